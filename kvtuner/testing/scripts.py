"""Load a benchmark script as a module by its path, so that a test can call its functions without
putting its folder on ``sys.path``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: the checkout's root (kvtuner/testing/scripts.py is two folders below it)
CHECKOUT = Path(__file__).resolve().parents[2]


def load_script(relative_path: str) -> ModuleType:
    """The script at ``relative_path`` under the checkout (e.g. ``"benchmarks/gpu_logs/compare.py"``),
    executed once and registered in ``sys.modules`` under its dotted path (``benchmarks.gpu_logs.compare``:
    dataclasses look their module up there); a second call returns the same module.

    Raises FileNotFoundError when the script is missing (an installed kvtuner has no benchmarks/)."""
    path = CHECKOUT / relative_path
    name = relative_path.removesuffix(".py").replace("/", ".")
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise FileNotFoundError(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
