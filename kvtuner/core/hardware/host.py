"""This machine's host: RAM, swap, CPU model and cores, the one place that asks.

Everything that needs the host's memory, its CPU's name or llama.cpp's default thread count
(the physical cores) asks here: the planner's hardware, the speed model, the runner, the
machine identity and the live sampler.
"""

from __future__ import annotations

import os
import platform
import sys

import psutil

from .specs import HostSpec


def detect_host() -> HostSpec:
    """The host's RAM and swap now (psutil) and its CPU's instruction sets (:func:`cpu_features`)."""
    vm = psutil.virtual_memory()
    sw = psutil.swap_memory()
    return HostSpec(
        total_bytes=int(vm.total),
        available_bytes=int(vm.available),
        swap_total_bytes=int(sw.total),
        cpu_features=cpu_features(),
    )


_CPU_FEATURES: frozenset[str] | None = None


def cpu_features() -> frozenset[str]:
    """The instruction sets ggml-cpu's weight repacking checks (ggml/src/ggml-cpu/repack.cpp
    ``ggml_cpu_has_avx2``, ``_avx512``, ``_neon``, ``_dotprod``, ``_matmul_int8``), as this CPU
    reports them: Linux ``/proc/cpuinfo`` flags (x86 ``avx2``, ``avx512f``; Arm ``asimd``,
    ``asimddp``, ``i8mm``), macOS on Apple silicon ``sysctl hw.optional.arm.FEAT_*``.

    llama.cpp's builds compile these in for the machine they are built on (GGML_NATIVE, the
    default of a pip install from source), so the CPU's flags stand for the build's.
    """
    global _CPU_FEATURES
    if _CPU_FEATURES is not None:
        return _CPU_FEATURES
    found: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    flags = set(line.split(":", 1)[1].split())
                    if "avx2" in flags:
                        found.add("avx2")
                    if "avx512f" in flags:
                        found.add("avx512")
                    if "asimd" in flags:
                        found.add("neon")
                    if "asimddp" in flags:
                        found.add("dotprod")
                    if "i8mm" in flags:
                        found.add("i8mm")
                    break
    except OSError:
        pass
    if sys.platform == "darwin" and platform.machine() == "arm64":  # Apple silicon: NEON and dot product always
        found |= {"neon", "dotprod"}
        try:
            import subprocess

            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_I8MM"], capture_output=True, text=True, timeout=2
            ).stdout.strip()
            if out == "1":
                found.add("i8mm")
        except (OSError, subprocess.SubprocessError):
            pass
    _CPU_FEATURES = frozenset(found)
    return _CPU_FEATURES


# Linux fast path: the files psutil reads (psutil/_pslinux.py virtual_memory, swap_memory,
# memory_info), parsed for just the fields kvtuner samples.
_LINUX_FAST = sys.platform.startswith("linux") and os.path.exists("/proc/meminfo")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MEMINFO_KEYS = (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree")


def _vmstat_value(data: bytes, key: bytes) -> int:
    i = data.find(b"\n" + key + b" ")
    if i < 0:
        return 0
    i += len(key) + 2
    return int(data[i : data.find(b"\n", i)])


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
    sin = _vmstat_value(vmstat, b"pswpin") * PAGE_BYTES
    sout = _vmstat_value(vmstat, b"pswpout") * PAGE_BYTES
    return (vals[b"MemTotal"], vals[b"MemAvailable"], vals[b"SwapTotal"] - vals[b"SwapFree"], sin, sout)


def read_host_counters() -> tuple[int, int, int, int, int]:
    """(RAM total, RAM available, swap used, swap-in, swap-out cumulative) in bytes. Linux: read
    /proc/meminfo and /proc/vmstat directly (what psutil reads, ~3x cheaper); else psutil."""
    if _LINUX_FAST:
        try:
            return _linux_host()
        except (OSError, ValueError, KeyError):
            pass
    vm = psutil.virtual_memory()
    sw = psutil.swap_memory()
    return int(vm.total), int(vm.available), int(sw.used), int(sw.sin), int(sw.sout)


def physical_cores() -> int:
    """Physical CPU cores, at least 1: llama.cpp's default thread count (common/common.cpp
    ``cpu_get_num_math``, which counts physical cores)."""
    try:
        n = psutil.cpu_count(logical=False)
    except Exception:  # pragma: no cover - psutil cannot read the topology
        n = None
    return max(int(n or os.cpu_count() or 1), 1)


def cpu_name() -> str:
    """The CPU's model name, or "": Linux ``/proc/cpuinfo`` "model name"; macOS ``sysctl -n
    machdep.cpu.brand_string`` ("Apple M2 Max"); else (Windows) ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        brand = _sysctl("machdep.cpu.brand_string")
        if brand:
            return brand
    return platform.processor() or ""


def _sysctl(name: str) -> str:
    """``sysctl -n NAME`` on macOS ("" when it cannot be read)."""
    import subprocess

    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def ram_total_bytes() -> int:
    """Installed RAM in bytes (0 when psutil cannot tell)."""
    try:
        return int(psutil.virtual_memory().total)
    except Exception:  # pragma: no cover
        return 0


def process_rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes (Linux: ``/proc/PID/statm``), None when gone."""
    if _LINUX_FAST:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * PAGE_BYTES
        except (OSError, ValueError, IndexError):
            return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return None
