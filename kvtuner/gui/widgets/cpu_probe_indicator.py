"""The status bar's CPU probe indicator: while the background probe job
(:mod:`kvtuner.runner.probe_job`) runs, a progress bar "CPU probe k/n" with the kernel and the
elapsed time in its tooltip; hidden otherwise. It polls the job's status file once a second
(a small JSON read) and emits :attr:`CpuProbeIndicator.finished` when the job ends."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from ...runner import probe_job


class CpuProbeIndicator(QtWidgets.QWidget):
    """Progress of the background CPU probe.

    Signals:
        finished(state, message): the job ended; ``state`` is the status file's (``stored``,
            ``busy``, ``failed``, or ``gone`` when it ended without saying).
    """

    finished = QtCore.Signal(str, str)

    def __init__(self, parent: QtWidgets.QWidget | None = None, interval_ms: int = 1000) -> None:
        super().__init__(parent)
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.bar = QtWidgets.QProgressBar()
        self.bar.setMaximumWidth(170)
        self.bar.setTextVisible(True)
        lay.addWidget(self.bar)
        self._timer = QtCore.QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self.poll)
        self.hide()

    def follow(self) -> None:
        """Show the job's progress until it ends."""
        self.show()
        self.bar.setRange(0, 0)  # busy indicator until the job reports its first kernel
        self.bar.setFormat("CPU probe starting")
        self._timer.start()
        self.poll()

    @property
    def following(self) -> bool:
        """Whether a job is being followed."""
        return self._timer.isActive()

    def poll(self) -> None:
        """Read the job's status: update the bar, or hide it and emit :attr:`finished`."""
        st = probe_job.read_status()
        state = st.get("state", "")
        if state in ("running", "starting") and (probe_job.is_running() or state == "starting"):
            k, n = int(st.get("k", 0) or 0), int(st.get("n", 0) or 0)
            if n:
                self.bar.setRange(0, n)
                self.bar.setValue(k)
                self.bar.setFormat(f"CPU probe {k}/{n}")
            text = (
                "timing llama.cpp's CPU kernels in the background: "
                + probe_job.progress_text(st)
                + "; the speed uses assumed CPU rates until it lands"
            )
            self.setToolTip(text)
            self.bar.setToolTip(text)
            return
        if state == "starting":
            return
        self._timer.stop()
        self.hide()
        self.finished.emit(state if state in ("stored", "busy", "failed") else "gone", str(st.get("message", "")))
