"""Recurrent and hybrid families: Mamba / RWKV (``mamba``, ``mamba2``, ``rwkv6``, ``rwkv6qwen2``,
``rwkv7``, ``arwkv7``), LFM2 (``lfm2``, ``lfm2moe``), Granite-4.0-H (``granitehybrid``), Jamba
(``jamba``), PLaMo-2 (``plamo2``), Falcon-H1 (``falcon-h1``), Nemotron-H (``nemotron_h``,
``nemotron_h_moe``), MiniMax-01 (``minimax-01``), Kimi-Linear / Kimi-K3 (``kimi-linear``,
``kimi-k3``) and Ling (``bailingmoe3``).

Recurrent architectures (src/llama-arch.cpp ``llm_arch_is_recurrent``) get a
``llama_memory_recurrent`` over the trunk layers; hybrids (``llm_arch_is_hybrid``) a
``llama_memory_hybrid`` whose filters are per family (``llama_model::create_memory``):

- lfm2 / lfm2moe (lfm2.cpp, lfm2moe.cpp): a layer without KV heads is a short-conv layer
  (``shortconv.l_cache`` state columns); lfm2 with a positive window makes every attention layer SWA.
- granitehybrid, jamba, plamo2: a layer without KV heads is a Mamba layer.
- falcon-h1 (falcon-h1.cpp): attention and Mamba2 side by side in every layer, then a SwiGLU
  feed-forward.
- nemotron_h / nemotron_h_moe (nemotron-h.cpp): a layer is Mamba2 (no KV heads, no FFN),
  attention without RoPE (KV heads, no FFN) or an MLP/MoE-only layer (no memory); the MTP
  tensors are skipped.
- minimax-01, kimi-linear, kimi-k3, bailingmoe3: special memories kvtuner does not model.
"""

from __future__ import annotations

from typing import Any

from ..meta import Hparams, Meta
from .family import (
    WINDOW_KEY,
    Family,
    GraphFacts,
    GraphHook,
    GraphRules,
    LayerRules,
    layers_without_kv_heads_recurrent,
)
from .qwen import trunk_layers


def _lfm2_rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """lfm2.cpp: a layer without KV heads is a short-conv (recurrent) layer; a positive window
    makes every attention layer SWA."""
    layers_without_kv_heads_recurrent(m, hp, r)
    n = m.int(WINDOW_KEY, 0)
    if n > 0:
        r.swa_type, r.n_swa = "standard", n
        r.is_swa = [il < hp.n_layer and not r.is_recr[il] for il in range(hp.n_layer_all)]


def _every_layer_recurrent(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """falcon-h1.cpp: attention and Mamba2 in every layer."""
    r.is_recr = [True] * hp.n_layer_all


def _falcon_h1_layers(hp: Hparams, r: LayerRules) -> tuple[list[bool], list[bool]]:
    """Falcon-H1's filters: attention in every layer, recurrent state in the trunk."""
    return [True] * hp.n_layer_all, [il < hp.n_layer for il in range(hp.n_layer_all)]


def _nemotron_h_rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """nemotron-h.cpp: recurrent iff no KV heads and no FFN."""
    r.is_recr = [il < hp.n_layer and hp.n_head_kv[il] == 0 and hp.n_ff[il] == 0 for il in range(hp.n_layer_all)]


def _nemotron_h_layers(hp: Hparams, r: LayerRules) -> tuple[list[bool], list[bool]]:
    """Nemotron-H's filters: attention iff KV heads and no FFN, Mamba iff neither; the rest are
    MLP/MoE-only layers with no memory."""
    L, N = hp.n_layer_all, hp.n_layer
    attn = [not r.is_recr[il] and hp.n_ff[il] == 0 for il in range(L)]
    return attn, [il < N and r.is_recr[il] and hp.n_ff[il] == 0 for il in range(L)]


#: mamba-base.cpp ``build_mamba2_layer``'s tensors, and the attention and MLP ones beside them
_MAMBA2_LAYER_TENSORS = {
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
}


def _mamba2_layers(extra: frozenset[str] = frozenset()) -> GraphHook:
    """The graph hook of nemotron-h.cpp (Mamba2 ('M'), attention ('*') and MLP ('-') layers) and
    falcon-h1.cpp (attention, Mamba2 and a SwiGLU feed-forward in every layer: ``extra``
    tensors): the Mamba2 sizes ``(d_conv, d_inner, d_state, n_head, n_group, ssm_norm)``; MoE
    (Nemotron 3), biases or latent projections: not rebuilt."""

    def hook(f: GraphFacts) -> bool:
        keys = ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")
        ssm = [f.meta(f"ssm.{k}") for k in keys]
        names = f.layer_names()
        if not all(isinstance(x, int) and x > 0 for x in ssm) or f.moe_layers or names - _MAMBA2_LAYER_TENSORS - extra:
            return False
        f.flags["ssm"] = (*ssm, int("ssm_norm.weight" in names))
        f.flags["fused_up"] = False
        f.names = set()
        f.mamba = True
        return True

    return hook


def _lfm2_layers(f: GraphFacts) -> bool:
    """lfm2.cpp: short-conv layers (layer 0's names may be those of either kind), ``l_cache - 1``
    state columns, Q and K RMS-normed per head; MoE: not rebuilt."""
    f.known |= {"shortconv.conv.weight", "shortconv.in_proj.weight", "shortconv.out_proj.weight"}
    l_cache = f.meta("shortconv.l_cache", 0)
    if not isinstance(l_cache, int) or l_cache < 2 or f.moe_layers:
        return False
    f.d_conv = l_cache - 1
    f.flags["qk_norm"] = True
    return True


def _mamba2_graph(traits: dict[str, bool], extra: frozenset[str] = frozenset(), **kw: Any) -> GraphRules:
    """The graph rules of a hybrid with Mamba2 blocks (:func:`_mamba2_layers`): recurrent layers,
    no feed-forward norm required, ``traits`` and the ``extra`` layer tensors of the family."""
    return GraphRules(traits=traits, recurrent=True, needs_ffn_norm=False, layers=_mamba2_layers(extra), **kw)


def _nemotron_h(arch: str, title: str, **kw: Any) -> Family:
    """A Nemotron-H family (nemotron-h.cpp): its layer rules and filters; the MTP tensors are skipped."""
    return Family(
        arch,
        title,
        memory="hybrid",
        load_rules=_nemotron_h_rules,
        hybrid_layers=_nemotron_h_layers,
        skips_mtp=True,
        **kw,
    )


def _recurrent(arch: str, title: str, **kw: Any) -> Family:
    return Family(arch, title, memory="recurrent", **kw)


FAMILIES = (
    _recurrent("mamba", "Mamba", tested=True, recurrent_kind="mamba"),
    _recurrent("mamba2", "Mamba-2"),
    _recurrent("rwkv6", "RWKV-6"),
    _recurrent("rwkv6qwen2", "RWKV-6 Qwen2"),
    _recurrent("rwkv7", "RWKV-7"),
    _recurrent("arwkv7", "ARWKV-7"),
    Family(
        "lfm2",
        "LFM2",
        memory="hybrid",
        load_rules=_lfm2_rules,
        tested=True,
        recurrent_kind="shortconv",
        graph=GraphRules(
            traits={"attn_residual_first": True, "residual_first": True},
            swa=True,
            recurrent=True,
            kvless_layer=lambda model, r: r.recurrent and model.n_head_kv[r.il] == 0,
            layers=_lfm2_layers,
        ),
    ),
    Family(
        "lfm2moe", "LFM2-MoE", memory="hybrid", load_rules=layers_without_kv_heads_recurrent, recurrent_kind="shortconv"
    ),
    Family(
        "granitehybrid",
        "Granite-4.0-H",
        memory="hybrid",
        load_rules=layers_without_kv_heads_recurrent,
        tested=True,
    ),
    Family("jamba", "Jamba", memory="hybrid", load_rules=layers_without_kv_heads_recurrent),
    Family("plamo2", "PLaMo-2", memory="hybrid", load_rules=layers_without_kv_heads_recurrent),
    Family(
        "falcon-h1",
        "Falcon-H1",
        memory="hybrid",
        load_rules=_every_layer_recurrent,
        hybrid_layers=_falcon_h1_layers,
        tested=True,
        parallel_attention=True,
        graph=_mamba2_graph({"parallel_ssm": True}, frozenset({"ffn_gate.weight", "ffn_norm", "ffn_norm.weight"})),
    ),
    _nemotron_h(
        "nemotron_h",
        "Nemotron-H",
        tested=True,
        graph=_mamba2_graph({"rope": False}, kvless_layer=lambda model, r: True),
    ),
    _nemotron_h("nemotron_h_moe", "Nemotron-H MoE"),
    Family("minimax-01", "MiniMax-01", memory="hybrid", hybrid_layers=trunk_layers, special_memory=True),
    Family("kimi-linear", "Kimi-Linear", memory="hybrid", special_memory=True),
    Family("kimi-k3", "kimi-k3", memory="hybrid", special_memory=True),
    Family("bailingmoe3", "bailingmoe3", memory="hybrid", special_memory=True, skips_mtp=True),
)
