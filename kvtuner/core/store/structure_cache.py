"""Model structures read from the installed llama.cpp (the structure probe), remembered.

A probe (a dry run's per-layer log lines, :mod:`kvtuner.runner.structure_probe`) costs a
no_alloc load of the model, about a second; its answer depends only on the model's header and
the llama.cpp build, so it is kept here under ``sha256(header) + build`` and every later plan
of that model (a slider move included) reads it from memory in microseconds.

Stored as JSON in ``data_dir()/model-structures.json`` (:func:`kvtuner.core.paths.data_dir`),
written atomically; a damaged file or record is ignored, never fatal.
"""

from __future__ import annotations

from functools import lru_cache

from ..model.structure import ModelStructure
from .keyed_json import KeyedJsonFile

FILE_NAME = "model-structures.json"
MAX_ENTRIES = 500


@lru_cache(maxsize=1)
def installed_llama_build() -> str:
    """The installed llama.cpp build as the runner names it (``llama-cpp-python 0.3.36``), read
    from the package metadata without importing llama_cpp; "" when it is not installed."""
    from importlib import metadata

    try:
        return f"llama-cpp-python {metadata.version('llama-cpp-python')}"
    except metadata.PackageNotFoundError:
        return ""


def _key(header_sha256: str, llama_build: str) -> str:
    return f"{header_sha256}|{llama_build}"


_FILE = KeyedJsonFile(FILE_NAME, MAX_ENTRIES)


def lookup(header_sha256: str, llama_build: str | None = None) -> ModelStructure | None:
    """The probed structure of a model for a llama.cpp build (default: the installed one), or None."""
    build = installed_llama_build() if llama_build is None else llama_build
    if not build:
        return None
    entry = _FILE.get(_key(header_sha256, build))
    if not isinstance(entry, dict):
        return None
    try:
        return ModelStructure.from_dict(entry)
    except ValueError:
        return None


def store(header_sha256: str, structure: ModelStructure) -> None:
    """Remember a probed structure under its model header and ``structure.llama_build``
    (atomic write; errors ignored)."""
    if not structure.llama_build:
        return
    _FILE.put(_key(header_sha256, structure.llama_build), structure.to_dict())
