"""Was the machine quiet during a run? CPU time used by *other* processes while a bench ran.

A bench on a busy machine measures the other load, not the configuration (runs at 8.4
and 2.5 tok/s beside 86 were saved as known good and widened the prediction band to
122-1,648 tok/s). :func:`cpu_snapshot` before and after the run, :func:`other_cores` between
them: the machine's busy CPU seconds (``/proc/stat`` via :func:`psutil.cpu_times`: every state
but idle and iowait) minus this process's and its reaped children's (:func:`os.times`: the
runner child is waited for before the run ends), per wall-clock second: how many cores others
kept busy on average. :func:`is_quiet` compares it with :data:`QUIET_MAX_OTHER_CORES`.

One rule for every measurement (``kvtuner bench``, the window's Run bench, the CPU probe):
:class:`ContentionMeter` measures the other load while it runs (children still running are
counted as this process's own through :meth:`ContentionMeter.track`), and the
:class:`Contention` it returns says whether the figure may calibrate, enter Known good or be
stored as a probe (:meth:`Contention.counts`): only when the machine was quiet, or when the user
asked for it (``--record-anyway``). ``KVTUNER_QUIET_MAX_OTHER_CORES`` overrides the limit (a
shared test machine sets ``inf``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

#: Cores other processes may keep busy on average for a run to count as measured on a quiet
#: machine. 0.3 of a core: a desktop's background (browser tabs, the compositor) stays under it;
#: one other busy thread on a 2-thread bench (the issue's case) is 1.0 and slows the run ~2x.
QUIET_MAX_OTHER_CORES = 0.3
#: Environment variable that overrides :data:`QUIET_MAX_OTHER_CORES` (cores; ``inf`` turns the rule off).
QUIET_LIMIT_ENV = "KVTUNER_QUIET_MAX_OTHER_CORES"


def quiet_limit() -> float:
    """Cores of other load a measurement may meet and still count: ``$KVTUNER_QUIET_MAX_OTHER_CORES``
    when it is a number >= 0, else :data:`QUIET_MAX_OTHER_CORES`."""
    try:
        v = float(os.environ.get(QUIET_LIMIT_ENV, ""))
    except ValueError:
        return QUIET_MAX_OTHER_CORES
    return v if v >= 0 else QUIET_MAX_OTHER_CORES


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


def _pid_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a running process and its waited-for children, None when it is gone."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return None
    return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


@dataclass(frozen=True)
class Contention:
    """The other load a measurement met: ``other_cores`` (average cores other processes kept
    busy, None when it could not be measured), over ``wall_s`` seconds, against ``limit``."""

    other_cores: float | None
    wall_s: float
    limit: float = QUIET_MAX_OTHER_CORES

    @property
    def busy(self) -> bool:
        """More than :attr:`limit` cores of other load (unmeasured or under a second: not busy)."""
        return self.other_cores is not None and self.wall_s >= 1.0 and not is_quiet(self.other_cores, self.limit)

    def counts(self, record_anyway: bool = False) -> bool:
        """Whether the figure may calibrate, enter Known good or become a stored probe: a quiet
        machine, or the user's explicit ``record_anyway``."""
        return record_anyway or not self.busy

    def reason(self, what: str = "this measurement") -> str:
        """One line saying why ``what`` is not kept ("" when it is quiet)."""
        if not self.busy:
            return ""
        return (
            f"the machine was busy during {what} ({self.other_cores:.1f} cores of other load, more than "
            f"{self.limit:g}): it measured the other load, so it is not kept; run again when the machine is quiet, "
            "or keep it with --record-anyway"
        )

    def to_dict(self) -> dict[str, float | None]:
        """JSON-able form (``other_cores``, ``wall_s``, ``limit``, ``busy``)."""
        return {
            "other_cores": None if self.other_cores is None else round(self.other_cores, 3),
            "wall_s": round(self.wall_s, 3),
            "limit": self.limit,
            "busy": self.busy,
        }


@dataclass
class ContentionMeter:
    """Measures the other load while a measurement runs: :meth:`start`, :meth:`track` each child
    that is still running when :meth:`stop` is called (a llama.cpp child, the runner), then
    :meth:`stop`. Children that were waited for before :meth:`stop` are counted by
    :func:`os.times`. Without ``psutil``'s CPU times the result is unmeasured (counts)."""

    limit: float = field(default_factory=quiet_limit)
    _before: CpuSnapshot | None = None
    _pids: dict[int, float] = field(default_factory=dict)

    def start(self) -> ContentionMeter:
        """Take the first snapshot; returns self."""
        try:
            self._before = cpu_snapshot()
        except (OSError, ImportError):
            self._before = None
        self._pids = {}
        return self

    def track(self, pid: int | None) -> None:
        """Count ``pid`` (a child this process started, still running) as this process's own
        load from now on."""
        if pid and pid not in self._pids:
            self._pids[pid] = _pid_cpu_s(pid) or 0.0

    def stop(self) -> Contention:
        """The other load since :meth:`start`."""
        before = self._before
        if before is None:
            return Contention(None, 0.0, self.limit)
        try:
            after = cpu_snapshot()
        except (OSError, ImportError):
            return Contention(None, 0.0, self.limit)
        children = 0.0
        for pid, t0 in self._pids.items():
            t1 = _pid_cpu_s(pid)
            if t1 is not None:  # a child gone since was waited for: os.times() counts it
                children += max(0.0, t1 - t0)
        after = CpuSnapshot(after.t_s, after.busy_s, after.own_s + children)
        return Contention(other_cores(before, after), after.t_s - before.t_s, self.limit)
