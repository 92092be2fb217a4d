"""The workload fields next to -np: real widgets offscreen, the default model."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.units import fmt_bytes
from kvtuner.gui.main_window import MainWindow
from kvtuner.testing.gui_support import HOST


def _assessed(w: MainWindow) -> bool:
    return w.model is not None and w.assessment is not None


def test_workload_fields_show_worst_and_expected(qtbot, tmp_path: Path, make_window):
    w = make_window(PlanConfig(n_ctx=8192, n_seq=4, kv_unified=True), wait=_assessed)
    plan = w.assessment.plan
    per = plan.kv_bytes_per_token()
    assert "give an average" in w.workload.text()
    w.workload.avg.setValue(1000)
    w.workload.p95.setValue(3000)
    text = w.workload.text()
    # unified: each of the 4 sequences may reach the whole n_ctx (8192): worst 4 x 8192 cells
    assert f"worst {fmt_bytes(4 * 8192 * per)}" in text
    assert f"P95 {fmt_bytes(4 * 3000 * per)}" in text and f"expected {fmt_bytes(4 * 1000 * per)}" in text
    # the 8192-cell pool holds 4 x 1000 (expected) but not 4 x 3000 (P95)
    assert "safe for the expected (average) case only" in text and "-c 32768" in text
    w.workload.avg.setValue(9000)  # longer than the window: one line saying what to change
    assert "--avg-tokens" in w.workload.text()


def test_decision_table_dialog_on_a_what_if_card(qtbot, tmp_path: Path, make_window):
    from kvtuner.core.hardware.specs import catalogue_gpu
    from kvtuner.core.plan.decision_table import kv_bytes_per_token
    from kvtuner.core.plan.vllm import VllmModel
    from kvtuner.core.units import GiB

    gpu = catalogue_gpu("RTX 3090")
    w = make_window(PlanConfig(), hardware=([gpu], HOST, "test"), wait=_assessed)
    w.workload.table_button.click()
    d = w.workload.table_dialog
    assert d is not None and len(d.cells) == 4 * 3 * 3
    per = kv_bytes_per_token(VllmModel.from_profile(w.assessment.plan.model), "f16")
    c = next(c for c in d.cells if (c.n_seq, c.window, c.kv_type) == (4, 32768, "f16"))
    assert c.kv_bytes == 4 * 32768 * per and c.fits and c.total_bytes < 24 * GiB
    assert d.cell_text(4, 32768, "f16").startswith(f"fits: KV {fmt_bytes(4 * 32768 * per)}, ")
    assert "tok/s" in d.cell_text(1, 8192, "fp8")
