"""Parse llama.cpp log lines into structured records.

What a load reports (caches, recurrent state, buffers, offloaded layers, graph, memory
breakdown) is typed once in :mod:`kvtuner.core.llama_report`; the records only the runner reads
(per-layer structure lines, context parameters, errors) are defined here.

Pure Python (no ``llama_cpp`` import): the worker feeds it the lines its own
``llama_log_set`` callback receives, and the parent can parse a saved log the same way.

Every pattern below copies a printf format from the llama.cpp vendored by
llama-cpp-python 0.3.36 (commit 0c1e570); the source is named next to each.
MiB figures are printed with two decimals (``%8.2f``), so values parsed here carry a
rounding error of up to 0.005 MiB; sizes that must be exact come from the planner.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.llama_report import (
    BufferReport,
    DryRunResult,
    GraphReport,
    KvCacheReport,
    MemoryBreakdownRow,
    OffloadedLayers,
    RecurrentStateReport,
    buffers_by_name,
)
from ..core.plan.buffers import buffer_device

if TYPE_CHECKING:  # pragma: no cover
    from .protocol import ContextEvent, Message

#: ``enum ggml_log_level`` (ggml/include/ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4,
#: CONT 5. (llama-cpp-python's _logger.py maps them off by one and hides errors.)
LEVEL_NONE, LEVEL_DEBUG, LEVEL_INFO, LEVEL_WARN, LEVEL_ERROR, LEVEL_CONT = range(6)
LEVEL_NAMES = {0: "none", 1: "debug", 2: "info", 3: "warn", 4: "error", 5: "cont"}


@dataclass(frozen=True)
class KvLayer:
    """DEBUG ``llama_kv_cache: layer %3d: dev = %s`` (llama-kv-cache.cpp constructor): layer ``il``
    has its own K/V tensors in the cache being built, on device ``dev``."""

    il: int
    dev: str


@dataclass(frozen=True)
class KvReuse:
    """DEBUG ``llama_kv_cache: - layer %3d: reuse layer %d, is_swa = %d`` (llama-kv-cache.cpp
    constructor): layer ``il`` reads the KV of layer ``src`` (Gemma 3n / Gemma 4 shared KV)."""

    il: int
    src: int
    swa: bool


@dataclass(frozen=True)
class IswaSection:
    """``llama_kv_cache_iswa: creating non-SWA KV cache, size = %u cells`` / ``creating     SWA KV
    cache`` (llama-kv-cache-iswa.cpp): the per-layer lines that follow belong to ``kind``
    (``"base"`` or ``"swa"``)."""

    kind: str
    cells: int


@dataclass(frozen=True)
class RecurrentLayer:
    """DEBUG ``llama_memory_recurrent, layer %3d: dev = %s`` (llama-memory-recurrent.cpp): layer
    ``il`` has a recurrent state row."""

    il: int
    dev: str


@dataclass(frozen=True)
class ModelInfo:
    """``print_info: <name> = <value>`` (llama-model.cpp ``print_info``) for the hyper-parameters
    the structure probe reads: ``n_layer``, ``n_layer_all``, ``n_swa``, ``n_embd_head_k``,
    ``n_embd_head_v``, ``n_embd_head_k_swa``, ``n_embd_head_v_swa``, ``n_head_kv``,
    ``n_embd_k_gqa``, ``n_embd_v_gqa``, ``n_embd``, ``arch`` (per-layer values print as
    ``[a, b, ...]`` when they differ, else once)."""

    name: str
    value: str

    def ints(self, n: int) -> tuple[int, ...]:
        """The value as ``n`` integers (a single printed value repeated)."""
        text = self.value.strip()
        if text.startswith("["):
            vals = tuple(int(x) for x in text.strip("[]").split(",") if x.strip())
            if len(vals) != n:
                raise ValueError(f"{self.name}: {len(vals)} values, expected {n}")
            return vals
        return (int(text),) * n


@dataclass(frozen=True)
class ContextParam:
    """``llama_context: <name> = <value>`` (llama-context.cpp constructor), e.g. ``n_ctx``,
    ``n_ctx_seq``, ``n_seq_max``, ``n_batch``, ``n_ubatch``, ``flash_attn``, ``kv_unified``.
    ``value`` is the text after ``=``."""

    name: str
    value: str


@dataclass(frozen=True)
class FlashAttnResolved:
    """Flash attention decided by llama.cpp: ``resolve_fused_ops: Flash Attention enabled`` /
    ``... not supported, set to disabled`` for ``auto`` (llama-context.cpp resolve_fused_ops),
    or ``enabling flash_attn since it is required for quantized V cache``
    (llama-context.cpp llama_init_from_model)."""

    enabled: bool


@dataclass(frozen=True)
class LogError:
    """An ERROR-level line. ``kind`` classifies it: ``out_of_memory`` (an allocation failed),
    ``invalid_config`` (llama.cpp refused the context), ``model_error`` (the model did not
    load), or ``other``."""

    func: str
    message: str
    kind: str


#: The function name every breakdown row starts with (common/fit.cpp).
BREAKDOWN_FUNC = "common_memory_breakdown_print"
_RE_BREAKDOWN_HEADER = re.compile(rf"{BREAKDOWN_FUNC}: \| memory breakdown \[MiB\]")
_RE_BREAKDOWN_DEVICE = re.compile(
    rf"{BREAKDOWN_FUNC}: \|\s+- (\S+) \((.*)\)\s*\|\s*(\d+) =\s*(\d+) \+ \(\s*(\d+) =\s*(\d+) \+\s*(\d+) \+\s*(\d+)\) \+\s*(-?\d+)\s*\|"
)
_RE_BREAKDOWN_OTHER = re.compile(rf"{BREAKDOWN_FUNC}: \|\s+- (\S+)\s*\|\s*(\d+) =\s*(\d+) \+\s*(\d+) \+\s*(\d+)\s*\|")
_RE_FIT_PRINT = re.compile(r"^(\S+) (\d+) (\d+) (\d+) ?$")
#: the prefix llama.cpp tools put before a log line (common/log.cpp ``common_log_entry::print``:
#: ``M.ss.mmm.uuu`` timestamp, level letter), and terminal colour codes
_RE_TOOL_PREFIX = re.compile(r"^(?:\d+\.\d{2}\.\d{3}\.\d{3} )?(?:[IWEDT] )?")
_RE_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_tool_prefix(line: str) -> str:
    """A llama.cpp tool's log line (llama-server, llama-fit-params) without its timestamp, level
    letter and colour codes, as the library logged it (``llama_kv_cache: size = ...``)."""
    return _RE_TOOL_PREFIX.sub("", _RE_ANSI.sub("", line.rstrip("\r\n")), count=1)


def is_breakdown_header(line: str) -> bool:
    """Whether ``line`` is the header of a memory breakdown table."""
    return bool(_RE_BREAKDOWN_HEADER.search(line))


def parse_breakdown_row(line: str) -> MemoryBreakdownRow | None:
    """One row of the memory breakdown table (prefix allowed), None for any other line (the
    header included)."""
    if m := _RE_BREAKDOWN_DEVICE.search(line):
        total, free, self_, model, context, compute, unacc = (int(m.group(i)) for i in range(3, 10))
        return MemoryBreakdownRow("device", m.group(1), m.group(2), model, context, compute, self_, total, free, unacc)
    if m := _RE_BREAKDOWN_OTHER.search(line):
        self_, model, context, compute = (int(m.group(i)) for i in range(2, 6))
        name = m.group(1)
        return MemoryBreakdownRow("host" if name == "Host" else "buffer_type", name, "", model, context, compute, self_)
    return None


def parse_breakdown(lines: Iterable[str]) -> tuple[MemoryBreakdownRow, ...]:
    """The rows of the first memory breakdown table in ``lines`` (empty when there is none).

    llama-server prints one table per measurement of ``--fit`` (common/fit.cpp
    ``common_get_device_memory_data_impl``); the first is the configuration as given."""
    rows: list[MemoryBreakdownRow] = []
    inside = False
    for line in lines:
        if is_breakdown_header(line):
            if inside:
                break
            inside = True
            continue
        if inside:
            row = parse_breakdown_row(line)
            if row is None:
                break
            rows.append(row)
    return tuple(rows)


def parse_fit_print(text: str) -> tuple[MemoryBreakdownRow, ...]:
    """``llama-fit-params --fit-print on`` output (stdout): ``<device> <model> <context>
    <compute>`` per device, then ``Host ...`` (common/fit.cpp ``common_fit_print``, integer
    MiB). Log lines around them are skipped."""
    rows: list[MemoryBreakdownRow] = []
    for line in text.splitlines():
        m = _RE_FIT_PRINT.match(line.strip() + " ")
        if not m:
            continue
        name = m.group(1)
        model, context, compute = int(m.group(2)), int(m.group(3)), int(m.group(4))
        rows.append(
            MemoryBreakdownRow(
                "host" if name == "Host" else "device", name, "", model, context, compute, model + context + compute
            )
        )
    if not rows or rows[-1].kind != "host":
        return ()
    return tuple(rows)


Record = (
    BufferReport
    | OffloadedLayers
    | GraphReport
    | KvCacheReport
    | ContextParam
    | FlashAttnResolved
    | LogError
    | RecurrentStateReport
    | KvLayer
    | KvReuse
    | IswaSection
    | RecurrentLayer
    | ModelInfo
)

_F = r"([0-9]+(?:\.[0-9]+)?)"  # a %f number
_RE_MODEL_BUF = re.compile(rf"^load_tensors:\s+(\S+) model buffer size =\s*{_F} MiB")
_RE_OFFLOADED = re.compile(r"^load_tensors: offloaded (\d+)/(\d+) layers to GPU")
_RE_OUTPUT_BUF = re.compile(rf"^llama_context:\s+(\S+)\s+output buffer size =\s*{_F} MiB")
_RE_KV_BUF = re.compile(rf"^llama_kv_cache:\s+(\S+) KV buffer size =\s*{_F} MiB")
_RE_KV_SIZE = re.compile(
    rf"^llama_kv_cache: size =\s*{_F} MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\), "
    rf"K \((\w+)\):\s*{_F} MiB, V \((\w+)\):\s*{_F} MiB"
)
_RE_RS_SIZE = re.compile(
    rf"^llama_memory_recurrent: size =\s*{_F} MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+) seqs\s+(\d+) rs_seq\), "
    rf"R \((\w+)\):\s*{_F} MiB, S \((\w+)\):\s*{_F} MiB(?:, P \(\w+\):\s*{_F} MiB)?"
)
_RE_KV_LAYER = re.compile(r"^llama_kv_cache: layer\s+(\d+): dev = (\S+)")
_RE_KV_REUSE = re.compile(r"^llama_kv_cache: - layer\s+(\d+): reuse layer (\d+), is_swa = (\d)")
_RE_ISWA = re.compile(r"^llama_kv_cache_iswa: creating\s+(non-SWA|SWA) KV cache, size = (\d+) cells")
_RE_RS_LAYER = re.compile(r"^llama_memory_recurrent, layer\s+(\d+): dev = (\S+)")
_RE_INFO = re.compile(
    r"^print_info: (arch|n_embd|n_layer|n_layer_all|n_swa|n_embd_head_k|n_embd_head_v|n_embd_head_k_swa|"
    r"n_embd_head_v_swa|n_head_kv|n_embd_k_gqa|n_embd_v_gqa)\s+= (.+)$"
)
_RE_COMPUTE_BUF = re.compile(rf"^sched_reserve:\s+(\S+) compute buffer size =\s*{_F} MiB")
_RE_GRAPH = re.compile(
    r"^sched_reserve: graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?, splits = (\d+)(?: / (\d+))?"
)
_RE_CTX_PARAM = re.compile(
    r"^llama_context: (n_ctx|n_ctx_seq|n_seq_max|n_batch|n_ubatch|flash_attn|kv_unified|causal_attn)\s+= (\S+)"
)
_RE_FA_RESOLVED = re.compile(r"^resolve_fused_ops: Flash Attention (enabled|not supported, set to disabled)")
_RE_FA_FORCED = re.compile(r"enabling flash_attn since it is required")
_RE_FUNC = re.compile(r"^(\w+):\s*(.*)$")
#: the :attr:`~kvtuner.core.llama_report.BufferReport.kind` of each buffer line
_BUFFER_LINES = (("model", _RE_MODEL_BUF), ("kv", _RE_KV_BUF), ("output", _RE_OUTPUT_BUF), ("compute", _RE_COMPUTE_BUF))

# Messages of allocation failures: ggml-backend.cpp / ggml-alloc.c ("failed to allocate ...
# buffer of size"), llama-kv-cache.cpp ("failed to allocate buffer for kv cache"),
# llama-context.cpp ("failed to allocate compute pp buffers", "... output buffer"),
# ggml-cuda.cu ("cudaMalloc failed: out of memory"), Vulkan ("ErrorOutOfDeviceMemory").
OOM_PATTERN = re.compile(
    r"out of memory|insufficient memory|failed to allocate|unable to allocate|cudaMalloc failed|OutOfDeviceMemory|bad_alloc|"
    r"failed to reserve initial output buffer",
    re.IGNORECASE,
)


def classify_error(func: str, message: str) -> str:
    """Kind of an ERROR log line or exception text: ``out_of_memory``, ``invalid_config``,
    ``model_error`` or ``other`` (rules: the messages listed at :data:`OOM_PATTERN`;
    llama-context.cpp ``llama_init_from_model`` refusals; llama.cpp ``llama_model_load``)."""
    text = f"{func}: {message}"
    if OOM_PATTERN.search(text):
        return "out_of_memory"
    if (
        func
        in (
            "llama_model_load",
            "llama_model_load_from_file_impl",
            "llama_model_loader",
            "gguf_init_from_file_impl",
            "gguf_init_from_file",
            "llama_load_model_from_file",
        )
        or "error loading model" in message
    ):
        return "model_error"
    if func in ("llama_init_from_model", "llama_new_context_with_model", "llama_context", "sched_reserve"):
        return "invalid_config"
    return "other"


def parse_line(line: str, level: int = LEVEL_INFO) -> Record | None:
    """Parse one complete log line (without its newline); None if it carries nothing we track.

    ``level`` is the ggml log level the callback received; ERROR lines become :class:`LogError`.
    """
    line = line.rstrip("\r\n")
    if level == LEVEL_ERROR:
        m = _RE_FUNC.match(line.strip())
        func, message = (m.group(1), m.group(2)) if m else ("", line.strip())
        return LogError(func=func, message=message, kind=classify_error(func, message))
    if m := _RE_KV_SIZE.match(line):
        return KvCacheReport(
            size_mib=float(m.group(1)),
            cells=int(m.group(2)),
            layers=int(m.group(3)),
            n_seq=int(m.group(4)),
            n_stream=int(m.group(5)),
            type_k=m.group(6),
            k_mib=float(m.group(7)),
            type_v=m.group(8),
            v_mib=float(m.group(9)),
        )
    if m := _RE_RS_SIZE.match(line):
        return RecurrentStateReport(
            size_mib=float(m.group(1)),
            cells=int(m.group(2)),
            layers=int(m.group(3)),
            n_seq=int(m.group(4)),
            n_rs_seq=int(m.group(5)),
            type_r=m.group(6),
            r_mib=float(m.group(7)),
            type_s=m.group(8),
            s_mib=float(m.group(9)),
            p_mib=float(m.group(10) or 0.0),
        )
    if m := _RE_KV_LAYER.match(line):
        return KvLayer(int(m.group(1)), m.group(2))
    if m := _RE_KV_REUSE.match(line):
        return KvReuse(int(m.group(1)), int(m.group(2)), m.group(3) == "1")
    if m := _RE_ISWA.match(line):
        return IswaSection("base" if m.group(1) == "non-SWA" else "swa", int(m.group(2)))
    if m := _RE_RS_LAYER.match(line):
        return RecurrentLayer(int(m.group(1)), m.group(2))
    if m := _RE_INFO.match(line):
        return ModelInfo(m.group(1), m.group(2).strip())
    for kind, pattern in _BUFFER_LINES:
        if m := pattern.match(line):
            return BufferReport(kind, m.group(1), float(m.group(2)))
    if m := _RE_OFFLOADED.match(line):
        return OffloadedLayers(int(m.group(1)), int(m.group(2)))
    if m := _RE_GRAPH.match(line):
        nodes, splits = int(m.group(1)), int(m.group(3))
        return GraphReport(nodes, int(m.group(2) or nodes), splits, int(m.group(4) or splits))
    if m := _RE_CTX_PARAM.match(line):
        return ContextParam(m.group(1), m.group(2))
    if m := _RE_FA_RESOLVED.match(line):
        return FlashAttnResolved(m.group(1) == "enabled")
    if _RE_FA_FORCED.search(line) and "flash_attn" in line:
        return FlashAttnResolved(True)
    return None


def parse_lines(lines: Iterable[str]) -> list[Record]:
    """Parse many INFO lines (e.g. a saved log); ERROR lines are recognised by their text
    (``error`` / ``failed``) since a plain log file has lost the levels."""
    out: list[Record] = []
    for line in lines:
        rec = parse_line(line)
        if rec is None and re.search(r"\berror\b|failed", line, re.IGNORECASE):
            rec = parse_line(line, LEVEL_ERROR)
        if rec is not None:
            out.append(rec)
    return out


def context_event(records: Iterable[Record], *, n_seq: int, n_batch: int, n_ubatch: int) -> ContextEvent:
    """The :class:`~kvtuner.runner.protocol.ContextEvent` of a load from its parsed log records
    (the ``llama_context: <name> = <value>`` lines and the flash attention decision); ``n_seq``,
    ``n_batch`` and ``n_ubatch`` stand in for lines the log lacks (the values asked for)."""
    from .protocol import ContextEvent

    records = list(records)
    params = {r.name: r.value for r in records if isinstance(r, ContextParam)}
    flash: bool | None = {"enabled": True, "disabled": False}.get(params.get("flash_attn", ""))
    for r in records:
        if isinstance(r, FlashAttnResolved):
            flash = r.enabled
    return ContextEvent(
        n_ctx=int(params.get("n_ctx", 0) or 0),
        n_ctx_seq=int(params.get("n_ctx_seq", 0) or 0),
        n_seq_max=int(params.get("n_seq_max", n_seq) or n_seq),
        n_batch=int(params.get("n_batch", n_batch) or n_batch),
        n_ubatch=int(params.get("n_ubatch", n_ubatch) or n_ubatch),
        flash_attn=flash,
        kv_unified=params.get("kv_unified", "false") == "true",
    )


def dry_run_report(records: Iterable[Record], **fields: Any) -> DryRunResult:
    """The :class:`~kvtuner.core.llama_report.DryRunResult` of a load's parsed log ``records``:
    its KV caches and recurrent state (log order), buffers per name (model, KV, compute, output;
    lines of one name summed), offloaded layers, graph, ``n_ctx``, ``n_ctx_seq`` and flash
    attention (:func:`context_event`). ``fields``: the result's other fields (the engine's
    devices, build, log tail ...), and any of those above to use instead."""
    recs = list(records)
    ctx = context_event(recs, n_seq=1, n_batch=0, n_ubatch=0)
    found: dict[str, Any] = {
        "n_ctx": ctx.n_ctx,
        "n_ctx_seq": ctx.n_ctx_seq,
        "flash_attn": ctx.flash_attn,
        "kv_caches": tuple(r for r in recs if isinstance(r, KvCacheReport)),
        "recurrent": tuple(r for r in recs if isinstance(r, RecurrentStateReport)),
        "compute_mib": buffers_by_name(recs, "compute"),
        "output_mib": buffers_by_name(recs, "output"),
        "model_mib": buffers_by_name(recs, "model"),
        "kv_buffer_mib": buffers_by_name(recs, "kv"),
        "offloaded": next((r for r in recs if isinstance(r, OffloadedLayers)), None),
        "graph": next((r for r in reversed(recs) if isinstance(r, GraphReport)), None),
    }
    return DryRunResult(**{**found, **fields})


def record_event(rec: Record) -> Message | None:
    """The runner event a parsed log record becomes, the same for every engine (the embedded
    child's log and llama-server's): a :class:`~kvtuner.runner.protocol.BufferEvent` for a
    model / KV / compute / output buffer line, a :class:`~kvtuner.runner.protocol.KvCacheEvent`
    for a ``llama_kv_cache: size = ...`` line; None for any other record."""
    from .protocol import BufferEvent, KvCacheEvent

    if isinstance(rec, BufferReport):
        return BufferEvent(buffer=rec)
    if isinstance(rec, KvCacheReport):
        return KvCacheEvent(cache=rec)
    return None


class LineAssembler:
    """Join the fragments a ``llama_log_set`` callback receives into whole lines.

    llama.cpp sometimes logs a line in pieces (``LLAMA_LOG_CONT``, level 5, continues the
    previous level; llama-model-loader.cpp prints override values that way). :meth:`feed`
    returns the completed ``(level, line)`` pairs.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._level = LEVEL_INFO

    def feed(self, level: int, text: str) -> list[tuple[int, str]]:
        """Add one callback's text; returns the lines it completed."""
        if level != LEVEL_CONT and not self._buf:
            self._level = level
        self._buf += text
        out: list[tuple[int, str]] = []
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            out.append((self._level, line))
        return out

    def flush(self) -> list[tuple[int, str]]:
        """Return a pending partial line, if any."""
        if self._buf:
            line, self._buf = self._buf, ""
            return [(self._level, line)]
        return []


# Allocation failures with a size and a device (llama.cpp/ggml sources):
#   ggml-alloc.c      "alloc_tensor_range: failed to allocate CUDA0 buffer of size 123"
#                     "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 123"
#   ggml-backend.cpp  "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 123"
#   ggml-cuda.cu      "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1234.56 MiB on device 0: cudaMalloc failed: ..."
#   ggml.c            "ggml_aligned_malloc: insufficient memory (attempted to allocate 1234.56 MB)"  (MB = 2^20 bytes)
_RE_ALLOC_NAMED = re.compile(r"failed to allocate (\S+) buffer of size (\d+)")
_RE_ALLOC_CPU = re.compile(r"^(\w*cpu\w*): failed to allocate buffer of size (\d+)", re.IGNORECASE)
_RE_ALLOC_CUDA = re.compile(rf"allocating {_F} MiB on device (\d+): \w+ failed")
_RE_ALLOC_HOST = re.compile(rf"insufficient memory \(attempted to allocate\s*{_F} MB\)")


def allocation_request(lines: Iterable[str]) -> tuple[str, int | None] | None:
    """The first failed allocation in ``lines`` (log lines or an error message) as
    ``(device, requested_bytes)``: ``("CUDA0", 1294467072)``, ``("CPU", None)`` when only the
    kind of failure is known; None when no line tells of one (see :data:`OOM_PATTERN`)."""
    fallback: tuple[str, int | None] | None = None
    for raw in lines:
        line = raw.strip()
        if m := _RE_ALLOC_NAMED.search(line):
            return buffer_device(m.group(1)), int(m.group(2))
        if m := _RE_ALLOC_CPU.search(line):
            return "CPU", int(m.group(2))
        if m := _RE_ALLOC_CUDA.search(line):
            return f"CUDA{m.group(2)}", int(round(float(m.group(1)) * (1 << 20)))
        if m := _RE_ALLOC_HOST.search(line):
            return "CPU", int(round(float(m.group(1)) * (1 << 20)))
        if fallback is None and OOM_PATTERN.search(line):
            dev = re.search(r"\b(CUDA\d+|Vulkan\d+|ROCm\d+|Metal\d*)\b", line)
            fallback = (dev.group(1) if dev else "CPU", None)
    return fallback
