"""A real ``kvtuner bench`` records its run for calibration, and the next ``kvtuner plan``
predicts with it: real processes, the default model, an isolated data directory."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from kvtuner.testing.cli import run_kvtuner

# find_spec, not importorskip: the test process itself must never load llama_cpp
if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("needs llama-cpp-python", allow_module_level=True)

pytestmark = [pytest.mark.llama, pytest.mark.slow]

BENCH = ("bench", "-p", "64", "-n", "16", "-r", "1", "-t", "1")


def kvtuner(data_dir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m kvtuner.cli ARGS`` with its data in ``data_dir``."""
    return run_kvtuner(*args, extra_env={"KVTUNER_DATA_DIR": str(data_dir)}, timeout=timeout)


def plan_speed(data_dir: Path) -> dict:
    out = kvtuner(data_dir, "plan", "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    speed = json.loads(out.stdout)["speed"]
    assert speed is not None, out.stderr
    return speed


def _records(data_dir: Path) -> list[dict]:
    path = data_dir / "calibration.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [r for m in data["machines"].values() for r in m.get("runs", [])]


def test_bench_records_a_run_and_plan_is_calibrated_by_it(tmp_path):
    before = plan_speed(tmp_path)
    assert before["n_calibration_runs"] == 0
    assert _records(tmp_path) == []

    out = kvtuner(tmp_path, *BENCH, "--json")
    assert out.returncode == 0, out.stderr
    bench = json.loads(out.stdout)
    assert "recorded for speed calibration" in out.stderr

    runs = _records(tmp_path)
    assert len(runs) == 1
    run = runs[0]
    assert run["family"] == "gemma3/MOSTLY_Q4_K_M" and run["n_threads"] == 1
    assert run["decode_tok_s"] == pytest.approx(bench["decode_tok_s"]["median"])
    assert run["prefill_tok_s"] == pytest.approx(bench["prefill_tok_s"]["median"])
    assert run["config"]["n_ctx"] == bench["config"]["n_ctx"]

    after = plan_speed(tmp_path)
    assert after["n_calibration_runs"] == 1
    assert after["decode_tok_s"] != pytest.approx(before["decode_tok_s"], rel=1e-9)  # new constants
    width = lambda s: s["band"][1] / s["band"][0]  # noqa: E731
    assert width(after) < width(before)  # the band narrows with a run of this family
    assert after["band"][0] <= after["decode_tok_s"] <= after["band"][1]

    text = kvtuner(tmp_path, "plan", timeout=120)
    assert text.returncode == 0 and "calibrated on 1 run" in text.stdout


def test_no_record_leaves_calibration_alone(tmp_path):
    out = kvtuner(tmp_path, *BENCH, "--no-record")
    assert out.returncode == 0, out.stderr
    assert "recorded" not in out.stderr
    assert _records(tmp_path) == []


def test_a_gui_run_records_a_run_and_the_prediction_uses_it(qtbot, tmp_path, monkeypatch, make_window):
    pytest.importorskip("PySide6")
    pytest.importorskip("pyqtgraph")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from kvtuner.core.hardware.host import detect_host
    from kvtuner.core.monitor.sampler import Sampler
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.gui.run_controller import BenchSettings
    from kvtuner.testing.gui_support import NO_MODEL

    monkeypatch.setenv("KVTUNER_DATA_DIR", str(tmp_path / "data"))
    w = make_window(
        PlanConfig(n_ctx=512, n_ubatch=64, n_batch=64),
        hardware=([], detect_host(), "test"),
        bench=BenchSettings(n_prompt=32, n_gen=8, repetitions=1),
        sampler=Sampler(interval_s=0.1, capacity=600, gpus=False),
        model=NO_MODEL,
    )
    # count the run whatever else loads this shared machine (the quiet-machine rule has its own
    # test: tests/test_gui_one_truth.py)
    w.run_events.quiet_max_other_cores = float("inf")
    try:
        w.open_model(None)
        qtbot.waitUntil(lambda: w.model is not None and w.speed is not None, timeout=30_000)
        before = w.speed
        assert before.n_calibration_runs == 0
        assert w.start_run()
        qtbot.waitUntil(lambda: not w.runner.running, timeout=240_000)
        qtbot.waitUntil(lambda: bool(w.calibration_note), timeout=60_000)
        assert "recorded for speed calibration" in w.calibration_note, w.calibration_note
        runs = _records(tmp_path / "data")
        assert len(runs) == 1 and runs[0]["decode_tok_s"] == pytest.approx(w.measured["decode_tok_s"])
        qtbot.waitUntil(lambda: w.speed is not None and w.speed.n_calibration_runs == 1, timeout=10_000)
        width = lambda s: s.band[1] / s.band[0]  # noqa: E731
        assert width(w.speed) < width(before)
    finally:
        w.shutdown()
