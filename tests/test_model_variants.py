"""Architecture rules the planner takes from llama.cpp's per-arch code: MLA, SWA patterns,
recurrent state. Expected values are computed by hand from the cited source."""

from __future__ import annotations

import pytest

from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import ConfigError, PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.testing.gguf_factory import ModelSpec, write_model


def test_mla_caches_k_only(tmp_path):
    """DeepSeek-V2-Lite shape: kv_lora_rank 512 + rope 64 = 576 per token per layer, K only
    (llama-kv-cache.cpp: has_v = !is_mla; deepseek2.cpp reads key_length_mla/value_length_mla)."""
    spec = ModelSpec(
        arch="deepseek2",
        n_layer=27,
        n_embd=2048,
        n_head=16,
        n_head_kv=1,
        head_dim=576,
        n_vocab=1024,
        extra_kv={
            "deepseek2.attention.kv_lora_rank": 512,
            "deepseek2.attention.key_length_mla": 192,
            "deepseek2.attention.value_length_mla": 128,
        },
    )
    m = ModelProfile.from_gguf(write_model(tmp_path / "ds.gguf", spec))
    assert m.is_mla and m.attention_kind == "MLA"
    plan = plan_memory(m, PlanConfig(n_ctx=32768, flash_attn="on"))
    assert plan.kv_caches[0].v_bytes == 0
    assert plan.kv_bytes == 27 * 576 * 2 * 32768  # f16
    with pytest.raises(ConfigError, match="same K and V cache type"):
        plan_memory(m, PlanConfig(type_k="q8_0", type_v="f16"))


@pytest.mark.parametrize(
    "arch,window_key,expected_full",
    [
        ("gemma2", True, [1, 3, 5, 7]),  # gemma2.cpp load_swa_pattern(ml, 2)
        ("cohere2", True, [3, 7]),  # cohere2.cpp load_swa_pattern(ml, 4)
        ("gemma3", True, [5]),  # gemma3.cpp load_swa_pattern(ml, 6)
        ("gemma3", False, list(range(8))),  # gemma3 without sliding_window: no SWA at all
    ],
)
def test_swa_patterns(tmp_path, arch, window_key, expected_full):
    spec = ModelSpec(
        arch=arch, n_layer=8, n_embd=256, n_head=4, n_head_kv=2, sliding_window=512 if window_key else None
    )
    m = ModelProfile.from_gguf(write_model(tmp_path / f"{arch}.gguf", spec))
    assert [il for il in range(8) if not m.swa_layers[il]] == expected_full


def test_swa_pattern_from_metadata_array(tmp_path):
    pattern = [True, False, True, True, False, True, True, False]
    spec = ModelSpec(
        arch="gemma3", n_layer=8, n_embd=256, n_head=4, n_head_kv=2, sliding_window=128, swa_pattern=pattern
    )
    m = ModelProfile.from_gguf(write_model(tmp_path / "arr.gguf", spec))
    assert list(m.swa_layers) == pattern
    # SWA cells: pad(min(n_ctx_seq, n_swa + n_ubatch), 256) = pad(128 + 512, 256) = 768
    plan = plan_memory(m, PlanConfig(n_ctx=8192))
    assert [(c.kind, c.cells, c.layers) for c in plan.kv_caches] == [("full", 8192, 3), ("swa", 768, 5)]
    # unified cache with 4 sequences: pad(min(8192, 128 * 4 + 512), 256) = 1024
    plan = plan_memory(m, PlanConfig(n_ctx=8192, n_seq=4, kv_unified=True))
    assert plan.kv_caches[1].cells == 1024


def test_llama_ignores_a_sliding_window_key(tmp_path):
    """llama.cpp's llama loader never reads attention.sliding_window (src/models/llama.cpp):
    every layer keeps a full-size cache, and kvtuner plans it so, without an approximation."""
    spec = ModelSpec(arch="llama", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, sliding_window=4096)
    m = ModelProfile.from_gguf(write_model(tmp_path / "x.gguf", spec))
    assert m.n_swa == 0 and not any(m.swa_layers) and m.structure.source == "analytic"
    plan = plan_memory(m, PlanConfig(n_ctx=8192))
    assert [(c.kind, c.cells, c.layers) for c in plan.kv_caches] == [("full", 8192, 4)]
    assert not any("approximate" in w for w in plan.warnings)


def test_unknown_arch_is_approximate_in_one_visible_line(tmp_path):
    """An architecture without a tested rule is planned with the generic rule (every layer
    full-size KV) and says so in one line until a probe of llama.cpp replaces it."""
    spec = ModelSpec(arch="starcoder2", n_layer=4, n_embd=256, n_head=4, n_head_kv=2)
    m = ModelProfile.from_gguf(write_model(tmp_path / "x.gguf", spec))
    assert m.structure.source == "approximate"
    plan = plan_memory(m, PlanConfig(n_ctx=4096))
    lines = [w for w in plan.warnings if w.startswith("approximate")]
    assert len(lines) == 1 and "starcoder2" in lines[0]


def test_mamba_recurrent_state(tmp_path):
    """Mamba: no KV; per layer per sequence f32 state of (d_conv - 1) * (d_inner + 2 n_group d_state)
    + d_state * d_inner (llama-hparams.cpp n_embd_r / n_embd_s)."""
    spec = ModelSpec(
        arch="mamba",
        n_layer=4,
        n_embd=256,
        n_head=0,
        n_head_kv=0,
        n_vocab=512,
        extra_kv={
            "mamba.ssm.conv_kernel": 4,
            "mamba.ssm.inner_size": 512,
            "mamba.ssm.state_size": 16,
            "mamba.ssm.time_step_rank": 16,
        },
    )
    m = ModelProfile.from_gguf(write_model(tmp_path / "mamba.gguf", spec))
    assert all(m.recurrent_layers)
    per_layer = 3 * 512 + 16 * 512
    assert m.recurrent_state_floats == per_layer
    plan = plan_memory(m, PlanConfig(n_ctx=65536, n_seq=2))
    assert plan.kv_bytes == per_layer * 4 * 2 * 4  # f32, 2 sequences, 4 layers; independent of n_ctx


def test_mamba_state_follows_its_layers(tmp_path):
    """The recurrent state lives on the layer's device with offload_kqv, on the host with -nkvo."""
    from kvtuner.core.hardware.specs import what_if_gpu
    from kvtuner.core.units import GiB

    spec = ModelSpec(
        arch="mamba",
        n_layer=4,
        n_embd=256,
        n_head=0,
        n_head_kv=0,
        n_vocab=512,
        extra_kv={
            "mamba.ssm.conv_kernel": 4,
            "mamba.ssm.inner_size": 512,
            "mamba.ssm.state_size": 16,
            "mamba.ssm.time_step_rank": 16,
        },
    )
    m = ModelProfile.from_gguf(write_model(tmp_path / "mamba.gguf", spec))
    per_layer = (3 * 512 + 16 * 512) * 4
    gpu = [what_if_gpu(8 * GiB)]
    three = plan_memory(m, PlanConfig(n_gpu_layers=3), gpu)  # output + layers 2, 3 on the GPU
    assert (three.gpus[0].kv_bytes, three.host.kv_bytes) == (2 * per_layer, 2 * per_layer)
    nkvo = plan_memory(m, PlanConfig(kv_gpu_layers=0), gpu)
    assert (nkvo.gpus[0].kv_bytes, nkvo.host.kv_bytes) == (0, 4 * per_layer)
