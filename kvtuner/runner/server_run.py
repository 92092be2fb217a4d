"""Run and bench a configuration through the user's own ``llama-server``.

:class:`ServerRunClient` offers the part of :class:`kvtuner.runner.client.RunnerClient` that a
bench uses (:meth:`~ServerRunClient.start` -> :class:`~kvtuner.runner.protocol.StartedEvent`,
:meth:`~ServerRunClient.request` of a :class:`~kvtuner.runner.protocol.LoadCommand` ->
:class:`~kvtuner.runner.protocol.LoadedEvent` and of a
:class:`~kvtuner.runner.protocol.BenchCommand` -> :class:`~kvtuner.runner.protocol.BenchResultEvent`,
:meth:`~ServerRunClient.cancel`, :meth:`~ServerRunClient.close`, :attr:`~ServerRunClient.pid`,
``on_event``), so :func:`kvtuner.runner.bench.run_bench` and the desktop app's run controller take
either; :func:`make_client` picks one for an engine.

The server: the exported command line (:func:`kvtuner.core.export.export` ``"llama-server"``
with the engine's binary) plus ``--host 127.0.0.1 --port <free> --metrics -lv 4`` (and ``-t N``
when threads are given), started in its own process group. Verbosity 4 (common/log.h
``LOG_LEVEL_TRACE``) makes b11434 print what the embedded runner reads from llama.cpp's log:
the buffers, the KV caches, the context (``llama_context: n_ctx = ...``) and ``system_info:
n_threads = N`` (common/common.cpp ``common_params_get_system_info``, a trace line). The log
(stdout and stderr together) is followed on a thread and turned into the embedded runner's
events with :mod:`kvtuner.runner.llama_log`; the progress dots llama.cpp prints while loading
(src/llama.cpp, one per percent) become :class:`~kvtuner.runner.protocol.LoadProgressEvent`.
The model is loaded once ``GET /health`` answers 200 (tools/server/server.cpp starts the HTTP
server first and answers 503 while loading).

The bench, per repetition, like llama-bench and the embedded runner
(:meth:`kvtuner.runner.worker.Worker._cmd_bench`): random token ids as the prompt of
``POST /completion`` (tools/server/server-common.cpp ``tokenize_input_prompts`` takes a list of
ids), ``n_depth`` tokens filled first (``n_predict`` 0: the prompt is evaluated into the cache,
untimed), then the depth plus ``n_prompt`` new tokens with ``cache_prompt`` so only the new ones
are processed (timed), and ``n_gen`` decode steps (``n_predict`` = ``n_gen`` + 1: the first token
comes from the prompt's logits, tools/server/server-common.h ``server_slot_stats::n_gen_steps``),
greedy (``samplers`` top-k with ``top_k`` 1, ``temperature`` 0, ``ignore_eos``). Times are the
server's own ``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``, ``cache_n``;
``server_slot_stats::to_json``), measured inside the server, so HTTP adds nothing to them:
prefill = ``prompt_ms`` (the prompt and picking the first token), decode = ``predicted_ms``
(``n_gen`` decode steps). With ``stream`` the tokens arrive one by one (``timings_per_token``)
and become :class:`~kvtuner.runner.protocol.TokenEvent`; prompt progress
(``return_progress``) becomes :class:`~kvtuner.runner.protocol.PrefillProgressEvent`.

Stopping: SIGTERM to the process group, SIGKILL after a grace period. A watchdog process
(``python -m kvtuner.runner --watch-group PGID``) holds a pipe from this process and stops the
group when the pipe closes, so the server never outlives kvtuner, even when kvtuner is killed.

Failures are :class:`~kvtuner.runner.protocol.ErrorEvent` / :class:`RunnerError` with one line
that says what to change: ``out_of_memory`` (an allocation failed in the log),
``invalid_config`` (a flag the build does not accept: common/arg.cpp ``error: invalid
argument``; the port is taken: tools/server/server-http.cpp ``couldn't bind HTTP server
socket``; the binary is missing or not executable; the context was refused), ``model_error``
(tools/server/server-context.cpp ``failed to load model``), ``crashed`` (the server died on a
signal or exited; an unrequested SIGKILL names the kernel's OOM killer), ``cancelled``,
``timeout``.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.plan.config import ConfigError, PlanConfig
from . import llama_log as L
from . import protocol as P
from .client import TERMINAL_EVENTS, EventClient, RunnerClient, RunnerError, _frozen, _signal_name
from .engines import Engine
from .protocol import field_names as _field_names

#: Flags added to the exported command line (see module doc).
HOST = "127.0.0.1"
SERVER_EXTRA_FLAGS = ("--metrics", "-lv", "4")

#: Seconds between two ``/health`` polls while the model loads.
HEALTH_POLL_S = 0.2
#: Times a server is started again on another free port when its port was taken meanwhile.
PORT_RETRIES = 3
#: Argument of ``python -m kvtuner.runner`` that makes it the watchdog of a process group.
WATCH_ARGUMENT = "--watch-group"

_RE_INVALID_ARG = re.compile(r"error: invalid argument: (\S+)")
_RE_ARG_ERROR = re.compile(r"error while handling (?:argument|environment variable) \"?([^\":]+)\"?: (.*)")
_RE_BIND = re.compile(r"couldn't bind HTTP server socket")
_RE_MODEL_LOAD = re.compile(r"failed to load model|error loading model|exiting due to model loading error")
_RE_LOAD_REASON = re.compile(r"error loading model: (.*)")
_RE_CONTEXT = re.compile(r"failed to create context|failed to initialize the context|llama_init_from_model: (.*)")
_RE_SYSTEM_INFO = re.compile(r"system_info: n_threads = (\d+)(?: \(n_threads_batch = (\d+)\))?")
_RE_PRINT_INFO = re.compile(r"^print_info: (n_vocab|n_ctx_train|n_layer)\s+= (\d+)\s*$")
_RE_ERROR_WORD = re.compile(r"^error\b|\berror\b|failed|couldn't|cannot|abort", re.IGNORECASE)
_RE_WARN_WORD = re.compile(r"\bwarn(ing)?\b", re.IGNORECASE)
_RE_DOTS = re.compile(r"^\.+$")
# common/log.cpp common_log_entry::print with prefix (and timestamps): "[M.SS.mmm.uuu ]L <text>",
# L one of I W E D; builds without the prefix print the text alone
_RE_PREFIX = re.compile(r"^(?:\d+\.\d{2}\.\d{3}\.\d{3} )?([IWED]) (.*)$")
_PREFIX_LEVELS = {"I": "info", "W": "warn", "E": "error", "D": "debug"}
_LOG_TAIL_LINES = 120


def _peak_rss_bytes(pid: int) -> int:
    """Peak resident memory of ``pid`` in bytes: ``VmHWM`` of /proc/PID/status (Linux), else its
    resident memory now; 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    from ..core.hardware.host import process_rss_bytes

    return int(process_rss_bytes(pid) or 0)


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that was free a moment ago (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_command(
    engine: Engine,
    model_path: str | os.PathLike[str],
    config: PlanConfig,
    *,
    port: int,
    n_threads: int | None = None,
    model: Any = None,
) -> tuple[list[str], Any]:
    """The llama-server command line kvtuner runs and the export it comes from: the exported
    line (:func:`kvtuner.core.export.export` target ``llama-server`` with ``engine.server`` as the
    binary, the GPU buffer type of the engine's first device for a partial KV split) plus
    ``--host 127.0.0.1 --port PORT --metrics -lv 4`` and ``-t N`` when ``n_threads`` is given.

    Returns:
        (argv, :class:`kvtuner.core.export.ExportResult`).

    Raises:
        kvtuner.core.export.ExportError: the configuration cannot be written as a command line.
        ValueError: ``engine`` is not a server engine.
    """
    from ..core.export import export

    if engine.kind != "server" or engine.server is None:
        raise ValueError(f"not a llama-server engine: {engine.label}")
    gpu_buft = engine.devices[0].name if engine.devices else "CUDA0"
    result = export(
        "llama-server",
        os.path.abspath(os.fspath(model_path)),
        config,
        model=model,
        binary=str(engine.server),
        gpu_buffer_type=gpu_buft,
    )
    argv = list(result.argv or ()) + ["--host", HOST, "--port", str(int(port)), *SERVER_EXTRA_FLAGS]
    if n_threads is not None:
        argv += ["-t", str(int(n_threads))]
    return argv, result


def server_argv(
    engine: Engine,
    model_path: str | os.PathLike[str],
    config: PlanConfig,
    *,
    port: int,
    n_threads: int | None = None,
    model: Any = None,
) -> list[str]:
    """The argv of :func:`server_command`."""
    return server_command(engine, model_path, config, port=port, n_threads=n_threads, model=model)[0]


def watchdog_command(pgid: int) -> list[str]:
    """The argv of the watchdog (:func:`kvtuner.runner.watchdog.watch_group`) that stops process
    group ``pgid`` when its stdin closes."""
    if _frozen():
        from .client import RUNNER_ARGUMENT

        return [sys.executable, RUNNER_ARGUMENT, WATCH_ARGUMENT, str(pgid)]
    return [sys.executable, "-m", "kvtuner.runner", WATCH_ARGUMENT, str(pgid)]


class _ServerGone(Exception):
    """The server process ended while a request ran (its reader reports why)."""


class ServerRunClient(EventClient):
    """One llama-server run for one model and configuration.

    Args:
        engine: a server :class:`~kvtuner.runner.engines.Engine`.
        model_path, config: what the server loads; given here so :meth:`start` can start the
            server (its pid is then known to samplers from the start); a
            :class:`~kvtuner.runner.protocol.LoadCommand` with other values starts it again.
        n_threads: CPU threads (``-t``); None: llama-server's default (the physical cores).
        on_event: called with every event (from the log thread or the requesting thread; keep
            it quick).
        stream: stream the decoded tokens (:class:`~kvtuner.runner.protocol.TokenEvent`, prompt
            progress); False: one response per request, no token events.
        port: the TCP port on 127.0.0.1 (None: a free one, chosen again when it is taken).
        extra_args: more llama-server flags, appended to the command line as given.
        env: extra environment variables for the server.
        log_lines: how many of the server's last log lines to keep.
    """

    _WHO = "llama-server"

    def __init__(
        self,
        engine: Engine,
        model_path: str | os.PathLike[str] | None = None,
        config: PlanConfig | None = None,
        *,
        n_threads: int | None = None,
        on_event: Callable[[P.Message], None] | None = None,
        stream: bool = True,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_lines: int = _LOG_TAIL_LINES,
    ) -> None:
        self.engine = engine
        self._model_path = None if model_path is None else os.path.abspath(os.fspath(model_path))
        self._config = config
        self._n_threads = n_threads
        self._on_event = on_event
        self.stream = stream
        self._fixed_port = port
        self._extra_args = tuple(str(a) for a in extra_args)
        self.port: int | None = None
        self._extra_env = dict(env or {})
        self._events: queue.Queue[P.Message] = queue.Queue()
        self._tail: collections.deque[str] = collections.deque(maxlen=log_lines)
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop_requested = False
        self._cancel = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._busy = False
        self._exited = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self._records: list[L.Record] = []
        self._error_lines: list[str] = []
        self._info: dict[str, int] = {}
        self._n_threads_seen: int | None = None
        self._dots = 0
        self._t_spawn = 0.0
        self._t_context: float | None = None
        self._loaded: P.LoadedEvent | None = None
        self._context_ev: P.ContextEvent | None = None
        self._argv: list[str] = []
        self._experimental = False
        self._retries_left = PORT_RETRIES
        self._bind_failed = False
        self.started: P.StartedEvent | None = None
        self.returncode: int | None = None

    # -- lifetime ----------------------------------------------------------------------------

    def _check_binary(self) -> None:
        server = self.engine.server
        if self.engine.kind != "server" or server is None:
            raise RunnerError("invalid_config", f"{self.engine.label} is not a llama-server: choose a server engine")
        if not Path(server).exists():
            raise RunnerError(
                "invalid_config", f"llama-server not found: {server} (give the path of a llama-server binary)"
            )
        if not Path(server).is_file() or not os.access(server, os.X_OK):
            raise RunnerError(
                "invalid_config",
                f"llama-server is not an executable file: {server} (make it executable or give another binary)",
            )

    def start(self, timeout_s: float = 60.0) -> P.StartedEvent:
        """Check the binary, start the server when the model and configuration are known, and
        emit a :class:`~kvtuner.runner.protocol.StartedEvent` (``pid``: the server's, 0 when it
        is started by the load command). Returns at once (``timeout_s`` is there for the embedded
        client's signature: the load command waits for the model).

        Raises:
            RunnerError: ``invalid_config`` (binary missing or not executable, a configuration
                that cannot be written as a command line), ``model_error`` (model file missing).
        """
        if self.started is not None:
            raise RuntimeError("server run already started")
        try:
            self._check_binary()
            if self._model_path is not None and self._config is not None:
                self._spawn(self._model_path, self._config, self._n_threads)
        except RunnerError as exc:
            self._tell(exc)
            raise
        e = self.engine
        ev = P.StartedEvent(
            pid=int(self.pid or 0),
            protocol_version=P.PROTOCOL_VERSION,
            llama_build=e.label + (f", commit {e.commit}" if e.commit else ""),
            devices=tuple(d.name for d in e.devices) + ("CPU",),
            device_descriptions=tuple(d.description for d in e.devices) + ("CPU",),
            gpu_offload_supported=bool(e.devices),
            system_info="",
        )
        self.started = ev
        if self._on_event is not None:  # as the embedded runner's reader does; start() consumed it
            try:
                self._on_event(ev)
            except Exception:
                pass
        return ev

    @property
    def argv(self) -> list[str]:
        """The command line of the server started last."""
        return list(self._argv)

    def stderr_tail(self) -> tuple[str, ...]:
        """The server's last log lines."""
        return tuple(self._tail)

    def __enter__(self) -> ServerRunClient:
        if self.started is None:
            self.start()
        return self

    def _spawn(self, model_path: str, config: PlanConfig, n_threads: int | None) -> None:
        """Start llama-server (and its watchdog) for ``model_path``/``config``."""
        from ..core.export import ExportError

        problem = P.model_file_problem(model_path)
        if problem:
            raise RunnerError("model_error", problem)
        port = self._fixed_port or free_port()
        try:
            argv, exported = server_command(self.engine, model_path, config, port=port, n_threads=n_threads)
            argv += self._extra_args
        except (ExportError, ConfigError, ValueError) as exc:
            raise RunnerError("invalid_config", f"cannot write the llama-server command line: {exc}") from None
        self._reset_run_state()
        env = dict(os.environ)
        env.update(self._extra_env)
        env.setdefault("GGML_NO_BACKTRACE", "1")  # no gdb attach on abort
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            raise RunnerError(
                "invalid_config",
                f"cannot start {argv[0]}: {exc.strerror or exc} (give the path of a working llama-server binary)",
            ) from None
        self._proc, self._argv, self.port = proc, argv, port
        self._experimental = bool(exported.experimental)
        self._model_path, self._config, self._n_threads = model_path, config, n_threads
        self._t_spawn = time.perf_counter()
        self._start_watchdog(proc.pid)
        self._reader = threading.Thread(
            target=self._read_log, args=(proc,), name=f"llama-server-{proc.pid}-log", daemon=True
        )
        self._reader.start()

    def _start_watchdog(self, pgid: int) -> None:
        env = dict(os.environ)
        if not _frozen():
            root = str(Path(__file__).resolve().parents[2])  # the directory holding kvtuner/
            env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self._watchdog = subprocess.Popen(
                watchdog_command(pgid),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                close_fds=True,
                start_new_session=True,
            )
        except OSError:
            self._watchdog = None  # the server is still stopped by close(); only a killed kvtuner leaks it

    def _stop_watchdog(self) -> None:
        wd = self._watchdog
        if wd is None:
            return
        try:
            if wd.stdin is not None:
                wd.stdin.close()
        except OSError:
            pass
        try:
            wd.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            wd.kill()
            wd.wait()
        self._watchdog = None

    def _reset_run_state(self) -> None:
        self._tail.clear()
        self._records = []
        self._error_lines = []
        self._info = {}
        self._n_threads_seen = None
        self._dots = 0
        self._t_context = None
        self._loaded = None
        self._context_ev = None
        self._exited.clear()
        self._stop_requested = False
        self._bind_failed = False
        self.returncode = None

    # -- events ------------------------------------------------------------------------------

    def _put(self, ev: P.Message) -> None:
        if isinstance(ev, TERMINAL_EVENTS) or (isinstance(ev, P.ErrorEvent) and ev.kind != "protocol_error"):
            self._busy = False
            self._idle.set()
        self._events.put(ev)
        if self._on_event is not None:
            try:
                self._on_event(ev)
            except Exception:  # a consumer's bug must not kill the log reader or the bench
                pass

    def _drain(self) -> None:
        try:
            while True:
                self._events.get_nowait()
        except queue.Empty:
            pass

    def _tell(self, exc: RunnerError) -> None:
        """Show ``on_event`` the error of a call that raises it (nothing else reports it)."""
        if self._on_event is not None:
            try:
                self._on_event(P.ErrorEvent(kind=exc.kind, message=exc.message, log_tail=exc.log_tail))
            except Exception:
                pass

    def send(self, command: P.Message) -> None:
        """Start ``command`` (load or bench) on a worker thread; its events follow.

        Raises:
            RunnerError: a load that cannot start the server (see :meth:`start`); ``crashed``
                when the server is gone.
        """
        try:
            self._send(command)
        except RunnerError as exc:
            self._tell(exc)
            raise

    def _send(self, command: P.Message) -> None:
        if self.started is None:
            raise RuntimeError("server run not started")
        if isinstance(command, P.CancelCommand):
            self._cancel.set()
            self._abort_connection()
            return
        if isinstance(command, (P.ShutdownCommand, P.UnloadCommand)):
            self.close()
            if isinstance(command, P.UnloadCommand):
                self._put(P.UnloadedEvent())
            return
        if isinstance(command, P.LoadCommand):
            self._cancel.clear()
            try:
                config = PlanConfig.from_dict(dict(command.config))
            except (ConfigError, TypeError) as exc:
                raise RunnerError("invalid_config", f"bad configuration: {exc}") from None
            path = os.path.abspath(command.model_path)
            if (
                self._proc is None
                or (path, config, command.n_threads) != (self._model_path, self._config, self._n_threads)
                or self._proc.poll() is not None
            ):
                if self._proc is not None:
                    self._shutdown_server(3.0)
                    self._drain()  # the old server's exit, asked for: not this load's news
                self._spawn(path, config, command.n_threads)
            target: Callable[[], None] = self._do_load
        elif isinstance(command, P.BenchCommand):
            if not self.alive:
                raise RunnerError("crashed", "llama-server is not running: load the model first", self.stderr_tail())
            self._cancel.clear()
            target = lambda: self._do_bench(command)  # noqa: E731
        else:
            raise RunnerError("protocol_error", f"llama-server runs do not take {command.type} commands")
        self._busy = True
        self._idle.clear()
        self._worker = threading.Thread(target=self._guard, args=(target,), name="llama-server-request", daemon=True)
        self._worker.start()

    def _guard(self, target: Callable[[], None]) -> None:
        try:
            target()
        except _ServerGone:
            pass  # the log reader reports the exit
        except RunnerError as exc:
            self._put(P.ErrorEvent(kind=exc.kind, message=exc.message, log_tail=exc.log_tail or self.stderr_tail()))
        except Exception as exc:  # a bug here: report it, never die silently
            if not self.alive:
                return
            if self._cancel.is_set():
                self._put(P.ErrorEvent(kind="cancelled", message="llama-server request cancelled"))
                return
            self._put(
                P.ErrorEvent(
                    kind="crashed",
                    message=f"llama-server request failed: {type(exc).__name__}: {exc}",
                    log_tail=self.stderr_tail(),
                )
            )

    # -- load --------------------------------------------------------------------------------

    def _health(self) -> int:
        """HTTP status of ``GET /health`` (0 when nothing answers)."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=5.0)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            return int(resp.status)
        except (OSError, http.client.HTTPException):
            return 0
        finally:
            conn.close()

    def _do_load(self) -> None:
        """Wait for ``/health`` 200, then emit the context and :class:`LoadedEvent`."""
        proc = self._proc
        assert proc is not None
        while True:
            if self._cancel.is_set():
                raise RunnerError("cancelled", "model load cancelled")
            if proc.poll() is not None or self._exited.is_set():
                self._exited.wait(15.0)
                if self._bind_failed and self._model_path and self._config is not None:
                    # another process took the free port between the pick and the bind: pick again
                    self._retries_left -= 1
                    self._stop_watchdog()
                    self._spawn(self._model_path, self._config, self._n_threads)
                    proc = self._proc
                    assert proc is not None
                    continue
                raise _ServerGone()
            if self._health() == 200:
                break
            time.sleep(HEALTH_POLL_S)
        t_ready = time.perf_counter()
        if self._dots < 100:
            self._put(P.LoadProgressEvent(progress=1.0))
        t_ctx = self._t_context if self._t_context is not None else t_ready
        cfg = self._config or PlanConfig()
        self._context_ev = L.context_event(self._records, n_seq=cfg.n_seq, n_batch=cfg.n_batch, n_ubatch=cfg.n_ubatch)
        self._put(self._context_ev)
        n_threads = self._n_threads_seen or self._n_threads or 0
        if not n_threads:
            from ..core.hardware.host import physical_cores

            n_threads = physical_cores()  # llama-server's default (common/common.cpp cpu_get_num_math)
        self._loaded = P.LoadedEvent(
            load_s=t_ready - self._t_spawn,
            load_model_s=t_ctx - self._t_spawn,
            create_context_s=t_ready - t_ctx,
            n_layer=self._info.get("n_layer", 0),
            n_vocab=self._info.get("n_vocab", 0),
            n_ctx_train=self._info.get("n_ctx_train", 0),
            n_threads=n_threads,
            kv_split_experimental=self._experimental and bool(self.engine.devices),
        )
        self._put(self._loaded)

    # -- bench -------------------------------------------------------------------------------

    def _vocab_from_models(self) -> int:
        """``n_vocab`` of ``GET /v1/models`` (``data[0].meta``, tools/server), for builds whose
        log does not print it; 0 when it does not say."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=10.0)
        try:
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            doc = json.loads(resp.read()) if resp.status == 200 else {}
            return int(((doc.get("data") or [{}])[0].get("meta") or {}).get("n_vocab", 0))
        except (OSError, http.client.HTTPException, ValueError, TypeError, AttributeError):
            return 0
        finally:
            conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        """A new connection per request (the server may close one after a stream); kept so
        :meth:`cancel` can abort it."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = http.client.HTTPConnection(HOST, self.port, timeout=None)
            return self._conn

    def _abort_connection(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            conn.close()

    def _completion(self, body: dict, rep: int, on_token: Callable[[int, dict], None] | None = None) -> dict:
        """POST ``/completion`` and return the final response object (streamed or not).

        Raises:
            _ServerGone: the server died meanwhile.
            RunnerError: ``cancelled``; ``invalid_config`` for an error the server answered.
        """
        conn = self._connection()
        data = json.dumps(body).encode("utf-8")
        try:
            conn.request("POST", "/completion", body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read().decode("utf-8", "replace")
                try:
                    msg = json.loads(text).get("error", {}).get("message", text)
                except (ValueError, AttributeError):
                    msg = text
                raise RunnerError(
                    "invalid_config",
                    f"llama-server refused the bench request ({resp.status}): {msg}",
                    self.stderr_tail(),
                )
            if not body.get("stream"):
                return json.loads(resp.read())
            final: dict = {}
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    err = chunk["error"]
                    raise RunnerError(
                        "invalid_config",
                        f"llama-server stopped the bench: {err.get('message', err) if isinstance(err, dict) else err}",
                        self.stderr_tail(),
                    )
                if on_token is not None:
                    on_token(rep, chunk)
                if chunk.get("stop"):
                    final = chunk
                    break
                if self._cancel.is_set():
                    raise RunnerError("cancelled", "benchmark cancelled")
            if not final:  # the stream ended without its final chunk: the server went away
                raise http.client.IncompleteRead(b"", None)
            return final
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._abort_connection()
            if self._cancel.is_set():
                raise RunnerError("cancelled", "benchmark cancelled") from None
            if self._proc is not None and self._proc.poll() is None:
                # the server lives but the connection broke: give its log a moment, then say so
                time.sleep(0.5)
            if not self.alive:
                raise _ServerGone() from None
            raise RunnerError(
                "crashed", f"the connection to llama-server broke: {type(exc).__name__}: {exc}", self.stderr_tail()
            ) from None

    def _do_bench(self, cmd: P.BenchCommand) -> None:
        if self._loaded is None:
            raise RunnerError("invalid_config", "no model loaded: send a load command before bench")
        for name in ("n_prompt", "n_gen", "n_depth"):
            if int(getattr(cmd, name)) < 0:
                raise RunnerError("invalid_config", f"{name} must be 0 or more")
        if cmd.repetitions < 1:
            raise RunnerError("invalid_config", "repetitions must be 1 or more")
        ctx = self._context_ev
        n_ctx_seq = ctx.n_ctx_seq if ctx and ctx.n_ctx_seq else (ctx.n_ctx if ctx else 0)
        # the server refuses a prompt that fills the slot and stops generating at its end
        # (tools/server/server-context.cpp: "request (%d tokens) exceeds the available context size")
        need = cmd.n_depth + cmd.n_prompt + cmd.n_gen + 1
        if n_ctx_seq and need > n_ctx_seq:
            raise RunnerError(
                "invalid_config",
                f"the bench needs {need} tokens of context (depth {cmd.n_depth} + prompt {cmd.n_prompt} + gen "
                f"{cmd.n_gen} + 1) but a llama-server slot holds {n_ctx_seq}: raise --ctx or lower -d/-p/-n",
            )
        vocab = self._loaded.n_vocab or self._vocab_from_models()
        if vocab <= 0:
            raise RunnerError(
                "crashed",
                "llama-server did not print the vocabulary size (print_info: n_vocab); "
                "is it a llama.cpp build kvtuner knows?",
                self.stderr_tail(),
            )
        n_batch = ctx.n_batch if ctx and ctx.n_batch else 512
        rng = random.Random(cmd.seed)

        def rand_tokens(n: int) -> list[int]:
            return [rng.randrange(vocab) for _ in range(n)]

        def body(prompt: list[int], n_predict: int, cache: bool, stream: bool) -> dict:
            # id_slot 0: the depth filled by one request is found by the next one (server-context.cpp
            # get_available_slot would pick another idle slot by LRU with several slots)
            # greedy through the shortest sampler chain the server builds (common/sampling.cpp
            # common_sampler_init: logit bias, top-k 1, dist), the nearest to llama-bench, which samples nothing
            b: dict[str, Any] = {
                "prompt": prompt,
                "n_predict": n_predict,
                "cache_prompt": cache,
                "id_slot": 0,
                "samplers": ["top_k"],
                "top_k": 1,
                "temperature": 0.0,
                "ignore_eos": True,
                "seed": cmd.seed,
                "n_probs": 0,
                "stream": stream,
            }
            if stream:
                b.update(timings_per_token=True, return_progress=True)
            return b

        if cmd.warmup:  # llama-bench: one prompt batch and one generated token, untimed
            self._completion(
                body(rand_tokens(max(1, min(cmd.n_prompt, n_batch))), 2 if cmd.n_gen else 1, False, False), -1
            )
        reps: list[P.Repetition] = []
        last_timings: dict = {}
        for rep in range(cmd.repetitions):
            self._check_cancel()
            depth = rand_tokens(cmd.n_depth)
            if depth:
                self._completion(body(depth, 0, False, False), rep)
            self._check_cancel()
            prompt = rand_tokens(cmd.n_prompt) if cmd.n_prompt else []
            if not depth and not prompt:
                prompt = rand_tokens(1)  # the server needs a prompt: one token, not reported as prefill
            state = {"t_prev_s": 0.0, "index": 0}

            def on_token(r: int, chunk: dict, state: dict = state) -> None:
                progress = chunk.get("prompt_progress")
                if isinstance(progress, dict) and cmd.n_prompt:
                    done = int(progress.get("processed", 0)) - int(progress.get("cache", 0))
                    self._put(
                        P.PrefillProgressEvent(rep=r, n_done=max(0, min(done, cmd.n_prompt)), n_total=cmd.n_prompt)
                    )
                timings = chunk.get("timings") or {}
                for tok in chunk.get("tokens") or ():
                    n_decoded = int(chunk.get("tokens_predicted", 0))
                    if n_decoded <= 1:
                        continue  # the first token comes from the prompt's logits, not a decode step
                    t_s = float(timings.get("predicted_ms", 0.0)) / 1000.0
                    self._put(
                        P.TokenEvent(
                            rep=r, index=state["index"], token=int(tok), dt_s=max(t_s - state["t_prev_s"], 0.0), t_s=t_s
                        )
                    )
                    state["t_prev_s"] = t_s
                    state["index"] += 1

            stream = self.stream and bool(cmd.n_gen or cmd.n_prompt)
            final = self._completion(
                body(depth + prompt, cmd.n_gen + 1, bool(depth), stream), rep, on_token if stream else None
            )
            t = final.get("timings") or {}
            last_timings = t
            cache_n, prompt_n = int(t.get("cache_n", 0)), int(t.get("prompt_n", 0))
            # with sliding-window or recurrent layers the server restores the depth from its last
            # checkpoint, made 4 or n_ubatch + 4 tokens before the end of a prompt
            # (tools/server/server-context.cpp "create checkpoints that many tokens before the end"),
            # and processes the rest again: those tokens are timed with the prompt (prompt_n counts them)
            n_ubatch = ctx.n_ubatch if ctx and ctx.n_ubatch else 512
            if depth and cache_n < len(depth) - (n_ubatch + 4):
                raise RunnerError(
                    "invalid_config",
                    f"llama-server processed the {len(depth)} depth tokens again (it reused {cache_n}): its cache "
                    "cannot keep a prefix for this model (sliding-window or recurrent layers); bench with -d 0 or "
                    "--swa-full",
                    self.stderr_tail(),
                )
            prefill_s = float(t.get("prompt_ms", 0.0)) / 1000.0
            n_prompt = prompt_n if cmd.n_prompt else 0
            if n_prompt:
                self._put(
                    P.PrefillResultEvent(
                        rep=rep,
                        n_depth=cache_n,
                        n_tokens=n_prompt,
                        prefill_s=prefill_s,
                        tok_s=n_prompt / prefill_s if prefill_s > 0 else 0.0,
                    )
                )
            steps = max(int(t.get("predicted_n", 0)) - 1, 0)
            decode_s = float(t.get("predicted_ms", 0.0)) / 1000.0 if cmd.n_gen else 0.0
            rec = P.RepResultEvent(
                rep=rep,
                n_depth=cmd.n_depth,
                n_prompt=n_prompt,
                prefill_s=prefill_s if n_prompt else 0.0,
                n_gen=steps if cmd.n_gen else 0,
                decode_s=decode_s,
                ttft_s=prefill_s if n_prompt else 0.0,
            )
            self._put(rec)
            reps.append(P.Repetition.of({k: getattr(rec, k) for k in _field_names(rec)}))
        perf = {
            "t_p_eval_ms": float(last_timings.get("prompt_ms", 0.0)),
            "t_eval_ms": float(last_timings.get("predicted_ms", 0.0)),
            "n_p_eval": int(last_timings.get("prompt_n", 0)),
            "n_eval": int(last_timings.get("predicted_n", 0)),
            "cache_n": int(last_timings.get("cache_n", 0)),
        }
        pid = self.pid or 0
        self._put(
            P.BenchResultEvent(
                reps=tuple(reps),
                peak_rss_bytes=_peak_rss_bytes(pid) if pid else 0,
                n_threads=self._loaded.n_threads,
                perf=perf,
            )
        )

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise RunnerError("cancelled", "benchmark cancelled")
        if not self.alive:
            raise _ServerGone()

    # -- log ---------------------------------------------------------------------------------

    def _read_log(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                self._on_line(raw.decode("utf-8", "replace"))
            self._on_partial(buf.decode("utf-8", "replace"))
        if buf:
            self._on_line(buf.decode("utf-8", "replace"))
        try:
            proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:
            proc.stdout.close()
        except OSError:
            pass
        self.returncode = rc = proc.returncode
        requested = self._stop_requested
        if (
            proc is self._proc
            and not requested
            and self._fixed_port is None
            and self._retries_left > 0
            and _RE_BIND.search("\n".join(self._tail))
        ):
            self._bind_failed = True  # the load starts it again on another port (_do_load)
        elif proc is self._proc:
            self._abort_connection()
            if self._busy or not requested:
                self._put(self._exit_error(rc, requested))
            self._put(P.ExitedEvent(returncode=rc, signal_name=_signal_name(rc), requested=requested))
        self._exited.set()

    def _on_partial(self, text: str) -> None:
        """The progress dots llama.cpp prints while loading, before their line ends."""
        stripped = text.strip()
        if stripped and _RE_DOTS.match(stripped) and len(stripped) != self._dots:
            self._dots = len(stripped)
            self._put(P.LoadProgressEvent(progress=round(min(self._dots / 100.0, 1.0), 4)))

    def _on_line(self, line: str) -> None:
        line = line.rstrip("\r")
        text = line.strip()
        if not text:
            return
        if _RE_DOTS.match(text):
            self._on_partial(text)
            return
        if text.startswith("."):  # the dots ran into the next line
            self._on_partial(text[: len(text) - len(text.lstrip("."))])
            line = line.lstrip(".")
        if m := _RE_PREFIX.match(line):
            level, line = _PREFIX_LEVELS[m.group(1)], m.group(2)
        else:
            level = "error" if _RE_ERROR_WORD.search(line) else ("warn" if _RE_WARN_WORD.search(line) else "info")
        self._tail.append(line)
        if level == "error":
            self._error_lines.append(line.strip())
        if level == "debug":
            return
        self._put(P.LogEvent(level=level, text=line))
        if m := _RE_SYSTEM_INFO.search(line):
            self._n_threads_seen = int(m.group(1))
        if m := _RE_PRINT_INFO.match(line):
            self._info[m.group(1)] = int(m.group(2))
        rec = L.parse_line(line, L.LEVEL_ERROR if level == "error" else L.LEVEL_INFO)
        if rec is None:
            return
        self._records.append(rec)
        ev = L.record_event(rec)
        if ev is not None:
            self._put(ev)
        elif isinstance(rec, L.ContextParam) and self._t_context is None:
            self._t_context = time.perf_counter()

    def _exit_error(self, rc: int, requested: bool) -> P.ErrorEvent:
        """The one-line reason the server ended (see module doc)."""
        tail = self.stderr_tail()
        text = "\n".join(tail)
        label = self.engine.label
        if requested:
            return P.ErrorEvent(kind="cancelled", message="llama-server was stopped", log_tail=tail)
        if m := _RE_INVALID_ARG.search(text):
            return P.ErrorEvent(
                kind="invalid_config",
                log_tail=tail,
                message=(
                    f"{label} does not accept '{m.group(1)}': use a newer llama.cpp build (kvtuner writes command lines "
                    "for b11434) or another engine"
                ),
            )
        if m := _RE_ARG_ERROR.search(text):
            return P.ErrorEvent(
                kind="invalid_config",
                log_tail=tail,
                message=f"{label} refused '{m.group(1)}' ({m.group(2).strip()}): check its value",
            )
        if _RE_BIND.search(text):
            return P.ErrorEvent(
                kind="invalid_config",
                log_tail=tail,
                message=(f"port {self.port} on {HOST} is in use: stop what holds it or pick another port"),
            )
        oom = next((ln.strip() for ln in tail if L.OOM_PATTERN.search(ln)), "")
        if oom and rc != 0:
            return P.ErrorEvent(
                kind="out_of_memory",
                log_tail=tail,
                message=(f"out of memory in llama-server: {oom} (lower --ctx, --ngl or the KV cache type)"),
            )
        if _RE_MODEL_LOAD.search(text) and rc != 0 and rc != -signal.SIGKILL:
            # the first error line says most (gguf_init_from_reader: failed to read key-value pairs)
            reason = next((ln for ln in self._error_lines if not _RE_MODEL_LOAD.search(ln)), "") or next(
                (m.group(1) for ln in tail if (m := _RE_LOAD_REASON.search(ln))), ""
            )
            return P.ErrorEvent(
                kind="model_error",
                log_tail=tail,
                message=(
                    f"llama-server could not load {self._model_path}"
                    + (f": {reason}" if reason else "")
                    + " (check the file, or use a llama.cpp build that knows this model)"
                ),
            )
        if _RE_CONTEXT.search(text) and rc > 0:
            last = next((ln.strip() for ln in reversed(tail) if _RE_ERROR_WORD.search(ln)), "")
            return P.ErrorEvent(
                kind="invalid_config",
                log_tail=tail,
                message=f"llama-server refused the context: {last} (change --ctx, -ub or the KV types)",
            )
        last = next((ln.strip() for ln in reversed(tail) if ln.strip()), "")
        detail = f": {last}" if last else ""
        if rc == -signal.SIGKILL:
            return P.ErrorEvent(
                kind="crashed",
                log_tail=tail,
                message=(
                    "llama-server was killed (SIGKILL) without kvtuner asking: the kernel's OOM killer does this when RAM "
                    "runs out (check dmesg); lower --ctx, --ngl or the KV cache type"
                ),
            )
        if rc < 0:
            return P.ErrorEvent(
                kind="crashed", log_tail=tail, message=f"llama-server crashed ({_signal_name(rc)}){detail}"
            )
        return P.ErrorEvent(kind="crashed", log_tail=tail, message=f"llama-server exited with status {rc}{detail}")

    # -- stopping ----------------------------------------------------------------------------

    def cancel(self, grace_s: float = 3.0, term_grace_s: float = 3.0) -> str:
        """Stop the running request: abort its HTTP connection (the server drops the task), then
        SIGTERM the server after ``grace_s`` seconds, SIGKILL after ``term_grace_s`` more.
        Returns ``"idle"``, ``"polite"`` (the server lives on), ``"terminated"`` or ``"killed"``."""
        if not self.alive or self._idle.is_set():
            return "idle"
        self._cancel.set()
        self._abort_connection()
        if self._idle.wait(grace_s):
            return "polite"
        return self._terminate(term_grace_s)

    def _terminate(self, term_grace_s: float) -> str:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return "terminated"
        self._stop_requested = True
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        if self._wait_exit(term_grace_s):
            return "terminated"
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._wait_exit(10.0)
        return "killed"

    def _wait_exit(self, timeout_s: float) -> bool:
        proc = self._proc
        assert proc is not None
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        self._exited.wait(max(timeout_s, 1.0))
        return True

    def _shutdown_server(self, timeout_s: float) -> None:
        self._stop_requested = True
        self._abort_connection()
        if self._proc is not None and self._proc.poll() is None:
            self._terminate(timeout_s)
        elif self._proc is not None:
            self._wait_exit(timeout_s)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(5.0)
        self._stop_watchdog()

    def kill(self) -> None:
        """SIGKILL the server's process group at once and reap it."""
        if self._proc is None:
            return
        self._stop_requested = True
        self._abort_connection()
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._wait_exit(10.0)
        self._stop_watchdog()

    def close(self, timeout_s: float = 5.0) -> int | None:
        """Stop the server (SIGTERM to its group, SIGKILL after ``timeout_s``), reap it and its
        watchdog. Returns its exit status. Safe to call twice."""
        proc = self._proc
        if proc is None:
            return None
        self._cancel.set()
        self._shutdown_server(timeout_s)
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout_s)
        return proc.returncode


def make_client(
    engine: Engine | None,
    *,
    model_path: str | os.PathLike[str] | None = None,
    config: PlanConfig | None = None,
    n_threads: int | None = None,
    on_event: Callable[[P.Message], None] | None = None,
    env: Mapping[str, str] | None = None,
    stream: bool = True,
) -> RunnerClient | ServerRunClient:
    """The client that runs a bench on ``engine``: a :class:`ServerRunClient` for a server engine,
    the embedded runner's :class:`RunnerClient` for None or the embedded engine (``model_path``,
    ``config``, ``n_threads`` and ``stream`` only matter to the server)."""
    if engine is None or engine.kind != "server":
        return RunnerClient(env=env, on_event=on_event)
    return ServerRunClient(engine, model_path, config, n_threads=n_threads, on_event=on_event, env=env, stream=stream)
