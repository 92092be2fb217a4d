"""The window's projector / draft / LoRA files: real widgets offscreen, the default model."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from kvtuner.core.plan.config import PlanConfig
from kvtuner.testing.gguf_extras import write_lora, write_not_gguf, write_projector

SHOT = os.environ.get("KVTUNER_EXTRAS_SCREENSHOT")


def test_window_takes_the_files_and_draws_their_segments(
    qtbot, tmp_path: Path, default_model, default_profile, make_window
):
    w = make_window(PlanConfig(n_ctx=4096, n_seq=1), wait=lambda w: w.model is not None and w.assessment is not None)
    host_before = w.prediction.bars.rows[-1].total_bytes
    proj = write_projector(tmp_path / "mmproj.gguf", default_profile.n_embd)
    lora = write_lora(tmp_path / "a.gguf", default_model)
    w.extras_panel.set_paths(str(proj), str(default_model), str(lora))
    xp = w.extras_plan
    assert xp is not None
    row = w.prediction.bars.rows[-1]  # the host (no GPU here)
    assert row.mmproj_bytes == xp.part_bytes("mmproj", device="CPU") > 797 * (1 << 20)
    assert row.draft_bytes == xp.part_bytes("draft", device="CPU") > 0
    assert row.lora_bytes == xp.part_bytes("lora", device="CPU") > 0
    assert row.total_bytes == host_before + row.mmproj_bytes + row.draft_bytes + row.lora_bytes
    # the session counts them: the plan's own host total, hence the fit verdict and the advice
    assert w.assessment.plan.host.total_bytes == row.total_bytes
    labels = [label for label, _ in w.prediction.bars._legend_items()]
    assert {"projector", "draft model", "LoRA"} <= set(labels)
    assert "projector" in w.prediction.bars.toolTip()
    assert "one image takes 256 tokens" in w.extras_panel.status.text()
    if SHOT:
        w.resize(1600, 1000)
        w.show()
        qtbot.wait(200)
        w.grab().save(SHOT)
    # -ngld 0: the draft's layers stay on the host (no GPU here: nothing changes but the value)
    w.extras_panel.draft_ngl.setValue(0)
    assert w.extras_panel.extras().draft_gpu_layers == 0 and w.extras_plan.config.draft_gpu_layers == 0
    w.extras_panel.draft_ngl.setValue(-1)
    # the window's export carries the flags
    dlg = w.open_export()
    assert dlg is not None
    dlg.target.setCurrentText("llama-server")
    dlg.render()
    text = dlg.preview.toPlainText()
    assert f"--mmproj {proj}" in text and f"-md {default_model}" in text and f"--lora {lora}" in text
    dlg.close()
    # a bad file: one line in the panel, the plan of the model stays
    w.extras_panel.set_paths(str(write_not_gguf(tmp_path / "bad.gguf")), "", "")
    assert w.extras_plan is None and "--mmproj" in w.extras_panel.status.text()
    assert w.prediction.bars.rows[-1].total_bytes == host_before
