"""Was the machine quiet during a run? CPU time used by *other* processes while a bench ran.

A bench on a busy machine measures the other load, not the configuration (runs at 8.4
and 2.5 tok/s beside 86 were saved as known good and widened the prediction band to
122-1,648 tok/s). :func:`cpu_snapshot` before and after the run, :func:`other_cores` between
them: the machine's busy CPU seconds (``/proc/stat`` via :func:`psutil.cpu_times`: every state
but idle and iowait) minus this process's and its reaped children's (:func:`os.times`: the
runner child is waited for before the run ends), per wall-clock second: how many cores others
kept busy on average. :func:`is_quiet` compares it with :data:`QUIET_MAX_OTHER_CORES`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: Cores other processes may keep busy on average for a run to count as measured on a quiet
#: machine. 0.3 of a core: a desktop's background (browser tabs, the compositor) stays under it;
#: one other busy thread on a 2-thread bench (the issue's case) is 1.0 and slows the run ~2x.
QUIET_MAX_OTHER_CORES = 0.3


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU time at one moment: ``t_s`` (``time.monotonic()``), ``busy_s`` (all CPUs' non-idle
    seconds since boot) and ``own_s`` (this process's user + system seconds, its waited-for
    children's included)."""

    t_s: float
    busy_s: float
    own_s: float


def cpu_snapshot() -> CpuSnapshot:
    """The machine's and this process tree's CPU seconds now."""
    import psutil

    ct = psutil.cpu_times()
    busy = sum(ct) - ct.idle - getattr(ct, "iowait", 0.0)
    # guest time is already counted in user on Linux (/proc/stat): do not count it twice
    busy -= getattr(ct, "guest", 0.0) + getattr(ct, "guest_nice", 0.0)
    t = os.times()
    return CpuSnapshot(time.monotonic(), busy, t.user + t.system + t.children_user + t.children_system)


def other_cores(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """Average cores kept busy by other processes between the two snapshots (>= 0; 0.0 when no
    time passed)."""
    wall = after.t_s - before.t_s
    if wall <= 0:
        return 0.0
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(others, 0.0) / wall


def is_quiet(other_cores_avg: float, limit: float = QUIET_MAX_OTHER_CORES) -> bool:
    """Whether a run with ``other_cores_avg`` cores of other load counts as measured on a quiet machine."""
    return other_cores_avg <= limit
