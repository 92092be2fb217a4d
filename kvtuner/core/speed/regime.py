"""Where a plan keeps its weights and KV, as a speed regime, and how far predictions in that
regime have been from public measurements.

The regimes are those of ``benchmarks/offload_validation.py`` (docs/accuracy/offload.md), told
apart from the plan the way llama.cpp places tensors:

- ``cpu``: no GPU in the plan;
- ``partial_ngl``: a layer's weights (a repeating layer or the output layer) stay in RAM, as with
  ``-ngl`` below the layer count (``llama_model_loader``'s per-layer buffer types);
- ``experts_cpu``: every layer is offloaded but MoE expert tensors are kept in RAM
  (``--n-cpu-moe``, ``--cpu-moe``, ``-ot exps=CPU``: ``tensor_buft_overrides``);
- ``kv_ram``: weights offloaded, some layers' KV in RAM (``-nkvo``: ``offload_kqv = false``,
  or kvtuner's KV split);
- ``full``: weights and KV on the GPUs.

A plan in more than one of these (layers and experts in RAM) is the first of the list above that
applies: layers in RAM dominate its speed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..plan.memory_plan import MemoryPlan

REGIMES = ("cpu", "full", "partial_ngl", "experts_cpu", "kv_ram")

#: Per regime, ``(decode, prefill)``: the ``ln(predicted / measured)`` that two of three
#: validation rows stay within (the 68.27th percentile of its absolute value; a normal error's
#: 1-sigma), over the public validation rows of ``benchmarks/offload_validation.py`` grouped by
#: :func:`placement_regime` (``--bands`` prints these figures; ``kv_ram``, with under
#: :data:`BAND_MIN_ROWS` rows of a phase, takes the figure of all offload rows together).
#: Percentiles rather than a root mean square, which a few rows 5-30x off would set alone.
REGIME_BAND_LOG: dict[str, tuple[float, float]] = {
    "partial_ngl": (0.307, 0.677),
    "experts_cpu": (0.516, 0.416),
    "kv_ram": (0.390, 0.429),
}
#: A regime in words, for "measurements with ... were within".
REGIME_WORDS = {
    "cpu": "no GPU",
    "full": "everything on the GPU",
    "partial_ngl": "layers in RAM",
    "experts_cpu": "MoE experts in RAM",
    "kv_ram": "the KV cache in RAM",
}
#: Fewer validation rows than this in a regime and phase: that regime uses all offload rows.
BAND_MIN_ROWS = 5
#: The share of rows a band holds: a normal distribution's within one sigma.
BAND_COVERAGE = 0.6827


def placement_regime(plan: MemoryPlan) -> str:
    """The speed regime of ``plan``: one of :data:`REGIMES` (see the module docstring)."""
    if not plan.gpus:
        return "cpu"
    host = plan.host.device
    if host in plan.layer_devices:
        return "partial_ngl"
    if plan.moves.expert_bytes.get(host, 0) > 0:
        return "experts_cpu"
    if any(kv.device == host for kv in plan.kv_layers):
        return "kv_ram"
    return "full"


def band_log(errors_log: list[float]) -> float:
    """The ``|ln(predicted / measured)|`` that :data:`BAND_COVERAGE` of ``errors_log`` stay within
    (the smallest such value of the list).

    Raises:
        ValueError: no errors.
    """
    if not errors_log:
        raise ValueError("no errors to take a band from")
    ordered = sorted(abs(e) for e in errors_log)
    return ordered[max(0, math.ceil(BAND_COVERAGE * len(ordered)) - 1)]


def band_note(regime: str) -> str | None:
    """One line saying where an offload regime's bands come from, None outside them."""
    spread = REGIME_BAND_LOG.get(regime)
    if spread is None:
        return None
    d, p = (math.exp(x) for x in spread)
    return (
        f"bands: two of three public measurements with {REGIME_WORDS[regime]} were within x{d:.2f} (decode) "
        f"and x{p:.2f} (prefill) of kvtuner's prediction (docs/accuracy/offload.md)"
    )


def regime_band_log(regime: str) -> tuple[float, float] | None:
    """``(decode, prefill)`` band of ``regime`` (:data:`REGIME_BAND_LOG`), None where the model's
    calibration spread applies (``cpu``, ``full``)."""
    return REGIME_BAND_LOG.get(regime)


__all__ = [
    "BAND_COVERAGE",
    "BAND_MIN_ROWS",
    "REGIMES",
    "REGIME_BAND_LOG",
    "REGIME_WORDS",
    "band_log",
    "band_note",
    "placement_regime",
    "regime_band_log",
]
