"""The status bar's CPU probe indicator follows the background probe job through its status file
and lock (:mod:`kvtuner.runner.probe_job`): this test holds the lock as a running job does."""

from __future__ import annotations

import fcntl
import json
import os
import time

import pytest

from kvtuner.gui.widgets.cpu_probe_indicator import CpuProbeIndicator
from kvtuner.runner import probe_job


def _status(**fields) -> None:
    probe_job.status_path().parent.mkdir(parents=True, exist_ok=True)
    probe_job.status_path().write_text(json.dumps({**fields, "t_unix": time.time()}))


def test_indicator_shows_kernel_k_of_n_then_reports_the_end(qtbot):
    w = CpuProbeIndicator(interval_ms=50)
    qtbot.addWidget(w)
    w.show()
    probe_job.lock_path().parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(probe_job.lock_path(), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a job holds the lock while it runs
    try:
        _status(state="running", pid=os.getpid(), k=4, n=15, key="attn:32/8/128", elapsed_s=38.0, message="")
        w.follow()
        assert w.isVisible() and w.following
        assert w.bar.format() == "CPU probe 4/15" and w.bar.value() == 4 and w.bar.maximum() == 15
        assert "kernel 4 of 15 (attn:32/8/128), 38 s" in w.toolTip()
    finally:
        os.close(fd)
    _status(state="busy", pid=os.getpid(), elapsed_s=90.0, message="the machine was busy during the CPU probe")
    with qtbot.waitSignal(w.finished, timeout=5000) as sig:
        pass
    assert sig.args == ["busy", "the machine was busy during the CPU probe"]
    assert not w.isVisible() and not w.following


@pytest.mark.llama
def test_the_window_starts_the_background_probe_and_shows_it(qtbot, tmp_path, monkeypatch, make_window):
    """A CPU-only window on a machine without a probe: the model opens at once (assumed rates),
    the background job starts and the status bar follows it."""
    import signal

    from kvtuner.core.plan.config import PlanConfig

    monkeypatch.delenv("KVTUNER_CPU_PROBE", raising=False)
    w = make_window(
        PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64), wait=lambda w: w.model is not None and w.assessment is not None
    )
    pid = probe_job.read_status().get("pid")
    try:
        assert pid and w.cpu_probe.following and w.cpu_probe.isVisibleTo(w)
        assert w.assessment.speed is not None  # the answer did not wait for the probe
        qtbot.waitUntil(lambda: probe_job.read_status().get("state") == "running", timeout=30_000)
        qtbot.waitUntil(lambda: w.cpu_probe.bar.format().startswith("CPU probe "), timeout=5_000)
    finally:
        if pid:
            os.killpg(pid, signal.SIGTERM)
    qtbot.waitUntil(lambda: not w.cpu_probe.following, timeout=30_000)
    w.close()
