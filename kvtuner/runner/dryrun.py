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

from ..core.llama_report import DryRunResult
from ..core.model.probed_structure import report_structure
from ..core.model.structure import ModelStructure
from ..core.plan.config import PlanConfig
from ..core.plan.llama_constants import CTX_PAD_CELLS
from . import protocol as P
from .client import RunnerClient, RunnerError


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
    return ev.result


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
    probed = report_structure(result, base)
    if probed is None:
        raise DryRunError("crashed", "llama.cpp's log described no per-layer structure for this model", result.log_tail)
    return probed
