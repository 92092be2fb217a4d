"""Run the CPU probe (:mod:`kvtuner.core.speed.cpu_probe`) in one runner child: write the probe
models (sparse, a few KiB each) to a temporary directory, then for each load it, bench it (a
warm-up pass, then ``repetitions``), unload it. The child sees no GPU (``CUDA_VISIBLE_DEVICES``
empty): it measures the CPU's kernels only.

Other programs on the machine only ever slow a measurement down, and on a shared machine they
do it for seconds at a time (a whole repetition at half speed, now and then a whole bench far
slower), so each figure is the fastest repetition's: a decoded token's time is the median of
one repetition's tokens (one interruption does not move a median), and of the repetitions the
smallest such median is kept; a prompt's time is the smallest of the repetitions' times. A
figure read at a busy moment would be stored for a week and slow every prediction made from it
(on a 2-core machine shared with other jobs a median over every repetition once read the attention
cost over 300x too high).

Attention probes get at least :data:`ATTN_MIN_REPETITIONS` repetitions (their figures are
differences of two such times). Takes about 15-35 s on an idle 2-core machine for a model of
two weight types; the result is
stored per machine and thread count by :class:`kvtuner.core.speed.calibration.CalibrationStore`.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ..core.monitor.contention import ContentionMeter
from ..core.plan.config import PlanConfig
from ..core.speed.cpu_probe import (
    BusyProbeError,
    CpuRates,
    ProbeError,
    ProbeModel,
    ProbeRun,
    attn_key_kv,
    implausible_types,
    matrix_model,
    probe_plan,
    rates_from_runs,
    write_probe_model,
)
from . import protocol as P
from .client import RunnerClient, RunnerError

#: Quantile of one repetition's per-token decode times taken as its token time (see the module docstring).
TOKEN_QUANTILE = 0.5
#: The least repetitions of an attention probe's benches. Its figures are differences of two
#: fastest times (depth ATTN_DEPTH minus depth 0), noisier than either: five probes of the
#: 32/4/128 attention on an AVX-512 AMD EPYC read its prefill cost at 5.6-9.4 ns per head and cell
#: with 3 repetitions (a 45% spread) and at 7.9-9.0 with 5 (13%); 8 s more per shape.
ATTN_MIN_REPETITIONS = 5


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return 0.0
    i = q * (len(v) - 1)
    lo = int(i)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)


def fastest_token_s(tokens: Sequence[tuple[int, float]]) -> float:
    """A decoded token's time from ``(repetition, seconds)`` pairs: the median of each
    repetition's tokens, the smallest of those medians (see the module docstring), s.

    Raises:
        ValueError: no tokens.
    """
    by_rep: dict[int, list[float]] = {}
    for rep, dt in tokens:
        by_rep.setdefault(rep, []).append(dt)
    if not by_rep:
        raise ValueError("no decoded tokens")
    return min(_quantile(v, TOKEN_QUANTILE) for v in by_rep.values())


#: Re-measurements of the matrix probes of implausible types (cpu_probe.implausible_types) before
#: the types are left out of the result.
REMEASURE_ROUNDS = 1
#: Probe models measured before a probe that may stop when busy first checks the other load (the
#: two overhead probes and one more: about 15 s on a quiet machine).
BUSY_CHECK_AFTER = 3


def run_cpu_probe(
    weight_types: Sequence[str],
    n_threads: int,
    *,
    attn_shapes: Sequence[str] = ("32/8/128",),
    expert_keys: Sequence[str] = (),
    kv_type: str = "f16",
    repetitions: int = 3,
    timeout_s: float = 600.0,
    on_step: Callable[[str], None] | None = None,
    on_progress: Callable[[int, int, str, float], None] | None = None,
    stop_when_busy: bool = False,
) -> CpuRates:
    """Probe this machine's CPU for ``weight_types`` (ggml type names), ``attn_shapes``
    (``"32/8/128"``: query heads/KV heads/head size) and MoE ``expert_keys``
    (``"2048/768/128/8@Q4_K"``, :func:`kvtuner.core.speed.expert_shapes.expert_key`) at ``n_threads``
    threads. An expert probe file holds a few MiB of data (routing, MXFP4 scales: about 1/17 of
    its MXFP4 bytes); the rest is a hole.

    The other load is measured over the whole probe (:class:`ContentionMeter`, the runner child
    counted as this process's own): the result's ``other_cores`` and ``busy`` say whether it may
    be stored. A weight type whose decode rate is implausible against the others
    (:func:`~kvtuner.core.speed.cpu_probe.implausible_types`) is re-measured
    (:data:`REMEASURE_ROUNDS`), the fastest reading of each bench kept; a type still implausible is
    left out of the result (its predictions use the nearest probed type).

    ``on_step`` is told each probe model's key before it runs; ``on_progress`` gets
    ``(k, n, key, elapsed_s)``: probe model k (1-based) of n starts, seconds since the start.
    ``stop_when_busy``: after :data:`BUSY_CHECK_AFTER` probe models, stop as soon as the other load
    so far is over the quiet limit (a busy probe would not be kept; why spend minutes on it).

    Raises:
        BusyProbeError: ``stop_when_busy`` and the machine was busy.
        ProbeError: the child failed (its reason in the message), or the runs were unusable.
    """
    models = list(probe_plan(weight_types, attn_shapes, expert_keys))
    runs: dict[tuple[str, int, int], ProbeRun] = {}
    meter = ContentionMeter()
    t0 = time.monotonic()
    left_out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvtuner-probe-") as tmp:
        client = RunnerClient(env={"CUDA_VISIBLE_DEVICES": ""})

        def measure(todo: Sequence[ProbeModel], offset: int, total: int) -> None:
            for i, m in enumerate(todo):
                if stop_when_busy and offset + i >= BUSY_CHECK_AFTER:
                    so_far = meter.stop()  # the other load since the start (the meter goes on)
                    if so_far.busy:
                        raise BusyProbeError(
                            f"the machine was busy during the CPU probe ({so_far.other_cores:.1f} cores of other load "
                            f"over its first {offset + i} kernels, more than {so_far.limit:g}): stopped, nothing "
                            "stored; the speed uses assumed CPU rates (run 'kvtuner probe' when the machine is quiet, "
                            "or keep a busy probe with --record-anyway)"
                        )
                if on_step is not None:
                    on_step(m.key)
                if on_progress is not None:
                    on_progress(offset + i + 1, total, m.key, time.monotonic() - t0)
                for run in _bench_probe_model(client, Path(tmp), m, n_threads, kv_type, repetitions, timeout_s):
                    k = (run.key, run.n_depth, run.n_prompt)
                    old = runs.get(k)
                    # other load only slows a reading: keep the fastest of a re-measured bench
                    runs[k] = (
                        run
                        if old is None
                        else ProbeRun(
                            run.key,
                            run.n_depth,
                            run.n_prompt,
                            min(old.prefill_s, run.prefill_s),
                            run.n_gen,
                            min(old.decode_s, run.decode_s)
                            if old.decode_s and run.decode_s
                            else run.decode_s or old.decode_s,
                        )
                    )

        try:
            meter.start()
            client.start(timeout_s=120.0)
            meter.track(client.pid)
            measure(models, 0, len(models))
            rates = rates_from_runs(list(runs.values()), n_threads, kv_type=kv_type)
            for _ in range(REMEASURE_ROUNDS):
                suspects = implausible_types(rates.decode_bytes_s)
                if not suspects:
                    break
                again = [matrix_model(t) for t in suspects]
                measure(again, len(models), len(models) + len(again))
                rates = rates_from_runs(list(runs.values()), n_threads, kv_type=kv_type)
            left_out = implausible_types(rates.decode_bytes_s)
        except RunnerError as exc:
            raise ProbeError(f"the CPU probe failed ({exc.kind}): {exc.message}") from None
        finally:
            client.close(timeout_s=5.0)
    contention = meter.stop()
    if left_out:
        rates = rates.without_types(left_out)
    return replace(rates, load_avg=os.getloadavg()[0], other_cores=contention.other_cores, busy=contention.busy)


def _bench_probe_model(
    client: RunnerClient, tmp: Path, m: ProbeModel, n_threads: int, kv_type: str, repetitions: int, timeout_s: float
) -> list[ProbeRun]:
    """Write probe model ``m`` in ``tmp``, load it in the runner, bench each of its runs, unload it."""
    name = "".join(c if c.isalnum() or c in "._" else "-" for c in m.key)
    path = write_probe_model(tmp / f"{name}.gguf", m)
    # an attention probe keyed with a K/V pair (cpu_probe.attn_key) runs with that pair
    kind, _, key = m.key.partition(":")
    _, type_k, type_v = attn_key_kv(key) if kind == "attn" else ("", kv_type, kv_type)
    cfg = PlanConfig(
        n_ctx=m.n_ctx, n_gpu_layers=0, type_k=type_k, type_v=type_v, flash_attn="on", n_batch=512, n_ubatch=512
    )
    client.request(
        P.LoadCommand(model_path=os.fspath(path), config=cfg.to_dict(), n_threads=n_threads),
        P.LoadedEvent,
        timeout_s=timeout_s,
        idle_timeout_s=timeout_s,
    )
    out = []
    for depth, n_prompt, n_gen in m.runs:
        tokens: list[tuple[int, float]] = []

        def keep(ev: P.Message, tokens: list[tuple[int, float]] = tokens) -> None:
            if isinstance(ev, P.TokenEvent):
                tokens.append((ev.rep, ev.dt_s))

        n_rep = max(repetitions, ATTN_MIN_REPETITIONS) if kind == "attn" else repetitions
        res = client.request(
            P.BenchCommand(n_prompt=n_prompt, n_gen=n_gen, n_depth=depth, repetitions=n_rep),
            P.BenchResultEvent,
            timeout_s=timeout_s,
            idle_timeout_s=timeout_s,
            on_other=keep,
        )
        assert isinstance(res, P.BenchResultEvent)
        reps = [P.Repetition.of(r) for r in res.reps]
        decode_s = n_gen * fastest_token_s(tokens) if n_gen and tokens else 0.0
        prefill_s = min(r.prefill_s for r in reps)
        out.append(ProbeRun(m.key, depth, n_prompt, prefill_s, n_gen, decode_s))
    client.request(P.UnloadCommand(), P.UnloadedEvent, timeout_s=60.0)
    path.unlink(missing_ok=True)  # an expert probe's file can hold 100s of MB of scales
    return out
