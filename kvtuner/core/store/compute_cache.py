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
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.memory_plan import MemoryPlan

from ..fileio import replace_atomic
from ..paths import data_dir
from ..plan.buffers import bytes_by_device

FILE_NAME = "compute-buffers.json"
MAX_ENTRIES = 2000


def compute_key(plan: "MemoryPlan") -> str:
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
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def exact_for(plan: "MemoryPlan") -> dict[str, int] | None:
    """Exact compute bytes per device remembered for this plan's configuration, or None."""
    return lookup(compute_key(plan))


def remember(plan: "MemoryPlan", compute_mib: dict[str, float]) -> dict[str, int]:
    """Store a dry-run's ``sched_reserve`` figures (MiB as printed, buffer-type names such as
    ``CPU`` or ``CUDA0``) for this plan; returns them in bytes per device."""
    exact = bytes_by_device(compute_mib)
    store(compute_key(plan), exact)
    return exact


def _path() -> Path:
    return data_dir() / FILE_NAME


_LOADED: tuple[Path, int, int, dict[str, dict[str, int]]] | None = None  # path, mtime_ns, size, data


def _load() -> dict[str, dict[str, int]]:
    """The stored figures, read again only when the file changed (a slider move plans several
    times a second; the file is small but re-parsing it each time is not free)."""
    global _LOADED
    path = _path()
    try:
        st = path.stat()
    except OSError:
        return {}
    if _LOADED is not None and _LOADED[:3] == (path, st.st_mtime_ns, st.st_size):
        return _LOADED[3]
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    data = data if isinstance(data, dict) else {}
    _LOADED = (path, st.st_mtime_ns, st.st_size, data)
    return data


def lookup(key: str) -> dict[str, int] | None:
    """Exact compute bytes per device for ``key``, or None."""
    entry = _load().get(key)
    if not isinstance(entry, dict) or not all(isinstance(v, int) for v in entry.values()):
        return None
    return dict(entry)


def store(key: str, bytes_by_device: dict[str, int]) -> None:
    """Remember exact compute bytes per device for ``key`` (atomic write; errors ignored)."""
    data = dict(_load())
    data[key] = {k: int(v) for k, v in bytes_by_device.items()}
    if len(data) > MAX_ENTRIES:
        for old in list(data)[: len(data) - MAX_ENTRIES]:
            del data[old]
    try:
        replace_atomic(_path(), json.dumps(data))
    except OSError:
        pass
