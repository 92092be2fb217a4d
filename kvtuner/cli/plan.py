"""``kvtuner plan`` and ``kvtuner inspect``: the session's assessment, printed or as JSON."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .args import (UserError, add_config_args, add_hardware_args, add_model_arg, config_from_args, emit_json,
                   ensure_cpu_probe, load_model, positive_int, session_from_args)

if TYPE_CHECKING:  # pragma: no cover
    from ..core.model.profile import ModelProfile
    from ..core.plan.config import PlanConfig


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``plan`` and ``inspect``."""
    p = sub.add_parser("plan", help="plan where every byte goes for a configuration (headless)",
                       description="Plan weights, KV cache, compute and output buffers per device, as llama.cpp will allocate them.")
    add_model_arg(p)
    add_config_args(p)
    add_hardware_args(p)
    p.add_argument("-t", "--threads", type=positive_int, default=None, metavar="N",
                   help="CPU threads to predict the speed for (llama.cpp's -t; default: the physical cores)")
    p.add_argument("--verify", action="store_true", help="ask the installed llama.cpp (dry-run in a child process) for the exact buffers")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in README)")
    p.set_defaults(func=cmd_plan)

    i = sub.add_parser("inspect", help="show what kvtuner reads from a GGUF model (headless)")
    add_model_arg(i)
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=cmd_inspect)


def cmd_plan(args: argparse.Namespace) -> int:
    """``kvtuner plan``: one :class:`~kvtuner.core.session.Assessment`."""
    from ..core.plan.config import ConfigError
    from . import report

    model = load_model(args.model)
    config = config_from_args(args, model=model)
    session = session_from_args(args, model, config)
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads must be 1 or more (leave it out for the physical cores), not {args.threads}")
        session.n_threads = args.threads
    try:
        session.plan()  # a configuration llama.cpp would refuse fails here, before any dry run
        note = ensure_cpu_probe(session, args, quiet=args.json)
        if note:
            print(note, file=sys.stderr)
        if args.verify:
            session.set_verified(verify(model, config))
        elif session.needs_structure_probe and not args.no_probe:
            session.set_structure(probe(model))
        assessment = session.assess()
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    if assessment.speed is None and assessment.speed_error:
        print(f"kvtuner: no speed prediction: {assessment.speed_error}", file=sys.stderr)
    resolved = list(getattr(args, "resolved_notes", ()))
    if args.json:
        doc = assessment.to_dict()
        doc["resolved"] = resolved  # llama-server defaults as resolved (--ctx 0, -np -1)
        emit_json(doc)
    else:
        text = report.plan_text(assessment)
        print("\n".join([*(f"resolved: {n}" for n in resolved), text]))
    return 0


def verify(model: "ModelProfile", config: "PlanConfig") -> "object":
    """llama.cpp's dry run of ``config`` (child process).

    Raises:
        UserError: llama.cpp refused the configuration, or the runner is missing.
    """
    try:
        from ..runner.dryrun import DryRunError, dry_run
    except ImportError as exc:  # pragma: no cover - broken install
        raise UserError(f"--verify needs the runner: {exc}") from None
    try:
        return dry_run(model.path, config)
    except DryRunError as exc:
        raise UserError(f"llama.cpp refused this configuration ({exc.kind}): {exc}") from None


def probe(model: "ModelProfile") -> "object":
    """The model's layer structure read from the installed llama.cpp (a dry run in a child
    process, once per model and llama.cpp build: the session remembers it); None when
    llama.cpp is not installed or cannot load the model (the plan then stays approximate)."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from ..runner.dryrun import DryRunError, probe_structure

    if sys.stderr.isatty():
        print(f"kvtuner: reading {model.architecture}'s layer structure from llama.cpp (once per model) ...",
              file=sys.stderr)
    try:
        return probe_structure(model.path, model.structure)
    except DryRunError as exc:
        print(f"kvtuner: llama.cpp could not be asked for the layer structure ({exc.kind}): {exc}", file=sys.stderr)
        return None


def cmd_inspect(args: argparse.Namespace) -> int:
    """``kvtuner inspect``: the model profile."""
    from . import report

    model = load_model(args.model)
    if args.json:
        emit_json(model.to_dict())
    else:
        print(report.model_text(model))
    return 0
