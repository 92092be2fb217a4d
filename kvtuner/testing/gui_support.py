"""Shared pieces of the GUI tests and benchmarks: a fixed host, a sampler that samples nothing,
settings in a folder of the test's own, and :func:`open_window`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6 import QtCore

from kvtuner.core.hardware.specs import HostSpec

GiB = 1 << 30
#: A fixed host for plan-only windows (the real one differs from machine to machine).
HOST = HostSpec(total_bytes=16 * GiB, available_bytes=12 * GiB, swap_total_bytes=2 * GiB)


class IdleSampler:
    """A sampler that samples nothing, for windows whose tests or benchmarks are about the plan,
    not the live graphs (those run the real :class:`kvtuner.core.monitor.sampler.Sampler`)."""

    def start(self):
        return self

    def stop(self, timeout_s=2.0):
        pass

    def set_pid(self, pid):
        pass

    def reset_peaks(self):
        pass

    def host_samples(self, since_t_s=None):
        return []

    def gpu_samples(self, index, since_t_s=None):
        return []

    def gpu_indices(self):
        return []


def ini_settings(folder: Path) -> QtCore.QSettings:
    """QSettings in an INI file under ``folder`` (never the user's real settings)."""
    return QtCore.QSettings(str(folder / "kvtuner.ini"), QtCore.QSettings.Format.IniFormat)


#: ``hardware`` of a plan-only window: no GPU detected, the fixed :data:`HOST`
NO_GPU = ([], HOST, "test: no NVML")
#: ``model`` that opens nothing
NO_MODEL = object()


def open_window(
    qtbot: Any,
    config: Any = None,
    *,
    settings: QtCore.QSettings | Path,
    hardware: tuple[list, Any, str] | None = NO_GPU,
    sampler: Any = IdleSampler,
    bench: Any = None,
    plan_for: tuple[str, int | None] | None = None,
    host: Any = None,
    what_if: str | None = None,
    size: tuple[int, int] | None = None,
    model: Any = None,
    wait: Callable[[Any], bool] | None = None,
    timeout_ms: int = 30_000,
) -> Any:
    """A :class:`~kvtuner.gui.main_window.MainWindow` for a test, registered with ``qtbot``
    (pytest-qt closes it after the test).

    Args:
        config, bench, plan_for, host: the window's own arguments.
        settings: QSettings, or a folder for an INI file (:func:`ini_settings`).
        hardware: (gpus, host, note) the window plans for instead of detecting them (None: detected).
        sampler: the sampler, or a class to make one of (default :class:`IdleSampler`: no live
            graphs); None: the window's own, at its rates.
        what_if: a "Plan for" choice made before the model opens (a catalogue card's name).
        size: (width, height): resize and show the window (a shown window lays out as the app does).
        model: what opens (:meth:`MainWindow.open_path`): None the default model, a path, or
            :data:`NO_MODEL`.
        wait: until this holds of the window after opening (default: a model is open).
    """
    from kvtuner.gui.app import make_app
    from kvtuner.gui.main_window import MainWindow

    make_app()
    w = MainWindow(
        config,
        settings=ini_settings(settings) if isinstance(settings, Path) else settings,
        hardware=hardware,
        bench=bench,
        sampler=sampler() if isinstance(sampler, type) else sampler,
        plan_for=plan_for,
        host=host,
    )
    qtbot.addWidget(w)
    if what_if is not None:
        w.hardware.set_choice(what_if)
    if size is not None:
        w.resize(*size)
        w.show()
    if model is not NO_MODEL:
        w.open_path(model)
        qtbot.waitUntil(lambda: (wait or (lambda w: w.model is not None))(w), timeout=timeout_ms)
    if size is not None:
        QtCore.QCoreApplication.processEvents()
    return w


def assert_run_drawn(w: Any) -> None:
    """After a finished run: pull once more and check the window drew it whole -- no error, the load
    at 100%, prefill, decode and the runner's RSS (the child's or the server's pid) graphed, every
    phase named, the measured rates kept and the decode rate in the status bar.

    Raises:
        AssertionError: the first of these that does not hold."""
    w.pull()
    assert w.last_error == "", w.last_error
    assert abs(w.last_load_progress - 1.0) < 1e-9, w.last_load_progress
    for curve in ("prefill", "decode", "runner_rss"):
        assert w.graphs.point_count(curve) >= 1, curve
    names = w.graphs.phase_names()
    for phase in ("weights", "KV", "compute", "prefill", "decode"):
        assert phase in names, phase
    assert "decode_tok_s" in w.measured and "prefill_tok_s" in w.measured
    assert "tok/s" in w.status.fields["decode"].text()
