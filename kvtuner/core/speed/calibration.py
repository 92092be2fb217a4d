"""Calibration of the speed model from measured runs, per machine and model family.

Every measured run (a bench: prefill and decode tokens/s at a known depth, thread count and
configuration) is stored with the *workload* the speed model computed for it
(:class:`kvtuner.core.speed.speed_model.Workload`: bytes and FLOPs per device) and the device rates
of the time. Fitting then re-evaluates :func:`~kvtuner.core.speed.speed_model.workload_time_s` under
scaled constants and picks the scales ``s`` (natural log ``x = ln s``) that minimise

    sum_runs (ln t_predicted(run; s) - ln t_measured(run))^2 + PRIOR_WEIGHT * sum_params x^2

(least squares in log space with a ridge prior toward the starting constants; with one run the
prior picks the smallest change, i.e. the constant of the bottleneck term moves). Decode fits
``host_decode_scale``, ``host_attn_scale``, ``host_overhead_scale``, ``gpu_bw_efficiency`` and
``gpu_token_overhead_s``; prefill fits one host scale per weight type the runs computed on the CPU
(``host_prefill_type_scales``, MoE experts' MUL_MAT_ID apart: a run corrects the kernels it ran, in proportion to their share of its
time), ``gpu_int8_efficiency`` and ``gpu_fp16_efficiency``. A family (``architecture/file_type``) is fitted starting from the
machine-wide fit.

Band: the relative 1-sigma uncertainty (natural log) starts at the measured spread of the
uncalibrated model's errors on the validation sets (:data:`PRIOR_SIGMA_DECODE`,
:data:`PRIOR_SIGMA_PREFILL`: the root mean square of ``ln(predicted / measured)`` printed by
``benchmarks/speed_validation.py``, CPU and public-GPU rows together) and shrinks with the runs
behind a fit,

    sigma^2 = (PRIOR_SIGMA^2 * PRIOR_RUNS + sum residual^2) / (PRIOR_RUNS + n_runs)

plus FAMILY_TRANSFER_SIGMA in quadrature when the family has no run of its own.

The CPU probe (:mod:`.cpu_probe`) is stored here too, per machine and thread count.

Storage: ``calibration.json`` in the user data directory (``platformdirs.user_data_dir("kvtuner")``,
``KVTUNER_DATA_DIR`` overrides), written atomically (temporary file + ``os.replace``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..fileio import replace_atomic
from ..hardware.identity import machine_id
from ..hardware.specs import GpuSpec, HostSpec
from ..model.profile import ModelProfile
from ..plan.memory_plan import MemoryPlan
from .cpu_probe import PROBE_MAX_AGE_S, CpuRates, ProbeError, probe_covers
from .measurement import Measurement
from .regime import placement_regime
from .speed_model import (
    PREFILL_TYPE_PARAM,
    DeviceRates,
    SpeedConstants,
    SpeedInputs,
    SpeedModelError,
    Workload,
    decode_workload,
    kernel_tag,
    prefill_workload,
    workload_time_s,
)

#: The stored runs' form: a change that makes stored runs' workloads or rates differ from what
#: predictions now use raises it, and a file of another version keeps its CPU probes but drops
#: its runs (:meth:`CalibrationStore._load`).
SCHEMA_VERSION = 8
FILE_NAME = "calibration.json"
#: Runs kept per machine (oldest dropped first).
MAX_RUNS_PER_MACHINE = 500
#: Relative 1-sigma error of the uncalibrated model, decode and prefill (natural log): the RMS of
#: ln(predicted / measured) over the validation rows of benchmarks/speed_validation.py
#: (docs/accuracy/speed.md, "Validation"): decode 0.131 on 14 CPU rows and 0.164 on 17 public GPU rows, 0.150 together;
#: prefill 0.169 on 14 CPU rows (with the MoE expert term) and 0.285 on 18 GPU rows, 0.241 together.
PRIOR_SIGMA_DECODE = 0.150
PRIOR_SIGMA_PREFILL = 0.241
#: The larger of the two (older callers).
PRIOR_SIGMA = max(PRIOR_SIGMA_DECODE, PRIOR_SIGMA_PREFILL)
#: Weight of the prior sigma, in runs.
PRIOR_RUNS = 1.0
#: Extra sigma when a family is predicted from other families' runs.
FAMILY_TRANSFER_SIGMA = 0.15
#: Ridge weight pulling fitted log-scales toward 0.
PRIOR_WEIGHT = 0.02
#: Host bandwidth probe results are reused for this long, seconds.
HOST_BANDWIDTH_MAX_AGE_S = 7 * 24 * 3600.0

DECODE_PARAMS = (
    "host_decode_scale",
    "host_attn_scale",
    "host_overhead_scale",
    "gpu_bw_efficiency",
    "gpu_token_overhead_s",
)
#: Plus one ``host_prefill_type:TYPE`` scale per weight type the runs computed on the host.
PREFILL_PARAMS = ("gpu_int8_efficiency", "gpu_fp16_efficiency")


class CalibrationError(ValueError):
    """Bad measured data; the message says what to change."""


class BusyMeasurementError(CalibrationError):
    """A measurement made while other processes kept the machine busy, refused for storage."""


def data_dir() -> Path:
    """kvtuner's user data directory (:func:`kvtuner.core.paths.data_dir`: ``$KVTUNER_DATA_DIR``
    or platformdirs' user data dir)."""
    from .. import paths

    return paths.data_dir()


def model_family(model: ModelProfile) -> str:
    """``architecture/file_type`` (``gemma3/MOSTLY_Q4_K_M``): models of a family share kernels."""
    return f"{model.architecture}/{model.file_type or '?'}"


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run with the workloads the speed model assigns to it.

    Attributes:
        machine: :func:`machine_id`.
        family: :func:`model_family`.
        model_sha256: header hash of the model.
        n_threads: CPU threads of the run.
        config: the PlanConfig as a dict.
        rates: device rates at the time of the run.
        decode_work, decode_tok_s: decode workload (one token at the run's mean decode depth)
            and measured decode tokens/s (None if not measured).
        prefill_work, prefill_tok_s: the same for the prefill.
        t_unix: when it was recorded, Unix seconds.
        regime: where the run's plan kept weights and KV (:func:`.regime.placement_regime`;
            empty for runs recorded before kvtuner stored it).
    """

    machine: str
    family: str
    model_sha256: str
    n_threads: int
    config: dict[str, Any]
    rates: dict[str, DeviceRates]
    decode_work: Workload | None
    decode_tok_s: float | None
    prefill_work: Workload | None
    prefill_tok_s: float | None
    t_unix: float = 0.0
    regime: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (the stored form)."""
        return {
            "machine": self.machine,
            "family": self.family,
            "model_sha256": self.model_sha256,
            "n_threads": self.n_threads,
            "config": self.config,
            "rates": {k: r.to_dict() for k, r in self.rates.items()},
            "decode_work": self.decode_work.to_dict() if self.decode_work else None,
            "decode_tok_s": self.decode_tok_s,
            "prefill_work": self.prefill_work.to_dict() if self.prefill_work else None,
            "prefill_tok_s": self.prefill_tok_s,
            "t_unix": self.t_unix,
            "regime": self.regime,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MeasuredRun:
        """Inverse of :meth:`to_dict`; KeyError/TypeError/ValueError on a malformed record."""
        return cls(
            machine=str(d["machine"]),
            family=str(d["family"]),
            model_sha256=str(d.get("model_sha256", "")),
            n_threads=int(d["n_threads"]),
            config=dict(d.get("config") or {}),
            rates={k: DeviceRates.from_dict(k, r) for k, r in d["rates"].items()},
            decode_work=Workload.from_dict(d["decode_work"]) if d.get("decode_work") else None,
            decode_tok_s=float(d["decode_tok_s"]) if d.get("decode_tok_s") else None,
            prefill_work=Workload.from_dict(d["prefill_work"]) if d.get("prefill_work") else None,
            prefill_tok_s=float(d["prefill_tok_s"]) if d.get("prefill_tok_s") else None,
            t_unix=float(d.get("t_unix", 0.0)),
            regime=str(d.get("regime", "")),
        )


def measured_run(
    plan: MemoryPlan, inputs: SpeedInputs, measurement: Measurement, *, machine: str | None = None
) -> MeasuredRun:
    """A :class:`MeasuredRun` for a bench of ``plan`` (llama-bench style, as
    :func:`kvtuner.runner.bench.run_bench` does it: fill ``n_depth`` tokens, prefill ``n_prompt``
    at that depth, decode ``n_gen`` after it, so decode runs at the mean depth
    ``n_depth + n_prompt + (n_gen - 1) / 2``), from the ``measurement``'s tokens, threads and
    median rates.

    Raises:
        CalibrationError: a speed that is not a positive number, or nothing measured.
    """
    m = measurement
    prefill_tok_s, decode_tok_s = m.prefill_tok_s, m.decode_tok_s
    for name, v in (("prefill_tok_s", prefill_tok_s), ("decode_tok_s", decode_tok_s)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise CalibrationError(f"{name} must be a positive number of tokens/s, not {v!r}")
    if prefill_tok_s is None and decode_tok_s is None:
        raise CalibrationError("a measured run needs prefill_tok_s or decode_tok_s")
    try:
        pre_w = (
            prefill_workload(plan, m.n_prompt, m.n_depth, inputs.constants) if (prefill_tok_s and m.n_prompt) else None
        )
        depth = min(plan.n_ctx_seq - 1, m.n_depth + m.n_prompt + max(0, m.n_gen - 1) // 2)
        dec_w = decode_workload(plan, depth, inputs.constants) if decode_tok_s else None
    except SpeedModelError as exc:
        raise CalibrationError(str(exc)) from None
    return MeasuredRun(
        machine=machine or machine_id(),
        family=model_family(plan.model),
        model_sha256=plan.model.header_sha256,
        n_threads=m.n_threads,
        config=plan.config.to_dict(),
        rates=dict(inputs.rates),
        decode_work=dec_w,
        decode_tok_s=decode_tok_s if dec_w else None,
        prefill_work=pre_w,
        prefill_tok_s=prefill_tok_s if pre_w else None,
        t_unix=time.time(),
        regime=placement_regime(plan),
    )


@dataclass(frozen=True)
class Calibration:
    """A fit: constants and 1-sigma log uncertainty for decode and prefill, run counts, and the
    ``(regime, phase)`` pairs the model family's own runs measured (``regimes``; empty when the
    family has no run: other families' runs do not speak for its regimes)."""

    constants: SpeedConstants
    decode_sigma_log: float = PRIOR_SIGMA_DECODE
    prefill_sigma_log: float = PRIOR_SIGMA_PREFILL
    n_runs: int = 0
    n_family_runs: int = 0
    regimes: frozenset[tuple[str, str]] = frozenset()


def _run_time_s(work: Workload, run: MeasuredRun, constants: SpeedConstants) -> float:
    return workload_time_s(work, SpeedInputs(run.rates, run.n_threads, constants))


def _fit(runs: Sequence[MeasuredRun], base: SpeedConstants, phase: str) -> tuple[SpeedConstants, list[float]]:
    """Coordinate descent on log-scales of the phase's constants (see the module docstring);
    returns the fitted constants and the log residuals (predicted over measured time)."""
    params = DECODE_PARAMS if phase == "decode" else PREFILL_PARAMS
    data = []
    for r in runs:
        w, tok_s = (r.decode_work, r.decode_tok_s) if phase == "decode" else (r.prefill_work, r.prefill_tok_s)
        if w is not None and tok_s:
            data.append((r, w, math.log(w.n_tokens / tok_s)))
    if not data:
        return base, []
    # only fit what the runs exercise
    has_gpu = any(d.kind == "gpu" for _, w, _ in data for d in w.devices)
    has_host = any(d.kind == "host" for _, w, _ in data for d in w.devices)
    active = [p for p in params if (("gpu" in p and has_gpu) or ("host" in p and has_host) or "overhead" in p)]
    if phase == "prefill":
        active += sorted(
            {
                PREFILL_TYPE_PARAM + kernel_tag(typ)
                for _, w, _ in data
                for d in w.devices
                if d.kind == "host"
                for typ, *_ in d.weights
            }
        )
    x = dict.fromkeys(active, 0.0)

    def constants_of(xs: dict[str, float]) -> SpeedConstants:
        return base.scaled(**{p: math.exp(v) for p, v in xs.items()})

    def loss(xs: dict[str, float]) -> float:
        c = constants_of(xs)
        err = sum((math.log(_run_time_s(w, r, c)) - lt) ** 2 for r, w, lt in data)
        return err + PRIOR_WEIGHT * sum(v * v for v in xs.values())

    best = loss(x)
    for step in (1.0, 0.3, 0.1, 0.03, 0.01, 0.003):
        for _ in range(6):
            improved = False
            for p in active:
                for _ in range(40):  # walk in each direction while it helps
                    moved = False
                    for sign in (1, -1):
                        trial = dict(x)
                        trial[p] = x[p] + sign * step
                        if abs(trial[p]) > 5:
                            continue
                        val = loss(trial)
                        if val < best - 1e-12:
                            x, best, moved, improved = trial, val, True, True
                            break
                    if not moved:
                        break
            if not improved:
                break
    c = constants_of(x)
    return c, [math.log(_run_time_s(w, r, c)) - lt for r, w, lt in data]


def _sigma(residuals: Sequence[float], prior: float) -> float:
    n = len(residuals)
    return math.sqrt((prior**2 * PRIOR_RUNS + sum(r * r for r in residuals)) / (PRIOR_RUNS + n))


def run_regimes(runs: Sequence[MeasuredRun]) -> frozenset[tuple[str, str]]:
    """The ``(regime, phase)`` pairs ``runs`` measured (a run stored without its regime counts for
    none)."""
    out = set()
    for r in runs:
        if r.regime:
            if r.decode_tok_s:
                out.add((r.regime, "decode"))
            if r.prefill_tok_s:
                out.add((r.regime, "prefill"))
    return frozenset(out)


def fit_calibration(
    runs: Sequence[MeasuredRun], family: str | None = None, base: SpeedConstants | None = None
) -> Calibration:
    """Fit constants to ``runs`` (one machine's); with ``family``, refine the machine-wide fit
    on that family's runs. No runs: the defaults with :data:`PRIOR_SIGMA_DECODE` and
    :data:`PRIOR_SIGMA_PREFILL`."""
    base = base or SpeedConstants()
    machine_c, dec_res = _fit(runs, base, "decode")
    machine_c2, pre_res = _fit(runs, machine_c, "prefill")
    fam_runs = [r for r in runs if family is not None and r.family == family]
    if fam_runs:
        c, fdec = _fit(fam_runs, machine_c2, "decode")
        c, fpre = _fit(fam_runs, c, "prefill")
        return Calibration(
            c,
            _sigma(fdec, PRIOR_SIGMA_DECODE),
            _sigma(fpre, PRIOR_SIGMA_PREFILL),
            len(runs),
            len(fam_runs),
            run_regimes(fam_runs),
        )
    extra = FAMILY_TRANSFER_SIGMA if (family is not None and runs) else 0.0
    return Calibration(
        machine_c2,
        math.hypot(_sigma(dec_res, PRIOR_SIGMA_DECODE), extra),
        math.hypot(_sigma(pre_res, PRIOR_SIGMA_PREFILL), extra),
        len(runs),
        0,
    )


class CalibrationStore:
    """Measured runs and the host bandwidth probe, per machine, in one JSON file.

    ``path`` defaults to ``data_dir() / "calibration.json"``. A missing or unreadable file is an
    empty store (an unreadable one is kept aside as ``calibration.json.bad``).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else data_dir() / FILE_NAME
        self._data = self._load()

    def _load(self) -> dict[str, Any]:
        empty: dict[str, Any] = {"schema": SCHEMA_VERSION, "machines": {}}
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return empty
        except OSError:
            return empty
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("machines"), dict):
                raise ValueError("not a calibration file")
            if data.get("schema") != SCHEMA_VERSION:  # runs hold an older speed model's workloads
                for m in data["machines"].values():
                    if isinstance(m, dict):
                        m["runs"] = []
                data["schema"] = SCHEMA_VERSION
            return data
        except ValueError:
            try:
                os.replace(self.path, self.path.with_name(self.path.name + ".bad"))
            except OSError:
                pass
            return empty

    def _save(self) -> None:
        """Write atomically: a temporary file in the same directory, then ``os.replace``.

        Raises:
            CalibrationError: the directory cannot be written (says which).
        """
        try:
            replace_atomic(self.path, json.dumps(self._data, indent=1))
        except OSError as exc:
            raise CalibrationError(
                f"cannot write calibration to {self.path.parent}: {exc.strerror or exc}; "
                "set KVTUNER_DATA_DIR to a writable directory"
            ) from None

    def _machine(self, machine: str) -> dict[str, Any]:
        return self._data["machines"].setdefault(machine, {"runs": []})

    def runs(self, machine: str | None = None) -> list[MeasuredRun]:
        """Stored runs of ``machine`` (default: this one); malformed records and records of an
        older schema (other workload fields) are skipped."""
        m = self._data["machines"].get(machine or machine_id(), {})
        out = []
        for d in m.get("runs", []):
            try:
                out.append(MeasuredRun.from_dict(d))
            except (KeyError, TypeError, ValueError):
                continue
        return out

    def add(self, run: MeasuredRun) -> None:
        """Store one run (keeps the newest :data:`MAX_RUNS_PER_MACHINE`) and save.

        Raises:
            CalibrationError: the file cannot be written.
        """
        m = self._machine(run.machine)
        m["runs"] = (m.get("runs", []) + [run.to_dict()])[-MAX_RUNS_PER_MACHINE:]
        self._save()

    def clear(self, machine: str | None = None) -> None:
        """Forget the runs of ``machine`` (default: this one) and save."""
        self._data["machines"].pop(machine or machine_id(), None)
        self._save()

    def calibration(
        self, family: str | None = None, machine: str | None = None, base: SpeedConstants | None = None
    ) -> Calibration:
        """:func:`fit_calibration` over this machine's runs."""
        return fit_calibration(self.runs(machine), family, base)

    def cpu_rates(
        self, n_threads: int, kv_type: str = "f16", machine: str | None = None, *, max_age_s: float = PROBE_MAX_AGE_S
    ) -> CpuRates | None:
        """The stored CPU probe of ``machine`` (default: this one) at ``n_threads`` threads with
        ``kv_type`` KV, or None when there is none younger than ``max_age_s`` seconds."""
        m = self._data["machines"].get(machine or machine_id(), {})
        rec = (m.get("cpu_probe") or {}).get(_probe_key(n_threads, kv_type)) if isinstance(m, dict) else None
        if not isinstance(rec, dict):
            return None
        try:
            rates = CpuRates.from_dict(rec)
        except ProbeError:
            return None
        if time.time() - rates.t_unix > max_age_s:
            return None
        return rates

    def model_cpu_rates(
        self, model: ModelProfile | None, n_threads: int, machine: str | None = None
    ) -> CpuRates | None:
        """The stored f16-KV CPU probe of ``machine`` at ``n_threads`` threads (:meth:`cpu_rates`)
        when it covers ``model`` (:func:`~kvtuner.core.speed.cpu_probe.probe_covers`), else None:
        the assumed rates, all of them, until this model's kernels are measured. A probe of other
        models' kernels would mix measured and assumed rates, and a prediction would depend on
        which models were probed before. Predictions and recorded runs both read it, so a run is
        priced with the rates the predictions it calibrates use."""
        cpu = self.cpu_rates(n_threads, "f16", machine)
        if cpu is not None and model is not None and not probe_covers(cpu, model):
            return None
        return cpu

    def set_cpu_rates(self, rates: CpuRates, machine: str | None = None, *, record_anyway: bool = False) -> CpuRates:
        """Keep a CPU probe (merged with the stored weight types of the same thread count and KV
        type) and save; returns what is now stored. A probe measured on a busy machine
        (``rates.busy``, :class:`kvtuner.core.monitor.contention.Contention`) is refused unless
        ``record_anyway``: it measured the other load and would slow every prediction for a week.

        Raises:
            BusyMeasurementError: a busy probe without ``record_anyway``.
            CalibrationError: the file cannot be written.
        """
        if rates.busy and not record_anyway:
            raise BusyMeasurementError(
                f"the machine was busy during the CPU probe ({rates.other_cores or 0:.1f} cores of other load): "
                "its figures measured the other load and were not kept; the speed uses assumed CPU rates until a "
                "probe on a quiet machine ('kvtuner probe', or --record-anyway to keep a busy one)"
            )
        old = self.cpu_rates(rates.n_threads, rates.kv_type, machine)
        new = old.merged(rates) if old is not None else rates
        m = self._machine(machine or machine_id())
        m.setdefault("cpu_probe", {})[_probe_key(rates.n_threads, rates.kv_type)] = new.to_dict()
        self._save()
        return new

    def host_bandwidth_bytes_s(self, machine: str | None = None, *, measure: bool = True) -> float | None:
        """This machine's host bandwidth: the stored probe if younger than
        :data:`HOST_BANDWIDTH_MAX_AGE_S`, else a fresh probe (stored; None if ``measure`` is False)."""
        from .speed_model import measure_host_bandwidth

        m = self._machine(machine or machine_id())
        probe = m.get("host_bandwidth")
        if isinstance(probe, dict) and time.time() - float(probe.get("t_unix", 0)) < HOST_BANDWIDTH_MAX_AGE_S:
            return float(probe["bytes_s"])
        if not measure:
            return None
        bw = measure_host_bandwidth()
        m["host_bandwidth"] = {"bytes_s": bw, "t_unix": time.time()}
        try:
            self._save()
        except CalibrationError:
            pass  # a read-only data dir must not stop a prediction
        return bw


def _probe_key(n_threads: int, kv_type: str) -> str:
    return f"{int(n_threads)}/{kv_type}"


def record_bench(
    plan: MemoryPlan,
    measurement: Measurement,
    *,
    gpus: Sequence[GpuSpec] = (),
    host: HostSpec | None = None,
    store: CalibrationStore | None = None,
    machine: str | None = None,
    probe_threads: int | None = None,
) -> MeasuredRun:
    """Record one measured bench of ``plan`` in ``store`` (default: the user's), so later
    predictions for this machine and model family are calibrated.

    ``gpus`` are the GPUs planned for; ``machine`` is this machine's id
    (:func:`kvtuner.core.hardware.identity.machine_id`, default: from the non-what-if ``gpus``); ``host`` gets the stored host bandwidth probe (re-measured weekly) like the plan's
    prediction, and the stored CPU probe only where it covers the model
    (:meth:`CalibrationStore.model_cpu_rates`), so the recorded device rates are the ones later
    predictions use. ``probe_threads``: the thread count of the stored probe those
    predictions read (:meth:`kvtuner.core.session.Session.probe_threads`; default: the run's),
    its rates moved to the run's threads: a run at other threads than the window predicts for
    then corrects the same base. Speeds that are missing or not positive count as not measured.

    Raises:
        CalibrationError: nothing measured, or the store cannot be written.
    """
    from .speed_model import speed_inputs

    store = store or CalibrationStore()
    mid = machine or machine_id(gpus)
    if host is not None and not host.mem_bandwidth_bytes_s:
        bw = store.host_bandwidth_bytes_s(mid)
        if bw:
            host = replace(host, mem_bandwidth_bytes_s=bw)

    def positive(v: float | None) -> float | None:
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None

    n_threads = max(1, int(measurement.n_threads))
    cpu = store.model_cpu_rates(plan.model, max(1, int(probe_threads or n_threads)), mid)
    try:
        inputs = speed_inputs(list(gpus) if plan.gpus else [], host, n_threads=n_threads, cpu=cpu)
    except SpeedModelError as exc:
        raise CalibrationError(str(exc)) from None
    measured = replace(
        measurement,
        n_threads=n_threads,
        prefill_tok_s=positive(measurement.prefill_tok_s),
        decode_tok_s=positive(measurement.decode_tok_s),
    )
    run = measured_run(plan, inputs, measured, machine=mid)
    store.add(run)
    return run


def calibrated_inputs(
    inputs: SpeedInputs, model: ModelProfile, store: CalibrationStore | None = None, machine: str | None = None
) -> SpeedInputs:
    """``inputs`` with the constants and band of this machine's calibration for ``model``'s family."""
    store = store or CalibrationStore()
    cal = store.calibration(model_family(model), machine, inputs.constants)
    return replace(
        inputs,
        constants=cal.constants,
        sigma_log=cal.decode_sigma_log,
        prefill_sigma_log=cal.prefill_sigma_log,
        n_calibration_runs=cal.n_runs,
        calibrated_regimes=cal.regimes,
    )


__all__ = [
    "BusyMeasurementError",
    "Calibration",
    "CalibrationError",
    "CalibrationStore",
    "MeasuredRun",
    "calibrated_inputs",
    "data_dir",
    "fit_calibration",
    "machine_id",
    "measured_run",
    "model_family",
    "record_bench",
]
