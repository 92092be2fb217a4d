"""llama.cpp's rules are written once in kvtuner: a grep over ``kvtuner/`` finds no literal copy.

What the greps match (in code only: comments, docstrings and strings are skipped by reading
Python's tokens, so prose that cites ``GGML_PAD(n_ctx, 256)`` is fine):

- **the 256-cell context padding** (:data:`kvtuner.core.plan.llama_constants.CTX_PAD_CELLS`):
  a ``256`` that is an operand of ``%``, ``//``, ``/``, ``*``, ``-`` or ``+`` (``n % 256``,
  ``mid * 256``, ``(1 << 32) - 256``; ``256 * MiB``, a size, is not) or of an order comparison
  (``v < 256``: the smallest context; ``n_seq <= 256`` is ``LLAMA_MAX_SEQ``, defined beside it), the multiple given to
  ``pad_to``, or a ``256`` next to a context name (a lowercase name holding ``ctx``, ``n_kv`` or
  ``cells`` among the three tokens before it or the two after it: ``max(256, n_ctx)``,
  ``at_ctx(256)``, ``n_kv=256``). A head size of 256 or a ubatch of 256 is none of these.
- **the op offload batch** (:data:`kvtuner.core.plan.llama_constants.OFFLOAD_MIN_BATCH`): a
  ``32`` compared (``>=``, ``<`` ...) on a line that names a batch or an offload
  (``n_ubatch >= 32``), or next to such a name (three tokens before, two after:
  ``OFFLOAD_MIN_BATCH = 32``).
- **the bisection** (:func:`kvtuner.core.tune.bisection.largest_true`): a ``while`` loop in
  ``kvtuner/core`` that computes a midpoint ``(a + b) // 2`` or ``(a + b) >> 1``. common/fit.cpp's
  false-position search (:mod:`kvtuner.core.tune.fit_choice`) steps by interpolation, not by
  halving, and is llama.cpp's own algorithm, so it is not one.
- **the block-divides-row check** (:meth:`kvtuner.core.model.ggml_types.GgmlType.divides`): a
  ``% <x>.block_size`` outside ``ggml_types.py``.

The function-length test lists the longest functions of ``kvtuner/core``: none may exceed
:data:`MAX_FUNCTION_LINES` lines (``def`` to last line, docstring included).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from kvtuner.core.model.ggml_types import KV_CACHE_TYPES, kv_type
from kvtuner.core.plan import llama_constants as L
from kvtuner.core.plan.decision_table import KV_ELEMENT_BYTES
from kvtuner.core.plan.vllm import KV_DTYPE_BYTES
from kvtuner.core.tune.bisection import largest_true, smallest_true

ROOT = Path(__file__).resolve().parent.parent / "kvtuner"
CORE = ROOT / "core"
DEFINITIONS = ROOT / "core" / "plan" / "llama_constants.py"
BISECTION = ROOT / "core" / "tune" / "bisection.py"
GGML_TYPES = ROOT / "core" / "model" / "ggml_types.py"
#: The longest a function in kvtuner/core may be (lines).
MAX_FUNCTION_LINES = 120

_ARITH = {"%", "//", "/", "*", "-", "+"}
_ORDER = {"<", "<=", ">", ">="}
_COMPARE = _ORDER | {"==", "!="}
_UNITS = {"KiB", "MiB", "GiB", "TiB"}
_CODE = {tokenize.NAME, tokenize.NUMBER, tokenize.OP}


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT.parent)) if path.is_relative_to(ROOT.parent) else str(path)


def _py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _logical_lines(path: Path) -> list[list[tokenize.TokenInfo]]:
    """The code tokens (names, numbers, operators) of each logical line of ``path``."""
    lines: list[list[tokenize.TokenInfo]] = []
    cur: list[tokenize.TokenInfo] = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type == tokenize.NEWLINE:
            if cur:
                lines.append(cur)
            cur = []
        elif tok.type in _CODE:
            cur.append(tok)
    if cur:
        lines.append(cur)
    return lines


def _is_ctx_name(tok: tokenize.TokenInfo) -> bool:
    return tok.type == tokenize.NAME and tok.string.islower() and any(k in tok.string for k in ("ctx", "n_kv", "cells"))


def _is_batch_name(tok: tokenize.TokenInfo) -> bool:
    return tok.type == tokenize.NAME and any(k in tok.string.lower() for k in ("batch", "offload"))


def padding_copies(path: Path) -> list[str]:
    """``file:line: code`` for each literal copy of the 256-cell padding in ``path``."""
    out = []
    for toks in _logical_lines(path):
        for i, tok in enumerate(toks):
            if tok.type != tokenize.NUMBER or tok.string != "256":
                continue
            before = toks[i - 1].string if i else ""
            after = toks[i + 1].string if i + 1 < len(toks) else ""
            after2 = toks[i + 2].string if i + 2 < len(toks) else ""
            near = toks[max(0, i - 3) : i] + toks[i + 1 : i + 3]
            if (
                before in _ARITH | _ORDER
                or after in _ORDER
                or (after in _ARITH and after2 not in _UNITS)
                or any(t.string == "pad_to" for t in toks[:i])
                or any(_is_ctx_name(t) for t in near)
            ):
                out.append(f"{_where(path)}:{tok.start[0]}: {tok.line.strip()}")
    return out


def offload_batch_copies(path: Path) -> list[str]:
    """``file:line: code`` for each literal copy of the 32-row op offload batch in ``path``."""
    out = []
    for toks in _logical_lines(path):
        batch_line = any(_is_batch_name(t) for t in toks)
        for i, tok in enumerate(toks):
            if tok.type != tokenize.NUMBER or tok.string != "32":
                continue
            before = toks[i - 1].string if i else ""
            after = toks[i + 1].string if i + 1 < len(toks) else ""
            near = toks[max(0, i - 3) : i] + toks[i + 1 : i + 3]
            if (batch_line and (before in _COMPARE or after in _COMPARE)) or any(_is_batch_name(t) for t in near):
                out.append(f"{_where(path)}:{tok.start[0]}: {tok.line.strip()}")
    return out


def test_the_padding_and_the_offload_batch_are_defined_once():
    pads, batches = [], []
    for path in _py_files(ROOT):
        if path == DEFINITIONS:
            continue
        pads += padding_copies(path)
        batches += offload_batch_copies(path)
    assert not pads, (
        "copies of llama.cpp's 256-cell padding (use llama_constants.pad_ctx / CTX_PAD_CELLS):\n" + "\n".join(pads)
    )
    assert not batches, "copies of GGML_OP_OFFLOAD_MIN_BATCH (use llama_constants.OFFLOAD_MIN_BATCH):\n" + "\n".join(
        batches
    )


def test_the_greps_catch_the_copies_they_describe(tmp_path):
    src = tmp_path / "copies.py"
    src.write_text(
        "n = (n_ctx + 255) // 256 * 256\n"
        "a = pad_to(n_ctx, 256)\n"
        "b = max(256, n_ctx)\n"
        "c = s.at_ctx(256)\n"
        "d = (1 << 32) - 256\n"
        "e = 256 * MiB  # a size\n"
        "f = 256 in heads  # a head size\n"
        "g = PlanConfig(n_ubatch=256)\n"
        "h = '256 tokens'\n"
        "if v < 256: pass\n"
        "if n_ubatch >= 32: pass\n"
        "OFFLOAD_MIN_BATCH = 32\n"
        "BITS = 32\n"
    )
    pads = padding_copies(src)
    assert [int(x.split(":")[1]) for x in pads] == [1, 1, 2, 3, 4, 5, 10]
    assert [int(x.split(":")[1]) for x in offload_batch_copies(src)] == [11, 12]


def test_the_rules_hold_llama_cpps_values():
    # llama-context.cpp GGML_PAD(n_ctx, 256); ggml-cuda.cu GGML_OP_OFFLOAD_MIN_BATCH default 32
    assert (L.CTX_PAD_CELLS, L.OFFLOAD_MIN_BATCH, L.LLAMA_MAX_SEQ) == (256, 32, 256)
    assert [L.pad_ctx(n) for n in (0, 1, 256, 257, 4096, 4097)] == [0, 256, 256, 512, 4096, 4352]
    # common/fit.cpp: n_ctx - n_ctx % (256 * n_streams)
    assert [L.round_down_ctx(n, s) for n, s in ((4097, 1), (3071, 4), (1023, 4), (6000, 3))] == [4096, 2048, 0, 5376]


def _midpoint(node: ast.AST) -> bool:
    """``(a + b) // 2`` or ``(a + b + 1) // 2`` or ``(a + b) >> 1``."""
    if not isinstance(node, ast.BinOp) or not isinstance(node.left, ast.BinOp) or not isinstance(node.left.op, ast.Add):
        return False
    if not isinstance(node.right, ast.Constant):
        return False
    return (isinstance(node.op, ast.FloorDiv) and node.right.value == 2) or (
        isinstance(node.op, ast.RShift) and node.right.value == 1
    )


def bisection_loops(path: Path) -> list[str]:
    """``file:line`` of each ``while`` loop in ``path`` that halves a range by a midpoint."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{_where(path)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.While) and any(_midpoint(n) for n in ast.walk(node))
    ]


def test_the_bisection_helper_is_the_only_bisection_in_core():
    found = {p: bisection_loops(p) for p in _py_files(CORE)}
    others = [x for p, loops in found.items() if p != BISECTION for x in loops]
    assert not others, "binary searches outside kvtuner/core/tune/bisection.py (use largest_true):\n" + "\n".join(
        others
    )
    assert len(found[BISECTION]) == 1


def test_the_bisection_finds_the_edge_in_log_calls():
    calls: list[int] = []

    def up_to(edge):
        def ok(x):
            calls.append(x)
            return x <= edge

        return ok

    for edge in range(-1, 101):
        calls.clear()
        assert largest_true(up_to(edge), 0, 100) == (edge if edge >= 0 else None)
        assert len(calls) <= 7  # ceil(log2(101))
    # a known-true bottom: search above it with the bottom as default
    assert largest_true(up_to(5), 4, 3, default=3) == 3
    assert largest_true(up_to(5), 4, 100, default=3) == 5
    for edge in range(102):
        assert smallest_true(lambda x, e=edge: x >= e, 0, 100) == (edge if edge <= 100 else None)


def test_one_kv_type_table():
    # the decision table's bytes per element are the ggml types' (ggml.c type_traits), plus vLLM's fp8
    assert set(KV_ELEMENT_BYTES) == set(KV_CACHE_TYPES) | {"fp8"}
    for name, t in KV_CACHE_TYPES.items():
        assert KV_ELEMENT_BYTES[name] == t.type_size / t.block_size
    assert KV_ELEMENT_BYTES["fp8"] == KV_DTYPE_BYTES["fp8"] == 1
    assert KV_ELEMENT_BYTES["q8_0"] == 34 / 32 and KV_ELEMENT_BYTES["q4_0"] == 18 / 32


def test_block_divides_is_one_rule():
    # StableLM 3B: head size 80; q8_0's block of 32 does not divide it (llama.cpp#4425)
    assert not kv_type("q8_0").divides(80) and kv_type("q8_0").divides(128) and kv_type("f16").divides(80)
    copies = []
    for path in _py_files(ROOT):
        if path == GGML_TYPES:
            continue
        for toks in _logical_lines(path):
            for i, tok in enumerate(toks[:-2]):
                if tok.string == "%" and any(t.string == "block_size" for t in toks[i + 1 : i + 4]):
                    copies.append(f"{_where(path)}:{tok.start[0]}: {tok.line.strip()}")
    assert not copies, "block-size checks outside ggml_types.py (use GgmlType.divides):\n" + "\n".join(copies)


def function_lengths(root: Path = CORE) -> list[tuple[int, str]]:
    """``(lines, "file:line name")`` of every function under ``root``, longest first."""
    rows = []
    for path in _py_files(root):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                rows.append((n, f"{_where(path)}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)


def test_no_function_in_core_is_longer_than_the_limit():
    rows = function_lengths()
    top = "\n".join(f"{n:4d} lines  {where}" for n, where in rows[:10])
    assert rows[0][0] <= MAX_FUNCTION_LINES, f"functions over {MAX_FUNCTION_LINES} lines in kvtuner/core:\n{top}"
