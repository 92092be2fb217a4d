"""Waiting on a child process's state from outside (Linux ``/proc``)."""

from __future__ import annotations

import signal
import time
from pathlib import Path


def wait_until_ignoring(pid: int, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 10.0) -> None:
    """Return once process ``pid`` ignores ``sig`` (bit ``sig - 1`` of the ``SigIgn:`` mask in
    ``/proc/PID/status``, proc(5)), polling every 10 ms.

    Raises:
        TimeoutError: not ignoring it after ``timeout_s`` seconds.
        FileNotFoundError: no such process (or no ``/proc``)."""
    status = Path(f"/proc/{pid}/status")
    deadline = time.monotonic() + timeout_s
    while True:
        for line in status.read_text().splitlines():
            if line.startswith("SigIgn:") and (int(line.split()[1], 16) >> (int(sig) - 1)) & 1:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} does not ignore {sig.name} after {timeout_s} s")
        time.sleep(0.01)
