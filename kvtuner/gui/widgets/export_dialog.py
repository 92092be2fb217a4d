"""Export dialog: pick a target, preview the text and what the target cannot express, copy or
save it (atomically; an existing file is replaced only after the user confirms)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from ...core.export import TARGETS, ExportError, export, write_export
from ...core.export.checked import check_export
from ...core.model.gguf_header import GGUFError

#: What each target is, for the combo box's tooltip line.
_TARGET_HELP = {
    "llama-server": "llama-server command line",
    "llama-cli": "llama-cli command line",
    "llama-cpp-python": "runnable llama-cpp-python snippet",
    "llama-cpp-python-json": "Llama(**kwargs) as JSON",
    "ollama": "Ollama Modelfile + server environment",
    "koboldcpp": "koboldcpp .kcpps settings file",
    "profile": "kvtuner profile (File > Open reads it again)",
}


class ExportDialog(QtWidgets.QDialog):
    """Preview of :func:`kvtuner.core.export.export` for each target, with Copy and Save.

    Args:
        model_path: the GGUF file.
        config: the PlanConfig to export.
        model: its ModelProfile (saves re-reading the header).
        measured: measured figures of the last completed run of this configuration (written
            into the profile target), or None.
        machine: this machine's fingerprint for the profile (None: detected on export).
        save_dir: folder the Save dialog opens in.
        flags_for: ``flags_for(target) -> BuildFlags | None``, the flags of the llama.cpp binary the
            llama-server / llama-cli line is for (the window's engine,
            :func:`kvtuner.runner.export_check.build_flags`); the line is checked against them
            (:func:`kvtuner.core.export.checked.check_export`), and says so. None: no build known.
        extras: the projector / draft / LoRA (:class:`~kvtuner.core.plan.extras.ExtrasConfig`)
            whose flags follow the configuration's in llama-server and llama-cli lines; None: none.

    The two questions Save asks are attributes so tests (and embedders) can answer them
    without a modal dialog: :attr:`ask_save_path` ``(suggested_path) -> path or None`` and
    :attr:`ask_overwrite` ``(path) -> bool``.
    """

    def __init__(
        self,
        model_path: Path,
        config: Any,
        *,
        model: Any = None,
        measured: dict | None = None,
        machine: Any = None,
        save_dir: str = "",
        parent: QtWidgets.QWidget | None = None,
        split: Any = None,
        rpc: tuple[str, ...] = (),
        flags_for: Callable[[str], Any] | None = None,
        extras: Any = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Export configuration")
        self.resize(820, 560)
        self._model_path, self._config, self._model = Path(model_path), config, model
        self._measured = dict(measured) if measured else None
        self._machine = machine
        self._split, self._rpc = split, tuple(rpc)  # -sm/-ts/-mg and --rpc (llama-server / llama-cli lines)
        self._save_dir = save_dir
        self._flags_for = flags_for
        self._extras = extras  # projector / draft / LoRA (ExtrasConfig): llama-server and llama-cli lines
        self.result: Any = None
        self.error = ""
        self.last_saved: Path | None = None
        self.ask_save_path: Callable[[str], str | None] = self._ask_save_path
        self.ask_overwrite: Callable[[str], bool] = self._ask_overwrite

        lay = QtWidgets.QVBoxLayout(self)
        row = QtWidgets.QHBoxLayout()
        label = QtWidgets.QLabel("&Target")
        self.target = QtWidgets.QComboBox()
        for name in TARGETS:
            self.target.addItem(name)
            self.target.setItemData(
                self.target.count() - 1, _TARGET_HELP.get(name, name), QtCore.Qt.ItemDataRole.ToolTipRole
            )
        label.setBuddy(self.target)
        row.addWidget(label)
        row.addWidget(self.target, 1)
        self.experimental = QtWidgets.QLabel("KV SPLIT")
        self.experimental.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.experimental.setStyleSheet(
            "background: #b26a00; color: white; font-weight: bold; padding: 2px 8px; border-radius: 3px;"
        )
        self.experimental.setToolTip(
            "This export moves layer weights with tensor overrides (-ot) so that only "
            "part of the KV cache stays on the GPU. Its memory layout was checked on a GPU "
            "(docs/accuracy/gpu.md); attention of the other layers reads their KV "
            "over PCIe, so it runs slower than kvtuner predicts."
        )
        self.experimental.hide()
        row.addWidget(self.experimental)
        lay.addLayout(row)

        self.description = QtWidgets.QLabel()
        self.description.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.description.setWordWrap(True)
        lay.addWidget(self.description)
        self.checked = QtWidgets.QLabel()
        self.checked.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.checked.setWordWrap(True)
        self.checked.hide()
        lay.addWidget(self.checked)

        self.preview = QtWidgets.QPlainTextEdit()
        self.preview.setReadOnly(True)
        # long command lines wrap on screen (Copy and Save write them unchanged)
        self.preview.setLineWrapMode(QtWidgets.QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.preview.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont))
        lay.addWidget(self.preview, 1)

        lim_title = QtWidgets.QLabel("What this target cannot express, or you must do by hand:")
        lay.addWidget(lim_title)
        self.limitations = QtWidgets.QListWidget()
        self.limitations.setWordWrap(True)
        self.limitations.setAlternatingRowColors(True)
        self.limitations.setSpacing(1)
        self.limitations.setMaximumHeight(130)
        lay.addWidget(self.limitations)

        buttons = QtWidgets.QDialogButtonBox()
        self.copy_button = buttons.addButton("&Copy", QtWidgets.QDialogButtonBox.ButtonRole.ActionRole)
        self.save_button = buttons.addButton("&Save...", QtWidgets.QDialogButtonBox.ButtonRole.ActionRole)
        close = buttons.addButton(QtWidgets.QDialogButtonBox.StandardButton.Close)
        close.clicked.connect(self.reject)
        self.copy_button.clicked.connect(self.copy)
        self.save_button.clicked.connect(self.save)
        lay.addWidget(buttons)
        self.target.currentTextChanged.connect(self.render)
        self.render()

    # -- content ---------------------------------------------------------------------------------

    def limitation_lines(self) -> list[str]:
        """The lines shown in the limitations list."""
        return [self.limitations.item(i).text() for i in range(self.limitations.count())]

    def render(self, *_: object) -> None:
        """Export for the selected target and show it (an error is shown in place of the text)."""
        target = self.target.currentText()
        measured = self._measured if target == "profile" else None
        self.limitations.clear()
        try:
            self.result = export(
                target,
                self._model_path,
                self._config,
                model=self._model,
                measured=measured,
                machine=self._machine,
                split=self._split,
                rpc=self._rpc,
            )
            if target in ("llama-server", "llama-cli"):
                from ...core.export.llama_server import with_extras

                build = self._flags_for(target) if self._flags_for is not None else None
                self.result = check_export(with_extras(self.result, self._extras, getattr(build, "flags", None)), build)
        except (ExportError, GGUFError, OSError) as exc:  # one line saying what to change
            self.result = None
            self.checked.hide()
            self.error = f"Cannot export to {target}: {exc}"
            self.preview.setPlainText("")
            self.description.setText(self.error)
            self.limitations.addItem("-")
            self.experimental.hide()
            self.copy_button.setEnabled(False)
            self.save_button.setEnabled(False)
            return
        self.error = ""
        r = self.result
        self.preview.setPlainText(r.text)
        desc = f"{_TARGET_HELP.get(target, target)}; saves as {r.filename_suggestion}"
        if target == "profile":
            desc += (
                "; includes the measured numbers of the last run of this configuration"
                if measured
                else "; no measured numbers (run a bench with this configuration to include them)"
            )
        self.description.setText(desc)
        lines = list(r.limitations)
        command = target in ("llama-server", "llama-cli")
        self.checked.setVisible(command)
        if command and lines:
            self.checked.setText(lines[0])
        if r.env:
            lines.append("Set in the environment: " + " ".join(f"{k}={v}" for k, v in r.env.items()))
        if not lines:
            lines = ["Nothing: this export is exact."]
        for line in lines:
            self.limitations.addItem(QtWidgets.QListWidgetItem(line))  # plain text
        self.experimental.setVisible(bool(r.experimental))
        self.copy_button.setEnabled(True)
        self.save_button.setEnabled(True)

    # -- actions ---------------------------------------------------------------------------------

    def copy(self) -> None:
        """Copy the exported text to the clipboard."""
        if self.result is not None:
            QtWidgets.QApplication.clipboard().setText(self.result.text)

    def suggested_path(self) -> str:
        """Where Save proposes to write (the save folder and the target's file name)."""
        name = self.result.filename_suggestion if self.result is not None else "export.txt"
        return str(Path(self._save_dir or Path.home()) / name)

    def save_to(self, path: str, confirm_overwrite: Callable[[str], bool] | None = None) -> Path | None:
        """Write the text atomically to ``path``. An existing file is replaced only when
        ``confirm_overwrite(path)`` says yes (default :attr:`ask_overwrite`). Returns the path
        written, or None (declined, or failed: :attr:`error` says why)."""
        if self.result is None:
            return None
        confirm = confirm_overwrite or self.ask_overwrite
        force = False
        if Path(path).expanduser().exists():
            if Path(path).expanduser().is_dir() or not confirm(path):
                if Path(path).expanduser().is_dir():
                    self.error = f"{path} is a folder: give a file name"
                return None
            force = True
        try:
            written = write_export(self.result, path, force=force)  # a .sh is an executable script
        except (ExportError, OSError) as exc:  # exists meanwhile, folder not writable ...
            self.error = f"Could not save: {exc}"
            return None
        self.error = ""
        self.last_saved = Path(written)
        return self.last_saved

    def save(self) -> Path | None:
        """Save: ask where (:attr:`ask_save_path`), then :meth:`save_to`; errors in a message box."""
        if self.result is None:
            return None
        path = self.ask_save_path(self.suggested_path())
        if not path:
            return None
        out = self.save_to(path)
        if out is None and self.error:
            QtWidgets.QMessageBox.warning(self, "Export", self.error)
        return out

    def _ask_save_path(self, start: str) -> str | None:
        path, _ = QtWidgets.QFileDialog.getSaveFileName(
            self, "Save export", start, options=QtWidgets.QFileDialog.Option.DontConfirmOverwrite
        )
        return path or None

    def _ask_overwrite(self, path: str) -> bool:
        answer = QtWidgets.QMessageBox.question(
            self,
            "Export",
            f"{path} already exists. Replace it?",
            QtWidgets.QMessageBox.StandardButton.Yes | QtWidgets.QMessageBox.StandardButton.No,
            QtWidgets.QMessageBox.StandardButton.No,
        )
        return answer == QtWidgets.QMessageBox.StandardButton.Yes
