"""Start-up check: will Qt's X11 platform plugin load? If not, say which system packages to install.

Qt's own message when ``libqxcb.so`` cannot load names ``xcb-cursor0`` whatever is really
missing (on a plain Debian desktop ``libxcb-icccm4`` and ``libxcb-keysyms1`` were
missing while ``libxcb-cursor0`` was installed), then aborts. :func:`platform_problem` asks the
dynamic loader instead (``ldd`` on the plugin and on ``libQt6XcbQpa``: the libraries it reports
``not found``) and returns one line with the exact ``apt-get install`` command (and the ``dnf``
one), or "" when nothing is missing or the check does not apply.

Sources: the X11 requirements of Qt 6 ("Qt for X11 Requirements", doc.qt.io/qt-6/linux-requirements.html)
and the Debian/Ubuntu and Fedora package names that ship each library (packages.debian.org,
packages.fedoraproject.org).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

#: Library soname -> (Debian/Ubuntu package, Fedora package) for what Qt 6's xcb plugin links.
PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb-xinerama.so.0": ("libxcb-xinerama0", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libGLX.so.0": ("libglx0", "libglvnd-glx"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
}

#: What the install page (docs/getting-started/install.md) lists for Debian/Ubuntu: the libraries above that a minimal desktop may lack.
DEBIAN_PACKAGES = (
    "libxcb-cursor0",
    "libxcb-icccm4",
    "libxcb-keysyms1",
    "libxcb-image0",
    "libxcb-render-util0",
    "libxcb-xkb1",
    "libxkbcommon-x11-0",
    "libegl1",
    "libfontconfig1",
    "libdbus-1-3",
)
#: The same for Fedora.
FEDORA_PACKAGES = (
    "xcb-util-cursor",
    "xcb-util-wm",
    "xcb-util-keysyms",
    "xcb-util-image",
    "xcb-util-renderutil",
    "libxkbcommon-x11",
    "libglvnd-egl",
    "fontconfig",
    "dbus-libs",
)

_NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.MULTILINE)


def xcb_plugin_files() -> list[Path]:
    """Qt's X11 platform plugin and its QPA library in the installed PySide6 (those that exist)."""
    import PySide6  # the GUI layer's own dependency; no Qt module is loaded by importing the package

    qt = Path(PySide6.__file__).parent / "Qt"
    files = [qt / "plugins" / "platforms" / "libqxcb.so", *sorted((qt / "lib").glob("libQt6XcbQpa.so*"))[:1]]
    return [f for f in files if f.exists()]


def parse_ldd(output: str) -> list[str]:
    """The sonames ``ldd`` reports as ``not found``, in order, without repeats."""
    out: list[str] = []
    for name in _NOT_FOUND.findall(output):
        if name not in out:
            out.append(name)
    return out


def missing_libraries(files: list[Path] | None = None) -> list[str]:
    """Sonames the dynamic loader cannot find for ``files`` (default :func:`xcb_plugin_files`);
    [] when none is missing or ``ldd`` is not there to ask."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    out: list[str] = []
    for f in files if files is not None else xcb_plugin_files():
        try:
            res = subprocess.run([ldd, str(f)], capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        out += [n for n in parse_ldd(res.stdout) if n not in out]
    return out


def install_line(missing: list[str]) -> str:
    """The message for missing libraries: what is missing, then the exact ``apt-get install``
    (Debian/Ubuntu) and ``dnf install`` (Fedora) commands."""
    deb = list(dict.fromkeys(PACKAGES.get(n, (n, n))[0] for n in missing))
    fed = list(dict.fromkeys(PACKAGES.get(n, (n, n))[1] for n in missing))
    return (
        f"kvtuner: Qt's X11 platform plugin cannot load, missing {', '.join(missing)}. Install them with: "
        f"sudo apt-get install {' '.join(deb)}   (Fedora: sudo dnf install {' '.join(fed)})"
    )


def uses_xcb(env: dict[str, str] | None = None) -> bool:
    """Whether Qt will pick the X11 (xcb) platform: ``QT_QPA_PLATFORM`` says xcb, or says nothing
    and there is an X display but no Wayland one."""
    env = dict(os.environ) if env is None else env
    platform = env.get("QT_QPA_PLATFORM", "").strip().lower()
    if platform:
        return platform.split(":")[0] == "xcb" or platform.startswith("xcb;")
    return bool(env.get("DISPLAY")) and not env.get("WAYLAND_DISPLAY")


def platform_problem(env: dict[str, str] | None = None) -> str:
    """One line saying which packages to install when Qt's X11 plugin would not load; "" when
    nothing is missing or another platform (offscreen, Wayland ...) is used."""
    if not uses_xcb(env):
        return ""
    missing = missing_libraries()
    return install_line(missing) if missing else ""
