r"""Where a plan keeps its weights and KV, as a speed regime, and how far measurements in that
regime have landed from kvtuner's predictions.

The regimes are those of ``benchmarks/offload_validation.py`` (docs/accuracy/offload.md), told
apart from the plan the way llama.cpp places tensors:

- ``cpu``: no GPU in the plan;
- ``partial_ngl``: weights other than MoE experts stay in RAM: a layer (``-ngl`` below the layer
  count + 1 leaves the first layers there: llama-model.cpp ``load_tensors``, ``i_gpu_start``), the
  output layer, or tensors an override sends there (``--n-cpu-ffn``, ``-ot ffn=CPU``,
  ``-ot attn=CPU``, shared experts) that weigh :data:`DENSE_IN_RAM_SHARE` of the weights or more
  (an ``-ot "blk\.[0-9]\.ffn_.*=CPU"`` meant for experts also moves routers and norms: megabytes);
- ``experts_cpu``: only MoE expert tensors are kept in RAM (``--n-cpu-moe``, ``--cpu-moe``,
  ``-ot exps=CPU``: ``tensor_buft_overrides``);
- ``kv_ram``: weights offloaded, some layers' KV in RAM (``-nkvo``: ``offload_kqv = false``, or
  kvtuner's KV split);
- ``full``: weights and KV on the GPUs (RPC servers' devices count as GPUs; no validation row
  covers them).

A plan on a unified-memory GPU (Apple silicon, an AMD APU) has a regime too, but no public range:
every row behind the ranges ran on a discrete card over PCIe.

A plan in more than one of these (layers and experts in RAM) is the first of the list above that
applies: weights in RAM dominate its speed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..plan.overrides import is_expert

if TYPE_CHECKING:
    from ..plan.memory_plan import MemoryPlan

REGIMES = ("cpu", "full", "partial_ngl", "experts_cpu", "kv_ram")
#: The regimes with weights or KV in RAM beside a GPU.
OFFLOAD_REGIMES = ("partial_ngl", "experts_cpu", "kv_ram")

#: Per offload regime, ``{phase: (low, high)}``: ``ln(measured / predicted)`` at the 15.87th and
#: 84.13th percentiles (about the central two thirds, a normal error's +/- 1 sigma) over the public
#: validation rows of ``benchmarks/offload_validation.py`` grouped by :func:`placement_regime`
#: (``python benchmarks/offload_validation.py --sets validate`` prints them). Signed percentiles,
#: as kvtuner's errors there lean one way (most rows are over-predicted). A regime and phase with
#: under :data:`RANGE_MIN_ROWS` rows (``kv_ram``: 3) has none: the validation spread applies.
REGIME_RANGE_LOG: dict[str, dict[str, tuple[float, float]]] = {
    "partial_ngl": {"decode": (-0.464, 0.057), "prefill": (-1.007, 0.583)},
    "experts_cpu": {"decode": (-0.703, 0.123), "prefill": (-0.552, 0.222)},
}
#: Fewer validation rows than this in a regime and phase: no range of its own (the minimum the
#: validation table of offload_validation.py judges a regime on, ``BAR_MIN_ROWS``).
RANGE_MIN_ROWS = 5
#: Non-expert weights in RAM, as a share of all weights, from which a plan is ``partial_ngl``.
DENSE_IN_RAM_SHARE = 0.01
#: The percentiles of :data:`REGIME_RANGE_LOG`: a normal distribution's -1 and +1 sigma.
RANGE_PERCENTILES = (0.1587, 0.8413)
#: A regime in words, for "public runs with ... measured".
REGIME_WORDS = {
    "cpu": "no GPU",
    "full": "everything on the GPU",
    "partial_ngl": "layers or other non-expert weights in RAM",
    "experts_cpu": "MoE experts in RAM",
    "kv_ram": "the KV cache in RAM",
}


def placement_regime(plan: MemoryPlan) -> str:
    """The speed regime of ``plan``: one of :data:`REGIMES` (see the module docstring)."""
    if not plan.gpus:
        return "cpu"
    host = plan.host.device
    dense_moved = sum(b for name, _, to, b in plan.moves.moved if to == host and not is_expert(name))
    if host in plan.layer_devices or dense_moved >= DENSE_IN_RAM_SHARE * max(1, plan.weights_bytes):
        return "partial_ngl"
    if plan.moves.expert_bytes.get(host, 0) > 0:
        return "experts_cpu"
    if any(kv.device == host for kv in plan.kv_layers):
        return "kv_ram"
    return "full"


def percentile_range(errors_log: list[float]) -> tuple[float, float]:
    """``(low, high)``: the :data:`RANGE_PERCENTILES` of ``errors_log`` (nearest rank: the
    ``ceil(p * n)``-th smallest).

    Raises:
        ValueError: no errors.
    """
    if not errors_log:
        raise ValueError("no errors to take a range from")
    ordered = sorted(errors_log)
    lo, hi = (ordered[max(0, math.ceil(p * len(ordered)) - 1)] for p in RANGE_PERCENTILES)
    return lo, hi


def regime_range(regime: str, phase: str) -> tuple[float, float] | None:
    """``(low, high)`` factors on a ``phase`` (``"decode"`` / ``"prefill"``) prediction that about
    two thirds of the public runs of ``regime`` measured within; None where there is no such range
    (:data:`REGIME_RANGE_LOG`)."""
    r = REGIME_RANGE_LOG.get(regime, {}).get(phase)
    if r is None:
        return None
    return math.exp(r[0]), math.exp(r[1])


def range_note(regime: str, phases: tuple[str, ...] = ("decode", "prefill")) -> str | None:
    """One line saying where the public likely ranges of ``regime`` for ``phases`` come from, None
    where it has none."""
    parts = []
    for phase in phases:
        r = regime_range(regime, phase)
        if r is not None:
            parts.append(f"{r[0]:.2f}-{r[1]:.2f}x kvtuner's {phase} prediction")
    if not parts:
        return None
    return (
        f"likely ranges: about two thirds of the public runs with {REGIME_WORDS[regime]} measured "
        f"{' and '.join(parts)} (docs/accuracy/offload.md)"
    )


__all__ = [
    "DENSE_IN_RAM_SHARE",
    "OFFLOAD_REGIMES",
    "RANGE_MIN_ROWS",
    "RANGE_PERCENTILES",
    "REGIMES",
    "REGIME_RANGE_LOG",
    "REGIME_WORDS",
    "percentile_range",
    "placement_regime",
    "range_note",
    "regime_range",
]
