"""Helpers for tests that start real llama.cpp servers (llama-server, rpc-server) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(port: int) -> tuple[int, str]:
    """llama-server's ``GET /health`` on ``port``: (HTTP status, body); (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a server started with ``start_new_session=True`` by its process group: SIGTERM, then
    SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def wait_healthy(proc: subprocess.Popen, port: int, log: Path, timeout_s: float) -> str:
    """Poll ``/health`` every 0.5 s until llama-server answers 200 and return the body; fail the
    test (with the tail of ``log``) when the process exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    status, body = 0, ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"llama-server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        status, body = health(port)
        if status == 200:
            break
        time.sleep(0.5)
    assert status == 200, f"no healthy /health within {timeout_s} s:\n{log.read_text(errors='replace')[-4000:]}"
    return body


def start_llama_server(
    binary: Path, model: Path, log_dir: Path, flags: list[str]
) -> tuple[subprocess.Popen, int, list[str]]:
    """Start ``binary -m model FLAGS --host 127.0.0.1 --port P`` in its own process group and
    wait until ``/health`` is 200; returns (process, port, argv). Stop it with :func:`stop_group`."""
    port = free_port()
    argv = [str(binary), "-m", str(model), *flags, "--host", "127.0.0.1", "--port", str(port)]
    log = log_dir / f"server-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        wait_healthy(proc, port, log, 120)
    except BaseException:
        stop_group(proc)
        raise
    return proc, port, argv


class CompletionClient(threading.Thread):
    """Sends ``/completion`` requests to a llama-server one after another until :attr:`stop` is
    set (or the server goes away); keeps each answer's ``timings`` and its (sent, answered)
    wall-clock times in :attr:`spans`."""

    def __init__(self, port: int, n_predict: int = 40) -> None:
        super().__init__(daemon=True)
        self.port, self.n_predict = port, n_predict
        self.stop = threading.Event()
        self.timings: list[dict] = []
        self.spans: list[tuple[float, float]] = []

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            body = json.dumps(
                {
                    "prompt": f"Tell a long story about the number {i}.",
                    "n_predict": self.n_predict,
                    "temperature": 0,
                    "ignore_eos": True,
                    "cache_prompt": False,
                }
            ).encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/completion", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                t0 = time.time()
                with urllib.request.urlopen(req, timeout=120) as r:
                    timings = json.loads(r.read())["timings"]
                self.spans.append((t0, time.time()))
                self.timings.append(timings)
            except OSError:  # the server was stopped under a request
                return
            i += 1
