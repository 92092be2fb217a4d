"""Workload-aware KV sizing: the worst case (every sequence at the window) beside the expected
case (sequences at their average or P95 length, a shared prefix stored once where the engine
shares it).

Why it matters: with a unified KV buffer (llama.cpp ``--kv-unified``, llama-server's default
with ``-np -1``; vLLM's paged blocks always) parallel requests draw from one pool, so the pool
only has to hold the tokens actually in flight, not ``sequences x window``. With llama.cpp's
default split streams each sequence owns ``n_ctx / n_seq`` cells whatever its length, so only
the worst case counts.

Shared prefixes:

- **vLLM** automatic prefix caching (``--enable-prefix-caching``, default on in the v1 engine)
  shares *full* blocks of identical prefix tokens between requests (``vllm/v1/core/
  kv_cache_manager.py`` / ``block_pool.py``: blocks are hashed per 16 tokens, a partial last
  block is not shared), so the saving is ``floor(prefix / 16) x 16 x (sequences - 1)`` tokens.
- **llama-server** (tools/server/server-context.cpp of the llama.cpp vendored by
  llama-cpp-python 0.3.36) does *not* share a prefix between separate requests' slots today:
  ``llama_memory_seq_cp`` is used only in ``server_slot::copy_state_to``, for the child slots of
  one request asking for several completions (``n_cmpl > 1``), and with ``--kv-unified`` that
  copy only tags the same cells with another sequence id (no new memory). Between requests it
  reuses a slot's *own* cache (slot choice by longest common prefix, ``--slot-prompt-similarity``;
  chunk reuse ``--cache-reuse``) and a host-RAM prompt cache (``--cache-ram``), each copy a full
  copy. kvtuner therefore counts no prefix saving for llama.cpp. Applications calling
  ``llama_memory_seq_cp`` themselves on a unified cache (as examples/parallel does for its system
  prompt) do share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, overload

#: Engines whose KV sharing rules :func:`workload_kv` knows.
ENGINES = ("llama.cpp", "vllm")


class WorkloadError(ValueError):
    """A workload that makes no sense; the message says what to change."""


@dataclass(frozen=True)
class ServingWorkload:
    """What the user expects to serve.

    Attributes:
        n_seq: parallel sequences.
        window_tokens: the most tokens one sequence may reach (prompt + output).
        avg_tokens: average tokens per sequence (prompt + output), or None.
        p95_tokens: 95th percentile of tokens per sequence, or None.
        shared_prefix_tokens: leading tokens every sequence shares (system prompt, document).
    """

    n_seq: int
    window_tokens: int
    avg_tokens: int | None = None
    p95_tokens: int | None = None
    shared_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.n_seq < 1:
            raise WorkloadError(f"--parallel must be 1 or more, not {self.n_seq}")
        if self.window_tokens < 1:
            raise WorkloadError(f"the window must be 1 token or more, not {self.window_tokens}")
        for flag, v in (("--avg-tokens", self.avg_tokens), ("--p95-tokens", self.p95_tokens)):
            if v is not None and not 1 <= v <= self.window_tokens:
                raise WorkloadError(
                    f"{flag} must be between 1 and the per-sequence window ({self.window_tokens}), not {v}"
                )
        if self.avg_tokens is not None and self.p95_tokens is not None and self.p95_tokens < self.avg_tokens:
            raise WorkloadError(f"--p95-tokens ({self.p95_tokens}) must be at least --avg-tokens ({self.avg_tokens})")
        lo = min(x for x in (self.avg_tokens, self.p95_tokens, self.window_tokens) if x is not None)
        if not 0 <= self.shared_prefix_tokens <= lo:
            raise WorkloadError(
                f"--shared-prefix must be between 0 and the shortest length given ({lo}), "
                f"not {self.shared_prefix_tokens}"
            )


@dataclass(frozen=True)
class WorkloadKV:
    """KV tokens and bytes of one workload on one engine.

    Attributes:
        engine: ``llama.cpp`` or ``vllm``.
        unified: whether sequences share one pool (llama.cpp ``--kv-unified``; always for vLLM).
        kv_bytes_per_token: bytes per token position over all layers.
        worst_tokens: ``n_seq x window`` (vLLM: rounded up to whole blocks per sequence).
        p95_tokens, expected_tokens: the same at P95 / average lengths, less the shared prefix
            saving; None when that length was not given. Without a unified pool they equal the
            worst case (split streams are allocated whole).
        shared_saving_tokens: tokens the shared prefix saves (0 where the engine does not share).
    """

    engine: str
    unified: bool
    kv_bytes_per_token: int
    worst_tokens: int
    p95_tokens: int | None
    expected_tokens: int | None
    shared_saving_tokens: int

    @overload
    def bytes(self, tokens: int) -> int: ...
    @overload
    def bytes(self, tokens: None) -> None: ...
    def bytes(self, tokens: int | None) -> int | None:
        """``tokens x kv_bytes_per_token`` (None stays None)."""
        return None if tokens is None else tokens * self.kv_bytes_per_token

    def safe_case(self, pool_tokens: int) -> str:
        """The heaviest case a pool of ``pool_tokens`` holds: ``worst``, ``p95``, ``expected`` or
        ``none``."""
        if pool_tokens >= self.worst_tokens:
            return "worst"
        if self.p95_tokens is not None and pool_tokens >= self.p95_tokens:
            return "p95"
        if self.expected_tokens is not None and pool_tokens >= self.expected_tokens:
            return "expected"
        return "none"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able tokens and bytes."""
        return {
            "engine": self.engine,
            "unified": self.unified,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "worst_tokens": self.worst_tokens,
            "worst_bytes": self.bytes(self.worst_tokens),
            "p95_tokens": self.p95_tokens,
            "p95_bytes": self.bytes(self.p95_tokens),
            "expected_tokens": self.expected_tokens,
            "expected_bytes": self.bytes(self.expected_tokens),
            "shared_saving_tokens": self.shared_saving_tokens,
            "shared_saving_bytes": self.bytes(self.shared_saving_tokens),
        }


def workload_kv(
    kv_bytes_per_token: int,
    workload: ServingWorkload,
    *,
    engine: str = "llama.cpp",
    unified: bool = True,
    block_size: int = 16,
) -> WorkloadKV:
    """KV tokens for the worst, P95 and expected cases of ``workload``.

    llama.cpp: ``worst = n_seq x window``; with ``unified`` the P95/expected cases are
    ``n_seq x length`` (no prefix sharing between requests, see the module docstring), without it
    they equal the worst case. vLLM: every sequence holds ``ceil(length / block_size)`` blocks; the
    shared prefix saves ``floor(prefix / block_size) x block_size x (n_seq - 1)`` tokens.

    Raises:
        WorkloadError: an unknown engine.
    """
    if engine not in ENGINES:
        raise WorkloadError(f"engine must be one of {', '.join(ENGINES)}, not '{engine}'")
    n = workload.n_seq
    if engine == "vllm":
        unified = True

        def seq(tokens: int) -> int:
            return -(-tokens // block_size) * block_size

        saving = (workload.shared_prefix_tokens // block_size) * block_size * (n - 1)
    else:

        def seq(tokens: int) -> int:
            return tokens

        saving = 0
    worst = n * seq(workload.window_tokens)

    def case(length: int | None) -> int | None:
        if length is None:
            return None
        if not unified:
            return worst
        return n * seq(length) - saving

    return WorkloadKV(
        engine,
        unified,
        int(kv_bytes_per_token),
        worst,
        case(workload.p95_tokens),
        case(workload.avg_tokens),
        saving if unified else 0,
    )


def workload_advice(kv: WorkloadKV, pool_tokens: int) -> str:
    """One line saying which case a pool of ``pool_tokens`` cells is safe for, and the flag that
    makes it safe for the worst case (llama.cpp: ``-c``)."""
    case = kv.safe_case(pool_tokens)
    if case == "worst":
        return f"KV pool of {pool_tokens} tokens holds the worst case ({kv.worst_tokens}): every sequence can reach the window"
    what = {"p95": "the P95 case", "expected": "the expected (average) case", "none": "none of the cases given"}[case]
    tail = (
        " (llama-server frees idle slots, then stops active ones, when a unified pool runs out: "
        "tools/server, ggml-org/llama.cpp#16736)"
        if kv.engine == "llama.cpp" and kv.unified
        else ""
    )
    return (
        f"KV pool of {pool_tokens} tokens is safe for {what} only; the worst case needs {kv.worst_tokens} "
        f"(-c {kv.worst_tokens})" + tail
    )
