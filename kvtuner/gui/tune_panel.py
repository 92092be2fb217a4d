"""The Tune dialog: goal fields, a "Tune" button, the result explained, and the knee chart
(predicted decode tok/s at full context against context length for the top configurations, the
memory limit of each, the 1 tok/s line, the chosen point marked, measured points as runs
complete). "Apply" puts the chosen configuration on the window's controls.

The search runs on the window's worker pool (:class:`kvtuner.gui.tasks.BackgroundTasks`), never on
the GUI thread; all figures come from :mod:`kvtuner.core.tune`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pyqtgraph as pg
from PySide6 import QtCore, QtWidgets

from ..core.plan.config import PlanConfig
from ..core.plan.llama_constants import CTX_PAD_CELLS
from ..core.speed.speed_model import ABANDON_TOK_S
from ..core.tune import (
    DEFAULT_KV_QUALITY,
    KV_QUALITY_ORDER,
    KneeCurve,
    QualityLevel,
    TuneError,
    TuneGoal,
    TuneResult,
    knee_curves,
    offload_note,
    quality_trade,
    tune,
)

#: Line colours of the top configurations (chosen first).
CURVE_COLORS = ("#1e8449", "#2471a3", "#9a6700", "#7d3c98")
#: Configurations drawn in the knee chart.
TOP_CURVES = 3
GOALS = (
    ("ctx", "This context at the best speed (--ctx)"),
    ("ctx_min", "At least this context (--ctx-min)"),
    ("min_tok_s", "The longest context at >= tok/s (--min-tok-s)"),
)


def _label(cfg: PlanConfig) -> str:
    ngl = "all" if cfg.n_gpu_layers < 0 else str(cfg.n_gpu_layers)
    kv = "all" if cfg.kv_gpu_layers is None else str(cfg.kv_gpu_layers)
    off = (f", FFN on CPU {cfg.n_cpu_ffn}" if cfg.n_cpu_ffn else "") + (
        f", experts on CPU {cfg.n_cpu_moe}" if cfg.n_cpu_moe else ""
    )
    return f"K {cfg.type_k}/V {cfg.type_v}, fa {cfg.flash_attn}, ngl {ngl}, KV on GPU {kv}, ub {cfg.n_ubatch}{off}"


class TunePanel(QtWidgets.QDialog):
    """Non-modal Tune dialog.

    Args:
        context: ``context() -> (model, config, gpus, host, inputs)`` of what the window shows
            (called on the GUI thread when Tune is pressed; ``inputs`` the speed model's, or None).
        submit: ``submit(fn, on_done, on_error)``, the window's background runner.
        apply: called with the chosen :class:`PlanConfig` when "Apply" is pressed.
        fit: ``fit(model, config, gpus, host, inputs, goal) -> (FitChoice | None, why | None)``,
            llama.cpp's own ``--fit`` choice (:func:`kvtuner.runner.fit_params.fit_choice_for`),
            run on the worker after the search and shown in a row beside the chosen one; None:
            no such row.

    Signals:
        applied(object): the configuration applied.
    """

    applied = QtCore.Signal(object)

    def __init__(
        self,
        context: Callable[[], tuple[Any, PlanConfig, tuple, Any, Any]],
        submit: Callable[..., Any],
        apply: Callable[[PlanConfig], None] | None = None,
        parent: QtWidgets.QWidget | None = None,
        fit: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Tune: the fastest configuration that fits")
        self._context, self._submit, self._apply, self._fit = context, submit, apply, fit
        #: llama.cpp's --fit choice of the last tune (a FitChoice), and why there is none
        self.fit_choice: Any = None
        self.trade: tuple[QualityLevel, ...] = ()
        self.fit_error: str | None = None
        self.result: TuneResult | None = None
        self.curves: list[KneeCurve] = []
        self.measured: list[tuple[int, float]] = []
        self.busy = False

        form = QtWidgets.QFormLayout()
        self.goal_kind = QtWidgets.QComboBox()
        for key, text in GOALS:
            self.goal_kind.addItem(text, key)
        self.ctx_spin = QtWidgets.QSpinBox()
        self.ctx_spin.setRange(CTX_PAD_CELLS, 1 << 30)
        self.ctx_spin.setSingleStep(1024)
        self.ctx_spin.setValue(32768)
        self.tok_spin = QtWidgets.QDoubleSpinBox()
        self.tok_spin.setRange(0.1, 10000.0)
        self.tok_spin.setValue(5.0)
        self.tok_spin.setSuffix(" tok/s")
        self.quality = QtWidgets.QComboBox()
        for q in KV_QUALITY_ORDER:
            self.quality.addItem(q, q)
        self.quality.setCurrentIndex(KV_QUALITY_ORDER.index(DEFAULT_KV_QUALITY))
        self.quality.setToolTip(
            "Worst KV cache type allowed. q8_0 is near-lossless in llama.cpp's measurements "
            "(PR #7412: KL divergence 0.001); q4_0 trades quality for memory."
        )
        form.addRow("Goal", self.goal_kind)
        form.addRow("Context (tokens)", self.ctx_spin)
        form.addRow("Decode at least", self.tok_spin)
        form.addRow("KV quality floor", self.quality)
        self.goal_kind.currentIndexChanged.connect(self._goal_changed)

        self.tune_button = QtWidgets.QPushButton("Tune")
        self.tune_button.clicked.connect(self.start)
        self.apply_button = QtWidgets.QPushButton("Apply")
        self.apply_button.setEnabled(False)
        self.apply_button.clicked.connect(self.apply)
        buttons = QtWidgets.QHBoxLayout()
        buttons.addWidget(self.tune_button)
        buttons.addWidget(self.apply_button)
        buttons.addStretch(1)

        self.text = QtWidgets.QLabel("Set a goal and press Tune.")
        self.text.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)

        # kvtuner's choice and llama.cpp's own --fit choice, one row each
        self.compare = QtWidgets.QTableWidget(0, 5)
        self.compare.setHorizontalHeaderLabels(["", "configuration", "decode at full ctx", "prefill", "source"])
        self.compare.verticalHeader().hide()
        self.compare.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.compare.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.NoSelection)
        self.compare.horizontalHeader().setSectionResizeMode(1, QtWidgets.QHeaderView.ResizeMode.Stretch)
        self.compare.setWordWrap(False)
        # every row shows whole: no scroll bars (long cells are elided, their tooltips hold the text)
        self.compare.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.compare.setVerticalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.compare.horizontalHeader().setSectionResizeMode(4, QtWidgets.QHeaderView.ResizeMode.Stretch)
        self.compare.hide()

        self.plot = pg.PlotWidget(background="w")
        self.plot.setLabel("bottom", "context length (tokens)")
        self.plot.setLabel("left", "predicted decode at full context (tok/s)")
        self.plot.setLogMode(x=True, y=True)
        # context lengths as llama.cpp users write them (1K .. 1M, powers of two): pyqtgraph's own
        # log ticks label every 1..9 x 10^k and run into each other between the decades
        self.plot.getAxis("bottom").setTicks([[(math.log10(n), _ctx_label(n)) for n in CTX_TICKS], []])
        self.plot.showGrid(x=True, y=True, alpha=0.25)
        # bottom left: decode falls with the context, so the curves leave that corner empty
        self.plot.addLegend(offset=(10, -10), brush=pg.mkBrush(255, 255, 255, 220))
        self.plot.setMinimumHeight(320)

        lay = QtWidgets.QVBoxLayout(self)
        lay.addLayout(form)
        lay.addLayout(buttons)
        lay.addWidget(self.text)
        lay.addWidget(self.compare)
        lay.addWidget(self.plot, 1)
        self._goal_changed()
        self.resize(900, 720)

    # -- goal ------------------------------------------------------------------------------------

    def _goal_changed(self) -> None:
        kind = self.goal_kind.currentData()
        self.ctx_spin.setEnabled(kind != "min_tok_s")
        self.tok_spin.setEnabled(kind == "min_tok_s")

    def goal(self) -> TuneGoal:
        """The goal the fields describe.

        Raises:
            TuneError: an impossible goal.
        """
        kind = self.goal_kind.currentData()
        q = self.quality.currentData()
        if kind == "ctx":
            return TuneGoal(n_ctx=self.ctx_spin.value(), kv_quality=q)
        if kind == "ctx_min":
            return TuneGoal(n_ctx_min=self.ctx_spin.value(), kv_quality=q)
        return TuneGoal(min_tok_s=float(self.tok_spin.value()), kv_quality=q)

    # -- work --------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Tune on a worker thread; False (with the reason shown) when it cannot start."""
        if self.busy:
            return False
        try:
            goal = self.goal()
            model, config, gpus, host, inputs = self._context()
        except TuneError as exc:
            self.text.setText(str(exc))
            return False
        if model is None or inputs is None:
            self.text.setText("Open a model first (and let the speed model set up): tuning ranks by predicted speed.")
            return False
        self.busy = True
        self.tune_button.setEnabled(False)
        self.text.setText("Tuning ...")

        fit = self._fit

        def work() -> tuple[TuneResult, list[KneeCurve], Any, tuple[QualityLevel, ...]]:
            result, curves = self.compute(model, config, gpus, host, inputs, goal)
            trade = quality_trade(goal, result, lambda g: tune(model, config, gpus, host, inputs, g))
            return result, curves, (fit(model, config, gpus, host, inputs, goal) if fit is not None else None), trade

        self._submit(work, self._done, self._failed)
        return True

    @staticmethod
    def compute(
        model: Any, config: PlanConfig, gpus: tuple, host: Any, inputs: Any, goal: TuneGoal
    ) -> tuple[TuneResult, list[KneeCurve]]:
        """The search and the chart's curves (pure core work; runs on a worker thread)."""
        result = tune(model, config, gpus, host, inputs, goal)
        configs: list[PlanConfig] = []
        seen: set[tuple[str, str, str]] = set()
        for c in result.top:  # the best of each KV type / flash attention combination
            key = (c.config.type_k, c.config.type_v, c.config.flash_attn)
            if key not in seen and len(configs) < TOP_CURVES:
                seen.add(key)
                configs.append(c.config)
        if result.fit_equivalent is not None and result.fit_equivalent.config not in configs:
            configs.append(result.fit_equivalent.config)
        top = max([2 * c.n_ctx for c in configs] + [8192])
        curves = knee_curves(
            model,
            configs,
            gpus,
            host,
            inputs,
            max_ctx=top,
            vram_margin_bytes=goal.vram_margin_bytes,
            ram_headroom_fraction=goal.ram_headroom_fraction,
        )
        return result, curves

    def _failed(self, exc: BaseException) -> None:
        self.busy = False
        self.tune_button.setEnabled(True)
        self.text.setText(f"Tuning failed: {exc}")

    def _done(self, payload: tuple[TuneResult, list[KneeCurve], Any, tuple[QualityLevel, ...]]) -> None:
        self.busy = False
        self.tune_button.setEnabled(True)
        result, curves, fit, trade = payload
        self.show_result(result, curves, fit, trade)

    # -- showing -----------------------------------------------------------------------------------

    def show_result(
        self, result: TuneResult, curves: list[KneeCurve], fit: Any = None, trade: tuple[QualityLevel, ...] = ()
    ) -> None:
        """Show a result and its knee curves; ``fit`` is ``(FitChoice | None, why | None)``,
        llama.cpp's own --fit choice, shown in a row beside the chosen one; ``trade`` the best at
        each KV quality level (:func:`kvtuner.core.tune.quality_trade`), a row each."""
        self.result, self.curves = result, curves
        self.trade = tuple(trade)
        self.fit_choice, self.fit_error = fit if fit is not None else (None, None)
        self.measured = []
        b = result.best
        lines = [f"{result.candidates_evaluated} configurations planned in {result.elapsed_s * 1000:.0f} ms."]
        if b is None:
            lines += list(result.notes) or ["Nothing fits."]
        else:
            lines.append(
                f"Chosen: ctx {b.config.n_ctx}, {_label(b.config)}: {b.decode_tok_s:.2f} tok/s at full context."
            )
            note = offload_note(b)
            if note:
                lines.append(f"Trade: {note}.")
            r = result.runner_up
            if r is not None:
                lines.append(f"Runner-up: {_label(r.config)}: {r.decode_tok_s:.2f} tok/s.")
            f = result.fit_equivalent
            if self.fit_choice is not None and self.fit_choice.note:
                lines.append(f"llama.cpp --fit: {self.fit_choice.note}.")
            elif self.fit_error:
                lines.append(f"llama.cpp --fit: {self.fit_error}.")
            elif f is not None and fit is None:
                lines.append(
                    f"llama.cpp --fit (keeps K {f.config.type_k}/V {f.config.type_v}, lowers -ngl): "
                    f"{_label(f.config)}: {f.decode_tok_s:.2f} tok/s."
                )
            lines += [f"Note: {n}" for n in result.notes]
        self.text.setText("\n".join(lines))
        self._show_compare(b)
        self.apply_button.setEnabled(b is not None)
        self.redraw()

    def compare_rows(self) -> list[list[str]]:
        """The comparison table's cells, row by row (kvtuner's choice, then llama.cpp's --fit)."""
        return [
            [
                self.compare.item(r, c).text() if self.compare.item(r, c) else ""
                for c in range(self.compare.columnCount())
            ]
            for r in range(self.compare.rowCount())
        ]

    def _show_compare(self, b: Any) -> None:
        rows: list[list[str]] = []
        if b is not None:
            pre = f"{b.prefill_tok_s:.1f} tok/s" if b.prefill_tok_s is not None else "-"
            rows.append(
                [
                    "kvtuner",
                    f"ctx {b.config.n_ctx}, {_label(b.config)}",
                    f"{b.decode_tok_s:.2f} tok/s",
                    pre,
                    "kvtuner's tune",
                ]
            )
        f = self.fit_choice
        if f is not None:
            dec = f"{f.decode_tok_s:.2f} tok/s" if f.decode_tok_s is not None else "-"
            pre = f"{f.prefill_tok_s:.1f} tok/s" if f.prefill_tok_s is not None else "-"
            how = "llama-fit-params" if f.method == "llama-fit-params" else "kvtuner's port of common/fit.cpp"
            rows.append(["llama.cpp --fit", f.flags, dec, pre, f"{how}, {f.source}"])
        elif self.fit_error:
            rows.append(["llama.cpp --fit", self.fit_error, "-", "-", ""])
        for level in self.trade:
            if level.chosen:
                continue  # the first row is that level's best
            if level.config is None:
                rows.append([f"kvtuner, KV down to {level.kv_quality}", "nothing fits", "-", "-", level.note])
                continue
            dec = f"{level.decode_tok_s_at_full_ctx:.2f} tok/s" if level.decode_tok_s_at_full_ctx is not None else "-"
            pre = f"{level.prefill_tok_s:.1f} tok/s" if level.prefill_tok_s is not None else "-"
            rows.append(
                [
                    f"kvtuner, KV down to {level.kv_quality}",
                    f"ctx {level.config.n_ctx}, {_label(level.config)}",
                    dec,
                    pre,
                    level.note,
                ]
            )
        self.compare.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                item = QtWidgets.QTableWidgetItem(text)
                item.setToolTip(text)
                self.compare.setItem(r, c, item)
        for c in (0, 2, 3):
            self.compare.resizeColumnToContents(c)
        height = self.compare.horizontalHeader().height() + 2 * self.compare.frameWidth()
        height += sum(self.compare.rowHeight(r) for r in range(len(rows)))
        self.compare.setFixedHeight(height + 2)
        self.compare.setVisible(len(rows) > 1)

    def add_measured(self, n_ctx: int, decode_tok_s: float) -> None:
        """Mark a measured decode speed (a run that completed) on the chart."""
        self.measured.append((int(n_ctx), float(decode_tok_s)))
        self.redraw()

    def redraw(self) -> None:
        """Draw the curves, the memory limits, the 1 tok/s line, the chosen and measured points."""
        p = self.plot
        p.clear()
        legend = p.plotItem.legend
        if legend is not None:
            legend.clear()
        fit_cfg = self.result.fit_equivalent.config if self.result and self.result.fit_equivalent else None
        for i, curve in enumerate(self.curves):
            color = CURVE_COLORS[i % len(CURVE_COLORS)]
            is_fit = fit_cfg is not None and curve.config == fit_cfg and i > 0
            fit_name = "--fit as kvtuner plans it: " if self.fit_choice is not None else "llama.cpp --fit: "
            name = (fit_name if is_fit else ("chosen: " if i == 0 else "")) + _label(curve.config)
            xs = [x for x, v, ok in curve.points if ok and v > 0]
            ys = [v for x, v, ok in curve.points if ok and v > 0]
            style = QtCore.Qt.PenStyle.DashLine if is_fit else QtCore.Qt.PenStyle.SolidLine
            if xs:
                p.plot(xs, ys, pen=pg.mkPen(color, width=2.5 if i == 0 else 1.5, style=style), name=name)
            over = [(x, v) for x, v, ok in curve.points if not ok and v > 0]
            if over:
                p.plot(
                    [x for x, _ in over],
                    [v for _, v in over],
                    pen=None,
                    symbol="x",
                    symbolSize=6,
                    symbolPen=pg.mkPen(color),
                    symbolBrush=None,
                )
            if curve.max_fit_ctx:
                p.addItem(
                    pg.InfiniteLine(
                        pos=_log(curve.max_fit_ctx),
                        angle=90,
                        pen=pg.mkPen(color, width=1, style=QtCore.Qt.PenStyle.DotLine),
                        label=f"fits to {curve.max_fit_ctx}" if i == 0 else None,
                        labelOpts={"position": 0.5, "color": color},
                    )
                )
        p.addItem(
            pg.InfiniteLine(
                pos=_log(ABANDON_TOK_S),
                angle=0,
                pen=pg.mkPen("#c0392b", width=1.5, style=QtCore.Qt.PenStyle.DashLine),
                label="1 tok/s: abandon",
                labelOpts={"position": 0.1, "color": "#c0392b"},
            )
        )
        b = self.result.best if self.result else None
        if b is not None and b.decode_tok_s > 0:
            p.plot(
                [b.config.n_ctx],
                [b.decode_tok_s],
                pen=None,
                symbol="star",
                symbolSize=18,
                symbolBrush="#1e8449",
                symbolPen=pg.mkPen("k"),
                name="chosen point",
            )
        f = self.fit_choice
        if f is not None and f.decode_tok_s:
            p.plot(
                [f.n_ctx],
                [f.decode_tok_s],
                pen=None,
                symbol="d",
                symbolSize=14,
                symbolBrush="#7d3c98",
                symbolPen=pg.mkPen("k"),
                name="llama.cpp --fit: " + f.flags[:60],
            )
        if self.measured:
            p.plot(
                [x for x, _ in self.measured],
                [v for _, v in self.measured],
                pen=None,
                symbol="o",
                symbolSize=10,
                symbolBrush="#e67e22",
                symbolPen=pg.mkPen("k"),
                name="measured",
            )

    def apply(self) -> None:
        """Put the chosen configuration on the window's controls."""
        if self.result is None or self.result.best is None:
            return
        cfg = self.result.best.config
        if self._apply is not None:
            self._apply(cfg)
        self.applied.emit(cfg)


#: Context lengths labelled on the knee chart's x axis, tokens (1K to 1M).
CTX_TICKS = tuple(1024 * 2**i for i in range(11))


def _ctx_label(n_tokens: int) -> str:
    """``1024 -> "1K"``, ``1048576 -> "1M"``."""
    return f"{n_tokens // (1 << 20)}M" if n_tokens >= 1 << 20 else f"{n_tokens // 1024}K"


def _log(v: float) -> float:
    """Position on a log-mode pyqtgraph axis (pyqtgraph draws items in log10 coordinates)."""
    return math.log10(max(v, 1e-9))
