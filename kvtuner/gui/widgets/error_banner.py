"""The window's error banner: one plain-text line in red above the prediction, with a Dismiss button."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets


class ErrorBanner(QtWidgets.QWidget):
    """The banner row (hidden while there is no error): :attr:`label` holds the text,
    :attr:`dismiss_button` hides it."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QtWidgets.QLabel()
        self.label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.label.setWordWrap(True)
        self.label.setStyleSheet("background: #fdecea; color: #8a1c13; padding: 6px; border: 1px solid #e6a19a;")
        self.label.hide()
        self.dismiss_button = QtWidgets.QToolButton()
        self.dismiss_button.setText("Dismiss")
        self.dismiss_button.setToolTip("Hide this message")
        self.dismiss_button.clicked.connect(self.dismiss)
        row = QtWidgets.QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.dismiss_button, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_text(self, text: str) -> None:
        """Show ``text`` (plain text), or with "" hide the banner."""
        self.label.setText(text)
        self.label.setVisible(bool(text))
        self.setVisible(bool(text))

    def dismiss(self) -> None:
        """Hide the banner (the Dismiss button); the text stays in the label."""
        self.label.hide()
        self.hide()
