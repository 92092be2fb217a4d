"""Start-up: when Qt's X11 plugin lacks system libraries, ``kvtuner`` says which packages to
install (the exact ``apt-get install`` line) and exits 2, instead of Qt's abort that names
``xcb-cursor0`` whatever is missing. Real ``ldd`` on the real plugin."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from kvtuner.gui.platform_check import (
    DEBIAN_PACKAGES,
    FEDORA_PACKAGES,
    PACKAGES,
    install_line,
    missing_libraries,
    parse_ldd,
    uses_xcb,
    xcb_plugin_files,
)
from kvtuner.testing.cli import run_kvtuner

ROOT = Path(__file__).resolve().parents[1]


def test_the_platform_choice_follows_qt():
    assert uses_xcb({"DISPLAY": ":0"})
    assert not uses_xcb({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"})  # Qt 6 picks Wayland there
    assert not uses_xcb({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"})
    assert uses_xcb({"QT_QPA_PLATFORM": "xcb"}) and not uses_xcb({})


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_missing_libraries_are_what_the_loader_reports():
    files = xcb_plugin_files()
    assert files and files[0].name == "libqxcb.so"
    out = subprocess.run(["ldd", str(files[0])], capture_output=True, text=True, check=False).stdout
    missing = missing_libraries()
    assert set(parse_ldd(out)) <= set(missing)
    for name in missing:  # every library this machine lacks has its Debian and Fedora package
        assert name in PACKAGES
    assert parse_ldd(
        "\tlibxcb-icccm.so.4 => not found\n\tlibxcb.so.1 => /lib/libxcb.so.1 (0x1)\n"
        "\tlibxcb-keysyms.so.1 => not found\n\tlibxcb-icccm.so.4 => not found\n"
    ) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    line = install_line(["libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in line
    assert "sudo dnf install xcb-util-wm xcb-util-keysyms" in line
    assert {"libxcb-icccm4", "libxcb-keysyms1", "libxcb-cursor0"} <= set(DEBIAN_PACKAGES)
    assert {"xcb-util-wm", "xcb-util-keysyms", "xcb-util-cursor"} <= set(FEDORA_PACKAGES)


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_kvtuner_prints_the_install_line_and_exits_2():
    missing = missing_libraries()
    if not missing:
        pytest.skip("this machine has every library Qt's X11 plugin links")
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=":97", PYTHONPATH=str(ROOT))
    res = run_kvtuner("gui", env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    debs = " ".join(dict.fromkeys(PACKAGES[n][0] for n in missing))
    assert f"sudo apt-get install {debs}" in lines[0]
