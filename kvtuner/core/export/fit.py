"""Exports that fit or say so: what a target will really run, planned on the hardware given.

A target that cannot express the plan's placement runs something else: Ollama has no tensor
override (no ``--n-cpu-moe`` / ``--cpu-moe`` / ``--n-cpu-ffn`` / ``-ot``; its Modelfile places
whole layers by ``num_gpu`` only), no ``-nkvo`` and one KV type for K and V; ``Llama()``'s
keyword arguments (llama-cpp-python JSON) have no tensor overrides either, and neither
llama-cpp-python export has the partial KV split. :func:`expressed_config`
is the configuration the target runs; :func:`check_export` plans it with the one fit verdict
(:func:`kvtuner.core.plan.verdict.fit_verdict`) and, when it does not fit and the target cannot
express the plan, chooses the nearest whole-layer placement that fits (the most GPU layers) with
its predicted speed, or says it cannot express a placement that fits.

The other llama.cpp targets (llama-server / llama-cli, the llama-cpp-python snippet with its
low-level loader, koboldcpp with ``moecpu`` / ``overridetensors``, the kvtuner profile) express
the experts and FFN kept in RAM: their exported configuration is the plan's own, and it fits or
the verdict's warning says why not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..plan.build_rules import VENDORED, BuildRules
from ..plan.config import ALL_LAYERS, ConfigError, PlanConfig
from ..plan.memory_plan import MemoryPlan, plan_memory
from ..plan.placement import placement_for
from ..plan.verdict import FitMargins, FitVerdict, fit_verdict
from ..tune.bisection import largest_true
from ..units import fmt_bytes

#: Targets without tensor overrides: they place whole layers only (Ollama's ``num_gpu``,
#: ``Llama(n_gpu_layers=...)`` as keyword arguments).
WHOLE_LAYER_TARGETS = ("ollama", "llama-cpp-python-json")
#: Targets without a partial KV split (no ``-ot`` moving a layer's weights apart from its KV).
NO_KV_SPLIT_TARGETS = ("ollama", "llama-cpp-python", "llama-cpp-python-json")
#: The setting that counts a target's GPU layers, by target (for the messages).
LAYER_SETTING = {
    "ollama": "num_gpu",
    "koboldcpp": "gpulayers",
    "llama-cpp-python": "n_gpu_layers",
    "llama-cpp-python-json": "n_gpu_layers",
    "llama-server": "-ngl",
    "llama-cli": "-ngl",
    "profile": "-ngl",
}


def keeps_tensors_in_ram(config: PlanConfig) -> bool:
    """The configuration keeps some tensors of offloaded layers in RAM (``--n-cpu-moe``,
    ``--cpu-moe``, ``--n-cpu-ffn``, ``-ot``)."""
    return bool(config.n_cpu_moe or config.cpu_moe or config.n_cpu_ffn or config.tensor_overrides)


def expressed_config(target: str, config: PlanConfig, n_layer: Callable[[], int]) -> PlanConfig:
    """The configuration ``target`` really runs for ``config``, as its module writes it: a partial
    KV split becomes that many whole layers with their KV (Ollama, llama-cpp-python); no tensor
    overrides (Ollama, llama-cpp-python keyword arguments); for Ollama also one KV type for K and V
    (:func:`~kvtuner.core.export.koboldcpp.nearest_shared_kv_type`) and no KV kept in RAM apart
    from its layer (no ``-nkvo``). The other targets run ``config`` itself.

    Raises:
        ConfigError: ``kv_gpu_layers`` exceeds the offloaded layers.
    """
    cfg = config
    if target in NO_KV_SPLIT_TARGETS:
        placement = placement_for(config, n_layer)
        if placement.mode == "split":
            cfg = cfg.with_(n_gpu_layers=placement.n_gpu_layers, kv_gpu_layers=None)
    if target in WHOLE_LAYER_TARGETS:
        cfg = cfg.with_(n_cpu_moe=0, cpu_moe=False, n_cpu_ffn=0, tensor_overrides=())
    if target == "ollama":
        from .koboldcpp import nearest_shared_kv_type
        from .ollama import OLLAMA_KV_TYPES

        kv = nearest_shared_kv_type(config.type_k, config.type_v, OLLAMA_KV_TYPES)
        cfg = cfg.with_(type_k=kv, type_v=kv, flash_attn="on" if kv != "f16" else cfg.flash_attn, kv_gpu_layers=None)
    return cfg


@dataclass(frozen=True)
class ExportFit:
    """What an export runs on the hardware given, and whether it fits.

    Attributes:
        target: the export target.
        expressed: the configuration the target runs (:func:`expressed_config`).
        verdict: the fit verdict of ``expressed``.
        config: the configuration to write: ``expressed``, or the whole-layer placement chosen
            because ``expressed`` does not fit (None: the target cannot express a placement that
            fits).
        config_verdict: the verdict of ``config`` (None with it).
        decode_tok_s: predicted decode at the full context of ``config`` (None: no prediction).
        warnings: one line each, for stderr (empty when the export fits as written).
    """

    target: str
    expressed: PlanConfig
    verdict: FitVerdict
    config: PlanConfig | None
    config_verdict: FitVerdict | None
    decode_tok_s: float | None
    warnings: tuple[str, ...]


def _largest_fitting_ngl(
    base: PlanConfig, n_layer: int, verdict_of: Callable[[PlanConfig], FitVerdict | None]
) -> int | None:
    """The most GPU layers (0 .. n_layer + 1) whose plan the verdict calls "fits" (memory grows
    with the layers offloaded: binary search); None when not even 0 fits."""

    def fits(ngl: int) -> bool:
        v = verdict_of(base.with_(n_gpu_layers=ngl))
        return v is not None and v.fits

    return largest_true(fits, 0, n_layer + 1)


def check_export(
    target: str,
    model: Any,
    config: PlanConfig,
    gpus: Sequence[Any],
    host: Any,
    *,
    margins: FitMargins | None = None,
    inputs: Any = None,
    split: Any = None,
    rules: BuildRules = VENDORED,
) -> ExportFit:
    """Plan what ``target`` runs for ``config`` on ``gpus`` / ``host`` and decide what to write.

    Args:
        target: an export target (:data:`kvtuner.core.export.TARGETS`).
        model: the :class:`~kvtuner.core.model.profile.ModelProfile`.
        config: the configuration exported.
        gpus, host: the hardware planned for (GpuSpecs, HostSpec or None).
        margins: the fit verdict's margins (default llama.cpp's ``--fit-target``).
        inputs: speed-model inputs (:class:`~kvtuner.core.speed.speed_model.SpeedInputs`) for the
            predicted decode of a whole-layer fallback; None: no prediction.
        split: ``-sm`` / ``-ts`` / ``-mg`` (:class:`~kvtuner.core.plan.placement.DeviceSplit`).
        rules: the llama.cpp build and program the target runs (:mod:`kvtuner.core.plan.build_rules`).

    Raises:
        ConfigError: the configuration cannot be planned for this model.
    """
    m = margins or FitMargins()
    n_layer = int(model.n_layer)
    expressed = expressed_config(target, config, lambda: n_layer)

    def plan(cfg: PlanConfig) -> MemoryPlan | None:
        try:
            return plan_memory(
                model, cfg, list(gpus), host, rules=rules, **({"split": split} if split is not None else {})
            )
        except ConfigError:
            return None

    def verdict_of(cfg: PlanConfig) -> FitVerdict | None:
        p = plan(cfg)
        return fit_verdict(p, m) if p is not None else None

    p0 = plan(expressed)
    if p0 is None:
        p0 = plan_memory(model, expressed, list(gpus), host, rules=rules)  # raises the ConfigError that says why
    v0 = fit_verdict(p0, m)
    setting = LAYER_SETTING.get(target, "-ngl")
    if v0.fits:
        return ExportFit(target, expressed, v0, expressed, v0, _decode(p0, inputs), ())
    warns = []
    if expressed == config or not gpus:
        warns.append(f"on the hardware given the fit verdict of this configuration is {v0.level.upper()}: {v0.detail}")
        return ExportFit(target, expressed, v0, expressed, v0, _decode(p0, inputs), tuple(warns))
    ngl_written = (
        ("999" if target == "ollama" else "all")
        if expressed.n_gpu_layers == ALL_LAYERS
        else str(expressed.n_gpu_layers)
    )
    what = (
        "keep tensors of offloaded layers in RAM (--n-cpu-moe / --cpu-moe / --n-cpu-ffn / -ot) or the KV apart "
        "from its layer"
        if target in WHOLE_LAYER_TARGETS
        else "split a layer's weights from its KV (--kv-gpu-layers)"
    )
    head = f"{target} cannot {what}: as written ({setting} {ngl_written}) it is {v0.level.upper()}: {v0.detail}"
    n = _largest_fitting_ngl(expressed, n_layer, verdict_of)
    if n is None:
        warns.append(head + f"; cannot express a placement that fits: even {setting} 0 does not fit")
        return ExportFit(target, expressed, v0, None, None, None, tuple(warns))
    chosen = expressed.with_(n_gpu_layers=n)
    pc = plan(chosen)
    vc = fit_verdict(pc, m) if pc is not None else None
    tok = _decode(pc, inputs) if pc is not None else None
    speed = f", predicted decode {tok:.3g} tok/s at full context" if tok is not None else ""
    gpu_total = sum(d.total_bytes for d in pc.gpus) if pc is not None else 0
    warns.append(
        head + f"; written with {setting} {n}, the most whole layers that fit "
        f"({fmt_bytes(gpu_total)} on the GPUs{speed})"
    )
    return ExportFit(target, expressed, v0, chosen, vc, tok, tuple(warns))


def _decode(p: MemoryPlan | None, inputs: Any) -> float | None:
    """Predicted decode tokens/s at the full context of ``p`` (None without inputs or a plan)."""
    if p is None or inputs is None:
        return None
    from ..speed.speed_model import SpeedModelError, decode_tok_s

    try:
        return decode_tok_s(p, inputs, p.n_ctx_seq - 1)
    except SpeedModelError:
        return None


__all__ = [
    "LAYER_SETTING",
    "NO_KV_SPLIT_TARGETS",
    "WHOLE_LAYER_TARGETS",
    "ExportFit",
    "check_export",
    "expressed_config",
    "keeps_tensors_in_ram",
]
