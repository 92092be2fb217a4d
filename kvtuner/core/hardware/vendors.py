"""GPUs beyond NVML: AMD and Intel through the kernel's sysfs, Apple's unified memory, and any
backend's devices as a llama-server lists them; and the checks a reading must pass before it is
trusted.

Sources, in the order kvtuner trusts them:

- **AMD (amdgpu)**: ``/sys/class/drm/card*/device/mem_info_vram_total``, ``mem_info_vram_used``,
  ``mem_info_gtt_total``, ``mem_info_gtt_used`` (bytes; Linux drivers/gpu/drm/amd/amdgpu/
  amdgpu_vram_mgr.c and amdgpu_gtt_mgr.c). These count every allocation in the driver, which
  ROCm's ``hipMemGetInfo`` does not (it is blind to VRAM not allocated through ROCm, so free
  memory is over-reported: llama.cpp issue 24906; PR 25123 proposed this sysfs reading).
- **Intel (xe)**: ``/sys/class/drm/card*/device/tile0/vram0/physical_vram_size_bytes`` (total
  only; i915 publishes no memory figures in sysfs, so an Intel card there has no reading).
- **Apple silicon**: one pool. Metal's ``recommendedMaxWorkingSetSize`` is what llama.cpp reports
  as the device's total (ggml/src/ggml-metal/ggml-metal-device.m ``ggml_metal_device_get_memory``:
  ``total = recommendedMaxWorkingSetSize``, ``free = total - currentAllocatedSize``);
  :func:`metal_working_set_bytes` gives it from the RAM size, or ``iogpu.wired_limit_mb`` when the
  user raised it with ``sysctl``.
- **Any backend**: a llama-server's ``--list-devices`` (:mod:`kvtuner.runner.engines`), which is
  what the backend itself reports (ggml-vulkan: the device-local heaps, or every heap on an
  integrated GPU, with ``VK_EXT_memory_budget``; ggml-vulkan.cpp ``ggml_backend_vk_get_device_memory``).

``$KVTUNER_SYSFS_ROOT`` (default ``/sys``) points the sysfs reader at another tree: a container's
bind mount, or a stand-in tree of real files in tests.

Sizes in bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..units import MiB
from .specs import GpuSpec, index_by_backend, metal_working_set_bytes

if TYPE_CHECKING:
    pass

#: Environment variable naming the sysfs root (default ``/sys``).
SYSFS_ROOT_ENV = "KVTUNER_SYSFS_ROOT"

#: PCI vendor ids (PCI-SIG registry).
PCI_VENDOR_AMD = 0x1002
PCI_VENDOR_INTEL = 0x8086

#: amdgpu APUs by PCI device id (Linux pci.ids): their "VRAM" is a carve-out of system RAM and
#: their GTT pool is system RAM too, so VRAM + GTT is one budget shared with the CPU.
AMD_APU_DEVICE_IDS: dict[int, str] = {
    0x1586: "Strix Halo",  # Radeon 8050S/8060S (gfx1151)
    0x150E: "Strix Point",  # Radeon 880M/890M (gfx1150)
    0x15BF: "Phoenix",  # Radeon 780M (gfx1103)
    0x15C8: "Phoenix2",
    0x1681: "Rembrandt",  # Radeon 680M (gfx1035)
}

#: amdgpu discrete cards by PCI device id (Linux pci.ids); the VRAM size picks the model where a
#: chip serves several (Navi 31: 7900 XTX 24 GiB, 7900 XT 20 GiB, 7900 GRE 16 GiB).
AMD_DGPU_DEVICE_IDS: dict[int, str] = {
    0x744C: "Navi 31",  # RX 7900 XTX / XT / GRE
    0x747E: "Navi 32",  # RX 7800 XT / 7700 XT
    0x7480: "Navi 33",  # RX 7600 / 7600 XT
    0x7550: "Navi 48",  # RX 9070 XT / 9070
    0x7590: "Navi 44",  # RX 9060 XT
}

_NAVI_MODELS = {  # chip -> catalogue names, any of which the VRAM size picks
    "Navi 31": ("RX 7900 XTX", "RX 7900 XT", "RX 7900 GRE"),
    "Navi 32": ("RX 7800 XT", "RX 7700 XT"),
    "Navi 33": ("RX 7600 XT", "RX 7600"),
    "Navi 48": ("RX 9070 XT", "RX 9070"),
    "Navi 44": ("RX 9060 XT 16GB",),
    "Strix Halo": ("Strix Halo 128GB",),
}

# -- contradictions ----------------------------------------------------------------------------

#: A reading's free memory exceeds its total (Vulkan on an Intel iGPU under Windows: llama.cpp
#: issue 29277).
FLAG_FREE_ABOVE_TOTAL = "free-above-total"
#: used + free exceeds total by more than the slack: the two figures come from different books.
FLAG_USED_PLUS_FREE_ABOVE_TOTAL = "used-plus-free-above-total"
#: the free memory a backend reports exceeds what the driver says is unused (ROCm's
#: ``hipMemGetInfo`` blind to other processes' VRAM: llama.cpp issue 24906).
FLAG_FREE_ABOVE_DRIVER = "free-above-driver-unused"

#: What the flags mean, for a tooltip or a note.
FLAG_TEXT = {
    FLAG_FREE_ABOVE_TOTAL: "free memory reported above the total: the reading is not trusted",
    FLAG_USED_PLUS_FREE_ABOVE_TOTAL: "used + free above the total: figures from different books, not trusted",
    FLAG_FREE_ABOVE_DRIVER: "the backend reports more free memory than the driver leaves unused "
    "(ROCm does not see other processes' VRAM); the driver's figure is used",
}

#: Disagreement tolerated between two books before a reading is flagged (page and allocation
#: granularity, a sample taken a moment apart).
READING_SLACK_BYTES = 64 * MiB


def check_reading(
    total_bytes: int,
    free_bytes: int | None,
    used_bytes: int | None = None,
    *,
    driver_used_bytes: int | None = None,
    slack_bytes: int = READING_SLACK_BYTES,
) -> tuple[str, ...]:
    """Flags (``FLAG_*``) for a memory reading that contradicts itself or the driver; empty when
    it is consistent.

    Args:
        total_bytes, free_bytes, used_bytes: the reading (used None when the source gives none).
        driver_used_bytes: what the kernel driver counts as used (amdgpu ``mem_info_vram_used``),
            when the reading came from elsewhere (a backend's free figure).
    """
    flags: list[str] = []
    if free_bytes is not None and free_bytes > total_bytes:
        flags.append(FLAG_FREE_ABOVE_TOTAL)
    if free_bytes is not None and used_bytes is not None and used_bytes + free_bytes > total_bytes + slack_bytes:
        flags.append(FLAG_USED_PLUS_FREE_ABOVE_TOTAL)
    if (
        free_bytes is not None
        and driver_used_bytes is not None
        and free_bytes > total_bytes - driver_used_bytes + slack_bytes
    ):
        flags.append(FLAG_FREE_ABOVE_DRIVER)
    return tuple(flags)


def trusted_free_bytes(
    total_bytes: int, free_bytes: int | None, flags: Iterable[str], driver_used_bytes: int | None = None
) -> int | None:
    """The free memory to plan with: the reading when unflagged; with the driver's used figure,
    ``total - driver used``; else None (not trusted, planned as unknown)."""
    flags = tuple(flags)
    if not flags:
        return free_bytes
    if driver_used_bytes is not None:
        return max(total_bytes - driver_used_bytes, 0)
    return None


# -- sysfs (amdgpu, xe) ------------------------------------------------------------------------


@dataclass(frozen=True)
class SysfsGpu:
    """One GPU as the kernel's DRM sysfs shows it.

    ``card``: ``card0``...; ``vendor``: ``"AMD"`` or ``"Intel"``; ``device_id``: PCI device id;
    ``name``: the catalogue card its id and VRAM pick, else ``"AMD GPU 0x744c"``; ``apu``: an
    integrated GPU sharing system RAM; VRAM and GTT in bytes (None where sysfs has no figure);
    ``flags``: :func:`check_reading` of VRAM; ``source``: the files read.
    """

    card: str
    vendor: str
    device_id: int
    name: str
    apu: bool
    vram_total_bytes: int
    vram_used_bytes: int | None
    gtt_total_bytes: int | None
    gtt_used_bytes: int | None
    source: str
    flags: tuple[str, ...] = ()
    catalogue: str | None = None

    @property
    def vram_free_bytes(self) -> int | None:
        """VRAM total - used (None without a used figure)."""
        return None if self.vram_used_bytes is None else self.vram_total_bytes - self.vram_used_bytes

    @property
    def budget_bytes(self) -> int:
        """What llama.cpp can allocate on it: VRAM, plus GTT on an APU (ggml-vulkan counts every
        heap of an integrated GPU, ``ggml_backend_vk_get_device_memory``; on Strix Halo the GTT
        pool is where the model lives)."""
        return self.vram_total_bytes + ((self.gtt_total_bytes or 0) if self.apu else 0)

    @property
    def budget_used_bytes(self) -> int | None:
        """Used part of :attr:`budget_bytes` (None when sysfs gives no used figure)."""
        if self.vram_used_bytes is None:
            return None
        return self.vram_used_bytes + ((self.gtt_used_bytes or 0) if self.apu else 0)


def sysfs_root() -> Path:
    """``$KVTUNER_SYSFS_ROOT`` or ``/sys``."""
    return Path(os.environ.get(SYSFS_ROOT_ENV) or "/sys")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def _amd_name(device_id: int, vram_bytes: int) -> tuple[str, str | None]:
    """(display name, catalogue entry) of an amdgpu device id."""
    from .gpu_catalogue import GPU_CATALOGUE

    chip = AMD_APU_DEVICE_IDS.get(device_id) or AMD_DGPU_DEVICE_IDS.get(device_id)
    names = _NAVI_MODELS.get(chip or "", ())
    models = [GPU_CATALOGUE[n] for n in names if n in GPU_CATALOGUE]
    if device_id in AMD_APU_DEVICE_IDS:
        entry = models[0] if models else None
        return f"AMD {chip} iGPU", entry.name if entry else None
    if models:
        entry = min(models, key=lambda g: abs(g.vram_bytes - vram_bytes))
        return f"AMD Radeon {entry.name}", entry.name
    return f"AMD GPU {device_id:#06x}" + (f" ({chip})" if chip else ""), None


def read_sysfs_gpus(root: str | os.PathLike[str] | None = None) -> list[SysfsGpu]:
    """The AMD and Intel GPUs under ``root``/class/drm (default :func:`sysfs_root`), by card
    number; render nodes and connectors (``card0-DP-1``) are skipped. Empty when there is none or
    sysfs cannot be read (Windows, macOS)."""
    base = Path(root) if root is not None else sysfs_root()
    drm = base / "class" / "drm"
    try:
        cards = sorted(
            (p for p in drm.iterdir() if p.name.startswith("card") and p.name[4:].isdigit()),
            key=lambda p: int(p.name[4:]),
        )
    except OSError:
        return []
    out: list[SysfsGpu] = []
    for card in cards:
        dev = card / "device"
        vendor = _read_int(dev / "vendor")
        device_id = _read_int(dev / "device") or 0
        if vendor == PCI_VENDOR_AMD:
            total = _read_int(dev / "mem_info_vram_total")
            if not total:
                continue
            used = _read_int(dev / "mem_info_vram_used")
            gtt_total = _read_int(dev / "mem_info_gtt_total")
            gtt_used = _read_int(dev / "mem_info_gtt_used")
            flags = check_reading(total, None if used is None else total - used, used)
            if used is not None and used > total:
                flags = (*flags, FLAG_USED_PLUS_FREE_ABOVE_TOTAL)
            if gtt_total is not None and gtt_used is not None and gtt_used > gtt_total:
                flags = (*flags, "gtt-used-above-total")
            name, entry = _amd_name(device_id, total)
            out.append(
                SysfsGpu(
                    card.name,
                    "AMD",
                    device_id,
                    name,
                    device_id in AMD_APU_DEVICE_IDS,
                    total,
                    used,
                    gtt_total,
                    gtt_used,
                    "sysfs amdgpu mem_info_vram_*/mem_info_gtt_*",
                    flags,
                    entry,
                )
            )
        elif vendor == PCI_VENDOR_INTEL:
            total = _read_int(dev / "tile0" / "vram0" / "physical_vram_size_bytes")
            if not total:
                continue  # i915, or an iGPU: no memory figures in sysfs
            out.append(
                SysfsGpu(
                    card.name,
                    "Intel",
                    device_id,
                    f"Intel GPU {device_id:#06x}",
                    False,
                    total,
                    None,
                    None,
                    None,
                    "sysfs xe tile0/vram0/physical_vram_size_bytes",
                )
            )
    return out


def sysfs_gpu_specs(first_index: int = 0, root: str | os.PathLike[str] | None = None) -> list[GpuSpec]:
    """:func:`read_sysfs_gpus` as :class:`GpuSpec` s, indexed from ``first_index`` (after the
    NVML cards). An AMD APU is one unified budget (VRAM + GTT) taken from the host's RAM."""
    from .gpu_catalogue import GPU_CATALOGUE

    specs = []
    for i, g in enumerate(read_sysfs_gpus(root)):
        entry = GPU_CATALOGUE.get(g.catalogue or "")
        used = g.budget_used_bytes
        free = None if used is None or g.flags else max(g.budget_bytes - used, 0)
        specs.append(
            GpuSpec(
                name=g.name,
                total_bytes=g.budget_bytes,
                free_bytes=free,
                index=first_index + i,
                mem_bandwidth_bytes_s=entry.mem_bandwidth_bytes_s if entry else None,
                pcie_bandwidth_bytes_s=entry.pcie_bandwidth_bytes_s if entry else None,
                catalogue=g.catalogue,
                backend="ROCm" if g.vendor == "AMD" else "SYCL",
                unified=g.apu,
                ram_bytes=_ram_bytes() if g.apu else None,
                source=g.source,
                flags=g.flags,
            )
        )
    return specs


def _ram_bytes() -> int:
    from .host import ram_total_bytes

    return ram_total_bytes()


# -- Apple silicon ------------------------------------------------------------------------------


def read_wired_limit_mb() -> int | None:
    """``sysctl -n iogpu.wired_limit_mb`` on macOS (None elsewhere or when unreadable)."""
    if sys.platform != "darwin":
        return None
    try:
        out = subprocess.run(
            ["sysctl", "-n", "iogpu.wired_limit_mb"], capture_output=True, text=True, timeout=2
        ).stdout.strip()
        return int(out) if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


# -- a llama-server's devices -------------------------------------------------------------------

#: ``--list-devices`` backends kvtuner plans as GPUs.
GPU_BACKENDS = ("CUDA", "ROCm", "Vulkan", "Metal", "SYCL", "MUSA", "CANN", "OpenCL")


def engine_gpu_specs(devices: Iterable[Any], first_index: int = 0, sysfs: Iterable[SysfsGpu] = ()) -> list[GpuSpec]:
    """GpuSpecs of an engine's ``--list-devices`` devices (:class:`kvtuner.runner.engines.EngineDevice`:
    name, description, total and free MiB). A device whose description names a sysfs card's
    catalogue entry is checked against that card's driver figure (:data:`FLAG_FREE_ABOVE_DRIVER`).
    Metal devices are unified; so is a Vulkan/ROCm device whose description names a known APU."""
    from .gpu_catalogue import UnknownGpuError, find_gpu

    cards = list(sysfs)
    out: list[GpuSpec] = []
    for d in devices:
        backend = getattr(d, "backend", "")
        if backend not in GPU_BACKENDS:
            continue
        desc = str(getattr(d, "description", ""))
        total = int(d.total_mib) * MiB
        free = int(d.free_mib) * MiB
        entry = None
        try:
            entry = find_gpu(desc.split("(")[0].strip()) if desc else None
        except UnknownGpuError:
            entry = None
        driver_used = None
        for c in cards:
            if entry is not None and c.catalogue == entry.name and c.budget_used_bytes is not None:
                driver_used = c.budget_used_bytes
        flags = check_reading(total, free, driver_used_bytes=driver_used)
        unified = backend == "Metal" or (entry is not None and entry.unified)
        out.append(
            GpuSpec(
                name=f"{d.name}: {desc}",
                total_bytes=total,
                free_bytes=trusted_free_bytes(total, free, flags, driver_used),
                index=first_index + len(out),
                mem_bandwidth_bytes_s=entry.mem_bandwidth_bytes_s if entry else None,
                pcie_bandwidth_bytes_s=entry.pcie_bandwidth_bytes_s if entry else None,
                catalogue=entry.name if entry else None,
                backend=backend,
                unified=unified,
                ram_bytes=_ram_bytes() if unified else None,
                source="llama-server --list-devices",
                flags=flags,
            )
        )
    return out


def apple_gpu_specs(index: int = 0) -> list[GpuSpec]:
    """This Mac's GPU when it is Apple silicon (``sys.platform == "darwin"``, ``arm64``), else
    empty: one unified GPU whose total is Metal's working set (:func:`metal_working_set_bytes`
    of psutil's RAM and the ``iogpu.wired_limit_mb`` sysctl) and whose free memory is psutil's
    available RAM capped at that total (what Metal can still take from the pool). The chip's
    name (``sysctl machdep.cpu.brand_string``, "Apple M2 Max") picks its catalogue entry."""
    import platform

    if sys.platform != "darwin" or platform.machine() != "arm64":
        return []
    import psutil

    from .gpu_catalogue import UnknownGpuError, find_gpu
    from .host import cpu_name

    vm = psutil.virtual_memory()
    ram = int(vm.total)
    total = metal_working_set_bytes(ram, read_wired_limit_mb())
    chip = cpu_name() or "Apple silicon"
    try:
        entry = find_gpu(chip)
    except UnknownGpuError:
        entry = None
    return [
        GpuSpec(
            name=f"{chip} GPU",
            total_bytes=total,
            free_bytes=min(int(vm.available), total),
            index=index,
            mem_bandwidth_bytes_s=entry.mem_bandwidth_bytes_s if entry else None,
            pcie_bandwidth_bytes_s=entry.mem_bandwidth_bytes_s if entry else None,
            catalogue=entry.name if entry else None,
            backend="Metal",
            unified=True,
            ram_bytes=ram,
            source="psutil + Metal working set",
        )
    ]


def detect_all_gpus() -> list[GpuSpec]:
    """Every GPU this machine shows: NVIDIA's through NVML, then AMD's and Intel's through sysfs
    (:func:`sysfs_gpu_specs`), then Apple silicon's (:func:`apple_gpu_specs`), indexed in that
    order, each named by its backend's own index (:func:`~kvtuner.core.hardware.specs.index_by_backend`).
    Empty when there is none (a normal state)."""
    from .nvml import detect_gpus

    gpus = detect_gpus()
    gpus += sysfs_gpu_specs(first_index=len(gpus))
    return index_by_backend([*gpus, *apple_gpu_specs(index=len(gpus))])
