"""Speed model: predicted decode and prefill tokens/s for a :class:`MemoryPlan`.

llama.cpp runs a sequence's layers device after device, so the times of the devices a token
passes through add up (ggml-backend's scheduler, ggml/src/ggml-backend.cpp ``ggml_backend_sched``).
Per device the model is a roofline (Williams et al., "Roofline", CACM 2009) over the kernels
llama.cpp picks for each weight type:

Decode (one token at KV depth ``D``)::

    t_decode(D) = sum_dev t_dev + pcie_bytes / (pcie_bw * pcie_efficiency) + n_crossings * crossing_latency_s
                  + token overhead (host: the probe's token_s; with a GPU: gpu_token_overhead_s)
                  + sum over RPC crossings (rtt + activation bytes / link)             (network)

    RPC devices (llama.cpp's RPC backend, ggml-rpc.cpp): every step in or out of an rpc-server's
    device sends the activations over the network - a hidden state of n_embd f32 per token
    (``ggml_backend_sched`` copies the split's input tensor; ``RPC_CMD_SET_TENSOR`` /
    ``RPC_CMD_GRAPH_COMPUTE`` / ``RPC_CMD_GET_TENSOR``), so a crossing costs one round trip plus
    4 x n_embd x tokens bytes at the link's throughput. Round trip: measured by kvtuner's RPC
    query (``RPC_CMD_DEVICE_COUNT``, median of 5) or :attr:`SpeedConstants.rpc_rtt_s`; throughput:
    ``--rpc-link`` or :attr:`SpeedConstants.rpc_link_bytes_s` (1 Gbit/s Ethernet). An RPC device
    computes at the rates of the catalogue card it is (``host:port=RTX 3090``) or the nearest in size.
    host:  t_dev = sum_T bytes_T / decode_bytes_s[T]                          (probe, per weight type T;
                                           MoE experts at expert_decode_bytes_s of the layer's expert shape)
                   + max(sum_hd head_cells_hd * attn_decode_s[hd], kv_bytes / stream_bytes_s)
                                                                                (probe per head size hd)
                   + n_layers_on_host * layer_s                                 (probe)
    GPU:   t_dev = (weight bytes + kv_bytes) / (bandwidth * gpu_bw_efficiency)  (catalogue or NVML)
                   + n_layers_on_gpu * gpu_layer_overhead_s

    bytes_T: the weights a token reads (weights.py: every 2-D weight once; of MoE experts
             n_expert_used / n_expert; the output matrix once; the input embedding one row)
    kv_bytes: sum over layers of bytes_per_cell * cells_read, cells_read = min(D + 1, window)
    head_cells: query heads x cells_read, per attention shape hd: the CPU flash-attention kernel
             walks the cache once per query head (ggml-cpu/ops.cpp ``ggml_compute_forward_flash_attn_ext_f16``),
             at a cost per cell the probe measures for each shape and K/V pair (f16 K/V takes the
             split-KV / tiled paths, other pairs the one-row path: cpu_probe.attn_key)

Prefill (``n_prompt`` tokens after ``D0`` cached ones, in ubatches of ``u = min(n_ubatch, n_prompt)``)::

    host:  sum_T flops_T / rate_T(batch) + sum_hd head_cells_hd * attn_prefill_s[hd]
           + calls * (token_s + n_layers * layer_prefill_s)
           rate_T(b) = prefill_flop_s[T] * b / (b + half_batch[T]) (probe); b = the ubatch's tokens,
           for MoE experts the tokens each expert gets, u * n_expert_used / n_expert, and
           the rate x host_moe_prefill_efficiency (MUL_MAT_ID: one token row at a time)
    GPU:   sum_T flops_T / (rate_T * efficiency_T) + attn_flops / (fp16 rate * gpu_fp16_efficiency)
           + weight bytes per ubatch / (bandwidth * gpu_bw_efficiency) + calls * gpu_token_overhead_s
           rate_T: quantized T -> int8 tensor ops/s (MMQ, ggml-cuda/mmq.cu ``ggml_cuda_should_use_mmq``:
                   int8 ``mma`` from Turing on, DP4A on Pascal), efficiency gpu_int8_efficiency;
                   F16/BF16/F32 -> FP16 tensor FLOP/s (cuBLAS, ``CUBLAS_COMPUTE_16F``),
                   efficiency gpu_fp16_efficiency
    flops_T = 2 * active parameters of type T * n_prompt (Kaplan et al. 2020, section 2.1: 2 N per token)
    attention FLOPs: 2 * n_head * (head_dim_k + head_dim_v) per (token, cached cell); flash
    attention skips masked cells (causal: token p reads min(p + 1, window) cells), without it
    every token of a ubatch reads the padded ``n_kv``.

With a GPU, an op of 32 or more rows runs on the GPU whatever device its weights or KV live on
(ggml-cuda.cu ``ggml_backend_cuda_device_offload_op``, ``GGML_OP_OFFLOAD_MIN_BATCH`` default 32):
in such a prefill, host-resident weights and KV cross PCIe once per ubatch and their FLOPs run
at the GPU's rates. The copies run at ``pcie_bw * pcie_efficiency`` from pinned memory and at
:attr:`SpeedConstants.pageable_h2d_share` of that from pageable memory (a memory-mapped model's
host weights, a KV cache in RAM) on a backend that stages such copies
(:func:`stages_pageable_copies`); of an expert tensor only the experts the ubatch uses cross
(:meth:`.weights.WeightSummary.expert_share`). With ``-nkvo`` and flash attention off llama.cpp
keeps the attention on the CPU instead (llama-graph.cpp ``build_attn_mha``): the host KV does not
cross, the activations do. A one-token decode runs each op where its weights or KV live: a layer whose
KV stays on the host (``-nkvo``, ``kv_gpu_layers``) computes its attention on the CPU, and the
activations cross PCIe twice per such layer (Q/K/V down, the result up); each change of device
along the layer sequence is one more crossing of ``n_embd * 4`` bytes.

A what-if host (``--host-mem``, ``--host-bw``, ``--host-cores``, ``--pcie``;
:class:`~kvtuner.core.hardware.specs.HostSpec` ``what_if``) is this machine's probed CPU kernels
moved to its cores, or without a probe its cores of a reference core (:func:`reference_core_rates`),
every host decode rate capped at the share of its RAM's achieved bandwidth that llama.cpp's
CPU decode reaches (:func:`cap_cpu_rates`, :data:`HOST_DECODE_BW_SHARE`), and its
PCIe link for every local GPU (:func:`gpu_rates`).

Where each constant comes from: the CPU rates from the probe (:mod:`.cpu_probe`, run by the
runner and stored per machine), the GPU figures from the catalogue
(:mod:`kvtuner.core.hardware.gpu_catalogue`: vendor datasheets) or NVML, the efficiencies and
overheads in :class:`SpeedConstants` (each with its source there). Calibration
(:mod:`.calibration`) scales them from this machine's measured runs.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..hardware.gpu_catalogue import GPU_CATALOGUE, GpuModel, match_nvml_name, pcie_bandwidth_bytes_s
from ..hardware.host import physical_cores
from ..hardware.specs import GpuSpec, HostSpec
from ..model.profile import ModelProfile
from ..plan.buffers import HOST
from ..plan.llama_constants import OFFLOAD_MIN_BATCH, pad_ctx
from ..plan.memory_plan import MemoryPlan
from ..plan.reserve_graph import last_layer_rows_only
from ..units import GiB
from .cpu_probe import CpuRates, ProbeError, is_lookup_type, layer_attn_key, nearest
from .regime import placement_regime, range_note, regime_range
from .weights import TypedWeights, WeightSummary, moved_weights, weight_summary

#: PCIe bandwidth assumed when neither NVML nor the catalogue tells (PCIe 4.0 x16 after encoding).
DEFAULT_PCIE_BANDWIDTH_BYTES_S = 16 * 1.9692e9
#: Host bandwidth assumed when the probe cannot run (dual-channel DDR4-3200 peaks at 51 GB/s; a
#: single thread streams about 20).
DEFAULT_HOST_BANDWIDTH_BYTES_S = 20e9
#: Catalogue cards standing in for a generic what-if GPU of a memory size (``--gpu-mem``): the
#: entry of that size most sold for local inference (the what-if presets of the app).
GENERIC_CARDS: dict[int, str] = {
    8 * GiB: "RTX 4060",
    12 * GiB: "RTX 3060 12GB",
    16 * GiB: "RTX 4060 Ti 16GB",
    24 * GiB: "RTX 3090",
    48 * GiB: "RTX A6000",
}
#: Depths at which the decode curve is evaluated (fractions of n_ctx_seq).
CURVE_POINTS = 17
#: Without a CPU probe: per-thread rates from this project's earlier measurements on a 2-core
#: AVX2/AVX-512 VM (benchmarks/speed_accuracy.py): 5 GB/s of weights per decode
#: thread, 30 GFLOP/s per prefill thread, 40 us per layer, 0.5 ms per token, and the flash-attention
#: kernel's 1280 B-equivalent per (head x cell) in decode and 1024 FLOP-equivalent in prefill.
FALLBACK_DECODE_BYTES_S_PER_THREAD = 5e9
FALLBACK_PREFILL_FLOP_S_PER_THREAD = 30e9
FALLBACK_LAYER_S = 40e-6
FALLBACK_TOKEN_S = 0.5e-3
FALLBACK_ATTN_DECODE_BYTES = 1280.0
FALLBACK_ATTN_PREFILL_FLOPS = 1024.0
#: What each CPU thread after the first adds (measured 1.36-1.67x for 2 threads on that VM); used
#: only to move probe rates to another thread count than they were measured at.
THREAD_EFFICIENCY = 0.55
#: One physical core of a what-if host that has no CPU probe (``--host-mem``/``--host-bw`` with
#: ``--host-cores``): this project's CPU probe at one thread on an AMD EPYC vCPU (AVX-512, VNNI;
#: benchmarks/moe_cpu_runs.json, ``here.probe``), the slowest quantized type of each figure:
#: decode 15.2 GB/s of MXFP4 weights (Q5_0 15.6, Q4_K 23.0, Q8_0 25.8), prefill 130 GFLOP/s
#: (Q5_0; Q8_0 184, Q4_K 260), flash attention 40 ns per (query head x cell) in decode and 8.3 ns
#: per (token x head x cell) in prefill (GQA 32/4/128). The 5 GB/s and 1280 B-equivalent per
#: thread of the ``FALLBACK_*`` figures came from an older 2-vCPU VM and put the CPU decode of
#: public rows on desktop hosts 25-70% low (benchmarks/offload_validation.py).
REFERENCE_CORE_DECODE_BYTES_S = 15e9
#: A table-lookup weight type's decode rate on a CPU without a probe, as a share of the reference
#: core's (the slowest streaming type, MXFP4): the i-quants and ternary types decode through
#: lookup tables and are bound by that work (:data:`~kvtuner.core.speed.cpu_probe.LOOKUP_TYPES`).
#: Measured by kvtuner's CPU probe at one thread against MXFP4 on an AVX-512 Xeon
#: (``benchmarks/lookup_type_rates.py``, benchmarks/results/2026-12-03-lookup-type-rates.md), capped
#: at 1 (a type faster than MXFP4 gets the reference figure, as every streaming type does).
LOOKUP_TYPE_DECODE_FACTOR: dict[str, float] = {
    "IQ1_S": 0.35,
    "IQ1_M": 0.33,
    "IQ2_XXS": 0.26,
    "IQ2_XS": 0.53,
    "IQ2_S": 0.70,
    "IQ3_XXS": 0.44,
    "IQ3_S": 0.52,
    "IQ4_NL": 1.0,
    "IQ4_XS": 0.80,
    "TQ1_0": 0.69,
    "TQ2_0": 1.0,
}
REFERENCE_CORE_PREFILL_FLOP_S = 130e9
REFERENCE_CORE_ATTN_DECODE_S = 4.0e-8
REFERENCE_CORE_ATTN_PREFILL_S = 8.3e-9
#: Share of a what-if host's achieved RAM bandwidth (the memory catalogue's typical read figure,
#: or ``--host-bw``) that llama.cpp's CPU decode reaches where it is memory-bound. A read benchmark
#: streams with every core and nothing else; a decode token runs hundreds of ops one after another,
#: each split into row chunks the threads take and end at a barrier (ggml-cpu.c
#: ``ggml_graph_compute_thread``, ``ggml_barrier``), and the quantized dot products
#: (ggml-cpu/quants.c ``ggml_vec_dot_*``) interleave decoding with the loads. Fitted
#: (``benchmarks/host_decode_fit.py``) as the median over the CPU-only public llama-bench rows of
#: ``benchmarks/cpu_decode_public_rows.json``, none of which is a row of the offload validation.
HOST_DECODE_BW_SHARE = 0.81


#: Calibration parameter name prefix for one weight type's host prefill scale.
PREFILL_TYPE_PARAM = "host_prefill_type:"
#: Appended to a weight type in a prefill workload when its matmul is ggml's MUL_MAT_ID (MoE
#: experts: ggml-cpu.c ``ggml_compute_forward_mul_mat_id``), another kernel than the dense
#: MUL_MAT of the same type, so a calibration run corrects the one it ran: ``"Q5_0@mul_mat_id"``.
MUL_MAT_ID_TAG = "@mul_mat_id"


def base_type(type_name: str) -> str:
    """The ggml type of a workload entry (``"Q5_0@mul_mat_id"`` -> ``"Q5_0"``)."""
    return type_name.split("@", 1)[0]


def expert_tag(type_name: str, key: str | None) -> str:
    """A workload entry's name for MoE expert weights of ``type_name`` in a layer whose expert
    shape is ``key`` (:func:`kvtuner.core.speed.expert_shapes.expert_key`; None: not known):
    ``"Q4_K@mul_mat_id:2048/768/128/8@Q4_K"``, or ``"Q4_K@mul_mat_id"``."""
    return type_name + MUL_MAT_ID_TAG + (f":{key}" if key else "")


def tagged_expert_key(type_name: str) -> str | None:
    """The expert shape of a workload entry named by :func:`expert_tag` (None for other entries)."""
    return type_name.partition(MUL_MAT_ID_TAG + ":")[2] or None


def kernel_tag(type_name: str) -> str:
    """The kernel of a workload entry, what calibration scales: :func:`expert_tag`'s name without
    the expert shape (``"Q4_K@mul_mat_id:2048/768/128/8@Q4_K"`` -> ``"Q4_K@mul_mat_id"``)."""
    head, sep, _ = type_name.partition(MUL_MAT_ID_TAG + ":")
    return head + MUL_MAT_ID_TAG if sep else type_name


class SpeedModelError(ValueError):
    """Bad input to the speed model; the message says what to change."""


@dataclass(frozen=True)
class SpeedConstants:
    """The model's constants beyond the measured rates (defaults: before any calibration).

    Host rates come from the CPU probe; the ``host_*_scale`` factors (1 = as probed) are what a
    calibration on this machine's benches moves: rates are multiplied, costs divided by them.

    GPU constants were fitted (least squares in log space: ``benchmarks/speed_validation.py --gpu
    --fit-gpu``) on the five public llama-bench rows of the fitting set in
    ``benchmarks/speed_public_gpu.json`` (``"set": "fit"``: RTX 3090 llama 7B F16 and Q4_0 from
    llama.cpp PR #4766, RTX 4090 LLaMA 3 8B Q4_K_M and F16 from XiongjieDai/GPU-Benchmarks-on-LLM-
    Inference, RTX 3090 Ti -nkvo from PR #4812); the validation rows were not used. Those builds
    (January-May 2024) ran quantized prefill through cuBLAS after dequantisation, before MMQ used
    int8 tensor cores (llama.cpp PR #7676, June 2024: +65 % pp512 on an RTX 4090), and had no CUDA
    graphs for the January rows: on a current build prefill of quantized models is faster and the
    per-layer cost smaller than predicted here.

    Attributes:
        host_decode_scale: multiplies the probe's decode bytes/s.
        host_prefill_scale: multiplies the probe's prefill FLOP/s (every weight type).
        host_prefill_type_scales: ``((type name, factor), ...)``: multiplies the probe's prefill
            FLOP/s of that weight type on top of ``host_prefill_scale``; what a calibration run
            moves, in proportion to the time its model spends in each type's kernel. MoE experts'
            MUL_MAT_ID has its own entries (``"Q5_0@mul_mat_id"``, :data:`MUL_MAT_ID_TAG`): a dense
            model's bench does not move them. One shared
            scale did not transfer: on the 2-core VM the probe's Q5_0 rate was about 30 % optimistic
            (most of the default model's prefill) while its Q8_0 rate was within 8 %
            (benchmarks/speed_cpu_runs.json), so a scale fitted on the default model made every
            Q8_0 row 17-29 % too slow.
        host_attn_scale: divides the probe's attention cost per head and cell.
        host_overhead_scale: divides the probe's per-layer and per-token costs.
        gpu_bw_efficiency: share of the datasheet bandwidth decode reaches (weights + KV); fitted 0.88.
        gpu_int8_efficiency: share of the int8 tensor (or DP4A) rate quantized prefill reaches; fitted 0.16.
        gpu_fp16_efficiency: share of the FP16 tensor rate cuBLAS and attention reach; fitted 0.41.
        gpu_token_overhead_s: fixed time per llama_decode call on a GPU (launch, synchronise,
            copy the logits back, sample), s; fitted 0.68 ms.
        gpu_layer_overhead_s: per offloaded layer per call (kernel launches), s; fitted 71 us.
        pcie_efficiency: share of the PCIe link rate a copy reaches (PCIe 4.0 x16 copies reach
            about 26 of 31.5 GB/s: NVIDIA bandwidthTest, pinned memory).
        pageable_h2d_share: share of the pinned copy rate a host-to-device copy from pageable
            memory reaches. CUDA stages such a copy through a pinned buffer of its own (CUDA C++
            Programming Guide, "Page-Locked Host Memory"; NVIDIA's "How to Optimize Data
            Transfers in CUDA C/C++"), and llama.cpp leaves two kinds of host data pageable: weights
            of a memory-mapped model (src/llama-model.cpp or, in older builds,
            src/llama-model-loader.cpp: "avoid using a host buffer when using mmap"; mmap is the
            default ``--load-mode auto``) and a KV cache kept on the host (src/llama-kv-cache.cpp:
            ``ggml_backend_cpu_buffer_type``). Without mmap the weights are in the GPU's pinned
            host buffer, unless ``--no-host`` or a failed pinned allocation leaves them plain.
            0.57 is the median per system of pageable / pinned bandwidthTest rates on 12 PCIe
            systems (benchmarks/h2d_public_rows.json, ``benchmarks/h2d_fit.py``); the spread is
            0.19-0.94 (single 16 MiB copies below the link's peak, a server likely reading remote
            NUMA memory and laptops among them).
        crossing_latency_s: fixed cost of one device crossing in a decode (copy, synchronise, the
            CPU op on the way), s; fitted 91 us to the -nkvo row of llama.cpp PR #4812 (RTX 3090 Ti,
            llama 7B Q4_0: tg128 127.4 -> 60.0 tok/s with the KV on the host).
        host_moe_prefill_efficiency: share of the probe's prefill rate (a dense MUL_MAT at that
            many rows) that MoE expert matmuls reach on the CPU, where ggml-cpu's MUL_MAT_ID
            multiplies one token row at a time (ggml-cpu.c ``ggml_compute_forward_mul_mat_id_one_chunk``);
            (the expert probe times the experts' decode only: cpu_probe's module docstring says
            why). Fitted on the one MoE row of the
            CPU fitting set (granite-3.0-1b-a400m Q4_K_M, depth 0, benchmarks/speed_cpu_runs.json;
            ``benchmarks/moe_cpu_validation.py --fit``), validated on the other MoE rows there.
    """

    host_decode_scale: float = 1.0
    host_prefill_scale: float = 1.0
    host_prefill_type_scales: tuple[tuple[str, float], ...] = ()
    host_attn_scale: float = 1.0
    host_overhead_scale: float = 1.0
    gpu_bw_efficiency: float = 0.88
    gpu_int8_efficiency: float = 0.16
    gpu_fp16_efficiency: float = 0.41
    gpu_token_overhead_s: float = 0.68e-3
    gpu_layer_overhead_s: float = 71e-6
    pcie_efficiency: float = 0.8
    pageable_h2d_share: float = 0.57
    crossing_latency_s: float = 91e-6
    host_moe_prefill_efficiency: float = 0.45
    #: RPC link defaults (no measurement, no --rpc-link): 1 Gbit/s Ethernet at ~94% goodput
    #: (TCP/IP over 1500-byte frames) and a 0.3 ms LAN round trip.
    rpc_link_bytes_s: float = 117.5e6
    rpc_rtt_s: float = 3e-4

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if name == "host_prefill_type_scales":
                for typ, v in value:
                    if not (isinstance(typ, str) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                        raise SpeedModelError(f"prefill scale of {typ!r} must be a finite number > 0, not {v!r}")
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise SpeedModelError(f"speed constant {name} must be a finite number >= 0, not {value!r}")

    def scaled(self, **factors: float) -> SpeedConstants:
        """A copy with the named constants multiplied by ``factors``; a name
        ``host_prefill_type:TYPE`` multiplies that weight type's prefill scale."""
        types = dict(self.host_prefill_type_scales)
        plain = {}
        for k, v in factors.items():
            if k.startswith(PREFILL_TYPE_PARAM):
                typ = k[len(PREFILL_TYPE_PARAM) :]
                types[typ] = types.get(typ, 1.0) * v
            else:
                plain[k] = getattr(self, k) * v
        return replace(self, host_prefill_type_scales=tuple(sorted(types.items())), **plain)

    def prefill_scale(self, type_name: str) -> float:
        """The host prefill rate factor for weights of ``type_name`` (dimensionless)."""
        return self.host_prefill_scale * dict(self.host_prefill_type_scales).get(kernel_tag(type_name), 1.0)


@dataclass(frozen=True)
class DeviceRates:
    """Rates of one device.

    Attributes:
        device: ``CUDA0`` ... or ``CPU``.
        bandwidth_bytes_s: memory bandwidth, bytes/s (GPU: datasheet or NVML; host: the numpy probe).
        flop_s: GPU FP32 FLOP/s (None for the host).
        pcie_bandwidth_bytes_s: the GPU's host link, bytes/s.
        source: where the figures came from.
        fp16_flop_s: GPU FP16 tensor FLOP/s (dense, FP16 accumulate).
        int8_op_s: GPU int8 tensor (or DP4A) ops/s.
        cpu: the host's probe rates (None: not probed, fallbacks used).
    """

    device: str
    bandwidth_bytes_s: float
    flop_s: float | None = None
    pcie_bandwidth_bytes_s: float | None = None
    source: str = ""
    fp16_flop_s: float | None = None
    int8_op_s: float | None = None
    cpu: CpuRates | None = None
    link_bytes_s: float | None = None
    link_rtt_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (stored with calibration runs)."""
        return {
            "bandwidth_bytes_s": self.bandwidth_bytes_s,
            "flop_s": self.flop_s,
            "pcie_bandwidth_bytes_s": self.pcie_bandwidth_bytes_s,
            "source": self.source,
            "fp16_flop_s": self.fp16_flop_s,
            "int8_op_s": self.int8_op_s,
            "cpu": self.cpu.to_dict() if self.cpu else None,
            "link_bytes_s": self.link_bytes_s,
            "link_rtt_s": self.link_rtt_s,
        }

    @classmethod
    def from_dict(cls, device: str, d: dict[str, Any]) -> DeviceRates:
        """Inverse of :meth:`to_dict` (KeyError/TypeError/ValueError when malformed)."""
        cpu = CpuRates.from_dict(d["cpu"]) if d.get("cpu") else None
        return cls(
            device,
            float(d["bandwidth_bytes_s"]),
            d.get("flop_s"),
            d.get("pcie_bandwidth_bytes_s"),
            str(d.get("source", "")),
            d.get("fp16_flop_s"),
            d.get("int8_op_s"),
            cpu,
            d.get("link_bytes_s"),
            d.get("link_rtt_s"),
        )


@dataclass(frozen=True)
class SpeedInputs:
    """Everything besides the plan that a prediction needs (kept on the prediction so the
    advisor can re-predict variants of the same plan).

    ``rates``: per device (``CUDA0`` ..., ``CPU``); ``n_threads``: CPU threads;
    ``constants``: effective constants; ``sigma_log``: 1-sigma relative uncertainty (natural log)
    of a decode prediction, ``prefill_sigma_log`` of a prefill one (None: ``sigma_log``);
    ``n_calibration_runs``: measured runs behind ``constants``; ``calibrated_regimes``: the
    ``(regime, phase)`` pairs (:func:`.regime.placement_regime`, ``"decode"`` / ``"prefill"``)
    that runs of this model family on this machine measured; ``host``: the host predicted for
    (:meth:`~kvtuner.core.hardware.specs.HostSpec.speed_dict`; None: not said).
    """

    rates: dict[str, DeviceRates]
    n_threads: int
    constants: SpeedConstants = field(default_factory=SpeedConstants)
    sigma_log: float = 0.35
    n_calibration_runs: int = 0
    prefill_sigma_log: float | None = None
    host: dict[str, Any] | None = None
    calibrated_regimes: frozenset[tuple[str, str]] = frozenset()

    def rate(self, device: str) -> DeviceRates:
        """Rates of ``device``.

        Raises:
            SpeedModelError: no rates for that device.
        """
        try:
            return self.rates[device]
        except KeyError:
            raise SpeedModelError(f"no rates known for device {device}: pass its GpuSpec to speed_inputs()") from None


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


def effective_threads(n_threads: int) -> float:
    """CPU threads' combined throughput in units of one thread: ``1 + (n - 1) * THREAD_EFFICIENCY``."""
    return 1.0 + max(0, n_threads - 1) * THREAD_EFFICIENCY


def _decode_table(cores_bytes_s: float, bandwidth_bytes_s: float) -> dict[str, float]:
    """Decode bytes/s per weight type of a CPU without a probe whose cores stream
    ``cores_bytes_s``: ``"*"`` for every streaming type, each table-lookup type at its
    :data:`LOOKUP_TYPE_DECODE_FACTOR` share of the cores' figure; all capped at ``bandwidth_bytes_s``."""
    table = {"*": min(bandwidth_bytes_s, cores_bytes_s)}
    for t, f in LOOKUP_TYPE_DECODE_FACTOR.items():
        table[t] = min(bandwidth_bytes_s, cores_bytes_s * min(1.0, f))
    return table


def kv_stream_rate(decode_bytes_s: dict[str, float]) -> float:
    """Bytes/s at which the CPU reads KV cache rows in decode: the fastest streaming type of a
    decode table (the K/V rows go through ``vec_dot`` of f16 or q8_0, streaming kernels). A
    table holding only table-lookup types (a probe of an all-i-quant model) gives each its
    streaming equivalent, its rate over its :data:`LOOKUP_TYPE_DECODE_FACTOR` share. Rates that
    are not positive are no reading.

    Raises:
        ProbeError: no positive rate in the table."""
    rates = {t: v for t, v in decode_bytes_s.items() if v > 0}
    if not rates:
        raise ProbeError("no CPU rates: run the CPU probe (kvtuner probe)")
    streaming = [v for t, v in rates.items() if not is_lookup_type(t)]
    if streaming:
        return max(streaming)
    return max(v / min(1.0, LOOKUP_TYPE_DECODE_FACTOR.get(t.upper(), 1.0)) for t, v in rates.items())


def fallback_cpu_rates(n_threads: int, host_bandwidth_bytes_s: float) -> CpuRates:
    """CPU rates without a probe (the ``FALLBACK_*`` constants): every streaming weight type decodes
    at ``min(copy bandwidth, threads * 5 GB/s)``, a table-lookup type at its
    :data:`LOOKUP_TYPE_DECODE_FACTOR` share of the threads' figure, and all prefill at
    ``threads * 30 GFLOP/s``."""
    thr = effective_threads(n_threads)
    flop = thr * FALLBACK_PREFILL_FLOP_S_PER_THREAD
    return CpuRates(
        n_threads,
        _decode_table(thr * FALLBACK_DECODE_BYTES_S_PER_THREAD, host_bandwidth_bytes_s),
        {"*": flop},
        FALLBACK_LAYER_S,
        FALLBACK_TOKEN_S,
        {"*": FALLBACK_ATTN_DECODE_BYTES / (thr * FALLBACK_DECODE_BYTES_S_PER_THREAD)},
        {"*": FALLBACK_ATTN_PREFILL_FLOPS / flop},
        source="assumed (no CPU probe)",
    )


def reference_core_rates(n_cores: int, bandwidth_bytes_s: float) -> CpuRates:
    """CPU rates of a what-if host without a probe: ``n_cores`` physical cores of the
    ``REFERENCE_CORE_*`` figures (a table-lookup type at its :data:`LOOKUP_TYPE_DECODE_FACTOR`
    share), added linearly, every decode rate capped at the RAM's
    ``bandwidth_bytes_s``. Linear because ggml-cpu splits each matmul's rows (and each attention's
    heads) into chunks the threads take in turn (ggml-cpu.c ``ggml_compute_forward_mul_mat``,
    ``ggml_compute_forward_mul_mat_id``): on physical cores their streams add until the RAM's
    bandwidth caps a decode (the roofline's memory roof; llama.cpp PR #6915: "generation is
    generally limited by memory bandwidth"; issue #12966: a 20-core i7-14700K gains nothing
    past 3-4 threads)."""
    n = max(1, int(n_cores))
    return CpuRates(
        n,
        _decode_table(n * REFERENCE_CORE_DECODE_BYTES_S, bandwidth_bytes_s),
        {"*": n * REFERENCE_CORE_PREFILL_FLOP_S},
        FALLBACK_LAYER_S,
        FALLBACK_TOKEN_S,
        {"*": REFERENCE_CORE_ATTN_DECODE_S / n},
        {"*": REFERENCE_CORE_ATTN_PREFILL_S / n},
        source=f"assumed (no CPU probe): {n} reference cores",
    )


def rates_for_threads(rates: CpuRates, n_threads: int) -> CpuRates:
    """``rates`` moved to ``n_threads`` threads by :func:`effective_threads` (identity when equal)."""
    if rates.n_threads == n_threads:
        return rates
    k = effective_threads(n_threads) / effective_threads(rates.n_threads)
    return replace(
        rates,
        n_threads=n_threads,
        decode_bytes_s={t: v * k for t, v in rates.decode_bytes_s.items()},
        prefill_flop_s={t: v * k for t, v in rates.prefill_flop_s.items()},
        attn_decode_s={t: v / k for t, v in rates.attn_decode_s.items()},
        attn_prefill_s={t: v / k for t, v in rates.attn_prefill_s.items()},
        expert_decode_bytes_s={t: v * k for t, v in rates.expert_decode_bytes_s.items()},
        source=f"{rates.source}, moved from {rates.n_threads} to {n_threads} threads",
    )


def cap_cpu_rates(rates: CpuRates, bandwidth_bytes_s: float, why: str = "") -> CpuRates:
    """``rates`` on a host whose RAM reaches ``bandwidth_bytes_s``: every decode rate (bytes of
    weights per second, dense and expert) at most that bandwidth. A decode token streams each
    host-resident weight once (ggml-cpu's MUL_MAT / MUL_MAT_ID read every row of ``src0``), so
    the RAM's achieved bandwidth bounds it whatever the cores could compute (the roofline's
    memory roof; Williams et al. 2009). ``why``: appended to the source line (where the cap comes from)."""

    def cap(table: dict[str, float]) -> dict[str, float]:
        return {t: min(v, bandwidth_bytes_s) for t, v in table.items()}

    return replace(
        rates,
        decode_bytes_s=cap(rates.decode_bytes_s),
        expert_decode_bytes_s=cap(rates.expert_decode_bytes_s),
        source=f"{rates.source}, decode capped at {bandwidth_bytes_s / 1e9:.1f} GB/s{why}",
    )


def cpu_rate(table: dict[str, float], type_name: str) -> float:
    """The rate of ``type_name`` in a probe table (:func:`kvtuner.core.speed.cpu_probe.nearest`:
    its own, else the probed type nearest in bits per weight, else the fallback ``"*"``).

    Raises:
        SpeedModelError: an empty table.
    """
    try:
        return nearest(table, type_name)
    except ProbeError as exc:
        raise SpeedModelError(str(exc)) from None


def catalogue_entry(gpu: GpuSpec) -> GpuModel:
    """The catalogue entry whose figures a GpuSpec's rates use: its own entry (``--gpu NAME``, or
    NVML's name); for a generic card (``--gpu-mem``) or an unknown name the card of
    :data:`GENERIC_CARDS` nearest in memory size."""
    if gpu.catalogue and gpu.catalogue in GPU_CATALOGUE:
        return GPU_CATALOGUE[gpu.catalogue]
    if not gpu.what_if:
        hit = match_nvml_name(gpu.name, gpu.total_bytes)
        if hit is not None:
            return hit
    size = min(GENERIC_CARDS, key=lambda b: (abs(b - gpu.total_bytes), b))
    return GPU_CATALOGUE[GENERIC_CARDS[size]]


def gpu_rates(gpu: GpuSpec, pcie_link: tuple[int, int] | None = None) -> DeviceRates:
    """Rates of one GPU: bandwidth and PCIe from NVML where the GpuSpec has them (measured clocks
    and bus width), else the catalogue; tensor rates from the catalogue entry
    (:func:`catalogue_entry`). ``pcie_link``: the host slot's ``(generation, lanes)``
    (``--pcie``); a link trains to the lower generation and the fewer lanes of card and slot
    (PCI Express Base Specification, link training), so a card of the catalogue gets
    ``min(gen) x min(lanes)`` and any other card the slot's link; a unified-memory GPU (an APU,
    Apple silicon) has no link and keeps its own figure."""
    entry = catalogue_entry(gpu)
    own = gpu.catalogue == entry.name or (not gpu.what_if and match_nvml_name(gpu.name, gpu.total_bytes) is entry)
    src = []
    bw = gpu.mem_bandwidth_bytes_s or entry.mem_bandwidth_bytes_s
    if gpu.mem_bandwidth_bytes_s and not gpu.what_if:
        src.append("bandwidth from NVML (memory clock x bus width)")
    else:
        src.append(f"bandwidth of the {entry.name} (catalogue)")
    pcie = gpu.pcie_bandwidth_bytes_s or entry.pcie_bandwidth_bytes_s
    if gpu.unified or entry.pcie_gen == 0:
        # one memory pool with the CPU: no link to train, whatever slot the host has
        src.append("one memory pool with the CPU (no PCIe link)")
    elif pcie_link is not None and gpu.endpoint is None:
        gen, lanes = pcie_link
        if own:
            gen, lanes = min(gen, entry.pcie_gen), min(lanes, entry.pcie_lanes)
        pcie = pcie_bandwidth_bytes_s(gen, lanes)
        src.append(f"PCIe {gen}.0 x{lanes} (the what-if host's slot)")
    else:
        src.append(
            "PCIe from NVML"
            if (gpu.pcie_bandwidth_bytes_s and not gpu.what_if)
            else f"PCIe {entry.pcie_gen}.0 x{entry.pcie_lanes}"
        )
    src.append(f"tensor rates of the {entry.name}" + ("" if own else " (nearest catalogue card)"))
    if gpu.endpoint is not None:
        src.append(
            f"RPC link to {gpu.endpoint}: "
            + ("round trip measured" if gpu.link_rtt_s else "round trip assumed")
            + (", throughput given" if gpu.link_bytes_s else ", throughput assumed")
        )
    return DeviceRates(
        gpu.device,
        float(bw),
        entry.fp32_flop_s,
        float(pcie),
        ", ".join(src),
        entry.fp16_tensor_flop_s if entry.has_int8_tensor_cores else entry.fp32_flop_s,
        entry.int8_op_s,
        link_bytes_s=gpu.link_bytes_s,
        link_rtt_s=gpu.link_rtt_s,
    )


def host_rates(
    host: HostSpec | None = None,
    *,
    measure: bool = True,
    cpu: CpuRates | None = None,
    n_threads: int | None = None,
    decode_bw_share: float = HOST_DECODE_BW_SHARE,
) -> DeviceRates:
    """Rates of the host: bandwidth from the HostSpec, else the numpy probe, else the default;
    ``cpu``: the CPU probe's rates (moved to ``n_threads``), else :func:`fallback_cpu_rates`.

    A what-if host (``host.what_if`` with a bandwidth: ``--host-mem``/``--host-bw``) is this
    machine's CPU kernels moved to its cores (:func:`rates_for_threads`), or without a probe
    its cores of the reference core (:func:`reference_core_rates`), with every decode rate
    capped at ``decode_bw_share`` of its RAM's achieved bandwidth (:func:`cap_cpu_rates`,
    :data:`HOST_DECODE_BW_SHARE`)."""
    what_if = host is not None and host.what_if and bool(host.mem_bandwidth_bytes_s)
    if host is not None and host.mem_bandwidth_bytes_s:
        bw = float(host.mem_bandwidth_bytes_s)
        src = (
            f"host bandwidth of the what-if host ({host.memory or 'given'}: {bw / 1e9:.1f} GB/s)"
            if what_if
            else "host bandwidth given"
        )
    elif measure:
        bw, src = measure_host_bandwidth(), "host bandwidth measured (numpy copy)"
    else:
        bw, src = DEFAULT_HOST_BANDWIDTH_BYTES_S, "host bandwidth assumed"
    threads = (
        n_threads
        or (host.n_cores if host is not None and host.n_cores else None)
        or (cpu.n_threads if cpu else physical_cores())
    )
    decode_bw = bw * decode_bw_share
    if cpu is not None:
        rates = rates_for_threads(cpu, threads)
    elif what_if:
        rates = reference_core_rates(threads, decode_bw)
    else:
        rates = fallback_cpu_rates(threads, bw)
    if what_if:
        share = (
            f" ({decode_bw_share:g} of {bw / 1e9:.1f} GB/s: llama.cpp's CPU decode share)"
            if decode_bw_share != 1
            else ""
        )
        rates = cap_cpu_rates(rates, decode_bw, share)
    return DeviceRates(HOST, bw, source=f"{src}; CPU kernels: {rates.source}", cpu=rates)


def speed_inputs(
    gpus: Sequence[GpuSpec] = (),
    host: HostSpec | None = None,
    *,
    n_threads: int | None = None,
    constants: SpeedConstants | None = None,
    sigma_log: float = 0.35,
    n_calibration_runs: int = 0,
    measure: bool = True,
    cpu: CpuRates | None = None,
    decode_bw_share: float = HOST_DECODE_BW_SHARE,
) -> SpeedInputs:
    """Build :class:`SpeedInputs` for the given hardware; ``cpu``: the CPU probe's rates;
    ``decode_bw_share``: :func:`host_rates`' share of a what-if host's RAM bandwidth.

    Raises:
        SpeedModelError: ``n_threads`` below 1.
    """
    threads = physical_cores() if n_threads is None else int(n_threads)
    if threads < 1:
        raise SpeedModelError(f"n_threads must be 1 or more, not {n_threads}")
    link = host.pcie_link if host is not None else None
    rates = {g.device: gpu_rates(g, link) for g in gpus}
    rates[HOST] = host_rates(host, measure=measure, cpu=cpu, n_threads=threads, decode_bw_share=decode_bw_share)
    return SpeedInputs(
        rates,
        threads,
        constants or SpeedConstants(),
        sigma_log,
        n_calibration_runs,
        host=host.speed_dict() if host is not None else None,
    )


# ------------------------------------------------------------------------------------------
# workloads


@dataclass(frozen=True)
class DeviceWork:
    """What one device does in a workload.

    Attributes:
        device, kind: ``CUDA0``/``gpu`` or ``CPU``/``host``.
        weights: ``(ggml type, bytes read, FLOPs, batch)`` per weight type and batch (the rows
            each matmul gets: 1 in decode, the ubatch's tokens in a prompt, fewer for MoE experts).
        kv_bytes: KV cache bytes read.
        attn_flops: attention FLOPs (QK^T and softmax(QK^T)V).
        head_cells: ``(attention shape, query heads x cells)`` pairs of the attention computed
            here (shape: :func:`~kvtuner.core.speed.cpu_probe.attn_key`, ``"32/8/128"``).
        n_layers: repeating layers computed here (per-layer overheads).
    """

    device: str
    kind: str  # "gpu" | "host"
    weights: tuple[tuple[str, float, float, float], ...] = ()
    kv_bytes: float = 0.0
    attn_flops: float = 0.0
    head_cells: tuple[tuple[str, float], ...] = ()
    n_layers: int = 0

    @property
    def bytes_read(self) -> float:
        """Weights and KV bytes read."""
        return sum(w[1] for w in self.weights) + self.kv_bytes

    @property
    def flops(self) -> float:
        """Weight and attention FLOPs."""
        return sum(w[2] for w in self.weights) + self.attn_flops

    @property
    def n_head_cells(self) -> float:
        """Query heads x cells over every head size."""
        return sum(c for _, c in self.head_cells)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {
            "device": self.device,
            "kind": self.kind,
            "weights": [list(w) for w in self.weights],
            "kv_bytes": self.kv_bytes,
            "attn_flops": self.attn_flops,
            "head_cells": [list(h) for h in self.head_cells],
            "n_layers": self.n_layers,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceWork:
        """Inverse of :meth:`to_dict`."""
        return cls(
            str(d["device"]),
            str(d["kind"]),
            tuple((str(t), float(b), float(f), float(n)) for t, b, f, n in d["weights"]),
            float(d["kv_bytes"]),
            float(d["attn_flops"]),
            tuple((str(h), float(c)) for h, c in d["head_cells"]),
            int(d["n_layers"]),
        )


@dataclass(frozen=True)
class Workload:
    """The work of one decode step, or of one whole prefill (``n_tokens`` tokens).

    ``n_crossings``: device crossings; ``pcie_bytes``: bytes over PCIe; ``n_calls``: llama_decode
    graph evaluations (ubatches); ``n_layer``: repeating layers; ``net``: per RPC device
    ``(device, crossings, bytes)`` sent over the network to or from it; ``weight_copy_bytes``:
    the part of ``pcie_bytes`` that is host-resident weights copied to the GPU for the ubatches
    op offload moves there (a prefill's; 0 in a decode); ``pageable_bytes``: the part of
    ``pcie_bytes`` copied from pageable host memory (memory-mapped weights, a host KV cache),
    at :attr:`SpeedConstants.pageable_h2d_share` of the pinned rate.
    """

    phase: str  # "decode" | "prefill"
    n_tokens: int
    devices: tuple[DeviceWork, ...]
    n_crossings: float
    pcie_bytes: float
    n_calls: int
    n_layer: int
    net: tuple[tuple[str, float, float], ...] = ()
    weight_copy_bytes: float = 0.0
    pageable_bytes: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (stored with calibration runs)."""
        return {
            "phase": self.phase,
            "n_tokens": self.n_tokens,
            "devices": [d.to_dict() for d in self.devices],
            "n_crossings": self.n_crossings,
            "pcie_bytes": self.pcie_bytes,
            "n_calls": self.n_calls,
            "n_layer": self.n_layer,
            "net": [list(x) for x in self.net],
            "weight_copy_bytes": self.weight_copy_bytes,
            "pageable_bytes": self.pageable_bytes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        """Inverse of :meth:`to_dict`."""
        return cls(
            str(d["phase"]),
            int(d["n_tokens"]),
            tuple(DeviceWork.from_dict(x) for x in d["devices"]),
            float(d["n_crossings"]),
            float(d["pcie_bytes"]),
            int(d["n_calls"]),
            int(d["n_layer"]),
            tuple((str(a), float(b), float(c)) for a, b, c in d.get("net", ())),
            float(d.get("weight_copy_bytes", 0.0)),
            float(d.get("pageable_bytes", 0.0)),
        )


class _Acc:
    """Per-device accumulator while a workload is built."""

    def __init__(self, plan: MemoryPlan) -> None:
        self.kinds = {d.device: d.kind for d in plan.devices}
        self.w: dict[str, dict[tuple[str, float], list[float]]] = {d: {} for d in self.kinds}
        self.kv = dict.fromkeys(self.kinds, 0.0)
        self.af = dict.fromkeys(self.kinds, 0.0)
        self.hc: dict[str, dict[str, float]] = {d: {} for d in self.kinds}
        self.nl = dict.fromkeys(self.kinds, 0)

    def weight(self, dev: str, t: str, b: float, f: float, batch: float = 1.0) -> None:
        acc = self.w[dev].setdefault((t, batch), [0.0, 0.0])
        acc[0] += b
        acc[1] += f

    def cells(self, dev: str, shape: str, n: float) -> None:
        self.hc[dev][shape] = self.hc[dev].get(shape, 0.0) + n

    def device(self, d: str) -> DeviceWork:
        return DeviceWork(
            d,
            self.kinds[d],
            tuple((t, b, f, n) for (t, n), (b, f) in sorted(self.w[d].items())),
            self.kv[d],
            self.af[d],
            tuple(sorted(self.hc[d].items())),
            self.nl[d],
        )

    def devices(self) -> tuple[DeviceWork, ...]:
        out = []
        for d in self.kinds:
            dw = self.device(d)
            if dw.bytes_read or dw.flops or dw.head_cells:
                out.append(dw)
        return tuple(out)


def _devices_of(plan: MemoryPlan) -> tuple[list[str], str]:
    """Device of each repeating layer's weights, and the output layer's."""
    n = plan.model.n_layer
    devs = list(plan.layer_devices[:n]) or [HOST] * n
    out = (
        plan.layer_devices[n]
        if len(plan.layer_devices) > n
        else next((g.device for g in plan.gpus if g.has_output), HOST)
    )
    return devs, out


def _graph_layers(plan: MemoryPlan) -> int:
    """Repeating layers a token runs through: the trunk's ``n_layer``, without the MTP/NextN
    blocks at the end of the file (the architectures' graphs loop over ``n_layer -
    nextn_predict_layers``, e.g. src/models/qwen35moe.cpp, src/models/glm4-moe.cpp)."""
    return min(plan.model.n_layer, plan.model.structure.n_layer or plan.model.n_layer)


def _window(plan: MemoryPlan, swa: bool) -> int:
    return plan.model.n_swa if (swa and plan.model.n_swa) else plan.n_ctx_seq


def _attn_dims(plan: MemoryPlan, il: int) -> tuple[int, int]:
    m = plan.model
    return m.n_head[il], m.head_dim_k_at(il) + m.head_dim_v_at(il)


def _layer_weights(
    s: WeightSummary,
    il: int,
    n_tokens_per_call: int,
    moved: dict[int, list[tuple[str, TypedWeights]]] | None = None,
) -> list[tuple[str | None, str, float, float, float, bool]]:
    """(device, type, bytes read per call, FLOPs per token, rows per matmul, expert?) of layer ``il``'s
    weights: an expert gets ``u * n_expert_used / n_expert`` of a ubatch's ``u`` tokens (at least
    1). ``device`` is None for weights on the layer's device, else where a tensor override put
    them (``moved``: :func:`.weights.moved_weights`)."""
    share = s.expert_share(n_tokens_per_call)
    act = s.active_fraction()
    u = float(n_tokens_per_call)
    groups: list[tuple[str | None, TypedWeights]] = [(None, w) for w in s.layers[il]]
    for dev, mw in (moved or {}).get(il, ()):
        groups = [
            (d, replace(w, bytes_=max(0, w.bytes_ - mw.bytes_), params=max(0, w.params - mw.params)))
            if d is None and (w.ggml_type, w.expert) == (mw.ggml_type, mw.expert)
            else (d, w)
            for d, w in groups
        ]
        groups.append((dev, mw))
    return [
        (
            d,
            w.ggml_type,
            w.bytes_ * (share if w.expert else 1.0),
            2.0 * w.params * (act if w.expert else 1.0),
            max(1.0, u * act) if w.expert else u,
            w.expert,
        )
        for d, w in groups
        if w.bytes_ or w.params
    ]


def _attn_crossing_bytes(m: ModelProfile, il: int) -> float:
    """Bytes per token that cross between devices when layer ``il``'s attention runs away from its
    weights: Q, K and V (f32) to the attention's device and its result back."""
    hk, hv = m.head_dim_k_at(il), m.head_dim_v_at(il)
    return 4.0 * (m.n_head[il] * hk + m.n_head_kv[il] * (hk + hv) + m.n_head[il] * hv)


@dataclass(frozen=True)
class _DecodeParts:
    """Depth-independent part of a decode workload and, per KV layer, (device, bytes per cell,
    attention shape, query heads, FLOPs per cell, cells cap), so a decode curve costs O(layers) per point."""

    acc: _Acc
    kv: tuple[tuple[str, float, str, int, float, int], ...]
    crossings: float
    pcie: float
    net: tuple[tuple[str, float, float], ...] = ()


def _attn_kv_pair(plan: MemoryPlan) -> tuple[str, str]:
    """The K/V pair whose probed CPU attention cost a plan's attention has (cpu_probe.attn_key):
    the configuration's with flash attention; f16's without it, where llama.cpp multiplies K and
    V with ordinary MUL_MATs instead of the flash-attention kernel the pairs were probed with."""
    return (plan.config.type_k, plan.config.type_v) if plan.flash_attn else ("f16", "f16")


def _decode_parts(plan: MemoryPlan) -> _DecodeParts:
    m = plan.model
    s = weight_summary(m)
    wdev, out_dev = _devices_of(plan)
    acc = _Acc(plan)
    moved = moved_weights(m, plan.moves.device_of())
    crossings = pcie = 0.0
    n_run = _graph_layers(plan)
    for il in range(n_run):
        away = set()
        for dev, t, b, f, _, expert in _layer_weights(s, il, 1, moved):
            acc.weight(dev or wdev[il], expert_tag(t, s.expert_key(il)) if expert else t, b, f)
            if dev and dev != wdev[il]:
                away.add(dev)
        acc.nl[wdev[il]] += 1
        # a layer whose experts (or other tensors) sit on another device runs those ops there:
        # the activations go there and back (ggml_backend_sched splits at each device change)
        crossings += 2 * len(away)
        pcie += 2 * 4.0 * m.n_embd * len(away)
    for w in s.output:
        acc.weight(out_dev, w.ggml_type, w.bytes_, 2.0 * w.params)
    kv = []
    n_stream = max(1, plan.n_stream)
    kv_pair = _attn_kv_pair(plan)
    for lk in plan.kv_layers:
        per_cell = lk.kv_bytes / (lk.cells * n_stream) if lk.cells else 0.0
        heads, dims = _attn_dims(plan, lk.il)
        kv.append(
            (
                lk.device,
                per_cell,
                layer_attn_key(m, lk.il, *kv_pair),
                heads,
                2.0 * heads * dims,
                min(_window(plan, lk.swa), lk.cells),
            )
        )
        if lk.device != wdev[lk.il]:  # attention away from the layer's weights: Q, K, V out, result back
            crossings += 2
            pcie += _attn_crossing_bytes(m, lk.il)
    seq = [HOST] + wdev[:n_run] + [out_dev]  # input embedding (host) -> layers -> output
    net: dict[str, list[float]] = {}
    for a_dev, b_dev in zip(seq, seq[1:]):
        if a_dev != b_dev:
            rpc = _rpc_side(a_dev, b_dev)
            if rpc is not None:  # over the network instead of PCIe
                x = net.setdefault(rpc, [0.0, 0.0])
                x[0] += 1
                x[1] += 4.0 * m.n_embd
                continue
            crossings += 1
            pcie += 4.0 * m.n_embd
    return _DecodeParts(acc, tuple(kv), crossings, pcie, tuple((d, c, b) for d, (c, b) in net.items()))


def _rpc_side(a: str, b: str) -> str | None:
    """The RPC device of a crossing ``a -> b`` (``RPC0[host:port]``), the one sending when both are."""
    for d in (a, b):
        if d.startswith("RPC") and "[" in d:
            return d
    return None


def _assemble_decode(plan: MemoryPlan, parts: _DecodeParts, depth: int) -> Workload:
    acc = parts.acc
    devs = []
    for d in acc.kinds:
        base = acc.device(d)
        kv = af = 0.0
        hc: dict[str, float] = {}
        for dev, b, hd, heads, f, cap in parts.kv:
            if dev != d:
                continue
            cells = min(depth + 1, cap)
            kv += b * cells
            af += f * cells
            hc[hd] = hc.get(hd, 0.0) + heads * cells
        dw = replace(base, kv_bytes=kv, attn_flops=af, head_cells=tuple(sorted(hc.items())))
        if dw.bytes_read or dw.flops or dw.head_cells:
            devs.append(dw)
    return Workload("decode", 1, tuple(devs), parts.crossings, parts.pcie, 1, _graph_layers(plan), parts.net)


def decode_workload(plan: MemoryPlan, depth: int, constants: SpeedConstants | None = None) -> Workload:
    """The work of decoding one token with ``depth`` tokens already in the KV cache
    (formulas in the module docstring). ``constants`` is accepted for symmetry and unused.

    Raises:
        SpeedModelError: ``depth`` negative or not below the context (``n_ctx_seq``).
    """
    if depth < 0 or depth >= plan.n_ctx_seq:
        raise SpeedModelError(f"depth {depth} must be between 0 and n_ctx_seq - 1 = {plan.n_ctx_seq - 1}")
    return _assemble_decode(plan, _decode_parts(plan), depth)


#: GPU backends whose host-to-device copies from pageable memory go through a pinned staging
#: buffer: ggml-cuda (CUDA, and ROCm/HIP built from the same source) copies with
#: ``cudaMemcpyAsync``, which the driver stages (ggml-cuda.cu ``ggml_backend_cuda_set_tensor_async``);
#: ggml-sycl with ``queue::memcpy`` from the host pointer, which the SYCL runtime stages likewise
#: (ggml-sycl.cpp ``ggml_backend_sycl_set_tensor_async``; its pinned host buffer is the other path);
#: ggml-vulkan copies a source outside its pinned host buffers by a CPU memcpy into its staging
#: buffer, a buffer copy and a wait (ggml-vulkan.cpp ``ggml_backend_vk_set_tensor_2d_async``, when
#: ``ggml_vk_buffer_write_2d_async`` finds no pinned source), a serial path, so the share measured
#: for the driver's pipelined one is at best its rate. ``""`` is a card planned without a named
#: backend. Metal shares the host's memory: no copy is staged. Integrated GPUs load without mmap
#: (:func:`kvtuner.core.plan.memory_plan.mmap_in_effect`), so they have no pageable weights.
STAGED_COPY_BACKENDS = ("", "CUDA", "ROCm", "SYCL", "Vulkan")


def stages_pageable_copies(backend: str) -> bool:
    """Whether a GPU of ``backend`` copies pageable host memory through a staging buffer
    (:data:`STAGED_COPY_BACKENDS`), at :attr:`SpeedConstants.pageable_h2d_share` of the pinned rate."""
    return backend in STAGED_COPY_BACKENDS


def _prefill_attention(
    plan: MemoryPlan, acc: _Acc, n_prompt: int, depth: int, gpu0: str | None, staged: bool
) -> tuple[float, float, float]:
    """Each KV layer's attention in a prefill added to ``acc`` (its cache reads, FLOPs and head
    cells, on the device it runs on); ``gpu0``: the GPU op offload moves host attention to (None:
    no op offload). Returns ``(pcie bytes, of them pageable, crossings)``."""
    m = plan.model
    wdev, _ = _devices_of(plan)
    n_ub = max(1, plan.n_ubatch)
    n_calls = math.ceil(n_prompt / n_ub)
    pcie = pageable = crossings = 0.0
    n_stream = max(1, plan.n_stream)
    kv_pair = _attn_kv_pair(plan)
    offload_kqv = plan.placement.offload_kqv if plan.placement is not None else True
    for lk in plan.kv_layers:
        window = min(_window(plan, lk.swa), lk.cells)
        heads, dims = _attn_dims(plan, lk.il)
        cells = 0.0
        kv_cells = 0.0  # cells of the cache view each ubatch's attention takes (n_kv), summed over the ubatches
        for c in range(n_calls):
            a = depth + c * n_ub
            b = min(depth + n_prompt, a + n_ub)
            n_kv = min(pad_ctx(b), lk.cells)
            kv_cells += n_kv
            if plan.flash_attn:  # causal: token p reads min(p + 1, window) cells
                cells += _sum_min_range(a + 1, b, window)
            else:  # the whole padded n_kv for every token of the ubatch
                cells += (b - a) * n_kv
        per_cell = lk.kv_bytes / (lk.cells * n_stream) if lk.cells else 0.0
        kv_read = per_cell * kv_cells
        # without offload_kqv (-nkvo) and without flash attention llama.cpp pins a layer's
        # attention to the CPU (llama-graph.cpp build_attn_mha: "all nodes between the KV store and
        # the attention output are run on the CPU"); with flash attention the op follows its
        # neighbours, to the GPU under op offload, and the host KV is copied there
        pinned = lk.device == HOST and not offload_kqv and not plan.flash_attn
        run_on = gpu0 if (gpu0 is not None and lk.device == HOST and not pinned) else lk.device
        if run_on != lk.device:
            pcie += kv_read  # host KV copied to the GPU for every ubatch
            if staged:
                pageable += kv_read
        elif run_on != wdev[lk.il]:  # attention away from the layer's weights: Q, K, V there, the result back
            crossings += 2 * n_calls
            pcie += _attn_crossing_bytes(m, lk.il) * n_prompt
        acc.kv[run_on] += kv_read
        acc.af[run_on] += 2.0 * heads * dims * cells
        acc.cells(run_on, layer_attn_key(m, lk.il, *kv_pair), heads * cells)
    return pcie, pageable, crossings


def prefill_workload(
    plan: MemoryPlan, n_prompt: int, depth: int = 0, constants: SpeedConstants | None = None
) -> Workload:
    """The work of a prefill of ``n_prompt`` tokens after ``depth`` cached tokens, in ubatches
    of ``plan.n_ubatch`` (formulas in the module docstring). ``constants`` is accepted for
    symmetry and unused (host experts' efficiency is applied in the time, not here).

    Raises:
        SpeedModelError: ``n_prompt`` below 1 or ``depth + n_prompt`` beyond ``n_ctx_seq``.
    """
    if n_prompt < 1 or depth < 0 or depth + n_prompt > plan.n_ctx_seq:
        raise SpeedModelError(
            f"a prefill of {n_prompt} tokens at depth {depth} must fit the context of {plan.n_ctx_seq} tokens: "
            "lower the prompt or depth, or raise --ctx"
        )
    m = plan.model
    s = weight_summary(m)
    wdev, out_dev = _devices_of(plan)
    n_ub = max(1, plan.n_ubatch)
    n_calls = math.ceil(n_prompt / n_ub)
    u = min(n_ub, n_prompt)
    # ops of host layers go to the first device whose backend offers offload_op; ggml-rpc's is NULL
    # (ggml-rpc.cpp device interface), so never an RPC device
    gpu0_plan = next((g for g in plan.gpus if g.kind == "gpu"), None)
    gpu0 = gpu0_plan.device if gpu0_plan is not None else None
    offload = gpu0 is not None and u >= OFFLOAD_MIN_BATCH  # ops of that many rows run on the GPU
    staged = gpu0_plan is not None and stages_pageable_copies(gpu0_plan.backend)
    acc = _Acc(plan)
    pcie = crossings = weight_copy = pageable = 0.0
    # host weights of a memory-mapped model stay in the mapping, pageable; without mmap they are in
    # the GPU's pinned host buffer (llama-model.cpp ``make_cpu_buft_list`` and "avoid using a host
    # buffer when using mmap"); a host KV cache is a plain CPU buffer (llama-kv-cache.cpp
    # ``ggml_backend_cpu_buffer_type``); only a staging backend pays for it (stages_pageable_copies)
    host_mapped = staged and plan.host.weights_mapped
    moved = moved_weights(m, plan.moves.device_of())
    rows_only = last_layer_rows_only(m.architecture)
    n_run = _graph_layers(plan)
    for il in range(n_run):
        run_on = gpu0 if (gpu0 is not None and offload and wdev[il] == HOST) else wdev[il]
        for dev, t, b, f, rows, expert in _layer_weights(s, il, u, moved):
            home = dev or wdev[il]
            run = gpu0 if (gpu0 is not None and offload and home == HOST) else home
            # experts: MUL_MAT_ID, priced on the host at the expert probe's prefill rate of the
            # layer's expert shape, else host_moe_prefill_efficiency x the dense rate
            # (_host_prefill_rate), and calibrated apart from the dense MUL_MAT of their type (one
            # scale per kernel: kernel_tag); the last layer's experts run for the output token
            # only where llama.cpp skips the unused rows there (last_layer_rows_only)
            tokens = 1 if (expert and il == n_run - 1 and rows_only) else n_prompt
            acc.weight(run, expert_tag(t, s.expert_key(il)) if expert else t, b * n_calls, f * tokens, rows)
            if run != home:
                # host weights copied to the GPU for every ubatch; of expert tensors only the
                # experts the ubatch uses (ggml-backend.cpp ggml_backend_sched_compute_splits)
                weight_copy += b * n_calls
                if host_mapped:
                    pageable += b * n_calls
            elif dev and dev != wdev[il] and not offload:
                crossings += 2 * n_calls
                pcie += 2 * 4.0 * m.n_embd * n_prompt
        acc.nl[run_on] += 1
    for w in s.output:  # logits of the last token only
        acc.weight(out_dev, w.ggml_type, w.bytes_, 2.0 * w.params)
    kv_pcie, kv_pageable, kv_crossings = _prefill_attention(
        plan, acc, n_prompt, depth, gpu0 if offload else None, staged
    )
    pcie += kv_pcie
    pageable += kv_pageable
    crossings += kv_crossings
    seq = [HOST] + wdev[:n_run] + [out_dev]
    net: dict[str, list[float]] = {}
    for a_dev, b_dev in zip(seq, seq[1:]):
        rpc = _rpc_side(a_dev, b_dev) if a_dev != b_dev else None
        if rpc is not None:  # each ubatch's hidden states over the network
            x = net.setdefault(rpc, [0.0, 0.0])
            x[0] += n_calls
            x[1] += 4.0 * m.n_embd * n_prompt
        elif a_dev != b_dev and not offload:
            crossings += n_calls
            pcie += 4.0 * m.n_embd * n_prompt
    if offload:
        crossings += n_calls  # the input embeddings go up once per ubatch
        pcie += 4.0 * m.n_embd * n_prompt
    return Workload(
        "prefill",
        n_prompt,
        acc.devices(),
        crossings,
        pcie + weight_copy,
        n_calls,
        n_run,
        tuple((d, c, b) for d, (c, b) in net.items()),
        weight_copy,
        pageable,
    )


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


_FLOAT_TYPES = ("F32", "F16", "BF16")


def _host_prefill_rate(cpu: CpuRates, typ: str, rows: float, c: SpeedConstants) -> float:
    """FLOP/s of a prefill workload entry's matmuls on the CPU: the probe's dense rate
    (:meth:`CpuRates.prefill_rate`); for MoE experts the expert probe's prefill rate of their
    shape (``CpuRates.expert_prefill_flop_s``), else the dense rate times
    ``host_moe_prefill_efficiency`` (ggml-cpu's MUL_MAT_ID takes one token row at a time per
    expert, ggml-cpu.c ``ggml_compute_forward_mul_mat_id_one_chunk`` and repack.cpp
    ``forward_mul_mat_id``: neither llamafile's sgemm nor the multi-row kernels of a dense MUL_MAT)."""
    if MUL_MAT_ID_TAG not in typ:
        return cpu.prefill_rate(base_type(typ), rows)
    key = tagged_expert_key(typ)
    probed = cpu.expert_prefill_flop_s.get(key) if key else None
    return probed or cpu.prefill_rate(base_type(typ), rows) * c.host_moe_prefill_efficiency


def _host_time_s(d: DeviceWork, r: DeviceRates, phase: str, c: SpeedConstants, n_calls: int) -> float:
    cpu = r.cpu or fallback_cpu_rates(1, r.bandwidth_bytes_s)
    t = 0.0
    try:
        if phase == "decode":
            for typ, b, _, _ in d.weights:
                key = tagged_expert_key(typ)
                rate = cpu.expert_decode_bytes_s.get(key) if key else None
                t += b / ((rate or nearest(cpu.decode_bytes_s, base_type(typ))) * c.host_decode_scale)
            stream = kv_stream_rate(cpu.decode_bytes_s) * c.host_decode_scale
            attn = sum(n * cpu.attn_cost(cpu.attn_decode_s, hd, decode=True) for hd, n in d.head_cells)
            t += max(attn / c.host_attn_scale, d.kv_bytes / stream)
            t += d.n_layers * cpu.layer_s / c.host_overhead_scale
        else:
            for typ, _, f, rows in d.weights:  # a MUL_MAT_ID entry has its own calibration scale
                t += f / (_host_prefill_rate(cpu, typ, rows, c) * c.prefill_scale(typ))
            t += sum(n * cpu.attn_cost(cpu.attn_prefill_s, hd) for hd, n in d.head_cells) / c.host_attn_scale
            t += n_calls * d.n_layers * cpu.layer_prefill_s / c.host_overhead_scale
    except ProbeError as exc:
        raise SpeedModelError(str(exc)) from None
    return t


def _gpu_time_s(d: DeviceWork, r: DeviceRates, phase: str, c: SpeedConstants) -> float:
    bw = r.bandwidth_bytes_s * c.gpu_bw_efficiency
    t_mem = d.bytes_read / bw if bw > 0 else math.inf
    if phase == "decode":
        return t_mem + d.n_layers * c.gpu_layer_overhead_s
    fp16 = (r.fp16_flop_s or r.flop_s or r.bandwidth_bytes_s * 40) * c.gpu_fp16_efficiency
    int8 = (r.int8_op_s or (r.fp16_flop_s or 0) * 2 or r.bandwidth_bytes_s * 80) * c.gpu_int8_efficiency
    t_cmp = d.attn_flops / fp16
    for typ, _, f, _ in d.weights:
        t_cmp += f / (fp16 if base_type(typ) in _FLOAT_TYPES else int8)
    return max(t_mem, t_cmp) + d.n_layers * c.gpu_layer_overhead_s


def workload_time_s(work: Workload, inputs: SpeedInputs) -> float:
    """Seconds for ``work`` under ``inputs`` (the sums of the module docstring)."""
    c = inputs.constants
    t = 0.0
    has_gpu = False
    for d in work.devices:
        r = inputs.rate(d.device)
        if d.kind == "host":
            t += _host_time_s(d, r, work.phase, c, work.n_calls)
        else:
            has_gpu = True
            t += _gpu_time_s(d, r, work.phase, c)
    if work.pcie_bytes:
        pcie = min(
            (r.pcie_bandwidth_bytes_s for r in inputs.rates.values() if r.pcie_bandwidth_bytes_s),
            default=DEFAULT_PCIE_BANDWIDTH_BYTES_S,
        )
        pinned = work.pcie_bytes - work.pageable_bytes
        t += pinned / (pcie * c.pcie_efficiency)
        if work.pageable_bytes:
            t += work.pageable_bytes / (pcie * c.pcie_efficiency * max(c.pageable_h2d_share, 1e-9))
    t += work.n_crossings * c.crossing_latency_s
    for dev, n, b in work.net:
        lr = inputs.rates.get(dev)
        rtt = lr.link_rtt_s if lr is not None and lr.link_rtt_s else c.rpc_rtt_s
        link = lr.link_bytes_s if lr is not None and lr.link_bytes_s else c.rpc_link_bytes_s
        t += n * rtt + b / link
    if has_gpu:
        t += work.n_calls * c.gpu_token_overhead_s
    else:
        host = inputs.rates.get(HOST)
        cpu = host.cpu if host is not None and host.cpu is not None else None
        t += work.n_calls * (cpu.token_s if cpu else FALLBACK_TOKEN_S) / c.host_overhead_scale
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
        band: (low, high) decode tokens/s at depth 0: the measured spread of the model's errors
            (see :mod:`.calibration`), narrowed by this machine's calibration runs.
        curve: ``(depth, decode_tok_s)`` pairs from 0 to the full context.
        prefill_band: (low, high) of ``prefill_tok_s``.
        prefill_tokens: prompt length of ``prefill_tok_s``.
        n_threads: CPU threads assumed.
        n_calibration_runs: measured runs behind the constants (0: defaults).
        sources: where the rates came from.
        inputs: the inputs used (for re-predicting variants; not serialised).
        host: the host predicted for (:meth:`~kvtuner.core.hardware.specs.HostSpec.speed_dict`).
        regime: where the plan keeps weights and KV (:func:`.regime.placement_regime`).
        band_from, prefill_band_from: where each band comes from: ``"public_runs"`` (the range
            public runs of the regime measured, :func:`.regime.regime_range`), ``"calibration"``
            (the validation spread narrowed by this machine's runs) or ``"validation"`` (the
            speed model's validation spread).
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
    host: dict[str, Any] | None = None
    regime: str = "full"
    band_from: str = "validation"
    prefill_band_from: str = "validation"

    @property
    def range_note(self) -> str | None:
        """One line saying where the bands that are public runs' ranges come from
        (:func:`.regime.range_note`), None when neither is."""
        phases = (("decode", self.band_from), ("prefill", self.prefill_band_from))
        return range_note(self.regime, tuple(ph for ph, src in phases if src == "public_runs"))

    @property
    def badge(self) -> str:
        """The speed band of :attr:`decode_tok_s` (:func:`speed_band`)."""
        return speed_band(self.decode_tok_s)

    def to_dict(self) -> dict[str, Any]:
        """The ``speed`` object of ``kvtuner plan --json`` (floats, tokens/s)."""
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
            "host": self.host,
            "regime": self.regime,
            "band_from": self.band_from,
            "prefill_band_from": self.prefill_band_from,
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

    ``prefill_tokens`` is clamped to the context. The band is ``value * exp(-/+ sigma)``, sigma
    being ``inputs.sigma_log`` (``inputs.prefill_sigma_log`` for prefill), a spread measured on CPU
    and full-offload runs; where the plan keeps weights or KV in RAM beside a discrete GPU and no
    run of this model family on this machine measured that regime and phase
    (``inputs.calibrated_regimes``), it is the range that about two thirds of the public runs of
    that regime measured (:func:`.regime.regime_range`), which is not symmetric: kvtuner
    over-predicts most of them.

    Raises:
        SpeedModelError: a device of the plan has no rates in ``inputs``.
    """
    n_full = plan.n_ctx_seq - 1
    depths = sorted({round(n_full * i / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)})
    parts = _decode_parts(plan)
    curve = tuple((d, 1.0 / workload_time_s(_assemble_decode(plan, parts, d), inputs)) for d in depths)
    dec0 = curve[0][1]
    dec_full = curve[-1][1]
    n_p = max(1, min(prefill_tokens, plan.n_ctx_seq))
    pre = prefill_tok_s(plan, inputs, n_p, 0)
    regime = placement_regime(plan)
    unified = any(d.unified for d in plan.gpus)
    spread = "calibration" if inputs.n_calibration_runs else "validation"

    def band_of(phase: str, value: float, sigma: float) -> tuple[tuple[float, float], str]:
        r = regime_range(regime, phase)
        if r is not None and not unified and (regime, phase) not in inputs.calibrated_regimes:
            return (value * r[0], value * r[1]), "public_runs"
        k = math.exp(sigma)
        return (value / k, value * k), spread

    band, band_from = band_of("decode", dec0, inputs.sigma_log)
    prefill_band, prefill_band_from = band_of(
        "prefill", pre, inputs.sigma_log if inputs.prefill_sigma_log is None else inputs.prefill_sigma_log
    )
    names = {d.device: d.backend_device for d in plan.devices}
    sources = tuple(f"{names.get(r.device, r.device)}: {r.source}" for r in inputs.rates.values() if r.source)
    return SpeedPrediction(
        decode_tok_s=dec0,
        decode_tok_s_at_full_ctx=dec_full,
        prefill_tok_s=pre,
        band=band,
        curve=curve,
        prefill_band=prefill_band,
        prefill_tokens=n_p,
        n_threads=inputs.n_threads,
        n_calibration_runs=inputs.n_calibration_runs,
        sources=sources,
        inputs=inputs,
        host=inputs.host,
        regime=regime,
        band_from=band_from,
        prefill_band_from=prefill_band_from,
    )
