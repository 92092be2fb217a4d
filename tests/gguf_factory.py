"""Write small or sparse GGUF language models with gguf's own writer, for tests and benchmarks.

A *sparse* model has a real header and tensor table and a file size that covers all tensor
data, but the data is a hole (``truncate``): llama.cpp's dry-run (no_alloc) reads no weights,
so a 7B model costs a few KiB of disk. ``random_weights=True`` writes real random data instead
(for runs that compute).

Tensor names and shapes follow llama.cpp's ``load_arch_tensors`` for ``llama`` and ``gemma3``
(src/models/llama.cpp, src/models/gemma3.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

GQT = gguf.GGMLQuantizationType


@dataclass
class ModelSpec:
    """Hyper-parameters of a synthetic model (llama.cpp names)."""

    arch: str = "llama"
    n_layer: int = 4
    n_embd: int = 256
    n_head: int | Sequence[int] = 8
    n_head_kv: int | Sequence[int] = 8
    head_dim: int | None = None  # key_length/value_length; default n_embd / n_head
    n_ff: int = 512
    n_vocab: int = 1024
    n_ctx_train: int = 4096
    sliding_window: int | None = None
    swa_pattern: int | Sequence[bool] | None = None
    weight_type: int = GQT.F16
    tied_output: bool = False
    name: str = "kvtuner synthetic"
    extra_kv: dict = field(default_factory=dict)
    #: explicit tensor table ``[(name, ggml shape (ne0 first), ggml type)]`` for architectures
    #: this module does not lay out itself (tests/gguf_families.py builds them)
    tensors: list | None = None


def _per_layer(v: int | Sequence[int], n_layer: int) -> list[int]:
    return [int(v)] * n_layer if isinstance(v, int) else [int(x) for x in v]


def _tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, ggml shape (ne0 first), ggml type) for every tensor."""
    if spec.tensors is not None:
        return [(n, tuple(sh), t) for n, sh, t in spec.tensors]
    heads = _per_layer(spec.n_head, spec.n_layer)
    kv_heads = _per_layer(spec.n_head_kv, spec.n_layer)
    hd = spec.head_dim or spec.n_embd // max(max(heads), 1)
    wt = spec.weight_type
    E, F, V = spec.n_embd, spec.n_ff, spec.n_vocab
    out: list[tuple[str, tuple[int, ...], int]] = [("token_embd.weight", (E, V), wt), ("output_norm.weight", (E,), GQT.F32)]
    if not spec.tied_output:
        out.append(("output.weight", (E, V), wt))
    for il in range(spec.n_layer):
        h, hkv = heads[il], kv_heads[il]
        p = f"blk.{il}."
        if spec.arch == "deci" and hkv == 0:  # attention-free layer: norm + output only (src/models/deci.cpp)
            out += [(p + "attn_norm.weight", (E,), GQT.F32), (p + "attn_output.weight", (E, E), wt),
                    (p + "ffn_norm.weight", (E,), GQT.F32), (p + "ffn_gate.weight", (E, F), wt),
                    (p + "ffn_up.weight", (E, F), wt), (p + "ffn_down.weight", (F, E), wt)]
            continue
        out += [
            (p + "attn_norm.weight", (E,), GQT.F32),
            (p + "attn_q.weight", (E, h * hd), wt),
            (p + "attn_k.weight", (E, hkv * hd), wt),
            (p + "attn_v.weight", (E, hkv * hd), wt),
            (p + "attn_output.weight", (h * hd, E), wt),
            (p + "ffn_norm.weight", (E,), GQT.F32),
            (p + "ffn_gate.weight", (E, F), wt),
            (p + "ffn_up.weight", (E, F), wt),
            (p + "ffn_down.weight", (F, E), wt),
        ]
        if spec.arch == "gemma3":
            out += [
                (p + "attn_q_norm.weight", (hd,), GQT.F32),
                (p + "attn_k_norm.weight", (hd,), GQT.F32),
                (p + "post_attention_norm.weight", (E,), GQT.F32),
                (p + "post_ffw_norm.weight", (E,), GQT.F32),
            ]
    return out


def _nbytes(shape: tuple[int, ...], t: int) -> int:
    block, size = gguf.GGML_QUANT_SIZES[GQT(t)]
    n = int(np.prod(shape))
    return n // block * size


def tensor_bytes(spec: ModelSpec) -> dict[str, int]:
    """Exact bytes of every tensor the factory writes (for expected values in tests)."""
    return {name: _nbytes(shape, t) for name, shape, t in _tensors(spec)}


def write_model(path: str | Path, spec: ModelSpec, *, random_weights: bool = False, seed: int = 0) -> Path:
    """Write ``spec`` as a GGUF file at ``path`` (sparse unless ``random_weights``); returns the path."""
    path = Path(path)
    w = gguf.GGUFWriter(str(path), spec.arch)
    a = spec.arch
    w.add_name(spec.name)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    heads = spec.n_head
    w.add_head_count(heads if isinstance(heads, int) else list(heads))
    kvh = spec.n_head_kv
    w.add_head_count_kv(kvh if isinstance(kvh, int) else list(kvh))
    if spec.head_dim:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16 if spec.weight_type == GQT.F16 else gguf.LlamaFileType.MOSTLY_Q8_0))
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
    if spec.swa_pattern is not None:
        key = f"{a}.attention.sliding_window_pattern"
        if isinstance(spec.swa_pattern, int):
            w.add_uint32(key, spec.swa_pattern)
        else:
            w.add_array(key, [bool(x) for x in spec.swa_pattern])
    # a dummy vocabulary: llama.cpp's "none" tokenizer takes its size from {arch}.vocab_size
    w.add_tokenizer_model("none")
    w.add_vocab_size(spec.n_vocab)
    for k, v in spec.extra_kv.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, list(v))

    tensors = _tensors(spec)
    rng = np.random.default_rng(seed)
    for name, shape, t in tensors:
        nbytes = _nbytes(shape, t)
        if random_weights:
            if t == GQT.F32:
                data = rng.standard_normal(shape[::-1], dtype=np.float32) * 0.02
            elif t == GQT.F16:
                data = (rng.standard_normal(shape[::-1], dtype=np.float32) * 0.02).astype(np.float16)
            else:
                data = gguf.quantize(rng.standard_normal(shape[::-1], dtype=np.float32) * 0.02, GQT(t))
            w.add_tensor(name, data, raw_dtype=None if t in (GQT.F32, GQT.F16) else GQT(t))
        else:
            w.add_tensor_info(name, shape[::-1], np.dtype(np.float32), nbytes, raw_dtype=GQT(t))
    if random_weights:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    align = gguf.GGUF_DEFAULT_ALIGNMENT
    size = path.stat().st_size
    data_start = -(-size // align) * align
    total = sum(-(-_nbytes(s, t) // align) * align for _, s, t in tensors)
    with open(path, "r+b") as f:
        f.truncate(data_start + total)
    return path


# Real models' shapes (from their config.json), for worked numbers people quote.
LLAMA2_7B = ModelSpec(n_layer=32, n_embd=4096, n_head=32, n_head_kv=32, n_ff=11008, n_vocab=32000, n_ctx_train=4096,
                      name="LLaMA-2-7B shape")
LLAMA31_8B = ModelSpec(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256, n_ctx_train=131072,
                       name="Llama-3.1-8B shape")
QWEN25_CODER_32B = ModelSpec(arch="qwen2", n_layer=64, n_embd=5120, n_head=40, n_head_kv=8, n_ff=27648, n_vocab=152064,
                             n_ctx_train=32768, name="Qwen2.5-Coder-32B shape")
