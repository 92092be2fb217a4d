"""Models people download in 2026, planned by kvtuner and dry-run by llama.cpp.

Each row: a sparse GGUF with the model's published shapes, the command a new user types, the
figures llama.cpp (the llama-cpp-python 0.3.36 build) reports, and kvtuner's plan of the same.
"""

from __future__ import annotations

import importlib.util
import json

import gguf
import pytest

from kvtuner.core.hardware.specs import what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.session import Session
from kvtuner.core.units import GiB, MiB
from kvtuner.testing import gguf_families as F
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gguf_factory import write_model

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("today")
    return {
        "qwen36": write_model(d / "qwen3.6-27b.gguf", F.qwen35()),
        "qwen36-q4": write_model(d / "qwen3.6-27b-q4_k.gguf", F.qwen35(wt=gguf.GGMLQuantizationType.Q4_K)),
        "scout": write_model(d / "llama-4-scout.gguf", F.llama4()),
        "gemma4": write_model(d / "gemma-4-e4b.gguf", F.gemma4()),
        "falcon": write_model(d / "falcon-h1-1.5b.gguf", F.falcon_h1()),
        "stablelm": write_model(d / "stablelm-zephyr-3b.gguf", F.stablelm()),
    }


def _mib(b: int) -> float:
    return round(b / MiB, 2)


def _kv(plan):
    return [(c.kind, c.cells, c.layers, _mib(c.kv_bytes)) for c in plan.kv_caches]


ROWS = [
    # (file, config, kvtuner's caches (kind, cells, layers, MiB); llama.cpp prints the same)
    (
        "qwen36",
        dict(n_ctx=262144, n_seq=4, kv_unified=True, flash_attn="on"),
        [("full", 262144, 16, 16384.0), ("recurrent", 4, 48, 598.5)],
    ),
    (
        "qwen36",
        dict(n_ctx=65536, type_k="q8_0", type_v="q8_0", flash_attn="on"),
        [("full", 65536, 16, 2176.0), ("recurrent", 1, 48, 149.62)],
    ),
    ("scout", dict(n_ctx=131072, flash_attn="on"), [("full", 131072, 12, 6144.0), ("chunked", 8704, 36, 1224.0)]),
    ("gemma4", dict(n_ctx=131072, flash_attn="on"), [("full", 131072, 4, 2048.0), ("swa", 1024, 20, 40.0)]),
    ("falcon", dict(n_ctx=32768, flash_attn="on"), [("full", 32768, 24, 768.0), ("recurrent", 1, 24, 72.98)]),
]


@pytest.mark.parametrize("name,kwargs,expected", ROWS, ids=[f"{r[0]}-{i}" for i, r in enumerate(ROWS)])
def test_kvtuner_plans_the_table(name, kwargs, expected, files):
    plan = plan_memory(ModelProfile.from_gguf(files[name]), PlanConfig(**kwargs))
    assert _kv(plan) == expected
    assert not any(w.startswith("approximate") for w in plan.warnings)


@pytest.mark.llama
@needs_llama
@pytest.mark.parametrize("name,kwargs,expected", ROWS, ids=[f"{r[0]}-{i}" for i, r in enumerate(ROWS)])
def test_llama_cpp_reports_the_table(name, kwargs, expected, files):
    from kvtuner.runner.dryrun import dry_run

    got = dry_run(files[name], PlanConfig(**kwargs))
    caches = [(c.cells, c.layers, c.size_mib) for c in got.kv_caches if c.layers]
    caches += [(r.cells, None, round(r.r_mib + r.s_mib, 2)) for r in got.recurrent]
    assert caches == [(cells, None if kind == "recurrent" else layers, mib) for kind, cells, layers, mib in expected]


def test_qwen36_q8_fits_a_24g_card(files):
    """Row 2: 2176 MiB of KV and 149.62 MiB of state next to Q4_K weights fit a 24 GB card;
    kvtuner used to plan 8.5 GiB of KV and advise vram-oom."""
    s = Session(
        model=ModelProfile.from_gguf(files["qwen36-q4"]),
        config=PlanConfig(n_ctx=65536, type_k="q8_0", type_v="q8_0", flash_attn="on"),
        gpus=(what_if_gpu(24 * GiB),),
        measure_host_bandwidth=False,
        use_compute_cache=False,
    )
    a = s.assess()
    assert a.fits and not any(x.id == "vram-oom" for x in a.advice)
    # 16 layers x 65536 cells x 1088 B x 2 (q8_0 K, V) + 48 layers x (30720 + 786432) f32 of state
    assert a.plan.gpus[0].kv_bytes == 2176 * MiB + 48 * 817152 * 4


def test_head_size_80_q8_k_refused_first(files):
    """StableLM-Zephyr-3B (head size 80): llama.cpp refuses -ctk q8_0 with flash attention auto;
    kvtuner says so in one line, exit 2, and what to choose."""
    r = run_kvtuner("plan", str(files["stablelm"]), "--ctx", "4096", "-ctk", "q8_0")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not divide the K head size 80" in lines[0] and "-ctk f16" in lines[0]
    assert run_kvtuner("plan", str(files["stablelm"]), "--ctx", "4096", "-ctk", "q8_0", "-fa", "off").returncode == 0


@pytest.mark.llama
@needs_llama
def test_llama_cpp_refuses_head_size_80_q8_k(files):
    from kvtuner.runner.dryrun import DryRunError, dry_run

    with pytest.raises(DryRunError) as err:
        dry_run(files["stablelm"], PlanConfig(n_ctx=4096, type_k="q8_0"))
    assert err.value.kind == "invalid_config" and "does not divide n_embd_head_k=80" in str(err.value)


@pytest.mark.slow
def test_server_defaults_resolved(files):
    """--ctx 0 is the training context and -np -1 llama-server's auto (4 slots, unified KV)."""
    r = run_kvtuner("plan", str(files["gemma4"]), "--ctx", "0", "-np", "-1", "-fa", "on", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["resolved"] == [
        "-np -1 -> 4 sequences, unified KV cache (llama-server's auto)",
        "ctx 0 -> 131072 (training context)",
    ]
    assert doc["config"]["n_ctx"] == 131072 and doc["config"]["n_seq"] == 4 and doc["config"]["kv_unified"]
    text = run_kvtuner("plan", str(files["gemma4"]), "--ctx", "0").stdout
    assert text.splitlines()[0] == "resolved: ctx 0 -> 131072 (training context)"
