"""The DeepSeek family: ``deepseek2`` (DeepSeek-V2/V3, MLA), ``deepseek32`` and ``deepseek4``.

- deepseek2: src/models/deepseek2.cpp, multi-head latent attention (``key_length_mla`` /
  ``value_length_mla``: a K-only latent cache, V a view of it), dense leading layers, softmax-routed
  MoE with shared experts; the MTP tensors are skipped. The reserve graph is rebuilt for the
  absorbed MLA with DeepSeek-V2-Lite's single Q projection, softmax or sigmoid-free routing without
  groups and no attention temperature.
- deepseek32 (DSA indexer cache) and deepseek4 (a hybrid with its own memory): special memories of
  ``create_memory`` that kvtuner does not model; deepseek4 takes one K and V cache type, as MLA
  models do (llama-context.cpp ``llama_init_from_model``).
"""

from __future__ import annotations

from typing import Any

from .family import Family, GraphFacts, GraphRules
from .tensors import EXPERTS, FFN, ROUTER, SHARED_EXPERT_FFN

#: the MLA projections: the KV latent (``attn_kv_a_mqa``) and its norm, the absorbed K and V
_MLA_PROJECTIONS = frozenset({"attn_kv_a_norm.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight"})
#: deepseek2.cpp's layer tensors with the single Q projection (DeepSeek-V2-Lite)
_MLA_LAYER_TENSORS = (
    _MLA_PROJECTIONS
    | FFN
    | EXPERTS
    | SHARED_EXPERT_FFN
    | {"attn_norm.weight", "attn_q.weight", "attn_output.weight", "ffn_norm.weight", ROUTER}
)


def _mla_tensors(f: GraphFacts) -> bool:
    """deepseek2.cpp, absorbed MLA (DeepSeek-V2-Lite's single Q projection), dense leading layers,
    softmax-routed MoE with shared experts: the MLA sizes ``(kv_lora_rank, n_rot, key_length_mla,
    value_length_mla)``; the full Q LoRA, sigmoid or grouped routing, temperature tuning or an f32
    K cache: not rebuilt."""
    model = f.model
    mla: list[Any] = [
        f.meta("attention.kv_lora_rank"),
        f.meta("rope.dimension_count"),
        f.meta("attention.key_length_mla"),
        f.meta("attention.value_length_mla"),
    ]
    if (
        not model.structure.is_mla
        or not f.layer_names() <= _MLA_LAYER_TENSORS
        or f.meta("expert_gating_func", 0) not in (0, 1)
        or f.meta("expert_group_count", 0) not in (0, 1)
        or f.meta("attention.temperature_scale") is not None
        or not all(isinstance(x, int) and x > 0 for x in mla)
        or f.type_k.lower() == "f32"
        or any(il not in f.moe_layers for il in range(model.n_layer) if il >= min(f.moe_layers, default=model.n_layer))
    ):
        return False
    f.moe_per_layer = True  # dense leading layers, then MoE (like GLM-4.5)
    f.flags["moe_norm_w"] = bool(f.meta("expert_weights_norm", False))
    f.flags["mla"] = tuple(mla)
    # the latent projections stand for K and V in the builder's names
    f.names = (f.names - _MLA_PROJECTIONS) | {"attn_k.weight", "attn_v.weight"}
    return True


FAMILIES = (
    Family(
        "deepseek2",
        "DeepSeek-V2 (MLA)",
        skips_mtp=True,
        tested=True,
        graph=GraphRules(mla=True, tensors=_mla_tensors),
    ),
    Family("deepseek32", "DeepSeek-V3.2 (DSA indexer cache)", special_memory=True, skips_mtp=True),
    Family("deepseek4", "deepseek4", memory="hybrid", special_memory=True, skips_mtp=True, same_kv_types=True),
)
