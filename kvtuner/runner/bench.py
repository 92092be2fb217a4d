"""Benchmark a configuration in the runner, llama-bench style, while sampling memory.

Parent side (no ``llama_cpp`` here). :func:`run_bench` starts a runner child, loads the model
for a :class:`PlanConfig`, and per repetition clears the KV cache, fills ``n_depth`` tokens
(untimed), prefills ``n_prompt`` random tokens (timed, in ``n_batch`` chunks), then decodes
``n_gen`` tokens one by one (timed, greedy). Like llama-bench (tools/llama-bench: ``-p``,
``-n``, ``-d``, ``-r``, a warm-up run first, random prompt tokens, mean/stdev per test) but
prefill and decode share one run per repetition, so decode runs at depth
``n_depth + n_prompt``; statistics are median and spread (min, max, stdev).

Memory: a :class:`kvtuner.core.monitor.sampler.Sampler` watches the child at 10 Hz (host RAM,
RSS, VRAM per device and per process when NVML works); the child adds its own exact peak
RSS (``getrusage``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..core.llama_report import KvCacheReport, buffers_by_name
from ..core.model.ggml_types import kv_type
from ..core.monitor.measurement import RunRecorder
from ..core.monitor.sampler import Peaks, Sampler
from ..core.plan.config import PlanConfig
from . import protocol as P
from .client import RunnerError

if TYPE_CHECKING:  # pragma: no cover
    from .engines import Engine

_MiB = 1 << 20
_ROUNDING_BYTES = 0.005 * _MiB  # llama.cpp prints MiB with %.2f


class BenchError(RunnerError):
    """The benchmark failed; ``kind`` as in :data:`kvtuner.runner.protocol.ERROR_KINDS`."""


@dataclass(frozen=True)
class Stat:
    """Median and spread of repeated measurements (same unit as the values)."""

    median: float
    mean: float
    min: float
    max: float
    stdev: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Stat | None:
        """Stat of ``values``; None for an empty list."""
        if not values:
            return None
        return cls(
            median=statistics.median(values),
            mean=statistics.fmean(values),
            min=min(values),
            max=max(values),
            stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
            n=len(values),
        )


@dataclass(frozen=True)
class MeasuredBuffers:
    """Buffers llama.cpp logged while loading for real, MiB per buffer type (as printed)."""

    model_mib: dict[str, float]
    kv_buffer_mib: dict[str, float]
    compute_mib: dict[str, float]
    output_mib: dict[str, float]
    kv_caches: tuple[KvCacheReport, ...]


def kv_bytes_from_report(cache: KvCacheReport) -> tuple[int, bool]:
    """K + V bytes of one logged cache and whether they are exact.

    llama.cpp prints MiB with two decimals (llama-kv-cache.cpp). K bytes are
    ``sum_il row_size(type_k, n_embd_k_gqa(il)) * cells * n_stream``, a multiple of
    ``type_size(type_k) * cells * n_stream``; when that unit exceeds the rounding window
    (0.01 MiB) the nearest multiple is the exact value. Otherwise the result is the rounded
    MiB figure and ``exact`` is False.
    """
    total = 0
    exact = True
    for type_name, mib in ((cache.type_k, cache.k_mib), (cache.type_v, cache.v_mib)):
        approx = mib * _MiB
        try:
            unit = kv_type(type_name).type_size * cache.cells * cache.n_stream
        except ValueError:
            unit = 0
        if unit > 2 * _ROUNDING_BYTES:
            total += int(round(approx / unit)) * unit
        else:
            total += int(round(approx))
            exact = False
    return total, exact


@dataclass(frozen=True)
class BenchResult:
    """One benchmark.

    Attributes:
        prefill_tok_s, decode_tok_s: tokens per second over repetitions (None if 0 tokens).
        ttft_s: time to first token in seconds (prefill + picking the first token).
        load_s: model load + context creation, seconds (wall clock, in the child).
        kv_bytes: KV bytes from llama.cpp's KV lines (see :func:`kv_bytes_from_report`),
            ``kv_bytes_exact`` whether that is exact.
        peak_rss_bytes: the child's peak resident memory (max of getrusage and samples).
        peak_host_used_bytes: peak of host RAM in use (total - available), all processes.
        peak_vram_used_bytes / peak_vram_process_bytes: per GPU index (NVML), empty without.
        reps: the per-repetition records.
    """

    model_path: str
    config: PlanConfig
    n_prompt: int
    n_gen: int
    n_depth: int
    repetitions: int
    n_threads: int
    load_s: float
    prefill_tok_s: Stat | None
    decode_tok_s: Stat | None
    ttft_s: Stat | None
    buffers: MeasuredBuffers
    kv_bytes: int
    kv_bytes_exact: bool
    peak_rss_bytes: int
    peak_host_used_bytes: int | None
    peak_vram_used_bytes: dict[int, int]
    peak_vram_process_bytes: dict[int, int]
    flash_attn: bool | None
    n_ctx: int
    gpu_offload_supported: bool
    devices: tuple[str, ...]
    llama_build: str
    kv_split_experimental: bool
    warnings: tuple[str, ...]
    reps: tuple[P.Repetition, ...] = field(default=())
    perf: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (``kvtuner bench --json``)."""
        d = asdict(self)
        d["config"] = self.config.to_dict()
        d["kv_caches"] = d["buffers"].pop("kv_caches")
        d["peak_vram_used_bytes"] = {str(k): v for k, v in self.peak_vram_used_bytes.items()}
        d["peak_vram_process_bytes"] = {str(k): v for k, v in self.peak_vram_process_bytes.items()}
        return d


def run_bench(
    model_path: str | os.PathLike,
    config: PlanConfig,
    *,
    n_prompt: int = 512,
    n_gen: int = 128,
    n_depth: int = 0,
    repetitions: int = 3,
    n_threads: int | None = None,
    sample_interval_s: float = 0.1,
    timeout_s: float = 3600.0,
    idle_timeout_s: float = 300.0,
    on_event: Callable[[P.Message], None] | None = None,
    env: dict[str, str] | None = None,
    sampler: Sampler | None = None,
    engine: Engine | None = None,
    stream: bool = False,
) -> BenchResult:
    """Load ``model_path`` with ``config`` in a runner child and benchmark it.

    ``on_event`` sees every event (load progress, buffers, tokens ...) on this thread.
    ``timeout_s`` bounds the whole run; ``idle_timeout_s`` the silence between two events.
    ``sampler``: a :class:`Sampler` to use (it is pointed at the child, started and stopped
    here; read its buffers and ``cpu_s`` after); default: a new one at ``sample_interval_s``.
    ``engine``: a llama-server :class:`~kvtuner.runner.engines.Engine` runs the bench through
    that server (:class:`~kvtuner.runner.server_run.ServerRunClient`, the sampler follows the
    server's pid; ``stream``: per-token events); None or the embedded engine: the runner child.

    Raises:
        BenchError: ``model_error``, ``invalid_config`` (incl. too small a context for
            depth + prompt + gen), ``out_of_memory``, ``crashed``, ``cancelled``, ``timeout``.
    """
    path = os.fspath(model_path)
    for name, value in (("n_prompt", n_prompt), ("n_gen", n_gen), ("n_depth", n_depth)):
        if value < 0:
            raise BenchError("invalid_config", f"{name} must be 0 or more, not {value}")
    if repetitions < 1:
        raise BenchError("invalid_config", f"repetitions must be 1 or more, not {repetitions}")
    if not os.path.isfile(path):
        raise BenchError("model_error", f"model file not found: {path}")
    if not os.access(path, os.R_OK):
        raise BenchError("model_error", f"model file is not readable (permission denied): {path}")

    seen: list[P.Message] = []

    def other(ev: P.Message) -> None:
        if not isinstance(ev, (P.LogEvent, P.TokenEvent, P.PrefillProgressEvent)):
            seen.append(ev)
        if on_event is not None:
            on_event(ev)

    deadline = time.monotonic() + timeout_s
    from .server_run import make_client

    client = make_client(
        engine, model_path=os.path.abspath(path), config=config, n_threads=n_threads, env=env, stream=stream
    )
    sampler = sampler or Sampler(interval_s=sample_interval_s)
    try:
        try:
            started = client.start(timeout_s=min(120.0, timeout_s))
            if on_event is not None:
                on_event(started)
            sampler.set_pid(client.pid)
            sampler.start()
            loaded = client.request(
                P.LoadCommand(model_path=os.path.abspath(path), config=config.to_dict(), n_threads=n_threads),
                P.LoadedEvent,
                timeout_s=max(deadline - time.monotonic(), 0.1),
                idle_timeout_s=idle_timeout_s,
                on_other=other,
            )
            other(loaded)
            result = client.request(
                P.BenchCommand(n_prompt=n_prompt, n_gen=n_gen, n_depth=n_depth, repetitions=repetitions),
                P.BenchResultEvent,
                timeout_s=max(deadline - time.monotonic(), 0.1),
                idle_timeout_s=idle_timeout_s,
                on_other=other,
            )
            other(result)
        except RunnerError as exc:
            raise BenchError(exc.kind, exc.message, exc.log_tail) from None
    finally:
        sampler.stop()
        client.close(timeout_s=5.0)
    assert isinstance(loaded, P.LoadedEvent) and isinstance(result, P.BenchResultEvent)
    return _summarise(path, config, n_prompt, n_gen, n_depth, repetitions, started, loaded, result, seen, sampler)


def _summarise(
    path: str,
    config: PlanConfig,
    n_prompt: int,
    n_gen: int,
    n_depth: int,
    repetitions: int,
    started: P.StartedEvent,
    loaded: P.LoadedEvent,
    result: P.BenchResultEvent,
    seen: list[P.Message],
    sampler: _PeakSource,
) -> BenchResult:
    def by_kind(kind: str) -> dict[str, float]:
        return buffers_by_name((ev.buffer for ev in seen if isinstance(ev, P.BufferEvent)), kind)

    caches = tuple(ev.cache for ev in seen if isinstance(ev, P.KvCacheEvent))
    kv_total, exact = 0, True
    for c in caches:
        b, e = kv_bytes_from_report(c)
        kv_total += b
        exact = exact and e
    ctx = next((ev for ev in seen if isinstance(ev, P.ContextEvent)), None)
    reps = result.reps
    prefill = [r.prefill_tok_s for r in reps if r.prefill_tok_s is not None]
    decode = [r.decode_tok_s for r in reps if r.decode_tok_s is not None]
    ttft = [r.ttft_s for r in reps if r.n_prompt]
    peaks = sampler.peaks()
    return BenchResult(
        model_path=path,
        config=config,
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=n_depth,
        repetitions=repetitions,
        n_threads=result.n_threads,
        load_s=loaded.load_s,
        prefill_tok_s=Stat.of(prefill),
        decode_tok_s=Stat.of(decode),
        ttft_s=Stat.of(ttft),
        buffers=MeasuredBuffers(by_kind("model"), by_kind("kv"), by_kind("compute"), by_kind("output"), caches),
        kv_bytes=kv_total,
        kv_bytes_exact=exact,
        peak_rss_bytes=max(result.peak_rss_bytes, peaks.process_rss_bytes or 0),
        peak_host_used_bytes=peaks.host_used_bytes,
        peak_vram_used_bytes=dict(peaks.gpu_used_bytes),
        peak_vram_process_bytes=dict(peaks.gpu_process_bytes),
        flash_attn=ctx.flash_attn if ctx else None,
        n_ctx=ctx.n_ctx if ctx else 0,
        gpu_offload_supported=started.gpu_offload_supported,
        devices=tuple(started.devices),
        llama_build=started.llama_build,
        kv_split_experimental=loaded.kv_split_experimental,
        warnings=tuple(loaded.warnings),
        reps=tuple(reps),
        perf=dict(result.perf),
    )


class _PeakSource(Protocol):
    """What :func:`_summarise` reads of a sampler: its peaks since the start."""

    def peaks(self) -> Peaks: ...


class _NoPeaks:
    """Stand-in sampler for :func:`summarise_events` when nothing sampled the child."""

    @staticmethod
    def peaks() -> Peaks:
        return Peaks(None, None, {}, {})


def summarise_events(
    model_path: str | os.PathLike,
    config: PlanConfig,
    *,
    n_prompt: int,
    n_gen: int,
    n_depth: int,
    repetitions: int,
    started: P.StartedEvent,
    loaded: P.LoadedEvent,
    result: P.BenchResultEvent,
    events: list[P.Message],
    sampler: Any = None,
) -> BenchResult:
    """The :class:`BenchResult` of a bench driven by someone else (the desktop app's run
    controller): the child's started, loaded and bench-result events plus the other events
    it sent (buffers, KV caches, context). ``sampler``: the sampler that watched the child
    since the start (its peaks are used), or None."""
    return _summarise(
        os.fspath(model_path),
        config,
        n_prompt,
        n_gen,
        n_depth,
        repetitions,
        started,
        loaded,
        result,
        list(events),
        sampler if sampler is not None and hasattr(sampler, "peaks") else _NoPeaks(),
    )


def record_event(recorder: RunRecorder, ev: object) -> None:
    """Hand one runner event to ``recorder`` (:class:`~kvtuner.core.monitor.measurement.RunRecorder`):
    the started, context, loaded and bench-result events make a measurement; every other event
    (and anything that is not a protocol event) is ignored. ``kvtuner bench``, a tune's real
    loads and the window's run handling all feed their recorder through here."""
    if isinstance(ev, P.StartedEvent):
        recorder.started(gpu_offload=ev.gpu_offload_supported, llama_build=ev.llama_build)
    elif isinstance(ev, P.ContextEvent):
        recorder.context(n_ctx=ev.n_ctx, n_ubatch=ev.n_ubatch)
    elif isinstance(ev, P.LoadedEvent):
        recorder.loaded(load_s=ev.load_s, n_threads=ev.n_threads)
    elif isinstance(ev, P.BenchResultEvent):
        recorder.bench_result(ev.reps, n_threads=ev.n_threads)


def measured_figures(result: BenchResult) -> dict[str, float | int]:
    """The figures the working-configs library keeps for a completed bench
    (:data:`kvtuner.core.export.MEASURED_KEYS`): median decode and prefill tok/s, load
    seconds, the runner's peak RSS and VRAM bytes (summed over GPUs; the device's use when
    NVML cannot tell per process; absent without a GPU) and the KV cache bytes."""
    out: dict[str, float | int] = {
        "load_s": float(result.load_s),
        "peak_rss_bytes": int(result.peak_rss_bytes),
        "kv_bytes": int(result.kv_bytes),
    }
    if result.decode_tok_s is not None:
        out["decode_tok_s"] = float(result.decode_tok_s.median)
    if result.prefill_tok_s is not None:
        out["prefill_tok_s"] = float(result.prefill_tok_s.median)
    vram = sum(result.peak_vram_process_bytes.values()) or sum(result.peak_vram_used_bytes.values())
    if vram:
        out["peak_vram_bytes"] = int(vram)
    return out
