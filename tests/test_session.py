"""The Session the CLI and the app share: one machine identity for recording and reading
calibration, and a dry run's buffer names mapped to devices. Both bugs showed only on a machine
with an NVIDIA GPU, so a stand-in for the driver (kvtuner/testing/nvml_standin.py) plays one here."""

from __future__ import annotations

import pytest

from kvtuner.core.hardware import nvml
from kvtuner.core.hardware.host import detect_host
from kvtuner.core.hardware.identity import MachineFingerprint, machine_id
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.session import Session
from kvtuner.core.speed.calibration import CalibrationStore
from kvtuner.core.speed.measurement import Measurement
from kvtuner.core.units import MiB
from kvtuner.testing.llama_report_support import dry_run_result
from kvtuner.testing.nvml_standin import fake_nvml


@pytest.fixture
def one_gpu():
    """A machine with one (stand-in) 12 GiB RTX 3060."""
    nvml.use_nvml_module(fake_nvml(1))
    yield nvml.detect_gpus()
    nvml.use_nvml_module(None)


def _session(default_profile, gpus, tmp_path, **kw) -> Session:
    return Session(
        model=default_profile,
        config=PlanConfig(n_ctx=4096),
        gpus=tuple(gpus),
        host=detect_host(),
        calibration=CalibrationStore(tmp_path / "calibration.json"),
        measure_host_bandwidth=False,
        **kw,
    )


def test_a_run_recorded_on_a_gpu_machine_calibrates_the_next_prediction(default_profile, one_gpu, tmp_path):
    """GPU-only bug #1: runs were recorded under the id with the GPUs and read back under the id
    without them, so a GPU machine never used its own calibration."""
    s = _session(default_profile, one_gpu, tmp_path)
    assert s.machine_id == machine_id(one_gpu) == MachineFingerprint.current().fingerprint_id
    assert s.machine_id != machine_id(())  # the GPU is part of the identity
    before = s.assess()
    assert before.speed is not None and before.speed.n_calibration_runs == 0
    note = s.record_run(
        before.plan, Measurement(0, 512, 128, 2, before.speed.prefill_tok_s * 2, before.speed.decode_tok_s * 2)
    )
    assert "1 run" in note
    after = s.assess()
    assert after.speed.n_calibration_runs == 1
    assert after.speed.decode_tok_s > before.speed.decode_tok_s  # it learnt that this machine is faster
    # a second session of the same machine (the CLI after the app, say) reads the same runs
    again = _session(default_profile, one_gpu, tmp_path)
    assert again.assess().speed.n_calibration_runs == 1


def test_what_if_cards_do_not_change_the_machine(default_profile, one_gpu, tmp_path):
    from kvtuner.core.hardware.specs import what_if_gpu

    s = _session(default_profile, [what_if_gpu(24 << 30)], tmp_path, detected_gpus=tuple(one_gpu))
    assert s.machine_id == machine_id(one_gpu)
    assert _session(default_profile, [what_if_gpu(24 << 30)], tmp_path).machine_id == machine_id(())


def test_verified_compute_maps_cuda_host_to_the_host(default_profile, one_gpu, tmp_path):
    """GPU-only bug #2: after Verify the raw buffer names were used as devices, so the pinned
    host buffer (``CUDA_Host``) never reached the host and its compute dropped to 0."""
    s = _session(default_profile, one_gpu, tmp_path)
    s.set_verified(dry_run_result(compute_mib={"CUDA0": 514.5, "CUDA_Host": 12.01}, output_mib={"CPU": 1.0}))
    a = s.assess()
    assert a.verified is not None and a.plan.compute.source == "dry-run"
    assert a.plan.gpus[0].compute_bytes == round(514.5 * MiB)
    assert a.plan.host.compute_bytes == round(12.01 * MiB)
    doc = a.to_dict()
    assert doc["verified"]["compute_bytes"] == {"CUDA0": round(514.5 * MiB), "CUDA_Host": round(12.01 * MiB)}
    assert doc["verified"]["compute_bytes_by_device"] == {"CUDA0": round(514.5 * MiB), "CPU": round(12.01 * MiB)}
    # a change of configuration leaves the verified figures behind (they were for the old one)
    s.config = s.config.with_(n_ubatch=256)
    assert s.assess().verified is None


def test_a_cpu_only_dry_run_never_replaces_a_gpu_plan(default_profile, one_gpu, tmp_path):
    s = _session(default_profile, one_gpu, tmp_path, use_compute_cache=False)
    s.set_verified(dry_run_result(compute_mib={"CPU": 514.5}, output_mib={"CPU": 1.0}, devices=("CPU",)))
    a = s.assess()
    assert a.verified is not None  # shown side by side ...
    assert a.plan.compute.source == "estimate"  # ... but the plan keeps its GPU estimate


def test_a_run_is_recorded_for_this_machine_when_a_what_if_host_is_planned(default_profile, tmp_path):
    """A run always ran here: recorded while a what-if host (64 cores at 500 GB/s) is planned
    for, it is priced with this machine's host and probe, and calibrates this machine's next
    prediction exactly as the same run recorded without the what-if host does."""
    from dataclasses import replace as _replace

    def recorded(directory, what_if: bool) -> float:
        s = _session(default_profile, [], directory)
        s.calibration_store().host_bandwidth_bytes_s(s.machine_id)  # this machine's, measured once
        plan = s.assess().plan
        if what_if:
            s.host = _replace(detect_host(), what_if=True, mem_bandwidth_bytes_s=500e9, n_cores=64)
            s.n_threads = 2
        s.record_run(plan, Measurement(0, 512, 128, 2, 900.0, 40.0))
        run = s.calibration_store().runs(s.machine_id)[0]
        assert run.rates["CPU"].bandwidth_bytes_s != 500e9 and "what-if" not in run.rates["CPU"].source
        after = _session(default_profile, [], directory).assess()
        assert after.speed.n_calibration_runs == 1
        return after.speed.decode_tok_s

    assert recorded(tmp_path / "what-if", True) == pytest.approx(recorded(tmp_path / "here", False), rel=0.03)
