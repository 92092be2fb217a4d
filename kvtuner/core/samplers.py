"""Live memory samplers: GPUs through NVML, the host and a process through psutil.

Headless (no Qt). A :class:`Sampler` runs on its own thread at 10 Hz by default and appends
timestamped samples to bounded, lock-guarded ring buffers; a GUI pulls them on a timer
(:meth:`Sampler.host_samples`, :meth:`Sampler.gpu_samples`), nothing is pushed across threads.

Every NVML call goes through one choke point, :func:`nvml_call`, which initialises NVML
lazily (``pynvml`` from the ``nvidia-ml-py`` distribution) and turns "library not found",
"driver not loaded" and a missing ``pynvml`` into the normal state "no NVIDIA GPU found",
reported once (:func:`nvml_status`, and one INFO log record), never an exception. A query
the device does not support returns the caller's default.

Times are ``time.monotonic()`` seconds (``t_s``); sizes in bytes; rates in bytes/s.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psutil

from .hardware import GpuSpec, HostSpec

log = logging.getLogger("kvtuner.samplers")

T = TypeVar("T")

# ----------------------------------------------------------------------------------------------
# NVML choke point


@dataclass(frozen=True)
class NvmlStatus:
    """``available``: NVML initialised; ``message``: why not, e.g. ``"no NVIDIA GPU found:
    NVML Shared Library Not Found"`` ("" when available); ``driver_version`` when known."""

    available: bool
    message: str
    driver_version: str = ""


_NOT_TRIED = object()
_nvml_lock = threading.RLock()
_nvml_module: Any = _NOT_TRIED  # None: unavailable; a module: initialised
_nvml_status = NvmlStatus(False, "NVML not initialised yet")
_nvml_injected: Any = None


def use_nvml_module(module: Any | None) -> None:
    """Use ``module`` in place of ``pynvml`` (a stand-in for the driver in tests), or go back
    to the real ``pynvml`` with None. Resets the choke point; the next call initialises again."""
    global _nvml_module, _nvml_injected, _nvml_status
    with _nvml_lock:
        _nvml_module = _NOT_TRIED
        _nvml_injected = module
        _nvml_status = NvmlStatus(False, "NVML not initialised yet")


def _nvml_init() -> Any:
    """Initialise once; returns the module or None (state in ``_nvml_status``)."""
    global _nvml_module, _nvml_status
    if _nvml_module is not _NOT_TRIED:
        return _nvml_module
    module = _nvml_injected
    if module is None:
        try:
            import pynvml as module  # type: ignore[no-redef]
        except Exception as exc:  # ImportError, or a broken install
            _nvml_module = None
            _nvml_status = NvmlStatus(False, f"no NVIDIA GPU found: nvidia-ml-py is not installed ({exc})")
            log.info("%s", _nvml_status.message)
            return None
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, OSError ...
        _nvml_module = None
        reason = str(exc) or type(exc).__name__
        _nvml_status = NvmlStatus(False, f"no NVIDIA GPU found: {reason}")
        log.info("%s", _nvml_status.message)
        return None
    _nvml_module = module
    try:
        drv = module.nvmlSystemGetDriverVersion()
        drv = drv.decode() if isinstance(drv, bytes) else str(drv)
    except Exception:
        drv = ""
    _nvml_status = NvmlStatus(True, "", drv)
    return module


def nvml_call(func: str, *args: Any, default: Any = None) -> Any:
    """The one way kvtuner talks to NVML: ``pynvml.<func>(*args)``, or ``default`` when NVML
    is unavailable (no driver, no library, no GPU) or the query fails or is unsupported.

    Never raises for NVML's own errors.
    """
    with _nvml_lock:
        module = _nvml_init()
    if module is None:
        return default
    try:
        return getattr(module, func)(*args)
    except Exception:
        return default


def nvml_status() -> NvmlStatus:
    """Whether NVML works here, initialising it if needed."""
    with _nvml_lock:
        _nvml_init()
        return _nvml_status


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# PCIe per-lane throughput after encoding, bytes/s (PCI-SIG: 2.5/5 GT/s 8b/10b, 8+ GT/s 128b/130b).
_PCIE_LANE_BYTES_S = {1: 250e6, 2: 500e6, 3: 984.6e6, 4: 1969.2e6, 5: 3938.5e6, 6: 7563e6}
_NVML_CLOCK_MEM = 2  # nvml.h nvmlClockType_t NVML_CLOCK_MEM


def detect_gpus() -> list[GpuSpec]:
    """The NVIDIA GPUs NVML sees, in NVML order (empty list when there is none or no driver).

    ``mem_bandwidth_bytes_s`` = max memory clock (MHz) x bus width (bits) / 8 x 2 (double data
    rate), an estimate; ``pcie_bandwidth_bytes_s`` = max link generation's lane rate x max
    width. Note: NVML orders by PCI bus id, CUDA by speed unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    """
    gpus: list[GpuSpec] = []
    count = nvml_call("nvmlDeviceGetCount", default=0) or 0
    for i in range(int(count)):
        h = nvml_call("nvmlDeviceGetHandleByIndex", i)
        if h is None:
            continue
        mem = nvml_call("nvmlDeviceGetMemoryInfo", h)
        if mem is None:
            continue
        clock = nvml_call("nvmlDeviceGetMaxClockInfo", h, _NVML_CLOCK_MEM)
        width = nvml_call("nvmlDeviceGetMemoryBusWidth", h)
        bw = float(clock) * 1e6 * float(width) / 8 * 2 if clock and width else None
        gen = nvml_call("nvmlDeviceGetMaxPcieLinkGeneration", h)
        lanes = nvml_call("nvmlDeviceGetMaxPcieLinkWidth", h)
        pcie = _PCIE_LANE_BYTES_S[gen] * lanes if gen in _PCIE_LANE_BYTES_S and lanes else None
        gpus.append(
            GpuSpec(
                name=_text(nvml_call("nvmlDeviceGetName", h, default=f"GPU {i}")),
                total_bytes=int(mem.total), free_bytes=int(mem.free), index=i,
                mem_bandwidth_bytes_s=bw, pcie_bandwidth_bytes_s=pcie,
            )
        )
    return gpus


def detect_host() -> HostSpec:
    """The host's RAM and swap now (psutil)."""
    vm = psutil.virtual_memory()
    sw = psutil.swap_memory()
    return HostSpec(total_bytes=int(vm.total), available_bytes=int(vm.available), swap_total_bytes=int(sw.total))


# Linux fast path: the files psutil reads (psutil/_pslinux.py virtual_memory, swap_memory,
# memory_info), parsed for just the fields kvtuner samples.
_LINUX_FAST = sys.platform.startswith("linux") and os.path.exists("/proc/meminfo")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MEMINFO_KEYS = (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree")


def _vmstat_value(data: bytes, key: bytes) -> int:
    i = data.find(b"\n" + key + b" ")
    if i < 0:
        return 0
    i += len(key) + 2
    return int(data[i:data.find(b"\n", i)])


def _linux_host() -> tuple[int, int, int, int, int]:
    with open("/proc/meminfo", "rb") as f:
        meminfo = f.read()
    vals: dict[bytes, int] = {}
    for line in meminfo.split(b"\n"):
        key, _, rest = line.partition(b":")
        if key in _MEMINFO_KEYS:
            vals[key] = int(rest.split()[0]) * 1024  # kB
    with open("/proc/vmstat", "rb") as f:
        vmstat = b"\n" + f.read()
    sin = _vmstat_value(vmstat, b"pswpin") * _PAGE_BYTES
    sout = _vmstat_value(vmstat, b"pswpout") * _PAGE_BYTES
    return (vals[b"MemTotal"], vals[b"MemAvailable"], vals[b"SwapTotal"] - vals[b"SwapFree"], sin, sout)


# ----------------------------------------------------------------------------------------------
# samples and ring buffers


@dataclass(frozen=True)
class GpuSample:
    """One GPU at ``t_s``: memory in bytes, ``util_percent`` (GPU busy, 0..100) or None,
    ``process_bytes``: VRAM of the watched process on this GPU (None: no process watched or
    NVML cannot tell)."""

    t_s: float
    index: int
    total_bytes: int
    used_bytes: int
    free_bytes: int
    util_percent: float | None
    process_bytes: int | None


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


@dataclass(frozen=True)
class GpuProcessInfo:
    """A process NVML lists on GPU ``gpu_index`` (compute or graphics): ``used_bytes`` of VRAM
    (None when NVML cannot tell, e.g. under WDDM or in a container), ``name`` ("" if unknown)."""

    pid: int
    name: str
    gpu_index: int
    used_bytes: int | None


def _process_name(pid: int) -> str:
    name = nvml_call("nvmlSystemGetProcessName", pid)
    if name:
        return os.path.basename(_text(name))
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return ""


def gpu_processes(handles: "list[tuple[int, Any]] | None" = None) -> tuple[GpuProcessInfo, ...]:
    """Every process NVML lists on each GPU (``nvmlDeviceGetComputeRunningProcesses`` and
    ``...GraphicsRunningProcesses``; a pid on both counts once, with the larger figure). Empty
    without NVML. ``handles``: ``(index, handle)`` pairs (default: every GPU)."""
    if handles is None:
        handles = []
        for i in range(int(nvml_call("nvmlDeviceGetCount", default=0) or 0)):
            h = nvml_call("nvmlDeviceGetHandleByIndex", i)
            if h is not None:
                handles.append((i, h))
    out: list[GpuProcessInfo] = []
    for index, h in handles:
        seen: dict[int, int | None] = {}
        for func in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in nvml_call(func, h, default=None) or ():
                pid = getattr(p, "pid", None)
                if pid is None:
                    continue
                used = getattr(p, "usedGpuMemory", None)
                used = int(used) if isinstance(used, int) and used >= 0 else None
                old = seen.get(int(pid))
                seen[int(pid)] = used if old is None else (old if used is None else max(old, used))
        out.extend(GpuProcessInfo(pid, _process_name(pid), index, used) for pid, used in sorted(seen.items()))
    return tuple(out)


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
            return [s for s in self._items if getattr(s, "t_s") > t_s]

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
    """Samples the host, every NVIDIA GPU and optionally one process, on its own thread.

    Args:
        interval_s: seconds between samples (default 0.1 = 10 Hz).
        capacity: samples kept per ring buffer (default 6000 = 10 minutes at 10 Hz).
        pid: process to watch (RSS, VRAM), e.g. the runner child; changeable with :meth:`set_pid`.
        gpus: sample GPUs through NVML (False: host only).
    """

    def __init__(self, interval_s: float = 0.1, capacity: int = 6000, pid: int | None = None, gpus: bool = True) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = float(interval_s)
        self._host = RingBuffer[HostSample](capacity)
        self._gpu: dict[int, RingBuffer[GpuSample]] = {}
        self._capacity = capacity
        self._pid = pid
        self._proc: psutil.Process | None = None
        self._use_gpus = gpus
        self._handles: list[tuple[int, Any]] | None = None
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
        self._processes: tuple[GpuProcessInfo, ...] = ()
        self._processes_t = -float("inf")

    # -- control ----------------------------------------------------------------------------

    def set_pid(self, pid: int | None) -> None:
        """Watch another process (or none)."""
        self._pid = pid
        self._proc = None

    def start(self) -> "Sampler":
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

    def __enter__(self) -> "Sampler":
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
        """Samples of GPU ``index`` (NVML order), oldest first."""
        buf = self._gpu.get(index)
        if buf is None:
            return []
        return buf.snapshot() if since_t_s is None else buf.since(since_t_s)

    def gpu_indices(self) -> list[int]:
        """GPUs sampled so far."""
        return sorted(self._gpu)

    def gpu_processes(self) -> tuple[GpuProcessInfo, ...]:
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
        if self._pid is None:
            return None
        if _LINUX_FAST:
            try:
                with open(f"/proc/{self._pid}/statm", "rb") as f:
                    return int(f.read().split()[1]) * _PAGE_BYTES
            except (OSError, ValueError, IndexError):
                return None
        try:
            if self._proc is None or self._proc.pid != self._pid:
                self._proc = psutil.Process(self._pid)
            return int(self._proc.memory_info().rss)
        except (psutil.Error, OSError):
            self._proc = None
            return None

    def _host_now(self) -> tuple[int, int, int, int, int]:
        """(total, available, swap used, swap-in, swap-out cumulative bytes). Linux: read
        /proc/meminfo and /proc/vmstat directly (what psutil reads, ~3x cheaper); else psutil."""
        if _LINUX_FAST:
            try:
                return _linux_host()
            except (OSError, ValueError, KeyError):
                pass
        vm = psutil.virtual_memory()
        sw = psutil.swap_memory()
        return int(vm.total), int(vm.available), int(sw.used), int(sw.sin), int(sw.sout)

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
            s = GpuSample(now, index, int(mem.total), int(mem.used), int(mem.free),
                          float(util.gpu) if util is not None else None, proc_bytes)
            buf = self._gpu.get(index)
            if buf is None:
                buf = self._gpu[index] = RingBuffer[GpuSample](self._capacity)
            buf.append(s)
            gpus.append(s)
        handles = self._gpu_handles()
        if handles and now - self._processes_t >= self.process_interval_s:
            self._processes_t = now
            self._processes = gpu_processes(handles)
        self._update_peaks(host, gpus)
        self.n_samples += 1
        return host, tuple(gpus)

    def record(self, host: HostSample | None = None, gpus: "tuple[GpuSample, ...] | list[GpuSample]" = ()) -> None:
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

