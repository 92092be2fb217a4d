"""Help > First steps, Help > About and the app icon: :func:`install_help_menu` is the main
window's one hook.

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
    return (
        f"<h3>kvtuner {html.escape(__version__)}</h3>"
        "<p>Plan, monitor and tune llama.cpp memory (weights, KV cache, compute buffers) for long "
        "contexts on small GPUs.</p>"
        f"<p><b>Plans for:</b> {html.escape(planned_llama_cpp())}<br>"
        f"<b>Installed:</b> {html.escape(installed_llama_cpp())}<br>"
        f"<b>Running as:</b> {'the desktop bundle' if distribution() == 'bundle' else 'a Python package'}</p>"
        "<p>MIT licence. The embedded default model is Gemma 3 270M (Gemma Terms of Use).</p>"
    )


def about_dialog(parent: QtWidgets.QWidget | None) -> QtWidgets.QMessageBox:
    """A non-modal About box (not yet shown), titled "About kvtuner"."""
    box = QtWidgets.QMessageBox(parent)
    box.setWindowTitle("About kvtuner")
    box.setTextFormat(QtCore.Qt.TextFormat.RichText)
    box.setText(about_text())
    box.setIconPixmap(app_icon().pixmap(96, 96))
    box.setStandardButtons(QtWidgets.QMessageBox.StandardButton.Ok)
    return box


#: Help > First steps: the window's parts in the order a first plan uses them (rich text).
FIRST_STEPS_HTML = (
    "<h3>First steps</h3><ol>"
    "<li><b>Open a model</b>: File &gt; Open model (a GGUF file), or File &gt; Open the default model "
    "to try with Gemma 3 270M.</li>"
    "<li><b>Plan for</b> (Hardware, left): the GPU found on this machine, a what-if card of the catalogue, "
    "or CPU only. <b>RAM</b> is this machine's; <b>Host</b> predicts the speed for another host's memory, "
    "cores and PCIe link (a what-if host).</li>"
    "<li><b>Set the context</b> and the other controls under Configuration: the Prediction (right) redraws "
    "at once with the memory on each device, the predicted speed, and a badge saying whether it fits "
    "and how fast it is.</li>"
    "<li><b>Read the Advice</b> (bottom right): each problem comes with a button that sets the controls "
    "to fix it.</li>"
    "<li><b>Tune</b> (Ctrl+T) finds the fastest configuration that fits a context; <b>Verify with "
    "llama.cpp</b> asks the installed llama.cpp for the exact buffers.</li>"
    "<li><b>Run bench</b> (Ctrl+R) loads the model on this machine and measures it: the graphs show "
    "memory and tok/s live. A what-if card is planned, not run.</li>"
    "<li><b>Export</b> (Ctrl+E) writes the configuration for llama-server, llama-cpp-python, Ollama, "
    "koboldcpp or as a kvtuner profile.</li></ol>"
    "<p>Every control's tooltip gives its llama.cpp flag and the formula behind it. The documentation's "
    "Getting started pages (docs/getting-started/ in kvtuner's source) walk through a first plan and a "
    "12 GB card at 128K tokens; <code>kvtuner --help</code> lists the same on the command line.</p>"
)


def first_steps_dialog(parent: QtWidgets.QWidget | None) -> QtWidgets.QMessageBox:
    """A non-modal "First steps" box (not yet shown): :data:`FIRST_STEPS_HTML`."""
    box = QtWidgets.QMessageBox(parent)
    box.setWindowTitle("First steps with kvtuner")
    box.setTextFormat(QtCore.Qt.TextFormat.RichText)
    box.setText(FIRST_STEPS_HTML)
    box.setIconPixmap(app_icon().pixmap(64, 64))
    box.setStandardButtons(QtWidgets.QMessageBox.StandardButton.Ok)
    return box


def install_help_menu(window: Any) -> QtGui.QAction:
    """Add Help > About kvtuner to ``window`` (a QMainWindow), set the window and application
    icon, version and desktop file name (Wayland matches windows to the desktop entry by it).
    Returns the About action (also ``window.about_action``); the box it opens is kept as
    ``window.about_box``. Help > First steps (F1, ``window.first_steps_action``) opens
    :func:`first_steps_dialog`, kept as ``window.first_steps_box``."""
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

    def show_first_steps() -> None:
        window.first_steps_box = first_steps_dialog(window)
        window.first_steps_box.open()

    help_menu = window.menuBar().addMenu("&Help")
    steps = QtGui.QAction(
        "&First steps", window, shortcut=QtGui.QKeySequence.StandardKey.HelpContents, triggered=show_first_steps
    )
    help_menu.addAction(steps)
    help_menu.addSeparator()
    action = QtGui.QAction("&About kvtuner", window, triggered=show_about)
    action.setMenuRole(QtGui.QAction.MenuRole.AboutRole)
    help_menu.addAction(action)
    window.about_action = action
    window.about_box = None
    window.first_steps_action = steps
    window.first_steps_box = None
    return action
