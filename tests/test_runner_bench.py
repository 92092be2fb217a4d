"""run_bench and ``kvtuner bench`` on the real default model (small sizes to stay fast)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from kvtuner.core.llama_report import KvCacheReport
from kvtuner.core.plan.config import PlanConfig
from kvtuner.runner import protocol as P
from kvtuner.runner.bench import BenchError, Stat, kv_bytes_from_report, run_bench

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")

Q8_FA = PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on", swa_full=False)
# 3 global layers x 8192 cells x 272 B (256 q8_0 values) x 2 (K, V) + 15 SWA layers x 1024 cells x 272 x 2
Q8_FA_KV_BYTES = 3 * 8192 * 272 * 2 + 15 * 1024 * 272 * 2  # 21_725_184


@pytest.mark.parametrize(
    "report, expected",
    [
        (KvCacheReport(12.75, 8192, 3, 1, 1, "q8_0", 6.38, "q8_0", 6.38), (3 * 8192 * 272 * 2, True)),
        (KvCacheReport(7.97, 1024, 15, 1, 1, "q8_0", 3.98, "q8_0", 3.98), (15 * 1024 * 272 * 2, True)),
        # f16, 8192 cells: unit 16 KiB > the 0.01 MiB rounding window -> exact
        (KvCacheReport(24.0, 8192, 3, 1, 1, "f16", 12.0, "f16", 12.0), (3 * 8192 * 512 * 2, True)),
        # f16, 256 cells: unit 512 B, below the rounding window -> rounded, not exact
        (KvCacheReport(0.75, 256, 3, 1, 1, "f16", 0.38, "f16", 0.38), (2 * round(0.38 * 2**20), False)),
        # two streams double the unit
        (KvCacheReport(12.75, 2048, 3, 4, 4, "q8_0", 6.38, "q8_0", 6.38), (3 * 2048 * 4 * 272 * 2, True)),
    ],
)
def test_kv_bytes_from_report(report, expected):
    assert kv_bytes_from_report(report) == expected


def test_stat():
    s = Stat.of([3.0, 1.0, 2.0])
    assert (s.median, s.mean, s.min, s.max, s.n) == (2.0, 2.0, 1.0, 3.0, 3)
    assert s.stdev == pytest.approx(1.0)
    assert Stat.of([5.0]).stdev == 0.0
    assert Stat.of([]) is None


def test_bad_arguments(tmp_path, default_model):
    with pytest.raises(BenchError, match="model file not found") as ei:
        run_bench(tmp_path / "x.gguf", PlanConfig())
    assert ei.value.kind == "model_error"
    with pytest.raises(BenchError, match="n_gen must be 0 or more") as ei:
        run_bench(default_model, PlanConfig(), n_gen=-1)
    assert ei.value.kind == "invalid_config"
    with pytest.raises(BenchError, match="repetitions must be 1 or more"):
        run_bench(default_model, PlanConfig(), repetitions=0)


@pytest.mark.llama
@needs_llama
def test_run_bench_default_model(default_model):
    events: list[P.Message] = []
    r = run_bench(default_model, Q8_FA, n_prompt=16, n_gen=4, repetitions=2, n_threads=1, on_event=events.append)
    assert r.n_prompt == 16 and r.n_gen == 4 and r.repetitions == 2 and r.n_threads == 1
    assert r.prefill_tok_s.n == 2 and r.prefill_tok_s.min > 0
    assert r.decode_tok_s.n == 2 and r.decode_tok_s.median > 0
    assert r.ttft_s.median > 0 and 0 < r.load_s < 60
    assert r.kv_bytes == Q8_FA_KV_BYTES and r.kv_bytes_exact
    assert [(c.cells, c.layers) for c in r.buffers.kv_caches] == [(8192, 3), (1024, 15)]
    assert r.buffers.compute_mib == {"CPU": 514.5} and r.buffers.output_mib == {"CPU": 1.0}
    assert sum(r.buffers.model_mib.values()) > 200  # real buffers this time
    assert r.buffers.kv_buffer_mib == {"CPU": 20.72}
    assert r.peak_rss_bytes > 250 << 20
    assert r.flash_attn is True and r.n_ctx == 8192
    assert sum(isinstance(e, P.TokenEvent) for e in events) == 8
    assert isinstance(events[0], P.StartedEvent)
    d = r.to_dict()
    json.dumps(d)
    assert d["kv_bytes"] == Q8_FA_KV_BYTES and d["config"]["type_k"] == "q8_0" and len(d["kv_caches"]) == 2


@pytest.mark.llama
@needs_llama
def test_run_bench_context_too_small(default_model):
    with pytest.raises(BenchError, match="raise --ctx") as ei:
        run_bench(default_model, PlanConfig(n_ctx=256), n_prompt=512, n_gen=8, repetitions=1)
    assert ei.value.kind == "invalid_config"


@pytest.mark.llama
@needs_llama
def test_cli_bench_json(default_model, capsys):
    from kvtuner.cli import main

    rc = main(
        [
            "bench",
            str(default_model),
            "--ctx",
            "8192",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
            "-fa",
            "on",
            "-p",
            "16",
            "-n",
            "4",
            "-r",
            "1",
            "-t",
            "1",
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "kvtuner.bench/1"
    assert doc["prefill_tok_s"]["median"] > 0 and doc["decode_tok_s"]["median"] > 0
    assert doc["load_s"] > 0 and doc["peak_rss_bytes"] > 0
    assert doc["kv_bytes"] == Q8_FA_KV_BYTES
    if "planned_kv_bytes" in doc:  # the planner is there: measured KV bytes equal the plan's
        assert doc["planned_kv_bytes"] == Q8_FA_KV_BYTES
        assert doc["kv_bytes_match"] is True and doc["kv_mib_match"] is True


@pytest.mark.llama
@needs_llama
def test_cli_bench_text(default_model, capsys):
    from kvtuner.cli import main

    assert main(["bench", "--ctx", "512", "-p", "8", "-n", "2", "-r", "1", "-t", "1"]) == 0
    out = capsys.readouterr().out
    for fragment in ("prefill", "decode", "TTFT", "load", "peak RSS", "planned", "measured", "llama_kv_cache"):
        assert fragment in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "/no/such/model.gguf"], "kvtuner: model file not found: /no/such/model.gguf"),
        pytest.param(
            ["bench", "--ctx", "256", "-p", "512", "-n", "8", "-r", "1"],
            "kvtuner: bench failed (invalid_config): the bench needs 520 tokens",
            marks=pytest.mark.llama,
        ),
        (["bench", "--cache-type-k", "q3_k"], "kvtuner: --cache-type-k: unknown KV cache type 'q3_k'"),
        # llama.cpp takes n_threads <= 0 as its own default of 4, which the report then misstated
        (["bench", "-t", "0"], "kvtuner: --threads must be 1 or more"),
        (["bench", "-t", "-1"], "kvtuner: --threads must be 1 or more"),
        (["bench", "--timeout", "nan"], "kvtuner: --timeout must be a positive number of seconds, not nan"),
    ],
)
def test_cli_bench_user_errors(argv, message, capsys):
    from kvtuner.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
