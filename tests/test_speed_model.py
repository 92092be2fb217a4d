"""Speed model formulas (kvtuner.core.speed.speed_model), with hand-computed expected values.

The tiny synthetic model (``TINY``, written sparse with kvtuner/testing/gguf_factory.py) has, by the
factory's tensor list (F16 weights, F32 norms):

    token_embd 256 x 1024 x 2 B = 524288 B; output.weight 524288 B; output_norm 256 x 4 = 1024 B
    per layer: 2 norms 2 x 1024 B, q/k/v/o 4 x 256 x 256 x 2 = 524288 B,
               gate/up/down 3 x 256 x 512 x 2 = 786432 B  -> 1312768 B per layer
    parameters per layer: 2 x 256 + 4 x 65536 + 3 x 131072 = 655872
    output parameters: 256 x 1024 + 256 = 262400
    KV per cell per layer (f16, 8 KV heads x head size 32, K and V): 2 x 256 x 2 B = 1024 B
    query heads per layer: 8, of head size 32
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from kvtuner.core.hardware.gpu_catalogue import GPU_CATALOGUE
from kvtuner.core.hardware.specs import GpuSpec, HostSpec, catalogue_gpu, what_if_gpu
from kvtuner.core.model.profile import ModelProfile
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.speed.cpu_probe import CpuRates
from kvtuner.core.speed.speed_model import (
    DeviceRates,
    SpeedConstants,
    SpeedInputs,
    SpeedModelError,
    cpu_rate,
    decode_tok_s,
    decode_workload,
    effective_threads,
    fallback_cpu_rates,
    gpu_rates,
    measure_host_bandwidth,
    predict_speed,
    prefill_tok_s,
    prefill_workload,
    rates_for_threads,
    speed_band,
    speed_inputs,
    workload_time_s,
)
from kvtuner.core.speed.weights import summary_from_profile, weight_summary
from kvtuner.testing.gguf_factory import ModelSpec, RealShape, write_model, write_real_shape
from test_moe_offload import gpt_oss  # noqa: F401  (the gpt-oss-20b-shaped MXFP4 fixture)

TINY = ModelSpec(n_layer=4, n_embd=256, n_head=8, n_head_kv=8, n_ff=512, n_vocab=1024, n_ctx_train=4096, name="tiny")
LAYER_BYTES = 1312768
LAYER_PARAMS = 655872
OUTPUT_BYTES = 524288 + 1024
OUTPUT_PARAMS = 262400
KV_CELL_LAYER = 1024
# round numbers for the hand computations: 1 GB/s of F16 (F32 norms stream at the same rate),
# 1 GFLOP/s at any batch (half_batch 0), 10 us per layer (5 us per layer per prompt batch), 1 ms per
# token, 1 ns per head and cell of 32-wide heads in decode, 0.1 ns in prefill
RATES = CpuRates(
    2,
    {"F16": 1e9, "F32": 1e9},
    {"F16": 1e9, "F32": 1e9},
    10e-6,
    1e-3,
    {"8/8/32": 1e-9},
    {"8/8/32": 0.1e-9},
    layer_prefill_s=5e-6,
)
C = SpeedConstants()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> ModelProfile:
    return ModelProfile.from_gguf(write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", TINY))


def cpu_inputs(rates: CpuRates = RATES) -> SpeedInputs:
    return SpeedInputs({"CPU": DeviceRates("CPU", 20e9, cpu=rates)}, rates.n_threads, C)


def test_weight_summary_reads_the_tensor_table(tiny):
    s = weight_summary(tiny)
    assert s.source == "tensor table"
    assert [sum(w.bytes_ for w in g) for g in s.layers] == [LAYER_BYTES] * 4
    assert sum(w.params for w in s.layers[0]) == LAYER_PARAMS
    assert {w.ggml_type for w in s.layers[0]} == {"F16", "F32"}
    assert sum(w.bytes_ for w in s.output) == OUTPUT_BYTES and sum(w.params for w in s.output) == OUTPUT_PARAMS
    # without the file: the profile's bytes in the file type's main type
    est = summary_from_profile(tiny)
    assert est.source == "profile estimate" and [sum(w.bytes_ for w in g) for g in est.layers] == [LAYER_BYTES] * 4


def test_decode_cpu_depth0(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"))
    w = decode_workload(plan, 0)
    (host,) = w.devices
    # weights: 4 layers + output (token_embd is read one row at a time: not counted); KV: 1 cell x 4 layers
    assert host.bytes_read == 4 * LAYER_BYTES + OUTPUT_BYTES + 4 * KV_CELL_LAYER
    assert host.flops == pytest.approx(2 * LAYER_PARAMS * 4 + 2 * OUTPUT_PARAMS + 4 * 2 * 8 * 64, rel=1e-9)
    assert host.head_cells == (("8/8/32", 4 * 8),) and host.n_layers == 4
    assert w.n_crossings == 0 and w.pcie_bytes == 0
    # t = weights / 1 GB/s + max(32 head-cells x 1 ns, 4 KiB / 1 GB/s) + 4 x 10 us + 1 ms
    t = (4 * LAYER_BYTES + OUTPUT_BYTES) / 1e9 + 4096 / 1e9 + 40e-6 + 1e-3
    assert workload_time_s(w, cpu_inputs()) == pytest.approx(t, rel=1e-9)
    assert decode_tok_s(plan, cpu_inputs(), 0) == pytest.approx(1 / t, rel=1e-9)


def test_decode_kv_grows_with_depth_and_stops_at_the_context(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"))
    w = decode_workload(plan, 1000)
    assert w.devices[0].bytes_read == 4 * LAYER_BYTES + OUTPUT_BYTES + 4 * 1001 * KV_CELL_LAYER
    assert w.devices[0].head_cells == (("8/8/32", 4 * 8 * 1001),)
    with pytest.raises(SpeedModelError, match="between 0 and n_ctx_seq - 1 = 1023"):
        decode_workload(plan, 1024)


def test_cpu_attention_cost_wins_over_streaming_the_kv(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"))
    slow_attn = replace(RATES, attn_decode_s={"8/8/32": 0.5e-6})
    w = decode_workload(plan, 99)
    # 100 cells: 3200 head-cells x 0.5 us = 1.6 ms > 400 KiB at 1 GB/s = 0.41 ms
    t = (4 * LAYER_BYTES + OUTPUT_BYTES) / 1e9 + 1.6e-3 + 40e-6 + 1e-3
    assert workload_time_s(w, cpu_inputs(slow_attn)) == pytest.approx(t, rel=1e-9)


def test_prefill_cpu(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on", n_ubatch=512, n_batch=512))
    w = prefill_workload(plan, 256, 0)
    (host,) = w.devices
    # causal attention with flash attention: sum_{p=1..256} p = 32896 cells per layer
    assert host.head_cells == (("8/8/32", 4 * 8 * 32896),)
    weight_flops = 2 * LAYER_PARAMS * 4 * 256 + 2 * OUTPUT_PARAMS  # logits of the last token only
    assert host.flops == pytest.approx(weight_flops + 4 * 1024 * 32896, rel=1e-9)
    # weight FLOPs at 1 GFLOP/s + 1052672 head-cells x 0.1 ns + one call x (1 ms + 4 layers x 5 us)
    t = weight_flops / 1e9 + 4 * 8 * 32896 * 0.1e-9 + 1e-3 + 4 * 5e-6
    assert prefill_tok_s(plan, cpu_inputs(), 256, 0) == pytest.approx(256 / t, rel=1e-9)


def test_prefill_without_flash_attention_reads_the_padded_cache(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="off", n_ubatch=512, n_batch=512))
    w = prefill_workload(plan, 256, 0)
    # every token of the ubatch sees n_kv = pad(256, 256) = 256 cells
    assert w.devices[0].head_cells == (("8/8/32", 4 * 8 * 256 * 256),)
    with pytest.raises(SpeedModelError, match="must fit the context of 1024 tokens"):
        prefill_workload(plan, 1000, 100)


def test_each_weight_type_runs_at_its_own_rate(tmp_path):
    shape = RealShape("mini", "llama", 8, 256, 4, 4, 512, 512, 2048, False, "test")
    m = ModelProfile.from_gguf(write_real_shape(tmp_path / "mini.gguf", shape, "Q4_K_M"))
    types = weight_summary(m).types()
    assert set(types) == {"F32", "Q4_K", "Q6_K"}  # Q6_K for half of attn_v/ffn_down and the output
    plan = plan_memory(m, PlanConfig(n_ctx=512, flash_attn="on"))
    rates = replace(RATES, decode_bytes_s={"Q4_K": 2e9, "Q6_K": 1e9, "F32": 4e9})
    (host,) = decode_workload(plan, 0).devices
    by = {t: b for t, b, _, _ in host.weights}
    t_weights = by["Q4_K"] / 2e9 + by["Q6_K"] / 1e9 + by["F32"] / 4e9
    kv = host.kv_bytes / 4e9  # the KV streams at the fastest probed rate
    ((hd, cells),) = host.head_cells
    # no probe of 4/4/64: the 8/8/32 cost scaled by the head size
    assert hd == "4/4/64"
    t = t_weights + max(cells * 1e-9 * 64 / 32, kv) + 8 * 10e-6 + 1e-3
    assert workload_time_s(decode_workload(plan, 0), cpu_inputs(rates)) == pytest.approx(t, rel=1e-9)


def test_prefill_rate_saturates_with_the_batch():
    r = replace(RATES, prefill_flop_s={"Q4_K": 100e9}, half_batch={"Q4_K": 16.0})
    assert r.prefill_rate("Q4_K", 16) == pytest.approx(50e9)
    assert r.prefill_rate("Q4_K", 112) == pytest.approx(87.5e9)
    assert r.prefill_rate("Q6_K", 16) == pytest.approx(50e9)  # nearest probed type
    assert r.attn_cost({"32/8/128": 2e-9, "32/8/64": 4e-9}, "32/8/64") == 4e-9
    assert r.attn_cost({"32/8/128": 2e-9}, "16/8/256") == pytest.approx(4e-9)  # nearest size, scaled
    # same head size: the nearest grouping of query heads per KV head
    assert r.attn_cost({"32/8/128": 2e-9, "32/32/128": 3e-9}, "40/40/128") == 3e-9
    assert r.attn_cost({"*": 1e-9}, "32/8/64") == pytest.approx(0.5e-9)


def test_an_unprobed_type_takes_the_nearest_in_bits_per_weight():
    table = {"Q4_K": 20e9, "Q8_0": 15e9}
    assert cpu_rate(table, "Q4_K") == 20e9
    assert cpu_rate(table, "Q5_K") == 20e9  # 5.5 bits: nearer Q4_K's 4.5 than Q8_0's 8.5
    assert cpu_rate(table, "Q6_K") == 15e9  # 6.56 bits: nearer 8.5
    assert cpu_rate({"*": 7e9}, "Q4_K") == 7e9
    with pytest.raises(SpeedModelError, match="run the CPU probe"):
        cpu_rate({}, "Q4_K")


def test_moe_decode_reads_only_the_active_experts(tmp_path):
    shape = RealShape(
        "mini-moe",
        "olmoe",
        2,
        256,
        4,
        4,
        256,
        512,
        2048,
        False,
        "test",
        qk_norm="embd",
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
    )
    m = ModelProfile.from_gguf(write_real_shape(tmp_path / "moe.gguf", shape, "Q8_0"))
    s = weight_summary(m)
    experts = sum(w.bytes_ for w in s.layers[0] if w.expert)
    dense = sum(w.bytes_ for w in s.layers[0] if not w.expert)
    assert experts == 3 * 256 * 256 * 8 // 32 * 34  # gate, up, down x 8 experts in Q8_0
    plan = plan_memory(m, PlanConfig(n_ctx=512, flash_attn="on"))
    (host,) = decode_workload(plan, 0).devices
    weights = sum(w[1] for w in host.weights)
    out = sum(w.bytes_ for w in s.output)
    assert weights == pytest.approx(2 * (dense + experts * 2 / 8) + out, rel=1e-12)
    # a 64-token ubatch touches 1 - (6/8)^64 of the experts: all of them, to 8 digits
    (p,) = prefill_workload(plan, 64, 0).devices
    assert sum(w[1] for w in p.weights) == pytest.approx(2 * (dense + experts) + out, rel=1e-7)
    # an expert matmul gets 64 x 2 / 8 = 16 of the ubatch's rows, a dense one all 64
    assert {w[3] for w in p.weights if w[0] == "Q8_0"} == {1.0, 64.0}  # 1: the output, last token only
    # experts: MUL_MAT_ID, its own entry; in decode named with the layer's expert shape (the expert probe's key)
    assert s.expert_keys == ("256/256/8/2@Q8_0",) * 2
    assert {w[3] for w in p.weights if w[0] == "Q8_0@mul_mat_id:256/256/8/2@Q8_0"} == {16.0}
    assert s.expert_share(1) == 0.25 and s.expert_share(2) == pytest.approx(1 - 0.75**2)
    # llama.cpp runs the last layer's experts for the output token only (olmoe.cpp takes the output
    # rows before the last FFN): 64 tokens of layer 0, 1 of layer 1, each 2 of 8 experts
    (ew,) = [w for w in p.weights if "@mul_mat_id" in w[0]]
    assert ew[2] == pytest.approx(2.0 * 3 * 256 * 256 * 2 * (64 + 1), rel=1e-12)
    # with the expert probe's decode rate of that shape the experts' bytes go at that rate; their
    # prefill stays the dense rate x host_moe_prefill_efficiency without its prefill rate
    rates = CpuRates(1, {"Q8_0": 10e9}, {"Q8_0": 50e9}, 0.0, 0.0, {"*": 0.0}, {"*": 0.0}, half_batch={"Q8_0": 0.0})
    probed = replace(rates, expert_decode_bytes_s={"256/256/8/2@Q8_0": 2e9})
    host = HostSpec(16 << 30, 8 << 30)
    t = {}
    for name, r in (("dense", rates), ("probed", probed)):
        inp = speed_inputs([], host, n_threads=1, cpu=r, constants=C)
        t[name] = 64 / prefill_tok_s(plan, inp, 64, 0), 1 / decode_tok_s(plan, inp, 0)
    (dhost,) = decode_workload(plan, 0).devices
    (dw,) = [w for w in dhost.weights if "@mul_mat_id" in w[0]]
    assert t["probed"][1] - t["dense"][1] == pytest.approx(dw[1] / 2e9 - dw[1] / 10e9, rel=1e-9)
    assert t["probed"][0] == t["dense"][0]
    without = replace(C, host_moe_prefill_efficiency=1.0)
    t1 = 64 / prefill_tok_s(plan, speed_inputs([], host, n_threads=1, cpu=rates, constants=without), 64, 0)
    assert t["dense"][0] - t1 == pytest.approx(ew[2] / (50e9 * C.host_moe_prefill_efficiency) - ew[2] / 50e9, rel=1e-9)
    # with its prefill rate probed too, the experts' prompt FLOPs go at that rate instead
    both = replace(probed, expert_prefill_flop_s={"256/256/8/2@Q8_0": 5e9})
    t2 = 64 / prefill_tok_s(plan, speed_inputs([], host, n_threads=1, cpu=both, constants=C), 64, 0)
    assert t2 - t["dense"][0] == pytest.approx(ew[2] / 5e9 - ew[2] / (50e9 * C.host_moe_prefill_efficiency), rel=1e-9)


def test_gpu_decode_and_prefill_on_a_catalogue_card(tiny):
    gpu = catalogue_gpu("RTX 3060 12GB")
    plan = plan_memory(
        tiny, PlanConfig(n_ctx=1024, flash_attn="on", n_ubatch=512, n_batch=512), [gpu], HostSpec(16 << 30, 8 << 30)
    )
    inp = SpeedInputs({"CUDA0": gpu_rates(gpu), "CPU": DeviceRates("CPU", 20e9, cpu=RATES)}, 2, C)
    w = decode_workload(plan, 0)
    (g,) = w.devices  # the host only does get_rows: no bytes, no FLOPs
    assert (g.device, g.kind, g.bytes_read) == ("CUDA0", "gpu", 4 * LAYER_BYTES + OUTPUT_BYTES + 4 * KV_CELL_LAYER)
    assert w.n_crossings == 1 and w.pcie_bytes == 4 * 256  # the embedding row goes up once
    e = GPU_CATALOGUE["RTX 3060 12GB"]
    t = (
        g.bytes_read / (360e9 * C.gpu_bw_efficiency)
        + 4 * C.gpu_layer_overhead_s
        + 1024 / (e.pcie_bandwidth_bytes_s * C.pcie_efficiency)
        + C.crossing_latency_s
        + C.gpu_token_overhead_s
    )
    assert workload_time_s(w, inp) == pytest.approx(t, rel=1e-9)
    # prefill: F16 weights on the FP16 tensor rate, attention too
    p = prefill_workload(plan, 256, 0)
    (gp,) = p.devices
    fp16 = e.fp16_tensor_flop_s * C.gpu_fp16_efficiency
    t_cmp = gp.flops / fp16
    t_mem = gp.bytes_read / (360e9 * C.gpu_bw_efficiency)
    t = (
        max(t_cmp, t_mem)
        + 4 * C.gpu_layer_overhead_s
        + p.pcie_bytes / (e.pcie_bandwidth_bytes_s * C.pcie_efficiency)
        + p.n_crossings * C.crossing_latency_s
        + C.gpu_token_overhead_s
    )
    assert workload_time_s(p, inp) == pytest.approx(t, rel=1e-9)


def test_quantized_prefill_runs_on_the_int8_rate(tmp_path):
    shape = RealShape("mini", "llama", 4, 256, 4, 4, 512, 512, 2048, False, "test")
    m = ModelProfile.from_gguf(write_real_shape(tmp_path / "q8.gguf", shape, "Q8_0"))
    gpu = catalogue_gpu("RTX 4090")
    plan = plan_memory(m, PlanConfig(n_ctx=1024, flash_attn="on"), [gpu], HostSpec(16 << 30, 8 << 30))
    (g,) = prefill_workload(plan, 512, 0).devices
    e = GPU_CATALOGUE["RTX 4090"]
    q8 = sum(w[2] for w in g.weights if w[0] == "Q8_0")
    f32 = sum(w[2] for w in g.weights if w[0] == "F32")
    t_cmp = q8 / (e.int8_op_s * C.gpu_int8_efficiency) + (f32 + g.attn_flops) / (
        e.fp16_tensor_flop_s * C.gpu_fp16_efficiency
    )
    inp = speed_inputs([gpu], HostSpec(16 << 30, mem_bandwidth_bytes_s=20e9), n_threads=2, cpu=RATES)
    from kvtuner.core.speed.speed_model import _gpu_time_s

    assert _gpu_time_s(g, inp.rate("CUDA0"), "prefill", C) == pytest.approx(
        max(t_cmp, g.bytes_read / (e.mem_bandwidth_bytes_s * C.gpu_bw_efficiency)) + 4 * C.gpu_layer_overhead_s,
        rel=1e-9,
    )


def test_kv_on_host_sends_attention_to_the_cpu(tiny):
    gpu = what_if_gpu(8 << 30)
    plan = plan_memory(
        tiny, PlanConfig(n_ctx=1024, flash_attn="on", kv_gpu_layers=0), [gpu], HostSpec(16 << 30, 8 << 30)
    )
    w = decode_workload(plan, 500)
    by = {d.device: d for d in w.devices}
    assert by["CPU"].bytes_read == 4 * 501 * KV_CELL_LAYER  # the KV, read on the host
    assert by["CPU"].head_cells == (("8/8/32", 4 * 8 * 501),) and by["CPU"].n_layers == 0
    assert by["CUDA0"].bytes_read == 4 * LAYER_BYTES + OUTPUT_BYTES
    # 1 crossing for the embedding + 2 per layer (Q/K/V down, result up): (256 + 2 x 256 + 256) x 4 B each
    assert w.n_crossings == 1 + 2 * 4
    assert w.pcie_bytes == 4 * 256 + 4 * (4 * 1024)


def test_large_batches_run_host_weights_on_the_gpu(tiny):
    """ggml-cuda's offload_op: a ubatch of 32+ tokens runs every op on the GPU; host weights cross PCIe."""
    gpu = what_if_gpu(8 << 30)
    plan = plan_memory(
        tiny,
        PlanConfig(n_ctx=1024, flash_attn="on", n_gpu_layers=2, kv_gpu_layers=0),
        [gpu],
        HostSpec(16 << 30, 8 << 30),
    )
    p = prefill_workload(plan, 256, 0)
    assert [d.device for d in p.devices] == ["CUDA0"]
    host_layers = [d for d in plan.layer_devices[:4] if d == "CPU"]
    assert len(host_layers) == 3  # -ngl 2: the output and one repeating layer offloaded
    kv = 4 * 256 * KV_CELL_LAYER  # every layer's KV is on the host, read once in the one ubatch
    assert p.pcie_bytes == pytest.approx(3 * LAYER_BYTES + kv + 4 * 256 * 256, rel=1e-12)
    small = prefill_workload(plan, 16, 0)  # 16 < 32: ops stay where their weights are
    assert {d.device for d in small.devices} == {"CPU", "CUDA0"}


def test_offloading_kv_is_slower_and_the_curve_falls(tiny):
    gpu = what_if_gpu(8 << 30)
    host = HostSpec(16 << 30, 8 << 30, mem_bandwidth_bytes_s=20e9)
    inp = speed_inputs([gpu], host, n_threads=4, cpu=RATES)
    on = predict_speed(plan_memory(tiny, PlanConfig(n_ctx=4096), [gpu], host), inp)
    off = predict_speed(plan_memory(tiny, PlanConfig(n_ctx=4096, kv_gpu_layers=0), [gpu], host), inp)
    assert off.decode_tok_s_at_full_ctx < on.decode_tok_s_at_full_ctx
    speeds = [v for _, v in on.curve]
    assert speeds == sorted(speeds, reverse=True) and on.curve[0][0] == 0 and on.curve[-1][0] == 4095
    assert on.band[0] < on.decode_tok_s < on.band[1]
    d = on.to_dict()
    assert set(d) >= {"decode_tok_s", "decode_tok_s_at_full_ctx", "prefill_tok_s", "band"}
    assert d["badge"] == speed_band(on.decode_tok_s)


def test_nvml_bandwidth_wins_over_the_catalogue():
    g = GpuSpec(
        "NVIDIA GeForce RTX 3060",
        12 << 30,
        11 << 30,
        mem_bandwidth_bytes_s=300e9,
        pcie_bandwidth_bytes_s=8e9,
        catalogue="RTX 3060 12GB",
    )
    r = gpu_rates(g)
    assert (r.bandwidth_bytes_s, r.pcie_bandwidth_bytes_s) == (300e9, 8e9)
    assert r.int8_op_s == GPU_CATALOGUE["RTX 3060 12GB"].int8_op_s
    assert "NVML" in r.source and "tensor rates of the RTX 3060 12GB" in r.source


def test_a_generic_card_takes_the_catalogue_card_of_its_size():
    r = gpu_rates(what_if_gpu(24 << 30))
    assert r.bandwidth_bytes_s == GPU_CATALOGUE["RTX 3090"].mem_bandwidth_bytes_s
    assert "nearest catalogue card" in r.source
    unknown = gpu_rates(GpuSpec("Some GPU", 11 << 30, mem_bandwidth_bytes_s=500e9))
    assert unknown.bandwidth_bytes_s == 500e9  # its own (NVML) bandwidth, the 12 GB card's tensor rates
    assert unknown.int8_op_s == GPU_CATALOGUE["RTX 3060 12GB"].int8_op_s


def test_a_bigger_catalogue_card_is_faster():
    """The what-if list is cards, not sizes: an RTX 4090 decodes faster than an RTX 3060."""
    a, b = gpu_rates(catalogue_gpu("RTX 3060 12GB")), gpu_rates(catalogue_gpu("RTX 4090"))
    assert b.bandwidth_bytes_s > a.bandwidth_bytes_s and b.int8_op_s > a.int8_op_s


def test_threads_move_probe_rates():
    assert effective_threads(1) == 1.0 and effective_threads(2) == pytest.approx(1.55)
    two = rates_for_threads(RATES, 2)
    assert two is RATES
    one = rates_for_threads(RATES, 1)
    assert one.decode_bytes_s["F16"] == pytest.approx(1e9 / 1.55)
    assert one.attn_decode_s["8/8/32"] == pytest.approx(1e-9 * 1.55)
    fb = fallback_cpu_rates(2, 100e9)
    assert fb.decode_bytes_s["*"] == pytest.approx(1.55 * 5e9) and "no CPU probe" in fb.source
    assert fb.decode_bytes_s["IQ3_XXS"] == pytest.approx(1.55 * 5e9 * 0.44)  # a table-lookup type's share


@pytest.mark.parametrize(
    "tok_s, badge",
    [
        (0.0, "abandon"),
        (0.99, "abandon"),
        (1.0, "offline"),
        (4.99, "offline"),
        (5.0, "interactive"),
        (9.99, "interactive"),
        (10.0, "fluent"),
        (250.0, "fluent"),
    ],
)
def test_speed_band(tok_s, badge):
    assert speed_band(tok_s) == badge


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "fast"])
def test_speed_band_rejects_nonsense(bad):
    with pytest.raises(SpeedModelError, match="tokens/s >= 0"):
        speed_band(bad)


def test_bad_constants_and_threads():
    with pytest.raises(SpeedModelError, match="gpu_bw_efficiency must be a finite number"):
        SpeedConstants(gpu_bw_efficiency=-1)
    with pytest.raises(SpeedModelError, match="n_threads must be 1 or more"):
        speed_inputs([], HostSpec(1 << 30, mem_bandwidth_bytes_s=1e9), n_threads=0)


def test_host_bandwidth_probe_is_quick_and_cached():
    measure_host_bandwidth.cache_clear()
    t = time.perf_counter()
    bw = measure_host_bandwidth()
    assert time.perf_counter() - t < 2.0  # ~0.25 s idle; slack for a loaded CI machine
    assert 1e8 < bw < 1e13 and math.isfinite(bw)
    assert measure_host_bandwidth() == bw
    assert measure_host_bandwidth.cache_info().hits == 1


def test_cpu_attention_is_keyed_by_the_kv_pair_flash_attention_runs(default_profile):
    """CPU flash attention with q8_0 K / f16 V runs ggml's one-row path, probed under its own key;
    without flash attention llama.cpp multiplies K and V with MUL_MATs, priced as f16's."""
    host = HostSpec(16 << 30, 8 << 30)
    keys = {}
    for fa in ("on", "off"):
        plan = plan_memory(
            default_profile,
            PlanConfig(n_ctx=4096, n_gpu_layers=0, type_k="q8_0", type_v="f16", flash_attn=fa),
            [],
            host,
        )
        keys[fa] = {h for d in prefill_workload(plan, 64, 1024).devices for h, _ in d.head_cells}
        assert keys[fa] == {h for d in decode_workload(plan, 1024).devices for h, _ in d.head_cells}
    assert keys == {"on": {"4/1/256@q8_0+f16"}, "off": {"4/1/256"}}


def test_assumed_cpu_attention_decode_scales_with_the_kv_rows_bytes():
    from kvtuner.core.speed.cpu_probe import attn_decode_kv_factor

    assert attn_decode_kv_factor("f16", "f16") == 1.0
    assert attn_decode_kv_factor("q8_0", "q8_0") == pytest.approx(0.1 + 0.9 * (34 / 32 * 2) / 4)
    assert attn_decode_kv_factor("q4_0", "q4_0") == pytest.approx(0.1 + 0.9 * (18 / 32 * 2) / 4)
    fb = fallback_cpu_rates(2, 100e9)
    f16 = fb.attn_cost(fb.attn_decode_s, "32/8/128", decode=True)
    assert fb.attn_cost(fb.attn_decode_s, "32/8/128@q4_0", decode=True) == pytest.approx(f16 * 0.353125)
    # prefill (the one-row path is slower there than f16's tiled path) and a probed table keep f16's cost
    assert fb.attn_cost(fb.attn_prefill_s, "32/8/128@q4_0") == fb.attn_cost(fb.attn_prefill_s, "32/8/128")
    assert RATES.attn_cost(RATES.attn_decode_s, "8/8/32@q4_0", decode=True) == RATES.attn_decode_s["8/8/32"]


def _small_qwen35moe(**layers) -> ModelSpec:
    """A Qwen3.6-35B-A3B-shaped fixture (``gguf_families.qwen35moe``, one MTP block unless
    ``n_mtp`` says otherwise) at a few KiB: 256 wide, 8 experts of 64, a 512-token vocabulary."""
    from kvtuner.testing import gguf_families as F

    return F.qwen35moe(
        **layers,
        E=256,
        n_head=4,
        n_head_kv=2,
        head=64,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=64,
        n_ff_shexp=64,
        V=512,
        d_inner=256,
        d_state=16,
        n_group=2,
        dt_rank=4,
    )


def test_an_mtp_block_the_loader_skips_is_neither_read_nor_run(tmp_path):
    """Qwen3.5/3.6 files carry an MTP block after the trunk (block_count 41, nextn_predict_layers 1)
    that llama.cpp neither loads nor runs: the weight summary reads the tensor table with that block
    empty (not the profile estimate, which typed every weight as the file type's main type), and a
    token runs the trunk's layers only."""
    spec = _small_qwen35moe(n_layer=4)
    m = ModelProfile.from_gguf(write_model(tmp_path / "q35moe.gguf", spec))
    assert m.n_layer == 5 and m.structure.n_layer == 4 and m.layer_bytes[4] == 0
    s = weight_summary(m)
    assert s.source == "tensor table"
    assert s.layers[4] == () and all(s.layers[il] for il in range(4))
    assert sum(w.bytes_ for w in s.layers[0] if w.expert) == 3 * 256 * 64 * 8 * 2  # gate, up, down in F16
    plan = plan_memory(m, PlanConfig(n_ctx=512, flash_attn="on"))
    d = decode_workload(plan, 0)
    (host,) = d.devices
    assert d.n_layer == 4 and host.n_layers == 4
    assert prefill_workload(plan, 64, 0).n_layer == 4
    # the block is in no buffer: moving every expert to the CPU moves the trunk's only, and the
    # expert probe is not asked for the block's experts
    from kvtuner.core.speed.expert_shapes import model_expert_keys

    gpu = catalogue_gpu("RTX 3060 12GB")
    trunk, every = (plan_memory(m, PlanConfig(n_ctx=512, n_cpu_moe=n), [gpu]) for n in (4, 99))
    assert every.gpus[0].weights_bytes == trunk.gpus[0].weights_bytes
    assert every.host.weights_bytes == trunk.host.weights_bytes
    keys = model_expert_keys(m)
    assert keys[4] is None and all(keys[:4])


def test_a_file_whose_every_block_is_mtp_is_refused(tmp_path):
    """llama.cpp asserts nextn_predict_layers < block_count: a file with no trunk is one clear error."""
    from kvtuner.core.model.gguf_header import GGUFError

    spec = _small_qwen35moe(n_layer=0, n_mtp=2)
    with pytest.raises(GGUFError, match="leaves no layer of block_count 2"):
        ModelProfile.from_gguf(write_model(tmp_path / "all-mtp.gguf", spec))


def test_a_gpt_oss_ubatch_reads_no_more_experts_than_llama_cpp_measured(gpt_oss):  # noqa: F811
    """:meth:`WeightSummary.expert_share`: one token reads ``k / n`` of the experts; uniform routing
    for other architectures; for gpt-oss no more than llama.cpp PR #15346's measured share of that
    ubatch size (:data:`GPT_OSS_ROUTED_SHARE`, between its points linear in log2 tokens)."""
    from kvtuner.core.speed.weights import GPT_OSS_ROUTED_SHARE, WeightSummary, routed_share, weight_summary

    s = weight_summary(ModelProfile.from_gguf(gpt_oss))
    assert (s.n_expert, s.n_expert_used, s.routed) == (32, 4, GPT_OSS_ROUTED_SHARE)
    assert s.expert_share(1) == pytest.approx(4 / 32)
    assert s.expert_share(128) == pytest.approx(0.61) and s.expert_share(512) == pytest.approx(0.73)
    assert s.expert_share(362) == pytest.approx((0.68 + 0.73) / 2, rel=1e-3)  # 2^8.5 tokens
    assert s.expert_share(8192) == pytest.approx(0.78)  # the last point beyond the table
    assert s.expert_share(4) == pytest.approx(1 - (28 / 32) ** 4)  # uniform below the measured share
    assert routed_share(GPT_OSS_ROUTED_SHARE, 16) == 0.61
    uniform = WeightSummary((), (), n_expert=128, n_expert_used=8)  # another architecture
    assert uniform.expert_share(512) == pytest.approx(1 - (120 / 128) ** 512)
    assert WeightSummary((), ()).expert_share(512) == 1.0  # dense


def test_op_offload_copies_from_a_memory_mapped_model_at_the_pageable_share(gpt_oss):  # noqa: F811
    """A prefill with experts in RAM copies them to the GPU per ubatch (op offload): from pinned
    memory without mmap, from pageable memory with it, which costs ``1 / pageable_h2d_share`` as
    long per byte; the copied bytes are the same."""
    from dataclasses import replace as dc_replace

    from kvtuner.core.hardware.specs import HostSpec, catalogue_gpu
    from kvtuner.core.speed.speed_model import SpeedConstants, prefill_workload, speed_inputs, workload_time_s

    model = ModelProfile.from_gguf(gpt_oss)
    host = HostSpec(total_bytes=64 << 30, available_bytes=64 << 30, mem_bandwidth_bytes_s=45e9, n_cores=8)
    gpu = catalogue_gpu("RTX 3060 12GB")
    mapped = plan_memory(model, PlanConfig(n_ctx=4096, n_cpu_moe=20), [gpu], host)
    pinned = plan_memory(model, dc_replace(mapped.config, use_mmap=False), [gpu], host)
    wm, wp = prefill_workload(mapped, 512, 0), prefill_workload(pinned, 512, 0)
    assert wm.weight_copy_bytes == wp.weight_copy_bytes > 1 << 30
    assert wm.pageable_bytes == wm.weight_copy_bytes and wp.pageable_bytes == 0
    inputs = speed_inputs([gpu], host, n_threads=8, measure=False)
    c = SpeedConstants()
    link = inputs.rate(gpu.device).pcie_bandwidth_bytes_s * c.pcie_efficiency
    extra = wm.weight_copy_bytes / link * (1 / c.pageable_h2d_share - 1)
    assert workload_time_s(wm, inputs) - workload_time_s(wp, inputs) == pytest.approx(extra, rel=1e-9)


def test_a_gpu_without_staged_copies_pays_no_pageable_share(gpt_oss):  # noqa: F811
    """Only a backend that stages pageable copies (CUDA, ROCm, SYCL, Vulkan) pays the pageable share:
    the same plan with a Metal device copies the same bytes, none of them priced as pageable."""
    from dataclasses import replace as dc_replace

    from kvtuner.core.hardware.specs import catalogue_gpu
    from kvtuner.core.speed.speed_model import prefill_workload, stages_pageable_copies

    model = ModelProfile.from_gguf(gpt_oss)
    host = HostSpec(total_bytes=64 << 30, available_bytes=64 << 30, mem_bandwidth_bytes_s=45e9)
    cuda = catalogue_gpu("RTX 3060 12GB")
    metal = dc_replace(cuda, backend="Metal")
    assert [stages_pageable_copies(b) for b in ("CUDA", "ROCm", "SYCL", "Vulkan", "Metal")] == [
        True,
        True,
        True,
        True,
        False,
    ]
    wc = prefill_workload(plan_memory(model, PlanConfig(n_ctx=4096, n_cpu_moe=20), [cuda], host), 512, 0)
    wm = prefill_workload(plan_memory(model, PlanConfig(n_ctx=4096, n_cpu_moe=20), [metal], host), 512, 0)
    assert wc.weight_copy_bytes == wm.weight_copy_bytes > 0
    assert wc.pageable_bytes == wc.weight_copy_bytes and wm.pageable_bytes == 0


def test_an_integrated_gpu_loads_without_mmap(gpt_oss):  # noqa: F811
    """llama.cpp's default load mode maps the file unless a device cannot, and integrated GPUs
    (ggml-vulkan, ggml-cuda/HIP) cannot: with a Strix Halo the host's experts are committed, not
    mapped, and a prompt's copies of them are pinned; Metal maps, and so does a discrete card."""
    from kvtuner.core.hardware.specs import catalogue_gpu
    from kvtuner.core.plan.memory_plan import mmap_in_effect
    from kvtuner.core.speed.speed_model import prefill_workload

    model = ModelProfile.from_gguf(gpt_oss)
    host = HostSpec(total_bytes=128 << 30, available_bytes=128 << 30, mem_bandwidth_bytes_s=200e9)
    apu, mac, card = catalogue_gpu("Strix Halo 128GB"), catalogue_gpu("M2 Max"), catalogue_gpu("RTX 3060 12GB")
    assert [mmap_in_effect(True, [g]) for g in (apu, mac, card)] == [False, True, True]
    assert not mmap_in_effect(False, [card])
    plan = plan_memory(model, PlanConfig(n_ctx=4096, n_cpu_moe=10), [apu], host)
    assert not plan.host.weights_mapped and plan.host.mapped_bytes == 0
    w = prefill_workload(plan, 512, 0)
    assert w.weight_copy_bytes > 0 and w.pageable_bytes == 0
    assert plan_memory(model, PlanConfig(n_ctx=4096, n_cpu_moe=10), [card], host).host.weights_mapped


def test_without_flash_attention_a_host_kv_is_attended_on_the_cpu(tmp_path):
    """``-nkvo`` with flash attention off: llama.cpp pins the attention to the CPU
    (llama-graph.cpp build_attn_mha), so a prefill copies no KV to the GPU and the attention's
    FLOPs are the host's; with flash attention on, op offload copies the host KV once per ubatch,
    the cache view each ubatch's attention takes (growing ubatch by ubatch)."""
    from kvtuner.core.plan.buffers import HOST
    from kvtuner.core.speed.speed_model import prefill_workload

    shape = RealShape("mini", "llama", 8, 256, 4, 4, 512, 512, 8192, False, "test")
    m = ModelProfile.from_gguf(write_real_shape(tmp_path / "mini.gguf", shape, "Q4_K_M"))
    gpu = catalogue_gpu("RTX 4090")
    host = HostSpec(total_bytes=64 << 30, available_bytes=64 << 30, mem_bandwidth_bytes_s=60e9)

    def work(fa: str):
        plan = plan_memory(m, PlanConfig(n_ctx=4096, kv_gpu_layers=0, flash_attn=fa, n_ubatch=512), [gpu], host)
        w = prefill_workload(plan, 2048, 0)
        return plan, w, {d.device: d.attn_flops for d in w.devices}

    plan, on, dev_on = work("on")
    per_cell = sum(lk.kv_bytes / lk.cells for lk in plan.kv_layers)
    # the n_kv view of each ubatch (512, 1024, 1536, 2048 cells), not the final 2048 four times,
    # and the input embeddings; all of the KV copy from pageable memory
    assert on.pcie_bytes == pytest.approx(per_cell * (512 + 1024 + 1536 + 2048) + 4.0 * 256 * 2048, rel=1e-12)
    assert on.pageable_bytes == pytest.approx(per_cell * (512 + 1024 + 1536 + 2048), rel=1e-12)
    assert dev_on.get(HOST, 0.0) == 0 and dev_on["CUDA0"] > 0
    _, off, dev_off = work("off")
    # no KV crosses: per layer and token Q, K, V (4 x 64-dim heads, f32) down and the result up,
    # and the input embeddings
    assert off.pcie_bytes == 8 * 4.0 * (4 * 64 + 2 * 4 * 64 + 4 * 64) * 2048 + 4.0 * 256 * 2048
    assert dev_off[HOST] > 0 and dev_off.get("CUDA0", 0.0) == 0
    # a 16-token prompt is not offloaded: with flash attention on too, the host KV's attention runs
    # on the CPU and only the activations cross, two crossings per layer, and the input embeddings
    # go up once
    short = prefill_workload(plan, 16, 0)
    assert short.pcie_bytes == 8 * 4.0 * (4 * 64 + 2 * 4 * 64 + 4 * 64) * 16 + 4.0 * 256 * 16
    assert short.n_crossings == 2 * 8 + 1
