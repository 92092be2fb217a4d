"""Working-configs library with real runs: a completed GUI run and a completed
``kvtuner bench`` are saved with their measured numbers (unless the user opted out), the
GUI's Known good panel lists the run, and Restore puts its configuration back.

Real child processes and real llama.cpp on the default model; the pytest process itself
never imports llama_cpp."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from kvtuner.testing.cli import run_kvtuner

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("needs llama-cpp-python", allow_module_level=True)

pytestmark = [pytest.mark.llama, pytest.mark.slow]

SMALL_CONFIG = {"n_ctx": 512, "n_ubatch": 64, "n_batch": 64}
MEASURED_KEYS = ("decode_tok_s", "prefill_tok_s", "load_s", "peak_rss_bytes", "kv_bytes")


def _kvtuner(*args: str, data_dir: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m kvtuner ARGS`` with its data in ``data_dir`` and the library on."""
    env = {"KVTUNER_DATA_DIR": str(data_dir), **(extra_env or {})}
    return run_kvtuner(*args, extra_env=env, unset=["KVTUNER_LIBRARY"], timeout=300, module="kvtuner")


def test_bench_saves_one_row_that_kvtuner_library_lists(tmp_path):
    data = tmp_path / "data"
    proc = _kvtuner("bench", "-p", "32", "-n", "8", "-r", "1", "-t", "1", data_dir=data)
    assert proc.returncode == 0, proc.stderr
    assert "saved as working configuration" in proc.stderr
    listed = _kvtuner("library", "--json", data_dir=data)
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    assert len(runs) == 1
    run = runs[0]
    assert run["config"]["n_ctx"] == 4096  # the default configuration
    for key in MEASURED_KEYS:
        assert key in run["measured"], key
    assert run["measured"]["decode_tok_s"] > 0 and run["measured"]["kv_bytes"] > 0
    text = _kvtuner("library", data_dir=data)
    assert text.returncode == 0 and "gemma-3-270m" in text.stdout and str(run["id"]) in text.stdout


@pytest.mark.parametrize("how", ["--no-save", "KVTUNER_LIBRARY=off"])
def test_bench_opt_out_saves_nothing(tmp_path, how):
    data = tmp_path / "data"
    args = ["bench", "-p", "16", "-n", "4", "-r", "1", "-t", "1", "-c", "512", "--no-record"]
    extra = None
    if how == "--no-save":
        args.append("--no-save")
    else:
        extra = {"KVTUNER_LIBRARY": "off"}
    proc = _kvtuner(*args, data_dir=data, extra_env=extra)
    assert proc.returncode == 0, proc.stderr
    assert "saved as working configuration" not in proc.stderr
    listed = _kvtuner("library", "--json", "--all-models", "--all-machines", data_dir=data)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []


# -- the desktop app --------------------------------------------------------------------------------


@pytest.fixture
def window(make_window):
    """The default model at a small configuration on this machine, with a short bench; every run
    counts as quiet (tests/test_gui_one_truth.py checks the busy-machine rule itself)."""
    pytest.importorskip("PySide6")
    pytest.importorskip("pyqtgraph")

    def make():
        from kvtuner.core.hardware.host import detect_host
        from kvtuner.core.monitor.sampler import Sampler
        from kvtuner.core.plan.config import PlanConfig
        from kvtuner.gui.run_controller import BenchSettings

        w = make_window(
            PlanConfig(**SMALL_CONFIG),
            hardware=([], detect_host(), "test"),
            bench=BenchSettings(n_prompt=32, n_gen=8, repetitions=1, n_threads=1),
            sampler=Sampler(interval_s=0.1, capacity=600, gpus=False),
            wait=lambda w: w.model is not None and w.tasks.pending == 0,
        )
        w.run_events.quiet_max_other_cores = float("inf")
        return w

    return make


def test_a_completed_gui_run_appears_in_known_good_and_restores(qtbot, tmp_path, window):
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.store.library import ConfigLibrary

    w = window()
    try:
        assert w.known_good.runs == []
        assert w.start_run()
        qtbot.waitUntil(lambda: not w.runner.running, timeout=240_000)
        w.pull()
        assert w.last_error == "", w.last_error
        qtbot.waitUntil(lambda: len(w.known_good.runs) == 1, timeout=20_000)
        saved = w.known_good.runs[0]
        assert saved.id == w.saved_run_id
        # what ran: on this machine without a GPU, CPU only (the GPU layers do not apply)
        assert saved.config == PlanConfig(**SMALL_CONFIG).with_(n_gpu_layers=0)
        for key in MEASURED_KEYS:
            assert key in saved.measured, key
        assert saved.measured["decode_tok_s"] > 0
        assert w.known_good.table.item(0, 0).text().endswith("tok/s")
        with ConfigLibrary() as lib:  # the same row is in the database (a connection of this thread)
            assert [r.id for r in lib.known_good()] == [saved.id]
        assert w.export_measured() is not None  # the profile export carries the run's numbers
        # move the controls away, then one click on Restore puts the run's configuration back
        w.controls.ctx.slider.setValue(w.controls.ctx.slider.value() + 16)
        assert w.config != saved.config
        w.known_good.table.selectRow(0)
        w.known_good.restore_button.click()
        assert w.config == saved.config and w.controls.config() == saved.config
        assert w.plan.config == saved.config
    finally:
        w.shutdown()


def test_a_gui_run_with_remember_off_saves_nothing(qtbot, tmp_path, window):
    from kvtuner.core.store.library import ConfigLibrary

    w = window()
    try:
        w.known_good.remember.setChecked(False)
        assert w.settings.value("library/remember") in (False, "false")
        assert w.start_run()
        qtbot.waitUntil(lambda: not w.runner.running, timeout=240_000)
        w.pull()
        assert w.last_error == "", w.last_error
        qtbot.waitUntil(lambda: w.tasks.pending == 0 and w.library_note != "", timeout=20_000)
        assert w.saved_run_id is None and "off" in w.library_note
        assert w.last_run is not None  # measured numbers still kept for export
        with ConfigLibrary() as lib:
            assert lib.known_good() == []
        assert w.known_good.runs == []
    finally:
        w.shutdown()
