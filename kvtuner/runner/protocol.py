"""The runner's wire protocol: versioned JSON lines, one message per line.

Commands go parent -> child on the child's stdin; events go child -> parent on the child's
stdout. Every line is a JSON object with ``"v"`` (:data:`PROTOCOL_VERSION`) and ``"type"``
(the message's :attr:`type` name) plus the dataclass fields below. Unknown fields are
ignored (a newer minor peer may add some); a missing field, a wrong version or a line that is
not JSON raises :class:`ProtocolError`.

Units are in the field names: ``_s`` seconds, ``_mib`` MiB (as llama.cpp prints them),
``_bytes`` bytes, ``tok_s`` tokens per second.

Error kinds (:attr:`ErrorEvent.kind`):

- ``out_of_memory``: a device or host allocation failed, or the child was SIGKILLed
  without kvtuner asking (the kernel's OOM killer).
- ``invalid_config``: llama.cpp refused the context (its reason is in the message).
- ``model_error``: the model file is missing, unreadable or not loadable.
- ``crashed``: the child aborted (GGML_ASSERT, ``abort()``) or died on a signal; the message
  carries the last log lines.
- ``cancelled``: the parent cancelled the command.
- ``timeout``: the child did not answer in time (made by the client).
- ``protocol_error``: a line that is not a valid message.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..core.llama_report import BufferReport, DryRunResult, JsonRecord, KvCacheReport
from ..core.speed.measurement import Repetition

#: Major version of the protocol; a peer with another major version is refused.
PROTOCOL_VERSION = 1

ERROR_KINDS = ("out_of_memory", "invalid_config", "model_error", "crashed", "cancelled", "timeout", "protocol_error")


def model_file_problem(path: str) -> str | None:
    """Why ``path`` cannot be loaded as a model file (the message of a ``model_error``), or None.

    Checked by the parent before it spawns a child (a dry-run) and by the worker before it
    hands the path to llama.cpp, with the same words.
    """
    import os

    if not os.path.exists(path):
        return f"model file not found: {path}"
    if not os.path.isfile(path):
        return f"model path is not a file: {path}"
    if not os.access(path, os.R_OK):
        return f"model file is not readable (permission denied): {path}"
    return None


class ProtocolError(ValueError):
    """A line that is not a valid message of this protocol version."""


@dataclass(frozen=True)
class Message:
    """Base of all messages; subclasses set :attr:`type`."""

    type: ClassVar[str] = ""


# ----------------------------------------------------------------------------------------------
# commands (parent -> child)


@dataclass(frozen=True)
class DryRunCommand(Message):
    """Load ``model_path`` with ``no_alloc`` (nothing allocated) for ``config``
    (:meth:`PlanConfig.to_dict`) and answer with a :class:`DryRunResultEvent`."""

    type: ClassVar[str] = "dry_run"
    model_path: str
    config: dict


@dataclass(frozen=True)
class LoadCommand(Message):
    """Load ``model_path`` and create a context for ``config`` (PlanConfig dict).

    ``n_threads``: CPU threads for decoding (None: the number of physical cores).
    Answered by :class:`LoadedEvent` (after progress, buffer and KV events) or an error."""

    type: ClassVar[str] = "load"
    model_path: str
    config: dict
    n_threads: int | None = None


@dataclass(frozen=True)
class BenchCommand(Message):
    """Benchmark the loaded model like llama-bench: per repetition, clear the KV cache, fill
    ``n_depth`` tokens (untimed), prefill ``n_prompt`` tokens (timed), then decode ``n_gen``
    tokens one at a time (timed, greedy). A warm-up pass runs first when ``warmup``.
    Answered by :class:`BenchResultEvent`."""

    type: ClassVar[str] = "bench"
    n_prompt: int = 512
    n_gen: int = 128
    n_depth: int = 0
    repetitions: int = 3
    warmup: bool = True
    seed: int = 42


@dataclass(frozen=True)
class UnloadCommand(Message):
    """Free the context and model; answered by :class:`UnloadedEvent`."""

    type: ClassVar[str] = "unload"


@dataclass(frozen=True)
class CancelCommand(Message):
    """Politely stop the running command (load, bench) at its next check point."""

    type: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class ShutdownCommand(Message):
    """Free everything and exit with status 0."""

    type: ClassVar[str] = "shutdown"


# ----------------------------------------------------------------------------------------------
# events (child -> parent)


@dataclass(frozen=True)
class StartedEvent(Message):
    """The child is ready. ``devices``: ggml backend devices (``"CPU"``, ``"CUDA0"`` ...);
    ``device_descriptions`` their descriptions; ``gpu_offload_supported``:
    ``llama_supports_gpu_offload()``; ``llama_build``: llama-cpp-python version and the
    vendored llama.cpp build; ``system_info``: ``llama_print_system_info()``."""

    type: ClassVar[str] = "started"
    pid: int
    protocol_version: int
    llama_build: str
    devices: tuple[str, ...]
    device_descriptions: tuple[str, ...]
    gpu_offload_supported: bool
    system_info: str = ""


@dataclass(frozen=True)
class LogEvent(Message):
    """One whole llama.cpp log line (INFO, WARN or ERROR level; DEBUG is not sent)."""

    type: ClassVar[str] = "log"
    level: str
    text: str


@dataclass(frozen=True)
class LoadProgressEvent(Message):
    """Model weights loading, ``progress`` 0..1 (llama.cpp ``progress_callback``)."""

    type: ClassVar[str] = "load_progress"
    progress: float


@dataclass(frozen=True)
class BufferEvent(Message):
    """A buffer llama.cpp reported (:class:`~kvtuner.core.llama_report.BufferReport`: model, KV,
    compute or output, its buffer name and MiB as printed)."""

    type: ClassVar[str] = "buffer"
    buffer: BufferReport


@dataclass(frozen=True)
class KvCacheEvent(Message):
    """One KV cache llama.cpp set up (:class:`~kvtuner.core.llama_report.KvCacheReport`)."""

    type: ClassVar[str] = "kv_cache"
    cache: KvCacheReport


@dataclass(frozen=True)
class ContextEvent(Message):
    """The context as llama.cpp set it up (after padding ``n_ctx`` to 256 and resolving
    flash attention; ``flash_attn`` None when llama.cpp did not say)."""

    type: ClassVar[str] = "context"
    n_ctx: int
    n_ctx_seq: int
    n_seq_max: int
    n_batch: int
    n_ubatch: int
    flash_attn: bool | None
    kv_unified: bool


@dataclass(frozen=True)
class LoadedEvent(Message):
    """Model and context are ready. ``load_s`` = ``load_model_s`` + ``create_context_s``
    (wall clock). ``kv_split_experimental``: tensor overrides placed part of the KV on the host
    (0 < kv_gpu_layers < offloaded layers; unverified on a GPU). ``warnings``: notes for the user."""

    type: ClassVar[str] = "loaded"
    load_s: float
    load_model_s: float
    create_context_s: float
    n_layer: int
    n_vocab: int
    n_ctx_train: int
    n_threads: int
    kv_split_experimental: bool = False
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DryRunResultEvent(Message):
    """What llama.cpp reported for a ``no_alloc`` load (:class:`~kvtuner.core.llama_report.DryRunResult`)."""

    type: ClassVar[str] = "dry_run_result"
    result: DryRunResult


@dataclass(frozen=True)
class PrefillProgressEvent(Message):
    """``n_done`` of ``n_total`` prompt tokens processed in repetition ``rep`` (-1: warm-up)."""

    type: ClassVar[str] = "prefill_progress"
    rep: int
    n_done: int
    n_total: int


@dataclass(frozen=True)
class PrefillResultEvent(Message):
    """Prefill of ``n_tokens`` at depth ``n_depth`` took ``prefill_s`` seconds (wall clock,
    synchronised)."""

    type: ClassVar[str] = "prefill_result"
    rep: int
    n_depth: int
    n_tokens: int
    prefill_s: float
    tok_s: float


@dataclass(frozen=True)
class TokenEvent(Message):
    """Token number ``index`` (0-based) of repetition ``rep`` was decoded in ``dt_s`` seconds;
    ``t_s`` is seconds since the decode phase began. ``token`` is the token id."""

    type: ClassVar[str] = "token"
    rep: int
    index: int
    token: int
    dt_s: float
    t_s: float


@dataclass(frozen=True)
class RepResultEvent(Repetition, Message):
    """One repetition as it ends: the :class:`~kvtuner.core.speed.measurement.Repetition` record
    (prefill and decode times in seconds, ``ttft_s`` time to first token: prefill plus picking
    the first token)."""

    type: ClassVar[str] = "rep_result"


@dataclass(frozen=True)
class BenchResultEvent(Message):
    """All repetitions and the child's own peak RSS in bytes (``getrusage`` ru_maxrss).
    ``perf``: ``llama_perf_context`` of the last repetition (t_load_ms, t_p_eval_ms, t_eval_ms,
    n_p_eval, n_eval)."""

    type: ClassVar[str] = "bench_result"
    reps: tuple[Repetition, ...]
    peak_rss_bytes: int
    n_threads: int
    perf: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "reps", tuple(Repetition.of(r) for r in self.reps))
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None


@dataclass(frozen=True)
class UnloadedEvent(Message):
    """Model and context freed."""

    type: ClassVar[str] = "unloaded"


@dataclass(frozen=True)
class ErrorEvent(Message):
    """A command failed. ``kind``: one of :data:`ERROR_KINDS`; ``message`` one line saying what
    happened and, where possible, what to change; ``log_tail`` the last llama.cpp log lines."""

    type: ClassVar[str] = "error"
    kind: str
    message: str
    log_tail: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExitedEvent(Message):
    """The child process is gone (made by the client after reaping it). ``returncode`` as
    :attr:`subprocess.Popen.returncode` (negative: killed by that signal); ``signal_name``
    e.g. ``"SIGKILL"`` or ``""``; ``requested``: the parent asked it to stop."""

    type: ClassVar[str] = "exited"
    returncode: int
    signal_name: str = ""
    requested: bool = False


COMMANDS: dict[str, type[Message]] = {
    c.type: c for c in (DryRunCommand, LoadCommand, BenchCommand, UnloadCommand, CancelCommand, ShutdownCommand)
}
EVENTS: dict[str, type[Message]] = {
    e.type: e
    for e in (
        StartedEvent,
        LogEvent,
        LoadProgressEvent,
        BufferEvent,
        KvCacheEvent,
        ContextEvent,
        LoadedEvent,
        DryRunResultEvent,
        PrefillProgressEvent,
        PrefillResultEvent,
        TokenEvent,
        RepResultEvent,
        BenchResultEvent,
        UnloadedEvent,
        ErrorEvent,
        ExitedEvent,
    )
}


def field_names(obj: Any) -> tuple[str, ...]:
    """Names of a dataclass's fields (instance or class), ClassVars excluded."""
    return tuple(f.name for f in dataclasses.fields(obj))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (JsonRecord, DryRunResult)):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def encode(message: Message) -> str:
    """One JSON line (without newline) for ``message``."""
    body = {"v": PROTOCOL_VERSION, "type": message.type}
    for f in dataclasses.fields(message):
        body[f.name] = _jsonable(getattr(message, f.name))
    return json.dumps(body, separators=(",", ":"), allow_nan=False)


_HINTS_CACHE: dict[type, dict[str, Any]] = {}


def _decode(line: str | bytes, registry: dict[str, type[Message]]) -> Message:
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("not UTF-8 text") from None
    text = line.strip()
    if len(text) > 1 << 22:
        raise ProtocolError(f"line of {len(text)} characters is too long")
    try:
        body = json.loads(text)
    except ValueError:
        raise ProtocolError(f"not a JSON message: {text[:80]!r}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"not a JSON object: {text[:80]!r}")
    if body.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {body.get('v')!r}, expected {PROTOCOL_VERSION}")
    type_name = body.get("type")
    cls = registry.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {body.get('type')!r}")
    hints = _HINTS_CACHE.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS_CACHE[cls] = hints
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in body:
            value = body[f.name]
            hint = hints[f.name]
            if isinstance(value, list) and typing.get_origin(hint) is tuple:
                value = tuple(value)
            elif isinstance(hint, type) and issubclass(hint, (JsonRecord, DryRunResult)):
                try:
                    value = hint.from_json(value)
                except (ValueError, TypeError) as exc:
                    raise ProtocolError(f"{cls.type} message: {exc}") from None
            kwargs[f.name] = value
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{cls.type} message lacks field '{f.name}'")
    return cls(**kwargs)


def decode_command(line: str | bytes) -> Message:
    """Parse a command line. Raises :class:`ProtocolError`."""
    return _decode(line, COMMANDS)


def decode_event(line: str | bytes) -> Message:
    """Parse an event line. Raises :class:`ProtocolError`."""
    return _decode(line, EVENTS)
