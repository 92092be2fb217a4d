"""Model profile: everything the planner needs to know about a GGUF model.

Read with :func:`ModelProfile.from_gguf` from the header alone (see
:mod:`kvtuner.core.model.gguf_header`); a 40 GB model's weights are never read. Hyper-parameters
follow llama.cpp's ``llama_model_base::load_hparams`` (src/llama-model.cpp) and the per-arch
``load_arch_hparams`` in src/models/*.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gguf

from .gguf_header import ArrayInfo, GGUFError, GGUFHeader, TensorInfo, printable, read_header
from .hparams import RECURRENT_ARCHS, Meta, derive_structure, read_hparams
from .structure import ModelStructure

__all__ = ["GGUFError", "ModelProfile", "ModelStructure", "split_parts"]

#: Architectures that are not language models (no causal text generation) -> refused.
NOT_LANGUAGE_MODELS = {
    "clip",
    "bert",
    "nomic-bert",
    "nomic-bert-moe",
    "jina-bert-v2",
    "jina-bert-v3",
    "neo-bert",
    "eurobert",
    "modern-bert",
    "gemma-embedding",
    "wavtokenizer-dec",
    "t5encoder",
}
#: general.type values that are not models llama.cpp generates text with.
NOT_MODEL_TYPES = {"mmproj", "adapter", "clip-vision", "vocab"}

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
        structure: which layers hold KV (full, sliding-window, chunked, shared), recurrent
            state or nothing, and where that knowledge comes from
            (:class:`~kvtuner.core.model.structure.ModelStructure`).
        mla_kv_lora_rank, mla_head_dim_k, mla_head_dim_v: MLA parameters (DeepSeek 2/3, Kimi), 0 if not MLA.
        n_vocab: vocabulary size.
        n_params: parameters (sum of tensor elements).
        input_bytes: bytes of tensors llama.cpp keeps on the host (``token_embd`` and friends).
        layer_bytes: bytes llama.cpp loads for each block ``blk.N`` (MTP/NextN tensors it skips
            without ``load_mtp`` are not counted: ``structure.skipped_layer_bytes``).
        output_bytes: bytes of the output layer (``output.weight``, ``output_norm``); with tied
            embeddings llama.cpp duplicates ``token_embd`` as the output matrix.
        tied_output: True when there is no ``output.weight`` (tied embeddings).
        embd_bytes: bytes of ``token_embd.weight``.
        n_expert, n_expert_used: MoE experts (0 for dense).
        metadata: the raw scalar metadata (long arrays reduced to their length).
        warnings: things the planner can only approximate for this model.
        tensors: the tensor table (names, shapes, types, bytes) of all parts, file order: what
            the ``CPU_REPACK`` plan reads (:mod:`kvtuner.core.plan.repack`).
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
    structure: ModelStructure
    mla_kv_lora_rank: int
    mla_head_dim_k: int
    mla_head_dim_v: int
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
    tensors: tuple[TensorInfo, ...] = field(default=(), repr=False, compare=False)

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
        return (
            self.input_bytes + sum(self.layer_bytes) + self.output_bytes - (self.embd_bytes if self.tied_output else 0)
        )

    @property
    def attention_kind(self) -> str:
        """``MHA``, ``GQA``, ``MQA`` or ``MLA`` (from the first attention layer)."""
        if self.is_mla:
            return "MLA"
        for h, hkv in zip(self.n_head, self.n_head_kv):
            if hkv:
                return "MHA" if hkv == h else ("MQA" if hkv == 1 else "GQA")
        return "none"

    @property
    def n_swa(self) -> int:
        """Sliding window (or attention chunk) in tokens, 0 = none (``hparams.n_swa``)."""
        return self.structure.n_swa

    @property
    def swa_layers(self) -> tuple[bool, ...]:
        """Per block: True for sliding-window/chunked layers (``hparams.is_swa(il)``)."""
        return tuple(r.swa for r in self.structure.layers)

    @property
    def recurrent_layers(self) -> tuple[bool, ...]:
        """Per block: True for layers with recurrent/conv state."""
        return tuple(r.recurrent for r in self.structure.layers)

    @property
    def recurrent_state_floats(self) -> int:
        """f32 values of recurrent state per layer per sequence: ``n_embd_r + n_embd_s``, 0 if none."""
        return self.structure.state_r + self.structure.state_s if any(self.recurrent_layers) else 0

    def head_dim_k_at(self, il: int) -> int:
        """Key head size of layer ``il`` (llama-hparams.cpp ``n_embd_head_k(il)``)."""
        return self.structure.layers[il].head_k

    def head_dim_v_at(self, il: int) -> int:
        """Value head size of layer ``il`` (``n_embd_head_v(il)``)."""
        return self.structure.layers[il].head_v

    def n_embd_k_gqa(self, il: int) -> int:
        """K row width of layer ``il``: ``n_embd_head_k(il) * n_head_kv(il)`` (llama-hparams.cpp)."""
        return self.structure.layers[il].k_width

    def n_embd_v_gqa(self, il: int) -> int:
        """V row width of layer ``il``: ``n_embd_head_v(il) * n_head_kv(il)`` (llama-hparams.cpp)."""
        return self.structure.layers[il].v_width

    def has_kv(self, il: int) -> bool:
        """Whether layer ``il`` has its own entry in the main context's KV cache.

        llama-kv-cache.cpp's constructor skips layers without ``has_kv`` (shared KV) and those
        its layer filter drops (recurrent, MLP-only and MTP/NextN blocks); a layer with 0 KV
        heads (DeciLM) still gets a zero-width entry."""
        return self.structure.layers[il].kv

    def with_structure(self, structure: ModelStructure) -> ModelProfile:
        """A copy planned with another structure (a probe of the installed llama.cpp).

        Raises:
            ValueError: the structure has a different number of blocks.
        """
        if structure.n_layer_all != self.n_layer:
            raise ValueError(f"structure has {structure.n_layer_all} blocks, the model {self.n_layer}")
        return replace(self, structure=structure)

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
            "mla": {
                "kv_lora_rank": self.mla_kv_lora_rank,
                "head_dim_k": self.mla_head_dim_k,
                "head_dim_v": self.mla_head_dim_v,
            }
            if self.is_mla
            else None,
            "recurrent_layers": [i for i, r in enumerate(self.recurrent_layers) if r],
            "structure": {
                "source": self.structure.source,
                "memory": self.structure.memory,
                "swa_type": self.structure.swa_type,
                "summary": self.structure.summary(),
                "kv_layers": [r.il for r in self.structure.kv_layers],
                "shared_kv": {r.il: r.reuse for r in self.structure.layers if r.reuse >= 0},
                "nextn_layers": [r.il for r in self.structure.layers if r.nextn],
                "state_r": self.structure.state_r,
                "state_s": self.structure.state_s,
                "note": self.structure.note,
            },
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
    def from_gguf(cls, path: str | os.PathLike[str]) -> ModelProfile:
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
_BLK_RE = re.compile(r"^blk\.(\d+)\.")


def _build(p: Path, parts: list[Path], headers: list[GGUFHeader]) -> ModelProfile:
    """The profile of the model whose split ``parts`` (first: ``p``) have ``headers``: the
    header's checks (:func:`_architecture`), the hyper-parameters, the tensors' bytes as
    llama.cpp places them (:func:`_tensor_bytes`) and the memory structure.

    Raises:
        GGUFError: a header kvtuner cannot plan (one line saying why).
    """
    first = headers[0]
    md = dict(first.metadata)
    arch = _architecture(p, md, len(headers))
    m = Meta(p, md, arch)
    n_layer = m.int("{arch}.block_count", required=True)
    n_embd = m.int("{arch}.embedding_length", required=True)
    if n_layer == 0 or n_layer > 4096:
        raise GGUFError(f"{p}: impossible block_count {n_layer}")
    if n_embd == 0 or n_embd > 1 << 20:
        raise GGUFError(f"{p}: impossible embedding_length {n_embd}")
    n_ctx_train = m.int("{arch}.context_length", 0)

    hp = read_hparams(m, n_layer, n_embd)
    n_head, n_head_kv = hp.n_head, hp.n_head_kv
    if max(n_head) == 0 and arch not in RECURRENT_ARCHS:
        raise GGUFError(f"{p}: no attention heads (head_count is 0): not a model kvtuner can plan")

    warnings: list[str] = []
    # MLA (deepseek2.cpp): key_length_mla / value_length_mla present -> K-only latent cache
    mla_rank = m.int("{arch}.attention.kv_lora_rank", 0)
    mla_k = m.int("{arch}.attention.key_length_mla", 0)
    mla_v = m.int("{arch}.attention.value_length_mla", 0)
    if not (mla_k and mla_v):
        mla_k = mla_v = 0

    # vocabulary
    tokens = md.get("tokenizer.ggml.tokens")
    n_vocab = m.int("{arch}.vocab_size", 0) or (tokens.count if isinstance(tokens, ArrayInfo) else len(tokens or ()))

    tensors: list[TensorInfo] = [t for h in headers for t in h.tensors]
    tb = _tensor_bytes(p, tensors, n_layer)
    layer_bytes = tb.layer_bytes
    if tb.extra_layers:
        warnings.append("tensors of layers beyond block_count (MTP/NextN heads) are kept on the host in this plan")
    if first.big_endian and sys.byteorder == "little":
        # ggml/src/gguf.cpp gguf_init_from_file_impl: "is there a mismatch between the host and model endianness?"
        warnings.append(
            "a big-endian GGUF: llama.cpp on this little-endian machine refuses it (convert it with "
            "gguf-py's gguf_convert_endian.py); planned as it would run on a big-endian host"
        )
    structure = derive_structure(m, hp, tuple(layer_bytes))
    if structure.skipped_layer_bytes:
        layer_bytes = [b - s for b, s in zip(layer_bytes, structure.skipped_layer_bytes)]

    name = md.get("general.name")
    return ModelProfile(
        path=p,
        parts=tuple(parts),
        file_bytes=sum(h.file_bytes for h in headers),
        header_sha256=first.header_sha256,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        file_type=_file_type_name(md.get("general.file_type")),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=hp.head_k_full,
        head_dim_v=hp.head_v_full,
        head_dim_k_swa=hp.head_k_swa,
        head_dim_v_swa=hp.head_v_swa,
        n_ctx_train=n_ctx_train,
        structure=structure,
        mla_kv_lora_rank=mla_rank,
        mla_head_dim_k=mla_k,
        mla_head_dim_v=mla_v,
        n_vocab=n_vocab,
        n_params=sum(t.n_elements for t in tensors),
        input_bytes=tb.input_bytes,
        layer_bytes=tuple(layer_bytes),
        output_bytes=tb.output_bytes,
        tied_output=tb.tied,
        embd_bytes=tb.embd_bytes,
        n_expert=m.int("{arch}.expert_count", 0),
        n_expert_used=m.int("{arch}.expert_used_count", 0),
        metadata={k: v for k, v in md.items() if not isinstance(v, ArrayInfo)},
        warnings=tuple(warnings),
        tensors=tuple(tensors),
    )


def _architecture(p: Path, md: dict[str, Any], n_parts: int) -> str:
    """``general.architecture`` of a language model, after the split-count check.

    Raises:
        GGUFError: ``split.count`` disagrees with the parts found, the architecture is missing
            or not a name, or the file is not a language model (a projector, an adapter ...).
    """
    if n_parts > 1:
        count = md.get("split.count")
        if count is not None and count != n_parts:
            raise GGUFError(f"{p}: split.count says {printable(repr(count))} parts but the file names say {n_parts}")
    arch = md.get("general.architecture")
    if arch is None:
        raise GGUFError(f"{p}: missing metadata key general.architecture (not a llama.cpp model file)")
    if not isinstance(arch, str):
        raise GGUFError(f"{p}: metadata general.architecture should be a string")
    if not arch or len(arch) > 64 or not arch.isprintable() or any(c.isspace() for c in arch):
        raise GGUFError(f"{p}: general.architecture {printable(arch)!r} is not an architecture name")
    gtype = md.get("general.type")
    if arch in NOT_LANGUAGE_MODELS or (isinstance(gtype, str) and gtype in NOT_MODEL_TYPES):
        what = gtype if isinstance(gtype, str) and gtype in NOT_MODEL_TYPES else arch
        raise GGUFError(
            f"{p}: is a '{what}' file, not a language model kvtuner can plan (open the text model GGUF instead)"
        )
    return arch


@dataclass(frozen=True)
class _TensorBytes:
    """Tensor bytes grouped as llama.cpp places them (:func:`_tensor_bytes`).

    Attributes:
        input_bytes: token embeddings and other non-layer tensors (host), with the tensors of
            layers beyond ``block_count``.
        layer_bytes: bytes of each repeating layer ``blk.<il>.*``.
        output_bytes: ``output*`` tensors; a tied output counts the token embeddings it reuses.
        embd_bytes: ``token_embd.weight``.
        tied: no ``output.weight`` (llama.cpp duplicates token_embd, ``TENSOR_DUPLICATED``).
        extra_layers: tensors of layers beyond ``block_count`` (MTP/NextN heads).
    """

    input_bytes: int
    layer_bytes: list[int]
    output_bytes: int
    embd_bytes: int
    tied: bool
    extra_layers: int


def _tensor_bytes(p: Path, tensors: list[TensorInfo], n_layer: int) -> _TensorBytes:
    """Group ``tensors`` by where llama.cpp places them.

    Raises:
        GGUFError: a tensor named twice, no tensors, or no ``token_embd.weight``.
    """
    names = set()
    input_bytes = output_bytes = 0
    layer_bytes = [0] * n_layer
    has_output_weight = False
    embd_bytes = 0
    extra_layers = 0
    for t in tensors:
        if t.name in names:
            raise GGUFError(f"{p}: tensor {printable(t.name)} appears twice")
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
    return _TensorBytes(input_bytes, layer_bytes, output_bytes, embd_bytes, tied, extra_layers)


def _file_type_name(ftype: Any) -> str | None:
    """``general.file_type`` as gguf-py names it (``MOSTLY_Q4_K_M``), the number for one it does
    not know, None when absent or not a number."""
    if not isinstance(ftype, int):
        return None
    try:
        return gguf.LlamaFileType(ftype).name
    except ValueError:
        return str(ftype)
