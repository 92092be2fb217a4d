"""Ask the installed llama.cpp what a configuration costs, without allocating anything.

:func:`dry_run` loads the model with ``no_alloc=True`` and ``load_mode=0`` (no mmap) and
creates the context in a child process (``python -m kvtuner.runner``), the way
``llama-server --fit`` does (common/fit.cpp). The buffer lines llama.cpp logs then print
0.00 MiB, but the ``llama_kv_cache: size = ...`` lines and ``sched_reserve: <buft> compute
buffer size = ...`` give the real sizes for the real backend (CUDA buffers on a CUDA build).
A GGML_ASSERT aborts only the child. Never imports ``llama_cpp`` in this process.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.plan.config import PlanConfig
from ..core.plan.llama_constants import CTX_PAD_CELLS

if TYPE_CHECKING:  # pragma: no cover
    from ..core.model.structure import ModelStructure

from . import protocol as P
from .client import RunnerClient, RunnerError
from .llama_log import KvCacheSize, MemoryBreakdownRow, RecurrentStateSize
from .structure_probe import structure_from_facts

#: One ``llama_kv_cache: size = ...`` line (llama-kv-cache.cpp constructor), in log order:
#: ``size_mib``, ``k_mib``, ``v_mib`` as printed (2 decimals); ``cells`` per stream; ``layers``;
#: ``n_seq`` (n_seq_max); ``n_stream``; ``type_k``, ``type_v``. The log parser's record, as is.
KvCacheReport = KvCacheSize

#: :attr:`DryRunResult.method` of each way of asking llama.cpp.
METHOD_EMBEDDED = "embedded dry run"
METHOD_SERVER = "llama-server start-up breakdown"
METHOD_FIT_PRINT = "llama-fit-params --fit-print"


@dataclass(frozen=True)
class DryRunResult:
    """What llama.cpp reported for a configuration.

    Attributes:
        kv_caches: log order; for iSWA models the non-SWA cache first, then the SWA one
            (llama-kv-cache-iswa.cpp creates them in that order).
        compute_mib: buffer type -> MiB from ``sched_reserve`` (e.g. ``{"CPU": 514.5}``).
        output_mib, model_mib, kv_buffer_mib: buffer type -> MiB as logged (0.00 for model
            and KV buffers under no_alloc, since nothing is allocated).
        n_ctx, n_ctx_seq: as llama.cpp set them (n_ctx padded to 256; llama-context.cpp).
        flash_attn: resolved flash attention (None if llama.cpp did not say).
        gpu_offload_supported: ``llama_supports_gpu_offload()``.
        devices: ggml backend devices (``"CPU"``, ``"CUDA0"`` ...).
        llama_build: the llama-cpp-python version.
        log_tail: the last llama.cpp log lines.
        recurrent: ``llama_memory_recurrent: size = ...`` records (R and S MiB as printed;
            ``layers`` is llama.cpp's ``n_layer``, not the recurrent layers).
        structure_facts: the per-layer facts the structure probe read from the log
            (:func:`kvtuner.runner.structure_probe.collect_facts`), None if none were logged.
        method: how llama.cpp was asked: :data:`METHOD_EMBEDDED` (llama-cpp-python in the
            runner child), :data:`METHOD_SERVER` (the user's llama-server, its ``--fit``
            probe's log) or :data:`METHOD_FIT_PRINT` (``llama-fit-params --fit-print on``).
        engine: the engine's label (``llama-server b11434 (CPU)``,
            :attr:`kvtuner.runner.engines.Engine.label`); "" for the embedded engine's own result.
        engine_build: llama.cpp's build number of that engine (None when unknown).
        breakdown: llama.cpp's memory breakdown rows exactly as printed (integer MiB,
            :class:`~kvtuner.runner.llama_log.MemoryBreakdownRow`); empty for the embedded
            dry run. From them: ``model_mib`` and ``kv_buffer_mib`` (the ``context`` column)
            keyed by device name, ``CPU`` for the ``Host`` row and the buffer type for other
            rows; ``compute_mib`` likewise unless the log gave the two-decimal
            ``sched_reserve`` figures.
    """

    kv_caches: tuple[KvCacheReport, ...]
    compute_mib: dict[str, float]
    output_mib: dict[str, float]
    model_mib: dict[str, float]
    kv_buffer_mib: dict[str, float]
    n_ctx: int
    n_ctx_seq: int
    flash_attn: bool | None
    gpu_offload_supported: bool
    devices: tuple[str, ...]
    llama_build: str
    log_tail: tuple[str, ...]
    recurrent: tuple[RecurrentStateSize, ...] = ()
    structure_facts: dict | None = None
    method: str = METHOD_EMBEDDED
    engine: str = ""
    engine_build: int | None = None
    breakdown: tuple[MemoryBreakdownRow, ...] = ()

    @property
    def kv_mib(self) -> float:
        """Sum of all KV caches in MiB (as printed)."""
        return round(sum(c.size_mib for c in self.kv_caches), 2)

    @property
    def recurrent_mib(self) -> float:
        """Recurrent/conv state in MiB (R + S + P as printed), 0 without one."""
        return round(sum(r.r_mib + r.s_mib + r.p_mib for r in self.recurrent), 2)

    def structure(self, base: ModelStructure) -> ModelStructure | None:
        """The model's structure as this llama.cpp built it (``source="probe"``), from the
        facts of this dry run and ``base`` (the header's analytic structure); None when the
        log had no facts or they do not fit the model."""
        if not self.structure_facts:
            return None
        try:
            return structure_from_facts(
                self.structure_facts, base, recurrent=self.recurrent, llama_build=self.llama_build
            )
        except (ValueError, KeyError, TypeError):
            return None


class DryRunError(RunnerError):
    """The dry run failed. ``kind``: ``invalid_config`` (llama.cpp refused the context, with
    its reason), ``model_error`` (missing/unreadable/unloadable model), ``out_of_memory``,
    ``crashed`` (the child aborted; ``log_tail`` has its last lines) or ``timeout``."""


def dry_run(model_path: str | os.PathLike, config: PlanConfig, *, timeout_s: float = 120.0) -> DryRunResult:
    """Run llama.cpp's no-alloc load for ``config`` in a child process and parse its report.

    ``timeout_s`` bounds everything (start, load, context); the child is killed after it.

    Raises:
        DryRunError: see its ``kind``.
    """
    path = os.fspath(model_path)
    problem = P.model_file_problem(path)
    if problem:
        raise DryRunError("model_error", problem)
    client = RunnerClient()
    try:
        try:
            deadline = time.monotonic() + timeout_s
            client.start(timeout_s=timeout_s)
            ev = client.request(
                P.DryRunCommand(model_path=os.path.abspath(path), config=config.to_dict()),
                P.DryRunResultEvent,
                timeout_s=max(deadline - time.monotonic(), 0.1),
            )
        except RunnerError as exc:
            raise DryRunError(exc.kind, exc.message, exc.log_tail) from None
    finally:
        client.close(timeout_s=5.0)
    assert isinstance(ev, P.DryRunResultEvent)
    return DryRunResult(
        kv_caches=tuple(KvCacheReport(**c) for c in ev.kv_caches),
        compute_mib=dict(ev.compute_mib),
        output_mib=dict(ev.output_mib),
        model_mib=dict(ev.model_mib),
        kv_buffer_mib=dict(ev.kv_buffer_mib),
        n_ctx=ev.n_ctx,
        n_ctx_seq=ev.n_ctx_seq,
        flash_attn=ev.flash_attn,
        gpu_offload_supported=ev.gpu_offload_supported,
        devices=tuple(ev.devices),
        llama_build=ev.llama_build,
        log_tail=tuple(ev.log_tail),
        recurrent=tuple(RecurrentStateSize(**r) for r in ev.recurrent),
        structure_facts=dict(ev.structure_facts) if ev.structure_facts else None,
    )


#: The configuration a structure probe loads: the smallest context, one sequence; the structure
#: llama.cpp builds does not depend on it.
PROBE_CONFIG = PlanConfig(n_ctx=CTX_PAD_CELLS, n_ubatch=256, n_batch=256, flash_attn="auto")


def probe_structure(model_path: str | os.PathLike, base: ModelStructure, *, timeout_s: float = 120.0) -> ModelStructure:
    """The model's per-layer memory structure as the installed llama.cpp builds it: a dry run
    of :data:`PROBE_CONFIG` whose per-layer log lines the structure probe reads
    (:mod:`kvtuner.runner.structure_probe`); ``base`` is the header's analytic structure.

    Raises:
        DryRunError: the dry run failed, or its log described no structure.
    """
    result = dry_run(model_path, PROBE_CONFIG, timeout_s=timeout_s)
    probed = result.structure(base)
    if probed is None:
        raise DryRunError("crashed", "llama.cpp's log described no per-layer structure for this model", result.log_tail)
    return probed
