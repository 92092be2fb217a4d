"""llama.cpp's hyper-parameters and memory structure, derived from a GGUF header.

:func:`read_hparams` follows ``llama_model_base::load_hparams`` (src/llama-model.cpp): block
count and NextN/MTP blocks, per-layer head counts (``get_key_or_arr``), head sizes
(``n_embd / n_head(0)`` unless ``key_length``/``value_length``, and their ``_swa`` variants).
:func:`derive_structure` then applies the architecture's ``load_arch_hparams`` rules of
src/models/<arch>.cpp (sliding-window patterns, chunked attention, recurrent layer patterns,
shared KV) as its family in :mod:`kvtuner.core.model.arch` writes them, the short-conv and SSM
state sizes, and the layer filters of ``llama_model::create_memory`` (src/llama-model.cpp), giving
a :class:`~kvtuner.core.model.structure.ModelStructure`.

Families whose rules are checked against llama.cpp's dry run in the tests are marked
``tested`` in the registry; any other architecture gets its family's rules (or the generic rule,
every layer has KV) labelled ``approximate`` until a structure probe of the installed llama.cpp
replaces it.
"""

from __future__ import annotations

from .arch import Family, LayerRules, family_of
from .gguf_header import GGUFError
from .meta import Hparams, Meta
from .structure import LayerRole, ModelStructure

__all__ = ["Hparams", "Meta", "derive_structure", "read_hparams"]


def read_hparams(m: Meta, n_layer_all: int, n_embd: int) -> Hparams:
    """Block count, NextN blocks, head counts and head sizes as ``load_hparams`` reads them.

    Head sizes (src/llama-model.cpp ``load_hparams``): when ``n_head(0) > 0``,
    ``n_embd_head_k = n_embd / n_head(0)`` unless ``{arch}.attention.key_length`` (V likewise);
    otherwise 0 and the keys are not read. SWA layers use ``key_length_swa`` /
    ``value_length_swa`` when present.

    Raises:
        GGUFError: malformed keys (one line).
    """
    n_nextn = m.int("{arch}.nextn_predict_layers", 0)
    if n_nextn >= n_layer_all:  # llama.cpp asserts "nextn_predict_layers must be < n_layer" (llama-model.cpp)
        raise GGUFError(
            f"{m.path}: {m.key('{arch}.nextn_predict_layers')} {n_nextn} leaves no layer of block_count {n_layer_all} "
            "to the model (llama.cpp requires fewer)"
        )
    n_head = m.per_layer("{arch}.attention.head_count", n_layer_all, 0)
    assert n_head is not None
    n_head_kv = m.per_layer("{arch}.attention.head_count_kv", n_layer_all, n_head)
    assert n_head_kv is not None
    n_ff = m.per_layer("{arch}.feed_forward_length", n_layer_all, 0)
    assert n_ff is not None
    if n_head[0] > 0:
        hk = m.int("{arch}.attention.key_length", n_embd // n_head[0])
        hv = m.int("{arch}.attention.value_length", n_embd // n_head[0])
    else:
        hk = hv = 0
    hk_swa = m.int("{arch}.attention.key_length_swa", hk)
    hv_swa = m.int("{arch}.attention.value_length_swa", hv)
    return Hparams(m.arch, n_layer_all, n_nextn, n_embd, n_head, n_head_kv, n_ff, hk, hv, hk_swa, hv_swa)


def _state_sizes(m: Meta, hp: Hparams) -> tuple[int, int]:
    """``(n_embd_r, n_embd_s)`` of llama-hparams.cpp: RWKV token shift / wkv state, LFM2's
    short-conv cache ``n_embd * (l_cache - 1)``, or Mamba's conv state
    ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)`` and SSM state ``d_state * d_inner``."""
    wkv = m.int("{arch}.wkv.head_size", 0)
    if wkv:
        return m.int("{arch}.token_shift_count", 2) * hp.n_embd, hp.n_embd * wkv
    l_cache = m.int("{arch}.shortconv.l_cache", 0) if family_of(hp.arch).recurrent_kind == "shortconv" else 0
    d_conv = m.int("{arch}.ssm.conv_kernel", 0)
    d_inner = m.int("{arch}.ssm.inner_size", 0)
    d_state = m.int("{arch}.ssm.state_size", 0)
    n_group = m.int("{arch}.ssm.group_count", 0)
    if l_cache:
        r = hp.n_embd * (l_cache - 1)
    else:
        r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    return r, d_state * d_inner


def _layer_rules(m: Meta, hp: Hparams, fam: Family) -> LayerRules:
    """The family's ``load_arch_hparams`` rules (:attr:`Family.load_rules`), then llama.cpp's
    consistency: no SWA type, no SWA layer; no SWA layer, no SWA cache (llama.cpp asserts
    ``is_swa_any()`` for an iSWA memory)."""
    L = hp.n_layer_all
    r = LayerRules(is_swa=[False] * L, is_recr=[fam.memory == "recurrent"] * L)
    if fam.load_rules is not None:
        fam.load_rules(m, hp, r)
    if r.swa_type == "none":
        r.n_swa = 0
        r.is_swa = [False] * L
    elif not any(r.is_swa):
        r.swa_type, r.n_swa = "none", 0
    return r


def _memory_layers(hp: Hparams, fam: Family, r: LayerRules) -> tuple[str, list[bool], list[bool]]:
    """``create_memory``'s memory kind and its layer filters: ``(memory, attention layers,
    recurrent layers)``. Recurrent: the trunk's state; hybrid (``-iswa`` with a window): the
    family's filters (:attr:`Family.hybrid_layers`); otherwise a KV cache (``iswa`` with a window)
    without the NextN blocks and without the layers that read another layer's KV
    (``has_kv``: ``il < n_layer_kv_from_start``)."""
    L, N = hp.n_layer_all, hp.n_layer
    if fam.memory == "recurrent":
        return "recurrent", [False] * L, [il < N for il in range(L)]
    if fam.memory == "hybrid":
        attn, recr = fam.hybrid_layers(hp, r)
        return ("hybrid-iswa" if r.swa_type != "none" else "hybrid"), attn, recr
    trunk_only = hp.n_nextn > 0 and N > 0
    attn = [(r.kv_from_start < 0 or il < r.kv_from_start) and (not trunk_only or il < N) for il in range(L)]
    return ("iswa" if r.swa_type != "none" else "kv"), attn, [False] * L


def _shared_kv(m: Meta, hp: Hparams, fam: Family, r: LayerRules) -> list[int]:
    """Per layer, the layer whose KV it reads, or -1 (Gemma 3n / Gemma 4: the last layers read
    the last full or SWA layer with its own cache, llama-model.cpp ``create_memory``'s reuse).

    Raises:
        GGUFError: fewer than 2 layers keep their own KV.
    """
    L = hp.n_layer_all
    reuse = [-1] * L
    if fam.shares_kv and fam.memory != "hybrid":
        if r.kv_from_start < 2:
            raise GGUFError(
                f"{m.path}: {hp.arch} needs at least 2 layers with their own KV cache (shared_kv_layers too large)"
            )
        for il in range(r.kv_from_start, L):
            reuse[il] = r.kv_from_start - (2 if r.is_swa[il] else 1)
    return reuse


def _source(fam: Family) -> tuple[str, str]:
    """``(source, note)`` of the structure: ``analytic`` for families checked against llama.cpp,
    ``approximate`` (with why) for special memories and unchecked rules."""
    a = fam.arch
    if fam.special_memory:
        return "approximate", (
            f"{a}: llama.cpp builds a special cache for this architecture that kvtuner does not model; "
            "figures are approximate"
        )
    if fam.tested:
        return "analytic", ""
    return "approximate", (
        f"{a}: kvtuner's per-layer rules for this architecture are not checked against llama.cpp; "
        "figures are approximate"
    )


def derive_structure(m: Meta, hp: Hparams, layer_bytes: tuple[int, ...] = ()) -> ModelStructure:
    """The memory structure llama.cpp builds for this model (see the module docstring).

    Follows ``llama_model::create_memory`` (src/llama-model.cpp) with the architecture's family
    (:func:`kvtuner.core.model.arch.family_of`): recurrent architectures get a
    ``llama_memory_recurrent`` over the trunk layers; hybrids a ``llama_memory_hybrid`` (or
    ``_iswa`` with a window) whose attention/recurrent filters are the family's; everything else
    a ``llama_kv_cache`` (or ``_iswa`` when ``swa_type != NONE``) without the NextN blocks and with
    Gemma 3n / Gemma 4's reuse of the last KV layers.

    Args:
        m: metadata accessor.
        hp: the generic hyper-parameters.
        layer_bytes: weight bytes per block (for the skipped MTP tensors).

    Raises:
        GGUFError: a key this architecture requires is missing or malformed.
    """
    fam = family_of(hp.arch)
    L, N = hp.n_layer_all, hp.n_layer
    r = _layer_rules(m, hp, fam)
    memory, attn, recr = _memory_layers(hp, fam, r)
    reuse = _shared_kv(m, hp, fam, r)
    is_mla = m.int("{arch}.attention.key_length_mla", 0) > 0 and m.int("{arch}.attention.value_length_mla", 0) > 0
    state_r, state_s = _state_sizes(m, hp) if any(recr) else (0, 0)

    def head_k(il: int) -> int:
        return hp.head_k_swa if r.is_swa[il] else hp.head_k_full

    def head_v(il: int) -> int:
        return hp.head_v_swa if r.is_swa[il] else hp.head_v_full

    layers = tuple(
        LayerRole(
            il=il,
            kv=attn[il],
            swa=r.is_swa[il],
            reuse=reuse[il],
            recurrent=recr[il],
            nextn=il >= N,
            k_width=head_k(il) * hp.n_head_kv[il],
            v_width=head_v(il) * hp.n_head_kv[il],
            head_k=head_k(il),
            head_v=head_v(il),
        )
        for il in range(L)
    )
    skipped = (
        tuple(layer_bytes[il] if (il >= N and fam.skips_mtp and il < len(layer_bytes)) else 0 for il in range(L))
        if layer_bytes
        else ()
    )
    source, note = _source(fam)
    return ModelStructure(
        layers=layers,
        n_layer=N,
        memory=memory,
        n_swa=r.n_swa,
        swa_type=r.swa_type,
        state_r=state_r,
        state_s=state_s,
        is_mla=is_mla,
        v_width_max=max((x.v_width for x in layers), default=0),
        source=source,
        note=note,
        skipped_layer_bytes=skipped,
    )
