"""Parent side of the runner: spawn ``python -m kvtuner.runner``, send commands, read events.

Never imports ``llama_cpp`` (only the child does). One :class:`RunnerClient` owns one child:

- events are read on a thread into a queue (and passed to ``on_event`` if given, e.g. for a
  GUI that forwards them to its own thread); :meth:`RunnerClient.next_event` and
  :meth:`RunnerClient.wait_for` take timeouts, so nothing here waits forever;
- the child's stderr is kept (last lines) for crash reports;
- when the child dies the client reaps it (no zombie) and queues an :class:`ErrorEvent`
  (``crashed``, ``out_of_memory`` for an unrequested SIGKILL, or ``cancelled``) and an
  :class:`ExitedEvent`;
- :meth:`RunnerClient.cancel`: polite cancel command, then SIGTERM, then SIGKILL;
- if the parent dies, the child sees EOF on its stdin and exits (see :mod:`.worker`).
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from . import procs
from . import protocol as P

#: Events that end a command (the child is idle after them).
TERMINAL_EVENTS = (P.LoadedEvent, P.BenchResultEvent, P.DryRunResultEvent, P.UnloadedEvent)


#: First argument that makes a frozen kvtuner executable (the PyInstaller bundle) run the runner
#: child instead of the command line: a frozen app has no ``-m``, its ``sys.executable`` is the
#: app itself (PyInstaller manual, "Run-time information": ``sys.frozen``, ``sys.executable``),
#: so the child re-enters through the same executable (packaging/kvtuner_main.py).
RUNNER_ARGUMENT = "--kvtuner-runner-child"


def _frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def child_command(python: str | None = None) -> list[str]:
    """The argv that starts the runner child.

    ``python`` given: ``[python, "-m", "kvtuner.runner"]``. Otherwise, in a frozen app,
    ``[sys.executable, RUNNER_ARGUMENT]``; else ``[sys.executable, "-m", "kvtuner.runner"]``.
    """
    if python is None and _frozen():
        return [sys.executable, RUNNER_ARGUMENT]
    return [python or sys.executable, "-m", "kvtuner.runner"]


class RunnerError(RuntimeError):
    """A runner command failed. ``kind`` is one of :data:`kvtuner.runner.protocol.ERROR_KINDS`;
    ``log_tail`` the last llama.cpp log / stderr lines."""

    def __init__(self, kind: str, message: str, log_tail: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.log_tail = tuple(log_tail)

    def __str__(self) -> str:
        return self.message


def _signal_name(returncode: int) -> str:
    if returncode >= 0:
        return ""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class EventClient:
    """What every engine client shares (the embedded runner child's :class:`RunnerClient`, the
    user's llama-server's :class:`~kvtuner.runner.server_run.ServerRunClient`): one process
    (``_proc``), a queue of the events it produced (``_events``), and reading them under one set of
    waiting rules (:func:`wait_for_event`). Subclasses give :meth:`send` and :meth:`stderr_tail`
    and set ``_WHO``, the engine a timeout names."""

    _WHO = "the runner"
    _proc: subprocess.Popen[bytes] | None
    _events: queue.Queue[P.Message]

    @property
    def pid(self) -> int | None:
        """The process id (None before it is started)."""
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self._proc is not None and self._proc.poll() is None

    def send(self, command: P.Message) -> None:
        """Hand ``command`` to the engine (each client its own way)."""
        raise NotImplementedError

    def stderr_tail(self) -> tuple[str, ...]:
        """The engine's last log lines."""
        raise NotImplementedError

    def next_event(self, timeout_s: float) -> P.Message:
        """The next event, waiting at most ``timeout_s`` seconds.

        Raises:
            RunnerError: ``timeout``.
        """
        try:
            return self._events.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            raise RunnerError("timeout", f"no event from {self._WHO} within {timeout_s:.0f} s") from None

    def wait_for(
        self,
        *types: type[P.Message],
        timeout_s: float,
        idle_timeout_s: float | None = None,
        on_other: Callable[[P.Message], None] | None = None,
    ) -> P.Message:
        """Read events until one of ``types``; others go to ``on_other`` (:func:`wait_for_event`).

        Raises:
            RunnerError: an :class:`ErrorEvent` arrived (its kind), the process exited
                (``crashed`` / ``out_of_memory`` / ``cancelled``), or a timeout (``timeout``).
        """
        return wait_for_event(
            self.next_event,
            self.stderr_tail,
            *types,
            timeout_s=timeout_s,
            idle_timeout_s=idle_timeout_s,
            on_other=on_other,
        )

    def request(
        self,
        command: P.Message,
        result: type[P.Message],
        *,
        timeout_s: float,
        idle_timeout_s: float | None = None,
        on_other: Callable[[P.Message], None] | None = None,
    ) -> P.Message:
        """:meth:`send` then :meth:`wait_for` ``result``."""
        self.send(command)
        return self.wait_for(result, timeout_s=timeout_s, idle_timeout_s=idle_timeout_s, on_other=on_other)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float = 5.0) -> int | None:
        """Stop the engine and reap it (each client its own way)."""
        raise NotImplementedError


class RunnerClient(EventClient):
    """One runner child process.

    Args:
        python: interpreter for the child (default: this one).
        env: extra environment variables for the child.
        on_event: called on the reader thread with every event (keep it quick).
        stderr_lines: how many of the child's last stderr lines to keep.

    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        *,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        on_event: Callable[[P.Message], None] | None = None,
        stderr_lines: int = 80,
    ) -> None:
        self._python = python
        self._extra_env = dict(env or {})
        self._on_event = on_event
        self._events: queue.Queue[P.Message] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=stderr_lines)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stop_requested = False
        self._busy = False
        self._idle = threading.Event()
        self._idle.set()
        self._exited = threading.Event()
        self._reader: threading.Thread | None = None
        self._err_reader: threading.Thread | None = None
        self.started: P.StartedEvent | None = None
        self.returncode: int | None = None

    # -- lifetime ----------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> P.StartedEvent:
        """Spawn the child and wait for its ``started`` event.

        Raises:
            RunnerError: the child could not start (``crashed``) or said nothing within
                ``timeout_s`` seconds (``timeout``; the child is killed).
        """
        if self._proc is not None:
            raise RuntimeError("runner already started")
        env = dict(os.environ)
        if not _frozen():
            root = str(Path(__file__).resolve().parents[2])  # the directory holding kvtuner/
            env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("GGML_NO_BACKTRACE", "1")  # no gdb attach on abort
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self._extra_env)
        try:
            self._proc = subprocess.Popen(
                child_command(self._python),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                close_fds=True,
                **(procs.group_popen_kwargs() if procs.WINDOWS else {}),
            )
        except OSError as exc:
            raise RunnerError("crashed", f"cannot start the runner ({self._python or sys.executable}): {exc}") from None
        self._reader = threading.Thread(target=self._read_events, name=f"runner-{self._proc.pid}-events", daemon=True)
        self._err_reader = threading.Thread(
            target=self._read_stderr, name=f"runner-{self._proc.pid}-stderr", daemon=True
        )
        self._err_reader.start()
        self._reader.start()
        try:
            ev = self.wait_for(P.StartedEvent, timeout_s=timeout_s)
        except RunnerError:
            self.kill()
            raise
        assert isinstance(ev, P.StartedEvent)
        self.started = ev
        return ev

    def stderr_tail(self) -> tuple[str, ...]:
        """The child's last stderr lines."""
        return tuple(self._stderr)

    def __enter__(self) -> RunnerClient:
        if self._proc is None:
            self.start()
        return self

    # -- commands ----------------------------------------------------------------------------

    def send(self, command: P.Message) -> None:
        """Write one command line to the child.

        Raises:
            RunnerError: ``crashed`` when the child is gone.
        """
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError("runner not started")
        if not isinstance(command, (P.CancelCommand, P.ShutdownCommand)):
            self._busy = True
            self._idle.clear()
        self.send_raw((P.encode(command) + "\n").encode("utf-8"))

    def send_raw(self, data: bytes) -> None:
        """Write bytes to the child's stdin as they are (tests use it for garbage lines)."""
        assert self._proc is not None and self._proc.stdin is not None
        with self._lock:
            try:
                self._proc.stdin.write(data)
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                raise RunnerError("crashed", "the runner is gone (its stdin is closed)", self.stderr_tail()) from None

    # -- stopping ----------------------------------------------------------------------------

    def cancel(self, grace_s: float = 3.0, term_grace_s: float = 3.0) -> str:
        """Stop the running command: a cancel request, then SIGTERM after ``grace_s`` seconds,
        then SIGKILL after ``term_grace_s`` more. Returns ``"idle"`` (nothing ran), ``"polite"``
        (the child stopped the command and lives on), ``"terminated"`` or ``"killed"``."""
        if not self.alive:
            return "idle"
        if self._idle.is_set():
            return "idle"
        try:
            self.send(P.CancelCommand())
        except RunnerError:
            pass
        if self._idle.wait(grace_s):
            return "polite"
        return self._terminate(term_grace_s)

    def _terminate(self, term_grace_s: float) -> str:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return "terminated"
        self._stop_requested = True
        procs.terminate_one(proc)  # SIGTERM; Windows: TerminateProcess of the child's tree
        if self._wait_exit(term_grace_s):
            return "terminated"
        procs.kill_tree(proc, group=False)
        self._wait_exit(10.0)
        return "killed"

    def _wait_exit(self, timeout_s: float) -> bool:
        assert self._proc is not None
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        self._exited.wait(max(timeout_s, 1.0))
        return True

    def kill(self) -> None:
        """SIGKILL the child at once and reap it."""
        if self._proc is None:
            return
        self._stop_requested = True
        if self._proc.poll() is None:
            procs.kill_tree(self._proc, group=False)
        self._wait_exit(10.0)
        self._close_pipes()

    def close(self, timeout_s: float = 5.0) -> int | None:
        """Ask the child to shut down, close its stdin, and make sure it is gone (SIGTERM, then
        SIGKILL). Returns its exit status. Safe to call twice."""
        proc = self._proc
        if proc is None:
            return None
        self._stop_requested = True
        if proc.poll() is None:
            try:
                self.send(P.ShutdownCommand())
            except RunnerError:
                pass
            try:
                assert proc.stdin is not None
                proc.stdin.close()
            except OSError:
                pass
            if not self._wait_exit(timeout_s):
                self._terminate(timeout_s)
        else:
            self._wait_exit(timeout_s)
        self._close_pipes()
        return proc.returncode

    def _close_pipes(self) -> None:
        assert self._proc is not None
        for stream in (self._proc.stdin,):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        for t in (self._reader, self._err_reader):
            if t is not None and t is not threading.current_thread():
                t.join(2.0)

    # -- reader threads ----------------------------------------------------------------------

    def _put(self, ev: P.Message) -> None:
        if isinstance(ev, TERMINAL_EVENTS) or (isinstance(ev, P.ErrorEvent) and ev.kind != "protocol_error"):
            self._busy = False
            self._idle.set()
        self._events.put(ev)
        if self._on_event is not None:
            try:
                self._on_event(ev)
            except Exception:  # a consumer's bug must not kill the reader
                pass

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for raw in iter(self._proc.stderr.readline, b""):
            self._stderr.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def _read_events(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            if not raw.strip():
                continue
            try:
                ev = P.decode_event(raw)
            except P.ProtocolError as exc:
                ev = P.ErrorEvent(kind="protocol_error", message=f"garbage from the runner: {exc}")
            self._put(ev)
        # stdout closed: the child is exiting; reap it (never leave a zombie)
        try:
            proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._err_reader is not None:
            self._err_reader.join(2.0)
        self.returncode = rc = proc.returncode
        requested = self._stop_requested
        if self._busy or not requested:
            self._put(self._exit_error(rc, requested))
        self._put(P.ExitedEvent(returncode=rc, signal_name=_signal_name(rc), requested=requested))
        self._exited.set()

    def _exit_error(self, rc: int, requested: bool) -> P.ErrorEvent:
        tail = self.stderr_tail()
        last = next((line for line in reversed(tail) if line.strip()), "")
        if requested:
            return P.ErrorEvent(kind="cancelled", message="the runner was stopped", log_tail=tail)
        if rc == -getattr(signal, "SIGKILL", 9):
            return P.ErrorEvent(
                kind="out_of_memory",
                message="the runner was killed by SIGKILL, most likely by the kernel's OOM killer (check dmesg); "
                "lower --ctx, --ngl or the KV cache type",
                log_tail=tail,
            )
        if rc < 0:
            detail = f": {last}" if last else ""
            return P.ErrorEvent(
                kind="crashed", message=f"the runner crashed ({_signal_name(rc)}){detail}", log_tail=tail
            )
        detail = f": {last}" if last else ""
        return P.ErrorEvent(
            kind="crashed", message=f"the runner exited unexpectedly with status {rc}{detail}", log_tail=tail
        )


def wait_for_event(
    next_event: Callable[[float], P.Message],
    stderr_tail: Callable[[], tuple[str, ...]],
    *types: type[P.Message],
    timeout_s: float,
    idle_timeout_s: float | None = None,
    on_other: Callable[[P.Message], None] | None = None,
) -> P.Message:
    """Read events with ``next_event(timeout_s)`` until one of ``types``; others go to ``on_other``.
    The waiting rules every engine client shares (the embedded runner's and llama-server's).

    ``timeout_s`` bounds the whole wait, ``idle_timeout_s`` the gap between two events.

    Raises:
        RunnerError: an :class:`ErrorEvent` arrived (its kind), the engine exited
            (``crashed`` / ``out_of_memory`` / ``cancelled``), or a timeout (``timeout``).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RunnerError("timeout", f"the runner did not finish within {timeout_s:.0f} s", stderr_tail())
        wait = min(left, idle_timeout_s) if idle_timeout_s else left
        try:
            ev = next_event(wait)
        except RunnerError:
            if idle_timeout_s and wait < left:
                raise RunnerError(
                    "timeout", f"the runner went silent for {idle_timeout_s:.0f} s", stderr_tail()
                ) from None
            raise RunnerError("timeout", f"the runner did not finish within {timeout_s:.0f} s", stderr_tail()) from None
        if isinstance(ev, types):
            return ev
        if isinstance(ev, P.ErrorEvent):
            raise RunnerError(ev.kind, ev.message, ev.log_tail)
        if isinstance(ev, P.ExitedEvent):
            raise RunnerError("crashed", f"the runner exited (status {ev.returncode})", stderr_tail())
        if on_other is not None:
            on_other(ev)
