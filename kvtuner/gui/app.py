"""Start the desktop app: ``kvtuner`` / ``kvtuner gui [MODEL]`` call :func:`run`.

``run(..., screenshot=FILE)`` renders the main window offscreen (after a short real bench on
the model with ``run=True``), writes a PNG and returns 0: the documentation's screenshots and the
tests use it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from ..core.plan.config import PlanConfig


def make_app(argv: list[str] | None = None, *, dark: bool = False) -> Any:
    """The QApplication (created once), with pyqtgraph following the system palette so light
    and dark themes both read well; ``dark``: force a dark palette (:func:`.theme.apply_dark`)."""
    import pyqtgraph as pg
    from pyqtgraph.util.garbage_collector import GarbageCollector
    from PySide6 import QtGui, QtWidgets

    app = QtWidgets.QApplication.instance()
    if app is None:
        app = QtWidgets.QApplication(argv or [sys.argv[0]])
        app.setApplicationName("kvtuner")
        app.setOrganizationName("kvtuner")
    if getattr(app, "_kvtuner_gc", None) is None:
        # Python's cyclic GC may otherwise run in a worker thread and destroy Qt objects there:
        # Qt's disconnect then waits for the GIL while the GUI thread holds it and waits for
        # Qt's lock (a deadlock seen in tests/test_gui_run.py). pyqtgraph's collector disables
        # automatic collection and collects on a timer in the GUI thread instead.
        app._kvtuner_gc = GarbageCollector(interval=1.0)
    if dark:
        from .theme import apply_dark

        apply_dark(app)
    pal = app.palette()
    pg.setConfigOptions(
        background=pal.color(QtGui.QPalette.ColorRole.Base),
        foreground=pal.color(QtGui.QPalette.ColorRole.WindowText),
        antialias=False,
    )
    return app


def _wait(app: Any, condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app.processEvents()
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def run(
    model_path: Path | None,
    config: PlanConfig | None,
    screenshot: str | None = None,
    run: bool = False,
    *,
    settings: Any = None,
    run_timeout_s: float = 300.0,
    size: tuple[int, int] | None = None,
    dark: bool = False,
    plan_for: tuple[str, int | None] | None = None,
    host: Any = None,
) -> int:
    """Open the main window on ``model_path`` (None: the last model, else the embedded default;
    a ``.json`` path is a kvtuner profile: its model and configuration).

    ``size``: the window's (width, height) in pixels; ``dark``: a dark palette (screenshots).
    ``plan_for``: the "Plan for" choice ``(choice, custom bytes)`` from ``--gpu``/``--gpu-mem``/
    ``--no-gpu`` (None: the saved one); ``host``: a :class:`HostSpec` from ``--ram`` (None: this
    machine's, followed as it changes).

    With ``screenshot``: render offscreen, optionally after a bench (``run``), save the PNG,
    return 0 (1 if the model or the run failed, with the reason on stderr).
    Without: run the event loop until the window closes; returns its exit status (2, with the
    ``apt-get install`` line on stderr, when Qt's X11 plugin lacks system libraries:
    :mod:`.platform_check`).
    """
    if screenshot:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    else:
        from .platform_check import platform_problem

        problem = platform_problem()  # Qt would abort naming the wrong package: say the right ones
        if problem:
            print(problem, file=sys.stderr)
            return 2
    app = make_app(dark=dark)
    from .main_window import MainWindow
    from .run_controller import BenchSettings

    bench = BenchSettings(n_prompt=256, n_gen=48, repetitions=2) if screenshot else None
    window = MainWindow(config, settings=settings, bench=bench, plan_for=plan_for, host=host)
    if size is not None:
        window.resize(*size)
    window.show()
    target = model_path if model_path is not None else (None if screenshot else window.last_model())
    if target is not None and not Path(target).exists():
        target = None
    window.open_path(target)  # a .json path is a kvtuner profile (model + configuration)
    if not screenshot:
        return int(app.exec())

    status = 0
    if not _wait(app, lambda: window.model is not None or bool(window.last_error), 120):
        print("kvtuner: the model did not open in time", file=sys.stderr)
    if window.model is None:
        print(f"kvtuner: {window.last_error or 'no model'}", file=sys.stderr)
        status = 1
    elif run:
        _wait(app, lambda: False, 3.0)  # a few seconds of idle samples before the run
        window.start_run()
        _wait(app, lambda: not window.runner.running, run_timeout_s)
        _wait(app, lambda: False, 2.5)  # samples after the run
        if window.last_error:
            print(f"kvtuner: {window.last_error}", file=sys.stderr)
            status = 1
    else:
        _wait(app, lambda: False, 1.0)
    window.pull()
    app.processEvents()
    Path(screenshot).expanduser().parent.mkdir(parents=True, exist_ok=True)
    ok = window.grab().save(str(Path(screenshot).expanduser()), "PNG")
    window.shutdown()
    window.deleteLater()
    app.processEvents()
    if not ok:
        print(f"kvtuner: could not write {screenshot}", file=sys.stderr)
        return 1
    return status
