"""Layer tensor names (without ``blk.N.``) the reserve-graph builder knows, from src/llama-arch.cpp
``LLM_TENSOR_NAMES``, in the groups the families combine."""

from __future__ import annotations

#: the attention block: its norm, the Q, K, V and output projections
ATTENTION = frozenset({"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"})
#: Q/K/V biases (qwen2.cpp) and per-head Q/K RMS norms (qwen3.cpp)
ATTENTION_BIASES = frozenset({"attn_q.bias", "attn_k.bias", "attn_v.bias"})
QK_NORMS = frozenset({"attn_q_norm.weight", "attn_k_norm.weight"})
#: the dense feed-forward (``build_ffn``): gate, up, down
FFN = frozenset({"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
#: a routed MoE layer's router and experts (``build_moe_ffn``)
ROUTER = "ffn_gate_inp.weight"
EXPERTS = frozenset({"ffn_up_exps.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight"})
#: a shared expert's dense feed-forward (qwen2moe.cpp, llama4.cpp, glm4-moe.cpp, deepseek2.cpp)
SHARED_EXPERT_FFN = frozenset({"ffn_up_shexp.weight", "ffn_gate_shexp.weight", "ffn_down_shexp.weight"})
#: Qwen2-MoE's shared expert (qwen2moe.cpp): a dense FFN gated by ``ffn_gate_inp_shexp``
SHARED_EXPERT = SHARED_EXPERT_FFN | {"ffn_gate_inp_shexp.weight"}

#: the plain transformer layer's tensors: attention (Phi-3's fused QKV), feed-forward, MoE and shared
#: expert, norms (Gemma's post-norms, StableLM's biases)
KNOWN_LAYER_TENSORS = (
    ATTENTION
    | ATTENTION_BIASES
    | QK_NORMS
    | FFN
    | EXPERTS
    | SHARED_EXPERT
    | {
        "attn_qkv.weight",
        "ffn_norm.weight",
        "post_attention_norm.weight",
        "post_ffw_norm.weight",
        "attn_norm.bias",
        "ffn_norm.bias",
        ROUTER,
    }
)
