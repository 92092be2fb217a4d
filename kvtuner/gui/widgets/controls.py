"""Tuning controls: one slider with a typed entry per llama.cpp knob.

Every control says in its tooltip which llama.cpp flag it is and the formula behind the
number it moves; labels and tooltips come from the configuration catalogue
(:func:`kvtuner.core.plan.fields.config_field`). The widget emits :attr:`ConfigControls.changed` on every move; the main
window replans (the planner takes well under a millisecond). Building the
:class:`~kvtuner.core.plan.config.PlanConfig` may raise :class:`~kvtuner.core.plan.config.ConfigError`
(e.g. a quantized V cache with flash attention off): the message is shown, nothing else.
"""

from __future__ import annotations

import bisect
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from ...core.model.ggml_types import KV_CACHE_TYPES
from ...core.plan.config import ALL_LAYERS, PlanConfig, resolve_server_defaults
from ...core.plan.fields import config_field
from ...core.plan.llama_constants import CTX_PAD_CELLS, LLAMA_MAX_SEQ, pad_ctx
from ...core.plan.placement import offloaded_repeating_layers

#: The context slider's bounds: 512 tokens .. max(trained context, 1M).
CTX_MIN = 512
CTX_MAX_FLOOR = 1 << 20
#: Slider steps per doubling of the context.
CTX_STEPS_PER_OCTAVE = 8


def ctx_slider_values(n_ctx_train: int) -> list[int]:
    """The context sizes the slider stops at, ascending: per octave ``2**k * (1 + i/8)``,
    i.e. every power of two and log-spaced multiples of llama.cpp's context padding (256) between
    them, from 512 to ``max(n_ctx_train, 1M)`` (the top padded as llama.cpp pads it)."""
    top = pad_ctx(max(n_ctx_train, CTX_MAX_FLOOR))
    values = set()
    k = CTX_MIN.bit_length() - 1
    while (1 << k) <= top:
        for i in range(CTX_STEPS_PER_OCTAVE):
            v = (1 << k) + (1 << k) * i // CTX_STEPS_PER_OCTAVE
            v = round(v / CTX_PAD_CELLS) * CTX_PAD_CELLS if v % (1 << k) else v  # powers of two stay exact
            if CTX_MIN <= v <= top:
                values.add(v)
        k += 1
    values.add(top)
    return sorted(values)


def nearest_index(values: list[int], value: int) -> int:
    """Index of the slider stop closest to ``value`` (ratio distance: the slider is logarithmic)."""
    i = bisect.bisect_left(values, value)
    if i <= 0:
        return 0
    if i >= len(values):
        return len(values) - 1
    lo, hi = values[i - 1], values[i]
    return i - 1 if value * value < lo * hi else i


class _AllSpinBox(QtWidgets.QSpinBox):
    """A spin box whose maximum reads "all" (typed "all" selects it); "n/a" while its control
    does not apply (:attr:`not_applicable`)."""

    #: set while the control does not apply: the box reads "n/a"
    not_applicable = False

    def textFromValue(self, value: int) -> str:  # noqa: N802 (Qt API)
        if self.not_applicable:
            return "n/a"
        return "all" if value == self.maximum() and self.maximum() > 0 else str(value)

    def valueFromText(self, text: str) -> int:  # noqa: N802 (Qt API)
        return self.maximum() if text.strip().lower() == "all" else int(text or 0)

    def validate(self, text: str, pos: int) -> object:
        t = text.strip().lower()
        if t and "all".startswith(t):
            return QtGui.QValidator.State.Acceptable if t == "all" else QtGui.QValidator.State.Intermediate
        return super().validate(text, pos)


class _SliderEntry(QtWidgets.QWidget):
    """A horizontal slider and a spin box kept in step; ``valueChanged(int)`` once per change."""

    valueChanged = QtCore.Signal(int)

    def __init__(self, spin: QtWidgets.QSpinBox | None = None, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.slider = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
        self.slider.setMinimumWidth(120)
        self.spin = spin or QtWidgets.QSpinBox()
        self.spin.setKeyboardTracking(False)
        self.spin.setMinimumWidth(96)
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.slider, 1)
        lay.addWidget(self.spin)
        self.slider.valueChanged.connect(self._on_slider_value_changed)
        self.spin.valueChanged.connect(self._on_spin_value_changed)
        self.setFocusProxy(self.slider)

    def setRange(self, lo: int, hi: int) -> None:  # noqa: N802 (Qt style)
        for w in (self.slider, self.spin):
            w.blockSignals(True)
            w.setRange(lo, hi)
            w.blockSignals(False)

    def value(self) -> int:
        return self.spin.value()

    def setValue(self, v: int) -> None:  # noqa: N802 (Qt style)
        for w in (self.slider, self.spin):
            w.blockSignals(True)
            w.setValue(v)
            w.blockSignals(False)

    def setToolTip(self, text: str) -> None:  # noqa: N802 (Qt style)
        super().setToolTip(text)
        self.slider.setToolTip(text)
        self.spin.setToolTip(text)

    def _on_slider_value_changed(self, v: int) -> None:
        self.spin.blockSignals(True)
        self.spin.setValue(v)
        self.spin.blockSignals(False)
        self.valueChanged.emit(v)

    def _on_spin_value_changed(self, v: int) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(v)
        self.slider.blockSignals(False)
        self.valueChanged.emit(v)


class ConfigControls(QtWidgets.QGroupBox):
    """The configuration knobs (``-ngl``, KV layers on GPU, ``-c``, ``-ctk``/``-ctv``, ``-fa``,
    ``-np``, ``-ub``). Emits :attr:`changed` when the user moves any of them."""

    changed = QtCore.Signal()
    #: the one-click fix of a refused combination was clicked: its PlanConfig changes
    fix_requested = QtCore.Signal(dict)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Configuration", parent)
        self._base = PlanConfig()
        self._n_ctx_train = 0  # what a context of 0 ("training") resolves to
        self._ctx_training = False  # the context box says "training" (0) while plans use n_ctx_train
        self._auto_unified: bool | None = None  # kv_unified before -np "auto" set it
        #: llama-server defaults resolved by the last config() ("ctx 0 -> 131072 (training context)")
        self.resolved_notes: list[str] = []
        self._shown = self._base
        #: field name -> why its control does not apply (the control reads "n/a")
        self.not_applicable: dict[str, str] = {}
        self._n_layer = 0
        self._ctx_values = ctx_slider_values(0)
        form = QtWidgets.QFormLayout(self)
        form.setFieldGrowthPolicy(QtWidgets.QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)

        # labels and tooltips: the configuration catalogue (kvtuner.core.plan.fields), one
        # description per field for the command line, the app and the exports
        self.ngl = _SliderEntry(_AllSpinBox())
        self.ngl.setToolTip(config_field("n_gpu_layers").tooltip())
        self.kv = _SliderEntry(_AllSpinBox())
        self.kv.setToolTip(config_field("kv_gpu_layers").tooltip())
        self.ctx = _SliderEntry()
        self.ctx.spin.setRange(0, 1 << 24)
        self.ctx.spin.setSpecialValueText("training")  # llama-server's -c 0: the training context
        self.ctx.spin.setSingleStep(CTX_PAD_CELLS)
        self.ctx.spin.setSuffix(" tok")
        self.ctx.setToolTip(
            config_field("n_ctx").tooltip() + "\nThe slider is logarithmic and snaps to powers of two "
            f"and multiples of {CTX_PAD_CELLS}; type any value."
        )
        # the ctx slider indexes ctx_slider_values(); the spin box holds the tokens
        self.ctx.slider.valueChanged.disconnect(self.ctx._on_slider_value_changed)
        self.ctx.spin.valueChanged.disconnect(self.ctx._on_spin_value_changed)
        self.ctx.slider.valueChanged.connect(self._on_ctx_slider_moved)
        self.ctx.spin.valueChanged.connect(self._on_ctx_typed)

        self.type_k = QtWidgets.QComboBox()
        self.type_v = QtWidgets.QComboBox()
        for combo in (self.type_k, self.type_v):
            combo.addItems(list(KV_CACHE_TYPES))
        self.type_k.setToolTip(config_field("type_k").tooltip())
        self.type_v.setToolTip(config_field("type_v").tooltip())
        self.link_kv = QtWidgets.QCheckBox("V = K (linked)")
        self.link_kv.setChecked(True)
        self.link_kv.setToolTip(
            "Linked: changing the K type changes V too. Different K and V types can make\n"
            "llama.cpp fall back to a slower attention path."
        )
        type_k_row = QtWidgets.QWidget()
        tl = QtWidgets.QHBoxLayout(type_k_row)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.type_k)
        tl.addWidget(self.link_kv, 1)

        self.flash = QtWidgets.QComboBox()
        self.flash.addItems(list(config_field("flash_attn").choices))
        self.flash.setToolTip(config_field("flash_attn").tooltip())
        self.parallel = _SliderEntry()
        self.parallel.setRange(1, 16)
        self.parallel.spin.setRange(-1, LLAMA_MAX_SEQ)
        self.parallel.spin.setSpecialValueText("auto")  # llama-server's -np -1: 4 slots, unified KV
        self.parallel.setToolTip(config_field("n_seq").tooltip())
        self.ubatch = QtWidgets.QSpinBox()
        self.ubatch.setRange(1, 8192)
        self.ubatch.setSingleStep(64)
        self.ubatch.setKeyboardTracking(False)
        self.ubatch.setToolTip(config_field("n_ubatch").tooltip())

        # MoE only (shown by set_model_layers): --n-cpu-moe, the experts of the first N layers in RAM
        self.moe = _SliderEntry(_AllSpinBox())
        self.moe.setToolTip(config_field("n_cpu_moe").tooltip())
        # dense models (shown by set_config once the configuration has one, e.g. from Tune's
        # Apply, the advisor's fix or --n-cpu-ffn): the dense FFN of the first N layers in RAM
        self.ffn = _SliderEntry(_AllSpinBox())
        self.ffn.setToolTip(config_field("n_cpu_ffn").tooltip())
        self._dense = False

        self._labels = {}
        # Alt+letter goes to the number box (a value can be typed there; the arrow keys step it)
        for name, w, buddy in (
            ("n_gpu_layers", self.ngl, self.ngl.spin),
            ("kv_gpu_layers", self.kv, self.kv.spin),
            ("n_cpu_moe", self.moe, self.moe.spin),
            ("n_cpu_ffn", self.ffn, self.ffn.spin),
            ("n_ctx", self.ctx, self.ctx.spin),
            ("type_k", type_k_row, self.type_k),
            ("type_v", self.type_v, self.type_v),
            ("flash_attn", self.flash, self.flash),
            ("n_seq", self.parallel, self.parallel.spin),
            ("n_ubatch", self.ubatch, self.ubatch),
        ):
            label = QtWidgets.QLabel(config_field(name).label)
            label.setBuddy(buddy)
            label.setToolTip(buddy.toolTip())
            self._labels[name] = label
            form.addRow(label, w)
        self.error_label = QtWidgets.QLabel()
        self.error_label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b;")
        self.error_label.hide()
        form.addRow(self.error_label)
        self.fix_button = QtWidgets.QPushButton()
        self.fix_button.hide()
        self.fix_button.clicked.connect(self._on_fix_clicked)
        self._fix: dict[str, Any] = {}
        form.addRow(self.fix_button)

        self.ngl.valueChanged.connect(self._emit)
        self.kv.valueChanged.connect(self._emit)
        self.moe.valueChanged.connect(self._emit)
        self.ffn.valueChanged.connect(self._emit)
        self.parallel.valueChanged.connect(self._emit)
        self.ubatch.valueChanged.connect(self._emit)
        self.type_k.currentTextChanged.connect(self._on_type_k_changed)
        self.type_v.currentTextChanged.connect(self._emit)
        self.flash.currentTextChanged.connect(self._emit)
        self.link_kv.toggled.connect(self._on_link_toggled)
        self.set_model_layers(0, 0)

    # -- model and config in -------------------------------------------------------------------

    def set_model_layers(self, n_layer: int, n_ctx_train: int, n_expert: int = 0) -> None:
        """Adapt the ranges to a model: ``-ngl`` 0 .. n_layer + 1, context up to max(train, 1M);
        ``n_ctx_train`` is what a context of 0 ("training") resolves to; the "MoE layers with
        experts on CPU" slider (0 .. n_layer) only for a MoE model (``n_expert`` > 0)."""
        self._n_layer = n_layer
        self._n_ctx_train = n_ctx_train
        self.ngl.setRange(0, n_layer + 1)
        self.moe.setRange(0, n_layer)
        for w in (self.moe, self._labels["n_cpu_moe"]):
            w.setVisible(n_expert > 0)
        self.ffn.setRange(0, n_layer)
        self._dense = n_layer > 0 and n_expert == 0
        for w in (self.ffn, self._labels["n_cpu_ffn"]):
            w.setVisible(False)
        self._ctx_values = ctx_slider_values(n_ctx_train)
        self.ctx.slider.blockSignals(True)
        self.ctx.slider.setRange(0, len(self._ctx_values) - 1)
        self.ctx.slider.blockSignals(False)
        self.ctx.spin.blockSignals(True)
        self.ctx.spin.setMaximum(max(self._ctx_values[-1], 1 << 24))
        self.ctx.spin.blockSignals(False)

    def set_kv_layers_max(self, n_offloaded: int) -> None:
        """KV-layers range: 0 .. the repeating layers ``-ngl`` offloads ("all" at the top); the
        value shown is the last configuration's, clamped."""
        kv = self._shown.kv_gpu_layers
        self.kv.setRange(0, max(n_offloaded, 0))
        self.kv.setValue(self.kv.spin.maximum() if kv is None else min(kv, n_offloaded))

    def set_config(
        self, config: PlanConfig, effective: PlanConfig | None = None, not_applicable: dict[str, str] | None = None
    ) -> None:
        """Show a configuration without emitting :attr:`changed`.

        ``config``: what the user asked for (kept for the controls that do not apply, and for
        the fields without a control); ``effective``: what is planned, run and exported (default
        ``config``; see :func:`kvtuner.gui.config_state.effective_config`), shown by every
        control; ``not_applicable``: field name -> why, for the controls that read "n/a".
        """
        self._base = config
        shown = effective or config
        self._shown = shown
        self.not_applicable = dict(not_applicable or {})
        self.blockSignals(True)
        try:
            if self._dense and (config.n_cpu_ffn or shown.n_cpu_ffn):
                for w in (self.ffn, self._labels["n_cpu_ffn"]):
                    w.setVisible(True)
            for name, entry in (
                ("n_gpu_layers", self.ngl),
                ("kv_gpu_layers", self.kv),
                ("n_cpu_moe", self.moe),
                ("n_cpu_ffn", self.ffn),
            ):
                na = name in self.not_applicable
                entry.spin.not_applicable = na
                entry.setEnabled(not na)
                tip = config_field(name).tooltip()
                entry.setToolTip(f"Does not apply: {self.not_applicable[name]}.\n\n{tip}" if na else tip)
            ngl = shown.n_gpu_layers
            self.ngl.setValue(self._n_layer + 1 if ngl == ALL_LAYERS or ngl > self._n_layer else ngl)
            if "n_gpu_layers" in self.not_applicable:
                self.ngl.setValue(0)
            n_off = offloaded_repeating_layers(shown.n_gpu_layers, self._n_layer) if self._n_layer else 0
            self.set_kv_layers_max(0 if "kv_gpu_layers" in self.not_applicable else n_off)
            for entry in (
                self.ngl,
                self.kv,
                self.moe,
                self.ffn,
            ):  # the text may change ("n/a") while the value does not
                entry.spin.blockSignals(True)
                entry.spin.lineEdit().setText(entry.spin.textFromValue(entry.spin.value()))
                entry.spin.blockSignals(False)
            # a context of 0 stays "training" (and -np -1 "auto") while the plan is its resolved value
            self._show_ctx(0 if (self._ctx_training and shown.n_ctx == self._n_ctx_train) else shown.n_ctx)
            linked = shown.type_k == shown.type_v
            for combo, value in ((self.type_k, shown.type_k), (self.type_v, shown.type_v)):
                combo.blockSignals(True)
                combo.setCurrentText(value)
                combo.blockSignals(False)
            self.link_kv.blockSignals(True)
            self.link_kv.setChecked(linked)
            self.link_kv.blockSignals(False)
            self.type_v.setEnabled(not linked)
            for w, v in ((self.flash, shown.flash_attn),):
                w.blockSignals(True)
                w.setCurrentText(v)
                w.blockSignals(False)
            self.parallel.setValue(-1 if self._auto_unified is not None else shown.n_seq)
            self.moe.setValue(self._n_layer if shown.cpu_moe else min(shown.n_cpu_moe, self._n_layer))
            if "n_cpu_moe" in self.not_applicable:
                self.moe.setValue(0)
            self.ffn.setValue(0 if "n_cpu_ffn" in self.not_applicable else min(shown.n_cpu_ffn, self._n_layer))
            self.ubatch.blockSignals(True)
            self.ubatch.setValue(shown.n_ubatch)
            self.ubatch.blockSignals(False)
        finally:
            self.blockSignals(False)

    def values(self) -> dict[str, Any]:
        """The controls' values as PlanConfig keyword arguments; a control that does not apply
        gives the value asked for before (it is kept, not used)."""
        ngl = self.ngl.value()
        kv = self.kv.value()
        values: dict[str, Any] = {
            "n_gpu_layers": ALL_LAYERS if ngl >= self._n_layer + 1 else ngl,
            "kv_gpu_layers": None if kv >= self.kv.spin.maximum() else kv,
            "n_ctx": self.ctx.spin.value(),
            "type_k": self.type_k.currentText(),
            "type_v": self.type_v.currentText(),
            "flash_attn": self.flash.currentText(),
            "n_seq": self.parallel.value(),
            "n_ubatch": self.ubatch.value(),
        }
        if not self.moe.isHidden() and not (self._base.cpu_moe and self.moe.value() >= self._n_layer):
            values["n_cpu_moe"] = self.moe.value()
            values["cpu_moe"] = False  # the slider now says how many layers
        if not self.ffn.isHidden():
            values["n_cpu_ffn"] = self.ffn.value()
        for name in self.not_applicable:
            values[name] = getattr(self._base, name)
        return values

    def config(self, changes: dict[str, Any] | None = None) -> PlanConfig:
        """The configuration asked for: the controls' values (:meth:`values`, updated with
        ``changes``) over the fields without a control (kept from the last :meth:`set_config`).

        Raises:
            ConfigError: llama.cpp would refuse this combination (the message says what to change).
        """
        values = {**self.values(), **(changes or {})}
        if self._auto_unified is not None and values["n_seq"] != -1:
            values["kv_unified"] = self._auto_unified  # leaving "auto" restores the cache layout it replaced
            self._auto_unified = None
        self.resolved_notes = []
        self._ctx_training = values["n_ctx"] == 0
        if values["n_ctx"] == 0 or values["n_seq"] == -1:
            if values["n_seq"] == -1 and self._auto_unified is None:
                self._auto_unified = self._base.kv_unified
            values, self.resolved_notes = resolve_server_defaults(values, self._n_ctx_train)
        return self._base.with_(**values)

    def show_error(self, message: str | None, fix: tuple[str, dict[str, Any]] | None = None) -> None:
        """Show why the configuration is refused (plain text), or hide the message; ``fix``:
        ``(button text, PlanConfig changes)`` for a one-click fix (:attr:`fix_requested`)."""
        self.error_label.setText(message or "")
        self.error_label.setVisible(bool(message))
        self._fix = dict(fix[1]) if (message and fix) else {}
        self.fix_button.setText(fix[0] if (message and fix) else "")
        self.fix_button.setVisible(bool(message and fix))

    def remember(self, config: PlanConfig) -> None:
        """Record ``config`` as the base for fields without a control (after a valid change)."""
        self._base = config

    # -- handlers ------------------------------------------------------------------------------

    def _show_ctx(self, n_ctx: int) -> None:
        # the spin box holds a C int: a larger context (up to llama.cpp's 2**32 - 256, e.g. from
        # --ctx or a profile) shows as the box's maximum instead of overflowing
        n_ctx = max(self.ctx.spin.minimum(), min(n_ctx, self.ctx.spin.maximum()))
        self.ctx.spin.blockSignals(True)
        self.ctx.spin.setValue(n_ctx)
        self.ctx.spin.blockSignals(False)
        self.ctx.slider.blockSignals(True)
        self.ctx.slider.setValue(nearest_index(self._ctx_values, n_ctx))
        self.ctx.slider.blockSignals(False)

    def _on_ctx_slider_moved(self, index: int) -> None:
        self.ctx.spin.blockSignals(True)
        self.ctx.spin.setValue(self._ctx_values[index])
        self.ctx.spin.blockSignals(False)
        self._emit()

    def _on_ctx_typed(self, n_ctx: int) -> None:
        self.ctx.slider.blockSignals(True)
        self.ctx.slider.setValue(nearest_index(self._ctx_values, n_ctx))
        self.ctx.slider.blockSignals(False)
        self._emit()

    def _on_type_k_changed(self, text: str) -> None:
        if self.link_kv.isChecked():
            self.type_v.blockSignals(True)
            self.type_v.setCurrentText(text)
            self.type_v.blockSignals(False)
        self._emit()

    def _on_link_toggled(self, linked: bool) -> None:
        self.type_v.setEnabled(not linked)
        if linked:
            self._on_type_k_changed(self.type_k.currentText())

    def _on_fix_clicked(self) -> None:
        self.fix_requested.emit(dict(self._fix))

    def _emit(self, *_: object) -> None:
        if not self.signalsBlocked():
            self.changed.emit()
