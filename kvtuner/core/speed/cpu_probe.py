"""A short probe of this machine's CPU as llama.cpp uses it: the speed of its matrix kernels per
weight type, of its flash-attention kernel per cached cell, and its fixed costs per layer and per
token -- measured by running tiny zero-weight models through llama.cpp itself (the runner does
it in a child process, :mod:`kvtuner.runner.probe`), so repacking (ggml-cpu/repack.cpp), the
weight type's vec-dot and gemm kernels, OpenMP barriers and the page cache are all what a real
model meets. Weight values never change a kernel's speed, so the models are sparse files of a
few KiB on disk (the data are holes).

The probe models (``llama`` architecture but the MLA attention probe, tokenizer ``none`` with a
256-token vocabulary):

- matrix, one per weight type T: 4 layers of width 4096 (32 query heads and 8 KV heads of 128,
  FFN 14336), every matrix in T: 872 M parameters (490 MB in Q4_K), more than any desktop CPU's
  last-level cache, so decode streams from RAM as a real model does.
  Decode of ``MATRIX_GEN`` tokens: ``bytes_s[T] = weight_bytes / (t_token - overheads)``.
  Prefill at two batch sizes ``b`` (``MATRIX_PROMPT`` and ``MATRIX_SMALL_PROMPT`` tokens):
  ``rate(b) = 2 * params * b / (t_prompt - overheads)``, and the two points give the mat-mat
  kernels' rate as a function of the batch, ``rate(b) = flop_s[T] * b / (b + half_batch[T])``
  (the usual saturation of a GEMM with the batch: a MoE expert that gets 16 of a prompt's
  tokens runs well below the rate of a 128-token dense matmul).
- attention, one per attention shape of the model (query heads, KV heads, head size): 4 layers of
  width 256 with exactly those heads, a tiny FFN, at depth 0 and at depth ``ATTN_DEPTH``: the
  difference is the flash-attention kernel's cost per (query head x cached cell), per decoded
  token and per prompt token. It depends on the shape in ways its FLOPs do not tell (measured here
  at depth 2048, one thread: 45 ns per head and cell for 16 query heads over 2 KV heads of 128, 121
  ns for 32 over 8, 132 ns for 32 over 32; 64-wide heads cost more than 128-wide ones), because
  the decode kernel walks each query head's KV rows in turn (ggml-cpu/ops.cpp
  ``ggml_compute_forward_flash_attn_ext_f16``, split-KV path) and how much of that stays in cache
  depends on the grouping; so the model's own shape is measured. An MLA attention (DeepSeek-V2/V3,
  Kimi K2: one KV head, a cached latent of ``kv_lora_rank`` plus the RoPE part as K, the latent as
  V; src/models/deepseek2.cpp) gets a ``deepseek2``-architecture probe with those sizes
  (:func:`attn_key` ``mla_rank``): measured 60 ns per head and cell for DeepSeek-V2-Lite's
  16/1/576/512 on an AVX-512 AMD EPYC, where scaling the nearest probed shape (32/4/128, 35 ns)
  by the head size said 156 (benchmarks/moe_cpu_validation.py ``here``).
- experts, one per MoE expert shape of the model (:func:`expert_key`: width, expert FFN width,
  experts, experts per token and the gate/up/down types): a ``llama``-architecture MoE model with
  exactly those expert tensors and a 1-head attention of 32 (under 2 % of its bytes), enough
  layers for :data:`EXPERT_MIN_BYTES` of experts, and routing data (random token embeddings and
  routers, unit norms) so each token picks its own experts as in a real model. Its decode gives
  the bytes/s of the selected experts' mat-vecs (ggml-cpu.c ``ggml_compute_forward_mul_mat_id``,
  another kernel than a dense MUL_MAT, over ``n_expert_used`` slices of a few MB each rather than
  one large matrix): measured here 10.2 GB/s for gpt-oss-20b's MXFP4 experts, where the dense
  probe of MXFP4 read 4.6 GB/s (with zero-exponent blocks; see :data:`MXFP4_NORMAL_EXPONENT`) and the
  model's decode was predicted 22-31 % slow. Its prefill of ``EXPERT_PROMPT`` tokens gives the
  FLOP/s of the same kernel in a prompt, where ggml-cpu's repacked MUL_MAT_ID (repack.cpp
  ``forward_mul_mat_id``) still runs one mat-vec per token and chosen expert: measured 73 GFLOP/s
  for gpt-oss-20b's experts on an AVX-512 AMD EPYC whose dense MXFP4 matmul ran 338 (0.22 of it,
  where the constant ``host_moe_prefill_efficiency`` says 0.45), 84-87 for Qwen3-30B-A3B's Q4_K
  experts against 260 (benchmarks/moe_cpu_runs.json ``here``). Its last layer's experts run for one token only (llama.cpp
  computes the last layer's FFN for the output rows alone); an earlier reading that missed this
  took a 2-layer probe for 1.5-2x faster than the real models.
- overhead: 24 and 6 layers of width 64: decode time = ``n_layer * layer_s + token_s`` (graph
  build, scheduling, thread barriers of every op, sampling) solved from the two, and the same for
  a prompt's per-layer cost ``layer_prefill_s``.

Everything is per thread count (llama.cpp's ``-t``): rates are stored with the thread count
they were measured at. Units in the field names (``_s`` seconds, ``_bytes_s`` bytes/s,
``_flop_s`` FLOP/s).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ..model.ggml_types import KV_CACHE_TYPES
from ..model.gguf_write import add_transformer_keys, write_sparse_gguf
from ..plan.llama_constants import pad_ctx
from ..plan.reserve_graph import last_layer_rows_only
from .expert_shapes import expert_key, model_expert_keys, parse_expert_key

#: Probe model shapes (see the module docstring).
MATRIX_LAYERS, MATRIX_EMBD, MATRIX_FF, MATRIX_HEADS, MATRIX_KV_HEADS, MATRIX_HEAD_DIM = 4, 4096, 14336, 32, 8, 128
ATTN_LAYERS, ATTN_EMBD, ATTN_FF = 4, 256, 256
OVERHEAD_LAYERS, OVERHEAD_EMBD = (24, 6), 64
PROBE_VOCAB = 256
#: Bench sizes: prompt (large and small batch) and generated tokens of the matrix runs, depth of
#: the attention runs (the depth the CPU validation measures at).
MATRIX_PROMPT, MATRIX_SMALL_PROMPT, MATRIX_GEN = 64, 16, 16
ATTN_DEPTH, ATTN_PROMPT, ATTN_GEN = 2048, 64, 32
OVERHEAD_PROMPT, OVERHEAD_GEN = 8, 64
#: Expert probe: prompt and generated tokens, the least bytes of experts its layers hold (more
#: than a desktop CPU's last-level cache, as the matrix probe), and its layer count bounds; the
#: attention of its layers: 1 query head of ``EXPERT_HEAD_DIM``.
EXPERT_PROMPT, EXPERT_GEN = 128, 16
EXPERT_MIN_BYTES = 384 << 20
EXPERT_MIN_LAYERS, EXPERT_MAX_LAYERS = 2, 16
EXPERT_HEAD_DIM = 32
#: Head sizes the attention probe can measure (the ones llama.cpp's CPU flash attention meets).
ATTN_HEAD_DIMS = (64, 80, 96, 112, 128, 192, 256)
#: An MLA attention probe (``deepseek2`` architecture) is any K head size ``rank + rope``: its
#: per-head query/output parts (``key_length_mla - rope`` and ``value_length_mla``), which only the
#: depth-independent absorbed matmuls (attn_k_b, attn_v_b) see, are DeepSeek-V2's 128 and 128.
MLA_NOPE, MLA_V = 128, 128


#: K/V types whose CPU flash attention takes ggml's vectorised paths (ggml-cpu/ops.cpp
#: ``ggml_compute_forward_flash_attn_ext_f16``: the split-KV decode path and the tiled prompt path
#: need K and V of one type, F32 or F16). Any other pair runs the one-row path
#: (``ggml_compute_forward_flash_attn_ext_f16_one_chunk``, K dot products and V accumulation per
#: cell in the K/V type), which costs differently per cell: measured here on the default model at
#: depth 32,544, a q8_0 K/V prefill ran 41 tok/s where f16 ran 86-120. Such pairs are probed and
#: stored under their own key (:func:`attn_key`).
ATTN_FAST_KV = ("f16", "f32")


#: Without a probe of a K/V pair (the assumed ``"*"`` cost only), the share of the CPU
#: flash-attention decode cost per head and cell that does not scale with the bytes of the K and
#: V rows; the rest scales with them. The one-row path reads one K row (a dot product in K's type,
#: ``kq_vec_dot``) and one V row (``v_to_float`` then ``ggml_vec_mad_f32``) per cell
#: (ggml-cpu/ops.cpp ``ggml_compute_forward_flash_attn_ext_f16_one_chunk``), so a q4_0 cache
#: reads 18/64 of f16's bytes. Fitted (least squares of the log error) on the fitting rows of
#: benchmarks/offload_public_rows.json (regime long_depth: GTX 1660 Ti + Ryzen 5 7600X, -nkvo,
#: R1-Distill-Qwen-7B at depths 8192 and 16384 with f16, q8_0 and q4_0 K/V, whose decode times
#: above depth 0 give 6.5, 4.2 and 2.9 ns per head and cell on 6 threads).
ATTN_DECODE_FIXED_SHARE = 0.10


def attn_decode_kv_factor(type_k: str, type_v: str) -> float:
    """The assumed CPU flash-attention decode cost of a K/V pair relative to f16/f16:
    ``ATTN_DECODE_FIXED_SHARE + (1 - share) * (bytes per element of K + V) / 4`` (f16: 1, q8_0:
    0.58, q4_0: 0.35); 1 for a type not in :data:`KV_CACHE_TYPES`."""
    try:
        k, v = KV_CACHE_TYPES[str(type_k).lower()], KV_CACHE_TYPES[str(type_v).lower()]
    except KeyError:
        return 1.0
    ratio = (k.type_size / k.block_size + v.type_size / v.block_size) / 4.0
    return ATTN_DECODE_FIXED_SHARE + (1.0 - ATTN_DECODE_FIXED_SHARE) * ratio


def attn_kv_suffix(type_k: str = "f16", type_v: str = "f16") -> str:
    """The K/V part of an attention key: ``""`` for the fast pairs (:data:`ATTN_FAST_KV`, one type
    for K and V), else ``"@q8_0"`` (K and V of one type) or ``"@q8_0+f16"`` (K, V)."""
    k, v = str(type_k).lower(), str(type_v).lower()
    if k == v and k in ATTN_FAST_KV:
        return ""
    return f"@{k}" if k == v else f"@{k}+{v}"


def attn_key(
    n_head: int, n_head_kv: int, head_dim: int, type_k: str = "f16", type_v: str = "f16", *, mla_rank: int = 0
) -> str:
    """The key of an attention shape in the probe's tables: ``"32/8/128"`` (query heads, KV heads,
    head size) with f16 K/V, ``"32/8/128@q8_0"`` with another K/V pair (:func:`attn_kv_suffix`);
    an MLA attention (``mla_rank``: its ``kv_lora_rank``, the V head size of its one KV head, whose
    K head is that latent plus the RoPE part) adds it as a fourth field: ``"16/1/576/512"``."""
    mla = f"/{int(mla_rank)}" if mla_rank else ""
    return f"{int(n_head)}/{int(n_head_kv)}/{int(head_dim)}{mla}" + attn_kv_suffix(type_k, type_v)


def layer_attn_key(model: Any, il: int, type_k: str = "f16", type_v: str = "f16") -> str:
    """The attention shape (:func:`attn_key`) of layer ``il`` of ``model`` (a
    :class:`~kvtuner.core.model.profile.ModelProfile`) with a K/V type pair: its query heads, KV
    heads and K head size, and for an MLA model (``is_mla``) its ``kv_lora_rank``."""
    mla = model.mla_kv_lora_rank if getattr(model, "is_mla", False) else 0
    return attn_key(model.n_head[il], model.n_head_kv[il], model.head_dim_k_at(il), type_k, type_v, mla_rank=mla)


def attn_key_kv(key: str) -> tuple[str, str, str]:
    """``(shape, type_k, type_v)`` of an attention key: ``"32/8/128@q8_0"`` -> ``("32/8/128", "q8_0", "q8_0")``."""
    shape, _, kv = key.partition("@")
    if not kv:
        return shape, "f16", "f16"
    k, _, v = kv.lower().partition("+")
    return shape, k, v or k


def _parse_attn_key(key: str) -> tuple[int, int, int] | None:
    """(query heads, KV heads, K head size) of an attention key (its MLA rank left out), None if malformed."""
    parsed = _parse_attn_key_mla(key)
    return None if parsed is None else parsed[:3]


def _parse_attn_key_mla(key: str) -> tuple[int, int, int, int] | None:
    """(query heads, KV heads, K head size, MLA rank or 0) of an attention key, None if malformed."""
    parts = key.partition("@")[0].split("/")
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts):
        return None
    h, hkv, hd, *rank = (int(p) for p in parts)
    return h, hkv, hd, (rank[0] if rank else 0)


#: Weight types the matrix probe can write (ggml types whose rows of 4096 and 14336 fit a block).
PROBE_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ1_S",
    "IQ1_M",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "IQ4_NL",
    "IQ4_XS",
    "TQ1_0",
    "TQ2_0",
    "MXFP4",
)
#: Weight types whose CPU dot product decodes each group of weights through a lookup table rather
#: than from the block's bits by arithmetic: the i-quants (ggml-cpu/arch/x86/quants.c
#: ``ggml_vec_dot_iq3_xxs_q8_K`` gathers ``iq3xxs_grid`` entries and ``keven_signs_q2xs`` sign
#: masks for every 4 or 8 weights; ``iq1s_grid``, ``iq2xxs_grid``, ``iq2xs_grid``, ``iq2s_grid``,
#: ``iq3s_grid`` likewise; IQ4_NL/IQ4_XS map 4-bit codes through ``kvalues_iq4nl``) and the ternary
#: TQ1_0/TQ2_0 (base-3 unpacking). Their decode is bound by that work, not by the bytes they stream:
#: measured by this probe at one thread on an AVX-512 Xeon, IQ3_XXS 2.3 GB/s and IQ2_XXS 1.3 beside
#: Q4_K 8.2 and MXFP4 5.2 (benchmarks/results/2026-12-03-lookup-type-rates.md). So a rate of one
#: kind says nothing about the other (:func:`implausible_types`, :func:`nearest`).
LOOKUP_TYPES = frozenset(
    ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0")
)


def is_lookup_type(type_name: str) -> bool:
    """Whether ``type_name`` (a ggml type name) is one of :data:`LOOKUP_TYPES`."""
    return type_name.upper() in LOOKUP_TYPES


#: A stored probe is re-measured after this long, seconds (hardware and kernels change rarely).
PROBE_MAX_AGE_S = 7 * 24 * 3600.0


class ProbeError(ValueError):
    """A probe that cannot be made or read; the message says what to change."""


class BusyProbeError(ProbeError):
    """A probe stopped early because other processes kept the machine busy: its figures would
    have measured that load (:class:`kvtuner.core.monitor.contention.Contention`)."""


@dataclass(frozen=True)
class ProbeModel:
    """One probe model to write and bench: ``key`` (``matrix:Q4_K``, ``attn``, ``overhead:24``),
    the hyper-parameters, the weight type of its matrices and the bench it gets
    (``runs``: ``(n_depth, n_prompt, n_gen)`` per bench)."""

    key: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    weight_type: str
    runs: tuple[tuple[int, int, int], ...]
    n_expert: int = 0
    n_expert_used: int = 0
    expert_types: tuple[str, ...] = ()
    mla_rank: int = 0

    @property
    def arch(self) -> str:
        """The GGUF architecture: ``deepseek2`` for an MLA attention probe, else ``llama``."""
        return "deepseek2" if self.mla_rank else "llama"

    @property
    def mla_rope(self) -> int:
        """An MLA probe's RoPE part of the K head (``head_dim - mla_rank``), 0 for others."""
        return self.head_dim - self.mla_rank if self.mla_rank else 0

    @property
    def n_ctx(self) -> int:
        """Context for its deepest run, padded as llama.cpp pads it."""
        need = max(d + p + g for d, p, g in self.runs) + 16
        return pad_ctx(need)

    def tensors(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, ggml shape, type) of every tensor (src/models/llama.cpp ``load_arch_tensors``; an
        MLA probe's attention as src/models/deepseek2.cpp's with ``q_lora_rank`` 0 and every layer
        dense)."""
        E, F, V, t = self.n_embd, self.n_ff, PROBE_VOCAB, self.weight_type
        q, kv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        out: list[tuple[str, tuple[int, ...], str]] = [
            ("token_embd.weight", (E, V), "F32"),
            ("output_norm.weight", (E,), "F32"),
            ("output.weight", (E, V), "F32"),
        ]
        for il in range(self.n_layer):
            p = f"blk.{il}."
            out.append((p + "attn_norm.weight", (E,), "F32"))
            if self.mla_rank:
                r, rope = self.mla_rank, self.mla_rope
                out += [
                    (p + "attn_kv_a_norm.weight", (r,), "F32"),
                    (p + "attn_q.weight", (E, self.n_head * (MLA_NOPE + rope)), t),
                    (p + "attn_kv_a_mqa.weight", (E, r + rope), t),
                    (p + "attn_k_b.weight", (MLA_NOPE, r, self.n_head), t),
                    (p + "attn_v_b.weight", (r, MLA_V, self.n_head), t),
                    (p + "attn_output.weight", (self.n_head * MLA_V, E), t),
                ]
            else:
                out += [
                    (p + "attn_q.weight", (E, q), t),
                    (p + "attn_k.weight", (E, kv), t),
                    (p + "attn_v.weight", (E, kv), t),
                    (p + "attn_output.weight", (q, E), t),
                ]
            out.append((p + "ffn_norm.weight", (E,), "F32"))
            if self.n_expert:
                N, (tg, tu, td) = self.n_expert, self.expert_types
                out += [
                    (p + "ffn_gate_inp.weight", (E, N), "F32"),
                    (p + "ffn_gate_exps.weight", (E, F, N), tg),
                    (p + "ffn_down_exps.weight", (F, E, N), td),
                    (p + "ffn_up_exps.weight", (E, F, N), tu),
                ]
            else:
                out += [
                    (p + "ffn_gate.weight", (E, F), t),
                    (p + "ffn_up.weight", (E, F), t),
                    (p + "ffn_down.weight", (F, E), t),
                ]
        return out

    def expert_bytes_params(self) -> tuple[int, int]:
        """Bytes and parameters of the expert matrices one token reads (``n_expert_used`` of each
        layer's experts; 0, 0 for a model without experts)."""
        b = p = 0
        for name, shape, t in self.tensors():
            if name.endswith("_exps.weight"):
                b += _nbytes(shape, t) * self.n_expert_used // self.n_expert
                p += shape[0] * shape[1] * self.n_expert_used
        return b, p

    def matrix_bytes_params(self) -> tuple[int, int]:
        """Bytes and parameters of the layers' matrices (the weights the probe times)."""
        b = p = 0
        for name, shape, t in self.tensors():
            if name.startswith("blk.") and len(shape) == 2:
                b += _nbytes(shape, t)
                p += shape[0] * shape[1]
        return b, p


def _nbytes(shape: tuple[int, ...], type_name: str) -> int:
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    n = int(np.prod(shape))
    if shape[0] % block:
        raise ProbeError(f"a row of {shape[0]} does not fit {type_name} blocks of {block}")
    return n // block * size


def matrix_model(weight_type: str) -> ProbeModel:
    """The matrix probe of ``weight_type`` (a ggml type name, :data:`PROBE_TYPES`).

    Raises:
        ProbeError: a type the probe cannot write.
    """
    t = weight_type.upper()
    if t not in PROBE_TYPES:
        raise ProbeError(f"no CPU probe for weight type {weight_type}: probe types are {', '.join(PROBE_TYPES)}")
    return ProbeModel(
        f"matrix:{t}",
        MATRIX_LAYERS,
        MATRIX_EMBD,
        MATRIX_HEADS,
        MATRIX_KV_HEADS,
        MATRIX_HEAD_DIM,
        MATRIX_FF,
        t,
        ((0, MATRIX_PROMPT, MATRIX_GEN), (0, MATRIX_SMALL_PROMPT, 0)),
    )


def attention_model(shape: str = "32/8/128") -> ProbeModel:
    """The attention probe of an attention shape (:func:`attn_key`; runs at depth 0 and :data:`ATTN_DEPTH`).

    Raises:
        ProbeError: a head size outside :data:`ATTN_HEAD_DIMS`, or query heads not a multiple of the KV heads.
    """
    parsed = _parse_attn_key_mla(shape)
    if parsed is None or not parsed[0] or not parsed[1] or parsed[0] % parsed[1]:
        raise ProbeError(
            f"no CPU attention probe for the shape {shape!r}: give query heads/KV heads/head size, "
            "query heads a multiple of KV heads"
        )
    n_head, n_head_kv, head_dim, mla_rank = parsed
    if mla_rank:
        rope = head_dim - mla_rank
        if n_head_kv != 1 or rope <= 0 or rope % 2:
            raise ProbeError(
                f"no CPU attention probe for the MLA shape {shape!r}: one KV head whose K head size is "
                "the rank plus an even RoPE size"
            )
    elif head_dim not in ATTN_HEAD_DIMS:
        raise ProbeError(
            f"no CPU attention probe for head size {head_dim}: probe head sizes are "
            f"{', '.join(map(str, ATTN_HEAD_DIMS))}"
        )
    _, type_k, type_v = attn_key_kv(shape)
    for t in (type_k, type_v):
        if t not in KV_CACHE_TYPES:
            raise ProbeError(
                f"no CPU attention probe for K/V type {t!r}: KV cache types are {', '.join(KV_CACHE_TYPES)}"
            )
        if head_dim % KV_CACHE_TYPES[t].block_size:  # llama_init_from_model refuses it (context_checks)
            raise ProbeError(
                f"no CPU attention probe for K/V type {t} with head size {head_dim}: its block of "
                f"{KV_CACHE_TYPES[t].block_size} does not divide it"
            )
    # the key as lookups build it ("@f16", "@Q8_0", "@q8_0+q8_0" written by hand become "", "@q8_0", "@q8_0")
    key = attn_key(n_head, n_head_kv, head_dim, type_k, type_v, mla_rank=mla_rank)
    return ProbeModel(
        f"attn:{key}",
        ATTN_LAYERS,
        ATTN_EMBD,
        n_head,
        n_head_kv,
        head_dim,
        ATTN_FF,
        "F16",
        ((0, ATTN_PROMPT, ATTN_GEN), (ATTN_DEPTH, ATTN_PROMPT, ATTN_GEN)),
        mla_rank=mla_rank,
    )


def expert_model(key: str) -> ProbeModel:
    """The expert probe of a MoE expert shape (:func:`expert_key`): :data:`EXPERT_MIN_BYTES` of
    experts or more in :data:`EXPERT_MIN_LAYERS` to :data:`EXPERT_MAX_LAYERS` layers, a 1-head
    attention of :data:`EXPERT_HEAD_DIM`, benched for :data:`EXPERT_GEN` decoded tokens (no prompt).

    Raises:
        ProbeError: not an expert key, a type the probe cannot write, or a row that does not fit
            its type's blocks.
    """
    parsed = parse_expert_key(key)
    if parsed is None:
        raise ProbeError(f"no CPU expert probe for {key!r}: give width/expert FFN width/experts/experts per token@TYPE")
    e, ff, n, k, types = parsed
    if not (e and ff and n and 0 < k <= n):
        raise ProbeError(
            f"no CPU expert probe for {key!r}: sizes must be positive and experts per token at most the experts"
        )
    bad = [t for t in types if t not in PROBE_TYPES]
    if bad:
        raise ProbeError(f"no CPU expert probe for type {bad[0]}: probe types are {', '.join(PROBE_TYPES)}")
    per_layer = (
        _nbytes((e, ff, n), types[0])
        + _nbytes((e, ff, n), types[1])  # raises on a row that does not fit
        + _nbytes((ff, e, n), types[2])
    )
    n_layer = min(EXPERT_MAX_LAYERS, max(EXPERT_MIN_LAYERS, -(-EXPERT_MIN_BYTES // per_layer)))
    return ProbeModel(
        f"expert:{expert_key(e, ff, n, k, types)}",
        n_layer,
        e,
        1,
        1,
        EXPERT_HEAD_DIM,
        ff,
        "F16",
        ((0, EXPERT_PROMPT, EXPERT_GEN),),
        n,
        k,
        types,
    )


def overhead_models() -> tuple[ProbeModel, ...]:
    """The two overhead probes (:data:`OVERHEAD_LAYERS` layers of width :data:`OVERHEAD_EMBD`)."""
    return tuple(
        ProbeModel(
            f"overhead:{n}", n, OVERHEAD_EMBD, 2, 2, 32, OVERHEAD_EMBD, "F16", ((0, OVERHEAD_PROMPT, OVERHEAD_GEN),)
        )
        for n in OVERHEAD_LAYERS
    )


def _buildable(keys: Sequence[str], build: Any) -> list[tuple[str, ProbeModel]]:
    """``(key, model)`` for each distinct key of ``keys`` (sorted) that ``build``
    (:func:`attention_model`, :func:`expert_model`) makes a probe model of; keys it refuses
    (:class:`ProbeError`) are left out."""
    out = []
    for key in sorted(set(keys)):
        try:
            out.append((key, build(key)))
        except ProbeError:
            continue
    return out


def probe_plan(
    weight_types: Sequence[str], attn_shapes: Sequence[str] = ("32/8/128",), expert_keys: Sequence[str] = ()
) -> tuple[ProbeModel, ...]:
    """The probe models for ``weight_types``, ``attn_shapes`` (:func:`attn_key`) and
    ``expert_keys`` (:func:`expert_key`; what the probe cannot write is skipped): the overhead
    probes, one attention probe per shape, one matrix probe per type, one expert probe per key."""
    types = sorted({t.upper() for t in weight_types if t.upper() in PROBE_TYPES})
    shapes = [m for _, m in _buildable(attn_shapes, attention_model)]
    experts = [m for _, m in _buildable(expert_keys, expert_model)]
    return (*overhead_models(), *shapes, *(matrix_model(t) for t in types), *experts)


def model_attn_shapes(model: Any, kv_pairs: Sequence[tuple[str, str]] = (("f16", "f16"),)) -> tuple[str, ...]:
    """The attention shapes (:func:`attn_key`) of ``model``'s layers with KV, for each K/V type
    pair of ``kv_pairs``."""
    return tuple(
        sorted(
            {
                layer_attn_key(model, il, k, v)
                for il in range(model.n_layer)
                if model.has_kv(il) and model.n_head_kv[il]
                for k, v in kv_pairs
            }
        )
    )


def probe_needs(
    model: Any, kv_pairs: Sequence[tuple[str, str]] = (("f16", "f16"),)
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a CPU prediction for ``model`` (a :class:`~kvtuner.core.model.profile.ModelProfile`)
    needs measured: its weight types of over 1 % of its bytes that the probe can write, and the
    attention shapes of its layers that the probe can measure, for each K/V type pair of
    ``kv_pairs`` (``(type_k, type_v)``; f16 K/V by default)."""
    from .weights import weight_summary

    wt = weight_summary(model).types()
    total = sum(wt.values()) or 1
    types = tuple(sorted(t for t, b in wt.items() if b / total > 0.01 and t in PROBE_TYPES))
    return types, tuple(k for k, _ in _buildable(model_attn_shapes(model, kv_pairs), attention_model))


def probe_expert_needs(model: Any) -> tuple[str, ...]:
    """The expert shapes (:func:`expert_key`) of ``model``'s layers that the expert probe can
    write (:func:`model_expert_keys`, :func:`expert_model`)."""
    return tuple(k for k, _ in _buildable([k for k in model_expert_keys(model) if k], expert_model))


def probe_covers(rates: CpuRates, model: Any) -> bool:
    """A stored CPU probe measured every kernel ``model`` (a
    :class:`~kvtuner.core.model.profile.ModelProfile`) needs: its weight types, its attention
    shapes with f16 K/V and its MoE expert shapes (:func:`probe_needs`, :func:`probe_expert_needs`).
    A prediction and a recorded run both use the probe only when it covers the model, else the
    assumed rates: a run priced with other rates than the predictions would calibrate the wrong
    base."""
    types, dims = probe_needs(model, [("f16", "f16")])
    return (
        all(t in rates.decode_bytes_s for t in types)
        and all(d in rates.attn_decode_s for d in dims)
        and all(e in rates.expert_decode_bytes_s for e in probe_expert_needs(model))
    )


#: The scale byte every probe model writes into its MXFP4 blocks: 127 (x 0.5, ggml-impl.h
#: ``GGML_E8M0_TO_FP32_HALF``). A hole's 0 is 2^-128, a subnormal float, and x86 runs arithmetic on
#: subnormals through a slow path: zero-weight MXFP4 experts with nonzero activations prefilled
#: 2.7x slower than normal ones on an Intel VM, and on an AMD EPYC VM even the dense probe (zero
#: activations) read MXFP4 at 4.6 GB/s decode and 52 GFLOP/s prefill with zero exponents against
#: 9.7 and 80 with this one.
MXFP4_NORMAL_EXPONENT = 127


def _probe_data(m: ProbeModel, name: str, shape: tuple[int, ...], t: str) -> Iterator[bytes] | None:
    """The data a probe model holds for one tensor (None: a hole of zeros): MXFP4 blocks with a
    normal scale (:data:`MXFP4_NORMAL_EXPONENT`); in an expert probe also random token embeddings and
    routers (fixed seed) and norms of one, so the hidden state of every layer is the token's own
    embedding and each layer's router sends it to its own experts."""
    if t == "MXFP4":
        return mxfp4_blocks(_nbytes(shape, t))
    if not m.n_expert:
        return None
    if name == "token_embd.weight" or name.endswith("ffn_gate_inp.weight"):
        seed = 0 if name == "token_embd.weight" else 1 + int(name.split(".")[1])
        return iter([np.random.default_rng(seed).standard_normal(int(np.prod(shape))).astype(np.float32).tobytes()])
    if name.endswith("_norm.weight"):
        return iter([np.ones(int(np.prod(shape)), np.float32).tobytes()])
    return None


def mxfp4_blocks(n_bytes: int, exponent: int = MXFP4_NORMAL_EXPONENT, chunk_blocks: int = 1 << 16) -> Iterator[bytes]:
    """``n_bytes`` of MXFP4 data (ggml-common.h ``block_mxfp4``: one E8M0 exponent byte, then 16
    bytes of 4-bit values, per 32 weights) whose blocks have exponent byte ``exponent`` and zero
    values -- zero weights with a normal scale -- in chunks of ``chunk_blocks`` blocks."""
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.MXFP4][1]
    n_blocks = n_bytes // block
    chunk = np.zeros((min(n_blocks, chunk_blocks), block), np.uint8)
    chunk[:, 0] = exponent
    for lo in range(0, n_blocks, chunk_blocks):
        yield chunk[: min(n_blocks - lo, chunk_blocks)].tobytes()


def write_probe_model(path: str | Path, m: ProbeModel) -> Path:
    """Write ``m`` as a sparse GGUF (header and tensor table; the data a hole of the right size).

    Raises:
        ProbeError: the file cannot be written.
    """
    path = Path(path)
    try:
        w = gguf.GGUFWriter(str(path), m.arch)
        w.add_name(f"kvtuner CPU probe {m.key}")
        add_transformer_keys(w, m.n_layer, m.n_ctx, m.n_embd, m.n_ff, m.n_head, m.n_head_kv)
        w.add_key_length(m.head_dim)
        if m.mla_rank:  # deepseek2.cpp load_arch_hparams: MLA with an absorbed K-only cache
            rope = m.mla_rope
            w.add_value_length(m.mla_rank)
            w.add_rope_dimension_count(rope)
            w.add_q_lora_rank(0)
            w.add_kv_lora_rank(m.mla_rank)
            w.add_key_length_mla(MLA_NOPE + rope)
            w.add_value_length_mla(MLA_V)
            w.add_leading_dense_block_count(m.n_layer)
            w.add_expert_feed_forward_length(m.n_ff)
            w.add_expert_shared_count(0)
        else:
            w.add_value_length(m.head_dim)
            w.add_rope_dimension_count(m.head_dim)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10000.0)
        w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
        if m.n_expert:
            w.add_expert_count(m.n_expert)
            w.add_expert_used_count(m.n_expert_used)
        w.add_tokenizer_model("none")
        w.add_vocab_size(PROBE_VOCAB)
        tensors = m.tensors()
        for _, shape, t in tensors:
            _nbytes(shape, t)  # every row whole blocks of its type
        write_sparse_gguf(path, w, tensors, lambda name, shape, t: _probe_data(m, name, shape, t))
    except OSError as exc:
        raise ProbeError(f"cannot write the CPU probe model {path}: {exc.strerror or exc}") from None
    return path


@dataclass(frozen=True)
class ProbeRun:
    """One measured bench of a probe model: ``key`` of the model, ``n_depth``, ``n_prompt``,
    ``prefill_s`` (seconds for the prompt), ``n_gen``, ``decode_s`` (seconds for the tokens)."""

    key: str
    n_depth: int
    n_prompt: int
    prefill_s: float
    n_gen: int
    decode_s: float


@dataclass(frozen=True)
class CpuRates:
    """This machine's CPU as llama.cpp uses it, at ``n_threads`` threads.

    Attributes:
        n_threads: llama.cpp threads (``-t``) of the measurement.
        decode_bytes_s: per weight type, bytes/s of weights the mat-vec kernels stream (decode).
        prefill_flop_s: per weight type, FLOP/s the mat-mat kernels tend to with a large batch.
        layer_s: fixed decode cost per layer per token (op dispatch, thread barriers), s.
        token_s: fixed cost per token (graph build, scheduling, sampling), s.
        attn_decode_s: per attention shape (:func:`attn_key`, ``"32/8/128"``), decode cost of one
            query head over one cached cell (flash attention, ``kv_type`` KV, averaged over depths
            up to :data:`ATTN_DEPTH`), s.
        attn_prefill_s: per attention shape, the same per (prompt token x query head x cell), s.
        kv_type: the KV type the attention probe used.
        half_batch: per weight type, the batch at which the mat-mat kernels reach half of
            ``prefill_flop_s`` (tokens).
        layer_prefill_s: fixed cost per layer per prompt batch, s.
        expert_decode_bytes_s: per MoE expert shape (:func:`expert_key`), bytes/s of the selected
            experts' weights the MUL_MAT_ID mat-vecs stream (decode).
        expert_prefill_flop_s: per MoE expert shape, FLOP/s of the selected experts' MUL_MAT_ID in
            a prompt of :data:`EXPERT_PROMPT` tokens (0 or absent: not probed).
        t_unix: when it was measured.
        load_avg: the 1-minute load average then (a busy machine measures slow).
        source: how it was obtained.
        other_cores: cores other processes kept busy on average while it ran
            (:class:`kvtuner.core.monitor.contention.ContentionMeter`; None: not measured).
        busy: that load was over the quiet limit: the rates measured the other load and are not
            stored unless the user asks for it (:meth:`CalibrationStore.set_cpu_rates
            <kvtuner.core.speed.calibration.CalibrationStore.set_cpu_rates>`).
    """

    n_threads: int
    decode_bytes_s: dict[str, float]
    prefill_flop_s: dict[str, float]
    layer_s: float
    token_s: float
    attn_decode_s: dict[str, float]
    attn_prefill_s: dict[str, float]
    kv_type: str = "f16"
    t_unix: float = 0.0
    load_avg: float | None = None
    source: str = "llama.cpp probe"
    half_batch: dict[str, float] = field(default_factory=dict)
    layer_prefill_s: float = 0.0
    expert_decode_bytes_s: dict[str, float] = field(default_factory=dict)
    expert_prefill_flop_s: dict[str, float] = field(default_factory=dict)
    other_cores: float | None = None
    busy: bool = False

    def prefill_rate(self, type_name: str, batch: float) -> float:
        """FLOP/s of ``type_name``'s mat-mat kernels for a batch of ``batch`` rows:
        ``prefill_flop_s * b / (b + half_batch)`` (rates of an unprobed type: :func:`nearest`)."""
        peak = nearest(self.prefill_flop_s, type_name)
        half = nearest(self.half_batch, type_name) if self.half_batch else 0.0
        b = max(1.0, float(batch))
        return peak * b / (b + half)

    def attn_cost(self, table: dict[str, float], shape: str, *, decode: bool = False) -> float:
        """Cost per head and cell of an attention shape (:func:`attn_key`) from ``table``
        (``attn_decode_s`` or ``attn_prefill_s``): the measured shape, else for another K/V pair
        than f16 the same shape with f16 K/V (what was used before K/V pairs were probed), else
        the f16 shape nearest in head size and then in query heads per KV head, scaled by the
        head size; else the fallback ``"*"`` (for 128-wide heads) scaled by the head size, and
        in decode (``decode``) by the K/V pair's bytes (:func:`attn_decode_kv_factor`)."""
        if shape in table:
            return table[shape]
        base, k, v = attn_key_kv(shape)
        if base != shape:
            cost = self.attn_cost(table, base)
            if decode and all(key == "*" for key in table):
                cost *= attn_decode_kv_factor(k, v)
            return cost
        want = _parse_attn_key(shape) or (32, 8, 128)
        known = [(k, p) for k, p in ((k, _parse_attn_key(k)) for k in table if "@" not in k) if p is not None]
        if not known:  # only other K/V pairs probed: the nearest of those rather than nothing
            known = [(k, p) for k, p in ((k, _parse_attn_key(k)) for k in table) if p is not None]
        if not known:
            return table.get("*", 0.0) * want[2] / 128
        ratio = want[0] / max(1, want[1])
        k, p = min(known, key=lambda kp: (abs(kp[1][2] - want[2]), abs(kp[1][0] / kp[1][1] - ratio)))
        return table[k] * want[2] / p[2]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (stored in the calibration file)."""
        return {
            "n_threads": self.n_threads,
            "decode_bytes_s": dict(self.decode_bytes_s),
            "prefill_flop_s": dict(self.prefill_flop_s),
            "half_batch": dict(self.half_batch),
            "layer_s": self.layer_s,
            "token_s": self.token_s,
            "layer_prefill_s": self.layer_prefill_s,
            "attn_decode_s": dict(self.attn_decode_s),
            "attn_prefill_s": dict(self.attn_prefill_s),
            "expert_decode_bytes_s": dict(self.expert_decode_bytes_s),
            "expert_prefill_flop_s": dict(self.expert_prefill_flop_s),
            "kv_type": self.kv_type,
            "t_unix": self.t_unix,
            "load_avg": self.load_avg,
            "source": self.source,
            "other_cores": self.other_cores,
            "busy": self.busy,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CpuRates:
        """Inverse of :meth:`to_dict`.

        Raises:
            ProbeError: a malformed record.
        """

        def table(key: str) -> dict[str, float]:
            return {str(k): float(v) for k, v in (d.get(key) or {}).items()}

        try:
            r = cls(
                int(d["n_threads"]),
                table("decode_bytes_s"),
                table("prefill_flop_s"),
                float(d["layer_s"]),
                float(d["token_s"]),
                table("attn_decode_s"),
                table("attn_prefill_s"),
                str(d.get("kv_type", "f16")),
                float(d.get("t_unix", 0.0)),
                d.get("load_avg"),
                str(d.get("source", "llama.cpp probe")),
                table("half_batch"),
                float(d.get("layer_prefill_s", 0.0)),
                table("expert_decode_bytes_s"),
                table("expert_prefill_flop_s"),
                None if d.get("other_cores") is None else float(d["other_cores"]),
                bool(d.get("busy", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProbeError(f"malformed CPU probe record: {exc}") from None
        values = [
            *r.decode_bytes_s.values(),
            *r.prefill_flop_s.values(),
            *r.half_batch.values(),
            r.layer_s,
            r.token_s,
            *r.attn_decode_s.values(),
            *r.attn_prefill_s.values(),
            r.layer_prefill_s,
            *r.expert_decode_bytes_s.values(),
            *r.expert_prefill_flop_s.values(),
        ]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ProbeError("malformed CPU probe record: rates must be finite and >= 0")
        return r

    def merged(self, other: CpuRates) -> CpuRates:
        """These rates with ``other``'s weight types, attention and expert shapes added (``other``'s
        fixed costs win: newer)."""
        return CpuRates(
            other.n_threads,
            {**self.decode_bytes_s, **other.decode_bytes_s},
            {**self.prefill_flop_s, **other.prefill_flop_s},
            other.layer_s,
            other.token_s,
            {**self.attn_decode_s, **other.attn_decode_s},
            {**self.attn_prefill_s, **other.attn_prefill_s},
            other.kv_type,
            other.t_unix,
            other.load_avg,
            other.source,
            {**self.half_batch, **other.half_batch},
            other.layer_prefill_s,
            {**self.expert_decode_bytes_s, **other.expert_decode_bytes_s},
            {**self.expert_prefill_flop_s, **other.expert_prefill_flop_s},
            other.other_cores,
            self.busy or other.busy,
        )

    def without_types(self, types: Sequence[str]) -> CpuRates:
        """These rates with the matrix figures of ``types`` left out (an implausible reading)."""
        drop = set(types)

        def keep(table: dict[str, float]) -> dict[str, float]:
            return {k: v for k, v in table.items() if k not in drop}

        return replace(
            self,
            decode_bytes_s=keep(self.decode_bytes_s),
            prefill_flop_s=keep(self.prefill_flop_s),
            half_batch=keep(self.half_batch),
        )


#: How far apart two weight types' decode rates may be and still be believed (a factor): a type
#: with fewer bits per weight must decode at least 1/this of the weights per second of a type with
#: more (its kernel streams fewer bytes per weight; measured ratios here: Q5_0 0.75-0.98 of Q6_K
#: and Q8_0 in weights/s, Q4_K 0.98-1.3x), and a type with more bits must stream at least 1/this of
#: the bytes per second of one with fewer (a mat-vec does less work per byte with more bits; measured
#: Q8_0 1.0-1.7x MXFP4 and Q5_0). Outside it one figure was read at a busy moment: Q4_K at 2.9 GB/s
#: beside Q6_K at 10.8 (3.7x the bytes/s and 2.6x the weights/s of a type with fewer bits).
PLAUSIBLE_RATE_FACTOR = 2.0


def implausible_types(decode_bytes_s: dict[str, float], factor: float = PLAUSIBLE_RATE_FACTOR) -> list[str]:
    """The weight types whose decode rate (bytes/s per type, :attr:`CpuRates.decode_bytes_s`) is
    too low against another type's for what their bits per weight allow (see
    :data:`PLAUSIBLE_RATE_FACTOR`): other load only ever slows a reading, so the slower one of an
    implausible pair is the suspect. Only types whose kernels stream their bytes are compared: a
    :data:`LOOKUP_TYPES` rate is bound by its table lookups (IQ3_XXS decodes under half of Q4_K's
    weights per second on an idle machine), so it is neither suspect nor evidence. Sorted."""
    bad: set[str] = set()
    items = [
        (t, v, _bits_per_weight(t)) for t, v in decode_bytes_s.items() if t != "*" and v > 0 and not is_lookup_type(t)
    ]
    for a, va, bits_a in items:
        for b, vb, bits_b in items:
            if bits_a >= bits_b:
                continue
            # a has fewer bits per weight than b
            if va * 8 / bits_a * factor < vb * 8 / bits_b:
                bad.add(a)  # a decodes far fewer weights/s than the wider type
            if vb * factor < va:
                bad.add(b)  # b streams far fewer bytes/s than the narrower type
    return sorted(bad)


def _bits_per_weight(type_name: str) -> float:
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name.upper()]]
    except KeyError:
        return 16.0
    return 8.0 * size / block


def nearest(table: dict[str, float], type_name: str) -> float:
    """The value of ``type_name`` in a per-type table: its own, else the probed type of the same
    kind (:func:`is_lookup_type`: table-lookup or streaming kernels) nearest in bits per weight
    (kernels of a family run alike), else ``table["*"]`` (a fallback), else the probed type of the
    other kind nearest in bits. Type names in any case (``"iq2_xxs"`` is ``"IQ2_XXS"``).

    Raises:
        ProbeError: an empty table.
    """
    type_name = type_name.upper()
    if type_name in table:
        return table[type_name]
    probed = [t for t in table if t != "*"]
    bits = _bits_per_weight(type_name)
    same = [t for t in probed if is_lookup_type(t) == is_lookup_type(type_name)]
    if same:
        return table[min(same, key=lambda t: abs(_bits_per_weight(t) - bits))]
    if "*" in table:
        return table["*"]
    if not probed:
        raise ProbeError("no CPU rates: run the CPU probe (kvtuner probe)")
    return table[min(probed, key=lambda t: abs(_bits_per_weight(t) - bits))]


def rates_from_runs(
    runs: Sequence[ProbeRun], n_threads: int, *, kv_type: str = "f16", load_avg: float | None = None
) -> CpuRates:
    """Turn the probe's measured runs into :class:`CpuRates` (formulas in the module docstring):

    - overhead: ``t(24) = 24 layer_s + token_s``, ``t(6) = 6 layer_s + token_s`` per decoded token,
      and per prompt ``p(24) - p(6) = 18 layer_prefill_s``;
    - attention (shape s = query heads/KV heads/head size):
      ``attn_decode_s[s] = (t_token(D) - t_token(0)) / (layers * query heads * D)``,
      ``attn_prefill_s[s] = (t_prompt(D) - t_prompt(0)) / (layers * query heads * n_prompt * D)``;
    - matrix type T: ``decode_bytes_s = bytes / (t_token - layers * layer_s - token_s)``; the prompt
      rates ``r(b) = 2 * params * b / (t_prompt(b) - token_s - layers * layer_prefill_s)`` at the two
      batches give ``half_batch = b1 b2 (r1 - r2) / (b1 r2 - b2 r1)`` and
      ``prefill_flop_s = r1 (b1 + half_batch) / b1`` (``rate(b) = peak * b / (b + half)``);
    - expert shape X (``L`` layers, ``k`` of ``n`` experts per token): ``expert_decode_bytes_s =
      selected expert bytes / (t_token - L * layer_s - token_s - the rest's bytes at the probed
      rate nearest F16)``; ``expert_prefill_flop_s = 2 * selected params per layer * ((L - 1) * P
      + 1) / (t_prompt - token_s - L * layer_prefill_s - the rest's FLOPs at the F16 rate)`` for a
      prompt of ``P`` tokens (the last layer's experts run for the output token only).

    A difference that comes out at or below zero (noise on a tiny model) is floored at 2 % of
    the measured time.

    Raises:
        ProbeError: a run the formulas need is missing.
    """
    by = {(r.key, r.n_depth, r.n_prompt): r for r in runs}

    def get(key: str, depth: int = 0, n_prompt: int | None = None) -> ProbeRun:
        for (k, d, p), r in by.items():
            if k == key and d == depth and (n_prompt is None or p == n_prompt):
                return r
        raise ProbeError(f"the CPU probe has no run of {key} at depth {depth}")

    def pos(x: float, whole: float) -> float:
        return max(x, 0.02 * whole)

    (n_hi, n_lo) = OVERHEAD_LAYERS
    o_hi, o_lo = get(f"overhead:{n_hi}"), get(f"overhead:{n_lo}")
    t_hi, t_lo = o_hi.decode_s / o_hi.n_gen, o_lo.decode_s / o_lo.n_gen
    layer_s = pos(t_hi - t_lo, t_hi) / (n_hi - n_lo)
    token_s = pos(t_lo - n_lo * layer_s, t_lo)
    layer_prefill_s = pos(o_hi.prefill_s - o_lo.prefill_s, o_hi.prefill_s) / (n_hi - n_lo)
    att_dec: dict[str, float] = {}
    att_pre: dict[str, float] = {}
    for key in sorted({r.key for r in runs if r.key.startswith("attn:")}):
        a0, a1 = get(key, 0), get(key, ATTN_DEPTH)
        shape = key.split(":", 1)[1]
        head_cells = ATTN_LAYERS * attention_model(shape).n_head * ATTN_DEPTH
        td0, td1 = a0.decode_s / a0.n_gen, a1.decode_s / a1.n_gen
        att_dec[shape] = pos(td1 - td0, td1) / head_cells
        att_pre[shape] = pos(a1.prefill_s - a0.prefill_s, a1.prefill_s) / (head_cells * a1.n_prompt)
    dec: dict[str, float] = {}
    pre: dict[str, float] = {}
    half: dict[str, float] = {}
    for key in sorted({r.key for r in runs if r.key.startswith("matrix:")}):
        t = key.split(":", 1)[1]
        b, p = matrix_model(t).matrix_bytes_params()
        big, small = get(key, 0, MATRIX_PROMPT), get(key, 0, MATRIX_SMALL_PROMPT)
        td = big.decode_s / big.n_gen
        dec[t] = b / pos(td - MATRIX_LAYERS * layer_s - token_s, td)
        fixed = token_s + MATRIX_LAYERS * layer_prefill_s
        b1, b2 = float(big.n_prompt), float(small.n_prompt)
        r1 = 2.0 * p * b1 / pos(big.prefill_s - fixed, big.prefill_s)
        r2 = 2.0 * p * b2 / pos(small.prefill_s - fixed, small.prefill_s)
        den = b1 * r2 - b2 * r1
        h = b1 * b2 * (r1 - r2) / den if den > 0 and r1 > r2 else 0.0
        half[t] = h
        pre[t] = r1 * (b1 + h) / b1
    e_dec: dict[str, float] = {}
    e_pre: dict[str, float] = {}
    for key in sorted({r.key for r in runs if r.key.startswith("expert:")}):
        x = key.split(":", 1)[1]
        m = expert_model(x)
        b, params = m.expert_bytes_params()
        run = get(key, 0)
        td = run.decode_s / run.n_gen
        # the rest a decoded token reads: the layers' attention and router matrices, the output
        rest = sum(
            _nbytes(sh, t)
            for name, sh, t in m.tensors()
            if (name.startswith("blk.") and len(sh) == 2) or name == "output.weight"
        )
        t_rest = rest / nearest(dec, "F16") if dec else 0.0
        e_dec[x] = b / pos(td - m.n_layer * layer_s - token_s - t_rest, td)
        if run.n_prompt and run.prefill_s > 0:
            # llama.cpp runs the last layer's FFN for the output row only (the probe is a llama
            # model: last_layer_rows_only), so the prompt's expert work is (L - 1) layers of every
            # token plus the last layer's output token
            last = 1 if last_layer_rows_only(m.arch) else run.n_prompt
            flops = 2.0 * params / m.n_layer * ((m.n_layer - 1) * run.n_prompt + last)
            fixed = token_s + m.n_layer * layer_prefill_s
            rest_p = sum(sh[0] * sh[1] for name, sh, t in m.tensors() if name.startswith("blk.") and len(sh) == 2)
            t_rest_p = 2.0 * rest_p * run.n_prompt / nearest(pre, "F16") if pre else 0.0
            e_pre[x] = flops / pos(run.prefill_s - fixed - t_rest_p, run.prefill_s)
    return CpuRates(
        n_threads,
        dec,
        pre,
        layer_s,
        token_s,
        att_dec,
        att_pre,
        kv_type,
        time.time(),
        load_avg,
        half_batch=half,
        layer_prefill_s=layer_prefill_s,
        expert_decode_bytes_s=e_dec,
        expert_prefill_flop_s=e_pre,
    )
