"""Advice for a workload (:mod:`kvtuner.core.plan.workload`): which case the KV pool is safe for,
and the fix that makes it safe for the worst case, or smaller for the expected one.

Rules:

- ``workload-not-worst-safe`` (warning): a unified pool (``--kv-unified``) smaller than
  ``sequences x window``: it holds only the P95 / expected case; when every sequence grows to
  the window llama-server frees idle slots and then stops active ones (ggml-org/llama.cpp#16736).
  Fix: ``n_ctx`` = the worst case.
- ``workload-unified-saves`` (info): split streams (llama.cpp's default) allocate every sequence's
  window whatever its length; with ``--kv-unified`` and ``n_ctx`` sized for the P95 case (else the
  expected one) the pool is that much smaller. Fix: ``kv_unified`` on and that ``n_ctx``.
"""

from __future__ import annotations

from ..plan.llama_constants import pad_ctx
from ..plan.workload import WorkloadKV
from .advisor import Advice, _adv


def advise_workload(kv: WorkloadKV, n_ctx: int) -> list[Advice]:
    """``workload-not-worst-safe`` for a unified llama.cpp pool of ``n_ctx`` cells (nothing for
    split streams, see :func:`advise_unified`, or for vLLM, whose pool is sized by memory)."""
    out: list[Advice] = []
    if kv.engine != "llama.cpp":
        return out
    if kv.unified:
        case = kv.safe_case(n_ctx)
        if case != "worst":
            what = {
                "p95": "the P95 case",
                "expected": "the expected (average) case",
                "none": "none of the cases given",
            }[case]
            out.append(
                _adv(
                    "workload-not-worst-safe",
                    "warning",
                    f"The unified KV pool of {n_ctx} cells is safe for {what} only; every sequence at the window needs "
                    f"{kv.worst_tokens} cells ({kv.bytes(kv.worst_tokens) / (1 << 20):.0f} MiB of KV).",
                    "unified KV: one pool for all sequences; worst case = sequences x window, expected = sequences x "
                    "average length (llama-server frees idle slots, then stops active ones, when it runs out: "
                    "ggml-org/llama.cpp#16736)",
                    {"n_ctx": pad_ctx(kv.worst_tokens)},
                )
            )
    return out


def advise_unified(worst_tokens: int, unified_target_tokens: int | None, kv_bytes_per_token: int) -> list[Advice]:
    """``workload-unified-saves`` for split streams: ``unified_target_tokens`` is the P95 (else
    expected) total the unified pool would need (:func:`kvtuner.core.plan.workload.workload_kv`
    with ``unified=True``); no advice when it is not smaller than the worst case."""
    if unified_target_tokens is None or unified_target_tokens >= worst_tokens:
        return []
    saved = (worst_tokens - unified_target_tokens) * kv_bytes_per_token
    return [
        _adv(
            "workload-unified-saves",
            "info",
            f"Split KV streams hold every sequence's whole window ({worst_tokens} cells); one unified pool sized for "
            f"the lengths you expect needs {unified_target_tokens} and saves {saved / (1 << 20):.0f} MiB.",
            "split streams: n_ctx / n_seq cells per sequence whatever its length; --kv-unified shares one pool "
            "(llama-kv-cache.cpp n_stream = unified ? 1 : n_seq_max)",
            {"kv_unified": True, "n_ctx": pad_ctx(unified_target_tokens)},
        )
    ]
