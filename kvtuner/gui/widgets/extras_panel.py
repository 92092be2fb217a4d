"""The files llama-server loads besides the model: a projector (``--mmproj``), a draft model
(``-md``) and a LoRA adapter (``--lora``), each picked with a file dialog; the plan shows them as
their own segments in the memory bars."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from ...core.plan.config import ALL_LAYERS
from ...core.plan.extras import ExtrasConfig
from ...core.plan.fields import EXTRA_FIELDS

_FIELD = {f.name: f for f in EXTRA_FIELDS}


class ExtrasPanel(QtWidgets.QGroupBox):
    """Three file rows (projector, draft model, LoRA adapter), the draft's GPU layers (``-ngld``)
    and "projector on GPU".

    Signals:
        changed: a file or setting changed (the window replans).
    """

    changed = QtCore.Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Projector, draft model, LoRA", parent)
        form = QtWidgets.QFormLayout(self)
        self.paths: dict[str, QtWidgets.QLineEdit] = {}
        for name, title in (
            ("mmproj", "Projector GGUF"),
            ("draft", "Draft model GGUF"),
            ("loras", "LoRA adapter GGUF"),
        ):
            f = _FIELD[name]
            edit = QtWidgets.QLineEdit()
            edit.setPlaceholderText("none")
            edit.setClearButtonEnabled(True)
            edit.setToolTip(f.tooltip())
            edit.editingFinished.connect(self.changed.emit)
            button = QtWidgets.QPushButton("Browse...")
            button.setToolTip(f"Choose the {title}")
            button.clicked.connect(lambda _=False, e=edit, t=title: self._browse(e, t))
            row = QtWidgets.QHBoxLayout()
            row.addWidget(edit, 1)
            row.addWidget(button)
            label = QtWidgets.QLabel(f.label)
            label.setBuddy(edit)
            form.addRow(label, row)
            self.paths[name] = edit
        self.draft_ngl = QtWidgets.QSpinBox()
        self.draft_ngl.setRange(-1, 9999)
        self.draft_ngl.setSpecialValueText("all")  # -1: every layer and the output layer (-ngld all)
        self.draft_ngl.setValue(-1)
        self.draft_ngl.setToolTip(_FIELD["draft_gpu_layers"].tooltip())
        self.draft_ngl.valueChanged.connect(lambda _v: self.changed.emit())
        form.addRow(_FIELD["draft_gpu_layers"].label, self.draft_ngl)
        self.mmproj_offload = QtWidgets.QCheckBox("Projector on the GPU")
        self.mmproj_offload.setChecked(True)
        self.mmproj_offload.setToolTip(_FIELD["mmproj_offload"].tooltip())
        self.mmproj_offload.toggled.connect(lambda _v: self.changed.emit())
        form.addRow("", self.mmproj_offload)
        self.status = QtWidgets.QLabel("")
        self.status.setWordWrap(True)
        self.status.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        form.addRow(self.status)

    def _browse(self, edit: QtWidgets.QLineEdit, title: str) -> None:
        path, _ = QtWidgets.QFileDialog.getOpenFileName(self, title, edit.text(), "GGUF files (*.gguf);;All files (*)")
        if path:
            edit.setText(path)
            self.changed.emit()

    def set_paths(self, mmproj: str = "", draft: str = "", lora: str = "") -> None:
        """Set the three files ("" for none) and emit :attr:`changed` once."""
        for name, value in (("mmproj", mmproj), ("draft", draft), ("loras", lora)):
            self.paths[name].setText(value)
        self.changed.emit()

    def extras(self) -> ExtrasConfig:
        """The :class:`ExtrasConfig` of the panel."""
        text = {k: e.text().strip() for k, e in self.paths.items()}
        return ExtrasConfig(
            mmproj=text["mmproj"] or None,
            mmproj_offload=self.mmproj_offload.isChecked(),
            draft=text["draft"] or None,
            draft_gpu_layers=ALL_LAYERS if self.draft_ngl.value() < 0 else self.draft_ngl.value(),
            loras=((text["loras"], 1.0),) if text["loras"] else (),
        )

    def show_result(self, summary: str, error: bool = False) -> None:
        """The line under the rows: what the parts add, or why a file was refused."""
        self.status.setText(summary)
        self.status.setStyleSheet("color: #b00020;" if error else "")
