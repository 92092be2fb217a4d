"""ggml tensor types: block sizes, byte sizes and the llama.cpp ids of KV cache types.

Source: ggml/src/ggml.c ``type_traits`` (blck_size, type_size) and ggml.h ``enum ggml_type``
in the llama.cpp vendored by llama-cpp-python 0.3.36. ``row_size`` is ``ggml_row_size``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgmlType:
    """One ggml type: ``name`` as llama.cpp spells it, ``ggml_id`` (enum ggml_type),
    ``block_size`` (elements per block), ``type_size`` (bytes per block)."""

    name: str
    ggml_id: int
    block_size: int
    type_size: int

    @property
    def is_quantized(self) -> bool:
        """True for block-quantized types (anything but f32, f16, bf16)."""
        return self.name not in ("f32", "f16", "bf16")

    @property
    def bytes_per_element(self) -> float:
        """Bytes per element: ``type_size / block_size`` (q8_0: 34 / 32 = 1.0625)."""
        return self.type_size / self.block_size

    def divides(self, n_elements: int) -> bool:
        """True when a row of ``n_elements`` holds whole blocks of this type: ggml.c
        ``ggml_row_size`` asserts ``ne % ggml_blck_size(type) == 0``, and
        ``llama_init_from_model`` (src/llama-context.cpp) refuses a quantized K (V) cache whose
        block size does not divide ``n_embd_head_k(il)`` (``n_embd_head_v(il)``)."""
        return n_elements % self.block_size == 0


# KV cache types llama.cpp accepts for -ctk/-ctv (common/arg.cpp kv_cache_types).
KV_CACHE_TYPES: dict[str, GgmlType] = {
    t.name: t
    for t in (
        GgmlType("f32", 0, 1, 4),
        GgmlType("f16", 1, 1, 2),
        GgmlType("bf16", 30, 1, 2),
        GgmlType("q8_0", 8, 32, 34),
        GgmlType("q5_1", 7, 32, 24),
        GgmlType("q5_0", 6, 32, 22),
        GgmlType("q4_1", 3, 32, 20),
        GgmlType("q4_0", 2, 32, 18),
        GgmlType("iq4_nl", 20, 32, 18),
    )
}


def kv_type(name: str) -> GgmlType:
    """Look up a KV cache type by its llama.cpp name (``f16``, ``q8_0`` ...).

    Raises:
        ValueError: unknown name; the message lists the accepted ones.
    """
    key = str(name).strip().lower()
    try:
        return KV_CACHE_TYPES[key]
    except KeyError:
        raise ValueError(f"unknown KV cache type '{name}': use one of {', '.join(KV_CACHE_TYPES)}") from None


def row_size(t: GgmlType, n_elements: int) -> int:
    """Bytes of a row of ``n_elements`` of type ``t`` (``ggml_row_size``).

    Raises:
        ValueError: ``n_elements`` is not a multiple of the type's block size
            (ggml asserts on this).
    """
    if not t.divides(n_elements):
        raise ValueError(f"{n_elements} elements is not a multiple of {t.name}'s block size {t.block_size}")
    return t.type_size * (n_elements // t.block_size)
