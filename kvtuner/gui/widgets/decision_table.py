"""The decision table as a dialog: sequences x window x KV type -> fits / does not fit and the
roofline decode speed, for the current model on the first GPU (:mod:`kvtuner.core.plan.decision_table`)."""

from __future__ import annotations

from typing import Any

from PySide6 import QtCore, QtWidgets

from ...core.plan.decision_table import decision_table
from ...core.plan.vllm import VllmError, VllmModel
from ...core.units import fmt_bytes

#: The grid the dialog shows (the CLI's defaults, ``kvtuner plan --table``).
SEQS = (1, 2, 4, 8)
WINDOWS = (8192, 16384, 32768)
KV_TYPES = ("f16", "q8_0", "fp8")


class DecisionTableDialog(QtWidgets.QDialog):
    """One row per (sequences, window), one column per KV type; each cell ``fits`` / ``no`` with
    the KV bytes and tok/s. ``plan`` is a :class:`~kvtuner.core.plan.memory_plan.MemoryPlan`."""

    def __init__(
        self, plan: Any, bandwidth_bytes_s: float | None = None, parent: QtWidgets.QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Decision table")
        lay = QtWidgets.QVBoxLayout(self)
        self.header = QtWidgets.QLabel()
        self.header.setWordWrap(True)
        self.header.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        lay.addWidget(self.header)
        self.table = QtWidgets.QTableWidget()
        lay.addWidget(self.table, 1)
        self.cells: list = []
        gpus = plan.gpus if plan is not None else ()
        if not gpus or not gpus[0].capacity_bytes:
            self.header.setText("The decision table is per card: plan a GPU (a detected one, or a what-if card).")
            return
        try:
            model = VllmModel.from_profile(plan.model)
        except VllmError as exc:
            self.header.setText(str(exc))
            return
        card = gpus[0].capacity_bytes
        weights = plan.model.weights_bytes
        self.cells = decision_table(
            model,
            card,
            weights_bytes=weights,
            seqs=SEQS,
            windows=WINDOWS,
            kv_types=KV_TYPES,
            bandwidth_bytes_s=bandwidth_bytes_s,
        )
        self.header.setText(
            f"{plan.model.name or plan.model.file_name} on {gpus[0].name} ({fmt_bytes(card)}): weights "
            f"{fmt_bytes(weights)} + KV + 1 GiB overhead; tok/s = decode roofline, an upper bound"
        )
        self.table.setColumnCount(2 + len(KV_TYPES))
        self.table.setHorizontalHeaderLabels(["seqs", "window", *KV_TYPES])
        rows = [(s, w) for s in SEQS for w in WINDOWS]
        self.table.setRowCount(len(rows))
        by = {(c.n_seq, c.window, c.kv_type): c for c in self.cells}
        for i, (s, w) in enumerate(rows):
            self.table.setItem(i, 0, QtWidgets.QTableWidgetItem(str(s)))
            self.table.setItem(i, 1, QtWidgets.QTableWidgetItem(str(w)))
            for j, t in enumerate(KV_TYPES):
                c = by[(s, w, t)]
                tok = f", {c.decode_tok_s:.0f} tok/s" if c.decode_tok_s is not None else ""
                self.table.setItem(
                    i,
                    2 + j,
                    QtWidgets.QTableWidgetItem(f"{'fits' if c.fits else 'no'}: KV {fmt_bytes(c.kv_bytes)}{tok}"),
                )
        self.table.resizeColumnsToContents()

    def cell_text(self, n_seq: int, window: int, kv_type: str) -> str:
        """The text of one cell (for tests)."""
        i = [(s, w) for s in SEQS for w in WINDOWS].index((n_seq, window))
        return self.table.item(i, 2 + KV_TYPES.index(kv_type)).text()
