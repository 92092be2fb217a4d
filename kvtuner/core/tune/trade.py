"""The trade across KV cache quality levels for one tuning goal: the best configuration and its
speed when the worst KV type allowed is f16, q8_0 or q4_0, with what each level costs in quality
(:data:`~kvtuner.core.tune.search.KV_QUALITY_NOTES`, each with its source). ``kvtuner tune``
(``quality:`` lines, ``quality_trade`` in ``--json``) and the Tune dialog show it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..plan.config import PlanConfig
from .search import KV_QUALITY_NOTES, KV_QUALITY_ORDER, TuneError, TuneGoal, TuneResult


@dataclass(frozen=True)
class QualityLevel:
    """The tuner's best at one KV quality floor.

    Attributes:
        kv_quality: the worst KV type allowed (``f16``, ``q8_0``, ``q4_0``).
        config: the best configuration that fits, None when nothing fits at this level.
        decode_tok_s_at_full_ctx: its predicted decode at the full context (tok/s), None likewise.
        prefill_tok_s: its predicted prefill (tok/s), None when unknown.
        chosen: this is the goal's own level.
        note: what the level costs in quality, with its source.
    """

    kv_quality: str
    config: PlanConfig | None
    decode_tok_s_at_full_ctx: float | None
    prefill_tok_s: float | None
    chosen: bool
    note: str

    @property
    def fits(self) -> bool:
        """Something fits at this level."""
        return self.config is not None

    def to_dict(self) -> dict[str, Any]:
        """``{kv_quality, config, decode_tok_s_at_full_ctx, prefill_tok_s, fits, chosen, note}``."""
        return {
            "kv_quality": self.kv_quality,
            "config": self.config.to_dict() if self.config is not None else None,
            "decode_tok_s_at_full_ctx": self.decode_tok_s_at_full_ctx,
            "prefill_tok_s": self.prefill_tok_s,
            "fits": self.fits,
            "chosen": self.chosen,
            "note": self.note,
        }


def quality_trade(
    goal: TuneGoal, result: TuneResult | None, tune_at: Callable[[TuneGoal], TuneResult]
) -> tuple[QualityLevel, ...]:
    """For each KV quality level (:data:`~kvtuner.core.tune.search.KV_QUALITY_ORDER`), the tuner's
    best for ``goal`` with that level as the floor: ``result`` for the goal's own level,
    ``tune_at(goal with another kv_quality)`` for the others (a goal the tuner refuses at a level
    counts as nothing fitting there)."""
    out = []
    for q in KV_QUALITY_ORDER:
        r: TuneResult | None = result
        if q != goal.kv_quality:
            try:
                r = tune_at(replace(goal, kv_quality=q))
            except (TuneError, ValueError):
                r = None
        b = r.best if r is not None else None
        out.append(
            QualityLevel(
                kv_quality=q,
                config=b.config if b is not None else None,
                decode_tok_s_at_full_ctx=b.decode_tok_s if b is not None else None,
                prefill_tok_s=b.prefill_tok_s if b is not None else None,
                chosen=q == goal.kv_quality,
                note=KV_QUALITY_NOTES[q],
            )
        )
    return tuple(out)
