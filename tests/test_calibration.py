"""Calibration of the speed model (kvtuner.core.speed.calibration): storage and fitting."""

from __future__ import annotations

import json
import math

import pytest

from kvtuner.core.hardware.specs import HostSpec
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.plan.memory_plan import plan_memory
from kvtuner.core.speed.calibration import (
    FAMILY_TRANSFER_SIGMA,
    PRIOR_SIGMA,
    PRIOR_SIGMA_DECODE,
    PRIOR_SIGMA_PREFILL,
    SCHEMA_VERSION,
    CalibrationError,
    CalibrationStore,
    calibrated_inputs,
    data_dir,
    fit_calibration,
    measured_run,
    model_family,
)
from kvtuner.core.speed.measurement import Measurement
from kvtuner.core.speed.speed_model import SpeedConstants, decode_tok_s, prefill_tok_s, speed_inputs

HOST = HostSpec(16 << 30, 8 << 30, mem_bandwidth_bytes_s=10e9)


@pytest.fixture(scope="module")
def plan(default_profile):
    return plan_memory(default_profile, PlanConfig(n_ctx=4096, flash_attn="on"), [], HOST)


def run_of(plan, n_threads, decode, prefill, depth=0):
    return measured_run(
        plan,
        speed_inputs([], HOST, n_threads=n_threads),
        Measurement(depth, 64, 16, n_threads, prefill, decode),
        machine="m1",
    )


def test_data_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTUNER_DATA_DIR", str(tmp_path / "d"))
    assert data_dir() == tmp_path / "d"
    assert CalibrationStore().path == tmp_path / "d" / "calibration.json"


def test_store_round_trip_is_atomic(tmp_path, plan):
    store = CalibrationStore(tmp_path / "cal.json")
    r = run_of(plan, 2, 10.0, 80.0)
    store.add(r)
    assert [p.name for p in tmp_path.iterdir()] == ["cal.json"]  # no temporary file left behind
    again = CalibrationStore(tmp_path / "cal.json").runs("m1")
    assert len(again) == 1 and again[0].to_dict() == r.to_dict()
    assert again[0].family == model_family(plan.model) == "gemma3/MOSTLY_Q4_K_M"


def test_corrupt_file_is_set_aside(tmp_path):
    p = tmp_path / "cal.json"
    p.write_text("{not json")
    store = CalibrationStore(p)
    assert store.runs("m1") == []
    assert (tmp_path / "cal.json.bad").read_text() == "{not json"


def test_one_run_reproduces_itself(plan):
    # measured slower than the defaults predict: the fit moves the bottleneck constant
    r = run_of(plan, 2, 10.0, 70.0)
    cal = fit_calibration([r], model_family(plan.model))
    inp = speed_inputs([], HOST, n_threads=2, constants=cal.constants)
    assert decode_tok_s(plan, inp, 64 + 7) == pytest.approx(10.0, rel=0.01)
    assert prefill_tok_s(plan, inp, 64, 0) == pytest.approx(70.0, rel=0.01)
    assert cal.n_runs == cal.n_family_runs == 1


def test_band_narrows_as_runs_accumulate(plan):
    base = fit_calibration([], None)
    assert base.constants == SpeedConstants() and base.decode_sigma_log == PRIOR_SIGMA_DECODE
    assert base.prefill_sigma_log == PRIOR_SIGMA_PREFILL
    sigmas = []
    runs = []
    for i, threads in enumerate((2, 1, 2, 1, 2, 1)):
        runs.append(run_of(plan, threads, 10.0 if threads == 2 else 6.0, 80.0 if threads == 2 else 45.0, depth=i * 100))
        sigmas.append(fit_calibration(runs, model_family(plan.model)).decode_sigma_log)
    assert sigmas == sorted(sigmas, reverse=True)
    assert sigmas[0] < PRIOR_SIGMA_DECODE and sigmas[-1] < 0.5 * PRIOR_SIGMA_DECODE


def test_other_family_gets_the_machine_fit_with_a_wider_band(plan):
    runs = [run_of(plan, 2, 10.0, 80.0)]
    own = fit_calibration(runs, model_family(plan.model))
    other = fit_calibration(runs, "llama/MOSTLY_F16")
    assert other.n_family_runs == 0 and other.n_runs == 1
    assert other.decode_sigma_log == pytest.approx(math.hypot(own.decode_sigma_log, FAMILY_TRANSFER_SIGMA), rel=0.02)
    assert other.decode_sigma_log > own.decode_sigma_log


def test_calibrated_inputs_uses_the_store(tmp_path, plan):
    store = CalibrationStore(tmp_path / "cal.json")
    store.add(run_of(plan, 2, 10.0, 80.0))
    inp = calibrated_inputs(speed_inputs([], HOST, n_threads=2), plan.model, store, "m1")
    assert inp.n_calibration_runs == 1 and inp.sigma_log < PRIOR_SIGMA
    assert decode_tok_s(plan, inp, 71) == pytest.approx(10.0, rel=0.01)


@pytest.mark.parametrize(
    "decode, prefill, match",
    [
        (0.0, 10.0, "decode_tok_s must be a positive number"),
        (float("nan"), None, "decode_tok_s must be a positive number"),
        (None, None, "needs prefill_tok_s or decode_tok_s"),
    ],
)
def test_bad_measurements(plan, decode, prefill, match):
    with pytest.raises(CalibrationError, match=match):
        run_of(plan, 2, decode, prefill)


def test_unwritable_dir_says_what_to_change(tmp_path, plan):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = CalibrationStore(blocker / "sub" / "cal.json")
    with pytest.raises(CalibrationError, match="set KVTUNER_DATA_DIR"):
        store.add(run_of(plan, 2, 10.0, 80.0))


def test_host_bandwidth_probe_is_stored(tmp_path):
    store = CalibrationStore(tmp_path / "cal.json")
    bw = store.host_bandwidth_bytes_s("m1")
    assert bw and bw > 0
    data = json.loads((tmp_path / "cal.json").read_text())
    assert data["machines"]["m1"]["host_bandwidth"]["bytes_s"] == bw
    assert CalibrationStore(tmp_path / "cal.json").host_bandwidth_bytes_s("m1", measure=False) == bw


def test_cpu_probe_is_stored_per_thread_count_and_merged(tmp_path):
    from kvtuner.core.speed.cpu_probe import CpuRates

    store = CalibrationStore(tmp_path / "cal.json")
    assert store.cpu_rates(2, machine="m1") is None
    a = CpuRates(
        2,
        {"Q4_K": 20e9},
        {"Q4_K": 200e9},
        50e-6,
        0.3e-3,
        {"128": 50e-9},
        {"128": 5e-9},
        t_unix=__import__("time").time(),
    )
    store.set_cpu_rates(a, "m1")
    b = CpuRates(2, {"Q8_0": 18e9}, {"Q8_0": 90e9}, 60e-6, 0.4e-3, {"64": 55e-9}, {"64": 6e-9}, t_unix=a.t_unix)
    merged = store.set_cpu_rates(b, "m1")
    assert set(merged.decode_bytes_s) == {"Q4_K", "Q8_0"} and merged.layer_s == 60e-6  # newer fixed costs win
    assert set(merged.attn_decode_s) == {"128", "64"}
    again = CalibrationStore(tmp_path / "cal.json")
    assert again.cpu_rates(2, machine="m1") == merged
    assert again.cpu_rates(1, machine="m1") is None  # another thread count is another probe
    assert again.cpu_rates(2, machine="m1", max_age_s=-1) is None  # too old


def test_runs_of_an_older_schema_are_dropped(tmp_path):
    p = tmp_path / "cal.json"
    p.write_text(
        json.dumps(
            {"schema": 1, "machines": {"m1": {"runs": [{"old": 1}], "host_bandwidth": {"bytes_s": 1e10, "t_unix": 0}}}}
        )
    )
    store = CalibrationStore(p)
    assert store.runs("m1") == [] and store._data["schema"] == SCHEMA_VERSION
    assert store._data["machines"]["m1"]["host_bandwidth"]["bytes_s"] == 1e10  # the probe is kept


def test_a_run_corrects_the_prefill_kernels_it_ran(plan, tmp_path):
    """A bench of the default model (Q4_K_M: mostly Q5_0 matmuls in prefill, some Q4_K/Q6_K/Q8_0)
    measured 25% slower than predicted moves those types' prefill scales in proportion to their
    time; an F16 model, whose matmuls the run never exercised, keeps its prefill prediction."""
    from kvtuner.core.model.profile import ModelProfile
    from kvtuner.testing.gguf_factory import write_real_shape

    cold = speed_inputs([], HOST, n_threads=2)
    predicted = prefill_tok_s(plan, cold, 64, 0)
    cal = fit_calibration([run_of(plan, 2, 10.0, 0.75 * predicted)], None)
    scales = dict(cal.constants.host_prefill_type_scales)
    assert scales["Q5_0"] < scales["Q4_K"] <= 1.0  # the bigger share moves more
    assert cal.constants.host_prefill_scale == 1.0
    assert not any("@mul_mat_id" in t for t in scales)  # a dense model's bench never ran MoE experts' kernel
    f16 = ModelProfile.from_gguf(write_real_shape(tmp_path / "f16.gguf", "llama-3.2-1b", "F16"))
    f16_plan = plan_memory(f16, PlanConfig(n_ctx=1024), [], HOST)
    after = speed_inputs([], HOST, n_threads=2, constants=cal.constants)
    # within 0.1%: only its few F32 ops ran in the calibrating bench too
    assert prefill_tok_s(f16_plan, after, 64, 0) == pytest.approx(prefill_tok_s(f16_plan, cold, 64, 0), rel=1e-3)


def test_a_run_is_priced_with_the_rates_its_predictions_use(tmp_path, plan):
    """A stored CPU probe that does not cover the model (here: only Q8_0, and far faster than the
    assumed rates) is left out of the recorded run as it is of the prediction
    (cpu_probe.probe_covers), so one recorded run calibrates the prediction onto what it measured,
    not onto a base the prediction never uses."""
    import time

    from kvtuner.core.speed.calibration import record_bench
    from kvtuner.core.speed.cpu_probe import CpuRates, probe_covers

    store = CalibrationStore(tmp_path / "cal.json")
    other = CpuRates(2, {"Q8_0": 200e9}, {"Q8_0": 900e9}, 1e-6, 1e-5, {"64": 1e-9}, {"64": 1e-10}, t_unix=time.time())
    store.set_cpu_rates(other, "m1")
    assert not probe_covers(other, plan.model)
    cold = speed_inputs([], HOST, n_threads=2)
    measured = 0.5 * decode_tok_s(plan, cold, 71)
    run = record_bench(plan, Measurement(0, 64, 16, 2, None, measured), host=HOST, store=store, machine="m1")
    assert run.rates["CPU"].cpu is not None and run.rates["CPU"].cpu.source == cold.rates["CPU"].cpu.source
    after = calibrated_inputs(speed_inputs([], HOST, n_threads=2), plan.model, store, "m1")
    assert decode_tok_s(plan, after, 71) == pytest.approx(measured, rel=0.02)


def test_a_run_at_other_threads_is_priced_with_the_probe_the_predictions_read(tmp_path, plan):
    """The window predicts at 2 threads from the probe stored at 2; a run at 1 thread is priced
    with that probe moved to 1 thread (not with the assumed rates for want of a 1-thread probe),
    so its calibration corrects the base the predictions use."""
    import time

    from kvtuner.core.speed.calibration import record_bench
    from kvtuner.core.speed.cpu_probe import CpuRates, probe_covers, probe_needs

    types, dims = probe_needs(plan.model)
    probe = CpuRates(
        2,
        dict.fromkeys(types, 10e9),
        dict.fromkeys(types, 100e9),
        40e-6,
        5e-4,
        dict.fromkeys(dims, 1e-8),
        dict.fromkeys(dims, 1e-9),
        t_unix=time.time(),
    )
    assert probe_covers(probe, plan.model)
    store = CalibrationStore(tmp_path / "cal.json")
    store.set_cpu_rates(probe, "m1")
    m = Measurement(0, 64, 16, 1, None, 20.0)
    run = record_bench(plan, m, host=HOST, store=store, machine="m1", probe_threads=2)
    assert "moved from 2 to 1 threads" in run.rates["CPU"].cpu.source
    alone = record_bench(plan, m, host=HOST, store=CalibrationStore(tmp_path / "other.json"), machine="m1")
    assert alone.rates["CPU"].cpu.source.startswith("assumed")  # no probe at 1 thread, none asked for


def test_a_run_records_its_regime_and_counts_as_an_offload_run(tmp_path, default_profile, plan):
    """A run records where its plan kept weights and KV; the store keeps it, the family's fit
    lists the (regime, phase) pairs its runs measured, and a run stored before kvtuner recorded
    regimes counts for none."""
    from kvtuner.core.hardware.specs import catalogue_gpu

    gpus = [catalogue_gpu("RTX 3060 12GB")]
    gplan = plan_memory(default_profile, PlanConfig(n_ctx=4096, n_gpu_layers=6), gpus, HOST)
    run = measured_run(
        gplan, speed_inputs(gpus, HOST, n_threads=2), Measurement(0, 64, 16, 2, 500.0, 40.0), machine="m1"
    )
    assert run.regime == "partial_ngl"
    store = CalibrationStore(tmp_path / "cal.json")
    store.add(run)
    store.add(run_of(plan, 2, 10.0, 80.0))
    runs = CalibrationStore(tmp_path / "cal.json").runs("m1")
    assert sorted(r.regime for r in runs) == ["cpu", "partial_ngl"]
    fam = model_family(gplan.model)
    assert fit_calibration(runs, fam).regimes == {
        ("cpu", "decode"),
        ("cpu", "prefill"),
        ("partial_ngl", "decode"),
        ("partial_ngl", "prefill"),
    }
    assert fit_calibration(runs, "another-family").regimes == frozenset()  # other families' runs do not count
    inp = calibrated_inputs(speed_inputs(gpus, HOST, n_threads=2), gplan.model, store, "m1")
    assert ("partial_ngl", "decode") in inp.calibrated_regimes
    old = {k: v for k, v in run.to_dict().items() if k != "regime"}
    assert type(run).from_dict(old).regime == ""
