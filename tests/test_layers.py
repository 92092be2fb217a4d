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


def _import_cycles(package: str) -> list[list[str]]:
    """Strongly connected groups of modules (size > 1) in ``package``'s import graph, with
    imports under ``if TYPE_CHECKING:`` counted too (grimp, import-linter's graph builder)."""
    import grimp

    graph = grimp.build_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return cycles


def test_no_import_cycles_anywhere():
    """No module of kvtuner imports itself back through others (TYPE_CHECKING imports included)."""
    assert _import_cycles("kvtuner") == []


def test_the_cycle_finder_sees_a_cycle(tmp_path, monkeypatch):
    """The check above can fail: a two-module cycle written here is found."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _import_cycles("cyclepkg") == [["cyclepkg.a", "cyclepkg.b"]]
