"""Shared fixtures: the embedded default model, a window factory, isolated user dirs, the llama marker
guard. Synthetic GGUF models, stand-ins and helpers come from :mod:`kvtuner.testing`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


@pytest.fixture
def make_window(qtbot, tmp_path):
    """Open a MainWindow for this test: :func:`kvtuner.testing.gui_support.open_window` with this
    test's ``qtbot`` and, unless ``settings`` are given, settings in an INI file under ``tmp_path``;
    the default model is opened unless ``model`` says otherwise."""
    from kvtuner.testing.gui_support import open_window

    def make(config=None, **options):
        options.setdefault("settings", tmp_path)
        return open_window(qtbot, config, **options)

    return make


@pytest.fixture
def settings(tmp_path):
    """The window's QSettings in an INI file under ``tmp_path`` (a test may read back what it saved)."""
    from kvtuner.testing.gui_support import ini_settings

    return ini_settings(tmp_path)


@pytest.fixture
def what_if_window(make_window, settings):
    """:func:`make_window` on a machine without GPU, planning for the what-if RTX 3060 12GB
    (the hardware panel's default what-if card), with :func:`settings`."""
    import functools

    from kvtuner.gui.widgets.hardware_panel import DEFAULT_WHAT_IF

    return functools.partial(make_window, settings=settings, what_if=DEFAULT_WHAT_IF)


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
    so it is never collected in a GUI worker thread of the next one (a PySide deadlock).

    What survives is frozen (``gc.freeze``): the next collections scan only what later tests
    create, not every object of the session again (a full scan after each test cost ~70 ms, a
    third of ``make test-fast``); :func:`_full_collection_per_module` thaws and collects it all."""
    yield
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def _full_collection_per_module():
    """After each test module, on the main thread: the objects frozen by
    :func:`_collect_garbage_on_the_main_thread` go back to the collector and their garbage is freed."""
    yield
    import gc

    gc.unfreeze()
    gc.collect()


# -- the `llama` marker guard ---------------------------------------------------------------
# In a run that deselects the llama tests (`-m "not llama"`, `make test-fast`), a test that starts
# llama.cpp (the runner child, a llama.cpp binary, a script importing llama_cpp), itself or in a
# Python child, fails: it needs @pytest.mark.llama. tests/llama_guard/sitecustomize.py records
# the starts; nothing is blocked.
_LLAMA_GUARD_DIR = Path(__file__).parent / "llama_guard"
_llama_guard_records: Path | None = None


def pytest_configure(config):
    global _llama_guard_records
    if "not llama" not in (config.option.markexpr or ""):
        return
    import importlib.util
    import tempfile

    spec = importlib.util.spec_from_file_location("kvtuner_llama_guard", _LLAMA_GUARD_DIR / "sitecustomize.py")
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    _llama_guard_records = Path(tempfile.mkdtemp(prefix="kvtuner-llama-guard-"))
    os.environ[guard.ENV_RECORD_DIR] = str(_llama_guard_records)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_LLAMA_GUARD_DIR), os.environ.get("PYTHONPATH")) if p)
    guard.install(str(_llama_guard_records))


def pytest_unconfigure(config):
    if _llama_guard_records is not None:
        import shutil

        shutil.rmtree(_llama_guard_records, ignore_errors=True)


@pytest.fixture(autouse=True)
def _llama_marker_guard(request):
    """Fail a test without the ``llama`` marker that started llama.cpp (guarded runs only)."""
    yield
    if _llama_guard_records is None:
        return
    starts = []
    for f in sorted(_llama_guard_records.iterdir()):
        starts.append(f.read_text(encoding="utf-8", errors="replace").strip().replace("\n", ": "))
        f.unlink(missing_ok=True)
    if starts and request.node.get_closest_marker("llama") is None:
        pytest.fail(
            f"{request.node.nodeid} starts llama.cpp but has no @pytest.mark.llama:\n  " + "\n  ".join(starts),
            pytrace=False,
        )
