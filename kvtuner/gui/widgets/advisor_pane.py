"""Advisor pane: the plan's advice (error / warning / info) with one-click fixes."""

from __future__ import annotations

from typing import Any, Sequence

from PySide6 import QtCore, QtWidgets

_ICONS = {
    "error": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxCritical,
    "warning": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxWarning,
    "info": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxInformation,
}


class AdvisorPane(QtWidgets.QGroupBox):
    """Lists :class:`kvtuner.core.advisor.Advice` items: severity icon, the sentence with its
    numbers, the reason as tooltip, and an Apply button that emits :attr:`apply_fix` with the
    advice's ``fix`` (a dict of PlanConfig changes)."""

    apply_fix = QtCore.Signal(dict)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Advice", parent)
        outer = QtWidgets.QVBoxLayout(self)
        outer.setContentsMargins(4, 4, 4, 4)
        self._scroll = QtWidgets.QScrollArea()
        self._scroll.setWidgetResizable(True)
        self._scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        outer.addWidget(self._scroll)
        self._body = QtWidgets.QWidget()
        self._rows = QtWidgets.QVBoxLayout(self._body)
        self._rows.setContentsMargins(0, 0, 0, 0)
        self._rows.setSpacing(4)
        self._scroll.setWidget(self._body)
        self.items: list[Any] = []
        self.buttons: list[QtWidgets.QPushButton] = []
        self.set_advice(None)

    def _clear(self) -> None:
        while self._rows.count():
            item = self._rows.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.buttons = []

    def set_advice(self, advice: Sequence[Any] | None) -> None:
        """Show advice items; None means the advisor is not available ("no advice yet")."""
        self._clear()
        self.items = list(advice or [])
        if advice is None:
            self._rows.addWidget(self._note("No advice yet: the advisor is not installed in this build."))
        elif not self.items:
            self._rows.addWidget(self._note("No problems found for this configuration."))
        for a in self.items:
            self._rows.addWidget(self._row(a))
        self._rows.addStretch(1)
        self.setTitle(f"Advice ({len(self.items)})" if self.items else "Advice")

    def _note(self, text: str) -> QtWidgets.QLabel:
        label = QtWidgets.QLabel(text)
        label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        label.setWordWrap(True)
        return label

    def _row(self, a: Any) -> QtWidgets.QWidget:
        row = QtWidgets.QWidget()
        lay = QtWidgets.QHBoxLayout(row)
        lay.setContentsMargins(0, 0, 0, 0)
        icon = QtWidgets.QLabel()
        sev = str(getattr(a, "severity", "info"))
        icon.setPixmap(self.style().standardIcon(_ICONS.get(sev, _ICONS["info"])).pixmap(18, 18))
        icon.setToolTip(sev)
        lay.addWidget(icon, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        text = QtWidgets.QLabel(f"{getattr(a, 'message', a)}")
        text.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        text.setWordWrap(True)
        reason = getattr(a, "reason", "")
        text.setToolTip(f"[{getattr(a, 'id', '')}] {reason}")
        lay.addWidget(text, 1)
        fix = getattr(a, "fix", None)
        if fix:
            button = QtWidgets.QPushButton(getattr(a, "fix_label", None) or "Apply")
            button.setToolTip("Apply: " + ", ".join(f"{k} = {v}" for k, v in dict(fix).items()))
            button.clicked.connect(lambda _=False, f=dict(fix): self.apply_fix.emit(f))
            self.buttons.append(button)
            lay.addWidget(button, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        return row
