"""``kvtuner`` command line.

``kvtuner`` with no arguments opens the desktop app; ``kvtuner plan|inspect|bench|export``
are headless and take ``--json``. Every user mistake ends in one line on stderr and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from .core.config import PlanConfig
    from .core.hardware import GpuSpec, HostSpec
    from .core.model_profile import ModelProfile

EXIT_USAGE = 2


class UserError(Exception):
    """A mistake the user can fix; printed as ``kvtuner: <message>`` with exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
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
    g.add_argument("--ngl", "--n-gpu-layers", dest="ngl", type=_ngl, default=None, metavar="N|all",
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


def hardware_from_args(args: argparse.Namespace) -> "tuple[list[GpuSpec], HostSpec | None]":
    """GPUs and host for the plan: what-if sizes if given, else detected (no GPU is normal)."""
    from .core.hardware import HostSpec, what_if_gpu
    from .core.units import parse_size

    gpus: list = []
    if args.gpu_mem:
        try:
            gpus = [what_if_gpu(parse_size(s), index=i) for i, s in enumerate(args.gpu_mem)]
        except ValueError as exc:
            raise UserError(f"--gpu-mem: {exc}") from None
    elif not args.no_gpu:
        gpus = _detect_gpus()
    host = _detect_host()
    if args.ram:
        try:
            total = parse_size(args.ram)
        except ValueError as exc:
            raise UserError(f"--ram: {exc}") from None
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
    from .core.memory_plan import plan_memory
    from .core import report

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
    data = report.plan_dict(plan, verified)
    if args.json:
        emit_json(data)
    else:
        print(report.plan_text(plan, verified))
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

# --- export (kvtuner.core.export) ------------------------------------------------------------

# --- gui (kvtuner.gui) -----------------------------------------------------------------------


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
