"""The app's resources: icon (SVG source and PNG sizes), freedesktop desktop entry, AppStream
metainfo. Read through :mod:`importlib.resources`, so they work from a checkout, a wheel and
the PyInstaller bundle alike (packaging/kvtuner.spec collects this package's data).

The PNGs are rendered from ``kvtuner.svg`` by ``resources/make_icons.py`` (top level of the
repository; not shipped). :func:`install_desktop_entry` is ``kvtuner install-desktop``: it copies
the entry, icons and metainfo into the user's XDG data directory, the places the freedesktop
Desktop Entry, Icon Theme and AppStream specifications name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

#: Reverse-DNS application id (AppStream component id, desktop file and icon name).
APP_ID = "io.github.kvtuner.kvtuner"
#: PNG sizes in pixels committed under icons/ (resources/make_icons.py SIZES_PX).
ICON_SIZES_PX = (16, 24, 32, 48, 64, 128, 256, 512)
DESKTOP_FILE = f"{APP_ID}.desktop"
METAINFO_FILE = f"{APP_ID}.metainfo.xml"
SVG_FILE = "kvtuner.svg"


def read_bytes(name: str) -> bytes:
    """The bytes of resource ``name`` (e.g. ``"kvtuner.svg"``, ``"icons/kvtuner-64.png"``).

    Raises:
        FileNotFoundError: no such resource.
    """
    node = resources.files(__name__)
    for part in name.split("/"):
        node = node.joinpath(part)
    return node.read_bytes()


def icon_png(size_px: int) -> bytes:
    """The app icon as PNG bytes, ``size_px`` one of :data:`ICON_SIZES_PX`.

    Raises:
        ValueError: a size that is not committed.
    """
    if size_px not in ICON_SIZES_PX:
        raise ValueError(f"no {size_px} px icon; sizes are {', '.join(map(str, ICON_SIZES_PX))}")
    return read_bytes(f"icons/kvtuner-{size_px}.png")


def launch_command() -> list[str]:
    """The command a desktop launcher should run to start this kvtuner: the bundle's
    executable when frozen (``sys.executable``), the ``kvtuner`` script when started through it
    (pip / pipx), else ``[python, "-m", "kvtuner"]``; absolute paths."""
    if getattr(sys, "frozen", False):
        return [os.path.abspath(sys.executable)]
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == "kvtuner" and script.is_file():
        return [str(script.resolve())]
    return [os.path.abspath(sys.executable), "-m", "kvtuner"]


def _exec_quote(arg: str) -> str:
    """One argument quoted for a desktop entry's ``Exec`` key (Desktop Entry Specification
    1.5, "The Exec key": reserved characters need double quotes; inside them ``"``, `` ` ``,
    ``$`` and ``\\`` are backslash-escaped; ``%`` is doubled)."""
    arg = arg.replace("%", "%%")
    if arg and not any(c in arg for c in " \t\n\"'\\><~|&;$*?#()`"):
        return arg
    escaped = "".join("\\" + c if c in '"`$\\' else c for c in arg)
    return f'"{escaped}"'


def desktop_entry(command: Sequence[str]) -> str:
    """The desktop entry text with ``Exec`` and ``TryExec`` pointing at ``command`` (argv)."""
    lines = []
    for line in read_bytes(DESKTOP_FILE).decode("utf-8").splitlines():
        if line.startswith("Exec="):
            line = "Exec=" + " ".join(_exec_quote(a) for a in command) + " gui %f"
            lines.append(line)
            lines.append("TryExec=" + _exec_quote(command[0]))
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def install_desktop_entry(
    data_home: Path | None = None, command: Sequence[str] | None = None, remove: bool = False
) -> list[Path]:
    """Install (or with ``remove`` delete) the desktop entry, icons and metainfo for this user.

    Writes ``applications/<APP_ID>.desktop``, ``icons/hicolor/<N>x<N>/apps/<APP_ID>.png`` for
    every size, ``icons/hicolor/scalable/apps/<APP_ID>.svg`` and ``metainfo/<APP_ID>.metainfo.xml``
    under ``data_home`` (default ``$XDG_DATA_HOME`` or ``~/.local/share``, XDG Base Directory
    Specification). ``command``: what the entry runs (default :func:`launch_command`).
    Returns the paths written (or removed).

    Raises:
        OSError: a directory or file could not be written.
    """
    if data_home is None:
        data_home = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    files: dict[Path, bytes] = {
        data_home / "applications" / DESKTOP_FILE: desktop_entry(command or launch_command()).encode("utf-8"),
        data_home / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg": read_bytes(SVG_FILE),
        data_home / "metainfo" / METAINFO_FILE: read_bytes(METAINFO_FILE),
    }
    for size in ICON_SIZES_PX:
        files[data_home / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"] = icon_png(size)
    done = []
    for path, data in files.items():
        if remove:
            if path.exists():
                path.unlink()
                done.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        done.append(path)
    return done
