"""The app's "MoE layers with experts on CPU" slider: shown for MoE models only, it
moves the experts of the first N layers to RAM, and the memory bars show experts separately."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6")

from kvtuner.core.plan.config import PlanConfig
from kvtuner.testing.gui_support import NO_MODEL
from test_moe_offload import gpt_oss  # noqa: F401  (the gpt-oss-20b-shaped fixture)


def test_moe_slider_moves_experts_and_the_bars_show_them(qtbot, tmp_path, gpt_oss, make_window):  # noqa: F811
    w = make_window(PlanConfig(flash_attn="on"), model=NO_MODEL)
    w.show()
    w.open_model(None)  # the default model is dense: no slider
    qtbot.waitUntil(lambda: w.model is not None, timeout=30_000)
    assert w.controls.moe.isHidden() and w.controls._labels["n_cpu_moe"].isHidden()
    w.open_model(gpt_oss)
    qtbot.waitUntil(lambda: w.model is not None and w.model.n_expert == 32, timeout=30_000)
    w.hardware.choice.setCurrentIndex(w.hardware.choice.findData("8 GB"))
    c = w.controls
    assert not c.moe.isHidden() and c._labels["n_cpu_moe"].text() == "MoE &experts on CPU"
    assert (c.moe.slider.minimum(), c.moe.slider.maximum()) == (0, 24)
    gpu_row = w.prediction.bars.rows[0]
    assert gpu_row.experts_bytes > 0 and gpu_row.free_bytes < 0  # all experts in VRAM: does not fit
    c.moe.slider.setValue(16)
    assert w.config.n_cpu_moe == 16 and w.plan.host.expert_layers == 16
    gpu_row, host_row = w.prediction.bars.rows
    assert host_row.experts_bytes == w.plan.host.expert_bytes > 0
    assert host_row.weights_bytes + host_row.experts_bytes == w.plan.host.weights_bytes
    assert gpu_row.free_bytes > 0  # now it fits
    assert "MoE experts" in w.prediction.bars.toolTip()
    c.moe.spin.setValue(0)
    assert w.config.n_cpu_moe == 0 and w.plan.host.expert_bytes == 0
    shot = tmp_path / "moe.png"
    c.moe.slider.setValue(16)
    qtbot.wait(50)
    assert w.grab().save(str(shot)) and shot.stat().st_size > 0
    if os.environ.get("KVTUNER_MOE_SCREENSHOT"):  # docs/moe-experts-slider.png: 12 layers' experts in RAM
        c.moe.slider.setValue(12)
        qtbot.wait(50)
        w.grab().save(os.environ["KVTUNER_MOE_SCREENSHOT"])
