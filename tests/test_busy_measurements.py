"""One rule for trusting a measurement: a bench or CPU probe that met other load is shown with
that fact and kept out of calibration, the library and the stored probe (``--record-anyway``
keeps it); an implausible probe is re-measured. Real child processes spin beside the
measurements (as many as this machine has cores)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvtuner.core.monitor.contention import QUIET_LIMIT_ENV, QUIET_MAX_OTHER_CORES, ContentionMeter
from kvtuner.core.speed.calibration import BusyMeasurementError, CalibrationStore
from kvtuner.core.speed.cpu_probe import CpuRates, implausible_types
from kvtuner.testing.cli import run_kvtuner

HOG = "while True: pass"


def _hogs() -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 2)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _rates(**kw) -> CpuRates:
    return CpuRates(
        2, {"Q4_K": 10e9}, {"Q4_K": 1e11}, 1e-5, 1e-3, {"32/8/128": 1e-9}, {"32/8/128": 1e-10}, t_unix=time.time(), **kw
    )


@pytest.mark.slow
def test_the_meter_sees_other_processes_and_not_its_own_children(monkeypatch):
    monkeypatch.delenv(QUIET_LIMIT_ENV, raising=False)
    hogs = _hogs()
    try:
        meter = ContentionMeter().start()
        time.sleep(1.5)
        busy = meter.stop()
    finally:
        _stop(hogs)
    assert busy.limit == QUIET_MAX_OTHER_CORES
    assert busy.busy and busy.other_cores > 1.0 and not busy.counts() and busy.counts(record_anyway=True)
    assert "busy" in busy.reason("this bench") and "--record-anyway" in busy.reason()
    # a child tracked by the meter is this process's own load
    own = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<1.5: pass"])
    meter = ContentionMeter().start()
    meter.track(own.pid)
    own.wait()
    mine = meter.stop()
    assert mine.other_cores is not None and mine.other_cores < busy.other_cores


def test_a_busy_probe_is_not_stored(tmp_path):
    store = CalibrationStore(tmp_path / "calibration.json")
    with pytest.raises(BusyMeasurementError, match="busy during the CPU probe"):
        store.set_cpu_rates(_rates(other_cores=1.8, busy=True))
    assert store.cpu_rates(2) is None and not (tmp_path / "calibration.json").exists()
    kept = store.set_cpu_rates(_rates(other_cores=1.8, busy=True), record_anyway=True)
    assert kept.busy and CalibrationStore(tmp_path / "calibration.json").cpu_rates(2).other_cores == 1.8
    quiet = CalibrationStore(tmp_path / "q.json")
    quiet.set_cpu_rates(_rates(other_cores=0.1))
    assert quiet.cpu_rates(2).decode_bytes_s == {"Q4_K": 10e9}


def test_an_implausible_type_is_the_suspect():
    # the reading: Q4_K 2.9 GB/s beside Q6_K 10.8 (a busy moment slowed Q4_K)
    assert implausible_types({"Q4_K": 2.9e9, "Q6_K": 10.8e9}) == ["Q4_K"]
    # a wide type read slow: it streams far fewer bytes than narrower ones
    assert implausible_types({"Q4_K": 23e9, "Q6_K": 25e9, "Q8_0": 8e9}) == ["Q8_0"]
    # measured probes (benchmarks/moe_cpu_runs.json) are plausible
    assert (
        implausible_types({"MXFP4": 15.24e9, "Q4_K": 23.04e9, "Q5_0": 15.61e9, "Q6_K": 24.96e9, "Q8_0": 25.84e9}) == []
    )
    assert implausible_types({"Q4_K": 6.05e9, "Q5_0": 5.32e9, "Q6_K": 6.49e9, "Q8_0": 6.8e9}) == []


def test_a_lookup_type_is_never_the_suspect():
    """The table-lookup kernels (i-quants, ternary) decode at what their lookups allow: readings
    of an idle probe at one thread (benchmarks/results/2026-12-03-lookup-type-rates.md) are kept,
    and they are no evidence against a streaming type either."""
    idle = {"MXFP4": 5.30e9, "Q4_K": 8.45e9, "IQ3_XXS": 2.39e9, "IQ2_XXS": 1.37e9, "IQ4_XS": 4.34e9}
    assert implausible_types(idle) == []
    assert implausible_types({**idle, "Q4_K": 2.0e9}) == ["Q4_K"]  # a busy Q4_K is still caught


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_bench_beside_a_cpu_hog_records_nothing_and_says_why(tmp_path):
    """``kvtuner bench`` with busy loops on every core: the figures are printed, nothing enters
    calibration or the library, and the output says why."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != QUIET_LIMIT_ENV}
    env.update(KVTUNER_DATA_DIR=str(data), KVTUNER_CPU_PROBE="off")
    args = ("bench", "-p", "32", "-n", "8", "-r", "1", "-t", "1", "-c", "512")
    hogs = _hogs()
    try:
        text = run_kvtuner(*args, env=env, timeout=600)
        js = run_kvtuner(*args, "--json", env=env, timeout=600)
    finally:
        _stop(hogs)
    assert text.returncode == 0, text.stderr
    assert "the machine was busy during this bench" in text.stderr and "--record-anyway" in text.stderr
    assert "not kept   busy machine" in text.stdout and "decode" in text.stdout
    doc = json.loads(js.stdout)
    assert doc["contention"]["busy"] and not doc["contention"]["recorded"] and doc["contention"]["other_cores"] > 0.3
    cal = data / "calibration.json"
    assert not cal.exists() or not any(m.get("runs") for m in json.loads(cal.read_text())["machines"].values())
    assert "saved as working configuration" not in text.stderr + js.stderr


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_a_real_probe_beside_a_cpu_hog_is_not_stored(tmp_path):
    """``kvtuner probe`` of one small type with busy loops on every core: it stops after its first
    kernels, says the machine was busy and stores nothing."""
    env = {k: v for k, v in os.environ.items() if k != QUIET_LIMIT_ENV}
    env.update(KVTUNER_DATA_DIR=str(tmp_path))
    hogs = _hogs()
    try:
        out = run_kvtuner("probe", "--types", "Q4_0", "--attn", "8/2/64", "-t", "1", env=env, timeout=600)
    finally:
        _stop(hogs)
    assert out.returncode == 2 and "busy during the CPU probe" in out.stderr, out.stderr
    assert "stopped, nothing stored" in out.stderr  # it stops at the first check instead of measuring on
    assert CalibrationStore(Path(tmp_path) / "calibration.json").cpu_rates(1) is None


def _wait_gone(pid: int, timeout_s: float) -> bool:
    t = time.monotonic()
    while time.monotonic() - t < timeout_s:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.5)
    return False


def _kill_job(pid: int | None) -> None:
    import signal

    if pid:
        try:
            os.killpg(pid, signal.SIGTERM)  # the job leads its own session
        except OSError:
            pass


@pytest.mark.llama
def test_first_plan_answers_at_once_and_probes_in_the_background(tmp_path, monkeypatch):
    """``plan`` on a new data directory answers in seconds from assumed rates (said in the speed
    header and on stderr) and leaves a detached probe job behind that reports its progress."""
    from kvtuner.runner import probe_job

    env = {**os.environ, "KVTUNER_DATA_DIR": str(tmp_path)}
    env.pop("KVTUNER_CPU_PROBE", None)
    t0 = time.monotonic()
    out = run_kvtuner("plan", env=env, timeout=120)
    answer_s = time.monotonic() - t0
    pid = json.loads((tmp_path / "cpu-probe.json").read_text()).get("pid")
    try:
        assert out.returncode == 0, out.stderr
        assert answer_s < 30, answer_s  # no hang; not waiting for the probe: the line below
        assert "assumed CPU rates: no probe of this model's kernels yet" in out.stdout
        assert "in the background (pid" in out.stderr and "kernels at" in out.stderr
        time.sleep(3)
        again = run_kvtuner("plan", "--json", env=env, timeout=120)
        assert "the CPU probe is running in the background (kernel" in again.stderr, again.stderr
        assert json.loads(again.stdout)["speed"] is not None
        monkeypatch.setenv("KVTUNER_DATA_DIR", str(tmp_path))
        assert probe_job.is_running()
    finally:
        _kill_job(pid)
    assert _wait_gone(pid, 30)


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_the_background_job_stores_its_probe_and_runs_alone(tmp_path, monkeypatch):
    """A real background job of one small type: a second job finds the lock held and ends at once;
    the first stores its probe (the rule turned off by the test environment) and says so."""
    from kvtuner.runner import probe_job

    monkeypatch.setenv("KVTUNER_DATA_DIR", str(tmp_path))
    pid = probe_job.start_background(["Q4_0"], 1, ["8/2/64"], [], machine="testmachine")
    try:
        t = time.monotonic()
        while not probe_job.is_running() and time.monotonic() - t < 30:
            time.sleep(0.2)
        assert probe_job.is_running()
        second = run_kvtuner("-t", "1", "--types", "Q4_0", timeout=60, module="kvtuner.runner.probe_job")
        assert second.returncode == 3  # the lock is held: never two probes at once
        assert _wait_gone(pid, 600)
    finally:
        _kill_job(pid)
    st = probe_job.read_status()
    assert st["state"] == "stored", st
    rates = CalibrationStore(tmp_path / "calibration.json").cpu_rates(1, machine="testmachine")
    assert rates is not None and "Q4_0" in rates.decode_bytes_s and rates.other_cores is not None


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_an_implausible_type_is_measured_again_then_left_out(monkeypatch):
    """A real probe whose Q4_0 reading the plausibility rule rejects (forced here: one type alone
    has nothing to compare with): its matrix probe runs again, and a type still rejected is not in
    the result."""
    import kvtuner.runner.probe as probe

    monkeypatch.setattr(probe, "implausible_types", lambda rates: ["Q4_0"] if "Q4_0" in rates else [])
    seen: list[tuple[int, int, str]] = []
    rates = probe.run_cpu_probe(
        ["Q4_0", "Q8_0"], 1, attn_shapes=["8/2/64"], on_progress=lambda k, n, key, t: seen.append((k, n, key))
    )
    assert seen[-1] == (6, 6, "matrix:Q4_0")  # 2 overhead, 1 attention, 2 matrix, then Q4_0 again
    assert "Q4_0" not in rates.decode_bytes_s and "Q4_0" not in rates.prefill_flop_s
    assert rates.decode_bytes_s["Q8_0"] > 1e8 and rates.other_cores is not None


def test_a_busy_real_load_of_tune_does_not_calibrate(default_profile, tmp_path):
    """``tune --runs``: a confirming load measured on a busy machine is shown (a real load in the
    result) but never recorded for calibration; the same load kept is recorded."""
    from kvtuner.core.plan.config import PlanConfig
    from kvtuner.core.session import Session
    from kvtuner.core.speed.measurement import Keep, Measurement
    from kvtuner.core.tune.search import TuneGoal
    from kvtuner.testing.gui_support import HOST

    def session(name: str) -> Session:
        return Session(
            model=default_profile,
            config=PlanConfig(),
            gpus=(),
            host=HOST,
            n_threads=1,
            calibration=CalibrationStore(tmp_path / name),
            measure_host_bandwidth=False,
        )

    busy = session("busy.json")
    _, loads = busy.confirm_tune(
        TuneGoal(n_ctx=2048),
        lambda cfg: Measurement(
            1024, 64, 16, 1, 300.0, 40.0, other_cores=1.8, busy=True, keep=Keep(False, False, "busy")
        ),
        2,
    )
    assert loads and loads[0].to_dict()["recorded"] is False and loads[0].to_dict()["other_cores"] == 1.8
    assert busy.calibration_store().runs(busy.machine_id) == []
    quiet = session("quiet.json")
    quiet.confirm_tune(TuneGoal(n_ctx=2048), lambda cfg: Measurement(1024, 64, 16, 1, 300.0, 40.0, other_cores=0.1), 1)
    assert len(quiet.calibration_store().runs(quiet.machine_id)) == 1
