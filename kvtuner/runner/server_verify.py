"""Verify a configuration with the llama.cpp build the user runs: their own ``llama-server``.

:func:`verify_with_engine` asks the selected engine (:mod:`kvtuner.runner.engines`) what a
configuration costs and returns the same :class:`~kvtuner.core.llama_report.DryRunResult` the
embedded dry run does:

- embedded engine: :func:`kvtuner.runner.dryrun.dry_run` (llama-cpp-python in the runner child);
- server engine, first choice (:data:`~kvtuner.core.llama_report.METHOD_SERVER`): llama-server is
  started with the exported command line (:func:`kvtuner.core.export.llama_server.render`), but
  ``--fit on`` and ``-lv 5``, on 127.0.0.1 and a free port, in its own process group. Before it
  loads any weight, ``--fit`` measures the configuration as given with a no-alloc load and
  context (common/fit.cpp ``common_get_device_memory_data_impl``: ``no_alloc``,
  ``LLAMA_LOAD_MODE_NONE``) and prints ``common_memory_breakdown_print``'s table (device rows
  ``total = free + (self = model + context + compute) + unaccounted``, a ``Host`` row, other
  buffer types), after the library's own ``llama_kv_cache: size = ...`` and ``sched_reserve:
  ... compute buffer size`` lines of that context (``-lv 5``: common/fit.cpp passes the library's
  log through undemoted only at debug verbosity). With ``-c`` and ``-ngl`` given, ``--fit``
  changes nothing before that table (it may only shrink an unset context or re-split unset
  layers, common/fit.cpp ``common_params_fit_impl`` steps 2-3). The process group is stopped
  (SIGTERM, then SIGKILL) as soon as the table is read, before the real load;
- server engine, fallback (:data:`~kvtuner.core.llama_report.METHOD_FIT_PRINT`) when the log ends
  without the table (an older build, a build without ``--fit``): ``llama-fit-params -m MODEL
  --fit off --fit-print on <same flags>`` (tools/fit-params, common/fit.cpp ``common_fit_print``:
  one ``<device> <model> <context> <compute>`` line per device, then ``Host``, integer MiB).
  Flags that tool does not take (``-np`` as a server slot count is taken; ``-kvu`` is
  server-only) are left out and named in the method.

Only the runner package starts llama.cpp; nothing here imports ``llama_cpp``.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.llama_report import METHOD_FIT_PRINT, METHOD_SERVER, DryRunResult, MemoryBreakdownRow, buffers_by_name
from ..core.plan.config import PlanConfig
from . import llama_log as L
from . import procs
from .dryrun import DryRunError, dry_run
from .engines import Engine, parse_flags
from .protocol import model_file_problem
from .structure_probe import collect_facts

#: llama-server's log verbosity for the probe: debug (5), the level at which common/fit.cpp lets
#: the library's own lines of its no-alloc context through (``common_fit_params`` log_level).
PROBE_VERBOSITY = "5"
#: Seconds a stopped llama-server gets after SIGTERM before SIGKILL.
STOP_GRACE_S = 1.0
#: What common/fit.cpp ``common_fit_params`` logs when its no-alloc probe throws (the model did
#: not load, the context was refused); llama-server then goes on to the real load.
FIT_FAILED = "encountered an error while trying to fit params"
#: Seconds to wait for another breakdown row after the ``Host`` row (the rows are printed in one
#: loop; only other buffer types can follow it).
ROW_IDLE_S = 0.1
#: Log lines kept for :attr:`DryRunResult.log_tail`.
TAIL_LINES = 60

#: common/log.cpp level letters -> ggml log levels (llama_log.LEVEL_*)
_LEVELS = {"I": L.LEVEL_INFO, "W": L.LEVEL_WARN, "E": L.LEVEL_ERROR, "D": L.LEVEL_DEBUG}


def verify_with_engine(
    engine: Engine,
    model_path: str | os.PathLike,
    config: PlanConfig,
    *,
    timeout_s: float = 30.0,
    split: Any = None,
    rpc: Sequence[str] = (),
) -> DryRunResult:
    """What ``engine`` reports for ``config`` on ``model_path``, without reading any weight.

    Args:
        engine: the embedded engine or a llama-server (:func:`kvtuner.runner.engines.resolve_engine`).
        model_path: the GGUF file (first part of a split model).
        config: the configuration, as exported to llama-server.
        timeout_s: bound on the whole verification (the process group is killed after it).
        split: ``-sm``/``-ts``/``-mg`` (:class:`~kvtuner.core.plan.placement.DeviceSplit`) for a
            server engine, None for llama.cpp's default.
        rpc: ``host:port`` of rpc-servers (``--rpc``) for a server engine.

    Returns:
        A :class:`DryRunResult` whose ``method``, ``engine`` and ``engine_build`` say how and by
        which build it was measured; for a server engine ``breakdown`` holds the rows as printed.

    Raises:
        DryRunError: ``model_error`` (missing or unloadable model), ``invalid_config``
            (llama.cpp refused the configuration, with its reason), ``timeout``, ``crashed``
            (no figures in the output; ``log_tail`` has its last lines).
    """
    if engine.kind != "server" or engine.server is None:
        result = dry_run(model_path, config, timeout_s=timeout_s)
        return replace(result, engine=engine.label)
    path = os.fspath(model_path)
    problem = model_file_problem(path)
    if problem:
        raise DryRunError("model_error", problem)
    deadline = time.monotonic() + timeout_s
    argv = server_argv(engine, path, config, split=split, rpc=rpc)
    tail: Sequence[str] = ()
    if not engine.flags or "--fit" in engine.flags:
        lines, finished = _run_until_breakdown(argv, deadline)
        rows = L.parse_breakdown(lines)
        if rows and finished:
            return _result(engine, lines, rows, METHOD_SERVER)
        _raise_refusal(lines)
        tail = lines[-TAIL_LINES:]
    if engine.fit_params is not None:
        return _fit_print(engine, argv, deadline)
    raise DryRunError(
        "crashed",
        f"{engine.server} printed no memory breakdown (is it older than llama.cpp's --fit?) "
        "and no llama-fit-params lies beside it",
        tuple(tail),
    )


def server_argv(
    engine: Engine,
    model_path: str,
    config: PlanConfig,
    *,
    port: int | None = None,
    split: Any = None,
    rpc: Sequence[str] = (),
) -> list[str]:
    """The command the probe starts: the exported llama-server command line
    (:func:`kvtuner.core.export.llama_server.render` with ``binary`` = the engine's server) with
    ``--fit on`` in place of ``--fit off``, ``-lv 5``, ``--host 127.0.0.1`` and a free port.

    Raises:
        DryRunError: ``invalid_config`` when the configuration cannot be exported.
    """
    from ..core.export import ExportError
    from ..core.export.llama_server import render

    def n_layer() -> int:
        from ..core.model.profile import ModelProfile

        return ModelProfile.from_gguf(Path(model_path)).n_layer

    gpu = next((d.name for d in engine.devices), "CUDA0")
    try:
        exported = render(
            Path(model_path), config, n_layer, binary=str(engine.server), gpu_buffer_type=gpu, split=split, rpc=rpc
        )
    except ExportError as exc:
        raise DryRunError("invalid_config", str(exc)) from None
    argv = list(exported.argv or ())
    for i in range(len(argv) - 1):
        if argv[i] == "--fit":
            argv[i + 1] = "on"
    return argv + ["-lv", PROBE_VERBOSITY, "--host", "127.0.0.1", "--port", str(port or _free_port())]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop ``proc`` and everything it started (:func:`kvtuner.runner.procs.stop_tree`: on POSIX
    SIGTERM to its process group, started with :func:`~kvtuner.runner.procs.group_popen_kwargs`,
    then SIGKILL after ``grace_s``; on Windows its process tree terminated, then killed); waits
    for ``proc``."""
    procs.stop_tree(proc, grace_s)


def _reader(stream, out: queue.Queue[str | None]) -> None:
    try:
        for raw in iter(stream.readline, b""):
            out.put(raw.decode("utf-8", "replace"))
    finally:
        out.put(None)


def _run_until_breakdown(argv: list[str], deadline: float, tables: int = 1) -> tuple[list[str], bool]:
    """Start ``argv`` in its own process group and read its merged output until the first
    ``tables`` memory breakdown tables are complete (a line after a table that is not a row),
    the process ends, or ``deadline`` passes; then stop the group. With a draft model (``-md``)
    the second table is the draft's (common/fit.cpp ``common_params_fit_impl``).

    Returns:
        ``(lines, finished)``: the lines read (without newlines; prefixes kept) and whether a
        complete table was read.

    Raises:
        DryRunError: ``crashed`` when the binary cannot be started, ``timeout``.
    """
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            **procs.group_popen_kwargs(),
        )
    except OSError as exc:
        raise DryRunError("crashed", f"cannot start {argv[0]}: {exc}") from None
    lines: list[str] = []
    out: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_reader, args=(proc.stdout, out), daemon=True)
    reader.start()
    inside = host_seen = finished = False
    timed_out = False
    done = 0
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            try:
                item = out.get(timeout=min(left, ROW_IDLE_S) if host_seen else left)
            except queue.Empty:
                if host_seen:  # the table's rows come in one burst: it is complete
                    done += 1
                    inside = host_seen = False
                    if done >= tables:
                        finished = True
                        break
                    continue
                timed_out = True
                break
            if item is None:
                break
            line = item.rstrip("\r\n")
            lines.append(line)
            if FIT_FAILED in line:  # the probe failed: what follows would be the real load
                break
            if L.is_breakdown_header(line):
                inside = True
            elif inside:
                row = L.parse_breakdown_row(line)
                if row is None:
                    done += 1
                    inside = host_seen = False
                    if done >= tables:
                        finished = True
                        break
                    continue
                host_seen = host_seen or row.kind == "host"
    finally:
        stop_process_group(proc)
        reader.join(timeout=5.0)
        if proc.stdout is not None:
            proc.stdout.close()
    if inside and not finished and not timed_out:
        finished = bool(L.parse_breakdown(lines))  # the table was the last thing it printed
    if timed_out and not finished:
        raise DryRunError(
            "timeout", f"{Path(argv[0]).name} printed no memory breakdown in time", tuple(lines[-TAIL_LINES:])
        )
    return lines, finished


def _levelled(lines: Sequence[str]) -> list[tuple[int, str]]:
    """(ggml level, line without prefix) for a tool's log lines; unprefixed lines are INFO."""
    out = []
    for raw in lines:
        clean = L._RE_ANSI.sub("", raw)
        text = L.strip_tool_prefix(clean)
        head = clean[: len(clean) - len(text)].strip()
        out.append((_LEVELS.get(head[-1:], L.LEVEL_INFO) if head else L.LEVEL_INFO, text))
    return out


def _records(lines: Sequence[str]) -> list[L.Record]:
    """The log records of the lines before the first breakdown table ends (the no-alloc context
    of ``--fit``; later lines belong to the real load, which is never waited for)."""
    recs: list[L.Record] = []
    inside = False
    for level, text in _levelled(lines):
        if L.is_breakdown_header(text):
            inside = True
            continue
        if inside:
            if L.parse_breakdown_row(text) is None:
                break
            continue
        rec = L.parse_line(text, level)
        if rec is not None:
            recs.append(rec)
    return recs


def _raise_refusal(lines: Sequence[str]) -> None:
    """Raise the first error llama.cpp logged that says the configuration or the model is bad."""
    for level, text in _levelled(lines):
        if level != L.LEVEL_ERROR:
            continue
        rec = L.parse_line(text, level)
        if isinstance(rec, L.LogError) and rec.kind in ("invalid_config", "model_error", "out_of_memory"):
            raise DryRunError(rec.kind, f"{rec.func}: {rec.message}", tuple(lines[-TAIL_LINES:]))
    for _level, text in _levelled(lines):
        if FIT_FAILED in text:
            reason = text.rpartition(": ")[2]
            kind = "model_error" if "load model" in reason else "invalid_config"
            raise DryRunError(
                kind, f"llama.cpp could not set up this configuration: {reason}", tuple(lines[-TAIL_LINES:])
            )
    for _level, text in _levelled(lines):
        # common/arg.cpp refuses unknown flags and bad values before anything is loaded
        if text.startswith("error: ") or "invalid argument" in text:
            raise DryRunError("invalid_config", text, tuple(lines[-TAIL_LINES:]))


def _row_key(row: MemoryBreakdownRow) -> str:
    """The buffer name a breakdown row is filed under: the device, ``CPU`` for the host row."""
    return "CPU" if row.kind == "host" else row.name


def _by_row(rows: Sequence[MemoryBreakdownRow], column: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        value = getattr(r, column)
        if value or r.kind != "buffer_type":
            out[_row_key(r)] = out.get(_row_key(r), 0.0) + float(value)
    return out


def _result(engine: Engine, lines: Sequence[str], rows: tuple[MemoryBreakdownRow, ...], method: str) -> DryRunResult:
    """A :class:`DryRunResult` from the breakdown ``rows`` and the log ``lines`` before them."""
    recs = _records(lines)
    build = f"llama.cpp b{engine.build}" if engine.build is not None else (engine.version_text or "llama.cpp")
    return L.dry_run_report(
        recs,
        compute_mib=buffers_by_name(recs, "compute") or _by_row(rows, "compute_mib"),
        model_mib=_by_row(rows, "model_mib"),
        kv_buffer_mib=_by_row(rows, "context_mib"),
        gpu_offload_supported=bool(engine.devices),
        devices=(*(d.name for d in engine.devices), "CPU"),
        llama_build=build,
        log_tail=tuple(L.strip_tool_prefix(x) for x in lines[-TAIL_LINES:]),
        structure_facts=collect_facts(recs),
        method=method,
        engine=engine.label,
        engine_build=engine.build,
        breakdown=rows,
    )


def _fit_params_flags(fit_params: Path) -> frozenset[str]:
    try:
        cp = subprocess.run(
            [str(fit_params), "--help"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=20.0,
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return parse_flags((cp.stdout or "") + (cp.stderr or ""))


#: flags of the exported command that take a value (the others are switches)
_SWITCHES = frozenset({"--swa-full", "-kvu", "--kv-unified", "-nkvo", "--no-kv-offload", "--cpu-moe"})


def _fit_print(engine: Engine, server_argv_: list[str], deadline: float) -> DryRunResult:
    """The fallback: ``llama-fit-params --fit off --fit-print on`` with the flags of the server
    command it takes.

    Raises:
        DryRunError: it failed or printed no rows.
    """
    assert engine.fit_params is not None
    known = _fit_params_flags(engine.fit_params)
    argv = [str(engine.fit_params)]
    dropped: list[str] = []
    args = server_argv_[1:]
    i = 0
    while i < len(args):
        flag = args[i]
        if flag in ("-lv", "--host", "--port", "--fit"):
            i += 2
            continue
        takes_value = flag not in _SWITCHES and i + 1 < len(args) and flag.startswith("-")
        group = args[i : i + 2] if takes_value else args[i : i + 1]
        if known and flag not in known:
            dropped.append(flag)
        else:
            argv += group
        i += len(group)
    argv += ["--fit", "off", "--fit-print", "on"]
    try:
        cp = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=max(deadline - time.monotonic(), 1.0),
            **procs.group_popen_kwargs(),
        )
    except subprocess.TimeoutExpired:
        raise DryRunError("timeout", "llama-fit-params printed nothing in time") from None
    except OSError as exc:
        raise DryRunError("crashed", f"cannot start {engine.fit_params}: {exc}") from None
    rows = L.parse_fit_print(cp.stdout or "")
    err_lines = (cp.stderr or "").splitlines()
    if not rows:
        _raise_refusal(err_lines)
        raise DryRunError(
            "crashed",
            f"llama-fit-params exited with {cp.returncode} and printed no estimate",
            tuple(err_lines[-TAIL_LINES:]),
        )
    method = METHOD_FIT_PRINT + (
        f" (without {', '.join(dropped)}: llama-fit-params does not take {'it' if len(dropped) == 1 else 'them'})"
        if dropped
        else ""
    )
    result = _result(engine, err_lines, rows, method)
    return result
