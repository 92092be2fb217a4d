"""Atomic file writes: a temporary file in the target's folder, flushed and fsynced, then renamed.

A crash or kill at any moment leaves the old file or the new one, never a mix (a stray hidden
``.<name>.*.tmp`` at worst). Used by the calibration store, the compute-buffer cache and the
exporters (which add a no-overwrite mode on top of :func:`write_temp`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_temp(folder: Path, name: str, text: str) -> Path:
    """Write ``text`` (UTF-8) to a new hidden temporary file in ``folder``, fsynced; return its path.

    Raises:
        OSError: the folder cannot be written.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def replace_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically, replacing any existing file; creates the folder.

    Raises:
        OSError: the folder cannot be created or written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = write_temp(target.parent, target.name, text)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
