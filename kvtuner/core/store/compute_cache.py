"""Exact compute-buffer sizes remembered from llama.cpp dry-runs.

The analytic compute estimate (:mod:`kvtuner.core.plan.compute_buffer`) cannot reproduce
ggml-alloc's packing exactly, so every dry-run's ``sched_reserve`` figures are kept here,
keyed by everything that shapes the reserve graph (model header hash, cells, streams,
ubatch, flash attention, KV types, layer placement, devices). A later plan of the same
configuration uses them as exact (``compute_source == "dry-run"``).

Stored as JSON in ``data_dir()/compute-buffers.json`` (:func:`kvtuner.core.paths.data_dir`),
written atomically; a damaged file is ignored, never fatal.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.memory_plan import MemoryPlan

from ..plan.buffers import bytes_by_device
from .keyed_json import KeyedJsonFile

FILE_NAME = "compute-buffers.json"
MAX_ENTRIES = 2000


def compute_key(plan: MemoryPlan) -> str:
    """A stable key for a plan's compute buffers (sha256 of the fields that shape the graph)."""
    c = plan.config
    fields = {
        "model": plan.model.header_sha256,
        "devices": [(d.device, d.name) for d in plan.gpus],
        "n_ctx_seq": plan.n_ctx_seq,
        "n_stream": plan.n_stream,
        "n_ubatch": plan.n_ubatch,
        "n_gpu_layers": plan.n_gpu_layers,
        "kv_gpu_layers": plan.kv_gpu_layers,
        "flash_attn": c.flash_attn,
        "type_k": c.type_k,
        "type_v": c.type_v,
        "n_seq": c.n_seq,
        "swa_full": c.swa_full,
        "kv_unified": c.kv_unified,
    }
    rules = getattr(plan, "rules", None)
    if rules is not None:  # figures of another build or program are not these
        fields["rules"] = [rules.build, rules.program]
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def exact_for(plan: MemoryPlan) -> dict[str, int] | None:
    """Exact compute bytes per device remembered for this plan's configuration, or None."""
    return lookup(compute_key(plan))


def remember(plan: MemoryPlan, compute_mib: dict[str, float]) -> dict[str, int]:
    """Store a dry-run's ``sched_reserve`` figures (MiB as printed, buffer-type names such as
    ``CPU`` or ``CUDA0``) for this plan; returns them in bytes per device."""
    exact = bytes_by_device(compute_mib)
    store(compute_key(plan), exact)
    return exact


_FILE = KeyedJsonFile(FILE_NAME, MAX_ENTRIES)


def lookup(key: str) -> dict[str, int] | None:
    """Exact compute bytes per device for ``key``, or None."""
    entry = _FILE.get(key)
    if not isinstance(entry, dict) or not all(isinstance(v, int) for v in entry.values()):
        return None
    return dict(entry)


def store(key: str, bytes_by_device: dict[str, int]) -> None:
    """Remember exact compute bytes per device for ``key`` (atomic write; errors ignored)."""
    _FILE.put(key, {k: int(v) for k, v in bytes_by_device.items()})
