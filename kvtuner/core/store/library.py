"""Working-configs library: configurations that ran to completion, with their measured numbers.

Stored in SQLite (stdlib ``sqlite3``) at ``<user data dir>/library.sqlite3`` (platformdirs
``user_data_dir("kvtuner")``, or ``$KVTUNER_DATA_DIR``). One row per completed run, keyed by
the model's identity (size + header hash) and the machine's fingerprint, so the list shown
for a model on this machine only holds configurations measured on this kind of machine.

Saving is on by default and can be turned off (``record_completed_run(enabled=False)`` from a
GUI setting, or ``KVTUNER_LIBRARY=off`` in the environment).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..export import MEASURED_KEYS, clean_measured
from ..hardware.identity import MachineFingerprint, llama_cpp_build
from ..model.identity import ModelIdentity
from ..paths import data_dir
from ..plan.config import ConfigError, PlanConfig

LIBRARY_FILE_NAME = "library.sqlite3"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_utc TEXT NOT NULL,
    model_path TEXT NOT NULL,
    model_file_name TEXT NOT NULL,
    model_file_bytes INTEGER NOT NULL,
    model_header_sha256 TEXT NOT NULL,
    model_json TEXT NOT NULL,
    machine_id TEXT NOT NULL,
    machine_json TEXT NOT NULL,
    llama_cpp_build TEXT,
    config_json TEXT NOT NULL,
    measured_json TEXT NOT NULL,
    decode_tok_s REAL,
    prefill_tok_s REAL,
    load_s REAL,
    peak_vram_bytes INTEGER,
    peak_rss_bytes INTEGER,
    kv_bytes INTEGER,
    note TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_model_machine
    ON runs (model_header_sha256, model_file_bytes, machine_id, decode_tok_s);
"""


class LibraryError(RuntimeError):
    """The library database cannot be opened or is damaged; one line saying what to do."""


def default_library_path() -> Path:
    """Where the library lives: ``data_dir() / library.sqlite3``."""
    return data_dir() / LIBRARY_FILE_NAME


def autosave_enabled() -> bool:
    """False when ``KVTUNER_LIBRARY`` is ``off``, ``0``, ``no`` or ``false`` (the opt-out)."""
    return os.environ.get("KVTUNER_LIBRARY", "on").strip().lower() not in ("off", "0", "no", "false")


@dataclass(frozen=True)
class WorkingConfig:
    """One saved run.

    Attributes:
        id: row id (stable; use it to restore or delete).
        created_utc: ISO 8601 UTC time it was saved.
        model_path: where the model was when it ran.
        model: the model's identity.
        machine: the machine it ran on.
        llama_cpp_build: the llama.cpp build it ran with, or None.
        config: the configuration.
        measured: the measured figures (``decode_tok_s`` tokens/s, ``prefill_tok_s`` tokens/s,
            ``load_s`` seconds, ``peak_vram_bytes``, ``peak_rss_bytes``, ``kv_bytes`` bytes,
            and any other numbers the runner gave).
        note: free text, or None.
    """

    id: int
    created_utc: str
    model_path: Path
    model: ModelIdentity
    machine: MachineFingerprint
    llama_cpp_build: str | None
    config: PlanConfig
    measured: dict[str, float | int] = field(default_factory=dict)
    note: str | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """Measured decode speed in tokens/s, or None."""
        value = self.measured.get("decode_tok_s")
        return float(value) if value is not None else None


class ConfigLibrary:
    """The working-configs library (a SQLite file; safe to open from several processes).

    One instance per thread (sqlite3 connections are not shared across threads): a GUI
    worker thread opens its own.

    Use as a context manager or call :meth:`close`. Every public method opens a short
    transaction; a crash mid-save leaves the database as it was (SQLite journaling).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, timeout: float = 10.0) -> None:
        """Open (creating if needed) the library at ``path`` (default :func:`default_library_path`).

        ``timeout``: seconds to wait for another process's write lock before giving up.

        Raises:
            LibraryError: the folder is not writable or the file is not a kvtuner library.
        """
        self.path = Path(path).expanduser() if path is not None else default_library_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=timeout)
        except (OSError, sqlite3.Error) as exc:
            raise LibraryError(f"cannot open the configs library {self.path}: {exc}") from None
        try:
            with self._db:
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise LibraryError(f"{self.path} was written by a newer kvtuner (schema {version}): update kvtuner")
                self._db.executescript(_SCHEMA)
                if version == 0:
                    self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.OperationalError as exc:
            self._db.close()
            if "locked" in str(exc) or "busy" in str(exc):
                # another kvtuner (the app saving a run) holds it: the file is fine, do not advise moving it
                raise LibraryError(
                    f"the configs library {self.path} is busy (locked by another program, probably kvtuner): try again"
                ) from None
            raise LibraryError(
                f"{self.path} is not a readable kvtuner library ({exc}): move it away and kvtuner starts a new one"
            ) from None
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise LibraryError(
                f"{self.path} is not a readable kvtuner library ({exc}): move it away and kvtuner starts a new one"
            ) from None

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def __enter__(self) -> ConfigLibrary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ------------------------------------------------------------------------------
    def save(
        self,
        model: ModelIdentity,
        config: PlanConfig,
        measured: Mapping[str, object],
        *,
        model_path: str | os.PathLike[str],
        machine: MachineFingerprint | None = None,
        llama_cpp_build_text: str | None = None,
        note: str | None = None,
        created_utc: str | None = None,
    ) -> int:
        """Save one completed run; returns its id.

        Args:
            model: the model's identity (:meth:`ModelIdentity.from_profile` of the run's model).
            config: the configuration that ran.
            measured: measured figures, see :data:`~kvtuner.core.export._common.MEASURED_KEYS`
                (a plain dict, e.g. ``dataclasses.asdict`` of the runner's result).
            model_path: the model file that ran.
            machine: default :meth:`MachineFingerprint.current`.
            llama_cpp_build_text: default the installed packages' versions.
            note: free text.

        Raises:
            ValueError: a measured value that is not a finite non-negative number.
            LibraryError: the database cannot be written.
        """
        figures = clean_measured(measured)
        machine = machine or MachineFingerprint.current()
        row = {
            "created_utc": created_utc or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "model_path": str(model_path),
            "model_file_name": model.file_name,
            "model_file_bytes": model.file_bytes,
            "model_header_sha256": model.header_sha256,
            "model_json": json.dumps(model.to_dict()),
            "machine_id": machine.fingerprint_id,
            "machine_json": json.dumps(machine.to_dict()),
            "llama_cpp_build": llama_cpp_build_text if llama_cpp_build_text is not None else llama_cpp_build(),
            "config_json": json.dumps(config.to_dict()),
            "measured_json": json.dumps(figures),
            "note": note,
        }
        for key in MEASURED_KEYS:
            row[key] = figures.get(key)
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        try:
            with self._db:
                cur = self._db.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", row)
        except sqlite3.Error as exc:
            raise LibraryError(f"cannot save to the configs library {self.path}: {exc}") from None
        assert cur.lastrowid is not None  # set by every successful INSERT
        return int(cur.lastrowid)

    def delete(self, run_id: int) -> bool:
        """Remove one saved run; False if there was none with that id."""
        try:
            with self._db:
                cur = self._db.execute("DELETE FROM runs WHERE id = ?", (int(run_id),))
        except OverflowError:  # beyond SQLite's 64-bit INTEGER: no such row
            return False
        except sqlite3.Error as exc:
            raise LibraryError(f"cannot change the configs library {self.path}: {exc}") from None
        return cur.rowcount > 0

    # -- reading ------------------------------------------------------------------------------
    def known_good(
        self,
        model: ModelIdentity | None = None,
        machine: MachineFingerprint | str | None = None,
        *,
        limit: int = 100,
    ) -> list[WorkingConfig]:
        """Saved runs, best first (highest measured decode tok/s; runs without one last,
        newest first among equals).

        Args:
            model: only runs of this model file (same size and header hash); None for all.
            machine: only runs on this machine (a fingerprint or its ``fingerprint_id``);
                None for every machine.
            limit: at most this many.
        """
        where, args = [], []
        if model is not None:
            where.append("model_header_sha256 = ? AND model_file_bytes = ?")
            args += [model.header_sha256, model.file_bytes]
        if machine is not None:
            where.append("machine_id = ?")
            args.append(machine if isinstance(machine, str) else machine.fingerprint_id)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY decode_tok_s IS NULL, decode_tok_s DESC, id DESC LIMIT ?"
        args.append(int(limit))
        return list(self._query(sql, args))

    def get(self, run_id: int) -> WorkingConfig:
        """One saved run.

        Raises:
            KeyError: no run with that id.
        """
        if not -(1 << 63) <= int(run_id) < (1 << 63):  # SQLite INTEGER is 64-bit; sqlite3 raises OverflowError
            raise KeyError(f"no saved configuration with id {run_id}")
        rows = list(self._query("SELECT * FROM runs WHERE id = ?", [int(run_id)]))
        if not rows:
            raise KeyError(f"no saved configuration with id {run_id}")
        return rows[0]

    def restore(self, run_id: int) -> tuple[Path, PlanConfig]:
        """The model path and configuration of a saved run, ready to plan or run again.

        Raises:
            KeyError: no run with that id.
        """
        wc = self.get(run_id)
        return wc.model_path, wc.config

    def _query(self, sql: str, args: list[Any]) -> Iterator[WorkingConfig]:
        try:
            cur = self._db.execute(sql, args)
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
        except sqlite3.Error as exc:
            raise LibraryError(f"cannot read the configs library {self.path}: {exc}") from None
        for values in rows:
            r = dict(zip(cols, values))
            try:
                yield WorkingConfig(
                    id=int(r["id"]),
                    created_utc=r["created_utc"],
                    model_path=Path(r["model_path"]),
                    model=ModelIdentity.from_dict(json.loads(r["model_json"])),
                    machine=MachineFingerprint.from_dict(json.loads(r["machine_json"])),
                    llama_cpp_build=r["llama_cpp_build"],
                    config=PlanConfig.from_dict(json.loads(r["config_json"])),
                    measured=clean_measured(json.loads(r["measured_json"])),
                    note=r["note"],
                )
            except (ValueError, TypeError, ConfigError):
                continue  # a row a future or broken writer left: skip it rather than fail the list


def record_completed_run(
    model: Any,
    config: PlanConfig,
    measured: Mapping[str, object],
    *,
    model_path: str | os.PathLike[str] | None = None,
    enabled: bool = True,
    library_path: str | os.PathLike[str] | None = None,
    machine: MachineFingerprint | None = None,
    note: str | None = None,
) -> int | None:
    """Save a run that completed, unless the user opted out; returns the id or None.

    Args:
        model: the run's :class:`~kvtuner.core.model.profile.ModelProfile` or :class:`ModelIdentity`.
        config: the configuration that ran.
        measured: measured figures as a plain dict.
        model_path: the model file (default ``model.path``).
        enabled: the user's setting (the GUI's "remember working configurations"); the
            environment ``KVTUNER_LIBRARY=off`` also turns saving off.
        library_path: default :func:`default_library_path`.
        machine: default :meth:`MachineFingerprint.current`.
        note: free text.
    """
    if not enabled or not autosave_enabled():
        return None
    identity = model if isinstance(model, ModelIdentity) else ModelIdentity.from_profile(model)
    path = model_path if model_path is not None else getattr(model, "path", identity.file_name)
    with ConfigLibrary(library_path) as lib:
        return lib.save(identity, config, measured, model_path=path, machine=machine, note=note)
