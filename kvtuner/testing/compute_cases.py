"""The planner's comparison cases against llama.cpp, shared by the tests that run them
(tests/test_plan_vs_llama.py, tests/test_model_families.py, tests/test_compute_exact.py) and the
benchmarks that tabulate them (benchmarks/compute_accuracy.py, benchmarks/compute_builds.py).

``SYNTHETIC`` / ``CASES``: tiny synthetic models and the default model with configurations
(``PlanConfig`` keyword arguments); ``FAMILIES`` with ``CONFIGS`` and ``LONG``: today's families
(:mod:`kvtuner.testing.gguf_families`) at short and long contexts; ``EXTRA_SHAPES`` / ``REAL``:
real-size shapes (:data:`kvtuner.testing.gguf_factory.REAL_SHAPES` and two MoE shapes) on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvtuner.testing import gguf_families as F
from kvtuner.testing.gguf_factory import ModelSpec, RealShape, write_model, write_real_shape

SYNTHETIC = {
    # a MHA llama: 8 heads, 8 KV heads of 32
    "llama-mha": ModelSpec(n_layer=4, n_embd=256, n_head=8, n_head_kv=8, n_ff=512, n_vocab=4096),
    # a GQA llama: 8 heads, 2 KV heads of 64
    "llama-gqa": ModelSpec(n_layer=6, n_embd=512, n_head=8, n_head_kv=2, n_ff=1024, n_vocab=8192),
    # per-layer KV head counts, one attention-free layer (DeciLM; llama itself needs equal counts).
    # V is sized by the largest row when transposed (flash attention off).
    "llama-per-layer-kv": ModelSpec(
        arch="deci", n_layer=4, n_embd=256, n_head=8, n_head_kv=[8, 2, 0, 4], n_ff=512, n_vocab=4096
    ),
    # a sliding-window architecture: gemma3 pattern 6 (layers 5, 11 global), window 256, head size 128
    "gemma3-swa": ModelSpec(
        arch="gemma3",
        n_layer=12,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim=128,
        n_ff=512,
        n_vocab=4096,
        n_ctx_train=32768,
        sliding_window=256,
        tied_output=True,
    ),
}


CASES = [
    # (model, config kwargs)  -- the first is the example of docs/getting-started/first-plan.md
    ("default", dict(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on")),
    ("default", dict(n_ctx=4096, flash_attn="off")),
    ("default", dict(n_ctx=32768, n_seq=2)),
    ("default", dict(n_ctx=8192, swa_full=True, type_k="q4_0", type_v="q4_0", flash_attn="on")),
    ("default", dict(n_ctx=3000, n_ubatch=256)),
    ("default", dict(n_ctx=16384, n_seq=4, kv_unified=True)),
    ("llama-mha", dict(n_ctx=4096, flash_attn="off")),
    ("llama-mha", dict(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on")),
    ("llama-gqa", dict(n_ctx=16384, n_seq=4)),
    ("llama-gqa", dict(n_ctx=4096, type_k="q5_1", type_v="iq4_nl", flash_attn="on", n_ubatch=128)),
    ("llama-per-layer-kv", dict(n_ctx=4096, flash_attn="off")),
    ("llama-per-layer-kv", dict(n_ctx=4096, flash_attn="on", type_k="bf16", type_v="f32")),
    ("gemma3-swa", dict(n_ctx=8192, flash_attn="on")),
    ("gemma3-swa", dict(n_ctx=8192, n_seq=2, kv_unified=True, flash_attn="off")),
]


FAMILIES = {
    "qwen35": lambda: F.qwen35(),
    "qwen35-mtp": lambda: F.qwen35(
        n_layer=8,
        E=1024,
        n_head=8,
        n_head_kv=2,
        n_ff=2048,
        V=8192,
        d_inner=1024,
        n_group=4,
        dt_rank=8,
        n_mtp=1,
        name="qwen35 small with an MTP block",
    ),
    "qwen35moe": lambda: F.qwen35moe(),
    "qwen3next": lambda: F.qwen3next(),
    "falcon-h1": lambda: F.falcon_h1(),
    "nemotron_h": lambda: F.nemotron_h(),
    "granitehybrid": lambda: F.granite_hybrid(),
    "lfm2": lambda: F.lfm2(),
    "lfm2-swa": lambda: F.lfm2(window=512, name="LFM2 shape with a sliding window"),
    "llama4": lambda: F.llama4(),
    "llama4-no-chunks": lambda: F.llama4(n_layer=8, window_key=0, name="llama4 with sliding_window = 0"),
    "gemma3n": lambda: F.gemma3n(),
    "gemma4": lambda: F.gemma4(),
    "glm4moe": lambda: F.glm4moe(),
    "gpt-oss": lambda: F.gpt_oss(),
    "qwen2": lambda: F.qwen2(),
    "qwen3": lambda: F.qwen3(),
    "stablelm": lambda: F.stablelm(),
    "deepseek2": lambda: F.deepseek2(),
    "mamba": lambda: F.mamba(),
}


CONFIGS = [
    dict(n_ctx=8192, flash_attn="on", type_k="q8_0", type_v="q8_0", n_seq=2),
    dict(n_ctx=4096, flash_attn="off", n_seq=1),
    dict(n_ctx=16384, flash_attn="on", n_seq=4, kv_unified=True, n_ubatch=256),
]


LONG = [
    dict(n_ctx=131072, flash_attn="on"),
    dict(n_ctx=32768, flash_attn="on", swa_full=True),
    dict(n_ctx=8192, flash_attn="off", n_ubatch=1024),
]


#: MoE shapes not in gguf_factory.REAL_SHAPES (layers cut to 8: the reserve graph repeats per layer)
EXTRA_SHAPES = {
    "qwen3-30b-a3b": RealShape(
        "qwen3-30b-a3b",
        "qwen3moe",
        8,
        2048,
        32,
        4,
        6144,
        151936,
        40960,
        False,
        "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
        head_dim=128,
        qk_norm="head",
        n_expert=128,
        n_expert_used=8,
        n_ff_exp=768,
    ),
    "mixtral-8x7b": RealShape(
        "mixtral-8x7b",
        "llama",
        8,
        4096,
        32,
        8,
        14336,
        32000,
        32768,
        False,
        "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=14336,
    ),
}


REAL = [
    ("llama-2-7b", dict(n_ctx=4096)),  # the phase estimate's counterexample: fa auto, n_ubatch 512
    ("llama-2-7b", dict(n_ctx=4096, flash_attn="off")),
    ("llama-2-7b", dict(n_ctx=2048, flash_attn="off", n_ubatch=2048)),
    ("llama-2-7b", dict(n_ctx=16384, flash_attn="on", n_ubatch=1024)),
    ("llama-3.1-8b", dict(n_ctx=32768)),
    ("llama-3.1-8b", dict(n_ctx=8192, flash_attn="off", n_ubatch=1024)),
    ("llama-3.1-8b", dict(n_ctx=131072, flash_attn="on", n_ubatch=2048)),
    ("llama-3.1-8b", dict(n_ctx=16384, n_seq=4)),
    ("llama-2-7b", dict(n_ctx=6144, n_seq=3)),  # 512 tokens over 3 streams: 171 each, 513 in all
    ("llama-2-7b", dict(n_ctx=300)),  # n_batch = min(n_ctx as asked, n_batch) = 300 tokens, 512 cells
    ("llama-3.1-8b", dict(n_ctx=32768, type_k="q8_0", type_v="q8_0", flash_attn="on")),  # Hadamard rotations
    ("llama-2-7b", dict(n_ctx=8192, type_k="q4_0", flash_attn="off", n_ubatch=1024)),  # K rotation only
    ("mistral-7b-v0.3", dict(n_ctx=32768, flash_attn="on", n_ubatch=2048)),
    ("qwen2.5-3b", dict(n_ctx=32768, n_seq=4, kv_unified=True)),
    ("qwen2.5-3b", dict(n_ctx=8192, flash_attn="off")),
    ("llama-3.2-1b", dict(n_ctx=65536, n_ubatch=1024)),
    ("gemma-2-9b", dict(n_ctx=8192)),
    ("gemma-2-9b", dict(n_ctx=4096, flash_attn="off", n_ubatch=1024)),
    ("phi-3-mini-4k", dict(n_ctx=4096)),
    ("phi-3-mini-4k", dict(n_ctx=4096, flash_attn="off", n_ubatch=2048)),
    ("olmoe-1b-7b", dict(n_ctx=4096, n_ubatch=1024)),
    ("olmoe-1b-7b", dict(n_ctx=16384, flash_attn="off")),
    ("qwen1.5-moe-a2.7b", dict(n_ctx=8192)),
    ("qwen3-30b-a3b", dict(n_ctx=32768, n_ubatch=1024)),
    ("qwen3-30b-a3b", dict(n_ctx=8192, flash_attn="off", type_k="q8_0")),
    ("mixtral-8x7b", dict(n_ctx=32768)),
]


#: the families :data:`LONG` runs at long contexts
LONG_FAMILIES = ["llama4", "gemma4", "gpt-oss", "qwen35", "deepseek2", "qwen3", "falcon-h1"]


def configurations(tmp: Path, default_model: Path) -> Iterator[tuple[str, Path, dict]]:
    """(label, model path, PlanConfig kwargs) for every covered configuration; the model files are
    written into ``tmp`` (sparse GGUFs, a few KiB each)."""
    synthetic = {k: write_model(tmp / f"{k}.gguf", s) for k, s in SYNTHETIC.items()}
    for name, kwargs in CASES:
        yield f"{name}", (default_model if name == "default" else synthetic[name]), kwargs
    fam = {}
    for family in FAMILIES:
        fam[family] = write_model(tmp / f"{family}.gguf", FAMILIES[family]())
        for kwargs in CONFIGS:
            yield family, fam[family], kwargs
    for kwargs in LONG:
        for family in LONG_FAMILIES:
            yield family, fam[family], kwargs
    real: dict[str, Path] = {}
    for shape, kwargs in REAL:
        if shape not in real:
            real[shape] = write_real_shape(tmp / f"{shape}.gguf", EXTRA_SHAPES.get(shape, shape), "Q4_K_M")
        yield shape, real[shape], kwargs
