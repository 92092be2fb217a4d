"""Starting and stopping llama.cpp processes with each system's means.

- POSIX (Linux, macOS): a child gets its own session (``start_new_session``, so its process
  group id is its pid); stopping sends SIGTERM to the group, then SIGKILL after a grace period,
  and kills what is left of the group once the leader has gone.
- Windows: there are no process groups to signal and no SIGTERM/SIGKILL; a child is started
  with ``CREATE_NEW_PROCESS_GROUP`` (so a console Ctrl-C meant for kvtuner does not reach it),
  and stopping terminates the whole tree through psutil (``TerminateProcess`` on the children,
  then the child), then kills what has not gone after the grace period.

:data:`WINDOWS` picks the branch; tests set it to exercise the Windows branch on Linux (psutil's
terminate/kill are the platform calls there, SIGTERM/SIGKILL on Linux).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import psutil

#: Whether the Windows branch is taken (``sys.platform == "win32"``).
WINDOWS = sys.platform == "win32"

#: ``subprocess.CREATE_NEW_PROCESS_GROUP`` (winbase.h, 0x00000200); defined here because the
#: subprocess module names it only on Windows.
CREATE_NEW_PROCESS_GROUP = 0x00000200


def group_popen_kwargs() -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments that put a child in its own process group:
    ``start_new_session=True`` on POSIX, ``creationflags=CREATE_NEW_PROCESS_GROUP`` on Windows."""
    if WINDOWS:
        return {"creationflags": CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def _tree(pid: int) -> list[psutil.Process]:
    """``pid``'s descendants (children first in psutil's order), empty when it has gone."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.Error, OSError):
        return []


def _signal_tree(proc: subprocess.Popen, *, hard: bool) -> None:
    """Windows branch: terminate (``hard``: kill) ``proc``'s descendants, then ``proc``."""
    for child in _tree(proc.pid):
        try:
            child.kill() if hard else child.terminate()
        except (psutil.Error, OSError):
            pass
    try:
        proc.kill() if hard else proc.terminate()
    except (ProcessLookupError, OSError):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tree(proc: subprocess.Popen, grace_s: float = 5.0, *, group: bool = True) -> str:
    """Stop ``proc`` and what it started: politely, then by force after ``grace_s`` seconds; waits
    for ``proc`` (at most 10 s after the forced stop).

    Args:
        group: ``proc`` leads its own process group (:func:`group_popen_kwargs`); POSIX signals
            the group, else only ``proc``.

    Returns:
        ``"gone"`` (it had already exited), ``"terminated"`` or ``"killed"``.
    """
    if proc.poll() is not None:
        if not WINDOWS and group:
            _signal_group(proc.pid, signal.SIGKILL)  # leftovers of a group whose leader is gone
        return "gone"
    if WINDOWS:
        survivors = _tree(proc.pid)
        _signal_tree(proc, hard=False)
        try:
            proc.wait(timeout=grace_s)
            psutil.wait_procs(survivors, timeout=grace_s)
            for p in survivors:
                if p.is_running():
                    p.kill()
            return "terminated"
        except (subprocess.TimeoutExpired, psutil.Error):
            _signal_tree(proc, hard=True)
            for p in survivors:
                try:
                    p.kill()
                except (psutil.Error, OSError):
                    pass
            proc.wait(timeout=10.0)
            return "killed"
    for sig, wait_s, outcome in ((signal.SIGTERM, grace_s, "terminated"), (signal.SIGKILL, 10.0, "killed")):
        if group:
            _signal_group(proc.pid, sig)
        else:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if group:  # the group may outlive its leader (a child it started): kill what is left
            _signal_group(proc.pid, signal.SIGKILL)
        return outcome
    return "killed"


def kill_tree(proc: subprocess.Popen, *, group: bool = True) -> None:
    """Kill ``proc`` (and its group on POSIX, its descendants on Windows) at once; waits for it."""
    if WINDOWS:
        _signal_tree(proc, hard=True)
    elif group:
        _signal_group(proc.pid, signal.SIGKILL)
    else:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10.0)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
        pass


def terminate_one(proc: subprocess.Popen) -> None:
    """Ask ``proc`` alone to stop: SIGTERM on POSIX; on Windows, where no polite signal reaches
    a process without a console, ``TerminateProcess`` of it and its descendants."""
    if WINDOWS:
        _signal_tree(proc, hard=False)
        return
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
