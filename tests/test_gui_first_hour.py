"""The window shows what matters to a newcomer: every advice row and its fix whole at the default
size (or reachable by scrolling), messages in control names, a rolling decode rate on the live
graph, no card chosen for the user, Run only with a model, Open in the user's folder, and a
First steps page.

Real widgets offscreen at the default 1440x920; the real default model and the sparse
Llama-3.1-8B shape (kvtuner/testing/gguf_factory.py); runner events are the real protocol messages fed to
the window's real handler."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6 import QtCore, QtWidgets

from kvtuner.core.hardware.specs import HostSpec
from kvtuner.core.monitor.rolling import RollingRate
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.fields import FIELDS
from kvtuner.gui.main_window import MainWindow
from kvtuner.gui.widgets.device_list import ADD_CARD_PLACEHOLDER
from kvtuner.gui.widgets.run_controls import NO_MODEL_TIP
from kvtuner.runner import protocol as P
from kvtuner.testing.gui_support import HOST, NO_MODEL

GiB = 1 << 30
RAM_32G = HostSpec(total_bytes=32 * GiB, available_bytes=32 * GiB, swap_total_bytes=0)
RTX_3060 = ("card:RTX 3060 12GB", None)


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory) -> Path:
    """The sparse Llama-3.1-8B Q4_K_M shape (zero weights)."""
    from kvtuner.testing.gguf_factory import write_real_shape

    return write_real_shape(tmp_path_factory.mktemp("llama8b") / "llama-3.1-8b.gguf", "llama-3.1-8b")


@pytest.fixture
def window(make_window):
    """A window at the default size, shown, planned for the RTX 3060 12GB with 32 GiB RAM (as
    ``kvtuner gui FILE --gpu "RTX 3060 12GB" --ram 32G``)."""

    def make(config=None, model=None, *, plan_for=RTX_3060, host=RAM_32G, open_model=True):
        return make_window(
            config,
            hardware=([], host, "test: no NVML"),
            plan_for=plan_for,
            host=host,
            size=(1440, 920),
            model=model if open_model else NO_MODEL,
            wait=lambda w: w.model is not None and w.assessment is not None,
        )

    return make


def _shown_whole(widget: QtWidgets.QWidget, viewport: QtWidgets.QWidget) -> bool:
    """The widget lies inside the viewport, at least as wide and tall as it asks to be."""
    top_left = widget.mapTo(viewport, QtCore.QPoint(0, 0))
    inside = (
        top_left.x() >= 0
        and top_left.y() >= 0
        and top_left.x() + widget.width() <= viewport.width()
        and top_left.y() + widget.height() <= viewport.height()
    )
    if isinstance(widget, QtWidgets.QLabel) and widget.wordWrap():  # wrapped: tall enough for its width
        return inside and widget.height() >= widget.heightForWidth(widget.width())
    return inside and widget.width() >= widget.sizeHint().width() and widget.height() >= widget.sizeHint().height()


def _advice_settled(qtbot, w: MainWindow, n_items: int) -> None:
    """Wait for ``n_items`` advice items and for the window's background work (the host
    bandwidth probe, whose result replans and rebuilds the rows), then let the layout run."""
    qtbot.waitUntil(lambda: w.tasks.pending == 0 and len(w.advisor.items) >= n_items, timeout=30_000)
    qtbot.wait(100)


def _row_labels(w: MainWindow) -> list[QtWidgets.QLabel]:
    return [lab for lab in w.advisor._body.findChildren(QtWidgets.QLabel) if lab.isVisibleTo(w.advisor) and lab.text()]


# -- the advice pane ---------------------------------------------------------------------------------


def test_three_advice_items_and_their_fixes_show_whole_at_the_default_size(qtbot, tmp_path, llama8b, window):
    """8B at 128K on a 12 GB card with 20 GPU layers: does not fit, too slow, --fit off. Every
    sentence and both fix buttons are inside the pane, none clipped, without scrolling."""
    w = window(PlanConfig(n_ctx=131072, n_gpu_layers=20), llama8b)
    _advice_settled(qtbot, w, 3)
    viewport = w.advisor._scroll.viewport()
    assert len(w.advisor.buttons) >= 2
    for widget in (*w.advisor.buttons, *_row_labels(w)):
        assert _shown_whole(widget, viewport), (widget.text(), widget.geometry(), viewport.size())
    assert w.advisor._scroll.verticalScrollBar().maximum() == 0  # nothing hidden below
    assert w.right_split.sizes()[0] > w.right_split.sizes()[1] / 2  # the graphs keep their room


def test_many_advice_items_scroll_with_every_fix_reachable(qtbot, tmp_path, llama8b, window):
    """Six items: the pane takes at most 60% of the column and scrolls; each fix, scrolled to,
    shows whole (never wider than the pane)."""
    w = window(
        PlanConfig(n_ctx=131072, n_gpu_layers=32, n_seq=4, type_k="q8_0", type_v="q4_0", flash_attn="on"),
        llama8b,
    )
    _advice_settled(qtbot, w, 5)
    graphs, advice = w.right_split.sizes()
    assert advice <= 0.6 * (graphs + advice) + 1
    viewport = w.advisor._scroll.viewport()
    for button in w.advisor.buttons:
        w.advisor._scroll.ensureWidgetVisible(button, 0, 0)
        QtWidgets.QApplication.processEvents()
        assert _shown_whole(button, viewport), (button.text(), button.geometry(), viewport.size())


def test_the_pane_shrinks_back_when_the_advice_goes(qtbot, tmp_path, llama8b, window):
    """Also when the layout gave the pane less than it asked (the graphs' least height); not after
    the user dragged the splitter."""
    w = window(PlanConfig(n_ctx=131072, n_gpu_layers=20), llama8b)
    _advice_settled(qtbot, w, 3)
    # one round trip first: the prediction above the splitter keeps the height its longest text
    # took, which changes the room the splitter has; the pane's own sizing is what is checked
    w.set_config(PlanConfig(n_ctx=8192))
    QtWidgets.QApplication.processEvents()
    w.set_config(PlanConfig(n_ctx=131072, n_gpu_layers=20))
    qtbot.waitUntil(lambda: len(w.advisor.items) >= 3, timeout=10_000)
    QtWidgets.QApplication.processEvents()
    grown = w.right_split.sizes()[1]
    w.set_config(PlanConfig(n_ctx=8192))
    QtWidgets.QApplication.processEvents()
    assert w.right_split.sizes()[1] < grown
    w.set_config(PlanConfig(n_ctx=131072, n_gpu_layers=20))
    qtbot.waitUntil(lambda: w.right_split.sizes()[1] == grown, timeout=10_000)
    w.right_split.splitterMoved.emit(w.right_split.sizes()[0], 1)  # as a drag by the user says
    w.set_config(PlanConfig(n_ctx=8192))
    QtWidgets.QApplication.processEvents()
    assert w.right_split.sizes()[1] == grown


# -- control names, not flags or field names ---------------------------------------------------------


FIELD_NAME = re.compile(r"\b(" + "|".join(f.name for f in FIELDS) + r")\b")
LABELS = sorted((f.label.replace("&", "") for f in FIELDS), key=len, reverse=True)
FLAG = re.compile(r"(?<![\w-])(" + "|".join(re.escape(s) for f in FIELDS for s in (f.flag, *f.aliases)) + r")(?![\w-])")


def test_advice_and_fixes_are_worded_in_control_names(qtbot, tmp_path, llama8b, window):
    w = window(PlanConfig(n_ctx=131072, n_gpu_layers=20), llama8b)
    qtbot.waitUntil(lambda: len(w.advisor.items) >= 3, timeout=10_000)
    shown = [lab.text() for lab in _row_labels(w)] + [b.text() for b in w.advisor.buttons]
    shown += [b.toolTip() for b in w.advisor.buttons]
    for text in shown:
        unquoted = text  # a control's own name may carry its flag: "GPU layers (-ngl)"
        for label in LABELS:
            unquoted = unquoted.replace(label, "")
        assert not FIELD_NAME.search(text) and not FLAG.search(unquoted), text
    fix = next(a.fix for a in w.advisor.items if "n_cpu_ffn" in a.fix)
    w.apply_fix(dict(fix))
    message = w.status.currentMessage()
    assert f"Dense FFN on CPU: {fix['n_cpu_ffn']} layers" in message and "n_cpu_ffn" not in message, message


# -- the Plan for box, the device list, Run and Open -------------------------------------------------


def test_the_plan_for_choice_reads_whole(qtbot, tmp_path, window):
    w = window(open_model=False)
    box = w.hardware.choice
    assert box.displayed_text() == "RTX 3060 12GB (what-if)"
    for i in range(box.count()):
        box.setCurrentIndex(i)
        QtWidgets.QApplication.processEvents()
        text = box.displayed_text()
        assert box.fontMetrics().horizontalAdvance(text) <= box.text_rect_width(), (text, box.text_rect_width())
    assert "GB/s" in box.itemText(box.findData("card:RTX 4090"))  # the list keeps the figures


def test_no_card_is_chosen_in_the_device_list(qtbot, tmp_path, window):
    w = window(open_model=False)
    d = w.devices
    assert d.card.currentText() == ADD_CARD_PLACEHOLDER and not d.add_card_button.isEnabled()
    before = len(d.devices())
    d.card.setCurrentText("Tesla P40")
    assert d.add_card_button.isEnabled()
    d.add_card_button.click()
    assert [g.catalogue for g in d.devices()][before:] == ["Tesla P40"]
    assert d.card.currentText() == ADD_CARD_PLACEHOLDER and not d.add_card_button.isEnabled()


def test_run_verify_and_export_wait_for_a_model(qtbot, tmp_path, window):
    w = window(open_model=False, plan_for=None, host=HOST)
    rc = w.run_controls
    assert not rc.run_button.isEnabled() and not rc.verify_button.isEnabled()
    assert rc.run_button.toolTip() == NO_MODEL_TIP
    assert not w.run_action.isEnabled() and not w.export_action.isEnabled() and not w.tune_action.isEnabled()
    assert w.start_run() is False and not w.runner.running
    w.open_path(None)
    qtbot.waitUntil(lambda: w.model is not None, timeout=30_000)
    assert rc.run_button.isEnabled() and rc.verify_button.isEnabled() and w.run_action.isEnabled()
    assert w.export_action.isEnabled() and w.tune_action.isEnabled()
    assert rc.run_button.toolTip() != NO_MODEL_TIP


def test_open_starts_in_the_last_folder_or_home_never_the_cache(qtbot, tmp_path, default_model, window):
    w = window(open_model=False, plan_for=None, host=HOST)
    assert w.app_settings.open_dir() == Path.home()
    w.open_path(default_model)  # the embedded default model lives in kvtuner's cache
    qtbot.waitUntil(lambda: w.model is not None, timeout=30_000)
    assert w.app_settings.open_dir() == Path.home()
    mine = tmp_path / "models"
    mine.mkdir()
    (mine / "copy.gguf").symlink_to(default_model)
    w.open_path(mine / "copy.gguf")
    qtbot.waitUntil(lambda: w.model_path == mine / "copy.gguf", timeout=30_000)
    assert w.app_settings.open_dir() == mine
    seen = []

    def fake_dialog(parent, caption, start, filters):  # the platform dialog cannot run offscreen
        seen.append(start)
        return "", ""

    orig = QtWidgets.QFileDialog.getOpenFileName
    QtWidgets.QFileDialog.getOpenFileName = staticmethod(fake_dialog)
    try:
        w.open_action.trigger()  # File > Open
    finally:
        QtWidgets.QFileDialog.getOpenFileName = orig
    assert seen == [str(mine)]


def test_help_has_first_steps(qtbot, tmp_path, window):
    w = window(open_model=False)
    help_menu = next(a.menu() for a in w.menuBar().actions() if a.text() == "&Help")
    assert [a.text() for a in help_menu.actions() if a.text()][:2] == ["&First steps", "&About kvtuner"]
    w.first_steps_action.trigger()
    box = w.first_steps_box
    assert box is not None and box.isVisible() and "Open a model" in box.text() and "Run bench" in box.text()
    box.close()


# -- the live decode rate ----------------------------------------------------------------------------


def test_rolling_rate_smooths_a_stalled_token():
    """80 tok/s with one token stalled for 3 s (another process took the core): per-token rates
    swing 0.33-80; the rolling rate stays between the two and recovers within the window."""
    r = RollingRate(window_s=1.5, min_tokens=8)
    t, rates = 0.0, []
    for i in range(300):
        dt = 3.0 if i == 100 else 1 / 80
        t += dt
        rates.append(r.add(t, dt))
    assert rates[0] == pytest.approx(80.0)
    assert min(rates) > 0.33 * 2 and max(rates) == pytest.approx(80.0)
    assert rates[-1] == pytest.approx(80.0)  # 2.5 s later the stall has left the 1.5 s window
    r.reset()
    assert r.rate_tok_s is None and r.add(1.0, 0.5) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        RollingRate(window_s=0)


def test_the_live_graph_draws_the_rolling_rate_per_repetition(qtbot, tmp_path, window):
    """Token events of two repetitions through the window's handler: the decode curve holds the
    rolling rate (never a single token's 0.33 tok/s) and breaks between repetitions."""
    import time

    w = window(open_model=False, plan_for=None, host=HOST)
    now = time.monotonic()
    w.graphs.begin_run(now)
    for rep in range(2):
        t_s = 0.0
        for i in range(40):
            dt = 3.0 if i == 20 else 0.02
            t_s += dt
            w.run_events.handle(now + rep * 10 + t_s, P.TokenEvent(rep=rep, index=i, token=1, dt_s=dt, t_s=t_s))
        w.run_events.handle(
            now + rep * 10 + t_s,
            P.RepResultEvent(rep=rep, n_prompt=1, n_gen=40, n_depth=0, prefill_s=0.1, decode_s=t_s, ttft_s=0.1),
        )
    ys = [y for _x, y in zip(*w.graphs.series["decode"].arrays())]
    finite = [y for y in ys if not math.isnan(y)]
    assert len(finite) == 80 and sum(math.isnan(y) for y in ys) == 2
    assert min(finite) > 1.0 and max(finite) == pytest.approx(50.0)
