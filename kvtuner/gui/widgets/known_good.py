"""Known good: configurations that ran to completion for this model on this machine, best
first (measured decode tok/s), each restorable with one click."""

from __future__ import annotations

from typing import Any, Sequence

from PySide6 import QtCore, QtWidgets

from ...core.units import fmt_bytes

_COLUMNS = ("decode", "context", "-ngl", "K / V", "-fa", "peak RAM", "")
_RESTORE_COL = len(_COLUMNS) - 1


class KnownGoodPanel(QtWidgets.QGroupBox):
    """Lists :class:`kvtuner.core.store.library.WorkingConfig` rows (the window loads them off the
    GUI thread and passes them in, already ordered best first).

    Signals:
        restore_requested(object): the user clicked Restore (or double-clicked a row); the
            WorkingConfig whose ``config`` should go into the controls.
        remember_changed(bool): the "Remember working configurations" checkbox changed.
    """

    restore_requested = QtCore.Signal(object)
    remember_changed = QtCore.Signal(bool)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Known good configurations on this machine", parent)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.table = QtWidgets.QTableWidget(0, len(_COLUMNS))
        self.table.setHorizontalHeaderLabels(list(_COLUMNS))
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QtWidgets.QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setWordWrap(False)
        self.table.setMinimumHeight(110)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QtWidgets.QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.table.setToolTip("Runs that completed with these settings, fastest decode first. "
                              "Restore (or double-click) puts a row's configuration into the controls.")
        self.table.cellDoubleClicked.connect(lambda row, _col: self._restore_row(row))
        self.table.hide()
        self.message = QtWidgets.QLabel()
        self.message.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.message.setWordWrap(True)
        lay.addWidget(self.message)
        lay.addWidget(self.table, 1)
        self.remember = QtWidgets.QCheckBox("Remember working configurations")
        self.remember.setChecked(True)
        self.remember.setToolTip("Save every bench that completes, with its measured speed and memory, in "
                                 "kvtuner's library (SQLite in the user data folder; also 'kvtuner library'). "
                                 "KVTUNER_LIBRARY=off in the environment turns this off too.")
        self.remember.toggled.connect(self.remember_changed.emit)
        lay.addWidget(self.remember)
        self.runs: list[Any] = []
        self.restore_buttons: list[QtWidgets.QPushButton] = []
        self.set_runs([])

    # -- content ---------------------------------------------------------------------------------

    def set_message(self, text: str) -> None:
        """A one-line note above the list (why it is empty, a library error ...); "" hides it."""
        self.message.setText(text)
        self.message.setVisible(bool(text))

    def set_runs(self, runs: Sequence[Any], *, empty_text: str | None = None) -> None:
        """Show ``runs`` (best first); ``empty_text`` replaces the message shown when there are none."""
        self.runs = list(runs or [])
        self.restore_buttons = []
        self.table.clearContents()
        self.table.setRowCount(len(self.runs))
        for row, wc in enumerate(self.runs):
            self._fill_row(row, wc)
        self.table.setVisible(bool(self.runs))
        if not self.runs:
            self.set_message(empty_text if empty_text is not None else
                             "Nothing saved for this model on this machine yet: every bench that completes "
                             "(Run bench) is kept here with its measured speed.")
        else:
            self.set_message("")
        title = "Known good configurations on this machine"
        self.setTitle(f"{title} ({len(self.runs)})" if self.runs else title)

    def _fill_row(self, row: int, wc: Any) -> None:
        c, m = wc.config, wc.measured
        decode = m.get("decode_tok_s")
        cells = (
            f"{decode:.1f} tok/s" if decode is not None else "-",
            f"{c.n_ctx:,}",
            "all" if c.n_gpu_layers < 0 else str(c.n_gpu_layers),
            f"{c.type_k} / {c.type_v}",
            c.flash_attn,
            fmt_bytes(m.get("peak_rss_bytes")),
        )
        prefill = m.get("prefill_tok_s")
        tip = "\n".join([
            f"saved {wc.created_utc} (id {wc.id})",
            f"model {wc.model_path}",
            f"decode {decode:.2f} tok/s" if decode is not None else "decode -",
            f"prefill {prefill:.1f} tok/s" if prefill is not None else "prefill -",
            f"load {m['load_s']:.2f} s" if m.get("load_s") is not None else "load -",
            f"peak RAM (runner) {fmt_bytes(m.get('peak_rss_bytes'))}, "
            f"peak VRAM {fmt_bytes(m.get('peak_vram_bytes'))}, KV {fmt_bytes(m.get('kv_bytes'))}",
            f"-c {c.n_ctx} -ngl {'all' if c.n_gpu_layers < 0 else c.n_gpu_layers} -ctk {c.type_k} -ctv {c.type_v} "
            f"-fa {c.flash_attn} -np {c.n_seq} -ub {c.n_ubatch}"
            + ("" if c.kv_gpu_layers is None else f", KV layers on GPU {c.kv_gpu_layers}"),
            f"llama.cpp: {wc.llama_cpp_build or 'unknown'}",
        ])
        for col, text in enumerate(cells):
            item = QtWidgets.QTableWidgetItem(text)  # plain text: never interpreted
            item.setToolTip(tip)
            if col in (0, 1, 5):
                item.setTextAlignment(QtCore.Qt.AlignmentFlag.AlignRight | QtCore.Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, col, item)
        button = QtWidgets.QPushButton("Restore")
        button.setToolTip("Put this configuration into the controls")
        button.clicked.connect(lambda _=False, r=row: self._restore_row(r))
        self.restore_buttons.append(button)
        self.table.setCellWidget(row, _RESTORE_COL, button)

    def _restore_row(self, row: int) -> None:
        if 0 <= row < len(self.runs):
            self.restore_requested.emit(self.runs[row])
