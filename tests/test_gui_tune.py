"""The Tune dialog: opened from the window, tunes on a worker, draws the knee chart, Apply puts
the result on the controls (real widgets, offscreen)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from kvtuner.core.hardware.specs import HostSpec, what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.speed.speed_model import speed_inputs
from kvtuner.core.units import GiB
from kvtuner.gui.tune_panel import TunePanel
from kvtuner.testing.gguf_factory import write_real_shape
from kvtuner.testing.gui_support import HOST


def test_window_tune_dialog_applies_to_the_controls(qtbot, tmp_path, make_window):
    w = make_window(
        PlanConfig(n_ctx=4096), hardware=([], HOST, ""), wait=lambda w: w.plan is not None and w.tasks.pending == 0
    )
    try:
        dlg = w.open_tune()
        qtbot.addWidget(dlg)
        dlg.ctx_spin.setValue(8192)
        assert dlg.start()
        assert dlg.busy  # the search runs on the worker pool, not here
        qtbot.waitUntil(lambda: not dlg.busy, timeout=60_000)
        assert dlg.result is not None and dlg.result.best is not None, dlg.text.text()
        assert dlg.curves and dlg.curves[0].points
        assert len(dlg.plot.plotItem.listDataItems()) >= 2
        dlg.apply()
        # what was asked is the tuned configuration; on CPU only the GPU knobs do not apply
        assert w.wanted_config == dlg.result.best.config
        assert w.config == dlg.result.best.config.with_(n_gpu_layers=0)
        assert w.controls.ctx.spin.value() == 8192
    finally:
        w.shutdown()


def test_knee_chart_of_the_issue_case(qtbot, tmp_path):
    model = ModelProfile.from_gguf(write_real_shape(tmp_path / "l8.gguf", "llama-3.1-8b", "Q4_K_M"))
    gpus = (what_if_gpu(12 * GiB),)
    host = HostSpec(total_bytes=64 * GiB, available_bytes=64 * GiB, mem_bandwidth_bytes_s=50e9)
    inputs = speed_inputs(gpus, host, measure=False, n_threads=8)
    got = []
    panel = TunePanel(
        lambda: (model, PlanConfig(n_ctx=131072), gpus, host, inputs), lambda fn, done, failed: done(fn()), got.append
    )
    qtbot.addWidget(panel)
    panel.ctx_spin.setValue(131072)
    panel.quality.setCurrentIndex(2)  # q4_0
    assert panel.start()
    r = panel.result
    assert r is not None and r.best.config.type_k == "q4_0" and r.best.decode_tok_s > 10
    assert any(c.config == r.fit_equivalent.config for c in panel.curves)
    panel.add_measured(65536, 20.0)
    assert panel.measured == [(65536, 20.0)]
    panel.apply()
    assert got == [r.best.config]


def test_apply_puts_the_ffn_split_on_the_controls(qtbot, tmp_path, make_window):
    """The issue's case with the default q8_0 floor on a 12 GB what-if card: the tuned
    configuration keeps the dense FFN of some layers in RAM (--n-cpu-ffn); the dialog says what
    that trades and Apply shows it on the "Dense FFN on CPU" slider of the controls."""
    path = write_real_shape(tmp_path / "l8.gguf", "llama-3.1-8b", "Q4_K_M")
    host = HostSpec(total_bytes=64 * GiB, available_bytes=64 * GiB, mem_bandwidth_bytes_s=50e9)
    w = make_window(
        PlanConfig(n_ctx=131072),
        hardware=([what_if_gpu(12 * GiB)], host, "test"),
        model=path,
        wait=lambda w: w.plan is not None and w.model_path == path and w.tasks.pending == 0,
    )
    try:
        c = w.controls
        assert c.ffn.isHidden() and c._labels["n_cpu_ffn"].isHidden()  # a dense model without the split
        dlg = w.open_tune()
        qtbot.addWidget(dlg)
        dlg.ctx_spin.setValue(131072)
        assert dlg.start()
        qtbot.waitUntil(lambda: not dlg.busy, timeout=60_000)
        best = dlg.result.best
        assert best is not None and best.config.type_k == "q8_0" and best.config.n_cpu_ffn > 0, dlg.text.text()
        assert f"FFN on CPU {best.config.n_cpu_ffn}" in dlg.text.text() and "Trade: --n-cpu-ffn" in dlg.text.text()
        dlg.apply()
        assert w.config == best.config
        assert not c.ffn.isHidden() and c._labels["n_cpu_ffn"].text() == "Dense FFN on CPU"
        assert c.ffn.value() == best.config.n_cpu_ffn and c.ffn.slider.maximum() == 32
        assert w.plan.config.n_cpu_ffn == best.config.n_cpu_ffn
        c.ffn.spin.setValue(best.config.n_cpu_ffn + 2)  # the slider moves it like any other control
        qtbot.waitUntil(lambda: w.config.n_cpu_ffn == best.config.n_cpu_ffn + 2, timeout=10_000)
    finally:
        w.shutdown()
