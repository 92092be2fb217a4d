"""The window's pull timer: samples and runner events into the views, 10 Hz during a run and
1 Hz otherwise, and the plan's available RAM kept current.

:class:`LiveFeed` owns the timer (a QTimer on the GUI thread) and the sampling rate; each tick
(:meth:`LiveFeed.pull`) hands new host and GPU samples to the graphs and the status bar, the
runner's events to :class:`~kvtuner.gui.run_events.RunEvents`, an attached server's samples to
:class:`~kvtuner.gui.attach.AttachedServer`, and re-evaluates live advice during a run.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from PySide6 import QtCore

#: How often the window pulls samples and runner events during a run, milliseconds (and the
#: samplers sample, 10 Hz).
PULL_INTERVAL_MS = 100
#: The same with nothing running: 1 Hz keeps the RAM graph and status bar alive while a window
#: left open all day idles under 1% of a core (3.3-3.6% at 10 Hz; benchmarks/gui_idle_cpu.py
#: measures it, docs/development/benchmarks.md has the figures).
IDLE_PULL_INTERVAL_MS = 1000
#: Seconds after a run ends before sampling slows to the idle rate (the graphs show the release).
IDLE_AFTER_S = 3.0
#: How often live advice is re-evaluated during a run, seconds (the pane rebuilds only on change).
LIVE_ADVICE_INTERVAL_S = 0.5
#: Available RAM moving by this much (bytes) replans with the new figure (512 MiB: well above the
#: page cache's second-to-second jitter, well under any model's weights).
RAM_REPLAN_BYTES = 512 << 20


class LiveFeed:
    """The pull timer of ``window`` and the rate of its sampler.

    Args:
        window: the :class:`~kvtuner.gui.main_window.MainWindow` whose views are fed.
        own_sampler: the window made its sampler, so the feed sets its rate (10 Hz in a run,
            1 Hz idle); a sampler passed in keeps the rate it was given.
    """

    def __init__(self, window: Any, own_sampler: bool) -> None:
        self.w = window
        self.own_sampler = own_sampler
        self.timer = QtCore.QTimer(window)
        self.timer.timeout.connect(self.pull)
        self.fast = True
        self.last_busy_t = -math.inf
        self._last_host_t = -math.inf
        self._last_gpu_t: dict[int, float] = {}
        self.set_sampling(fast=False)

    def start(self) -> None:
        """Start the timer and the sampler."""
        self.timer.start()
        self.w.sampler.start()

    def run_started(self) -> None:
        """A run began: sample and pull at the run rate from now on."""
        self.last_busy_t = time.monotonic()
        self.set_sampling(fast=True)

    def set_sampling(self, fast: bool) -> None:
        """10 Hz sampling and pulling during a run, 1 Hz otherwise."""
        if fast == self.fast:
            return
        self.fast = fast
        self.timer.setInterval(PULL_INTERVAL_MS if fast else IDLE_PULL_INTERVAL_MS)
        if self.own_sampler:
            self.w.sampler.interval_s = PULL_INTERVAL_MS / 1000 if fast else IDLE_PULL_INTERVAL_MS / 1000

    def follow_available_ram(self, available_bytes: int) -> None:
        """The plan's RAM headroom uses the RAM available now, not at start: when it moved by
        more than :data:`RAM_REPLAN_BYTES` (and no run holds memory), replan with it."""
        w = self.w
        h = w.session.host
        if h is None or w.fixed_host or w.runner.running or abs(available_bytes - h.available_bytes) < RAM_REPLAN_BYTES:
            return
        w.session.host = replace(h, available_bytes=int(available_bytes))
        w.hardware.set_host(w.session.host)
        if w.model is not None and not w.stale:
            w.replan()

    def pull(self) -> None:
        """Pull new samples and runner events into the views (the timer calls it: every 100 ms
        during a run, every second otherwise)."""
        w = self.w
        if w.runner.running:
            self.last_busy_t = time.monotonic()
        elif self.fast and time.monotonic() - self.last_busy_t > IDLE_AFTER_S:
            self.set_sampling(fast=False)
        host = w.sampler.host_samples(self._last_host_t)
        if host:
            self._last_host_t = host[-1].t_s
            w.graphs.add_host_samples(host)
            w.status.show_host(host[-1])
            self.follow_available_ram(host[-1].available_bytes)
        gpu_latest = None
        for index in w.sampler.gpu_indices():
            samples = w.sampler.gpu_samples(index, self._last_gpu_t.get(index, -math.inf))
            if samples:
                self._last_gpu_t[index] = samples[-1].t_s
                w.graphs.add_gpu_samples(index, samples)
                w.gpu_last[index] = samples[-1]
                if gpu_latest is None:
                    gpu_latest = samples[-1]
        if gpu_latest is not None or not w.sampler.gpu_indices():
            w.status.show_gpu(gpu_latest)
        for t_s, ev in w.runner.drain():
            w.run_events.handle(t_s, ev)
        if w.attached is not None:
            for sample in w.attached.drain():
                if w.attached is None:
                    break
                w.attached.show(sample)
        if w.runner.running and time.monotonic() - w.run_events.last_live_t >= LIVE_ADVICE_INTERVAL_S:
            w.update_live()
        w.graphs.refresh()
