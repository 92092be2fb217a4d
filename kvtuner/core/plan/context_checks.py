"""The refusals llama.cpp makes when a context is created, made first by kvtuner.

Each rule copies a check of ``llama_init_from_model`` (src/llama-context.cpp) of the llama.cpp
that llama-cpp-python 0.3.36 vendors, and fails with a one-line :class:`ConfigError` that
says what to choose instead:

- a quantized V cache needs flash attention (``quantized V cache requires flash_attn``);
- MLA models (and DeepSeek-V4) need the same K and V type;
- with flash attention on *or auto*, a quantized K (V) type's block size must divide every
  trunk layer's ``n_embd_head_k(il)`` (``n_embd_head_v(il)``): "K cache type q8_0 with block
  size 32 does not divide n_embd_head_k=80" (StableLM 3B, llama.cpp#4425).

The row-width rule of ``ggml_row_size`` (a K/V row must hold whole blocks) is checked per
layer by the planner itself (:func:`kvtuner.core.plan.memory_plan.plan_memory`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model.ggml_types import KV_CACHE_TYPES, kv_type
from .config import ConfigError, PlanConfig

if TYPE_CHECKING:  # pragma: no cover
    from ..model.profile import ModelProfile


def _alternatives(head: int) -> list[str]:
    """KV types whose block divides ``head`` (quantized first, then the 16-bit ones)."""
    quant = [t.name for t in KV_CACHE_TYPES.values() if t.is_quantized and t.divides(head)]
    return quant + ["f16", "bf16"]


def check_context(model: ModelProfile, config: PlanConfig, flash_attn: bool) -> None:
    """Raise what ``llama_init_from_model`` would refuse for ``config`` on ``model``.

    Args:
        model: the model (its structure gives the per-layer head sizes).
        config: the configuration as given (``flash_attn`` ``on``/``auto`` both count as
            "not disabled" for the head-size rule, as in llama.cpp).
        flash_attn: flash attention after forced changes (Grok forces it off).

    Raises:
        ConfigError: one line naming the rule and what to choose instead.
    """
    tk, tv = kv_type(config.type_k), kv_type(config.type_v)
    if tv.is_quantized and not flash_attn:
        raise ConfigError(
            f"a quantized V cache ({tv.name}) requires flash attention: use --flash-attn on (or auto), or --cache-type-v f16"
        )
    if (model.is_mla or model.architecture == "deepseek4") and tk.name != tv.name:
        raise ConfigError(f"{model.architecture} (MLA) needs the same K and V cache type: set --cache-type-v {tk.name}")
    fa_not_off = config.flash_attn != "off" and flash_attn
    if not fa_not_off:
        return
    st = model.structure
    for t, what, flag in ((tk, "K", "-ctk"), (tv, "V", "-ctv")):
        if not t.is_quantized:
            continue
        for role in st.layers[: st.n_layer]:
            head = role.head_k if what == "K" else role.head_v
            if not t.divides(head):
                alts = _alternatives(head)
                fa_hint = ""
                if what == "K" and not tv.is_quantized:
                    fa_hint = f", or -fa off to keep {t.name}"
                raise ConfigError(
                    f"llama.cpp refuses {flag} {t.name} with flash attention {config.flash_attn}: {t.name}'s block of "
                    f"{t.block_size} does not divide the {what} head size {head} (layer {role.il}); "
                    f"choose {flag} {' or '.join(alts)}{fa_hint}"
                )
