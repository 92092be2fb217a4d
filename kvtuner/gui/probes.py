"""The window's background probes, each off the GUI thread and remembered by the session's stores:
the layer structure of a model kvtuner's rules do not cover (read from llama.cpp), this
machine's CPU kernel rates (the background probe job, followed in the status bar) and the host
memory bandwidth. Each one replans when its figure lands.

``w`` is the window (:class:`kvtuner.gui.main_window.MainWindow`, which imports this module).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..runner.dryrun import probe_structure

log = logging.getLogger("kvtuner.gui")


def structure_if_needed(w: Any) -> None:
    """A model whose layer structure kvtuner's rules do not cover (the plan says "approximate"):
    read it from the installed llama.cpp once, off the GUI thread (a no_alloc load in a child
    process, remembered by the session's structure store), then replan; as ``kvtuner plan``
    does (cli/plan.py ``probe``)."""
    if w.model_path is None or not w.session.needs_structure_probe:
        return
    model, path = w.model, w.model_path
    w.status.showMessage(f"reading {model.architecture}'s layer structure from llama.cpp (once per model) ...")

    def done(probed: Any) -> None:
        if model is not w.model:
            return
        w.session.set_structure(probed)
        w.status.showMessage(f"{model.architecture}'s layer structure read from llama.cpp", 5000)
        w.replan()

    def failed(exc: BaseException) -> None:
        log.warning("structure probe of %s failed: %s", path, exc)
        w.status.showMessage("llama.cpp could not be asked for the layer structure: the plan stays approximate", 8000)

    w.tasks.submit(lambda: probe_structure(path, model.structure), done, failed)


def cpu_if_needed(w: Any) -> None:
    """This machine has no CPU probe of the model's kernels and the plan computes on the CPU:
    start the background probe job (:func:`kvtuner.runner.probe_job.background_for`, one at a
    time, as ``kvtuner plan`` does) and show its progress in the status bar; the prediction
    uses assumed rates meanwhile and is refined when the probe lands. ``KVTUNER_CPU_PROBE=off``
    turns it off."""
    from ..runner import probe_job

    if os.environ.get("KVTUNER_CPU_PROBE", "").lower() in ("off", "0", "no") or w.cpu_probe.following:
        return
    missing, dims, experts = probe_job.probe_missing(w.session)
    if not missing and not dims and not experts:
        return
    note = probe_job.background_for(w.session, missing, dims, experts)
    w.status.showMessage(
        note.replace(" (--probe now waits, --probe off skips)", "").replace(" (--probe now waits for it)", ""),
        10000,
    )
    if probe_job.is_running() or probe_job.read_status().get("state") == "starting":
        w.cpu_probe.follow()


def on_cpu_probe_finished(w: Any, state: str, message: str) -> None:
    """The background probe ended: predict with its rates when it stored them, else say why not."""
    if state == "stored":
        w.session.invalidate_speed()
        w.replan()
        w.status.showMessage("CPU probe done: the speed now uses this machine's measured CPU rates", 8000)
    elif state == "busy":
        w.status.showMessage("CPU probe not kept: the machine was busy; the speed keeps assumed CPU rates", 15000)
        w.advisor.set_notes([message])
    else:
        w.status.showMessage(
            f"CPU probe failed: {message or 'it ended without a result'}; the speed keeps assumed CPU rates", 15000
        )


def measure_host_bandwidth(w: Any) -> None:
    """The host bandwidth probe (~0.25 s, once a week per machine: the calibration store
    keeps it) on a worker; the session predicts with it once it is there."""
    store, machine = w.session.calibration_store(), w.session.machine_id

    def failed(exc: BaseException) -> None:
        log.warning("host bandwidth probe failed: %s", exc)

    w.tasks.submit(
        lambda: store.host_bandwidth_bytes_s(machine, measure=True), lambda bw: _on_host_bandwidth(w, bw), failed
    )


def _on_host_bandwidth(w: Any, bw: float | None) -> None:
    if not bw:
        return
    session = w.planner.sync_session()
    verified = session.verified
    session.set_host_bandwidth(bw)
    if verified is not None:  # the host's bandwidth does not change what llama.cpp allocates
        session.set_verified(verified)
    w.replan()
