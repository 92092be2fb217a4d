"""``kvtuner gui`` (and plain ``kvtuner``): the desktop app."""

from __future__ import annotations

import argparse
import sys

from .args import (
    UserError,
    add_config_args,
    add_engine_arg,
    add_model_arg,
    add_what_if_args,
    any_config_flag,
    config_from_args,
    load_model,
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``gui``."""
    p = sub.add_parser(
        "gui",
        help="open the desktop app (the default command)",
        description="Live VRAM, RAM and tok/s graphs, tuning sliders with instant predictions, run control. "
        "MODEL may also be a kvtuner profile (.json): its model and configuration open.",
    )
    add_model_arg(p)
    add_engine_arg(p)
    add_config_args(p)
    add_what_if_args(p.add_argument_group("hardware (what the window plans for; change it in the window later)"))
    p.add_argument(
        "--screenshot",
        metavar="FILE",
        default=None,
        help="render the main window offscreen to a PNG and exit (no display needed)",
    )
    p.add_argument(
        "--run", action="store_true", help="with --screenshot: run a short bench first so the graphs show a real run"
    )
    p.set_defaults(func=cmd_gui)


def cmd_gui(args: argparse.Namespace) -> int:
    """``kvtuner gui``."""
    from pathlib import Path

    model = Path(args.model).expanduser() if args.model else None
    if model is not None and not model.exists():
        raise UserError(f"model file not found: {model}")
    config = config_from_args(args, model=lambda: load_model(args.model))
    if args.screenshot:
        shot = Path(args.screenshot).expanduser()
        try:
            shot.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(
                f"--screenshot: cannot create the folder {shot.parent} ({exc.strerror}): "
                "give a path in a writable folder"
            ) from None
        if shot.is_dir():
            raise UserError(f"--screenshot: {shot} is a directory: give a file name ending in .png")
    elif _no_display():  # Qt would abort with its own multi-line message (exit 134)
        raise UserError(
            "no display to open the app on (DISPLAY and WAYLAND_DISPLAY are not set): run it in a "
            "desktop session, or headless use 'kvtuner plan' or 'kvtuner gui --screenshot FILE'"
        )
    try:
        from ..gui.app import run
    except ImportError as exc:  # PySide6 / pyqtgraph missing
        raise UserError(f"the desktop app needs PySide6 and pyqtgraph: {exc}") from None
    plan_for, host = _hardware(args)
    return run(
        model,
        config if any_config_flag(args) else None,
        screenshot=args.screenshot,
        run=args.run,
        plan_for=plan_for,
        host=host,
    )


def _hardware(args: argparse.Namespace) -> tuple[tuple[str, int | None] | None, object]:
    """The window's "Plan for" choice and host from ``--gpu``/``--gpu-mem``/``--no-gpu``/``--ram``:
    ``(choice, custom bytes)`` as :class:`kvtuner.gui.widgets.hardware_panel.HardwarePanel` names
    it (None: the saved or detected choice) and a :class:`HostSpec` with the given RAM (None: this
    machine's, followed as it changes).

    Raises:
        UserError: an unknown card, a size without a unit, or more than one card (the window's
            Devices list takes further cards).
    """
    from .args import hardware_from_args

    names, sizes = args.gpu_name or [], args.gpu_mem or []
    if len(names) + len(sizes) > 1:
        raise UserError("gui takes one --gpu or --gpu-mem card: add further cards in the window's Devices list")
    if names and args.no_gpu:
        raise UserError("--no-gpu plans CPU only: leave out --gpu/--gpu-mem, or --no-gpu")
    gpus, host = hardware_from_args(args, detected=[])  # checks names and sizes, one line each
    plan_for: tuple[str, int | None] | None = None
    if args.no_gpu:
        plan_for = ("cpu", None)
    elif names:
        plan_for = ("card:" + gpus[0].catalogue, None)
    elif sizes:
        plan_for = ("custom", gpus[0].total_bytes)
    return plan_for, (host if args.ram or host.what_if else None)


def _no_display() -> bool:
    """Linux/BSD without an X11 or Wayland display and no Qt platform chosen (``QT_QPA_PLATFORM``):
    Qt's default xcb plugin cannot start there."""
    import os

    if sys.platform in ("win32", "darwin") or os.environ.get("QT_QPA_PLATFORM"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
