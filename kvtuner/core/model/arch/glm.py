"""The GLM family: ``glm4moe`` (GLM-4.5 / 4.6 MoE), ``glm-dsa`` and ``glm5-next``.

- glm4moe: src/models/glm4-moe.cpp, dense leading layers then MoE layers with a shared expert,
  sigmoid routing selected on ``probs + exp_probs_b``, ``post_attention_norm`` as the feed-forward
  norm, NextN (MTP) blocks at the end that the loader skips and the graph leaves out.
- glm-dsa (DSA indexer cache) and glm5-next (a hybrid with its own memory): special memories of
  ``create_memory`` that kvtuner does not model.
"""

from __future__ import annotations

from .family import Family, GraphFacts, GraphRules
from .tensors import ATTENTION, ATTENTION_BIASES, EXPERTS, FFN, QK_NORMS, ROUTER, SHARED_EXPERT_FFN

#: glm4-moe.cpp's layer tensors (``post_attention_norm`` is the feed-forward norm, ``exp_probs_b``
#: the routing bias)
_GLM_LAYER_TENSORS = (
    ATTENTION
    | ATTENTION_BIASES
    | QK_NORMS
    | FFN
    | EXPERTS
    | SHARED_EXPERT_FFN
    | {"post_attention_norm.weight", ROUTER, "exp_probs_b.bias"}
)


def _glm4moe_tensors(f: GraphFacts) -> bool:
    """glm4-moe.cpp: dense leading layers, then MoE with a shared expert; post_attention_norm is
    the feed-forward norm; sigmoid gating (the default, 2) with exp_probs_b; another gating,
    M-RoPE or interleaved dense layers: not rebuilt."""
    names = f.layer_names(below=f.n_layer)
    gating = f.meta("expert_gating_func", 2)
    if (
        not names <= _GLM_LAYER_TENSORS
        or "exp_probs_b.bias" not in names
        or gating not in (0, 2)
        or f.meta("rope.dimension_sections") is not None
        or any(il not in f.moe_layers for il in range(f.n_layer) if il >= min(f.moe_layers, default=f.n_layer))
    ):
        return False
    f.names = (f.names - {"post_attention_norm.weight"}) | {"ffn_norm.weight"}
    f.moe_per_layer = True
    f.flags["moe_norm_w"] = bool(f.meta("expert_weights_norm", False))
    return True


FAMILIES = (
    Family(
        "glm4moe",
        "GLM-4.5 MoE",
        skips_mtp=True,
        tested=True,
        graph=GraphRules(traits={"moe_sigmoid": True}, drops_nextn=True, tensors=_glm4moe_tensors),
    ),
    Family("glm-dsa", "glm-dsa", special_memory=True, skips_mtp=True),
    Family("glm5-next", "glm5-next", memory="hybrid", special_memory=True, skips_mtp=True),
)
