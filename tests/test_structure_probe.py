"""Architecture truth from llama.cpp itself: the structure probe, its cache, and verified figures.

An architecture kvtuner has no tested rule for (granite_swa: a per-layer sliding-window array)
is planned with the generic rule and says "approximate" in one line; a probe of the installed
llama.cpp (a no_alloc dry run whose per-layer log lines are read) replaces the structure, is
remembered per model header and llama.cpp build, and later plans read it in microseconds.
``--verify`` figures (every cache, the recurrent state, compute, output) flow into the plan's
totals and advice, and the approximation note goes away.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import time

import pytest

from kvtuner.core.hardware.specs import HostSpec
from kvtuner.core.llama_report import KvCacheReport, RecurrentStateReport
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.session import Session
from kvtuner.core.units import GiB, MiB
from kvtuner.testing import gguf_families as F
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gguf_factory import write_model
from kvtuner.testing.llama_report_support import dry_run_result

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")


@pytest.fixture(scope="module")
def gswa(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("probe") / "granite-swa.gguf", F.granite_swa())


def _session(path, **kw) -> Session:
    return Session(model=ModelProfile.from_gguf(path), measure_host_bandwidth=False, **kw)


def test_untested_architecture_is_approximate_in_one_line(gswa):
    s = _session(gswa, config=PlanConfig(n_ctx=8192))
    assert s.needs_structure_probe
    plan = s.plan()
    assert [w for w in plan.warnings if w.startswith("approximate")] == [
        "approximate: granite_swa: kvtuner's per-layer rules for this architecture are not checked against llama.cpp; "
        "figures are approximate (plan --verify reads the real structure from llama.cpp)"
    ]
    assert [(c.kind, c.cells, c.layers) for c in plan.kv_caches] == [("full", 8192, 8)]  # the generic guess


@pytest.mark.llama
@needs_llama
def test_probe_gives_llama_cpp_structure_and_is_remembered(gswa):
    from kvtuner.runner.dryrun import dry_run, probe_structure

    s = _session(gswa, config=PlanConfig(n_ctx=8192))
    probed = probe_structure(gswa, s.model.structure)
    assert probed.source == "probe" and probed.llama_build.startswith("llama-cpp-python")
    s.set_structure(probed)
    plan = s.plan()
    got = dry_run(gswa, PlanConfig(n_ctx=8192))
    assert (
        [(c.cells, c.layers, round(c.kv_bytes / MiB, 2)) for c in plan.kv_caches]
        == [(c.cells, c.layers, c.size_mib) for c in got.kv_caches]
        == [(8192, 2, 16.0), (1024, 6, 6.0)]
    )
    assert not any(w.startswith("approximate") for w in plan.warnings)
    assert not s.needs_structure_probe

    # a new session (the app restarted, another command) reads it from the cache
    again = _session(gswa, config=PlanConfig(n_ctx=8192))
    assert again.planned_model().structure.source == "probe" and not again.needs_structure_probe
    # and a slider move stays well under a millisecond of planning arithmetic
    times = []
    for ctx in range(4096, 4096 + 256 * 60, 256):
        again.config = PlanConfig(n_ctx=ctx)
        t0 = time.perf_counter()
        again.plan()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    print(f"plan with a cached probe: median {median * 1e3:.3f} ms")
    assert median < 0.005  # generous for a shared 2-core machine; measured ~0.2 ms


@pytest.mark.llama
@needs_llama
def test_cli_plan_probes_once_and_no_probe_stays_approximate(gswa):
    off = json.loads(run_kvtuner("plan", str(gswa), "--ctx", "8192", "--json", "--no-probe").stdout)
    assert off["structure"]["source"] == "approximate"
    assert sum(w.startswith("approximate") for w in off["warnings"]) == 1
    on = json.loads(run_kvtuner("plan", str(gswa), "--ctx", "8192", "--json").stdout)
    assert on["structure"]["source"] == "probe"
    assert not any(w.startswith("approximate") for w in on["warnings"])
    assert [(c["kind"], c["cells"], c["layers"]) for c in on["kv_caches"]] == [("full", 8192, 2), ("swa", 1024, 6)]


@pytest.mark.llama
@needs_llama
def test_cli_verify_flows_through(gswa):
    """--verify on an approximate plan: llama.cpp's caches (SWA row included), compute and
    output are the plan's figures, and the approximation note is gone."""
    doc = json.loads(run_kvtuner("plan", str(gswa), "--ctx", "8192", "--json", "--no-probe", "--verify").stdout)
    assert doc["figures_source"] == "llama.cpp dry-run" and doc["compute_source"] == "dry-run"
    assert not any(w.startswith("approximate") for w in doc["warnings"])
    v = doc["verified"]
    assert [round(c["kv_bytes"] / MiB, 2) for c in doc["kv_caches"]] == [c["kv_mib"] for c in v["kv_caches"]]
    host = doc["devices"][-1]
    assert host["kv_bytes"] == doc["kv_bytes"]
    assert host["compute_bytes"] == v["compute_bytes"]["CPU"]
    assert host["output_bytes"] == v["output_bytes"]["CPU"]
    text = run_kvtuner("plan", str(gswa), "--ctx", "8192", "--no-probe", "--verify").stdout
    assert "KV swa" in text and "verified by embedded llama-cpp-python" in text


# -- verified figures win, without llama.cpp: a stand-in dry-run report -------------------------


def test_verified_figures_reach_totals_and_advice(tmp_path):
    """A dry run that reports more than the plan (a structure kvtuner got wrong): the plan's
    KV, recurrent state, compute and output become llama.cpp's, and the RAM advice follows."""
    path = write_model(
        tmp_path / "lfm2.gguf", F.lfm2(n_layer=8, attn_layers=(2, 5), E=512, n_head=8, n_head_kv=2, n_ff=1024, V=4096)
    )
    host = HostSpec(total_bytes=2 * GiB, available_bytes=2 * GiB)
    s = _session(path, config=PlanConfig(n_ctx=8192, flash_attn="on"), host=host, use_compute_cache=False)
    before = s.assess()
    assert not any(a.id == "ram-oom" for a in before.advice)
    kv = before.plan.kv_caches[0]
    assert kv.layers == 2
    # llama.cpp (the stand-in) says: 4 GiB of KV in the same 2 layers, more state, compute and output
    s.set_verified(
        dry_run_result(
            kv_caches=(KvCacheReport(4096.0, kv.cells, 2, 1, 1, "f16", 2048.0, "f16", 2048.0),),
            compute_mib={"CPU": 100.0},
            output_mib={"CPU": 0.5},
            devices=("CPU",),
            recurrent=(RecurrentStateReport(3.0, 1, 8, 1, 0, "f32", 1.0, "f32", 2.0),),
        )
    )
    after = s.assess()
    p = after.plan
    assert p.verified and p.kv_caches[0].kv_bytes == 4096 * MiB
    assert p.kv_caches[-1].kind == "recurrent" and p.kv_caches[-1].kv_bytes == 3 * MiB
    assert p.host.kv_bytes == 4096 * MiB + 3 * MiB
    assert (p.host.compute_bytes, p.host.output_bytes) == (100 * MiB, MiB // 2)
    assert p.host.total_bytes == p.host.weights_bytes + 4099 * MiB + 100 * MiB + MiB // 2 + p.host.overhead_bytes
    assert any(a.id == "ram-oom" for a in after.advice)
    # another configuration: the report no longer applies
    s.config = PlanConfig(n_ctx=4096, flash_attn="on")
    assert not s.plan().verified
