"""The GUI's single doorway to core pieces that other issues deliver (speed model, advisor,
export). Each function returns None / an empty value while its module is absent or broken,
so the window shows an empty state instead of failing. No arithmetic here: only calls.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger("kvtuner.gui")


def speed_inputs_for(gpus: Sequence[Any], host: Any, model: Any | None, *, measure: bool) -> Any | None:
    """:func:`kvtuner.core.speed.speed_model.speed_inputs` for this hardware, calibrated for ``model``
    when :mod:`kvtuner.core.speed.calibration` has runs; None when the speed model is unavailable.
    ``measure`` runs the ~0.2 s host bandwidth probe (call it off the GUI thread)."""
    try:
        from ..core.speed import speed_model
    except ImportError:
        return None
    try:
        inputs = speed_model.speed_inputs(list(gpus), host, measure=measure)
    except Exception as exc:  # a half-built module must not take the window down
        log.warning("speed model inputs failed: %s", exc)
        return None
    if model is not None:
        try:
            from ..core.speed.calibration import calibrated_inputs

            inputs = calibrated_inputs(inputs, model)
        except Exception as exc:
            log.info("no calibration applied: %s", exc)
    return inputs


def measure_host_bandwidth() -> float | None:
    """The speed model's host memory bandwidth probe (~0.2 s; run it off the GUI thread), or None."""
    try:
        from ..core.speed.speed_model import measure_host_bandwidth as _measure
    except ImportError:
        return None
    try:
        return float(_measure())
    except Exception as exc:
        log.warning("host bandwidth probe failed: %s", exc)
        return None


def predict_speed(plan: Any, inputs: Any | None) -> Any | None:
    """:class:`~kvtuner.core.speed.speed_model.SpeedPrediction` for ``plan`` or None."""
    if inputs is None:
        return None
    try:
        from ..core.speed.speed_model import predict_speed as _predict
    except ImportError:
        return None
    try:
        return _predict(plan, inputs)
    except Exception as exc:
        log.warning("speed prediction failed: %s", exc)
        return None


def speed_band(tok_s: float | None) -> str | None:
    """The seed's badge (abandon / offline / interactive / fluent) for a decode speed, or None."""
    if tok_s is None:
        return None
    try:
        from ..core.speed.speed_model import speed_band as _band
    except ImportError:
        return None
    try:
        return _band(tok_s)
    except Exception:
        return None


def advisor_available() -> bool:
    """Whether :mod:`kvtuner.core.advice.advisor` is installed."""
    try:
        from ..core import advisor  # noqa: F401
    except ImportError:
        return False
    return hasattr(advisor, "advise")


def advise(plan: Any, speed: Any | None, live: Any | None = None) -> list[Any] | None:
    """:func:`kvtuner.core.advice.advisor.advise` or None when the advisor is not there yet."""
    try:
        from ..core.advice.advisor import advise as _advise
    except ImportError:
        return None
    try:
        return list(_advise(plan, speed, live=live) if live is not None else _advise(plan, speed))
    except Exception as exc:
        log.warning("advisor failed: %s", exc)
        return None


def should_auto_stop(live: Any | None, enabled: bool) -> bool:
    """:func:`kvtuner.core.advice.advisor.should_auto_stop` with the user's auto-stop choice; False
    when the advisor is not there."""
    if live is None or not enabled:
        return False
    try:
        from ..core.advice.advisor import AdvisorSettings, should_auto_stop as _should
    except ImportError:
        return False
    try:
        return bool(_should(live, AdvisorSettings(auto_stop_below_abandon=True)))
    except Exception as exc:
        log.warning("auto-stop check failed: %s", exc)
        return False


def record_calibration(plan: Any, *, gpus: Sequence[Any], host: Any, n_threads: int, n_depth: int, n_prompt: int,
                       n_gen: int, prefill_tok_s: float | None, decode_tok_s: float | None) -> str:
    """Record a finished run with :func:`kvtuner.core.speed.calibration.record_bench` (slow: file I/O,
    call it off the GUI thread); returns a one-line note. Raises ``CalibrationError``."""
    from ..core.speed.calibration import CalibrationStore, record_bench

    store = CalibrationStore()
    run = record_bench(plan, gpus=list(gpus), host=host, n_threads=n_threads, n_depth=n_depth, n_prompt=n_prompt,
                       n_gen=n_gen, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s, store=store)
    n = sum(1 for r in store.runs(run.machine) if r.family == run.family)
    return f"run recorded for speed calibration ({n} run{'s' if n != 1 else ''} of {run.family} on this machine)"


def export_targets() -> tuple[str, ...]:
    """Targets of :func:`kvtuner.core.export.export`, empty when export is unavailable."""
    try:
        from ..core.export import TARGETS, export  # noqa: F401
    except ImportError:
        return ()
    return tuple(TARGETS)


def export(target: str, model_path: Path, config: Any, *, model: Any = None,
           measured: dict[str, object] | None = None, machine: Any = None) -> Any:
    """:func:`kvtuner.core.export.export` (raises its ``ExportError``). ``machine``: this
    machine's fingerprint for the profile target (None: detect it)."""
    from ..core.export import export as _export

    return _export(target, model_path, config, model=model, measured=measured, machine=machine)


def write_export(path: str, text: str, *, force: bool) -> Path:
    """:func:`kvtuner.core.export.write_text_atomic` (raises ``ExportError`` / ``FileExistsError``)."""
    from ..core.export import write_text_atomic

    return write_text_atomic(path, text, force=force)


def is_profile_path(path: str | Path) -> bool:
    """Whether File > Open should treat ``path`` as a kvtuner profile (a ``.json`` file)."""
    return Path(path).suffix.lower() == ".json"


def load_profile(path: str | Path) -> tuple[Path, Any, tuple[str, ...]]:
    """:func:`kvtuner.core.export.load_profile`: ``(model_path, PlanConfig, warnings)``.
    Reads files (call it off the GUI thread). Raises ``ProfileError`` (one line)."""
    from ..core.export import load_profile as _load

    model_path, config, warnings = _load(path)
    return Path(model_path), config, tuple(warnings)


def machine_fingerprint(gpus: Sequence[Any]) -> Any | None:
    """This machine's :class:`~kvtuner.core.export.MachineFingerprint` from GPUs already
    detected (no driver call; fast enough for the GUI thread), or None when export is absent."""
    try:
        from ..core.export import MachineFingerprint
    except ImportError:
        return None
    return MachineFingerprint.current(gpus=list(gpus))


def measured_figures(bench_result: Any) -> dict[str, float | int]:
    """The library's measured figures of a completed bench (:func:`kvtuner.runner.bench.measured_figures`)."""
    from ..runner.bench import measured_figures as _figures

    return _figures(bench_result)


def library_available() -> bool:
    """Whether :mod:`kvtuner.core.store.library` is installed."""
    try:
        from ..core import library  # noqa: F401
    except ImportError:
        return False
    return True


def library_autosave_allowed() -> bool:
    """False when the environment opts out (``KVTUNER_LIBRARY=off``) or the library is absent."""
    try:
        from ..core.store.library import autosave_enabled
    except ImportError:
        return False
    return autosave_enabled()


def library_record(model: Any, config: Any, measured: dict[str, object], *, model_path: Path, machine: Any,
                   enabled: bool) -> int | None:
    """Save a completed run (:func:`kvtuner.core.store.library.record_completed_run`); returns its id,
    or None when the user opted out. Opens its own database connection: call it on the worker
    thread that uses it. Raises ``LibraryError`` / ``ValueError``."""
    from ..core.store.library import record_completed_run

    return record_completed_run(model, config, measured, model_path=model_path, enabled=enabled, machine=machine)


def library_known_good(model: Any, machine: Any, limit: int = 50) -> list[Any]:
    """Saved runs of ``model`` (a ModelProfile) on ``machine``, best first
    (:meth:`kvtuner.core.store.library.ConfigLibrary.known_good`). Opens and closes its own
    connection (call it on a worker thread). Raises ``LibraryError``."""
    from ..core.export import ModelIdentity
    from ..core.store.library import ConfigLibrary

    identity = model if isinstance(model, ModelIdentity) else ModelIdentity.from_profile(model)
    with ConfigLibrary() as lib:
        return lib.known_good(identity, machine, limit=limit)


def library_delete(run_id: int) -> bool:
    """Remove one saved run (own connection; call it on a worker thread)."""
    from ..core.store.library import ConfigLibrary

    with ConfigLibrary() as lib:
        return lib.delete(run_id)


def fmt_bytes(n: Any) -> str:
    """:func:`kvtuner.core.units.fmt_bytes` ("-" for None)."""
    from ..core.units import fmt_bytes as _fmt

    return _fmt(n)
