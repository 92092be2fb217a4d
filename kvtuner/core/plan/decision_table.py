"""The decision table: for one model and one card, every (sequences, window, KV type) ->
fits / does not fit, and a predicted aggregate decode speed.

KV bytes per token = ``2 x n_layer x n_kv_head x head_dim x bytes per element`` (K and V of every
layer; llama.cpp ``llama_kv_cache`` rows ``row_size(type, n_embd_k_gqa)``, vLLM
``CacheEngine.get_cache_block_size``); bytes per element: f16/bf16 2, fp8 1 (vLLM
``--kv-cache-dtype fp8``), q8_0 34/32, q5_1 24/32, q5_0 22/32, q4_1 20/32, q4_0 and iq4_nl 18/32
(ggml block sizes, ggml-common.h). A cell fits when ``weights + sequences x window x KV per token +
overhead <= card``.

The speed is the decode roofline: every step reads all weights once and every sequence's KV
once, so ``tok/s = sequences x bandwidth / (weights + KV in flight)`` (Williams, Waterman and
Patterson, "Roofline", CACM 2009; the memory-bound decode argument of Pope et al., "Efficiently
Scaling Transformer Inference", MLSys 2023). It is an upper bound that ignores compute and
kernel efficiency (kvtuner's speed model is the calibrated figure for one configuration).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..model.ggml_types import KV_CACHE_TYPES
from .vllm import KV_DTYPE_BYTES, VllmModel

#: Bytes per KV element by type name: llama.cpp's KV cache types
#: (:data:`~kvtuner.core.model.ggml_types.KV_CACHE_TYPES`, ggml.c ``type_traits``), with vLLM's
#: 1-byte ``fp8`` (:data:`~kvtuner.core.plan.vllm.KV_DTYPE_BYTES`) after the 16-bit types.
KV_ELEMENT_BYTES: dict[str, float] = {
    **{n: t.bytes_per_element for n, t in KV_CACHE_TYPES.items() if not t.is_quantized},
    "fp8": float(KV_DTYPE_BYTES["fp8"]),
    **{n: t.bytes_per_element for n, t in KV_CACHE_TYPES.items() if t.is_quantized},
}
#: What a cell reserves beside weights and KV unless told otherwise: 1 GiB (CUDA context,
#: about 0.3-0.5 GiB, plus a llama.cpp compute buffer of an 8B model at n_ubatch 512, about
#: 0.3-0.6 GiB in kvtuner's plans; vLLM's activation peak at 2048 tokens is similar).
DEFAULT_OVERHEAD_BYTES = 1 << 30


class TableError(ValueError):
    """A table request that cannot be computed; the message says what to change."""


def kv_bytes_per_token(model: VllmModel, kv_type: str) -> int:
    """``2 x n_layer x n_kv_head x head_dim x bytes(kv_type)``, rounded to whole bytes.

    Raises:
        TableError: an unknown KV type.
    """
    try:
        per = KV_ELEMENT_BYTES[kv_type]
    except KeyError:
        raise TableError(f"KV type must be one of {', '.join(KV_ELEMENT_BYTES)}, not '{kv_type}'") from None
    return int(round(2 * model.n_layer * model.n_kv_head * model.head_dim * per))


@dataclass(frozen=True)
class TableCell:
    """One cell: ``n_seq`` sequences of ``window`` tokens with ``kv_type`` KV.

    Attributes:
        kv_bytes: ``n_seq x window x kv_bytes_per_token``.
        total_bytes: weights + KV + overhead.
        fits: ``total_bytes <= card``.
        decode_tok_s: aggregate roofline decode speed with every sequence at the window (None
            without a known bandwidth).
    """

    n_seq: int
    window: int
    kv_type: str
    kv_bytes_per_token: int
    kv_bytes: int
    total_bytes: int
    fits: bool
    decode_tok_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields."""
        return {
            "n_seq": self.n_seq,
            "window": self.window,
            "kv_type": self.kv_type,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes": self.kv_bytes,
            "total_bytes": self.total_bytes,
            "fits": self.fits,
            "decode_tok_s": None if self.decode_tok_s is None else round(self.decode_tok_s, 1),
        }


def decision_table(
    model: VllmModel,
    card_bytes: int,
    *,
    weights_bytes: int,
    seqs: Sequence[int],
    windows: Sequence[int],
    kv_types: Sequence[str],
    bandwidth_bytes_s: float | None = None,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
) -> list[TableCell]:
    """Every (sequences, window, KV type) cell, in that nesting order.

    Raises:
        TableError: a non-positive sequence count, window or card size, or an unknown KV type.
    """
    if card_bytes <= 0:
        raise TableError("the table needs a card: give --gpu NAME or --gpu-mem SIZE")
    if any(s < 1 for s in seqs) or any(w < 1 for w in windows):
        raise TableError("--table-seqs and --table-windows must be positive whole numbers")
    cells = []
    for s in seqs:
        for w in windows:
            for t in kv_types:
                per = kv_bytes_per_token(model, t)
                kv = s * w * per
                total = weights_bytes + kv + overhead_bytes
                tok = s * bandwidth_bytes_s / (weights_bytes + kv) if bandwidth_bytes_s else None
                cells.append(TableCell(s, w, t, per, kv, total, total <= card_bytes, tok))
    return cells
