"""Today's model families against llama.cpp's own dry run (no_alloc, a child process).

Each family is a sparse GGUF with the published shapes of a model people download
(kvtuner/testing/gguf_families.py). For each, kvtuner's plan must equal llama.cpp's report:

- every KV cache (full, sliding-window, chunked): cells, layers, streams, types and the K, V
  and total MiB as printed; and the bytes per cell *to the byte* at >= 65536 cells, where the
  print's 0.005 MiB is under 0.1 byte per cell;
- the recurrent / short-conv state (``llama_memory_recurrent: size = ...``): R and S MiB as
  printed, at 1, 4 and 64 sequences;
- the structure kvtuner derives from the header equals the one the structure probe reads from
  llama.cpp's per-layer log lines (which layers hold KV, SWA, shared KV, recurrent state, MTP).
"""

from __future__ import annotations

import importlib.util

import pytest

from kvtuner.core.model.probed_structure import report_structure
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import ConfigError, PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.plan.reserve_graph import transformer_shape
from kvtuner.core.units import MiB
from kvtuner.testing.compute_cases import CONFIGS, FAMILIES, LONG, LONG_FAMILIES
from kvtuner.testing.gguf_factory import write_model

pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python"),
]
dryrun = pytest.importorskip("kvtuner.runner.dryrun")
from kvtuner.runner.structure_probe import differences  # noqa: E402


@pytest.fixture(scope="module")
def family_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("families")
    return {k: write_model(d / f"{k}.gguf", make()) for k, make in FAMILIES.items()}


def _compare(plan, got):
    """Every KV cache and the recurrent state of ``plan`` against the dry run ``got``."""
    assert (plan.n_ctx, plan.n_ctx_seq) == (got.n_ctx, got.n_ctx_seq)
    theirs = [c for c in got.kv_caches if c.layers > 0]  # an iSWA half without layers prints 0 layers
    ours = [c for c in plan.kv_caches if c.kind != "recurrent"]
    assert [(c.cells, c.layers, c.n_stream, c.type_k, c.type_v) for c in ours] == [
        (c.cells, c.layers, c.n_stream, c.type_k, c.type_v) for c in theirs
    ]
    for o, t in zip(ours, theirs):
        assert (f"{o.k_bytes / MiB:.2f}", f"{o.v_bytes / MiB:.2f}", f"{o.kv_bytes / MiB:.2f}") == (
            f"{t.k_mib:.2f}",
            f"{t.v_mib:.2f}",
            f"{t.size_mib:.2f}",
        )
    rec = [c for c in plan.kv_caches if c.kind == "recurrent"]
    if got.recurrent:
        (r,) = got.recurrent
        assert len(rec) == 1 and rec[0].cells == r.cells
        assert (f"{rec[0].k_bytes / MiB:.2f}", f"{rec[0].v_bytes / MiB:.2f}") == (f"{r.r_mib:.2f}", f"{r.s_mib:.2f}")
    else:
        assert not rec


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_family_matches_llama_cpp(family, ci, family_files):
    path = family_files[family]
    config = PlanConfig(**CONFIGS[ci])
    model = ModelProfile.from_gguf(path)
    assert model.structure.source == "analytic", model.structure.note
    try:
        plan = plan_memory(model, config)
    except ConfigError as exc:  # head size 80 and q8_0: llama.cpp must refuse it too
        with pytest.raises(dryrun.DryRunError) as err:
            dryrun.dry_run(path, config)
        assert err.value.kind == "invalid_config", (exc, err.value)
        return
    got = dryrun.dry_run(path, config)
    _compare(plan, got)
    probed = report_structure(got, model.structure)
    assert probed is not None and differences(model.structure, probed) == []
    _compute_never_under(plan, got, family, CONFIGS[ci])


def _compute_never_under(plan, got, family, kwargs):
    """The analytic compute buffer may over-estimate, never under-estimate by more than 2% + 8 MiB."""
    theirs = sum(got.compute_mib.values()) * MiB
    ours = plan.compute.bytes_on("CPU")
    print(
        f"compute {family} {kwargs}: planned {ours / MiB:.2f} MiB, llama.cpp {theirs / MiB:.2f} MiB "
        f"({ours / theirs - 1:+.1%})"
    )
    assert ours >= 0.98 * theirs - 8 * MiB
    if transformer_shape(plan.model, plan.kv_layers, plan.config.type_k, plan.config.type_v) is not None:
        assert f"{ours / MiB:.2f}" == f"{theirs / MiB:.2f}"  # rebuilt reserve graph: exact


@pytest.mark.parametrize("family", LONG_FAMILIES)
@pytest.mark.parametrize("li", range(len(LONG)))
def test_long_context_compute_never_under(family, li, family_files):
    """Long contexts and large ubatches, where masks and scores outgrow the logits."""
    path = family_files[family]
    config = PlanConfig(**LONG[li])
    plan = plan_memory(ModelProfile.from_gguf(path), config)
    got = dryrun.dry_run(path, config)
    _compare(plan, got)
    _compute_never_under(plan, got, family, LONG[li])


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("stablelm", "mamba")])
def test_family_kv_bytes_per_cell_exact(family, family_files):
    """At 65536 cells the printed MiB pins every cache's bytes per cell exactly."""
    path = family_files[family]
    model = ModelProfile.from_gguf(path)
    config = PlanConfig(
        n_ctx=65536, flash_attn="on", type_k="q8_0", type_v="q8_0" if model.is_mla else "q4_0", swa_full=True
    )
    plan = plan_memory(model, config)
    got = dryrun.dry_run(path, config)
    theirs = [c for c in got.kv_caches if c.layers > 0]
    ours = [c for c in plan.kv_caches if c.kind != "recurrent"]
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs):
        cells = t.cells * t.n_stream
        assert cells >= 65536
        assert o.k_bytes == round(t.k_mib * MiB / cells) * cells
        assert o.v_bytes == round(t.v_mib * MiB / cells) * cells


@pytest.mark.parametrize("family", ["qwen35", "falcon-h1", "nemotron_h", "granitehybrid", "lfm2", "qwen3next", "mamba"])
@pytest.mark.parametrize("n_seq", [1, 4, 64])
def test_recurrent_state_matches_llama_cpp(family, n_seq, family_files):
    path = family_files[family]
    config = PlanConfig(n_ctx=4096, n_seq=n_seq, kv_unified=True, flash_attn="on")
    plan = plan_memory(ModelProfile.from_gguf(path), config)
    got = dryrun.dry_run(path, config)
    _compare(plan, got)
