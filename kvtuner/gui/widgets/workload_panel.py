"""The workload fields next to ``-np``: average and P95 tokens per sequence and a shared prefix,
and the worst-case / expected-case KV they give (:mod:`kvtuner.core.plan.workload`)."""

from __future__ import annotations

from typing import Any

from PySide6 import QtCore, QtWidgets

from ...core.plan.workload import ServingWorkload, WorkloadError, workload_advice, workload_kv
from ...core.units import fmt_bytes


class WorkloadPanel(QtWidgets.QGroupBox):
    """Three spin boxes (0 = not given) and a summary line; :meth:`set_plan` recomputes it for a
    :class:`~kvtuner.core.plan.memory_plan.MemoryPlan`. ``changed`` fires when a field changes."""

    changed = QtCore.Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Workload (expected lengths)", parent)
        form = QtWidgets.QFormLayout(self)
        self.avg = self._spin("average tokens per sequence (prompt + output); 0 = not given")
        self.p95 = self._spin("95th percentile of tokens per sequence; 0 = not given")
        self.prefix = self._spin(
            "leading tokens every sequence shares (system prompt); vLLM's prefix caching stores "
            "its full 16-token blocks once, llama-server shares none between requests"
        )
        form.addRow("Average &length (tokens)", self.avg)
        form.addRow("P95 length (t&okens)", self.p95)
        form.addRow("Shared prefi&x (tokens)", self.prefix)
        self.summary = QtWidgets.QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        form.addRow(self.summary)
        self.table_button = QtWidgets.QPushButton("&Decision table...")
        self.table_button.setToolTip(
            "sequences x window x KV type -> fits / does not fit on the first GPU (plan --table)"
        )
        self.table_button.clicked.connect(self.open_table)
        form.addRow(self.table_button)
        self.table_dialog: QtWidgets.QDialog | None = None
        self._plan: Any = None
        self._bandwidth: float | None = None

    def _spin(self, tip: str) -> QtWidgets.QSpinBox:
        s = QtWidgets.QSpinBox()
        s.setRange(0, 1 << 30)
        s.setSpecialValueText("-")
        s.setToolTip(tip)
        s.valueChanged.connect(self._on_changed)
        return s

    def _on_changed(self, *_: object) -> None:
        self._update()
        self.changed.emit()

    def set_plan(self, plan: Any, bandwidth_bytes_s: float | None = None) -> None:
        """Show the workload's KV for ``plan`` (None clears it); ``bandwidth_bytes_s`` (the first
        GPU's) gives the decision table its tok/s."""
        self._plan = plan
        self._bandwidth = bandwidth_bytes_s
        self._update()

    def open_table(self) -> None:
        """Open the decision table for the current plan."""
        from .decision_table import DecisionTableDialog

        self.table_dialog = DecisionTableDialog(self._plan, self._bandwidth, self)
        self.table_dialog.resize(760, 420)
        self.table_dialog.show()

    def _update(self) -> None:
        plan = self._plan
        if plan is None or not (self.avg.value() or self.p95.value()):
            self.summary.setText("give an average or P95 length to see the expected case beside the worst")
            return
        cfg = plan.config
        window = plan.n_ctx if cfg.kv_unified else plan.n_ctx_seq
        try:
            w = ServingWorkload(
                cfg.n_seq, window, self.avg.value() or None, self.p95.value() or None, self.prefix.value()
            )
        except WorkloadError as exc:
            self.summary.setText(str(exc))
            return
        kv = workload_kv(plan.kv_bytes_per_token(), w, engine="llama.cpp", unified=cfg.kv_unified)
        parts = [f"worst {fmt_bytes(kv.bytes(kv.worst_tokens))}"]
        if kv.p95_tokens is not None:
            parts.append(f"P95 {fmt_bytes(kv.bytes(kv.p95_tokens))}")
        if kv.expected_tokens is not None:
            parts.append(f"expected {fmt_bytes(kv.bytes(kv.expected_tokens))}")
        vl = workload_kv(plan.kv_bytes_per_token(), w, engine="vllm")
        tail = f"; vLLM expected {fmt_bytes(vl.bytes(vl.expected_tokens or vl.p95_tokens))}"
        self.summary.setText("KV: " + ", ".join(parts) + tail + "\n" + workload_advice(kv, plan.n_ctx))

    def text(self) -> str:
        """The summary line (for tests and the status bar)."""
        return self.summary.text()
