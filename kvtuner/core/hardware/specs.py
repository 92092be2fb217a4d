"""What the plan is laid out on: GPUs (detected or what-if) and the host.

Detection lives in :mod:`kvtuner.core.hardware.nvml` and :mod:`kvtuner.core.hardware.host`; these are plain values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..units import GiB, MiB

if TYPE_CHECKING:  # pragma: no cover
    from .gpu_catalogue import GpuModel


@dataclass(frozen=True)
class GpuSpec:
    """One GPU.

    Attributes:
        name: marketing name (``"NVIDIA GeForce RTX 3060"``) or ``"what-if 12 GiB GPU"``.
        total_bytes: memory capacity in bytes.
        free_bytes: free memory now in bytes, or None when not measured (what-if).
        index: CUDA device index (``CUDA0`` is 0).
        mem_bandwidth_bytes_s: memory bandwidth in bytes/s, or None when unknown.
        pcie_bandwidth_bytes_s: host link bandwidth in bytes/s, or None when unknown.
        what_if: True for a GPU the user described rather than one that was detected.
        catalogue: the :mod:`kvtuner.core.hardware.gpu_catalogue` entry this card is (its tensor
            throughput and link come from there), or None for a generic card (``--gpu-mem``) or
            one the catalogue does not know.
        endpoint: ``host:port`` of the ``rpc-server`` exposing this device (llama.cpp's RPC
            backend, ``--rpc``), None for a local GPU; ``index`` is then the device's index on
            that server (``rpc-server -d``).
        link_bytes_s: network throughput to that server, bytes/s (RPC devices; None: the speed
            model's default link).
        link_rtt_s: network round trip to that server, s (measured by kvtuner's RPC query, or None).
        backend: the ggml backend that drives it: ``"CUDA"`` (NVML-detected cards, generic what-if
            cards), ``"ROCm"``, ``"Vulkan"``, ``"Metal"``, ``"SYCL"`` (from sysfs, an engine's
            ``--list-devices`` or a catalogue card's vendor). Backend rules (:mod:`kvtuner.core.advice.backends`)
            key on it; the plan's device names stay ``CUDA<i>``-style indices.
        unified: the GPU shares one memory pool with the CPU (Apple M-series, AMD APUs):
            ``total_bytes`` is the part the GPU may use, taken from the same RAM as the host's.
        ram_bytes: the machine's RAM behind a unified GPU (None otherwise).
        source: where ``total_bytes`` / ``free_bytes`` were read (``"nvml"``, ``"sysfs"``,
            ``"llama-server --list-devices"``, ``"catalogue"``; "" for what-if cards).
        flags: contradictions found in the reading (:func:`kvtuner.core.hardware.vendors.check_reading`).
        backend_index: the device's index among its own backend's devices, which each ggml backend
            numbers from 0 (:func:`index_by_backend`); None: the ``CUDA<i>`` slot's index.
    """

    name: str
    total_bytes: int
    free_bytes: int | None = None
    index: int = 0
    mem_bandwidth_bytes_s: float | None = None
    pcie_bandwidth_bytes_s: float | None = None
    what_if: bool = False
    catalogue: str | None = None
    endpoint: str | None = None
    link_bytes_s: float | None = None
    link_rtt_s: float | None = None
    backend: str = "CUDA"
    unified: bool = False
    ram_bytes: int | None = None
    source: str = ""
    flags: tuple[str, ...] = ()
    backend_index: int | None = None

    @property
    def device(self) -> str:
        """llama.cpp's device name: ``CUDA0``, or ``RPC0[host:port]`` for a device of an
        ``rpc-server`` (ggml/src/ggml-rpc/ggml-rpc.cpp ``ggml_backend_rpc_add_server``:
        ``"RPC" + device + "[" + endpoint + "]"``), the name its buffers are logged under."""
        if self.endpoint is not None:
            return f"RPC{self.index}[{self.endpoint}]"
        return f"CUDA{self.index}"

    @property
    def backend_device(self) -> str:
        """The device as its own backend names it (:func:`backend_device_name`): ``CUDA0``,
        ``ROCm0``, ``Vulkan0``, ``SYCL0``, ``MTL0``, ``RPC0[host:port]``."""
        return backend_device_name(self.backend, self.device, self.backend_index)

    @property
    def kind(self) -> str:
        """``"rpc"`` for a device behind an ``rpc-server``, else ``"gpu"``."""
        return "rpc" if self.endpoint is not None else "gpu"


@dataclass(frozen=True)
class HostSpec:
    """The host: RAM capacity and availability in bytes, swap in bytes, and the CPU's
    instruction sets llama.cpp's CPU backend checks (``cpu_features``: ``avx2``, ``avx512``,
    ``neon``, ``dotprod``, ``i8mm``; None when unknown), which decide the ``CPU_REPACK`` copy.

    A what-if host (``--host-mem``, ``--host-bw``, ``--host-cores``, ``--pcie``; ``what_if``
    True) also carries what the speed model predicts for: ``mem_bandwidth_bytes_s`` its achieved
    RAM bandwidth (bytes/s), ``memory`` the named configuration (``"DDR4-3200x2"``, None for a
    bandwidth given directly) and ``mem_theoretical_bytes_s`` its theoretical bandwidth,
    ``n_cores`` the physical cores llama.cpp uses (None: this machine's), ``pcie_link`` the GPUs'
    link ``(generation, lanes)`` (None: each card's own).
    """

    total_bytes: int
    available_bytes: int | None = None
    swap_total_bytes: int = 0
    mem_bandwidth_bytes_s: float | None = None
    cpu_features: frozenset[str] | None = None
    what_if: bool = False
    memory: str | None = None
    mem_theoretical_bytes_s: float | None = None
    n_cores: int | None = None
    pcie_link: tuple[int, int] | None = None

    def describe(self) -> str:
        """One line naming the host a prediction is for: ``what-if host: DDR4-3200x2 (51.2 GB/s
        theoretical, 45.1 GB/s achieved), 6 cores, PCIe 4.0 x16``, or ``this machine``."""
        if not self.what_if:
            return "this machine"
        parts = []
        if self.mem_bandwidth_bytes_s:
            bw = f"{self.mem_bandwidth_bytes_s / 1e9:.1f} GB/s achieved"
            if self.memory:
                theo = (
                    f"{self.mem_theoretical_bytes_s / 1e9:.1f} GB/s theoretical, "
                    if self.mem_theoretical_bytes_s
                    else ""
                )
                parts.append(f"{self.memory} ({theo}{bw})")
            else:
                parts.append(f"RAM at {bw}")
        else:
            parts.append("this machine's RAM bandwidth")
        parts.append(f"{self.n_cores} cores" if self.n_cores else "this machine's cores")
        if self.pcie_link:
            parts.append(f"PCIe {self.pcie_link[0]}.0 x{self.pcie_link[1]}")
        return "what-if host: " + ", ".join(parts)

    def speed_dict(self) -> dict[str, object]:
        """The ``speed.host`` object of ``plan --json``: ``name`` (:meth:`describe`), ``what_if``,
        ``memory``, ``mem_bandwidth_bytes_s``, ``mem_theoretical_bytes_s``, ``n_cores``, ``pcie``
        (``"4.0 x16"`` or None)."""
        return {
            "name": self.describe(),
            "what_if": self.what_if,
            "memory": self.memory,
            "mem_bandwidth_bytes_s": self.mem_bandwidth_bytes_s,
            "mem_theoretical_bytes_s": self.mem_theoretical_bytes_s,
            "n_cores": self.n_cores,
            "pcie": f"{self.pcie_link[0]}.0 x{self.pcie_link[1]}" if self.pcie_link else None,
        }

    def speed_key(self) -> tuple:
        """What of the host a speed prediction depends on (the cache key of the speed inputs)."""
        return (self.what_if, self.mem_bandwidth_bytes_s if self.what_if else None, self.n_cores, self.pcie_link)


def backend_device_name(backend: str, device: str, index: int | None = None) -> str:
    """A planned device's name as its backend's log gives it: the planner's ``CUDA<i>`` slot for
    CUDA and unnamed backends, an RPC device as it is, else the backend's own name with ``index``
    (its index among that backend's devices, each backend numbering from 0; None: the slot's)
    (ggml-cuda ``GGML_CUDA_NAME``, "ROCm" in a HIP build; ggml-vulkan ``GGML_VK_NAME``; ggml-sycl
    ``GGML_SYCL_NAME``; ggml-metal.cpp ``GGML_METAL_NAME`` "MTL")."""
    if backend in ("", "CUDA") or not device.startswith("CUDA"):
        return device
    return f"{'MTL' if backend == 'Metal' else backend}{device[4:] if index is None else index}"


def index_by_backend(gpus: Sequence[GpuSpec]) -> list[GpuSpec]:
    """``gpus`` with each non-CUDA local GPU's ``backend_index``: how many GPUs of its backend come
    before it, as each ggml backend numbers its own devices from 0 (an NVIDIA card and an AMD one
    are ``CUDA0`` and ``ROCm0``, not ``ROCm1``). CUDA cards keep their ``CUDA<i>`` slot name, the
    key every consumer plans on; RPC devices are unchanged."""
    seen: dict[str, int] = {}
    out = []
    for g in gpus:
        if g.endpoint is None and g.backend not in ("", "CUDA"):
            out.append(replace(g, backend_index=seen.get(g.backend, 0)))
            seen[g.backend] = seen.get(g.backend, 0) + 1
        else:
            out.append(g)
    return out


#: What-if presets offered by the GUI and ``--gpu-mem`` (decimal "GB" cards hold binary GiB).
GPU_PRESETS_BYTES: dict[str, int] = {
    "8 GB": 8 * GiB,
    "12 GB": 12 * GiB,
    "16 GB": 16 * GiB,
    "24 GB": 24 * GiB,
    "48 GB": 48 * GiB,
}


def what_if_gpu(total_bytes: int, index: int = 0) -> GpuSpec:
    """A generic GPU the user describes by its size (``--gpu-mem 12G``): no catalogue entry, so the
    speed model uses the catalogue card nearest in memory size for its rates."""
    return GpuSpec(name=f"what-if {total_bytes / GiB:g} GiB GPU", total_bytes=total_bytes, index=index, what_if=True)


#: The ggml backend a discrete card of each vendor is planned under (llama.cpp's build for it:
#: ggml-cuda, ggml-cuda compiled by HIP, ggml-sycl).
DISCRETE_BACKEND_BY_VENDOR: dict[str, str] = {"NVIDIA": "CUDA", "AMD": "ROCm", "Intel": "SYCL"}


def catalogue_gpu(name: str, index: int = 0) -> GpuSpec:
    """A what-if GPU that is a named card of :mod:`kvtuner.core.hardware.gpu_catalogue`
    (``--gpu "RTX 3090"``): its memory, bandwidth and PCIe link from the catalogue, driven by the
    backend llama.cpp builds for its vendor: CUDA on NVIDIA, ROCm (HIP) on AMD, SYCL on Intel, as
    for a card found in sysfs (:func:`kvtuner.core.hardware.vendors.sysfs_gpu_specs`).

    Raises:
        UnknownGpuError: the catalogue does not know ``name`` (the message lists what it knows).
    """
    from .gpu_catalogue import find_gpu

    g = find_gpu(name)
    if g.unified:
        return unified_gpu_spec(g, index=index)
    return GpuSpec(
        name=f"{g.name} (what-if)",
        total_bytes=g.vram_bytes,
        index=index,
        mem_bandwidth_bytes_s=g.mem_bandwidth_bytes_s,
        pcie_bandwidth_bytes_s=g.pcie_bandwidth_bytes_s,
        what_if=True,
        catalogue=g.name,
        backend=DISCRETE_BACKEND_BY_VENDOR.get(g.vendor, "CUDA"),
    )


#: RAM at or under which Metal's default working set is two thirds of RAM; above, three quarters.
#: llama.cpp logs Metal's ``recommendedMaxWorkingSetSize`` at start-up (ggml-metal-device.m):
#: 11453.25 MB on 16 GB Macs (2/3 of 16 GiB), 51539.61 MB on 64 GB Macs (3/4 of 64 GiB).
METAL_TWO_THIRDS_UP_TO_BYTES = 32 * GiB


def metal_working_set_bytes(ram_bytes: int, wired_limit_mb: int | None = None) -> int:
    """Metal's ``recommendedMaxWorkingSetSize`` for a Mac with ``ram_bytes`` of RAM: the GPU's
    share of the one pool, and the total llama.cpp reports for the Metal device.

    ``wired_limit_mb``: the ``iogpu.wired_limit_mb`` sysctl (macOS 14+; 0 or None: the default,
    2/3 of RAM up to :data:`METAL_TWO_THIRDS_UP_TO_BYTES`, 3/4 above).
    """
    if wired_limit_mb:
        return min(int(wired_limit_mb) * MiB, ram_bytes)
    if ram_bytes <= METAL_TWO_THIRDS_UP_TO_BYTES:
        return ram_bytes * 2 // 3
    return ram_bytes * 3 // 4


def unified_gpu_spec(
    model: GpuModel, index: int = 0, ram_bytes: int | None = None, wired_limit_mb: int | None = None
) -> GpuSpec:
    """A what-if unified-memory chip of the catalogue (``--gpu "M2 Max"``, ``--gpu "Strix Halo"``):
    ``ram_bytes`` (default the entry's memory) is the one pool; the GPU part is Metal's working
    set on Apple (:func:`metal_working_set_bytes`), on an AMD APU the same three-quarter share
    (amdgpu's GTT is sized by TTM's page limit, which Strix Halo guides raise to most of RAM)."""
    ram = ram_bytes or model.vram_bytes
    gpu = metal_working_set_bytes(ram, wired_limit_mb)
    backend = "Metal" if model.vendor == "Apple" else "Vulkan"
    return GpuSpec(
        name=f"{model.name} (what-if)",
        total_bytes=gpu,
        index=index,
        mem_bandwidth_bytes_s=model.mem_bandwidth_bytes_s,
        pcie_bandwidth_bytes_s=model.mem_bandwidth_bytes_s,
        what_if=True,
        catalogue=model.name,
        backend=backend,
        unified=True,
        ram_bytes=ram,
        source="catalogue",
    )
