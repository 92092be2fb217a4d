"""Smaller families, one entry each: Phi-3 (``phi3``), StableLM (``stablelm``), OLMoE (``olmoe``),
OLMo 2 (``olmo2``), AFMoE (``afmoe``), Cohere 2 (``cohere2``), EXAONE 4 (``exaone4``), SmallThinker
(``smallthinker``), and architectures whose memory or loading kvtuner only flags: MiniMax-M3
(``minimax-m3``), Hunyuan (``hy-v3``, ``hy-v4``), ``dots3note``, ``dflash``, MiMo-2 (``mimo2``),
Step-3.5 (``step35``), Cohere 2 MoE (``cohere2moe``).

- phi3: src/models/phi3.cpp, one fused QKV and one fused up+gate projection, Q scaled after RoPE,
  ``l_out = residual + ffn_out``.
- stablelm: stablelm.cpp, LayerNorm with biases (``ggml_norm``) instead of RMSNorm; StableLM 2's
  parallel residual (no ``ffn_norm``) and its 12B per-head Q/K LayerNorms are not rebuilt.
- olmoe: olmoe.cpp, softmax routing without normalized weights.
- olmo2, afmoe: SWA (patterns 4) only with a positive window key (olmo2.cpp, afmoe.cpp).
- cohere2: cohere2.cpp, SWA pattern 4, the window required.
- exaone4: exaone4.cpp, the 64-layer (32B) model is SWA with pattern 4 (window 4096 unless the key).
- smallthinker: smallthinker.cpp, with a window key the window is forced to 4096, dense-first
  pattern 4.
- minimax-m3, hy-v4, dots3note, dflash: special memories of ``create_memory`` (not modelled);
  cohere2moe, hy-v3, mimo2, step35: the loader skips their MTP tensors.
"""

from __future__ import annotations

from ..meta import Hparams, Meta
from .family import WINDOW_KEY, Family, GraphRules, LayerRules, load_swa_pattern, standard_swa


def _exaone4_rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """exaone4.cpp: the 64-layer (32B) model is SWA with pattern 4; the window key overrides 4096."""
    if hp.n_layer == 64:
        r.swa_type, r.n_swa = "standard", 4096
        r.is_swa = load_swa_pattern(m, hp, 4)
    r.n_swa = m.int(WINDOW_KEY, r.n_swa)


def _smallthinker_rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """smallthinker.cpp: window forced to 4096, dense-first pattern 4, when the key has a window."""
    if m.int(WINDOW_KEY, 0) > 0:
        r.swa_type, r.n_swa = "standard", 4096
        r.is_swa = load_swa_pattern(m, hp, 4, dense_first=True)


FAMILIES = (
    Family("phi3", "Phi-3", graph=GraphRules(traits={"q_scale": True, "residual_first": True}, fused=True)),
    Family("stablelm", "StableLM", tested=True, graph=GraphRules(traits={"layer_norm": True})),
    Family("olmoe", "OLMoE", graph=GraphRules(moe_norm_w=False)),
    Family("olmo2", "OLMo 2", load_rules=standard_swa(4, when_window_key=True)),
    Family("afmoe", "AFMoE", load_rules=standard_swa(4, when_window_key=True)),
    Family("cohere2", "Cohere 2", load_rules=standard_swa(4)),
    Family("cohere2moe", "cohere2moe", skips_mtp=True),
    Family("exaone4", "EXAONE 4", load_rules=_exaone4_rules),
    Family("smallthinker", "SmallThinker", load_rules=_smallthinker_rules),
    Family("minimax-m3", "minimax-m3", special_memory=True),
    Family("hy-v3", "hy-v3", skips_mtp=True),
    Family("hy-v4", "hy-v4", special_memory=True),
    Family("dots3note", "dots3note", special_memory=True),
    Family("dflash", "dflash", special_memory=True),
    Family("mimo2", "mimo2", skips_mtp=True),
    Family("step35", "step35", skips_mtp=True),
)
