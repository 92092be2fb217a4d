"""The tuner room: the fastest configuration that fits a goal (:mod:`.search`)."""

from .search import (DEFAULT_KV_QUALITY, INT_KNOBS, KneeCurve, knee_curves, KV_QUALITY_ORDER, RAM_HEADROOM_FRACTION, VRAM_MARGIN_BYTES, Candidate,
                     KV_QUALITY_NOTES,
                     IntKnob, TuneError, TuneGoal, TuneResult, fit_equivalent, kv_type_pairs, offload_note, tune)

__all__ = [
    "Candidate", "DEFAULT_KV_QUALITY", "INT_KNOBS", "KneeCurve", "knee_curves", "IntKnob", "KV_QUALITY_ORDER", "RAM_HEADROOM_FRACTION", "TuneError",
    "KV_QUALITY_NOTES",
    "TuneGoal", "TuneResult", "VRAM_MARGIN_BYTES", "fit_equivalent", "kv_type_pairs", "offload_note", "tune",
]
