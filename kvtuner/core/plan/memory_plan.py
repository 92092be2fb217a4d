"""Memory planner: where every byte of a llama.cpp run goes, per device.

:func:`plan_memory` follows the rules of the llama.cpp vendored by llama-cpp-python 0.3.36:

- Layer placement (src/llama-model.cpp ``load_tensors``): ``i_gpu_start = max(n_layer + 1 -
  n_gpu_layers, 0)``; layers ``il >= i_gpu_start`` go to the GPUs, split by free memory
  (``upper_bound`` over cumulative fractions); the output layer is "layer n_layer" and is
  offloaded only when ``n_gpu_layers > n_layer``; the input embedding stays on the host.
  With no GPU, nothing is offloaded (``act_gpu_layers = devices.empty() ? 0 : ...``).
- Context sizes (src/llama-context.cpp constructor): ``n_ctx = GGML_PAD(n_ctx, 256)``; with a
  non-unified cache ``n_ctx_seq = GGML_PAD(n_ctx / n_seq, 256)`` and ``n_seq`` streams.
- KV cache (src/llama-kv-cache.cpp constructor): per layer with KV,
  ``K = row_size(type_k, n_embd_k_gqa(il)) * kv_size * n_stream`` and likewise V, where V is
  sized by ``n_embd_v_gqa_max`` when V is transposed (flash attention off); MLA layers keep K only.
  The KV of a layer lives on the layer's device when ``offload_kqv``, else on the host.
- Sliding window (src/llama-kv-cache-iswa.cpp): SWA layers get
  ``GGML_PAD(min(kv_size, n_swa * (unified ? n_seq : 1) + n_ubatch), 256)`` cells unless swa_full.
- Output buffer (llama-context.cpp ``output_reserve``): ``n_vocab * max(1, n_seq) * 4`` bytes, host.
- Compute buffers: :mod:`kvtuner.core.plan.compute_buffer` (estimate, or exact from a dry-run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..hardware.specs import GpuSpec, HostSpec, backend_device_name, index_by_backend
from ..model.ggml_types import GgmlType, kv_type, row_size
from ..model.profile import ModelProfile
from ..units import MiB
from .buffers import HOST
from .build_rules import VENDORED, BuildRules
from .compute_buffer import ComputeEstimate, estimate_compute
from .config import ALL_LAYERS, ConfigError, PlanConfig
from .context_checks import check_context
from .kv_cache import KvCacheSummary, LayerKV
from .llama_constants import OFFLOAD_MIN_BATCH, output_buffer_bytes, pad_ctx
from .overrides import TensorMoves, apply_overrides
from .placement import DeviceSplit, LayerPlacement, device_layer_split, placement_for, split_devices, tensor_overrides
from .repack import repack_bytes

#: Memory per GPU that no llama.cpp buffer reports (CUDA context, cuBLAS workspace, graphs):
#: measured on an H200 (driver 580, CUDA 13.0) with cudaMemGetInfo as 527 MiB after the context
#: is created and 609 MiB once a 512-token batch and one token have run
#: (benchmarks/gpu_truth/results/2026-11-30-h200.md, "Per-process overhead"); consumer cards with
#: fewer multiprocessors need somewhat less, so this errs on the safe side for them.
DEFAULT_GPU_OVERHEAD_BYTES = 610 * MiB
#: Host memory of the process itself: Python, llama.cpp and ggml libraries (measured RSS of an
#: idle runner child before loading a model, see benchmarks/).
DEFAULT_HOST_OVERHEAD_BYTES = 160 * MiB


#: llama.cpp prints MiB with two decimals: a printed figure is exact to +-0.005 MiB.
PRINT_TOLERANCE_BYTES = int(0.0051 * MiB)


@dataclass(frozen=True)
class ExactFigures:
    """What llama.cpp itself reported for a configuration (a dry run), in bytes; the plan takes
    these over its own arithmetic wherever they differ by more than the print's rounding.

    Attributes:
        kv: one ``(cells, layers, k_bytes, v_bytes)`` per attention cache with layers, in
            llama.cpp's log order (full, then sliding-window/chunked), or None.
        recurrent: ``(cells, r_bytes, s_bytes)`` of the recurrent state, or None.
        compute: compute buffer bytes per device (``CPU``, ``CUDA0``), or None.
        output: output buffer bytes per device, or None.
    """

    kv: tuple[tuple[int, int, int, int], ...] | None = None
    recurrent: tuple[int, int, int] | None = None
    compute: dict[str, int] | None = None
    output: dict[str, int] | None = None


@dataclass(frozen=True)
class DevicePlan:
    """Memory of one device (a GPU or the host), bytes.

    ``capacity_bytes`` is the GPU's total memory or the host's RAM (None when unknown);
    ``free_bytes`` is what was free when measured (None for what-if GPUs).
    ``kind`` is ``gpu`` (local), ``rpc`` (a device of an ``rpc-server`` at ``endpoint``,
    ``host:port``) or ``host``.
    ``n_layers`` counts repeating layers whose weights live here; ``has_output`` the output layer.
    ``weights_mapped`` marks host weights that are memory-mapped from the file (page cache).
    ``expert_bytes`` are the MoE expert tensors among ``weights_bytes`` (``expert_layers``: the
    layers whose experts are here), moved by ``--n-cpu-moe`` / ``--cpu-moe`` / ``-ot`` or not.
    ``repack_bytes`` is the host's ``CPU_REPACK`` copy of repackable quantized weights
    (:mod:`kvtuner.core.plan.repack`): committed memory on top of the mapped file pages.
    ``extras_bytes`` is what a projector, a draft model and LoRA adapters add here
    (:func:`kvtuner.core.plan.extras.with_extras`; 0 without them).
    ``backend_index`` is a non-CUDA GPU's index among its backend's devices (``ROCm0`` beside
    ``CUDA0``; :func:`~kvtuner.core.hardware.specs.index_by_backend`), None: the slot's.

    As the OS sees the host: :attr:`mapped_bytes` are file pages (reclaimable page cache, read
    again from disk when evicted), :attr:`committed_bytes` everything else (anonymous memory
    that only swap can take); :attr:`total_bytes` is their sum, the peak RSS of the run.
    """

    device: str
    kind: str  # "gpu" | "rpc" | "host"
    name: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    capacity_bytes: int | None
    free_bytes: int | None = None
    n_layers: int = 0
    has_output: bool = False
    weights_mapped: bool = False
    repack_bytes: int = 0
    endpoint: str | None = None
    expert_bytes: int = 0
    expert_layers: int = 0
    extras_bytes: int = 0
    backend: str = ""
    unified: bool = False
    source: str = ""
    flags: tuple[str, ...] = ()
    backend_index: int | None = None

    @property
    def backend_device(self) -> str:
        """The device as its own backend names it: ``device`` for CUDA, RPC and the host;
        ``ROCm0``, ``Vulkan0``, ``MTL0`` for a GPU of another backend (ggml-metal.cpp
        ``GGML_METAL_NAME "MTL"``; ggml-vulkan.cpp ``GGML_VK_NAME``; the plan's ``device`` keeps
        the ``CUDA<i>`` slot name every consumer keys on)."""
        return self.device if self.kind != "gpu" else backend_device_name(self.backend, self.device, self.backend_index)

    @property
    def total_bytes(self) -> int:
        """weights + repacked copy + KV + compute + output + overhead + extras (projector, draft
        model, LoRA: :mod:`kvtuner.core.plan.extras`)."""
        return (
            self.weights_bytes
            + self.repack_bytes
            + self.kv_bytes
            + self.compute_bytes
            + self.output_bytes
            + self.overhead_bytes
            + self.extras_bytes
        )

    @property
    def mapped_bytes(self) -> int:
        """Memory-mapped file pages (reclaimable): the weights when mapped, else 0."""
        return self.weights_bytes if self.weights_mapped else 0

    @property
    def committed_bytes(self) -> int:
        """Committed (anonymous) memory: everything but the mapped file pages."""
        return self.total_bytes - self.mapped_bytes

    @property
    def headroom_bytes(self) -> int | None:
        """capacity - total (negative: does not fit), None when capacity is unknown."""
        return None if self.capacity_bytes is None else self.capacity_bytes - self.total_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (schema: docs/reference/plan-json.md)."""
        return {
            "device": self.device,
            "kind": self.kind,
            "name": self.name,
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "compute_bytes": self.compute_bytes,
            "output_bytes": self.output_bytes,
            "overhead_bytes": self.overhead_bytes,
            "total_bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
            "free_bytes": self.free_bytes,
            "n_layers": self.n_layers,
            "has_output": self.has_output,
            "weights_mapped": self.weights_mapped,
            "repack_bytes": self.repack_bytes,
            "endpoint": self.endpoint,
            "expert_bytes": self.expert_bytes,
            "expert_layers": self.expert_layers,
            "backend": self.backend,
            "backend_device": self.backend_device,
            "unified": self.unified,
            "source": self.source,
            "flags": list(self.flags),
            "mapped_bytes": self.mapped_bytes,
            "committed_bytes": self.committed_bytes,
            "extras_bytes": self.extras_bytes,
        }


@dataclass(frozen=True)
class MemoryPlan:
    """The result of :func:`plan_memory`.

    Attributes:
        model: the profile planned.
        config: the configuration as given.
        n_ctx: context after llama.cpp's padding (all sequences).
        n_ctx_seq: cells per stream of full-attention layers.
        n_stream: KV streams (n_seq, or 1 when unified).
        n_ubatch: effective physical batch (``min(n_batch, n_ubatch)``, ``n_batch <= n_ctx``).
        flash_attn: whether KV is laid out for flash attention (``on`` or ``auto``).
        n_gpu_layers: effective offloaded layers, output layer included (0 without a GPU).
        n_gpu_repeating: repeating layers offloaded.
        output_on_gpu: whether the output layer is offloaded.
        kv_gpu_layers: offloaded repeating layers that keep their KV in VRAM.
        devices: offload devices in llama.cpp's order (RPC servers' devices, then CUDA0,
            CUDA1 ...), then the host.
        kv_layers: per-layer KV (layers with KV only).
        kv_caches: llama.cpp's KV caches (one, or "full" + "swa").
        compute: the compute-buffer estimate per device, with its source.
        layer_devices: device of each repeating layer's weights, ``n_layer`` entries, then the
            output layer's (``"CPU"`` or ``"CUDA0"`` ...); the one per-layer placement every
            consumer (speed model, exporters, views) reads.
        placement: what llama.cpp is given to get this layout (``n_gpu_layers``,
            ``offload_kqv``, tensor overrides), from :func:`kvtuner.core.plan.placement.placement_for`;
            None for a CPU-only plan.
        warnings: notes the user should read (approximations, ignored settings).
        verified: llama.cpp's own figures (a dry run of this configuration) are in the plan.
        split: the ``-sm`` / ``-ts`` / ``-mg`` planned with.
        moves: the tensors ``--n-cpu-moe`` / ``--cpu-moe`` / ``-ot`` send away from their
            layer's device, tensor by tensor from the tensor table (:mod:`.overrides`).
        extras: the projector / draft / LoRA planned beside the model
            (:class:`~kvtuner.core.plan.extras.ExtrasPlan`, counted in each device's
            ``extras_bytes``), None without them.
        rules: the llama.cpp build and program the compute buffers follow (:mod:`.build_rules`).
    """

    model: ModelProfile
    config: PlanConfig
    n_ctx: int
    n_ctx_seq: int
    n_stream: int
    n_ubatch: int
    flash_attn: bool
    n_gpu_layers: int
    n_gpu_repeating: int
    output_on_gpu: bool
    kv_gpu_layers: int
    devices: tuple[DevicePlan, ...]
    kv_layers: tuple[LayerKV, ...]
    kv_caches: tuple[KvCacheSummary, ...]
    compute: ComputeEstimate
    layer_devices: tuple[str, ...] = ()
    placement: LayerPlacement | None = None
    warnings: tuple[str, ...] = field(default=())
    verified: bool = False
    split: DeviceSplit | None = None
    moves: TensorMoves = field(default_factory=TensorMoves)
    rules: BuildRules = VENDORED
    extras: Any = None

    @property
    def kv_bytes(self) -> int:
        """All KV cache bytes (every layer, every stream)."""
        return sum(c.kv_bytes for c in self.kv_caches)

    @property
    def weights_bytes(self) -> int:
        """Weight bytes over all devices (a tied output matrix offloaded counts twice, as in llama.cpp)."""
        return sum(d.weights_bytes for d in self.devices)

    @property
    def gpus(self) -> tuple[DevicePlan, ...]:
        """Offload devices of :attr:`devices` (local GPUs and RPC devices, llama.cpp's order)."""
        return tuple(d for d in self.devices if d.kind != "host")

    @property
    def host(self) -> DevicePlan:
        """The host entry of :attr:`devices`."""
        return self.devices[-1]

    def kv_bytes_per_token(self) -> int:
        """KV bytes added per token of context for one sequence, full-attention layers only
        (SWA layers stop growing at their window)."""
        return sum(c.bytes_per_cell for c in self.kv_caches if c.kind == "full")

    def to_dict(self) -> dict[str, Any]:
        """The stable ``kvtuner plan --json`` schema (docs/reference/plan-json.md)."""
        return {
            "model": {
                "path": str(self.model.path),
                "name": self.model.name,
                "architecture": self.model.architecture,
                "file_type": self.model.file_type,
                "n_layer": self.model.n_layer,
                "n_ctx_train": self.model.n_ctx_train,
                "file_bytes": self.model.file_bytes,
            },
            "config": self.config.to_dict(),
            "effective": {
                "n_ctx": self.n_ctx,
                "n_ctx_seq": self.n_ctx_seq,
                "n_stream": self.n_stream,
                "n_ubatch": self.n_ubatch,
                "flash_attn": self.flash_attn,
                "n_gpu_layers": self.n_gpu_layers,
                "n_gpu_repeating": self.n_gpu_repeating,
                "output_on_gpu": self.output_on_gpu,
                "kv_gpu_layers": self.kv_gpu_layers,
            },
            "kv_bytes": self.kv_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token(),
            "weights_bytes": self.weights_bytes,
            "kv_caches": [
                {
                    "kind": c.kind,
                    "cells": c.cells,
                    "layers": c.layers,
                    "n_seq": c.n_seq,
                    "n_stream": c.n_stream,
                    "type_k": c.type_k,
                    "type_v": c.type_v,
                    "k_bytes": c.k_bytes,
                    "v_bytes": c.v_bytes,
                    "kv_bytes": c.kv_bytes,
                }
                for c in self.kv_caches
            ],
            "kv_layers": [
                {
                    "il": l.il,
                    "device": l.device,
                    "swa": l.swa,
                    "cells": l.cells,
                    "k_bytes": l.k_bytes,
                    "v_bytes": l.v_bytes,
                }
                for l in self.kv_layers
            ],
            "structure": {
                "source": self.model.structure.source,
                "summary": self.model.structure.summary(),
                "memory": self.model.structure.memory,
                "llama_build": self.model.structure.llama_build,
                "note": self.model.structure.note,
            },
            "figures_source": "llama.cpp dry-run" if self.verified else "kvtuner",
            "compute_source": self.compute.source,
            "rules": self.rules.to_dict(),
            "compute_estimate_bytes": {d: self.compute.estimate_on(d) for d in [*(g.device for g in self.gpus), HOST]},
            "devices": [d.to_dict() for d in self.devices],
            "split": None
            if self.split is None
            else {
                "split_mode": self.split.split_mode,
                "tensor_split": list(self.split.tensor_split) if self.split.tensor_split else None,
                "main_gpu": self.split.main_gpu,
            },
            "warnings": list(self.warnings),
            "tensor_overrides": [
                {"pattern": p, "buffer": b} for p, b in (self.placement.tensor_overrides if self.placement else ())
            ],
            "moved_tensors": [{"name": n, "from": a, "to": b, "bytes": nb} for n, a, b, nb in self.moves.moved],
        }


def order_devices(gpus: Sequence[GpuSpec]) -> list[GpuSpec]:
    """The devices in llama.cpp's order (src/llama.cpp ``llama_prepare_model_devices``: "add RPC
    servers at the front of the list to minimize network transfers", in ``--rpc`` order, then the
    local GPUs); ``-ts`` and ``-mg`` index this order. Each local GPU of a backend other than CUDA
    gets its index among that backend's devices (:func:`~kvtuner.core.hardware.specs.index_by_backend`)."""
    return index_by_backend([g for g in gpus if g.kind == "rpc"] + [g for g in gpus if g.kind != "rpc"])


def _layer_devices(
    n_layer: int, n_gpu_layers: int, gpus: Sequence[GpuSpec], split: DeviceSplit
) -> tuple[list[str], list[GpuSpec]]:
    """Device of layers 0..n_layer (index n_layer is the output layer) and the devices llama.cpp
    keeps, by the rules of :func:`kvtuner.core.plan.placement.device_layer_split` (``gpus`` already
    in :func:`order_devices` order)."""
    kept = [gpus[i] for i in split_devices(len(gpus), split)]
    if not kept:
        return [HOST] * (n_layer + 1), kept
    ts = split.tensor_split
    if ts is not None and split.split_mode != "none":
        shares = [ts[i] for i in split_devices(len(gpus), split)]
    elif ts is not None:
        shares = [ts[0]]  # -sm none: llama.cpp reads tensor_split[0] for its one device
    else:
        shares = []
    if not shares or not any(shares):
        # default split: each device's free memory (ggml_backend_dev_memory); total for what-ifs
        shares = [float(g.free_bytes if g.free_bytes is not None else g.total_bytes) for g in kept]
    idx = device_layer_split(n_layer, n_gpu_layers, shares)
    return [HOST if i is None else kept[i].device for i in idx], kept


def mmap_in_effect(use_mmap: bool, gpus: Sequence[GpuSpec]) -> bool:
    """Whether llama.cpp memory-maps the model: ``use_mmap`` (kvtuner's default, llama.cpp's
    ``--load-mode auto``) unless a device cannot map, which llama.cpp then loads the file for
    without mmap (src/llama-model.cpp ``load_tensors``: ``props.caps.mmap_support``). Integrated
    GPUs cannot: ggml-vulkan reports ``!is_integrated_gpu``, ggml-cuda (and HIP) ``props->type !=
    GGML_BACKEND_DEVICE_TYPE_IGPU``; Metal maps (ggml-metal.cpp). So a unified GPU of any backend
    but Metal turns mmap off."""
    return use_mmap and not any(g.unified and g.backend != "Metal" for g in gpus if g.endpoint is None)


def plan_memory(
    model: ModelProfile,
    config: PlanConfig,
    gpus: Sequence[GpuSpec] = (),
    host: HostSpec | None = None,
    *,
    gpu_overhead_bytes: int = DEFAULT_GPU_OVERHEAD_BYTES,
    host_overhead_bytes: int = DEFAULT_HOST_OVERHEAD_BYTES,
    compute_override: dict[str, int] | None = None,
    exact: ExactFigures | None = None,
    split: DeviceSplit | None = None,
    rules: BuildRules = VENDORED,
) -> MemoryPlan:
    """Plan where llama.cpp will put every byte for ``config`` on ``gpus`` and ``host``.

    The steps, in llama.cpp's order: the layers' devices (:func:`_place_layers`), the context
    sizes (:func:`_context_sizes`), the KV cache per layer (:func:`_kv_layers`) and per cache
    (:func:`_kv_caches`), the recurrent state (:func:`_recurrent_state`), the compute buffers
    (:func:`_compute_buffers`), then each device's total (:func:`_gpu_plans`, :func:`_host_plan`).

    Args:
        model: the model profile.
        config: the configuration.
        gpus: GPUs (detected or what-if); empty means a CPU-only run.
        host: host RAM; None leaves the host capacity unknown.
        gpu_overhead_bytes: driver/CUDA context per GPU.
        host_overhead_bytes: process baseline on the host.
        compute_override: exact compute buffer bytes per device (from a dry-run); replaces
            the estimate for those devices.
        exact: llama.cpp's figures for this configuration (:class:`ExactFigures`): every KV
            cache, the recurrent state, compute and output per device replace the plan's own
            where they differ by more than the print's rounding, and the plan is ``verified``.
        split: ``-sm`` / ``-ts`` / ``-mg`` (:class:`~kvtuner.core.plan.placement.DeviceSplit`);
            None is llama.cpp's default (layer split by free memory). ``gpus`` may hold RPC
            devices (``GpuSpec.endpoint``); the plan orders them first, as llama.cpp does.
        rules: the llama.cpp build and program planned for (:mod:`.build_rules`; default: the
            build llama-cpp-python vendors, as the embedded engine runs it).

    Returns:
        The :class:`MemoryPlan`; pure arithmetic, well under a millisecond for 100 layers.

    Raises:
        ConfigError: the configuration cannot work with this model (says what to change).
    """
    cfg = config
    split = split or DeviceSplit()
    gpus = order_devices(gpus)
    tk, tv = kv_type(cfg.type_k), kv_type(cfg.type_v)
    warnings: list[str] = list(model.warnings)

    layout = _place_layers(model, cfg, gpus, split, warnings)
    ctx = _context_sizes(model, cfg, exact, warnings)
    layers, swa_cells = _kv_layers(model, cfg, ctx, layout, tk, tv)
    if exact is not None and exact.kv is not None:
        layers = _apply_exact_kv(layers, exact.kv, warnings)
    caches = _kv_caches(model, cfg, ctx, layers, tk, tv)
    recurrent_by_device, recurrent_cache = _recurrent_state(model, cfg, layout, exact, warnings)
    if recurrent_cache is not None:
        caches.append(recurrent_cache)
    compute = _compute_buffers(
        model, cfg, ctx, layout, layers, swa_cells, gpus, tk, tv, compute_override, exact, rules, warnings
    )
    output_bytes, output_exact = _output_bytes(model, cfg, exact)
    devices = _gpu_plans(
        model, gpus, layout, layers, recurrent_by_device, compute, output_exact, gpu_overhead_bytes
    ) + [
        _host_plan(
            model, cfg, gpus, host, layout, layers, recurrent_by_device, compute, output_bytes, host_overhead_bytes
        )
    ]

    return MemoryPlan(
        model=model,
        config=cfg,
        **asdict(ctx),
        n_gpu_layers=layout.n_gpu_layers,
        n_gpu_repeating=layout.n_gpu_repeating,
        output_on_gpu=layout.output_on_gpu,
        kv_gpu_layers=len(layout.kv_on_gpu) if layout.offload_kqv else 0,
        devices=tuple(devices),
        kv_layers=tuple(layers),
        kv_caches=tuple(caches),
        compute=compute,
        layer_devices=tuple(layout.devs),
        placement=layout.placement,
        warnings=tuple(warnings),
        verified=exact is not None,
        split=split,
        moves=layout.moves,
        rules=rules,
    )


@dataclass(frozen=True)
class _Layout:
    """Where a plan's layers, their KV and the overridden tensors go (:func:`_place_layers`).

    Attributes:
        n_gpu_layers: effective ``-ngl`` (output layer included; 0 without a GPU).
        devs: device of layers ``0..n_layer`` (index ``n_layer``: the output layer).
        kept: the GPUs llama.cpp keeps (``-sm none`` keeps one).
        n_gpu_repeating: repeating layers offloaded.
        output_on_gpu: whether the output layer is offloaded.
        placement: the placement llama.cpp is given (None without a GPU).
        offload_kqv: KV on the layers' devices (llama.cpp's ``offload_kqv``).
        kv_on_gpu: repeating layers whose KV is in VRAM when ``offload_kqv``.
        moves: what ``-ot`` / ``--n-cpu-moe`` / ``--cpu-moe`` move (:mod:`.overrides`).
    """

    n_gpu_layers: int
    devs: list[str]
    kept: list[GpuSpec]
    n_gpu_repeating: int
    output_on_gpu: bool
    placement: LayerPlacement | None
    offload_kqv: bool
    kv_on_gpu: set[int]
    moves: TensorMoves


def _effective_ngl(n_layer: int, cfg: PlanConfig, gpus: Sequence[GpuSpec], warnings: list[str]) -> int:
    """``-ngl`` as llama.cpp applies it: clamped to ``n_layer + 1`` (``act_gpu_layers =
    min(n_gpu_layers, n_layer + 1)``), 0 without a GPU (``devices.empty() ? 0 : ...``)."""
    ngl = n_layer + 1 if cfg.n_gpu_layers == ALL_LAYERS else cfg.n_gpu_layers
    if ngl > n_layer + 1:
        # llama.cpp clamps (act_gpu_layers = min(n_gpu_layers, n_layer + 1)): -ngl 99 means "all"
        warnings.append(
            f"-ngl {ngl} is more than the {n_layer} layers + output layer: llama.cpp offloads all {n_layer + 1}"
        )
        ngl = n_layer + 1
    if gpus:
        return ngl
    if ngl > 0 and cfg.n_gpu_layers != ALL_LAYERS:
        warnings.append(
            "no GPU: n_gpu_layers is accepted but every layer stays on the CPU (give --gpu-mem to plan a what-if GPU)"
        )
    return 0


def _place_layers(
    model: ModelProfile, cfg: PlanConfig, gpus: list[GpuSpec], split: DeviceSplit, warnings: list[str]
) -> _Layout:
    """Layer placement (src/llama-model.cpp ``load_tensors``), which layers keep KV in VRAM
    (:func:`~kvtuner.core.plan.placement.placement_for`) and the tensor overrides, with their
    warnings; ``gpus`` in :func:`order_devices` order.

    Raises:
        ConfigError: ``--kv-gpu-layers`` asks for a GPU and none is planned for.
    """
    n_layer = model.n_layer
    ngl_eff = _effective_ngl(n_layer, cfg, gpus, warnings)
    devs, kept = _layer_devices(n_layer, ngl_eff, gpus, split)
    if split.split_mode == "row" and len(kept) > 1:
        warnings.append(
            "-sm row: planned as -sm layer (layers, their KV and the output layer per device by -ts); "
            "llama.cpp also splits each matrix by rows over the CUDA devices and keeps intermediate results "
            "(and, per its -mg help, KV) on -mg: not modelled"
        )
    n_gpu_repeating = sum(1 for d in devs[:n_layer] if d != HOST)

    placement = None
    if cfg.kv_gpu_layers is not None and cfg.kv_gpu_layers > n_gpu_repeating and not gpus:
        raise ConfigError(
            f"--kv-gpu-layers {cfg.kv_gpu_layers} needs a GPU and none is planned for: "
            "leave it out for a CPU-only plan, or plan a what-if card with --gpu-mem 12G"
        )
    if gpus:
        # the one placement rule (plan/placement.py): which layers keep KV in VRAM, and what
        # llama.cpp is given to get there
        placement = placement_for(cfg.with_(n_gpu_layers=ngl_eff), n_layer, (kept or gpus)[0].device)
        kv_gpu, offload_kqv = placement.kv_gpu_layers, placement.offload_kqv
        if placement.experimental:
            warnings.append(
                "KV of only some offloaded layers on the GPU uses tensor overrides (-ot): memory layout checked on a GPU (weights and KV per device as planned: docs/accuracy/gpu.md); its speed is predicted too high"
            )
    else:
        kv_gpu, offload_kqv = 0, cfg.kv_gpu_layers is None
    if (
        len(kept) > 1
        and ngl_eff > n_layer
        and split.split_mode == "layer"
        and offload_kqv
        and not (placement is not None and placement.override_layers)
        and not tensor_overrides(cfg)
    ):
        # llama-context.cpp constructor: pipeline_parallel (n_devices > 1, all layers offloaded,
        # layer split, offload_kqv, no tensor overrides; every device async + events)
        warnings.append(
            "several devices, every layer offloaded: llama.cpp enables pipeline parallelism, whose compute "
            "buffers hold several copies of each split's inputs; the compute figures here are a one-copy "
            "estimate (llama.cpp's log of a real run gives the figures)"
        )
    # tensor overrides (-ot, --cpu-moe, --n-cpu-moe): tensor by tensor from the tensor table
    ot = tensor_overrides(cfg)
    # an override may name a GPU as its backend does (ROCm0) or by the planner's slot (CUDA0)
    names = {n: g.device for g in gpus for n in (g.device, g.backend_device)}
    moves = apply_overrides(model, devs, ot, names, HOST)
    if ot and not gpus:
        warnings.append(
            "no GPU: tensor overrides (--n-cpu-moe, --cpu-moe, -ot) change nothing on a CPU-only run "
            "(every weight is in host memory already)"
        )
    elif ot and not moves.moved:
        warnings.append("the tensor overrides match no tensor this plan would move")
    # KV in VRAM for the last kv_gpu repeating layers: llama.cpp's -ngl range; the offloaded
    # layers before them got their weights moved by tensor override and keep KV on the host
    kv_on_gpu = set(range(n_layer - kv_gpu, n_layer)) if kv_gpu else set()
    return _Layout(
        ngl_eff, devs, kept, n_gpu_repeating, devs[n_layer] != HOST, placement, offload_kqv, kv_on_gpu, moves
    )


@dataclass(frozen=True)
class _Context:
    """The context as llama.cpp sets it up (:func:`_context_sizes`): ``flash_attn`` after forced
    changes, ``n_ctx`` padded (all streams), ``n_ctx_seq`` cells per stream, ``n_stream``
    streams and the effective ``n_ubatch`` (the :class:`MemoryPlan` fields of those names)."""

    flash_attn: bool
    n_ctx: int
    n_ctx_seq: int
    n_stream: int
    n_ubatch: int


def _context_sizes(model: ModelProfile, cfg: PlanConfig, exact: ExactFigures | None, warnings: list[str]) -> _Context:
    """Flash attention, context and batch sizes as the context constructor sets them
    (src/llama-context.cpp), after :func:`~kvtuner.core.plan.context_checks.check_context`.

    Raises:
        ConfigError: what ``llama_init_from_model`` would refuse.
    """
    flash_attn = cfg.flash_attn != "off"
    if flash_attn and model.architecture == "grok":
        # llama-context.cpp llama_init_from_model: "flash_attn is not compatible with Grok - forcing off"
        warnings.append("grok: llama.cpp turns flash attention off for this architecture")
        flash_attn = False
    check_context(model, cfg, flash_attn)
    n_ctx = pad_ctx(cfg.n_ctx)
    if cfg.kv_unified:
        n_stream, n_ctx_seq = 1, n_ctx
    else:
        n_stream = cfg.n_seq
        n_ctx_seq = pad_ctx(n_ctx // cfg.n_seq)
        if n_ctx_seq == 0:  # pragma: no cover - the padding of a positive number is positive
            raise ConfigError("n_ctx / n_seq rounds to 0: raise --ctx or lower --parallel")
        n_ctx = n_ctx_seq * cfg.n_seq
    # llama-context.cpp: n_batch = min(n_ctx, n_batch) with the context as asked, before it is padded
    n_batch = min(cfg.n_ctx, cfg.n_batch)
    n_ubatch = min(n_batch, cfg.n_ubatch)
    if model.n_ctx_train and n_ctx_seq > model.n_ctx_train:
        warnings.append(
            f"n_ctx_seq {n_ctx_seq} exceeds the trained context {model.n_ctx_train}: quality may fall apart"
        )
    st = model.structure
    if st.is_approximate and exact is None:
        warnings.append(f"approximate: {st.note} (plan --verify reads the real structure from llama.cpp)")
    return _Context(flash_attn, n_ctx, n_ctx_seq, n_stream, n_ubatch)


def _kv_layers(
    model: ModelProfile, cfg: PlanConfig, ctx: _Context, layout: _Layout, tk: GgmlType, tv: GgmlType
) -> tuple[list[LayerKV], int]:
    """The KV cache of each layer with its own KV (src/llama-kv-cache.cpp constructor) and the
    sliding-window cells (src/llama-kv-cache-iswa.cpp).

    Raises:
        ConfigError: a K or V row that does not hold whole blocks of its type.
    """
    st = model.structure
    v_trans = not ctx.flash_attn
    swa_cells = ctx.n_ctx_seq
    if st.is_iswa and not cfg.swa_full:
        # llama-kv-cache-iswa.cpp: GGML_PAD(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256)
        swa_cells = pad_ctx(min(ctx.n_ctx_seq, st.n_swa * (cfg.n_seq if cfg.kv_unified else 1) + ctx.n_ubatch))

    layers: list[LayerKV] = []
    for role in st.kv_layers:
        il = role.il
        # a plain (non-iSWA) cache holds every layer at full size, SWA-masked or not
        swa = role.swa and st.is_iswa
        cells = swa_cells if swa else ctx.n_ctx_seq
        k_width = role.k_width
        v_width = 0 if st.is_mla else (st.v_width_max if v_trans else role.v_width)
        for t, w, what in ((tk, k_width, "K"), (tv, v_width, "V")):
            if not t.divides(w):
                raise ConfigError(
                    f"{what} rows of layer {il} are {w} wide, not a multiple of {t.name}'s block of {t.block_size}: "
                    f"choose another --cache-type-{what.lower()} (e.g. f16)"
                )
        k_bytes = row_size(tk, k_width) * cells * ctx.n_stream
        v_bytes = row_size(tv, v_width) * cells * ctx.n_stream if v_width else 0
        device = layout.devs[il] if (layout.offload_kqv and il in layout.kv_on_gpu) else HOST
        layers.append(LayerKV(il, device, swa, cells, k_bytes, v_bytes))
    return layers, swa_cells


def _kv_caches(
    model: ModelProfile, cfg: PlanConfig, ctx: _Context, layers: list[LayerKV], tk: GgmlType, tv: GgmlType
) -> list[KvCacheSummary]:
    """llama.cpp's KV caches as its log lists them: the full cache, then the sliding-window or
    chunked one."""
    caches: list[KvCacheSummary] = []
    label = model.structure.swa_label
    for kind, sel in (("full", [l for l in layers if not l.swa]), (label, [l for l in layers if l.swa])):
        if sel:
            caches.append(
                KvCacheSummary(
                    kind,
                    sel[0].cells,
                    len(sel),
                    cfg.n_seq,
                    ctx.n_stream,
                    tk.name,
                    tv.name,
                    sum(l.k_bytes for l in sel),
                    sum(l.v_bytes for l in sel),
                )
            )
    return caches


def _recurrent_state(
    model: ModelProfile, cfg: PlanConfig, layout: _Layout, exact: ExactFigures | None, warnings: list[str]
) -> tuple[dict[str, int], KvCacheSummary | None]:
    """Recurrent state bytes per device and its cache entry (None without one).

    llama-memory-recurrent.cpp constructor: per recurrent layer an f32 row of n_embd_r (R) and
    of n_embd_s (S) for each of max(1, n_seq_max) cells (x (1 + n_rs_seq), n_rs_seq = 0 by
    default); on the layer's device when offload_kqv, else the host.
    """
    st = model.structure
    recurrent_by_device: dict[str, int] = {}
    rec = st.recurrent_layers
    if rec:
        rows = max(1, cfg.n_seq)
        r_total, s_total = st.state_r * 4 * rows * len(rec), st.state_s * 4 * rows * len(rec)
        if exact is not None and exact.recurrent is not None:
            _, er, es = exact.recurrent
            if abs(er - r_total) > PRINT_TOLERANCE_BYTES or abs(es - s_total) > PRINT_TOLERANCE_BYTES:
                warnings.append(
                    f"recurrent state: llama.cpp reports {(er + es) / MiB:.2f} MiB, "
                    f"kvtuner's rule {(r_total + s_total) / MiB:.2f} MiB: using llama.cpp's"
                )
                r_total, s_total = er, es
        for i, role in enumerate(rec):
            dev = layout.devs[role.il] if layout.offload_kqv else HOST
            share = _share(r_total + s_total, i, len(rec))
            recurrent_by_device[dev] = recurrent_by_device.get(dev, 0) + share
        return recurrent_by_device, KvCacheSummary(
            "recurrent", rows, len(rec), cfg.n_seq, 1, "f32", "f32", r_total, s_total
        )
    if exact is not None and exact.recurrent is not None:
        _, er, es = exact.recurrent
        warnings.append(
            f"llama.cpp keeps {(er + es) / MiB:.2f} MiB of recurrent state that kvtuner's structure has no "
            "layer for: counted on the host"
        )
        recurrent_by_device[HOST] = er + es
        return recurrent_by_device, KvCacheSummary(
            "recurrent", max(1, cfg.n_seq), 0, cfg.n_seq, 1, "f32", "f32", er, es
        )
    return recurrent_by_device, None


def _compute_buffers(
    model: ModelProfile,
    cfg: PlanConfig,
    ctx: _Context,
    layout: _Layout,
    layers: list[LayerKV],
    swa_cells: int,
    gpus: list[GpuSpec],
    tk: GgmlType,
    tv: GgmlType,
    compute_override: dict[str, int] | None,
    exact: ExactFigures | None,
    rules: BuildRules,
    warnings: list[str],
) -> ComputeEstimate:
    """The compute buffer per device: :func:`~kvtuner.core.plan.compute_buffer.estimate_compute`,
    plus the expert tensors host layers copy to a GPU, or llama.cpp's own figures."""
    devs = layout.devs
    compute = estimate_compute(
        model,
        n_ubatch=ctx.n_ubatch,
        n_seq=cfg.n_seq,
        n_ctx_seq=ctx.n_ctx_seq,
        swa_cells=swa_cells,
        flash_attn=ctx.flash_attn,
        layer_devices=devs,
        kv_layers=layers,
        gpu_devices=[g.device for g in layout.kept],
        host=HOST,
        kv_f16=tk.name == "f16" and tv.name == "f16",
        n_stream=ctx.n_stream,
        type_k=tk.name,
        type_v=tv.name,
        rules=rules,
    )
    if rules.approximate_line:
        warnings.append(rules.approximate_line)
    if exact is not None and exact.compute:
        compute_override = exact.compute
    moved_to_host = layout.moves.largest_moved(HOST)
    if moved_to_host and ctx.n_ubatch >= OFFLOAD_MIN_BATCH and not compute_override:
        # a ubatch of >= OFFLOAD_MIN_BATCH tokens runs host experts' MUL_MAT_ID on the GPU (ggml-cuda.cu
        # ggml_backend_cuda_device_offload_op); ggml_backend_sched gives each such weight a split
        # of its own and copies it into that split's compute buffer ("by starting a new split, the
        # memory of the previously offloaded weights can be reused", ggml-backend.cpp
        # ggml_backend_sched_split_graph): one whole expert tensor on top of the layer's activations
        for g in gpus:
            # never on an RPC device: ggml-rpc's device has no offload_op (ggml-rpc.cpp)
            if g.kind == "gpu" and any(d == g.device for d in devs[: model.n_layer]):
                compute = compute.plus(g.device, moved_to_host)
    if compute_override:
        compute = compute.with_exact(compute_override)
    return compute


def _output_bytes(
    model: ModelProfile, cfg: PlanConfig, exact: ExactFigures | None
) -> tuple[int, dict[str, int] | None]:
    """The host's output buffer (:func:`~kvtuner.core.plan.llama_constants.output_buffer_bytes`)
    and llama.cpp's output buffers of the other devices (None without figures)."""
    output_bytes = output_buffer_bytes(model.n_vocab, cfg.n_seq)
    output_exact = dict(exact.output) if (exact is not None and exact.output) else None
    if output_exact is not None:
        output_bytes = output_exact.pop(HOST, 0)
    return output_bytes, output_exact


def _gpu_plans(
    model: ModelProfile,
    gpus: list[GpuSpec],
    layout: _Layout,
    layers: list[LayerKV],
    recurrent_by_device: dict[str, int],
    compute: ComputeEstimate,
    output_exact: dict[str, int] | None,
    gpu_overhead_bytes: int,
) -> list[DevicePlan]:
    """Each offload device's weights, KV, compute, output and overhead."""
    n_layer, devs, moves = model.n_layer, layout.devs, layout.moves
    out: list[DevicePlan] = []
    for g in gpus:
        ids = [il for il in range(n_layer) if devs[il] == g.device]
        w = sum(model.layer_bytes[il] for il in ids)
        # layers placed by tensor override (weights on this GPU, KV on host) are still in `ids`
        has_out = devs[n_layer] == g.device
        if has_out:
            w += model.output_bytes
        w += moves.delta(g.device)
        kv = sum(l.kv_bytes for l in layers if l.device == g.device) + recurrent_by_device.get(g.device, 0)
        used = g in layout.kept
        out.append(
            DevicePlan(
                device=g.device,
                kind=g.kind,
                name=g.name,
                weights_bytes=w,
                kv_bytes=kv,
                compute_bytes=compute.bytes_on(g.device),
                output_bytes=(output_exact or {}).get(g.device, 0),
                # an rpc-server's own process memory (backend context) is on the remote machine and
                # already out of the free memory it reports (RPC_CMD_GET_DEVICE_MEMORY): none here;
                # a device -sm none leaves out gets no buffer
                overhead_bytes=gpu_overhead_bytes if (used and g.kind == "gpu") else 0,
                capacity_bytes=g.total_bytes,
                free_bytes=g.free_bytes,
                n_layers=len(ids),
                has_output=has_out,
                endpoint=g.endpoint,
                expert_bytes=moves.expert_bytes.get(g.device, 0),
                expert_layers=len(moves.expert_layers.get(g.device, ())),
                backend=g.backend if g.kind == "gpu" else "RPC",
                unified=g.unified,
                source=g.source,
                flags=g.flags,
                backend_index=g.backend_index,
            )
        )
    return out


def _host_plan(
    model: ModelProfile,
    cfg: PlanConfig,
    gpus: list[GpuSpec],
    host: HostSpec | None,
    layout: _Layout,
    layers: list[LayerKV],
    recurrent_by_device: dict[str, int],
    compute: ComputeEstimate,
    output_bytes: int,
    host_overhead_bytes: int,
) -> DevicePlan:
    """The host's weights (with the ``CPU_REPACK`` copy), KV, compute, output and overhead."""
    n_layer, devs, moves = model.n_layer, layout.devs, layout.moves
    output_on_gpu = layout.output_on_gpu
    host_ids = [il for il in range(n_layer) if devs[il] == HOST]
    host_w = model.input_bytes + sum(model.layer_bytes[il] for il in host_ids)
    if not output_on_gpu:
        # output.weight on the host; a tied output reuses token_embd's data (no second copy)
        host_w += model.output_bytes - (model.embd_bytes if model.tied_output else 0)
    # ggml-cpu's CPU_REPACK copy (plan/repack.py): committed memory; with mmap the file pages it
    # was read from stay mapped (llama-mmap.cpp maps the file with MAP_POPULATE), without mmap
    # those tensors live only in the repack buffer
    repack = repack_bytes(
        model, host_ids, not output_on_gpu, host.cpu_features if host else None, gpu_present=bool(gpus)
    )
    mapped = mmap_in_effect(cfg.use_mmap, gpus)
    if repack and not mapped:
        host_w -= repack
    host_w += moves.delta(HOST)
    host_kv = sum(l.kv_bytes for l in layers if l.device == HOST) + recurrent_by_device.get(HOST, 0)
    return DevicePlan(
        device=HOST,
        kind="host",
        name="host RAM",
        weights_bytes=host_w,
        kv_bytes=host_kv,
        compute_bytes=compute.bytes_on(HOST),
        output_bytes=output_bytes,
        overhead_bytes=host_overhead_bytes,
        capacity_bytes=host.total_bytes if host else None,
        free_bytes=host.available_bytes if host else None,
        n_layers=len(host_ids),
        has_output=not output_on_gpu,
        weights_mapped=mapped,
        repack_bytes=repack,
        expert_bytes=moves.expert_bytes.get(HOST, 0),
        expert_layers=len(moves.expert_layers.get(HOST, ())),
    )


def _share(total: int, i: int, n: int) -> int:
    """The ``i``-th of ``n`` near-equal integer parts of ``total`` (they sum to ``total``)."""
    return total * (i + 1) // n - total * i // n


def _scaled(values: list[int], total: int) -> list[int]:
    """``values`` scaled to sum to ``total`` (integers, proportional; equal parts if all are 0)."""
    have = sum(values)
    if not values:
        return []
    if have == 0:
        return [_share(total, i, len(values)) for i in range(len(values))]
    out, acc, run = [], 0, 0
    for v in values:
        run += v
        nxt = total * run // have
        out.append(nxt - acc)
        acc = nxt
    return out


def _apply_exact_kv(
    layers: list[LayerKV], exact: tuple[tuple[int, int, int, int], ...], warnings: list[str]
) -> list[LayerKV]:
    """Per-layer KV with llama.cpp's cache sizes where they differ from the plan's by more than
    the print's rounding (K and V scaled within each cache; per layer, hence per device)."""
    groups = [g for g in ([l for l in layers if not l.swa], [l for l in layers if l.swa]) if g]
    same_shape = len(groups) == len(exact) and all(
        (g[0].cells, len(g)) == (cells, n) for g, (cells, n, _, _) in zip(groups, exact)
    )
    if not same_shape:
        total_k, total_v = sum(e[2] for e in exact), sum(e[3] for e in exact)
        warnings.append(
            "llama.cpp's KV caches (" + ", ".join(f"{n} layers x {c} cells" for c, n, _, _ in exact) + ") differ from "
            "kvtuner's structure: totals are llama.cpp's, spread over the planned layers"
        )
        groups, exact = [layers], ((0, len(layers), total_k, total_v),)
    out = {id(l): l for l in layers}
    for g, (_, _, kb, vb) in zip(groups, exact):
        pk, pv = sum(l.k_bytes for l in g), sum(l.v_bytes for l in g)
        if abs(pk - kb) <= PRINT_TOLERANCE_BYTES and abs(pv - vb) <= PRINT_TOLERANCE_BYTES:
            continue
        ks, vs = _scaled([l.k_bytes for l in g], kb), _scaled([l.v_bytes for l in g], vb)
        for l, k, v in zip(g, ks, vs):
            out[id(l)] = LayerKV(l.il, l.device, l.swa, l.cells, k, v)
    return [out[id(l)] for l in layers]
