"""Model profile: everything the planner needs to know about a GGUF model.

Read with :func:`ModelProfile.from_gguf` from the header alone (see
:mod:`kvtuner.core.model.gguf_header`); a 40 GB model's weights are never read. Hyper-parameters
follow llama.cpp's ``llama_model_base::load_hparams`` (src/llama-model.cpp) and the per-arch
``load_arch_hparams`` in src/models/*.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from .gguf_header import ArrayInfo, GGUFError, GGUFHeader, TensorInfo, read_header

__all__ = ["GGUFError", "ModelProfile", "split_parts"]

#: Architectures that are not language models (no causal text generation) -> refused.
NOT_LANGUAGE_MODELS = {
    "clip", "bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert",
    "eurobert", "modern-bert", "gemma-embedding", "wavtokenizer-dec", "t5encoder",
}
#: general.type values that are not models llama.cpp generates text with.
NOT_MODEL_TYPES = {"mmproj", "adapter", "clip-vision", "vocab"}

#: Pure recurrent architectures (llama-arch.cpp ``llm_arch_is_recurrent``): no KV cache.
RECURRENT_ARCHS = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
#: Hybrid attention/recurrent architectures (``llm_arch_is_hybrid``): planned approximately.
HYBRID_ARCHS = {
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
    "nemotron_h_moe", "qwen3next", "kimi-linear", "qwen35", "qwen35moe", "minimax-01",
}

# Sliding-window layer patterns, from src/models/<arch>.cpp ``load_swa_pattern(ml, n, dense_first)``.
# arch -> (default pattern, dense_first, needs the sliding_window key to enable SWA)
SWA_PATTERNS: dict[str, tuple[int, bool, bool]] = {
    "gemma2": (2, False, False),
    "gemma3": (6, False, True),
    "gemma3n": (5, False, False),
    "cohere2": (4, False, False),
    "gpt-oss": (2, False, False),  # openai-moe.cpp
    "olmo2": (4, False, True),
    "exaone4": (4, False, True),
    "afmoe": (4, False, True),
    "llama4": (4, False, True),  # chunked attention, same cache rule
    "smallthinker": (4, True, True),
}

_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_parts(path: Path) -> list[Path]:
    """All parts of a split model (``name-00001-of-00003.gguf``), in order; ``[path]`` otherwise.

    Raises:
        GGUFError: a part is missing (names the first missing part).
    """
    m = _SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count = int(m.group("count"))
    parts = [path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for part in parts:
        if not part.exists():
            raise GGUFError(f"{path}: split part {part.name} is missing ({count} parts expected)")
    return parts


@dataclass(frozen=True)
class ModelProfile:
    """A GGUF model as llama.cpp sees it.

    Sizes are bytes; per-layer tuples have ``n_layer`` entries (layer ``il`` at index ``il``).

    Attributes:
        path: first (or only) file; ``parts`` lists every split part.
        file_bytes: total size on disk of all parts.
        header_sha256: sha256 of the first part's header (identity without hashing weights).
        architecture: ``general.architecture`` (``llama``, ``gemma3`` ...).
        name: ``general.name`` or None (plain text from the file: never interpret it).
        file_type: llama.cpp file type name (``MOSTLY_Q4_K_M``) or None.
        n_layer: repeating layers (``{arch}.block_count``).
        n_embd: embedding width.
        n_head: attention heads per layer.
        n_head_kv: KV heads per layer (GQA: fewer than n_head; 0 = no attention in that layer).
        head_dim_k, head_dim_v: key/value head size of full-attention layers
            (``key_length`` / ``value_length``, default ``n_embd / n_head``).
        head_dim_k_swa, head_dim_v_swa: the same for sliding-window layers.
        n_ctx_train: trained context length.
        n_swa: sliding window in tokens (0 = none).
        swa_layers: per layer, True if it uses the sliding window.
        mla_kv_lora_rank, mla_head_dim_k, mla_head_dim_v: MLA parameters (DeepSeek 2/3, Kimi), 0 if not MLA.
        recurrent_layers: per layer, True for recurrent/SSM layers (no KV cache).
        recurrent_state_floats: f32 values of recurrent state per layer per sequence (r + s), 0 if none.
        n_vocab: vocabulary size.
        n_params: parameters (sum of tensor elements).
        input_bytes: bytes of tensors llama.cpp keeps on the host (``token_embd`` and friends).
        layer_bytes: bytes of each repeating layer ``blk.N``.
        output_bytes: bytes of the output layer (``output.weight``, ``output_norm``); with tied
            embeddings llama.cpp duplicates ``token_embd`` as the output matrix.
        tied_output: True when there is no ``output.weight`` (tied embeddings).
        embd_bytes: bytes of ``token_embd.weight``.
        n_expert, n_expert_used: MoE experts (0 for dense).
        metadata: the raw scalar metadata (long arrays reduced to their length).
        warnings: things the planner can only approximate for this model.
    """

    path: Path
    parts: tuple[Path, ...]
    file_bytes: int
    header_sha256: str
    architecture: str
    name: str | None
    file_type: str | None
    n_layer: int
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    head_dim_k_swa: int
    head_dim_v_swa: int
    n_ctx_train: int
    n_swa: int
    swa_layers: tuple[bool, ...]
    mla_kv_lora_rank: int
    mla_head_dim_k: int
    mla_head_dim_v: int
    recurrent_layers: tuple[bool, ...]
    recurrent_state_floats: int
    n_vocab: int
    n_params: int
    input_bytes: int
    layer_bytes: tuple[int, ...]
    output_bytes: int
    tied_output: bool
    embd_bytes: int
    n_expert: int
    n_expert_used: int
    metadata: dict[str, Any] = field(repr=False, compare=False)
    warnings: tuple[str, ...] = ()

    # ----------------------------------------------------------------------------------------
    @property
    def file_name(self) -> str:
        """Base name of the (first) file."""
        return self.path.name

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: a K-only cache (llama-hparams.cpp ``is_mla``)."""
        return self.mla_head_dim_k > 0 and self.mla_head_dim_v > 0

    @property
    def weights_bytes(self) -> int:
        """All tensor bytes in the file(s)."""
        return self.input_bytes + sum(self.layer_bytes) + self.output_bytes - (self.embd_bytes if self.tied_output else 0)

    @property
    def attention_kind(self) -> str:
        """``MHA``, ``GQA``, ``MQA`` or ``MLA`` (from the first attention layer)."""
        if self.is_mla:
            return "MLA"
        for h, hkv in zip(self.n_head, self.n_head_kv):
            if hkv:
                return "MHA" if hkv == h else ("MQA" if hkv == 1 else "GQA")
        return "none"

    def head_dim_k_at(self, il: int) -> int:
        """Key head size of layer ``il`` (llama-hparams.cpp ``n_embd_head_k(il)``)."""
        return self.head_dim_k_swa if self.swa_layers[il] else self.head_dim_k

    def head_dim_v_at(self, il: int) -> int:
        """Value head size of layer ``il`` (``n_embd_head_v(il)``)."""
        return self.head_dim_v_swa if self.swa_layers[il] else self.head_dim_v

    def n_embd_k_gqa(self, il: int) -> int:
        """K row width of layer ``il``: ``n_embd_head_k(il) * n_head_kv(il)`` (llama-hparams.cpp)."""
        return self.head_dim_k_at(il) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        """V row width of layer ``il``: ``n_embd_head_v(il) * n_head_kv(il)`` (llama-hparams.cpp)."""
        return self.head_dim_v_at(il) * self.n_head_kv[il]

    def has_kv(self, il: int) -> bool:
        """Whether layer ``il`` has an entry in the KV cache.

        llama-hparams.cpp ``has_kv`` is true for every layer of a non-hybrid model, so a layer
        with 0 KV heads (DeciLM) gets a zero-width entry; recurrent layers have none."""
        return not self.recurrent_layers[il]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (``kvtuner inspect --json``)."""
        return {
            "path": str(self.path),
            "parts": [str(p) for p in self.parts],
            "file_bytes": self.file_bytes,
            "header_sha256": self.header_sha256,
            "architecture": self.architecture,
            "name": self.name,
            "file_type": self.file_type,
            "n_params": self.n_params,
            "n_layer": self.n_layer,
            "n_embd": self.n_embd,
            "n_head": list(self.n_head),
            "n_head_kv": list(self.n_head_kv),
            "attention": self.attention_kind,
            "head_dim_k": self.head_dim_k,
            "head_dim_v": self.head_dim_v,
            "head_dim_k_swa": self.head_dim_k_swa,
            "head_dim_v_swa": self.head_dim_v_swa,
            "n_ctx_train": self.n_ctx_train,
            "n_swa": self.n_swa,
            "swa_layers": [i for i, s in enumerate(self.swa_layers) if s],
            "mla": {"kv_lora_rank": self.mla_kv_lora_rank, "head_dim_k": self.mla_head_dim_k, "head_dim_v": self.mla_head_dim_v}
            if self.is_mla else None,
            "recurrent_layers": [i for i, r in enumerate(self.recurrent_layers) if r],
            "n_vocab": self.n_vocab,
            "n_expert": self.n_expert,
            "n_expert_used": self.n_expert_used,
            "weights_bytes": self.weights_bytes,
            "input_bytes": self.input_bytes,
            "layer_bytes": list(self.layer_bytes),
            "output_bytes": self.output_bytes,
            "tied_output": self.tied_output,
            "warnings": list(self.warnings),
        }

    # ----------------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "ModelProfile":
        """Read a GGUF model (all parts of a split model) into a profile.

        Raises:
            GGUFError: unreadable, not GGUF, truncated, corrupt, a missing split part, a
                metadata value of the wrong type, or not a language model. One line.
        """
        p = Path(path).expanduser()
        parts = split_parts(p)
        headers = [read_header(part, i) for i, part in enumerate(parts)]
        return _build(p, parts, headers)


# ---------------------------------------------------------------------------------------------
class _Meta:
    """Typed access to metadata with errors that name the file and key."""

    def __init__(self, path: Path, md: dict[str, Any], arch: str) -> None:
        self.path, self.md, self.arch = path, md, arch

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def int(self, template: str, default: int | None = None, *, required: bool = False) -> int:
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

    def per_layer(self, template: str, n_layer: int, default: int | tuple[int, ...] | None) -> tuple[int, ...] | None:
        """Scalar-or-array key (llama.cpp ``get_key_or_arr``)."""
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

    def str(self, key: str) -> str | None:
        v = self.md.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise GGUFError(f"{self.path}: metadata {key} should be a string, found {type(v).__name__}")
        return v


_BLK_RE = re.compile(r"^blk\.(\d+)\.")


def _build(p: Path, parts: list[Path], headers: list[GGUFHeader]) -> ModelProfile:
    first = headers[0]
    md = dict(first.metadata)
    if len(headers) > 1:
        count = md.get("split.count")
        if count is not None and count != len(headers):
            raise GGUFError(f"{p}: split.count says {count} parts but the file names say {len(headers)}")
    arch = md.get("general.architecture")
    if arch is None:
        raise GGUFError(f"{p}: missing metadata key general.architecture (not a llama.cpp model file)")
    if not isinstance(arch, str):
        raise GGUFError(f"{p}: metadata general.architecture should be a string")
    gtype = md.get("general.type")
    if arch in NOT_LANGUAGE_MODELS or (isinstance(gtype, str) and gtype in NOT_MODEL_TYPES):
        what = gtype if isinstance(gtype, str) and gtype in NOT_MODEL_TYPES else arch
        raise GGUFError(f"{p}: is a '{what}' file, not a language model kvtuner can plan (open the text model GGUF instead)")

    m = _Meta(p, md, arch)
    n_layer = m.int("{arch}.block_count", required=True)
    n_embd = m.int("{arch}.embedding_length", required=True)
    if n_layer == 0 or n_layer > 4096:
        raise GGUFError(f"{p}: impossible block_count {n_layer}")
    if n_embd == 0 or n_embd > 1 << 20:
        raise GGUFError(f"{p}: impossible embedding_length {n_embd}")
    n_ctx_train = m.int("{arch}.context_length", 0)

    n_head = m.per_layer("{arch}.attention.head_count", n_layer, 0)
    assert n_head is not None
    n_head_kv = m.per_layer("{arch}.attention.head_count_kv", n_layer, n_head)
    assert n_head_kv is not None
    head0 = max(n_head) if any(n_head) else 0
    if head0 == 0 and arch not in RECURRENT_ARCHS:
        raise GGUFError(f"{p}: no attention heads (head_count is 0): not a model kvtuner can plan")

    # llama-model.cpp load_hparams: n_embd_head_k = n_embd / n_head(0), overridden by key_length
    first_head = n_head[0] if n_head[0] else head0
    default_hd = n_embd // first_head if first_head else 0
    head_dim_k = m.int("{arch}.attention.key_length", default_hd)
    head_dim_v = m.int("{arch}.attention.value_length", default_hd)
    head_dim_k_swa = m.int("{arch}.attention.key_length_swa", head_dim_k)
    head_dim_v_swa = m.int("{arch}.attention.value_length_swa", head_dim_v)

    # sliding window
    warnings: list[str] = []
    n_swa = m.int("{arch}.attention.sliding_window", 0)
    swa_layers: tuple[bool, ...] = (False,) * n_layer
    pattern_key = m.key("{arch}.attention.sliding_window_pattern")
    if arch in SWA_PATTERNS:
        n_pattern, dense_first, needs_key = SWA_PATTERNS[arch]
        if n_swa > 0 or not needs_key:
            raw = md.get(pattern_key)
            if isinstance(raw, tuple) and len(raw) == n_layer:
                swa_layers = tuple(bool(x) for x in raw)
            else:
                if isinstance(raw, int) and not isinstance(raw, bool):
                    n_pattern = raw
                swa_layers = _swa_pattern(n_layer, n_pattern, dense_first)
            if n_swa == 0:
                warnings.append(f"{arch} without {m.key('{arch}.attention.sliding_window')}: sliding window size unknown")
    elif n_swa > 0:
        raw = md.get(pattern_key)
        if isinstance(raw, tuple) and len(raw) == n_layer:
            swa_layers = tuple(bool(x) for x in raw)
        else:
            warnings.append(
                f"{arch} declares a sliding window of {n_swa} but kvtuner does not know which layers use it; "
                "planned as full attention (run plan --verify)"
            )
            n_swa = 0
    if not any(swa_layers):
        n_swa = 0

    # MLA (deepseek2.cpp): key_length_mla / value_length_mla present -> K-only latent cache
    mla_rank = m.int("{arch}.attention.kv_lora_rank", 0)
    mla_k = m.int("{arch}.attention.key_length_mla", 0)
    mla_v = m.int("{arch}.attention.value_length_mla", 0)
    if not (mla_k and mla_v):
        mla_k = mla_v = 0

    # recurrent layers
    recurrent = (False,) * n_layer
    state_floats = 0
    if arch in RECURRENT_ARCHS:
        recurrent = (True,) * n_layer
        state_floats = _recurrent_state_floats(m, n_embd)
    elif arch in HYBRID_ARCHS:
        recurrent = tuple(h == 0 for h in n_head_kv)
        state_floats = _recurrent_state_floats(m, n_embd)
        warnings.append(f"{arch} is a hybrid attention/recurrent model: kvtuner plans it approximately (run plan --verify)")

    # vocabulary
    tokens = md.get("tokenizer.ggml.tokens")
    n_vocab = m.int("{arch}.vocab_size", 0) or (tokens.count if isinstance(tokens, ArrayInfo) else len(tokens or ()))

    # tensors grouped as llama.cpp places them
    tensors: list[TensorInfo] = [t for h in headers for t in h.tensors]
    names = set()
    input_bytes = output_bytes = 0
    layer_bytes = [0] * n_layer
    has_output_weight = False
    embd_bytes = 0
    extra_layers = 0
    for t in tensors:
        if t.name in names:
            raise GGUFError(f"{p}: tensor {t.name} appears twice")
        names.add(t.name)
        mb = _BLK_RE.match(t.name)
        if mb:
            il = int(mb.group(1))
            if il < n_layer:
                layer_bytes[il] += t.n_bytes
            else:
                extra_layers += 1
                input_bytes += t.n_bytes
        elif t.name.startswith("output"):
            output_bytes += t.n_bytes
            if t.name == "output.weight":
                has_output_weight = True
        else:
            input_bytes += t.n_bytes
            if t.name == "token_embd.weight":
                embd_bytes = t.n_bytes
    if not tensors:
        raise GGUFError(f"{p}: has no tensors (a vocabulary-only file?), not a model")
    if embd_bytes == 0:
        raise GGUFError(f"{p}: has no token_embd.weight tensor: not a language model kvtuner can plan")
    tied = not has_output_weight
    if tied:
        output_bytes += embd_bytes  # llama.cpp creates output from token_embd (TENSOR_DUPLICATED)
    if extra_layers:
        warnings.append("tensors of layers beyond block_count (MTP/NextN heads) are kept on the host in this plan")

    ftype = md.get("general.file_type")
    ftype_name = None
    if isinstance(ftype, int):
        try:
            ftype_name = gguf.LlamaFileType(ftype).name
        except ValueError:
            ftype_name = str(ftype)

    name = md.get("general.name")
    return ModelProfile(
        path=p,
        parts=tuple(parts),
        file_bytes=sum(h.file_bytes for h in headers),
        header_sha256=first.header_sha256,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        file_type=ftype_name,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        head_dim_k_swa=head_dim_k_swa,
        head_dim_v_swa=head_dim_v_swa,
        n_ctx_train=n_ctx_train,
        n_swa=n_swa,
        swa_layers=swa_layers,
        mla_kv_lora_rank=mla_rank,
        mla_head_dim_k=mla_k,
        mla_head_dim_v=mla_v,
        recurrent_layers=recurrent,
        recurrent_state_floats=state_floats,
        n_vocab=n_vocab,
        n_params=sum(t.n_elements for t in tensors),
        input_bytes=input_bytes,
        layer_bytes=tuple(layer_bytes),
        output_bytes=output_bytes,
        tied_output=tied,
        embd_bytes=embd_bytes,
        n_expert=m.int("{arch}.expert_count", 0),
        n_expert_used=m.int("{arch}.expert_used_count", 0),
        metadata={k: v for k, v in md.items() if not isinstance(v, ArrayInfo)},
        warnings=tuple(warnings),
    )


def _swa_pattern(n_layer: int, n_pattern: int, dense_first: bool) -> tuple[bool, ...]:
    """llama-hparams.cpp ``set_swa_pattern``: with dense_first layer 0 of each group is full,
    otherwise the last of each group of ``n_pattern`` is full; pattern 0 = every layer SWA."""
    if dense_first:
        return tuple(n_pattern == 0 or (il % n_pattern != 0) for il in range(n_layer))
    return tuple(n_pattern == 0 or (il % n_pattern < n_pattern - 1) for il in range(n_layer))


def _recurrent_state_floats(m: _Meta, n_embd: int) -> int:
    """f32 values of recurrent state per layer per sequence: ``n_embd_r + n_embd_s``
    (llama-hparams.cpp ``n_embd_r`` / ``n_embd_s``; RWKV and Mamba forms)."""
    wkv = m.int("{arch}.wkv.head_size", 0)
    if wkv:
        shift = m.int("{arch}.token_shift_count", 2)
        return shift * n_embd + n_embd * wkv
    d_conv = m.int("{arch}.ssm.conv_kernel", 0)
    d_inner = m.int("{arch}.ssm.inner_size", 0)
    d_state = m.int("{arch}.ssm.state_size", 0)
    n_group = m.int("{arch}.ssm.group_count", 0)
    n_conv = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    return n_conv + d_state * d_inner
