"""Run an engine's ``llama-fit-params`` and read the choice llama.cpp's ``--fit`` makes.

``llama-fit-params -m MODEL --fit on ...`` loads the model without allocating
(common/fit.cpp ``common_get_device_memory_data``), runs ``common_fit_params`` on this machine's
devices and prints ``-c N -ngl N [-ts ...] [-ot "..."]`` on stdout (tools/fit-params/fit-params.cpp);
it exits 1 when ``--fit`` gives up. The arguments come from
:func:`kvtuner.core.tune.fit_choice.fit_params_args`; the result is a
:class:`~kvtuner.core.tune.fit_choice.FitChoice` with method ``llama-fit-params``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.tune.fit_choice import METHOD_BINARY, FitChoice, FitChoiceError, FitRequest, fit_params_args, parse_fit_line
from . import procs

if TYPE_CHECKING:  # pragma: no cover
    from ..core.plan.config import PlanConfig
    from .engines import Engine

#: Seconds llama-fit-params may take (it loads the model's metadata and plans several layouts).
FIT_TIMEOUT_S = 120.0


class FitParamsError(RuntimeError):
    """llama-fit-params could not give a choice: missing, failed, timed out, or ``--fit`` gave up
    (the message is one line, with the binary's own last error line)."""


def _last_error(text: str) -> str:
    for line in reversed(text.splitlines()):
        s = line.strip()
        if s and ("fail" in s or "error" in s.lower() or "abort" in s or "unable" in s):
            return s
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def run_fit_params(
    engine: Engine,
    model_path: str | os.PathLike[str],
    base: PlanConfig,
    request: FitRequest | None = None,
    *,
    n_threads: int = 1,
    timeout_s: float = FIT_TIMEOUT_S,
) -> FitChoice:
    """``--fit``'s choice for ``base`` and ``request`` from ``engine``'s llama-fit-params.

    Args:
        engine: a server engine with ``fit_params`` (:class:`~kvtuner.runner.engines.Engine`).
        model_path: the GGUF file.
        base: the configuration whose KV types, flash attention, sequences and batches are kept.
        request: context and margin (None: llama.cpp's defaults, :class:`FitRequest`).
        n_threads: ``-t`` (the fit loads no weights; threads only matter to start-up).
        timeout_s: wall-clock limit; the process group is killed past it.

    Raises:
        FitParamsError: no llama-fit-params beside the engine, it failed, printed no choice, or
            took longer than ``timeout_s``.
    """
    binary = getattr(engine, "fit_params", None)
    if binary is None:
        raise FitParamsError(f"{engine.label} has no llama-fit-params beside it")
    args, notes = fit_params_args(str(Path(model_path).expanduser().absolute()), base, request or FitRequest())
    argv = [str(binary), *args, "-t", str(max(1, n_threads))]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            **procs.group_popen_kwargs(),
        )
    except OSError as exc:
        raise FitParamsError(f"cannot start {binary}: {exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        procs.kill_tree(proc)
        proc.communicate()
        raise FitParamsError(f"llama-fit-params took longer than {timeout_s:g} s") from None
    except BaseException:
        procs.kill_tree(proc)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise FitParamsError(f"llama-fit-params (exit {proc.returncode}): {_last_error(err + out)}")
    try:
        n_ctx, ngl, ts, ot = parse_fit_line(out)
    except FitChoiceError as exc:
        raise FitParamsError(f"{exc}: {_last_error(err + out)}") from None
    return FitChoice(METHOD_BINARY, n_ctx, ngl, ts, ot, source=engine.label, note="; ".join(notes))


def fit_choice_for(
    engine: Engine | None,
    model_path: str | os.PathLike[str],
    model: Any,
    base: PlanConfig,
    gpus: Sequence[Any],
    host: Any,
    inputs: Any,
    goal: Any,
    *,
    split: Any = None,
    n_threads: int = 2,
) -> tuple[FitChoice | None, str | None]:
    """llama.cpp's ``--fit`` choice beside a tune, with kvtuner's prediction of it.

    The engine's llama-fit-params answers for this machine's own devices; a what-if card (which
    llama.cpp cannot see), an engine without llama-fit-params, or a llama-fit-params that fails
    to run get kvtuner's port of common/fit.cpp
    (:func:`~kvtuner.core.tune.fit_choice.port_fit_choice`), and the choice's ``note`` says so.

    Args:
        engine: the engine in use (None: the port).
        model_path, model: the GGUF file and its (planned) profile.
        base, gpus, host, split: what is planned.
        inputs: the speed model's inputs (None: no prediction).
        goal: the :class:`~kvtuner.core.tune.TuneGoal`.
        n_threads: ``-t`` of llama-fit-params.

    Returns:
        ``(choice, None)``, or ``(None, why)`` when ``--fit`` gives up (user-set layers, split or
        overrides) or nothing can be planned.
    """
    from ..core.plan.build_rules import VENDORED, rules_for
    from ..core.plan.config import ConfigError
    from ..core.plan.memory_plan import plan_memory
    from ..core.tune.fit_choice import fit_blockers, port_fit_choice, predict_choice
    from ..core.units import MiB

    # the port plans as the program that runs --fit: the engine's llama-server, or the vendored build
    rules = rules_for(engine.kind, engine.build) if engine is not None else VENDORED

    # on a CPU-only machine --fit only lowers the context: common/fit.cpp returns (or gives up)
    # before it looks at the user's -ngl / -ts / -ot
    blockers = fit_blockers(base, split) if gpus else []
    if blockers:
        return None, (
            f"--fit is off: {', '.join(blockers)} set (common/fit.cpp gives up when the user sets the "
            "layers, split or tensor overrides)"
        )
    request = FitRequest.for_goal(goal, max(0, goal.vram_margin_bytes // MiB))
    measured = None
    note = ""
    if not any(getattr(g, "what_if", False) for g in gpus):
        if engine is not None and getattr(engine, "fit_params", None) is not None:
            try:
                measured = run_fit_params(engine, model_path, base, request, n_threads=n_threads)
            except FitParamsError as exc:
                # --fit gave up (tools/fit-params: "failed to fit CLI arguments", exit 1); llama.cpp's
                # log thread may not flush that line before exit(1), leaving a silent exit 1
                # (an argument it refuses prints "error: invalid argument" instead)
                if "failed to fit" in str(exc) or str(exc).endswith("(exit 1): no output"):
                    return None, str(exc)
                note = f"llama-fit-params failed ({exc}); computed by kvtuner's port of common/fit.cpp"
        else:
            name = engine.label if engine is not None else "no engine"
            note = f"{name} has no llama-fit-params: computed by kvtuner's port of common/fit.cpp"
    try:
        choice = measured or port_fit_choice(
            model,
            base,
            gpus,
            host,
            request,
            plan=lambda c, s: plan_memory(model, c, gpus, host, split=s or split, rules=rules),
        )
        choice = predict_choice(
            choice, model, base, gpus, host, inputs, vram_margin_bytes=goal.vram_margin_bytes, rules=rules
        )
    except (FitChoiceError, ConfigError) as exc:
        return None, str(exc)
    if note:
        choice = replace(choice, note="; ".join(x for x in (choice.note, note) if x))
    return choice, None
