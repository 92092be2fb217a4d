"""Advisor pane: the plan's advice (error / warning / info) with one-click fixes.

Every row shows whole: the sentence wraps, and its fix button sits under it with its text
wrapped to the pane's width (a button never runs past the edge). :meth:`AdvisorPane.needed_height`
says how tall the pane must be to show every row; the window grows the pane to it (up to a
share of its height) and the rows scroll beyond that, so every fix stays reachable."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6 import QtCore, QtGui, QtWidgets

from ...core.advice.advisor import Advice, AdviceAction
from ..config_state import fix_wording, gui_wording

_ICONS = {
    "error": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxCritical,
    "warning": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxWarning,
    "info": QtWidgets.QStyle.StandardPixmap.SP_MessageBoxInformation,
}
#: The severity icon's size, pixels.
ICON_PX = 18


def wrap_to_width(text: str, metrics: QtGui.QFontMetrics, width_px: int) -> str:
    """``text`` with line breaks between words so that no line is wider than ``width_px`` in
    ``metrics``' font (a word wider than that stays whole on its own line)."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            trial = f"{line} {word}" if line else word
            if line and metrics.horizontalAdvance(trial) > width_px:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
    return "\n".join(lines)


class AdvisorPane(QtWidgets.QGroupBox):
    """Lists :class:`kvtuner.core.advice.advisor.Advice` items: severity icon, the sentence with its
    numbers (in the window's words: :func:`kvtuner.gui.config_state.gui_wording`), the reason as
    tooltip, and under it a button by the advice's :class:`AdviceAction`: ``FIX`` emits
    :attr:`apply_fix` with the advice's ``fix`` (a dict of PlanConfig changes), ``STOP_RUN`` emits
    :attr:`stop_requested`."""

    apply_fix = QtCore.Signal(dict)
    #: the user asked to stop the run (the live "under 1 tok/s" advice's button)
    stop_requested = QtCore.Signal()
    #: the "stop by itself" checkbox changed
    auto_stop_changed = QtCore.Signal(bool)
    #: the notes or the rows changed, or their wrapping did (the window makes room for them)
    content_changed = QtCore.Signal()

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
        self._scroll.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._scroll.setMinimumHeight(24)  # one row; the window gives more
        self._scroll.viewport().installEventFilter(self)
        outer.addWidget(self._scroll)
        self._body = QtWidgets.QWidget()
        self._rows = QtWidgets.QVBoxLayout(self._body)
        self._rows.setContentsMargins(0, 0, 0, 0)
        self._rows.setSpacing(6)
        self._scroll.setWidget(self._body)
        self.auto_stop = QtWidgets.QCheckBox("Stop a run by itself when decode stays under 1 tok/s for 10 s")
        self.auto_stop.setToolTip(
            "Under 1 tok/s, 1000 tokens take over 15 minutes: the abandon line. "
            "Unchecked, the advice offers a Stop button instead."
        )
        self.auto_stop.toggled.connect(self.auto_stop_changed.emit)
        outer.addWidget(self.auto_stop)
        self.items: list[Advice] = []
        self.buttons: list[QtWidgets.QPushButton] = []
        self.stop_button: QtWidgets.QPushButton | None = None
        #: every row's button with its unwrapped text (rewrapped when the width changes)
        self._button_texts: list[tuple[QtWidgets.QPushButton, str]] = []
        self._wrap_width_px = 0
        self.live = False
        self._key: object = object()
        self.set_advice(None)

    # -- size ------------------------------------------------------------------------------------

    def _content_width(self) -> int:
        """Pixels a row may use: the scroll area's width less its scroll bar (kept free so the
        rows need not rewrap when it appears)."""
        bar = self.style().pixelMetric(QtWidgets.QStyle.PixelMetric.PM_ScrollBarExtent)
        width = self._scroll.viewport().width() if self._scroll.isVisible() else self.contentsRect().width() - 8
        return max(width - bar, 160)

    def needed_height(self) -> int:
        """Pixels the pane needs to show its notes, every advice row with its button and the
        checkbox whole, at its current width."""
        width = self._content_width()
        self._wrap_buttons(width)
        m = self.contentsMargins()  # the frame and the title
        lay = self.layout()
        lm = lay.contentsMargins()
        notes = self.notes.heightForWidth(width) + lay.spacing() if not self.notes.isHidden() else 0
        rows = (
            self._rows.totalHeightForWidth(width)
            if self._rows.hasHeightForWidth()
            else self._rows.totalSizeHint().height()
        )
        return (
            m.top()
            + m.bottom()
            + lm.top()
            + lm.bottom()
            + notes
            + rows
            + 2 * lay.spacing()
            + self.auto_stop.sizeHint().height()
        )

    def eventFilter(self, obj: QtCore.QObject, event: QtCore.QEvent) -> bool:  # noqa: N802 (Qt API)
        if obj is self._scroll.viewport() and event.type() == QtCore.QEvent.Type.Resize:
            if self._wrap_buttons(self._content_width()):
                self.content_changed.emit()
        return False

    def _wrap_buttons(self, width_px: int) -> bool:
        """Wrap every button's text to fit ``width_px`` less the icon column; returns whether
        any text changed."""
        if width_px == self._wrap_width_px:
            return False
        self._wrap_width_px = width_px
        changed = False
        for button, text in self._button_texts:
            chrome = button.sizeHint().width() - button.fontMetrics().horizontalAdvance(
                max(button.text().split("\n"), key=button.fontMetrics().horizontalAdvance)
            )
            wrapped = wrap_to_width(text, button.fontMetrics(), width_px - ICON_PX - 12 - max(chrome, 16))
            if wrapped != button.text():
                button.setText(wrapped)
                changed = True
        return changed

    # -- content ---------------------------------------------------------------------------------

    def set_notes(self, notes: Sequence[str]) -> None:
        """Notes shown above the advice (plain text, one per line); empty hides them."""
        self.notes.setText("\n".join(f"\u26a0 {n}" for n in notes))
        self.notes.setVisible(bool(notes))
        self._fit_notes()
        self.content_changed.emit()

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        self._fit_notes()

    def _fit_notes(self) -> None:
        """The notes keep every wrapped line at the pane's width: the advice rows below scroll
        instead (the notes sit outside the scroll area)."""
        width = self.notes.width() if self.notes.width() > 1 else self.contentsRect().width()
        self.notes.setMinimumHeight(
            max(self.notes.heightForWidth(max(width, 1)), 0) if not self.notes.isHidden() else 0
        )

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
        self._button_texts = []

    @staticmethod
    def _item_key(a: Advice) -> tuple:
        return (
            a.id,
            a.severity,
            a.message,
            a.fix_label,
            a.action,
            tuple(sorted((k, repr(v)) for k, v in dict(a.fix).items())),
        )

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
        for i in range(self._rows.count()):  # shown now, not at the next event loop: measured below
            if self._rows.itemAt(i).widget() is not None:
                self._rows.itemAt(i).widget().show()
        self._wrap_width_px = 0
        self._wrap_buttons(self._content_width())
        title = f"Advice ({len(self.items)})" if self.items else "Advice"
        self.setTitle(title + (" - live, from the running model" if live else ""))
        self.content_changed.emit()
        return True

    def _note(self, text: str) -> QtWidgets.QLabel:
        label = QtWidgets.QLabel(text)
        label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        label.setWordWrap(True)
        return label

    def _row(self, a: Advice) -> QtWidgets.QWidget:
        """One advice: the icon, the sentence (wrapped) and under it the button, whole."""
        row = QtWidgets.QWidget()
        lay = QtWidgets.QGridLayout(row)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setHorizontalSpacing(6)
        lay.setVerticalSpacing(2)
        icon = QtWidgets.QLabel()
        icon.setPixmap(self.style().standardIcon(_ICONS.get(a.severity, _ICONS["info"])).pixmap(ICON_PX, ICON_PX))
        icon.setToolTip(a.severity)
        lay.addWidget(icon, 0, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        text = QtWidgets.QLabel(gui_wording(a.message))
        text.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        text.setWordWrap(True)
        text.setToolTip(f"[{a.id}] {a.reason}")  # the rule and its source, as written
        lay.addWidget(text, 0, 1)
        lay.setColumnStretch(1, 1)
        button: QtWidgets.QPushButton | None = None
        if a.action is AdviceAction.FIX and a.fix:
            button = QtWidgets.QPushButton()
            label = gui_wording(a.fix_label) if a.fix_label else "Apply"
            button.setToolTip("Sets " + fix_wording(a.fix))
            button.clicked.connect(lambda _=False, f=dict(a.fix): self.apply_fix.emit(f))
            self.buttons.append(button)
        elif a.action is AdviceAction.STOP_RUN:
            button = QtWidgets.QPushButton()
            label = a.fix_label or "Stop the run"
            button.setToolTip("Stop the running bench (its child process ends)")
            button.clicked.connect(lambda _=False: self.stop_requested.emit())
            self.stop_button = button
        if button is not None:
            button.setText(label)
            self._button_texts.append((button, label))
            lay.addWidget(button, 1, 1, QtCore.Qt.AlignmentFlag.AlignLeft)
        return row
