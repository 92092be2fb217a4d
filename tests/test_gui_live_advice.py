"""Live advice in the desktop app: the samplers' latest samples and the run's token rate feed
the advisor during a run; under 1 tok/s for 10 s the pane offers to stop, or the run stops by
itself when the user enabled it (persisted). The real Sampler holds the host samples (fed
synthetic ones through its public ``record``); the slow decode is a recorded token series fed
through the window's public ``add_decode_tokens``; the run being stopped is a real runner child."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import importlib.util
import time
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6 import QtCore

from kvtuner.core.hardware.host import detect_host
from kvtuner.core.monitor.sampler import HostSample, Sampler
from kvtuner.core.plan.config import PlanConfig
from kvtuner.gui.main_window import MainWindow
from kvtuner.gui.run_controller import BenchSettings

# find_spec, not importorskip: the test process must never load llama_cpp (the runner child does)
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")

GiB = 1 << 30
MiB = 1 << 20
SMALL_CONFIG = PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64)
# a long prefill: the real child is still loading or prefilling when the recorded series is fed
SLOW_BENCH = BenchSettings(n_prompt=448, n_gen=32, repetitions=1, warmup=False)


def _settings(tmp_path: Path) -> QtCore.QSettings:
    return QtCore.QSettings(str(tmp_path / "kvtuner.ini"), QtCore.QSettings.Format.IniFormat)


@pytest.fixture
def window(make_window):
    """The default model at a small configuration on this machine's host, with the real sampler at
    a long interval so the synthetic samples recorded by the tests stay the latest."""

    def make(settings, bench=SLOW_BENCH):
        sampler = Sampler(interval_s=60.0, capacity=600, gpus=False)
        hardware = ([], detect_host(), "test")
        return make_window(
            SMALL_CONFIG, settings=settings, hardware=hardware, bench=bench, sampler=sampler, wait=_planned
        )

    return make


def _planned(w: MainWindow) -> bool:
    return w.model is not None and w.plan is not None


def _feed_slow_decode(w: MainWindow, now: float) -> None:
    """12 s of decode at 0.5 tok/s (a recorded series) and a host low on RAM and swapping."""
    w.sampler.record(HostSample(now, 16 * GiB, 1 * GiB, 2 * GiB, 40 * MiB, 0.0, 600 * MiB))
    w.add_decode_tokens([(now - 12.0 + 2.0 * (i + 1), 2.0) for i in range(6)])


def _ids(w: MainWindow) -> list[str]:
    return [a.id for a in w.advisor.items]


def test_auto_stop_choice_persists(qtbot, tmp_path, window):
    settings = _settings(tmp_path)
    w = window(settings)
    assert not w.advisor.auto_stop.isChecked()
    w.advisor.auto_stop.setChecked(True)
    assert str(settings.value("advisor/auto_stop")).lower() == "true"
    w.shutdown()
    w2 = window(_settings(tmp_path))
    try:
        assert w2.advisor.auto_stop.isChecked()
    finally:
        w2.shutdown()


def test_no_live_advice_without_a_run(qtbot, tmp_path, window):
    w = window(_settings(tmp_path))
    try:
        now = time.monotonic()
        _feed_slow_decode(w, now)
        st = w.update_live(now)
        assert st.decode_tok_s is None and st.available_ram_bytes is None  # measured data needs a run
        assert "swap-risk" not in _ids(w) and w.advisor.stop_button is None
        assert not w.auto_stopped
    finally:
        w.shutdown()


@needs_llama
@pytest.mark.llama
@pytest.mark.slow
def test_live_advice_offers_to_stop_a_slow_run(qtbot, tmp_path, window):
    w = window(_settings(tmp_path))
    try:
        assert w.start_run()
        now = time.monotonic()
        _feed_slow_decode(w, now)
        st = w.update_live(now)
        # the state comes from the real sampler's latest sample and the token series
        assert (st.total_ram_bytes, st.available_ram_bytes) == (16 * GiB, 1 * GiB)
        assert st.swap_in_bytes_s == pytest.approx(40 * MiB)
        assert st.decode_tok_s == pytest.approx(0.5) and st.below_abandon_s >= 10
        ids = _ids(w)
        assert "swap-risk" in ids and "below-abandon-threshold" in ids
        slow = [a for a in w.advisor.items if a.id == "below-abandon-threshold" and a.fix_label == "Stop the run"]
        assert slow and "0.50 tok/s" in slow[0].message
        assert any("swapping in" in a.message for a in w.advisor.items)
        assert "live" in w.advisor.title()
        # auto-stop is off: the pane offers a Stop button (non-modal) and the run goes on
        assert w.advisor.stop_button is not None and not w.auto_stopped and w.runner.running
        w.advisor.stop_button.click()
        qtbot.waitUntil(lambda: not w.runner.running, timeout=60_000)
        w.pull()
        assert w.status.fields["runner"].text() == "runner: stopped"
        assert w.advisor.stop_button is None  # the run is over: no live speed advice any more
        assert "live" not in w.advisor.title()
    finally:
        w.shutdown()


@needs_llama
@pytest.mark.llama
@pytest.mark.slow
def test_auto_stop_stops_a_slow_run_by_itself(qtbot, tmp_path, window):
    w = window(_settings(tmp_path))
    try:
        w.advisor.auto_stop.setChecked(True)
        assert w.start_run()
        now = time.monotonic()
        # a recorded series: decode began at now - 14 s, one token every 2 s
        tokens = [(now - 14.0 + 2.0 * (i + 1), 2.0) for i in range(7)]
        w.add_decode_tokens(tokens[:4])  # up to now - 6 s
        st = w.update_live(now - 5.0)  # 9 s under the line: not yet
        assert st.decode_tok_s < 1 and 8.9 < st.below_abandon_s < 10
        assert not w.auto_stopped and w.runner.running
        w.add_decode_tokens(tokens[4:])
        w.update_live(now)  # 14 s under 1 tok/s
        assert w.auto_stopped
        qtbot.waitUntil(lambda: not w.runner.running, timeout=60_000)
        w.pull()
        assert w.status.fields["runner"].text() == "runner: stopped"
        assert "stopped by itself" in w.status.currentMessage()
        assert w.last_error == ""  # a stop is not a failure
    finally:
        w.shutdown()
