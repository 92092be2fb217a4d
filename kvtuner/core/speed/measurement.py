"""What a bench measured, typed once: the runner reports :class:`Repetition` records, a
:class:`kvtuner.core.monitor.measurement.RunRecorder` folds one run into a :class:`Measurement`,
and calibration (:func:`kvtuner.core.speed.calibration.record_bench`), the session
(:meth:`kvtuner.core.session.Session.record_run`) and a tune's confirming loads take it whole.

The bench is llama-bench's (tools/llama-bench/llama-bench.cpp: ``-d`` depth, ``-p`` prompt,
``-n`` generated tokens, ``-r`` repetitions), with prefill and decode in one run per repetition
(:mod:`kvtuner.runner.bench`). Rates are tokens per second; a rate is None when nothing was
measured (no tokens, or no time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.config import PlanConfig


@dataclass(frozen=True)
class Repetition:
    """One bench repetition: ``n_prompt`` tokens prefilled at depth ``n_depth`` in ``prefill_s``
    seconds, ``n_gen`` decoded in ``decode_s``; ``ttft_s`` time to first token (prefill plus
    picking the first token). Rates in tokens/s are None when nothing was measured."""

    rep: int
    n_depth: int
    n_prompt: int
    prefill_s: float
    n_gen: int
    decode_s: float
    ttft_s: float

    @property
    def prefill_tok_s(self) -> float | None:
        """Prefill tokens/s (None without a prompt or a time)."""
        return self.n_prompt / self.prefill_s if self.n_prompt and self.prefill_s > 0 else None

    @property
    def decode_tok_s(self) -> float | None:
        """Decode tokens/s (None without generated tokens or a time)."""
        return self.n_gen / self.decode_s if self.n_gen and self.decode_s > 0 else None

    @classmethod
    def of(cls, value: Repetition | dict[str, Any]) -> Repetition:
        """From a decoded JSON object (unknown keys are ignored).

        Raises:
            ValueError: not an object, or a field is missing (says which).
        """
        if isinstance(value, Repetition):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"a repetition must be an object, not {type(value).__name__}")
        try:
            return cls(**{f.name: value[f.name] for f in dataclasses.fields(cls)})
        except KeyError as exc:
            raise ValueError(f"a repetition lacks '{exc.args[0]}'") from None


@dataclass(frozen=True)
class Keep:
    """What a measurement may be used for: ``calibrate`` (the speed model's calibration),
    ``library`` (the working-configs library: Known good, the profile export) and, when either
    is False, ``reason``: one line saying why (decided by
    :meth:`kvtuner.core.monitor.measurement.RunRecorder.finish`)."""

    calibrate: bool = True
    library: bool = True
    reason: str = ""


@dataclass(frozen=True)
class Measurement:
    """One measured bench.

    The first six fields are what calibration needs: ``n_depth`` tokens in the context before
    the prompt, ``n_prompt`` prefilled and ``n_gen`` decoded tokens per repetition (as asked),
    ``n_threads`` CPU threads, and the medians over the repetitions of ``prefill_tok_s`` and
    ``decode_tok_s`` (tokens/s; None when none measured it).

    Attributes:
        n_prefill_samples, n_decode_samples: repetitions behind each median.
        n_ctx, n_ubatch: the context and micro-batch llama.cpp created (0: not reported).
        engine: the llama.cpp that ran it (``"embedded"``, ``"server"``); llama_build: its build.
        model_path: the model file; config: the configuration it ran (None: not known).
        gpu_offload: the build could offload to a GPU (the run used this machine's GPUs).
        load_s: model load + context creation, seconds (None: not reported).
        completed: the bench ran to its result.
        other_cores: cores other processes kept busy on average during the run (None: not
            measured), against ``quiet_limit_cores``; ``busy``: more than that
            (:class:`kvtuner.core.monitor.contention.Contention`).
        keep: what it may calibrate and enter (:class:`Keep`).
    """

    n_depth: int
    n_prompt: int
    n_gen: int
    n_threads: int
    prefill_tok_s: float | None
    decode_tok_s: float | None
    _: KW_ONLY
    n_prefill_samples: int = 0
    n_decode_samples: int = 0
    n_ctx: int = 0
    n_ubatch: int = 0
    engine: str = ""
    llama_build: str = ""
    model_path: str = ""
    config: PlanConfig | None = None
    gpu_offload: bool = False
    load_s: float | None = None
    completed: bool = True
    other_cores: float | None = None
    quiet_limit_cores: float | None = None
    busy: bool = False
    keep: Keep = Keep()

    @property
    def measured(self) -> bool:
        """Whether it measured a prefill or a decode rate."""
        return self.prefill_tok_s is not None or self.decode_tok_s is not None


__all__ = ["Keep", "Measurement", "Repetition"]
