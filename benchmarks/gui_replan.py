"""How long one slider move takes in the desktop app: plan, speed prediction, advice and the
redraw of the prediction panel, the work :meth:`MainWindow.replan` does on every move.

Opens the main window offscreen on the default model (a 12 GB what-if GPU, so every part of
the plan and the advisor runs), moves the context slider back and forth, and prints the median
milliseconds per move (wall and GUI-thread CPU) against a 16.7 ms frame (60 Hz). The goal is
"well under a frame"; tests only guard against a hang (tests/test_gui_controls.py).

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/gui_replan.py [--moves N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6 import QtCore, QtWidgets

from kvtuner.core.hardware.specs import HostSpec
from kvtuner.core.plan.config import PlanConfig
from kvtuner.gui.main_window import MainWindow
from kvtuner.testing.gui_support import IdleSampler

FRAME_MS = 1000 / 60
GiB = 1 << 30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=60, help="slider moves to time (default 60)")
    args = ap.parse_args(argv)

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    tmp = tempfile.mkdtemp(prefix="kvtuner-bench-")
    os.environ.setdefault("KVTUNER_DATA_DIR", os.path.join(tmp, "data"))
    settings = QtCore.QSettings(os.path.join(tmp, "kvtuner.ini"), QtCore.QSettings.Format.IniFormat)
    host = HostSpec(total_bytes=16 * GiB, available_bytes=12 * GiB, swap_total_bytes=2 * GiB)
    w = MainWindow(PlanConfig(), settings=settings, hardware=([], host, "benchmark"), sampler=IdleSampler())
    w.show()
    w.hardware.choice.setCurrentIndex(w.hardware.choice.findData("12 GB"))
    w.open_model(None)
    deadline = time.monotonic() + 60
    while (w.model is None or w.plan is None) and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    if w.model is None:
        print("the default model did not open", file=sys.stderr)
        return 2
    app.processEvents()
    slider = w.controls.ctx.slider
    base = slider.value()
    wall, cpu, inner = [], [], []
    for i in range(args.moves):
        t0, c0 = time.perf_counter(), time.thread_time()
        slider.setValue(base + (i % 16) - 8 if base >= 8 else base + (i % 16))
        app.processEvents()  # the redraw Qt schedules for the move
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
        inner.append(w.replan_ms)
    w.shutdown()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    med_wall, med_cpu = statistics.median(wall), statistics.median(cpu)
    print(f"slider moves: {args.moves} on the default model, 12 GB what-if GPU, load average {load:.1f}")
    print(
        f"  per move (replan + redraw): wall median {med_wall:.2f} ms (max {max(wall):.2f} ms); "
        f"GUI-thread CPU median {med_cpu:.2f} ms"
    )
    print(f"  replan alone (plan, speed, advice, panel update): median {statistics.median(inner):.2f} ms")
    print(
        f"  frame budget {FRAME_MS:.1f} ms -> {'within' if med_cpu < FRAME_MS else 'OVER'} budget (CPU time; "
        f"wall time also counts waiting for a core on a busy machine)"
    )
    return 0 if med_cpu < FRAME_MS else 1


if __name__ == "__main__":
    sys.exit(main())
