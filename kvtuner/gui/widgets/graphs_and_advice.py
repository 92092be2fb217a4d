"""The right column below the prediction: the live graphs (with the "Whole session" switch) over
the advice pane, split so that the graphs keep the height and the advice gets what its rows need."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from .advisor_pane import AdvisorPane
from .live_graphs import LiveGraphs

#: The advice pane's least height, pixels (drag the splitter for more).
ADVICE_HEIGHT_PX = 110
#: The most of the graphs-and-advice column the advice pane takes by itself; its rows scroll
#: beyond that (the graphs keep the rest).
ADVICE_MAX_SHARE = 0.6
#: The live graphs' title.
GRAPHS_TITLE = "Live: memory and speed (dashed: predicted; dotted: run phases)"


def graphs_box(graphs: LiveGraphs) -> tuple[QtWidgets.QGroupBox, QtWidgets.QCheckBox]:
    """The live graphs in a titled box with the "Whole session" switch and how to zoom;
    returns the box and the switch."""
    box = QtWidgets.QGroupBox(GRAPHS_TITLE)
    gl = QtWidgets.QVBoxLayout(box)
    gl.setContentsMargins(4, 4, 4, 4)
    gl.addWidget(graphs)
    whole_session = QtWidgets.QCheckBox("&Whole session")
    whole_session.setToolTip(
        "Show everything since the window opened; off: the time axis follows the "
        "current run.\nDrag or scroll on a graph to zoom the time axis; double-click "
        "to follow the newest data again."
    )
    whole_session.toggled.connect(graphs.set_whole_session)
    hint = QtWidgets.QLabel("drag or scroll: zoom time; double-click: follow")
    hint.setEnabled(False)
    row = QtWidgets.QHBoxLayout()
    row.addWidget(whole_session)
    row.addStretch(1)
    row.addWidget(hint)
    gl.addLayout(row)
    return box, whole_session


class GraphsAndAdvice(QtWidgets.QSplitter):
    """The graphs box over the advice pane. The split is set at the window's first show
    (:meth:`first_show`); afterwards the advice pane is sized to its notes and rows each time
    its content changes (:meth:`make_room_for_advice`)."""

    def __init__(self, graphs_box: QtWidgets.QWidget, advisor: AdvisorPane) -> None:
        super().__init__(QtCore.Qt.Orientation.Vertical)
        self.advisor = advisor
        self.addWidget(graphs_box)
        self.addWidget(advisor)
        self.setStretchFactor(0, 1)
        self.setStretchFactor(1, 0)
        self.setChildrenCollapsible(False)
        self._split_done = False  # the graphs/advice split is set at the first show
        self._dragged = False  # the user moved the splitter since the advice was last sized here
        # only a user's drag emits splitterMoved (setSizes does not); a height the layout clamps
        # (the graphs' least height) is still the pane's own
        self.splitterMoved.connect(self._on_dragged)
        advisor.content_changed.connect(self.make_room_for_advice)

    def _on_dragged(self, _pos: int, _index: int) -> None:
        self._dragged = True

    def first_show(self) -> None:
        """The window is shown for the first time: the graphs get the height, the advice what its rows need."""
        if not self._split_done:
            self._split_done = True
            self._dragged = False
            self.make_room_for_advice()

    def make_room_for_advice(self) -> None:
        """Size the advice pane to its notes and rows (:meth:`AdvisorPane.needed_height`, at
        least :data:`ADVICE_HEIGHT_PX`, at most :data:`ADVICE_MAX_SHARE` of the column, where
        its rows scroll): it grows when advice comes, and shrinks back when advice goes unless
        the splitter was dragged since."""
        if not self._split_done:
            return
        graphs, advice = self.sizes()
        total = graphs + advice
        if total <= 0:
            return
        want = max(ADVICE_HEIGHT_PX, min(self.advisor.needed_height(), int(total * ADVICE_MAX_SHARE)))
        if advice < want or (advice > want and not self._dragged):
            self.setSizes([total - want, want])
            self._dragged = False
