"""Live state for the advisor: decode rate over the last 10 s, time under the abandon line,
the runner's KV types and allocation failures, the samplers' RAM and swap."""

from __future__ import annotations

import pytest

from kvtuner.core.advice.advisor import AdvisorSettings, should_auto_stop
from kvtuner.core.hardware.nvml import GpuProcess
from kvtuner.core.monitor.live import AllocationFailure, LiveTracker, free_bytes_on
from kvtuner.core.monitor.sampler import GpuSample, HostSample
from kvtuner.runner.llama_log import allocation_request

GiB = 1 << 30
MiB = 1 << 20


def series(t0: float, tok_s: float, seconds: float) -> list[tuple[float, float]]:
    dt = 1 / tok_s
    return [(t0 + dt * (i + 1), dt) for i in range(int(seconds * tok_s))]


def test_slow_decode_for_ten_seconds_is_below_the_line():
    lt = LiveTracker()
    lt.start_decode(100.0)
    lt.tokens(series(100.0, 0.5, 12))
    rate, below = lt.decode_rate(112.0)
    assert rate == pytest.approx(0.5) and below == pytest.approx(12.0)
    st = lt.state(112.0)
    assert st.decode_tok_s == pytest.approx(0.5) and st.below_abandon_s == pytest.approx(12.0)
    assert should_auto_stop(st, AdvisorSettings(auto_stop_below_abandon=True))
    assert not should_auto_stop(st)  # only when the user enabled it
    # 9 s is not enough
    assert not should_auto_stop(lt.state(109.0), AdvisorSettings(auto_stop_below_abandon=True))


def test_fast_decode_and_a_stall():
    lt = LiveTracker()
    lt.tokens(series(0.0, 20.0, 5))  # 100 tokens at 20 tok/s, phase starts at the first token's start
    rate, below = lt.decode_rate(5.0)
    assert rate == pytest.approx(20.0) and below == pytest.approx(0.0)
    # then nothing for 12 s (a token that never ends): 0 tok/s over the window, 12 s under the line
    rate, below = lt.decode_rate(17.0)
    assert rate == 0.0 and below == pytest.approx(12.0)
    lt.end_decode()
    assert lt.decode_rate(18.0) == (None, 0.0) and lt.state(18.0).below_abandon_s == 0.0


def test_host_samples_kv_types_and_processes():
    lt = LiveTracker()
    lt.kv_cache("f16", "f16")
    lt.set_flash_attn(False)
    host = [HostSample(10.0 + i * 0.1, 16 * GiB, 1 * GiB, 0, 40 * MiB, 0.0, None) for i in range(30)]
    procs = [GpuProcess(77, "game", 0, 2 * GiB)]
    st = lt.state(13.0, host, gpu_processes=procs, own_pids=(4242,))
    assert (st.total_ram_bytes, st.available_ram_bytes) == (16 * GiB, 1 * GiB)
    assert st.swap_in_bytes_s == pytest.approx(40 * MiB)
    assert (st.kv_type_k, st.kv_type_v, st.flash_attn) == ("f16", "f16", False)
    assert st.gpu_processes[0].pid == 77 and 4242 in st.own_pids
    lt.allocation_failed("CUDA0", 900 * MiB, 300 * MiB)
    after = lt.state(14.0, host, running=False)  # after the run: only its facts remain
    assert after.available_ram_bytes is None and after.decode_tok_s is None
    assert after.allocation_failure == AllocationFailure("CUDA0", 900 * MiB, 300 * MiB)
    assert after.kv_type_k == "f16"


@pytest.mark.parametrize(
    "lines,expected",
    [
        (["ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 943718400"], ("CUDA0", 943718400)),
        (["alloc_tensor_range: failed to allocate CUDA_Host buffer of size 1024"], ("CPU", 1024)),
        (
            [
                "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 900.00 MiB on device 1: cudaMalloc failed: out of memory"
            ],
            ("CUDA1", 900 * MiB),
        ),
        (["ggml_aligned_malloc: insufficient memory (attempted to allocate 2048.00 MB)"], ("CPU", 2048 * MiB)),
        (["ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 4096"], ("CPU", 4096)),
        (["llama_kv_cache: failed to allocate buffer for kv cache"], ("CPU", None)),
        (["load_tensors: CPU_Mapped model buffer size = 241.05 MiB"], None),
    ],
)
def test_allocation_request_from_llama_log(lines, expected):
    assert allocation_request(lines) == expected


def test_free_bytes_on_a_device():
    host = HostSample(1.0, 16 * GiB, 3 * GiB, 0, None, None, None)
    gpu = {0: GpuSample(1.0, 0, 12 * GiB, 10 * GiB, 2 * GiB, None, None)}
    assert free_bytes_on("CPU", host, gpu) == 3 * GiB
    assert free_bytes_on("CUDA0", host, gpu) == 2 * GiB
    assert free_bytes_on("CUDA1", host, gpu) is None
