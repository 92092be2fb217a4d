"""Shared fixtures: the embedded default model, synthetic GGUF models, isolated user dirs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # gguf_factory

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session")
def default_model() -> Path:
    """Path of the embedded Gemma 3 270M Q4_K_M (assembled once into the cache)."""
    from kvtuner.core.model.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def default_profile(default_model):
    """ModelProfile of the default model."""
    from kvtuner.core.model.profile import ModelProfile

    return ModelProfile.from_gguf(default_model)


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Keep settings, calibration and the configs library out of the real user directories."""
    base = tmp_path_factory.mktemp("userdirs")
    monkeypatch.setenv("KVTUNER_DATA_DIR", str(base / "data"))
    monkeypatch.setenv("KVTUNER_CONFIG_DIR", str(base / "config"))
    # the CPU probe (llama.cpp in a child, ~20 s) runs only in the tests that ask for it
    monkeypatch.setenv("KVTUNER_CPU_PROBE", "off")
    # the tests share the machine with other work: every measurement counts as quiet unless a test
    # checks the busy-machine rule itself (tests/test_busy_measurements.py restores the limit)
    monkeypatch.setenv("KVTUNER_QUIET_MAX_OTHER_CORES", "inf")


@pytest.fixture(autouse=True)
def _collect_garbage_on_the_main_thread():
    """Collect cyclic garbage (old windows' Qt objects) here, on the main thread, after each test,
    so it is never collected in a GUI worker thread of the next one (a PySide deadlock)."""
    yield
    import gc

    gc.collect()
