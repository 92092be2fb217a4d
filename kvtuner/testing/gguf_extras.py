"""GGUF fixtures of what llama-server loads beside a model: LoRA adapters (zero weights, real
shapes of the base model's tensors).

A LoRA adapter (src/llama-adapter.cpp ``llama_adapter_lora_init_impl``): ``general.type =
adapter``, ``general.architecture`` = the base model's, ``adapter.type = lora``,
``adapter.lora.alpha``; per adapted tensor ``<name>.lora_a`` with ggml shape ``[ne0, r]`` and
``<name>.lora_b`` with ``[r, ne1]`` where ``[ne0, ne1]`` is the base tensor's shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

from kvtuner.core.model.gguf_header import read_header
from kvtuner.core.model.gguf_write import write_sparse_gguf

LORA_TARGETS = ("attn_q", "attn_v")


def write_lora(
    path: str | Path, base: str | Path, *, rank: int = 8, alpha: float = 16.0, targets: Sequence[str] = LORA_TARGETS
) -> Path:
    """Write a zero-weight f32 LoRA adapter of rank ``rank`` for the ``targets`` of every layer of
    the GGUF model ``base``. Returns the path."""
    h = read_header(base)
    arch = h.metadata["general.architecture"]
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for t in h.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in targets and parts[3] == "weight":
            ne0, ne1 = t.shape[0], t.shape[1]
            # numpy order is ggml's reversed: lora_a ggml [ne0, r] -> numpy (r, ne0)
            w.add_tensor(t.name + ".lora_a", np.zeros((rank, ne0), dtype=np.float32))
            w.add_tensor(t.name + ".lora_b", np.zeros((ne1, rank), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_not_gguf(path: str | Path) -> Path:
    """A file that is not GGUF (a text file)."""
    path = Path(path)
    path.write_text("not a gguf file\n")
    return path


#: SigLIP-So400m/14 at 896 px, the vision tower of Gemma 3 4B-27B (google/gemma-3-4b-it config.json
#: vision_config): width 1152, MLP 4304, 27 blocks, 16 heads, patch 14.
SIGLIP_GEMMA3 = {"n_embd": 1152, "n_ff": 4304, "n_block": 27, "n_head": 16, "image_size": 896, "patch_size": 14}


def projector_tensors(text_n_embd: int, v: dict = SIGLIP_GEMMA3) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml shape, type) of a Gemma 3 projector (tools/mtmd/clip.cpp ``load_tensors``,
    ``PROJECTOR_TYPE_GEMMA3``): SigLIP patch and position embeddings, ``n_block`` pre-norm blocks
    (``ln1``, ``attn_q/k/v/out``, ``ln2``, ``ffn_up/down``, each with a bias), ``post_ln``, and
    ``mm.input_projection.weight`` ``[text_n_embd, n_embd]`` with ``mm.soft_emb_norm.weight``.
    Matrices f16, the rest f32 (convert_hf_to_gguf.py's mmproj types)."""
    e, f, p = v["n_embd"], v["n_ff"], v["patch_size"]
    n_pos = (v["image_size"] // p) ** 2
    out = [
        ("v.patch_embd.weight", (p, p, 3, e), "f16"),
        ("v.patch_embd.bias", (e,), "f32"),
        ("v.position_embd.weight", (e, n_pos), "f16"),
    ]
    for i in range(v["n_block"]):
        b = f"v.blk.{i}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out += [(b + n + ".weight", (e, e), "f16"), (b + n + ".bias", (e,), "f32")]
        for n in ("ln1", "ln2"):
            out += [(b + n + ".weight", (e,), "f32"), (b + n + ".bias", (e,), "f32")]
        out += [
            (b + "ffn_up.weight", (e, f), "f16"),
            (b + "ffn_up.bias", (f,), "f32"),
            (b + "ffn_down.weight", (f, e), "f16"),
            (b + "ffn_down.bias", (e,), "f32"),
        ]
    out += [
        ("v.post_ln.weight", (e,), "f32"),
        ("v.post_ln.bias", (e,), "f32"),
        ("mm.input_projection.weight", (text_n_embd, e), "f16"),
        ("mm.soft_emb_norm.weight", (e,), "f32"),
    ]
    return out


def write_projector(path: str | Path, text_n_embd: int, v: dict = SIGLIP_GEMMA3) -> Path:
    """Write a sparse zero-weight Gemma 3 (SigLIP) projector GGUF for a text model ``text_n_embd``
    wide: ``general.architecture = clip``, ``clip.projector_type = gemma3`` and the
    ``clip.vision.*`` hparams clip.cpp ``load_hparams`` reads. Returns the path."""
    path = Path(path)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", "siglip gemma3 projector shape (zero weights)")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "gemma3")
    w.add_uint32("clip.vision.embedding_length", v["n_embd"])
    w.add_uint32("clip.vision.feed_forward_length", v["n_ff"])
    w.add_uint32("clip.vision.block_count", v["n_block"])
    w.add_uint32("clip.vision.attention.head_count", v["n_head"])
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", text_n_embd)
    w.add_uint32("clip.vision.image_size", v["image_size"])
    w.add_uint32("clip.vision.patch_size", v["patch_size"])
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_bool("clip.use_gelu", True)
    tensors = [(name, shape, t.upper()) for name, shape, t in projector_tensors(text_n_embd, v)]  # "F16" / "F32"
    write_sparse_gguf(path, w, tensors)
    return path
