"""Live graphs: memory (VRAM, RAM, swap) and speed (prefill and decode tok/s) over time.

Pull model (pyqtgraph style): the main window's timer hands new samples and runner events to
:class:`LiveGraphs`, which appends them to bounded :class:`~kvtuner.gui.series.Series` and
calls ``setData`` only for series that changed. Curves use peak downsampling and clip to the
view, so an hour of 10 Hz samples redraws well inside one frame (``benchmarks/gui_redraw.py``).
Predicted levels from the planner and speed model are drawn dashed over the measured ones;
run phases (weights, KV, compute, prefill, decode) are vertical markers.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np
import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from ...core.speed.speed_model import ABANDON_TOK_S, FLUENT_TOK_S
from ...core.units import GiB
from ..series import HOUR_AT_10HZ, Series

#: Phase markers kept on the graphs (older ones are removed).
MAX_PHASE_MARKERS = 60
#: Phase markers this close after a labelled one (s) join its label.
PHASE_MERGE_S = 0.5
#: Rows the phase labels step down before starting at the top again.
PHASE_LABEL_ROWS = 3

# Okabe-Ito palette: distinguishable for colour-blind readers, on light and dark backgrounds.
COLORS = {
    "vram": "#0072B2",
    "vram_runner": "#56B4E9",
    "ram_used": "#D55E00",
    "ram_avail": "#009E73",
    "swap": "#CC79A7",
    "runner_rss": "#7B3294",
    "prefill": "#009E73",
    "decode": "#0072B2",
    "phase": "#888888",
    "context": "#E69F00",
    "gtt": "#999933",
}


def nice_ceil(value: float, minimum: float = 0.0) -> float:
    """The smallest 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten that is >= value
    (axis ranges that change rarely and read well)."""
    value = max(value, minimum)
    if value <= 0 or not math.isfinite(value):
        return max(minimum, 1.0)
    exp = math.floor(math.log10(value))
    for m in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * 10**exp >= value * (1 - 1e-12):
            return m * 10**exp
    return 10 ** (exp + 1)


def _pen(color: str, dashed: bool = False, width: float = 1.0) -> pg.QtGui.QPen:
    pen = pg.mkPen(color, width=width)
    if dashed:
        pen.setStyle(QtCore.Qt.PenStyle.DashLine)
    return pen


#: Per-run zoom: seconds shown before the run starts (the idle level before it).
RUN_LEAD_S = 3.0
#: The memory axis' lowest value, GiB (log axis).
MEM_FLOOR_GIB = 0.05


def _tick_label(v: float) -> str:
    """``0.5 -> "0.5"``, ``2.0 -> "2"``, ``20000 -> "20k"``."""
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


#: Ticks of the log axes (positions in log10 units, as pyqtgraph's log mode draws them): the
#: decades 0.001 .. 10 000, then 2 and 5 x 10^k as a second level, whose labels pyqtgraph leaves
#: out when the axis is too short for them (``AxisItem`` ``textFillLimits``).
LOG_TICKS = [
    [(float(e), _tick_label(10.0**e)) for e in range(-3, 5)],
    [(math.log10(m * 10.0**e), _tick_label(m * 10.0**e)) for e in range(-3, 5) for m in (2, 5)],
]


class LiveGraphs(QtWidgets.QWidget):
    """Two stacked plots sharing the time axis (seconds since the window opened).

    Top, memory in GiB: VRAM used per GPU and by kvtuner's runner, RAM used and available,
    swap used, the runner's RSS. Bottom, speed in tok/s: prefill per repetition (points)
    and decode per token (line). Feed it with :meth:`add_host_samples`,
    :meth:`add_gpu_samples`, :meth:`add_prefill`, :meth:`add_decode`, :meth:`mark_phase`;
    call :meth:`refresh` from a timer.
    """

    def __init__(
        self, parent: QtWidgets.QWidget | None = None, *, capacity: int = HOUR_AT_10HZ, t0_s: float | None = None
    ) -> None:
        super().__init__(parent)
        self.t0_s = time.monotonic() if t0_s is None else t0_s
        self.capacity = capacity
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)

        self.mem_plot = pg.PlotWidget()
        self.speed_plot = pg.PlotWidget()
        for plot, label, unit in ((self.mem_plot, "memory", "GiB"), (self.speed_plot, "speed", "tok/s")):
            item = plot.getPlotItem()
            item.setLabel("left", f"{label} ({unit})")
            item.setDownsampling(auto=True, mode="peak")
            item.setClipToView(True)
            item.setMenuEnabled(False)
            item.getViewBox().setMouseEnabled(x=True, y=False)
            plot.setMinimumHeight(120)
            plot.setFocusPolicy(QtCore.Qt.FocusPolicy.NoFocus)
            layout.addWidget(plot, 1)
        self.speed_plot.getPlotItem().setLabel("bottom", "time (s)")
        # prefill runs 10-100x faster than decode: a log axis shows both (and the decode bands)
        self.speed_plot.getPlotItem().setLogMode(x=False, y=True)
        self.speed_plot.getPlotItem().setLabel("left", "tok/s (log)")
        # memory: a log axis too, so the runner's few hundred MiB move visibly beside 20+ GiB of
        # available RAM (a linear 0-40 GiB axis hides the runner's ~0.4 GiB)
        self.mem_plot.getPlotItem().setLogMode(x=False, y=True)
        self.mem_plot.getPlotItem().setLabel("left", "GiB (log)")
        # log axes labelled 1-2-5 per decade: pyqtgraph's own log ticks label every 1..9 x 10^k
        # and ran into each other on a short plot (0.4 .. 30 tok/s read "0.8 0.6 0.5 0.4")
        for plot in (self.mem_plot, self.speed_plot):
            plot.getPlotItem().getAxis("left").setTicks(LOG_TICKS)
        self.mem_plot.getPlotItem().getAxis("bottom").setStyle(showValues=False)
        self.speed_plot.setXLink(self.mem_plot)
        # Ranges are set by refresh() from the series themselves (one paint per plot per
        # redraw); pyqtgraph's own auto-range would repaint twice. Dragging or zooming the
        # time axis stops following the newest data; a double click follows again.
        for plot in (self.mem_plot, self.speed_plot):
            item = plot.getPlotItem()
            item.disableAutoRange()
            item.hideButtons()
            item.getViewBox().sigRangeChangedManually.connect(self._on_view_range_changed_manually)
            plot.scene().sigMouseClicked.connect(self._on_plot_clicked)
        self.follow = True
        self._ranges: dict[str, tuple[float, float]] = {}
        # legends above the data (in the plot's title row), so no marker label or curve is under them
        self.mem_legend = self._legend_above(self.mem_plot, 4)
        self.speed_legend = self._legend_above(self.speed_plot, 4)
        #: show the whole session (True) or follow the current run (False, the default)
        self.whole_session = False
        #: where the current (or last) run started on the time axis, s
        self.run_start_s: float | None = None

        self.series: dict[str, Series] = {}
        self.curves: dict[str, pg.PlotDataItem] = {}
        self._drawn: dict[str, int] = {}
        self._add_curve("ram_used", self.mem_plot, "RAM used", COLORS["ram_used"])
        self._add_curve("ram_avail", self.mem_plot, "RAM available", COLORS["ram_avail"])
        self._add_curve("swap", self.mem_plot, "swap used", COLORS["swap"])
        self._add_curve("runner_rss", self.mem_plot, "runner RAM (RSS)", COLORS["runner_rss"])
        self._add_curve("decode", self.speed_plot, "decode tok/s", COLORS["decode"])
        self._add_curve("prefill", self.speed_plot, "prefill tok/s", COLORS["prefill"], symbol="o")
        self._gpu_keys: set[int] = set()
        self._predicted: list[tuple[pg.InfiniteLine, float]] = []
        # the decode bands (kvtuner.core.speed.speed_model.speed_band): under 1 tok/s abandon, 10 and over fluent
        # (labels at different places along the axis: on a short plot the two lines are close)
        for tok_s, label, where in (
            (ABANDON_TOK_S, f"{ABANDON_TOK_S:g} tok/s: abandon below", 0.28),
            (FLUENT_TOK_S, f"{FLUENT_TOK_S:g} tok/s: fluent above", 0.5),
        ):
            dotted = _pen(COLORS["phase"], width=1)
            dotted.setStyle(QtCore.Qt.PenStyle.DotLine)
            line = pg.InfiniteLine(
                pos=math.log10(tok_s),
                angle=0,
                pen=dotted,
                label=label,
                labelOpts={"position": where, "color": COLORS["phase"], "anchors": [(1, 1), (1, 1)]},
            )
            self.speed_plot.addItem(line, ignoreBounds=True)
        self._phases: deque[tuple[pg.InfiniteLine, pg.InfiniteLine]] = deque()
        self._label_head: pg.InfiniteLine | None = None  # the last marker with a label
        self._label_slot = -1
        self.n_redraws = 0

    # -- construction --------------------------------------------------------------------------

    @staticmethod
    def _legend_above(plot: pg.PlotWidget, columns: int) -> pg.LegendItem:
        item = plot.getPlotItem()
        legend = pg.LegendItem(offset=None, colCount=columns, labelTextSize="8pt", verSpacing=-6)
        item.layout.removeItem(item.titleLabel)
        item.titleLabel.hide()
        item.layout.addItem(legend, 0, 1)
        item.legend = legend  # PlotItem.addItem adds every named curve to it
        return legend

    def _add_curve(self, key: str, plot: pg.PlotWidget, name: str, color: str, symbol: str | None = None) -> None:
        kwargs = {"pen": _pen(color), "name": name, "connect": "finite", "autoDownsampleFactor": 1.0}
        if symbol:
            kwargs.update(symbol=symbol, symbolSize=7, symbolBrush=color, symbolPen=None, pen=None)
        curve = plot.getPlotItem().plot([], [], **kwargs)
        curve.setDownsampling(auto=True, method="peak")
        curve.setClipToView(True)
        self.series[key] = Series(self.capacity)
        self.curves[key] = curve
        self._drawn[key] = -1

    def _ensure_gpu(self, index: int) -> None:
        if index in self._gpu_keys:
            return
        self._gpu_keys.add(index)
        self._add_curve(f"vram{index}", self.mem_plot, f"VRAM used GPU{index}", COLORS["vram"])
        self._add_curve(f"vram_runner{index}", self.mem_plot, f"VRAM runner GPU{index}", COLORS["vram_runner"])

    # -- feeding ---------------------------------------------------------------------------------

    def rel(self, t_s: float) -> float:
        """Seconds on the graphs' time axis for a ``time.monotonic()`` time."""
        return t_s - self.t0_s

    def add_host_samples(self, samples: Sequence) -> None:
        """Append :class:`kvtuner.core.monitor.sampler.HostSample` items (oldest first)."""
        if not samples:
            return
        t = np.fromiter((s.t_s - self.t0_s for s in samples), float, len(samples))

        def col(get) -> np.ndarray:
            return np.fromiter((math.nan if (v := get(s)) is None else v / GiB for s in samples), float, len(samples))

        # "used" is total minus available, the samplers' own definition (Peaks.host_used_bytes)
        self.series["ram_used"].extend(t, col(lambda s: s.total_bytes - s.available_bytes))
        self.series["ram_avail"].extend(t, col(lambda s: s.available_bytes))
        self.series["swap"].extend(t, col(lambda s: s.swap_used_bytes))
        self.series["runner_rss"].extend(t, col(lambda s: s.process_rss_bytes))

    def add_gpu_samples(self, index: int, samples: Sequence) -> None:
        """Append :class:`kvtuner.core.monitor.sampler.GpuSample` items of GPU ``index``."""
        if not samples:
            return
        self._ensure_gpu(index)
        t = np.fromiter((s.t_s - self.t0_s for s in samples), float, len(samples))
        self.series[f"vram{index}"].extend(t, np.fromiter((s.used_bytes / GiB for s in samples), float, len(samples)))
        self.series[f"vram_runner{index}"].extend(
            t,
            np.fromiter(
                (math.nan if s.process_bytes is None else s.process_bytes / GiB for s in samples), float, len(samples)
            ),
        )
        gtt = [getattr(s, "gtt_used_bytes", None) for s in samples]
        if any(v is not None for v in gtt):  # an AMD GPU (sysfs): its GTT pool, system RAM the GPU maps
            if f"gtt{index}" not in self.series:
                self._add_curve(f"gtt{index}", self.mem_plot, f"GTT used GPU{index}", COLORS["gtt"])
            self.series[f"gtt{index}"].extend(
                t, np.fromiter((math.nan if v is None else v / GiB for v in gtt), float, len(gtt))
            )

    def add_context(self, t_s: float, kv_bytes: float) -> None:
        """The KV cache bytes holding tokens at monotonic time ``t_s`` (an attached server's
        context fill; the curve appears with its first point)."""
        if "context" not in self.series:
            self._add_curve("context", self.mem_plot, "KV holding context", COLORS["context"])
        self.series["context"].append(self.rel(t_s), kv_bytes / GiB)

    def add_prefill(self, t_s: float, tok_s: float) -> None:
        """One measured prefill rate (tok/s) at monotonic time ``t_s``."""
        self.series["prefill"].append(self.rel(t_s), tok_s)

    def add_decode(self, t_s: float, tok_s: float) -> None:
        """One measured decode rate (tok/s) at monotonic time ``t_s`` (the window draws the
        rolling rate of :class:`kvtuner.core.monitor.rolling.RollingRate`)."""
        self.series["decode"].append(self.rel(t_s), tok_s)

    def begin_run(self, t_s: float) -> None:
        """A run starts at monotonic time ``t_s``: the view follows it (unless
        :attr:`whole_session`)."""
        self.run_start_s = self.rel(t_s)
        self.follow = True
        self._ranges.pop("x", None)
        self._update_ranges()

    def set_whole_session(self, whole: bool) -> None:
        """Show the whole session (True) or zoom on the current run (False)."""
        self.whole_session = bool(whole)
        self.follow = True
        self._ranges.pop("x", None)
        self._update_ranges()

    def end_run(self, t_s: float) -> None:
        """Break the decode line so two runs are not joined."""
        self.break_decode(t_s)

    def break_decode(self, t_s: float) -> None:
        """Break the decode line at monotonic time ``t_s`` (the end of a decode phase): the next
        phase's rate is not joined to this one's."""
        self.series["decode"].append(self.rel(t_s), math.nan)

    def mark_phase(self, t_s: float, name: str) -> None:
        """A vertical marker on both plots (oldest dropped beyond MAX_PHASE_MARKERS). Markers
        within :data:`PHASE_MERGE_S` of the last labelled one add their name to its label
        ("weights, KV, compute": loading phases come milliseconds apart) instead of a label of
        their own; labels of successive markers step down :data:`PHASE_LABEL_ROWS` rows, so
        labels of close markers never overlap each other (nor the legends, which sit above)."""
        x = self.rel(t_s)
        pen = _pen(COLORS["phase"], dashed=False, width=1)
        pen.setStyle(QtCore.Qt.PenStyle.DotLine)
        head = self._label_head
        if head is not None and head in [a for a, _ in self._phases] and 0 <= x - head.value() <= PHASE_MERGE_S:
            top = pg.InfiniteLine(pos=x, angle=90, pen=pen)
            head.label.setFormat(head.label.format + ", " + name)
        else:
            self._label_slot = (self._label_slot + 1) % PHASE_LABEL_ROWS
            top = pg.InfiniteLine(
                pos=x,
                angle=90,
                pen=pen,
                label=name,
                labelOpts={
                    "position": 0.9 - 0.2 * self._label_slot,
                    "color": COLORS["phase"],
                    "anchors": [(0, 0.5), (0, 0.5)],
                },
            )
            self._label_head = top
        top.phase_name = name
        bottom = pg.InfiniteLine(pos=x, angle=90, pen=pen)
        self.mem_plot.addItem(top, ignoreBounds=True)
        self.speed_plot.addItem(bottom, ignoreBounds=True)
        self._phases.append((top, bottom))
        while len(self._phases) > MAX_PHASE_MARKERS:
            a, b = self._phases.popleft()
            self.mem_plot.removeItem(a)
            self.speed_plot.removeItem(b)

    def phase_names(self) -> list[str]:
        """Names of the phase markers shown, oldest first."""
        return [a.phase_name for a, _ in self._phases]

    def set_predicted(self, memory_bytes: Iterable[tuple[str, int]], speeds_tok_s: Iterable[tuple[str, float]]) -> None:
        """Dashed horizontal lines: predicted memory levels (label, bytes) and speeds (label, tok/s)."""
        for line, _ in self._predicted:
            vb = line.getViewBox()
            if vb is not None:
                vb.removeItem(line)
        self._predicted = []
        for label, n_bytes in memory_bytes:
            color = COLORS["vram"] if label.startswith("GPU") else COLORS["runner_rss"]
            gib = max(n_bytes / GiB, 1e-3)
            self._predicted.append((self._hline(self.mem_plot, math.log10(gib), f"predicted {label}", color), gib))
        # each speed label at its own place along the axis: two close lines never stack their labels
        for i, (label, tok_s) in enumerate(speeds_tok_s):
            if tok_s and tok_s > 0:
                color = COLORS["prefill"] if "prefill" in label else COLORS["decode"]
                line = self._hline(self.speed_plot, math.log10(tok_s), f"predicted {label}", color, 0.97 - 0.2 * i)
                self._predicted.append((line, tok_s))
        self._ranges.clear()
        self._update_ranges()

    def _hline(self, plot: pg.PlotWidget, y: float, label: str, color: str, where: float = 0.97) -> pg.InfiniteLine:
        line = pg.InfiniteLine(
            pos=y,
            angle=0,
            pen=_pen(color, dashed=True, width=1.5),
            label=label,
            labelOpts={"position": where, "color": color, "anchors": [(1, 0), (1, 0)]},
        )
        plot.addItem(line, ignoreBounds=True)
        return line

    def clear(self) -> None:
        """Forget every point and marker."""
        for s in self.series.values():
            s.clear()
        while self._phases:
            a, b = self._phases.popleft()
            self.mem_plot.removeItem(a)
            self.speed_plot.removeItem(b)

    # -- drawing ---------------------------------------------------------------------------------

    def refresh(self) -> int:
        """``setData`` on every curve whose series changed; returns how many were redrawn."""
        n = 0
        for key, s in self.series.items():
            if self._drawn[key] != s.version:
                t, v = s.arrays()
                self.curves[key].setData(t, v, connect="finite")
                self._drawn[key] = s.version
                n += 1
        if n:
            self.n_redraws += 1
            self._update_ranges()
        return n

    def _update_ranges(self) -> None:
        """Jump-scroll: the time axis grows in nice steps and its left edge moves in twentieths
        of the span, so most redraws keep the range (no axis relayout, no re-downsampling)."""
        t_lo, t_hi = math.inf, -math.inf
        for s in self.series.values():
            t, _ = s.arrays()
            if len(t):
                t_lo, t_hi = min(t_lo, t[0]), max(t_hi, t[-1])
        if not math.isfinite(t_lo):
            return
        if self.run_start_s is not None and not self.whole_session:
            t_lo = max(t_lo, self.run_start_s - RUN_LEAD_S)  # per-run zoom: from just before the run
        if self.follow:
            span = nice_ceil(max(t_hi - t_lo, 1.0) * 1.02, minimum=10.0)
            step = span / 20
            lo = math.floor(t_lo / step) * step
            if lo + span < t_hi:  # quantising the left edge must not hide the newest point
                span = nice_ceil(t_hi - lo, minimum=span)
            self._set_range("x", self.mem_plot, lo, lo + span)
        mem_keys = [k for k in self.series if k not in ("decode", "prefill")]
        mem_vb = self.mem_plot.getPlotItem().getViewBox()
        y_hi = max(
            [self.series[k].peak() for k in mem_keys]
            + [v for line, v in self._predicted if line.getViewBox() is mem_vb]
        )
        # log axis (values are log10): from 50 MiB to above the highest line; the phase labels
        # sit in the top band
        y_lo = min([MEM_FLOOR_GIB] + [v for line, v in self._predicted if line.getViewBox() is mem_vb and v > 0])
        self._set_range(
            "ymem",
            self.mem_plot,
            math.log10(max(y_lo * 0.7, 1e-3)),
            math.log10(nice_ceil(max(y_hi, 0.5) * 4.0, minimum=0.5)),
        )
        speed_vb = self.speed_plot.getPlotItem().getViewBox()
        s_hi = max(
            [self.series[k].peak() for k in ("decode", "prefill")]
            + [v for line, v in self._predicted if line.getViewBox() is speed_vb]
            + [20.0]
        )
        # log axis (values are log10): from 0.3 tok/s (below the abandon line) to the top
        self._set_range("yspeed", self.speed_plot, math.log10(0.3), math.log10(nice_ceil(s_hi * 1.6)))

    def _set_range(self, key: str, plot: pg.PlotWidget, lo: float, hi: float) -> None:
        old = self._ranges.get(key)
        if old is not None and abs(old[0] - lo) < 1e-9 and abs(old[1] - hi) < 1e-9 * max(1.0, abs(hi)):
            return
        self._ranges[key] = (lo, hi)
        if key == "x":
            plot.getPlotItem().setXRange(lo, hi, padding=0)
        else:
            plot.getPlotItem().setYRange(lo, hi, padding=0)

    def _on_view_range_changed_manually(self, *_: object) -> None:
        self.follow = False

    def _on_plot_clicked(self, event: object) -> None:
        if getattr(event, "double", lambda: False)():
            self.follow = True
            self._ranges.pop("x", None)
            self._update_ranges()

    def point_count(self, key: str) -> int:
        """Points held (not NaN gaps) in series ``key``."""
        _, v = self.series[key].arrays()
        return int(np.count_nonzero(~np.isnan(v)))
