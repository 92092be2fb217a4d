"""vLLM budgets (kvtuner/core/plan/vllm.py), workload-aware KV (core/plan/workload.py), the
decision table (core/plan/decision_table.py) and the vLLM export, with hand-computed values and
the public vLLM logs of benchmarks/vllm_logs/rows.json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvtuner.core.export.vllm import render, settings_from_config
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.decision_table import decision_table, kv_bytes_per_token
from kvtuner.core.plan.torch_allocator import CachingAllocatorModel
from kvtuner.core.plan.vllm import (
    VllmError,
    VllmModel,
    VllmSettings,
    cuda_reported_total,
    estimate_activation_bytes,
    plan_vllm,
    pool_from_available,
    reserved_profile_bytes,
)
from kvtuner.core.plan.workload import ServingWorkload, WorkloadError, workload_advice, workload_kv
from kvtuner.core.units import GiB, MiB
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gguf_factory import write_real_shape

ROOT = Path(__file__).resolve().parents[1]

#: Published config.json fields (huggingface.co/<id>/blob/main/config.json).
CONFIGS = {
    "Llama-3.1-8B": {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "Qwen2.5-7B": {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "Qwen2.5-14B": {
        "model_type": "qwen2",
        "num_hidden_layers": 48,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "intermediate_size": 13824,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "Qwen2.5-32B": {
        "model_type": "qwen2",
        "num_hidden_layers": 64,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "intermediate_size": 27648,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "Llama-2-13B": {
        "model_type": "llama",
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 40,
        "intermediate_size": 13824,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
    },
}


def model(name: str) -> VllmModel:
    return VllmModel.from_hf_config(CONFIGS[name], name=name)


# --- vLLM budget -------------------------------------------------------------------------------------


def test_parameter_counts_from_config_match_published_sizes():
    # Llama-3.1-8B: 32 x (4096 x 48 x 128 + 4096 x 4096 + 3 x 4096 x 14336 + 2 x 4096) + 2 x 128256 x 4096 + 4096
    assert model("Llama-3.1-8B").n_params == 8_030_261_248
    # Qwen2.5-7B with its q/k/v biases: 7,615,616,512 (the model card says 7.61B)
    assert model("Qwen2.5-7B").n_params == 7_615_616_512


def test_block_bytes_and_pool_arithmetic_by_hand():
    m = model("Llama-3.1-8B")
    assert m.kv_bytes_per_token("auto") == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert m.block_bytes("auto") == 2 * MiB and m.block_bytes("fp8") == 1 * MiB
    v0 = VllmSettings(max_model_len=20000, engine="v0")
    # vllm-project/vllm#10517: kv_cache_size=3.81GiB -> "# GPU blocks: 1952", "Maximum concurrency ... 1.56x"
    block, blocks, tokens, conc = pool_from_available(m, v0, int(3.81 * GiB))
    assert (block, blocks, tokens) == (2 * MiB, 1950, 31200)  # 3.81 GiB / 2 MiB = 1950.7 (the log rounds 3.8128)
    assert round(conc, 2) == 1.56
    # v1 divides blocks by whole blocks per request: 20001 tokens need 1251 blocks
    v1 = VllmSettings(max_model_len=20001)
    assert pool_from_available(m, v1, 1952 * 2 * MiB)[3] == pytest.approx(1952 / 1251)


def test_full_plan_components_by_hand():
    m = model("Llama-3.1-8B")
    s = VllmSettings(max_model_len=20000, engine="v0")
    assert s.batched_tokens() == 20000 and VllmSettings(max_model_len=40000, engine="v0").batched_tokens() == 512
    assert VllmSettings(max_model_len=40000).batched_tokens() == 2048
    # v1 on a card of 70 GiB or more that is not an A100: 8192 (EngineArgs.get_batch_defaults)
    assert VllmSettings(max_model_len=4096).batched_tokens(80 * GiB, "H100 80GB") == 8192
    assert VllmSettings(max_model_len=4096).batched_tokens(80 * GiB, "A100 80GB") == 2048
    assert estimate_activation_bytes(m, 20000) == 20000 * (3 * 14336 + 3 * 4096) * 2
    p = plan_vllm(
        m,
        s,
        int(23.58 * GiB),
        weights_bytes=int(14.9888 * GiB),
        activation_bytes=int(2.07 * GiB),
        non_torch_bytes=int(0.35 * GiB),
    )
    usable = int(int(23.58 * GiB) * 0.9)
    assert p.available_kv_bytes == usable - int(14.9888 * GiB) - int(2.07 * GiB) - int(0.35 * GiB)
    assert p.num_blocks == p.available_kv_bytes // (2 * MiB) and p.kv_tokens == 16 * p.num_blocks
    assert abs(p.num_blocks / 1952 - 1) < 0.01 and p.fits
    assert p.sources == {"weights": "logged", "activation": "logged", "non_torch": "logged"}


def test_public_logs_within_5_percent():
    """benchmarks/vllm_logs: the pool arithmetic matches every logged figure within 1%; the full
    prediction from the card and config.json within 5% on every text-model row with logged
    components (the GPTQ row without logged components is reported by compare.py, not asserted)."""
    spec = importlib.util.spec_from_file_location("vllm_compare", ROOT / "benchmarks" / "vllm_logs" / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    results = mod.evaluate(json.loads((ROOT / "benchmarks" / "vllm_logs" / "rows.json").read_text()))
    pairs = {(r["model"], r["card"]) for r in results}
    assert len(pairs) >= 5
    arith = [v for r in results for v in r.get("arith_ratios", {}).values()]
    assert len(arith) >= 7 and all(abs(v - 1) < 0.01 for v in arith), arith
    assert all(r["export_blocks"] == r["full"]["blocks"] for r in results if "full" in r)  # the export prints them
    for r in results:
        if r["multimodal"]:  # vision-encoder profiling is not modelled: no blocks, no ratios
            assert r["full"]["blocks"] is None and r["export_blocks"] is None and not r["full_ratios"]
            assert "vision encoder not modelled" in r["full"]["unknown"]
            continue
        for v in r.get("full_ratios", {}).values():
            assert abs(v - 1) < 0.05, (r["id"], v)
    gptq = next(r for r in results if r["id"] == "qwen15-7b-gptq-3090")
    assert abs(gptq["full_ratios"]["kv_tokens"] - 1) < 0.01  # 24384 predicted, 24320 logged


#: Qwen1.5-7B-Chat-GPTQ-Int4 (benchmarks/vllm_logs/rows.json): Qwen2 shapes, 4-bit GPTQ, group size 128.
QWEN15_GPTQ = {
    "model_type": "qwen2",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
}


def gptq_linear_bytes(n_in: int, n_out: int) -> int:
    # qweight int32 [in/8, out] + g_idx int32 [in] + qzeros int32 [in/128, out/8] + scales fp16 [in/128, out]
    return n_in // 8 * n_out * 4 + n_in * 4 + n_in // 128 * (n_out // 8) * 4 + n_in // 128 * n_out * 2


def test_gptq_weights_exact_by_hand():
    m = VllmModel.from_hf_config(QWEN15_GPTQ, name="qwen")
    assert m.gptq is not None and (m.gptq.bits, m.gptq.group_size) == (4, 128) and m.qkv_bias and m.n_head == 32
    per_layer = (
        gptq_linear_bytes(4096, 3 * 4096)
        + 3 * 4096 * 2  # qkv_proj + its fp16 bias
        + gptq_linear_bytes(4096, 4096)
        + gptq_linear_bytes(4096, 2 * 11008)
        + gptq_linear_bytes(11008, 4096)
        + 2 * 4096 * 2
    )  # two RMSNorm weights
    # qkv 26,189,824 + o 8,732,672 + gate_up 46,866,432 + down 23,469,056 + norms 16,384
    assert per_layer == 105_274_368
    total = 151936 * 4096 * 2 * 2 + 32 * per_layer + 4096 * 2  # embed_tokens + lm_head (fp16), layers, final norm
    assert m.weights_bytes == total == 5_858_107_392  # the checkpoint's safetensors: 3.99 GB + 1.87 GB
    # the allocated activation peak: (3 F + 3 E) x 2 bytes per token + down_proj's dequantized fp16 weight
    assert estimate_activation_bytes(m, 32768) == 32768 * (3 * 11008 + 3 * 4096) * 2 + 11008 * 4096 * 2
    plain = VllmModel.from_hf_config({k: v for k, v in QWEN15_GPTQ.items() if k != "quantization_config"})
    assert plain.gptq is None and plain.weights_bytes == plain.n_params * 2
    with pytest.raises(VllmError, match="GPTQ checkpoints of 2, 4 or 8 bits"):
        VllmModel.from_hf_config(dict(QWEN15_GPTQ, quantization_config={"quant_method": "gptq", "bits": 3}))


def test_caching_allocator_rules_by_hand():
    a = CachingAllocatorModel()
    a.malloc("tiny", 100)  # small pool: 512 bytes out of a 2 MiB segment
    assert (a.allocated_bytes, a.reserved_bytes) == (512, 2 * MiB)
    a.malloc("scales", 1_409_024)  # 1.34 MiB, under 10 MiB: a 20 MiB segment, the rest split off
    assert a.reserved_bytes == 22 * MiB and a.allocated_bytes == 512 + 1_409_024
    a.malloc("qweight", 22_544_384)  # 21.5 MiB: a 22 MiB segment; 0.5 MiB left is not split (<= 1 MiB)
    assert a.reserved_bytes == 44 * MiB and a.allocated_bytes == 512 + 1_409_024 + 22 * MiB
    a.malloc("qkv", 768 * MiB)
    a.free("qkv")  # cached, still reserved
    a.malloc("gate_up", 1376 * MiB)  # does not fit the 768 MiB block: a new segment
    a.malloc("act", 688 * MiB)  # best fit: the cached 768 MiB block, split
    assert a.reserved_bytes == (44 + 768 + 1376) * MiB
    assert a.peak_allocated_bytes == 512 + 1_409_024 + (22 + 1376 + 688) * MiB


def test_reserved_profile_qwen_gptq_by_hand():
    """vLLM v0.3.0 subtracts total - free: the reserved segments of one forward of 32768 tokens.
    Segments: residual 256 MiB, layer 0's normalised input 256, qkv_proj output 768, its temp_dq
    (4096 x 12288 fp16) 96, output + bias 768, gate_up 1376 (the freed 768 MiB blocks are too
    small), and a 2 MiB small-pool segment for input ids and positions; the attention and
    o_proj outputs, act (688) and the later layers reuse cached blocks."""
    m = VllmModel.from_hf_config(QWEN15_GPTQ, name="qwen")
    weights, act = reserved_profile_bytes(m, 32768)
    assert act == (256 + 256 + 768 + 96 + 768 + 1376 + 2) * MiB
    assert m.weights_bytes < weights < m.weights_bytes * 1.02  # segments rounded up to 2 MiB / 20 MiB
    s = VllmSettings(max_model_len=32768, engine="v0", memory_profiling="mem_get_info")
    p = plan_vllm(m, s, int(23.58 * GiB))
    assert (p.weights_bytes, p.activation_bytes, p.non_torch_bytes) == (weights, act, int(0.35 * GiB))
    assert p.num_blocks == (int(int(23.58 * GiB) * 0.9) - weights - act - int(0.35 * GiB)) // (8 * MiB)
    assert p.kv_tokens == 16 * p.num_blocks == 24384  # QwenLM/Qwen3#16 logged 24320 (vLLM 0.3.0)
    # vLLM v0.6.4+ (torch_peak) subtracts the allocated peak: the same model keeps more blocks
    assert plan_vllm(m, VllmSettings(max_model_len=32768, engine="v0"), int(23.58 * GiB)).num_blocks > p.num_blocks
    with pytest.raises(VllmError, match="memory profiling"):
        VllmSettings(max_model_len=4096, memory_profiling="guess")


def test_export_cli_gptq_mem_get_info(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN15_GPTQ))
    out = run_kvtuner(
        "export",
        "--format",
        "vllm",
        "--hf-config",
        str(cfg),
        "--gpu-mem",
        "24G",
        "--max-model-len",
        "32768",
        "--vllm-engine",
        "v0",
        "--vllm-memory-profiling",
        "mem_get_info",
    )
    assert out.returncode == 0, out.stderr
    m = VllmModel.from_hf_config(QWEN15_GPTQ)
    s = VllmSettings(max_model_len=32768, max_num_seqs=1, engine="v0", memory_profiling="mem_get_info")
    p = plan_vllm(m, s, cuda_reported_total(24 * GiB))
    assert f"# GPU blocks: {p.num_blocks}\n" in out.stdout and "GPTQ 4-bit tensors" in out.stderr
    bad = run_kvtuner("export", "--format", "vllm", "--hf-config", str(cfg), "--vllm-memory-profiling", "free")
    assert bad.returncode == 2 and "--vllm-memory-profiling" in bad.stderr


#: Llama-3.2-11B-Vision's config.json shape: a text_config inside an mllama model.
MLLAMA = {
    "model_type": "mllama",
    "vision_config": {"image_size": 560, "max_num_tiles": 4},
    "text_config": {
        "model_type": "mllama_text_model",
        "num_hidden_layers": 40,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
    },
}


def test_multimodal_plan_says_blocks_unknown(tmp_path):
    m = VllmModel.from_hf_config(MLLAMA, name="mllama")
    assert m.multimodal == "mllama"
    p = plan_vllm(m, VllmSettings(max_model_len=65536, max_num_seqs=128), int(79.22 * GiB))
    assert p.unknown.startswith("vision encoder not modelled: blocks unknown")
    assert (p.num_blocks, p.kv_tokens, p.max_concurrency, p.fits) == (None, None, None, None)
    assert p.to_dict()["num_blocks"] is None
    r = render("meta-llama/Llama-3.2-11B-Vision", m, PlanConfig(), p.settings, int(79.22 * GiB))
    assert "# GPU blocks: unknown (vision encoder not modelled: blocks unknown" in r.text
    assert "Maximum concurrency for 65,536 tokens per request: unknown" in r.text
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(MLLAMA))
    out = run_kvtuner(
        "export", "--format", "vllm", "--hf-config", str(cfg), "--gpu", "H100 SXM", "--max-model-len", "65536"
    )
    assert out.returncode == 0, out.stderr
    assert "# GPU blocks: unknown" in out.stdout and "vision encoder not modelled" in out.stderr


def test_bad_vllm_settings_say_what_to_change():
    with pytest.raises(VllmError, match="--gpu-memory-utilization"):
        VllmSettings(max_model_len=4096, gpu_memory_utilization=1.2)
    with pytest.raises(VllmError, match="--kv-cache-dtype"):
        VllmSettings(max_model_len=4096, kv_cache_dtype="q4_0")
    with pytest.raises(VllmError, match="num_hidden_layers"):
        VllmModel.from_hf_config({"hidden_size": 8})


# --- workload ----------------------------------------------------------------------------------------


def test_workload_worst_and_expected_by_hand():
    per = 131072  # Llama-3.1-8B f16
    w = ServingWorkload(4, 32768, avg_tokens=8000, p95_tokens=20000, shared_prefix_tokens=2000)
    ll = workload_kv(per, w, engine="llama.cpp", unified=True)
    assert (ll.worst_tokens, ll.p95_tokens, ll.expected_tokens, ll.shared_saving_tokens) == (131072, 80000, 32000, 0)
    assert ll.bytes(ll.worst_tokens) == 16 * GiB and ll.bytes(ll.expected_tokens) == 4_194_304_000
    split = workload_kv(per, w, engine="llama.cpp", unified=False)
    assert split.expected_tokens == split.p95_tokens == split.worst_tokens == 131072
    # vLLM: 2000 // 16 = 125 full blocks shared, saving 2000 x 3 tokens; 8000 and 20000 are whole blocks
    vl = workload_kv(per, w, engine="vllm")
    assert (vl.worst_tokens, vl.p95_tokens, vl.expected_tokens, vl.shared_saving_tokens) == (131072, 74000, 26000, 6000)
    # partial blocks: 8001 tokens hold 501 blocks; a 2010-token prefix still shares 125 blocks
    odd = workload_kv(per, ServingWorkload(2, 9000, avg_tokens=8001, shared_prefix_tokens=2010), engine="vllm")
    assert odd.expected_tokens == 2 * 8016 - 2000
    assert ll.safe_case(131072) == "worst" and ll.safe_case(80000) == "p95" and ll.safe_case(40000) == "expected"
    assert ll.safe_case(1000) == "none"
    assert "expected (average) case only" in workload_advice(ll, 40000) and "-c 131072" in workload_advice(ll, 40000)


def test_workload_rejects_nonsense():
    with pytest.raises(WorkloadError, match="--avg-tokens"):
        ServingWorkload(4, 1000, avg_tokens=2000)
    with pytest.raises(WorkloadError, match="--p95-tokens"):
        ServingWorkload(4, 1000, avg_tokens=500, p95_tokens=400)
    with pytest.raises(WorkloadError, match="--shared-prefix"):
        ServingWorkload(4, 1000, avg_tokens=500, shared_prefix_tokens=600)


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory) -> Path:
    return write_real_shape(tmp_path_factory.mktemp("vllm") / "llama-3.1-8b-Q4_K_M.gguf", "llama-3.1-8b")


@pytest.mark.slow
def test_plan_cli_workload_section(llama8b):
    out = run_kvtuner(
        "plan",
        str(llama8b),
        "--ctx",
        "65536",
        "-np",
        "4",
        "--kv-unified",
        "--window",
        "32768",
        "--avg-tokens",
        "8000",
        "--p95-tokens",
        "20000",
        "--shared-prefix",
        "2000",
        "--no-gpu",
        "--no-probe",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    w = json.loads(out.stdout)["workload"]
    assert w["llama_cpp"]["worst_bytes"] == 16 * GiB and w["llama_cpp"]["expected_bytes"] == 32000 * 131072
    assert w["llama_cpp"]["p95_tokens"] == 80000 and w["vllm"]["expected_tokens"] == 26000
    assert "safe for the P95 case only" not in w["advice"] and "expected (average) case only" in w["advice"]
    items = {a["id"]: a for a in w["advice_items"]}
    assert items["workload-not-worst-safe"]["fix"] == {"n_ctx": 131072}
    # split streams: one unified pool sized for the P95 total (4 x 20000, padded to 256) would do
    split = run_kvtuner(
        "plan",
        str(llama8b),
        "--ctx",
        "131072",
        "-np",
        "4",
        "--avg-tokens",
        "8000",
        "--p95-tokens",
        "20000",
        "--no-gpu",
        "--no-probe",
        "--json",
    )
    assert split.returncode == 0, split.stderr
    ws = json.loads(split.stdout)["workload"]
    assert ws["llama_cpp"]["expected_tokens"] == ws["llama_cpp"]["worst_tokens"] == 131072
    adv = {a["id"]: a for a in ws["advice_items"]}["workload-unified-saves"]
    assert (
        adv["fix"] == {"kv_unified": True, "n_ctx": 80128}
        and f"{(131072 - 80000) * 131072 // (1 << 20)} MiB" in adv["message"]
    )
    text = run_kvtuner(
        "plan",
        str(llama8b),
        "--ctx",
        "65536",
        "-np",
        "4",
        "--kv-unified",
        "--window",
        "32768",
        "--avg-tokens",
        "8000",
        "--no-gpu",
        "--no-probe",
    )
    assert text.returncode == 0, text.stderr
    assert (
        "worst case" in text.stdout
        and "16.00 GiB (131072)" in text.stdout
        and "llama-server shares no prefix" in text.stdout
    )
    assert "[warning] workload-not-worst-safe" in text.stdout and "fix: --ctx 131072" in text.stdout
    bad = run_kvtuner("plan", str(llama8b), "--window", "1000", "--avg-tokens", "5000", "--no-gpu", "--no-probe")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--avg-tokens" in bad.stderr


# --- decision table ----------------------------------------------------------------------------------

#: 4 x 32K on a 24 GiB card: KV = 131072 tokens x 2 x n_layer x n_kv_head x 128 x bytes.
FOUR_BY_32K_KV_GIB = {
    # elements per token: 2 x n_layer x n_kv_head x 128; bytes: f16 2, q8_0 34/32, fp8 1
    "Llama-3.1-8B": {"f16": 16.0, "q8_0": 8.5, "fp8": 8.0},  # 2 x 32 x 8 x 128 = 65536
    "Qwen2.5-7B": {"f16": 7.0, "q8_0": 3.71875, "fp8": 3.5},  # 2 x 28 x 4 x 128 = 28672
    "Qwen2.5-14B": {"f16": 24.0, "q8_0": 12.75, "fp8": 12.0},  # 2 x 48 x 8 x 128 = 98304
    "Qwen2.5-32B": {"f16": 32.0, "q8_0": 17.0, "fp8": 16.0},  # 2 x 64 x 8 x 128 = 131072
    "Llama-2-13B": {"f16": 100.0, "q8_0": 53.125, "fp8": 50.0},  # 2 x 40 x 40 x 128 = 409600
}


@pytest.mark.parametrize("name", list(FOUR_BY_32K_KV_GIB))
def test_decision_table_24gib_four_by_32k(name):
    m = model(name)
    weights = m.n_params * 2  # bf16, as vLLM loads it
    cells = decision_table(
        m,
        24 * GiB,
        weights_bytes=weights,
        seqs=[4],
        windows=[32768],
        kv_types=["f16", "q8_0", "fp8"],
        bandwidth_bytes_s=936.2e9,
    )
    for c in cells:
        assert c.kv_bytes == FOUR_BY_32K_KV_GIB[name][c.kv_type] * GiB
        assert c.total_bytes == weights + c.kv_bytes + GiB
        assert c.fits == (c.total_bytes <= 24 * GiB)
        assert c.decode_tok_s == pytest.approx(4 * 936.2e9 / (weights + c.kv_bytes))
    fits = {c.kv_type: c.fits for c in cells}
    # Only Llama-3.1-8B (14.96 GiB bf16 + 8 GiB fp8 KV + 1 GiB = 23.96 GiB) and Qwen2.5-7B fp8/f16 fit at bf16
    expected = {
        "Llama-3.1-8B": {"f16": False, "q8_0": False, "fp8": True},
        "Qwen2.5-7B": {"f16": True, "q8_0": True, "fp8": True},
    }.get(name, {"f16": False, "q8_0": False, "fp8": False})
    assert fits == expected
    assert kv_bytes_per_token(m, "fp8") * 4 * 32768 == FOUR_BY_32K_KV_GIB[name]["fp8"] * GiB


@pytest.mark.slow
def test_table_cli_hf_config_and_gguf(tmp_path, llama8b):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIGS["Qwen2.5-14B"]))
    out = run_kvtuner(
        "plan",
        "--table",
        "--hf-config",
        str(cfg),
        "--gpu-mem",
        "24G",
        "--table-seqs",
        "4",
        "--table-windows",
        "32768",
        "--weight-bits",
        "4.85",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    kv = {c["kv_type"]: c["kv_bytes"] for c in d["cells"]}
    assert kv == {"f16": 24 * GiB, "q8_0": int(12.75 * GiB), "fp8": 12 * GiB}
    # the GGUF path: the file's own weights, the same KV arithmetic
    g = run_kvtuner(
        "plan", str(llama8b), "--table", "--gpu", "RTX 3090", "--table-seqs", "4", "--table-windows", "32768"
    )
    assert g.returncode == 0, g.stderr
    assert "16.00 GiB" in g.stdout and "8.50 GiB" in g.stdout and "fits" in g.stdout
    assert run_kvtuner("plan", "--table", "--no-gpu").returncode == 2
    bad = run_kvtuner("plan", "--table", "--gpu-mem", "24G", "--table-seqs", "four")
    assert bad.returncode == 2 and "--table-seqs" in bad.stderr


# --- export ------------------------------------------------------------------------------------------


def test_vllm_export_render_and_cli(llama8b):
    cfg = PlanConfig(n_ctx=131072, n_seq=4, type_k="q8_0", type_v="q8_0", flash_attn="on")
    s = settings_from_config(cfg)
    assert (s.max_model_len, s.max_num_seqs, s.kv_cache_dtype) == (32768, 4, "fp8")
    assert settings_from_config(PlanConfig(type_k="q8_0")).kv_cache_dtype == "auto"
    m = model("Llama-3.1-8B")
    r = render("meta-llama/Llama-3.1-8B-Instruct", m, cfg, s, int(23.58 * GiB))
    first = r.text.splitlines()[0]
    assert first == (
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768 --gpu-memory-utilization 0.9 "
        "--max-num-seqs 4 --kv-cache-dtype fp8 --enable-prefix-caching"
    )
    p = plan_vllm(m, s, int(23.58 * GiB))
    assert f"# GPU blocks: {p.num_blocks}" in r.text and f"GPU KV cache size: {p.kv_tokens:,} tokens" in r.text
    assert f"Maximum concurrency for 32,768 tokens per request: {p.max_concurrency:.2f}x" in r.text
    assert "LLM(model='meta-llama/Llama-3.1-8B-Instruct', max_model_len=32768" in r.text
    assert any("GGUF" in x for x in r.limitations) and any("prefix caching" in x for x in r.limitations)
    out = run_kvtuner(
        "export",
        str(llama8b),
        "--format",
        "vllm",
        "--hf-model",
        "meta-llama/Llama-3.1-8B",
        "-c",
        "131072",
        "-np",
        "4",
        "--gpu",
        "RTX 3090",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("vllm serve meta-llama/Llama-3.1-8B --max-model-len 32768")
    assert "GPU KV cache size" in out.stdout and "kvtuner: note:" in out.stderr
    bad = run_kvtuner("export", "--format", "vllm", "--gpu-memory-utilization", "0")
    assert bad.returncode == 2 and "--gpu-memory-utilization" in bad.stderr and "Traceback" not in bad.stderr
