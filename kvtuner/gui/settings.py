"""The app's settings: one INI file, ``kvtuner.ini``, in kvtuner's configuration directory
(:func:`kvtuner.core.paths.config_dir`: ``$KVTUNER_CONFIG_DIR`` or platformdirs' user config
directory), so the environment that moves calibration and the library moves settings too.

:class:`AppSettings` reads and writes the window's keys with their types; a value of the wrong
type (a hand-edited or foreign file) reads as missing, so a damaged file never keeps the app
from starting.

Keys: ``window/geometry``, ``config`` (the remembered configuration, JSON), ``hardware/choice``,
``hardware/custom_bytes``, ``advisor/auto_stop``, ``library/remember``, ``model/last``,
``model/recent`` (JSON list, newest first), ``engine/choice`` (the llama.cpp engine:
``embedded``, ``server`` or a llama-server path; :func:`kvtuner.runner.engines.resolve_engine`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6 import QtCore

from ..core import paths
from ..core.plan.config import ConfigError, PlanConfig

#: The settings file's name in the configuration directory.
SETTINGS_FILE = "kvtuner.ini"
#: How many recently opened models File > Recent models keeps.
MAX_RECENT = 8


def settings_path() -> Path:
    """Where the app keeps its settings: ``config_dir() / "kvtuner.ini"``."""
    return paths.config_dir() / SETTINGS_FILE


def open_settings(path: str | Path | None = None) -> QtCore.QSettings:
    """QSettings in INI format at ``path`` (default :func:`settings_path`; Qt creates the file
    and its folder on the first write)."""
    return QtCore.QSettings(str(path or settings_path()), QtCore.QSettings.Format.IniFormat)


def _flag(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1")


class AppSettings:
    """Typed access to the window's settings in a :class:`QtCore.QSettings`.

    Args:
        qsettings: where they persist (default :func:`open_settings`; tests pass one on a
            temporary file).
    """

    def __init__(self, qsettings: QtCore.QSettings | None = None) -> None:
        self.qsettings = qsettings if qsettings is not None else open_settings()

    def sync(self) -> None:
        """Write pending changes to the file."""
        self.qsettings.sync()

    # -- window ------------------------------------------------------------------------------------

    def geometry(self) -> QtCore.QByteArray | None:
        """The saved window geometry, or None."""
        value = self.qsettings.value("window/geometry")
        if isinstance(value, (QtCore.QByteArray, bytes, bytearray)):
            return QtCore.QByteArray(value)
        return None

    def set_geometry(self, geometry: QtCore.QByteArray) -> None:
        self.qsettings.setValue("window/geometry", geometry)

    # -- configuration and hardware ----------------------------------------------------------------

    def config(self) -> PlanConfig | None:
        """The remembered configuration, or None (never saved, or not a valid one)."""
        raw = self.qsettings.value("config")
        if not raw:
            return None
        try:
            return PlanConfig.from_dict(json.loads(str(raw)))
        except (ValueError, TypeError, ConfigError):
            return None

    def set_config(self, config: PlanConfig) -> None:
        """Remember ``config`` for the next start."""
        self.qsettings.setValue("config", json.dumps(config.to_dict()))

    def hardware_choice(self) -> tuple[str, int | None] | None:
        """``(choice, custom_bytes)`` of the hardware panel, or None when never saved."""
        choice = self.qsettings.value("hardware/choice")
        if not choice:
            return None
        custom = self.qsettings.value("hardware/custom_bytes")
        try:
            custom_bytes = int(custom) if custom else None
        except (TypeError, ValueError):
            custom_bytes = None
        return str(choice), custom_bytes

    def set_hardware_choice(self, choice: str, custom_bytes: int) -> None:
        self.qsettings.setValue("hardware/choice", choice)
        self.qsettings.setValue("hardware/custom_bytes", int(custom_bytes))

    # -- switches ----------------------------------------------------------------------------------

    def auto_stop(self) -> bool:
        """ "Stop a run by itself when decode stays under 1 tok/s" (default off)."""
        return _flag(self.qsettings.value("advisor/auto_stop"), False)

    def set_auto_stop(self, enabled: bool) -> None:
        self.qsettings.setValue("advisor/auto_stop", bool(enabled))
        self.qsettings.sync()

    def remember_working_configs(self) -> bool:
        """ "Remember working configurations" (default on)."""
        return _flag(self.qsettings.value("library/remember"), True)

    def set_remember_working_configs(self, enabled: bool) -> None:
        self.qsettings.setValue("library/remember", bool(enabled))
        self.qsettings.sync()

    # -- engine ------------------------------------------------------------------------------------

    def engine_choice(self) -> str | None:
        """The llama.cpp engine the user chose (``embedded``, ``server`` or a llama-server path),
        or None for the default."""
        value = self.qsettings.value("engine/choice")
        return str(value) if isinstance(value, str) and value else None

    def set_engine_choice(self, choice: str | None) -> None:
        """Remember the engine choice (None: back to the default)."""
        if choice:
            self.qsettings.setValue("engine/choice", str(choice))
        else:
            self.qsettings.remove("engine/choice")
        self.qsettings.sync()

    # -- models ------------------------------------------------------------------------------------

    def recent_models(self) -> list[str]:
        """Recently opened model paths, newest first."""
        raw = self.qsettings.value("model/recent") or "[]"
        try:
            paths_ = json.loads(str(raw))
        except ValueError:
            return []
        return [str(p) for p in paths_] if isinstance(paths_, list) else []

    def add_recent_model(self, path: Path) -> None:
        """Put ``path`` first in the recent models (at most :data:`MAX_RECENT`) and make it the last model."""
        recent = [str(path)] + [p for p in self.recent_models() if p != str(path)]
        self.qsettings.setValue("model/recent", json.dumps(recent[:MAX_RECENT]))
        self.set_last_model(path)

    def last_model(self) -> Path | None:
        """The model opened last time (None if never)."""
        value = self.qsettings.value("model/last")
        return Path(str(value)) if value else None

    def open_dir(self) -> Path:
        """Where the Open dialog starts: the folder of the last model or profile the user opened,
        else the home folder (never kvtuner's cache, where the default model lives)."""
        value = self.qsettings.value("open/dir")
        folder = Path(str(value)) if value else None
        return folder if folder is not None and folder.is_dir() else Path.home()

    def set_open_dir(self, path: Path) -> None:
        """Remember ``path``'s folder for the Open dialog, unless it is kvtuner's cache."""
        from ..core.paths import cache_dir

        folder = Path(path).expanduser().absolute().parent  # the folder opened from, links not followed
        if folder.resolve() != cache_dir().resolve():
            self.qsettings.setValue("open/dir", str(folder))

    def set_last_model(self, path: Path) -> None:
        self.qsettings.setValue("model/last", str(path))
