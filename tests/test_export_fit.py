"""Exports that fit or say so: every target of a configuration that keeps tensors in RAM (the
gpt-oss-20b experts of the first layers, ``--n-cpu-moe``) either fits -- checked by planning
what the target runs -- or warns; Ollama, which places whole layers only, gets the most whole
layers that fit with their predicted speed; a ``.sh`` export is a script."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from kvtuner.cli import build_parser, main
from kvtuner.cli.args import config_from_args, session_from_args
from kvtuner.core.export.fit import check_export, expressed_config
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.build_rules import VENDORED, rules_for_target
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.plan.verdict import TIGHT, fit_verdict
from test_moe_offload import gpt_oss  # noqa: F401  (the gpt-oss-20b-shaped fixture)

FITS_FLAGS = ["--gpu-mem", "8G", "--n-cpu-moe", "16", "-fa", "on"]  # 5.60 of 8 GiB with the experts in RAM
TIGHT_FLAGS = ["--gpu-mem", "8G", "--n-cpu-moe", "12", "-fa", "on"]  # 7.18 of 8 GiB
EXPRESSIVE = ["llama-server", "llama-cli", "llama-cpp-python", "koboldcpp", "profile"]


def _export(path, fmt, flags, capsys):
    argv = ["export", str(path), "--format", fmt, *flags]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    return out, [ln[len("kvtuner: warning: ") :] for ln in err.splitlines() if ln.startswith("kvtuner: warning: ")]


def _session(path, flags):
    model = ModelProfile.from_gguf(path)
    args = build_parser().parse_args(["export", str(path), "--format", "llama-server", *flags])
    return session_from_args(args, model, config_from_args(args, model=model))


@pytest.mark.parametrize("fmt", EXPRESSIVE)
def test_a_target_that_expresses_the_placement_fits_or_warns(gpt_oss, fmt, capsys):  # noqa: F811
    s = _session(gpt_oss, FITS_FLAGS)
    # what the target runs is the plan's own configuration, and its plan fits
    assert expressed_config(fmt, s.config, lambda: s.model.n_layer) == s.config
    rules = rules_for_target(fmt)  # each target is planned as the program it runs
    fit = check_export(fmt, s.model, s.config, s.gpus, s.host, rules=rules)
    assert fit.verdict.fits and fit.config == s.config and not fit.warnings
    out, warns = _export(gpt_oss, fmt, FITS_FLAGS, capsys)
    assert not warns
    if fmt in ("llama-server", "llama-cli"):
        assert "--n-cpu-moe 16" in out
    elif fmt == "koboldcpp":
        assert json.loads(out)["moecpu"] == 16
    elif fmt == "profile":
        assert json.loads(out)["config"]["n_cpu_moe"] == 16
    else:
        assert "--n-cpu-moe 16" in out and "OVERRIDES = " in out  # the snippet's low-level loader
    # the tight configuration (7.18 of 8 GiB as the embedded build plans it) warns with the device
    # and the level of the program the target runs, and only when that verdict is not "fits"
    t = _session(gpt_oss, TIGHT_FLAGS)
    tight = check_export(fmt, t.model, t.config, t.gpus, t.host, rules=rules).verdict
    _, warns = _export(gpt_oss, fmt, TIGHT_FLAGS, capsys)
    if tight.fits:
        assert not warns
    else:
        assert len(warns) == 1 and tight.level.upper() in warns[0] and "CUDA0 needs" in warns[0]
    if rules == VENDORED:
        assert tight.level == TIGHT and "CUDA0 needs 7.18 GiB of 8.00 GiB" in warns[0]


@pytest.mark.parametrize("fmt", ["ollama", "llama-cpp-python-json"])
def test_a_whole_layer_target_writes_the_most_whole_layers_that_fit(gpt_oss, fmt, capsys):  # noqa: F811
    out, warns = _export(gpt_oss, fmt, FITS_FLAGS, capsys)
    (w,) = warns
    setting, all_layers = ("num_gpu", "999") if fmt == "ollama" else ("n_gpu_layers", "all")
    assert f"{fmt} cannot keep tensors of offloaded layers in RAM" in w and f"{setting} {all_layers}" in w
    assert "DOES NOT FIT" in w and "predicted decode" in w
    n = (
        int(re.search(r"^PARAMETER num_gpu (\d+)$", out, re.M).group(1))
        if fmt == "ollama"
        else json.loads(out)["n_gpu_layers"]
    )
    assert f"written with {setting} {n}, the most whole layers that fit" in w
    # checked by planning what the target runs: n whole layers fit the verdict, n + 1 do not
    s = _session(gpt_oss, FITS_FLAGS)
    ran = expressed_config(fmt, s.config, lambda: s.model.n_layer)
    assert ran.n_cpu_moe == 0 and not ran.tensor_overrides
    rules = rules_for_target(fmt)
    assert fit_verdict(plan_memory(s.model, ran.with_(n_gpu_layers=n), s.gpus, s.host, rules=rules)).fits
    assert not fit_verdict(plan_memory(s.model, ran.with_(n_gpu_layers=n + 1), s.gpus, s.host, rules=rules)).fits
    assert 0 < n < s.model.n_layer


def test_ollama_says_when_it_cannot_express_a_placement_that_fits(gpt_oss, capsys):  # noqa: F811
    # 2 GiB: even num_gpu 0 keeps the compute buffer and overhead over the margin
    out, warns = _export(gpt_oss, "ollama", ["--gpu-mem", "1G", "--n-cpu-moe", "24", "-fa", "on"], capsys)
    (w,) = warns
    assert "cannot express a placement that fits" in w
    assert "PARAMETER num_gpu 999" in out  # written as given, with the warning


def test_vllm_warns_that_it_cannot_express_experts_in_ram(gpt_oss, capsys):  # noqa: F811
    _, warns = _export(gpt_oss, "vllm", FITS_FLAGS, capsys)
    assert any(w.startswith("vLLM cannot express this placement") for w in warns)


def test_sh_export_is_an_executable_script(default_model, tmp_path, capsys):
    for fmt in ("llama-server", "vllm"):
        path = tmp_path / f"run-{fmt}.sh"
        assert main(["export", str(default_model), "--format", fmt, "-o", str(path)]) == 0
        capsys.readouterr()
        text = path.read_text()
        assert text.startswith("#!/bin/sh\n")
        assert os.stat(path).st_mode & stat.S_IXUSR
    # a Modelfile is not a script
    path = tmp_path / "Modelfile"
    assert main(["export", str(default_model), "--format", "ollama", "-o", str(path)]) == 0
    assert not path.read_text().startswith("#!") and not os.stat(path).st_mode & stat.S_IXUSR
