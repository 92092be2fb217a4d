"""``kvtuner install-desktop``: put kvtuner in the desktop's application menu (Linux and other
freedesktop desktops): the desktop entry, icons and AppStream metainfo of :mod:`kvtuner.resources`
copied into the user's data directory, the entry running this kvtuner (pip/pipx script or bundle)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import UserError, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``install-desktop``."""
    p = sub.add_parser(
        "install-desktop",
        help="add kvtuner to the desktop's application menu (this user)",
        description="Write the desktop entry, icons and AppStream metainfo under $XDG_DATA_HOME "
        "(default ~/.local/share); the entry starts this kvtuner.",
    )
    p.add_argument(
        "--data-home", metavar="DIR", default=None, help="write under DIR instead of $XDG_DATA_HOME or ~/.local/share"
    )
    p.add_argument("--remove", action="store_true", help="remove what install-desktop wrote")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_install_desktop)


def cmd_install_desktop(args: argparse.Namespace) -> int:
    """``kvtuner install-desktop``."""
    from ..resources import install_desktop_entry, launch_command

    data_home = Path(args.data_home).expanduser() if args.data_home else None
    if data_home is not None and data_home.exists() and not data_home.is_dir():
        raise UserError(f"--data-home: {data_home} is a file: give a directory")
    command = launch_command()
    try:
        paths = install_desktop_entry(data_home, command, remove=args.remove)
    except OSError as exc:
        raise UserError(
            f"cannot write {exc.filename or 'the desktop entry'} ({exc.strerror}): "
            "pass --data-home DIR with a writable directory"
        ) from None
    if args.json:
        emit_json({"removed" if args.remove else "written": [str(p) for p in paths], "command": command})
        return 0
    if args.remove:
        print(f"removed {len(paths)} files" + (f" ({paths[0].parent})" if paths else ""))
    else:
        print(
            f"installed the desktop entry {paths[0]} (runs: {' '.join(command)}) and {len(paths) - 1} icon/metainfo files"
        )
    return 0
