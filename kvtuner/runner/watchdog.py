"""The watchdog of a llama-server process group (``python -m kvtuner.runner --watch-group PGID``).

:class:`kvtuner.runner.server_run.ServerRunClient` starts llama-server in its own process group
and this small process beside it, holding the read end of a pipe whose write end only kvtuner
has. When that pipe closes (kvtuner closed it, or kvtuner died and the kernel closed it), the
watchdog stops the group, so a server never outlives the app that started it. Imports nothing
but the standard library, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import os
import select
import signal
import time


def watch_group(pgid: int, grace_s: float = 3.0, poll_s: float = 0.5) -> int:
    """Watchdog body (``python -m kvtuner.runner --watch-group PGID``): wait until stdin closes
    (kvtuner closed the pipe or died), then SIGTERM process group ``pgid`` and SIGKILL it after
    ``grace_s`` seconds if it is still there. Leaves at once when the group ends by itself (its
    id could later name another group). Returns 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def alive() -> bool:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    while alive():
        try:
            ready, _, _ = select.select([0], [], [], poll_s)
            if ready and not os.read(0, 4096):
                break  # the pipe closed
        except OSError:
            break
    else:
        return 0
    if alive():
        try:
            os.killpg(pgid, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + grace_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive():
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
    return 0
