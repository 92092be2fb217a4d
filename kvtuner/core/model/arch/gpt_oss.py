"""gpt-oss (``gpt-oss``): src/models/openai-moe.cpp.

Alternating sliding-window layers (pattern 2, even layers SWA, the window required), attention
sinks, a bias after the output projection, ``post_attention_norm`` as the feed-forward norm, and
MoE with a router bias, softmax over the selected logits (``SOFTMAX_WEIGHT``) and expert biases
(``ggml_add_id``); the last layer's output is ``t_h_nextn`` and its output rows are taken after
the layers, so the last layer's feed-forward runs for every token.
"""

from __future__ import annotations

from .family import Family, GraphFacts, GraphRules, standard_swa

#: openai-moe.cpp's layer tensors beyond the plain transformer's
_GPT_OSS_TENSORS = {
    "post_attention_norm.weight",
    "attn_sinks.weight",
    "attn_output.bias",
    "ffn_gate_inp.bias",
    "ffn_gate_exps.bias",
    "ffn_down_exps.bias",
    "ffn_up_exps.bias",
}


def _gpt_oss_tensors(f: GraphFacts) -> bool:
    """openai-moe.cpp: every one of its own tensors present; post_attention_norm is the
    feed-forward norm."""
    if not _GPT_OSS_TENSORS <= f.names:
        return False
    f.names = (f.names - _GPT_OSS_TENSORS) | {"ffn_norm.weight"}
    return True


FAMILIES = (
    Family(
        "gpt-oss",
        "gpt-oss",
        load_rules=standard_swa(2),
        tested=True,
        graph=GraphRules(
            traits={"attn_out_bias": True, "moe_oai": True, "rows_after_layers": True},
            moe_norm_w=False,
            swa=True,
            tensors=_gpt_oss_tensors,
        ),
    ),
)
