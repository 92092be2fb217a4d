"""One run becomes one measurement: :class:`RunRecorder` is fed what the runner reports while a
bench runs (the llama.cpp build and its GPU offload, the context, the load, the repetitions) and
measures the other load meanwhile (:class:`~kvtuner.core.monitor.contention.ContentionMeter`);
:meth:`RunRecorder.finish` returns the :class:`~kvtuner.core.speed.measurement.Measurement` with
what it may be used for (:class:`~kvtuner.core.speed.measurement.Keep`, :func:`keep_of`).

``kvtuner bench``, a tune's confirming loads and the window's Run all measure through it
(:func:`kvtuner.runner.bench.record_event` turns the runner's protocol events into its calls),
so a figure calibrates and enters the library under one rule wherever it was measured.
Headless: no Qt, no runner imports.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..speed.measurement import Keep, Measurement, Repetition
from .contention import Contention, ContentionMeter, quiet_limit

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.config import PlanConfig


def keep_of(
    contention: Contention, *, completed: bool, measured: bool, record_anyway: bool = False, what: str = "this run"
) -> Keep:
    """What a run may be used for, in this order:

    - a run that did not complete: nothing;
    - a run on a busy machine (:meth:`Contention.counts`: more than the quiet limit of other
      load, unless ``record_anyway``): nothing, it measured the other load;
    - a run that measured no rate: the library (its load and memory figures), not calibration;
    - else both.

    ``what`` names the run in the reason ("this bench", "this real load").
    """
    if not completed:
        return Keep(False, False, f"{what} did not complete")
    if not contention.counts(record_anyway):
        return Keep(False, False, contention.reason(what))
    if not measured:
        return Keep(False, True, f"{what} measured no prefill or decode rate: nothing to calibrate")
    return Keep()


class RunRecorder:
    """Folds one bench into a :class:`Measurement`.

    Call :meth:`start` when the run starts (the other load is measured from then), feed it
    what the runner reports (:meth:`started`, :meth:`context`, :meth:`loaded`,
    :meth:`bench_result`), then :meth:`finish` once the runner's process is gone (its CPU time
    is then this process's own, :func:`os.times`).

    Args:
        n_depth, n_prompt, n_gen: the bench asked for (tokens).
        model_path, config, engine: what runs it (recorded as they are).
        record_anyway: keep a run on a busy machine (the user's ``--record-anyway``).
        limit: cores of other load a run may meet (default :func:`quiet_limit`).
        what: the run's name in the reasons ("this bench").
    """

    def __init__(
        self,
        *,
        n_prompt: int,
        n_gen: int,
        n_depth: int = 0,
        model_path: str = "",
        config: PlanConfig | None = None,
        engine: str = "",
        record_anyway: bool = False,
        limit: float | None = None,
        what: str = "this run",
    ) -> None:
        self.record_anyway, self.what = record_anyway, what
        self.meter = ContentionMeter(quiet_limit() if limit is None else float(limit))
        #: the other load :meth:`finish` measured (None before)
        self.contention: Contention | None = None
        #: what the runner reported so far (rates and the decision come with :meth:`finish`)
        self.facts = Measurement(
            int(n_depth),
            int(n_prompt),
            int(n_gen),
            0,
            None,
            None,
            model_path=str(model_path),
            config=config,
            engine=engine,
        )
        self.reps: tuple[Repetition, ...] = ()

    def start(self) -> RunRecorder:
        """The run starts now: measure the other load from here; returns self."""
        self.meter.start()
        return self

    def started(self, *, gpu_offload: bool, llama_build: str) -> None:
        """The runner is up: whether its llama.cpp can offload to a GPU, and its build."""
        self.facts = replace(self.facts, gpu_offload=bool(gpu_offload), llama_build=str(llama_build))

    def context(self, *, n_ctx: int, n_ubatch: int) -> None:
        """llama.cpp created the context: its size and micro-batch (tokens)."""
        self.facts = replace(self.facts, n_ctx=int(n_ctx), n_ubatch=int(n_ubatch))

    def loaded(self, *, load_s: float, n_threads: int) -> None:
        """The model is loaded: model load + context creation in seconds, the CPU threads."""
        self.facts = replace(self.facts, load_s=float(load_s), n_threads=int(n_threads))

    def bench_result(self, reps: Sequence[Repetition], *, n_threads: int) -> None:
        """The bench's repetitions and the threads it ran on."""
        self.reps = tuple(reps)
        self.facts = replace(self.facts, n_threads=int(n_threads))

    def finish(self, *, completed: bool = True) -> Measurement:
        """The measurement: medians over the repetitions, the other load since :meth:`start`
        and what it may be used for (:func:`keep_of`); ``completed``: the bench ran to its
        result (it did not fail or get stopped)."""
        contention = self.contention = self.meter.stop()
        prefill = [r.prefill_tok_s for r in self.reps if r.prefill_tok_s is not None]
        decode = [r.decode_tok_s for r in self.reps if r.decode_tok_s is not None]
        completed = completed and bool(self.reps)
        keep = keep_of(
            contention,
            completed=completed,
            measured=bool(prefill or decode),
            record_anyway=self.record_anyway,
            what=self.what,
        )
        return replace(
            self.facts,
            prefill_tok_s=statistics.median(prefill) if prefill else None,
            decode_tok_s=statistics.median(decode) if decode else None,
            n_prefill_samples=len(prefill),
            n_decode_samples=len(decode),
            completed=completed,
            other_cores=contention.other_cores,
            quiet_limit_cores=contention.limit,
            busy=contention.busy,
            keep=keep,
        )


__all__ = ["RunRecorder", "keep_of"]
