"""Model card: what kvtuner read from the GGUF header. Text from the file is plain text only."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from ...core.units import fmt_bytes


def fmt_count(n: int) -> str:
    """``268.1 M``, ``7.24 B`` (parameter counts)."""
    for unit, factor in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= factor:
            return f"{n / factor:.3g} {unit}"
    return str(n)


class ModelCard(QtWidgets.QGroupBox):
    """Architecture, parameters, quant, file size, layers, heads/KV heads (MHA/GQA/MQA/MLA), head
    size, sliding window and trained context of a :class:`~kvtuner.core.model.profile.ModelProfile`.
    Every label uses ``Qt.PlainText``: a GGUF name is never interpreted as HTML."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Model", parent)
        self._form = QtWidgets.QFormLayout(self)
        self._form.setVerticalSpacing(2)
        self.fields: dict[str, QtWidgets.QLabel] = {}
        for key, title in (
            ("name", "Name"),
            ("file", "File"),
            ("arch", "Architecture"),
            ("params", "Parameters"),
            ("quant", "Quant / size"),
            ("layers", "Layers"),
            ("heads", "Heads / KV heads"),
            ("head_dim", "Head size"),
            ("swa", "Sliding window"),
            ("ctx_train", "Trained context"),
        ):
            label = QtWidgets.QLabel("-")
            label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
            label.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(True)
            self.fields[key] = label
            self._form.addRow(title, label)
        self.message = QtWidgets.QLabel()
        self.message.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.message.setWordWrap(True)
        self.message.hide()
        self._form.addRow(self.message)

    def set_model(self, model: object | None) -> None:
        """Show a profile (None: "no model")."""
        if model is None:
            for label in self.fields.values():
                label.setText("-")
            self.fields["name"].setText("no model loaded: File > Open (Ctrl+O) or drop a .gguf here")
            return
        m = model
        self.fields["name"].setText(m.name or "(no general.name)")
        self.fields["file"].setText(m.file_name + (f" (+{len(m.parts) - 1} parts)" if len(m.parts) > 1 else ""))
        self.fields["file"].setToolTip(str(m.path))
        self.fields["arch"].setText(
            m.architecture + (f", MoE {m.n_expert_used}/{m.n_expert} experts" if m.n_expert else "")
        )
        self.fields["params"].setText(fmt_count(m.n_params))
        self.fields["quant"].setText(
            f"{(m.file_type or '?').replace('MOSTLY_', '')}, {fmt_bytes(m.file_bytes)} on disk"
        )
        self.fields["layers"].setText(str(m.n_layer))
        first = next((i for i in range(m.n_layer) if m.has_kv(i)), 0)
        self.fields["heads"].setText(
            f"{m.n_head[first]} / {m.n_head_kv[first]} ({m.attention_kind})" if m.n_layer else "-"
        )
        self.fields["head_dim"].setText(
            f"K {m.head_dim_k}, V {m.head_dim_v}" if m.head_dim_k != m.head_dim_v else str(m.head_dim_k)
        )
        n_swa_layers = sum(m.swa_layers)
        self.fields["swa"].setText(f"{m.n_swa} tokens on {n_swa_layers} of {m.n_layer} layers" if m.n_swa else "none")
        self.fields["ctx_train"].setText(f"{m.n_ctx_train:,} tokens")
        warnings = "\n".join(m.warnings)
        self.message.setText(warnings)
        self.message.setStyleSheet("")
        self.message.setVisible(bool(warnings))

    def show_error(self, text: str) -> None:
        """Show a load error under the card (plain text); the previous model stays shown."""
        self.message.setText(text)
        self.message.setStyleSheet("color: #c0392b;")
        self.message.setVisible(bool(text))
