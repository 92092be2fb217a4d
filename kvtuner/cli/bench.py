"""``kvtuner bench``: load a model in a child process (:mod:`kvtuner.runner`) and measure it like
llama-bench, with the session's plan beside the measured buffers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, cast

from .args import (
    UserError,
    _wait_for_background_probe,
    add_config_args,
    add_engine_arg,
    add_hardware_args,
    add_model_arg,
    add_record_anyway_arg,
    add_threads_arg,
    config_from_args,
    emit_json,
    engine_from_args,
    ensure_cpu_probe,
    load_model,
    positive_int,
    probe_disabled,
    resolve_model,
    session_from_args,
)

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from ..core.plan.config import PlanConfig
    from ..core.plan.memory_plan import MemoryPlan
    from ..core.session import Session
    from ..core.speed.measurement import Measurement
    from ..runner.bench import BenchResult, Stat
    from ..runner.engines import Engine


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``bench``."""
    b = sub.add_parser(
        "bench",
        help="load a model in a child process and measure load, prefill and decode (headless)",
        description="Benchmark a configuration like llama-bench: prefill P tokens at depth D, then decode G tokens, "
        "R times; report tok/s (median and spread), time to first token, load time, peak RAM/VRAM, and the "
        "planned and measured buffers side by side.",
    )
    add_model_arg(b)
    add_engine_arg(b)
    add_config_args(b)
    add_hardware_args(b)
    g = b.add_argument_group("benchmark")
    g.add_argument(
        "-p", "--n-prompt", type=positive_int, default=512, metavar="P", help="prompt tokens to prefill (default 512)"
    )
    g.add_argument("-n", "--n-gen", type=positive_int, default=128, metavar="G", help="tokens to decode (default 128)")
    g.add_argument(
        "-d", "--n-depth", type=positive_int, default=0, metavar="D", help="context depth before the prompt (default 0)"
    )
    g.add_argument("-r", "--repetitions", type=positive_int, default=3, metavar="R", help="repetitions (default 3)")
    add_threads_arg(g)
    g.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="give up after S seconds (default 3600)")
    g.add_argument(
        "--no-record",
        action="store_true",
        help="do not record this run for speed calibration (by default every successful bench refines "
        "the speed model for this machine and model family)",
    )
    g.add_argument(
        "--no-save",
        action="store_true",
        help="do not save this run in the working-configs library (by default every completed bench is "
        "kept with its measured numbers; see 'kvtuner library'; KVTUNER_LIBRARY=off also turns it off)",
    )
    add_record_anyway_arg(g, "the run for calibration and the library")
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.set_defaults(func=cmd_bench)


def _bench_session(
    args: argparse.Namespace, model_path: Path, config: PlanConfig, gpu_offload: bool
) -> tuple[Session | None, MemoryPlan | None, str]:
    """The session and its plan for the bench's side-by-side table, on the devices llama.cpp
    could use (no GPU when the installed build cannot offload); ``(None, None, reason)`` when the
    plan fails: the measurement stands on its own."""
    from ..core.model.profile import GGUFError, ModelProfile
    from ..core.plan.config import ConfigError

    try:
        session = session_from_args(args, ModelProfile.from_gguf(model_path), config)
        if not gpu_offload:
            session.gpus = ()
        return session, session.plan(), ""
    except (GGUFError, ConfigError, UserError, OSError, ValueError) as exc:
        return None, None, f"{type(exc).__name__}: {exc}"


def _bench_record(session: Session, plan: MemoryPlan, measurement: Measurement) -> str:
    """Record a bench that may calibrate for speed calibration; returns a note for stderr. A
    calibration store that cannot be written is a note, not a failure."""
    from ..core.speed.calibration import CalibrationError

    try:
        note = session.record_run(plan, measurement)
    except CalibrationError as exc:
        return f"kvtuner: this run was not recorded for calibration: {exc}"
    return f"kvtuner: {note}; --no-record skips this"


def _bench_save(model_path: Path, config: PlanConfig, result: BenchResult, session: Session | None) -> str:
    """Save a completed bench in the working-configs library (unless ``KVTUNER_LIBRARY=off``);
    returns a note for stderr. A library that cannot be written is a note, not a failure."""
    from ..core.hardware.identity import MachineFingerprint
    from ..core.model.profile import GGUFError, ModelProfile
    from ..core.store.library import LibraryError, record_completed_run
    from ..runner.bench import measured_figures

    try:
        run_id = record_completed_run(
            ModelProfile.from_gguf(model_path),
            config,
            measured_figures(result),
            model_path=model_path,
            machine=MachineFingerprint.current(session.machine_gpus if session else None),
        )
    except (LibraryError, GGUFError, ValueError, OSError) as exc:
        return f"kvtuner: this run was not saved in the working-configs library: {exc}"
    if run_id is None:
        return ""
    return f"kvtuner: saved as working configuration {run_id} ('kvtuner library' lists them; --no-save skips this)"


def _bench_side_by_side(plan: MemoryPlan | None, result: BenchResult) -> dict:
    """Planned and measured bytes per buffer kind and device."""
    from ..core.plan.buffers import buffer_device
    from ..core.units import MiB

    measured: dict[str, dict[str, float]] = {}
    for kind, table in (
        ("weights", result.buffers.model_mib),
        ("kv", result.buffers.kv_buffer_mib),
        ("compute", result.buffers.compute_mib),
        ("output", result.buffers.output_mib),
    ):
        for buft, mib in table.items():
            dev = buffer_device(buft)
            k = "repack" if buft == "CPU_REPACK" else kind  # ggml-cpu's repacked copy, apart from the mapped file
            measured.setdefault(dev, {}).setdefault(f"{k}_bytes", 0)
            measured[dev][f"{k}_bytes"] += int(round(mib * MiB))
    doc: dict = {
        "measured_devices": measured,
        "measured_kv_bytes": result.kv_bytes,
        "measured_kv_bytes_exact": result.kv_bytes_exact,
    }
    if plan is not None:
        doc["planned_devices"] = {
            d.device: {
                "weights_bytes": d.weights_bytes,
                "kv_bytes": d.kv_bytes,
                "compute_bytes": d.compute_bytes,
                "output_bytes": d.output_bytes,
                "repack_bytes": d.repack_bytes,
                "total_bytes": d.total_bytes,
                "mapped_bytes": d.mapped_bytes,
                "committed_bytes": d.committed_bytes,
            }
            for d in plan.devices
        }
        doc["planned_kv_caches"] = [
            {"kind": c.kind, "cells": c.cells, "layers": c.layers, "kv_bytes": c.kv_bytes} for c in plan.kv_caches
        ]
        # the host as the OS sees it: the planned total against the runner's measured peak RSS
        doc["planned_host_total_bytes"] = plan.host.total_bytes
        doc["measured_peak_rss_bytes"] = int(result.peak_rss_bytes)
        if plan.host.total_bytes:
            doc["rss_vs_plan"] = round(result.peak_rss_bytes / plan.host.total_bytes - 1, 4)
        # llama.cpp prints each cache's K and V in MiB with 2 decimals: compare at that precision too
        # (the attention caches: the recurrent state has its own line)
        attn = [c for c in plan.kv_caches if c.kind != "recurrent"]
        planned_kv = sum(c.kv_bytes for c in attn)
        doc["planned_kv_bytes"] = planned_kv
        printed = [round(c.size_mib, 2) for c in result.buffers.kv_caches if c.layers]
        planned_printed = [round((c.k_bytes + c.v_bytes) / MiB, 2) for c in attn]
        doc["kv_bytes_match"] = (planned_kv == result.kv_bytes) if result.kv_bytes_exact else None
        doc["kv_mib_match"] = all(abs(a - b) <= 0.011 for a, b in zip(printed, planned_printed)) and len(
            printed
        ) == len(planned_printed)
    return doc


def _check_bench_devices(args: argparse.Namespace) -> None:
    """A bench runs on this machine's devices: ``--gpu NAME`` names a card it must have, as
    llama-bench's ``-dev`` does (tools/llama-bench/llama-bench.cpp ``parse_devices_arg``: an
    unknown device is "invalid device", and the bench does not run), so a card this machine
    lacks, or a generic ``--gpu-mem`` card, ends in one line (exit 2) instead of a run on other
    hardware whose figures would read as the card's. A named card that is this machine's GPU is
    that GPU (the detected one is planned beside the measurement).

    Raises:
        UserError: ``--gpu-mem``, or a ``--gpu`` card that is not detected here.
    """
    names, sizes = getattr(args, "gpu_name", None) or [], getattr(args, "gpu_mem", None) or []
    for flag in ("host_mem", "host_bw", "host_cores", "pcie"):
        if getattr(args, flag, None) is not None:
            opt = "--" + flag.replace("_", "-")
            raise UserError(
                f"bench measures this machine: {opt} describes a what-if host it cannot run on; leave it "
                f"out, or predict that host with 'kvtuner plan {opt} ...'"
            )
    if sizes:
        raise UserError(
            f"bench measures this machine: --gpu-mem {sizes[0]} is a what-if card it cannot run on; "
            f"leave it out, or plan the card with 'kvtuner plan --gpu-mem {sizes[0]}'"
        )
    if not names:
        return
    from ..core.hardware.gpu_catalogue import UnknownGpuError, find_gpu
    from .args import detect_gpus

    detected = detect_gpus()
    have = {g.catalogue for g in detected if g.catalogue}
    for name in names:
        try:
            card = find_gpu(name).name
        except UnknownGpuError as exc:
            raise UserError(f"--gpu: {exc}") from None
        if card not in have:
            here = ", ".join(g.name for g in detected) or "no GPU found"
            raise UserError(
                f'bench measures this machine ({here}): it has no {card}, so --gpu "{name}" does not '
                f"apply; leave it out, or plan the card with 'kvtuner plan --gpu \"{card}\"'"
            )
    args.gpu_name = None  # the detected card it names is planned as detected (its free memory, its index)


def cmd_bench(args: argparse.Namespace) -> int:
    """``kvtuner bench``."""
    from functools import partial

    from ..core.monitor.measurement import RunRecorder
    from ..runner.bench import BenchError, record_event, run_bench

    if (
        getattr(args, "rpc", None)
        or getattr(args, "tensor_split", None)
        or getattr(args, "split_mode", None)
        or getattr(args, "main_gpu", None) is not None
    ):
        # the embedded runner is llama-cpp-python, built without the RPC backend, and neither engine's
        # bench takes a split yet
        raise UserError(
            "bench runs one device (no RPC backend, no split): plan and export "
            "--rpc/-sm/-ts/-mg layouts, and run them with the exported llama-server"
        )
    _check_bench_devices(args)
    engine = cast("Engine", engine_from_args(args))
    model_path = resolve_model(args.model)
    if not model_path.is_file():
        raise UserError(f"model file not found: {model_path}")
    config = config_from_args(args, model=lambda: load_model(str(model_path)))
    for note in getattr(args, "resolved_notes", ()):
        print(f"kvtuner: {note}", file=sys.stderr)
    if not args.timeout > 0:  # also NaN
        raise UserError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    if args.threads is not None and args.threads < 1:  # llama.cpp would quietly use its own default
        raise UserError(f"--threads must be 1 or more (leave it out for the physical cores), not {args.threads}")
    if not args.json and sys.stderr.isatty():
        print(f"kvtuner: benchmarking {model_path.name} ...", file=sys.stderr)
    if not probe_disabled(args):
        from ..runner import probe_job

        if probe_job.is_running():  # it would slow the bench and the bench it: one at a time
            _wait_for_background_probe(args.json)
    recorder = RunRecorder(
        n_prompt=args.n_prompt,
        n_gen=args.n_gen,
        n_depth=args.n_depth,
        model_path=str(model_path),
        config=config,
        engine=engine.kind,
        record_anyway=args.record_anyway,
        what="this bench",
    ).start()
    try:
        result = run_bench(
            model_path,
            config,
            n_prompt=args.n_prompt,
            n_gen=args.n_gen,
            n_depth=args.n_depth,
            repetitions=args.repetitions,
            n_threads=args.threads,
            timeout_s=args.timeout,
            engine=engine if engine.kind == "server" else None,
            on_event=partial(record_event, recorder),
        )
    except BenchError as exc:
        if exc.kind in ("invalid_config", "model_error", "out_of_memory"):
            raise UserError(f"bench failed ({exc.kind}): {exc}") from None
        print(f"kvtuner: bench failed ({exc.kind}): {exc}", file=sys.stderr)
        for line in exc.log_tail[-5:]:
            print(f"  | {line}", file=sys.stderr)
        return 1
    measurement = recorder.finish()  # the bench child was waited for: its CPU time is this process's
    keep = measurement.keep
    if measurement.busy:
        print(
            f"kvtuner: {keep.reason}"
            if not keep.library
            else f"kvtuner: the machine was busy during this bench ({measurement.other_cores:.1f} cores of other "
            "load); recorded anyway (--record-anyway)",
            file=sys.stderr,
        )
    session, plan, plan_error = _bench_session(args, model_path, config, result.gpu_offload_supported)
    if session is not None and plan is not None and not args.no_record and keep.calibrate:
        session.n_threads = result.n_threads
        note = ensure_cpu_probe(session, args, quiet=args.json)
        if note:
            print(note, file=sys.stderr)
    side = _bench_side_by_side(plan, result)
    if plan_error:
        side["plan_error"] = plan_error
    if session is not None and plan is not None and not args.no_record and keep.calibrate:
        note = _bench_record(session, plan, measurement)
        if note:
            print(note, file=sys.stderr)
    if not args.no_save and keep.library:
        note = _bench_save(model_path, config, result, session)
        if note:
            print(note, file=sys.stderr)
    if args.json:
        doc = {"schema": "kvtuner.bench/1", **result.to_dict(), **side}
        doc["model_path"] = str(model_path)
        assert recorder.contention is not None  # finish() measured it
        doc["contention"] = {
            **recorder.contention.to_dict(),
            "recorded": keep.calibrate and not args.no_record,
            "reason": keep.reason,
        }
        doc["engine"] = {
            "kind": engine.kind,
            "label": engine.label,
            "build": engine.build,
            "commit": engine.commit,
            "server": None if engine.server is None else str(engine.server),
        }
        emit_json(doc)
    else:
        print(f"engine     {engine.label}" + (f" ({engine.server})" if engine.server else ""))
        print(_bench_text(result, side))
        if measurement.busy and not keep.library:
            print(
                f"not kept   busy machine: {measurement.other_cores:.1f} cores of other load during the bench "
                "(not recorded for calibration, not saved as a working configuration; --record-anyway keeps it)"
            )
    return 0


def _bench_text(result: BenchResult, side: dict) -> str:
    from ..core.units import fmt_bytes

    r = result
    c = r.config

    def stat(s: Stat | None, unit: str, fmt: str = "{:.1f}") -> str:
        if s is None:
            return "-"
        return (
            f"{fmt.format(s.median)} {unit}  (median of {s.n}; min {fmt.format(s.min)}, max {fmt.format(s.max)}, "
            f"stdev {fmt.format(s.stdev)})"
        )

    fa = {True: "on", False: "off", None: "?"}[r.flash_attn]
    ngl = "all" if c.n_gpu_layers < 0 else str(c.n_gpu_layers)
    lines = [
        f"model      {r.model_path}",
        f"llama.cpp  {r.llama_build}; devices {', '.join(r.devices) or '-'}; GPU offload "
        f"{'yes' if r.gpu_offload_supported else 'no'}; threads {r.n_threads}",
        f"config     n_ctx {r.n_ctx} (asked {c.n_ctx}), ngl {ngl}, K {c.type_k} / V {c.type_v}, "
        f"flash attn {c.flash_attn} -> {fa}, n_seq {c.n_seq}, ubatch {c.n_ubatch}, swa_full {c.swa_full}",
        "",
        f"load       {r.load_s:.2f} s",
        f"prefill    {r.n_prompt} tok at depth {r.n_depth}: {stat(r.prefill_tok_s, 'tok/s')}",
        f"decode     {r.n_gen} tok: {stat(r.decode_tok_s, 'tok/s')}",
        f"TTFT       {stat(r.ttft_s, 's', '{:.3f}')}",
        f"peak RSS   {fmt_bytes(r.peak_rss_bytes)} (runner process)"
        + (
            f"; planned host total {fmt_bytes(side['planned_host_total_bytes'])} ({side['rss_vs_plan']:+.1%})"
            if side.get("planned_host_total_bytes") and "rss_vs_plan" in side
            else ""
        ),
    ]
    if r.peak_vram_used_bytes:
        for idx, used in sorted(r.peak_vram_used_bytes.items()):
            proc = r.peak_vram_process_bytes.get(idx)
            lines.append(f"peak VRAM  GPU {idx}: {fmt_bytes(used)} used on the device, {fmt_bytes(proc)} by the runner")
    else:
        lines.append("peak VRAM  - (no NVIDIA GPU found)")
    lines += ["", f"{'buffer':<22}{'planned':>14}{'measured':>14}"]
    planned = side.get("planned_devices", {})
    measured = side.get("measured_devices", {})
    for dev in sorted(set(planned) | set(measured)):
        for kind in ("weights", "repack", "kv", "compute", "output"):
            p = planned.get(dev, {}).get(f"{kind}_bytes")
            m = measured.get(dev, {}).get(f"{kind}_bytes")
            if not p and not m:
                continue
            lines.append(f"{dev + ' ' + kind:<22}{fmt_bytes(p):>14}{fmt_bytes(m):>14}")
    pk = side.get("planned_kv_bytes")
    match = side.get("kv_bytes_match")
    mark = {
        True: "equal",
        False: "DIFFERENT",
        None: "equal to llama.cpp's 0.01 MiB" if side.get("kv_mib_match") else "?",
    }[match]
    lines.append(
        f"{'KV total (bytes)':<22}{pk if pk is not None else '-':>14}{r.kv_bytes:>14}  {mark if pk is not None else ''}"
    )
    for cache in r.buffers.kv_caches:
        lines.append(
            f"  llama_kv_cache: {cache.size_mib:.2f} MiB ({cache.cells} cells, {cache.layers} layers, "
            f"{cache.n_seq}/{cache.n_stream} seqs), K ({cache.type_k}) {cache.k_mib:.2f}, V ({cache.type_v}) {cache.v_mib:.2f}"
        )
    if side.get("plan_error"):
        lines.append(f"note: no plan to compare with ({side['plan_error']})")
    for w in r.warnings:
        lines.append(f"warning: {w}")
    if r.kv_split_experimental:
        lines.append("note: the KV split across GPU and host uses tensor overrides (-ot)")
    return "\n".join(lines)
