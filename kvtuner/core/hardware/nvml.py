"""NVIDIA GPUs through NVML: the one choke point for every driver query.

Every NVML call goes through :func:`nvml_call`, which initialises NVML lazily (``pynvml`` from
the ``nvidia-ml-py`` distribution) and turns "library not found", "driver not loaded" and a
missing ``pynvml`` into the normal state "no NVIDIA GPU found", reported once
(:func:`nvml_status`, and one INFO log record), never an exception. A query the device does not
support (an ``NVMLError``) returns the caller's default; any other exception is a bug and
propagates. The pattern follows nvitop's ``nvitop/api/libnvml.py``.

Sizes in bytes; rates in bytes/s.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import psutil

from .gpu_catalogue import PCIE_LANE_BYTES_S, match_nvml_name
from .specs import GpuSpec

log = logging.getLogger("kvtuner.nvml")

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

    Never raises for NVML's own errors (``pynvml.NVMLError`` and its subclasses); any other
    exception is a bug in the caller and propagates.
    """
    with _nvml_lock:
        module = _nvml_init()
    if module is None:
        return default
    nvml_error = getattr(module, "NVMLError", None)
    try:
        fn = getattr(module, func)
    except AttributeError:  # an older nvidia-ml-py without this query
        return default
    try:
        return fn(*args)
    except Exception as exc:
        if nvml_error is not None and isinstance(exc, nvml_error):
            return default  # not supported, GPU lost, no permission: NVML's own errors
        raise


def nvml_status() -> NvmlStatus:
    """Whether NVML works here, initialising it if needed."""
    with _nvml_lock:
        _nvml_init()
        return _nvml_status


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


_NVML_CLOCK_MEM = 2  # nvml.h nvmlClockType_t NVML_CLOCK_MEM


def detect_gpus() -> list[GpuSpec]:
    """The NVIDIA GPUs NVML sees, in NVML order (empty list when there is none or no driver).

    ``mem_bandwidth_bytes_s`` = max memory clock (MHz) x bus width (bits) / 8 x 2: NVML's memory
    clock is half the data rate per pin for GDDR5/6/6X/7 and HBM alike (an RTX 3090 reports 9751
    MHz for 19.5 Gbps, an A100 1593 MHz for 3.19 Gbps HBM2e), so this gives the datasheet
    bandwidth; ``pcie_bandwidth_bytes_s`` = max link generation's lane rate
    (:data:`~kvtuner.core.hardware.gpu_catalogue.PCIE_LANE_BYTES_S`) x max width; ``catalogue`` =
    the :mod:`~kvtuner.core.hardware.gpu_catalogue` entry NVML's name picks (nearest memory size
    when a name has several). Note: NVML orders by PCI bus id, CUDA by speed unless
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
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
        pcie = PCIE_LANE_BYTES_S[gen] * lanes if gen in PCIE_LANE_BYTES_S and lanes else None
        name = _text(nvml_call("nvmlDeviceGetName", h, default=f"GPU {i}"))
        entry = match_nvml_name(name, int(mem.total))
        gpus.append(
            GpuSpec(
                name=name,
                total_bytes=int(mem.total),
                free_bytes=int(mem.free),
                index=i,
                mem_bandwidth_bytes_s=bw,
                pcie_bandwidth_bytes_s=pcie,
                catalogue=entry.name if entry else None,
                source="nvml",
            )
        )
    return gpus


@dataclass(frozen=True)
class GpuProcess:
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


def gpu_processes(handles: list[tuple[int, Any]] | None = None) -> tuple[GpuProcess, ...]:
    """Every process NVML lists on each GPU (``nvmlDeviceGetComputeRunningProcesses`` and
    ``...GraphicsRunningProcesses``; a pid on both counts once, with the larger figure). Empty
    without NVML. ``handles``: ``(index, handle)`` pairs (default: every GPU)."""
    if handles is None:
        handles = []
        for i in range(int(nvml_call("nvmlDeviceGetCount", default=0) or 0)):
            h = nvml_call("nvmlDeviceGetHandleByIndex", i)
            if h is not None:
                handles.append((i, h))
    out: list[GpuProcess] = []
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
        out.extend(GpuProcess(pid, _process_name(pid), index, used) for pid, used in sorted(seen.items()))
    return tuple(out)
