"""Known good: configurations that ran to completion for this model on this machine, best
first (measured decode tok/s), each restorable with one click."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from ...core.units import fmt_bytes

#: Columns: measured decode, then every knob a run differs by, peak runner RAM, runs merged, date.
_COLUMNS = ("decode", "context", "-ngl", "KV on GPU", "K / V", "-fa", "-np", "-ub", "peak RAM", "runs", "saved")


def merge_duplicates(runs: Sequence[Any]) -> list[tuple[Any, list[Any]]]:
    """Group saved runs of the same configuration: ``(best run, every run of it)`` per distinct
    :class:`~kvtuner.core.plan.config.PlanConfig`, in the order of each group's best run (the
    input is best first, :meth:`kvtuner.core.store.library.ConfigLibrary.known_good`)."""
    groups: dict[Any, list[Any]] = {}
    for wc in runs:
        groups.setdefault(wc.config, []).append(wc)
    return [(members[0], members) for members in groups.values()]


class KnownGoodPanel(QtWidgets.QGroupBox):
    """Lists :class:`kvtuner.core.store.library.WorkingConfig` rows (the window loads them off the
    GUI thread and passes them in, already ordered best first); runs of the same configuration
    are one row (:func:`merge_duplicates`, the "runs" column counts them).

    Signals:
        restore_requested(object): the user clicked Restore (or double-clicked a row); the
            WorkingConfig whose ``config`` should go into the controls.
        delete_requested(list): the user deleted a row: the library ids of its runs.
        remember_changed(bool): the "Remember working configurations" checkbox changed.
    """

    restore_requested = QtCore.Signal(object)
    delete_requested = QtCore.Signal(list)
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
        self.table.setToolTip(
            "Runs that completed with these settings, fastest decode first; runs of the same "
            "configuration are one row.\nRestore (or double-click) puts the selected row's "
            "configuration into the controls; Delete removes its runs from the library."
        )
        self.table.cellDoubleClicked.connect(lambda row, _col: self._restore_row(row))
        self.table.itemSelectionChanged.connect(self._on_selection_changed)
        self.table.hide()
        # the buttons act on the selected row, under the table: nothing in a cell to clip
        self.restore_button = QtWidgets.QPushButton("Restore")
        self.restore_button.setToolTip("Put the selected configuration into the controls (or double-click a row)")
        self.restore_button.clicked.connect(lambda: self._restore_row(self.table.currentRow()))
        self.delete_button = QtWidgets.QPushButton("Delete")
        self.delete_button.setToolTip("Remove the selected configuration's runs from the library (Delete key)")
        self.delete_button.clicked.connect(lambda: self._delete_row(self.table.currentRow()))
        QtGui.QShortcut(
            QtGui.QKeySequence.StandardKey.Delete,
            self.table,
            activated=lambda: self._delete_row(self.table.currentRow()),
            context=QtCore.Qt.ShortcutContext.WidgetShortcut,
        )
        self.buttons = QtWidgets.QWidget()
        bl = QtWidgets.QHBoxLayout(self.buttons)
        bl.setContentsMargins(0, 0, 0, 0)
        bl.addWidget(self.restore_button)
        bl.addWidget(self.delete_button)
        bl.addStretch(1)
        self.message = QtWidgets.QLabel()
        self.message.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.message.setWordWrap(True)
        lay.addWidget(self.message)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.buttons)
        self.remember = QtWidgets.QCheckBox("Remember working configurations")
        self.remember.setChecked(True)
        self.remember.setToolTip(
            "Save every bench that completes, with its measured speed and memory, in "
            "kvtuner's library (SQLite in the user data folder; also 'kvtuner library'). "
            "KVTUNER_LIBRARY=off in the environment turns this off too."
        )
        self.remember.toggled.connect(self.remember_changed.emit)
        lay.addWidget(self.remember)
        self.runs: list[Any] = []
        #: (best run, all its runs) per row
        self.rows: list[tuple[Any, list[Any]]] = []
        self.set_runs([])

    # -- content ---------------------------------------------------------------------------------

    def set_message(self, text: str) -> None:
        """A one-line note above the list (why it is empty, a library error ...); "" hides it."""
        self.message.setText(text)
        self.message.setVisible(bool(text))

    def set_runs(self, runs: Sequence[Any], *, empty_text: str | None = None) -> None:
        """Show ``runs`` (best first); ``empty_text`` replaces the message shown when there are none."""
        self.runs = list(runs or [])
        self.rows = merge_duplicates(self.runs)
        self.table.clearContents()
        self.table.setRowCount(len(self.rows))
        for row, (wc, members) in enumerate(self.rows):
            self._fill_row(row, wc, len(members))
        self.table.setVisible(bool(self.rows))
        self.buttons.setVisible(bool(self.rows))
        if self.rows:
            self.table.selectRow(0)
        self._on_selection_changed()
        if not self.runs:
            self.set_message(
                empty_text
                if empty_text is not None
                else "Nothing saved for this model on this machine yet: every bench that completes "
                "(Run bench) is kept here with its measured speed."
            )
        else:
            self.set_message("")
        title = "Known good configurations on this machine"
        self.setTitle(f"{title} ({len(self.rows)})" if self.rows else title)

    def _fill_row(self, row: int, wc: Any, n_runs: int = 1) -> None:
        c, m = wc.config, wc.measured
        decode = m.get("decode_tok_s")
        cells = (
            f"{decode:.1f} tok/s" if decode is not None else "-",
            f"{c.n_ctx:,}",
            "all" if c.n_gpu_layers < 0 else str(c.n_gpu_layers),
            "all" if c.kv_gpu_layers is None else str(c.kv_gpu_layers),
            f"{c.type_k} / {c.type_v}",
            c.flash_attn,
            str(c.n_seq),
            str(c.n_ubatch),
            fmt_bytes(m.get("peak_rss_bytes")),
            str(n_runs),
            str(wc.created_utc)[:10],
        )
        prefill = m.get("prefill_tok_s")
        tip = "\n".join(
            [
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
            ]
        )
        for col, text in enumerate(cells):
            item = QtWidgets.QTableWidgetItem(text)  # plain text: never interpreted
            item.setToolTip(tip)
            if col in (0, 1, 6, 7, 8, 9):
                item.setTextAlignment(QtCore.Qt.AlignmentFlag.AlignRight | QtCore.Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, col, item)

    def _on_selection_changed(self) -> None:
        ok = 0 <= self.table.currentRow() < len(self.rows)
        self.restore_button.setEnabled(ok)
        self.delete_button.setEnabled(ok)

    def _restore_row(self, row: int) -> None:
        if 0 <= row < len(self.rows):
            self.restore_requested.emit(self.rows[row][0])

    def _delete_row(self, row: int) -> None:
        if 0 <= row < len(self.rows):
            self.delete_requested.emit([wc.id for wc in self.rows[row][1]])
