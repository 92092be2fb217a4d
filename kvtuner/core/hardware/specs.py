"""What the plan is laid out on: GPUs (detected or what-if) and the host.

Detection lives in :mod:`kvtuner.core.hardware.nvml` and :mod:`kvtuner.core.hardware.host`; these are plain values.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import GiB


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
        backend: the ggml backend that drives it: ``"CUDA"`` (NVML-detected cards and what-if
            cards), ``"ROCm"``, ``"Vulkan"``, ``"Metal"``, ``"SYCL"`` (from sysfs, an engine's
            ``--list-devices`` or a catalogue chip). Backend rules (:mod:`kvtuner.core.plan.backend_rules`)
            key on it; the plan's device names stay ``CUDA<i>``-style indices.
        unified: the GPU shares one memory pool with the CPU (Apple M-series, AMD APUs):
            ``total_bytes`` is the part the GPU may use, taken from the same RAM as the host's.
        ram_bytes: the machine's RAM behind a unified GPU (None otherwise).
        source: where ``total_bytes`` / ``free_bytes`` were read (``"nvml"``, ``"sysfs"``,
            ``"llama-server --list-devices"``, ``"catalogue"``; "" for what-if cards).
        flags: contradictions found in the reading (:func:`kvtuner.core.hardware.vendors.check_reading`).
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

    @property
    def device(self) -> str:
        """llama.cpp's device name: ``CUDA0``, or ``RPC0[host:port]`` for a device of an
        ``rpc-server`` (ggml/src/ggml-rpc/ggml-rpc.cpp ``ggml_backend_rpc_add_server``:
        ``"RPC" + device + "[" + endpoint + "]"``), the name its buffers are logged under."""
        if self.endpoint is not None:
            return f"RPC{self.index}[{self.endpoint}]"
        return f"CUDA{self.index}"

    @property
    def kind(self) -> str:
        """``"rpc"`` for a device behind an ``rpc-server``, else ``"gpu"``."""
        return "rpc" if self.endpoint is not None else "gpu"


@dataclass(frozen=True)
class HostSpec:
    """The host: RAM capacity and availability in bytes, swap in bytes, and the CPU's
    instruction sets llama.cpp's CPU backend checks (``cpu_features``: ``avx2``, ``avx512``,
    ``neon``, ``dotprod``, ``i8mm``; None when unknown), which decide the ``CPU_REPACK`` copy."""

    total_bytes: int
    available_bytes: int | None = None
    swap_total_bytes: int = 0
    mem_bandwidth_bytes_s: float | None = None
    cpu_features: frozenset[str] | None = None


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


def catalogue_gpu(name: str, index: int = 0) -> GpuSpec:
    """A what-if GPU that is a named card of :mod:`kvtuner.core.hardware.gpu_catalogue`
    (``--gpu "RTX 3090"``): its memory, bandwidth and PCIe link from the catalogue.

    Raises:
        UnknownGpuError: the catalogue does not know ``name`` (the message lists what it knows).
    """
    from .gpu_catalogue import find_gpu

    g = find_gpu(name)
    if g.unified:
        from .vendors import unified_gpu_spec

        return unified_gpu_spec(g, index=index)
    return GpuSpec(name=f"{g.name} (what-if)", total_bytes=g.vram_bytes, index=index,
                   mem_bandwidth_bytes_s=g.mem_bandwidth_bytes_s, pcie_bandwidth_bytes_s=g.pcie_bandwidth_bytes_s,
                   what_if=True, catalogue=g.name)
