"""The window's menus, toolbar and keyboard shortcuts (File, Run, Help), the recent-models menu,
and which actions a window without a model offers.

``w`` is the window (:class:`kvtuner.gui.main_window.MainWindow`, which imports this module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from .about import install_help_menu


class WindowShortcuts(QtCore.QObject):
    """Event filter for the window's text boxes: the window's own shortcuts (Ctrl+E, Ctrl+R ...)
    win over the line edit's (QLineEdit takes Ctrl+E as "end of line" on X11, so Export did
    nothing while a number box had focus)."""

    def __init__(self, actions: list[QtGui.QAction], parent: QtCore.QObject) -> None:
        super().__init__(parent)
        self._keys = [a.shortcut() for a in actions if not a.shortcut().isEmpty()]

    def eventFilter(self, obj: QtCore.QObject, event: QtCore.QEvent) -> bool:  # noqa: N802 (Qt API)
        if event.type() == QtCore.QEvent.Type.ShortcutOverride:
            pressed = QtGui.QKeySequence(event.keyCombination())
            if any(
                pressed.matches(k) == QtGui.QKeySequence.SequenceMatch.ExactMatch
                for k in self._keys
                if k.toString() != "Esc"
            ):
                event.ignore()  # not overridden: the window's shortcut gets it
                return True
        return False


def install_shortcuts(w: Any) -> WindowShortcuts:
    """Filter the window's spin boxes, line edits and combo boxes so Export, Run, Verify and Open
    keep their shortcuts while one has focus; returns the filter."""
    shortcuts = WindowShortcuts([w.export_action, w.run_action, w.verify_action, w.open_action], w)
    # on the spin boxes themselves too: QAbstractSpinBox hands ShortcutOverride straight to
    # its line edit's event(), past any filter on the line edit
    for edit in (
        *w.findChildren(QtWidgets.QAbstractSpinBox),
        *w.findChildren(QtWidgets.QLineEdit),
        *w.findChildren(QtWidgets.QComboBox),
    ):
        edit.installEventFilter(shortcuts)
    return shortcuts


def build_actions(w: Any) -> None:
    """The File, Run and Help menus and the toolbar; each action becomes a window attribute
    (``open_action``, ``export_action``, ``run_action``, ``verify_action`` ...)."""
    menu = w.menuBar().addMenu("&File")
    w.open_action = QtGui.QAction(
        "&Open model or profile...",
        w,
        shortcut=QtGui.QKeySequence.StandardKey.Open,
        triggered=w.choose_and_open,
    )
    w.open_action.setToolTip("Open a GGUF model, or a kvtuner profile (.json) with its model and configuration")
    w.default_action = QtGui.QAction("Open the &default model (Gemma 3 270M)", w, triggered=lambda: w.open_model(None))
    w.recent_menu = QtWidgets.QMenu("&Recent models", w)
    w.export_action = QtGui.QAction("&Export configuration...", w, shortcut="Ctrl+E", triggered=w.open_export)
    w.export_action.setToolTip(
        "Export this configuration for llama-server, llama-cpp-python, Ollama, koboldcpp or as a kvtuner profile"
    )
    quit_action = QtGui.QAction("&Quit", w, shortcut=QtGui.QKeySequence.StandardKey.Quit, triggered=w.close)
    w.reset_action = QtGui.QAction("Rese&t configuration to defaults", w, triggered=w.reset_to_defaults)
    w.reset_action.setToolTip("Put llama.cpp's defaults into the controls")
    for a in (w.open_action, w.default_action):
        menu.addAction(a)
    menu.addMenu(w.recent_menu)
    menu.addSeparator()
    menu.addAction(w.export_action)
    menu.addAction(w.reset_action)
    menu.addSeparator()
    menu.addAction(quit_action)
    run_menu = w.menuBar().addMenu("&Run")
    w.run_action = QtGui.QAction("&Run bench", w, shortcut="Ctrl+R", triggered=w.start_run)
    w.stop_action = QtGui.QAction("&Stop", w, shortcut="Esc", triggered=w.stop_run)
    w.verify_action = QtGui.QAction("&Verify with llama.cpp", w, shortcut="Ctrl+Shift+V", triggered=w.verify)
    for a in (w.run_action, w.stop_action, w.verify_action):
        run_menu.addAction(a)
    run_menu.addSeparator()
    w.attach_action = QtGui.QAction(
        "&Attach to a running server...", w, shortcut="Ctrl+Shift+A", triggered=w.open_attach
    )
    w.attach_action.setToolTip(
        "Watch a llama-server or Ollama someone else started: its speed, context fill "
        "and memory live, beside kvtuner's plan for its configuration"
    )
    w.detach_action = QtGui.QAction("&Detach", w, triggered=lambda: w.detach())
    w.detach_action.setEnabled(False)
    run_menu.addAction(w.attach_action)
    run_menu.addAction(w.detach_action)
    run_menu.addSeparator()
    install_help_menu(w)  # Help > About, app icon (gui/about.py)
    tb = w.addToolBar("Main")
    tb.setObjectName("main-toolbar")
    tb.setMovable(False)
    tb.addAction(w.open_action)
    tb.addAction(w.export_action)
    # the Tune dialog (kvtuner/gui/tune_panel.py)
    w.tune_action = QtGui.QAction("&Tune...", w, shortcut="Ctrl+T", triggered=w.open_tune)
    w.tune_action.setToolTip("Find the fastest configuration that fits a goal, with its knee chart")
    run_menu.addAction(w.tune_action)
    tb.addAction(w.tune_action)
    update_recent_menu(w)


def set_model_open(w: Any, is_open: bool) -> None:
    """Run, Verify, Export and Tune act on a model: disabled, with the reason, until one is open."""
    w.run_controls.set_ready(is_open)
    for action in (w.run_action, w.verify_action, w.export_action):
        action.setEnabled(is_open and not w.stale)
    w.tune_action.setEnabled(is_open)


def update_recent_menu(w: Any) -> None:
    """File > Recent models: the recently opened models, newest first (disabled when none)."""
    w.recent_menu.clear()
    recent = w.recent_models()
    for p in recent:
        act = w.recent_menu.addAction(Path(p).name)
        act.setToolTip(p)
        act.triggered.connect(lambda _=False, p=p: w.open_model(Path(p)))
    w.recent_menu.setEnabled(bool(recent))
