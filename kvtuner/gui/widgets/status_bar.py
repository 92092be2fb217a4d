"""Status bar with the latest live numbers (VRAM, RAM, swap, tok/s, runner state)."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from ...core.units import fmt_bytes


class StatusBar(QtWidgets.QStatusBar):
    """Permanent fields: runner state, VRAM, RAM available, swap, prefill and decode tok/s."""

    FIELDS = ("runner", "vram", "ram", "swap", "prefill", "decode")

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.fields: dict[str, QtWidgets.QLabel] = {}
        for key in self.FIELDS:
            label = QtWidgets.QLabel("")
            label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
            self.fields[key] = label
            self.addPermanentWidget(label)
        self.set_field("runner", "runner: idle")

    def set_field(self, key: str, text: str) -> None:
        """Set one field's text."""
        self.fields[key].setText(text)

    def show_host(self, sample: object | None) -> None:
        """Latest :class:`~kvtuner.core.monitor.sampler.HostSample`."""
        if sample is None:
            return
        self.set_field(
            "ram", f"RAM available {fmt_bytes(sample.available_bytes, 1)} of {fmt_bytes(sample.total_bytes, 1)}"
        )
        self.set_field("swap", f"swap {fmt_bytes(sample.swap_used_bytes, 1)}")

    def show_gpu(self, sample: object | None) -> None:
        """Latest :class:`~kvtuner.core.monitor.sampler.GpuSample` of the first GPU."""
        if sample is None:
            self.set_field("vram", "VRAM: no GPU")
            return
        text = f"VRAM {fmt_bytes(sample.used_bytes, 1)} of {fmt_bytes(sample.total_bytes, 1)}"
        gtt_total = getattr(sample, "gtt_total_bytes", None)
        if gtt_total:  # AMD (sysfs): the GTT pool beside VRAM
            text += f", GTT {fmt_bytes(getattr(sample, 'gtt_used_bytes', 0) or 0, 1)} of {fmt_bytes(gtt_total, 1)}"
        if getattr(sample, "flags", ()):
            text += " (reading contradicts itself: not trusted)"
        self.set_field("vram", text)

    def show_speed(self, prefill_tok_s: float | None, decode_tok_s: float | None) -> None:
        """Latest measured speeds."""
        if prefill_tok_s is not None:
            self.set_field("prefill", f"prefill {prefill_tok_s:,.1f} tok/s")
        if decode_tok_s is not None:
            self.set_field("decode", f"decode {decode_tok_s:,.1f} tok/s")
