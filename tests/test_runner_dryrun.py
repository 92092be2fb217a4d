"""llama.cpp's dry run (no_alloc) in a real child process on real models."""

from __future__ import annotations

import importlib.util
import os

import pytest

from kvtuner.core.llama_report import DryRunResult, KvCacheReport
from kvtuner.core.plan.config import ALL_LAYERS, PlanConfig
from kvtuner.runner.dryrun import DryRunError, dry_run

pytestmark = [
    pytest.mark.llama,
    # find_spec, not importorskip: the test process itself must never load llama_cpp
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python"),
]

# Measured on the real Gemma 3 270M Q4_K_M (reference/llama-cpp-memory.md §2): 18 layers,
# 1 KV head x 256, window 512, 3 global layers; n_ctx 8192, q8_0 K and V, FA on, swa_full off.
Q8_FA = PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on", swa_full=False)


@pytest.fixture(scope="module")
def q8_result(default_model) -> DryRunResult:
    return dry_run(default_model, Q8_FA)


def test_default_model_q8_kv_caches(q8_result):
    assert q8_result.kv_caches == (
        # non-SWA first: 3 layers x 8192 cells x (256/32 x 34 B) x 2 (K, V) = 12.75 MiB
        KvCacheReport(12.75, 8192, 3, 1, 1, "q8_0", 6.38, "q8_0", 6.38),
        # SWA: pad(512 + 512 ubatch, 256) = 1024 cells, 15 layers = 7.97 MiB
        KvCacheReport(7.97, 1024, 15, 1, 1, "q8_0", 3.98, "q8_0", 3.98),
    )
    assert q8_result.kv_mib == 20.72


def test_default_model_q8_buffers(q8_result):
    assert q8_result.compute_mib == {"CPU": 514.50}  # 262144-vocab logits for a 512-token ubatch
    assert q8_result.output_mib == {"CPU": 1.00}
    assert set(q8_result.kv_buffer_mib.values()) == {0.0}  # no_alloc: nothing allocated
    assert q8_result.n_ctx == 8192 and q8_result.n_ctx_seq == 8192
    assert q8_result.flash_attn is True
    assert "CPU" in q8_result.devices
    assert q8_result.llama_build.startswith("llama-cpp-python 0.3.36")
    assert any("llama_kv_cache" in line or "sched_reserve" in line for line in q8_result.log_tail)


def test_parent_never_loads_llama_cpp(q8_result):
    import sys

    assert "llama_cpp" not in sys.modules


@pytest.mark.parametrize(
    "config, caches",
    [
        # swa_full passed explicitly: full-size SWA cache (the C default would be true)
        (PlanConfig(n_ctx=4096, swa_full=True, flash_attn="on"), [(4096, 3, "f16"), (4096, 15, "f16")]),
        (PlanConfig(n_ctx=4096, swa_full=False, flash_attn="on"), [(4096, 3, "f16"), (1024, 15, "f16")]),
        # n_ctx padded up to 256; 2 sequences, non-unified: 2 streams of pad(1000/2, 256) = 512 cells,
        # and the SWA cache is capped by the stream size: min(512, pad(512 + 512, 256)) = 512
        (
            PlanConfig(n_ctx=1000, n_seq=2, flash_attn="on", type_k="q4_0", type_v="q4_0"),
            [(512, 3, "q4_0"), (512, 15, "q4_0")],
        ),
        # n_ubatch shapes the SWA cache: pad(512 + 128, 256) = 768
        (PlanConfig(n_ctx=8192, n_ubatch=128, flash_attn="on"), [(8192, 3, "f16"), (768, 15, "f16")]),
    ],
)
def test_configs_are_passed_through(default_model, config, caches):
    r = dry_run(default_model, config)
    assert [(c.cells, c.layers, c.type_k) for c in r.kv_caches] == caches
    assert all(c.type_v == c.type_k for c in r.kv_caches)
    assert all(c.n_seq == config.n_seq for c in r.kv_caches)


def test_two_sequences_make_two_streams(default_model):
    r = dry_run(default_model, PlanConfig(n_ctx=1000, n_seq=2, flash_attn="on"))
    assert r.n_ctx == 1024 and r.n_ctx_seq == 512
    assert [c.n_stream for c in r.kv_caches] == [2, 2]
    unified = dry_run(default_model, PlanConfig(n_ctx=1000, n_seq=2, kv_unified=True, flash_attn="on"))
    assert [c.n_stream for c in unified.kv_caches] == [1, 1]


def test_flash_attn_auto_is_resolved(default_model):
    r = dry_run(default_model, PlanConfig(n_ctx=512, flash_attn="auto"))
    assert r.flash_attn in (True, False)  # llama.cpp decides; never "auto"
    off = dry_run(default_model, PlanConfig(n_ctx=512, flash_attn="off"))
    assert off.flash_attn is False


def test_nkvo_and_ngl_are_accepted_without_a_gpu(default_model):
    r = dry_run(default_model, PlanConfig(n_ctx=512, n_gpu_layers=ALL_LAYERS, kv_gpu_layers=0))
    assert len(r.kv_caches) == 2
    r = dry_run(default_model, PlanConfig(n_ctx=512, n_gpu_layers=7, kv_gpu_layers=3))  # split: ignored without GPU
    assert len(r.kv_caches) == 2


def test_too_many_kv_gpu_layers(default_model):
    with pytest.raises(DryRunError, match="--kv-gpu-layers 9 exceeds the 4 repeating layers") as ei:
        dry_run(default_model, PlanConfig(n_ctx=512, n_gpu_layers=5, kv_gpu_layers=9))
    assert ei.value.kind == "invalid_config"


def test_llama_cpp_refuses_the_context(tmp_path):
    from kvtuner.testing.gguf_factory import ModelSpec, write_model

    # head dim 48: q8_0's block of 32 does not divide it, and llama.cpp refuses with FA on
    path = write_model(
        tmp_path / "hd48.gguf", ModelSpec(n_layer=2, n_embd=96, n_head=2, n_head_kv=2, n_ff=128, n_vocab=256)
    )
    with pytest.raises(DryRunError) as ei:
        dry_run(path, PlanConfig(n_ctx=512, type_k="q8_0", type_v="f16", flash_attn="on"))
    assert ei.value.kind == "invalid_config"
    assert "K cache type q8_0 with block size 32 does not divide n_embd_head_k=48" in str(ei.value)
    # the same model is fine with f16
    ok = dry_run(path, PlanConfig(n_ctx=512, flash_attn="on"))
    assert [(c.cells, c.layers) for c in ok.kv_caches] == [(512, 2)]


def test_missing_model(tmp_path):
    with pytest.raises(DryRunError, match="model file not found") as ei:
        dry_run(tmp_path / "nope.gguf", PlanConfig())
    assert ei.value.kind == "model_error"


def test_fifo_is_not_a_model_and_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(DryRunError, match="not a file") as ei:
        dry_run(fifo, PlanConfig(), timeout_s=10)
    assert ei.value.kind == "model_error"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_model(tmp_path, default_model):
    p = tmp_path / "locked.gguf"
    p.write_bytes(b"GGUF")
    p.chmod(0)
    with pytest.raises(DryRunError, match="not readable") as ei:
        dry_run(p, PlanConfig())
    assert ei.value.kind == "model_error"


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "text.gguf"
    p.write_text("hello, I am not a model\n" * 10)
    with pytest.raises(DryRunError) as ei:
        dry_run(p, PlanConfig())
    assert ei.value.kind == "model_error"
    assert str(p) in str(ei.value)


def test_truncated_gguf(tmp_path, default_model):
    p = tmp_path / "truncated.gguf"
    with open(default_model, "rb") as f:
        p.write_bytes(f.read(1 << 20))  # header and tensor table, data cut off
    with pytest.raises(DryRunError) as ei:
        dry_run(p, PlanConfig(n_ctx=512))
    assert ei.value.kind == "model_error"
