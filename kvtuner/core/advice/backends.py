"""Advice where llama.cpp's backends differ from CUDA: Vulkan's per-allocation limit and unified
memory (Apple M-series under Metal, AMD APUs under Vulkan or ROCm).

Rules:

- ``vulkan-allocation-limit`` (error): on a Vulkan device one buffer is larger than the driver
  lets one allocation be. ggml-vulkan sub-allocates buffers in blocks of at most
  ``suballocation_block_size`` (1 GiB, capped by ``max_memory_allocation_size``;
  ggml/src/ggml-vulkan/ggml-vulkan.cpp ``ggml_vk_get_device`` and
  ``ggml_backend_vk_buffer_type_get_max_size``), and ggml-alloc splits a compute buffer into such
  chunks (ggml/src/ggml-alloc.c ``ggml_dyn_tallocr_new_chunk``), but one tensor larger than
  ``max_memory_allocation_size`` (``VkPhysicalDeviceMaintenance3Properties::maxMemoryAllocationSize``,
  4 GiB on the common drivers, lower on some) cannot be placed: llama.cpp stops with
  "Requested buffer size exceeds device memory allocation limit" although the card has room.
  The largest tensors are the attention scores without flash attention (``n_kv x n_ubatch x
  n_head`` f32, llama.cpp issue 15009: Qwen3-30B-A3B, flash attention off, 70K context on Strix
  Halo) and one layer's K or V cache. Fix: flash attention on, else a smaller ``n_ubatch``.
- ``unified-memory-pool`` (error when the plan does not fit the pool, else info): a unified GPU
  takes its buffers from the same RAM as the CPU; the GPU part may not exceed its limit (Metal's
  ``recommendedMaxWorkingSetSize``), and GPU plus host may not exceed the RAM. Nothing is counted
  twice: the plan's host figures and the GPU's are summed against the one pool.
- ``mixed-backends`` (warning): local cards that hold part of the plan need the CUDA and the ROCm
  backend in one llama-server: ggml-hip compiles ggml-cuda's sources
  (ggml/src/ggml-hip/CMakeLists.txt) and a build configured with both keeps one
  (ggml-org/llama.cpp#29048). A Vulkan build runs both vendors' cards, or one vendor's cards serve
  from an rpc-server of their own build. Cards of unknown vendor (``--gpu-mem``) do not count.

The limit is :data:`VULKAN_MAX_ALLOCATION_BYTES` unless ``GGML_VK_FORCE_MAX_ALLOCATION_SIZE`` is
set (the variable ggml-vulkan reads to override it), which kvtuner reads too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..hardware.specs import GpuSpec
from ..plan.config import ConfigError, PlanConfig
from ..plan.memory_plan import DevicePlan, MemoryPlan
from ..units import GiB, fmt_bytes
from .advisor import Advice, _adv

#: The per-allocation limit most Vulkan drivers report (``maxMemoryAllocationSize``, 4 GiB:
#: RADV, AMDVLK, NVIDIA, Intel ANV; llama.cpp issue 15009, where a maintainer notes some
#: drivers report 2 GiB or 1 GiB).
VULKAN_MAX_ALLOCATION_BYTES = 4 * GiB

#: The environment variable ggml-vulkan reads to override the limit (ggml-vulkan.cpp).
VK_FORCE_MAX_ALLOCATION_ENV = "GGML_VK_FORCE_MAX_ALLOCATION_SIZE"


def vulkan_max_allocation_bytes() -> int:
    """The Vulkan per-allocation limit kvtuner plans with: ``$GGML_VK_FORCE_MAX_ALLOCATION_SIZE``
    (bytes) when set to a number, else :data:`VULKAN_MAX_ALLOCATION_BYTES`."""
    text = os.environ.get(VK_FORCE_MAX_ALLOCATION_ENV, "").strip()
    try:
        value = int(text)
    except ValueError:
        return VULKAN_MAX_ALLOCATION_BYTES
    return value if value > 0 else VULKAN_MAX_ALLOCATION_BYTES


def largest_tensors(plan: MemoryPlan, device: str) -> list[tuple[int, str]]:
    """The largest single tensors ``plan`` puts on ``device``, bytes, largest first:
    ``(bytes, what)`` for the attention scores of the widest layer without flash attention
    (``cells x n_ubatch x n_head x 4``: llama-graph.cpp ``build_attn_mha``, ``kq`` f32) and the
    largest K and V cache tensor (one per layer, all streams: llama-kv-cache.cpp)."""
    m = plan.model
    out: list[tuple[int, str]] = []
    layer_dev = plan.layer_devices
    if not plan.flash_attn:
        best = (0, -1)
        for l in plan.kv_layers:
            runs_here = l.device == device or (l.il < len(layer_dev) and layer_dev[l.il] == device)
            if runs_here:
                n_head = m.n_head[l.il] if l.il < len(m.n_head) else max(m.n_head)
                best = max(best, (l.cells * plan.n_ubatch * int(n_head) * 4, l.il))
        if best[0]:
            out.append(
                (best[0], f"attention scores of layer {best[1]} (n_kv x n_ubatch x n_head f32, flash attention off)")
            )
    kv_here = [l for l in plan.kv_layers if l.device == device]
    if kv_here:
        k = max(kv_here, key=lambda l: l.k_bytes)
        v = max(kv_here, key=lambda l: l.v_bytes)
        out.append((k.k_bytes, f"K cache of layer {k.il}"))
        out.append((v.v_bytes, f"V cache of layer {v.il}"))
    return sorted(out, reverse=True)


def _valid(cfg: PlanConfig, fix: dict[str, object]) -> bool:
    try:
        cfg.with_(**fix)
    except (ConfigError, TypeError, ValueError):
        return False
    return True


def _vulkan(plan: MemoryPlan, gpu: GpuSpec, device: str) -> list[Advice]:
    limit = vulkan_max_allocation_bytes()
    big = [(b, what) for b, what in largest_tensors(plan, device) if b > limit]
    if not big:
        return []
    size, what = big[0]
    fix: dict[str, object] = {}
    if what.startswith("attention scores"):
        fix = {"flash_attn": "on"}
        if not _valid(plan.config, fix):
            per_token = size // max(plan.n_ubatch, 1)
            ub = 1
            while ub * 2 * per_token <= limit and ub * 2 <= plan.n_ubatch:
                ub *= 2
            fix = {"n_ubatch": ub, "n_batch": max(ub, plan.config.n_batch)} if ub < plan.n_ubatch else {}
    return [
        _adv(
            "vulkan-allocation-limit",
            "error",
            f"On {gpu.name if gpu.name.startswith(gpu.backend) else f'{device} ({gpu.name})'} the {what} needs one allocation of {fmt_bytes(size)}, over the Vulkan "
            f"driver's limit of {fmt_bytes(limit)}: llama.cpp stops with 'Requested buffer size exceeds device "
            "memory allocation limit' although the device has room.",
            "one tensor cannot span two Vulkan allocations; maxMemoryAllocationSize is 4 GiB on common drivers "
            f"(ggml-vulkan.cpp max_memory_allocation_size; {VK_FORCE_MAX_ALLOCATION_ENV} overrides it; llama.cpp issue 15009)",
            fix if fix and _valid(plan.config, fix) else {},
        )
    ]


def _unified(plan: MemoryPlan, gpus: Sequence[GpuSpec]) -> list[Advice]:
    uni = [(g, d) for g, d in _pairs(plan, gpus) if g.unified]
    if not uni:
        return []
    ram = max((g.ram_bytes or 0) for g, _ in uni) or (plan.host.capacity_bytes or 0)
    gpu_need = sum(d.total_bytes for _, d in uni)
    gpu_limit = sum(g.total_bytes for g, _ in uni)
    host_need = plan.host.committed_bytes + plan.host.mapped_bytes
    need = gpu_need + host_need
    names = ", ".join(g.name for g, _ in uni)
    reason = (
        "one memory pool: the GPU's buffers come out of the same RAM as the CPU's (Metal's total is "
        "recommendedMaxWorkingSetSize, ggml-metal-device.m ggml_metal_device_get_memory; an APU's VRAM and GTT are "
        "system RAM); GPU and host figures are summed once against it"
    )
    if gpu_need > gpu_limit or (ram and need > ram):
        over = (
            f"the GPU part {fmt_bytes(gpu_need)} is over its limit of {fmt_bytes(gpu_limit)}"
            if gpu_need > gpu_limit
            else f"GPU {fmt_bytes(gpu_need)} + host {fmt_bytes(host_need)} = {fmt_bytes(need)} is over the "
            f"{fmt_bytes(ram)} of RAM"
        )
        return [
            _adv(
                "unified-memory-pool",
                "error",
                f"{names} shares one {fmt_bytes(ram)} pool with the CPU: {over}.",
                reason,
                {},
            )
        ]
    return [
        _adv(
            "unified-memory-pool",
            "info",
            f"{names} shares one {fmt_bytes(ram)} pool with the CPU: GPU {fmt_bytes(gpu_need)} of its "
            f"{fmt_bytes(gpu_limit)} limit + host {fmt_bytes(host_need)} = {fmt_bytes(need)}.",
            reason,
            {},
        )
    ]


#: Backends one llama.cpp build does not run together: ggml-hip compiles ggml-cuda's sources
#: (ggml/src/ggml-hip/CMakeLists.txt), and a build configured with both GGML_CUDA and GGML_HIP
#: keeps one (ggml-org/llama.cpp#29048).
EXCLUSIVE_BACKENDS = frozenset({"CUDA", "ROCm"})


def _vendor_backend(g: GpuSpec) -> str | None:
    """The backend a local card needs, None for one of unknown vendor (``--gpu-mem``: no
    catalogue entry, planned with CUDA's defaults) or behind an rpc-server."""
    if g.endpoint is not None or (g.what_if and g.catalogue is None):
        return None
    return g.backend


def _mixed(plan: MemoryPlan, gpus: Sequence[GpuSpec]) -> list[Advice]:
    """``mixed-backends`` (warning): local cards holding part of the plan need CUDA and ROCm in one
    llama-server."""
    used = [
        (g, d)
        for g, d in _pairs(plan, gpus)
        if _vendor_backend(g) in EXCLUSIVE_BACKENDS and d.weights_bytes + d.kv_bytes + d.compute_bytes > 0
    ]
    if {_vendor_backend(g) for g, _ in used} != EXCLUSIVE_BACKENDS:
        return []
    names = [f"{d.backend_device} {d.name}" for _, d in used]
    cards = ", ".join(names[:-1]) + " and " + names[-1]
    return [
        _adv(
            "mixed-backends",
            "warning",
            f"{cards} need llama.cpp's CUDA and ROCm backends in one llama-server, and a build configured "
            "with both keeps only one. Run every card through a Vulkan build (Vulkan0, Vulkan1 ...; its "
            "speed differs from this plan's), or serve one vendor's cards from an rpc-server of their own "
            "build on this machine (a ROCm build's rpc-server -p 50052, and --rpc 127.0.0.1:50052 on the "
            "CUDA build's llama-server).",
            "ggml/src/ggml-hip/CMakeLists.txt builds the ROCm backend from ggml-cuda's sources; a build "
            "configured with GGML_CUDA and GGML_HIP exposes only one of them (ggml-org/llama.cpp#29048)",
            {},
        )
    ]


def _pairs(plan: MemoryPlan, gpus: Sequence[GpuSpec]) -> list[tuple[GpuSpec, DevicePlan]]:
    """(GpuSpec, its DevicePlan) matched by llama.cpp device name."""
    by_device = {g.device: g for g in gpus}
    return [(by_device[d.device], d) for d in plan.gpus if d.device in by_device]


def advise_backends(plan: MemoryPlan, gpus: Sequence[GpuSpec]) -> list[Advice]:
    """The backend rules (module docstring) for ``plan``, made for ``gpus`` (the GpuSpecs it was
    planned on); empty for CUDA-only plans."""
    out: list[Advice] = []
    for g, d in _pairs(plan, gpus):
        if g.backend == "Vulkan":
            out.extend(_vulkan(plan, g, d.device))
    out.extend(_unified(plan, gpus))
    out.extend(_mixed(plan, gpus))
    return out
