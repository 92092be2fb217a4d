"""One fit verdict: the window's badge, the advisor, the tuner, ``kvtuner plan`` (text and
``--json``), ``kvtuner tune`` and the export warning all say what
:func:`kvtuner.core.plan.verdict.fit_verdict` says, on the gpt-oss-20b 8 GiB case (7.18 of 8 GiB:
inside llama.cpp's 1 GiB ``--fit-target`` margin) and on one case per level, for a GPU and for the
host."""

from __future__ import annotations

import json

import pytest

from kvtuner.cli import main
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.verdict import DOES_NOT_FIT, FITS, LEVELS, TIGHT, FitMargins, VerdictError, fit_verdict
from kvtuner.core.session import Session
from kvtuner.core.tune import knee_curves
from kvtuner.core.units import GiB, MiB
from test_moe_offload import gpt_oss  # noqa: F401  (the gpt-oss-20b-shaped fixture, 11.27 GiB of tensors)

#: (flags, level, the device that sets it): the 8 GiB case of the issue, then one case per level
#: on a GPU and on the host (CPU only; the host needs 21.39 GiB with ggml-cpu's repacked copy)
CASES = [
    (["--gpu-mem", "8G", "--n-cpu-moe", "12", "-fa", "on"], TIGHT, "CUDA0"),  # 7.18 of 8 GiB
    (["--gpu-mem", "8G", "--n-cpu-moe", "16", "-fa", "on"], FITS, "CUDA0"),  # 5.60 of 8 GiB
    (["--gpu-mem", "8G", "-fa", "on"], DOES_NOT_FIT, "CUDA0"),  # 11.79 of 8 GiB
    (["--no-gpu", "--ram", "32G"], FITS, "CPU"),  # 67 % of the RAM
    (["--no-gpu", "--ram", "24G"], TIGHT, "CPU"),  # 89 %: over the 80 % line
    (["--no-gpu", "--ram", "16G"], DOES_NOT_FIT, "CPU"),
]
#: the advice each level draws for a GPU / the host (an error only for "does not fit")
ADVICE = {
    ("CUDA0", TIGHT): ("vram-tight", "warning"),
    ("CUDA0", DOES_NOT_FIT): ("vram-oom", "error"),
    ("CPU", TIGHT): ("swap-risk", "warning"),
    ("CPU", DOES_NOT_FIT): ("ram-oom", "error"),
}
OOM_IDS = {"vram-oom", "vram-tight", "ram-oom"}


def _plan_json(path, flags, capsys) -> dict:
    main(["plan", str(path), *flags, "--json", "--no-probe"])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flags,level,device", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_every_surface_gives_the_one_verdict(gpt_oss, flags, level, device, capsys, qtbot):  # noqa: F811
    # plan --json: the verdict, the badge, the advice
    doc = _plan_json(gpt_oss, flags, capsys)
    fit = doc["fit"]
    assert fit["level"] == level
    (dev,) = [d for d in fit["devices"] if d["device"] == device]
    assert dev["level"] == level
    assert fit["margins"]["vram_margin_bytes"] == 1024 * MiB and "--fit-target" in fit["margins"]["source"]
    if level != FITS:
        assert doc["badge"] == level
        assert device.replace("CPU", "host") in fit["why"]
    else:
        assert doc["badge"] in ("abandon", "offline", "interactive", "fluent")
    ids = {(a["id"], a["severity"]) for a in doc["advice"]}
    want = ADVICE.get((device, level))
    assert {i for i in ids if i[0] in OOM_IDS | {"swap-risk"}} - {("swap-risk", "warning")} <= {want}
    if want is not None:
        assert want in ids
    if level != DOES_NOT_FIT:
        assert not [a for a in doc["advice"] if a["severity"] == "error"]

    # plan text: the same level, in capitals
    main(["plan", str(gpt_oss), *flags, "--no-probe"])
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("fit: ")]
    assert line.startswith(f"fit: {level.upper()} -- ") and "--fit-target" in line

    # the window's badge, drawn by the real widget from the same plan
    from kvtuner.gui.widgets.prediction_panel import PredictionPanel

    model = ModelProfile.from_gguf(gpt_oss)
    session = _session(model, flags)
    a = session.assess()
    assert a.verdict.level == level and a.badge == doc["badge"]
    panel = PredictionPanel()
    qtbot.addWidget(panel)
    panel.set_plan(a.plan, a.speed, margins=a.margins)
    assert panel.verdict is not None and panel.verdict[0] == doc["badge"]
    assert panel.badge.text() == doc["badge"].upper()

    # the tuner: a candidate fits exactly when the verdict is "fits"
    inputs, _ = session.speed_inputs()
    (curve,) = knee_curves(model, [session.config], session.gpus, session.host, inputs, max_ctx=4096, n_points=2)
    assert {x: ok for x, _, ok in curve.points}[session.config.n_ctx] is (level == FITS)

    # the export warning on the same hardware, from the same verdict of the program the export runs:
    # a llama-server export is planned as llama-server (kvtuner.core.plan.build_rules), whose
    # compute buffer is smaller than the embedded build's, so its level may be better
    from kvtuner.core.plan.build_rules import rules_for_target

    session.rules = rules_for_target("llama-server")
    served = session.assess().verdict
    assert LEVELS.index(served.level) <= LEVELS.index(level)
    main(["export", str(gpt_oss), "--format", "llama-server", *flags])
    err = capsys.readouterr().err
    if served.level == FITS:
        assert "fit verdict" not in err
    else:
        assert f"the fit verdict of this configuration is {served.level.upper()}: " in err
        assert device.replace("CPU", "host") in err


def _session(model: ModelProfile, flags: list[str]) -> Session:
    """The session ``kvtuner plan MODEL FLAGS`` plans with (the CLI's own parser and builders)."""
    from kvtuner.cli import build_parser
    from kvtuner.cli.args import config_from_args, session_from_args

    args = build_parser().parse_args(["plan", str(model.path), *flags, "--no-probe"])
    s = session_from_args(args, model, config_from_args(args, model=model))
    s.measure_host_bandwidth = False
    return s


def test_the_8_gib_case_is_tight_for_tune_too(gpt_oss, capsys):  # noqa: F811
    """``tune`` names the given configuration's verdict (the same as ``plan``'s) and chooses one
    that fits."""
    main(
        [
            "tune",
            str(gpt_oss),
            "--gpu-mem",
            "8G",
            "--n-cpu-moe",
            "12",
            "-fa",
            "on",
            "--ctx",
            "4096",
            "--json",
            "--no-probe",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["given_fit"]["level"] == TIGHT
    best = doc["best"]
    assert best["fits"] is True
    (gpu,) = [d for d in best["plan"]["devices"] if d["device"] == "CUDA0"]
    assert gpu["total_bytes"] <= 7 * GiB


def test_margins_are_a_setting(gpt_oss):  # noqa: F811
    """A 512 MiB margin makes the 8 GiB case fit (0.82 GiB free); the advisor follows the setting."""
    model = ModelProfile.from_gguf(gpt_oss)
    s = _session(model, ["--gpu-mem", "8G", "--n-cpu-moe", "12", "-fa", "on"])
    assert s.assess().verdict.level == TIGHT
    s.margins = FitMargins(vram_margin_bytes=512 * MiB)
    a = s.assess()
    assert a.verdict.level == FITS and "set by the user" in a.verdict.margins.source
    assert not {x.id for x in a.advice} & OOM_IDS
    with pytest.raises(VerdictError, match="fraction"):
        FitMargins(ram_headroom_fraction=1.0)


def test_unknown_capacity_counts_as_fits(gpt_oss):  # noqa: F811
    from kvtuner.core.plan.memory_plan import plan_memory

    p = plan_memory(ModelProfile.from_gguf(gpt_oss), PlanConfig(), [], None)
    v = fit_verdict(p)
    assert v.level == FITS and v.devices[-1].level is None
