"""Speed model: predicted decode and prefill tokens/s for a :class:`MemoryPlan`.

The model is a roofline per device, summed over the devices a token passes through (llama.cpp
runs one sequence's layers device after device, so their times add up):

Decode (one token at KV depth ``D``, memory-bound; Williams et al., "Roofline", CACM 2009, and
llama.cpp's own decode analysis, ggml-org/llama.cpp discussion #638)::

    t_decode(D) = sum_dev max(bytes_dev(D) / bw_dev, flops_dev(D) / flop_s_dev)
                  + n_crossings * crossing_latency_s + pcie_bytes / pcie_bandwidth_bytes_s
                  + token_overhead_s + n_layer * layer_overhead_s
    decode_tok_s(D) = 1 / t_decode(D)

    bytes_dev(D) = weights read on dev                     (every weight once per token, except
                                                            the input embedding: one row, get_rows)
                 + sum_{layers with KV on dev} kv_bytes_per_cell(il) * cells_read(il, D)
    cells_read(il, D) = min(D + 1, n_swa) for sliding-window layers, else min(D + 1, n_ctx_seq)
    flops_dev(D) = 2 * params_dev                          (one multiply-add per weight)
                 + sum_{layers with KV on dev} 2 * n_head(il) * (head_dim_k + head_dim_v) * cells_read
    (measured copy bandwidth: :func:`measure_host_bandwidth`)
    bw_host = min(measured copy bandwidth * host_bw_efficiency,
                  threads * host_decode_bytes_s_per_thread)   (one core cannot stream at full bandwidth)
    flop_s_host = threads * host_decode_flop_s_per_thread
    threads = 1 + (n_threads - 1) * host_thread_efficiency    (threads do not scale linearly)
    bw_gpu = GPU bandwidth (NVML: memory clock x bus width x 2, or a preset) * gpu_bw_efficiency

On the CPU two kernel effects enter the host terms (ggml/src/ggml-cpu): weight bytes and
mat-mat FLOPs are divided by the weight type's kernel factor (:data:`CPU_KERNEL_FACTORS`: F16
and Q8_0/Q4_0 have llamafile sgemm kernels on AVX2, K-quants go through ggml's vec-dot), and
the CPU flash-attention kernel walks the KV once per *query* head with a fixed cost per head and
cell (online softmax ``expf``, f16 conversions) that dominates 64-256-wide dot products, so on the
host attention costs, per cached cell read,

    decode:  n_head * (kv_bytes_per_cell / n_head_kv + host_attn_bytes_per_head_cell)  bytes-equivalent
    prefill: n_head * (2 * (head_dim_k + head_dim_v) + host_attn_flops_per_head_cell)  FLOP-equivalent

(GQA saves memory, not CPU time).

Where the KV of a GPU layer lives on the host (``-nkvo`` / ``kv_gpu_layers`` below the offloaded
layers), llama.cpp computes that layer's attention on the CPU for a one-token batch (the ggml
scheduler keeps an op on the backend of its KV buffer; ggml-cuda's ``offload_op`` only pulls ops
to the GPU for batches of 32 or more, ggml/src/ggml-cuda/ggml-cuda.cu): the KV is read at host
bandwidth and the activations cross PCIe twice per such layer (Q/K/V out, the result back:
``(n_head * head_dim_k + 2 * n_head_kv * head_dim_k + n_head * head_dim_v) * 4`` bytes).
Each change of device along the layer sequence is one more crossing of ``n_embd * 4`` bytes.

Prefill (a prompt of ``n_prompt`` tokens at depth ``D0``, compute-bound; Kaplan et al.,
"Scaling Laws for Neural Language Models", 2020, section 2.1: C_forward ~ 2 N + 2 n_layer n_ctx d_attn)::

    t_prefill = sum_dev max(flops_dev / flop_s_dev, n_ubatches * weight_bytes_dev / bw_dev)
                + [GPU present] n_ubatches * host_weight_bytes / pcie_bandwidth_bytes_s
                + n_ubatches * (token_overhead_s + n_layer * layer_overhead_s)
    flops_dev = 2 * params_dev * n_prompt + 2 * n_vocab * n_embd (logits of the last token only,
                llama_batch_get_one) + attention: for each token at position p and layer il,
                2 * n_head * (head_dim_k + head_dim_v) * cells(p), cells(p) = min(p + 1, window)
                with flash attention (masked cells skipped), the padded ``n_kv`` of the ubatch without it
    flop_s_host = threads * host_prefill_flop_s_per_thread
    flop_s_gpu = GPU FLOP/s (preset, or bandwidth x 40 FLOP/byte) * gpu_flop_efficiency

With a GPU, host-resident weights are copied to the GPU for every ubatch of 32 tokens or more
(ggml-cuda ``offload_op``), hence the PCIe term.

Constants live in :class:`SpeedConstants`; :mod:`kvtuner.core.speed.calibration` refines them from
measured runs. MoE models read ``n_expert_used / n_expert`` of their expert weights per token;
the expert share of a layer is taken as :data:`MOE_EXPERT_FRACTION` (an approximation).
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..hardware.host import physical_cores
from ..hardware.specs import GpuSpec, HostSpec
from ..plan.buffers import HOST
from ..plan.memory_plan import MemoryPlan
from ..units import GiB, pad_to

#: Share of a MoE layer's bytes held by its experts (Mixtral ~0.96, Qwen3-30B-A3B ~0.9).
MOE_EXPERT_FRACTION = 0.9
#: FLOP per byte of bandwidth assumed for a detected GPU whose FLOP/s are unknown (the presets
#: below range from 35 to 55 FP32 FLOP per byte).
GPU_FLOP_PER_BYTE = 40.0
#: PCIe bandwidth assumed when neither NVML nor a preset tells (PCIe 4.0 x16 after encoding).
DEFAULT_PCIE_BANDWIDTH_BYTES_S = 16 * 1.969e9
#: Host bandwidth assumed when the probe cannot run (dual-channel DDR4-3200 is 51 GB/s peak).
DEFAULT_HOST_BANDWIDTH_BYTES_S = 20e9
#: CPU kernel factors by file type: (decode bytes-rate factor, prefill FLOP-rate factor), relative
#: to F16. Measured with benchmarks/speed_accuracy.py on the reference 2-core AVX2 machine (decode
#: bytes/s: Q4_K_M 0.8x of F16; Q8_0 1.0x on an idle machine, 12.8 vs 12.1 GB/s effective; prefill
#: FLOP/s Q4_K_M 0.62x, Q8_0 0.73x); other types by kernel family. Calibration refines a family's constants from its own runs.
CPU_KERNEL_FACTORS: dict[str, tuple[float, float]] = {
    "ALL_F32": (1.0, 0.8), "MOSTLY_F16": (1.0, 1.0), "MOSTLY_BF16": (1.0, 0.9),
    "MOSTLY_Q8_0": (1.0, 0.73), "MOSTLY_Q4_0": (0.8, 0.7), "MOSTLY_Q4_1": (0.8, 0.65),
    "MOSTLY_Q5_0": (0.8, 0.6), "MOSTLY_Q5_1": (0.8, 0.6),
}
#: Factors of file types not in the table (K-quants, i-quants, ...).
CPU_KERNEL_FACTORS_OTHER = (0.8, 0.62)


def cpu_kernel_factors(file_type: str | None) -> tuple[float, float]:
    """(decode bytes-rate factor, prefill FLOP-rate factor) of a llama.cpp file type on the CPU."""
    return CPU_KERNEL_FACTORS.get(file_type or "", CPU_KERNEL_FACTORS_OTHER)


#: Depths at which the decode curve is evaluated (fractions of n_ctx_seq).
CURVE_POINTS = 17


@dataclass(frozen=True)
class GpuSpeedPreset:
    """Typical card for a what-if memory size (spec-sheet figures, labelled as presets).

    ``mem_bandwidth_bytes_s``: memory bandwidth, bytes/s; ``pcie_bandwidth_bytes_s``: host link
    after encoding, bytes/s (lanes x 1.969 GB/s for PCIe 4.0); ``flop_s``: FP32 shader FLOP/s.
    """

    card: str
    total_bytes: int
    mem_bandwidth_bytes_s: float
    pcie_bandwidth_bytes_s: float
    flop_s: float


#: What-if presets of :data:`kvtuner.core.hardware.specs.GPU_PRESETS_BYTES` with a typical card each
#: (NVIDIA product pages: memory bandwidth, PCIe link, FP32 TFLOPS).
GPU_SPEED_PRESETS: dict[str, GpuSpeedPreset] = {
    "8 GB": GpuSpeedPreset("RTX 4060 8GB (preset)", 8 * GiB, 272e9, 8 * 1.969e9, 15.1e12),
    "12 GB": GpuSpeedPreset("RTX 3060 12GB (preset)", 12 * GiB, 360e9, 16 * 1.969e9, 12.7e12),
    "16 GB": GpuSpeedPreset("RTX 4060 Ti 16GB (preset)", 16 * GiB, 288e9, 8 * 1.969e9, 22.1e12),
    "24 GB": GpuSpeedPreset("RTX 3090 24GB (preset)", 24 * GiB, 936e9, 16 * 1.969e9, 35.6e12),
    "48 GB": GpuSpeedPreset("RTX A6000 48GB (preset)", 48 * GiB, 768e9, 16 * 1.969e9, 38.7e12),
}


class SpeedModelError(ValueError):
    """Bad input to the speed model; the message says what to change."""


@dataclass(frozen=True)
class SpeedConstants:
    """Effective constants of the roofline (defaults before any calibration).

    Attributes:
        host_bw_efficiency: share of the measured copy bandwidth llama.cpp's CPU mat-vec reaches.
        host_decode_bytes_s_per_thread: bytes/s of F16 weights one CPU thread streams through
            the mat-vec kernels (the decode limit on machines with few threads).
        host_decode_flop_s_per_thread: FLOP/s one CPU thread sustains in decode (mat-vec with
            on-the-fly dequantisation; AVX2 reaches a small part of its FMA peak there).
        host_prefill_flop_s_per_thread: FLOP/s one CPU thread sustains in prefill (mat-mat).
        host_attn_bytes_per_head_cell: fixed decode cost of one query head over one cached cell on
            the CPU, in bytes-equivalent of the mat-vec stream.
        host_attn_flops_per_head_cell: the same for prefill, in FLOP-equivalent.
        gpu_bw_efficiency: share of the GPU's peak bandwidth reached in decode (llama.cpp CUDA
            reaches 70-85 % on large models).
        gpu_flop_efficiency: share of the GPU's FLOP/s reached in prefill.
        pcie_efficiency: share of the PCIe link rate reached by copies.
        crossing_latency_s: fixed cost of one device crossing (copy + synchronisation), s.
        token_overhead_s: fixed cost per llama_decode call (graph build, scheduling, sampling), s.
        layer_overhead_s: per layer per llama_decode call (op dispatch and thread barriers), s.
        host_thread_efficiency: what each CPU thread after the first adds, as a share of the
            first: effective threads = 1 + (n_threads - 1) * efficiency. Measured here with
            benchmarks/speed_accuracy.py on an idle 2-core VM: 2 threads run 1.36-1.67x one thread
            (prefill and decode alike; shared caches, memory controller and OpenMP barriers).
    """

    host_bw_efficiency: float = 1.0
    host_decode_bytes_s_per_thread: float = 5e9
    host_decode_flop_s_per_thread: float = 20e9
    host_prefill_flop_s_per_thread: float = 30e9
    host_attn_bytes_per_head_cell: float = 1280.0
    host_attn_flops_per_head_cell: float = 1024.0
    gpu_bw_efficiency: float = 0.75
    gpu_flop_efficiency: float = 0.5
    pcie_efficiency: float = 0.8
    crossing_latency_s: float = 20e-6
    token_overhead_s: float = 0.5e-3
    layer_overhead_s: float = 40e-6
    host_thread_efficiency: float = 0.55

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise SpeedModelError(f"speed constant {name} must be a finite number >= 0, not {value!r}")

    def scaled(self, **factors: float) -> "SpeedConstants":
        """A copy with the named constants multiplied by ``factors``."""
        return replace(self, **{k: getattr(self, k) * v for k, v in factors.items()})


@dataclass(frozen=True)
class DeviceRates:
    """Peak rates of one device. ``bandwidth_bytes_s``: memory bandwidth, bytes/s;
    ``flop_s``: FLOP/s (None for the host: threads x per-thread constant);
    ``pcie_bandwidth_bytes_s``: host link (GPUs), bytes/s; ``source``: where the figures came from."""

    device: str
    bandwidth_bytes_s: float
    flop_s: float | None = None
    pcie_bandwidth_bytes_s: float | None = None
    source: str = ""


@dataclass(frozen=True)
class SpeedInputs:
    """Everything besides the plan that a prediction needs (kept on the prediction so the
    advisor can re-predict variants of the same plan).

    ``rates``: per device (``CUDA0`` ..., ``CPU``); ``n_threads``: CPU threads;
    ``constants``: effective constants; ``sigma_log``: 1-sigma relative uncertainty (natural log)
    of a decode prediction, ``prefill_sigma_log`` of a prefill one (None: ``sigma_log``);
    ``n_calibration_runs``: measured runs behind ``constants``.
    """

    rates: dict[str, DeviceRates]
    n_threads: int
    constants: SpeedConstants = field(default_factory=SpeedConstants)
    sigma_log: float = 0.35
    n_calibration_runs: int = 0
    prefill_sigma_log: float | None = None

    def rate(self, device: str) -> DeviceRates:
        """Rates of ``device``.

        Raises:
            SpeedModelError: no rates for that device.
        """
        try:
            return self.rates[device]
        except KeyError:
            raise SpeedModelError(f"no bandwidth known for device {device}: pass its GpuSpec to speed_inputs()") from None


# ------------------------------------------------------------------------------------------
# hardware rates


@functools.lru_cache(maxsize=1)
def measure_host_bandwidth(budget_s: float = 0.25, array_bytes: int = 32 << 20) -> float:
    """Host RAM bandwidth in bytes/s, measured with a numpy copy (cached for the process).

    ``bytes = 2 * array_bytes`` per copy (read + write), best of the copies made until
    ``budget_s`` seconds have passed since the call began (allocation included; at least 2
    copies after the first, page-touching one). The arrays (32 MiB each) exceed the L3 cache of
    most desktop CPUs. Single-threaded, like STREAM's Copy kernel (McCalpin, STREAM benchmark).
    Takes about 0.25 s on an idle machine.

    Returns:
        bytes/s; :data:`DEFAULT_HOST_BANDWIDTH_BYTES_S` if numpy is unavailable.
    """
    t_end = time.perf_counter() + budget_s
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return DEFAULT_HOST_BANDWIDTH_BYTES_S
    n = max(1, array_bytes // 8)
    src = np.ones(n)
    dst = np.empty(n)
    np.copyto(dst, src)  # touch every page of dst first
    best = math.inf
    runs = 0
    while runs < 2 or (time.perf_counter() < t_end and runs < 50):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return 2.0 * n * 8 / best if best > 0 else DEFAULT_HOST_BANDWIDTH_BYTES_S


def gpu_speed_preset(total_bytes: int) -> GpuSpeedPreset:
    """The preset whose memory size is nearest ``total_bytes`` (ties: the smaller card)."""
    return min(GPU_SPEED_PRESETS.values(), key=lambda p: (abs(p.total_bytes - total_bytes), p.total_bytes))


def gpu_rates(gpu: GpuSpec) -> DeviceRates:
    """Rates of one GPU: NVML's figures where the GpuSpec has them, else the nearest preset."""
    preset = gpu_speed_preset(gpu.total_bytes)
    bw = gpu.mem_bandwidth_bytes_s
    src = []
    if bw:
        src.append("bandwidth from NVML")
        known = [p for p in GPU_SPEED_PRESETS.values() if p.card.rsplit(" ", 2)[0] in gpu.name]
        flop = max(known, key=lambda p: len(p.card)).flop_s if known else bw * GPU_FLOP_PER_BYTE
    else:
        bw, flop = preset.mem_bandwidth_bytes_s, preset.flop_s
        src.append(f"bandwidth of a {preset.card}")
    pcie = gpu.pcie_bandwidth_bytes_s or preset.pcie_bandwidth_bytes_s
    src.append("PCIe from NVML" if gpu.pcie_bandwidth_bytes_s else f"PCIe of a {preset.card}")
    return DeviceRates(gpu.device, float(bw), float(flop), float(pcie), ", ".join(src))


def host_rates(host: HostSpec | None = None, *, measure: bool = True) -> DeviceRates:
    """Rates of the host: the HostSpec's bandwidth, else the probe, else the default."""
    if host is not None and host.mem_bandwidth_bytes_s:
        return DeviceRates(HOST, float(host.mem_bandwidth_bytes_s), source="host bandwidth given")
    if measure:
        return DeviceRates(HOST, measure_host_bandwidth(), source="host bandwidth measured (numpy copy)")
    return DeviceRates(HOST, DEFAULT_HOST_BANDWIDTH_BYTES_S, source="host bandwidth assumed")


def speed_inputs(
    gpus: Sequence[GpuSpec] = (),
    host: HostSpec | None = None,
    *,
    n_threads: int | None = None,
    constants: SpeedConstants | None = None,
    sigma_log: float = 0.35,
    n_calibration_runs: int = 0,
    measure: bool = True,
) -> SpeedInputs:
    """Build :class:`SpeedInputs` for the given hardware.

    Raises:
        SpeedModelError: ``n_threads`` below 1.
    """
    threads = physical_cores() if n_threads is None else int(n_threads)
    if threads < 1:
        raise SpeedModelError(f"n_threads must be 1 or more, not {n_threads}")
    rates = {g.device: gpu_rates(g) for g in gpus}
    rates[HOST] = host_rates(host, measure=measure)
    return SpeedInputs(rates, threads, constants or SpeedConstants(), sigma_log, n_calibration_runs)


# ------------------------------------------------------------------------------------------
# workloads


@dataclass(frozen=True)
class DeviceWork:
    """What one device does: ``bytes_read`` from its memory and ``flops``; for prefill,
    ``weight_bytes`` read once per ubatch is already inside ``bytes_read``."""

    device: str
    kind: str  # "gpu" | "host"
    bytes_read: float
    flops: float


@dataclass(frozen=True)
class Workload:
    """The work of one decode step, or of one whole prefill (``n_tokens`` tokens).

    ``n_crossings``: device crossings; ``pcie_bytes``: bytes over PCIe; ``n_calls``: llama_decode
    graph evaluations (ubatches); ``n_layer``: repeating layers (for the per-layer overhead).
    """

    phase: str  # "decode" | "prefill"
    n_tokens: int
    devices: tuple[DeviceWork, ...]
    n_crossings: float
    pcie_bytes: float
    n_calls: int
    n_layer: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (stored with calibration runs)."""
        return {
            "phase": self.phase, "n_tokens": self.n_tokens,
            "devices": [{"device": d.device, "kind": d.kind, "bytes_read": d.bytes_read, "flops": d.flops} for d in self.devices],
            "n_crossings": self.n_crossings, "pcie_bytes": self.pcie_bytes, "n_calls": self.n_calls, "n_layer": self.n_layer,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Workload":
        """Inverse of :meth:`to_dict`."""
        return cls(
            phase=str(d["phase"]), n_tokens=int(d["n_tokens"]),
            devices=tuple(DeviceWork(str(x["device"]), str(x["kind"]), float(x["bytes_read"]), float(x["flops"])) for x in d["devices"]),
            n_crossings=float(d["n_crossings"]), pcie_bytes=float(d["pcie_bytes"]), n_calls=int(d["n_calls"]), n_layer=int(d["n_layer"]),
        )


def _layer_params(plan: MemoryPlan) -> list[float]:
    """Parameters of each repeating layer: all parameters minus the embedding and output
    matrices (``n_vocab * n_embd`` each; one when tied), shared out in proportion to layer bytes."""
    m = plan.model
    mat = m.n_vocab * m.n_embd
    rest = max(0.0, float(m.n_params - mat * (1 if m.tied_output else 2)))
    total_bytes = sum(m.layer_bytes) or 1
    return [rest * b / total_bytes for b in m.layer_bytes]


def _active(plan: MemoryPlan) -> float:
    """Share of a layer's weights read per token: 1 for dense models; for MoE
    ``(1 - f) + f * n_expert_used / n_expert`` with f = :data:`MOE_EXPERT_FRACTION`."""
    m = plan.model
    if m.n_expert > 0 and m.n_expert_used > 0:
        return (1 - MOE_EXPERT_FRACTION) + MOE_EXPERT_FRACTION * m.n_expert_used / m.n_expert
    return 1.0


def _weight_devices(plan: MemoryPlan) -> list[str]:
    """Device of each repeating layer's weights, as the plan placed them."""
    return list(plan.layer_devices[: plan.model.n_layer])


def _window(plan: MemoryPlan, il: int, swa: bool) -> int:
    return plan.model.n_swa if (swa and plan.model.n_swa) else plan.n_ctx_seq


def _attn_flops_per_cell(plan: MemoryPlan, il: int) -> float:
    """2 * n_head * (head_dim_k + head_dim_v): QK^T and softmax(QK^T) V for one cached cell."""
    m = plan.model
    return 2.0 * m.n_head[il] * (m.head_dim_k_at(il) + m.head_dim_v_at(il))


@dataclass(frozen=True)
class _DecodeParts:
    """Depth-independent part of a decode workload plus, per KV layer, (device, bytes per cell,
    FLOPs per cell, cells cap), so a decode curve costs O(layers) per point."""

    bytes_: dict[str, float]
    flops: dict[str, float]
    kv: tuple[tuple[str, float, float, int], ...]
    crossings: float
    pcie: float


def _decode_parts(plan: MemoryPlan, c: SpeedConstants) -> _DecodeParts:
    m = plan.model
    act = _active(plan)
    params = _layer_params(plan)
    wdev = _weight_devices(plan)
    f_dec, _ = cpu_kernel_factors(m.file_type)
    bytes_: dict[str, float] = {d.device: 0.0 for d in plan.devices}
    flops: dict[str, float] = {d.device: 0.0 for d in plan.devices}
    for il in range(m.n_layer):
        bytes_[wdev[il]] += m.layer_bytes[il] * act / (f_dec if wdev[il] == HOST else 1.0)
        flops[wdev[il]] += 2.0 * params[il] * act
    out_dev = next((g.device for g in plan.gpus if g.has_output), HOST)
    bytes_[out_dev] += m.output_bytes / (f_dec if out_dev == HOST else 1.0)
    flops[out_dev] += 2.0 * m.n_vocab * m.n_embd
    crossings = 0.0
    pcie = 0.0
    kv = []
    n_stream = max(1, plan.n_stream)
    for lk in plan.kv_layers:
        per_cell = lk.kv_bytes / (lk.cells * n_stream) if lk.cells else 0.0
        if lk.device == HOST:  # per query head: its KV-head row plus the kernel's fixed cost
            per_cell = m.n_head[lk.il] * (per_cell / max(1, m.n_head_kv[lk.il]) + c.host_attn_bytes_per_head_cell)
        kv.append((lk.device, per_cell, _attn_flops_per_cell(plan, lk.il), min(_window(plan, lk.il, lk.swa), lk.cells)))
        if lk.device != wdev[lk.il]:  # attention away from the layer's weights: Q, K, V out, result back
            crossings += 2
            hk, hv = m.head_dim_k_at(lk.il), m.head_dim_v_at(lk.il)
            pcie += 4.0 * (m.n_head[lk.il] * hk + 2 * m.n_head_kv[lk.il] * hk + m.n_head[lk.il] * hv)
    # activations crossing devices along the layer sequence: input (host) -> layers -> output
    seq = [HOST] + wdev + [out_dev]
    for a, b in zip(seq, seq[1:]):
        if a != b:
            crossings += 1
            pcie += 4.0 * m.n_embd
    return _DecodeParts(bytes_, flops, tuple(kv), crossings, pcie)


def _assemble_decode(plan: MemoryPlan, parts: _DecodeParts, depth: int) -> Workload:
    bytes_ = dict(parts.bytes_)
    flops = dict(parts.flops)
    for dev, b, f, cap in parts.kv:
        cells = min(depth + 1, cap)
        bytes_[dev] += b * cells
        flops[dev] += f * cells
    devs = tuple(DeviceWork(d.device, d.kind, bytes_[d.device], flops[d.device]) for d in plan.devices
                 if bytes_[d.device] or flops[d.device])
    return Workload("decode", 1, devs, parts.crossings, parts.pcie, 1, plan.model.n_layer)


def decode_workload(plan: MemoryPlan, depth: int, constants: SpeedConstants | None = None) -> Workload:
    """The work of decoding one token with ``depth`` tokens already in the KV cache
    (formulas in the module docstring).

    Raises:
        SpeedModelError: ``depth`` negative or not below the context (``n_ctx_seq``).
    """
    if depth < 0 or depth >= plan.n_ctx_seq:
        raise SpeedModelError(f"depth {depth} must be between 0 and n_ctx_seq - 1 = {plan.n_ctx_seq - 1}")
    return _assemble_decode(plan, _decode_parts(plan, constants or SpeedConstants()), depth)


def prefill_workload(plan: MemoryPlan, n_prompt: int, depth: int = 0,
                     constants: SpeedConstants | None = None) -> Workload:
    """The work of a prefill of ``n_prompt`` tokens after ``depth`` cached tokens, in ubatches
    of ``plan.n_ubatch`` (formulas in the module docstring).

    Raises:
        SpeedModelError: ``n_prompt`` below 1 or ``depth + n_prompt`` beyond ``n_ctx_seq``.
    """
    if n_prompt < 1 or depth < 0 or depth + n_prompt > plan.n_ctx_seq:
        raise SpeedModelError(
            f"a prefill of {n_prompt} tokens at depth {depth} must fit the context of {plan.n_ctx_seq} tokens: "
            "lower the prompt or depth, or raise --ctx"
        )
    m = plan.model
    const = constants or SpeedConstants()
    act = _active(plan)
    params = _layer_params(plan)
    wdev = _weight_devices(plan)
    n_ub = max(1, plan.n_ubatch)
    n_calls = math.ceil(n_prompt / n_ub)
    bytes_: dict[str, float] = {d.device: 0.0 for d in plan.devices}
    flops: dict[str, float] = {d.device: 0.0 for d in plan.devices}
    has_gpu = bool(plan.gpus)
    host_weight_bytes = 0.0
    _, f_pre = cpu_kernel_factors(m.file_type)
    for il in range(m.n_layer):
        # MoE: a ubatch touches more experts than one token; take all of them for ubatches >= 32
        share = 1.0 if n_ub >= 32 else act
        bytes_[wdev[il]] += m.layer_bytes[il] * share * n_calls
        flops[wdev[il]] += 2.0 * params[il] * act * n_prompt / (f_pre if wdev[il] == HOST else 1.0)
        if wdev[il] == HOST:
            host_weight_bytes += m.layer_bytes[il] * share
    out_dev = next((g.device for g in plan.gpus if g.has_output), HOST)
    bytes_[out_dev] += m.output_bytes
    flops[out_dev] += 2.0 * m.n_vocab * m.n_embd  # logits of the last token only
    for lk in plan.kv_layers:
        window = min(_window(plan, lk.il, lk.swa), lk.cells)
        per_cell_flops = _attn_flops_per_cell(plan, lk.il)
        if lk.device == HOST:
            per_cell_flops += m.n_head[lk.il] * const.host_attn_flops_per_head_cell
        cells = 0.0
        for c in range(n_calls):
            a = depth + c * n_ub
            b = min(depth + n_prompt, a + n_ub)
            if plan.flash_attn:  # causal: token p reads min(p + 1, window) cells
                cells += _sum_min_range(a + 1, b, window)
            else:  # the whole padded n_kv for every token of the ubatch
                cells += (b - a) * min(pad_to(b, 256), lk.cells)
        flops[lk.device] += per_cell_flops * cells
        n_stream = max(1, plan.n_stream)
        per_cell = lk.kv_bytes / (lk.cells * n_stream) if lk.cells else 0.0
        bytes_[lk.device] += per_cell * min(depth + n_prompt, window) * n_calls
    pcie = 0.0
    crossings = 0.0
    if has_gpu and n_ub >= 32:
        pcie += host_weight_bytes * n_calls  # ggml-cuda offload_op: host weights go to the GPU
    seq = [HOST] + wdev + [out_dev]
    for a_dev, b_dev in zip(seq, seq[1:]):
        if a_dev != b_dev:
            crossings += n_calls
            pcie += 4.0 * m.n_embd * n_prompt
    devs = tuple(DeviceWork(d.device, d.kind, bytes_[d.device], flops[d.device]) for d in plan.devices
                 if bytes_[d.device] or flops[d.device])
    return Workload("prefill", n_prompt, devs, crossings, pcie, n_calls, m.n_layer)


def _sum_min_range(lo: int, hi: int, cap: int) -> float:
    """sum_{x=lo}^{hi} min(x, cap) in closed form (0 when hi < lo)."""
    if hi < lo:
        return 0.0
    total = 0.0
    a, b = lo, min(hi, cap)
    if b >= a:
        total += (a + b) * (b - a + 1) / 2
    if hi > cap:
        total += cap * (hi - max(lo, cap + 1) + 1)
    return total


# ------------------------------------------------------------------------------------------
# times


def effective_threads(n_threads: int, constants: SpeedConstants) -> float:
    """CPU threads' combined throughput in units of one thread: ``1 + (n - 1) * host_thread_efficiency``."""
    return 1.0 + max(0, n_threads - 1) * constants.host_thread_efficiency


def workload_time_s(work: Workload, inputs: SpeedInputs) -> float:
    """Seconds for ``work`` under ``inputs`` (the roofline sum of the module docstring)."""
    c = inputs.constants
    t = 0.0
    for d in work.devices:
        r = inputs.rate(d.device)
        if d.kind == "host":
            bw = r.bandwidth_bytes_s * c.host_bw_efficiency
            threads = effective_threads(inputs.n_threads, c)
            if work.phase == "decode":
                bw = min(bw, threads * c.host_decode_bytes_s_per_thread)
            per_thread = c.host_decode_flop_s_per_thread if work.phase == "decode" else c.host_prefill_flop_s_per_thread
            flop_s = threads * per_thread
        else:
            bw = r.bandwidth_bytes_s * c.gpu_bw_efficiency
            flop_s = (r.flop_s or r.bandwidth_bytes_s * GPU_FLOP_PER_BYTE) * c.gpu_flop_efficiency
        t_mem = d.bytes_read / bw if bw > 0 else math.inf
        t_cmp = d.flops / flop_s if flop_s > 0 else math.inf
        t += max(t_mem, t_cmp)
    if work.pcie_bytes:
        pcie = min((r.pcie_bandwidth_bytes_s for r in inputs.rates.values() if r.pcie_bandwidth_bytes_s),
                   default=DEFAULT_PCIE_BANDWIDTH_BYTES_S)
        t += work.pcie_bytes / (pcie * c.pcie_efficiency)
    t += work.n_crossings * c.crossing_latency_s
    t += work.n_calls * (c.token_overhead_s + work.n_layer * c.layer_overhead_s)
    return t


def decode_tok_s(plan: MemoryPlan, inputs: SpeedInputs, depth: int = 0) -> float:
    """Predicted decode tokens/s at ``depth`` cached tokens: ``1 / t_decode(depth)``."""
    return 1.0 / workload_time_s(decode_workload(plan, depth, inputs.constants), inputs)


def prefill_tok_s(plan: MemoryPlan, inputs: SpeedInputs, n_prompt: int = 512, depth: int = 0) -> float:
    """Predicted prefill tokens/s for ``n_prompt`` tokens at ``depth``: ``n_prompt / t_prefill``."""
    return n_prompt / workload_time_s(prefill_workload(plan, n_prompt, depth, inputs.constants), inputs)


@dataclass(frozen=True)
class SpeedPrediction:
    """Predicted speed of one plan.

    Attributes:
        decode_tok_s: decode tokens/s at depth 0 (empty cache).
        decode_tok_s_at_full_ctx: decode tokens/s with the cache full (depth ``n_ctx_seq - 1``).
        prefill_tok_s: prefill tokens/s of a ``prefill_tokens`` prompt at depth 0.
        band: (low, high) decode tokens/s at depth 0, 1 sigma of the calibration's spread.
        curve: ``(depth, decode_tok_s)`` pairs from 0 to the full context.
        prefill_band: (low, high) of ``prefill_tok_s``.
        prefill_tokens: prompt length of ``prefill_tok_s``.
        n_threads: CPU threads assumed.
        n_calibration_runs: measured runs behind the constants (0: defaults).
        sources: where the bandwidth figures came from.
        inputs: the inputs used (for re-predicting variants; not serialised).
    """

    decode_tok_s: float
    decode_tok_s_at_full_ctx: float
    prefill_tok_s: float
    band: tuple[float, float]
    curve: tuple[tuple[int, float], ...]
    prefill_band: tuple[float, float] = (0.0, 0.0)
    prefill_tokens: int = 512
    n_threads: int = 1
    n_calibration_runs: int = 0
    sources: tuple[str, ...] = ()
    inputs: SpeedInputs | None = field(default=None, repr=False, compare=False)

    @property
    def badge(self) -> str:
        """The speed band of :attr:`decode_tok_s` (:func:`speed_band`)."""
        return speed_band(self.decode_tok_s)

    def to_dict(self) -> dict[str, Any]:
        """The ``speed`` object of ``kvtuner plan --json`` (tokens/s rounded to 3 significant digits
        is left to the reader; values are floats)."""
        return {
            "decode_tok_s": self.decode_tok_s,
            "decode_tok_s_at_full_ctx": self.decode_tok_s_at_full_ctx,
            "prefill_tok_s": self.prefill_tok_s,
            "band": list(self.band),
            "prefill_band": list(self.prefill_band),
            "prefill_tokens": self.prefill_tokens,
            "badge": self.badge,
            "badge_at_full_ctx": speed_band(self.decode_tok_s_at_full_ctx),
            "n_threads": self.n_threads,
            "n_calibration_runs": self.n_calibration_runs,
            "curve": [[d, v] for d, v in self.curve],
            "sources": list(self.sources),
        }


#: Decode bands, tokens/s: under 1 a reply of 1000 tokens takes over 16 minutes (abandon); 5-10
#: is about reading speed (interactive); 10 and more reads as fluent.
ABANDON_TOK_S = 1.0
INTERACTIVE_TOK_S = 5.0
FLUENT_TOK_S = 10.0


def speed_band(decode_tok_s: float) -> str:
    """The badge for a decode speed: ``"abandon"`` (< 1 tok/s), ``"offline"`` (1-5),
    ``"interactive"`` (5-10) or ``"fluent"`` (>= 10).

    Raises:
        SpeedModelError: not a number or negative.
    """
    if not isinstance(decode_tok_s, (int, float)) or math.isnan(decode_tok_s) or decode_tok_s < 0:
        raise SpeedModelError(f"decode speed must be a number of tokens/s >= 0, not {decode_tok_s!r}")
    if decode_tok_s < ABANDON_TOK_S:
        return "abandon"
    if decode_tok_s < INTERACTIVE_TOK_S:
        return "offline"
    if decode_tok_s < FLUENT_TOK_S:
        return "interactive"
    return "fluent"


def predict_speed(plan: MemoryPlan, inputs: SpeedInputs, *, prefill_tokens: int = 512) -> SpeedPrediction:
    """Predict decode (depth 0, full context, curve) and prefill speed for ``plan``.

    ``prefill_tokens`` is clamped to the context. The band is
    ``value * exp(-/+ inputs.sigma_log)``.

    Raises:
        SpeedModelError: a device of the plan has no rates in ``inputs``.
    """
    n_full = plan.n_ctx_seq - 1
    depths = sorted({round(n_full * i / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)})
    parts = _decode_parts(plan, inputs.constants)
    curve = tuple((d, 1.0 / workload_time_s(_assemble_decode(plan, parts, d), inputs)) for d in depths)
    dec0 = curve[0][1]
    dec_full = curve[-1][1]
    n_p = max(1, min(prefill_tokens, plan.n_ctx_seq))
    pre = prefill_tok_s(plan, inputs, n_p, 0)
    k = math.exp(inputs.sigma_log)
    kp = math.exp(inputs.sigma_log if inputs.prefill_sigma_log is None else inputs.prefill_sigma_log)
    sources = tuple(f"{r.device}: {r.source}" for r in inputs.rates.values() if r.source)
    return SpeedPrediction(
        decode_tok_s=dec0, decode_tok_s_at_full_ctx=dec_full, prefill_tok_s=pre,
        band=(dec0 / k, dec0 * k), curve=curve, prefill_band=(pre / kp, pre * kp), prefill_tokens=n_p,
        n_threads=inputs.n_threads, n_calibration_runs=inputs.n_calibration_runs, sources=sources, inputs=inputs,
    )
