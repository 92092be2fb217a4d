"""Write small or sparse GGUF language models with gguf's own writer, for tests and benchmarks.

A *sparse* model has a real header and tensor table and a file size that covers all tensor
data, but the data is a hole (``truncate``): llama.cpp's dry-run (no_alloc) reads no weights,
so a 7B model costs a few KiB of disk. ``random_weights=True`` writes real random data instead
(for runs that compute).

Tensor names and shapes follow llama.cpp's ``load_arch_tensors`` for ``llama`` and ``gemma3``
(src/models/llama.cpp, src/models/gemma3.cpp), and for the architectures the public-log truth set
(benchmarks/gpu_logs) needs: ``gptneox`` (fused QKV, biases, LayerNorm), ``qwen2`` (QKV biases with ``qkv_bias``),
``qwen3moe`` (Q/K norms, routed experts as 3-D ``*_exps`` tensors), ``command-r`` (no FFN norm,
tied output) and ``glm4`` (GLM-4-0414: post-attention/post-FFN norms, fused gate+up ``ffn_up``).
``tensor_types`` / ``more_bits_types`` give per-class quantization types so a fixture's weight
bytes can follow a printed file type (llama-quant.cpp's ``use_more_bits`` layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np

# the E8M0 exponent write_mxfp4_scales writes and its block writer: the CPU probe's own
from kvtuner.core.model.gguf_write import add_transformer_keys, tensor_nbytes, write_sparse_gguf
from kvtuner.core.speed.cpu_probe import MXFP4_NORMAL_EXPONENT, mxfp4_blocks

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
    # MoE (qwen3moe): routed experts, experts per token, width of one expert's FFN
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int | None = None
    # per-class tensor types: class -> GGMLQuantizationType, class being the tensor name without
    # "blk.N." and ".weight" ("token_embd", "output", "attn_v", "ffn_down_exps" ...); unlisted
    # matrices use weight_type, norms and biases are F32
    tensor_types: dict = field(default_factory=dict)
    # classes that get another type in llama-quant.cpp's use_more_bits layers (Q4_K_M / Q5_K_M:
    # attn_v and ffn_down become Q6_K in the first and last eighth and every third layer between)
    more_bits_types: dict = field(default_factory=dict)
    file_type: int | None = None  # general.file_type (LlamaFileType); default from weight_type
    qkv_bias: bool = False  # Q/K/V bias tensors (qwen2 has them; off by default to keep older fixtures)
    #: explicit tensor table ``[(name, ggml shape (ne0 first), ggml type)]`` for architectures
    #: this module does not lay out itself (kvtuner/testing/gguf_families.py builds them)
    tensors: list | None = None


def _per_layer(v: int | Sequence[int], n_layer: int) -> list[int]:
    return [int(v)] * n_layer if isinstance(v, int) else [int(x) for x in v]


def _use_more_bits(il: int, n_layer: int) -> bool:
    """llama-quant.cpp ``use_more_bits``: first and last eighth of the layers and every third between."""
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def _tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, ggml shape (ne0 first), ggml type) for every tensor."""
    if spec.tensors is not None:
        return [(n, tuple(sh), t) for n, sh, t in spec.tensors]
    heads = _per_layer(spec.n_head, spec.n_layer)
    kv_heads = _per_layer(spec.n_head_kv, spec.n_layer)
    hd = spec.head_dim or spec.n_embd // max(max(heads), 1)
    wt = spec.weight_type
    E, F, V = spec.n_embd, spec.n_ff, spec.n_vocab
    F32 = GQT.F32

    def ty(cls: str, il: int | None = None) -> int:
        if il is not None and cls in spec.more_bits_types and _use_more_bits(il, spec.n_layer):
            return spec.more_bits_types[cls]
        return spec.tensor_types.get(cls, wt)

    out: list[tuple[str, tuple[int, ...], int]] = [
        ("token_embd.weight", (E, V), ty("token_embd")),
        ("output_norm.weight", (E,), F32),
    ]
    if spec.arch == "gptneox":
        out.append(("output_norm.bias", (E,), F32))
    if not spec.tied_output:
        out.append(("output.weight", (E, V), ty("output")))
    for il in range(spec.n_layer):
        h, hkv = heads[il], kv_heads[il]
        p = f"blk.{il}."
        if spec.arch == "deci" and hkv == 0:  # attention-free layer: norm + output only (src/models/deci.cpp)
            out += [
                (p + "attn_norm.weight", (E,), GQT.F32),
                (p + "attn_output.weight", (E, E), wt),
                (p + "ffn_norm.weight", (E,), GQT.F32),
                (p + "ffn_gate.weight", (E, F), wt),
                (p + "ffn_up.weight", (E, F), wt),
                (p + "ffn_down.weight", (F, E), wt),
            ]
            continue
        if spec.arch == "glm4":  # src/models/glm4.cpp: post-attn/post-FFN norms, fused gate+up (ffn_up 2*n_ff wide)
            out += [
                (p + "attn_norm.weight", (E,), F32),
                (p + "attn_q.weight", (E, h * hd), ty("attn_q", il)),
                (p + "attn_k.weight", (E, hkv * hd), ty("attn_k", il)),
                (p + "attn_v.weight", (E, hkv * hd), ty("attn_v", il)),
                (p + "attn_output.weight", (h * hd, E), ty("attn_output", il)),
                (p + "post_attention_norm.weight", (E,), F32),
                (p + "ffn_norm.weight", (E,), F32),
                (p + "ffn_up.weight", (E, 2 * F), ty("ffn_up", il)),
                (p + "ffn_down.weight", (F, E), ty("ffn_down", il)),
                (p + "post_ffw_norm.weight", (E,), F32),
            ]
            continue
        if spec.arch == "gptneox":  # src/models/gptneox.cpp: LayerNorm with bias, fused QKV, GELU FFN
            out += [
                (p + "attn_norm.weight", (E,), F32),
                (p + "attn_norm.bias", (E,), F32),
                (p + "attn_qkv.weight", (E, 3 * E), ty("attn_qkv", il)),
                (p + "attn_qkv.bias", (3 * E,), F32),
                (p + "attn_output.weight", (E, E), ty("attn_output", il)),
                (p + "attn_output.bias", (E,), F32),
                (p + "ffn_norm.weight", (E,), F32),
                (p + "ffn_norm.bias", (E,), F32),
                (p + "ffn_up.weight", (E, F), ty("ffn_up", il)),
                (p + "ffn_up.bias", (F,), F32),
                (p + "ffn_down.weight", (F, E), ty("ffn_down", il)),
                (p + "ffn_down.bias", (E,), F32),
            ]
            continue
        out += [
            (p + "attn_norm.weight", (E,), F32),
            (p + "attn_q.weight", (E, h * hd), ty("attn_q", il)),
            (p + "attn_k.weight", (E, hkv * hd), ty("attn_k", il)),
            (p + "attn_v.weight", (E, hkv * hd), ty("attn_v", il)),
            (p + "attn_output.weight", (h * hd, E), ty("attn_output", il)),
        ]
        if spec.qkv_bias:  # qwen2: Q/K/V biases (src/models/qwen2.cpp)
            out += [
                (p + "attn_q.bias", (h * hd,), F32),
                (p + "attn_k.bias", (hkv * hd,), F32),
                (p + "attn_v.bias", (hkv * hd,), F32),
            ]
        if spec.arch == "qwen3moe":  # src/models/qwen3moe.cpp
            Fe, X = spec.n_ff_exp or F, spec.n_expert
            out += [
                (p + "attn_q_norm.weight", (hd,), F32),
                (p + "attn_k_norm.weight", (hd,), F32),
                (p + "ffn_norm.weight", (E,), F32),
                (p + "ffn_gate_inp.weight", (E, X), F32),
                (p + "ffn_gate_exps.weight", (E, Fe, X), ty("ffn_gate_exps", il)),
                (p + "ffn_up_exps.weight", (E, Fe, X), ty("ffn_up_exps", il)),
                (p + "ffn_down_exps.weight", (Fe, E, X), ty("ffn_down_exps", il)),
            ]
            continue
        if spec.arch != "command-r":  # command-r: parallel attention/FFN off one norm (src/models/command-r.cpp)
            out.append((p + "ffn_norm.weight", (E,), F32))
        out += [
            (p + "ffn_gate.weight", (E, F), ty("ffn_gate", il)),
            (p + "ffn_up.weight", (E, F), ty("ffn_up", il)),
            (p + "ffn_down.weight", (F, E), ty("ffn_down", il)),
        ]
        if spec.arch == "gemma3":
            out += [
                (p + "attn_q_norm.weight", (hd,), GQT.F32),
                (p + "attn_k_norm.weight", (hd,), GQT.F32),
                (p + "post_attention_norm.weight", (E,), GQT.F32),
                (p + "post_ffw_norm.weight", (E,), GQT.F32),
            ]
    return out


def hd_rot(spec: ModelSpec) -> int:
    """Head size of ``spec`` (``head_dim`` or ``n_embd / n_head``)."""
    heads = _per_layer(spec.n_head, spec.n_layer)
    return spec.head_dim or spec.n_embd // max(max(heads), 1)


def tensor_bytes(spec: ModelSpec) -> dict[str, int]:
    """Exact bytes of every tensor the factory writes (for expected values in tests)."""
    return {name: tensor_nbytes(shape, t) for name, shape, t in _tensors(spec)}


def write_model(path: str | Path, spec: ModelSpec, *, random_weights: bool = False, seed: int = 0) -> Path:
    """Write ``spec`` as a GGUF file at ``path`` (sparse unless ``random_weights``); returns the path."""
    path = Path(path)
    w = gguf.GGUFWriter(str(path), spec.arch)
    a = spec.arch
    w.add_name(spec.name)
    add_transformer_keys(w, spec.n_layer, spec.n_ctx_train, spec.n_embd, spec.n_ff, spec.n_head, spec.n_head_kv)
    if spec.head_dim:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    if spec.arch == "gptneox":
        w.add_layer_norm_eps(1e-5)
        w.add_rope_dimension_count(max(1, hd_rot(spec) // 4))
        w.add_bool(f"{a}.use_parallel_residual", True)
    elif spec.arch == "command-r":
        w.add_layer_norm_eps(1e-5)
        w.add_float32(f"{a}.logit_scale", 0.0625)
    else:
        w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    if spec.n_expert:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        if spec.n_ff_exp:
            w.add_expert_feed_forward_length(spec.n_ff_exp)
    if spec.file_type is not None:
        w.add_file_type(int(spec.file_type))
    else:
        w.add_file_type(
            int(gguf.LlamaFileType.MOSTLY_F16 if spec.weight_type == GQT.F16 else gguf.LlamaFileType.MOSTLY_Q8_0)
        )
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
    if not random_weights:
        write_sparse_gguf(path, w, tensors)
        return path
    rng = np.random.default_rng(seed)
    for name, shape, t in tensors:
        if t == GQT.F32:
            data = rng.standard_normal(shape[::-1], dtype=np.float32) * 0.02
        elif t == GQT.F16:
            data = (rng.standard_normal(shape[::-1], dtype=np.float32) * 0.02).astype(np.float16)
        else:
            data = gguf.quantize(rng.standard_normal(shape[::-1], dtype=np.float32) * 0.02, GQT(t))
        w.add_tensor(name, data, raw_dtype=None if t in (GQT.F32, GQT.F16) else GQT(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Real models' shapes (from their config.json), for worked numbers people quote.
LLAMA2_7B = ModelSpec(
    n_layer=32,
    n_embd=4096,
    n_head=32,
    n_head_kv=32,
    n_ff=11008,
    n_vocab=32000,
    n_ctx_train=4096,
    name="LLaMA-2-7B shape",
)
LLAMA31_8B = ModelSpec(
    n_layer=32,
    n_embd=4096,
    n_head=32,
    n_head_kv=8,
    n_ff=14336,
    n_vocab=128256,
    n_ctx_train=131072,
    name="Llama-3.1-8B shape",
)
QWEN25_CODER_32B = ModelSpec(
    arch="qwen2",
    n_layer=64,
    n_embd=5120,
    n_head=40,
    n_head_kv=8,
    n_ff=27648,
    n_vocab=152064,
    n_ctx_train=32768,
    name="Qwen2.5-Coder-32B shape",
)
# Gemma 3 12B (config.json of google/gemma-3-12b-it: 48 layers, hidden 3840, 16 heads, 8 KV heads
# of 256, intermediate 15360, window 1024, 5 local : 1 global layers; vocab 262208; tied output)
GEMMA3_12B = ModelSpec(
    arch="gemma3",
    n_layer=48,
    n_embd=3840,
    n_head=16,
    n_head_kv=8,
    head_dim=256,
    n_ff=15360,
    n_vocab=262208,
    n_ctx_train=131072,
    sliding_window=1024,
    swa_pattern=6,
    tied_output=True,
    name="Gemma-3-12B shape",
)
# Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads, 4 KV heads of
# 128, 128 experts of width 768, 8 used; vocab 151936; untied output)
QWEN3_30B_A3B = ModelSpec(
    arch="qwen3moe",
    n_layer=48,
    n_embd=2048,
    n_head=32,
    n_head_kv=4,
    head_dim=128,
    n_ff=6144,
    n_vocab=151936,
    n_ctx_train=40960,
    n_expert=128,
    n_expert_used=8,
    n_ff_exp=768,
    name="Qwen3-30B-A3B shape",
)


def q4_k_m(spec: ModelSpec) -> ModelSpec:
    """``spec`` as a Q4_K_M file (``general.file_type`` 15), following llama-quant.cpp's
    ``llama_tensor_get_type`` for the main classes: Q4_K matrices, Q6_K for the output matrix
    (the token embedding when the output is tied) and for ``attn_v`` / ``ffn_down`` /
    ``ffn_down_exps`` in the ``use_more_bits`` layers. Real files differ by a few MiB (not every
    special case is copied); the fixture is self-consistent, which a plan-versus-llama.cpp
    comparison needs. Zero-weight sparse files of real shapes run at real speed on a GPU."""
    out = "token_embd" if spec.tied_output else "output"
    return replace(
        spec,
        weight_type=GQT.Q4_K,
        file_type=int(gguf.LlamaFileType.MOSTLY_Q4_K_M),
        tensor_types={out: GQT.Q6_K},
        more_bits_types={"attn_v": GQT.Q6_K, "ffn_down": GQT.Q6_K, "ffn_down_exps": GQT.Q6_K},
    )


def q8_0(spec: ModelSpec) -> ModelSpec:
    """``spec`` as a Q8_0 file (every matrix Q8_0, ``general.file_type`` 7)."""
    return replace(
        spec, weight_type=GQT.Q8_0, file_type=int(gguf.LlamaFileType.MOSTLY_Q8_0), tensor_types={}, more_bits_types={}
    )


def copy_header_sparse(src: str | Path, dst: str | Path) -> Path:
    """Write ``dst`` as ``src`` with every weight zero: the exact header, metadata and tensor
    table of ``src`` (its vocabulary too), then a hole up to ``src``'s size. Returns ``dst``.
    The header ends where gguf's reader says the tensor data starts."""
    src, dst = Path(src), Path(dst)
    offset = gguf.GGUFReader(str(src)).data_offset
    with open(src, "rb") as f:
        head = f.read(offset)
    return write_header_sparse(head, src.stat().st_size, dst)


def write_header_sparse(header: bytes, size: int, dst: str | Path) -> Path:
    """Write ``header`` (a GGUF file's bytes up to its tensor data) at ``dst`` and extend the file
    to ``size`` bytes with a hole (all-zero weights, no disk blocks)."""
    dst = Path(dst)
    with open(dst, "wb") as f:
        f.write(header)
        f.truncate(size)
    return dst


# ---------------------------------------------------------------------------------------------
# Real architectures as zero-weight fixtures (speed validation; benchmarks/speed_validation.py)
#
# A zero-weight file with a real model's shapes, tensor types and vocabulary size runs at that
# model's real speed on llama.cpp's CPU and GPU kernels, which never look at weight values -- with
# one exception kept here: a MoE router that sees all-zero hidden states sends every token to the
# same experts. So MoE fixtures carry real data in the few small tensors routing depends on
# (random token embeddings, unit norms, a random router), and every token picks its own experts.


@dataclass(frozen=True)
class RealShape:
    """A published model's architecture (from its Hugging Face ``config.json``, URL in ``source``).

    ``qk_norm``: ``"head"`` (Qwen3: per-head q/k norms), ``"embd"`` (OLMoE: over n_embd) or None.
    ``fused``: Phi-3's fused ``attn_qkv`` and gate+up ``ffn_up``. MoE: ``n_expert``,
    ``n_expert_used``, ``n_ff_exp`` (expert FFN width), ``n_ff_shexp`` (shared expert, 0: none).
    """

    key: str
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    tied: bool
    source: str
    head_dim: int | None = None
    qkv_bias: bool = False
    qk_norm: str | None = None
    fused: bool = False
    post_norms: bool = False
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    sliding_window: int | None = None
    extra_kv: tuple = ()

    @property
    def hd(self) -> int:
        """Head size."""
        return self.head_dim or self.n_embd // self.n_head


_HF = "https://huggingface.co/{}/blob/main/config.json"

#: Real shapes by key (config.json figures; the key names the model).
REAL_SHAPES: dict[str, RealShape] = {
    s.key: s
    for s in (
        RealShape(
            "llama-3.2-1b",
            "llama",
            16,
            2048,
            32,
            8,
            8192,
            128256,
            131072,
            True,
            _HF.format("meta-llama/Llama-3.2-1B"),
            head_dim=64,
        ),
        RealShape(
            "qwen2.5-3b",
            "qwen2",
            36,
            2048,
            16,
            2,
            11008,
            151936,
            32768,
            True,
            _HF.format("Qwen/Qwen2.5-3B"),
            qkv_bias=True,
        ),
        RealShape(
            "granite-3.0-1b-a400m",
            "granitemoe",
            24,
            1024,
            16,
            8,
            512,
            49155,
            4096,
            True,
            _HF.format("ibm-granite/granite-3.0-1b-a400m-base"),
            n_expert=32,
            n_expert_used=8,
            n_ff_exp=512,
            extra_kv=(
                ("granitemoe.logit_scale", 6.0),
                ("granitemoe.residual_scale", 0.22),
                ("granitemoe.embedding_scale", 12.0),
                ("granitemoe.attention.scale", 0.015625),
            ),
        ),
        RealShape(
            "llama-2-7b", "llama", 32, 4096, 32, 32, 11008, 32000, 4096, False, _HF.format("meta-llama/Llama-2-7b-hf")
        ),
        RealShape(
            "llama-3.1-8b",
            "llama",
            32,
            4096,
            32,
            8,
            14336,
            128256,
            131072,
            False,
            _HF.format("meta-llama/Llama-3.1-8B"),
        ),
        RealShape(
            "llama-2-13b", "llama", 40, 5120, 40, 40, 13824, 32000, 4096, False, _HF.format("meta-llama/Llama-2-13b-hf")
        ),
        RealShape(
            "mistral-7b-v0.3",
            "llama",
            32,
            4096,
            32,
            8,
            14336,
            32768,
            32768,
            False,
            _HF.format("mistralai/Mistral-7B-v0.3"),
        ),
        RealShape(
            "gemma-2-9b",
            "gemma2",
            42,
            3584,
            16,
            8,
            14336,
            256000,
            8192,
            True,
            _HF.format("google/gemma-2-9b"),
            head_dim=256,
            post_norms=True,
            sliding_window=4096,
            extra_kv=(("gemma2.attn_logit_softcapping", 50.0), ("gemma2.final_logit_softcapping", 30.0)),
        ),
        RealShape(
            "qwen2.5-14b",
            "qwen2",
            48,
            5120,
            40,
            8,
            13824,
            152064,
            32768,
            False,
            _HF.format("Qwen/Qwen2.5-14B"),
            qkv_bias=True,
        ),
        RealShape(
            "phi-3-mini-4k",
            "phi3",
            32,
            3072,
            32,
            32,
            8192,
            32064,
            4096,
            False,
            _HF.format("microsoft/Phi-3-mini-4k-instruct"),
            fused=True,
        ),
        RealShape(
            "olmoe-1b-7b",
            "olmoe",
            16,
            2048,
            16,
            16,
            1024,
            50304,
            4096,
            False,
            _HF.format("allenai/OLMoE-1B-7B-0924"),
            qk_norm="embd",
            n_expert=64,
            n_expert_used=8,
            n_ff_exp=1024,
        ),
        RealShape(
            "qwen1.5-moe-a2.7b",
            "qwen2moe",
            24,
            2048,
            16,
            16,
            5632,
            151936,
            8192,
            False,
            _HF.format("Qwen/Qwen1.5-MoE-A2.7B"),
            qkv_bias=True,
            n_expert=60,
            n_expert_used=4,
            n_ff_exp=1408,
            n_ff_shexp=5632,
        ),
    )
}


#: llama-quantize's type for a tensor whose rows (``ne[0]``) are not a multiple of the target
#: type's block (src/llama-quant.cpp ``tensor_type_fallback``): the 256-block i-quants take IQ4_NL,
#: the low k-quants Q4_0, Q4_K Q5_0, Q5_K Q5_1, Q6_K Q8_0; a 32-block type keeps itself. Where the
#: fallback's block does not divide the rows either, the tensor is F16 (:func:`fallback_type`).
_K_FALLBACK = {
    **dict.fromkeys(
        (GQT.IQ1_S, GQT.IQ1_M, GQT.IQ2_XXS, GQT.IQ2_XS, GQT.IQ2_S, GQT.IQ3_XXS, GQT.IQ3_S, GQT.IQ4_XS), GQT.IQ4_NL
    ),
    **dict.fromkeys((GQT.Q2_K, GQT.Q3_K, GQT.TQ1_0, GQT.TQ2_0), GQT.Q4_0),
    GQT.Q4_K: GQT.Q5_0,
    GQT.Q5_K: GQT.Q5_1,
    GQT.Q6_K: GQT.Q8_0,
}


def fallback_type(t: int, n_cols: int) -> int:
    """The type llama-quantize writes for a tensor of target type ``t`` with ``n_cols`` elements
    per row (``ne[0]``): ``t`` when its block divides the rows, else its :data:`_K_FALLBACK`, else
    F16 (src/llama-quant.cpp ``tensor_type_fallback``)."""
    if n_cols % gguf.GGML_QUANT_SIZES[GQT(t)][0] == 0:
        return t
    f = _K_FALLBACK.get(GQT(t), GQT(t))
    return f if n_cols % gguf.GGML_QUANT_SIZES[f][0] == 0 else GQT.F16


#: File types the factory writes: (default tensor type, gguf.LlamaFileType).
REAL_FTYPES = {
    "F16": (GQT.F16, gguf.LlamaFileType.MOSTLY_F16),
    "Q8_0": (GQT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (GQT.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "Q4_1": (GQT.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
    "Q5_0": (GQT.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    "Q3_K_S": (GQT.Q3_K, gguf.LlamaFileType.MOSTLY_Q3_K_S),
    "Q4_K_S": (GQT.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    "Q4_K_M": (GQT.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
}


def _real_type(name: str, shape: tuple[int, ...], ftype: str, s: RealShape, counters: dict[str, int]) -> int:
    """The tensor type ``llama-quantize`` gives ``name`` for ``ftype`` (src/llama-quant.cpp
    ``llama_tensor_get_type_impl``, non-falcon, n_expert != 8), with its fallback for rows not a
    multiple of the block (``tensor_type_fallback``)."""
    if len(shape) == 1 or "ffn_gate_inp" in name:
        return GQT.F32  # norms, biases and routers are not quantized
    if ftype in ("F16", "Q8_0"):
        return GQT[ftype]
    if ftype not in REAL_FTYPES:
        raise ValueError(f"file type {ftype} is not written by the factory ({', '.join(REAL_FTYPES)})")
    t = REAL_FTYPES[ftype][0]
    il = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if name == "output.weight" or (s.tied and name == "token_embd.weight"):
        t = GQT.Q6_K
    elif ftype == "Q4_K_S" and ".attn_v." in name:
        t = GQT.Q5_K if counters["attn_v"] < 4 else GQT.Q4_K
        counters["attn_v"] += 1
    elif ftype == "Q4_K_S" and ".ffn_down" in name:
        t = GQT.Q5_K if il < s.n_layer // 8 else GQT.Q4_K
    elif ftype != "Q4_K_M":
        pass
    elif ".attn_v." in name:
        t = GQT.Q6_K if _use_more_bits(counters["attn_v"], s.n_layer) else GQT.Q4_K
        counters["attn_v"] += 1
    elif ".attn_qkv." in name:
        t = GQT.Q5_K
    elif ".ffn_down" in name:
        n_down = s.n_layer * (2 if s.n_ff_shexp else 1)
        i = il if s.n_expert > 1 else counters["ffn_down"]
        t = GQT.Q6_K if _use_more_bits(i, n_down) else GQT.Q4_K
        counters["ffn_down"] += 1
    return fallback_type(t, shape[0])


def _real_tensors(s: RealShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, ggml shape) of every tensor, in llama.cpp's ``load_arch_tensors`` order for the arch
    (src/models/{llama,qwen2,gemma2,phi3,olmoe,qwen2moe,granite}.cpp)."""
    E, V, hd = s.n_embd, s.n_vocab, s.hd
    q, kv = s.n_head * hd, s.n_head_kv * hd
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (E, V)), ("output_norm.weight", (E,))]
    if not s.tied:
        out.append(("output.weight", (E, V)))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        out.append((p + "attn_norm.weight", (E,)))
        if s.fused:
            out.append((p + "attn_qkv.weight", (E, q + 2 * kv)))
        else:
            out += [(p + "attn_q.weight", (E, q)), (p + "attn_k.weight", (E, kv)), (p + "attn_v.weight", (E, kv))]
        if s.qkv_bias:
            out += [(p + "attn_q.bias", (q,)), (p + "attn_k.bias", (kv,)), (p + "attn_v.bias", (kv,))]
        if s.qk_norm == "embd":
            out += [(p + "attn_q_norm.weight", (q,)), (p + "attn_k_norm.weight", (kv,))]
        elif s.qk_norm == "head":
            out += [(p + "attn_q_norm.weight", (hd,)), (p + "attn_k_norm.weight", (hd,))]
        out.append((p + "attn_output.weight", (q, E)))
        if s.post_norms:
            out.append((p + "post_attention_norm.weight", (E,)))
        out.append((p + "ffn_norm.weight", (E,)))
        if s.n_expert:
            X, F = s.n_expert, s.n_ff_exp
            out += [
                (p + "ffn_gate_inp.weight", (E, X)),
                (p + "ffn_gate_exps.weight", (E, F, X)),
                (p + "ffn_down_exps.weight", (F, E, X)),
                (p + "ffn_up_exps.weight", (E, F, X)),
            ]
            if s.n_ff_shexp:
                S = s.n_ff_shexp
                out += [
                    (p + "ffn_gate_inp_shexp.weight", (E,)),
                    (p + "ffn_gate_shexp.weight", (E, S)),
                    (p + "ffn_down_shexp.weight", (S, E)),
                    (p + "ffn_up_shexp.weight", (E, S)),
                ]
        elif s.fused:
            out += [(p + "ffn_down.weight", (s.n_ff, E)), (p + "ffn_up.weight", (E, 2 * s.n_ff))]
        else:
            out += [
                (p + "ffn_gate.weight", (E, s.n_ff)),
                (p + "ffn_up.weight", (E, s.n_ff)),
                (p + "ffn_down.weight", (s.n_ff, E)),
            ]
        if s.post_norms:
            out.append((p + "post_ffw_norm.weight", (E,)))
    return out


def real_shape_tensors(s: RealShape, ftype: str) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, ggml shape, ggml type) of every tensor of ``s`` quantized as ``ftype``."""
    counters = {"attn_v": 0, "ffn_down": 0}
    return [(n, sh, _real_type(n, sh, ftype, s, counters)) for n, sh in _real_tensors(s)]


def _random_data(
    shape: tuple[int, ...], t: int, rng: np.random.Generator, ones: bool = False, centered: bool = False
) -> bytes:
    """Bytes of a tensor with finite non-zero values: F32 (ones or N(0, 1)), F16 or a block
    type whose scale fields are set (Q8_0/Q4_K: f16 d first; Q6_K: f16 d last) over random quants.
    ``centered``: Q4_K/Q5_K values average zero (their ``d * sc * q - dmin * m`` with ``dmin``
    = mean q x ``d``, ggml-common.h ``block_q4_K``) instead of being all >= 0; the other types
    are symmetric already."""
    n = int(np.prod(shape))
    if t == GQT.F32:
        return (np.ones(n, np.float32) if ones else rng.standard_normal(n).astype(np.float32)).tobytes()
    if t == GQT.F16:
        return rng.standard_normal(n).astype(np.float16).tobytes()
    block, size = gguf.GGML_QUANT_SIZES[GQT(t)]
    raw = rng.integers(0, 256, size=(n // block, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if t in (GQT.Q8_0, GQT.Q5_0, GQT.Q4_K, GQT.Q5_K):
        raw[:, 0:2] = d
        if t in (GQT.Q4_K, GQT.Q5_K):
            mean_q = 7.5 if t == GQT.Q4_K else 15.5  # 4-bit / 5-bit quants, uniform
            raw[:, 2:4] = np.frombuffer(np.float16(0.01 * mean_q).tobytes(), np.uint8) if centered else 0  # dmin
    elif t == GQT.Q6_K:
        raw[:, size - 2 : size] = d
    else:
        raise ValueError(f"no random data for type {GQT(t).name}")
    return raw.tobytes()


def write_real_shape(path: str | Path, shape: str | RealShape, ftype: str = "Q4_K_M", *, seed: int = 0) -> Path:
    """Write a zero-weight (sparse) GGUF of a real architecture quantized as ``ftype`` (a key of
    :data:`REAL_FTYPES`, with llama-quantize's per-tensor types); MoE files carry the routing data
    described above. Returns the path."""
    s = REAL_SHAPES[shape] if isinstance(shape, str) else shape
    path = Path(path)
    tensors = real_shape_tensors(s, ftype)
    w = gguf.GGUFWriter(str(path), s.arch)
    w.add_name(f"{s.key} shape (zero weights)")
    add_transformer_keys(w, s.n_layer, s.n_ctx_train, s.n_embd, s.n_ff, s.n_head, s.n_head_kv)
    if s.head_dim:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(s.hd)
    w.add_file_type(int(REAL_FTYPES[ftype][1]))
    if s.sliding_window:
        w.add_sliding_window(s.sliding_window)
    if s.n_expert:
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
        w.add_expert_feed_forward_length(s.n_ff_exp)
        if s.n_ff_shexp:
            w.add_expert_shared_feed_forward_length(s.n_ff_shexp)
    for k, v in s.extra_kv:
        w.add_float32(k, v) if isinstance(v, float) else w.add_uint32(k, v)
    w.add_tokenizer_model("none")
    w.add_vocab_size(s.n_vocab)
    rng = np.random.default_rng(seed)

    def routing_data(name: str, shape_: tuple[int, ...], t: int) -> list[bytes] | None:
        if not (s.n_expert and is_routing_tensor(name)):
            return None
        return [_random_data(shape_, t, rng, ones=name.endswith("_norm.weight"))]

    write_sparse_gguf(path, w, tensors, routing_data)
    return path


def is_routing_tensor(name: str) -> bool:
    """Whether ``name`` is one of the small tensors a MoE router's choice depends on (see the comment
    above :class:`RealShape`): the token embedding, the norms, the router ``ffn_gate_inp`` (weight
    and, as gpt-oss has one, bias; qwen2moe's shared-expert gate too) and DeepSeek-V3-style expert
    selection biases ``exp_probs_b``."""
    return (
        name == "token_embd.weight" or name.endswith("_norm.weight") or "ffn_gate_inp" in name or "exp_probs_b" in name
    )


def write_routing_data(path: str | Path, *, seed: int = 0) -> Path:
    """Write real data into the routing tensors (:func:`is_routing_tensor`) of a sparse GGUF written
    by :func:`write_model` (any architecture, e.g. a ``kvtuner/testing/gguf_families.py`` spec): random token
    embeddings and routers, unit norms, all other weights left zero, so that every token of a
    zero-weight MoE file picks its own experts as :func:`write_real_shape` files do. The residual
    stream stays each token's embedding (attention and experts add zeros), so each layer's router
    sees a different unit-RMS vector per token. Returns ``path``.

    Raises:
        ValueError: a routing tensor of a type :func:`_random_data` cannot fill.
    """
    path = Path(path)
    reader = gguf.GGUFReader(str(path))
    todo = [
        (t.name, tuple(int(x) for x in t.shape), int(t.tensor_type), int(t.data_offset))
        for t in reader.tensors
        if is_routing_tensor(t.name)
    ]
    del reader
    rng = np.random.default_rng(seed)
    with open(path, "r+b") as f:
        for name, shape, t, offset in todo:
            f.seek(offset)
            f.write(_random_data(shape, t, rng, ones=name.endswith("_norm.weight"), centered=True))
    return path


def write_mxfp4_scales(path: str | Path, exponent: int = MXFP4_NORMAL_EXPONENT) -> Path:
    """Give every MXFP4 block of a sparse GGUF a normal scale: the E8M0 exponent byte of each
    17-byte block (``block_mxfp4``: 1 exponent byte, 16 bytes of 4-bit values) set to ``exponent``,
    the values left zero, so the weights stay zero. Returns ``path``.

    Why: in a zero-weight file the exponent byte is 0, which ggml decodes to 2**-128
    (``GGML_E8M0_TO_FP32_HALF``), a subnormal float. ggml's CPU backend does not set flush-to-zero,
    so once the activations are not all zero (a file with :func:`write_routing_data`) every block's
    scale multiply in the MXFP4 vec-dot and repacked gemv/gemm kernels (ggml-cpu ``repack.cpp``
    ``ggml_gemv_mxfp4_8x8_q8_0``) takes the CPU's subnormal slow path. Measured on this machine
    (gpt-oss-20b shapes, 2 layers, routing data, -t 1, 128-token prefill / decode): 25.0 / 14.8
    tok/s with zero exponents, 67.6 / 23.3 with exponent 127; Q4_0 experts of the same shape, whose
    fp16 scale 0 is a plain zero, 76.7 / 21.9. The other ggml types in these files keep fp16 or
    fp32 scales, which zero bytes make an ordinary 0.0. The file is no longer sparse where it has
    MXFP4 tensors (their whole size is written).
    """
    path = Path(path)
    reader = gguf.GGUFReader(str(path))
    todo = [
        (int(t.n_bytes), int(t.data_offset))
        for t in reader.tensors
        if int(t.tensor_type) == int(gguf.GGMLQuantizationType.MXFP4)
    ]
    del reader
    with open(path, "r+b") as f:
        for n_bytes, offset in todo:
            f.seek(offset)
            for chunk in mxfp4_blocks(n_bytes, exponent):
                f.write(chunk)
    return path
