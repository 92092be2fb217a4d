"""What llama.cpp reports about a load, typed once.

The runner's log parser (:mod:`kvtuner.runner.llama_log`) makes these records from llama.cpp's
log lines, the runner's wire protocol (:mod:`kvtuner.runner.protocol`) carries them between its
child process and the parent (:meth:`to_json` / :meth:`from_json`), and the session
(:mod:`kvtuner.core.session`) reads them whole. Pure data: no llama.cpp here.

Sizes are MiB as llama.cpp prints them (two decimals, ``%8.2f``: exact to +-0.005 MiB) or
integer MiB where its memory breakdown prints them so (truncated ``bytes / MiB``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from .units import MiB

_R = TypeVar("_R", bound="JsonRecord")


def mib_to_bytes(mib: float) -> int:
    """Bytes of a printed MiB figure (rounded to the byte)."""
    return int(round(mib * MiB))


class JsonRecord:
    """Base of the flat records below: :meth:`to_json` gives a dict of the fields,
    :meth:`from_json` reads one back (unknown keys ignored, a missing field raises)."""

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-able dict (the record's field names as keys)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(cast(Any, self))}

    @classmethod
    def from_json(cls: type[_R], data: Mapping[str, Any]) -> _R:
        """The record of a decoded JSON object.

        Raises:
            ValueError: ``data`` is not an object, or lacks a field without a default.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{cls.__name__} must be an object, not {type(data).__name__}")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cast(Any, cls)):
            if f.name in data:
                kwargs[f.name] = data[f.name]
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{cls.__name__} lacks '{f.name}'")
        return cls(**kwargs)


@dataclass(frozen=True)
class KvCacheReport(JsonRecord):
    """One KV cache: ``llama_kv_cache: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs),
    K (%s): %7.2f MiB, V (%s): %7.2f MiB`` (src/llama-kv-cache.cpp constructor). Real sizes even
    under ``no_alloc``; for iSWA models the non-SWA cache comes first, then the SWA one
    (src/llama-kv-cache-iswa.cpp).

    ``cells`` per stream; ``n_seq`` is n_seq_max, ``n_stream`` the number of KV streams (1 when
    unified); ``size_mib``, ``k_mib``, ``v_mib`` as printed.
    """

    size_mib: float
    cells: int
    layers: int
    n_seq: int
    n_stream: int
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float


@dataclass(frozen=True)
class RecurrentStateReport(JsonRecord):
    """The recurrent state: ``llama_memory_recurrent: size = %7.2f MiB (%6u cells, %3d layers,
    %2u seqs %2u rs_seq), R (%s): %7.2f MiB, S (%s): %7.2f MiB[, P (%s): %7.2f MiB]``
    (src/llama-memory-recurrent.cpp constructor).

    ``layers`` is what llama.cpp prints: ``hparams.n_layer()``, *not* the layers its filter kept
    (the per-layer ``llama_memory_recurrent, layer %3d`` lines say which); ``cells`` is
    max(1, n_seq_max); R, S and P in MiB as printed (P 0 when not printed).
    """

    size_mib: float
    cells: int
    layers: int
    n_seq: int
    n_rs_seq: int
    type_r: str
    r_mib: float
    type_s: str
    s_mib: float
    p_mib: float = 0.0

    @property
    def state_mib(self) -> float:
        """R + S + P in MiB (as printed)."""
        return self.r_mib + self.s_mib + self.p_mib


#: :attr:`BufferReport.kind` of each buffer line.
BUFFER_KINDS = ("model", "kv", "compute", "output")


@dataclass(frozen=True)
class BufferReport(JsonRecord):
    """One buffer llama.cpp logged, ``kind`` one of :data:`BUFFER_KINDS`:

    - ``model``: ``load_tensors: <buft> model buffer size = <MiB> MiB`` (src/llama-model.cpp
      load_tensors);
    - ``kv``: ``llama_kv_cache: <buft> KV buffer size = <MiB> MiB`` (src/llama-kv-cache.cpp;
      0.00 MiB under ``no_alloc``, where the buffer is a dummy);
    - ``compute``: ``sched_reserve: <buft> compute buffer size = <MiB> MiB``
      (src/llama-context.cpp sched_reserve);
    - ``output``: ``llama_context: <buft>  output buffer size = <MiB> MiB``
      (src/llama-context.cpp constructor).

    ``buft`` is the buffer type or name (``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``CUDA0``,
    ``CUDA_Host`` ...), ``mib`` its size as printed.
    """

    kind: str
    buft: str
    mib: float


def buffers_by_name(buffers: Iterable[object], kind: str) -> dict[str, float]:
    """MiB per buffer name of the ``kind`` buffers among ``buffers`` (an iterable of records;
    :class:`BufferReport` ones are read, others skipped), lines of one name summed (2 decimals)."""
    out: dict[str, float] = {}
    for b in buffers:
        if isinstance(b, BufferReport) and b.kind == kind:
            out[b.buft] = round(out.get(b.buft, 0.0) + b.mib, 2)
    return out


@dataclass(frozen=True)
class OffloadedLayers(JsonRecord):
    """``load_tensors: offloaded <k>/<n> layers to GPU`` (src/llama-model.cpp load_tensors; only
    printed when ``llama_supports_gpu_offload()``). ``n_total`` is n_layer + 1 (the output layer)."""

    n_offloaded: int
    n_total: int


@dataclass(frozen=True)
class GraphReport(JsonRecord):
    """``sched_reserve: graph[ (pp bs=%d, tg bs=%d)]: nodes = %s, splits = %s, ...``
    (src/llama-context.cpp sched_reserve): nodes and splits of the prompt-processing graph
    (``_pp``) and of the one-token graph (``_tg``), the same number printed once when equal."""

    nodes_pp: int
    nodes_tg: int
    splits_pp: int
    splits_tg: int


@dataclass(frozen=True)
class MemoryBreakdownRow(JsonRecord):
    """One row of llama.cpp's memory breakdown, integer MiB as printed (truncated: ``bytes / MiB``).

    Printed by ``common_memory_breakdown_print`` (common/fit.cpp, trace level, ``-lv 4``): a
    header, one row per model device ``| - CUDA0 (RTX 3090) | total = free + (self = model +
    context + compute) + unaccounted |``, one ``| - Host | self = model + context + compute |``
    row (every host buffer: ``CPU``, ``CPU_Mapped``, ``CUDA_Host`` ...) and one row per other
    buffer type (``CPU_REPACK`` ...). ``llama-fit-params --fit-print on`` prints the same
    figures as ``<device> <model> <context> <compute>`` lines and a ``Host`` line
    (common/fit.cpp ``common_fit_print``); those rows have no total, free or unaccounted.

    ``context`` is the context's memory (KV cache, recurrent state: ``llama_context::memory_breakdown``,
    src/llama-context.cpp); the output buffer is in none of the columns.

    Attributes:
        kind: ``"device"``, ``"host"`` or ``"buffer_type"``.
        name: device name (``CUDA0``), ``Host``, or the buffer type (``CPU_REPACK``).
        description: the device description as printed (vendor prefixes stripped), "" otherwise.
    """

    kind: str
    name: str
    description: str
    model_mib: int
    context_mib: int
    compute_mib: int
    self_mib: int
    total_mib: int | None = None
    free_mib: int | None = None
    unaccounted_mib: int | None = None


#: :attr:`DryRunResult.method` of each way of asking llama.cpp.
METHOD_EMBEDDED = "embedded dry run"
METHOD_SERVER = "llama-server start-up breakdown"
METHOD_FIT_PRINT = "llama-fit-params --fit-print"


@dataclass(frozen=True)
class DryRunResult:
    """What llama.cpp reported for a configuration it set up without allocating (``no_alloc``).

    Attributes:
        kv_caches: log order; for iSWA models the non-SWA cache first, then the SWA one
            (llama-kv-cache-iswa.cpp creates them in that order).
        compute_mib: buffer type -> MiB from ``sched_reserve`` (e.g. ``{"CPU": 514.5}``).
        output_mib, model_mib, kv_buffer_mib: buffer type -> MiB as logged (0.00 for model
            and KV buffers under no_alloc, since nothing is allocated).
        n_ctx, n_ctx_seq: as llama.cpp set them (n_ctx padded to 256; llama-context.cpp).
        flash_attn: resolved flash attention (None if llama.cpp did not say).
        gpu_offload_supported: ``llama_supports_gpu_offload()``.
        devices: ggml backend devices (``"CPU"``, ``"CUDA0"`` ...).
        llama_build: the llama.cpp build (the llama-cpp-python version for the embedded engine).
        log_tail: the last llama.cpp log lines.
        recurrent: the recurrent state records (R and S MiB as printed; ``layers`` is
            llama.cpp's ``n_layer``, not the recurrent layers).
        structure_facts: the per-layer facts the structure probe read from the log
            (``kvtuner.runner.structure_probe.collect_facts``), None if none were logged.
        method: how llama.cpp was asked: :data:`METHOD_EMBEDDED` (llama-cpp-python in the
            runner child), :data:`METHOD_SERVER` (the user's llama-server, its ``--fit``
            probe's log) or :data:`METHOD_FIT_PRINT` (``llama-fit-params --fit-print on``).
        engine: the engine's label (``llama-server b11434 (CPU)``); "" for the embedded engine.
        engine_build: llama.cpp's build number of that engine (None when unknown).
        breakdown: llama.cpp's memory breakdown rows exactly as printed (integer MiB); empty
            for the embedded dry run. From them: ``model_mib`` and ``kv_buffer_mib`` (the
            ``context`` column) keyed by device name, ``CPU`` for the ``Host`` row and the buffer
            type for other rows; ``compute_mib`` likewise unless the log gave the two-decimal
            ``sched_reserve`` figures.
        offloaded: the offloaded layers line, None when not printed (no GPU offload).
        graph: the compute graph's nodes and splits, None when not printed.
    """

    kv_caches: tuple[KvCacheReport, ...]
    compute_mib: dict[str, float]
    output_mib: dict[str, float]
    model_mib: dict[str, float]
    kv_buffer_mib: dict[str, float]
    n_ctx: int
    n_ctx_seq: int
    flash_attn: bool | None
    gpu_offload_supported: bool
    devices: tuple[str, ...]
    llama_build: str
    log_tail: tuple[str, ...]
    recurrent: tuple[RecurrentStateReport, ...] = ()
    structure_facts: dict | None = None
    method: str = METHOD_EMBEDDED
    engine: str = ""
    engine_build: int | None = None
    breakdown: tuple[MemoryBreakdownRow, ...] = ()
    offloaded: OffloadedLayers | None = None
    graph: GraphReport | None = None

    @property
    def kv_mib(self) -> float:
        """Sum of all KV caches in MiB (as printed)."""
        return round(sum(c.size_mib for c in self.kv_caches), 2)

    @property
    def kv_bytes(self) -> int:
        """Sum of all KV caches in bytes, each printed size converted (:func:`mib_to_bytes`)."""
        return sum(mib_to_bytes(c.size_mib) for c in self.kv_caches)

    @property
    def recurrent_mib(self) -> float:
        """Recurrent/conv state in MiB (R + S + P as printed), 0 without one."""
        return round(sum(r.state_mib for r in self.recurrent), 2)

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-able dict; records as their :meth:`JsonRecord.to_json`."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, JsonRecord):
                value = value.to_json()
            elif isinstance(value, tuple):
                value = [v.to_json() if isinstance(v, JsonRecord) else v for v in value]
            elif isinstance(value, dict):
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DryRunResult:
        """The result of a decoded JSON object (unknown keys ignored).

        Raises:
            ValueError: not an object, or a field without a default is missing or malformed.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a dry-run result must be an object, not {type(data).__name__}")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [k for k in required if k not in data]
        if missing:
            raise ValueError(f"a dry-run result lacks '{missing[0]}'")

        def one(rec: type[_R], key: str) -> _R | None:
            value = data.get(key)
            return rec.from_json(value) if value is not None else None

        facts = data.get("structure_facts")
        return cls(
            kv_caches=tuple(KvCacheReport.from_json(c) for c in data["kv_caches"]),
            compute_mib=dict(data["compute_mib"]),
            output_mib=dict(data["output_mib"]),
            model_mib=dict(data["model_mib"]),
            kv_buffer_mib=dict(data["kv_buffer_mib"]),
            n_ctx=int(data["n_ctx"]),
            n_ctx_seq=int(data["n_ctx_seq"]),
            flash_attn=data["flash_attn"],
            gpu_offload_supported=bool(data["gpu_offload_supported"]),
            devices=tuple(data["devices"]),
            llama_build=str(data["llama_build"]),
            log_tail=tuple(data["log_tail"]),
            recurrent=tuple(RecurrentStateReport.from_json(r) for r in data.get("recurrent", ())),
            structure_facts=dict(facts) if facts else None,
            method=str(data.get("method", METHOD_EMBEDDED)),
            engine=str(data.get("engine", "")),
            engine_build=data.get("engine_build"),
            breakdown=tuple(MemoryBreakdownRow.from_json(r) for r in data.get("breakdown", ())),
            offloaded=one(OffloadedLayers, "offloaded"),
            graph=one(GraphReport, "graph"),
        )
