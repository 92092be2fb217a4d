"""Runs a bench without touching the GUI thread: a worker thread drives the engine (the
embedded runner child through :class:`kvtuner.runner.client.RunnerClient`, or the user's
llama-server through :class:`kvtuner.runner.server_run.ServerRunClient`: start, load, bench) and
every event lands, stamped with ``time.monotonic()``, in a queue that the window drains on its
timer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.plan.config import PlanConfig
from ..runner import protocol as P
from ..runner.bench import summarise_events
from ..runner.client import RunnerError
from ..runner.engines import Engine
from ..runner.server_run import make_client

log = logging.getLogger("kvtuner.gui")


@dataclass(frozen=True)
class BenchSettings:
    """The bench the Run button starts (llama-bench style): prompt tokens, generated tokens,
    repetitions, warm-up, and the limits in seconds for the whole run and between two events."""

    n_prompt: int = 256
    n_gen: int = 64
    repetitions: int = 2
    warmup: bool = False
    timeout_s: float = 900.0
    idle_timeout_s: float = 180.0
    n_threads: int | None = None  # CPU threads (None: the runner's default, the physical cores)


@dataclass(frozen=True)
class RunStarted:
    """The child is up (its process id)."""

    pid: int
    llama_build: str


@dataclass(frozen=True)
class RunFinished:
    """The run ended: ``ok`` (bench completed), ``stopped`` (the user stopped it), ``message``."""

    ok: bool
    stopped: bool
    message: str = ""
    #: the completed bench (:class:`kvtuner.runner.bench.BenchResult`), None unless ``ok``
    result: Any = None


class RunController:
    """One run at a time. :meth:`start` returns at once; :meth:`drain` hands over
    ``(t_s, event)`` pairs (runner protocol events plus :class:`RunStarted` / :class:`RunFinished`).

    Args:
        settings: the bench to run.
        sampler: a :class:`kvtuner.core.monitor.sampler.Sampler` to point at the child (RSS, VRAM).
        engine: the llama.cpp build that runs it (:class:`kvtuner.runner.engines.Engine`): a
            llama-server engine runs the exported command line of that server; None or the
            embedded engine the runner child. Settable between runs (:attr:`engine`).
    """

    def __init__(
        self, settings: BenchSettings | None = None, sampler: Any = None, engine: Engine | None = None
    ) -> None:
        self.settings = settings or BenchSettings()
        self.sampler = sampler
        #: the engine of the next run (None: the embedded runner)
        self.engine: Engine | None = engine
        self._events: queue.SimpleQueue[tuple[float, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._stop = threading.Event()
        self.pid: int | None = None

    @property
    def running(self) -> bool:
        """True from :meth:`start` until the worker thread has finished."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, model_path: Path, config: PlanConfig) -> bool:
        """Start a run; False if one is already running."""
        if self.running:
            return False
        self._stop.clear()
        self.pid = None
        self._thread = threading.Thread(
            target=self._work, args=(Path(model_path), config), name="kvtuner-gui-run", daemon=True
        )
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the run: cancel, then shut the child down (SIGTERM/SIGKILL if it does not
        listen). Returns at once; the work happens on a helper thread."""
        self._stop.set()
        client = self._client
        if client is None:
            return

        def _stop_child() -> None:
            try:
                client.cancel(grace_s=2.0, term_grace_s=2.0)
            finally:
                client.close(timeout_s=3.0)

        threading.Thread(target=_stop_child, name="kvtuner-gui-stop", daemon=True).start()

    def drain(self, limit: int = 5000) -> list[tuple[float, Any]]:
        """Events that arrived since the last call (at most ``limit``), oldest first."""
        out = []
        try:
            while len(out) < limit:
                out.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return out

    def wait(self, timeout_s: float) -> bool:
        """Wait for the worker to finish (tests, shutdown); True when it has."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.running

    # -- worker thread ---------------------------------------------------------------------------

    def _put(self, ev: Any) -> None:
        self._events.put((time.monotonic(), ev))

    def _work(self, model_path: Path, config: PlanConfig) -> None:
        s = self.settings
        ok, message, summary = False, "", None
        seen: list[Any] = []

        def on_event(ev: Any) -> None:
            if not isinstance(ev, (P.LogEvent, P.TokenEvent, P.PrefillProgressEvent)):
                seen.append(ev)  # buffers, KV caches, context: for the run's summary
            self._put(ev)

        client = make_client(
            self.engine,
            model_path=model_path.resolve(),
            config=config,
            n_threads=s.n_threads,
            on_event=on_event,
            stream=True,
        )
        self._client = client
        try:
            started = client.start(timeout_s=60.0)
            self.pid = client.pid
            if self.sampler is not None:
                self.sampler.set_pid(client.pid)
                self.sampler.reset_peaks()
            self._put(RunStarted(pid=int(client.pid or 0), llama_build=started.llama_build))
            if self._stop.is_set():
                raise RunnerError("cancelled", "stopped")
            loaded = client.request(
                P.LoadCommand(model_path=str(model_path.resolve()), config=config.to_dict(), n_threads=s.n_threads),
                P.LoadedEvent,
                timeout_s=s.timeout_s,
                idle_timeout_s=s.idle_timeout_s,
            )
            if self._stop.is_set():
                raise RunnerError("cancelled", "stopped")
            result = client.request(
                P.BenchCommand(n_prompt=s.n_prompt, n_gen=s.n_gen, repetitions=s.repetitions, warmup=s.warmup),
                P.BenchResultEvent,
                timeout_s=s.timeout_s,
                idle_timeout_s=s.idle_timeout_s,
            )
            ok = True
            try:
                summary = summarise_events(
                    model_path,
                    config,
                    n_prompt=s.n_prompt,
                    n_gen=s.n_gen,
                    n_depth=0,
                    repetitions=s.repetitions,
                    started=started,
                    loaded=loaded,
                    result=result,
                    events=seen,
                    sampler=self.sampler,
                )
            except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
                # the run itself succeeded; only its summary (for the library) is missing
                log.warning("no summary of the completed run: %s", exc)
                summary = None
        except RunnerError as exc:
            message = f"{exc.kind}: {exc.message}"
            if exc.kind == "timeout":  # made by the client, not an event: tell the window
                self._put(P.ErrorEvent(kind="timeout", message=exc.message))
        except Exception as exc:  # never let the worker die silently
            message = f"{type(exc).__name__}: {exc}"
            self._put(P.ErrorEvent(kind="crashed", message=message))
        finally:
            try:
                client.close(timeout_s=5.0)
            finally:
                if self.sampler is not None:
                    self.sampler.set_pid(None)
                self._client = None
                self._put(RunFinished(ok=ok, stopped=self._stop.is_set(), message=message, result=summary))
