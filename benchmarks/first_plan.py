"""Time a newcomer's first ``kvtuner plan``: a new, empty data directory
(``KVTUNER_DATA_DIR=$(mktemp -d) kvtuner plan``, the default model), so no CPU probe, no host
bandwidth figure and no calibration are stored. Prints the seconds to the answer, the load
average, and what the CPU probe started in the background says; ``--wait`` also follows the
background probe to its end (its state: stored, or busy when other load kept it from being kept),
else the probe is stopped so nothing is left behind.

Usage: ``python benchmarks/first_plan.py [--runs N] [--wait]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def first_plan(wait: bool) -> dict:
    """One first plan in a fresh data directory; returns its figures."""
    with tempfile.TemporaryDirectory(prefix="kvtuner-first-") as data:
        env = {**os.environ, "KVTUNER_DATA_DIR": data}
        env.pop("KVTUNER_CPU_PROBE", None)
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "kvtuner.cli", "plan"], capture_output=True, text=True, env=env, timeout=600
        )
        answer_s = time.monotonic() - t0
        status_file = Path(data) / "cpu-probe.json"
        status = json.loads(status_file.read_text()) if status_file.exists() else {}
        pid = status.get("pid")
        probe_s = None
        if pid and wait:
            while _alive(pid):
                time.sleep(2.0)
            status = json.loads(status_file.read_text())
            probe_s = time.monotonic() - t0
        elif pid and _alive(pid):
            os.killpg(pid, signal.SIGTERM)  # the job runs in its own session: its group is its pid
        stderr = [line for line in out.stderr.splitlines() if line.strip()]
        return {
            "rc": out.returncode,
            "answer_s": round(answer_s, 2),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "stderr": stderr,
            "probe_state": status.get("state"),
            "probe_s": probe_s,
            "probe_message": status.get("message", ""),
        }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie of a detached job is reaped by init; treat it as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--runs", type=int, default=3, help="first plans to time (default 3)")
    ap.add_argument("--wait", action="store_true", help="follow the background probe of the first run to its end")
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.2f}")
    for i in range(a.runs):
        r = first_plan(a.wait and i == 0)
        print(
            f"first plan {i + 1}: answered in {r['answer_s']:.2f} s (exit {r['rc']}), load average {r['load_avg_1m']}"
        )
        for line in r["stderr"]:
            print(f"  stderr: {line}")
        if r["probe_s"] is not None:
            print(f"  background probe: {r['probe_state']} after {r['probe_s']:.0f} s {r['probe_message']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
