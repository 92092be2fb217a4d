"""The RPC plan against a real loopback run: two ``rpc-server`` on 127.0.0.1, the exported
``llama-server --rpc A,B -ngl all -ts 3,1`` on the default model, its per-device buffers read from
its log and compared with kvtuner's plan of the same configuration.

Needs llama.cpp built with ``-DGGML_RPC=ON``: ``.ci/build_llama_rpc.sh`` builds ``llama-server``
and ``ggml-rpc-server`` (the rpc-server) into a cache keyed by the sdist and the flags; ``make test``
runs it and passes the directory as ``KVTUNER_RPC_BIN``. Without it the test is skipped, saying so.

Every process the test starts is stopped by its pid (its process group), also on failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from kvtuner.core.export import export
from kvtuner.core.export.llama_server import rpc_server_command
from kvtuner.core.hardware.rpc import RpcError, query_endpoint, rpc_devices
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import PRINT_TOLERANCE_BYTES, plan_memory
from kvtuner.core.plan.placement import DeviceSplit
from kvtuner.core.units import MiB
from kvtuner.testing.server_support import free_port, stop_group, wait_healthy

pytestmark = [pytest.mark.llama, pytest.mark.slow]

HEALTH_TIMEOUT_S = 240
_F = r"([0-9]+\.[0-9]+)"


def _rpc_bin() -> Path:
    d = os.environ.get("KVTUNER_RPC_BIN", "")
    if not d:
        pytest.skip(
            "rpc-server absent: KVTUNER_RPC_BIN is not set (make test builds llama.cpp with -DGGML_RPC=ON "
            "by .ci/build_llama_rpc.sh and sets it)"
        )
    p = Path(d)
    for name in ("ggml-rpc-server", "llama-server"):
        if not (p / name).is_file():
            pytest.skip(f"rpc-server absent: {p / name} not found (run .ci/build_llama_rpc.sh)")
    return p


def _buffers(text: str, what: str) -> dict[str, int]:
    """``<func>: <buft> <what> buffer size = X MiB`` per buffer type, summed (KV prints one line per cache)."""
    out: dict[str, int] = {}
    for dev, mib in re.findall(rf"(\S+)\s+{what} buffer size =\s*{_F} MiB", text):
        out[dev] = out.get(dev, 0) + round(float(mib) * MiB)
    return out


SPLITS = {
    "ts-3-1": DeviceSplit(tensor_split=(3, 1)),  # the case: layers 0-14 | 15-17 + output
    "none-mg-1": DeviceSplit(split_mode="none", main_gpu=1),  # only the second server holds anything
}


@pytest.mark.parametrize("name", list(SPLITS))
def test_rpc_loopback_matches_the_plan(tmp_path, default_model, default_profile, name):
    bindir = _rpc_bin()
    procs: list[subprocess.Popen] = []
    try:
        endpoints = []
        for i in range(2):
            port = free_port()
            ep = f"127.0.0.1:{port}"
            fh = open(tmp_path / f"rpc{i}.log", "wb")
            procs.append(
                subprocess.Popen(
                    rpc_server_command(ep, binary=str(bindir / "ggml-rpc-server"), cache=False),
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            endpoints.append(ep)
        # kvtuner asks each server for its device memory over the RPC protocol
        infos = []
        for ep in endpoints:
            deadline = time.monotonic() + 30
            while True:
                try:
                    infos.append(query_endpoint(ep))
                    break
                except RpcError:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                        raise
                    time.sleep(0.2)
        devices = [d for info in infos for d in rpc_devices(info)]
        assert [d.device for d in devices] == [f"RPC0[{ep}]" for ep in endpoints]
        assert all(info.version[0] == 7 and len(info.devices) == 1 for info in infos)

        config = PlanConfig()
        split = SPLITS[name]
        plan = plan_memory(default_profile, config, devices, split=split)
        result = export(
            "llama-server", default_model, config, binary=str(bindir / "llama-server"), split=split, rpc=endpoints
        )
        assert " ".join([*split.flags(), "--rpc", ",".join(endpoints)]) in result.text
        port = free_port()
        log = tmp_path / "server.log"
        with open(log, "wb") as fh:
            procs.append(
                subprocess.Popen(
                    [*result.argv, "--host", "127.0.0.1", "--port", str(port), "--threads", "2", "-lv", "4"],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        body = wait_healthy(procs[-1], port, log, HEALTH_TIMEOUT_S)
        assert json.loads(body) == {"status": "ok"}
        text = log.read_text(errors="replace")
        weights, kv, compute = _buffers(text, "model"), _buffers(text, "KV"), _buffers(text, "compute")
        rows = []
        for d in plan.gpus:
            rows.append(
                (
                    d.device,
                    d.weights_bytes,
                    weights.get(d.device),
                    d.kv_bytes,
                    kv.get(d.device),
                    d.compute_bytes,
                    compute.get(d.device),
                )
            )
        print("\ndevice | weights plan / llama.cpp | KV plan / llama.cpp | compute plan / llama.cpp (MiB)")
        for dev, wp, wl, kp, kl, cp, cl in rows:
            print(
                f"{dev} | {wp / MiB:.2f} / {(wl or 0) / MiB:.2f} | {kp / MiB:.2f} / {(kl or 0) / MiB:.2f} | "
                f"{cp / MiB:.2f} / {(cl or 0) / MiB:.2f}"
            )
        for dev, wp, wl, kp, kl, _, cl in rows:
            # exact to the print: llama.cpp logs MiB with two decimals (no line: the device holds nothing)
            assert abs(wp - (wl or 0)) <= PRINT_TOLERANCE_BYTES, (dev, wp, wl)
            assert abs(kp - (kl or 0)) <= PRINT_TOLERANCE_BYTES, (dev, kp, kl)
            assert bool(cl) == bool(wp), (dev, "a compute buffer exactly where layers are")
        # the host keeps the token embedding (CPU_Mapped with mmap)
        host_w = sum(v for k, v in weights.items() if k.startswith("CPU"))
        assert abs(host_w - plan.host.weights_bytes) <= PRINT_TOLERANCE_BYTES
    finally:
        for p in reversed(procs):
            stop_group(p)
    assert all(p.returncode is not None for p in procs)
