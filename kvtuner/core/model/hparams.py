"""llama.cpp's hyper-parameters and memory structure, derived from a GGUF header.

:func:`read_hparams` follows ``llama_model_base::load_hparams`` (src/llama-model.cpp): block
count and NextN/MTP blocks, per-layer head counts (``get_key_or_arr``), head sizes
(``n_embd / n_head(0)`` unless ``key_length``/``value_length``, and their ``_swa`` variants).
:func:`derive_structure` then applies the per-architecture ``load_arch_hparams`` rules of
src/models/<arch>.cpp (sliding-window patterns, chunked attention, recurrent layer patterns,
shared KV, short-conv and SSM state sizes) and the layer filters of ``llama_model::create_memory``
(src/llama-model.cpp), giving a :class:`~kvtuner.core.model.structure.ModelStructure`.

Architectures whose rules are written here *and* checked against llama.cpp's dry run in the
tests are in :data:`TESTED_ARCHS`; any other architecture gets the generic rule (every layer
has KV) labelled ``approximate`` until a structure probe of the installed llama.cpp replaces it.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gguf_header import ArrayInfo, GGUFError
from .structure import LayerRole, ModelStructure

#: Pure recurrent architectures (llama-arch.cpp ``llm_arch_is_recurrent``).
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
#: Hybrid attention/recurrent architectures (llama-arch.cpp ``llm_arch_is_hybrid``).
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
#: Architectures ``create_memory`` builds a special memory for (DSA/MSA indexer caches, DSV4,
#: an assistant model sharing another context's KV) or none at all (encoders, diffusion):
#: kvtuner has no rule for them; a probe or the approximate label covers them.
SPECIAL_MEMORY_ARCHS = frozenset(
    {
        "minimax-m3",
        "glm-dsa",
        "deepseek32",
        "glm5-next",
        "hy-v4",
        "dots3note",
        "deepseek4",
        "dflash",
        "gemma4-assistant",
        "qwen4exp",
        "kimi-linear",
        "kimi-k3",
        "bailingmoe3",
        "minimax-01",
    }
)
#: Architectures whose loader skips MTP/NextN tensors unless ``load_mtp`` (src/models/*.cpp
#: ``mtp_flags = TENSOR_SKIP``): those weights are never loaded in a plain run.
SKIPS_MTP_ARCHS = frozenset(
    {
        "bailingmoe3",
        "cohere2moe",
        "deepseek2",
        "deepseek32",
        "deepseek4",
        "glm-dsa",
        "glm4moe",
        "glm5-next",
        "hy-v3",
        "mimo2",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "step35",
    }
)

#: Architectures whose structure rules below are checked against llama.cpp's dry run in the
#: tests (tests/test_plan_vs_llama.py, tests/test_model_families.py, tests/test_model_variants.py).
TESTED_ARCHS = frozenset(
    {
        "llama",
        "deci",
        "gemma3",
        "deepseek2",
        "mamba",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "falcon-h1",
        "nemotron_h",
        "granitehybrid",
        "lfm2",
        "llama4",
        "gemma3n",
        "gemma4",
        "glm4moe",
        "gpt-oss",
        "qwen2",
        "qwen3",
        "stablelm",
    }
)


class Meta:
    """Typed access to GGUF metadata with errors that name the file and key (one line)."""

    def __init__(self, path: Path, md: dict[str, Any], arch: str) -> None:
        self.path, self.md, self.arch = path, md, arch

    def key(self, template: str) -> str:
        """``template`` with ``{arch}`` filled in."""
        return template.format(arch=self.arch)

    def has(self, template: str) -> bool:
        """Whether the key is present."""
        return self.key(template) in self.md

    def int(self, template: str, default: int | None = None, *, required: bool = False) -> int:
        """A non-negative integer key (llama.cpp ``get_key`` on a uint32).

        Raises:
            GGUFError: missing (when required), not an integer, or negative.
        """
        k = self.key(template)
        if k not in self.md:
            if required:
                raise GGUFError(f"{self.path}: missing metadata key {k}")
            return default  # type: ignore[return-value]
        v = self.md[k]
        if isinstance(v, bool) or not isinstance(v, int):
            raise GGUFError(f"{self.path}: metadata {k} should be an integer, found {type(v).__name__}")
        if v < 0:
            raise GGUFError(f"{self.path}: metadata {k} is negative ({v})")
        return v

    # annotations below name the builtin explicitly: in this class body `int` is the method above
    def per_layer(
        self, template: str, n_layer: builtins.int, default: builtins.int | tuple[builtins.int, ...] | None
    ) -> tuple[builtins.int, ...] | None:
        """Scalar-or-array key (llama.cpp ``get_key_or_arr``): ``n_layer`` values.

        Raises:
            GGUFError: an array of the wrong length or element type.
        """
        k = self.key(template)
        if k not in self.md:
            if default is None or isinstance(default, tuple):
                return default
            return (default,) * n_layer
        v = self.md[k]
        if isinstance(v, tuple):
            if len(v) != n_layer or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
                raise GGUFError(f"{self.path}: metadata {k} should hold {n_layer} non-negative integers, one per layer")
            return tuple(int(x) for x in v)
        if isinstance(v, ArrayInfo):
            raise GGUFError(f"{self.path}: metadata {k} has {v.count} entries, expected {n_layer}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise GGUFError(f"{self.path}: metadata {k} should be an integer or an array of integers")
        return (int(v),) * n_layer

    def bool_array(self, template: str, n_max: builtins.int) -> tuple[bool, ...] | None:
        """A bool/int array key of at most ``n_max`` entries (llama.cpp ``get_arr`` into a
        per-layer array), None if absent or not an array.

        Raises:
            GGUFError: longer than ``n_max`` (llama.cpp refuses it too).
        """
        k = self.key(template)
        v = self.md.get(k)
        if isinstance(v, ArrayInfo):
            raise GGUFError(f"{self.path}: metadata {k} has {v.count} entries, more than the {n_max} layers")
        if not isinstance(v, tuple):
            return None
        if len(v) > n_max:
            raise GGUFError(f"{self.path}: metadata {k} has {len(v)} entries, more than the {n_max} layers")
        return tuple(bool(x) for x in v)

    def str(self, key: str) -> str | None:
        """A string key (full key name), None if absent.

        Raises:
            GGUFError: present but not a string.
        """
        v = self.md.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise GGUFError(f"{self.path}: metadata {key} should be a string, found {type(v).__name__}")
        return v


@dataclass(frozen=True)
class Hparams:
    """The generic part of llama.cpp's ``load_hparams`` (src/llama-model.cpp).

    Per-layer tuples have ``n_layer_all`` entries.
    """

    arch: str
    n_layer_all: int
    n_nextn: int
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]
    head_k_full: int
    head_v_full: int
    head_k_swa: int
    head_v_swa: int

    @property
    def n_layer(self) -> int:
        """Trunk layers: ``n_layer_all - n_layer_nextn`` (llama-hparams.cpp ``n_layer``)."""
        return self.n_layer_all - self.n_nextn


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
    if n_nextn > n_layer_all:
        raise GGUFError(f"{m.path}: {m.key('{arch}.nextn_predict_layers')} {n_nextn} exceeds block_count {n_layer_all}")
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


def _swa_pattern(n_layer: int, n_layer_all: int, n_pattern: int, dense_first: bool) -> list[bool]:
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


def _load_swa_pattern(m: Meta, hp: Hparams, n_pattern: int, dense_first: bool = False) -> list[bool]:
    """llama-model.cpp ``load_swa_pattern``: the ``sliding_window_pattern`` array if present,
    else its scalar (default ``n_pattern``) through ``set_swa_pattern``."""
    arr = m.bool_array("{arch}.attention.sliding_window_pattern", hp.n_layer_all)
    if arr is not None:
        return list(arr) + [False] * (hp.n_layer_all - len(arr))
    n = m.int("{arch}.attention.sliding_window_pattern", n_pattern)
    return _swa_pattern(hp.n_layer, hp.n_layer_all, n, dense_first)


@dataclass
class _Rules:
    """What ``load_arch_hparams`` sets that decides memory (mutable while rules run)."""

    is_swa: list[bool]
    is_recr: list[bool]
    n_swa: int = 0
    swa_type: str = "none"
    kv_from_start: int = -1


def _apply_arch_rules(m: Meta, hp: Hparams, r: _Rules) -> None:
    """Per-architecture ``load_arch_hparams`` (src/models/<arch>.cpp), the parts that decide memory."""
    a, L, N = hp.arch, hp.n_layer_all, hp.n_layer
    win = "{arch}.attention.sliding_window"
    if a == "gemma2":  # gemma2.cpp: standard SWA, window 4096 unless the key says otherwise, pattern 2
        r.swa_type, r.n_swa = "standard", m.int(win, 4096)
        r.is_swa = _load_swa_pattern(m, hp, 2)
    elif a in ("gemma3", "olmo2"):  # gemma3.cpp / olmo2.cpp: SWA only with a positive window key
        n = m.int(win, 0)
        if n > 0:
            r.swa_type, r.n_swa = "standard", n
            r.is_swa = _load_swa_pattern(m, hp, 6 if a == "gemma3" else 4)
    elif a == "afmoe":  # afmoe.cpp
        n = m.int(win, 0)
        if n > 0:
            r.swa_type, r.n_swa = "standard", n
            r.is_swa = _load_swa_pattern(m, hp, 4)
    elif a == "cohere2":  # cohere2.cpp: pattern 4, window required
        r.swa_type, r.n_swa = "standard", m.int(win, required=True)
        r.is_swa = _load_swa_pattern(m, hp, 4)
    elif a == "gpt-oss":  # openai-moe.cpp: pattern 2 (even layers SWA), window required
        r.swa_type, r.n_swa = "standard", m.int(win, required=True)
        r.is_swa = _load_swa_pattern(m, hp, 2)
    elif a == "exaone4":  # exaone4.cpp: the 64-layer (32B) model is SWA with pattern 4
        if N == 64:
            r.swa_type, r.n_swa = "standard", 4096
            r.is_swa = _load_swa_pattern(m, hp, 4)
        r.n_swa = m.int(win, r.n_swa)
    elif a == "smallthinker":  # smallthinker.cpp: window forced to 4096, dense-first pattern 4
        if m.int(win, 0) > 0:
            r.swa_type, r.n_swa = "standard", 4096
            r.is_swa = _load_swa_pattern(m, hp, 4, dense_first=True)
    elif a == "llama4":
        # llama4.cpp: chunked attention (chunk 8192, 3 chunked - 1 full) unless the file
        # says sliding_window = 0; a window key of any other value is overwritten with 8192
        if m.has(win) and m.int(win, 0) == 0:
            pass
        else:
            r.swa_type, r.n_swa = "chunked", 8192
            r.is_swa = _load_swa_pattern(m, hp, 4)
    elif a == "gemma3n":  # gemma3n.cpp: pattern 5, KV only in the first 20 layers, window required
        r.swa_type = "standard"
        r.is_swa = _load_swa_pattern(m, hp, 5)
        r.kv_from_start = 20
        r.n_swa = m.int(win, required=True)
    elif a == "gemma4":
        # gemma4.cpp: the per-layer pattern array is required; the last shared_kv_layers
        # layers read the KV of earlier ones
        arr = m.bool_array("{arch}.attention.sliding_window_pattern", L)
        if arr is None:
            raise GGUFError(
                f"{m.path}: missing metadata array {m.key('{arch}.attention.sliding_window_pattern')} (gemma4 needs it)"
            )
        r.swa_type = "standard"
        r.is_swa = list(arr) + [False] * (L - len(arr))
        r.kv_from_start = L - m.int("{arch}.attention.shared_kv_layers", 0)
        r.n_swa = m.int(win, required=True)
    elif a in ("lfm2", "lfm2moe"):
        # lfm2.cpp / lfm2moe.cpp: a layer without KV heads is a short-conv (recurrent) layer;
        # lfm2 with a positive window makes every attention layer SWA
        r.is_recr = [il < N and hp.n_head_kv[il] == 0 for il in range(L)]
        if a == "lfm2":
            n = m.int(win, 0)
            if n > 0:
                r.swa_type, r.n_swa = "standard", n
                r.is_swa = [il < N and not r.is_recr[il] for il in range(L)]
    elif a in ("qwen35", "qwen35moe", "qwen3next"):
        # qwen35.cpp / qwen35moe.cpp / qwen3next.cpp: attention.recurrent_layers if present, else
        # every full_attention_interval-th layer (default 4) is attention; MTP blocks never recurrent
        arr = m.bool_array("{arch}.attention.recurrent_layers", L)
        if arr is not None:
            r.is_recr = list(arr) + [False] * (L - len(arr))
        else:
            interval = m.int("{arch}.full_attention_interval", 4)
            if interval == 0:
                raise GGUFError(f"{m.path}: {m.key('{arch}.full_attention_interval')} is 0")
            r.is_recr = [il < N and (il + 1) % interval != 0 for il in range(L)]
    elif a == "falcon-h1":  # falcon-h1.cpp: attention and Mamba2 in every layer
        r.is_recr = [True] * L
    elif a in ("nemotron_h", "nemotron_h_moe"):
        # nemotron-h.cpp: recurrent iff no KV heads and no FFN; attention iff KV heads and no
        # FFN (create_memory's filters); the rest are MLP/MoE-only layers with no memory
        r.is_recr = [il < N and hp.n_head_kv[il] == 0 and hp.n_ff[il] == 0 for il in range(L)]
    elif a in ("granitehybrid", "jamba", "plamo2"):  # a layer without KV heads is a Mamba layer
        r.is_recr = [il < N and hp.n_head_kv[il] == 0 for il in range(L)]


def _state_sizes(m: Meta, hp: Hparams) -> tuple[int, int]:
    """``(n_embd_r, n_embd_s)`` of llama-hparams.cpp: RWKV token shift / wkv state, LFM2's
    short-conv cache ``n_embd * (l_cache - 1)``, or Mamba's conv state
    ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)`` and SSM state ``d_state * d_inner``."""
    wkv = m.int("{arch}.wkv.head_size", 0)
    if wkv:
        return m.int("{arch}.token_shift_count", 2) * hp.n_embd, hp.n_embd * wkv
    l_cache = m.int("{arch}.shortconv.l_cache", 0) if hp.arch in ("lfm2", "lfm2moe") else 0
    d_conv = m.int("{arch}.ssm.conv_kernel", 0)
    d_inner = m.int("{arch}.ssm.inner_size", 0)
    d_state = m.int("{arch}.ssm.state_size", 0)
    n_group = m.int("{arch}.ssm.group_count", 0)
    if l_cache:
        r = hp.n_embd * (l_cache - 1)
    else:
        r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    return r, d_state * d_inner


def derive_structure(m: Meta, hp: Hparams, layer_bytes: tuple[int, ...] = ()) -> ModelStructure:
    """The memory structure llama.cpp builds for this model (see the module docstring).

    Follows ``llama_model::create_memory`` (src/llama-model.cpp): recurrent architectures get a
    ``llama_memory_recurrent`` over the trunk layers; hybrids a ``llama_memory_hybrid`` (or
    ``_iswa`` with a window) whose attention/recurrent filters are per architecture (Falcon-H1:
    every layer both; Nemotron-H: attention and Mamba layers without FFN; Qwen3-Next/3.5:
    trunk layers by ``is_recr``; others ``!is_recr`` / ``is_recr``); everything else a
    ``llama_kv_cache`` (or ``_iswa`` when ``swa_type != NONE``) without the NextN blocks and with
    Gemma 3n / Gemma 4's reuse of the last KV layers.

    Args:
        m: metadata accessor.
        hp: the generic hyper-parameters.
        layer_bytes: weight bytes per block (for the skipped MTP tensors).

    Raises:
        GGUFError: a key this architecture requires is missing or malformed.
    """
    a, L, N = hp.arch, hp.n_layer_all, hp.n_layer
    r = _Rules(is_swa=[False] * L, is_recr=[a in RECURRENT_ARCHS] * L)
    _apply_arch_rules(m, hp, r)
    if r.swa_type == "none":
        r.n_swa = 0
        r.is_swa = [False] * L
    elif not any(r.is_swa):
        r.swa_type, r.n_swa = "none", 0  # llama.cpp asserts is_swa_any() for iSWA; no SWA layer, no SWA cache

    def head_k(il: int) -> int:
        return hp.head_k_swa if r.is_swa[il] else hp.head_k_full

    def head_v(il: int) -> int:
        return hp.head_v_swa if r.is_swa[il] else hp.head_v_full

    def has_kv(il: int) -> bool:  # llama-hparams.cpp has_kv
        return r.kv_from_start < 0 or il < r.kv_from_start

    recurrent = a in RECURRENT_ARCHS
    hybrid = a in HYBRID_ARCHS
    if recurrent:
        memory = "recurrent"
        attn = [False] * L
        recr = [il < N for il in range(L)]
    elif hybrid:
        memory = "hybrid-iswa" if r.swa_type != "none" else "hybrid"
        if a == "falcon-h1":
            attn = [True] * L
            recr = [il < N for il in range(L)]
        elif a in ("nemotron_h", "nemotron_h_moe"):
            attn = [not r.is_recr[il] and hp.n_ff[il] == 0 for il in range(L)]
            recr = [il < N and r.is_recr[il] and hp.n_ff[il] == 0 for il in range(L)]
        elif a in ("qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"):
            attn = [il < N and not r.is_recr[il] for il in range(L)]
            recr = [il < N and r.is_recr[il] for il in range(L)]
        else:
            attn = [not r.is_recr[il] for il in range(L)]
            recr = [il < N and r.is_recr[il] for il in range(L)]
    else:
        memory = "iswa" if r.swa_type != "none" else "kv"
        recr = [False] * L
        trunk_only = hp.n_nextn > 0 and N > 0
        attn = [has_kv(il) and (not trunk_only or il < N) for il in range(L)]

    reuse = [-1] * L
    if a in ("gemma3n", "gemma4") and not hybrid:
        if r.kv_from_start < 2:
            raise GGUFError(
                f"{m.path}: {a} needs at least 2 layers with their own KV cache (shared_kv_layers too large)"
            )
        for il in range(r.kv_from_start, L):
            reuse[il] = r.kv_from_start - (2 if r.is_swa[il] else 1)

    is_mla = m.int("{arch}.attention.key_length_mla", 0) > 0 and m.int("{arch}.attention.value_length_mla", 0) > 0
    state_r, state_s = _state_sizes(m, hp) if any(recr) else (0, 0)
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
    v_width_max = max((x.v_width for x in layers), default=0)
    skipped = (
        tuple(layer_bytes[il] if (il >= N and a in SKIPS_MTP_ARCHS and il < len(layer_bytes)) else 0 for il in range(L))
        if layer_bytes
        else ()
    )
    if a in SPECIAL_MEMORY_ARCHS:
        source, note = (
            "approximate",
            (
                f"{a}: llama.cpp builds a special cache for this architecture that kvtuner "
                "does not model; figures are approximate"
            ),
        )
    elif a in TESTED_ARCHS:
        source, note = "analytic", ""
    else:
        source, note = (
            "approximate",
            (
                f"{a}: kvtuner's per-layer rules for this architecture are not checked "
                "against llama.cpp; figures are approximate"
            ),
        )
    return ModelStructure(
        layers=layers,
        n_layer=N,
        memory=memory,
        n_swa=r.n_swa,
        swa_type=r.swa_type,
        state_r=state_r,
        state_s=state_s,
        is_mla=is_mla,
        v_width_max=v_width_max,
        source=source,
        note=note,
        skipped_layer_bytes=skipped,
    )
