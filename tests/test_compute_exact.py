"""The compute buffer of plain transformers on the CPU, rebuilt node by node (core/plan/reserve_graph.py)
and placed by a model of ggml-alloc (core/plan/ggml_graph.py), against llama.cpp's own dry run.

``REAL`` are real-size shapes (kvtuner/testing/gguf_factory.py ``write_real_shape``, sparse Q4_K_M files)
on the CPU alone, with flash attention auto/on/off, n_ubatch 512/1024/2048, contexts from 300 tokens
to 128K, 1-4 streams and quantized or f32 caches; among them the phase estimate's known miss
(LLaMA-2-7B, fa auto, n_ubatch 512, ctx 4096: llama.cpp 100.51 MiB, the phase estimate 84.51). Architectures the graph model rebuilds must match
to the printed 0.01 MiB; the others keep the phase estimate and its bound (never under llama.cpp
by more than 2% + 8 MiB).
"""

from __future__ import annotations

import pytest

from kvtuner.core.plan.reserve_graph import LayerShape, TransformerShape, transformer_reserve_bytes
from kvtuner.core.units import MiB
from kvtuner.testing.compute_cases import EXTRA_SHAPES, REAL


def test_allocator_reuses_in_place_frees_at_last_use_and_merges_blocks():
    """ggml-alloc's rules on a five-node graph: x (1 KiB input) at 0, y (2 KiB) at 1024, SCALE
    runs in place on y, x is freed after y so w (512 B) best-fits at 0, freeing y's block merges it
    with the buffer's end, and the output (4 KiB) lands at 512: peak 4608 bytes."""
    from kvtuner.core.plan.ggml_graph import Graph, allocate

    g = Graph()
    x = g.input("x", (256,), "f32")
    y = g.op("MUL_MAT", "y", (512,), None, x)
    z = g.op("SCALE", "z", (512,), y)
    w = g.op("MUL_MAT", "w", (128,), None, z)
    out = g.op("MUL_MAT", "out", (1024,), None, w)
    out.is_output = True
    g.expand(out)
    assert [t.name for t in g.nodes] == ["y", "z", "w", "out"] and [t.name for t in g.leafs] == ["x"]
    assert allocate(g) == 4608
    assert (x.addr, y.addr, z.addr, w.addr, out.addr) == (0, 1024, 1024, 0, 512)


def test_tiny_llama_figures():
    """A 2-layer llama (n_embd 256, 8 heads, 2 KV heads of 32, n_ff 512, n_vocab 4096) at 1024 cells
    and 512 tokens: llama.cpp's dry run prints 11.51 MiB with flash attention and 20.76 without."""
    shape = TransformerShape(256, 4096, tuple(LayerShape(8, 2, 32, 32, 512, 1024) for _ in range(2)))
    assert f"{transformer_reserve_bytes(shape, 512, 1, True) / MiB:.2f}" == "11.51"
    assert f"{transformer_reserve_bytes(shape, 512, 1, False) / MiB:.2f}" == "20.76"


@pytest.mark.llama
@pytest.mark.parametrize("shape,kwargs", REAL, ids=[f"{s}-{i}" for i, (s, _) in enumerate(REAL)])
def test_real_shapes_against_llama_cpp(shape, kwargs, tmp_path_factory):
    dryrun = pytest.importorskip("kvtuner.runner.dryrun")
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.plan.reserve_graph import transformer_shape
    from kvtuner.testing.gguf_factory import write_real_shape

    d = tmp_path_factory.getbasetemp() / "real_shapes"
    d.mkdir(exist_ok=True)
    path = d / f"{shape}.gguf"
    if not path.exists():
        write_real_shape(path, EXTRA_SHAPES.get(shape, shape), "Q4_K_M")
    model = ModelProfile.from_gguf(path)
    config = PlanConfig(**kwargs)
    plan = plan_memory(model, config)
    got = dryrun.dry_run(path, config)
    theirs = sum(got.compute_mib.values()) * MiB
    ours = plan.compute.bytes_on("CPU")
    print(
        f"{shape} {kwargs}: planned {ours / MiB:.2f} MiB, llama.cpp {theirs / MiB:.2f} MiB ({ours / theirs - 1:+.2%})"
    )
    if transformer_shape(model, plan.kv_layers, config.type_k, config.type_v) is not None:
        assert f"{ours / MiB:.2f}" == f"{theirs / MiB:.2f}"
    assert ours >= 0.98 * theirs - 8 * MiB


#: the rebuilt graphs of Gemma 4, Gemma 3n, LFM2, Llama 4, Nemotron-H, Falcon-H1, gpt-oss, GLM-4.5 and DeepSeek-V2 (kvtuner/testing/gguf_families.py shapes) against
#: the figures llama.cpp's dry run printed for them (tests/test_model_families.py asserts the same
#: equalities against a live dry run; this pins them without llama.cpp)
PINNED = [
    ("gemma4", dict(n_ctx=8192, flash_attn="on", type_k="q8_0", type_v="q8_0", n_seq=2), "572.80"),
    ("gemma4", dict(n_ctx=4096, flash_attn="off", n_seq=1), "527.00"),
    ("gemma4", dict(n_ctx=8192, flash_attn="off", n_ubatch=1024), "1098.03"),
    ("gemma3n", dict(n_ctx=8192, flash_attn="on", type_k="q8_0", type_v="q8_0", n_seq=2), "525.55"),
    ("gemma3n", dict(n_ctx=16384, flash_attn="on", n_seq=4, kv_unified=True, n_ubatch=256), "262.00"),
    ("lfm2", dict(n_ctx=8192, flash_attn="on", type_k="q8_0", type_v="q8_0", n_seq=2), "144.04"),
    ("lfm2-swa", dict(n_ctx=8192, flash_attn="on", type_k="q8_0", type_v="q8_0", n_seq=2), "141.01"),
    ("lfm2-swa", dict(n_ctx=4096, flash_attn="off", n_seq=1), "144.01"),
    ("llama4", dict(n_ctx=16384, flash_attn="on", n_seq=4, kv_unified=True, n_ubatch=256), "212.31"),
    ("llama4", dict(n_ctx=32768, flash_attn="on", swa_full=True), "444.72"),
    ("nemotron_h", dict(n_ctx=8192, flash_attn="on", type_k="q8_0", type_v="q8_0", n_seq=2), "286.34"),
    ("nemotron_h", dict(n_ctx=16384, flash_attn="on", n_seq=4, kv_unified=True, n_ubatch=256), "144.76"),
    ("falcon-h1", dict(n_ctx=4096, flash_attn="off", n_seq=1), "140.00"),
    ("falcon-h1", dict(n_ctx=8192, flash_attn="off", n_ubatch=1024), "362.02"),
    ("gpt-oss", dict(n_ctx=32768, flash_attn="on", swa_full=True), "409.63"),
    ("gpt-oss", dict(n_ctx=4096, flash_attn="off", n_seq=1), "558.39"),
    ("glm4moe", dict(n_ctx=4096, flash_attn="off", n_seq=1), "154.01"),
    ("deepseek2", dict(n_ctx=8192, flash_attn="off", n_ubatch=1024), "660.54"),
    ("deepseek2", dict(n_ctx=16384, flash_attn="on", n_seq=4, kv_unified=True, n_ubatch=256), "120.13"),
]


@pytest.mark.parametrize("family,kwargs,mib", PINNED, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(PINNED)])
def test_rebuilt_families_pinned(family, kwargs, mib, tmp_path_factory):
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.plan.memory_plan import plan_memory
    from kvtuner.core.plan.reserve_graph import transformer_shape
    from kvtuner.testing import gguf_families as F
    from kvtuner.testing.gguf_factory import write_model

    make = {
        "gemma4": F.gemma4,
        "gemma3n": F.gemma3n,
        "lfm2": F.lfm2,
        "llama4": F.llama4,
        "nemotron_h": F.nemotron_h,
        "falcon-h1": F.falcon_h1,
        "gpt-oss": F.gpt_oss,
        "glm4moe": F.glm4moe,
        "deepseek2": F.deepseek2,
        "lfm2-swa": lambda: F.lfm2(window=512, name="LFM2 shape with a sliding window"),
    }[family]
    d = tmp_path_factory.getbasetemp() / "pinned_families"
    d.mkdir(exist_ok=True)
    path = d / f"{family}.gguf"
    if not path.exists():
        write_model(path, make())
    model = ModelProfile.from_gguf(path)
    config = PlanConfig(**kwargs)
    plan = plan_memory(model, config)
    assert transformer_shape(model, plan.kv_layers, config.type_k, config.type_v) is not None
    assert f"{plan.compute.bytes_on('CPU') / MiB:.2f}" == mib
