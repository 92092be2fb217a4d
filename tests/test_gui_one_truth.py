"""The window tells one truth. What the controls show is what is planned, predicted,
run and exported; a control that does not apply reads "n/a" and its value is not used; a
refused combination keeps the last plan marked stale with a one-click fix; the badge combines
fit and speed; a machine without GPU plans for itself (CPU only) by default.

Real widgets offscreen, the real default model, the real runner (a short bench) in a child."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from kvtuner.core.export import export
from kvtuner.core.hardware.host import detect_host
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.speed.speed_model import speed_band
from kvtuner.gui.main_window import MainWindow
from kvtuner.gui.run_controller import BenchSettings
from kvtuner.gui.widgets.hardware_panel import CPU_ONLY, DEFAULT_WHAT_IF
from kvtuner.gui.widgets.prediction_panel import verdict
from kvtuner.testing.gui_support import HOST, NO_MODEL, IdleSampler

SMALL = PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64)


@pytest.fixture
def window(make_window):
    """The default model planned for ``host`` without GPU."""

    def make(config=SMALL, *, host=HOST, bench=None, sampler=None):
        return make_window(
            config,
            hardware=([], host, "test: no NVML"),
            bench=bench,
            sampler=sampler or IdleSampler,
            wait=lambda w: w.model is not None and w.assessment is not None,
        )

    return make


def _choose(qtbot, w: MainWindow, choice: str) -> None:
    hw = w.hardware
    hw.choice.setCurrentIndex(hw.choice.findData(choice))
    assert hw.current_choice() == choice


def _server_line(w: MainWindow) -> str:
    dlg = w.open_export()
    assert dlg is not None
    try:
        dlg.target.setCurrentText("llama-server")
        assert dlg.result is not None, dlg.error
        return dlg.result.text
    finally:
        dlg.close()


def test_no_gpu_plans_for_this_machine_by_default(qtbot, tmp_path, window):
    w = window()
    assert w.hardware.current_choice() == CPU_ONLY
    assert "this machine plans CPU only" in w.hardware.detected_label.text()
    assert w.hardware.gpus() == [] and w.plan.n_gpu_layers == 0 and w.config.n_gpu_layers == 0
    # GPU layers and KV layers do not apply: they read n/a and are disabled, with the reason
    for entry in (w.controls.ngl, w.controls.kv):
        assert entry.spin.text() == "n/a" and not entry.isEnabled()
        assert entry.spin.toolTip().startswith("Does not apply: CPU only")
    # the predicted lines are for this machine, labelled so
    assert "on this machine, CPU only" in w.graphs_box.title()
    assert {"predicted decode", "predicted prefill", "predicted runner RAM"} <= {
        line.label.format for line, _ in w.graphs._predicted
    }
    # a what-if card is an explicit choice: named, with its bandwidth; its plan draws no
    # predicted line over this machine's measurements
    _choose(qtbot, w, DEFAULT_WHAT_IF)
    assert "RTX 3060 12GB" in w.hardware.choice.currentText() and "GB/s" in w.hardware.choice.currentText()
    assert w.plan.n_gpu_layers > 0 and w.graphs._predicted == []
    assert "no predicted lines: the plan is for RTX 3060 12GB (what-if)" in w.graphs_box.title()


def test_a_refused_combination_keeps_the_last_plan_stale_and_offers_the_fix(qtbot, tmp_path, window):
    w = window(PlanConfig(n_ctx=4096, type_k="q8_0", type_v="q8_0", flash_attn="on"))
    before = w.assessment
    w.controls.flash.setCurrentText("off")  # quantized V needs flash attention: llama.cpp refuses
    assert w.stale and w.assessment is before and w.config.flash_attn == "on"
    assert w.prediction.title().startswith("Prediction - STALE") and not w.prediction.speed_label.isEnabled()
    text = w.controls.error_label.text()
    assert "--" not in text and '"Flash attention (-fa)" on' in text, text  # what to click, not a flag
    assert not w.controls.fix_button.isHidden() and w.controls.fix_button.text() == "Turn flash attention on"
    assert not w.run_controls.run_button.isEnabled() and not w.export_action.isEnabled()
    assert w.open_export() is None and w.start_run() is False
    w.controls.fix_button.click()
    assert not w.stale and w.config.flash_attn == "on" and w.controls.flash.currentText() == "on"
    assert w.prediction.title() == "Prediction" and w.run_controls.run_button.isEnabled()
    assert w.export_action.isEnabled() and w.controls.error_label.isHidden()


@pytest.mark.slow
def test_the_badge_is_the_worse_of_fit_and_both_speeds(qtbot, tmp_path, window):
    w = window(PlanConfig(n_ctx=1 << 22, type_k="f32", type_v="f32"))
    _choose(qtbot, w, DEFAULT_WHAT_IF)  # 4M tokens of f32 KV do not fit a 12 GB card ...
    assert not w.assessment.fits
    assert speed_band(min(w.speed.decode_tok_s, w.speed.decode_tok_s_at_full_ctx)) == "fluent"  # ... at any speed
    assert w.prediction.badge.text() == "DOES NOT FIT" and "over" in w.prediction.badge.toolTip()
    w.controls.set_config(SMALL)
    w.set_config(SMALL)
    assert w.assessment.fits
    speed = w.speed
    worse = min(speed.decode_tok_s, speed.decode_tok_s_at_full_ctx)
    assert w.prediction.badge.text() == speed_band(worse).upper()
    # full-context speed worse than the empty cache's: the badge follows it, the tooltip says why
    slow_full = dataclasses.replace(speed, decode_tok_s=20.0, decode_tok_s_at_full_ctx=3.0)
    name, reason = verdict(w.plan, slow_full)
    assert name == "offline" and "with the context full" in reason and "20" in reason


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_finding_1_shows_runs_and_exports_the_same_configuration(qtbot, tmp_path, window):
    """What-if 16 GB card, KV layers on GPU 5, then "Plan for" CPU only: the KV control reads
    n/a and its 5 is not used; prediction, badge and advice replan; Export and Run take exactly
    the configuration shown; the run calibrates this machine, never the what-if card."""
    from kvtuner.core.monitor.sampler import Sampler

    bench = BenchSettings(n_prompt=32, n_gen=8, repetitions=1, warmup=False)
    w = window(
        SMALL,
        host=detect_host(),
        bench=bench,
        sampler=Sampler(interval_s=0.1, capacity=600, gpus=False),
    )
    # this test is about what runs, not how fast: count the run whatever else loads this shared
    # machine (test_a_run_on_a_busy_machine_is_kept_out tests the quiet-machine rule)
    w.run_events.quiet_max_other_cores = math.inf
    try:
        _choose(qtbot, w, "16 GB")
        w.controls.kv.spin.setValue(5)
        assert w.config.kv_gpu_layers == 5 and w.config.n_gpu_layers == -1
        assert any(d.kind == "gpu" and d.kv_bytes for d in w.plan.devices)
        gpu_text, gpu_speed = w.prediction.speed_label.text(), w.speed.decode_tok_s
        assert "-ot" in _server_line(w)

        _choose(qtbot, w, CPU_ONLY)
        assert w.controls.kv.spin.text() == "n/a" and not w.controls.kv.isEnabled()
        assert w.controls.error_label.isHidden() and not w.stale
        assert w.config == SMALL.with_(n_gpu_layers=0, kv_gpu_layers=None)
        assert w.plan.config == w.config and w.session.config == w.config
        assert w.plan.n_gpu_layers == 0 and all(d.kind == "host" for d in w.plan.devices if d.kv_bytes)
        assert w.speed.decode_tok_s != gpu_speed and w.prediction.speed_label.text() != gpu_text
        assert w.advice == list(w.session.assess().advice)  # the advice of the CPU plan
        name, _ = verdict(w.plan, w.speed)
        assert w.prediction.badge.text() == name.upper()

        line = _server_line(w)
        assert line == export("llama-server", w.model_path, w.config, model=w.model).text
        assert "-ot" not in line and "-ngl 0" in line and "-c 512" in line

        assert not w.sampling_fast  # nothing running: 1 Hz (idle under 1% of a core)
        assert w.start_run()
        assert w.sampling_fast and w.feed.timer.interval() == 100  # a run: 10 Hz
        qtbot.waitUntil(lambda: not w.runner.running and w.last_run is not None, timeout=240_000)
        w.pull()
        assert w.last_error == "", w.last_error
        assert w.run_events.run_config == w.config and w.last_run[1] == w.config
        assert not any("Requested a" in a.message for a in w.advice)
        qtbot.waitUntil(lambda: "recorded for speed calibration" in w.calibration_note, timeout=30_000)

        # this machine's run calibrates this machine's prediction, never the what-if card's
        w.replan()
        assert w.speed.n_calibration_runs >= 1
        _choose(qtbot, w, "16 GB")
        assert w.speed.n_calibration_runs == 0
        assert w.config.kv_gpu_layers == 5  # asked for before, not used on the CPU: back again
        assert w.controls.kv.spin.text() == "5"
        qtbot.waitUntil(lambda: not w.sampling_fast, timeout=15_000)  # idle again after the run
        assert w.feed.timer.interval() == 1000
    finally:
        w.shutdown()


def test_ctrl_e_exports_while_a_number_box_has_focus(qtbot, tmp_path, window):
    """Under X11 a QLineEdit takes Ctrl+E for itself ("end of line", Qt's X11 key bindings: its
    ShortcutOverride is accepted) and Export never fired. Offscreen Qt has no X11 key bindings,
    so a filter on the number box accepts the override the way X11's QLineEdit
    does; the window's filter must run first and hand Ctrl+E to the Export action."""
    from PySide6 import QtCore, QtWidgets
    from PySide6.QtTest import QTest

    class AcceptsCtrlE(QtCore.QObject):  # what QLineEdit::event does with the X11 key bindings
        def eventFilter(self, obj, event):  # noqa: N802 (Qt API)
            if event.type() == QtCore.QEvent.Type.ShortcutOverride and event.key() == QtCore.Qt.Key.Key_E:
                event.accept()
                return True
            return False

    w = window()
    edit = w.controls.ctx.spin  # QAbstractSpinBox::event passes ShortcutOverride to its line edit's event()
    x11 = AcceptsCtrlE(w)
    edit.removeEventFilter(w._shortcuts)
    edit.installEventFilter(x11)
    edit.installEventFilter(w._shortcuts)  # the last installed runs first: the window's, as in the app
    w.show()
    w.activateWindow()
    qtbot.waitExposed(w)
    spin = w.controls.ctx.spin
    spin.setFocus()
    qtbot.waitUntil(lambda: QtWidgets.QApplication.focusWidget() is spin, timeout=5_000)
    exported = []
    w.export_action.triggered.connect(lambda *_: exported.append(True))
    QTest.keyClick(spin, QtCore.Qt.Key.Key_E, QtCore.Qt.KeyboardModifier.ControlModifier)
    assert exported  # QLineEdit's own Ctrl+E ("end of line") no longer swallows it
    for dlg in w.findChildren(QtWidgets.QDialog):
        dlg.close()


def test_quantized_kv_advice_says_how_much_it_saves(qtbot, tmp_path, window):
    w = window(PlanConfig(n_ctx=4096, type_k="q4_0", type_v="q5_1", flash_attn="on"))
    text = next(a.message for a in w.advice if a.id == "kv-quant-quality")
    assert "q4_0 0.281x, q5_1 0.375x of f16" in text and "halve" not in text


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_a_run_on_a_busy_machine_is_kept_out_of_calibration_and_known_good(qtbot, tmp_path, window):
    """Runs made while the machine was busy measured the other load. Two
    busy-loop processes (as many as this VM has cores) run beside a short bench: the run is
    flagged, its figures are shown but neither calibrate nor enter Known good."""
    from kvtuner.core.monitor.contention import QUIET_MAX_OTHER_CORES, cpu_snapshot, other_cores
    from kvtuner.core.monitor.sampler import Sampler
    from kvtuner.core.store.library import ConfigLibrary

    bench = BenchSettings(n_prompt=32, n_gen=16, repetitions=1, warmup=False)
    w = window(
        SMALL,
        host=detect_host(),
        bench=bench,
        sampler=Sampler(interval_s=0.1, capacity=600, gpus=False),
    )
    w.run_events.quiet_max_other_cores = QUIET_MAX_OTHER_CORES  # the rule itself (conftest turns it off)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        before = cpu_snapshot()
        qtbot.wait(1500)
        assert other_cores(before, cpu_snapshot()) > 1.0  # the loops, measured as other load
        assert w.start_run()
        qtbot.waitUntil(lambda: not w.runner.running and w.last_run is not None, timeout=240_000)
        assert w.run_events.other_cores > w.run_events.quiet_max_other_cores
        assert "machine was busy" in w.calibration_note and "not used for calibration" in w.calibration_note
        assert "decode_tok_s" in w.measured  # the figures are still shown
        qtbot.wait(500)
        assert w.run_events.saved_run_id is None
        store = w.session.calibration_store()
        assert all(not store.runs(m) for m in [w.session.machine_id])
        with ConfigLibrary() as lib:
            assert lib.known_good() == []
    finally:
        for p in loops:
            p.kill()
            p.wait()
        w.shutdown()


def _mnemonic(text: str) -> str | None:
    i = text.replace("&&", "").find("&")
    return text.replace("&&", "")[i + 1].lower() if 0 <= i < len(text.replace("&&", "")) - 1 else None


def test_alt_letters_are_unique_and_go_to_the_number_box(qtbot, tmp_path, window):
    from PySide6 import QtWidgets

    w = window()
    owners: dict[str, list[str]] = {}
    texts = [a.text() for a in w.menuBar().actions()]
    for widget in w.findChildren(QtWidgets.QAbstractButton) + w.findChildren(QtWidgets.QLabel):
        if isinstance(widget, QtWidgets.QLabel) and widget.buddy() is None:
            continue
        texts.append(widget.text())
    for text in texts:
        if (m := _mnemonic(text)) is not None:
            owners.setdefault(m, []).append(text)
    assert {m: t for m, t in owners.items() if len(t) > 1} == {}
    # a slider's label hands the focus to its number box, where a value can be typed
    for name, entry in (("n_ctx", w.controls.ctx), ("n_seq", w.controls.parallel)):
        assert w.controls._labels[name].buddy() is entry.spin


def test_export_wraps_and_saves_where_the_last_export_went(qtbot, tmp_path, window):
    from PySide6 import QtWidgets

    w = window()
    dlg = w.open_export()
    assert dlg.preview.lineWrapMode() == QtWidgets.QPlainTextEdit.LineWrapMode.WidgetWidth
    assert Path(dlg.suggested_path()).parent == Path.home()  # not the model cache folder
    out_dir = tmp_path / "exports"
    out_dir.mkdir()
    assert dlg.save_to(str(out_dir / "run.sh")) is not None
    dlg.close()
    dlg2 = w.open_export()
    assert Path(dlg2.suggested_path()).parent == out_dir
    dlg2.close()


def test_error_banner_dismisses_reset_and_about(qtbot, tmp_path, window):
    w = window(PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on"))
    w.open_model(tmp_path / "missing.gguf")
    qtbot.waitUntil(lambda: "missing.gguf" in w.last_error, timeout=10_000)
    assert not w.banner_row.isHidden()
    w.dismiss_button.click()
    assert w.banner_row.isHidden() and w.model is not None  # the current model stays
    w.reset_action.trigger()
    assert w.wanted_config == PlanConfig() and w.config == PlanConfig().with_(n_gpu_layers=0)
    assert w.controls.type_k.currentText() == "f16" and w.plan.config == w.config
    from kvtuner.gui.about import about_text

    assert "kvtuner" in about_text() and "Plans for" in about_text()
    assert [a.text() for a in w.menuBar().actions()] == ["&File", "&Run", "&Help"]


@pytest.mark.llama
def test_available_ram_is_read_live_and_verified_goes_stale(qtbot, tmp_path, window):
    """The plan's RAM headroom follows the RAM available now (the test host says 12 GiB; the
    real sampler reads this machine), and "verified by llama.cpp" does not outlive a change."""
    from kvtuner.core.monitor.sampler import Sampler
    from kvtuner.gui.live_feed import RAM_REPLAN_BYTES
    from kvtuner.gui.verify import VERIFIED_TEXT

    w = window(sampler=Sampler(interval_s=0.1, capacity=600, gpus=False))
    try:
        real = detect_host().available_bytes
        if abs(real - HOST.available_bytes) < 2 * RAM_REPLAN_BYTES:
            pytest.skip("this machine has about the test host's available RAM")
        qtbot.waitUntil(lambda: abs(w.session.host.available_bytes - real) < 2 * RAM_REPLAN_BYTES, timeout=10_000)
        host_row = next(d for d in w.plan.devices if d.kind == "host")
        assert abs(host_row.free_bytes - real) < 2 * RAM_REPLAN_BYTES
        assert "available" in w.hardware.ram_label.text()
        if importlib.util.find_spec("llama_cpp") is not None:
            w.verify()  # a real dry run in a child process
            qtbot.waitUntil(lambda: w.assessment.verified is not None, timeout=120_000)
            assert w.run_controls.progress.format() == VERIFIED_TEXT
            w.controls.ctx.spin.setValue(1024)
            assert w.assessment.verified is None
            assert w.run_controls.progress.format() == "not verified for this configuration"
    finally:
        w.shutdown()


def test_at_1280x720_nothing_is_clipped(qtbot, tmp_path, window):
    """The window fits a 1280x720 screen (no minimum size above it), the prediction's wrapped
    lines and the advice notes show whole."""
    w = window()
    w.resize(1280, 720)
    w.show()
    qtbot.waitExposed(w)
    assert (w.width(), w.height()) == (1280, 720)
    # the host bandwidth probe's result replans and rewrites the prediction: measure after it
    qtbot.waitUntil(lambda: w.tasks.pending == 0, timeout=30_000)
    w.advisor.set_notes(
        [
            "the machine was busy during this run (1.5 cores of other load): not used for "
            "calibration or Known good; run again when it is quiet",
            "a second note",
        ]
    )
    qtbot.wait(50)
    notes = w.advisor.notes
    assert notes.height() >= notes.heightForWidth(notes.width())
    for label in (w.prediction.kv_label, w.prediction.speed_label):
        assert label.height() >= label.heightForWidth(label.width())
    bars = w.prediction.bars
    assert bars.height() >= bars.heightForWidth(bars.width())


def test_refusals_and_warnings_name_controls_not_flags():
    from kvtuner.gui.config_state import gui_wording

    for cli in (
        "no GPU: n_gpu_layers is accepted but every layer stays on the CPU (give --gpu-mem to plan a what-if GPU)",
        "--kv-gpu-layers 5 needs a GPU and none is planned for: leave it out for a CPU-only plan, or plan a "
        "what-if card with --gpu-mem 12G",
        "approximate: a guess (plan --verify reads the real structure from llama.cpp)",
        "a quantized V cache (q8_0) requires flash attention: use --flash-attn on (or auto), or --cache-type-v f16",
    ):
        text = gui_wording(cli)
        assert "--" not in text, text
    assert 'choose a what-if card in "Plan for"' in gui_wording("x (give --gpu-mem to plan a what-if GPU)")
    assert (
        gui_wording("predicts 30.4 tok/s (kvtuner tune --kv-quality q4_0).")
        == 'predicts 30.4 tok/s (Tune..., "KV quality floor" q4_0).'
    )


def test_bench_length_and_threads_are_set_in_the_run_controls(qtbot, tmp_path, window):
    w = window(bench=BenchSettings(n_prompt=256, n_gen=64, repetitions=2))
    b = w.run_controls.bench
    assert b.text().strip() == "256+64 tok x2, auto threads"
    b.n_gen.setValue(16)
    b.n_threads.setValue(1)
    b.repetitions.setValue(1)
    s = w.runner.settings
    assert (s.n_prompt, s.n_gen, s.repetitions, s.n_threads) == (256, 16, 1, 1)
    assert b.text().strip() == "256+16 tok x1, 1 threads"
    b.n_threads.setValue(0)
    assert w.runner.settings.n_threads is None and b.n_threads.text() == "auto"


def test_the_windows_own_sampler_idles_at_1_hz(qtbot, tmp_path, make_window):
    w = make_window(SMALL, hardware=([], HOST, "test"), sampler=None, model=NO_MODEL)  # the window's own sampler
    try:
        assert w.sampler.interval_s == pytest.approx(1.0) and w.feed.timer.interval() == 1000
        w.feed.set_sampling(fast=True)  # what Run does
        assert w.sampler.interval_s == pytest.approx(0.1) and w.feed.timer.interval() == 100
    finally:
        w.shutdown()


def test_parallel_advice_offers_one_sequence_only_when_it_saves_memory(qtbot, tmp_path, window):
    w = window(PlanConfig(n_ctx=16384, n_seq=4))
    adv = next(a for a in w.advice if a.id == "parallel-multiplies-kv")
    one = w.session.plan().kv_bytes  # the 4-sequence plan's KV ...
    w.set_config(PlanConfig(n_ctx=16384, n_seq=1))
    saving = one - w.plan.kv_bytes  # ... against one sequence's: the sliding-window floor per stream
    assert 0 < saving < 256 << 20
    assert adv.fix == {} and "one sequence would save" in adv.message  # said, not offered as a fix
