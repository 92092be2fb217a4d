"""Stacked memory bars: per device, weights | MoE experts | repacked copy | KV | compute | output | overhead | free, against
capacity. Figures a llama.cpp dry-run confirmed are marked "verified"."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6 import QtCore, QtGui, QtWidgets

from ...core.units import fmt_bytes

#: Segment order, label and colour (Okabe-Ito; "free" drawn as an outline).
SEGMENTS = (
    ("weights", "weights", "#0072B2"),
    ("experts", "MoE experts", "#F0E442"),
    ("repack", "repacked copy", "#56B4E9"),
    ("kv", "KV cache", "#E69F00"),
    ("compute", "compute", "#009E73"),
    ("output", "output", "#CC79A7"),
    ("overhead", "overhead", "#999999"),
    ("mmproj", "projector", "#8C564B"),
    ("draft", "draft model", "#6A3D9A"),
    ("lora", "LoRA", "#17BECF"),
)
#: Segments shown (bar and legend) only when some row has them.
OPTIONAL_SEGMENTS = frozenset({"experts", "mmproj", "draft", "lora"})
OVER_COLOR = "#D55E00"


@dataclass(frozen=True)
class BarRow:
    """One bar: the device's caption and its segments in bytes.

    ``free_bytes`` is the headroom the planner reports (negative: over capacity);
    ``verified`` names the segments a dry-run confirmed (``{"kv", "compute"}``).
    """

    caption: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    total_bytes: int
    capacity_bytes: int | None
    free_bytes: int | None
    verified: frozenset[str] = frozenset()
    repack_bytes: int = 0  # the host's CPU_REPACK copy of repackable quantized weights
    experts_bytes: int = 0  # MoE expert tensors here (not in weights_bytes: a segment of their own)
    mmproj_bytes: int = 0  # the projector's weights and compute here (in total_bytes)
    draft_bytes: int = 0  # the draft model's weights, KV, compute and output here (in total_bytes)
    lora_bytes: int = 0  # LoRA adapter tensors here (in total_bytes)

    def segment_bytes(self, key: str) -> int:
        """Bytes of segment ``key`` (``weights``, ``kv`` ...)."""
        return int(getattr(self, f"{key}_bytes"))


def row_from_device(device: object, verified: frozenset[str] = frozenset(), extras: object = None) -> BarRow:
    """A :class:`BarRow` from a :class:`~kvtuner.core.plan.memory_plan.DevicePlan`; ``extras``
    (:class:`~kvtuner.core.plan.extras.ExtrasPlan`, or None) adds the projector, draft and LoRA
    bytes on this device as their own segments, counted in the total and the free space."""
    d = device
    name = "RAM (host)" if d.kind == "host" else f"{d.backend_device} {d.name}"
    experts = getattr(d, "expert_bytes", 0)
    parts = {
        p: (extras.part_bytes(p, device=d.device) if extras is not None else 0) for p in ("mmproj", "draft", "lora")
    }
    # a plan that carries them (DevicePlan.extras_bytes) counts them in its totals already
    added = 0 if getattr(d, "extras_bytes", 0) else sum(parts.values())
    free = d.headroom_bytes
    return BarRow(
        caption=name,
        weights_bytes=d.weights_bytes - experts,
        experts_bytes=experts,
        kv_bytes=d.kv_bytes,
        compute_bytes=d.compute_bytes,
        output_bytes=d.output_bytes,
        overhead_bytes=d.overhead_bytes,
        total_bytes=d.total_bytes + added,
        capacity_bytes=d.capacity_bytes,
        free_bytes=None if free is None else free - added,
        verified=verified,
        repack_bytes=d.repack_bytes,
        mmproj_bytes=parts["mmproj"],
        draft_bytes=parts["draft"],
        lora_bytes=parts["lora"],
    )


class MemoryBars(QtWidgets.QWidget):
    """Paints one stacked bar per device. Set rows with :meth:`set_rows`."""

    BAR_H = 22
    CAPTION_H = 18
    GAP = 8

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[BarRow] = []
        policy = QtWidgets.QSizePolicy(QtWidgets.QSizePolicy.Policy.Expanding, QtWidgets.QSizePolicy.Policy.Fixed)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self.setMouseTracking(True)

    def set_rows(self, rows: list[BarRow]) -> None:
        """Replace the bars and repaint."""
        self.rows = list(rows)
        self.setToolTip("\n\n".join(self.describe(r) for r in self.rows))
        self.updateGeometry()
        self.update()

    @staticmethod
    def caption(row: BarRow) -> str:
        """``CUDA0 ...: 1.23 GiB of 12.00 GiB, 10.77 GiB free`` (or how much it is over)."""
        if row.capacity_bytes is None:
            return f"{row.caption}: {fmt_bytes(row.total_bytes)} needed"
        if row.free_bytes is not None and row.free_bytes < 0:
            return (
                f"{row.caption}: {fmt_bytes(row.total_bytes)} of {fmt_bytes(row.capacity_bytes)} "
                f"- DOES NOT FIT, {fmt_bytes(-row.free_bytes)} over"
            )
        return f"{row.caption}: {fmt_bytes(row.total_bytes)} of {fmt_bytes(row.capacity_bytes)}, {fmt_bytes(row.free_bytes)} free"

    @staticmethod
    def describe(row: BarRow) -> str:
        """Multi-line text of every segment (tooltip and accessibility)."""
        lines = [MemoryBars.caption(row)]
        for key, label, _ in SEGMENTS:
            if key in OPTIONAL_SEGMENTS and not row.segment_bytes(key):
                continue
            mark = " (verified by llama.cpp)" if key in row.verified else ""
            lines.append(f"  {label}: {fmt_bytes(row.segment_bytes(key))}{mark}")
        return "\n".join(lines)

    LEGEND_LINE_H = 16

    def _legend_items(self) -> list[tuple[str, str | None]]:
        # a dense model has no experts entry; no projector/draft/LoRA entries without them
        present = {key for key in OPTIONAL_SEGMENTS if any(r.segment_bytes(key) for r in self.rows)}
        items: list[tuple[str, str | None]] = [
            (label, color) for key, label, color in SEGMENTS if key not in OPTIONAL_SEGMENTS or key in present
        ] + [("free", None)]
        return items + [("✓ = verified by llama.cpp", "")]

    def _legend_layout(self, width: int) -> list[tuple[int, int, str, str | None]]:
        """(x, line, text, colour) of each legend entry, wrapped to ``width`` pixels (no entry
        is ever cut at the right edge)."""
        fm = self.fontMetrics()
        out, x, line = [], 1, 0
        for text, color in self._legend_items():
            item_w = (14 if color != "" else 0) + fm.horizontalAdvance(text) + 12
            if x > 1 and x + item_w - 12 > width:
                x, line = 1, line + 1
            out.append((x, line, text, color))
            x += item_w
        return out

    def _legend_height(self, width: int) -> int:
        lines = max((ln for _, ln, _, _ in self._legend_layout(width)), default=0) + 1
        return 4 + lines * self.LEGEND_LINE_H

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt API)
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 (Qt API)
        n = max(len(self.rows), 1)
        return self._legend_height(width - 2) + n * (self.CAPTION_H + self.BAR_H + self.GAP)

    def sizeHint(self) -> QtCore.QSize:  # noqa: N802 (Qt API)
        return QtCore.QSize(400, self.heightForWidth(max(self.width(), 400)))

    def minimumSizeHint(self) -> QtCore.QSize:  # noqa: N802 (Qt API)
        return QtCore.QSize(200, self.heightForWidth(max(self.width(), 200)))

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.updateGeometry()  # the legend may wrap onto another line

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:  # noqa: N802 (Qt API)
        p = QtGui.QPainter(self)
        pal = self.palette()
        text_color = pal.color(QtGui.QPalette.ColorRole.WindowText)
        w = self.width() - 2
        # legend, wrapped to the width
        for x, line, label, color in self._legend_layout(w):
            top = 4 + line * self.LEGEND_LINE_H
            p.setPen(text_color)
            if color == "":  # the tick's explanation: text only
                p.drawText(x, top + 10, label)
                continue
            p.fillRect(
                QtCore.QRect(x, top, 10, 10), QtGui.QColor(color) if color else pal.color(QtGui.QPalette.ColorRole.Base)
            )
            p.drawRect(QtCore.QRect(x, top, 10, 10))
            p.drawText(x + 14, top + 10, label)
        y = self._legend_height(w)
        for row in self.rows:
            p.setPen(text_color)
            caption = self.caption(row)
            if row.verified:
                caption += "   ✓ " + ", ".join(sorted(row.verified)) + " verified"
            p.drawText(QtCore.QRect(1, y, w, self.CAPTION_H), QtCore.Qt.AlignmentFlag.AlignVCenter, caption)
            y += self.CAPTION_H
            full = max(row.capacity_bytes or 0, row.total_bytes, 1)
            scale = w / full
            bar = QtCore.QRectF(1, y, (row.capacity_bytes or row.total_bytes) * scale, self.BAR_H)
            p.fillRect(bar, pal.color(QtGui.QPalette.ColorRole.Base))
            pos = 1.0
            for key, _label, color in SEGMENTS:
                seg = row.segment_bytes(key) * scale
                if seg <= 0:
                    continue
                r = QtCore.QRectF(pos, y, seg, self.BAR_H)
                p.fillRect(r, QtGui.QColor(color))
                if key in row.verified and seg > 14:
                    p.setPen(QtGui.QColor("white"))
                    p.drawText(r, QtCore.Qt.AlignmentFlag.AlignCenter, "✓")
                pos += seg
            if row.capacity_bytes is not None and row.total_bytes > row.capacity_bytes:
                cap_x = 1 + row.capacity_bytes * scale
                over = QtCore.QRectF(cap_x, y, pos - cap_x, self.BAR_H)
                p.fillRect(over, QtGui.QBrush(QtGui.QColor(OVER_COLOR), QtCore.Qt.BrushStyle.BDiagPattern))
                p.setPen(QtGui.QPen(QtGui.QColor(OVER_COLOR), 2))
                p.drawLine(QtCore.QPointF(cap_x, y - 2), QtCore.QPointF(cap_x, y + self.BAR_H + 2))
            p.setPen(text_color)
            p.drawRect(bar)
            y += self.BAR_H + self.GAP
        p.end()
