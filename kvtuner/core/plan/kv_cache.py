"""KV cache records: one layer's K and V, and one llama.cpp cache as its log line reports it.

The arithmetic that fills them is :func:`kvtuner.core.plan.memory_plan.plan_memory` (after
src/llama-kv-cache.cpp's constructor); they live here so the compute-buffer estimate can read
them without importing the planner.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerKV:
    """KV cache of one layer: ``cells`` per stream, K and V bytes over all streams, its device."""

    il: int
    device: str
    swa: bool
    cells: int
    k_bytes: int
    v_bytes: int

    @property
    def kv_bytes(self) -> int:
        """K + V bytes."""
        return self.k_bytes + self.v_bytes


@dataclass(frozen=True)
class KvCacheSummary:
    """One KV cache as kvtuner plans it, the cache llama.cpp's ``llama_kv_cache: size = ...`` log
    line reports (:class:`~kvtuner.core.llama_report.KvCacheReport`, MiB as printed); the plan's
    figures are exact bytes.

    ``kind`` is ``"full"``, ``"swa"`` or ``"recurrent"``; sizes in bytes over all layers and streams.
    """

    kind: str
    cells: int
    layers: int
    n_seq: int
    n_stream: int
    type_k: str
    type_v: str
    k_bytes: int
    v_bytes: int

    @property
    def kv_bytes(self) -> int:
        """K + V bytes."""
        return self.k_bytes + self.v_bytes

    @property
    def bytes_per_cell(self) -> int:
        """Bytes per cell (token position) per stream, all layers: ``kv_bytes / (cells * n_stream)``."""
        return self.kv_bytes // (self.cells * self.n_stream) if self.cells else 0
