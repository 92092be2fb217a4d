"""Speed model formulas (kvtuner.core.speed.speed_model), with hand-computed expected values.

The tiny synthetic model (``TINY``, written sparse with tests/gguf_factory.py) has, by the
factory's tensor list (F16 weights, F32 norms):

    token_embd 256 x 1024 x 2 B = 524288 B; output.weight 524288 B; output_norm 256 x 4 = 1024 B
    per layer: 2 norms 2 x 1024 B, q/k/v/o 4 x 256 x 256 x 2 = 524288 B,
               gate/up/down 3 x 256 x 512 x 2 = 786432 B  -> 1312768 B per layer
    parameters: 2 x 262144 (embd, output) + 256 + 4 x (512 + 4 x 65536 + 3 x 131072) = 3148032
    layer parameters (all but the two vocab matrices, shared by layer bytes) = (3148032 - 524288) / 4 = 655936
    KV per cell per layer (f16, 8 KV heads x head size 32, K and V): 2 x 256 x 2 B = 1024 B
"""

from __future__ import annotations

import math
import time

import pytest

from gguf_factory import ModelSpec, write_model
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.hardware.specs import GpuSpec, HostSpec, what_if_gpu
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.model.profile import ModelProfile
from dataclasses import replace

from kvtuner.core.speed.speed_model import CPU_KERNEL_FACTORS_OTHER, GPU_SPEED_PRESETS, cpu_kernel_factors, SpeedConstants, SpeedInputs, SpeedModelError, DeviceRates, decode_tok_s, decode_workload, gpu_rates, measure_host_bandwidth, predict_speed, prefill_tok_s, prefill_workload, speed_band, speed_inputs, workload_time_s

TINY = ModelSpec(n_layer=4, n_embd=256, n_head=8, n_head_kv=8, n_ff=512, n_vocab=1024, n_ctx_train=4096, name="tiny")
LAYER_BYTES = 1312768
OUTPUT_BYTES = 524288 + 1024
LAYER_PARAMS = 655936
KV_CELL_LAYER = 1024
# round numbers for the hand computations
CONST = SpeedConstants(host_bw_efficiency=1.0, host_decode_flop_s_per_thread=1e9, host_prefill_flop_s_per_thread=1e9,
                       gpu_bw_efficiency=0.75, gpu_flop_efficiency=0.5, pcie_efficiency=0.8,
                       crossing_latency_s=20e-6, token_overhead_s=0.5e-3, layer_overhead_s=40e-6,
                       host_decode_bytes_s_per_thread=5e9,  # 2 threads: 10 GB/s, above the 1 GB/s of HOST_BW
                       host_attn_bytes_per_head_cell=0.0, host_attn_flops_per_head_cell=0.0,
                       host_thread_efficiency=1.0)  # linear threads keep the hand numbers simple
HOST_BW = 1e9


def test_effective_threads():
    """1 + (n - 1) x efficiency: the default 0.55 makes 2 threads 1.55x one (idle 2-core VM: 1.36-1.67x)."""
    from kvtuner.core.speed.speed_model import effective_threads

    assert effective_threads(1, SpeedConstants()) == 1.0
    assert effective_threads(2, SpeedConstants()) == pytest.approx(1.55)
    assert effective_threads(8, CONST) == 8.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> ModelProfile:
    return ModelProfile.from_gguf(write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", TINY))


def cpu_inputs(n_threads: int = 2) -> SpeedInputs:
    return SpeedInputs({"CPU": DeviceRates("CPU", HOST_BW)}, n_threads, CONST)


def test_tiny_profile_matches_the_hand_numbers(tiny):
    assert tiny.layer_bytes == (LAYER_BYTES,) * 4
    assert tiny.output_bytes == OUTPUT_BYTES
    assert tiny.n_params == 3148032


def test_decode_cpu_depth0(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"))
    w = decode_workload(plan, 0, CONST)
    (host,) = w.devices
    # weights: 4 layers + output (token_embd is read one row at a time: not counted); KV: 1 cell x 4 layers
    assert host.bytes_read == 4 * LAYER_BYTES + OUTPUT_BYTES + 4 * KV_CELL_LAYER == 5780480
    # 2 x layer params x 4 + 2 x n_vocab x n_embd (logits) + attention 4 x 2 x 8 x (32 + 32) x 1 cell
    assert host.flops == pytest.approx(2 * LAYER_PARAMS * 4 + 2 * 1024 * 256 + 4 * 1024, rel=1e-9)
    assert w.n_crossings == 0 and w.pcie_bytes == 0
    # t = max(5780480 / 1e9, 5775872 / 2e9) + 0.5 ms + 4 x 40 us = 5.78048 ms + 0.66 ms = 6.44048 ms
    assert workload_time_s(w, cpu_inputs()) == pytest.approx(6.44048e-3, rel=1e-9)
    assert decode_tok_s(plan, cpu_inputs(), 0) == pytest.approx(1 / 6.44048e-3, rel=1e-9)


def test_decode_is_compute_bound_with_one_slow_thread(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"))
    inp = SpeedInputs({"CPU": DeviceRates("CPU", HOST_BW)}, 1, CONST.scaled(host_decode_flop_s_per_thread=0.5))
    # flops 5775872 / (1 thread x 0.5e9) = 11.551744 ms > 5.78048 ms of memory; + 0.66 ms
    assert workload_time_s(decode_workload(plan, 0, inp.constants), inp) == pytest.approx(11.551744e-3 + 0.66e-3, rel=1e-9)


def test_decode_kv_grows_with_depth_and_stops_at_the_context(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"))
    w = decode_workload(plan, 1000, CONST)
    # 1001 cells x 1024 B x 4 layers of KV on top of the weights
    assert w.devices[0].bytes_read == 4 * LAYER_BYTES + OUTPUT_BYTES + 4 * 1001 * KV_CELL_LAYER
    with pytest.raises(SpeedModelError, match="between 0 and n_ctx_seq - 1 = 1023"):
        decode_workload(plan, 1024, CONST)


def test_prefill_cpu(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on", n_ubatch=512, n_batch=512))
    w = prefill_workload(plan, 256, 0, CONST)
    (host,) = w.devices
    # causal attention with flash attention: sum_{p=1..256} p = 32896 cells per layer, 1024 FLOP per cell
    attn = 4 * 1024 * 32896
    assert host.flops == pytest.approx(2 * LAYER_PARAMS * 4 * 256 + 2 * 1024 * 256 + attn, rel=1e-9)
    # weights once per ubatch (1 call) + output + KV written/read: 256 cells x 1024 B x 4 layers
    assert host.bytes_read == 4 * LAYER_BYTES + OUTPUT_BYTES + 256 * KV_CELL_LAYER * 4
    # compute-bound: 1478623232 / 2e9 = 0.739311616 s, + 0.66 ms overhead for the one ubatch
    assert prefill_tok_s(plan, cpu_inputs(), 256, 0) == pytest.approx(256 / (0.739311616 + 0.66e-3), rel=1e-9)


def test_prefill_without_flash_attention_reads_the_padded_cache(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="off", n_ubatch=512, n_batch=512))
    w = prefill_workload(plan, 256, 0, CONST)
    # every token of the ubatch sees n_kv = pad(256, 256) = 256 cells: 256 x 256 x 1024 FLOP x 4 layers
    assert w.devices[0].flops == pytest.approx(2 * LAYER_PARAMS * 4 * 256 + 2 * 1024 * 256 + 4 * 1024 * 256 * 256, rel=1e-9)
    with pytest.raises(SpeedModelError, match="must fit the context of 1024 tokens"):
        prefill_workload(plan, 1000, 100)


def test_decode_full_offload_on_the_8gb_preset(tiny):
    gpu = what_if_gpu(8 << 30)
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"), [gpu], HostSpec(16 << 30, 8 << 30))
    w = decode_workload(plan, 0, CONST)
    (g,) = w.devices  # the host only does get_rows: no bytes, no FLOPs
    assert (g.device, g.bytes_read) == ("CUDA0", 5780480)
    assert w.n_crossings == 1 and w.pcie_bytes == 4 * 256  # the embedding row goes up once
    preset = GPU_SPEED_PRESETS["8 GB"]  # RTX 4060: 272 GB/s, PCIe 4.0 x8, 15.1 TFLOPS
    inp = SpeedInputs({"CUDA0": gpu_rates(gpu), "CPU": DeviceRates("CPU", HOST_BW)}, 2, CONST)
    t = (max(5780480 / (272e9 * 0.75), g.flops / (15.1e12 * 0.5)) + 1024 / (preset.pcie_bandwidth_bytes_s * 0.8)
         + 20e-6 + 0.66e-3)
    assert workload_time_s(w, inp) == pytest.approx(t, rel=1e-9)


def test_one_thread_streams_slower_than_memory(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"))
    inp = SpeedInputs({"CPU": DeviceRates("CPU", 20e9)}, 1, CONST)
    # min(20 GB/s x 1.0, 1 thread x 5 GB/s) = 5 GB/s: 5780480 / 5e9 = 1.156096 ms; FLOPs 5775872 / 1e9 = 5.775872 ms bind
    assert workload_time_s(decode_workload(plan, 0, CONST), inp) == pytest.approx(5.775872e-3 + 0.66e-3, rel=1e-9)
    fast = SpeedInputs({"CPU": DeviceRates("CPU", 20e9)}, 1, CONST.scaled(host_decode_flop_s_per_thread=100))
    assert workload_time_s(decode_workload(plan, 0, CONST), fast) == pytest.approx(1.156096e-3 + 0.66e-3, rel=1e-9)


def test_cpu_attention_pays_per_query_head(tiny):
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on"))
    c = replace(CONST, host_attn_bytes_per_head_cell=100.0, host_attn_flops_per_head_cell=50.0)
    # decode at depth 9: 10 cells x 8 heads x (1024 B / 8 KV heads + 100) per layer, 4 layers
    w = decode_workload(plan, 9, c)
    assert w.devices[0].bytes_read == 4 * LAYER_BYTES + OUTPUT_BYTES + 4 * 10 * 8 * (128 + 100)
    # prefill of 10 tokens: 55 cells x (1024 + 8 x 50) FLOP per layer on top of the weights
    p = prefill_workload(plan, 10, 0, c)
    assert p.devices[0].flops == pytest.approx(2 * LAYER_PARAMS * 4 * 10 + 2 * 1024 * 256 + 4 * 55 * (1024 + 400), rel=1e-9)


def test_kernel_factors():
    assert cpu_kernel_factors("MOSTLY_F16") == (1.0, 1.0)
    assert cpu_kernel_factors("MOSTLY_Q4_K_M") == CPU_KERNEL_FACTORS_OTHER


def test_kv_on_host_sends_attention_to_the_cpu(tiny):
    gpu = what_if_gpu(8 << 30)
    plan = plan_memory(tiny, PlanConfig(n_ctx=1024, flash_attn="on", kv_gpu_layers=0), [gpu], HostSpec(16 << 30, 8 << 30))
    w = decode_workload(plan, 500, CONST)
    by = {d.device: d for d in w.devices}
    assert by["CPU"].bytes_read == 4 * 501 * KV_CELL_LAYER  # the KV, read at host bandwidth
    assert by["CUDA0"].bytes_read == 4 * LAYER_BYTES + OUTPUT_BYTES
    # 1 crossing for the embedding + 2 per layer (Q/K/V down, result up): (256 + 2 x 256 + 256) x 4 B each
    assert w.n_crossings == 1 + 2 * 4
    assert w.pcie_bytes == 4 * 256 + 4 * (4 * 1024)


def test_offloading_kv_is_slower_and_the_curve_falls(tiny):
    gpu = what_if_gpu(8 << 30)
    host = HostSpec(16 << 30, 8 << 30, mem_bandwidth_bytes_s=20e9)
    inp = speed_inputs([gpu], host, n_threads=4)
    on = predict_speed(plan_memory(tiny, PlanConfig(n_ctx=4096), [gpu], host), inp)
    off = predict_speed(plan_memory(tiny, PlanConfig(n_ctx=4096, kv_gpu_layers=0), [gpu], host), inp)
    assert off.decode_tok_s_at_full_ctx < on.decode_tok_s_at_full_ctx
    speeds = [v for _, v in on.curve]
    assert speeds == sorted(speeds, reverse=True) and on.curve[0][0] == 0 and on.curve[-1][0] == 4095
    assert on.band[0] < on.decode_tok_s < on.band[1]
    d = on.to_dict()
    assert set(d) >= {"decode_tok_s", "decode_tok_s_at_full_ctx", "prefill_tok_s", "band"}
    assert d["badge"] == speed_band(on.decode_tok_s)


def test_nvml_bandwidth_wins_over_the_preset():
    g = GpuSpec("NVIDIA GeForce RTX 3060", 12 << 30, 11 << 30, mem_bandwidth_bytes_s=360e9, pcie_bandwidth_bytes_s=8e9)
    r = gpu_rates(g)
    assert (r.bandwidth_bytes_s, r.pcie_bandwidth_bytes_s, r.flop_s) == (360e9, 8e9, 12.7e12)
    unknown = gpu_rates(GpuSpec("Some GPU", 10 << 30, mem_bandwidth_bytes_s=500e9))
    assert unknown.flop_s == 500e9 * 40  # GPU_FLOP_PER_BYTE


@pytest.mark.parametrize("tok_s, badge", [
    (0.0, "abandon"), (0.99, "abandon"), (1.0, "offline"), (4.99, "offline"), (5.0, "interactive"),
    (9.99, "interactive"), (10.0, "fluent"), (250.0, "fluent"),
])
def test_speed_band(tok_s, badge):
    assert speed_band(tok_s) == badge


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "fast"])
def test_speed_band_rejects_nonsense(bad):
    with pytest.raises(SpeedModelError, match="tokens/s >= 0"):
        speed_band(bad)


def test_bad_constants_and_threads():
    with pytest.raises(SpeedModelError, match="host_bw_efficiency must be a finite number"):
        SpeedConstants(host_bw_efficiency=-1)
    with pytest.raises(SpeedModelError, match="n_threads must be 1 or more"):
        speed_inputs([], HostSpec(1 << 30, mem_bandwidth_bytes_s=1e9), n_threads=0)


def test_host_bandwidth_probe_is_quick_and_cached():
    measure_host_bandwidth.cache_clear()
    t = time.perf_counter()
    bw = measure_host_bandwidth()
    assert time.perf_counter() - t < 1.0  # ~0.25 s idle; slack for a loaded CI machine
    assert 1e8 < bw < 1e13 and math.isfinite(bw)
    t = time.perf_counter()
    assert measure_host_bandwidth() == bw
    assert time.perf_counter() - t < 0.01
