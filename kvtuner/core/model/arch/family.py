"""What kvtuner knows about one architecture (GGUF ``general.architecture``), as one record.

A :class:`Family` carries, for one architecture, everything the planner reads that differs between
architectures:

- the memory llama.cpp builds (``llm_arch_is_recurrent`` / ``llm_arch_is_hybrid`` of
  src/llama-arch.cpp, the special memories of ``llama_model::create_memory``), the parts of
  ``load_arch_hparams`` (src/models/<arch>.cpp) that decide memory (:attr:`Family.load_rules`),
  the hybrid memory's layer filters and Gemma 3n / Gemma 4's shared KV: read by
  :func:`kvtuner.core.model.hparams.derive_structure`;
- whether the reserve graph is rebuilt node by node and with which fixed traits and tensor checks
  (:class:`GraphRules`): read by :func:`kvtuner.core.plan.reserve_graph.transformer_shape`;
- what the phase estimate of the compute buffer needs (the recurrent block's kind, Qwen3.5's gated
  query, Gemma 3n's per-layer embeddings, Llama 4's shared expert): read by
  :mod:`kvtuner.core.plan.compute_buffer`;
- whether the last layer's feed-forward runs for the output rows only: read by the speed model
  (:func:`kvtuner.core.plan.reserve_graph.last_layer_rows_only`).

The families themselves are in the modules of this package, registered in one table
(:data:`kvtuner.core.model.arch.REGISTRY`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..meta import Hparams, Meta
from ..structure import LayerRole


@dataclass
class LayerRules:
    """What ``load_arch_hparams`` sets that decides memory (mutable while the rules run).

    ``is_swa`` / ``is_recr`` have ``n_layer_all`` entries; ``swa_type`` is ``none``, ``standard``
    or ``chunked``; ``kv_from_start`` is llama-hparams.cpp's ``n_layer_kv_from_start`` (-1: every
    layer has its own KV)."""

    is_swa: list[bool]
    is_recr: list[bool]
    n_swa: int = 0
    swa_type: str = "none"
    kv_from_start: int = -1


def swa_pattern(n_layer: int, n_layer_all: int, n_pattern: int, dense_first: bool) -> list[bool]:
    """llama-hparams.cpp ``set_swa_pattern``: with dense_first layer 0 of each group is full,
    otherwise the last of each group of ``n_pattern``; pattern 0 = every layer SWA; NextN
    blocks are never SWA."""
    out = []
    for il in range(n_layer_all):
        if il >= n_layer:
            out.append(False)
        elif dense_first:
            out.append(n_pattern == 0 or il % n_pattern != 0)
        else:
            out.append(n_pattern == 0 or il % n_pattern < n_pattern - 1)
    return out


def load_swa_pattern(m: Meta, hp: Hparams, n_pattern: int, dense_first: bool = False) -> list[bool]:
    """llama-model.cpp ``load_swa_pattern``: the ``sliding_window_pattern`` array if present,
    else its scalar (default ``n_pattern``) through ``set_swa_pattern``."""
    arr = m.bool_array("{arch}.attention.sliding_window_pattern", hp.n_layer_all)
    if arr is not None:
        return list(arr) + [False] * (hp.n_layer_all - len(arr))
    n = m.int("{arch}.attention.sliding_window_pattern", n_pattern)
    return swa_pattern(hp.n_layer, hp.n_layer_all, n, dense_first)


#: the sliding-window key of ``load_arch_hparams`` (``LLM_KV_ATTENTION_SLIDING_WINDOW``)
WINDOW_KEY = "{arch}.attention.sliding_window"


def standard_swa(pattern: int, *, window: int | None = None, when_window_key: bool = False) -> RulesFn:
    """The rule of most SWA families: ``swa_type = STANDARD``, the window from the key (``window``
    its default, None: required) and ``load_swa_pattern`` with ``pattern``; with
    ``when_window_key`` only when the key holds a positive window (gemma3.cpp, olmo2.cpp,
    afmoe.cpp)."""

    def rules(m: Meta, hp: Hparams, r: LayerRules) -> None:
        if when_window_key:
            n = m.int(WINDOW_KEY, 0)
            if n <= 0:
                return
            r.swa_type, r.n_swa = "standard", n
        else:
            r.swa_type = "standard"
            r.n_swa = m.int(WINDOW_KEY, window) if window is not None else m.int(WINDOW_KEY, required=True)
        r.is_swa = load_swa_pattern(m, hp, pattern)

    return rules


def layers_without_kv_heads_recurrent(m: Meta, hp: Hparams, r: LayerRules) -> None:
    """A trunk layer without KV heads is a recurrent (Mamba / short-conv) layer (granite-hybrid.cpp,
    jamba.cpp, plamo2.cpp, lfm2.cpp)."""
    r.is_recr = [il < hp.n_layer and hp.n_head_kv[il] == 0 for il in range(hp.n_layer_all)]


def trunk_split(hp: Hparams, r: LayerRules) -> tuple[list[bool], list[bool]]:
    """``create_memory``'s default hybrid filters: attention where ``!is_recr``, recurrent state
    where ``is_recr`` in the trunk (src/llama-model.cpp)."""
    L, N = hp.n_layer_all, hp.n_layer
    return [not r.is_recr[il] for il in range(L)], [il < N and r.is_recr[il] for il in range(L)]


#: ``load_arch_hparams``'s memory rules of one family (mutates the :class:`LayerRules`)
RulesFn = Callable[[Meta, Hparams, LayerRules], None]
#: a hybrid memory's layer filters: (attention layers, recurrent layers), ``n_layer_all`` each
HybridFn = Callable[[Hparams, LayerRules], tuple[list[bool], list[bool]]]


@dataclass
class GraphFacts:
    """What :func:`kvtuner.core.plan.reserve_graph.transformer_shape` has read of a model while it
    decides whether the reserve graph can be rebuilt; a family's hooks read and adjust it.

    ``model`` is the :class:`~kvtuner.core.model.profile.ModelProfile` (typed loosely: the profile
    module imports this package). ``names``: layer 0's tensor names without ``blk.0.``;
    ``moe_layers``: layer -> ``ffn_up_exps`` shape; ``top``: names outside the blocks; ``flags``:
    :class:`~kvtuner.core.plan.reserve_graph.TransformerShape` keywords; ``known``: the layer
    tensor names the builder knows; ``d_conv``: LFM2's short-conv state columns; ``nope_step``:
    Llama 4's NoPE period (0: none); ``moe_per_layer``: only the layers with experts are MoE
    (dense leading layers); ``mamba``: recurrent layers are Mamba2 blocks."""

    model: Any
    n_layer: int
    type_k: str
    names: set[str]
    moe_layers: dict[int, tuple]
    top: set[str]
    flags: dict[str, Any] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    d_conv: int = 0
    nope_step: int = 0
    moe_per_layer: bool = False
    mamba: bool = False

    def layer_names(self, below: int | None = None) -> set[str]:
        """Every layer's tensor names without ``blk.N.`` (of layers ``< below`` when given)."""
        return {
            t.name.split(".", 2)[2]
            for t in self.model.tensors
            if t.name.startswith("blk.") and (below is None or int(t.name.split(".")[1]) < below)
        }

    def meta(self, key: str, default: Any = None) -> Any:
        """The metadata value of ``{arch}.key``."""
        return self.model.metadata.get(f"{self.model.architecture}.{key}", default)


#: a graph hook: adjusts the facts, False when the model is not one the builder rebuilds
GraphHook = Callable[[GraphFacts], bool]


@dataclass(frozen=True)
class GraphRules:
    """How :func:`kvtuner.core.plan.reserve_graph.transformer_shape` rebuilds a family's reserve graph.

    Attributes:
        traits: fixed :class:`~kvtuner.core.plan.reserve_graph.TransformerShape` keywords of the
            family's builder (src/models/<arch>.cpp); traits that depend on the file (biases, Q/K
            norms, fused projections) are read from its tensor names.
        swa: sliding-window / chunked layers are rebuilt.
        recurrent: recurrent (short-conv, Mamba2) layers are rebuilt.
        mla: DeepSeek-V2's absorbed MLA is rebuilt.
        moe_norm_w: softmax-routed MoE layers are rebuilt, and whether they normalize the selected
            weights (``norm_w`` of their ``build_moe_ffn`` call); None: no such MoE.
        drops_nextn: the NextN (MTP) blocks at the end are outside the graph (glm4-moe.cpp).
        needs_ffn_norm: a layer without ``ffn_norm`` is not rebuilt (a parallel residual).
        fused: Phi-3's fused QKV and up+gate projections.
        shared_expert: the shared-expert tensors its MoE layer has (empty: none).
        kvless_layer: which layers without a KV cache the builder rebuilds (``(model, role)``).
        tensors: hook run on layer 0's tensor names before the name-derived traits are read.
        layers: hook run after them (recurrent sizes, NoPE period, per-layer embeddings).
    """

    traits: Mapping[str, bool | int] = field(default_factory=dict)
    swa: bool = False
    recurrent: bool = False
    mla: bool = False
    moe_norm_w: bool | None = None
    drops_nextn: bool = False
    needs_ffn_norm: bool = True
    fused: bool = False
    shared_expert: frozenset[str] = frozenset()
    kvless_layer: Callable[[Any, LayerRole], bool] | None = None
    tensors: GraphHook | None = None
    layers: GraphHook | None = None


@dataclass(frozen=True)
class Family:
    """One architecture as kvtuner plans it (module docstring).

    Attributes:
        arch: GGUF ``general.architecture`` (llama-arch.cpp ``LLM_ARCH_NAMES``).
        title: the family's name in documents.
        memory: ``kv``, ``recurrent`` (``llm_arch_is_recurrent``) or ``hybrid``
            (``llm_arch_is_hybrid``).
        load_rules: the memory-deciding part of ``load_arch_hparams`` (None: every layer full
            attention).
        hybrid_layers: a hybrid memory's attention / recurrent layer filters (``create_memory``).
        shares_kv: the last layers read earlier layers' KV (Gemma 3n / Gemma 4 ``n_layer_kv_from_start``).
        special_memory: ``create_memory`` builds a memory kvtuner does not model (figures approximate).
        skips_mtp: the loader skips the MTP/NextN tensors unless ``load_mtp`` (never loaded).
        tested: the structure rules are checked against llama.cpp's dry run in the tests.
        recurrent_kind: the recurrent block: ``mamba2`` (mamba-base.cpp), ``mamba`` (Mamba-1),
            ``shortconv`` (lfm2.cpp, ``shortconv.l_cache`` state) or ``delta_net``
            (delta-net-base.cpp, Qwen3.5 / Qwen3-Next).
        gated_attention: Qwen3.5 / Qwen3-Next's attention projects the query with its gate.
        parallel_attention: attention beside the recurrent block in every layer (Falcon-H1).
        per_layer_default: ``embedding_length_per_layer_input`` when the key is absent (Gemma 3n: 256).
        shared_expert_is_expert: the shared expert is one expert wide (llama4.cpp).
        same_kv_types: ``llama_init_from_model`` (src/llama-context.cpp) refuses different K and V
            cache types for this architecture, as for every MLA model ("model does not support
            different K and V cache types").
        graph: how the reserve graph is rebuilt node by node (None: the phase estimate).
    """

    arch: str
    title: str
    memory: str = "kv"
    load_rules: RulesFn | None = None
    hybrid_layers: HybridFn = trunk_split
    shares_kv: bool = False
    special_memory: bool = False
    skips_mtp: bool = False
    tested: bool = False
    recurrent_kind: str = "mamba2"
    gated_attention: bool = False
    parallel_attention: bool = False
    per_layer_default: int = 0
    shared_expert_is_expert: bool = False
    graph: GraphRules | None = None
    same_kv_types: bool = False
