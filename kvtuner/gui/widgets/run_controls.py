"""Run controls: Run (a bench with the current configuration), Stop, Verify, the bench's length
and threads, and progress."""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6 import QtCore, QtWidgets

#: Run's and Verify's tooltip while no model is open.
NO_MODEL_TIP = "Open a model first (File > Open, or File > Open the default model)"


class BenchButton(QtWidgets.QToolButton):
    """A compact button that shows the bench (``256+64 tok x2, auto threads``) and drops down a
    form to set prompt tokens, generated tokens, repetitions and CPU threads (0: llama.cpp's
    default, the physical cores). Emits :attr:`changed` with the new
    :class:`kvtuner.gui.run_controller.BenchSettings`."""

    changed = QtCore.Signal(object)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPopupMode(QtWidgets.QToolButton.ToolButtonPopupMode.InstantPopup)
        self.setToolTip(
            "The bench Run starts: prompt tokens (prefill), generated tokens (decode), repetitions and CPU threads"
        )
        self._settings: Any = None
        form_w = QtWidgets.QWidget()
        form = QtWidgets.QFormLayout(form_w)
        self.n_prompt = QtWidgets.QSpinBox()
        self.n_prompt.setRange(1, 65536)
        self.n_gen = QtWidgets.QSpinBox()
        self.n_gen.setRange(1, 65536)
        self.repetitions = QtWidgets.QSpinBox()
        self.repetitions.setRange(1, 20)
        self.n_threads = QtWidgets.QSpinBox()
        self.n_threads.setRange(0, 1024)
        self.n_threads.setSpecialValueText("auto")
        for label, w in (
            ("Prompt tokens", self.n_prompt),
            ("Generated tokens", self.n_gen),
            ("Repetitions", self.repetitions),
            ("CPU threads", self.n_threads),
        ):
            w.setKeyboardTracking(False)
            w.valueChanged.connect(self._on_changed)
            form.addRow(label, w)
        menu = QtWidgets.QMenu(self)
        action = QtWidgets.QWidgetAction(menu)
        action.setDefaultWidget(form_w)
        menu.addAction(action)
        self.setMenu(menu)

    def set_settings(self, settings: Any) -> None:
        """Show a BenchSettings without emitting :attr:`changed`."""
        self._settings = settings
        for w, v in (
            (self.n_prompt, settings.n_prompt),
            (self.n_gen, settings.n_gen),
            (self.repetitions, settings.repetitions),
            (self.n_threads, settings.n_threads or 0),
        ):
            w.blockSignals(True)
            w.setValue(v)
            w.blockSignals(False)
        # trailing spaces: room for the drop-down arrow, which some styles draw over the text
        self.setText(
            f"{settings.n_prompt}+{settings.n_gen} tok x{settings.repetitions}, "
            f"{settings.n_threads or 'auto'} threads   "
        )

    def _on_changed(self, *_: object) -> None:
        if self._settings is None:
            return
        new = dataclasses.replace(
            self._settings,
            n_prompt=self.n_prompt.value(),
            n_gen=self.n_gen.value(),
            repetitions=self.repetitions.value(),
            n_threads=self.n_threads.value() or None,
        )
        self.set_settings(new)
        self.changed.emit(new)


class RunControls(QtWidgets.QWidget):
    """Buttons and a progress bar. Emits :attr:`run_clicked`, :attr:`stop_clicked`,
    :attr:`verify_clicked`; the window calls :meth:`set_running` and :meth:`set_progress`."""

    run_clicked = QtCore.Signal()
    stop_clicked = QtCore.Signal()
    verify_clicked = QtCore.Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.run_button = QtWidgets.QPushButton("Run &bench")
        self.run_button.setToolTip(
            "Load the model with this configuration in a child process and run a short\n"
            "llama-bench style test (prefill, then decode); the graphs show it live. Ctrl+R"
        )
        self.stop_button = QtWidgets.QPushButton("&Stop")
        self.stop_button.setToolTip("Stop the run and end the child process. Esc")
        self.verify_button = QtWidgets.QPushButton("&Verify with llama.cpp")
        self.verify_button.setToolTip(
            "Ask the installed llama.cpp for the exact KV and compute buffers of this\n"
            "configuration (a no-alloc dry run in a child process, about a second)."
        )
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.progress.setTextVisible(True)
        self.progress.setFormat("idle")
        self.progress.setMinimumWidth(220)
        self.bench = BenchButton()
        lay.addWidget(self.run_button)
        lay.addWidget(self.bench)
        lay.addWidget(self.stop_button)
        lay.addWidget(self.verify_button)
        lay.addWidget(self.progress, 1)
        self.run_button.clicked.connect(self.run_clicked)
        self.stop_button.clicked.connect(self.stop_clicked)
        self.verify_button.clicked.connect(self.verify_clicked)
        self._tips = {b: b.toolTip() for b in (self.run_button, self.verify_button)}
        self.ready = False
        self._running = False
        self.set_ready(False)

    def set_ready(self, ready: bool) -> None:
        """Whether a model is open: without one, Run and Verify are disabled and say so."""
        self.ready = ready
        for button, tip in self._tips.items():
            button.setToolTip(tip if ready else NO_MODEL_TIP)
        self.verify_button.setEnabled(ready)
        self.set_running(self._running)

    def set_running(self, running: bool) -> None:
        """Enable Stop while a run is active, Run otherwise (with a model open)."""
        self._running = running
        self.run_button.setEnabled(not running and self.ready)
        self.stop_button.setEnabled(running)

    def set_progress(self, fraction: float | None, text: str) -> None:
        """``fraction`` 0..1 (None: busy indicator) and a short text (``loading weights 40%``)."""
        if fraction is None:
            self.progress.setRange(0, 0)
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(round(max(0.0, min(fraction, 1.0)) * 1000)))
        self.progress.setFormat(text)
