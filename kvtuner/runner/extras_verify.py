"""The draft model's memory as llama-server measures it before loading any weight.

With ``-md`` and ``--fit on``, llama-server's fit step (common/fit.cpp ``common_params_fit_impl``
``add_extra_memory``) logs "getting device memory data for the extra model at a context size of
N", builds the draft's no-alloc model and context (the library's ``llama_kv_cache: size = ...``
and ``sched_reserve: ... compute buffer size`` lines at ``-lv 5``) and prints a second
``common_memory_breakdown_print`` table: the draft's model / context / compute per device.
:func:`verify_draft` starts the exported command line with the draft flags and reads that
section; the process group is stopped as soon as the second table is complete.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from ..core.llama_report import METHOD_SERVER, DryRunResult
from ..core.plan.config import PlanConfig
from . import llama_log as L
from .dryrun import DryRunError
from .engines import Engine
from .server_verify import _raise_refusal, _result, _run_until_breakdown, server_argv

#: What common/fit.cpp logs before it measures the draft (or MTP) context.
EXTRA_MODEL_MARK = "getting device memory data for the extra model"


def extras_argv(extras: Any, known_flags: Any = None) -> list[str]:
    """The llama-server flags of an :class:`~kvtuner.core.plan.extras.ExtrasConfig`
    (:func:`kvtuner.core.plan.extras.server_flags`)."""
    from ..core.plan.extras import server_flags

    return server_flags(extras, known_flags)


def verify_draft(
    engine: Engine,
    model_path: str | os.PathLike,
    config: PlanConfig,
    extras: Any,
    *,
    timeout_s: float = 60.0,
    split: Any = None,
    rpc: Sequence[str] = (),
) -> DryRunResult:
    """llama-server's figures for the draft model of ``extras`` next to ``model_path``.

    Returns:
        A :class:`DryRunResult` of the draft's section: its KV caches and compute/output
        buffers from the library's lines, model/context per device from the second table.

    Raises:
        DryRunError: ``invalid_config`` (llama-server refused the flags or a file), ``crashed``
            (no second table: a build without the draft's fit step), ``timeout``.
    """
    if engine.kind != "server" or engine.server is None:
        raise DryRunError("invalid_config", "the draft's figures come from llama-server: choose --engine server")
    argv = server_argv(engine, os.fspath(model_path), config, split=split, rpc=rpc)
    at = argv.index("-lv")
    argv[at:at] = extras_argv(extras, engine.flags or None)
    lines, _finished = _run_until_breakdown(argv, time.monotonic() + timeout_s, tables=2)
    start = next((i for i, line in enumerate(lines) if EXTRA_MODEL_MARK in line), None)
    rows = L.parse_breakdown(lines[start:]) if start is not None else ()
    if not rows:
        _raise_refusal(lines)
        raise DryRunError(
            "crashed",
            f"{engine.server} printed no memory breakdown for the draft model (a build before the draft's fit step?)",
            tuple(lines[-60:]),
        )
    return _result(engine, lines[start:], rows, METHOD_SERVER + " (draft model's table)")


def draft_exact_figures(result: DryRunResult) -> Any:
    """The draft's :class:`~kvtuner.core.plan.memory_plan.ExactFigures` from :func:`verify_draft`."""
    from ..core.session import exact_figures

    return exact_figures(result, device_figures=True)
