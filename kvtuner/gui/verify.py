"""Verify (Run > Verify with llama.cpp): the engine in use reports the exact buffers of the
configuration shown, off the GUI thread, without reading a weight; the window's session keeps
the result for that configuration and hardware (:meth:`kvtuner.core.session.Session.set_verified`).

``w`` is the window (:class:`kvtuner.gui.main_window.MainWindow`, which imports this module).
"""

from __future__ import annotations

from typing import Any

from ..core.llama_report import DryRunResult
from ..core.plan.config import PlanConfig
from ..runner.dryrun import dry_run
from ..runner.server_verify import verify_with_engine

#: The progress text after a dry run (replaced when the configuration changes).
VERIFIED_TEXT = "verified by llama.cpp"


def engine_name(engine: Any) -> str:
    """The engine as the progress line names it (``llama-server b11434``, ``llama.cpp``)."""
    if engine is None or engine.kind == "embedded":
        return "llama.cpp"
    return engine.label.split(" (")[0]


def start_verify(w: Any) -> None:
    """Ask the engine in use for the exact buffers, off the GUI thread, without reading a
    weight: llama-server's own start-up memory breakdown for a llama-server engine, the
    embedded dry run otherwise (:func:`kvtuner.runner.server_verify.verify_with_engine`); the
    session keeps the result for this configuration and hardware."""
    if w.model_path is None:
        return
    config, path, model = w.config, w.model_path, w.model
    gpus = tuple(w.hardware.gpus())
    engine, split = w.engine, w.session.split
    w.run_controls.verify_button.setEnabled(False)
    w.run_controls.set_progress(None, f"verifying with {engine_name(engine)} ...")

    def work() -> DryRunResult:
        if engine is None or engine.kind == "embedded":
            return dry_run(path, config)
        return verify_with_engine(engine, path, config, split=split)

    w.tasks.submit(work, lambda r: _on_verified(w, model, config, gpus, r), lambda exc: _on_failed(w, exc))


def _on_verified(w: Any, model: Any, config: PlanConfig, gpus: tuple, result: DryRunResult) -> None:
    w.run_controls.verify_button.setEnabled(True)
    if model is not w.model or gpus != tuple(w.hardware.gpus()):
        w.run_controls.set_progress(0.0, "model or hardware changed: verify again")
        return
    w.run_controls.set_progress(1.0, VERIFIED_TEXT)
    who = result.engine or "llama.cpp"
    w.status.showMessage(f"verified by {who}" + (f" ({result.method})" if result.method else ""), 10000)
    w.planner.sync_session().set_verified(result, config)
    w.replan()


def _on_failed(w: Any, exc: BaseException) -> None:
    w.run_controls.verify_button.setEnabled(True)
    w.run_controls.set_progress(0.0, "verify failed")
    w.show_error(f"llama.cpp refused this configuration: {exc}")
