"""The layering rule: kvtuner.core imports neither Qt, pyqtgraph nor llama_cpp."""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import kvtuner.core

ROOT = Path(__file__).resolve().parents[1]


def _core_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(kvtuner.core.__path__, "kvtuner.core.")]


def test_core_imports_with_qt_and_llama_cpp_blocked():
    """Import every core module in a fresh interpreter where the forbidden packages cannot load."""
    mods = _core_modules()
    assert "kvtuner.core.plan.memory_plan" in mods
    code = (
        "import sys\n"
        "for name in ('PySide6', 'pyqtgraph', 'llama_cpp', 'shiboken6'):\n"
        "    sys.modules[name] = None  # any import of them raises ImportError\n"
        "import importlib\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = [m for m in sys.modules if m.startswith(('kvtuner.gui', 'kvtuner.runner.worker'))]\n"
        "assert not bad, bad\n"
        "print('ok', len(" + repr(mods) + "))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


def test_import_linter_contracts():
    """The import-linter contracts in pyproject.toml hold (static check, indirect imports too)."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a test dependency: pip install -e .[test]"
    out = subprocess.run([exe, "--no-cache"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "broken" not in out.stdout.lower().replace("0 broken", "")
