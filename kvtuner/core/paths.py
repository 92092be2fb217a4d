"""Where kvtuner keeps files: platformdirs' user directories, overridable by environment.

- ``KVTUNER_DATA_DIR``   (default ``platformdirs.user_data_dir("kvtuner")``): calibration, the
  working-configs library, exact compute buffers remembered from dry-runs.
- ``KVTUNER_CACHE_DIR``  (default ``platformdirs.user_cache_dir("kvtuner")``): the assembled
  default model.
- ``KVTUNER_CONFIG_DIR`` (default ``platformdirs.user_config_dir("kvtuner")``): settings.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "kvtuner"


def data_dir() -> Path:
    """User data directory (not created)."""
    return Path(os.environ.get("KVTUNER_DATA_DIR") or platformdirs.user_data_dir(APP))


def cache_dir() -> Path:
    """User cache directory (not created)."""
    return Path(os.environ.get("KVTUNER_CACHE_DIR") or platformdirs.user_cache_dir(APP))


def config_dir() -> Path:
    """User configuration directory (not created)."""
    return Path(os.environ.get("KVTUNER_CONFIG_DIR") or platformdirs.user_config_dir(APP))
