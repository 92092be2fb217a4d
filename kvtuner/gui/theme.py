"""Light and dark palettes. The app follows the system's palette (Qt reads the desktop's colour
scheme); :func:`apply_dark` forces a dark one where there is no desktop to ask (offscreen
screenshots, ``kvtuner gui --screenshot``), with Qt's Fusion style, which draws every widget from
the palette.

Colours: Qt's Fusion dark palette (qtbase ``src/gui/kernel/qplatformtheme.cpp``-style values:
window #353535, base #2a2a2a, text #e6e6e6), links and highlights kept readable on both.
"""

from __future__ import annotations

from typing import Any


def apply_dark(app: Any) -> None:
    """Give ``app`` (a QApplication) the Fusion style and a dark palette."""
    from PySide6 import QtGui

    app.setStyle("Fusion")
    C = QtGui.QPalette.ColorRole
    pal = QtGui.QPalette()
    for role, color in (
        (C.Window, "#353535"),
        (C.WindowText, "#e6e6e6"),
        (C.Base, "#2a2a2a"),
        (C.AlternateBase, "#353535"),
        (C.ToolTipBase, "#424242"),
        (C.ToolTipText, "#e6e6e6"),
        (C.Text, "#e6e6e6"),
        (C.Button, "#3c3c3c"),
        (C.ButtonText, "#e6e6e6"),
        (C.BrightText, "#ff6060"),
        (C.Link, "#6cb4ff"),
        (C.Highlight, "#2f6fb3"),
        (C.HighlightedText, "#ffffff"),
        (C.PlaceholderText, "#9a9a9a"),
        (C.Mid, "#505050"),
        (C.Dark, "#232323"),
        (C.Light, "#5a5a5a"),
        (C.Midlight, "#4a4a4a"),
        (C.Shadow, "#141414"),
    ):
        pal.setColor(role, QtGui.QColor(color))
    for role in (C.WindowText, C.Text, C.ButtonText):
        pal.setColor(QtGui.QPalette.ColorGroup.Disabled, role, QtGui.QColor("#808080"))
    app.setPalette(pal)


def is_dark(palette: Any) -> bool:
    """Whether ``palette``'s window is darker than its text (a dark theme)."""
    from PySide6 import QtGui

    C = QtGui.QPalette.ColorRole
    return palette.color(C.Window).lightness() < palette.color(C.WindowText).lightness()
