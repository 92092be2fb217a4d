"""Layer tensor names (without ``blk.N.``) the reserve-graph builder knows, from src/llama-arch.cpp
``LLM_TENSOR_NAMES``; the family modules add their own."""

from __future__ import annotations

#: the plain transformer layer's tensors: attention, feed-forward, MoE and shared expert, norms
KNOWN_LAYER_TENSORS = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_qkv.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
        "attn_q.bias",
        "attn_k.bias",
        "attn_v.bias",
        "attn_q_norm.weight",
        "attn_k_norm.weight",
        "post_attention_norm.weight",
        "post_ffw_norm.weight",
        "attn_norm.bias",
        "ffn_norm.bias",
        "ffn_gate_inp.weight",
        "ffn_up_exps.weight",
        "ffn_gate_exps.weight",
        "ffn_down_exps.weight",
        "ffn_gate_inp_shexp.weight",
        "ffn_up_shexp.weight",
        "ffn_gate_shexp.weight",
        "ffn_down_shexp.weight",
    }
)

#: Qwen2-MoE's shared expert (qwen2moe.cpp): a dense FFN gated by ``ffn_gate_inp_shexp``
SHARED_EXPERT = frozenset(
    {"ffn_gate_inp_shexp.weight", "ffn_up_shexp.weight", "ffn_gate_shexp.weight", "ffn_down_shexp.weight"}
)

#: a routed MoE layer's experts (``build_moe_ffn``)
EXPERTS = frozenset({"ffn_up_exps.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight"})
