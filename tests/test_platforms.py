"""kvtuner on Windows and macOS, exercised here on Linux: every module imports with
``sys.platform`` set to ``win32`` and to ``darwin`` (in a fresh interpreter per platform, so the
patch cannot leak), and each platform's branch of process stopping and host facts runs with the
platform-specific call stood in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
import kvtuner
# third-party packages (psutil, PySide6 ...) are imported under the real platform: only
# kvtuner's own module-level code runs with the patched one
for info in pkgutil.walk_packages(kvtuner.__path__, "kvtuner."):
    if not info.name.endswith("__main__"):
        try:
            importlib.import_module(info.name)
        except Exception:
            pass
for name in [n for n in sys.modules if n == "kvtuner" or n.startswith("kvtuner.")]:
    del sys.modules[name]
sys.platform = PLATFORM
if PLATFORM == "win32":
    # what Windows lacks: the Unix-only standard modules, POSIX process calls and signals
    import os, signal

    class _NoUnixModules:
        def find_spec(self, name, path=None, target=None):
            if name in ("resource", "fcntl", "termios", "pwd", "grp", "pty", "tty"):
                raise ImportError(f"No module named {name!r} on Windows")
            return None

    sys.meta_path.insert(0, _NoUnixModules())
    for name in ("resource", "fcntl", "termios", "pwd", "grp", "pty", "tty"):
        sys.modules.pop(name, None)
    for name in ("killpg", "getpgid", "setsid", "setpgrp", "sysconf", "getuid", "fork"):
        if hasattr(os, name):
            delattr(os, name)
    for name in ("SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD"):
        if hasattr(signal, name):
            delattr(signal, name)
import kvtuner
failed = {}
names = []
for info in pkgutil.walk_packages(kvtuner.__path__, "kvtuner."):
    if info.name.endswith("__main__"):
        continue
    names.append(info.name)
    try:
        importlib.import_module(info.name)
    except Exception as exc:
        failed[info.name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"platform": sys.platform, "names": names, "failed": failed}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_every_module_imports_on_windows_and_macos(platform):
    env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen")
    cp = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL.replace("PLATFORM", repr(platform))],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    result = json.loads(cp.stdout.strip().splitlines()[-1])
    assert result["platform"] == platform
    assert len(result["names"]) > 80  # every package walked, not just the top
    assert "kvtuner.runner.worker" in result["names"] and "kvtuner.gui.main_window" in result["names"]
    assert result["failed"] == {}


# -- stopping processes: the POSIX and the Windows branch ---------------------------------------

from kvtuner.runner import procs  # noqa: E402 (this part's subject, imported where it starts)

_PARENT_WITH_CHILD = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(params=["posix", "windows"])
def platform_branch(request, monkeypatch):
    """Each branch of :mod:`kvtuner.runner.procs`; the Windows one runs its psutil tree calls
    here, and the Windows-only ``creationflags`` (which Linux's Popen refuses) is stood in by a
    POSIX group so the child still runs."""
    if request.param == "windows":
        monkeypatch.setattr(procs, "WINDOWS", True)
        assert procs.group_popen_kwargs() == {"creationflags": 0x200}
        monkeypatch.setattr(procs, "group_popen_kwargs", lambda: {"start_new_session": True})
    else:
        assert procs.group_popen_kwargs() == {"start_new_session": True}
    return request.param


def test_stop_tree_ends_the_child_and_what_it_started(platform_branch):
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARENT_WITH_CHILD], stdout=subprocess.PIPE, text=True, **procs.group_popen_kwargs()
    )
    try:
        grandchild = int(proc.stdout.readline())
        assert procs.stop_tree(proc, grace_s=5.0) == "terminated"
        assert proc.returncode is not None
        assert _gone(grandchild), f"{platform_branch}: the grandchild {grandchild} outlived the stop"
        assert procs.stop_tree(proc) == "gone"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


def test_kill_tree_escalates_past_a_child_that_ignores_sigterm(platform_branch):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **procs.group_popen_kwargs()
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert procs.stop_tree(proc, grace_s=0.5) == "killed"
        assert _gone(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


@pytest.mark.llama
@pytest.mark.slow
def test_runner_child_stop_paths(platform_branch, default_model):
    """The runner child (``python -m kvtuner.runner``) stuck mid-load: cancel escalates to the
    branch's terminate, and a child deaf to it is killed; nothing is left behind."""
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.runner import protocol as P
    from kvtuner.runner.client import RunnerClient, RunnerError
    from kvtuner.testing.processes import wait_until_ignoring

    # term_grace_s: the hanging child dies on the branch's terminate (5 s lets a busy machine reap
    # it); the deaf one never does, so its grace only delays the kill
    for fault, outcome, term_grace_s in (
        ("hang@load_progress", "terminated", 5.0),
        ("deaf@load_progress", "killed", 0.5),
    ):
        c = RunnerClient(env={"KVTUNER_RUNNER_FAULT": fault})
        try:
            c.start(timeout_s=60)
            c.send(P.LoadCommand(model_path=str(default_model), config=PlanConfig(n_ctx=512, n_batch=512).to_dict()))
            c.wait_for(P.LoadProgressEvent, timeout_s=30)
            if fault.startswith("deaf"):  # the child ignores SIGTERM from here on
                wait_until_ignoring(c.pid)
            assert c.cancel(grace_s=0.3, term_grace_s=term_grace_s) == outcome, (platform_branch, fault)
            with pytest.raises(RunnerError) as ei:
                c.wait_for(P.LoadedEvent, timeout_s=15)
            assert ei.value.kind == "cancelled"  # asked for: not mistaken for the OOM killer
            assert c.wait_for(P.ExitedEvent, timeout_s=15).requested
        finally:
            c.close(timeout_s=5)
        assert _gone(c.pid), f"runner {c.pid} left behind ({platform_branch}, {fault})"
