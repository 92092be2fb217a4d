"""The desktop app on the one Session the command line uses: a finished run recorded on a GPU
machine calibrates the window's next prediction, a dry run's buffer names land on the right
devices, the CLI and the window give the same plan, speed and advice for the same
configuration; settings live in the configuration directory and a configuration from the
command line is not remembered. Both GPU-only bugs showed only with an NVIDIA driver, so a
stand-in for it (kvtuner/testing/nvml_standin.py) plays one here; the dry run needs a CUDA llama.cpp, so
its result is fabricated."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6 import QtCore

from kvtuner.core.advice.advisor import Advice, AdviceAction
from kvtuner.core.hardware import nvml
from kvtuner.core.hardware.identity import machine_id
from kvtuner.core.hardware.specs import HostSpec
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.fields import config_field
from kvtuner.core.units import GiB, MiB
from kvtuner.gui import verify as verify_module
from kvtuner.gui.app import make_app
from kvtuner.gui.main_window import MainWindow
from kvtuner.gui.run_controller import RunFinished
from kvtuner.gui.settings import settings_path
from kvtuner.gui.widgets.advisor_pane import AdvisorPane
from kvtuner.runner import protocol as P
from kvtuner.testing.gui_support import HOST, NO_MODEL, ini_settings
from kvtuner.testing.llama_report_support import dry_run_result
from kvtuner.testing.nvml_standin import fake_nvml


@pytest.fixture
def one_gpu():
    """This machine with one (stand-in) 12 GiB RTX 3060 and its driver."""
    nvml.use_nvml_module(fake_nvml(1))
    try:
        yield nvml.detect_gpus()
    finally:
        nvml.use_nvml_module(None)


def _planned(w: MainWindow) -> bool:
    """The model, and the host bandwidth probe (the session predicts with it once it is there)."""
    return w.plan is not None and w.tasks.pending == 0


def _records(data_dir: Path) -> dict[str, list[dict]]:
    path = data_dir / "calibration.json"
    data = json.loads(path.read_text()) if path.exists() else {"machines": {}}
    return {m: v.get("runs", []) for m, v in data["machines"].items() if v.get("runs")}


def test_a_run_finished_on_a_gpu_machine_calibrates_the_windows_next_prediction(qtbot, tmp_path, one_gpu, make_window):
    """GPU-only bug #1: the window recorded runs under the machine id with its GPUs and read them
    back under another, so on a GPU machine it never used its own calibration."""
    w = make_window(PlanConfig(n_ctx=4096), hardware=None, wait=_planned)
    try:
        assert [g.device for g in w.session.gpus] == ["CUDA0"]  # detected through the driver
        assert w.hardware.current_choice() == "detected"
        before = w.speed
        assert before is not None and before.n_calibration_runs == 0
        # a finished bench, as the runner child reports it, through the window's event handling
        w.run_events.begin(w.model_path, w.config)
        t = time.monotonic()
        w.run_events.handle(
            t,
            P.StartedEvent(
                pid=1,
                protocol_version=1,
                llama_build="test",
                devices=("CPU", "CUDA0"),
                device_descriptions=("CPU", "RTX 3060"),
                gpu_offload_supported=True,
            ),
        )
        rep = P.Repetition(
            rep=0,
            n_depth=0,
            n_prompt=512,
            prefill_s=512 / (before.prefill_tok_s * 2),
            n_gen=128,
            decode_s=128 / (before.decode_tok_s * 2),
            ttft_s=512 / (before.prefill_tok_s * 2),
        )
        w.run_events.handle(t, P.BenchResultEvent(reps=(rep,), peak_rss_bytes=300 * MiB, n_threads=2))
        w.run_events.handle(t, RunFinished(ok=True, stopped=False))
        qtbot.waitUntil(lambda: bool(w.calibration_note), timeout=30_000)
        assert "recorded for speed calibration" in w.calibration_note, w.calibration_note
        qtbot.waitUntil(lambda: w.speed is not None and w.speed.n_calibration_runs >= 1, timeout=10_000)
        assert w.speed.decode_tok_s > before.decode_tok_s  # it learnt that this machine is faster
        # recorded under this machine's one identity, GPU included, with the GPU's rates
        runs = _records(Path(os.environ["KVTUNER_DATA_DIR"]))
        assert list(runs) == [machine_id(one_gpu)] == [w.session.machine_id]
        assert machine_id(one_gpu) != machine_id(())
        assert "CUDA0" in runs[machine_id(one_gpu)][0]["rates"]
        assert "calibrated on 1 run" in w.prediction.speed_label.text()
    finally:
        w.shutdown()


def test_verify_puts_each_compute_buffer_on_its_device(qtbot, tmp_path, one_gpu, monkeypatch, make_window):
    """GPU-only bug #2: after Verify the window took llama.cpp's buffer names as devices, so the
    pinned host buffer ``CUDA_Host`` never reached the host and its compute buffer showed 0."""
    x_mib, y_mib = 300.25, 12.5
    calls = []

    def fake_dry_run(path, config):  # what a CUDA build of llama.cpp reports
        calls.append(config)
        return dry_run_result(compute_mib={"CUDA0": x_mib, "CUDA_Host": y_mib}, output_mib={"CUDA_Host": 1.0})

    monkeypatch.setattr(verify_module, "dry_run", fake_dry_run)
    w = make_window(PlanConfig(n_ctx=4096), hardware=None, wait=_planned)
    try:
        estimate = {d.device: d.compute_bytes for d in w.plan.devices}
        w.verify()
        qtbot.waitUntil(lambda: w.assessment.verified is not None, timeout=10_000)
        assert calls == [w.config]
        compute = {d.device: d.compute_bytes for d in w.plan.devices}
        assert compute == {"CUDA0": round(x_mib * MiB), "CPU": round(y_mib * MiB)} != estimate
        assert w.plan.compute.source == "dry-run"
        bars = {r.caption: r for r in w.prediction.bars.rows}
        assert bars["RAM (host)"].compute_bytes == round(y_mib * MiB) and "compute" in bars["RAM (host)"].verified
        assert "Verified by llama.cpp" in w.prediction.kv_label.text()
        # another configuration is not verified; coming back to this one shows the figures again
        w.controls.ctx.slider.setValue(w.controls.ctx.slider.value() + 8)
        assert w.assessment.verified is None
        w.controls.ctx.slider.setValue(w.controls.ctx.slider.value() - 8)
        assert w.assessment.verified is not None and w.plan.devices[-1].compute_bytes == round(y_mib * MiB)
    finally:
        w.shutdown()


def test_the_cli_and_the_window_give_the_same_plan_speed_and_advice(qtbot, tmp_path, one_gpu, capsys, make_window):
    """One Session behind both: the same model, configuration, host and what-if card give the
    same plan totals, speed and advice on the command line and in the window."""
    from kvtuner.cli import main as cli_main

    flags = ["--ctx", "65536", "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on", "--ubatch", "1024"]
    assert cli_main(["plan", *flags, "--gpu-mem", "12G", "--ram", "16G", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)

    config = PlanConfig(n_ctx=65536, type_k="q8_0", type_v="q4_0", flash_attn="on", n_ubatch=1024)
    host = HostSpec(total_bytes=16 * GiB, available_bytes=16 * GiB)  # what --ram 16G plans for
    w = make_window(config, hardware=(list(one_gpu), host, ""), what_if="12 GB", wait=_planned)
    try:
        w.replan()
        gui = json.loads(json.dumps(w.assessment.to_dict()))
        assert w.session.machine_id == machine_id(one_gpu)  # the same machine: a what-if card is not one
        assert gui["config"] == cli["config"] and gui["effective"] == cli["effective"]

        def totals(doc):
            return [(d["device"], d["total_bytes"], d["kv_bytes"], d["compute_bytes"]) for d in doc["devices"]]

        assert totals(gui) == totals(cli) and len(totals(cli)) == 2
        assert gui["kv_bytes"] == cli["kv_bytes"] and gui["weights_bytes"] == cli["weights_bytes"]
        assert cli["speed"] is not None and gui["speed"] == cli["speed"]
        assert [a["id"] for a in gui["advice"]] == [a["id"] for a in cli["advice"]]
        assert "kv-type-slow-path" in [a["id"] for a in cli["advice"]]  # mixed K/V types: advice to compare
        # in fact the whole plan --json document; "resolved" lists the llama-server defaults the
        # command line resolved (--ctx 0, -np -1): none here
        assert cli.pop("resolved") == []
        assert gui == cli
    finally:
        w.shutdown()


# -- settings ---------------------------------------------------------------------------------------


def test_settings_live_in_the_configuration_directory(qtbot, tmp_path, monkeypatch, make_window):
    monkeypatch.setenv("KVTUNER_CONFIG_DIR", str(tmp_path / "conf"))
    assert settings_path() == tmp_path / "conf" / "kvtuner.ini"
    w = make_window(settings=None, hardware=([], HOST, ""), model=NO_MODEL)  # the default settings file
    try:
        assert Path(w.settings.fileName()) == tmp_path / "conf" / "kvtuner.ini"
        assert w.settings.format() == QtCore.QSettings.Format.IniFormat
        w.controls.ctx.spin.setValue(16384)
        w.close()
        assert "16384" in (tmp_path / "conf" / "kvtuner.ini").read_text()
    finally:
        w.shutdown()


def test_a_configuration_from_the_command_line_is_used_but_not_remembered(qtbot, tmp_path, make_window):
    settings = ini_settings(tmp_path)
    # a configuration chosen in the window is remembered
    w = make_window(settings=settings, hardware=([], HOST, ""), model=NO_MODEL)
    w.controls.ctx.spin.setValue(16384)
    w.close()
    assert json.loads(settings.value("config"))["n_ctx"] == 16384
    # `kvtuner gui -c 8192`: this session plans with 8192, the next one still starts from 16384
    w2 = make_window(PlanConfig(n_ctx=8192), settings=settings, hardware=([], HOST, ""), wait=_planned)
    assert w2.config.n_ctx == 8192 and w2.plan.config.n_ctx == 8192
    w2.close()
    assert json.loads(settings.value("config"))["n_ctx"] == 16384
    assert settings.value("model/last")  # everything else is saved as usual
    w3 = make_window(settings=settings, hardware=([], HOST, ""), model=NO_MODEL)
    assert w3.config.n_ctx == 16384
    # ... unless the configuration is changed in the window: then that one is remembered
    w3.close()
    w4 = make_window(PlanConfig(n_ctx=8192), settings=settings, hardware=([], HOST, ""), model=NO_MODEL)
    w4.controls.ctx.spin.setValue(4096)
    w4.close()
    assert json.loads(settings.value("config"))["n_ctx"] == 4096


# -- labels, tooltips, advice actions ---------------------------------------------------------------


def test_control_labels_and_tooltips_come_from_the_catalogue(qtbot):
    make_app()
    from kvtuner.gui.widgets.controls import ConfigControls

    c = ConfigControls()
    qtbot.addWidget(c)
    for name, widget in (
        ("n_gpu_layers", c.ngl),
        ("kv_gpu_layers", c.kv),
        ("n_ctx", c.ctx),
        ("type_k", c.type_k),
        ("type_v", c.type_v),
        ("flash_attn", c.flash),
        ("n_seq", c.parallel),
        ("n_ubatch", c.ubatch),
    ):
        f = config_field(name)
        assert c._labels[name].text() == f.label
        assert widget.toolTip().startswith(f.tooltip())


def test_the_advisor_pane_acts_on_the_advice_action_not_its_label(qtbot):
    make_app()
    pane = AdvisorPane()
    qtbot.addWidget(pane)
    stop = Advice("below-abandon-threshold", "error", "slow", "why", {}, "Stop", AdviceAction.STOP_RUN)
    fix = Advice("kv-quant-quality", "info", "quality", "why", {"type_k": "f16", "type_v": "f16"}, "Stop the run")
    plain = Advice("mha-long-context", "info", "long", "why", {}, "")
    assert (stop.action, fix.action, plain.action) == (AdviceAction.STOP_RUN, AdviceAction.FIX, AdviceAction.NONE)
    pane.set_advice([stop, fix, plain], live=True)
    assert pane.stop_button is not None and pane.stop_button.text() == "Stop"
    assert [b.text() for b in pane.buttons] == ["Stop the run"]  # a fix, whatever its label says
    stopped, fixes = [], []
    pane.stop_requested.connect(lambda: stopped.append(True))
    pane.apply_fix.connect(fixes.append)
    pane.stop_button.click()
    pane.buttons[0].click()
    assert stopped == [True] and fixes == [{"type_k": "f16", "type_v": "f16"}]
    assert "action" not in stop.to_dict()  # the plan --json advice keys stay as they are
