"""KV cache arithmetic on worked numbers people quote (computed here, not copied).

Per-token KV = 2 (K and V) x n_layer x n_head_kv x head_dim x bytes per element, from each
model's config.json (Llama-2-7B: 32 x 32 x 128 x 2 x 2 B = 512 KiB per token, so 128 GiB at
256K); six models at one and four sequences of 32K; Qwen2.5-Coder-32B with q8_0 KV at 32768 is
4352 MiB (64 layers x 8 KV heads x 128 x 34/32 B x 2 x 32768), as llama.cpp prints it.
"""

from __future__ import annotations

import pytest

from kvtuner.core.hardware.specs import what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import ALL_LAYERS, ConfigError, PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.units import GiB, KiB, MiB
from kvtuner.testing.gguf_factory import LLAMA2_7B, LLAMA31_8B, QWEN25_CODER_32B, ModelSpec, write_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("shapes")
    specs = {
        "llama2-7b": LLAMA2_7B,
        "llama2-13b": ModelSpec(n_layer=40, n_embd=5120, n_head=40, n_head_kv=40, n_ff=13824, n_vocab=32000),
        "llama3.1-8b": LLAMA31_8B,
        "qwen2.5-7b": ModelSpec(
            arch="qwen2", n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944, n_vocab=152064
        ),
        "qwen2.5-14b": ModelSpec(
            arch="qwen2", n_layer=48, n_embd=5120, n_head=40, n_head_kv=8, n_ff=13824, n_vocab=152064
        ),
        "qwen2.5-32b": ModelSpec(
            arch="qwen2", n_layer=64, n_embd=5120, n_head=40, n_head_kv=8, n_ff=27648, n_vocab=152064
        ),
        "qwen2.5-coder-32b": QWEN25_CODER_32B,
    }
    return {k: ModelProfile.from_gguf(write_model(d / f"{k}.gguf", s)) for k, s in specs.items()}


# model, KV per token (all layers, f16), 32K single, 4 x 32K  -- computed from config.json shapes
SEED_TABLE = [
    ("llama2-7b", 512 * KiB, 16 * GiB, 64 * GiB),
    ("llama2-13b", 800 * KiB, 25 * GiB, 100 * GiB),
    ("llama3.1-8b", 128 * KiB, 4 * GiB, 16 * GiB),
    ("qwen2.5-7b", 56 * KiB, 1.75 * GiB, 7 * GiB),
    ("qwen2.5-14b", 192 * KiB, 6 * GiB, 24 * GiB),
    ("qwen2.5-32b", 256 * KiB, 8 * GiB, 32 * GiB),
]


@pytest.mark.parametrize("name,per_token,one_32k,four_32k", SEED_TABLE)
def test_quoted_table(models, name, per_token, one_32k, four_32k):
    m = models[name]
    one = plan_memory(m, PlanConfig(n_ctx=32768))
    assert one.kv_bytes_per_token() == per_token
    assert one.kv_bytes == one_32k
    # four sequences of 32K each: n_ctx 131072 split into 4 streams of 32768 cells
    four = plan_memory(m, PlanConfig(n_ctx=4 * 32768, n_seq=4))
    assert four.n_stream == 4 and four.n_ctx_seq == 32768
    assert four.kv_bytes == four_32k


def test_quoted_7b_mha_at_256k(models):
    """7B MHA: 512 KiB/token x 262144 = 128 GiB; 16 KiB per token per layer."""
    m = models["llama2-7b"]
    plan = plan_memory(m, PlanConfig(n_ctx=262144))
    assert plan.kv_bytes == 128 * GiB
    assert plan.kv_layers[0].kv_bytes == 16 * KiB * 262144


def test_quoted_8_of_32_layers_kv_on_gpu(models):
    """8 layers' KV in VRAM at 256K is often quoted as "about 1 GB": it is 8 x 16 KiB x 262144
    = 32 GiB (and the other 24 layers hold 96 GiB in RAM). kvtuner computes, never copies."""
    m = models["llama2-7b"]
    plan = plan_memory(m, PlanConfig(n_ctx=262144, n_gpu_layers=ALL_LAYERS, kv_gpu_layers=8), [what_if_gpu(12 * GiB)])
    gpu, host = plan.gpus[0], plan.host
    assert gpu.kv_bytes == 32 * GiB
    assert host.kv_bytes == 96 * GiB
    assert plan.kv_gpu_layers == 8
    assert gpu.headroom_bytes < 0  # and it does not fit a 12 GiB card


def test_quoted_q8_0_halves_kv(models):
    """q8_0 KV is 34/64 of f16 (8.5 bits per value, not exactly half: ggml block_q8_0 is 32 int8 + one f16 scale)."""
    m = models["llama3.1-8b"]
    f16 = plan_memory(m, PlanConfig(n_ctx=32768)).kv_bytes
    q8 = plan_memory(m, PlanConfig(n_ctx=32768, type_k="q8_0", type_v="q8_0", flash_attn="on")).kv_bytes
    assert q8 * 64 == f16 * 34


def test_qwen25_coder_32b_q8_0_32768_is_4352_mib(models):
    plan = plan_memory(
        models["qwen2.5-coder-32b"], PlanConfig(n_ctx=32768, type_k="q8_0", type_v="q8_0", flash_attn="on")
    )
    assert plan.kv_bytes == 4352 * MiB


def test_n_ctx_padded_to_256(models):
    m = models["llama3.1-8b"]
    plan = plan_memory(m, PlanConfig(n_ctx=1000))
    assert plan.n_ctx == 1024
    # n_seq 3 with n_ctx 4096: n_ctx_seq = pad(4096 / 3, 256) = 1536, n_ctx rounds to 4608
    plan = plan_memory(m, PlanConfig(n_ctx=4096, n_seq=3))
    assert (plan.n_ctx_seq, plan.n_ctx) == (1536, 4608)
    unified = plan_memory(m, PlanConfig(n_ctx=4096, n_seq=3, kv_unified=True))
    assert (unified.n_ctx_seq, unified.n_stream) == (4096, 1)


def test_layer_placement_output_first(models):
    """llama-model.cpp: i_gpu_start = max(n_layer + 1 - ngl, 0); the output layer is offloaded first."""
    m = models["llama3.1-8b"]
    gpu = [what_if_gpu(24 * GiB)]
    one = plan_memory(m, PlanConfig(n_gpu_layers=1), gpu)
    assert one.output_on_gpu and one.n_gpu_repeating == 0
    # -ngl n_layer: i_gpu_start = 1, so the output layer is on the GPU and layer 0 stays on the CPU
    # (the reference's "-ngl n_layer leaves the output layer on the CPU" disagrees with the code)
    n = plan_memory(m, PlanConfig(n_gpu_layers=32), gpu)
    assert n.output_on_gpu and n.n_gpu_repeating == 31
    assert n.kv_layers[0].device == "CPU" and n.kv_layers[1].device == "CUDA0"
    full = plan_memory(m, PlanConfig(n_gpu_layers=ALL_LAYERS), gpu)
    assert full.output_on_gpu and full.n_gpu_repeating == 32
    assert full.host.weights_bytes == m.input_bytes  # the input embedding always stays on the host
    ten = plan_memory(m, PlanConfig(n_gpu_layers=10), gpu)
    assert [l.device for l in ten.kv_layers[-9:]] == ["CUDA0"] * 9 and ten.kv_layers[-10].device == "CPU"


def test_nkvo_puts_all_kv_on_host(models):
    m = models["llama3.1-8b"]
    plan = plan_memory(m, PlanConfig(n_ctx=8192, kv_gpu_layers=0), [what_if_gpu(24 * GiB)])
    assert plan.gpus[0].kv_bytes == 0 and plan.host.kv_bytes == plan.kv_bytes


def test_two_gpus_split_by_memory(models):
    m = models["llama3.1-8b"]
    plan = plan_memory(m, PlanConfig(), [what_if_gpu(12 * GiB, 0), what_if_gpu(12 * GiB, 1)])
    a, b = plan.gpus
    # 33 slots (32 layers + output) at upper_bound(il / 33) over [0.5, 1.0]: slots 0..16 -> CUDA0
    assert (a.n_layers, b.n_layers, b.has_output) == (17, 15, True)


@pytest.mark.parametrize(
    "config,match",
    [
        (dict(kv_gpu_layers=20, n_gpu_layers=10), "lower --kv-gpu-layers to 9 or less"),
    ],
)
def test_impossible_configs_say_what_to_change(models, config, match):
    with pytest.raises(ConfigError, match=match):
        plan_memory(models["llama3.1-8b"], PlanConfig(**config), [what_if_gpu(24 * GiB)])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(type_v="q8_0", flash_attn="off"), "requires flash attention"),
        (dict(n_ctx=0), "positive"),
        (dict(n_ctx=-5), "positive"),
        (dict(type_k="q3_k"), "unknown KV cache type"),
        (dict(n_seq=0), "between 1 and 256"),
        (dict(flash_attn="maybe"), "on, off or auto"),
        # llama.cpp's counts are 32-bit: a bigger value would wrap in llama_context_params
        (dict(n_ctx=1 << 32), "--ctx must be at most 4294967040"),
        (dict(n_ctx=10**23), "--ctx must be at most"),
        (dict(n_ubatch=1 << 32), "--ubatch must be a positive number of tokens up to"),
        (dict(n_batch=1 << 40), "--batch must be a positive number of tokens up to"),
        (dict(n_gpu_layers=1 << 31), "--ngl must be at most"),
        (dict(kv_gpu_layers=1 << 31), "--kv-gpu-layers must be at most"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PlanConfig(**kwargs)
