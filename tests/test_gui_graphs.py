"""Live graphs: bounded history, downsampling, dashed predictions, phase markers; the
redraw benchmark runs."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from kvtuner.core.monitor.sampler import HostSample
from kvtuner.core.units import GiB
from kvtuner.gui.app import make_app
from kvtuner.gui.series import Series
from kvtuner.gui.widgets.live_graphs import MAX_PHASE_MARKERS, LiveGraphs, nice_ceil


def test_series_is_bounded_and_keeps_the_newest_points():
    s = Series(capacity=100)
    for i in range(1000):
        s.append(float(i), float(i % 7))
    t, _ = s.arrays()
    assert len(s) == 100 and t[0] == 900 and t[-1] == 999
    s.extend(np.arange(1000, 1050, dtype=float), np.full(50, 42.0))
    assert len(s) == 100 and s.peak() == 42.0 and s.arrays()[0][-1] == 1049


def test_nice_ceil():
    assert [nice_ceil(v) for v in (0.9, 1.0, 1.1, 3.7, 7.9, 8.1, 1234)] == [1, 1, 1.25, 4, 8, 10, 1250]


def test_graphs_downsample_bound_history_and_mark_phases(qtbot):
    make_app()
    g = LiveGraphs(t0_s=0.0, capacity=600)
    qtbot.addWidget(g)
    g.add_host_samples([HostSample(i * 0.1, 16 * GiB, 8 * GiB, 0, None, None, GiB) for i in range(2000)])
    for i in range(10):
        g.add_decode(i, 5.0)
    g.set_predicted([("runner RAM", 2 * GiB)], [("decode", 6.0), ("prefill", 300.0)])
    for i in range(MAX_PHASE_MARKERS + 5):
        g.mark_phase(float(i), "decode")
    assert g.refresh() > 0 and g.refresh() == 0  # redraws only what changed
    assert len(g.series["ram_avail"]) == 600
    curve = g.curves["ram_avail"]
    assert curve.opts["autoDownsample"] and curve.opts["clipToView"] and curve.opts["downsampleMethod"] == "peak"
    assert len(g.phase_names()) == MAX_PHASE_MARKERS
    g.grab()


def test_redraw_benchmark_runs():
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gui_redraw.py"), "--seconds", "60", "--repeats", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert "ms" in out.stdout and "frame budget" in out.stdout, out.stderr
