"""Export dialog: pick a target, preview the text and its limitations, copy or save it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from PySide6 import QtCore, QtGui, QtWidgets

from .. import bridge


class ExportDialog(QtWidgets.QDialog):
    """Preview of :func:`kvtuner.core.export.export` for each target, with Copy and Save.

    Args:
        model_path: the GGUF file.
        config: the PlanConfig to export.
        model: its ModelProfile (saves re-reading the header).
        measured: measured results of the last run (for the profile target), or None.
        save_dir: folder the Save dialog opens in.
    """

    def __init__(self, model_path: Path, config: Any, *, model: Any = None, measured: dict | None = None,
                 save_dir: str = "", parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Export configuration")
        self.resize(760, 520)
        self._model_path, self._config, self._model, self._measured = model_path, config, model, measured
        self._save_dir = save_dir
        self.result: Any = None
        lay = QtWidgets.QVBoxLayout(self)
        row = QtWidgets.QHBoxLayout()
        label = QtWidgets.QLabel("&Target")
        self.target = QtWidgets.QComboBox()
        self.target.addItems(list(bridge.export_targets()))
        label.setBuddy(self.target)
        row.addWidget(label)
        row.addWidget(self.target, 1)
        lay.addLayout(row)
        self.preview = QtWidgets.QPlainTextEdit()
        self.preview.setReadOnly(True)
        self.preview.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont))
        lay.addWidget(self.preview, 1)
        self.limitations = QtWidgets.QLabel()
        self.limitations.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.limitations.setWordWrap(True)
        lay.addWidget(self.limitations)
        buttons = QtWidgets.QDialogButtonBox()
        self.copy_button = buttons.addButton("&Copy", QtWidgets.QDialogButtonBox.ButtonRole.ActionRole)
        self.save_button = buttons.addButton("&Save...", QtWidgets.QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(QtWidgets.QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        self.copy_button.clicked.connect(self.copy)
        self.save_button.clicked.connect(self._on_save_clicked)
        lay.addWidget(buttons)
        self.target.currentTextChanged.connect(self.render)
        self.render()

    def render(self, *_: object) -> None:
        """Export for the selected target and show it (errors shown in place of the text)."""
        try:
            self.result = bridge.export(self.target.currentText(), self._model_path, self._config,
                                        model=self._model, measured=self._measured)
        except Exception as exc:  # ExportError: one line saying what to change
            self.result = None
            self.preview.setPlainText("")
            self.limitations.setText(f"Cannot export: {exc}")
            self.copy_button.setEnabled(False)
            self.save_button.setEnabled(False)
            return
        self.preview.setPlainText(self.result.text)
        lim = list(self.result.limitations)
        if self.result.env:
            lim.append("Environment: " + " ".join(f"{k}={v}" for k, v in self.result.env.items()))
        self.limitations.setText("Limitations:\n- " + "\n- ".join(lim) if lim else "Exact: nothing lost in this export.")
        self.copy_button.setEnabled(True)
        self.save_button.setEnabled(True)

    def copy(self) -> None:
        """Copy the exported text to the clipboard."""
        if self.result is not None:
            QtWidgets.QApplication.clipboard().setText(self.result.text)

    def save_to(self, path: str, confirm_overwrite: Callable[[str], bool] | None = None) -> Path | None:
        """Write the text atomically to ``path``; an existing file is replaced only if
        ``confirm_overwrite(path)`` says yes."""
        if self.result is None:
            return None
        try:
            return bridge.write_export(path, self.result.text, force=False)
        except Exception as exc:
            if Path(path).exists() and confirm_overwrite is not None and confirm_overwrite(path):
                return bridge.write_export(path, self.result.text, force=True)
            if not Path(path).exists():
                QtWidgets.QMessageBox.warning(self, "Export", f"Could not save: {exc}")
            return None

    def _on_save_clicked(self) -> None:
        if self.result is None:
            return
        start = str(Path(self._save_dir or Path.home()) / self.result.filename_suggestion)
        path, _ = QtWidgets.QFileDialog.getSaveFileName(self, "Save export", start,
                                                        options=QtWidgets.QFileDialog.Option.DontConfirmOverwrite)
        if path:
            self.save_to(path, lambda p: QtWidgets.QMessageBox.question(
                self, "Export", f"{p} exists. Replace it?") == QtWidgets.QMessageBox.StandardButton.Yes)
