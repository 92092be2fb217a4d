"""Run controls: Run (a bench with the current configuration), Stop, Verify, and progress."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets


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
        self.run_button.setToolTip("Load the model with this configuration in a child process and run a short\n"
                                   "llama-bench style test (prefill, then decode); the graphs show it live. Ctrl+R")
        self.stop_button = QtWidgets.QPushButton("&Stop")
        self.stop_button.setToolTip("Stop the run and end the child process. Esc")
        self.verify_button = QtWidgets.QPushButton("&Verify with llama.cpp")
        self.verify_button.setToolTip("Ask the installed llama.cpp for the exact KV and compute buffers of this\n"
                                      "configuration (a no-alloc dry run in a child process, about a second).")
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.progress.setTextVisible(True)
        self.progress.setFormat("idle")
        self.progress.setMinimumWidth(220)
        lay.addWidget(self.run_button)
        lay.addWidget(self.stop_button)
        lay.addWidget(self.verify_button)
        lay.addWidget(self.progress, 1)
        self.run_button.clicked.connect(self.run_clicked)
        self.stop_button.clicked.connect(self.stop_clicked)
        self.verify_button.clicked.connect(self.verify_clicked)
        self.set_running(False)

    def set_running(self, running: bool) -> None:
        """Enable Stop while a run is active, Run otherwise."""
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)

    def set_progress(self, fraction: float | None, text: str) -> None:
        """``fraction`` 0..1 (None: busy indicator) and a short text (``loading weights 40%``)."""
        if fraction is None:
            self.progress.setRange(0, 0)
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(round(max(0.0, min(fraction, 1.0)) * 1000)))
        self.progress.setFormat(text)
