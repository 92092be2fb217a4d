"""Samplers: NVML through a stand-in for the driver (the only fake), psutil for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kvtuner.core.hardware import host as H
from kvtuner.core.hardware import nvml as N
from kvtuner.core.monitor import sampler as S
from kvtuner.testing.nvml_standin import FakeNVMLError, fake_nvml


@pytest.fixture
def nvml():
    """Inject a module into the choke point; always restore the real pynvml after."""
    yield N.use_nvml_module
    N.use_nvml_module(None)


def test_detect_gpus_through_the_choke_point(nvml):
    fake = fake_nvml(2)
    nvml(fake)
    gpus = N.detect_gpus()
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 3060", "NVIDIA RTX A2000 12GB"]
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].total_bytes == 12 << 30 and gpus[0].free_bytes == 10 << 30 and gpus[1].free_bytes == 9 << 30
    assert gpus[0].device == "CUDA0"
    # 7501 MHz x 192 bit / 8 x 2 (DDR) = 360 GB/s: the RTX 3060's published 360 GB/s
    assert gpus[0].mem_bandwidth_bytes_s == pytest.approx(360.05e9, rel=1e-3)
    assert gpus[1].mem_bandwidth_bytes_s is None  # bus width unsupported -> None, not an error
    assert gpus[0].pcie_bandwidth_bytes_s == pytest.approx(16 * 1969.2e6)
    assert N.nvml_status() == N.NvmlStatus(True, "", "550.54.14")
    assert fake.calls.count("nvmlInit") == 1  # lazily, once


@pytest.mark.parametrize(
    "error",
    [
        FakeNVMLError("NVML Shared Library Not Found"),
        FakeNVMLError("Driver Not Loaded"),
        OSError("libnvidia-ml.so.1: cannot open"),
    ],
)
def test_no_driver_is_a_normal_state_reported_once(nvml, error, caplog):
    fake = fake_nvml(init_error=error)
    nvml(fake)
    with caplog.at_level("INFO", logger="kvtuner.nvml"):
        assert N.detect_gpus() == []
        assert N.nvml_call("nvmlDeviceGetCount", default=-1) == -1
        assert N.detect_gpus() == []
        status = N.nvml_status()
    assert not status.available
    assert status.message == f"no NVIDIA GPU found: {error}"
    assert fake.calls.count("nvmlInit") == 1  # not retried on every call
    assert [r.getMessage() for r in caplog.records] == [status.message]  # reported once


def test_real_machine_without_driver_is_not_an_error():
    N.use_nvml_module(None)
    status = N.nvml_status()  # this machine may or may not have a driver; either way no exception
    assert isinstance(status.available, bool)
    if not status.available:
        assert status.message.startswith("no NVIDIA GPU found")
        assert N.detect_gpus() == []


def test_failed_query_returns_the_default(nvml):
    nvml(fake_nvml(1))
    assert N.nvml_call("nvmlDeviceGetHandleByIndex", 5, default="nope") == "nope"
    assert N.nvml_call("nvmlNoSuchFunction", default=0) == 0


def test_sampler_reads_gpus_and_the_runner_process_vram(nvml):
    nvml(fake_nvml(2, runner_pid=os.getpid()))
    s = S.Sampler(pid=os.getpid())
    _, gpus = s.sample_once()
    assert [g.index for g in gpus] == [0, 1]
    g0, g1 = gpus
    assert g0.used_bytes == 2 << 30 and g0.free_bytes == 10 << 30 and g0.util_percent == 37.0
    assert g0.process_bytes == 900 << 20  # only our pid, entries without a figure skipped
    assert g1.process_bytes is None  # per-process query unsupported on that device
    assert s.gpu_indices() == [0, 1]
    assert s.gpu_samples(0) == [g0] and s.gpu_samples(7) == []
    peaks = s.peaks()
    assert peaks.gpu_used_bytes == {0: 2 << 30, 1: 3 << 30}
    assert peaks.gpu_process_bytes == {0: 900 << 20}


def test_host_sample_is_real():
    N.use_nvml_module(None)
    s = S.Sampler(pid=os.getpid(), gpus=False)
    first, gpus = s.sample_once()
    assert gpus == ()
    import psutil

    vm = psutil.virtual_memory()
    assert first.total_bytes == vm.total
    assert abs(first.available_bytes - vm.available) < vm.total * 0.05
    assert first.swap_in_bytes_s is None  # no rate before a second sample
    rss = psutil.Process().memory_info().rss
    assert first.process_rss_bytes == pytest.approx(rss, rel=0.2)
    second, _ = s.sample_once()
    assert second.swap_in_bytes_s is not None and second.swap_in_bytes_s >= 0
    assert second.t_s > first.t_s


def test_process_gone_gives_none():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    s = S.Sampler(pid=proc.pid, gpus=False)
    host, _ = s.sample_once()
    assert host.process_rss_bytes is None


def test_sampler_thread_fills_a_bounded_ring_buffer():
    s = S.Sampler(interval_s=0.01, capacity=5, pid=os.getpid(), gpus=False)
    with s:
        deadline = time.monotonic() + 5
        while s.n_samples < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
    n = s.n_samples
    assert n >= 12
    samples = s.host_samples()
    assert len(samples) == 5  # bounded: the oldest fell off
    assert [x.t_s for x in samples] == sorted(x.t_s for x in samples)
    assert s.host_samples(since_t_s=samples[2].t_s) == samples[3:]
    time.sleep(0.05)
    assert s.n_samples == n  # stopped
    assert s.peaks().process_rss_bytes is not None
    s.reset_peaks()
    assert s.peaks().process_rss_bytes is None


def test_ring_buffer():
    rb = S.RingBuffer[int](3)
    assert rb.latest() is None
    for i in range(5):
        rb.append(i)
    assert rb.snapshot() == [2, 3, 4] and rb.latest() == 4 and len(rb) == 3
    with pytest.raises(ValueError):
        S.RingBuffer(0)


def test_bad_interval():
    with pytest.raises(ValueError):
        S.Sampler(interval_s=0)


def test_detect_host():
    h = H.detect_host()
    assert h.total_bytes > 0 and 0 < (h.available_bytes or 0) <= h.total_bytes


def test_gpu_process_list_through_the_choke_point(nvml):
    fake = fake_nvml(2, runner_pid=4242)
    fake.nvmlSystemGetProcessName = lambda pid: b"/usr/bin/llama-server" if pid == 1 else b""
    nvml(fake)
    procs = N.gpu_processes()
    # GPU 0 lists the runner twice (900 MiB and unknown): one entry with the known figure; GPU 1 is unsupported
    assert procs == (N.GpuProcess(1, "llama-server", 0, 100 << 20), N.GpuProcess(4242, procs[1].name, 0, 900 << 20))
    s = S.Sampler(interval_s=0.1, gpus=True)
    s.sample_once()
    assert s.gpu_processes() == procs  # taken on the sampling thread, read without NVML calls


def test_gpu_process_list_without_nvml_is_empty(nvml):
    nvml(fake_nvml(init_error=FakeNVMLError("Driver Not Loaded")))
    assert N.gpu_processes() == ()
    s = S.Sampler(interval_s=0.1)
    s.sample_once()
    assert s.gpu_processes() == ()


def test_recorded_samples_are_stored_like_sampled_ones():
    s = S.Sampler(interval_s=0.1, gpus=False)
    t = time.monotonic()
    s.record(S.HostSample(t, 16 << 30, 1 << 30, 0, 50 << 20, 0.0, 3 << 30))
    assert s.host_samples(t - 1)[-1].available_bytes == 1 << 30
    assert s.peaks().process_rss_bytes == 3 << 30 and s.peaks().host_used_bytes == 15 << 30
