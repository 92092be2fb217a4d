"""Where shared code lives: tests and benchmarks import their fixtures from the ``kvtuner.testing``
package (never through ``sys.path`` edits), and the window's module keeps layout and wiring only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: an edit of the module search path: insert/append/extend/remove, slice or item assignment, +=
SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\.(insert|append|extend|remove|pop|clear)\s*\(|\[[^\]]*\]\s*=|\+=|=(?!=))")
#: the window's module: layout, wiring and the window's public face; the controllers live beside it
MAIN_WINDOW_MAX_LINES = 400


def test_no_sys_path_edits_in_tests_or_benchmarks():
    """No file under tests/ or benchmarks/ edits ``sys.path``: shared code comes from kvtuner.testing."""
    edits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for folder in ("tests", "benchmarks")
        for p in sorted((ROOT / folder).rglob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if SYS_PATH_EDIT.search(line) and p.name != "test_code_layout.py"
    ]
    assert edits == []


def test_the_sys_path_pattern_sees_edits():
    """The check above can fail: each kind of edit is matched, a read is not."""
    for line in (
        "sys.path.insert(0, str(ROOT))",
        "sys.path.append('x')",
        "sys.path[:0] = [here]",
        "sys.path += [here]",
        "sys.path = [p for p in sys.path]",
    ):
        assert SYS_PATH_EDIT.search(line), line
    assert not SYS_PATH_EDIT.search("path = [p for p in sys.path if p != here]")
    assert not SYS_PATH_EDIT.search("if sys.path == before:")


def test_main_window_is_layout_and_wiring():
    """kvtuner/gui/main_window.py stays under 400 lines: what the window does lives in its controllers."""
    lines = len((ROOT / "kvtuner" / "gui" / "main_window.py").read_text(encoding="utf-8").splitlines())
    assert lines < MAIN_WINDOW_MAX_LINES, lines
