"""Desktop app with the real runner: a bench on the default model puts points on the tok/s
and RAM graphs and shows load progress; Stop ends the child process."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pathlib import Path

import psutil
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
# find_spec, not importorskip: the test process itself must never load llama_cpp (the runner
# child does; test_runner_dryrun.py checks the parent stays clean)
import importlib.util

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("needs llama-cpp-python", allow_module_level=True)


from kvtuner.core.hardware.host import detect_host
from kvtuner.core.monitor.sampler import Sampler
from kvtuner.core.plan.config import PlanConfig
from kvtuner.gui.run_controller import BenchSettings
from kvtuner.testing.gui_support import assert_run_drawn

pytestmark = [pytest.mark.llama, pytest.mark.slow]

SMALL_CONFIG = PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64)


@pytest.fixture
def window(make_window):
    """The default model at a small configuration on this machine, with the real sampler: Run measures."""

    def make(bench):
        sampler = Sampler(interval_s=0.1, capacity=600, gpus=False)
        return make_window(SMALL_CONFIG, hardware=([], detect_host(), "test"), bench=bench, sampler=sampler)

    return make


def test_a_real_run_fills_the_graphs_and_shows_load_progress(qtbot, tmp_path, window):
    w = window(BenchSettings(n_prompt=32, n_gen=8, repetitions=1, warmup=False))
    try:
        assert w.start_run()
        assert not w.run_controls.stop_button.isHidden() and w.run_controls.stop_button.isEnabled()
        qtbot.waitUntil(lambda: not w.runner.running and not w.run_controls.stop_button.isEnabled(), timeout=240_000)
        assert_run_drawn(w)
        assert w.graphs.point_count("ram_avail") >= 1 and w.graphs.point_count("ram_used") >= 1
    finally:
        w.shutdown()


def test_stop_ends_the_child(qtbot, tmp_path, window):
    w = window(BenchSettings(n_prompt=32, n_gen=450, repetitions=1, warmup=False))
    try:
        assert w.start_run()
        qtbot.waitUntil(lambda: w.graphs.point_count("decode") >= 2 or not w.runner.running, timeout=240_000)
        pid = w.runner.pid
        assert w.runner.running, w.last_error  # n_prompt + n_gen fits the 512-token context
        assert pid is not None and psutil.pid_exists(pid)
        w.stop_run()
        qtbot.waitUntil(lambda: not w.runner.running, timeout=30_000)
        w.pull()
        gone = not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert gone
        assert w.run_controls.run_button.isEnabled() and not w.run_controls.stop_button.isEnabled()
        assert w.last_error == ""  # a requested stop is not an error
    finally:
        w.shutdown()


def test_a_run_that_fails_shows_the_error_and_the_app_keeps_working(qtbot, tmp_path, window):
    w = window(BenchSettings(n_prompt=16, n_gen=4, repetitions=1))
    try:
        gone = tmp_path / "gone.gguf"
        gone.write_bytes(Path(w.model_path).read_bytes()[:4096])  # a truncated copy: llama.cpp refuses it
        w.model_path = gone
        assert w.start_run()
        qtbot.waitUntil(lambda: not w.runner.running, timeout=120_000)
        w.pull()
        assert w.last_error and "Run failed" in w.last_error
        assert w.run_controls.run_button.isEnabled()
        w.controls.ctx.slider.setValue(w.controls.ctx.slider.value() + 8)
        assert w.plan.config.n_ctx == w.config.n_ctx
    finally:
        w.shutdown()
