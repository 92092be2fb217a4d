"""Advisor: rules that flag out-of-memory, fragmentation, swap and too-slow configurations,
each with a one-click fix (PlanConfig field changes).

:func:`advise` takes a :class:`MemoryPlan`, optionally its :class:`SpeedPrediction` and a
:class:`LiveState` (latest samples of a running model) and returns :class:`Advice` records,
errors first. Thresholds come from :class:`AdvisorSettings` (each default explained there,
see ``shared/reference/llama-cpp-memory.md`` section 6).

Rule ids (stable, the GUI keys on them): ``vram-oom``, ``ram-oom``, ``fragmentation-risk``,
``swap-risk``, ``vram-tight``, ``below-abandon-threshold``, ``v-cache-needs-flash-attn``, ``kv-type-slow-path``,
``ctx-exceeds-train``, ``first-layer-on-host``, ``mha-long-context``, ``parallel-multiplies-kv``,
``kv-quant-quality``, ``kv-type-not-applied``, ``other-processes-hold-vram``, ``offload-knee``,
``fit-off``, ``mmap-host-weights``.

A fix is applied with ``dataclasses.replace(plan.config, **advice.fix)``; every fix offered
here is checked to build a valid :class:`PlanConfig`. ``fix`` is ``{}`` when no configuration
change helps; then ``fix_label`` is ``""``, except for the live ``below-abandon-threshold``
advice whose :attr:`Advice.action` is :attr:`AdviceAction.STOP_RUN`: the app offers to stop the
run (:func:`should_auto_stop` says when to stop without asking).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from ..hardware.nvml import GpuProcess
from ..hardware.specs import GpuSpec, HostSpec
from ..model.ggml_types import kv_type
from ..monitor.live import AllocationFailure, LiveState
from ..plan.buffers import HOST, buffer_device
from ..plan.config import ALL_LAYERS, ConfigError, PlanConfig
from ..plan.extras import replan_extras
from ..plan.fields import cli_flags, config_field
from ..plan.memory_plan import MemoryPlan, plan_memory
from ..plan.verdict import DOES_NOT_FIT, TIGHT, FitMargins, FitVerdict, fit_verdict
from ..speed.speed_model import (
    ABANDON_TOK_S,
    SpeedConstants,
    SpeedModelError,
    SpeedPrediction,
    decode_tok_s,
    speed_band,
    stages_pageable_copies,
)
from ..tune import (
    DEFAULT_KV_QUALITY,
    KV_QUALITY_NOTES,
    KV_QUALITY_ORDER,
    RAM_HEADROOM_FRACTION,
    VRAM_MARGIN_BYTES,
    TuneError,
    TuneGoal,
    tune,
)
from ..tune.bisection import largest_true, smallest_true
from ..tune.fit_choice import fit_blockers
from ..units import GiB, MiB, fmt_bytes

__all__ = [
    "Advice",
    "AdviceAction",
    "AdvisorError",
    "AdvisorSettings",
    "AllocationFailure",
    "GpuProcess",
    "LiveState",
    "advise",
    "fix_flags",
    "should_auto_stop",
    "speed_band",
]

SEVERITIES = ("error", "warning", "info")


class AdvisorError(ValueError):
    """Bad advisor settings or live data; the message says what to change."""


class AdviceAction(str, Enum):
    """What acting on an :class:`Advice` does (what its button, if any, should do)."""

    #: nothing to click: no configuration change helps
    NONE = "none"
    #: apply :attr:`Advice.fix` (PlanConfig field changes)
    FIX = "fix"
    #: stop the running model (the live "under 1 tok/s" advice)
    STOP_RUN = "stop-run"


@dataclass(frozen=True)
class Advice:
    """One piece of advice.

    Attributes:
        id: the rule (see the module docstring).
        severity: ``"error"`` (will fail or is unusable), ``"warning"`` or ``"info"``.
        message: one sentence with the numbers.
        reason: the formula or the rule behind it.
        fix: PlanConfig field changes (``{"n_ubatch": 256, "flash_attn": "on"}``), ``{}`` if none.
        fix_label: button text (``"Use n_ubatch 256"``).
        action: what acting on it does; by default :attr:`AdviceAction.FIX` when there is a
            ``fix``, else :attr:`AdviceAction.NONE`.
        trade: for "does not fit" and "too slow", the trade across KV quality levels
            (:data:`~kvtuner.core.tune.KV_QUALITY_ORDER`): per level ``{kv_quality, fix, fix_label,
            decode_tok_s_at_full_ctx, fits, note}``, ``fix`` None when nothing fits at that level.
    """

    id: str
    severity: str
    message: str
    reason: str
    fix: dict[str, object]
    fix_label: str
    action: AdviceAction | None = None
    trade: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.action is None:
            object.__setattr__(self, "action", AdviceAction.FIX if self.fix else AdviceAction.NONE)
        elif not isinstance(self.action, AdviceAction):
            object.__setattr__(self, "action", AdviceAction(self.action))

    def to_dict(self) -> dict[str, Any]:
        """``{id, severity, message, reason, fix, fix_label, trade}`` (JSON-able; ``trade`` is [] but
        for "does not fit" and "too slow")."""
        return {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "reason": self.reason,
            "fix": dict(self.fix),
            "fix_label": self.fix_label,
            "trade": [dict(t) for t in self.trade],
        }


@dataclass(frozen=True)
class AdvisorSettings:
    """Thresholds (bytes, fractions 0..1, tokens/s, seconds).

    Attributes:
        vram_margin_bytes: VRAM kept free per GPU for the driver and desktop: 1 GiB, the
            margin llama.cpp's own ``--fit`` keeps per device by default (``--fit-target``,
            common/common.h ``fit_params_target``).
        ram_headroom_fraction: host need must stay under ``1 - this`` of available RAM (20 %: room for the OS page cache and other programs).
            These two are the fit verdict's margins (:attr:`margins`,
            :func:`kvtuner.core.plan.verdict.fit_verdict`): over capacity is an error
            (``vram-oom``, ``ram-oom``), inside the margin a warning (``vram-tight``, ``swap-risk``).
        frag_min_bytes, frag_min_fraction: headroom under ``max(fraction * capacity, bytes)`` risks
            fragmentation.
        frag_last_alloc_fraction: the compute buffer (allocated last) needing more than this share of
            what is free when it comes risks fragmentation.
        abandon_tok_s: the abandon line (1 tok/s: 1000 tokens take over 16 minutes).
        live_window_s: how long measured decode must stay under the line before advising a stop.
        auto_stop_below_abandon: stop the run by itself after ``live_window_s`` under the line.
        swap_in_bytes_s: swap-in rate that counts as swapping during a run.
        low_available_fraction: available RAM under this share of total during a run is a swap risk.
        long_context_tokens: context per sequence from which an MHA model is flagged.
        other_process_min_bytes: VRAM held by other processes worth mentioning.
        knee_min_gain: decode gain (fraction) that makes moving KV back to the GPU worth a warning.
    """

    vram_margin_bytes: int = VRAM_MARGIN_BYTES
    ram_headroom_fraction: float = RAM_HEADROOM_FRACTION
    frag_min_bytes: int = 512 * MiB
    frag_min_fraction: float = 0.05
    frag_last_alloc_fraction: float = 0.5
    abandon_tok_s: float = ABANDON_TOK_S
    live_window_s: float = 10.0
    auto_stop_below_abandon: bool = False
    swap_in_bytes_s: float = 1 * MiB
    low_available_fraction: float = 0.10
    long_context_tokens: int = 32768
    other_process_min_bytes: int = 256 * MiB
    knee_min_gain: float = 0.10

    @property
    def margins(self) -> FitMargins:
        """The fit verdict's margins (:class:`~kvtuner.core.plan.verdict.FitMargins`)."""
        return FitMargins(int(self.vram_margin_bytes), self.ram_headroom_fraction)

    def __post_init__(self) -> None:
        for name in (
            "vram_margin_bytes",
            "frag_min_bytes",
            "swap_in_bytes_s",
            "abandon_tok_s",
            "live_window_s",
            "long_context_tokens",
            "other_process_min_bytes",
            "knee_min_gain",
        ):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise AdvisorError(f"advisor setting {name} must be a number >= 0, not {v!r}")
        for name in (
            "ram_headroom_fraction",
            "frag_min_fraction",
            "frag_last_alloc_fraction",
            "low_available_fraction",
        ):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise AdvisorError(f"advisor setting {name} must be a fraction between 0 and 1, not {v!r}")


# ------------------------------------------------------------------------------------------
# fixes


def fix_flags(fix: dict[str, object]) -> str:
    """The ``kvtuner`` command-line flags of a fix: ``{"n_ubatch": 256, "flash_attn": "on"}`` ->
    ``"--ubatch 256 --flash-attn on"`` (:func:`kvtuner.core.plan.fields.cli_flags`).

    Raises:
        AdvisorError: a key that is not a PlanConfig field.
    """
    try:
        return cli_flags(dict(fix))
    except KeyError as exc:
        raise AdvisorError(f"fix key {exc.args[0]!r} is not a configuration field") from None


def _hardware(plan: MemoryPlan) -> tuple[list[GpuSpec], HostSpec | None]:
    """GpuSpecs and HostSpec that reproduce ``plan``'s devices for re-planning."""
    # CUDA<i>, or RPC<i>[host:port] for an rpc-server's device (GpuSpec.device)
    gpus = [
        GpuSpec(
            name=d.name,
            total_bytes=d.capacity_bytes or 0,
            free_bytes=d.free_bytes,
            index=int(d.device[3 : d.device.index("[")] if d.endpoint is not None else (d.device[4:] or 0)),
            endpoint=d.endpoint,
        )
        for d in plan.gpus
    ]
    h = plan.host
    host = HostSpec(total_bytes=h.capacity_bytes, available_bytes=h.free_bytes) if h.capacity_bytes else None
    return gpus, host


class _Ctx:
    """What every rule sees; caches re-plans."""

    def __init__(self, plan: MemoryPlan, speed: SpeedPrediction | None, live: LiveState | None, s: AdvisorSettings):
        self.plan, self.speed, self.live, self.s = plan, speed, live, s
        self.gpus, self.host = _hardware(plan)
        self._plans: dict[tuple, MemoryPlan | None] = {}
        self._tuned: dict[tuple, dict[str, object]] = {}

    def config(self, fix: Mapping[str, Any]) -> PlanConfig | None:
        try:
            return replace(self.plan.config, **fix)
        except (ConfigError, TypeError):
            return None

    def replan(self, fix: dict[str, object]) -> MemoryPlan | None:
        key = tuple(sorted((k, repr(v)) for k, v in fix.items()))
        if key not in self._plans:
            cfg = self.config(fix)
            try:
                p = (
                    plan_memory(
                        self.plan.model, cfg, self.gpus, self.host, split=self.plan.split, rules=self.plan.rules
                    )
                    if cfg
                    else None
                )
                # the projector / draft / LoRA stay: planned again for the changed configuration
                self._plans[key] = replan_extras(p, self.plan, self.gpus, self.host) if p is not None else None
            except ConfigError:
                self._plans[key] = None
        return self._plans[key]

    def vram_limit(self, d: Any) -> int | None:
        return None if d.capacity_bytes is None else d.capacity_bytes - self.s.vram_margin_bytes

    def verdict(self, p: MemoryPlan) -> FitVerdict:
        """The one fit verdict of ``p`` with the settings' margins."""
        return fit_verdict(p, self.s.margins)

    def vram_ok(self, p: MemoryPlan) -> bool:
        return self.verdict(p).gpu_fits

    def ram_limit(self, p: MemoryPlan) -> int | None:
        h = p.host
        return h.free_bytes if h.free_bytes is not None else h.capacity_bytes

    def fits(self, p: MemoryPlan) -> bool:
        """The verdict says ``fits``: every fix the advisor offers passes this, so applying one
        draws neither an out-of-memory error nor a tight or swap-risk warning."""
        return self.verdict(p).fits

    def decode(self, p: MemoryPlan, full: bool = False) -> float | None:
        if self.speed is None or self.speed.inputs is None:
            return None
        try:
            return decode_tok_s(p, self.speed.inputs, p.n_ctx_seq - 1 if full else 0)
        except SpeedModelError:
            return None

    def tuned_fix(self, goal: dict[str, Any], quality: str | None = None) -> dict[str, object]:
        """The tuner's configuration (:func:`kvtuner.core.tune.tune`) for ``goal`` (TuneGoal
        fields) as a fix: the fields it changes; ``{}`` without a speed prediction or a result.
        The KV quality floor is :data:`~kvtuner.core.tune.DEFAULT_KV_QUALITY`, or the user's
        own types when they are already coarser."""
        if self.speed is None or self.speed.inputs is None:
            return {}
        cfg = self.plan.config
        if quality is None:
            worst = max(KV_QUALITY_ORDER.index(t) if t in KV_QUALITY_ORDER else 0 for t in (cfg.type_k, cfg.type_v))
            quality = KV_QUALITY_ORDER[max(worst, KV_QUALITY_ORDER.index(DEFAULT_KV_QUALITY))]
        key = ("tuned", tuple(sorted(goal.items())), quality)
        if key not in self._tuned:
            try:
                g = TuneGoal(
                    kv_quality=quality,
                    vram_margin_bytes=self.s.vram_margin_bytes,
                    ram_headroom_fraction=self.s.ram_headroom_fraction,
                    **goal,
                )
                best = _tuned_config(self.plan.model, cfg, self.gpus, self.host, self.speed.inputs, g)
            except (TuneError, ConfigError, SpeedModelError):
                best = None
            cur = cfg.to_dict()  # compared as JSON values (a tuple and a list of the same items are equal)
            # without a GPU the placement fields change nothing (every layer is on the CPU): the
            # tuner's "-ngl all" is not offered as "all layers on the GPU" to a CPU-only plan
            same = set() if self.gpus else _GPU_PLACEMENT_FIELDS
            self._tuned[key] = (
                {k: v for k, v in best.to_dict().items() if cur.get(k) != v and k not in same}
                if best is not None
                else {}
            )
        return dict(self._tuned[key])

    def first_fix(self, candidates: Iterable[dict[str, object]], ok: Callable[[MemoryPlan], bool]) -> dict[str, object]:
        for fix in candidates:
            if not fix:
                continue
            p = self.replan(fix)
            if p is not None and ok(p):
                return fix
        return {}

    def largest(
        self, field: str, lo: int, hi: int, ok: Callable[[MemoryPlan], bool], extra: dict[str, object] | None = None
    ) -> int | None:
        """Largest value of ``field`` in [lo, hi] whose plan is ``ok`` (ok assumed monotone)."""

        def holds(v: int) -> bool:
            p = self.replan({**(extra or {}), field: v})
            return p is not None and ok(p)

        return largest_true(holds, lo, hi)

    def smallest(self, field: str, lo: int, hi: int, ok: Callable[[MemoryPlan], bool]) -> int | None:
        """Smallest value of ``field`` in [lo, hi] whose plan is ``ok`` (ok assumed monotone:
        more experts on the host never needs more VRAM)."""

        def holds(v: int) -> bool:
            p = self.replan({field: v})
            return p is not None and ok(p)

        return smallest_true(holds, lo, hi)


#: Tune results the advisor asked for lately: a slider move that changes only a searched knob
#: (n_gpu_layers, kv_gpu_layers, types, ubatch) asks the same question again (one search is
#: 10-500 ms on a 2-core machine; a hit is free).
_TUNED: dict[tuple, tuple[Any, PlanConfig | None]] = {}
_TUNED_MAX = 32


#: Fields that only place tensors on GPUs (no effect on a CPU-only plan).
_GPU_PLACEMENT_FIELDS = frozenset({"n_gpu_layers", "kv_gpu_layers", "n_cpu_moe", "cpu_moe", "n_cpu_ffn"})


def _tuned_config(
    model: Any, cfg: PlanConfig, gpus: list[GpuSpec], host: HostSpec | None, inputs: Any, goal: TuneGoal
) -> PlanConfig | None:
    """The tuner's best configuration for ``goal`` from ``cfg`` (cached: :data:`_TUNED`)."""
    # what the search keeps from the user's configuration (search.py: the base's non-searched
    # fields); the searched ones do not change the answer
    base = cfg.with_(
        n_gpu_layers=ALL_LAYERS,
        kv_gpu_layers=None,
        n_cpu_moe=0,
        cpu_moe=False,
        n_cpu_ffn=0,
        type_k="f16",
        type_v="f16",
        flash_attn="auto",
        n_ubatch=512,
    )
    key = (model.header_sha256, model.structure.source, model.n_layer, tuple(gpus), host, id(inputs), goal, base)
    hit = _TUNED.get(key)
    if hit is not None and hit[0] is inputs:
        return hit[1]
    r = tune(model, base, gpus, host, inputs, goal, with_fit=False)
    best = r.best.config if r.best is not None else None
    if len(_TUNED) >= _TUNED_MAX:
        _TUNED.pop(next(iter(_TUNED)))
    _TUNED[key] = (inputs, best)
    return best


def _tuned_or(c: _Ctx, ok: Callable[[MemoryPlan], bool], *, gpu: bool) -> dict[str, object]:
    """The "does not fit" fix: of the tuned configuration for this context and the one-change
    candidates that keep the context (MoE experts or dense FFN to RAM, KV split, -ngl cut ...),
    the one that fits with the fastest predicted decode at full context (the tuner's own ranking;
    on a tie the tuned one), so the next rules have nothing worse to flag. The candidates take
    part because they keep the user's other settings (the tuner may change KV types, flash
    attention and n_ubatch too); without a prediction, or when none of them fits, the first
    candidate that fits (a smaller context last)."""
    options: list[tuple[float, int, dict[str, object]]] = []
    tuned = c.tuned_fix({"n_ctx": c.plan.config.n_ctx})
    candidates = list(_memory_candidates(c, ok, gpu=gpu))
    for fix in [tuned] + [fx for fx in candidates if "n_ctx" not in fx]:
        p = c.replan(fix) if fix else None
        if p is not None and c.fits(p):
            v = c.decode(p, full=True)
            if v is not None:
                options.append((v, -len(options), fix))
    if options:
        return max(options, key=lambda o: (o[0], o[1]))[2]
    return c.first_fix(candidates, c.fits)


def _quality_trade(c: _Ctx, fix: dict[str, object]) -> tuple[str, tuple[dict[str, Any], ...]]:
    """The trade across KV quality levels at this context: for f16, q8_0 and q4_0 (each the worst
    KV type allowed) the tuner's fastest configuration that fits, its predicted decode at full
    context, and what the level costs in quality (:data:`~kvtuner.core.tune.KV_QUALITY_NOTES`).
    Returns the sentence for the message and the structured :attr:`Advice.trade`; ("", ()) without
    a speed prediction."""
    if c.speed is None or c.speed.inputs is None:
        return "", ()
    n_ctx = c.plan.config.n_ctx
    rows: list[dict[str, Any]] = []
    parts = []
    for q in KV_QUALITY_ORDER:
        f = c.tuned_fix({"n_ctx": n_ctx}, quality=q)
        p = c.replan(f) if f else (c.plan if c.fits(c.plan) else None)
        v = c.decode(p, full=True) if p is not None and c.fits(p) else None
        ok = v is not None
        rows.append(
            {
                "kv_quality": q,
                "fix": dict(f) if ok else None,
                "fix_label": _label(f) if ok else "",
                "decode_tok_s_at_full_ctx": v,
                "fits": ok,
                "note": KV_QUALITY_NOTES[q],
            }
        )
        chosen = " (this fix)" if ok and f == fix else ""
        parts.append(f"{q} {v:.3g} tok/s{chosen}" if ok else f"{q} nothing fits")
    best = max((r for r in rows if r["fits"]), key=lambda r: r["decode_tok_s_at_full_ctx"], default=None)
    text = (
        f" KV quality trade at {n_ctx} tokens (best predicted decode at full context that fits): "
        + "; ".join(parts)
        + "."
    )
    if best is not None and best["fix"] and best["fix"] != fix:
        text += f" The fastest, {best['kv_quality']}: {fix_flags(best['fix'])}."
    return text, tuple(rows)


def _quality_reason() -> str:
    """The quality notes with their sources, for an advice's reason."""
    return "KV quality: " + "; ".join(KV_QUALITY_NOTES[q] for q in KV_QUALITY_ORDER)


def _label(fix: dict[str, object]) -> str:
    """Button text of a fix, in the catalogue's words (``"Use context 8192, flash attention on"``)."""
    if not fix:
        return ""
    return "Use " + ", ".join(config_field(k).phrase_for(v) for k, v in fix.items())


def _memory_candidates(c: _Ctx, ok: Callable[[MemoryPlan], bool], *, gpu: bool) -> Iterable[dict[str, object]]:
    """Fixes ordered by what they cost in speed: flash attention, smaller ubatch, q8_0 KV,
    then (GPU) KV to the host, fewer GPU layers, then a smaller context."""
    cfg, plan = c.plan.config, c.plan
    if cfg.flash_attn == "off":
        yield {"flash_attn": "on"}
    if gpu and plan.model.n_expert and not cfg.cpu_moe and any(d.expert_bytes for d in plan.gpus):
        # MoE: experts to the host before anything else: attention, KV and the dense part
        # stay in VRAM and a token reads only n_expert_used / n_expert of the moved experts
        n = c.smallest("n_cpu_moe", cfg.n_cpu_moe + 1, plan.model.n_layer, ok)
        if n is not None:
            yield {"n_cpu_moe": n}
    for ub in (256, 128):
        if plan.n_ubatch > ub:
            yield {"n_ubatch": ub}
    if cfg.type_k == "f16" or cfg.type_v == "f16":
        yield {"type_k": "q8_0", "type_v": "q8_0", **({"flash_attn": "on"} if cfg.flash_attn == "off" else {})}
    if gpu and plan.n_gpu_repeating:
        fixes: list[dict[str, object]] = []
        k = c.largest("kv_gpu_layers", 0, plan.n_gpu_repeating - 1, ok) if plan.kv_gpu_layers else None
        if k is not None:
            fixes.append({"kv_gpu_layers": k})
        top = plan.model.n_layer + 1 if cfg.n_gpu_layers == ALL_LAYERS else cfg.n_gpu_layers
        n = c.largest(
            "n_gpu_layers", 0, top - 1, ok, {"kv_gpu_layers": None} if cfg.kv_gpu_layers is not None else None
        )
        if n is not None:
            fixes.append({"n_gpu_layers": n, **({"kv_gpu_layers": None} if cfg.kv_gpu_layers is not None else {})})
        if not plan.model.n_expert and cfg.n_gpu_layers == ALL_LAYERS and cfg.kv_gpu_layers is None:
            # the other direction: every layer's attention and KV stay in VRAM,
            # the FFN of the first layers goes to RAM (llama.cpp's --n-cpu-ffn)
            f = c.smallest("n_cpu_ffn", cfg.n_cpu_ffn + 1, plan.model.n_layer, ok)
            if f is not None:
                fixes.append({"n_cpu_ffn": f})
        if len(fixes) > 1 and c.speed is not None and c.speed.inputs is not None:
            # KV split, -ngl cut or FFN split: the speed model orders them, fastest first (mean of
            # the predicted decode with an empty and a full context); without a prediction the
            # order stays KV split, -ngl cut, FFN split
            fixes.sort(key=lambda fx: -_mean_decode(c, fx))
        yield from fixes
    n_ctx = cfg.n_ctx
    for _ in range(8):
        n_ctx //= 2
        if n_ctx < 512:
            break
        yield {"n_ctx": n_ctx}


# ------------------------------------------------------------------------------------------
# rules


def _adv(
    id: str,
    severity: str,
    message: str,
    reason: str,
    fix: dict[str, object] | None = None,
    label: str | None = None,
    action: AdviceAction | None = None,
    trade: tuple[dict[str, Any], ...] = (),
) -> Advice:
    fix = dict(fix or {})
    return Advice(id, severity, message, reason, fix, _label(fix) if label is None else label, action, trade)


def _rule_vram_oom(c: _Ctx) -> list[Advice]:
    """``vram-oom`` (error) for a GPU the fit verdict calls "does not fit", ``vram-tight``
    (warning) for one it calls "tight"; the fix is the fastest that the verdict calls "fits"."""
    out = []
    levels = {d.device: d.level for d in c.verdict(c.plan).devices}
    for d in c.plan.gpus:
        level = levels.get(d.device)
        if level not in (DOES_NOT_FIT, TIGHT):
            continue
        lim = c.vram_limit(d)
        fix = _tuned_or(c, c.fits, gpu=True)
        parts = (
            f"{d.backend_device} needs {fmt_bytes(d.total_bytes)} (weights {fmt_bytes(d.weights_bytes)}, KV "
            f"{fmt_bytes(d.kv_bytes)}, compute {fmt_bytes(d.compute_bytes)})"
        )
        note = _moe_note(c, fix)
        if level == DOES_NOT_FIT:
            trade_text, trade = _quality_trade(c, fix)
            out.append(
                _adv(
                    "vram-oom",
                    "error",
                    f"{parts} but holds {fmt_bytes(d.capacity_bytes)}: "
                    f"{fmt_bytes(d.total_bytes - (d.capacity_bytes or 0))} over." + note + trade_text,
                    "total = weights + KV + compute + driver overhead must stay under the card's capacity; the fit "
                    "verdict also keeps a margin free (llama.cpp's --fit-target, 1 GiB per device by default). "
                    + _quality_reason(),
                    fix,
                    trade=trade,
                )
            )
        else:
            out.append(
                _adv(
                    "vram-tight",
                    "warning",
                    f"{parts}: it loads on the {fmt_bytes(d.capacity_bytes)} card but leaves "
                    f"{fmt_bytes((d.capacity_bytes or 0) - d.total_bytes)} free, under the "
                    f"{fmt_bytes(c.s.vram_margin_bytes)} margin (limit {fmt_bytes(lim)})." + note,
                    "the fit verdict calls a GPU tight when its total is within capacity but not within capacity - margin; "
                    "the margin is llama.cpp's --fit-target (1024 MiB by default, common/common.h fit_params_target): "
                    "the driver, the desktop or another program can take it, and llama-server's --fit would change "
                    "this configuration",
                    fix,
                )
            )
    fail = c.live.allocation_failure if c.live else None
    if (
        fail is not None
        and buffer_device(fail.device) != HOST
        and not (
            fail.free_bytes is not None and fail.requested_bytes is not None and fail.free_bytes >= fail.requested_bytes
        )
        and not out
    ):
        fix = c.first_fix(_memory_candidates(c, c.fits, gpu=True), c.fits)
        out.append(
            _adv(
                "vram-oom",
                "error",
                f"{fail.device} ran out of memory: the run asked for {fmt_bytes(fail.requested_bytes)} with "
                f"{fmt_bytes(fail.free_bytes)} free.",
                "an allocation larger than the free VRAM fails (measured during the run)",
                fix,
            )
        )
    return out


def _mean_decode(c: _Ctx, fix: dict[str, object]) -> float:
    """Mean of the predicted decode tok/s with an empty and a full context for ``fix`` (0 when
    there is no speed prediction)."""
    p = c.replan(fix)
    if p is None:
        return 0.0
    a, b = c.decode(p), c.decode(p, full=True)
    return (a + b) / 2 if a and b else 0.0


def _moe_note(c: _Ctx, fix: dict[str, object]) -> str:
    """For an ``n_cpu_moe`` fix: what moves and the decode speed predicted with it."""
    if "n_cpu_moe" not in fix:
        return ""
    p = c.replan(fix)
    if p is None:
        return ""
    tok_s = c.decode(p)
    speed = f", decode predicted {tok_s:.1f} tok/s" if tok_s else ""
    return (
        f" With the experts of the first {fix['n_cpu_moe']} layers in RAM ({fmt_bytes(p.host.expert_bytes)}) "
        f"it fits{speed}."
    )


def _rule_ram_oom(c: _Ctx) -> list[Advice]:
    """``ram-oom`` (error) when the fit verdict calls the host "does not fit"; the fix is the
    fastest the verdict calls "fits" (the host inside its headroom: no swap-risk afterwards)."""
    h = c.plan.host
    lim = c.ram_limit(c.plan)
    hv = c.verdict(c.plan).at_device("host")
    if lim is None or hv is None or hv.level != DOES_NOT_FIT:
        return []
    fix = _tuned_or(c, c.fits, gpu=False)
    what = "available" if h.free_bytes is not None else "installed"
    repack = f", repacked copy {fmt_bytes(h.repack_bytes)}" if h.repack_bytes else ""
    trade_text, trade = _quality_trade(c, fix)
    return [
        _adv(
            "ram-oom",
            "error",
            f"The host needs {fmt_bytes(h.total_bytes)} (weights {fmt_bytes(h.weights_bytes)}{repack}, KV {fmt_bytes(h.kv_bytes)}, "
            f"compute {fmt_bytes(h.compute_bytes)}) but only {fmt_bytes(lim)} of RAM is {what}." + trade_text,
            "host total = weights (mapped pages must stay resident) + ggml-cpu's repacked copy + KV + compute + output + "
            "process must fit the available RAM. " + _quality_reason(),
            fix,
            trade=trade,
        )
    ]


def _frag_risk(c: _Ctx, d: Any) -> str | None:
    if d.capacity_bytes is None:
        return None
    headroom = d.capacity_bytes - d.total_bytes
    floor = max(c.s.frag_min_fraction * d.capacity_bytes, c.s.frag_min_bytes)
    if 0 <= headroom < floor:
        return (
            f"{d.backend_device} keeps only {fmt_bytes(headroom)} free after every buffer, under "
            f"max({c.s.frag_min_fraction:.0%} of {fmt_bytes(d.capacity_bytes)}, {fmt_bytes(c.s.frag_min_bytes)}) = {fmt_bytes(floor)}"
        )
    free_then = d.capacity_bytes - (d.overhead_bytes + d.weights_bytes + d.kv_bytes)
    if (
        d.compute_bytes
        and free_then > 0
        and d.compute_bytes > c.s.frag_last_alloc_fraction * free_then
        and headroom >= 0
    ):
        return (
            f"the {fmt_bytes(d.compute_bytes)} compute buffer of {d.backend_device}, allocated last, needs "
            f"{d.compute_bytes / free_then:.0%} of the {fmt_bytes(free_then)} left after weights and KV"
        )
    return None


def _rule_fragmentation(c: _Ctx) -> list[Advice]:
    out = []
    reason = (
        "headroom under max(5 %, 512 MiB), or the last large allocation (llama.cpp allocates weights, then KV, "
        "then the compute buffer) needing more than half of what is free: free VRAM can suffice while no "
        "contiguous block does"
    )

    def no_risk(p: MemoryPlan) -> bool:
        return c.fits(p) and all(_frag_risk(c, d) is None for d in p.gpus)

    levels = {d.device: d.level for d in c.verdict(c.plan).devices}
    for d in c.plan.gpus:
        if levels.get(d.device) in (DOES_NOT_FIT, TIGHT):
            continue  # vram-oom or vram-tight says it
        why = _frag_risk(c, d)
        if why:
            fix = c.first_fix(_memory_candidates(c, no_risk, gpu=True), no_risk)
            out.append(_adv("fragmentation-risk", "warning", why[0].upper() + why[1:] + ".", reason, fix))
    fail = c.live.allocation_failure if c.live else None
    if (
        fail is not None
        and fail.free_bytes is not None
        and fail.requested_bytes is not None
        and fail.free_bytes >= fail.requested_bytes
    ):
        fix = c.first_fix(_memory_candidates(c, no_risk, gpu=buffer_device(fail.device) != HOST), no_risk)
        out.append(
            _adv(
                "fragmentation-risk",
                "error",
                f"An allocation of {fmt_bytes(fail.requested_bytes)} on {fail.device} failed while {fmt_bytes(fail.free_bytes)} "
                "was reported free: memory is fragmented.",
                reason,
                fix,
            )
        )
    return out


def _rule_swap(c: _Ctx) -> list[Advice]:
    out = []
    h = c.plan.host
    lim = c.ram_limit(c.plan)
    frac = 1 - c.s.ram_headroom_fraction
    reason = "keep at least 20 % of RAM above the need; KV swapped to disk is unusable, not slow "
    hv = c.verdict(c.plan).at_device("host")
    if lim is not None and hv is not None and hv.level == TIGHT:
        fix = c.first_fix(_memory_candidates(c, c.fits, gpu=False), c.fits)
        split = (
            f" ({fmt_bytes(h.committed_bytes)} committed, which only swap can take; {fmt_bytes(h.mapped_bytes)} of "
            "mapped file pages, which the OS drops and re-reads)"
            if h.mapped_bytes
            else ""
        )
        out.append(
            _adv(
                "swap-risk",
                "warning",
                f"The host needs {fmt_bytes(h.total_bytes)}, {h.total_bytes / lim:.0%} of the {fmt_bytes(lim)} available "
                f"(more than {frac:.0%}){split}.",
                reason,
                fix,
            )
        )
    # committed memory takes its share of free RAM first; the mapped weights get what is left
    if h.weights_mapped and h.free_bytes is not None and h.mapped_bytes > h.free_bytes - h.committed_bytes:
        gpu_fix = c.first_fix(
            [
                {"n_gpu_layers": n}
                for n in ([c.largest("n_gpu_layers", 0, c.plan.model.n_layer + 1, c.fits)] if c.plan.gpus else [])
                if n is not None and n > c.plan.n_gpu_layers
            ],
            lambda p: p.host.mapped_bytes <= (p.host.free_bytes or 0) - p.host.committed_bytes and c.fits(p),
        )
        room = max(h.free_bytes - h.committed_bytes, 0)
        out.append(
            _adv(
                "swap-risk",
                "warning",
                f"{fmt_bytes(h.mapped_bytes)} of memory-mapped weights exceed the {fmt_bytes(room)} of free RAM left after "
                f"{fmt_bytes(h.committed_bytes)} of committed memory: they will be streamed from disk at every token.",
                "mapped weights that do not fit the page cache are re-read from disk",
                gpu_fix,
            )
        )
    lv = c.live
    if lv is not None:
        if lv.swap_in_bytes_s is not None and lv.swap_in_bytes_s > c.s.swap_in_bytes_s:
            out.append(
                _adv(
                    "swap-risk",
                    "error",
                    f"The system is swapping in {fmt_bytes(lv.swap_in_bytes_s)}/s during the run.",
                    reason + "; measured swap-in",
                    c.first_fix(_memory_candidates(c, c.fits, gpu=False), c.fits),
                )
            )
        if (
            lv.available_ram_bytes is not None
            and lv.total_ram_bytes
            and lv.available_ram_bytes < c.s.low_available_fraction * lv.total_ram_bytes
        ):
            out.append(
                _adv(
                    "swap-risk",
                    "warning",
                    f"Only {fmt_bytes(lv.available_ram_bytes)} of {fmt_bytes(lv.total_ram_bytes)} RAM "
                    f"({lv.available_ram_bytes / lv.total_ram_bytes:.0%}) is available during the run.",
                    reason + f"; available RAM under {c.s.low_available_fraction:.0%}",
                    {},
                )
            )
    return out


def _rule_abandon(c: _Ctx) -> list[Advice]:
    """Under the abandon line only when even the optimistic end of the prediction's band is: the
    band is the measured spread of the speed model's errors (kvtuner.core.speed.calibration
    PRIOR_SIGMA_DECODE, from benchmarks/speed_validation.py; with weights or KV in RAM beside a
    GPU, the range about two thirds of the public runs of that regime measured,
    kvtuner.core.speed.regime REGIME_RANGE_LOG: its top is the 84th percentile of measured /
    predicted, 1.06-1.13x), so a full-offload plan predicted at 0.9 tok/s that may well run at 1.1
    is not called hopeless, while one with experts in RAM predicted at 0.85 is. The fix offered is
    the first candidate whose predicted full-context decode clears the line, and the message says
    what it predicts."""
    out = []
    reason = (
        "below 1 token/s, 1000 tokens take over 15 minutes: give up on this configuration; "
        "bands: < 1 abandon, 1-5 offline, 5-10 interactive, >= 10 fluent; the line is compared with the "
        "top of the prediction's likely range (the measured spread of the speed model's errors)"
    )
    sp = c.speed
    line = c.s.abandon_tok_s
    k = sp.band[1] / sp.decode_tok_s if sp is not None and sp.decode_tok_s > 0 and sp.band[1] > 0 else 1.0
    if sp is not None and sp.decode_tok_s_at_full_ctx * k < line:

        def fast(p: MemoryPlan) -> bool:
            v = c.decode(p, full=True)
            return c.fits(p) and v is not None and v >= line

        cands: list[dict[str, object]] = [
            c.tuned_fix({"n_ctx": c.plan.config.n_ctx}),
            c.tuned_fix({"min_tok_s": line, "max_ctx": c.plan.config.n_ctx}),
        ]
        if c.plan.gpus:
            if c.plan.config.kv_gpu_layers is not None:
                cands.append({"kv_gpu_layers": None})
            cands.append({"n_gpu_layers": ALL_LAYERS, "kv_gpu_layers": None})
        # of the fixes that keep the context, the fastest at full context that clears the line;
        # only when none does, the longest shorter context that does
        keep = []
        for i, fx in enumerate(cands):
            p = c.replan(fx) if fx else None
            if p is not None and fast(p):
                keep.append((c.decode(p, full=True) or 0.0, -i, fx))
        fix = max(keep, key=lambda o: (o[0], o[1]))[2] if keep else {}
        if not fix:
            n_ctx = c.plan.config.n_ctx
            shorter: list[dict[str, object]] = []
            for _ in range(8):
                n_ctx //= 2
                if n_ctx < 512:
                    break
                shorter.append({"n_ctx": n_ctx})
            fix = c.first_fix(shorter, fast)
        trade_text, trade = _quality_trade(c, fix)
        effect = ""
        if fix:
            fixed = c.replan(fix)
            v = c.decode(fixed, full=True) if fixed is not None else None
            if v is not None:
                effect = f" With {fix_flags(fix)}: {v:.2f} tok/s predicted at full context."
        if sp.decode_tok_s * k < line:
            msg = (
                f"Predicted decode is {sp.decode_tok_s:.2f} tok/s (at most {sp.band[1]:.2f}) even with an empty cache, "
                f"under the {line:g} tok/s abandon line.{effect}"
            )
            sev = "error"
        else:
            msg = (
                f"Predicted decode falls from {sp.decode_tok_s:.2f} tok/s to {sp.decode_tok_s_at_full_ctx:.2f} tok/s "
                f"(at most {sp.decode_tok_s_at_full_ctx * k:.2f}) at the full {c.plan.n_ctx_seq}-token context, under "
                f"the {line:g} tok/s abandon line.{effect}"
            )
            sev = "warning"
        out.append(
            _adv("below-abandon-threshold", sev, msg + trade_text, reason + ". " + _quality_reason(), fix, trade=trade)
        )
    lv = c.live
    if (
        lv is not None
        and lv.decode_tok_s is not None
        and lv.decode_tok_s < line
        and lv.below_abandon_s >= c.s.live_window_s
    ):
        out.append(
            _adv(
                "below-abandon-threshold",
                "error",
                f"Measured decode has stayed at {lv.decode_tok_s:.2f} tok/s for {lv.below_abandon_s:.0f} s, under the "
                f"{line:g} tok/s abandon line.",
                reason + "; measured over the last 10 s",
                {},
                "Stop the run",
                AdviceAction.STOP_RUN,
            )
        )
    return out


def _rule_v_needs_fa(c: _Ctx) -> list[Advice]:
    cfg = c.plan.config
    if not kv_type(cfg.type_v).is_quantized:
        return []
    reason = "a quantized V cache requires flash attention; llama.cpp refuses the context without it (src/llama-context.cpp: 'V cache quantization requires flash_attn')"
    lv = c.live
    if lv is not None and lv.flash_attn is False:
        return [
            _adv(
                "v-cache-needs-flash-attn",
                "error",
                f"The run reports flash attention off with a {cfg.type_v} V cache.",
                reason,
                {"flash_attn": "on"},
            )
        ]
    if cfg.flash_attn == "auto":
        return [
            _adv(
                "v-cache-needs-flash-attn",
                "info",
                f"The {cfg.type_v} V cache works only if flash attention 'auto' resolves to on; set it on explicitly "
                "so a backend that cannot run it fails loudly.",
                reason,
                {"flash_attn": "on"},
            )
        ]
    return []


def _rule_kv_slow_path(c: _Ctx) -> list[Advice]:
    p, cfg, m = c.plan, c.plan.config, c.plan.model
    if not p.gpus or p.kv_gpu_layers == 0:
        return []
    quant = kv_type(cfg.type_k).is_quantized or kv_type(cfg.type_v).is_quantized
    reason = (
        "CUDA flash-attention kernels exist for matching K/V types and, for quantized KV, head sizes other than 256; "
        "otherwise ggml-cuda reports the flash-attention op unsupported and the scheduler runs it on the CPU (ggml-cuda/fattn.cu; GGML_CUDA_FA_ALL_QUANTS builds more cases)"
    )
    heads = {m.head_dim_k_at(l.il) for l in p.kv_layers}
    if cfg.type_k != cfg.type_v:
        # match the types; with head size 256 only f16/f16 avoids the slow path (no quantized kernel)
        fix: dict[str, object] = {"type_k": "f16", "type_v": "f16"} if 256 in heads else {"type_v": cfg.type_k}
        if c.config(fix) is None:
            fix = {"type_k": cfg.type_v}
        return [
            _adv(
                "kv-type-slow-path",
                "warning",
                f"K cache {cfg.type_k} and V cache {cfg.type_v} differ: CUDA attention falls back to a slow path.",
                reason,
                fix if c.config(fix) else {},
            )
        ]
    if quant and 256 in heads:
        return [
            _adv(
                "kv-type-slow-path",
                "warning",
                f"A {cfg.type_k} KV cache with head size 256 ({m.architecture}) runs attention on a slow path on CUDA.",
                reason,
                {"type_k": "f16", "type_v": "f16"},
            )
        ]
    return []


def _rule_ctx_train(c: _Ctx) -> list[Advice]:
    p, m = c.plan, c.plan.model
    if not m.n_ctx_train or p.n_ctx_seq <= m.n_ctx_train:
        return []
    per_seq = m.n_ctx_train * (1 if p.config.kv_unified else p.config.n_seq)
    return [
        _adv(
            "ctx-exceeds-train",
            "warning",
            f"Each sequence gets {p.n_ctx_seq} tokens of context, more than the {m.n_ctx_train} the model was trained on.",
            "n_ctx_seq > n_ctx_train: positions past the trained length degrade output unless RoPE scaling is set",
            {"n_ctx": per_seq},
        )
    ]


def _rule_first_layer_host(c: _Ctx) -> list[Advice]:
    """``-ngl n_layer`` is the classic "all layers" mistake. llama.cpp offloads the output layer
    *first* (llama-model.cpp: ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``, and the
    output layer is slot ``n_layer``), so it is layer 0, not the output layer, that stays on the
    CPU with its KV. (The reference's "leaves the output layer on the CPU" disagrees with the code.)"""
    p, cfg = c.plan, c.plan.config
    if not p.gpus or cfg.n_gpu_layers != p.model.n_layer:
        return []
    fix: dict[str, object] = {"n_gpu_layers": ALL_LAYERS}
    q = c.replan(fix)
    gain = ""
    if q is not None:
        a, b = c.decode(p), c.decode(q)
        if a and b:
            gain = f" (predicted decode {a:.1f} -> {b:.1f} tok/s)"
        if not c.fits(q):
            fix = {}
    layer0 = p.model.layer_bytes[0] + sum(l.kv_bytes for l in p.kv_layers if l.il == 0)
    return [
        _adv(
            "first-layer-on-host",
            "warning",
            f"--ngl {cfg.n_gpu_layers} equals the {p.model.n_layer} layers, but the output layer is offloaded first, "
            f"so layer 0 ({fmt_bytes(layer0)} with its KV) stays on the CPU{gain}.",
            "i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0) and the output layer is slot n_layer "
            "(llama-model.cpp load_tensors); 'all' is n_layer + 1",
            fix,
            "Offload every layer (--ngl all)" if fix else "",
        )
    ]


def _rule_mha(c: _Ctx) -> list[Advice]:
    p, m = c.plan, c.plan.model
    if m.attention_kind != "MHA" or p.n_ctx_seq < c.s.long_context_tokens:
        return []
    per_tok = p.kv_bytes_per_token()
    n_head = max(m.n_head) if m.n_head else 0
    factor = n_head // 8 if n_head >= 16 else 0
    gqa = f"; a GQA model with 8 KV heads would need {factor}x less" if factor else ""
    fix: dict[str, object] = {}
    if p.config.type_k == "f16" and p.config.type_v == "f16":
        fix = {"type_k": "q8_0", "type_v": "q8_0", **({"flash_attn": "on"} if p.config.flash_attn == "off" else {})}
        if c.replan(fix) is None:
            fix = {}
    return [
        _adv(
            "mha-long-context",
            "info",
            f"This MHA model keeps {fmt_bytes(per_tok)} of KV per token, {fmt_bytes(p.kv_bytes)} at "
            f"{p.n_ctx_seq} tokens{gqa}.",
            "KV bytes = 2 x layers x KV heads x head size x tokens x bytes; GQA models have 4-8x fewer KV heads ",
            fix,
        )
    ]


#: The parallel-sequences advice offers "-np 1" only when it saves at least this much KV (and
#: a tenth of the KV): below that the fix is noise (it was once offered to save 54 MiB).
PARALLEL_FIX_MIN_BYTES = 256 << 20


def _rule_parallel(c: _Ctx) -> list[Advice]:
    p, cfg = c.plan, c.plan.config
    if cfg.n_seq <= 1 or cfg.kv_unified:
        return []
    per = p.kv_bytes // max(1, p.n_stream)
    # one sequence keeps the same n_ctx in one stream: the KV only shrinks where a stream has
    # a floor of its own (an SWA cache holds n_swa + n_ubatch cells per stream,
    # llama-kv-cache-iswa.cpp); offer it only when that saves something worth a click
    one = c.replan({"n_seq": 1})
    saving = p.kv_bytes - one.kv_bytes if one is not None else 0
    worth = saving >= max(PARALLEL_FIX_MIN_BYTES, p.kv_bytes // 10)
    return [
        _adv(
            "parallel-multiplies-kv",
            "info",
            f"{cfg.n_seq} parallel sequences each get their own {p.n_ctx_seq}-cell KV stream: "
            f"{cfg.n_seq} x {fmt_bytes(per)} = {fmt_bytes(p.kv_bytes)}"
            + (
                f"; one sequence would save {fmt_bytes(saving)}."
                if saving > 0
                else "; one sequence would hold the same KV (the context is shared between them)."
            ),
            "sequences share the weights and the context; each has its own KV stream",
            {"n_seq": 1} if worth else {},
        )
    ]


def _rule_kv_quality(c: _Ctx) -> list[Advice]:
    cfg = c.plan.config
    quant = [t for t in (cfg.type_k, cfg.type_v) if kv_type(t).is_quantized]
    if not quant:
        return []
    fix: dict[str, object] = {"type_k": "f16", "type_v": "f16"}
    q = c.replan(fix)
    if q is None or not c.fits(q):
        fix = {}
    # bytes per element relative to f16's 2 (ggml.c type_traits: q8_0 34 B / 32 = 0.53x,
    # q5_1 24 B / 32 = 0.375x, q4_0 18 B / 32 = 0.28x)
    ratios = ", ".join(f"{t} {kv_type(t).bytes_per_element / 2:.3g}x" for t in sorted(set(quant)))
    return [
        _adv(
            "kv-quant-quality",
            "info",
            f"A quantized KV cache takes a fraction of f16's memory ({ratios} of f16); "
            "exact recall (numbers, quotes, code) may suffer.",
            "quantized KV: perplexity barely moves, exact-recall tasks show occasional token errors (KIVI, Liu et al. 2024, arXiv:2402.02750)",
            fix,
        )
    ]


def _rule_kv_not_applied(c: _Ctx) -> list[Advice]:
    lv, cfg = c.live, c.plan.config
    if lv is None or (lv.kv_type_k is None and lv.kv_type_v is None):
        return []
    got_k = lv.kv_type_k or cfg.type_k
    got_v = lv.kv_type_v or cfg.type_v
    if (got_k.lower(), got_v.lower()) == (cfg.type_k, cfg.type_v):
        return []
    fix: dict[str, object] = (
        {"flash_attn": "on"} if (kv_type(cfg.type_v).is_quantized and cfg.flash_attn != "on") else {}
    )
    return [
        _adv(
            "kv-type-not-applied",
            "warning",
            f"Requested a {cfg.type_k}/{cfg.type_v} KV cache but the runner's buffers are {got_k}/{got_v}.",
            "measured llama_kv_cache line differs from the request",
            fix,
        )
    ]


def _rule_other_processes(c: _Ctx) -> list[Advice]:
    out = []
    reason = "VRAM held by other processes is not available to llama.cpp"
    lv = c.live
    seen: set[str] = set()
    if lv is not None and lv.gpu_processes:
        by_gpu: dict[int, list[GpuProcess]] = {}
        for pr in lv.gpu_processes:
            if pr.pid not in lv.own_pids:
                by_gpu.setdefault(pr.gpu_index, []).append(pr)
        for idx, procs in sorted(by_gpu.items()):
            held = sum(pr.used_bytes or 0 for pr in procs)
            if held < c.s.other_process_min_bytes:
                continue
            dev = f"CUDA{idx}"
            seen.add(dev)
            top = ", ".join(
                f"{pr.name or pr.pid} {fmt_bytes(pr.used_bytes)}"
                for pr in sorted(procs, key=lambda x: -(x.used_bytes or 0))[:3]
            )
            out.append(
                _adv(
                    "other-processes-hold-vram",
                    "warning",
                    f"{len(procs)} other process{'es' if len(procs) > 1 else ''} hold {fmt_bytes(held)} on {dev} ({top}).",
                    reason + "; NVML process list",
                    {},
                )
            )
    for d in c.plan.gpus:
        if d.device in seen or d.free_bytes is None or d.capacity_bytes is None:
            continue
        held = d.capacity_bytes - d.free_bytes
        if held < c.s.other_process_min_bytes:
            continue
        sev = "warning" if d.total_bytes > d.free_bytes else "info"
        out.append(
            _adv(
                "other-processes-hold-vram",
                sev,
                f"{fmt_bytes(held)} of {d.backend_device} is already in use by other processes; the plan needs "
                f"{fmt_bytes(d.total_bytes)} of the {fmt_bytes(d.free_bytes)} free.",
                reason + "; NVML free memory",
                {},
            )
        )
    return out


def _rule_offload_knee(c: _Ctx) -> list[Advice]:
    p = c.plan
    if c.speed is None or c.speed.inputs is None or not p.gpus or not p.n_gpu_repeating:
        return []
    n = p.n_gpu_repeating
    k = p.kv_gpu_layers
    if k >= n:
        return []
    step = max(1, n // 8)
    up = c.replan({"kv_gpu_layers": min(n, k + step) if k + step < n else None})
    if up is None or not c.fits(up):
        return []
    s0, s1 = c.decode(p, full=True), c.decode(up, full=True)
    if not s0 or not s1:
        return []
    gain = s1 / s0 - 1
    extra = sum(d.total_bytes for d in up.gpus) - sum(d.total_bytes for d in p.gpus)
    cap = sum(d.capacity_bytes or 0 for d in p.gpus) or 1
    if gain < c.s.knee_min_gain or (extra > 0 and gain <= extra / cap):
        return []
    best = c.largest("kv_gpu_layers", k, n, c.fits)
    fix: dict[str, object] = {"kv_gpu_layers": None if best == n else best} if best is not None and best > k else {}
    return [
        _adv(
            "offload-knee",
            "warning",
            f"Moving the KV of {min(step, n - k)} more layer{'s' if min(step, n - k) > 1 else ''} back to the GPU costs "
            f"{fmt_bytes(extra)} ({extra / cap:.0%} of VRAM) and gains {gain:.0%} decode speed at full context "
            f"({s0:.2f} -> {s1:.2f} tok/s): this offload is past the knee.",
            "speed falls off a cliff once host bandwidth carries the KV; find the knee, do not minimise VRAM blindly "
            "; step worth it when relative speed gain > relative VRAM cost",
            fix,
        )
    ]


def _rule_fit_off(c: _Ctx) -> list[Advice]:
    p = c.plan
    if not p.gpus:
        return []
    blockers = fit_blockers(p.config, p.split)
    if not blockers:
        return []
    return [
        _adv(
            "fit-off",
            "info",
            f"{', '.join(blockers)} switches off llama-server's --fit: it will not lower the layers or context "
            "to keep 1 GiB of each GPU free; this plan is what it will run.",
            "common/fit.cpp common_params_fit_impl gives up when n_gpu_layers, tensor_split or "
            "tensor_buft_overrides (-ot, --n-cpu-moe, --cpu-moe, --n-cpu-ffn) were set by the user",
            {},
        )
    ]


#: Weights copied per prompt ubatch below which the mmap note is not worth a line (bytes): a
#: quarter of a GiB, a few milliseconds even from pageable memory.
MMAP_NOTE_MIN_BYTES = GiB // 4


def _rule_mmap_host_weights(c: _Ctx) -> list[Advice]:
    """``mmap-host-weights`` (info): a prompt's ubatches copy weights kept in RAM to the GPU (op
    offload, ``OFFLOAD_MIN_BATCH`` tokens and more), and with mmap those weights sit in pageable
    memory: llama.cpp keeps memory-mapped host weights in a plain CPU buffer, not the GPU's pinned
    host buffer (src/llama-model-loader.cpp "avoid using a host buffer when using mmap"), so each
    copy goes through a staging buffer (the CUDA driver's, or ggml-vulkan's own memcpy and wait:
    :data:`~kvtuner.core.speed.speed_model.STAGED_COPY_BACKENDS`). kvtuner's prefill prices such copies at
    :attr:`SpeedConstants.pageable_h2d_share` of the pinned rate; ``-lm none`` (``--no-mmap``)
    loads the weights into pinned memory, copied at the full rate (as llama.cpp does by itself with an
    integrated GPU: :func:`~kvtuner.core.plan.memory_plan.mmap_in_effect`)."""
    from ..plan.llama_constants import OFFLOAD_MIN_BATCH
    from ..speed.speed_model import prefill_workload

    p = c.plan
    gpu = next((g for g in p.gpus if g.kind == "gpu"), None)
    u = min(p.n_ubatch, p.n_ctx_seq)
    # the backends that stage copies from pageable memory (the speed model's rule)
    if not p.host.weights_mapped or gpu is None or not stages_pageable_copies(gpu.backend) or u < OFFLOAD_MIN_BATCH:
        return []
    try:
        work = prefill_workload(p, u, 0)
    except SpeedModelError:
        return []
    copied = work.weight_copy_bytes
    if copied < MMAP_NOTE_MIN_BYTES:
        return []
    return [
        _adv(
            "mmap-host-weights",
            "info",
            f"Each prompt ubatch of {u} tokens copies {fmt_bytes(copied)} of the weights kept in RAM to "
            f"{gpu.backend_device}; memory-mapped (the default) they sit in pageable memory, and the copy goes "
            "through a staging buffer at about "
            f"{SpeedConstants().pageable_h2d_share:.0%} of the pinned rate (the prefill figure counts this). "
            "Without mmap (-lm none, --no-mmap) they are loaded into pinned memory and copied at the full "
            "rate; the load takes longer.",
            "src/llama-model-loader.cpp: memory-mapped host weights stay in a plain CPU buffer ('avoid using a "
            "host buffer when using mmap') and llama.cpp warns 'tensor overrides to CPU are used with mmap "
            "enabled - consider using --load-mode none for better performance'; ggml-backend.cpp "
            "ggml_backend_sched_compute_splits copies them for every ubatch that op offload moves to the GPU",
            {"use_mmap": False},
        )
    ]


def _rule_extras(c: _Ctx) -> list[Advice]:
    """``extras-over`` (warning) when a device the fit verdict does not call "fits" holds part of a
    projector, a draft model or a LoRA adapter: what ``--no-mmproj-offload``, a lower ``-ngld`` and
    dropping the draft free there, each with its speed (no button: these are llama-server flags
    beside the configuration, :mod:`kvtuner.core.plan.extras`)."""
    from dataclasses import replace as _replace

    from ..plan.config import ALL_LAYERS as _ALL
    from ..plan.extras import plan_extras, with_extras
    from ..speed.extras_speed import speculative_speed
    from ..speed.speed_model import predict_speed

    xp = c.plan.extras
    if xp is None:
        return []
    levels = {d.device: d.level for d in c.verdict(c.plan).devices}
    bad = [d for d in c.plan.devices if d.extras_bytes and levels.get(d.device) in (DOES_NOT_FIT, TIGHT)]
    if not bad:
        return []
    base = _replace(c.plan, devices=tuple(_replace(d, extras_bytes=0) for d in c.plan.devices), extras=None)

    def trial(cfg: Any) -> tuple[Any, Any] | None:
        try:
            x = plan_extras(base, cfg, c.gpus, c.host, split=c.plan.split)
        except ConfigError:
            return None
        return x, with_extras(base, x)

    def spec_text(x: Any) -> str:
        if c.speed is None or c.speed.inputs is None or x.draft_plan is None:
            return ""
        try:
            d = predict_speed(x.draft_plan, c.speed.inputs)
            r = speculative_speed(c.speed.decode_tok_s, c.speed.prefill_tok_s, d.decode_tok_s)
        except (SpeedModelError, ValueError):
            return ""
        return f", speculative decode {r.tok_s[0]:.1f}-{r.tok_s[1]:.1f} tok/s"

    options: list[str] = []
    cfg = xp.config
    devs = ", ".join(d.backend_device for d in bad)
    if cfg.mmproj and cfg.mmproj_offload and any(d.kind != "host" for d in bad):
        t = trial(_replace(cfg, mmproj_offload=False))
        if t is not None:
            verdict = {DOES_NOT_FIT: "still does not fit", TIGHT: "then tight, inside the margin"}.get(
                c.verdict(t[1]).level, "fits"
            )
            options.append(
                f"--no-mmproj-offload moves the projector's {fmt_bytes(xp.part_bytes('mmproj'))} to RAM "
                f"({verdict}; images encode on the CPU)"
            )
    if cfg.draft:
        n_draft = xp.draft_plan.model.n_layer if xp.draft_plan is not None else 0
        start = n_draft + 1 if cfg.draft_gpu_layers == _ALL else cfg.draft_gpu_layers - 1
        for ngld in range(start, -1, -1):
            t = trial(_replace(cfg, draft_gpu_layers=ngld))
            if t is not None and c.fits(t[1]):
                if ngld != (n_draft + 1 if cfg.draft_gpu_layers == _ALL else cfg.draft_gpu_layers):
                    options.append(
                        f"-ngld {ngld} keeps {n_draft + 1 - ngld} of the draft's layers in RAM (fits{spec_text(t[0])})"
                    )
                break
        t = trial(_replace(cfg, draft=None))
        if t is not None:
            plain = f", decode {c.speed.decode_tok_s:.1f} tok/s" if c.speed is not None else ""
            level = {DOES_NOT_FIT: "still does not fit", TIGHT: "then tight, inside the margin"}.get(
                c.verdict(t[1]).level, "fits"
            )
            options.append(f"without -md frees {fmt_bytes(xp.part_bytes('draft'))} ({level}{plain})")
    if not options:
        options.append("drop the projector, draft or LoRA, or give them another device")
    return [
        _adv(
            "extras-over",
            "warning",
            f"The projector, draft model and LoRA adapters add {fmt_bytes(sum(d.extras_bytes for d in bad))} on {devs}, "
            "which is then over its limit: " + "; ".join(options) + ".",
            "llama-server loads them beside the model (projector: tools/mtmd/clip.cpp; draft: "
            "common/speculative.cpp; LoRA: src/llama-adapter.cpp): their memory counts in each device's total",
            {},
        )
    ]


_RULES = (
    _rule_vram_oom,
    _rule_ram_oom,
    _rule_fragmentation,
    _rule_swap,
    _rule_abandon,
    _rule_v_needs_fa,
    _rule_kv_slow_path,
    _rule_ctx_train,
    _rule_first_layer_host,
    _rule_mha,
    _rule_parallel,
    _rule_kv_quality,
    _rule_kv_not_applied,
    _rule_other_processes,
    _rule_offload_knee,
    _rule_fit_off,
    _rule_mmap_host_weights,
    _rule_extras,
)


def advise(
    plan: MemoryPlan,
    speed: SpeedPrediction | None = None,
    *,
    live: LiveState | None = None,
    settings: AdvisorSettings | None = None,
) -> list[Advice]:
    """Advice for ``plan``: errors first, then warnings, then info (rule order within).

    ``speed`` enables the speed rules (below-abandon-threshold, offload-knee, the gain in
    first-layer-on-host); ``live`` the measured variants. Pure arithmetic plus a few re-plans
    (milliseconds).

    Raises:
        AdvisorError: ``settings`` or ``live`` is not of the right type.
    """
    s = settings or AdvisorSettings()
    if not isinstance(s, AdvisorSettings):
        raise AdvisorError(f"settings must be an AdvisorSettings, not {type(s).__name__}")
    if live is not None and not isinstance(live, LiveState):
        raise AdvisorError(f"live must be a LiveState, not {type(live).__name__}")
    c = _Ctx(plan, speed, live, s)
    out: list[Advice] = []
    for rule in _RULES:
        out.extend(rule(c))
    return sorted(out, key=lambda a: SEVERITIES.index(a.severity))


def should_auto_stop(live: LiveState | None, settings: AdvisorSettings | None = None) -> bool:
    """True when the user enabled auto-stop and measured decode has stayed under the abandon
    line for ``live_window_s`` (10 s)."""
    s = settings or AdvisorSettings()
    return bool(
        s.auto_stop_below_abandon
        and live is not None
        and live.decode_tok_s is not None
        and live.decode_tok_s < s.abandon_tok_s
        and live.below_abandon_s >= s.live_window_s
    )
