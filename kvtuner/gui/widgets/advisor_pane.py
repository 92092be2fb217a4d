"""Advisor pane: the plan's advice (error / warning / info) with one-click fixes."""

from __future__ import annotations

from typing import Sequence

from PySide6 import QtCore, QtWidgets

from ...core.advice.advisor import Advice, AdviceAction

_ICONS = {
    "error": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxCritical,
    "warning": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxWarning,
    "info": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxInformation,
}


class AdvisorPane(QtWidgets.QGroupBox):
    """Lists :class:`kvtuner.core.advice.advisor.Advice` items: severity icon, the sentence with its
    numbers, the reason as tooltip, and a button by the advice's :class:`AdviceAction`: ``FIX``
    emits :attr:`apply_fix` with the advice's ``fix`` (a dict of PlanConfig changes),
    ``STOP_RUN`` emits :attr:`stop_requested`."""

    apply_fix = QtCore.Signal(dict)
    #: the user asked to stop the run (the live "under 1 tok/s" advice's button)
    stop_requested = QtCore.Signal()
    #: the "stop by itself" checkbox changed
    auto_stop_changed = QtCore.Signal(bool)
    #: notes were shown or hidden (the window makes room for them)
    notes_changed = QtCore.Signal()

    def needed_height(self) -> int:
        """Pixels the pane needs to show its notes whole, one advice row and the checkbox."""
        width = max(self.width() - 24, 200)
        notes = self.notes.heightForWidth(width) + 8 if not self.notes.isHidden() else 0
        return notes + 2 * self.auto_stop.sizeHint().height() + 48

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Advice", parent)
        outer = QtWidgets.QVBoxLayout(self)
        outer.setContentsMargins(4, 4, 4, 4)
        self.notes = QtWidgets.QLabel()  # e.g. an opened profile's warnings
        self.notes.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.notes.setWordWrap(True)
        self.notes.setStyleSheet("background: #fff4d6; color: #5c4400; padding: 4px; border: 1px solid #e6c96b;")
        self.notes.hide()
        outer.addWidget(self.notes)
        self._scroll = QtWidgets.QScrollArea()
        self._scroll.setWidgetResizable(True)
        self._scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)
        self._scroll.setMinimumHeight(24)  # one row; the splitter gives more
        outer.addWidget(self._scroll)
        self._body = QtWidgets.QWidget()
        self._rows = QtWidgets.QVBoxLayout(self._body)
        self._rows.setContentsMargins(0, 0, 0, 0)
        self._rows.setSpacing(4)
        self._scroll.setWidget(self._body)
        self.auto_stop = QtWidgets.QCheckBox("Stop a run by itself when decode stays under 1 tok/s for 10 s")
        self.auto_stop.setToolTip("Under 1 tok/s, 1000 tokens take over 15 minutes: the abandon line. "
                                  "Unchecked, the advice offers a Stop button instead.")
        self.auto_stop.toggled.connect(self.auto_stop_changed.emit)
        outer.addWidget(self.auto_stop)
        self.items: list[Advice] = []
        self.buttons: list[QtWidgets.QPushButton] = []
        self.stop_button: QtWidgets.QPushButton | None = None
        self.live = False
        self._key: object = object()
        self.set_advice(None)

    def set_notes(self, notes: Sequence[str]) -> None:
        """Notes shown above the advice (plain text, one per line); empty hides them."""
        self.notes.setText("\n".join(f"\u26a0 {n}" for n in notes))
        self.notes.setVisible(bool(notes))
        self.notes_changed.emit()

    def _clear(self) -> None:
        while self._rows.count():
            item = self._rows.takeAt(0)
            if item.widget() is not None:
                # hidden now: deleteLater waits for the event loop, and until then (a screenshot,
                # processEvents-only loops) the old row would still paint under the new ones
                item.widget().hide()
                item.widget().deleteLater()
        self.buttons = []
        self.stop_button = None

    @staticmethod
    def _item_key(a: Advice) -> tuple:
        return (a.id, a.severity, a.message, a.fix_label, a.action,
                tuple(sorted((k, repr(v)) for k, v in dict(a.fix).items())))

    def set_advice(self, advice: Sequence[Advice] | None, *, live: bool = False) -> bool:
        """Show advice items; None means there is no plan to advise on yet.
        ``live``: the list includes measured advice of a running model. Rebuilds the rows only
        when something changed (the live timer calls this often); returns whether it did."""
        key = (None if advice is None else tuple(self._item_key(a) for a in advice), live)
        if key == self._key:
            return False
        self._key = key
        self.live = live
        self._clear()
        self.items = list(advice or [])
        if advice is None:
            self._rows.addWidget(self._note("No advice yet: open a model."))
        elif not self.items:
            self._rows.addWidget(self._note("No problems found for this configuration."))
        for a in self.items:
            self._rows.addWidget(self._row(a))
        self._rows.addStretch(1)
        title = f"Advice ({len(self.items)})" if self.items else "Advice"
        self.setTitle(title + (" - live, from the running model" if live else ""))
        return True

    def _note(self, text: str) -> QtWidgets.QLabel:
        label = QtWidgets.QLabel(text)
        label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        label.setWordWrap(True)
        return label

    def _row(self, a: Advice) -> QtWidgets.QWidget:
        row = QtWidgets.QWidget()
        lay = QtWidgets.QHBoxLayout(row)
        lay.setContentsMargins(0, 0, 0, 0)
        icon = QtWidgets.QLabel()
        icon.setPixmap(self.style().standardIcon(_ICONS.get(a.severity, _ICONS["info"])).pixmap(18, 18))
        icon.setToolTip(a.severity)
        lay.addWidget(icon, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        text = QtWidgets.QLabel(a.message)
        text.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        text.setWordWrap(True)
        text.setToolTip(f"[{a.id}] {a.reason}")
        lay.addWidget(text, 1)
        if a.action is AdviceAction.FIX and a.fix:
            button = QtWidgets.QPushButton(a.fix_label or "Apply")
            button.setToolTip("Apply: " + ", ".join(f"{k} = {v}" for k, v in a.fix.items()))
            button.clicked.connect(lambda _=False, f=dict(a.fix): self.apply_fix.emit(f))
            self.buttons.append(button)
            lay.addWidget(button, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        elif a.action is AdviceAction.STOP_RUN:
            button = QtWidgets.QPushButton(a.fix_label or "Stop the run")
            button.setToolTip("Stop the running bench (its child process ends)")
            button.clicked.connect(lambda _=False: self.stop_requested.emit())
            self.stop_button = button
            lay.addWidget(button, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        return row
