"""The Qwen family: ``qwen2``, ``qwen2moe``, ``qwen3``, ``qwen3moe`` (plain transformers) and the hybrid
``qwen35``, ``qwen35moe``, ``qwen3next``, ``qwen4exp``.

- qwen2 / qwen3: src/models/qwen2.cpp (Q/K/V biases), qwen3.cpp (per-head Q/K RMS norms); the
  biases and norms are read from the tensor names.
- qwen2moe: qwen2moe.cpp, softmax routing without normalized weights and a dense shared expert
  gated by ``sigmoid(ffn_gate_inp_shexp x)``; qwen3moe: qwen3moe.cpp, softmax routing, weights
  normalized.
- qwen35 / qwen35moe / qwen3next: qwen35.cpp, qwen35moe.cpp, qwen3next.cpp: Gated-DeltaNet layers
  (delta-net-base.cpp) and every ``full_attention_interval``-th layer attention (or the
  ``attention.recurrent_layers`` array), the query projected with its gate; the memory's filters
  keep to the trunk (MTP blocks never recurrent); the MTP tensors are skipped.
- qwen4exp: a hybrid with a special memory (``create_memory``): not modelled.
"""

from __future__ import annotations

from ..gguf_header import GGUFError
from ..meta import Hparams, Meta
from .family import Family, GraphRules, LayerRules
from .tensors import SHARED_EXPERT


def _delta_net_rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """qwen35.cpp / qwen35moe.cpp / qwen3next.cpp: attention.recurrent_layers if present, else every
    full_attention_interval-th layer (default 4) is attention; MTP blocks never recurrent."""
    L, N = hp.n_layer_all, hp.n_layer
    arr = m.bool_array("{arch}.attention.recurrent_layers", L)
    if arr is not None:
        r.is_recr = list(arr) + [False] * (L - len(arr))
        return
    interval = m.int("{arch}.full_attention_interval", 4)
    if interval == 0:
        raise GGUFError(f"{m.path}: {m.key('{arch}.full_attention_interval')} is 0")
    r.is_recr = [il < N and (il + 1) % interval != 0 for il in range(L)]


def trunk_layers(hp: Hparams, r: LayerRules) -> tuple[list[bool], list[bool]]:
    """``create_memory``'s filters of Qwen3-Next / Qwen3.5 / MiniMax-01: trunk layers only,
    attention where ``!is_recr``, recurrent state where ``is_recr``."""
    L, N = hp.n_layer_all, hp.n_layer
    return [il < N and not r.is_recr[il] for il in range(L)], [il < N and r.is_recr[il] for il in range(L)]


def _delta_net(arch: str, title: str) -> Family:
    return Family(
        arch,
        title,
        memory="hybrid",
        load_rules=_delta_net_rules,
        hybrid_layers=trunk_layers,
        skips_mtp=True,
        tested=True,
        recurrent_kind="delta_net",
        gated_attention=True,
    )


FAMILIES = (
    Family("qwen2", "Qwen2", tested=True, graph=GraphRules()),
    Family("qwen2moe", "Qwen2-MoE", graph=GraphRules(moe_norm_w=False, shared_expert=SHARED_EXPERT)),
    Family("qwen3", "Qwen3", tested=True, graph=GraphRules()),
    Family("qwen3moe", "Qwen3-MoE", graph=GraphRules(moe_norm_w=True)),
    _delta_net("qwen35", "Qwen3.5"),
    _delta_net("qwen35moe", "Qwen3.5-MoE"),
    _delta_net("qwen3next", "Qwen3-Next"),
    Family("qwen4exp", "qwen4exp", memory="hybrid", hybrid_layers=trunk_layers, special_memory=True),
)
