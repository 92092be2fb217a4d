"""Run kvtuner's command line in a child process, as a user would, for the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

#: the checkout this kvtuner is imported from (kvtuner/testing/cli.py is two folders below it)
CHECKOUT = Path(__file__).resolve().parents[2]


def run_kvtuner(
    *args: str,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
    checkout: bool = False,
    cwd: str | Path | None = None,
    timeout: float = 120,
    module: str = "kvtuner.cli",
) -> subprocess.CompletedProcess[str]:
    """``python -m kvtuner.cli ARGS`` with this interpreter; stdout and stderr captured as text.

    Args:
        env: the child's environment (default: this process's), less ``unset``, plus ``extra_env``.
        checkout: run in :data:`CHECKOUT` with ``PYTHONPATH`` set to it (this checkout's kvtuner,
            not another one installed).
        cwd: the child's working directory (default: this process's, or :data:`CHECKOUT`).
        timeout: seconds before ``subprocess.TimeoutExpired``.
        module: ``kvtuner.cli`` or ``kvtuner`` (the package's ``__main__``, as the app starts).
    """
    child = dict(os.environ if env is None else env)
    for name in unset:
        child.pop(name, None)
    if checkout:
        child["PYTHONPATH"] = str(CHECKOUT)
        cwd = CHECKOUT if cwd is None else cwd
    child.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, env=child, cwd=cwd
    )
