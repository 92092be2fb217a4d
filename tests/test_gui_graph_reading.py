"""Graphs read at a glance: legends above the data so phase labels never sit
under them, a log memory axis on which the runner's few hundred MiB are visible beside 20+ GiB
of available RAM, and a time axis that follows the current run with a "whole session" toggle.
Real pyqtgraph widgets offscreen."""

from __future__ import annotations

import math
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("pyqtgraph")

from kvtuner.core.monitor.sampler import HostSample
from kvtuner.gui.app import make_app
from kvtuner.gui.widgets.live_graphs import RUN_LEAD_S, LiveGraphs

GiB = 1 << 30


def _graphs(qtbot) -> LiveGraphs:
    make_app()
    g = LiveGraphs(t0_s=0.0, capacity=2000)
    qtbot.addWidget(g)
    g.resize(900, 420)
    g.show()
    # 100 s of a 24 GiB machine with 22 GiB available; the runner holds 0.4 GiB from t = 90 s
    g.add_host_samples(
        [
            HostSample(i * 0.1, 24 * GiB, 22 * GiB, 0, None, None, (int(0.4 * GiB) if i >= 900 else None))
            for i in range(1000)
        ]
    )
    g.set_predicted([("runner RAM", int(0.45 * GiB))], [("decode", 60.0), ("prefill", 300.0)])
    return g


def test_runner_ram_is_visible_on_the_memory_axis(qtbot):
    g = _graphs(qtbot)
    g.refresh()
    lo, hi = g.mem_plot.getPlotItem().getViewBox().viewRange()[1]  # log10 GiB
    assert lo < math.log10(0.4) < hi and lo < math.log10(22) < hi
    # 0.4 GiB sits well above the bottom: at least a fifth of the axis height
    assert (math.log10(0.4) - lo) / (hi - lo) > 0.2


def test_the_time_axis_follows_the_run_or_the_whole_session(qtbot):
    g = _graphs(qtbot)
    g.begin_run(90.0)
    g.refresh()
    x_lo, x_hi = g.mem_plot.getPlotItem().getViewBox().viewRange()[0]
    assert 90.0 - RUN_LEAD_S - 1.0 <= x_lo <= 90.0 and x_hi >= 99.9
    g.set_whole_session(True)
    x_lo, x_hi = g.mem_plot.getPlotItem().getViewBox().viewRange()[0]
    assert x_lo <= 0.0 and x_hi >= 99.9


def test_phase_labels_never_sit_under_the_legends(qtbot):
    g = _graphs(qtbot)
    g.begin_run(90.0)
    # a run's phases as the runner reports them: loading within milliseconds, then prefill and
    # decode; then a second run's prefill and decode a few seconds later
    for t, name in (
        (90.2, "weights"),
        (90.21, "KV"),
        (90.23, "compute"),
        (91.0, "prefill"),
        (91.8, "decode"),
        (93.0, "prefill 1"),
        (93.9, "decode 1"),
    ):
        g.mark_phase(t, name)
    assert g.phase_names() == ["weights", "KV", "compute", "prefill", "decode", "prefill 1", "decode 1"]
    g.refresh()
    qtbot.wait(50)
    legend = g.mem_legend.sceneBoundingRect()
    view = g.mem_plot.getPlotItem().getViewBox().sceneBoundingRect()
    assert legend.bottom() <= view.top() + 1  # the legend is above the data area
    labelled = [top for top, _ in g._phases if hasattr(top, "label")]
    assert [t.label.format for t in labelled] == ["weights, KV, compute", "prefill", "decode", "prefill 1", "decode 1"]
    labels = [top.label.sceneBoundingRect() for top in labelled]
    assert all(not r.intersects(legend) for r in labels)
    for i, a in enumerate(labels):  # close markers: staggered, their labels do not overlap
        assert all(not a.intersects(b) for b in labels[i + 1 :])
