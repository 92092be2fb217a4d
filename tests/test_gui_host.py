"""The host part of the window's "Plan for": a what-if memory, cores and PCIe link change the
prediction and name the host it is for; back to this machine, the prediction is this machine's
again. Offscreen, no llama.cpp needed."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from kvtuner.core.plan.config import PlanConfig
from kvtuner.gui.widgets.hardware_panel import DEFAULT_WHAT_IF
from kvtuner.testing.gui_support import HOST


def test_plan_for_host_part(qtbot, tmp_path: Path, make_window):
    w = make_window(PlanConfig(), wait=lambda w: w.model is not None and w.speed is not None)
    hw = w.hardware
    assert w.speed.host is not None and not w.speed.host["what_if"]  # this machine by default
    hw.choice.setCurrentIndex(hw.choice.findData(DEFAULT_WHAT_IF))
    qtbot.waitUntil(lambda: len(w.plan.gpus) == 1, timeout=10_000)
    # every layer on the CPU, so the host's RAM is what decode streams from
    w.set_config(w.wanted_config.with_(n_gpu_layers=0))
    hw.host_mem.setCurrentIndex(hw.host_mem.findData("DDR4-3200x2"))
    hw.host_cores.setValue(6)
    hw.host_pcie.setCurrentIndex(hw.host_pcie.findData("3x4"))
    qtbot.waitUntil(
        lambda: (
            w.speed is not None
            and (w.speed.host or {}).get("memory") == "DDR4-3200x2"
            and w.speed.host.get("pcie") == "3.0 x4"
        ),
        timeout=10_000,
    )
    assert w.speed.host["name"] == (
        "what-if host: DDR4-3200x2 (51.2 GB/s theoretical, 45.1 GB/s achieved), 6 cores, PCIe 3.0 x4"
    )
    assert w.speed.n_threads == 6 and w.session.host.what_if
    hw.host_mem.setCurrentIndex(0)
    hw.host_cores.setValue(0)
    hw.host_pcie.setCurrentIndex(0)
    qtbot.waitUntil(lambda: w.speed is not None and not (w.speed.host or {}).get("what_if"), timeout=10_000)
    assert w.session.host.n_cores is None and w.session.host.memory is None
    # kvtuner gui --host-mem DDR5-5200x2 --host-cores 8 --pcie 4x8: the window shows that host
    from dataclasses import replace

    given = replace(
        HOST,
        what_if=True,
        memory="DDR5-5200x2",
        mem_bandwidth_bytes_s=5200e6 * 16 * 0.72,
        mem_theoretical_bytes_s=5200e6 * 16,
        n_cores=8,
        pcie_link=(4, 8),
    )
    hw.set_what_if_host(given)
    got = hw.host_for(HOST)
    assert (got.memory, got.n_cores, got.pcie_link, got.what_if) == ("DDR5-5200x2", 8, (4, 8), True)
    assert got.mem_bandwidth_bytes_s == pytest.approx(given.mem_bandwidth_bytes_s)
    hw.set_what_if_host(replace(HOST, what_if=True, mem_bandwidth_bytes_s=30e9))  # --host-bw 30
    assert hw.host_for(HOST).mem_bandwidth_bytes_s == 30e9 and hw.host_for(HOST).memory is None
