"""What the window opens beside itself: the Export dialog (File > Export), the Tune dialog
(Run > Tune) and Run > Attach, with attaching to and detaching from a running server.

``w`` is the window (:class:`kvtuner.gui.main_window.MainWindow`, which imports this module).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6 import QtCore, QtWidgets

from ..core.plan.config import PlanConfig
from .attach import AttachDialog, AttachedServer
from .widgets.export_dialog import ExportDialog


def export_measured(w: Any) -> dict | None:
    """Measured figures of the last completed run when it ran the model and configuration
    shown (written into a profile export), else None."""
    if w.last_run is None:
        return None
    path, config, figures = w.last_run
    return dict(figures) if path == w.model_path and config == w.config else None


def open_export(w: Any) -> ExportDialog | None:
    """Open the Export dialog for the current configuration (non-modal; returned for tests)."""
    if w.model_path is None or w.stale:
        return None
    # Save starts where the last export went (else the home folder), never the model cache
    last_dir = w.settings.value("export/dir")
    save_dir = str(last_dir) if last_dir and Path(str(last_dir)).is_dir() else str(Path.home())
    s = w.planner.sync_session()
    rpc = tuple(dict.fromkeys(g.endpoint for g in s.gpus if g.endpoint is not None))  # --rpc, in order
    from ..runner.export_check import build_flags

    engine = w.engine
    dlg = ExportDialog(
        w.model_path,
        w.config,
        model=w.model,
        measured=export_measured(w),
        machine=w.machine,
        save_dir=save_dir,
        parent=w,
        split=s.split,
        rpc=rpc,
        flags_for=lambda target: build_flags(engine, target),
        extras=s.extras,
    )
    dlg.setAttribute(QtCore.Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.finished.connect(
        lambda *_: dlg.last_saved is not None and w.settings.setValue("export/dir", str(dlg.last_saved.parent))
    )
    dlg.show()
    return dlg


def open_tune(w: Any) -> Any:
    """Open the Tune dialog (non-modal; returned for tests); "Apply" puts its result on the controls."""
    from .tune_panel import TunePanel

    def context() -> tuple:
        s = w.planner.sync_session()
        inputs = s.speed_inputs()[0] if s.model is not None else None
        model = s.planned_model() if s.model is not None else None
        return model, w.config, s.gpus, s.host, inputs

    def apply(config: PlanConfig) -> None:
        w.controls.set_config(config)
        w.controls.show_error(None)
        w.set_config(config)
        w.status.showMessage("applied the tuned configuration", 5000)

    def fit(model: Any, config: PlanConfig, gpus: tuple, host: Any, inputs: Any, goal: Any) -> Any:
        from ..runner.fit_params import fit_choice_for  # llama.cpp's own --fit, on the worker

        return fit_choice_for(engine, path, model, config, gpus, host, inputs, goal, split=split)

    engine, path, split = w.engine, w.model_path, w.session.split
    dlg = TunePanel(context, w.tasks.submit, apply, parent=w, fit=fit if path is not None else None)
    dlg.ctx_spin.setValue(w.config.n_ctx)
    dlg.setAttribute(QtCore.Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.show()
    return dlg


def open_attach(w: Any) -> AttachDialog | None:
    """Run > Attach: the dialog of servers found; attaches to the one chosen."""
    dialog = AttachDialog(w)
    if dialog.exec() != QtWidgets.QDialog.DialogCode.Accepted:
        return None
    chosen = dialog.chosen()
    if chosen:
        attach_to(w, chosen)
    return dialog


def attach_to(w: Any, target: Any) -> bool:
    """Watch the running server ``target`` (a URL, a PID, or a found server): its samples are
    drawn by :class:`~kvtuner.gui.attach.AttachedServer`. False while a bench runs."""
    if w.runner.running:
        w.status.showMessage("a bench is running: stop it before attaching", 8000)
        return False
    if w.attached is not None:
        detach(w, quiet=True)
    w.attached = AttachedServer(w, target)
    w.graphs.begin_run(time.monotonic())
    w.graphs.mark_phase(time.monotonic(), "attached")
    w.run_controls.set_progress(None, "attaching ...")
    w.detach_action.setEnabled(True)
    w.run_action.setEnabled(False)
    w.attached.start()
    # the server's process is polled once a second; the samplers follow its RSS and VRAM
    QtCore.QTimer.singleShot(1500, w.follow_attached_pid)  # the window's method: dropped if it is gone
    return True


def follow_attached_pid(w: Any) -> None:
    """Point the samplers at the attached server's process once the monitor knows it (polled every 0.5 s)."""
    a = w.attached
    if a is None:
        return
    if a.monitor is None and a.running:
        QtCore.QTimer.singleShot(500, w.follow_attached_pid)
        return
    pid = a.monitor.server.pid if a.monitor is not None else None
    if pid:
        w.sampler.set_pid(pid)
    w.status.set_field("runner", f"attached: {a.label}")


def detach(w: Any, quiet: bool = False, wait_s: float = 0.0) -> None:
    """Stop watching the attached server (the server itself runs on). The polling thread ends
    after its current poll; ``wait_s``: how long to wait for it (0: not on the GUI thread)."""
    a, w.attached = w.attached, None
    if a is None:
        return
    a.stop(wait_s)
    w.sampler.set_pid(w.runner.pid if w.runner.running else None)
    w.graphs.end_run(time.monotonic())
    w.detach_action.setEnabled(False)
    w.run_action.setEnabled(True)
    w.run_events.live_state = None
    w.status.set_field("runner", "runner: idle")
    if not quiet:
        w.run_controls.set_progress(0.0, f"detached from {a.label}")
    w.refresh_advice(running=False)
