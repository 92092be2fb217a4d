"""A stand-in for ``pynvml`` (the NVIDIA driver): the only fake in the tests, for the hardware
these machines lack. Inject it with :func:`kvtuner.core.hardware.nvml.use_nvml_module`."""

from __future__ import annotations

import types
from dataclasses import dataclass


class FakeNVMLError(Exception):
    pass


@dataclass
class _Mem:
    total: int
    free: int
    used: int


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int | None


def fake_nvml(n_gpus: int = 2, *, init_error: Exception | None = None, runner_pid: int = 4242) -> types.SimpleNamespace:
    """A stand-in for pynvml with a driver and ``n_gpus`` 12 GiB cards."""
    calls: list[str] = []
    GiB = 1 << 30

    def rec(name, fn):
        def wrapper(*a):
            calls.append(name)
            return fn(*a)

        return wrapper

    def init():
        if init_error is not None:
            raise init_error

    def handle(i):
        if not 0 <= i < n_gpus:
            raise FakeNVMLError("Invalid Argument")
        return ("handle", i)

    def unsupported(*_a):
        raise FakeNVMLError("Not Supported")

    m = types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlInit=rec("nvmlInit", init),
        nvmlSystemGetDriverVersion=lambda: b"550.54.14",
        nvmlDeviceGetCount=rec("count", lambda: n_gpus),
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda h: b"NVIDIA GeForce RTX 3060" if h[1] == 0 else "NVIDIA RTX A2000 12GB",
        nvmlDeviceGetMemoryInfo=lambda h: _Mem(12 * GiB, (10 - h[1]) * GiB, (2 + h[1]) * GiB),
        nvmlDeviceGetUtilizationRates=lambda h: _Util(37 + h[1], 10),
        nvmlDeviceGetComputeRunningProcesses=lambda h: (
            [_Proc(runner_pid, 900 << 20), _Proc(1, 100 << 20), _Proc(runner_pid, None)] if h[1] == 0 else unsupported()
        ),
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 7501 if kind == 2 else 1900,  # MHz (memory clock for kind 2)
        nvmlDeviceGetMemoryBusWidth=lambda h: 192 if h[1] == 0 else unsupported(),
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 4,
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
    )
    m.calls = calls
    return m
