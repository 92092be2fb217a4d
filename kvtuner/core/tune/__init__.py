"""The tuner room: the fastest configuration that fits a goal (:mod:`.search`)."""

from .search import (
    DEFAULT_KV_QUALITY,
    INT_KNOBS,
    KV_QUALITY_NOTES,
    KV_QUALITY_ORDER,
    RAM_HEADROOM_FRACTION,
    VRAM_MARGIN_BYTES,
    Candidate,
    IntKnob,
    KneeCurve,
    TuneError,
    TuneGoal,
    TuneResult,
    fit_equivalent,
    knee_curves,
    kv_type_pairs,
    offload_note,
    tune,
)
from .trade import QualityLevel, quality_trade

__all__ = [
    "DEFAULT_KV_QUALITY",
    "INT_KNOBS",
    "KV_QUALITY_NOTES",
    "KV_QUALITY_ORDER",
    "RAM_HEADROOM_FRACTION",
    "VRAM_MARGIN_BYTES",
    "Candidate",
    "IntKnob",
    "KneeCurve",
    "QualityLevel",
    "TuneError",
    "TuneGoal",
    "TuneResult",
    "fit_equivalent",
    "knee_curves",
    "kv_type_pairs",
    "offload_note",
    "quality_trade",
    "tune",
]
