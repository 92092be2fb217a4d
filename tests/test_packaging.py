"""Installing kvtuner: version and About, the app resources (icon, desktop entry, metainfo) read
through importlib.resources, a wheel that carries them, install-desktop, and the runner child's
re-entry through a frozen app's executable (packaging/kvtuner_main.py). The built bundle itself
is checked by packaging/smoke.py (`make package package-smoke`, see docs/getting-started/install.md)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvtuner
from kvtuner import about
from kvtuner.resources import (
    APP_ID,
    DESKTOP_FILE,
    ICON_SIZES_PX,
    METAINFO_FILE,
    desktop_entry,
    icon_png,
    read_bytes,
)
from kvtuner.runner import client as runner_client
from kvtuner.testing.cli import run_kvtuner

ROOT = Path(__file__).resolve().parents[1]


_kvtuner = functools.partial(run_kvtuner, module="kvtuner", checkout=True)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_version_names_kvtuner_and_the_llama_cpp_build_it_plans_for():
    out = _kvtuner("--version")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == f"kvtuner {kvtuner.__version__} (python)"
    assert lines[1] == "plans for llama.cpp 0c1e570 (ggml 0.25.3), as vendored by llama-cpp-python 0.3.36"
    assert lines[2].startswith("installed: llama-cpp-python 0.3.36")


def test_planned_build_is_the_installed_one():
    """The commit and ggml version kvtuner names are the ones compiled into the installed
    libggml-base.so (ggml_commit() / ggml_version() strings), and the pin in pyproject."""
    spec = importlib.util.find_spec("llama_cpp")  # locates the package without importing it
    lib = Path(spec.submodule_search_locations[0]) / "lib" / "libggml-base.so"
    data = lib.read_bytes()
    assert f"{about.PLANNED_LLAMA_CPP_COMMIT}".encode() in data
    assert f"\0{about.PLANNED_GGML_VERSION}\0".encode() in data
    assert f'"llama-cpp-python=={about.PLANNED_LLAMA_CPP_PYTHON}"' in (ROOT / "pyproject.toml").read_text()


def test_icons_are_read_through_importlib_resources_at_their_sizes():
    for size in ICON_SIZES_PX:
        assert _png_size(icon_png(size)) == (size, size)
    assert b"<svg" in read_bytes("kvtuner.svg")
    with pytest.raises(ValueError, match="no 20 px icon"):
        icon_png(20)


def test_committed_icons_match_their_svg_source():
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    out = subprocess.run(
        [sys.executable, str(ROOT / "resources" / "make_icons.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_desktop_entry_and_metainfo_are_valid(tmp_path):
    entry = read_bytes(DESKTOP_FILE).decode()
    keys = dict(line.split("=", 1) for line in entry.splitlines()[1:] if "=" in line)
    assert entry.startswith("[Desktop Entry]\n")
    assert keys["Type"] == "Application" and keys["Icon"] == APP_ID and keys["Exec"] == "kvtuner gui %f"
    assert keys["Categories"].endswith(";")
    import xml.etree.ElementTree as ET

    root = ET.fromstring(read_bytes(METAINFO_FILE))
    assert root.findtext("id") == APP_ID
    assert root.find("launchable").text == DESKTOP_FILE
    assert root.find("releases/release").get("version") == kvtuner.__version__
    if shutil.which("appstreamcli"):  # the AppStream project's own validator, where installed
        copy = tmp_path / METAINFO_FILE
        copy.write_bytes(read_bytes(METAINFO_FILE))
        out = subprocess.run(
            ["appstreamcli", "validate", "--no-net", "--pedantic", str(copy)], capture_output=True, timeout=60
        )
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()


def test_exec_line_quotes_paths_as_the_desktop_entry_spec_says():
    text = desktop_entry(["/opt/my apps/kvtuner", "--x=$HOME", "100%"])
    exec_line = next(line for line in text.splitlines() if line.startswith("Exec="))
    assert exec_line == 'Exec="/opt/my apps/kvtuner" "--x=\\$HOME" 100%% gui %f'
    assert 'TryExec="/opt/my apps/kvtuner"' in text


def test_install_desktop_writes_entry_icons_and_metainfo_and_removes_them(tmp_path):
    out = _kvtuner("install-desktop", "--data-home", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    written = [Path(p) for p in doc["written"]]
    assert len(written) == 3 + len(ICON_SIZES_PX)
    entry = (tmp_path / "applications" / DESKTOP_FILE).read_text()
    assert f"Exec={sys.executable} -m kvtuner gui %f" in entry  # started as python -m kvtuner
    png = tmp_path / "icons" / "hicolor" / "48x48" / "apps" / f"{APP_ID}.png"
    assert _png_size(png.read_bytes()) == (48, 48)
    assert (tmp_path / "metainfo" / METAINFO_FILE).read_bytes() == read_bytes(METAINFO_FILE)
    out = _kvtuner("install-desktop", "--data-home", str(tmp_path), "--remove")
    assert out.returncode == 0 and out.stdout.startswith(f"removed {len(written)} files")
    assert not any(p.exists() for p in written)


def test_install_desktop_into_a_file_is_one_line_exit_2(tmp_path):
    (tmp_path / "f").write_text("x")
    out = _kvtuner("install-desktop", "--data-home", str(tmp_path / "f"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"kvtuner: --data-home: {tmp_path / 'f'} is a file: give a directory"]


def test_package_data_carries_the_resources_and_the_version(tmp_path):
    """setuptools' build_py (the step a wheel build copies the package from) on a copy of the
    sources: every resource file is in the built package, and the version is kvtuner.__version__
    (pyproject reads it from there)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "kvtuner", src / "kvtuner", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    setup = [sys.executable, "-c", "from setuptools import setup; setup()"]
    out = subprocess.run(
        [*setup, "-q", "build_py", "--build-lib", str(tmp_path / "lib")],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    built = tmp_path / "lib" / "kvtuner" / "resources"
    for name in ("kvtuner.svg", DESKTOP_FILE, METAINFO_FILE, *(f"icons/kvtuner-{s}.png" for s in ICON_SIZES_PX)):
        assert (built / name).read_bytes() == read_bytes(name)
    out = subprocess.run([*setup, "--version"], cwd=src, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == kvtuner.__version__, out.stderr


def test_child_command_re_enters_a_frozen_app(monkeypatch):
    assert runner_client.child_command() == [sys.executable, "-m", "kvtuner.runner"]
    assert runner_client.child_command("/usr/bin/python3") == ["/usr/bin/python3", "-m", "kvtuner.runner"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert runner_client.child_command() == [sys.executable, runner_client.RUNNER_ARGUMENT]
    from kvtuner.resources import launch_command

    assert launch_command() == [os.path.abspath(sys.executable)]


@pytest.mark.llama
def test_bundle_entry_script_runs_the_runner_child_with_the_re_entry_argument():
    """packaging/kvtuner_main.py (the frozen app's entry) started with --kvtuner-runner-child
    speaks the runner protocol: its first event is ``started`` with llama.cpp's system info;
    closing its stdin ends it with status 0."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "packaging" / "kvtuner_main.py"), runner_client.RUNNER_ARGUMENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        first = json.loads(proc.stdout.readline())
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first["type"] == "started", first
    assert first["pid"] == proc.pid
    assert first["llama_build"] == f"llama-cpp-python {about.PLANNED_LLAMA_CPP_PYTHON}"


def test_bundle_entry_script_is_the_command_line_otherwise():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "kvtuner_main.py"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0 and out.stdout.startswith(f"kvtuner {kvtuner.__version__}")


def test_help_about_shows_the_version_and_the_planned_llama_cpp_build(qtbot, tmp_path, make_window):
    """The real main window offscreen: Help > About opens a box naming the version, the
    llama.cpp build planned for and the installed one; the window carries the app icon."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    pytest.importorskip("PySide6")
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.gui.app import make_app
    from kvtuner.testing.gui_support import NO_MODEL

    app = make_app()
    w = make_window(PlanConfig(), model=NO_MODEL)
    help_menu = next(a.menu() for a in w.menuBar().actions() if a.text() == "&Help")
    about = next(a for a in help_menu.actions() if a.text() == "&About kvtuner")
    about.trigger()
    qtbot.waitUntil(lambda: w.about_box is not None and w.about_box.isVisible(), timeout=5_000)
    text = w.about_box.text()
    assert f"kvtuner {kvtuner.__version__}" in text
    assert "llama.cpp 0c1e570 (ggml 0.25.3), as vendored by llama-cpp-python 0.3.36" in text
    assert "Installed:</b> llama-cpp-python 0.3.36" in text
    assert w.about_box.windowTitle() == "About kvtuner"
    sizes = {(s.width(), s.height()) for s in w.windowIcon().availableSizes()}
    assert {(s, s) for s in ICON_SIZES_PX} <= sizes
    assert app.applicationVersion() == kvtuner.__version__
    w.about_box.close()
    w.shutdown()
