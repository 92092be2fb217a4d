"""Prediction: KV per token and in total, predicted speed with its band and badge, and the
stacked memory bars per device. Redrawn on every control move (all figures from the core)."""

from __future__ import annotations

from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from ...core.llama_report import DryRunResult
from ...core.units import fmt_bytes
from .memory_bars import MemoryBars, row_from_device

#: Badge colours: the fit verdict's "does not fit" and "tight", then the decode bands of
#: :func:`kvtuner.core.speed.speed_model.speed_band`.
BADGE_COLORS = {
    "does not fit": "#7b241c",
    "tight": "#9a6700",
    "abandon": "#c0392b",
    "offline": "#d35400",
    "interactive": "#2471a3",
    "fluent": "#1e8449",
}


def _tok_s(v: float) -> str:
    return f"{v:.3g}" if v < 100 else f"{v:,.0f}"


def verdict(plan: Any, speed: Any | None, margins: Any | None = None) -> tuple[str, str] | None:
    """The badge for a plan: ``(badge, reason)``; None when there is nothing to say (no plan).

    The one fit verdict (:func:`kvtuner.core.plan.verdict.fit_verdict` with ``margins``, default
    llama.cpp's ``--fit-target`` 1 GiB per GPU and 20 % of the RAM) decides first: ``"does not
    fit"`` or ``"tight"`` whatever the speed; a plan that fits shows the decode band
    (:func:`kvtuner.core.speed.speed_model.speed_band`: abandon < 1 tok/s, offline 1-5,
    interactive 5-10, fluent >= 10) of the *worse* of the empty-cache and the full-context decode
    speed (``speed.decode_tok_s``, ``speed.decode_tok_s_at_full_ctx``); None when there is no
    speed prediction and the plan fits. ``reason`` is one line for the tooltip.
    """
    from ...core.plan.verdict import DOES_NOT_FIT, fit_verdict
    from ...core.speed.speed_model import speed_band

    if plan is None:
        return None
    v = fit_verdict(plan, margins)
    if v.level == DOES_NOT_FIT:
        return v.level, f"{v.why}. Lower the context, quantize the KV cache or move layers."
    band = ""
    if speed is not None:
        empty, full = speed.decode_tok_s, speed.decode_tok_s_at_full_ctx
        worse = min(empty, full)
        which = "with the context full" if full < empty else "with the cache empty"
        band = (
            f"{speed_band(worse).upper()}: decode {_tok_s(worse)} tok/s {which} (empty cache {_tok_s(empty)}, "
            f"full context {_tok_s(full)} tok/s). Bands: under 1 tok/s abandon, 1-5 offline only, "
            "5-10 interactive, 10 and over fluent; the badge takes the worse of the two."
        )
    if not v.fits:
        return v.level, f"{v.why} ({v.margins.source}). It loads, with less than the margin free." + (
            f" {band}" if band else ""
        )
    if speed is None:
        return None
    return speed_band(min(speed.decode_tok_s, speed.decode_tok_s_at_full_ctx)), band


class PredictionPanel(QtWidgets.QGroupBox):
    """What the plan says before anything runs. Feed it with :meth:`set_plan`."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Prediction", parent)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setSpacing(3)
        self.kv_label = QtWidgets.QLabel()
        self.speed_label = QtWidgets.QLabel()
        self.badge = QtWidgets.QLabel()
        self.warnings_label = QtWidgets.QLabel()
        for label in (self.kv_label, self.speed_label, self.badge, self.warnings_label):
            label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
            label.setWordWrap(True)
        self.badge.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)
        self.badge.setMinimumWidth(110)
        top = QtWidgets.QHBoxLayout()
        text_col = QtWidgets.QVBoxLayout()
        text_col.addWidget(self.kv_label)
        text_col.addWidget(self.speed_label)
        top.addLayout(text_col, 1)
        top.addWidget(self.badge, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        lay.addLayout(top)
        self.bars = MemoryBars()
        lay.addWidget(self.bars)
        self.warnings_label.setStyleSheet("color: #9a6700;")
        lay.addWidget(self.warnings_label)
        self.stale = False
        #: the badge shown and its reason (:func:`verdict`), or None
        self.verdict: tuple[str, str] | None = None
        self.set_plan(None)

    def set_stale(self, reason: str | None) -> None:
        """Mark the figures as those of the last valid configuration (``reason``: why the shown
        one was refused), or (None) as current."""
        self.stale = bool(reason)
        self.setTitle(
            "Prediction - STALE: these figures are for the last valid configuration" if reason else "Prediction"
        )
        for w in (self.kv_label, self.speed_label, self.badge, self.bars, self.warnings_label):
            w.setEnabled(not reason)
        self.setToolTip(f"Not replanned: {reason}" if reason else "")

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit_labels()

    def _fit_labels(self) -> None:
        """Keep the wrapped lines whole: each label asks its layout for the height its text needs
        at its width, so a growing advice pane below cannot squeeze the prediction."""
        for label in (self.kv_label, self.speed_label):
            label.setMinimumHeight(max(label.heightForWidth(max(label.width(), 1)), 0))

    def set_plan(
        self,
        plan: Any | None,
        speed: Any | None = None,
        verified: DryRunResult | None = None,
        badge: str | None = None,
        speed_error: str = "",
        margins: Any | None = None,
        extras: Any | None = None,
    ) -> None:
        """Show a :class:`~kvtuner.core.plan.memory_plan.MemoryPlan` (None: nothing to show), its
        :class:`~kvtuner.core.speed.speed_model.SpeedPrediction` (None: no prediction, for the
        reason ``speed_error``) and the dry run's report
        (:class:`~kvtuner.core.llama_report.DryRunResult`, or None); ``margins``:
        the fit verdict's (:class:`~kvtuner.core.plan.verdict.FitMargins`, None: the defaults);
        ``extras``: the projector / draft / LoRA (:class:`~kvtuner.core.plan.extras.ExtrasPlan`),
        drawn as segments of their own."""
        self.verdict = verdict(plan, speed, margins) if badge is None else (badge, "")
        if plan is None:
            self.kv_label.setText("No plan: open a model.")
            self.speed_label.setText("")
            self.badge.hide()
            self.bars.set_rows([])
            self.warnings_label.hide()
            return
        c = plan.config
        text = (
            f"KV cache: {fmt_bytes(plan.kv_bytes_per_token())} per token, {fmt_bytes(plan.kv_bytes)} in all "
            f"({plan.n_ctx:,} tokens, K {c.type_k} / V {c.type_v}, {plan.n_stream} stream"
            f"{'s' if plan.n_stream > 1 else ''}); {plan.n_gpu_layers} layers on GPU"
        )
        if verified is not None:
            who = verified.engine or "llama.cpp"
            how = verified.method or "dry-run"
            text += f"\nVerified by {who} ({how}): KV {fmt_bytes(verified.kv_bytes)}" + (
                ", compute buffers exact" if plan.compute.source == "dry-run" else ""
            )
        self.kv_label.setText(text)
        if speed is None:
            self.speed_label.setText(f"Speed: no prediction ({speed_error or 'speed model not available'})")
            self.badge.hide()
        else:
            lo, hi = speed.band
            plo, phi = speed.prefill_band
            self.speed_label.setText(
                f"Predicted: decode {_tok_s(speed.decode_tok_s)} tok/s (likely {_tok_s(lo)}-{_tok_s(hi)}), "
                f"{_tok_s(speed.decode_tok_s_at_full_ctx)} tok/s with the context full; "
                f"prefill {_tok_s(speed.prefill_tok_s)} tok/s"
                + (f" (likely {_tok_s(plo)}-{_tok_s(phi)})" if phi > 0 else "")
                + (
                    f"; calibrated on {speed.n_calibration_runs} run(s)"
                    if speed.n_calibration_runs
                    else "; uncalibrated"
                )
            )
            self.speed_label.setToolTip(
                speed.range_note or "likely: the measured spread of the speed model's errors (docs/accuracy/speed.md)"
            )
        self._fit_labels()
        if self.verdict is not None:
            name, reason = self.verdict
            self.badge.setText(name.upper())
            self.badge.setToolTip(reason)
            self.badge.setStyleSheet(
                f"background: {BADGE_COLORS.get(name, '#555')}; color: white; font-weight: bold; "
                "border-radius: 4px; padding: 4px 8px;"
            )
            self.badge.show()
        else:
            self.badge.hide()
        verified_sets = []
        for d in plan.devices:
            marks = set()
            if verified is not None and d.kv_bytes:
                marks.add("kv")
            if plan.compute.source == "dry-run" and d.compute_bytes:
                marks.add("compute")
            verified_sets.append(frozenset(marks))
        self.bars.set_rows([row_from_device(d, v, extras) for d, v in zip(plan.devices, verified_sets)])
        from ..config_state import gui_wording

        self.warnings_label.setText("\n".join(gui_wording(w) for w in plan.warnings))
        self.warnings_label.setVisible(bool(plan.warnings))
