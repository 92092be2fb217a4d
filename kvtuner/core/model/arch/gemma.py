"""The Gemma family: ``gemma2``, ``gemma3``, ``gemma3n``, ``gemma4`` and Gemma 4's assistant model
(``gemma4-assistant``).

- gemma2: src/models/gemma2.cpp, standard SWA (window 4096 unless the key says otherwise,
  pattern 2), scaled embeddings (``ggml_scale`` in every build), post-norms, attention and final
  logit soft-capping.
- gemma3: src/models/gemma3.cpp, SWA (pattern 6) only with a positive window key, scaled
  embeddings and Q, post-norms.
- gemma3n: src/models/gemma3n.cpp, SWA pattern 5, KV only in the first 20 layers (the rest read
  it), AltUp streams (n_altup 4), LAuReL, per-layer embeddings (n_embd_altup 256,
  llama-hparams.h), a sparse GELU gate in the first 10 layers.
- gemma4: src/models/gemma4.cpp, the per-layer SWA pattern array (required), the last
  ``shared_kv_layers`` layers reading earlier KV, V RMS-normed, per-layer embeddings, the output
  rows taken after the output norm, final logit soft-capping (default 30).
- gemma4-assistant: an assistant model sharing another context's KV (``create_memory``): not modelled.
"""

from __future__ import annotations

from ..gguf_header import GGUFError
from ..meta import Hparams, Meta
from .family import WINDOW_KEY, Family, GraphFacts, GraphRules, LayerRules, load_swa_pattern, standard_swa


def _gemma3n_rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """gemma3n.cpp: pattern 5, KV only in the first 20 layers, window required."""
    r.swa_type = "standard"
    r.is_swa = load_swa_pattern(m, hp, 5)
    r.kv_from_start = 20
    r.n_swa = m.int(WINDOW_KEY, required=True)


def _gemma4_rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """gemma4.cpp: the per-layer pattern array is required; the last shared_kv_layers layers read
    the KV of earlier ones."""
    L = hp.n_layer_all
    arr = m.bool_array("{arch}.attention.sliding_window_pattern", L)
    if arr is None:
        raise GGUFError(
            f"{m.path}: missing metadata array {m.key('{arch}.attention.sliding_window_pattern')} (gemma4 needs it)"
        )
    r.swa_type = "standard"
    r.is_swa = list(arr) + [False] * (L - len(arr))
    r.kv_from_start = L - m.int("{arch}.attention.shared_kv_layers", 0)
    r.n_swa = m.int(WINDOW_KEY, required=True)


#: gemma3n.cpp / gemma4.cpp per-layer embedding tensors of a layer (gate, projection, norm)
_PER_LAYER_TENSORS = {"inp_gate.weight", "proj.weight", "post_norm.weight"}


def _gemma3n_layers(f: GraphFacts) -> bool:
    """AltUp, LAuReL and per-layer embedding tensors; the model-level AltUp projections and the
    per-layer token embeddings must be there, and no fused QKV."""
    f.known |= _PER_LAYER_TENSORS | {
        "altup_correct_coef.weight",
        "altup_correct_scale.weight",
        "altup_predict_coef.weight",
        "altup_router.weight",
        "altup_router_norm.weight",
        "laurel_l.weight",
        "laurel_r.weight",
        "laurel_post_norm.weight",
    }
    return {
        "altup_proj.weight",
        "altup_unembd_proj.weight",
        "per_layer_token_embd.weight",
    } <= f.top and "attn_qkv.weight" not in f.names


def _gemma4_layers(f: GraphFacts) -> bool:
    """The per-layer embedding's gate, projection and norm (present iff
    ``embedding_length_per_layer_input > 0``), final logit soft-capping (llama-hparams.h default
    30); fused QKV or K as V (gemma4.cpp's other branches): not rebuilt."""
    f.known |= _PER_LAYER_TENSORS
    ple = f.meta("embedding_length_per_layer_input", 0)
    if (
        not isinstance(ple, int)
        or (ple > 0) != ("inp_gate.weight" in f.names)
        or (ple > 0 and "per_layer_token_embd.weight" not in f.top)
    ):
        return False
    f.flags["per_layer"] = ple
    cap = f.meta("final_logit_softcapping", 30.0)
    f.flags["logit_softcap"] = bool(cap)
    return "attn_k.weight" in f.names and "attn_v.weight" in f.names


FAMILIES = (
    Family(
        "gemma2",
        "Gemma 2",
        load_rules=standard_swa(2, window=4096),
        graph=GraphRules(
            traits={
                "embd_scale": True,
                "embd_scale_op": True,
                "q_scale": True,
                "post_norms": True,
                "attn_softcap": True,
                "logit_softcap": True,
            },
            swa=True,
        ),
    ),
    Family(
        "gemma3",
        "Gemma 3",
        load_rules=standard_swa(6, when_window_key=True),
        tested=True,
        graph=GraphRules(traits={"embd_scale": True, "q_scale": True, "post_norms": True}, swa=True),
    ),
    Family(
        "gemma3n",
        "Gemma 3n",
        load_rules=_gemma3n_rules,
        shares_kv=True,
        tested=True,
        per_layer_default=256,
        graph=GraphRules(
            traits={"embd_scale": True, "v_norm": True, "altup": 4, "per_layer": 256},
            swa=True,
            layers=_gemma3n_layers,
        ),
    ),
    Family(
        "gemma4",
        "Gemma 4",
        load_rules=_gemma4_rules,
        shares_kv=True,
        tested=True,
        graph=GraphRules(
            traits={"embd_scale": True, "post_norms": True, "v_norm": True, "rows_after_norm": True},
            swa=True,
            layers=_gemma4_layers,
        ),
    ),
    Family("gemma4-assistant", "gemma4-assistant", special_memory=True),
)
