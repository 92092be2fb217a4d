"""llama.cpp buffer names -> the device whose memory they use: the one mapping.

llama.cpp names every buffer by its buffer type (ggml-backend ``ggml_backend_buft_name``):
``CPU``, ``CPU_Mapped`` (weights memory-mapped from the file), ``CPU_REPACK`` (ggml-cpu's
repacked copies), ``CUDA0``, ``CUDA_Host`` (pinned host memory the CUDA backend uses for
inputs and for ``-nkvo`` KV), ``CUDA0_Split`` (row split), ``RPC0[host:port]`` and so on. The
planner keys devices as ``CPU`` for the host and ``CUDA0``/``CUDA1``... for GPUs.
"""

from __future__ import annotations

import re

#: The planner's name for the host.
HOST = "CPU"

_DEVICE_RE = re.compile(r"^([A-Za-z]+\d+(?:\[[^\]]*\])?)(?:$|_)")


def buffer_device(buft: str) -> str:
    """The device of a llama.cpp buffer type name: ``"CUDA0"`` -> ``"CUDA0"``,
    ``"CUDA0_Split"`` -> ``"CUDA0"``, ``"RPC0[10.0.0.2:50052]"`` stays; every host buffer
    (``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``CUDA_Host``, ``Vulkan_Host`` ...) and any name
    without a device number -> :data:`HOST`."""
    name = buft.strip()
    if name.upper().startswith("CPU") or name.endswith("_Host"):
        return HOST
    m = _DEVICE_RE.match(name)
    return m.group(1) if m else HOST


def bytes_by_device(mib_by_buffer: dict[str, float]) -> dict[str, int]:
    """Sum MiB figures keyed by buffer name (as llama.cpp prints them) into bytes per device
    (``{"CUDA0": 1.5, "CUDA_Host": 0.5, "CPU": 0.25}`` -> ``{"CUDA0": 1572864, "CPU": 786432}``)."""
    out: dict[str, int] = {}
    for buft, mib in mib_by_buffer.items():
        dev = buffer_device(buft)
        out[dev] = out.get(dev, 0) + int(round(float(mib) * (1 << 20)))
    return out
