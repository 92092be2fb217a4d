"""The Llama family: ``llama`` (and Mixtral-style MoE), ``deci`` (DeciLM / Llama-3.1-Nemotron) and
``llama4``.

- llama: src/models/llama.cpp, every layer full attention; its MoE (Mixtral) routes by softmax
  and normalizes the selected weights.
- deci: src/models/deci.cpp, attention-free layers (no heads) and "linear attention" layers (heads
  but no KV heads) beside ordinary ones; a layer without a feed-forward is skipped whole.
- llama4: src/models/llama4.cpp, chunked attention (chunks of 8192, three chunked then one full)
  unless ``sliding_window = 0``, NoPE layers, L2 Q/K norms unless 128 experts, sigmoid routing with
  the weights applied before the experts and a dense shared expert one expert wide.
"""

from __future__ import annotations

from ..meta import Hparams, Meta
from .family import WINDOW_KEY, Family, GraphFacts, GraphRules, LayerRules, load_swa_pattern
from .tensors import SHARED_EXPERT


def _llama4_rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """llama4.cpp: chunked attention (chunk 8192, 3 chunked - 1 full) unless the file says
    sliding_window = 0; a window key of any other value is overwritten with 8192."""
    if m.has(WINDOW_KEY) and m.int(WINDOW_KEY, 0) == 0:
        return
    r.swa_type, r.n_swa = "chunked", 8192
    r.is_swa = load_swa_pattern(m, hp, 4)


def _llama4_layers(f: GraphFacts) -> bool:
    """llama4.cpp load_arch_hparams: NoPE every 4th layer (n_layer when sliding_window = 0), L2
    norms of Q/K unless 128 experts (use_kq_norm); weighted Q/K norms or Q biases: not rebuilt."""
    window = f.meta("attention.sliding_window")
    f.nope_step = f.model.n_layer if window == 0 else 4
    f.flags["qk_norm_after_rope"] = f.meta("expert_count", 0) != 128
    return "attn_q_norm.weight" not in f.names and "attn_q.bias" not in f.names


def _deci_layers(f: GraphFacts) -> bool:
    """deci.cpp skips the rest of an FFN-free layer ("continue"): not rebuilt."""
    ff = f.meta("feed_forward_length", 0)
    ffs = [int(x) for x in ff] if isinstance(ff, tuple) else [int(ff) if isinstance(ff, int) else 0] * f.model.n_layer
    return 0 not in ffs


FAMILIES = (
    Family("llama", "Llama (and Mixtral-style MoE)", tested=True, graph=GraphRules(moe_norm_w=True)),
    Family(
        "deci",
        "DeciLM",
        tested=True,
        graph=GraphRules(
            # attention-free layers and "linear attention" (heads, no KV heads) layers
            kvless_layer=lambda model, r: model.n_head_kv[r.il] == 0,
            layers=_deci_layers,
        ),
    ),
    Family(
        "llama4",
        "Llama 4",
        load_rules=_llama4_rules,
        tested=True,
        shared_expert_is_expert=True,
        graph=GraphRules(
            traits={"moe_llama4": True},
            moe_norm_w=False,
            swa=True,
            shared_expert=SHARED_EXPERT - {"ffn_gate_inp_shexp.weight"},
            layers=_llama4_layers,
        ),
    ),
)
