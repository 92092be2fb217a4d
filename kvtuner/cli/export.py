"""``kvtuner export`` and ``kvtuner library``: one configuration for the tool you run it with, and
the configurations that ran well here."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .args import (
    UserError,
    add_config_args,
    add_engine_arg,
    add_extras_args,
    add_hardware_args,
    add_model_arg,
    add_vllm_args,
    any_hardware_flag,
    apply_hardware_flags,
    check_hardware_flags,
    config_from_args,
    emit_json,
    engine_from_args,
    extras_from_args,
    hardware_from_args,
    load_model,
    positive_int,
    resolve_model,
    rpc_endpoints,
    rules_from_args,
    session_from_args,
    split_from_args,
    vllm_model_from_args,
    vllm_settings_from_args,
    vllm_weights_from_args,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hardware.specs import GpuSpec
    from ..core.plan.config import PlanConfig

_EXPORT_FORMATS = (
    "llama-server",
    "llama-cli",
    "llama-cpp-python",
    "llama-cpp-python-json",
    "ollama",
    "koboldcpp",
    "profile",
    "vllm",
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``export`` and ``library``."""
    p = sub.add_parser(
        "export",
        help="write a configuration for llama-server, llama-cpp-python, Ollama, koboldcpp or a kvtuner profile",
        description="Export one configuration to the tool you run it with. What the target cannot express is "
        "printed as notes on stderr. Files are written atomically and never overwritten without --force.",
    )
    add_model_arg(p)
    add_engine_arg(p)
    add_config_args(p)
    add_extras_args(p)
    add_hardware_args(p)
    p.add_argument(
        "--format",
        dest="export_format",
        required=True,
        choices=_EXPORT_FORMATS,
        help="target: llama-server / llama-cli command line, llama-cpp-python snippet or kwargs JSON, "
        "Ollama Modelfile, koboldcpp .kcpps, kvtuner profile, vllm serve line (+ LLM kwargs and the "
        "KV blocks / maximum concurrency vLLM will log on the --gpu given)",
    )
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="write to FILE instead of stdout")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--profile",
        metavar="FILE",
        default=None,
        help="start from a kvtuner profile (its model and configuration; flags given here override)",
    )
    src.add_argument(
        "--from-library",
        metavar="ID",
        type=positive_int,
        default=None,
        help="start from a saved working configuration (see 'kvtuner library')",
    )
    src.add_argument(
        "--from-tune",
        metavar="FILE",
        default=None,
        help="start from a 'kvtuner tune --json' result (its model and best configuration)",
    )
    p.add_argument(
        "--gpu-buffer-type",
        default=None,
        metavar="BUFT",
        help="llama.cpp GPU buffer name for the partial KV split's -ot (default: the first GPU's, as its "
        "backend names it: CUDA0, ROCm0, Vulkan0 ...)",
    )
    p.add_argument(
        "--binary", default=None, metavar="PATH", help="llama-server / llama-cli executable to write in the command"
    )
    p.add_argument("--note", default=None, help="free text stored in a profile")
    add_vllm_args(p)
    p.set_defaults(func=cmd_export)

    lib = sub.add_parser(
        "library",
        help="list saved working configurations, best first",
        description="Configurations that ran to completion, with measured speed, per model and machine.",
    )
    add_model_arg(lib)
    lib.add_argument("--all-machines", action="store_true", help="include runs from other machines")
    lib.add_argument("--all-models", action="store_true", help="list every model's runs (ignores MODEL)")
    lib.add_argument("--json", action="store_true", help="machine-readable output")
    lib.set_defaults(func=cmd_library)


def cmd_export(args: argparse.Namespace) -> int:
    """``kvtuner export``."""
    from ..core.export import ExportError, MachineFingerprint, load_profile, write_export
    from ..core.store.library import ConfigLibrary, LibraryError

    base = None
    measured = None
    warnings: tuple[str, ...] = ()
    model_path = None
    try:
        if args.from_tune:
            model_path, base, hardware = _from_tune(args.from_tune)
            if args.model:
                model_path = resolve_model(args.model)
            # plan the export for the hardware the tune planned for, but for what the export sets itself
            taken = apply_hardware_flags(args, hardware)
            if taken:
                print(f"kvtuner: planned for the tune's hardware: {_describe_hardware(taken)}", file=sys.stderr)
        elif args.profile:
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
    config = config_from_args(args, base, model=lambda: load_model(str(model_path)))
    for note in getattr(args, "resolved_notes", ()):
        print(f"kvtuner: {note}", file=sys.stderr)
    if args.export_format == "vllm":
        result = _export_vllm(args, model_path, config)
    else:
        gpus = None
        if any_hardware_flag(args):
            config, gpus = _check_fits(args, model_path, config)
        result = _export_llama(args, model_path, config, measured, gpus)
    if args.output is not None:  # -o '' is a mistake, not "stdout"
        try:
            written = write_export(result, args.output, force=args.force)
        except ExportError as exc:
            raise UserError(str(exc)) from None
        print(f"kvtuner: wrote {written}", file=sys.stderr)
    else:
        sys.stdout.write(result.text)
    for note in result.limitations:
        print(f"kvtuner: note: {note}", file=sys.stderr)
    for w in getattr(result, "warnings", ()):
        print(f"kvtuner: warning: {w}", file=sys.stderr)
    return 0


def _export_vllm(args: argparse.Namespace, model_path: object, config: object) -> object:
    """The vLLM export: model fields from --hf-config or the GGUF, the card from the hardware
    flags (or the detected GPU; without either the prediction is left out)."""
    from ..core.export.vllm import render
    from ..core.plan.vllm import cuda_reported_total

    model, ref = vllm_model_from_args(args, str(model_path))
    settings = vllm_settings_from_args(args, config)  # type: ignore[arg-type]
    gpus, _host = hardware_from_args(args)
    total = cuda_reported_total(gpus[0].total_bytes) if gpus else None
    return render(
        ref,
        model,
        config,
        settings,
        total,
        vllm_weights_from_args(args, model),  # type: ignore[arg-type]
        gpus[0].name if gpus else "",
    )


def _gpu_buffer_type(args: argparse.Namespace, config: PlanConfig, gpus: list[GpuSpec] | None) -> str:
    """The first planned GPU's buffer name as its backend gives it (ggml-cuda ``GGML_CUDA_NAME``:
    "CUDA0", or "ROCm0" in a HIP build; ggml-vulkan "Vulkan0"; ggml-sycl "SYCL0"), "CUDA0" without
    a GPU. Only a partial KV split (``--kv-gpu-layers``) writes the name, so only then are the GPUs
    detected when ``gpus`` (those :func:`_check_fits` planned on) is None."""
    if config.kv_gpu_layers is None:
        return "CUDA0"
    if gpus is None:
        gpus, _host = hardware_from_args(args)
    return gpus[0].backend_device if gpus else "CUDA0"


def _export_llama(
    args: argparse.Namespace,
    model_path: object,
    config: PlanConfig,
    measured: object,
    gpus: list[GpuSpec] | None = None,
) -> object:
    """The llama.cpp-family exports (every format but vllm)."""
    from ..core.export import ExportError, ModelIdentity, export

    model = None
    if args.export_format == "profile":
        from ..core.model.profile import GGUFError, ModelProfile

        try:
            model = ModelIdentity.from_profile(ModelProfile.from_gguf(model_path))
        except GGUFError as exc:
            raise UserError(str(exc)) from None
    try:
        result = export(
            args.export_format,
            model_path,
            config,
            model=model,
            measured=measured,  # type: ignore[arg-type]
            gpu_buffer_type=args.gpu_buffer_type or _gpu_buffer_type(args, config, gpus),
            binary=args.binary,
            note=args.note,
            split=split_from_args(args),
            rpc=[e.partition("=")[0].strip() for e in rpc_endpoints(args)],
        )
        if args.export_format in ("llama-server", "llama-cli"):
            from ..core.export.checked import check_export
            from ..runner.export_check import build_flags

            flags = build_flags(engine_from_args(args, list_devices=False), args.export_format)
            result = check_export(_with_extras(args, result, flags, model_path), flags)
        elif not extras_from_args(args).empty:
            print(
                f"kvtuner: note: --mmproj, -md and --lora are written in llama-server and llama-cli exports only, "
                f"not in {args.export_format}",
                file=sys.stderr,
            )
        return result
    except ExportError as exc:
        raise UserError(str(exc)) from None


def _with_extras(args: argparse.Namespace, result: object, flags: object, model_path: object) -> object:
    """``result`` with the projector / draft / LoRA flags (:func:`kvtuner.core.plan.extras.server_flags`,
    spelled for the build of ``flags``) after the configuration's; the files are checked as
    llama-server would (one line on a bad file)."""
    from ..core.export.llama_server import with_extras
    from ..core.plan.config import ConfigError
    from ..core.plan.extras import check_files

    extras = extras_from_args(args)
    if extras.empty:
        return result
    try:
        check_files(extras, load_model(str(model_path)))
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    return with_extras(result, extras, getattr(flags, "flags", None))


def _describe_hardware(hardware: dict[str, object]) -> str:
    """The recorded hardware flags as a command line would give them (``--gpu "RX 7600"``)."""
    import shlex

    flag = {"gpu_name": "--gpu", "gpu_mem": "--gpu-mem", "rpc": "--rpc"}
    parts: list[str] = []
    for k, v in hardware.items():
        name = flag.get(k, "--" + k.replace("_", "-"))
        for x in v if isinstance(v, list) else [v]:
            parts.append(name if x is True else f"{name} {shlex.quote(str(x))}")
    return " ".join(parts)


def _from_tune(path: str) -> tuple[object, object, dict[str, object]]:
    """The model path, best configuration and hardware flags (``hardware``: the tune's own
    ``--gpu``, ``--host-mem`` ..., as parsed; empty for an older file) of a ``kvtuner tune --json``
    file.

    Raises:
        UserError: unreadable, not a tune result, or a result where nothing fit.
    """
    import json
    from pathlib import Path

    from ..core.plan.config import ConfigError, PlanConfig

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"--from-tune {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "kvtuner.tune/1":
        raise UserError(f"--from-tune {path}: not a 'kvtuner tune --json' result")
    best = doc.get("best")
    if not best:
        raise UserError(f"--from-tune {path}: the tune found nothing that fits, so there is nothing to export")
    try:
        config = PlanConfig.from_dict(best["config"])
    except (ConfigError, KeyError, TypeError) as exc:
        raise UserError(f"--from-tune {path}: its configuration is invalid ({exc})") from None
    hardware = check_hardware_flags(doc.get("hardware") or {}, f"--from-tune {path}")
    return Path(doc.get("model_path", "")), config, hardware


def cmd_library(args: argparse.Namespace) -> int:
    """``kvtuner library``."""
    from ..core.export import MachineFingerprint, ModelIdentity
    from ..core.store.library import ConfigLibrary, LibraryError
    from ..core.units import fmt_bytes

    model = None if args.all_models else ModelIdentity.from_profile(load_model(args.model))
    machine = None if args.all_machines else MachineFingerprint.current()
    try:
        with ConfigLibrary() as lib:
            runs = lib.known_good(model, machine)
    except LibraryError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        emit_json(
            [
                {
                    "id": r.id,
                    "created_utc": r.created_utc,
                    "model_path": str(r.model_path),
                    "model": r.model.to_dict(),
                    "machine": r.machine.to_dict(),
                    "llama_cpp_build": r.llama_cpp_build,
                    "config": r.config.to_dict(),
                    "measured": r.measured,
                    "note": r.note,
                }
                for r in runs
            ]
        )
        return 0
    if not runs:
        print(
            "no saved working configurations"
            + ("" if args.all_machines else " on this machine")
            + ("" if args.all_models else f" for {model.file_name}")
        )
        return 0
    print(f"{'id':>5}  {'decode tok/s':>12}  {'ctx':>7}  {'ngl':>4}  {'K/V':>11}  {'fa':>4}  {'peak VRAM':>10}  model")
    for r in runs:
        c = r.config
        ngl = "all" if c.n_gpu_layers < 0 else str(c.n_gpu_layers)
        tok = f"{r.decode_tok_s:.1f}" if r.decode_tok_s is not None else "-"
        print(
            f"{r.id:>5}  {tok:>12}  {c.n_ctx:>7}  {ngl:>4}  {c.type_k + '/' + c.type_v:>11}  {c.flash_attn:>4}  "
            f"{fmt_bytes(r.measured.get('peak_vram_bytes')):>10}  {r.model.file_name}"
        )
    return 0


def _check_fits(args: argparse.Namespace, model_path: object, config: object) -> tuple[PlanConfig, list[GpuSpec]]:
    """With hardware flags, plan what the target will run (:func:`kvtuner.core.export.fit.check_export`)
    on that hardware and say on stderr what the one fit verdict says when it is not "fits"; a
    target that cannot express the placement (Ollama: whole layers only) gets the nearest
    whole-layer placement that fits, with its predicted speed, or a "cannot express" warning.
    Returns the configuration to write (the export is still written when it does not fit: the
    target may be another machine) and the GPUs it was planned on."""
    from ..core.export.fit import check_export
    from ..core.plan.config import ConfigError

    model = load_model(str(model_path))
    session = session_from_args(args, model, config)  # type: ignore[arg-type]
    # planned as the target runs it: a llama-server export as llama-server, a llama-cpp-python
    # export as the build llama-cpp-python vendors
    session.rules = rules_from_args(args, args.export_format)
    inputs, _why = session.speed_inputs()
    try:
        fit = check_export(
            args.export_format,
            session.planned_model(),
            config,
            session.gpus,  # type: ignore[arg-type]
            session.host,
            margins=session.margins,
            inputs=inputs,
            split=session.split,
            rules=session.rules,
        )
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    for w in fit.warnings:
        print(f"kvtuner: warning: {w}", file=sys.stderr)
    return (fit.config if fit.config is not None else config), list(session.gpus)
