"""Live memory sampling: GPUs (through :mod:`kvtuner.core.hardware.nvml`), the host and one
process (through :mod:`kvtuner.core.hardware.host`), into ring buffers.

Headless (no Qt). A :class:`Sampler` runs on its own thread at 10 Hz by default and appends
timestamped samples to bounded, lock-guarded ring buffers; a GUI pulls them on a timer
(:meth:`Sampler.host_samples`, :meth:`Sampler.gpu_samples`), nothing is pushed across threads.

Times are ``time.monotonic()`` seconds (``t_s``); sizes in bytes; rates in bytes/s.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..hardware.host import process_rss_bytes, read_host_counters
from ..hardware.nvml import GpuProcess, gpu_processes, nvml_call
from ..hardware.vendors import read_sysfs_gpus

log = logging.getLogger("kvtuner.monitor")

T = TypeVar("T")

# ----------------------------------------------------------------------------------------------
# samples and ring buffers


@dataclass(frozen=True)
class GpuSample:
    """One GPU at ``t_s``: memory in bytes, ``util_percent`` (GPU busy, 0..100) or None,
    ``process_bytes``: VRAM of the watched process on this GPU (None: no process watched or
    NVML cannot tell).

    The same shape for every vendor: ``source`` says where the figures come from (``"nvml"``,
    ``"sysfs"`` for amdgpu's ``mem_info_*`` files); ``gtt_total_bytes`` / ``gtt_used_bytes``: an
    AMD GPU's GTT pool (system RAM the GPU maps; None elsewhere); ``flags``: contradictions in the
    reading (:func:`kvtuner.core.hardware.vendors.check_reading`): a flagged sample is shown, not
    trusted. On an AMD APU total/used/free are VRAM + GTT, the budget llama.cpp allocates from."""

    t_s: float
    index: int
    total_bytes: int
    used_bytes: int
    free_bytes: int
    util_percent: float | None
    process_bytes: int | None
    source: str = "nvml"
    gtt_total_bytes: int | None = None
    gtt_used_bytes: int | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostSample:
    """The host at ``t_s``: RAM in bytes, swap used in bytes, swap-in/out rates in bytes/s
    since the previous sample (None for the first), RSS of the watched process in bytes."""

    t_s: float
    total_bytes: int
    available_bytes: int
    swap_used_bytes: int
    swap_in_bytes_s: float | None
    swap_out_bytes_s: float | None
    process_rss_bytes: int | None


class RingBuffer(Generic[T]):
    """A bounded, lock-guarded FIFO of samples; the oldest fall off when full."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._items: collections.deque[T] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()

    def append(self, item: T) -> None:
        """Add one sample."""
        with self._lock:
            self._items.append(item)

    def snapshot(self) -> list[T]:
        """A copy of all samples, oldest first."""
        with self._lock:
            return list(self._items)

    def since(self, t_s: float) -> list[T]:
        """Samples with ``t_s`` later than ``t_s`` (items need a ``t_s`` attribute)."""
        with self._lock:
            return [s for s in self._items if getattr(s, "t_s") > t_s]  # noqa: B009 (T has no t_s in general)

    def latest(self) -> T | None:
        """The newest sample or None."""
        with self._lock:
            return self._items[-1] if self._items else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


@dataclass(frozen=True)
class Peaks:
    """Highest values seen since the sampler started or :meth:`Sampler.reset_peaks`:
    ``process_rss_bytes``; ``gpu_used_bytes`` and ``gpu_process_bytes`` per GPU index;
    ``host_used_bytes`` (total minus available)."""

    process_rss_bytes: int | None
    host_used_bytes: int | None
    gpu_used_bytes: dict[int, int]
    gpu_process_bytes: dict[int, int]


class Sampler:
    """Samples the host, every GPU (NVIDIA through NVML, then AMD through sysfs) and optionally
    one process, on its own thread.

    Args:
        interval_s: seconds between samples (default 0.1 = 10 Hz).
        capacity: samples kept per ring buffer (default 6000 = 10 minutes at 10 Hz).
        pid: process to watch (RSS, VRAM), e.g. the runner child; changeable with :meth:`set_pid`.
        gpus: sample GPUs (False: host only).
        sysfs_root: the sysfs tree AMD GPUs are read from (default ``$KVTUNER_SYSFS_ROOT`` or
            ``/sys``); their indices follow NVML's.
    """

    def __init__(
        self,
        interval_s: float = 0.1,
        capacity: int = 6000,
        pid: int | None = None,
        gpus: bool = True,
        sysfs_root: str | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = float(interval_s)
        self._host = RingBuffer[HostSample](capacity)
        self._gpu: dict[int, RingBuffer[GpuSample]] = {}
        self._capacity = capacity
        self._pid = pid
        self._use_gpus = gpus
        self._handles: list[tuple[int, Any]] | None = None
        self._sysfs_root = sysfs_root
        self._sysfs_cards: bool | None = None  # None: not looked yet; False: none there
        self._prev_swap: tuple[float, int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_lock = threading.Lock()
        self._peaks: dict[str, Any] = {}
        self.reset_peaks()
        self.cpu_s = 0.0  # CPU time spent by the sampling thread, seconds
        self.n_samples = 0
        #: seconds between two NVML process lists (they are slower than a memory query)
        self.process_interval_s = 1.0
        self._processes: tuple[GpuProcess, ...] = ()
        self._processes_t = -float("inf")

    # -- control ----------------------------------------------------------------------------

    def set_pid(self, pid: int | None) -> None:
        """Watch another process (or none)."""
        self._pid = pid
        self._proc = None

    def start(self) -> Sampler:
        """Start the sampling thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="kvtuner-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the sampling thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset_peaks(self) -> None:
        """Forget the peaks seen so far."""
        with self._peak_lock:
            self._peaks = {"rss": None, "host": None, "gpu": {}, "gpu_proc": {}}

    # -- reading ----------------------------------------------------------------------------

    def host_samples(self, since_t_s: float | None = None) -> list[HostSample]:
        """Host samples, oldest first (only those after ``since_t_s`` if given)."""
        return self._host.snapshot() if since_t_s is None else self._host.since(since_t_s)

    def gpu_samples(self, index: int, since_t_s: float | None = None) -> list[GpuSample]:
        """Samples of GPU ``index`` (NVML order, then sysfs cards), oldest first."""
        buf = self._gpu.get(index)
        if buf is None:
            return []
        return buf.snapshot() if since_t_s is None else buf.since(since_t_s)

    def gpu_indices(self) -> list[int]:
        """GPUs sampled so far."""
        return sorted(self._gpu)

    def gpu_processes(self) -> tuple[GpuProcess, ...]:
        """The latest NVML process list of every GPU (taken on the sampling thread about once
        a second; empty without a GPU)."""
        return self._processes

    def peaks(self) -> Peaks:
        """The peaks since start or :meth:`reset_peaks`."""
        with self._peak_lock:
            p = self._peaks
            return Peaks(p["rss"], p["host"], dict(p["gpu"]), dict(p["gpu_proc"]))

    # -- sampling ---------------------------------------------------------------------------

    def _gpu_handles(self) -> list[tuple[int, Any]]:
        if self._handles is None:
            handles = []
            if self._use_gpus:
                for i in range(int(nvml_call("nvmlDeviceGetCount", default=0) or 0)):
                    h = nvml_call("nvmlDeviceGetHandleByIndex", i)
                    if h is not None:
                        handles.append((i, h))
            self._handles = handles
        return self._handles

    def _process_rss(self) -> int | None:
        return None if self._pid is None else process_rss_bytes(self._pid)

    def _host_now(self) -> tuple[int, int, int, int, int]:
        """(total, available, swap used, swap-in, swap-out cumulative bytes)."""
        return read_host_counters()

    def sample_once(self) -> tuple[HostSample, tuple[GpuSample, ...]]:
        """Take one sample of everything now, store it and return it."""
        now = time.monotonic()
        total, avail, swap_used, sin, sout = self._host_now()
        sin_rate = sout_rate = None
        if self._prev_swap is not None:
            t0, sin0, sout0 = self._prev_swap
            dt = now - t0
            if dt > 0:
                sin_rate = max(sin - sin0, 0) / dt
                sout_rate = max(sout - sout0, 0) / dt
        self._prev_swap = (now, sin, sout)
        rss = self._process_rss()
        host = HostSample(now, total, avail, swap_used, sin_rate, sout_rate, rss)
        self._host.append(host)
        gpus = []
        for index, h in self._gpu_handles():
            mem = nvml_call("nvmlDeviceGetMemoryInfo", h)
            if mem is None:
                continue
            util = nvml_call("nvmlDeviceGetUtilizationRates", h)
            proc_bytes = None
            if self._pid is not None:
                procs = nvml_call("nvmlDeviceGetComputeRunningProcesses", h, default=None)
                if procs is not None:
                    proc_bytes = 0
                    for p in procs:
                        if getattr(p, "pid", None) == self._pid and getattr(p, "usedGpuMemory", None) is not None:
                            proc_bytes += int(p.usedGpuMemory)
            s = GpuSample(
                now,
                index,
                int(mem.total),
                int(mem.used),
                int(mem.free),
                float(util.gpu) if util is not None else None,
                proc_bytes,
            )
            buf = self._gpu.get(index)
            if buf is None:
                buf = self._gpu[index] = RingBuffer[GpuSample](self._capacity)
            buf.append(s)
            gpus.append(s)
        gpus.extend(self._sysfs_samples(now, len(self._gpu_handles())))
        handles = self._gpu_handles()
        if handles and now - self._processes_t >= self.process_interval_s:
            self._processes_t = now
            self._processes = gpu_processes(handles)
        self._update_peaks(host, gpus)
        self.n_samples += 1
        return host, tuple(gpus)

    def _sysfs_samples(self, now: float, first_index: int) -> list[GpuSample]:
        """AMD GPUs from sysfs (:func:`kvtuner.core.hardware.vendors.read_sysfs_gpus`), stored."""
        if not self._use_gpus or self._sysfs_cards is False:
            return []
        cards = read_sysfs_gpus(self._sysfs_root)
        if self._sysfs_cards is None:
            self._sysfs_cards = bool(cards)  # none now: none later (no hot-plugged GPUs)
        out = []
        for i, g in enumerate(cards):
            used = g.budget_used_bytes
            if used is None:
                continue
            total = g.budget_bytes
            s = GpuSample(
                now,
                first_index + i,
                total,
                used,
                max(total - used, 0),
                None,
                None,
                source="sysfs",
                gtt_total_bytes=g.gtt_total_bytes,
                gtt_used_bytes=g.gtt_used_bytes,
                flags=g.flags,
            )
            buf = self._gpu.get(s.index)
            if buf is None:
                buf = self._gpu[s.index] = RingBuffer[GpuSample](self._capacity)
            buf.append(s)
            out.append(s)
        return out

    def record(self, host: HostSample | None = None, gpus: tuple[GpuSample, ...] | list[GpuSample] = ()) -> None:
        """Store samples taken elsewhere (a recorded session replayed, synthetic samples in a
        test) exactly as :meth:`sample_once` stores its own: ring buffers and peaks."""
        if host is not None:
            self._host.append(host)
        for s in gpus:
            buf = self._gpu.get(s.index)
            if buf is None:
                buf = self._gpu[s.index] = RingBuffer[GpuSample](self._capacity)
            buf.append(s)
        if host is not None:
            self._update_peaks(host, list(gpus))

    def _update_peaks(self, host: HostSample, gpus: list[GpuSample]) -> None:
        def hi(old: int | None, new: int | None) -> int | None:
            if new is None:
                return old
            return new if old is None or new > old else old

        with self._peak_lock:
            p = self._peaks
            p["rss"] = hi(p["rss"], host.process_rss_bytes)
            p["host"] = hi(p["host"], host.total_bytes - host.available_bytes)
            for s in gpus:
                p["gpu"][s.index] = hi(p["gpu"].get(s.index), s.used_bytes)
                if s.process_bytes is not None:
                    p["gpu_proc"][s.index] = hi(p["gpu_proc"].get(s.index), s.process_bytes)

    def _run(self) -> None:
        cpu0 = time.thread_time()
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # keep sampling; report once per kind
                log.debug("sample failed: %s", exc)
            self.cpu_s = time.thread_time() - cpu0
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind: skip, do not burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)
