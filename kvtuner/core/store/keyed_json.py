"""A small JSON file of entries by key, bounded in size: what the remembered compute buffers and
the probed model structures are kept in (the data directory, ``KVTUNER_DATA_DIR``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..fileio import replace_atomic
from ..paths import data_dir


class KeyedJsonFile:
    """``{key: entry}`` in ``data_dir() / file_name``, at most ``max_entries`` (oldest dropped).

    Reads are cached until the file's modification time or size changes (a slider move plans
    several times a second); writes are atomic (temporary file + rename); a file that cannot be
    read is empty, one that cannot be written is left as it was (both are caches).
    """

    def __init__(self, file_name: str, max_entries: int) -> None:
        self.file_name = file_name
        self.max_entries = max_entries
        self._loaded: tuple[Path, int, int, dict[str, Any]] | None = None

    def path(self) -> Path:
        """The file (the data directory is looked up each time: tests move it)."""
        return data_dir() / self.file_name

    def load(self) -> dict[str, Any]:
        """Every entry (do not mutate the result)."""
        path = self.path()
        try:
            st = path.stat()
        except OSError:
            return {}
        if self._loaded is not None and self._loaded[:3] == (path, st.st_mtime_ns, st.st_size):
            return self._loaded[3]
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        data = data if isinstance(data, dict) else {}
        self._loaded = (path, st.st_mtime_ns, st.st_size, data)
        return data

    def get(self, key: str) -> Any:
        """The entry of ``key``, or None."""
        return self.load().get(key)

    def put(self, key: str, entry: Any) -> None:
        """Store ``entry`` under ``key`` (JSON-able), dropping the oldest beyond ``max_entries``."""
        data = dict(self.load())
        data.pop(key, None)
        data[key] = entry
        for old in list(data)[: max(0, len(data) - self.max_entries)]:
            del data[old]
        try:
            replace_atomic(self.path(), json.dumps(data))
        except OSError:
            pass
