"""The tuner: the fastest llama.cpp configuration that fits, for a goal the user states.

Goals (:class:`TuneGoal`): ``n_ctx`` ("this context at the best speed", ``--ctx``),
``n_ctx_min`` ("the best speed with at least this context", ``--ctx-min``; the chosen
configuration then gets the longest context that still fits) or ``min_tok_s`` ("the longest
context at >= this decode speed", ``--min-tok-s``).

Constraint: the planner (:func:`kvtuner.core.plan.memory_plan.plan_memory`): every GPU's total
within its capacity minus :data:`VRAM_MARGIN_BYTES`, the host's total within
``(1 - RAM_HEADROOM_FRACTION)`` of the available RAM (no swap). Ranking: the speed model's
decode tokens/s at the user's full context (:func:`kvtuner.core.speed.speed_model.decode_tok_s`
at depth ``n_ctx_seq - 1``), then prefill tokens/s among those within :data:`DECODE_TIE` of the
best decode.

Knobs searched:

- categorical (:func:`kv_type_pairs`, ``flash_attn``, ``n_ubatch``: :data:`UBATCH_CHOICES`, and for
  a MoE model with a GPU :data:`UBATCH_CHOICES_HOST_EXPERTS` too): every combination, in the
  order of its upper bound (the predicted decode with every layer and all KV on the GPUs,
  fitting or not); a combination whose upper bound is below the best found is skipped;
- integer, monotone in memory (:data:`INT_KNOBS`): ``n_gpu_layers``, ``n_cpu_moe`` (MoE models),
  ``n_cpu_ffn`` (dense models: ``--n-cpu-ffn``, the dense FFN weights of the first N layers in
  RAM while their attention and KV stay in VRAM), then ``kv_gpu_layers``; ``n_cpu_moe`` and
  ``n_cpu_ffn`` only with every layer offloaded (weights go to RAM in parts before whole layers
  do, the order of llama.cpp's ``--fit`` for experts);
  each is a "GPU share" ``g`` from 0 to ``hi``: GPU memory grows with ``g``, host memory falls.
  The last knob is binary searched for the largest ``g`` whose plan fits the GPUs; the one just
  before it (``n_cpu_ffn`` / ``n_cpu_moe``) climbs from the largest ``g`` that still fits with the
  last at its top (:meth:`_Searcher._climb_start`); ``n_gpu_layers`` is sampled on a grid and
  refined around the best sample (:meth:`_Searcher.frontier`). A value whose speed with every
  knob after it at its top (an upper bound: decode falls as bytes move to the host) cannot beat
  the best found, or the ``--min-tok-s`` target, is not searched, nor any value below it.
  **Adding a knob**: append one :class:`IntKnob` to :data:`INT_KNOBS` with its range and its
  value mapping (as ``n_cpu_moe = n_layer - g``); nothing else changes.

``tune(..., exhaustive=True)`` is the reference: every categorical combination x every value of every
integer knob, planned and predicted; ``benchmarks/tune_quality.py`` and the tests compare the two.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..hardware.specs import GpuSpec, HostSpec
from ..model.ggml_types import kv_type
from ..model.profile import ModelProfile
from ..plan.build_rules import VENDORED, BuildRules
from ..plan.config import ALL_LAYERS, ConfigError, PlanConfig
from ..plan.llama_constants import CTX_PAD_CELLS, pad_ctx
from ..plan.memory_plan import MemoryPlan, plan_memory
from ..plan.verdict import FIT_TARGET_MIB, RAM_HEADROOM_FRACTION, FitMargins, FitVerdict, fit_verdict
from ..speed.speed_model import SpeedInputs, SpeedModelError, decode_tok_s, prefill_tok_s
from ..units import GiB, MiB
from .bisection import largest_true

#: VRAM kept free per GPU and host RAM kept free: the fit verdict's defaults
#: (:class:`~kvtuner.core.plan.verdict.FitMargins`: llama.cpp's ``--fit-target`` 1024 MiB, 20 % of
#: the available RAM). A tuned configuration is one the verdict calls ``fits``.
VRAM_MARGIN_BYTES = FIT_TARGET_MIB * MiB
#: KV cache types from best to worst quality; ``--kv-quality T`` allows T and everything before it.
#: Evidence (llama.cpp PR #7412, "CUDA: quantized KV cache demo", JohannesGaessler's table for
#: LLaMA 3 8B on wikitext-2): q8_0 K + q8_0 V costs KL divergence 0.00098 against 0.00019 for f16
#: KV (dPPL +0.005 +- 0.001), less than quantizing the weights themselves to q8_0 (KLD 0.00136,
#: llama.cpp PR #6936); q4_0 KV is coarser still, and errors of quantized KV grow with context
#: (ik_llama.cpp PR #1547) and hit some model classes hard (attention-sink models,
#: TheTom/llama-cpp-turboquant issue #305): q4_0 is opt-in, q8_0 the default floor.
KV_QUALITY_ORDER = ("f16", "q8_0", "q4_0")
#: What each KV quality level costs, one line each with its source (the evidence above).
KV_QUALITY_NOTES = {
    "f16": "f16 KV: llama.cpp's default, the reference",
    "q8_0": "q8_0 KV: KL divergence 0.00098 against 0.00019 for f16 KV on LLaMA 3 8B, less than q8_0 weights "
    "(llama.cpp PR #7412)",
    "q4_0": "q4_0 KV: coarser; its errors grow with the context (ik_llama.cpp PR #1547) and hit some model classes "
    "hard (attention-sink models)",
}
DEFAULT_KV_QUALITY = "q8_0"
#: Decode speeds within this fraction of the best count as a tie, broken by prefill speed.
DECODE_TIE = 0.01
#: Physical batch sizes tried, largest first (llama.cpp's default 512; smaller ones shrink the
#: compute buffer, llama-context.cpp ``graph_reserve`` sizes it by n_ubatch).
UBATCH_CHOICES = (512, 256, 128)
#: Physical batch sizes also tried for a MoE model with a GPU, whose experts may live in RAM
#: (``--n-cpu-moe``): a ubatch of at least :data:`~kvtuner.core.plan.llama_constants.OFFLOAD_MIN_BATCH` rows runs the host
#: experts' matmuls on the GPU (ggml-cuda.cu ``ggml_backend_cuda_device_offload_op``), and the
#: scheduler copies those host weights over PCIe once per ubatch (ggml-backend.cpp
#: ``ggml_backend_sched_compute_splits``), so a larger ``-ub`` divides that copy among more prompt
#: tokens: prefill grows several-fold from ``-ub 512`` to ``-ub 4096`` in public llama-bench
#: sweeps. ``-b`` is raised with it (llama-context.cpp: ``n_ubatch = min(n_batch, n_ubatch)``).
UBATCH_CHOICES_HOST_EXPERTS = (4096, 2048, 1024)
#: Prompt length of the prefill ranking where those are searched (tokens): one ubatch of the largest.
LONG_PREFILL_TOKENS = 4096
#: Grid points of a sampled (non-last) integer knob before refinement.
GRID_POINTS = 9
#: Context granularity of the ``min_tok_s`` search (tokens; a multiple of llama.cpp's padding,
#: :data:`~kvtuner.core.plan.llama_constants.CTX_PAD_CELLS`).
CTX_STEP = 1024


class TuneError(ValueError):
    """A goal that cannot be searched; the message says what to change."""


@dataclass(frozen=True)
class TuneGoal:
    """What the user asks for (exactly one of ``n_ctx``, ``n_ctx_min``, ``min_tok_s``).

    Attributes:
        n_ctx: this context (tokens) at the best decode speed.
        n_ctx_min: at least this context (tokens), best decode speed at it; the result is then
            given the longest context its configuration fits.
        min_tok_s: the longest context whose full-context decode is at least this (tokens/s).
        kv_quality: the worst KV cache type allowed (:data:`KV_QUALITY_ORDER`).
        vram_margin_bytes: VRAM kept free per GPU (bytes).
        ram_headroom_fraction: share of the available RAM kept free (0..1).
        ubatch_choices: ``n_ubatch`` values tried.
        max_ctx: upper end of the ``min_tok_s`` search (tokens; None: the model's training
            context, else 131072).
    """

    n_ctx: int | None = None
    n_ctx_min: int | None = None
    min_tok_s: float | None = None
    kv_quality: str = DEFAULT_KV_QUALITY
    vram_margin_bytes: int = VRAM_MARGIN_BYTES
    ram_headroom_fraction: float = RAM_HEADROOM_FRACTION
    ubatch_choices: tuple[int, ...] = UBATCH_CHOICES
    max_ctx: int | None = None

    def __post_init__(self) -> None:
        given = [
            n
            for n, v in (("--ctx", self.n_ctx), ("--ctx-min", self.n_ctx_min), ("--min-tok-s", self.min_tok_s))
            if v is not None
        ]
        if len(given) != 1:
            raise TuneError(
                "give exactly one goal: --ctx N, --ctx-min N or --min-tok-s X"
                + (f" (got {', '.join(given)})" if given else "")
            )
        for name, v in (("--ctx", self.n_ctx), ("--ctx-min", self.n_ctx_min)):
            if v is not None and (not isinstance(v, int) or v < CTX_PAD_CELLS):
                raise TuneError(f"{name} must be a number of tokens of at least {CTX_PAD_CELLS}, not {v}")
        if self.min_tok_s is not None and not (math.isfinite(self.min_tok_s) and self.min_tok_s > 0):
            raise TuneError(f"--min-tok-s must be a positive number of tokens/s, not {self.min_tok_s}")
        if self.kv_quality not in KV_QUALITY_ORDER:
            raise TuneError(f"--kv-quality must be one of {', '.join(KV_QUALITY_ORDER)}, not '{self.kv_quality}'")
        if self.vram_margin_bytes < 0 or not 0 <= self.ram_headroom_fraction < 1:
            raise TuneError("the memory margins must be >= 0 (RAM headroom a fraction below 1)")
        if not self.ubatch_choices or any(u < 1 for u in self.ubatch_choices):
            raise TuneError("n_ubatch choices must be positive numbers of tokens")

    @property
    def margins(self) -> FitMargins:
        """The goal's margins as the fit verdict takes them."""
        return FitMargins(self.vram_margin_bytes, self.ram_headroom_fraction)

    @property
    def kind(self) -> str:
        """``"ctx"``, ``"ctx_min"`` or ``"min_tok_s"``."""
        return "ctx" if self.n_ctx is not None else ("ctx_min" if self.n_ctx_min is not None else "min_tok_s")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the goal."""
        return {
            "kind": self.kind,
            "n_ctx": self.n_ctx,
            "n_ctx_min": self.n_ctx_min,
            "min_tok_s": self.min_tok_s,
            "kv_quality": self.kv_quality,
            "vram_margin_bytes": self.vram_margin_bytes,
            "ram_headroom_fraction": self.ram_headroom_fraction,
        }


@dataclass(frozen=True)
class Candidate:
    """One planned and predicted configuration.

    Attributes:
        config: the configuration.
        plan: its memory plan.
        fits: within every device's limit (capacity less margin).
        decode_tok_s: predicted decode tokens/s at the full context (depth ``n_ctx_seq - 1``).
        prefill_tok_s: predicted prefill tokens/s of a ``prefill_tokens`` prompt at depth 0 (None:
            not computed, only the top candidates get it).
        prefill_tokens: that prompt's length: 512, or :data:`LONG_PREFILL_TOKENS` where larger
            ubatches are searched (a 512-token prompt fills one ubatch of any size above 512).
        measured_decode_tok_s, measured_prefill_tok_s: a real load's figures, when confirmed.
    """

    config: PlanConfig
    plan: MemoryPlan = field(repr=False, compare=False)
    fits: bool
    decode_tok_s: float
    prefill_tok_s: float | None = None
    measured_decode_tok_s: float | None = None
    measured_prefill_tok_s: float | None = None
    prefill_tokens: int = 512

    def summary(self) -> dict[str, Any]:
        """The plan in a few figures: bytes per device, KV placement."""
        p = self.plan
        return {
            "n_ctx": p.n_ctx,
            "n_gpu_layers": p.n_gpu_layers,
            "kv_gpu_layers": p.kv_gpu_layers,
            "n_layer": p.model.n_layer,
            "kv_bytes": p.kv_bytes,
            "devices": [
                {
                    "device": d.device,
                    "backend_device": d.backend_device,
                    "total_bytes": d.total_bytes,
                    "capacity_bytes": d.capacity_bytes,
                    "kv_bytes": d.kv_bytes,
                    "weights_bytes": d.weights_bytes,
                }
                for d in p.devices
            ],
        }

    def to_dict(self) -> dict[str, Any]:
        """``{config, plan, fits, predicted: {decode_tok_s, prefill_tok_s}, measured}`` (JSON-able)."""
        measured = None
        if self.measured_decode_tok_s is not None or self.measured_prefill_tok_s is not None:
            measured = {"decode_tok_s": self.measured_decode_tok_s, "prefill_tok_s": self.measured_prefill_tok_s}
        return {
            "config": self.config.to_dict(),
            "plan": self.summary(),
            "fits": self.fits,
            "predicted": {
                "decode_tok_s_at_full_ctx": self.decode_tok_s,
                "prefill_tok_s": self.prefill_tok_s,
                "prefill_tokens": self.prefill_tokens,
            },
            "measured": measured,
        }


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` found.

    Attributes:
        goal: the goal.
        best: the chosen candidate (None: nothing fits).
        runner_up: the best candidate of another KV type / flash attention combination (else
            the second best), None if there is none.
        fit_equivalent: what llama.cpp's ``--fit`` would run (:func:`fit_equivalent`), planned
            and predicted the same way; None when not even that fits.
        candidates_evaluated: plans made (each also predicted when it fit the GPUs).
        elapsed_s: wall time of the search (s).
        top: the best candidate of each categorical combination, best first (for the knee chart).
        notes: one line per remark (why nothing fits, what was approximated).
    """

    goal: TuneGoal
    best: Candidate | None
    runner_up: Candidate | None
    fit_equivalent: Candidate | None
    candidates_evaluated: int
    elapsed_s: float
    top: tuple[Candidate, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``kvtuner tune --json`` document (schema ``kvtuner.tune/1``, docs/reference/tune-json.md)."""
        return {
            "schema": "kvtuner.tune/1",
            "goal": self.goal.to_dict(),
            "best": self.best.to_dict() if self.best else None,
            "runner_up": self.runner_up.to_dict() if self.runner_up else None,
            "fit_equivalent": self.fit_equivalent.to_dict() if self.fit_equivalent else None,
            "candidates_evaluated": self.candidates_evaluated,
            "elapsed_s": self.elapsed_s,
            "notes": list(self.notes),
        }


# ------------------------------------------------------------------------------------------
# knobs


@dataclass(frozen=True)
class IntKnob:
    """An integer knob whose GPU memory grows and host memory falls with its "GPU share" ``g``.

    Attributes:
        name: for messages.
        hi: ``hi(model, config, gpus) -> int``, the largest ``g`` (0 is the smallest).
        apply: ``apply(config, g, hi) -> PlanConfig``, the configuration with this knob at ``g``.
    """

    name: str
    hi: Callable[[ModelProfile, PlanConfig], int]
    apply: Callable[[PlanConfig, int, int], PlanConfig]


def _ngl_hi(model: ModelProfile, cfg: PlanConfig) -> int:
    return model.n_layer + 1


def _ngl_apply(cfg: PlanConfig, g: int, hi: int) -> PlanConfig:
    return cfg.with_(n_gpu_layers=ALL_LAYERS if g >= hi else g)


def _kvgl_hi(model: ModelProfile, cfg: PlanConfig) -> int:
    # the offloaded repeating layers (llama-model.cpp: the output layer is offloaded first)
    ngl = model.n_layer + 1 if cfg.n_gpu_layers == ALL_LAYERS else cfg.n_gpu_layers
    return max(0, min(ngl, model.n_layer + 1) - 1) if ngl <= model.n_layer else model.n_layer


def _kvgl_apply(cfg: PlanConfig, g: int, hi: int) -> PlanConfig:
    return cfg.with_(kv_gpu_layers=None if g >= hi else g)


def _moe_hi(model: ModelProfile, cfg: PlanConfig) -> int:
    # MoE models with every layer offloaded only: the layers whose experts may stay in RAM
    # (llama.cpp's --n-cpu-moe N puts the experts of layers 0..N-1 on the CPU). With fewer
    # layers offloaded it has one value, 0: experts go to RAM before whole layers do (the order of
    # llama.cpp's own --fit, llama_params_fit_impl), which keeps the search under a second
    return model.n_layer if model.n_expert and cfg.n_gpu_layers == ALL_LAYERS else 0


def _moe_apply(cfg: PlanConfig, g: int, hi: int) -> PlanConfig:
    return cfg.with_(n_cpu_moe=hi - g, cpu_moe=False)


def _ffn_hi(model: ModelProfile, cfg: PlanConfig) -> int:
    # dense models with every layer offloaded only: the layers whose dense FFN weights may stay in
    # RAM (llama.cpp's --n-cpu-ffn N: one override blk\.i\.ffn_(up|down|gate)\.=CPU per layer
    # i < N, common/common.h llm_add_n_cpu_ffn_overrides with LLM_FFN_DENSE_REGEX); attention and
    # the KV cache of those layers stay in VRAM. With fewer layers offloaded it has one value, 0,
    # as n_cpu_moe (a layer on the CPU already has its FFN there); MoE models keep n_cpu_moe
    return model.n_layer if not model.n_expert and cfg.n_gpu_layers == ALL_LAYERS else 0


def _ffn_apply(cfg: PlanConfig, g: int, hi: int) -> PlanConfig:
    return cfg.with_(n_cpu_ffn=hi - g)


#: The integer knobs, outermost first; the last is binary searched. ``n_cpu_moe`` is
#: searched as its GPU share ``n_layer - n_cpu_moe``: more layers' experts in VRAM, less in RAM;
#: ``n_cpu_ffn`` (dense models) likewise as ``n_layer - n_cpu_ffn``. ``n_gpu_layers`` stays first
#: (:func:`fit_equivalent` searches it alone).
INT_KNOBS: tuple[IntKnob, ...] = (
    IntKnob("n_gpu_layers", _ngl_hi, _ngl_apply),
    IntKnob("n_cpu_moe", _moe_hi, _moe_apply),
    IntKnob("n_cpu_ffn", _ffn_hi, _ffn_apply),
    IntKnob("kv_gpu_layers", _kvgl_hi, _kvgl_apply),
)


def kv_type_pairs(model: ModelProfile, quality: str, *, gpu: bool) -> list[tuple[str, str]]:
    """(type_k, type_v) pairs allowed by the quality floor, best quality first.

    K and V differ only without a GPU: CUDA builds flash-attention kernels for matching K/V
    types only (ggml-cuda/fattn.cu; other pairs need GGML_CUDA_FA_ALL_QUANTS, else the op runs
    on the CPU), and with head size 256 only f16 (the advisor's ``kv-type-slow-path`` rule).
    Types whose block does not divide the rows are dropped (llama-kv-cache.cpp refuses them).
    """
    allowed = KV_QUALITY_ORDER[: KV_QUALITY_ORDER.index(quality) + 1]
    layers = model.structure.kv_layers or ()
    heads = {model.head_dim_k_at(l.il) for l in layers}
    heads_v = {model.head_dim_v_at(l.il) for l in layers}

    def fits(t: str, dims: set[int]) -> bool:
        return all(kv_type(t).divides(d) for d in dims)

    pairs = []
    for k in allowed:
        for v in allowed:
            if not (fits(k, heads) and fits(v, heads_v)):
                continue
            if gpu and k != v:
                continue
            if gpu and 256 in heads and (k != "f16" or v != "f16"):
                continue
            pairs.append((k, v))
    return pairs


# ------------------------------------------------------------------------------------------
# the search


class _Searcher:
    """Plans, fit checks and predictions of one model on one machine, with a plan cache."""

    def __init__(
        self,
        model: ModelProfile,
        base: PlanConfig,
        gpus: Sequence[GpuSpec],
        host: HostSpec | None,
        inputs: SpeedInputs,
        goal: TuneGoal,
        rules: BuildRules = VENDORED,
    ):
        self.model, self.base, self.gpus, self.host, self.inputs, self.goal = (
            model,
            base,
            tuple(gpus),
            host,
            inputs,
            goal,
        )
        self.margins = goal.margins
        self.rules = rules
        self.evaluated = 0
        self._plans: dict[PlanConfig, MemoryPlan | None] = {}
        self._decode: dict[PlanConfig, float] = {}
        self.hints: dict[tuple[str, str, str], tuple[int, ...]] = {}
        #: decode speed (tokens/s) below which a value is not worth searching: the target of a
        #: yes/no question (:meth:`at_ctx` with ``target``), else 0
        self.floor = 0.0

    def plan(self, cfg: PlanConfig) -> MemoryPlan | None:
        if cfg not in self._plans:
            self.evaluated += 1
            try:
                self._plans[cfg] = plan_memory(self.model, cfg, self.gpus, self.host, rules=self.rules)
            except ConfigError:
                self._plans[cfg] = None
        return self._plans[cfg]

    def verdict(self, p: MemoryPlan) -> FitVerdict:
        """The one fit verdict (:func:`~kvtuner.core.plan.verdict.fit_verdict`) with the goal's margins."""
        return fit_verdict(p, self.margins)

    def vram_ok(self, p: MemoryPlan) -> bool:
        return self.verdict(p).gpu_fits

    def fits(self, p: MemoryPlan) -> bool:
        return self.verdict(p).fits

    def decode(self, cfg: PlanConfig, p: MemoryPlan) -> float:
        if cfg not in self._decode:
            try:
                self._decode[cfg] = decode_tok_s(p, self.inputs, p.n_ctx_seq - 1)
            except SpeedModelError:
                self._decode[cfg] = 0.0
        return self._decode[cfg]

    def candidate(self, cfg: PlanConfig) -> Candidate | None:
        p = self.plan(cfg)
        if p is None:
            return None
        return Candidate(cfg, p, self.fits(p), self.decode(cfg, p))

    def with_prefill(self, c: Candidate) -> Candidate:
        if c.prefill_tok_s is not None:
            return c
        n_prompt = LONG_PREFILL_TOKENS if max(self.ubatch_choices()) > 512 else 512
        n_prompt = max(1, min(n_prompt, c.plan.n_ctx_seq))
        try:
            pre = prefill_tok_s(c.plan, self.inputs, n_prompt, 0)
        except SpeedModelError:
            pre = 0.0
        return replace(c, prefill_tok_s=pre, prefill_tokens=n_prompt)

    # -- categorical combinations ---------------------------------------------------------------

    def ubatch_choices(self) -> list[int]:
        """``n_ubatch`` values searched, largest first: the goal's, and for a MoE model with a GPU
        also :data:`UBATCH_CHOICES_HOST_EXPERTS` (its experts may end in RAM, where prefill
        depends on the ubatch)."""
        choices = set(self.goal.ubatch_choices)
        if self.gpus and self.model.n_expert > 0 and self.goal.ubatch_choices == UBATCH_CHOICES:
            choices |= set(UBATCH_CHOICES_HOST_EXPERTS)
        return sorted(choices, reverse=True)

    def combos(self, n_ctx: int) -> list[PlanConfig]:
        pairs = kv_type_pairs(self.model, self.goal.kv_quality, gpu=bool(self.gpus))
        out = []
        for k, v in pairs:
            for fa in ("on", "off"):
                if fa == "off" and kv_type(v).is_quantized:
                    continue  # a quantized V cache requires flash attention (llama-context.cpp)
                for ub in self.ubatch_choices():
                    try:
                        out.append(
                            self.base.with_(
                                n_ctx=n_ctx,
                                type_k=k,
                                type_v=v,
                                flash_attn=fa,
                                n_ubatch=ub,
                                n_batch=max(self.base.n_batch, ub),
                                n_gpu_layers=ALL_LAYERS,
                                kv_gpu_layers=None,
                                n_cpu_moe=0,
                                cpu_moe=False,
                                n_cpu_ffn=0,
                            )
                        )
                    except ConfigError:
                        continue
        return out

    # -- integer knobs ----------------------------------------------------------------------------

    def _last_knob_max(
        self, cfg: PlanConfig, knob: IntKnob, hint: int | None = None
    ) -> tuple[Candidate | None, tuple[int, ...]]:
        """The largest value of the last knob whose plan fits the GPUs (GPU memory is monotone in
        it: binary search, or with a ``hint`` a galloping search outwards from it), as a fitting
        candidate; None when none fits."""
        hi = knob.hi(self.model, cfg)

        def ok(g: int) -> bool:
            p = self.plan(knob.apply(cfg, g, hi))
            return p is not None and self.vram_ok(p)

        best = _largest_true(ok, hi, hint)
        if best is None:
            return None, ()
        c = self.candidate(knob.apply(cfg, best, hi))
        return (c if c is not None and c.fits else None), (best,)

    def _climb_start(
        self, cfg: PlanConfig, knob: IntKnob, hi: int, rest: Sequence[IntKnob], guess: int | None = None
    ) -> tuple[int, ...]:
        """Where the search of ``knob`` starts: the largest ``g`` whose plan fits the GPUs with
        every knob of ``rest`` at its top (binary search, galloping from ``guess`` when given;
        GPU memory grows with ``g``), and those tops as the hint of ``rest``; ``(0,)`` when none
        fits. Below that ``g`` every value fits with ``rest`` at its top and is slower (less on
        the GPUs; the speed model's decode falls as bytes move to the host), so the fastest
        value is there or above it, where the knobs after it have to give way."""

        def ok(g: int) -> bool:
            p = self.plan(_at_top(self.model, knob.apply(cfg, g, hi), rest))
            return p is not None and self.vram_ok(p)

        lo = _largest_true(ok, hi, guess if guess is not None and 0 < guess <= hi else None)
        if lo is None:
            return (0,)
        c, tops = knob.apply(cfg, lo, hi), []
        for k in rest:
            tops.append(k.hi(self.model, c))
            c = k.apply(c, tops[-1], tops[-1])
        return (lo, *tops)

    def _beaten(self, cfg: PlanConfig, rest: Sequence[IntKnob], best: float) -> bool:
        """Whether no value of ``rest`` from ``cfg`` can beat ``best`` (tokens/s): the speed with
        every knob of ``rest`` at its top, fitting or not, is an upper bound (decode falls as
        bytes move to the host)."""
        c = self.candidate(_at_top(self.model, cfg, rest))
        return c is not None and c.decode_tok_s <= best

    def frontier(
        self, cfg: PlanConfig, knobs: Sequence[IntKnob] = INT_KNOBS, hint: tuple[int, ...] | None = None
    ) -> tuple[Candidate | None, tuple[int, ...]]:
        """The fastest fitting candidate over ``knobs`` from ``cfg``, and the knob values (``g``)
        that gave it. The last knob goes to its largest fitting value; the one just before it
        climbs from :meth:`_climb_start`, one step at a time while the speed rises; the others are
        sampled on a :data:`GRID_POINTS` grid, then refined by halving the step around the best
        sample (speed along the frontier is taken unimodal; ``tune(..., exhaustive=True)`` checks
        that). Values that cannot beat the best found (:meth:`_beaten`) are skipped.
        ``hint``: the values found for a neighbouring combination (another ``n_ubatch``): the
        search then only climbs from there, one step at a time."""
        if not knobs:
            c = self.candidate(cfg)
            return (c if c is not None and c.fits else None), ()
        if len(knobs) == 1:
            return self._last_knob_max(cfg, knobs[0], hint[0] if hint else None)
        knob, rest = knobs[0], knobs[1:]
        hi = knob.hi(self.model, cfg)
        results: dict[int, tuple[Candidate | None, tuple[int, ...]]] = {}

        beaten_at = [-1]  # values at or below this one cannot beat the best (speed falls with g)

        def at(g: int) -> None:
            g = max(0, min(hi, g))
            if g not in results:
                c = knob.apply(cfg, g, hi)
                best = max([score(k) for k in results] + [self.floor])
                if g <= beaten_at[0] or (best > 0 and self._beaten(c, rest, best)):
                    results[g] = (None, ())  # cannot beat a value already found
                    beaten_at[0] = max(beaten_at[0], g)
                else:
                    results[g] = self.frontier(c, rest, hint[1:] if hint else None)

        def score(g: int) -> float:
            c = results[g][0]
            return c.decode_tok_s if c is not None else -1.0

        def best_g() -> int:
            return max(results, key=lambda g: (score(g), g))

        if len(rest) == 1:
            # climb from where the last knob stops fitting at its top (a hint, from another
            # n_ubatch or context, only guesses where that is: climbing from a stale value can
            # stop on a step of the last knob's staircase)
            hint = self._climb_start(cfg, knob, hi, rest, hint[0] if hint else None)
        if hint:
            g = max(0, min(hi, hint[0]))
            at(g)
            for direction in (1, -1):
                while 0 <= g + direction <= hi:
                    at(g + direction)
                    if score(g + direction) <= score(g):
                        break
                    g += direction
        else:
            step = max(1, math.ceil(hi / (GRID_POINTS - 1)))
            for g in range(hi, -1, -step):
                at(g)
            at(0)
            while step > 1:
                step = max(1, step // 2)
                b = best_g()
                for g in (b - step, b + step):
                    if 0 <= g <= hi:
                        at(g)
        b = best_g()
        c, sub = results[b]
        return c, (b, *sub)

    # -- one context ------------------------------------------------------------------------------

    def at_ctx(self, n_ctx: int, exhaustive: bool = False, target: float | None = None) -> list[Candidate]:
        """Best fitting candidate of each categorical combination at ``n_ctx``, best first.
        ``target`` (tokens/s): stop at the first candidate that reaches it (a yes/no question)."""
        found: list[Candidate] = []
        combos = self.combos(n_ctx)
        if not self.gpus:
            for cfg in combos:
                c = self.candidate(cfg)
                if c is not None and c.fits:
                    found.append(c)
            return _rank(self, found)
        if exhaustive:
            extra_ub = set(UBATCH_CHOICES_HOST_EXPERTS) - set(self.goal.ubatch_choices)
            for cfg in combos:
                best = None
                for c in self._all_int(cfg, INT_KNOBS):
                    if cfg.n_ubatch in extra_ub and not c.plan.host.expert_bytes:
                        continue  # as the fast search: the larger ubatches only with experts in RAM
                    if c.fits and (best is None or c.decode_tok_s > best.decode_tok_s):
                        best = c
                if best is not None:
                    found.append(best)
            return _rank(self, found)
        if target is not None:
            # a yes/no question on decode: the speed model's decode does not depend on n_ubatch
            # and a smaller n_ubatch only shrinks the compute buffers (llama-context.cpp
            # graph_reserve), so if the smallest one cannot reach the target none can
            ub_min = min(c.n_ubatch for c in combos) if combos else 0
            combos = [c for c in combos if c.n_ubatch == ub_min]
        # upper bound of each combination: everything on the GPUs, fitting or not
        bounds = []
        for cfg in combos:
            c = self.candidate(cfg)
            if c is not None:
                bounds.append((c.decode_tok_s, cfg, c))
        bounds.sort(key=lambda t: -t[0])
        # knob values found for another n_ubatch of the same combination; during the min_tok_s
        # context search also those found at the previous context (self.hints)
        hints: dict[tuple[str, str, str], tuple[int, ...]] = self.hints if target is not None else {}
        reached: dict[tuple[str, str, str], float] = {}
        self.floor = target * (1 - 1e-9) if target is not None else 0.0
        try:
            return self._search_combos(bounds, hints, reached, found, target)
        finally:
            self.floor = 0.0

    def _search_combos(
        self, bounds: list, hints: dict, reached: dict, found: list[Candidate], target: float | None
    ) -> list[Candidate]:
        """:meth:`at_ctx`'s search of the combinations, in the order of their upper bound."""
        best_decode = 0.0
        full_fit: set[tuple[str, str, str]] = set()
        extra_ub = set(UBATCH_CHOICES_HOST_EXPERTS) - set(self.goal.ubatch_choices)
        for ub_decode, cfg, top in bounds:
            key = (cfg.type_k, cfg.type_v, cfg.flash_attn)
            if ub_decode < best_decode * (1 - DECODE_TIE) or key in full_fit:
                continue
            if target is not None and ub_decode < target:
                continue  # cannot reach the target even with everything on the GPUs
            if cfg.n_ubatch in extra_ub and top.fits:
                continue  # no expert in RAM: the larger ubatches are searched for those only
            if top.fits:
                c = top
            else:
                c, at_g = self.frontier(cfg, hint=hints.get(key))
                if c is not None:
                    hints[key] = at_g
            if c is None or (cfg.n_ubatch in extra_ub and not c.plan.host.expert_bytes):
                continue
            reached[key] = max(reached.get(key, 0.0), c.decode_tok_s)
            if top.fits:
                full_fit.add(key)  # a smaller n_ubatch can only lose prefill speed
            found.append(c)
            best_decode = max(best_decode, c.decode_tok_s)
            if target is not None and best_decode >= target:
                break
        return _rank(self, found)

    def _all_int(self, cfg: PlanConfig, knobs: Sequence[IntKnob]) -> Iterable[Candidate]:
        if not knobs:
            p = self.plan(cfg)
            if p is not None and self.fits(p):
                yield Candidate(cfg, p, True, self.decode(cfg, p))
            return
        hi = knobs[0].hi(self.model, cfg)
        for g in range(hi + 1):
            yield from self._all_int(knobs[0].apply(cfg, g, hi), knobs[1:])


def _largest_true(ok: Callable[[int], bool], hi: int, guess: int | None = None) -> int | None:
    """The largest ``g`` in ``0..hi`` with ``ok(g)``, for an ``ok`` that holds up to some value and
    not above it (GPU memory is monotone in a knob's GPU share); None when ``ok(0)`` fails.
    With a ``guess`` (a neighbouring search's answer) it gallops outwards from there, doubling
    the step, then binary searches the last step; without one it tries ``hi``, then ``0``, then
    binary searches between them."""
    if guess is not None:
        h = max(0, min(hi, guess))
        if ok(h):  # gallop up to the first value that does not fit
            lo, step = h, 1
            while lo + step <= hi and ok(lo + step):
                lo, step = lo + step, step * 2
            top = min(hi, lo + step) - 1 if lo + step <= hi else hi
            lo_b, hi_b, best = lo + 1, top, lo
        elif h > 0 and not ok(0):
            return None  # not even the bottom fits
        else:  # gallop down to the first value that fits
            step, up = 1, h
            while up - step >= 0 and not ok(up - step):
                up, step = up - step, step * 2
            if up - step < 0:
                lo_b, hi_b, best = 0, up - 1, None
            else:
                lo_b, hi_b, best = up - step + 1, up - 1, up - step
    else:
        if ok(hi):
            return hi
        if hi == 0 or not ok(0):
            return None  # not even the bottom fits: no binary search
        lo_b, hi_b, best = 1, hi - 1, 0
    return largest_true(ok, lo_b, hi_b, default=best)


def _at_top(model: ModelProfile, cfg: PlanConfig, knobs: Sequence[IntKnob]) -> PlanConfig:
    """``cfg`` with every knob of ``knobs`` at its top (everything they place on the GPUs)."""
    for k in knobs:
        top = k.hi(model, cfg)
        cfg = k.apply(cfg, top, top)
    return cfg


def _rank(s: _Searcher, found: list[Candidate]) -> list[Candidate]:
    """Best first: decode at full context, prefill among those within :data:`DECODE_TIE`."""
    if not found:
        return []
    found = sorted(found, key=lambda c: -c.decode_tok_s)
    lead = found[0].decode_tok_s
    tied = [s.with_prefill(c) for c in found if c.decode_tok_s >= lead * (1 - DECODE_TIE)]
    tied.sort(key=lambda c: (-(c.prefill_tok_s or 0.0), -c.decode_tok_s))
    return tied + found[len(tied) :]


def ubatch_note(s: _Searcher, best: Candidate | None, top: Sequence[Candidate]) -> str | None:
    """When the best candidate keeps experts in RAM: the fastest-prefill candidate of another
    ``-ub`` among those searched (:data:`UBATCH_CHOICES_HOST_EXPERTS`), as one line with what it
    gains in prefill and costs in decode (its larger compute buffer takes VRAM the experts had);
    None when no other ubatch prefills at least 20 % faster."""
    if best is None or not best.plan.host.expert_bytes or not best.prefill_tok_s:
        return None
    others = [
        s.with_prefill(c)
        for c in top
        if c.config.n_ubatch != best.config.n_ubatch
        and c.plan.host.expert_bytes
        and c.decode_tok_s >= best.decode_tok_s * 0.5
    ]
    if not others:
        return None
    alt = max(others, key=lambda c: c.prefill_tok_s or 0.0)
    if (alt.prefill_tok_s or 0.0) < 1.2 * best.prefill_tok_s:
        return None
    cfg = alt.config
    moe = f" --n-cpu-moe {cfg.n_cpu_moe}" if cfg.n_cpu_moe else ""
    return (
        f"prefill: -ub {cfg.n_ubatch} -b {cfg.n_batch}{moe} prefills {alt.prefill_tok_s:.0f} tok/s instead of "
        f"{best.prefill_tok_s:.0f} and decodes {alt.decode_tok_s:.2f} instead of {best.decode_tok_s:.2f} tok/s "
        f"(each ubatch copies the experts in RAM to the GPU once: a larger one spreads that copy over more "
        f"tokens, and its compute buffer takes VRAM the experts had)"
    )


def _runner_up(top: list[Candidate]) -> Candidate | None:
    if len(top) < 2:
        return None
    b = top[0].config
    for c in top[1:]:
        if (c.config.type_k, c.config.type_v, c.config.flash_attn) != (b.type_k, b.type_v, b.flash_attn):
            return c
    return top[1]


def offload_note(c: Candidate) -> str | None:
    """What the candidate's ``--n-cpu-ffn`` / ``--n-cpu-moe`` trades, in one sentence (None when
    it has neither). The bytes are the tensors the overrides move to the host
    (:attr:`MemoryPlan.moves`, llama-model-loader.cpp ``create_tensor``); the speed model reads
    them over host memory bandwidth once per token (the CPU computes those FFNs), a cost that
    does not grow with the context, while KV in RAM is read in full at every token."""
    cfg = c.config
    gpus = {d.device for d in c.plan.gpus}
    moved = sum(b for _, _, to, b in c.plan.moves.moved if to not in gpus)
    size = f"{moved / GiB:.2f} GiB"
    if cfg.n_cpu_ffn:
        return (
            f"--n-cpu-ffn {cfg.n_cpu_ffn}: the dense FFN weights of the first {cfg.n_cpu_ffn} layers ({size}) stay "
            f"in RAM and the CPU reads them over host memory bandwidth at every token; attention and the KV cache "
            f"of every layer stay in VRAM, so that cost does not grow with the context as KV in RAM would"
        )
    if cfg.n_cpu_moe or cfg.cpu_moe:
        n = c.plan.model.n_layer if cfg.cpu_moe else cfg.n_cpu_moe
        return (
            f"--n-cpu-moe {n}: the MoE experts of the first {n} layers ({size}) stay in RAM; a token reads only the "
            f"experts it is routed to ({c.plan.model.n_expert_used} of {c.plan.model.n_expert}) there, on the CPU; "
            f"attention, the shared weights and the KV cache stay in VRAM"
        )
    return None


def fit_equivalent(
    model: ModelProfile,
    base: PlanConfig,
    n_ctx: int,
    gpus: Sequence[GpuSpec],
    host: HostSpec | None,
    inputs: SpeedInputs,
    *,
    vram_margin_bytes: int = VRAM_MARGIN_BYTES,
    ram_headroom_fraction: float = RAM_HEADROOM_FRACTION,
    rules: BuildRules = VENDORED,
) -> Candidate | None:
    """What llama.cpp's ``--fit`` would run for ``base`` at ``n_ctx``, planned by kvtuner (with the
    compute rules of ``rules``, :mod:`kvtuner.core.plan.build_rules`).

    The rules of src/llama.cpp ``llama_params_fit_impl`` (ggml-org/llama.cpp): nothing changes
    when every device keeps ``margin`` (``--fit-target``, 1024 MiB) free; the context is reduced
    only when the user left it to the model (``n_ctx == 0``), never when set, as here; then the
    user's KV types and flash attention stay and ``n_gpu_layers`` is lowered until the devices
    fit (KV follows its layers: ``offload_kqv``). For MoE models llama.cpp first moves expert
    tensors to the CPU (``ffn_*_exps`` overrides); this equivalent lowers ``n_gpu_layers`` there
    too, so its MoE result is pessimistic. Dense FFN weights (``--n-cpu-ffn``) are never moved
    by ``--fit`` for a dense model: common/fit.cpp (the vendored llama.cpp of llama-cpp-python
    0.3.36, ``common_params_fit_impl``) fills whole layers back to front and returns when
    ``hp_nex == 0``; its partial-layer patterns (``LAYER_FRACTION_ATTN/UP/GATE``, ``ffn_*`` of one
    layer) are used only in the MoE step. So the equivalent keeps every FFN with its layer.

    Returns:
        The candidate, or None when not even ``-ngl 0`` fits.
    """
    goal = TuneGoal(
        n_ctx=max(CTX_PAD_CELLS, n_ctx),
        vram_margin_bytes=vram_margin_bytes,
        ram_headroom_fraction=ram_headroom_fraction,
    )
    s = _Searcher(model, base, gpus, host, inputs, goal, rules)
    try:
        cfg = base.with_(n_ctx=n_ctx, kv_gpu_layers=None)
    except ConfigError:
        return None
    c = s.candidate(cfg)
    if c is None or c.fits or not gpus:
        return s.with_prefill(c) if c is not None and c.fits else None
    c, _ = s.frontier(cfg.with_(n_gpu_layers=ALL_LAYERS), INT_KNOBS[:1])
    return s.with_prefill(c) if c is not None else None


def tune(
    model: ModelProfile,
    base: PlanConfig,
    gpus: Sequence[GpuSpec],
    host: HostSpec | None,
    inputs: SpeedInputs,
    goal: TuneGoal,
    *,
    exhaustive: bool = False,
    with_fit: bool = True,
    rules: BuildRules = VENDORED,
) -> TuneResult:
    """Search for the fastest configuration that fits ``goal`` (module docstring).

    Args:
        model: the model (as planned: with its probed structure when there is one).
        base: the user's configuration: ``n_seq``, ``n_batch``, ``swa_full``, ``kv_unified``,
            ``use_mmap`` are kept; its KV types and flash attention are what ``--fit`` would keep.
        gpus, host: the hardware planned for.
        inputs: the speed model's inputs (calibrated for this machine where possible).
        goal: what to optimise.
        exhaustive: plan every value of every knob (the reference; slow).
        with_fit: also plan llama.cpp's ``--fit`` equivalent (:func:`fit_equivalent`).
        rules: the llama.cpp build and program the candidates are planned for
            (:mod:`kvtuner.core.plan.build_rules`).

    Returns:
        A :class:`TuneResult`; ``best`` None when nothing fits (``notes`` says why).

    Raises:
        TuneError: a goal this model cannot have (a context past llama.cpp's limit).
    """
    t0 = time.perf_counter()
    s = _Searcher(model, base, gpus, host, inputs, goal, rules)
    notes: list[str] = []
    ctx_train = model.n_ctx_train or 0
    if goal.min_tok_s is not None:  # goal.kind == "min_tok_s"
        top_ctx = goal.max_ctx or ctx_train or 131072
        lo, hi = 1, max(1, top_ctx // CTX_STEP)
        best_top: list[Candidate] = []
        ok = s.at_ctx(lo * CTX_STEP, exhaustive)
        if not ok or ok[0].decode_tok_s < goal.min_tok_s:
            small = s.at_ctx(CTX_PAD_CELLS, exhaustive)
            if small and small[0].decode_tok_s >= goal.min_tok_s:
                best_top = small
            notes.append(
                f"no configuration reaches {goal.min_tok_s:g} tok/s at {CTX_STEP} tokens"
                + (f"; shown at {CTX_PAD_CELLS} tokens" if best_top else "")
            )
        else:
            best_top = ok

            def reaches(k: int, target: float = goal.min_tok_s) -> bool:
                got = s.at_ctx(k * CTX_STEP, exhaustive, target=target)
                return bool(got) and max(c.decode_tok_s for c in got) >= target

            lo = largest_true(reaches, lo + 1, hi, default=lo) or lo
            if lo > 1:
                best_top = s.at_ctx(lo * CTX_STEP, exhaustive)
        n_ctx = best_top[0].config.n_ctx if best_top else CTX_STEP
        top = best_top
    else:
        n_ctx = goal.n_ctx if goal.n_ctx is not None else int(goal.n_ctx_min or 0)
        top = s.at_ctx(n_ctx, exhaustive)
        if top and goal.kind == "ctx_min":
            top = [_extend_ctx(s, top[0], ctx_train)] + top[1:]
    best = top[0] if top else None
    if best is None:
        notes.append(_why_nothing_fits(s, n_ctx))
    else:
        best = s.with_prefill(best)
    runner = _runner_up(top)
    if runner is not None:
        runner = s.with_prefill(runner)
    fit = (
        fit_equivalent(
            model,
            base,
            n_ctx,
            gpus,
            host,
            inputs,
            vram_margin_bytes=goal.vram_margin_bytes,
            ram_headroom_fraction=goal.ram_headroom_fraction,
            rules=rules,
        )
        if with_fit
        else None
    )
    if model.n_expert and gpus:
        notes.append(
            "MoE: llama.cpp's --fit would move experts to the CPU before layers; its figure here lowers "
            "-ngl only, so it is pessimistic"
        )
    ub_note = ubatch_note(s, best, top)
    if ub_note:
        notes.append(ub_note)
    return TuneResult(goal, best, runner, fit, s.evaluated, time.perf_counter() - t0, tuple(top), tuple(notes))


def _extend_ctx(s: _Searcher, c: Candidate, ctx_train: int) -> Candidate:
    """``c`` with the longest context (a multiple of llama.cpp's padding, up to the training
    context) that still fits with the same knobs (memory is monotone in n_ctx: binary search)."""
    top = max(c.config.n_ctx, ctx_train or c.config.n_ctx)
    found: dict[int, Candidate] = {}

    def fits(k: int) -> bool:
        cand = s.candidate(c.config.with_(n_ctx=k * CTX_PAD_CELLS))
        if cand is not None and cand.fits:
            found[k] = cand
            return True
        return False

    k = largest_true(fits, c.config.n_ctx // CTX_PAD_CELLS + 1, top // CTX_PAD_CELLS)
    return c if k is None else found[k]


def _why_nothing_fits(s: _Searcher, n_ctx: int) -> str:
    cfg = s.base.with_(
        n_ctx=n_ctx,
        n_gpu_layers=0 if s.gpus else s.base.n_gpu_layers,
        kv_gpu_layers=None,
        type_k=s.goal.kv_quality,
        type_v=s.goal.kv_quality,
        flash_attn="on",
    )
    p = s.plan(cfg)
    if p is None:
        return f"nothing can be planned at {n_ctx} tokens"
    hv = s.verdict(p).at_device("host")
    if hv is None or hv.limit_bytes is None:
        return f"nothing fits at {n_ctx} tokens; lower the context, allow --kv-quality q4_0, or plan a larger card"
    return (
        f"nothing fits at {n_ctx} tokens: even with {s.goal.kv_quality} KV the host needs "
        f"{hv.need_bytes / GiB:.2f} GiB of the {hv.limit_bytes / GiB:.2f} GiB allowed and the GPUs hold no more; "
        f"lower the context, allow --kv-quality q4_0, or plan a larger card"
    )


@dataclass(frozen=True)
class KneeCurve:
    """Predicted decode at full context against context length, for one configuration's knobs.

    Attributes:
        config: the configuration (its ``n_ctx`` is the chosen point).
        points: ``(n_ctx, decode_tok_s, fits)`` from small to large contexts.
        max_fit_ctx: the longest context that fits with these knobs (tokens; 0: none).
    """

    config: PlanConfig
    points: tuple[tuple[int, float, bool], ...]
    max_fit_ctx: int


def knee_curves(
    model: ModelProfile,
    configs: Sequence[PlanConfig],
    gpus: Sequence[GpuSpec],
    host: HostSpec | None,
    inputs: SpeedInputs,
    *,
    max_ctx: int | None = None,
    n_points: int = 16,
    vram_margin_bytes: int = VRAM_MARGIN_BYTES,
    ram_headroom_fraction: float = RAM_HEADROOM_FRACTION,
) -> list[KneeCurve]:
    """The knee chart's data: for each configuration, its knobs (KV types, flash attention,
    n_gpu_layers, kv_gpu_layers, n_cpu_ffn / n_cpu_moe, n_ubatch) planned and predicted at ``n_points`` contexts spaced
    evenly on a log scale from 1024 to ``max_ctx`` (default: twice the largest configured
    context, at most the training context when it is larger than that), plus the longest
    context that fits (binary search: memory is monotone in n_ctx). A few ms per point."""
    if not configs:
        return []
    top = max_ctx or max(max(c.n_ctx for c in configs) * 2, 4096)
    lo = 1024
    xs = sorted(
        {pad_ctx(int(round(lo * (top / lo) ** (i / max(1, n_points - 1))))) for i in range(n_points)}
        | {c.n_ctx for c in configs}
    )
    goal = TuneGoal(
        n_ctx=max(CTX_PAD_CELLS, configs[0].n_ctx),
        vram_margin_bytes=vram_margin_bytes,
        ram_headroom_fraction=ram_headroom_fraction,
    )
    s = _Searcher(model, configs[0], gpus, host, inputs, goal)
    out = []
    for cfg in configs:
        pts = []
        for x in xs:
            c = s.candidate(cfg.with_(n_ctx=x))
            if c is not None:
                pts.append((x, c.decode_tok_s, c.fits))

        def fits(k: int, cfg: PlanConfig = cfg) -> bool:
            c = s.candidate(cfg.with_(n_ctx=k * CTX_PAD_CELLS))
            return c is not None and c.fits

        best = (largest_true(fits, 1, max(1, top // CTX_PAD_CELLS)) or 0) * CTX_PAD_CELLS
        out.append(KneeCurve(cfg, tuple(pts), best))
    return out
