"""The planner against llama.cpp itself: a dry-run (no_alloc) in a child process per case.

KV: cells, layers and streams equal; K, V and total equal to llama.cpp's printed MiB
(2 decimals); and the bytes per cell equal *to the byte*, recovered from a dry-run with
>= 65536 cells where the print's 0.005 MiB rounding is under 0.1 byte per cell.
Compute buffer: the analytic estimate within 2% of llama.cpp's figure on the real default
model, and within 2% or 8 MiB (whichever is larger) on the tiny synthetic ones (ggml-alloc's packing makes the exact figure
non-monotonic in n_ctx: 9.0, 11.51, 9.0, 12.5 MiB at 512, 1024, 2048, 4096 cells for the same
model); the exact figure comes from a dry-run (``plan --verify``) and is then remembered.
"""

from __future__ import annotations

import pytest

from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.plan.reserve_graph import transformer_shape
from kvtuner.core.units import MiB
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.compute_cases import CASES, SYNTHETIC
from kvtuner.testing.gguf_factory import write_model

pytestmark = pytest.mark.llama
dryrun = pytest.importorskip("kvtuner.runner.dryrun")

COMPUTE_TOLERANCE = 0.02
SYNTHETIC_COMPUTE_SLACK_BYTES = 8 * MiB


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    return {k: write_model(d / f"{k}.gguf", s) for k, s in SYNTHETIC.items()}


def _model_path(name, synthetic, default_model):
    return default_model if name == "default" else synthetic[name]


@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_kv_and_compute_match_llama_cpp(name, kwargs, synthetic, default_model):
    path = _model_path(name, synthetic, default_model)
    config = PlanConfig(**kwargs)
    plan = plan_memory(ModelProfile.from_gguf(path), config)
    got = dryrun.dry_run(path, config)

    assert (plan.n_ctx, plan.n_ctx_seq) == (got.n_ctx, got.n_ctx_seq)
    assert len(plan.kv_caches) == len(got.kv_caches)
    for ours, theirs in zip(plan.kv_caches, got.kv_caches):
        assert (ours.cells, ours.layers, ours.n_stream) == (theirs.cells, theirs.layers, theirs.n_stream)
        assert (ours.type_k, ours.type_v) == (theirs.type_k, theirs.type_v)
        assert f"{ours.k_bytes / MiB:.2f}" == f"{theirs.k_mib:.2f}"
        assert f"{ours.v_bytes / MiB:.2f}" == f"{theirs.v_mib:.2f}"
        assert f"{ours.kv_bytes / MiB:.2f}" == f"{theirs.size_mib:.2f}"

    # compute buffer: the estimate against llama.cpp's sched_reserve figure (CPU backend here)
    theirs_compute = sum(got.compute_mib.values()) * MiB
    ours_compute = plan.compute.bytes_on("CPU")
    err = abs(ours_compute - theirs_compute) / theirs_compute
    print(
        f"{name} {kwargs}: compute planned {ours_compute / MiB:.2f} MiB, llama.cpp {theirs_compute / MiB:.2f} MiB, error {err:.1%}"
    )
    if transformer_shape(plan.model, plan.kv_layers, config.type_k, config.type_v) is not None:
        # rebuilt node by node and placed like ggml-alloc (core/plan/reserve_graph.py): exact
        assert f"{ours_compute / MiB:.2f}" == f"{theirs_compute / MiB:.2f}"
    if name == "default":
        assert err <= COMPUTE_TOLERANCE
    else:
        assert abs(ours_compute - theirs_compute) <= max(
            COMPUTE_TOLERANCE * theirs_compute, SYNTHETIC_COMPUTE_SLACK_BYTES
        )
    # never under llama.cpp by more than 2% + 8 MiB (an under-estimate is an unseen out-of-memory)
    assert ours_compute >= (1 - COMPUTE_TOLERANCE) * theirs_compute - SYNTHETIC_COMPUTE_SLACK_BYTES

    # output buffer: n_vocab x n_seq x 4 bytes (llama-context.cpp output_reserve)
    if got.output_mib:
        assert f"{plan.host.output_bytes / MiB:.2f}" == f"{sum(got.output_mib.values()):.2f}"


@pytest.mark.parametrize("name", ["default", "llama-mha", "llama-gqa", "llama-per-layer-kv", "gemma3-swa"])
@pytest.mark.parametrize("types", [("f16", "f16", "off"), ("q8_0", "q4_1", "on")])
def test_kv_bytes_per_cell_exact(name, types, synthetic, default_model):
    """Bytes per cell to the byte: at 65536 cells the printed MiB pins each cell's size exactly."""
    path = _model_path(name, synthetic, default_model)
    tk, tv, fa = types
    config = PlanConfig(n_ctx=65536, type_k=tk, type_v=tv, flash_attn=fa, swa_full=True)
    plan = plan_memory(ModelProfile.from_gguf(path), config)
    got = dryrun.dry_run(path, config)
    for ours, theirs in zip(plan.kv_caches, got.kv_caches):
        cells = theirs.cells * theirs.n_stream
        assert cells >= 65536
        k_per_cell = round(theirs.k_mib * MiB / cells)
        v_per_cell = round(theirs.v_mib * MiB / cells)
        assert ours.k_bytes == k_per_cell * cells
        assert ours.v_bytes == v_per_cell * cells


def test_done_when_figures(default_model):
    """The default model at n_ctx 8192, q8_0 K and V, FA on, swa_full off -> 12.75 MiB (3 global layers) and
    7.97 MiB (15 sliding-window layers), as llama.cpp reports them."""
    config = PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on")
    got = dryrun.dry_run(default_model, config)
    assert [(c.cells, c.layers, c.size_mib) for c in got.kv_caches] == [(8192, 3, 12.75), (1024, 15, 7.97)]
    plan = plan_memory(ModelProfile.from_gguf(default_model), config)
    assert [(c.cells, c.layers, round(c.kv_bytes / MiB, 2)) for c in plan.kv_caches] == [
        (8192, 3, 12.75),
        (1024, 15, 7.97),
    ]


def test_verify_makes_compute_exact_and_remembers_it(default_model, tmp_path):
    """``plan --verify --json`` shows analytic and llama.cpp figures side by side; afterwards a
    plain ``plan`` of the same configuration uses the remembered exact compute buffer."""
    import json

    data = {"KVTUNER_DATA_DIR": str(tmp_path)}
    args = ("plan", "--ctx", "2048", "--ubatch", "128", "--json")
    out = run_kvtuner(*args, extra_env=data)
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)
    assert first["compute_source"] == "estimate" and first["verified"] is None
    out = run_kvtuner(*args, "--verify", extra_env=data)
    assert out.returncode == 0, out.stderr
    verified = json.loads(out.stdout)
    assert verified["compute_source"] == "dry-run"
    host = next(d for d in verified["devices"] if d["device"] == "CPU")
    assert host["compute_bytes"] == verified["verified"]["compute_bytes"]["CPU"]
    assert verified["kv_bytes"] == sum(c["kv_bytes"] for c in verified["kv_caches"])
    assert [round(c["kv_bytes"] / MiB, 2) for c in verified["kv_caches"]] == [
        c["kv_mib"] for c in verified["verified"]["kv_caches"]
    ]
    out = run_kvtuner(*args, extra_env=data)
    assert out.returncode == 0, out.stderr
    again = json.loads(out.stdout)
    assert again["compute_source"] == "dry-run"
