"""Help > About and the app icon: :func:`install_help_menu` is the main window's one hook.

The About box shows :func:`kvtuner.about.version_text` (version, the llama.cpp build the planner
follows, the llama.cpp packages installed) next to the icon from :mod:`kvtuner.resources`.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from .. import __version__
from ..about import distribution, installed_llama_cpp, planned_llama_cpp
from ..resources import APP_ID, ICON_SIZES_PX, icon_png


def app_icon() -> QtGui.QIcon:
    """The app icon with every committed PNG size (16..512 px), so Qt picks a sharp one."""
    icon = QtGui.QIcon()
    for size in ICON_SIZES_PX:
        pixmap = QtGui.QPixmap()
        pixmap.loadFromData(icon_png(size), "PNG")
        icon.addPixmap(pixmap)
    return icon


def about_text() -> str:
    """The About box's rich text: version, distribution, planned and installed llama.cpp."""
    return (f"<h3>kvtuner {html.escape(__version__)}</h3>"
            "<p>Plan, monitor and tune llama.cpp memory (weights, KV cache, compute buffers) for long "
            "contexts on small GPUs.</p>"
            f"<p><b>Plans for:</b> {html.escape(planned_llama_cpp())}<br>"
            f"<b>Installed:</b> {html.escape(installed_llama_cpp())}<br>"
            f"<b>Running as:</b> {'the desktop bundle' if distribution() == 'bundle' else 'a Python package'}</p>"
            "<p>MIT licence. The embedded default model is Gemma 3 270M (Gemma Terms of Use).</p>")


def about_dialog(parent: QtWidgets.QWidget | None) -> QtWidgets.QMessageBox:
    """A non-modal About box (not yet shown), titled "About kvtuner"."""
    box = QtWidgets.QMessageBox(parent)
    box.setWindowTitle("About kvtuner")
    box.setTextFormat(QtCore.Qt.TextFormat.RichText)
    box.setText(about_text())
    box.setIconPixmap(app_icon().pixmap(96, 96))
    box.setStandardButtons(QtWidgets.QMessageBox.StandardButton.Ok)
    return box


def install_help_menu(window: Any) -> QtGui.QAction:
    """Add Help > About kvtuner to ``window`` (a QMainWindow), set the window and application
    icon, version and desktop file name (Wayland matches windows to the desktop entry by it).
    Returns the About action (also ``window.about_action``); the box it opens is kept as
    ``window.about_box``."""
    app = QtWidgets.QApplication.instance()
    icon = app_icon()
    window.setWindowIcon(icon)
    if app is not None:
        app.setWindowIcon(icon)
        app.setApplicationVersion(__version__)
        QtGui.QGuiApplication.setDesktopFileName(APP_ID)

    def show_about() -> None:
        window.about_box = about_dialog(window)
        window.about_box.open()

    action = QtGui.QAction("&About kvtuner", window, triggered=show_about)
    action.setMenuRole(QtGui.QAction.MenuRole.AboutRole)
    window.menuBar().addMenu("&Help").addAction(action)
    window.about_action = action
    window.about_box = None
    return action
