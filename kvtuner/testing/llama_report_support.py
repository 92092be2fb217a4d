"""Dry-run results that stand in for what a llama.cpp build this machine lacks would report."""

from __future__ import annotations

from typing import Any

from kvtuner.core.llama_report import DryRunResult


def dry_run_result(**fields: Any) -> DryRunResult:
    """A :class:`~kvtuner.core.llama_report.DryRunResult` of a CUDA build's embedded dry run at
    ``n_ctx`` 4096 that reports nothing; ``fields`` set what it reports (``kv_caches``,
    ``compute_mib``, ``devices`` ...)."""
    base: dict[str, Any] = {
        "kv_caches": (),
        "compute_mib": {},
        "output_mib": {},
        "model_mib": {},
        "kv_buffer_mib": {},
        "n_ctx": 4096,
        "n_ctx_seq": 4096,
        "flash_attn": True,
        "gpu_offload_supported": True,
        "devices": ("CPU", "CUDA0"),
        "llama_build": "test",
        "log_tail": (),
    }
    return DryRunResult(**{**base, **fields})
