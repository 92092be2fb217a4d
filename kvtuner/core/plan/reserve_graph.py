"""llama.cpp's worst-case (reserve) graph for plain transformer layers, shape only.

``llama_context::sched_reserve`` (src/llama-context.cpp) builds the prompt-processing graph for
``n_tokens = min(n_ctx, n_ubatch)`` tokens, every token an output (one per slot in llama-server
b11434), over a full KV cache, and the CPU backend's compute buffer is what ggml-alloc reserves for
it (:func:`ggml_graph.allocate`). What differs between builds and programs is keyed by
:class:`~.build_rules.BuildRules` (b11434's mixed-batch embedding inputs and embedding scale rows,
its one-gather ``build_rs``, the outputs reserved).
:func:`transformer_reserve_bytes` rebuilds that graph:

- the inputs of ``llm_graph_context`` (src/llama-graph.cpp): token ids, the unselected
  ``inp_embd`` of ``build_inp_embd`` (``ggml_build_forward_select``, PR 18550: allocated, never
  freed), positions, per KV cache its K/V row indices and KQ mask (f16 with flash attention),
  ``out_ids``; the Hadamard matrices of a quantized cache (llama-kv-cache.cpp ``attn_rot_k/v``);
- the decoder layer of ``llm_build_llama`` (src/models/llama.cpp) and its relatives: Qwen2
  biases, Qwen3/OLMoE Q/K norms, Phi-3's fused QKV and gate+up projections, Gemma 3 (scaled
  embeddings, post-norms, scaled Q, iSWA caches), StableLM's LayerNorm with biases, DeciLM's
  attention-free and "linear attention" layers; Gemma 4 and Gemma 3n (src/models/gemma4.cpp,
  gemma3n.cpp: per-layer embeddings, shared-KV layers that only read, Gemma 3n's AltUp streams and
  LAuReL); LFM2's short-conv layers (lfm2.cpp, ``build_rs`` state rows); Llama 4 (llama4.cpp: NoPE
  layers, L2 Q/K norms, sigmoid MoE weighted before the experts, shared expert); Nemotron-H and
  Falcon-H1 (``build_mamba2_layer``); gpt-oss (openai-moe.cpp); GLM-4.5 MoE (glm4-moe.cpp);
  DeepSeek-V2's absorbed MLA (deepseek2.cpp);
- ``build_attn`` / ``build_attn_mha``: Q, V, K expanded first (Q, K, V for iSWA), the cache
  writes (``ggml_set_rows``; V transposed without flash attention, one index per element), then
  flash attention or ``kq`` / ``soft_max`` / ``kqv``, f16 casts of an f32 cache;
- ``build_ffn`` (SwiGLU/GeGLU) or ``build_moe_ffn`` (softmax routing, top-k ``argsort``,
  ``mul_mat_id`` experts, the weighted sum of expert views; Qwen2-MoE's shared expert);
- the last layer's ``get_rows`` of the output rows and the output norm and head.

The node order and op of every node were checked against ``GGML_SCHED_DEBUG=2`` dumps of the
vendored llama.cpp (llama-cpp-python 0.3.36), and the result equals llama.cpp's dry run to the
printed 0.01 MiB on every configuration the tests cover for these architectures. Gemma 2
(gemma2.cpp) and the b11434 differences were checked against dumps of b11434's llama-server and
llama-fit-params, whose figures the same graphs equal (benchmarks/compute_builds.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .build_rules import VENDORED, BuildRules
from .ggml_graph import Graph, Tensor, allocate
from .llama_constants import CTX_PAD_CELLS

if TYPE_CHECKING:  # pragma: no cover
    from ..model.profile import ModelProfile
    from .kv_cache import LayerKV


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer: ``n_head`` / ``n_head_kv`` heads (``n_head_kv`` 0: no attention),
    head sizes in elements, ``n_ff`` feed-forward width, ``n_kv`` KV cells it attends over."""

    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_ff: int
    n_kv: int
    swa: bool = False  # a sliding-window layer (the iSWA memory's SWA cache)
    n_expert: int = 0  # experts of a mixture-of-experts FFN (0: dense, ``n_ff`` wide)
    n_expert_used: int = 0  # experts per token
    n_ff_exp: int = 0  # width of one expert
    n_ff_shexp: int = 0  # width of the shared expert (Qwen2-MoE), 0: none
    iswa: bool = False  # the model's memory is iSWA (build_attn expands Q, K, V in that order)
    kv_src: int = -1  # Gemma 4 shared KV: reads the cache of that layer, projects no K/V of its own
    conv: int = 0  # LFM2 short-conv layer: d_conv (l_cache - 1) state columns, 0: not one
    nope: bool = False  # Llama 4 NoPE layer: Q times the attention temperature input instead of RoPE
    mamba: bool = False  # Nemotron-H Mamba2 layer (TransformerShape.ssm holds its sizes)


@dataclass(frozen=True)
class TransformerShape:
    """What the reserve graph of a plain transformer depends on (all counts, no bytes)."""

    n_embd: int
    n_vocab: int
    layers: tuple[LayerShape, ...]
    qkv_bias: bool = False  # Qwen2: bq, bk, bv added after the projections
    qk_norm: bool = False  # Qwen3: RMS norms of Q and K per head
    fused_qkv: bool = False  # Phi-3: one QKV projection
    fused_up: bool = False  # Phi-3: one up+gate projection
    q_scale: bool = False  # Phi-3, Gemma 3: Q scaled after RoPE
    residual_first: bool = False  # Phi-3: l_out = residual + ffn_out
    attn_residual_first: bool = False  # LFM2: ffn_inp = residual + attention output
    embd_scale: bool = False  # Gemma: scaled input embeddings
    post_norms: bool = False  # Gemma 2/3: norms after attention and feed-forward
    layer_norm: bool = False  # StableLM: LayerNorm (ggml_norm) instead of RMSNorm
    attn_norm_bias: bool = False  # StableLM: norm biases (an in-place add after the weight)
    ffn_norm_bias: bool = False
    output_norm_bias: bool = False
    k_f32: bool = False  # an f32 K cache (cast to f16 for flash attention)
    v_f32: bool = False  # an f32 V cache (likewise)
    moe_norm_w: bool = False  # MoE: the selected experts' weights are normalized to sum 1
    moe_llama4: bool = False  # Llama 4 MoE: sigmoid gating selected on the logits, weights applied to the
    #                           input before the experts, a dense shared expert added
    qk_norm_after_rope: bool = False  # Llama 4: unweighted RMS norms of Q and K after RoPE (use_kq_norm)
    altup: int = 0  # Gemma 3n: n_altup parallel streams (AltUp), LAuReL, sparse GELU gates (0: not Gemma 3n)
    rope: bool = True  # Nemotron-H: attention without RoPE
    parallel_ssm: bool = False  # Falcon-H1: attention and Mamba2 in every layer, then a feed-forward
    attn_out_bias: bool = False  # gpt-oss: a bias added after the output projection
    moe_oai: bool = False  # gpt-oss MoE: router bias, softmax over the selected logits, expert biases (add_id)
    rows_after_layers: bool = False  # gpt-oss: the last layer's output is h_nextn (an output), its rows then
    #                                  the output norm
    mla: tuple[int, ...] = ()  # DeepSeek-V2 MLA: (kv_lora_rank, n_rot, key_length_mla, value_length_mla)
    moe_sigmoid: bool = False  # GLM-4.5: sigmoid probabilities, selected after adding exp_probs_b, and a
    #                            dense shared expert added (build_ffn)
    ssm: tuple[int, ...] = ()  # Nemotron-H: one block per layer (Mamba2, attention or ReLU^2 MLP) and the
    #                            Mamba2 sizes (d_conv, d_inner, d_state, n_head, n_group, ssm_norm 0/1)
    rot_k: int = 0  # Hadamard rotation of Q and K, its size (quantized K cache)
    rot_v: int = 0  # Hadamard rotation of V and the attention output (quantized V cache)
    rot_k_swa: int = 0  # the same for the sliding-window cache of an iSWA memory (its own head sizes)
    rot_v_swa: int = 0
    per_layer: int = 0  # Gemma 4: n_embd_per_layer of the per-layer embeddings (0: none)
    v_norm: bool = False  # Gemma 4: V RMS-normed (no weight)
    rows_after_norm: bool = False  # Gemma 4: output rows taken after the output norm (h_nextn, an output)
    logit_softcap: bool = False  # Gemma 4: logits scaled, tanh, scaled back (f_final_logit_softcapping)
    attn_softcap: bool = False  # Gemma 2: attention scores scaled, tanh, scaled back without flash attention
    embd_scale_op: bool = (
        False  # Gemma 2: the embeddings scaled by ggml_scale in every build (not build_inp_embd's rows)
    )


def hadamard_size(head: int) -> int:
    """Size of the Hadamard matrix llama.cpp rotates heads of ``head`` elements with: the largest
    power of two dividing it (llama-kv-cache.cpp, ``attn_rot_hadamard``)."""
    return head & -head if head > 0 else 0


def attn_rotation(type_name: str, heads: Sequence[int]) -> bool:
    """Whether llama.cpp rotates a cache of ``type_name`` over layers with head sizes ``heads``:
    ``attn_rot_k = ggml_is_quantized(type_k) && n_embd_head_k_all > 0 && n_embd_head_k % 64 == 0``
    (llama-kv-cache.cpp constructor, llama.cpp PR 21038; V likewise), i.e. a quantized type and one
    head size for every layer, a multiple of 64."""
    sizes = set(heads)
    return type_name not in ("f32", "f16", "bf16") and len(sizes) == 1 and next(iter(sizes)) % 64 == 0


def _weight(name: str, *ne: int) -> None:
    """A weight: in the model's buffers, so left out of the graph (:meth:`Graph.op`)."""
    return None


def _moe_ffn(g: Graph, shape: TransformerShape, L: LayerShape, cur: Tensor, T: int) -> Tensor:
    """``llm_graph_context::build_moe_ffn`` (llama-graph.cpp) with softmax gating and SwiGLU
    experts: router logits and probabilities ``[n_expert, T]``, the top-k ``argsort`` and the
    selected weights (normalized when ``moe_norm_w``), gate/up/down ``mul_mat_id``
    ``[n_ff_exp | n_embd, n_expert_used, T]``, the weighted sum of the expert views."""
    E, k = cur.ne[0], L.n_expert_used
    logits = g.op("MUL_MAT", "ffn_moe_logits", (L.n_expert, T), None, cur)
    if shape.moe_oai:  # router bias; SOFTMAX_WEIGHT: experts selected on the logits, softmax of the selected
        logits = g.op("ADD", "ffn_moe_logits_biased", logits.ne, logits, None)
        probs = logits
        argsort = g.op("ARGSORT", "ffn_moe_argsort", (L.n_expert, T), logits, etype="i32")
    elif shape.moe_sigmoid:  # glm4-moe.cpp: sigmoid, selection on probs + exp_probs_b
        probs = g.op("UNARY", "ffn_moe_probs", (L.n_expert, T), logits)
        sel = g.op("ADD", "ffn_moe_probs_biased", (L.n_expert, T), probs, None)
        argsort = g.op("ARGSORT", "ffn_moe_argsort", (L.n_expert, T), sel, etype="i32")
    elif shape.moe_llama4:  # sigmoid probabilities, experts selected on the logits
        probs = g.op("UNARY", "ffn_moe_probs", (L.n_expert, T), logits)
        argsort = g.op("ARGSORT", "ffn_moe_argsort", (L.n_expert, T), logits, etype="i32")
    else:
        probs = g.op("SOFT_MAX", "ffn_moe_probs", (L.n_expert, T), logits)
        argsort = g.op("ARGSORT", "ffn_moe_argsort", (L.n_expert, T), probs, etype="i32")
    topk = g.view(argsort, (k, T), (argsort.nb[1],))
    weights = g.op("GET_ROWS", "ffn_moe_weights", (1, k, T), g.reshape(probs, 1, L.n_expert, T), topk)
    if shape.moe_oai:
        weights = g.reshape(g.op("SOFT_MAX", "ffn_moe_weights_softmax", (k, T), g.reshape(weights, k, T)), 1, k, T)
    if shape.moe_norm_w:
        w2 = g.reshape(weights, k, T)
        wsum = g.op("SUM_ROWS", "ffn_moe_weights_sum", (1, T), w2)
        wsum = g.op("CLAMP", "ffn_moe_weights_sum_clamped", (1, T), wsum)
        weights = g.reshape(g.op("DIV", "ffn_moe_weights_norm", (k, T), w2, wsum), 1, k, T)
    g.expand(weights)
    x = g.reshape(cur, E, 1, T)
    if shape.moe_llama4:  # weight_before_ffn: the input repeated per selected expert, times its weight
        x = g.op("MUL", "ffn_moe_weighted", (E, k, T), g.op("REPEAT", "repeat", (E, k, T), x), weights)
    up = g.op("MUL_MAT_ID", "ffn_moe_up", (L.n_ff_exp, k, T), None, x, topk)
    gate = g.op("MUL_MAT_ID", "ffn_moe_gate", (L.n_ff_exp, k, T), None, x, topk)
    if shape.moe_oai:  # expert biases: ggml_add_id(x, bias, selected experts), in place
        up = g.op("ADD_ID", "ffn_moe_up_biased", up.ne, up, None, topk)
        gate = g.op("ADD_ID", "ffn_moe_gate_biased", gate.ne, gate, None, topk)
    act = g.op("GLU", "ffn_moe_swiglu", (L.n_ff_exp, k, T), gate, up)
    experts = g.op("MUL_MAT_ID", "ffn_moe_down", (E, k, T), None, act, topk)
    if shape.moe_oai:
        experts = g.op("ADD_ID", "ffn_moe_down_biased", experts.ne, experts, None, topk)
    if not shape.moe_llama4:
        experts = g.op("MUL", "ffn_moe_weighted", (E, k, T), experts, weights)
    g.expand(experts)
    views = [g.view(experts, (E, T), (experts.nb[2],), i * experts.nb[1]) for i in range(k)]
    for v in views:
        g.expand(v)
    out = views[0]
    for v in views[1:]:
        out = g.op("ADD", "ffn_moe_add", (E, T), out, v)
        g.expand(out)
    if k == 1:
        out = g.op("CONT", "ffn_moe_out", (E, T), out)
    if L.n_ff_shexp and (
        shape.moe_llama4 or shape.moe_sigmoid or shape.mla
    ):  # llama4.cpp, glm4-moe.cpp: build_ffn of the
        # shared expert, added
        gate = g.op("MUL_MAT", "ffn_gate_shexp", (L.n_ff_shexp, T), None, cur)
        up = g.op("MUL_MAT", "ffn_up_shexp", (L.n_ff_shexp, T), None, cur)
        sh = g.op("MUL_MAT", "ffn_down_shexp", (E, T), None, g.op("GLU", "ffn_swiglu", (L.n_ff_shexp, T), gate, up))
        out = g.op("ADD", "ffn_moe_out_merged", (E, T), out, sh)
    elif L.n_ff_shexp:  # qwen2moe.cpp: a dense shared expert times sigmoid(gate_inp_shexp x), added
        gate = g.op("MUL_MAT", "ffn_gate", (L.n_ff_shexp, T), None, cur)
        up = g.op("MUL_MAT", "ffn_up", (L.n_ff_shexp, T), None, cur)
        sh = g.op("MUL_MAT", "ffn_shexp", (E, T), None, g.op("GLU", "ffn_swiglu", (L.n_ff_shexp, T), gate, up))
        gi = g.op("MUL_MAT", "ffn_shexp_gate_inp", (1, T), None, cur)
        sg = g.op("DIV", "ffn_shexp_gate", (1, T), g.op("UNARY", "silu", (1, T), gi), gi)
        out = g.op("ADD", "ffn_out", (E, T), out, g.op("MUL", "ffn_shexp_out", (E, T), sh, sg))
    return out


def _build_rs(
    g: Graph, rules: BuildRules, name: str, state: Tensor, state_size: int, n_seqs: int, s_copy: Tensor, getter=None
) -> Tensor:
    """``llm_graph_context::build_rs`` (src/llama-graph.cpp) when reserving (``n_rs = n_seqs``): one state
    cleared in place, this ubatch's state rows, the others (none) copied back.

    The vendored build gathers the ubatch's rows with ``getter`` (default ``ggml_get_rows`` by
    ``s_copy``) and the extra rows with a second ``get_rows``. b11434 (``rules.rs_gather``) gathers
    all ``n_rs`` rows at once (``states_all``): without a getter the ubatch's rows are a view of it;
    with one (Mamba2's ``ssm_scan``) the gather skips the first row (``s_copy_tail``, ``n_rs - 1``
    rows) and is expanded only with the copy of the extra rows, after the getter's output."""
    states = g.reshape(state, state_size, n_seqs)
    g.expand(g.view_of_op("SCALE", f"{name} (zero)", g.view(states, (state_size,))))  # clears a state in place
    main_ids = g.view(s_copy, (n_seqs,))
    if rules.rs_gather:
        i0 = 1 if getter is not None else 0
        tail = g.view(s_copy, (n_seqs - i0,), None, i0 * 4) if i0 else s_copy
        states_all = g.op("GET_ROWS", f"{name} (all)", (state_size, n_seqs - i0), states, tail)
        main = getter(states, main_ids) if getter is not None else g.view(states_all, (state_size, n_seqs))
        g.expand(main)
        extra = g.view(states_all, (state_size, 0), None, (n_seqs - i0) * state_size * 4)
    else:
        main = (getter or (lambda st, ids: g.op("GET_ROWS", name, (state_size, n_seqs), st, ids)))(states, main_ids)
        g.expand(main)
        extra = g.op("GET_ROWS", f"{name} (extra)", (state_size, 0), states, g.view(s_copy, (0,), None, n_seqs * 4))
    g.expand(g.view_of_op("CPY", f"{name} (extra copied)", g.view(state, (state_size, 0)), extra))
    return main


def _shortconv(
    g: Graph, L: LayerShape, il: int, cur: Tensor, T: int, n_seqs: int, s_copy: Tensor, rules: BuildRules = VENDORED
) -> Tensor:
    """``build_shortconv_block`` (src/models/lfm2.cpp): in_proj to B, C, x thirds, B*x transposed after
    the conv state (``build_rs``: the state rows of this ubatch's sequences, ``get_rows`` by
    ``s_copy``; the rest, none when reserving, copied back), the last ``d_conv`` columns copied
    into the state, ``ssm_conv``, times C, out_proj."""
    E, d = cur.ne[0], L.conv
    tps = T // n_seqs
    x3 = g.reshape(cur, E, tps, n_seqs)
    bcx = g.op("MUL_MAT", f"conv.in_proj-{il}", (3 * E, tps, n_seqs), None, x3)
    b, c, x = (g.view(bcx, (E, tps, n_seqs), (bcx.nb[1], bcx.nb[2]), i * E * 4) for i in range(3))
    bx = g.transpose(g.op("MUL", f"bx-{il}", (E, tps, n_seqs), b, x))
    state = g.leaf(f"cache_r_l{il}", (d * E, n_seqs), "f32")
    main = _build_rs(g, rules, f"rs-{il}", state, d * E, n_seqs, s_copy)
    conv = g.reshape(main, d, E, n_seqs)
    bx = g.op("CONCAT", f"concat-{il}", (d + tps, E, n_seqs), conv, bx)
    snap = g.view(bx, (d, E, n_seqs), (bx.nb[1], bx.nb[2]), tps * 4)
    g.expand(g.view_of_op("CPY", f"cache_r_l{il} (snapshot)", g.view(state, (d * E, n_seqs)), snap))
    out = g.op("SSM_CONV", f"conv-{il}", (E, tps, n_seqs), bx)
    y = g.op("MUL", f"y-{il}", (E, tps, n_seqs), c, out)
    y = g.op("MUL_MAT", f"conv.out_proj-{il}", (E, tps, n_seqs), None, y)
    return g.reshape(y, E, T)


def _mamba2(
    g: Graph,
    shape: TransformerShape,
    il: int,
    cur: Tensor,
    T: int,
    n_seqs: int,
    s_copy: Tensor,
    rules: BuildRules = VENDORED,
) -> Tensor:
    """``llm_build_mamba_base::build_mamba2_layer`` (src/models/mamba-base.cpp) on the normed
    ``[n_embd, T]`` input: ssm_in, the conv state (``build_rs``) concatenated before x/B/C, its last
    columns copied back, ``ssm_conv`` + bias + SiLU, ``ssm_scan`` over the state rows (y and the
    new states in one tensor, the states copied back), y + x*D, SwiGLU with z, the grouped RMS
    norm, ssm_out."""
    E = shape.n_embd
    d_conv, d_inner, d_state, n_head, n_group, ssm_norm = shape.ssm
    head_dim, tps = d_inner // n_head, T // n_seqs
    conv_ch = d_inner + 2 * n_group * d_state

    def rs(il: int, kind: str, state_size: int, getter=None) -> Tensor:
        """build_rs (:func:`_build_rs`) of the layer's ``r`` (conv) or ``s`` (scan) state."""
        state = g.leaf(f"cache_{kind}_l{il}", (state_size, n_seqs), "f32")
        return _build_rs(g, rules, f"rs_{kind}-{il}", state, state_size, n_seqs, s_copy, getter)

    conv_state = g.leaf(f"cache_r_l{il}", ((d_conv - 1) * conv_ch, n_seqs), "f32")
    conv = rs(il, "r", (d_conv - 1) * conv_ch)
    conv = g.reshape(conv, d_conv - 1, conv_ch, n_seqs)
    d_in = 2 * d_inner + 2 * n_group * d_state + n_head
    zx = g.reshape(g.op("MUL_MAT", f"ssm_in-{il}", (d_in, T), None, cur), d_in, tps, n_seqs)
    z = g.view(zx, (head_dim, n_head, tps, n_seqs), (head_dim * 4, zx.nb[1], zx.nb[2]))
    xbc = g.view(zx, (conv_ch, tps, n_seqs), (zx.nb[1], zx.nb[2]), d_inner * 4)
    dt = g.view(zx, (n_head, tps, n_seqs), (zx.nb[1], zx.nb[2]), (2 * d_inner + 2 * n_group * d_state) * 4)
    conv_x = g.op("CONCAT", f"conv_x-{il}", (d_conv - 1 + tps, conv_ch, n_seqs), conv, g.transpose(xbc))
    last = g.view(conv_x, (d_conv - 1, conv_ch, n_seqs), (conv_x.nb[1], conv_x.nb[2]), tps * 4)
    g.expand(
        g.view_of_op("CPY", f"cache_r_l{il} (last_conv)", g.view(conv_state, ((d_conv - 1) * conv_ch, n_seqs)), last)
    )
    xbc = g.op("SSM_CONV", f"ssm_conv-{il}", (conv_ch, tps, n_seqs), conv_x)
    xbc = g.op("UNARY", f"silu-{il}", xbc.ne, g.op("ADD", f"conv_b-{il}", xbc.ne, xbc, None))
    x = g.view(xbc, (head_dim, n_head, tps, n_seqs), (head_dim * 4, xbc.nb[1], xbc.nb[2]))
    B = g.view(xbc, (d_state, n_group, tps, n_seqs), (d_state * 4, xbc.nb[1], xbc.nb[2]), d_inner * 4)
    C = g.view(
        xbc, (d_state, n_group, tps, n_seqs), (d_state * 4, xbc.nb[1], xbc.nb[2]), (d_inner + n_group * d_state) * 4
    )
    dt = g.op("ADD", f"dt-{il}", (n_head, tps, n_seqs), g.op("CONT", f"dt-{il}", (n_head, tps, n_seqs), dt), None)
    D = d_state * d_inner
    y_ssm = rs(
        il,
        "s",
        D,
        lambda st, ids: g.op(
            "SSM_SCAN",
            f"ssm_scan-{il}",
            (d_inner * T + D * n_seqs,),
            g.reshape(st, d_state, head_dim, n_head, n_seqs),
            x,
            dt,
            B,
            C,
            ids,
        ),
    )
    ssm_state = g.leaf(f"cache_s_l{il} (all)", (D, n_seqs), "f32")
    g.expand(
        g.view_of_op(
            "CPY",
            f"cache_s_l{il} (view)",
            g.view(ssm_state, (D, n_seqs)),
            g.view(y_ssm, (D, n_seqs), (D * 4,), d_inner * T * 4),
        )
    )
    y = g.view(y_ssm, (head_dim, n_head, tps, n_seqs), (head_dim * 4, d_inner * 4, tps * d_inner * 4))
    y = g.op("ADD", f"mamba2_y_add_d-{il}", y.ne, y, g.op("MUL", f"x_d-{il}", x.ne, x, None))
    y = g.op("GLU", f"swiglu-{il}", y.ne, g.op("CONT", f"z-{il}", z.ne, z), y)
    if ssm_norm:
        y = g.reshape(y, d_inner // n_group, n_group, tps, n_seqs)
        y = g.op("MUL", f"ssm_norm-{il}", y.ne, g.op("RMS_NORM", f"norm-{il}", y.ne, y), None)
    cur = g.op("MUL_MAT", f"mamba_out-{il}", (E, T), None, g.reshape(y, d_inner, T))
    return cur


def _nemotron_h(
    g: Graph,
    shape: TransformerShape,
    inpL: Tensor,
    mix,
    T: int,
    n_seqs: int,
    n_out: int,
    out_ids: Tensor,
    rules: BuildRules = VENDORED,
) -> Graph:
    """``llama_model_nemotron_h::graph`` (src/models/nemotron-h.cpp): per layer an RMS norm, then
    one block (``build_mamba2_layer`` of mamba-base.cpp, attention without RoPE, or a ReLU^2 MLP)
    and the residual; the normed ``h_nextn`` (an output), its output rows, the head."""
    E = shape.n_embd
    s_copy = g.input("rs_s_copy", (n_seqs,), "i32")
    for il, L in enumerate(shape.layers):
        inpSA = inpL
        cur = g.op("MUL", f"attn_norm-{il}", (E, T), g.op("RMS_NORM", f"norm-{il}", (E, T), inpL), None)
        if L.mamba:
            cur = _mamba2(g, shape, il, cur, T, n_seqs, s_copy, rules)
        elif L.n_head_kv > 0:
            cur = mix(il, L, cur)
        else:  # build_ffn, ReLU^2, no gate
            up = g.op("MUL_MAT", f"ffn_up-{il}", (L.n_ff, T), None, cur)
            act = g.op("SQR", f"ffn_relu_sqr-{il}", up.ne, g.op("UNARY", f"relu-{il}", up.ne, up))
            cur = g.op("MUL_MAT", f"ffn_out-{il}", (E, T), None, act)
        inpL = g.op("ADD", f"nemotron_h_block_out-{il}", (E, T), cur, inpSA)
    h = g.op("MUL", "h_nextn", (E, T), g.op("RMS_NORM", "norm", (E, T), inpL), None)
    h.is_output = True
    result_norm = g.op("GET_ROWS", "result_norm", (E, n_out), h, out_ids)
    result_norm.is_output = True
    logits = g.op("MUL_MAT", "result_output", (shape.n_vocab, n_out), None, result_norm)
    logits.is_output = True
    g.expand(logits)
    return g


def _falcon_h1(
    g: Graph,
    shape: TransformerShape,
    inpL: Tensor,
    mix,
    T: int,
    n_seqs: int,
    n_out: int,
    out_ids: Tensor,
    rules: BuildRules = VENDORED,
) -> Graph:
    """``llama_model_falcon_h1::graph`` (src/models/falcon-h1.cpp): per layer attention and a Mamba2
    mixer side by side on two norms of the input, their sum added to the residual, then the
    SwiGLU feed-forward and its residual; output norm and head."""
    E = shape.n_embd
    s_copy = g.input("rs_s_copy", (n_seqs,), "i32")
    Tc = T
    for il, L in enumerate(shape.layers):
        inpSA = inpL
        cur = g.op("MUL", f"attn_norm-{il}", (E, T), g.op("RMS_NORM", f"norm-{il}", (E, T), inpL), None)
        attn_out = mix(il, L, cur)
        cur = g.op("MUL", f"ssm_in-{il}", (E, T), g.op("RMS_NORM", f"norm-{il}", (E, T), inpL), None)
        cur = g.op("ADD", f"layer_out-{il}", (E, T), attn_out, _mamba2(g, shape, il, cur, T, n_seqs, s_copy, rules))
        inpSA = g.op("ADD", f"ffn_inp-{il}", (E, T), cur, inpSA)
        if il == len(shape.layers) - 1:
            Tc = n_out
            inpSA = g.op("GET_ROWS", "ffn_inp", (E, Tc), inpSA, out_ids)
        cur = g.op("MUL", f"ffn_norm-{il}", (E, Tc), g.op("RMS_NORM", f"norm-{il}", (E, Tc), inpSA), None)
        gate = g.op("MUL_MAT", f"ffn_gate-{il}", (L.n_ff, Tc), None, cur)
        up = g.op("MUL_MAT", f"ffn_up-{il}", (L.n_ff, Tc), None, cur)
        cur = g.op("MUL_MAT", f"ffn_out-{il}", (E, Tc), None, g.op("GLU", f"ffn_swiglu-{il}", (L.n_ff, Tc), gate, up))
        inpL = g.op("ADD", f"l_out-{il}", (E, Tc), cur, inpSA)
    result_norm = g.op("MUL", "result_norm", (E, Tc), g.op("RMS_NORM", "norm", (E, Tc), inpL), None)
    result_norm.is_output = True
    logits = g.op("MUL_MAT", "result_output", (shape.n_vocab, Tc), None, result_norm)
    logits.is_output = True
    g.expand(logits)
    return g


def _mla(
    g: Graph,
    shape: TransformerShape,
    L: LayerShape,
    il: int,
    cur: Tensor,
    T: int,
    tps: int,
    ns: int,
    flash_attn: bool,
    pos: Tensor,
    cache_input,
) -> Tensor:
    """deepseek2.cpp's absorbed MLA attention (``is_mla``, DeepSeek-V2-Lite's single Q projection):
    Q split in nope/rope parts, the nope part times ``wk_b`` per head, K the normed latent plus the
    roped ``k_pe`` (one head), V a view of the K cache; ``build_attn`` with a K-only cache
    (llm_graph_input_attn_k) and ``build_attn_mha``'s ``v_mla`` product, then ``wo``."""
    kv_lora, rope, k_mla, v_mla = shape.mla
    H, nope, hk = L.n_head, k_mla - rope, kv_lora + rope
    q = g.reshape(g.op("MUL_MAT", f"q-{il}", (k_mla * H, T), None, cur), k_mla, H, T)
    kvp = g.op("MUL_MAT", f"kv_cmpr_pe-{il}", (hk, T), None, cur)
    kv = g.view(kvp, (kv_lora, T), (kvp.nb[1],))
    k_pe = g.view(kvp, (rope, 1, T), (kvp.nb[1], kvp.nb[1]), kv_lora * 4)
    k_pe = g.op("ROPE", f"k_pe-{il}", (rope, 1, T), k_pe, pos)
    kv = g.op("MUL", f"kv_cmpr-{il}", (kv_lora, T), g.op("RMS_NORM", f"norm-{il}", (kv_lora, T), kv), None)
    q_nope = g.view(q, (nope, H, T), (q.nb[1], q.nb[2]))
    q_pe = g.view(q, (rope, H, T), (q.nb[1], q.nb[2]), nope * 4)
    q_pe = g.op("ROPE", f"q_pe-{il}", (rope, H, T), q_pe, pos)
    qa = g.op("MUL_MAT", f"q_nope_absorbed-{il}", (kv_lora, T, H), None, g.permute(q_nope, 0, 2, 1, 3))
    qcur = g.op("CONCAT", f"Qcur-{il}", (hk, H, T), g.permute(qa, 0, 2, 1, 3), q_pe)
    kv3 = g.reshape(kv, kv_lora, 1, T)
    kcur = g.op("CONCAT", f"Kcur-{il}", (hk, 1, T), kv3, k_pe)
    g.expand(qcur)
    g.expand(kv3)
    g.expand(kcur)
    n_kv = L.n_kv
    cache_k = g.leaf(f"cache_k_l{il}", (hk, n_kv * ns), "f16")
    k_idxs = cache_input(False, "attn_inp_k_idxs", (T,), "i64")
    g.expand(g.view_of_op("SET_ROWS", f"cache_k_l{il} (view)", cache_k, g.view(kcur, (hk, T), (kcur.nb[2],)), k_idxs))
    mask = cache_input(False, "attn_inp_kq_mask", (n_kv, tps, 1, ns), "f16" if flash_attn else "f32")
    if not any(t is mask for t, _, _ in g.kv_sized):
        g.kv_sized.append((mask, False, 0))
    qp = g.permute(g.reshape(qcur, hk, H, tps, ns) if ns > 1 else qcur, 0, 2, 1, 3)
    kview = g.permute(g.view(cache_k, (hk, 1, n_kv, ns), (hk * 2, hk * 2, hk * 2 * n_kv)), 0, 2, 1, 3)
    vview = g.permute(g.view(cache_k, (kv_lora, 1, n_kv, ns), (hk * 2, hk * 2, hk * 2 * n_kv)), 0, 2, 1, 3)
    if flash_attn:
        fa = g.op("FLASH_ATTN_EXT", f"fa-{il}", (kv_lora, H, tps, ns), qp, kview, vview, mask)
        o = g.op("MUL_MAT", f"fattn_mla-{il}", (v_mla, tps, H, ns), None, g.permute(fa, 0, 2, 1, 3))
        o = g.op("CONT", f"fattn_mla-{il}", (v_mla, H, tps, ns), g.permute(o, 0, 2, 1, 3))
        attn = g.reshape(o, v_mla * H, T)
    else:
        kq = g.op("MUL_MAT", f"kq-{il}", (n_kv, tps, H, ns), kview, qp)
        sm = g.op("SOFT_MAX", f"kq_soft_max-{il}", kq.ne, kq, mask)
        vc = g.op("CONT", f"v_cont-{il}", (n_kv, kv_lora, 1, ns), g.transpose(vview), etype="f16")
        g.kv_sized += [(kq, False, 0), (sm, False, 0), (vc, False, 0)]
        kqv = g.op("MUL_MAT", f"kqv-{il}", (kv_lora, tps, H, ns), vc, sm)
        kqv = g.op("MUL_MAT", f"kqv_mla-{il}", (v_mla, tps, H, ns), None, kqv)
        attn = g.op("CONT", f"kqv_out-{il}", (v_mla * H, T), g.permute(kqv, 0, 2, 1, 3))
    g.expand(attn)
    return g.op("MUL_MAT", f"attn_out-{il}", (shape.n_embd, T), None, attn)


def _magnitude(g: Graph, x: Tensor) -> Tensor:
    """gemma3n.cpp ``calc_magnitude``: sqrt(sum_rows(x^2))."""
    ne = (1, *x.ne[1:])
    return g.op("SQRT", "magnitude", ne, g.op("SUM_ROWS", "sum_rows", ne, g.op("SQR", "sqr", x.ne, x)))


#: gemma3n.cpp (models.h ``llama_model_gemma3n::graph``): AltUp's active stream, layers with a sparse
#: (gaussian top-k) GELU gate
GEMMA3N_ALTUP_ACTIVE = 0
GEMMA3N_SPARSE_LAYERS = 10


def _gemma3n(
    g: Graph, shape: TransformerShape, inpL: Tensor, ple: Tensor | None, mix, T: int, n_out: int, out_ids: Tensor
) -> Graph:
    """``llama_model_gemma3n::graph`` (src/models/gemma3n.cpp) from the scaled embeddings on: the
    input stacked into ``altup`` streams (magnitude-matched projections), per layer AltUp predict,
    the token mixer on the active stream with LAuReL beside it, the feed-forward (gaussian top-k
    sparse gate in the first 10 layers), AltUp correct and the per-layer embedding added to the
    other streams; then the streams merged back, the output rows, norm, head and logit softcapping."""
    E, A, P = shape.n_embd, shape.altup, shape.per_layer

    def slice2d(x: Tensor, i: int) -> Tensor:  # gemma3n_view_2d_slice
        return g.view(x, (x.ne[0], x.ne[1]), (x.nb[1],), i * x.ne[0] * x.ne[1] * 4)

    def rest(x: Tensor) -> Tensor:  # streams 1.. of [E, T, A]
        return g.view(x, (E, T, A - 1), (x.nb[1], x.nb[2]), E * T * 4)

    def router(x: Tensor) -> Tensor:  # altup_compute_router_modalities
        r = g.op("MUL", "altup_router_norm", (E, T), g.op("RMS_NORM", "norm", (E, T), x), None)
        r = g.op("MUL_MAT", "altup_router", (A, T), None, g.op("SCALE", "router_inputs", (E, T), r))
        return g.op("UNARY", "modalities", (A, T), r)

    target = _magnitude(g, inpL)
    added = g.op("MUL_MAT", "altup_proj", (E, T, A - 1), None, g.op("REPEAT", "inp_repeated", (E, T, A - 1), inpL))
    added = g.op(
        "DIV", "altup_added", added.ne, g.op("MUL", "altup_added", added.ne, added, target), _magnitude(g, added)
    )
    inpL = g.op("CONCAT", "inp_stacked", (E, T, A), inpL, added)
    for il, L in enumerate(shape.layers):
        cur = inpL
        # altup_predict
        coefs = g.op("MUL_MAT", f"all_coefs-{il}", (A * A, T), None, router(slice2d(cur, GEMMA3N_ALTUP_ACTIVE)))
        coefs = g.reshape(coefs, A, A, T)
        perm = g.op("CONT", f"cur_permuted-{il}", (A, E, T), g.permute(cur, 1, 2, 0, 3))
        pred = g.op("MUL_MAT", f"predictions-{il}", (E, A, T), perm, coefs)
        pred = g.op("CONT", f"predictions-{il}", (E, T, A), g.permute(pred, 0, 2, 1, 3))
        pred = g.op("ADD", f"predictions-{il}", (E, T, A), pred, cur)
        active = slice2d(pred, GEMMA3N_ALTUP_ACTIVE)
        cur = g.op("MUL", f"attn_norm-{il}", (E, T), g.op("RMS_NORM", f"norm-{il}", (E, T), active), None)
        # laurel
        lr = g.op("MUL_MAT", f"laurel_r-{il}", (E, T), None, g.op("MUL_MAT", f"laurel_l-{il}", (64, T), None, cur))
        lr = g.op("MUL", f"laurel_post_norm-{il}", (E, T), g.op("RMS_NORM", f"norm-{il}", (E, T), lr), None)
        laurel_out = g.op("ADD", f"laurel_out-{il}", (E, T), lr, cur)
        cur = mix(il, L, cur)
        cur = g.op("MUL", f"attn_post_norm-{il}", (E, T), g.op("RMS_NORM", f"norm-{il}", (E, T), cur), None)
        cur = g.op("ADD", f"attn_gated-{il}", (E, T), cur, active)
        attn_laurel = g.op(
            "SCALE", f"attn_laurel-{il}", (E, T), g.op("ADD", f"attn_laurel-{il}", (E, T), cur, laurel_out)
        )
        cur = g.op("MUL", f"ffn_norm-{il}", (E, T), g.op("RMS_NORM", f"norm-{il}", (E, T), attn_laurel), None)
        F = L.n_ff
        up = g.op("MUL_MAT", f"ffn_up-{il}", (F, T), None, cur)
        gate = g.op("MUL_MAT", f"ffn_gate-{il}", (F, T), None, cur)
        if il < GEMMA3N_SPARSE_LAYERS:  # gaussian_topk
            mean = g.op("MEAN", "mean", (1, T), gate)
            std = g.op(
                "SUM_ROWS", "sum_rows", (1, T), g.op("SQR", "sqr", (F, T), g.op("SUB", "sub", (F, T), gate, mean))
            )
            std = g.op("SQRT", "std", (1, T), g.op("SCALE", "scale", (1, T), std))
            cutoff = g.op("ADD", "cutoff", (1, T), mean, g.op("SCALE", "scale", (1, T), std))
            gate = g.op("UNARY", "relu", (F, T), g.op("SUB", "sub", (F, T), gate, cutoff))
        gate = g.op("UNARY", "gelu", (F, T), gate)
        cur = g.op("MUL_MAT", f"ffn_out-{il}", (E, T), None, g.op("MUL", f"ffn_mul-{il}", (F, T), up, gate))
        cur = g.op("MUL", f"ffn_post_norm-{il}", (E, T), g.op("RMS_NORM", "norm", (E, T), cur), None)
        gated = g.op("ADD", f"attn_ffw_laurel_gated-{il}", (E, T), cur, attn_laurel)
        # altup_correct
        mod = router(gated)
        innovation = g.op("SUB", f"innovation-{il}", (E, T), gated, slice2d(pred, GEMMA3N_ALTUP_ACTIVE))
        coefs = g.op("SCALE", f"all_coefs-{il}", (A, T), g.op("MUL_MAT", f"all_coefs-{il}", (A, T), None, mod))
        coefs = g.op("CONT", f"all_coefs-{il}", (1, T, A), g.transpose(coefs))
        corrected = g.op(
            "MUL", f"corrected-{il}", (E, T, A), g.op("REPEAT", "innovation", (E, T, A), innovation), coefs
        )
        corrected = g.op("ADD", f"corrected-{il}", (E, T, A), corrected, pred)
        first = g.op("MUL", f"first_prediction-{il}", (E, T), slice2d(corrected, GEMMA3N_ALTUP_ACTIVE), None)
        first = g.op("UNARY", "gelu", (P, T), g.op("MUL_MAT", f"inp_gate-{il}", (P, T), None, first))
        if ple is not None:
            first = g.op("MUL", f"first_prediction_scaled-{il}", (P, T), first, slice2d(ple, il))
        first = g.op("MUL_MAT", f"proj-{il}", (E, T), None, first)
        first = g.op("MUL", f"first_prediction_out-{il}", (E, T), g.op("RMS_NORM", f"norm-{il}", (E, T), first), None)
        tmp = g.op("ADD", f"rest-{il}", (E, T, A - 1), rest(corrected), first)
        inpL = g.op("CONCAT", f"l_out-{il}", (E, T, A), slice2d(corrected, 0), tmp)
    cur = inpL
    target = _magnitude(g, slice2d(cur, GEMMA3N_ALTUP_ACTIVE))
    unembd = g.op("MUL_MAT", "altup_unembd", (E, T, A - 1), None, rest(cur))
    unembd = g.op(
        "DIV", "altup_unembd", unembd.ne, g.op("MUL", "altup_unembd", unembd.ne, unembd, target), _magnitude(g, unembd)
    )
    merged = slice2d(cur, 0)
    for i in range(A - 1):
        merged = g.op("ADD", "unembd_merged", (E, T), merged, slice2d(unembd, i))
    merged = g.op("SCALE", "unembd_merged", (E, T), merged)
    rows = g.op("GET_ROWS", "rows", (E, n_out), merged, out_ids)
    result_norm = g.op("MUL", "result_norm", (E, n_out), g.op("RMS_NORM", "norm", (E, n_out), rows), None)
    result_norm.is_output = True
    logits = g.op("MUL_MAT", "result_output", (shape.n_vocab, n_out), None, result_norm)
    logits = g.op(
        "SCALE",
        "result_output",
        logits.ne,
        g.op("UNARY", "tanh", logits.ne, g.op("SCALE", "scaled", logits.ne, logits)),
    )
    logits.is_output = True
    g.expand(logits)
    return g


def _build(
    shape: TransformerShape,
    n_tokens: int,
    n_stream: int,
    flash_attn: bool,
    n_seqs: int = 0,
    n_outputs: int = 0,
    rules: BuildRules = VENDORED,
) -> Graph:
    g = Graph()
    T, E = n_tokens, shape.n_embd
    # graph_reserve's ubatch: n_seq_tokens = ceil(n_tokens / n_seqs) tokens per sequence (n_seqs =
    # n_seq_max), so n_seq_tokens * n_seqs tokens in all (513 for 512 over 3 sequences);
    # n_outputs = min(n_tokens, n_outputs_max) (n_tokens in a generic context, one per slot in
    # llama-server b11434); the KV masks split the tokens over the cache's streams
    ns = max(1, n_stream)
    n_seqs = max(1, n_seqs or ns)
    n_out = min(T, n_outputs) if n_outputs > 0 else T
    T = -(-T // n_seqs) * n_seqs
    tps = T // ns
    s_copy: Tensor | None = None
    attn_scale: Tensor | None = None
    tok = g.input("inp_tokens", (T,), "i32")
    embd = g.op("GET_ROWS", "embd", (E, T), None, tok)
    # build_inp_embd keeps both inputs in the graph (ggml_build_forward_select, llama.cpp PR 18550):
    # the unselected [n_embd, n_tokens] f32 embeddings input is allocated and never freed
    g.expand(embd)
    g.expand(g.input("inp_embd", (E, T), "f32"))
    if rules.mixed_embd:  # b11434: the mixed-batch branch, set_rows of token rows into a dup of its own
        # embeddings input (set_rows' sources: rows, slots, destination); never selected, never freed
        rows = g.op("GET_ROWS", "mixed_rows", (E, T), None, g.input("inp_mixed_tokens", (T,), "i32"))
        slots = g.input("inp_mixed_slots", (T,), "i64")
        dup = g.op("DUP", "mixed_dup", (E, T), g.input("inp_mixed_embd", (E, T), "f32"))
        g.expand(g.view_of_op("SET_ROWS", "mixed_dup (view)", dup, rows, slots))
    pos = g.input("inp_pos", (T,), "i32")
    out_ids = g.input("out_ids", (n_out,), "i32")
    cache_inputs: dict[bool, dict[str, Tensor]] = {}

    def rotate(x: Tensor, size: int, which: str, swa: bool) -> Tensor:
        """``ggml_mul_mat_aux``: ``x`` as rows of ``size`` times the Hadamard matrix, reshaped back."""
        m = cache_input(swa, f"attn_inp_{which}_rot", (size, size), "f32")
        n = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3]
        r = g.op("MUL_MAT", f"{which}_rot", (size, n // size), m, g.reshape(x, size, n // size))
        return g.reshape(r, *x.ne)

    norm_op = "NORM" if shape.layer_norm else "RMS_NORM"  # ggml_norm is not an in-place op, ggml_rms_norm is
    inpL = embd
    if (
        shape.embd_scale and rules.scale_rows and not shape.embd_scale_op
    ):  # b11434: the token rows times an inp_scale_rows input
        inpL = g.op("MUL", "inp_scaled", (E, T), embd, g.input("inp_scale_rows", (1, T), "f32"))
    elif shape.embd_scale:  # gemma: embeddings times sqrt(n_embd)
        inpL = g.op("SCALE", "inp_scaled", (E, T), embd)
    n_layer = len(shape.layers)
    v_width = max(L.head_v * L.n_head_kv for L in shape.layers)  # llama_hparams::n_embd_v_gqa_max
    ple = None
    if shape.per_layer:  # gemma4.cpp build_inp_per_layer: its own token input, rows of per_layer_tok_embd, scaled
        P = shape.per_layer
        ple_tok = g.input("inp_per_layer_tokens", (T,), "i32")
        sel = g.op("GET_ROWS", "per_layer_rows", (P * n_layer, T), None, ple_tok)
        sel = g.op("SCALE", "inp_per_layer_selected", (P, n_layer, T), g.reshape(sel, P, n_layer, T))
        g.expand(sel)
        # project_per_layer_inputs: not expanded, so listed where layer 0 first reads it
        proj = g.op("MUL_MAT", "per_layer_proj", (P * n_layer, T), None, inpL)
        proj = g.reshape(g.op("SCALE", "per_layer_proj", proj.ne, proj), P, n_layer, T)
        proj = g.op("MUL", "per_layer_proj", proj.ne, g.op("RMS_NORM", "norm", proj.ne, proj), None)
        ple = g.op("SCALE", "inp_per_layer", proj.ne, g.op("ADD", "inp_per_layer", proj.ne, proj, sel))
        ple = g.op("CONT", "inp_per_layer (permuted)", (P, T, n_layer), g.permute(ple, 0, 2, 1, 3))

    def cache_input(swa: bool, name: str, ne: tuple[int, ...], etype: str) -> Tensor:
        """One input per KV cache (the sliding-window cache of an iSWA memory has its own)."""
        d = cache_inputs.setdefault(swa, {})
        if name not in d:
            d[name] = g.input(name, ne, etype)
        return d[name]

    def mix(il: int, L: LayerShape, cur: Tensor) -> Tensor:
        """The layer's token mixer on the normed input: attention (build_attn), a short conv or DeciLM's
        linear attention; ``[n_embd, T]`` out."""
        nonlocal s_copy, attn_scale
        w = _weight
        if L.conv:  # lfm2.cpp build_shortconv_block
            if s_copy is None:  # build_rs_inp: one state per sequence (n_rs = n_seqs when reserving)
                s_copy = g.input("rs_s_copy", (n_seqs,), "i32")
            cur = _shortconv(g, L, il, cur, T, n_seqs, s_copy, rules)
        elif shape.mla:
            cur = _mla(g, shape, L, il, cur, T, tps, ns, flash_attn, pos, cache_input)
        elif L.n_head_kv == 0 and L.n_head > 0:  # deci.cpp: "linear attention", the output projection alone
            cur = g.op("MUL_MAT", f"wo-{il}", (E, T), None, cur)
        elif L.n_head_kv > 0:
            hk, hv, H, Hkv = L.head_k, L.head_v, L.n_head, L.n_head_kv
            if shape.fused_qkv:  # phi3: one [n_embd + 2 n_embd_gqa, T] projection, Q/K/V are views of it
                qkv = g.op(
                    "MUL_MAT",
                    f"wqkv-{il}",
                    (hk * H + hk * Hkv + hv * Hkv, T),
                    w("attn_qkv", E, hk * H + 2 * hk * Hkv),
                    cur,
                )
                q = g.view(qkv, (hk, H, T), (hk * 4, qkv.nb[1]), 0)
                k = g.view(qkv, (hk, Hkv, T), (hk * 4, qkv.nb[1]), 4 * hk * H)
                v = g.view(qkv, (hv, Hkv, T), (hv * 4, qkv.nb[1]), 4 * (hk * H + hk * Hkv))
            else:
                q = g.op("MUL_MAT", f"Qcur-{il}", (hk * H, T), w("attn_q", E, hk * H), cur)
                k = g.op("MUL_MAT", f"Kcur-{il}", (hk * Hkv, T), w("attn_k", E, hk * Hkv), cur)
                v = g.op("MUL_MAT", f"Vcur-{il}", (hv * Hkv, T), w("attn_v", E, hv * Hkv), cur)
                if shape.qkv_bias:
                    q = g.op("ADD", f"Qcur-{il}", q.ne, q, w("attn_q.bias", hk * H))
                    k = g.op("ADD", f"Kcur-{il}", k.ne, k, w("attn_k.bias", hk * Hkv))
                    v = g.op("ADD", f"Vcur-{il}", v.ne, v, w("attn_v.bias", hv * Hkv))
                q = g.reshape(q, hk, H, T)
                k = g.reshape(k, hk, Hkv, T)
                v = g.reshape(v, hv, Hkv, T)
            if shape.qk_norm:
                q = g.op(
                    "MUL", f"Qcur_normed-{il}", q.ne, g.op("RMS_NORM", f"norm-{il}", q.ne, q), w("attn_q_norm", hk)
                )
                k = g.op(
                    "MUL", f"Kcur_normed-{il}", k.ne, g.op("RMS_NORM", f"norm-{il}", k.ne, k), w("attn_k_norm", hk)
                )
            if shape.v_norm:
                v = g.op("RMS_NORM", f"Vcur_normed-{il}", v.ne, v)
            if L.nope:  # llama4.cpp: Q times inp_attn_scale (build_inp_attn_scale, [1, 1, n_tokens])
                if attn_scale is None:
                    attn_scale = g.input("inp_attn_scale", (1, 1, T), "f32")
                q = g.op("MUL", f"Qcur-{il}", q.ne, q, attn_scale)
            elif shape.rope:
                q = g.op("ROPE", f"Qcur-{il}", (hk, H, T), q, pos)
                k = g.op("ROPE", f"Kcur-{il}", (hk, Hkv, T), k, pos)
                if shape.qk_norm_after_rope:
                    q = g.op("RMS_NORM", f"Qcur_normed-{il}", q.ne, q)
                    k = g.op("RMS_NORM", f"Kcur_normed-{il}", k.ne, k)
            if shape.q_scale:  # phi3, gemma3: Q scaled before build_attn
                q = g.op("SCALE", f"Qcur-{il}", q.ne, q)
            # build_attn (llama-graph.cpp): the Hadamard rotations of a quantized cache, then
            # Q, V, K expanded in that order (iSWA caches: Q, K, V), then the cache writes
            rot_k, rot_v = (shape.rot_k_swa, shape.rot_v_swa) if L.swa else (shape.rot_k, shape.rot_v)
            if rot_k:
                q = rotate(q, rot_k, "k", L.swa)
            if rot_v:
                v = rotate(v, rot_v, "v", L.swa)
            if rot_k:
                k = rotate(k, rot_k, "k", L.swa)
            g.expand(q)
            shared = L.kv_src >= 0
            if shared:
                pass
            elif L.iswa:
                g.expand(k)
                g.expand(v)
            else:
                g.expand(v)
                g.expand(k)
            n_kv = L.n_kv
            sw = L.swa
            cache_k = g.leaf(f"cache_k_l{il}", (hk * Hkv, n_kv * ns), "f16")
            cache_v = g.leaf(f"cache_v_l{il}", (hv * Hkv, n_kv * ns), "f16")
            if not shared:  # the cache writes (ggml_set_rows), not for a layer reading another's KV
                k_idxs = cache_input(sw, "attn_inp_k_idxs", (T,), "i64")
                kv2 = g.view(k, (hk * Hkv, T), (k.nb[2],))
                g.expand(g.view_of_op("SET_ROWS", f"cache_k_l{il} (view)", cache_k, kv2, k_idxs))
                if flash_attn:
                    vv2 = g.view(v, (hv * Hkv, T), (v.nb[2],))
                    v_idxs = cache_input(sw, "attn_inp_v_idxs", (T,), "i64")
                    g.expand(g.view_of_op("SET_ROWS", f"cache_v_l{il} (view)", cache_v, vv2, v_idxs))
                else:
                    # a transposed V cache has rows of n_embd_v_gqa_max() (the widest layer's V), a
                    # narrower layer's V is padded to it (llama-kv-cache.cpp cpy_v, TAG_V_CACHE_VARIABLE)
                    v_idxs = cache_input(sw, "attn_inp_v_idxs", (T * v_width,), "i64")
                    vr = g.reshape(g.view(v, (hv * Hkv, T), (v.nb[2],)), hv * Hkv, T)
                    if hv * Hkv < v_width:
                        vr = g.op("PAD", f"v_pad-{il}", (v_width, T), vr)
                    vr = g.reshape(vr, 1, T * v_width)
                    g.expand(
                        g.view_of_op(
                            "SET_ROWS",
                            f"cache_v_l{il} (reshaped)",
                            g.reshape(cache_v, 1, v_width * n_kv * ns),
                            vr,
                            v_idxs,
                        )
                    )
            mask = cache_input(sw, "attn_inp_kq_mask", (n_kv, tps, 1, ns), "f16" if flash_attn else "f32")
            if not any(t is mask for t, _, _ in g.kv_sized):
                g.kv_sized.append((mask, sw, 0))
            qp = g.permute(g.reshape(q, hk, H, tps, ns) if ns > 1 else q, 0, 2, 1, 3)
            kview = g.permute(
                g.view(cache_k, (hk, Hkv, n_kv, ns), (hk * 2, hk * Hkv * 2, hk * Hkv * 2 * n_kv)), 0, 2, 1, 3
            )
            if flash_attn:
                vview = g.permute(
                    g.view(cache_v, (hv, Hkv, n_kv, ns), (hv * 2, hv * Hkv * 2, hv * Hkv * 2 * n_kv)), 0, 2, 1, 3
                )
                # build_attn_mha: an f32 cache is cast to f16 for flash attention (ggml_cast: a new
                # tensor, its own second source)
                if shape.k_f32:
                    kview = g.cast_f16(kview)
                    g.kv_sized.append((kview, sw, 1))
                if shape.v_f32:
                    vview = g.cast_f16(vview)
                    g.kv_sized.append((vview, sw, 1))
                fa = g.op("FLASH_ATTN_EXT", f"fa-{il}", (hv, H, tps, ns), qp, kview, vview, mask)
                attn = g.reshape(fa, hv * H, T)
                g.expand(attn)  # build_attn_mha ends with ggml_build_forward_expand(gf, cur)
                if rot_v:
                    attn = rotate(attn, rot_v, "v", L.swa)
            else:
                vview = g.view(cache_v, (n_kv, hv, Hkv, ns), (n_kv * ns * 2, n_kv * ns * 2 * hv, n_kv * 2))
                kq = g.op("MUL_MAT", f"kq-{il}", (n_kv, tps, H, ns), kview, qp)
                sized = [kq]
                if shape.attn_softcap:  # build_attn_mha: kq scaled, tanh, scaled back (in place)
                    for op in ("SCALE", "UNARY", "SCALE"):
                        kq = g.op(op, f"kq_softcap-{il}", kq.ne, kq)
                        sized.append(kq)
                sm = g.op("SOFT_MAX", f"kq_soft_max-{il}", kq.ne, kq, mask)
                g.kv_sized += [(t, sw, 0) for t in (*sized, sm)]
                kq = sm
                kqv = g.op("MUL_MAT", f"kqv-{il}", (hv, tps, H, ns), vview, kq)
                perm = g.permute(kqv, 0, 2, 1, 3)
                attn = g.op("CONT", f"kqv_out-{il}", (hv * H, T), perm)
                g.expand(attn)
            cur = g.op("MUL_MAT", f"attn_out-{il}", (E, T), w("attn_output", hv * H, E), attn)
            if shape.attn_out_bias:
                cur = g.op("ADD", f"attn_out-{il}", (E, T), cur, None)
        return cur

    if shape.altup:
        return _gemma3n(g, shape, inpL, ple, mix, T, n_out, out_ids)
    if shape.ssm and shape.parallel_ssm:
        return _falcon_h1(g, shape, inpL, mix, T, n_seqs, n_out, out_ids, rules)
    if shape.ssm:
        return _nemotron_h(g, shape, inpL, mix, T, n_seqs, n_out, out_ids, rules)
    for il, L in enumerate(shape.layers):
        inpSA = inpL
        w = _weight
        if L.n_head == 0:  # deci.cpp: an attention-free layer (Llama-3.1-Nemotron-51B)
            cur = inpL
        else:
            cur = g.op("MUL", f"attn_norm-{il}", (E, T), g.op(norm_op, f"norm-{il}", (E, T), inpL), w("attn_norm", E))
        if shape.attn_norm_bias:
            cur = g.op("ADD", f"attn_norm-{il}", (E, T), cur, None)
        cur = mix(il, L, cur)
        Tc = T
        if il == n_layer - 1 and not (shape.rows_after_norm or shape.rows_after_layers):  # the output rows only
            Tc = n_out
            cur = g.op("GET_ROWS", "node_out", (cur.ne[0], Tc), cur, out_ids)
            inpSA = g.op("GET_ROWS", "node_sa", (E, Tc), inpSA, out_ids)
        if shape.post_norms:
            cur = g.op(
                "MUL",
                f"attn_post_norm-{il}",
                (E, Tc),
                g.op("RMS_NORM", f"norm-{il}", (E, Tc), cur),
                w("post_attention_norm", E),
            )
        if L.n_head == 0:
            ffn_inp = cur
        elif shape.attn_residual_first:
            ffn_inp = g.op("ADD", f"ffn_inp-{il}", (E, Tc), inpSA, cur)
        else:
            ffn_inp = g.op("ADD", f"ffn_inp-{il}", (E, Tc), cur, inpSA)
        cur = g.op("MUL", f"ffn_norm-{il}", (E, Tc), g.op(norm_op, f"norm-{il}", (E, Tc), ffn_inp), w("ffn_norm", E))
        if shape.ffn_norm_bias:
            cur = g.op("ADD", f"ffn_norm-{il}", (E, Tc), cur, None)
        if L.n_expert:
            cur = _moe_ffn(g, shape, L, cur, Tc)
        elif L.n_ff > 0:
            if shape.fused_up:  # phi3: up and gate in one [2 n_ff, T] projection, SwiGLU of its halves
                up = g.op("MUL_MAT", f"ffn_up-{il}", (2 * L.n_ff, Tc), w("ffn_up", E, 2 * L.n_ff), cur)
                act = g.op("GLU", f"ffn_swiglu-{il}", (L.n_ff, Tc), up)
            else:
                gate = g.op("MUL_MAT", f"ffn_gate-{il}", (L.n_ff, Tc), w("ffn_gate", E, L.n_ff), cur)
                up = g.op("MUL_MAT", f"ffn_up-{il}", (L.n_ff, Tc), w("ffn_up", E, L.n_ff), cur)
                act = g.op("GLU", f"ffn_swiglu-{il}", (L.n_ff, Tc), gate, up)
            cur = g.op("MUL_MAT", f"ffn_out-{il}", (E, Tc), w("ffn_down", L.n_ff, E), act)
        if shape.post_norms:
            cur = g.op(
                "MUL", f"ffn_post_norm-{il}", (E, Tc), g.op("RMS_NORM", "norm", (E, Tc), cur), w("post_ffw_norm", E)
            )
        if shape.residual_first:
            cur = g.op("ADD", f"l_out-{il}", (E, Tc), ffn_inp, cur)
        else:
            cur = g.op("ADD", f"l_out-{il}", (E, Tc), cur, ffn_inp)
        if ple is not None:  # gemma4.cpp: per-layer embedding, gated by the layer's output, added back
            P = shape.per_layer
            pe = g.op("UNARY", f"gelu-{il}", (P, Tc), g.op("MUL_MAT", f"inp_gate-{il}", (P, Tc), None, cur))
            sl = g.view(ple, (P, T), (ple.nb[1],), il * P * T * 4)
            pe = g.op("MUL_MAT", f"proj-{il}", (E, Tc), None, g.op("MUL", f"pe-{il}", (P, Tc), pe, sl))
            pe = g.op("MUL", f"per_layer_embd_out-{il}", (E, Tc), g.op("RMS_NORM", f"norm-{il}", (E, Tc), pe), None)
            cur = g.op("ADD", f"l_out-{il}", (E, Tc), cur, pe)
        inpL = cur
    if shape.rows_after_layers:  # openai-moe.cpp: t_h_nextn = the last layer's output, then its rows
        inpL.is_output = True
        Tc = n_out
        inpL = g.op("GET_ROWS", "rows", (E, Tc), inpL, out_ids)
    result_norm = g.op("MUL", "result_norm", (E, Tc), g.op(norm_op, "norm", (E, Tc), inpL), None)
    if shape.output_norm_bias:
        result_norm = g.op("ADD", "result_norm", (E, Tc), result_norm, None)
    result_norm.is_output = True
    if shape.rows_after_norm:  # gemma4.cpp: the normed h_nextn (an output) for all tokens, then the rows
        Tc = n_out
        result_norm = g.op("GET_ROWS", "result_norm", (E, Tc), result_norm, out_ids)
        result_norm.is_output = True
    logits = g.op("MUL_MAT", "result_output", (shape.n_vocab, Tc), None, result_norm)
    if shape.logit_softcap:  # scale, tanh, scale (in place)
        logits = g.op(
            "SCALE",
            "result_output",
            logits.ne,
            g.op("UNARY", "tanh", logits.ne, g.op("SCALE", "scaled", logits.ne, logits)),
        )
    logits.is_output = True
    g.expand(logits)
    return g


@lru_cache(maxsize=256)
def transformer_reserve_bytes(
    shape: TransformerShape,
    n_tokens: int,
    n_stream: int,
    flash_attn: bool,
    n_seqs: int = 0,
    n_outputs: int = 0,
    rules: BuildRules = VENDORED,
) -> int:
    """The CPU compute buffer llama.cpp reserves for ``shape``, bytes: ggml-alloc's peak over the
    prompt-processing reserve graph of ``n_tokens`` tokens in ``n_stream`` KV streams, the ubatch
    holding ``n_seqs`` sequences (``n_seq_max``; 0: ``n_stream``), ``n_outputs`` of its tokens
    outputs (0: all; :meth:`BuildRules.n_outputs`), built as the build and program of ``rules`` build it.

    Cached per shape and configuration. The whole graph is placed: cutting repeated layers to a
    few periods is *not* exact (the allocator's free list keeps changing for many layers: 5 of 300
    random shapes differed with four periods kept), and exactness is the point. The graph itself
    depends on the KV cell counts only through the masks and scores, so it is built once per
    shape and resized (:func:`_template`); a new context then costs one allocation pass, ~1 ms
    for 32 layers (benchmarks/compute_accuracy.py ``--timing``).
    """
    kv: dict[bool, int] = {}
    for L in shape.layers:
        if L.n_head_kv > 0 and kv.setdefault(L.swa, L.n_kv) != L.n_kv:
            return allocate(_build(shape, n_tokens, n_stream, flash_attn, n_seqs, n_outputs, rules))  # no template
    template = replace(shape, layers=tuple(replace(L, n_kv=0) for L in shape.layers))
    with _TEMPLATE_LOCK:
        g = _template(template, n_tokens, n_stream, flash_attn, n_seqs, n_outputs, rules)
        for t, swa, dim in g.kv_sized:
            t.resize(kv[swa], dim)
        return allocate(g)


_TEMPLATE_LOCK = threading.Lock()


@lru_cache(maxsize=8)
def _template(
    shape: TransformerShape,
    n_tokens: int,
    n_stream: int,
    flash_attn: bool,
    n_seqs: int = 0,
    n_outputs: int = 0,
    rules: BuildRules = VENDORED,
) -> Graph:
    """The reserve graph of ``shape`` (cell counts 0) with placeholder KV sizes, to be resized."""
    shape = replace(shape, layers=tuple(replace(L, n_kv=CTX_PAD_CELLS) for L in shape.layers))
    return _build(shape, n_tokens, n_stream, flash_attn, n_seqs, n_outputs, rules)


#: architectures whose decoder layer :func:`_build` rebuilds, with their fixed traits
#: (src/models/llama.cpp, qwen2.cpp, qwen3.cpp, phi3.cpp, gemma3.cpp); traits that depend on the
#: file (biases, Q/K norms, fused projections) are read from its tensor names
EXACT_ARCHITECTURES: dict[str, dict[str, bool | int]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "phi3": {"q_scale": True, "residual_first": True},
    "gemma3": {"embd_scale": True, "q_scale": True, "post_norms": True},
    # gemma2.cpp: Gemma 3's layer without Q/K norms, attention and final logit soft-capping
    "gemma2": {
        "embd_scale": True,
        "embd_scale_op": True,
        "q_scale": True,
        "post_norms": True,
        "attn_softcap": True,
        "logit_softcap": True,
    },
    "olmoe": {},
    "qwen3moe": {},
    "qwen2moe": {},
    "stablelm": {"layer_norm": True},
    "deci": {},
    "gemma4": {"embd_scale": True, "post_norms": True, "v_norm": True, "rows_after_norm": True},
    "lfm2": {"attn_residual_first": True, "residual_first": True},
    "llama4": {"moe_llama4": True},
    "gemma3n": {"embd_scale": True, "v_norm": True, "altup": 4, "per_layer": 256},
    "nemotron_h": {"rope": False},
    "falcon-h1": {"parallel_ssm": True},
    "gpt-oss": {"attn_out_bias": True, "moe_oai": True, "rows_after_layers": True},
    "glm4moe": {"moe_sigmoid": True},
    "deepseek2": {},
}


def last_layer_rows_only(arch: str) -> bool:
    """Whether llama.cpp's graph of ``arch`` runs its last layer's feed-forward for the output rows
    only: src/models/llama.cpp and most builders take ``ggml_get_rows(cur, inp_out_ids)`` after the
    last layer's attention ("skip computing output for unused tokens"), so a prompt's prefill
    computes that feed-forward for its last token alone. False where the rows are taken after the
    layers (openai-moe.cpp: only with ``cparams.embeddings_nextn_masked``, off by default) or after
    the output norm (gemma4.cpp): :data:`EXACT_ARCHITECTURES` ``rows_after_layers`` /
    ``rows_after_norm``."""
    traits = EXACT_ARCHITECTURES.get(arch, {})
    return not (traits.get("rows_after_layers") or traits.get("rows_after_norm"))


#: MoE architectures with softmax routing (a shared expert only in qwen2moe), and whether they normalize the
#: selected weights (``norm_w`` of their ``build_moe_ffn`` call: llama.cpp Mixtral-style, qwen3moe.cpp
#: true; olmoe.cpp false)
MOE_NORM_W = {"llama": True, "qwen3moe": True, "olmoe": False, "qwen2moe": False, "llama4": False, "gpt-oss": False}


_FACTS: dict[int, tuple[object, tuple]] = {}


def _tensor_facts(tensors: Sequence) -> tuple[set[str], dict[int, tuple], dict[int, int], set[str]]:
    """Layer 0's tensor names (without ``blk.0.``), each layer's ``ffn_up_exps`` shape and shared
    expert width, and the names outside the blocks; remembered per tensor table (a plan runs per
    slider move)."""
    hit = _FACTS.get(id(tensors))
    if hit is not None and hit[0] is tensors:
        return hit[1]
    names = {t.name[len("blk.0.") :] for t in tensors if t.name.startswith("blk.0.")}
    moe_layers = {
        int(t.name.split(".")[1]): tuple(t.shape)
        for t in tensors
        if t.name.startswith("blk.") and t.name.endswith(".ffn_up_exps.weight")
    }
    shexp_ff = {
        int(t.name.split(".")[1]): int(t.shape[1])
        for t in tensors
        if t.name.startswith("blk.") and t.name.endswith(".ffn_up_shexp.weight")
    }
    top = {t.name for t in tensors if not t.name.startswith("blk.")}
    if len(_FACTS) > 16:
        _FACTS.clear()
    _FACTS[id(tensors)] = (tensors, (names, moe_layers, shexp_ff, top))
    return names, moe_layers, shexp_ff, top


def transformer_shape(
    model: ModelProfile, kv_layers: Sequence[LayerKV], type_k: str = "f16", type_v: str = "f16"
) -> TransformerShape | None:
    """The :class:`TransformerShape` of ``model`` when its reserve graph is the one :func:`_build`
    rebuilds, else ``None``: an architecture of :data:`EXACT_ARCHITECTURES` with the layer kinds
    its graph has (shared KV only in Gemma 3n / Gemma 4, recurrent state only in LFM2, Nemotron-H
    and Falcon-H1, NextN blocks only in GLM-4.5, where they are outside the graph; MoE routing as
    :data:`MOE_NORM_W` and the per-architecture flags say), no MLA, and tensors the builder knows
    (layer 0's, or every layer's where layers differ in kind)."""
    extra = EXACT_ARCHITECTURES.get(model.architecture)
    st = model.structure
    if (
        extra is None
        or (st.is_mla and model.architecture != "deepseek2")
        or (st.recurrent_layers and model.architecture not in ("lfm2", "nemotron_h", "falcon-h1"))
    ):
        return None
    rows = st.layers
    n_layer = model.n_layer
    if model.architecture == "glm4moe":  # glm4-moe.cpp: the NextN (MTP) blocks at the end are not in the graph
        rows = tuple(r for r in rows if not r.nextn)
        n_nextn = model.metadata.get("glm4moe.nextn_predict_layers", 0)
        if len(rows) + (n_nextn if isinstance(n_nextn, int) else -1) != model.n_layer:
            return None
        n_layer = len(rows)
    shared_kv = model.architecture in ("gemma4", "gemma3n")  # gemma4.cpp: layers reading an earlier layer's KV
    if len(rows) != n_layer or any((r.reuse >= 0 and not shared_kv) or r.nextn for r in rows):
        return None
    if any(
        not r.kv
        and r.reuse < 0
        and (model.architecture != "deci" or model.n_head_kv[r.il] > 0)
        and not (model.architecture == "lfm2" and r.recurrent and model.n_head_kv[r.il] == 0)
        and model.architecture != "nemotron_h"
        for r in rows
    ):
        return None  # a layer without KV: deci's attention-free and "linear attention" layers, LFM2's short convs
    if any(r.swa for r in rows) and model.architecture not in (
        "gemma2",
        "gemma3",
        "gemma4",
        "lfm2",
        "llama4",
        "gemma3n",
        "gpt-oss",
    ):
        return None
    names, moe_layers, shexp_ff, top = _tensor_facts(model.tensors)
    glm_moe = False
    mla_shape: tuple[int, ...] = ()
    if model.architecture == "glm4moe":  # glm4-moe.cpp: dense leading layers, then MoE with a shared expert;
        # post_attention_norm is the feed-forward norm; sigmoid gating (the default), exp_probs_b
        all_names = {
            t.name.split(".", 2)[2]
            for t in model.tensors
            if t.name.startswith("blk.") and int(t.name.split(".")[1]) < n_layer
        }
        glm = {
            "attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "attn_q.bias",
            "attn_k.bias",
            "attn_v.bias",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "post_attention_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
            "ffn_gate_inp.weight",
            "exp_probs_b.bias",
            "ffn_up_exps.weight",
            "ffn_gate_exps.weight",
            "ffn_down_exps.weight",
            "ffn_up_shexp.weight",
            "ffn_gate_shexp.weight",
            "ffn_down_shexp.weight",
        }
        gating = model.metadata.get("glm4moe.expert_gating_func", 2)
        if (
            not all_names <= glm
            or "exp_probs_b.bias" not in all_names
            or gating not in (0, 2)
            or model.metadata.get("glm4moe.rope.dimension_sections") is not None
            or any(il not in moe_layers for il in range(n_layer) if il >= min(moe_layers, default=n_layer))
        ):
            return None  # another gating, M-RoPE or interleaved dense layers: not rebuilt
        names = (names - {"post_attention_norm.weight"}) | {"ffn_norm.weight"}
        glm_moe = True
    if model.architecture == "deepseek2":  # deepseek2.cpp, absorbed MLA (DeepSeek-V2-Lite's single Q
        # projection), dense leading layers, softmax-routed MoE with shared experts
        a = "deepseek2"
        all_names = {t.name.split(".", 2)[2] for t in model.tensors if t.name.startswith("blk.")}
        ds = {
            "attn_norm.weight",
            "attn_kv_a_norm.weight",
            "attn_q.weight",
            "attn_kv_a_mqa.weight",
            "attn_k_b.weight",
            "attn_v_b.weight",
            "attn_output.weight",
            "ffn_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
            "ffn_gate_inp.weight",
            "ffn_up_exps.weight",
            "ffn_gate_exps.weight",
            "ffn_down_exps.weight",
            "ffn_up_shexp.weight",
            "ffn_gate_shexp.weight",
            "ffn_down_shexp.weight",
        }
        meta = model.metadata
        mla: list[Any] = [
            meta.get(f"{a}.attention.kv_lora_rank"),
            meta.get(f"{a}.rope.dimension_count"),
            meta.get(f"{a}.attention.key_length_mla"),
            meta.get(f"{a}.attention.value_length_mla"),
        ]
        if (
            not st.is_mla
            or not all_names <= ds
            or meta.get(f"{a}.expert_gating_func", 0) not in (0, 1)
            or meta.get(f"{a}.expert_group_count", 0) not in (0, 1)
            or meta.get(f"{a}.attention.temperature_scale") is not None
            or not all(isinstance(x, int) and x > 0 for x in mla)
            or type_k.lower() == "f32"
            or any(il not in moe_layers for il in range(model.n_layer) if il >= min(moe_layers, default=model.n_layer))
        ):
            return None  # the full Q LoRA, sigmoid or grouped routing, temperature tuning: not rebuilt
        mla_shape = tuple(mla)
        glm_moe = True  # per-layer MoE like GLM-4.5
    if model.architecture == "gpt-oss":  # openai-moe.cpp: post_attention_norm is the feed-forward norm
        gpt_oss = {
            "post_attention_norm.weight",
            "attn_sinks.weight",
            "attn_output.bias",
            "ffn_gate_inp.bias",
            "ffn_gate_exps.bias",
            "ffn_down_exps.bias",
            "ffn_up_exps.bias",
        }
        if not gpt_oss <= names:
            return None
        names = (names - gpt_oss) | {"ffn_norm.weight"}
    if "ffn_norm.weight" not in names and model.architecture not in ("nemotron_h", "falcon-h1"):
        return None  # parallel residual (StableLM 2 without ffn_norm), or no feed-forward norm: not rebuilt
    flags: dict[str, Any] = dict(extra)  # TransformerShape keywords of mixed types
    flags["fused_qkv"] = "attn_qkv.weight" in names
    flags["fused_up"] = "ffn_gate.weight" not in names
    flags["qkv_bias"] = "attn_q.bias" in names
    flags["qk_norm"] = "attn_q_norm.weight" in names
    flags["attn_norm_bias"] = "attn_norm.bias" in names
    flags["ffn_norm_bias"] = "ffn_norm.bias" in names
    flags["output_norm_bias"] = "output_norm.bias" in top
    if glm_moe:
        flags["moe_norm_w"] = bool(model.metadata.get(f"{model.architecture}.expert_weights_norm", False))
    if mla_shape:
        flags["mla"] = mla_shape
        names = (names - {"attn_kv_a_norm.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight"}) | {
            "attn_k.weight",
            "attn_v.weight",
        }
    if flags["qk_norm"] and flags.get("layer_norm"):
        return None  # StableLM 2 12B's per-head LayerNorms: not rebuilt
    known = {
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
    d_conv = 0
    nope_step = 0
    if model.architecture in ("nemotron_h", "falcon-h1"):  # nemotron-h.cpp: Mamba2 ('M'), attention ('*') and
        # MLP ('-') layers; falcon-h1.cpp: attention, Mamba2 and a SwiGLU feed-forward in every layer
        a = model.architecture
        ssm = [
            model.metadata.get(f"{a}.ssm.{k}")
            for k in ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")
        ]
        all_names = {t.name.split(".", 2)[2] for t in model.tensors if t.name.startswith("blk.")}
        if (
            not all(isinstance(x, int) and x > 0 for x in ssm)
            or moe_layers
            or all_names
            - {
                "attn_norm.weight",
                "ssm_in.weight",
                "ssm_conv1d.weight",
                "ssm_conv1d.bias",
                "ssm_dt.bias",
                "ssm_a",
                "ssm_d",
                "ssm_norm.weight",
                "ssm_out.weight",
                "attn_q.weight",
                "attn_k.weight",
                "attn_v.weight",
                "attn_output.weight",
                "ffn_up.weight",
                "ffn_down.weight",
                *(("ffn_gate.weight", "ffn_norm", "ffn_norm.weight") if a == "falcon-h1" else ()),
            }
        ):
            return None  # MoE (Nemotron 3), biases or latent projections: not rebuilt
        flags["ssm"] = (*ssm, int("ssm_norm.weight" in all_names))
        flags["fused_up"] = False
        names = set()

    if model.architecture == "llama4":  # llama4.cpp load_arch_hparams: NoPE every 4th layer (n_layer when
        # sliding_window = 0), L2 norms of Q/K unless 128 experts (use_kq_norm)
        window = model.metadata.get("llama4.attention.sliding_window")
        nope_step = model.n_layer if window == 0 else 4
        flags["qk_norm_after_rope"] = model.metadata.get("llama4.expert_count", 0) != 128
        if "attn_q_norm.weight" in names or "attn_q.bias" in names:
            return None
    if model.architecture == "lfm2":  # short-conv layers (layer 0's names may be those of either kind)
        known |= {"shortconv.conv.weight", "shortconv.in_proj.weight", "shortconv.out_proj.weight"}
        l_cache = model.metadata.get("lfm2.shortconv.l_cache", 0)
        if not isinstance(l_cache, int) or l_cache < 2 or moe_layers:
            return None
        d_conv = l_cache - 1
        flags["qk_norm"] = True  # lfm2.cpp: Q and K RMS-normed per head
    if model.architecture == "gemma3n":  # hparams n_altup 4, n_embd_altup 256 (llama-hparams.h, not read from the file)
        known |= {
            "inp_gate.weight",
            "proj.weight",
            "post_norm.weight",
            "altup_correct_coef.weight",
            "altup_correct_scale.weight",
            "altup_predict_coef.weight",
            "altup_router.weight",
            "altup_router_norm.weight",
            "laurel_l.weight",
            "laurel_r.weight",
            "laurel_post_norm.weight",
        }
        if (
            not {"altup_proj.weight", "altup_unembd_proj.weight", "per_layer_token_embd.weight"} <= top
            or "attn_qkv.weight" in names
        ):
            return None
    if model.architecture == "gemma4":  # the per-layer embedding's gate, projection and norm
        known |= {"inp_gate.weight", "proj.weight", "post_norm.weight"}
        ple = model.metadata.get("gemma4.embedding_length_per_layer_input", 0)
        if (
            not isinstance(ple, int)
            or (ple > 0) != ("inp_gate.weight" in names)
            or (ple > 0 and "per_layer_token_embd.weight" not in top)
        ):
            return None
        flags["per_layer"] = ple
        cap = model.metadata.get("gemma4.final_logit_softcapping", 30.0)  # llama-hparams.h default 30
        flags["logit_softcap"] = bool(cap)
        if "attn_k.weight" not in names or "attn_v.weight" not in names:
            return None  # fused QKV or K as V (gemma4.cpp's other branches): not rebuilt
    shexp = {"ffn_gate_inp_shexp.weight", "ffn_up_shexp.weight", "ffn_gate_shexp.weight", "ffn_down_shexp.weight"}
    if names & shexp and not (
        (model.architecture == "qwen2moe" and shexp <= names)
        or (model.architecture == "llama4" and names & shexp == shexp - {"ffn_gate_inp_shexp.weight"})
    ):
        return None
    moe = "ffn_gate_inp.weight" in names
    if moe:
        flags["fused_up"] = False
        if not {"ffn_up_exps.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight"} <= names:
            return None
        if model.architecture not in MOE_NORM_W:
            return None
        flags["moe_norm_w"] = MOE_NORM_W[model.architecture]
    if not names <= known or (flags["fused_up"] and model.architecture != "phi3"):
        return None
    if moe and len(moe_layers) != model.n_layer:
        return None
    if flags["fused_qkv"] and model.architecture != "phi3":
        return None
    cells = {l.il: l.cells for l in kv_layers}
    if len(cells) != sum(r.kv for r in rows):
        return None
    ff = model.metadata.get(f"{model.architecture}.feed_forward_length", 0)
    ffs = [int(x) for x in ff] if isinstance(ff, tuple) else [int(ff) if isinstance(ff, int) else 0] * model.n_layer
    iswa = st.is_iswa
    if model.architecture == "deci" and 0 in ffs:
        return None  # deci.cpp skips the rest of an FFN-free layer ("continue"): not rebuilt
    layers = tuple(
        LayerShape(
            model.n_head[il],
            model.n_head_kv[il],
            r.head_k,
            r.head_v,
            ffs[il],
            cells.get(il if r.reuse < 0 else r.reuse, 0),
            swa=r.swa and iswa,
            iswa=iswa,
            kv_src=r.reuse,
            conv=d_conv if r.recurrent else 0,
            nope=nope_step > 0 and (il + 1) % nope_step == 0,
            mamba=model.architecture in ("nemotron_h", "falcon-h1") and r.recurrent,
            n_expert=int(moe_layers[il][2]) if moe or (glm_moe and il in moe_layers) else 0,
            n_expert_used=model.n_expert_used if moe or (glm_moe and il in moe_layers) else 0,
            n_ff_exp=int(moe_layers[il][1]) if moe or (glm_moe and il in moe_layers) else 0,
            n_ff_shexp=shexp_ff.get(il, 0),
        )
        for il, r in enumerate(rows)
    )
    type_k, type_v = type_k.lower(), type_v.lower()
    if not [l for l in layers if l.n_head_kv > 0]:
        return None
    rot: dict[str, Any] = {}  # TransformerShape keywords (rotation sizes)
    # build_inp_mem_hybrid_iswa (llama-graph.cpp) sets no rotation inputs: a hybrid iSWA memory
    # (LFM2 with a sliding window) is never rotated, whatever the cache type
    hybrid_iswa = bool(st.recurrent_layers) and iswa
    for swa, suffix in (
        () if hybrid_iswa else ((False, ""), (True, "_swa"))
    ):  # each cache of an iSWA memory decides for its own layers
        own = [l for l in layers if l.n_head_kv > 0 and l.kv_src < 0 and l.swa == swa]
        if not own:
            continue
        rot["rot_k" + suffix] = hadamard_size(own[0].head_k) if attn_rotation(type_k, [l.head_k for l in own]) else 0
        # V is rotated block-diagonally by 64 x 64 blocks (llama-kv-cache.cpp, "smaller matrix seems beneficial for V")
        rot["rot_v" + suffix] = 64 if attn_rotation(type_v, [l.head_v for l in own]) else 0
    return TransformerShape(
        model.n_embd, model.n_vocab, layers, **rot, k_f32=type_k == "f32", v_f32=type_v == "f32", **flags
    )
