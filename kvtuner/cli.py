"""``kvtuner`` command line.

``kvtuner`` with no arguments opens the desktop app; ``kvtuner plan|inspect|bench|export``
are headless and take ``--json``. Every user mistake ends in one line on stderr and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import typing
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from .core.config import PlanConfig
    from .core.hardware import GpuSpec, HostSpec
    from .core.model_profile import ModelProfile

EXIT_USAGE = 2


class UserError(Exception):
    """A mistake the user can fix; printed as ``kvtuner: <message>`` with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with the usage errors on one line too (``kvtuner plan: error: ...``, exit 2),
    not the whole usage block; ``--help`` still prints it. Subparsers inherit the class."""

    def error(self, message: str) -> "typing.NoReturn":  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = _Parser(
        prog="kvtuner",
        description="Plan, monitor and tune llama.cpp memory for long contexts on small GPUs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _REGISTRARS:
        register(sub)
    return parser


_REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = []


def _registrar(fn: Callable[[argparse._SubParsersAction], None]) -> Callable[[argparse._SubParsersAction], None]:
    _REGISTRARS.append(fn)
    return fn


# --- shared: model and configuration arguments --------------------------------------------


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    """Optional positional MODEL (a .gguf path; default: the embedded Gemma 3 270M)."""
    parser.add_argument("model", nargs="?", metavar="MODEL",
                        help="GGUF model file (first part of a split model); default: embedded Gemma 3 270M Q4_K_M")


def resolve_model(arg: str | None) -> "Path":
    """The model path for a MODEL argument; None means the embedded default model.

    Raises:
        UserError: the default model package is broken.
    """
    from pathlib import Path

    if arg:
        return Path(arg).expanduser()
    from .core.default_model import DefaultModelError, default_model_path

    try:
        return default_model_path()
    except DefaultModelError as exc:
        raise UserError(str(exc)) from None


def load_model(arg: str | None) -> "ModelProfile":
    """Read the model profile for a MODEL argument; GGUF problems become :class:`UserError`."""
    from .core.model_profile import GGUFError, ModelProfile

    try:
        return ModelProfile.from_gguf(resolve_model(arg))
    except GGUFError as exc:
        raise UserError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None


def _ngl(text: str) -> int:
    from .core.config import ALL_LAYERS

    if text.strip().lower() == "all":
        return ALL_LAYERS
    return _positive_int(text)


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """The configuration flags shared by plan, bench, export and gui (llama.cpp spellings in help)."""
    g = parser.add_argument_group("configuration (llama.cpp flags in brackets)")
    g.add_argument("--ctx", "-c", type=_positive_int, default=None, metavar="N", help="context size in tokens [-c] (default 4096)")
    g.add_argument("--ngl", "-ngl", "--n-gpu-layers", dest="ngl", type=_ngl, default=None, metavar="N|all",
                   help="layers on the GPU, output layer included [-ngl] (default all)")
    g.add_argument("--kv-gpu-layers", type=_positive_int, default=None, metavar="N",
                   help="offloaded layers that keep their KV cache in VRAM; 0 = [-nkvo] (default: all offloaded)")
    g.add_argument("--cache-type-k", "-ctk", default=None, metavar="T", help="K cache type [-ctk]: f32 f16 bf16 q8_0 q5_1 q5_0 q4_1 q4_0 iq4_nl")
    g.add_argument("--cache-type-v", "-ctv", default=None, metavar="T", help="V cache type [-ctv] (quantized V needs flash attention)")
    g.add_argument("--flash-attn", "-fa", default=None, choices=["on", "off", "auto"], help="flash attention [-fa] (default auto)")
    g.add_argument("--parallel", "-np", type=_positive_int, default=None, metavar="N", help="parallel sequences [-np] (default 1)")
    g.add_argument("--ubatch", "-ub", type=_positive_int, default=None, metavar="N", help="physical batch size [-ub] (default 512)")
    g.add_argument("--batch", "-b", type=_positive_int, default=None, metavar="N", help="logical batch size [-b] (default 2048)")
    g.add_argument("--swa-full", action="store_true", default=None, help="full-size cache for sliding-window layers [--swa-full]")
    g.add_argument("--kv-unified", action="store_true", default=None, help="one KV buffer for all sequences [--kv-unified]")
    g.add_argument("--no-mmap", action="store_true", default=None, help="read weights into RAM instead of memory-mapping [--no-mmap]")


def config_from_args(args: argparse.Namespace, base: "PlanConfig | None" = None) -> "PlanConfig":
    """Build a :class:`PlanConfig` from :func:`add_config_args` flags (unset flags keep ``base``).

    Raises:
        UserError: an impossible configuration, with what to change.
    """
    from dataclasses import replace

    from .core.config import ConfigError, PlanConfig

    mapping = {
        "ctx": "n_ctx", "ngl": "n_gpu_layers", "kv_gpu_layers": "kv_gpu_layers", "cache_type_k": "type_k",
        "cache_type_v": "type_v", "flash_attn": "flash_attn", "parallel": "n_seq", "ubatch": "n_ubatch",
        "batch": "n_batch", "swa_full": "swa_full", "kv_unified": "kv_unified",
    }
    changes = {field: getattr(args, flag) for flag, field in mapping.items() if getattr(args, flag, None) is not None}
    if getattr(args, "no_mmap", None):
        changes["use_mmap"] = False
    # a quantized V with FA left at default: llama.cpp turns FA on (auto); keep that behaviour
    try:
        return replace(base or PlanConfig(), **changes)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def add_hardware_args(parser: argparse.ArgumentParser) -> None:
    """``--gpu-mem SIZE`` (what-if GPU, repeatable) and ``--ram SIZE``."""
    g = parser.add_argument_group("hardware")
    g.add_argument("--gpu-mem", action="append", default=None, metavar="SIZE",
                   help="plan for a what-if GPU of this size (e.g. 12G); repeat for several GPUs; default: the detected GPUs")
    g.add_argument("--no-gpu", action="store_true", help="plan a CPU-only run even if a GPU is detected")
    g.add_argument("--ram", default=None, metavar="SIZE", help="host RAM to plan for (default: this machine's)")


#: Smallest --gpu-mem / --ram taken as meant (bytes): below it a unit was surely forgotten.
MIN_MEMORY_BYTES = 1 << 20


def hardware_from_args(args: argparse.Namespace) -> "tuple[list[GpuSpec], HostSpec | None]":
    """GPUs and host for the plan: what-if sizes if given, else detected (no GPU is normal)."""
    from .core.hardware import HostSpec, what_if_gpu
    from .core.units import parse_size

    def size(flag: str, text: str) -> int:
        try:
            n = parse_size(text)
        except ValueError as exc:
            raise UserError(f"{flag}: {exc}") from None
        if n < MIN_MEMORY_BYTES:  # 0, or a bare number read as bytes ("--gpu-mem 12")
            raise UserError(f"{flag}: {text.strip()!r} is {n} bytes, too small for a memory size: give a unit, e.g. 12G")
        return n

    gpus: list = []
    if args.gpu_mem:
        gpus = [what_if_gpu(size("--gpu-mem", s), index=i) for i, s in enumerate(args.gpu_mem)]
    elif not args.no_gpu:
        gpus = _detect_gpus()
    host = _detect_host()
    if args.ram:
        total = size("--ram", args.ram)
        host = HostSpec(total_bytes=total, available_bytes=total)
    return gpus, host


def _detect_gpus() -> list:
    try:
        from .core.samplers import detect_gpus
    except ImportError:  # samplers not built yet
        return []
    return list(detect_gpus())


def _detect_host() -> "HostSpec":
    from .core.hardware import HostSpec
    import psutil

    vm = psutil.virtual_memory()
    return HostSpec(total_bytes=vm.total, available_bytes=vm.available, swap_total_bytes=psutil.swap_memory().total)


def emit_json(obj: object) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    import json

    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


# --- plan / inspect (kvtuner.core.memory_plan) -------------------------------------------


@_registrar
def _register_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan where every byte goes for a configuration (headless)",
                       description="Plan weights, KV cache, compute and output buffers per device, as llama.cpp will allocate them.")
    add_model_arg(p)
    add_config_args(p)
    add_hardware_args(p)
    p.add_argument("--verify", action="store_true", help="ask the installed llama.cpp (dry-run in a child process) for the exact buffers")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in README)")
    p.set_defaults(func=_cmd_plan)

    i = sub.add_parser("inspect", help="show what kvtuner reads from a GGUF model (headless)")
    add_model_arg(i)
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=_cmd_inspect)


def _cmd_plan(args: argparse.Namespace) -> int:
    from .core.config import ConfigError
    from .core import compute_cache, report
    from .core.memory_plan import plan_memory

    model = load_model(args.model)
    config = config_from_args(args)
    gpus, host = hardware_from_args(args)
    try:
        plan = plan_memory(model, config, gpus, host)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    verified = None
    if args.verify:
        verified = _verify(model, config)
        if verified.devices == ("CPU",) and plan.gpus:
            pass  # a CPU-only llama.cpp cannot verify a GPU plan's buffers; shown side by side only
        else:
            exact = compute_cache.remember(plan, verified.compute_mib)
            plan = plan_memory(model, config, gpus, host, compute_override=exact)
    else:
        exact = compute_cache.exact_for(plan)
        if exact:
            plan = plan_memory(model, config, gpus, host, compute_override=exact)
    from .core.advisor import advise
    from .core.calibration import CalibrationStore, calibrated_inputs, machine_id
    from .core.speed_model import SpeedModelError, predict_speed, speed_inputs

    speed = None
    try:
        store = CalibrationStore()
        mid = machine_id(gpus)
        host_bw = host
        bw = store.host_bandwidth_bytes_s(mid)  # stored probe, re-measured weekly
        if host_bw is not None and bw and not host_bw.mem_bandwidth_bytes_s:
            from dataclasses import replace as _replace

            host_bw = _replace(host_bw, mem_bandwidth_bytes_s=bw)
        speed = predict_speed(plan, calibrated_inputs(speed_inputs(gpus, host_bw), model, store, mid))
    except SpeedModelError as exc:
        print(f"kvtuner: no speed prediction: {exc}", file=sys.stderr)
    advice = [a.to_dict() for a in advise(plan, speed)]
    data = report.plan_dict(plan, verified, advice, speed)
    if args.json:
        emit_json(data)
    else:
        print(report.plan_text(plan, verified, advice, speed))
    return 0


def _verify(model: "ModelProfile", config: "PlanConfig") -> "object":
    try:
        from .runner.dryrun import DryRunError, dry_run
    except ImportError as exc:  # pragma: no cover - broken install
        raise UserError(f"--verify needs the runner: {exc}") from None
    try:
        return dry_run(model.path, config)
    except DryRunError as exc:
        raise UserError(f"llama.cpp refused this configuration ({exc.kind}): {exc}") from None


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .core import report

    model = load_model(args.model)
    if args.json:
        emit_json(model.to_dict())
    else:
        print(report.model_text(model))
    return 0


# --- bench (kvtuner.runner) ------------------------------------------------------------------

if TYPE_CHECKING:  # pragma: no cover
    from .core.memory_plan import MemoryPlan
    from .runner.bench import BenchResult, Stat


@_registrar
def _register_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench", help="load a model in a child process and measure load, prefill and decode (headless)",
        description="Benchmark a configuration like llama-bench: prefill P tokens at depth D, then decode G tokens, "
        "R times; report tok/s (median and spread), time to first token, load time, peak RAM/VRAM, and the "
        "planned and measured buffers side by side.",
    )
    add_model_arg(b)
    add_config_args(b)
    g = b.add_argument_group("benchmark")
    g.add_argument("-p", "--n-prompt", type=_positive_int, default=512, metavar="P", help="prompt tokens to prefill (default 512)")
    g.add_argument("-n", "--n-gen", type=_positive_int, default=128, metavar="G", help="tokens to decode (default 128)")
    g.add_argument("-d", "--n-depth", type=_positive_int, default=0, metavar="D", help="context depth before the prompt (default 0)")
    g.add_argument("-r", "--repetitions", type=_positive_int, default=3, metavar="R", help="repetitions (default 3)")
    g.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N", help="CPU threads (default: physical cores)")
    g.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="give up after S seconds (default 3600)")
    g.add_argument("--no-record", action="store_true",
                   help="do not record this run for speed calibration (by default every successful bench refines "
                        "the speed model for this machine and model family)")
    g.add_argument("--no-save", action="store_true",
                   help="do not save this run in the working-configs library (by default every completed bench is "
                        "kept with its measured numbers; see 'kvtuner library'; KVTUNER_LIBRARY=off also turns it off)")
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.set_defaults(func=_cmd_bench)


def _bench_plan(model_path: "Path", config: "PlanConfig", gpu_offload: bool,
                gpus: "list[GpuSpec] | None" = None) -> "tuple[MemoryPlan | None, str]":
    """The analytic plan for the bench's side-by-side table, for the devices llama.cpp could
    use (no GPU when the installed build cannot offload); ``(None, reason)`` when it fails.
    ``gpus``: the detected GPUs (None: detect them)."""
    try:
        from .core.memory_plan import plan_memory
        from .core.model_profile import ModelProfile

        model = ModelProfile.from_gguf(model_path)
        if gpus is None:
            gpus = _detect_gpus()
        return plan_memory(model, config, gpus if gpu_offload else [], _detect_host()), ""
    except Exception as exc:  # the measurement stands on its own; say why the plan is missing
        return None, f"{type(exc).__name__}: {exc}"


def _bench_record(plan: "MemoryPlan", result: "BenchResult", gpus: "list[GpuSpec]") -> str:
    """Record a successful bench for speed calibration; returns a note for stderr ("" if nothing
    was measured). A calibration store that cannot be written is a note, not a failure."""
    from .core.calibration import CalibrationError, CalibrationStore, record_bench

    prefill = result.prefill_tok_s.median if result.prefill_tok_s else None
    decode = result.decode_tok_s.median if result.decode_tok_s else None
    if not prefill and not decode:
        return ""
    try:
        store = CalibrationStore()
        run = record_bench(plan, gpus=gpus, host=_detect_host(), n_threads=result.n_threads, n_depth=result.n_depth,
                           n_prompt=result.n_prompt, n_gen=result.n_gen, prefill_tok_s=prefill, decode_tok_s=decode,
                           store=store)
        n = len([r for r in store.runs(run.machine) if r.family == run.family])
    except CalibrationError as exc:
        return f"kvtuner: this run was not recorded for calibration: {exc}"
    return (f"kvtuner: recorded for speed calibration ({run.family}: {n} run{'s' if n != 1 else ''} on this machine; "
            f"--no-record skips this)")


def _bench_save(model_path: "Path", config: "PlanConfig", result: "BenchResult", gpus: "list[GpuSpec]") -> str:
    """Save a completed bench in the working-configs library (unless ``KVTUNER_LIBRARY=off``);
    returns a note for stderr. A library that cannot be written is a note, not a failure."""
    from .core.export import MachineFingerprint
    from .core.library import LibraryError, record_completed_run
    from .core.model_profile import GGUFError, ModelProfile
    from .runner.bench import measured_figures

    try:
        run_id = record_completed_run(ModelProfile.from_gguf(model_path), config, measured_figures(result),
                                      model_path=model_path, machine=MachineFingerprint.current(gpus=gpus))
    except (LibraryError, GGUFError, ValueError, OSError) as exc:
        return f"kvtuner: this run was not saved in the working-configs library: {exc}"
    if run_id is None:
        return ""
    return f"kvtuner: saved as working configuration {run_id} ('kvtuner library' lists them; --no-save skips this)"


def _buft_device(buft: str) -> str:
    """llama.cpp buffer name -> device: ``CUDA0`` stays, host buffers (CPU, CPU_Mapped,
    CPU_REPACK, CUDA_Host ...) are the host ``CPU``."""
    import re

    m = re.match(r"^([A-Za-z]+\d+)(?:$|_)", buft)
    return m.group(1) if m and not buft.startswith("CPU") else "CPU"


def _bench_side_by_side(plan: "MemoryPlan | None", result: "BenchResult") -> dict:
    """Planned and measured bytes per buffer kind and device."""
    from .core.units import MiB

    measured: dict[str, dict[str, float]] = {}
    for kind, table in (("weights", result.buffers.model_mib), ("kv", result.buffers.kv_buffer_mib),
                        ("compute", result.buffers.compute_mib), ("output", result.buffers.output_mib)):
        for buft, mib in table.items():
            dev = _buft_device(buft)
            measured.setdefault(dev, {}).setdefault(f"{kind}_bytes", 0)
            measured[dev][f"{kind}_bytes"] += int(round(mib * MiB))
    doc: dict = {"measured_devices": measured, "measured_kv_bytes": result.kv_bytes,
                 "measured_kv_bytes_exact": result.kv_bytes_exact}
    if plan is not None:
        planned_kv = plan.kv_bytes
        doc["planned_kv_bytes"] = planned_kv
        doc["planned_devices"] = {
            d.device: {"weights_bytes": d.weights_bytes, "kv_bytes": d.kv_bytes, "compute_bytes": d.compute_bytes,
                       "output_bytes": d.output_bytes}
            for d in plan.devices
        }
        doc["planned_kv_caches"] = [
            {"kind": c.kind, "cells": c.cells, "layers": c.layers, "kv_bytes": c.kv_bytes} for c in plan.kv_caches
        ]
        # llama.cpp prints each cache's K and V in MiB with 2 decimals: compare at that precision too
        printed = [round(c.size_mib, 2) for c in result.buffers.kv_caches]
        planned_printed = [round((c.k_bytes + c.v_bytes) / MiB, 2) for c in plan.kv_caches]
        doc["kv_bytes_match"] = (planned_kv == result.kv_bytes) if result.kv_bytes_exact else None
        doc["kv_mib_match"] = all(abs(a - b) <= 0.011 for a, b in zip(printed, planned_printed)) and len(printed) == len(planned_printed)
    return doc


def _cmd_bench(args: argparse.Namespace) -> int:
    from .runner.bench import BenchError, run_bench

    model_path = resolve_model(args.model)
    if not model_path.is_file():
        raise UserError(f"model file not found: {model_path}")
    config = config_from_args(args)
    if not args.timeout > 0:  # also NaN
        raise UserError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    if args.threads is not None and args.threads < 1:  # llama.cpp would quietly use its own default
        raise UserError(f"--threads must be 1 or more (leave it out for the physical cores), not {args.threads}")
    if not args.json and sys.stderr.isatty():
        print(f"kvtuner: benchmarking {model_path.name} ...", file=sys.stderr)
    try:
        result = run_bench(model_path, config, n_prompt=args.n_prompt, n_gen=args.n_gen, n_depth=args.n_depth,
                           repetitions=args.repetitions, n_threads=args.threads, timeout_s=args.timeout)
    except BenchError as exc:
        if exc.kind in ("invalid_config", "model_error", "out_of_memory"):
            raise UserError(f"bench failed ({exc.kind}): {exc}") from None
        print(f"kvtuner: bench failed ({exc.kind}): {exc}", file=sys.stderr)
        for line in exc.log_tail[-5:]:
            print(f"  | {line}", file=sys.stderr)
        return 1
    gpus = _detect_gpus()
    plan, plan_error = _bench_plan(model_path, config, result.gpu_offload_supported, gpus)
    side = _bench_side_by_side(plan, result)
    if plan_error:
        side["plan_error"] = plan_error
    if plan is not None and not args.no_record:
        note = _bench_record(plan, result, gpus)
        if note:
            print(note, file=sys.stderr)
    if not args.no_save:
        note = _bench_save(model_path, config, result, gpus)
        if note:
            print(note, file=sys.stderr)
    if args.json:
        doc = {"schema": "kvtuner.bench/1", **result.to_dict(), **side}
        doc["model_path"] = str(model_path)
        emit_json(doc)
    else:
        print(_bench_text(result, side))
    return 0


def _bench_text(result: "BenchResult", side: dict) -> str:
    from .core.units import fmt_bytes

    r = result
    c = r.config

    def stat(s: "Stat | None", unit: str, fmt: str = "{:.1f}") -> str:
        if s is None:
            return "-"
        return (f"{fmt.format(s.median)} {unit}  (median of {s.n}; min {fmt.format(s.min)}, max {fmt.format(s.max)}, "
                f"stdev {fmt.format(s.stdev)})")

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
        f"peak RSS   {fmt_bytes(r.peak_rss_bytes)} (runner process)",
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
        for kind in ("weights", "kv", "compute", "output"):
            p = planned.get(dev, {}).get(f"{kind}_bytes")
            m = measured.get(dev, {}).get(f"{kind}_bytes")
            if not p and not m:
                continue
            lines.append(f"{dev + ' ' + kind:<22}{fmt_bytes(p):>14}{fmt_bytes(m):>14}")
    pk = side.get("planned_kv_bytes")
    match = side.get("kv_bytes_match")
    mark = {True: "equal", False: "DIFFERENT", None: "equal to llama.cpp's 0.01 MiB" if side.get("kv_mib_match") else "?"}[match]
    lines.append(f"{'KV total (bytes)':<22}{pk if pk is not None else '-':>14}{r.kv_bytes:>14}  {mark if pk is not None else ''}")
    for cache in r.buffers.kv_caches:
        lines.append(f"  llama_kv_cache: {cache.size_mib:.2f} MiB ({cache.cells} cells, {cache.layers} layers, "
                     f"{cache.n_seq}/{cache.n_stream} seqs), K ({cache.type_k}) {cache.k_mib:.2f}, V ({cache.type_v}) {cache.v_mib:.2f}")
    if side.get("plan_error"):
        lines.append(f"note: no plan to compare with ({side['plan_error']})")
    for w in r.warnings:
        lines.append(f"warning: {w}")
    if r.kv_split_experimental:
        lines.append("note: the KV split across GPU and host uses tensor overrides (EXPERIMENTAL)")
    return "\n".join(lines)


# --- export (kvtuner.core.export) ------------------------------------------------------------


_EXPORT_FORMATS = ("llama-server", "llama-cli", "llama-cpp-python", "llama-cpp-python-json", "ollama", "koboldcpp", "profile")


@_registrar
def _register_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a configuration for llama-server, llama-cpp-python, Ollama, koboldcpp or a kvtuner profile",
        description="Export one configuration to the tool you run it with. What the target cannot express is "
                    "printed as notes on stderr. Files are written atomically and never overwritten without --force.")
    add_model_arg(p)
    add_config_args(p)
    p.add_argument("--format", dest="export_format", required=True, choices=_EXPORT_FORMATS,
                   help="target: llama-server / llama-cli command line, llama-cpp-python snippet or kwargs JSON, "
                        "Ollama Modelfile, koboldcpp .kcpps, kvtuner profile")
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="write to FILE instead of stdout")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", metavar="FILE", default=None,
                     help="start from a kvtuner profile (its model and configuration; flags given here override)")
    src.add_argument("--from-library", metavar="ID", type=_positive_int, default=None,
                     help="start from a saved working configuration (see 'kvtuner library')")
    p.add_argument("--gpu-buffer-type", default="CUDA0", metavar="BUFT",
                   help="llama.cpp GPU buffer name for the partial KV split's -ot (default CUDA0; Vulkan0, ROCm0, Metal ...)")
    p.add_argument("--binary", default=None, metavar="PATH", help="llama-server / llama-cli executable to write in the command")
    p.add_argument("--note", default=None, help="free text stored in a profile")
    p.set_defaults(func=_cmd_export)

    lib = sub.add_parser("library", help="list saved working configurations, best first",
                         description="Configurations that ran to completion, with measured speed, per model and machine.")
    add_model_arg(lib)
    lib.add_argument("--all-machines", action="store_true", help="include runs from other machines")
    lib.add_argument("--all-models", action="store_true", help="list every model's runs (ignores MODEL)")
    lib.add_argument("--json", action="store_true", help="machine-readable output")
    lib.set_defaults(func=_cmd_library)


def _cmd_export(args: argparse.Namespace) -> int:
    from .core.export import ExportError, MachineFingerprint, ModelIdentity, export, load_profile, write_text_atomic
    from .core.library import ConfigLibrary, LibraryError

    base = None
    measured = None
    warnings: tuple[str, ...] = ()
    model_path = None
    try:
        if args.profile:
            model_path, base, warnings = load_profile(args.profile, model_path=args.model)
        elif args.from_library is not None:
            with ConfigLibrary() as lib:
                saved = lib.get(args.from_library)
            model_path, base, measured = saved.model_path, saved.config, saved.measured
            if args.model:
                model_path = resolve_model(args.model)
            if saved.machine.fingerprint_id != MachineFingerprint.current().fingerprint_id:
                warnings = ("this configuration was measured on another machine: " + saved.machine.describe(),)
    except (ExportError, LibraryError) as exc:
        raise UserError(str(exc)) from None
    except KeyError as exc:
        raise UserError(f"{exc.args[0]}: see 'kvtuner library' for the ids") from None
    for w in warnings:
        print(f"kvtuner: warning: {w}", file=sys.stderr)
    if model_path is None:
        model_path = resolve_model(args.model)
    if not model_path.is_file():
        raise UserError(f"{model_path}: model file not found: give the path of a .gguf file")
    config = config_from_args(args, base)
    model = None
    if args.export_format == "profile":
        from .core.model_profile import GGUFError, ModelProfile

        try:
            model = ModelIdentity.from_profile(ModelProfile.from_gguf(model_path))
        except GGUFError as exc:
            raise UserError(str(exc)) from None
    try:
        result = export(args.export_format, model_path, config, model=model, measured=measured,
                        gpu_buffer_type=args.gpu_buffer_type, binary=args.binary, note=args.note)
        if args.output is not None:  # -o '' is a mistake, not "stdout"
            written = write_text_atomic(args.output, result.text, force=args.force)
    except ExportError as exc:
        raise UserError(str(exc)) from None
    if args.output is not None:
        print(f"kvtuner: wrote {written}", file=sys.stderr)
    else:
        sys.stdout.write(result.text)
    for note in result.limitations:
        print(f"kvtuner: note: {note}", file=sys.stderr)
    return 0


def _cmd_library(args: argparse.Namespace) -> int:
    from .core.export import MachineFingerprint, ModelIdentity
    from .core.library import ConfigLibrary, LibraryError
    from .core.units import fmt_bytes

    model = None if args.all_models else ModelIdentity.from_profile(load_model(args.model))
    machine = None if args.all_machines else MachineFingerprint.current()
    try:
        with ConfigLibrary() as lib:
            runs = lib.known_good(model, machine)
    except LibraryError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        emit_json([{"id": r.id, "created_utc": r.created_utc, "model_path": str(r.model_path),
                    "model": r.model.to_dict(), "machine": r.machine.to_dict(), "llama_cpp_build": r.llama_cpp_build,
                    "config": r.config.to_dict(), "measured": r.measured, "note": r.note} for r in runs])
        return 0
    if not runs:
        print("no saved working configurations" + ("" if args.all_machines else " on this machine")
              + ("" if args.all_models else f" for {model.file_name}"))
        return 0
    print(f"{'id':>5}  {'decode tok/s':>12}  {'ctx':>7}  {'ngl':>4}  {'K/V':>11}  {'fa':>4}  {'peak VRAM':>10}  model")
    for r in runs:
        c = r.config
        ngl = "all" if c.n_gpu_layers < 0 else str(c.n_gpu_layers)
        tok = f"{r.decode_tok_s:.1f}" if r.decode_tok_s is not None else "-"
        print(f"{r.id:>5}  {tok:>12}  {c.n_ctx:>7}  {ngl:>4}  {c.type_k + '/' + c.type_v:>11}  {c.flash_attn:>4}  "
              f"{fmt_bytes(r.measured.get('peak_vram_bytes')):>10}  {r.model.file_name}")
    return 0


# --- gui (kvtuner.gui) -----------------------------------------------------------------------


@_registrar
def _register_gui(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gui", help="open the desktop app (the default command)",
                       description="Live VRAM, RAM and tok/s graphs, tuning sliders with instant predictions, run control. "
                                   "MODEL may also be a kvtuner profile (.json): its model and configuration open.")
    add_model_arg(p)
    add_config_args(p)
    p.add_argument("--screenshot", metavar="FILE", default=None,
                   help="render the main window offscreen to a PNG and exit (no display needed)")
    p.add_argument("--run", action="store_true",
                   help="with --screenshot: run a short bench first so the graphs show a real run")
    p.set_defaults(func=_cmd_gui)


def _cmd_gui(args: argparse.Namespace) -> int:
    from pathlib import Path

    config = config_from_args(args)
    model = Path(args.model).expanduser() if args.model else None
    if model is not None and not model.exists():
        raise UserError(f"model file not found: {model}")
    if args.screenshot:
        shot = Path(args.screenshot).expanduser()
        try:
            shot.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--screenshot: cannot create the folder {shot.parent} ({exc.strerror}): "
                            "give a path in a writable folder") from None
        if shot.is_dir():
            raise UserError(f"--screenshot: {shot} is a directory: give a file name ending in .png")
    elif _no_display():  # Qt would abort with its own multi-line message (exit 134)
        raise UserError("no display to open the app on (DISPLAY and WAYLAND_DISPLAY are not set): run it in a "
                        "desktop session, or headless use 'kvtuner plan' or 'kvtuner gui --screenshot FILE'")
    try:
        from .gui.app import run
    except ImportError as exc:  # PySide6 / pyqtgraph missing
        raise UserError(f"the desktop app needs PySide6 and pyqtgraph: {exc}") from None
    return run(model, config if _any_config_flag(args) else None, screenshot=args.screenshot, run=args.run)


def _no_display() -> bool:
    """Linux/BSD without an X11 or Wayland display and no Qt platform chosen (``QT_QPA_PLATFORM``):
    Qt's default xcb plugin cannot start there."""
    import os

    if sys.platform in ("win32", "darwin") or os.environ.get("QT_QPA_PLATFORM"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _any_config_flag(args: argparse.Namespace) -> bool:
    """Whether any configuration flag was given (else the app restores the saved configuration)."""
    names = ("ctx", "ngl", "kv_gpu_layers", "cache_type_k", "cache_type_v", "flash_attn", "parallel",
             "ubatch", "batch", "swa_full", "kv_unified", "no_mmap")
    return any(getattr(args, n, None) is not None for n in names)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvtuner`` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["gui", *(argv or [])]) if any(r.__name__ == "_register_gui" for r in _REGISTRARS) else args
        if args.command is None:
            parser.print_help()
            return 0
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"kvtuner: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvtuner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
