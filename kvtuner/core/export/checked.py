"""A llama-server / llama-cli export checked against the flags of the build that will run it.

kvtuner writes llama.cpp b11434's spellings (:mod:`.llama_server`). A user's own build may be
older or newer: every flag of the exported line must be one its ``--help`` names (the engine's
:attr:`~kvtuner.runner.engines.Engine.flags`, handed in here as data: core starts no process).
Where the build spells a setting differently, the line is rewritten to the build's spelling:

===============================  ==================================  ==============================================
kvtuner writes (b11434)          a build without it has               source
===============================  ==================================  ==============================================
``-lm none`` (``--load-mode``)   ``--no-mmap``                        common/arg.cpp: ``--load-mode`` replaced
                                                                      ``--no-mmap`` / ``--mlock`` / ``-dio``
``--fit off``                    nothing (no auto-fit to stop)        common/fit.cpp arrived with ``--fit``
``-ngl all``                     ``-ngl 999`` (clamped to n_layer+1)  ``auto``/``all`` came with ``--fit``
``--n-cpu-ffn N`` (``-ncffn``)   ``-ot`` per layer                    common/common.h ``LLM_FFN_DENSE_REGEX``
``--n-cpu-moe N`` (``-ncmoe``)   ``-ot`` per layer                    common/common.h ``LLM_FFN_EXPS_REGEX``
``--cpu-moe`` (``-cmoe``)        ``-ot`` for every layer              common/common.h ``llm_ffn_exps_cpu_override``
===============================  ==================================  ==============================================

Any other flag the build lacks is an error that names it (:class:`~kvtuner.core.export.ExportError`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ._common import ExportError, ExportResult

_FLAG_RE = re.compile(r"^--?[A-Za-z][\w-]*$")
#: common/common.h ``LLM_FFN_DENSE_REGEX`` / ``LLM_FFN_EXPS_REGEX`` (``llm_ffn_block_regex``: ``blk\.%d`` + regex).
FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


@dataclass(frozen=True)
class BuildFlags:
    """The flags one llama.cpp binary accepts.

    Attributes:
        label: what to call the build in messages (``llama-server b11434 (CPU)``).
        flags: every spelling its ``--help`` names (``-ngl``, ``--n-gpu-layers`` ...).
        path: the binary, for messages ("" when unknown).
    """

    label: str
    flags: frozenset[str]
    path: str = ""

    def has(self, *spellings: str) -> bool:
        """Whether the build accepts any of ``spellings``."""
        return any(s in self.flags for s in spellings)


def flags_of(argv: Iterable[str]) -> list[str]:
    """The flags of a command line (after the binary): tokens shaped like ``-x`` / ``--xyz``; values
    (numbers, paths, patterns) never start with a letter after a dash."""
    return [a for a in list(argv)[1:] if _FLAG_RE.match(a)]


def _take(argv: list[str], i: int) -> tuple[str, str]:
    return argv[i], argv[i + 1] if i + 1 < len(argv) else ""


def _rewrite(argv: list[str], build: BuildFlags) -> tuple[list[str], list[str]]:
    """``argv`` in the build's spellings, and one note per rewrite."""
    out = [argv[0]]
    notes: list[str] = []
    ot: list[str] = []  # overrides to add as one -ot (common/arg.cpp takes a comma-separated list)
    has_fit = build.has("--fit", "-fit")
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-lm", "--load-mode") and not build.has("-lm", "--load-mode"):
            _, v = _take(argv, i)
            if v == "none" and build.has("--no-mmap"):
                out.append("--no-mmap")
                notes.append("-lm none written as --no-mmap (this build predates --load-mode)")
                i += 2
                continue
        if a in ("--fit", "-fit") and not has_fit:
            notes.append("--fit off left out: this build has no --fit (it never changes -ngl or -c by itself)")
            i += 2
            continue
        if a in ("-ngl", "--n-gpu-layers", "--gpu-layers") and not has_fit:
            _, v = _take(argv, i)
            if v == "all":
                out += [a, "999"]
                notes.append(
                    "-ngl all written as -ngl 999 (this build predates 'all'; llama.cpp clamps it to every layer)"
                )
                i += 2
                continue
        if a in ("--n-cpu-ffn", "-ncffn", "--n-cpu-moe", "-ncmoe") and not build.has(a):
            _, v = _take(argv, i)
            regex = FFN_DENSE_REGEX if "ffn" in a else FFN_EXPS_REGEX
            ot += [rf"blk\.{il}{regex}=CPU" for il in range(int(v))]
            notes.append(f"{a} {v} written as -ot tensor overrides (the same patterns llama.cpp's {a} adds)")
            i += 2
            continue
        if a in ("--cpu-moe", "-cmoe") and not build.has(a):
            ot.append(f"{FFN_EXPS_REGEX}=CPU")
            notes.append(f"{a} written as an -ot tensor override (the pattern llama.cpp's {a} adds)")
            i += 1
            continue
        out.append(a)
        i += 1
    if ot:
        out += ["-ot", ",".join(ot)]
    return out, notes


def check_export(result: ExportResult, build: BuildFlags | None) -> ExportResult:
    """``result`` (a llama-server / llama-cli export) checked against ``build``.

    Returns:
        The export in the build's spellings, with a first limitation that names the build it was
        checked against (or says that none was available, when ``build`` is None); other targets
        are returned unchanged.

    Raises:
        ExportError: a flag the build does not accept and kvtuner cannot respell, in one line
            naming the flag and the build.
    """
    if result.argv is None or result.target not in ("llama-server", "llama-cli"):
        return result
    if build is None:
        line = (
            f"Not checked against a {result.target} build: none was available (give --engine PATH, or set "
            "KVTUNER_LLAMA_SERVER, to check every flag against the binary you run)."
        )
        return replace(result, limitations=(line, *result.limitations))
    argv, notes = _rewrite(list(result.argv), build)
    missing = [f for f in flags_of(argv) if f not in build.flags]
    if missing:
        uniq = list(dict.fromkeys(missing))
        them = "it" if len(uniq) == 1 else "them"
        raise ExportError(
            f"{build.label} does not accept {', '.join(uniq)} (not in its --help): "
            f"use a llama.cpp build that has {them}, or change the setting that needs {them}"
        )
    text = result.text
    old = shlex.join(result.argv) + "\n"
    if text.endswith(old):
        text = text[: len(text) - len(old)] + shlex.join(argv) + "\n"
    where = f" ({build.path})" if build.path else ""
    line = f"Checked against {build.label}{where}: every flag is in its --help."
    return replace(result, text=text, argv=tuple(argv), limitations=(line, *notes, *result.limitations))
