"""The Qt-free session that the command line and the desktop app share.

A :class:`Session` holds what a user is looking at -- a model, a configuration, the hardware
planned for and this machine's stores (speed calibration, remembered exact compute buffers) --
and answers one question, :meth:`Session.assess`: the memory plan, llama.cpp's verified
figures when a dry run has been made, the predicted speed and the advice, as one
:class:`Assessment`. ``kvtuner plan`` prints an Assessment; the app draws one on every slider
move. Measured runs go back in through :meth:`Session.record_run`, keyed by this machine's one
identity (:func:`kvtuner.core.hardware.identity.machine_id`), so the calibration a run feeds
is the one the next prediction reads, on a GPU machine as on a CPU-only one.

Nothing here touches Qt or llama.cpp; the dry run itself is the runner's
(:func:`kvtuner.runner.dryrun.dry_run`), whose result is handed to :meth:`Session.set_verified`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .advice.advisor import SEVERITIES, Advice, AdvisorSettings, advise
from .advice.backends import advise_backends
from .hardware.host import detect_host, physical_cores
from .hardware.identity import machine_id
from .hardware.specs import GpuSpec, HostSpec
from .llama_report import METHOD_EMBEDDED, DryRunResult, mib_to_bytes
from .model.probed_structure import report_structure
from .model.profile import ModelProfile
from .model.structure import ModelStructure, differences
from .monitor.live import LiveState
from .plan.buffers import bytes_by_device
from .plan.build_rules import VENDORED, BuildRules
from .plan.config import PlanConfig
from .plan.memory_plan import ExactFigures, MemoryPlan, plan_memory
from .plan.placement import DeviceSplit
from .plan.verdict import FitMargins, FitVerdict, badge, fit_verdict
from .speed.calibration import (
    BusyMeasurementError,
    CalibrationError,
    CalibrationStore,
    calibrated_inputs,
    record_bench,
)
from .speed.cpu_probe import CpuRates, probe_expert_needs, probe_needs
from .speed.measurement import Measurement
from .speed.speed_model import SpeedInputs, SpeedModelError, SpeedPrediction, predict_speed, speed_inputs
from .store import compute_cache, structure_cache
from .tune import TuneGoal, TuneResult, tune
from .tune.confirm import CONFIRM_TOLERANCE, MAX_REAL_LOADS, Measure, RealLoad
from .units import MiB

log = logging.getLogger("kvtuner.session")

#: Version of the ``kvtuner plan --json`` document (docs/reference/plan-json.md; keys are only added).
SCHEMA_VERSION = 1


def exact_figures(v: DryRunResult, *, device_figures: bool) -> ExactFigures:
    """A dry run's report as :class:`~kvtuner.core.plan.memory_plan.ExactFigures` (bytes from
    the printed MiB). KV and recurrent sizes do not depend on the backend; compute and output
    per device are taken only when ``device_figures`` (the dry run ran on the planned devices)."""
    kv = tuple((c.cells, c.layers, mib_to_bytes(c.k_mib), mib_to_bytes(c.v_mib)) for c in v.kv_caches if c.layers > 0)
    rec = v.recurrent
    recurrent = None
    if rec:
        recurrent = (
            rec[0].cells,
            sum(mib_to_bytes(r.r_mib) for r in rec),
            sum(mib_to_bytes(r.s_mib + r.p_mib) for r in rec),
        )
    return ExactFigures(
        kv=kv,
        recurrent=recurrent,
        compute=bytes_by_device(v.compute_mib) if device_figures and v.compute_mib else None,
        output=bytes_by_device(v.output_mib) if device_figures and v.output_mib else None,
    )


#: kvtuner's analytic figure and llama.cpp's differ when they are further apart than this share
#: of llama.cpp's figure or :data:`DIFFER_SLACK_MIB`, whichever is larger (the compute-buffer
#: tolerance of tests/test_plan_vs_llama.py; it also covers the breakdown's truncated MiB).
DIFFER_SHARE = 0.02
DIFFER_SLACK_MIB = 8.0


def differs(analytic_mib: float | None, llama_mib: float | None) -> bool | None:
    """Whether kvtuner's analytic figure and llama.cpp's printed one (MiB) differ by more than
    :data:`DIFFER_SHARE` or :data:`DIFFER_SLACK_MIB`, whichever is larger; None when one is missing."""
    if analytic_mib is None or llama_mib is None:
        return None
    return abs(analytic_mib - llama_mib) > max(DIFFER_SHARE * abs(llama_mib), DIFFER_SLACK_MIB)


def device_comparison(v: DryRunResult, analytic: MemoryPlan | None) -> list[dict[str, Any]]:
    """llama.cpp's figures per device beside kvtuner's analytic ones (MiB), one entry per device
    of either side, in the analytic plan's device order then llama.cpp's.

    llama.cpp's side: the memory breakdown rows the engine printed (``breakdown``: model,
    context = KV and recurrent state, compute; integer MiB as printed, rows of one device
    summed: the ``Host`` row and host buffer types such as ``CPU_REPACK`` are the host ``CPU``),
    else the dry run's compute buffers (model and context are not measured there). kvtuner's
    side: weights, KV and compute of ``analytic``, the plan made without llama.cpp's figures (the
    weights without the host's ``CPU_REPACK`` copy: llama.cpp's probe loads without mmap, and then
    the repacked tensors are in the ``CPU_REPACK`` row instead of ``Host``, the same bytes once).
    ``differs`` per column: :func:`differs`.
    """
    from .plan.buffers import buffer_device

    rows = v.breakdown
    theirs: dict[str, dict[str, Any]] = {}
    if rows:
        for r in rows:
            dev = "CPU" if r.kind == "host" else buffer_device(r.name)
            t: dict[str, Any] = theirs.setdefault(dev, {"model_mib": 0, "context_mib": 0, "compute_mib": 0, "rows": []})
            t["model_mib"] += r.model_mib
            t["context_mib"] += r.context_mib
            t["compute_mib"] += r.compute_mib
            t["rows"].append(r.name)
    else:
        for dev, nbytes in bytes_by_device(v.compute_mib).items():
            theirs[dev] = {
                "model_mib": None,
                "context_mib": None,
                "compute_mib": round(nbytes / MiB, 2),
                "rows": [k for k in v.compute_mib if buffer_device(k) == dev],
            }
    ours: dict[str, dict[str, float]] = {}
    if analytic is not None:
        for d in analytic.devices:
            ours[d.device] = {
                "weights_mib": round(d.weights_bytes / MiB, 2),
                "kv_mib": round(d.kv_bytes / MiB, 2),
                "compute_mib": round(analytic.compute.estimate_on(d.device) / MiB, 2),
            }
    out = []
    for dev in [*ours, *(k for k in theirs if k not in ours)]:
        theirs_dev, o = theirs.get(dev), ours.get(dev)
        out.append(
            {
                "device": dev,
                "llama_cpp": theirs_dev,
                "kvtuner": o,
                "differs": {
                    "model": differs(o["weights_mib"] if o else None, theirs_dev["model_mib"] if theirs_dev else None),
                    "context": differs(o["kv_mib"] if o else None, theirs_dev["context_mib"] if theirs_dev else None),
                    "compute": differs(
                        o["compute_mib"] if o else None, theirs_dev["compute_mib"] if theirs_dev else None
                    ),
                },
            }
        )
    return out


@dataclass(frozen=True)
class Assessment:
    """Everything kvtuner says about one configuration on one machine.

    Attributes:
        plan: the memory plan; its compute buffers are llama.cpp's exact figures (mapped to
            devices, ``CUDA_Host`` counted on the host) once a dry run verified them.
        verified: the dry run's report for exactly this configuration and hardware, or None.
        speed: the predicted speed (None when the speed model cannot predict; see ``speed_error``).
        advice: the advisor's findings, errors first.
        speed_error: why there is no speed prediction ("" when there is one).
        analytic: with ``verified``, the plan as kvtuner computes it without llama.cpp's
            figures (shown beside them, :func:`device_comparison`); None otherwise.
        margins: the margins of the fit verdict (:attr:`verdict`).
    """

    plan: MemoryPlan
    verified: DryRunResult | None = None
    speed: SpeedPrediction | None = None
    advice: tuple[Advice, ...] = ()
    speed_error: str = ""
    analytic: MemoryPlan | None = None
    margins: FitMargins = field(default_factory=FitMargins)

    @property
    def verdict(self) -> FitVerdict:
        """The one fit verdict of the plan (:func:`kvtuner.core.plan.verdict.fit_verdict`): the
        badge, the advisor, the tuner, the CLI and the export all say this."""
        return fit_verdict(self.plan, self.margins)

    @property
    def fits(self) -> bool:
        """The verdict is "fits": every device keeps its margin."""
        return self.verdict.fits

    @property
    def badge(self) -> str | None:
        """The one badge: "does not fit" or "tight" from the verdict, else the speed band of the
        worse of the empty-cache and full-context decode (None without a prediction)."""
        from .speed.speed_model import speed_band

        band = None
        if self.speed is not None:
            band = speed_band(min(self.speed.decode_tok_s, self.speed.decode_tok_s_at_full_ctx))
        return badge(self.verdict, band)

    def to_dict(self) -> dict[str, Any]:
        """The ``kvtuner plan --json`` document (schema: docs/reference/plan-json.md).

        Keys: ``schema``, ``model``, ``config``, ``effective``, ``kv_bytes``,
        ``kv_bytes_per_token``, ``weights_bytes``, ``kv_caches``, ``kv_layers``,
        ``compute_source``, ``devices``, ``warnings``, ``advice`` (list of ``{id, severity,
        message, reason, fix, fix_label}``), ``speed`` (null, or
        :meth:`~kvtuner.core.speed.speed_model.SpeedPrediction.to_dict`) and ``verified`` (null,
        or the dry run's figures in bytes, converted from llama.cpp's MiB with 2 decimals:
        ``compute_bytes`` by llama.cpp buffer name, ``compute_bytes_by_device`` summed per device;
        ``method``, ``engine``, ``engine_build``: how and by which build it was measured;
        ``breakdown``: llama.cpp's memory breakdown rows as printed, integer MiB; ``devices``:
        :func:`device_comparison`, llama.cpp's figures beside kvtuner's analytic ones; the keys
        are documented in docs/reference/verify.md).
        """
        d: dict[str, Any] = {"schema": SCHEMA_VERSION, **self.plan.to_dict()}
        d["fit"] = self.verdict.to_dict()
        d["badge"] = self.badge
        d["advice"] = [a.to_dict() for a in self.advice]
        d["speed"] = self.speed.to_dict() if self.speed is not None else None
        d["verified"] = self.verified_dict()
        return d

    def verified_dict(self) -> dict[str, Any] | None:
        """The ``"verified"`` entry of :meth:`to_dict`: None without a dry run, else its figures
        in bytes (converted from llama.cpp's MiB with 2 decimals), the breakdown rows as printed
        and :func:`device_comparison`."""
        v = self.verified
        if v is None:
            return None
        out: dict[str, Any] = {
            "source": "llama.cpp dry-run (no_alloc)",
            "kv_caches": [
                {
                    "cells": c.cells,
                    "layers": c.layers,
                    "kv_mib": c.size_mib,
                    "k_mib": c.k_mib,
                    "v_mib": c.v_mib,
                    "kv_bytes": mib_to_bytes(c.size_mib),
                }
                for c in v.kv_caches
            ],
            "kv_bytes": v.kv_bytes,
            "recurrent": [
                {"cells": r.cells, "r_mib": r.r_mib, "s_mib": r.s_mib, "bytes": mib_to_bytes(r.state_mib)}
                for r in v.recurrent
            ],
            "compute_bytes": {k: mib_to_bytes(x) for k, x in v.compute_mib.items()},
            "compute_bytes_by_device": bytes_by_device(v.compute_mib),
            "output_bytes": {k: mib_to_bytes(x) for k, x in v.output_mib.items()},
            "method": v.method or METHOD_EMBEDDED,
            "engine": v.engine,
            "engine_build": v.engine_build,
            "breakdown": [r.to_json() for r in v.breakdown],
            "devices": device_comparison(v, self.analytic),
        }
        if v.method.startswith(("llama-server", "llama-fit-params")):
            out["source"] = f"{v.method} ({v.engine or 'llama-server'}, no_alloc)"
        return out


@dataclass
class Session:
    """A model, a configuration, the hardware planned for, and this machine's stores.

    Attributes:
        model: the model profile (None: nothing open yet; :meth:`assess` then raises).
        config: the configuration.
        gpus: the GPUs planned for: detected ones, what-if cards, or none (CPU only).
        host: the host planned for (None: capacity unknown).
        detected_gpus: the GPUs this machine really has (they name it: :attr:`machine_id`);
            None: the GPUs in ``gpus`` that are not what-if cards.
        calibration: the speed calibration store (None: the user's, opened on first use).
        measure_host_bandwidth: run the ~0.25 s host bandwidth probe when no figure is stored
            (False on the GUI thread: the app measures it on a worker and calls
            :meth:`set_host_bandwidth`).
        use_compute_cache: use exact compute buffers remembered from earlier dry runs.
        use_structure_cache: use model structures remembered from earlier structure probes.
        n_threads: CPU threads the speed is predicted for (None: llama.cpp's default, the
            physical cores).
        prefill_tokens: prompt length of the predicted prefill (tokens).
        split: ``-sm`` / ``-ts`` / ``-mg`` over the devices of ``gpus`` (RPC devices included;
            :class:`~kvtuner.core.plan.placement.DeviceSplit`).
        margins: what a plan must leave free to "fit" (:class:`~kvtuner.core.plan.verdict.FitMargins`:
            llama.cpp's ``--fit-target`` 1024 MiB of VRAM per GPU, 20 % of the available RAM); the
            verdict, the advisor and :meth:`tune` all use them.
        rules: the llama.cpp build and program the plan follows (:mod:`kvtuner.core.plan.build_rules`;
            :func:`~kvtuner.core.plan.build_rules.rules_for` of the engine in use; default: the
            embedded engine's vendored build).
        extras: what llama-server loads besides the model (projector, draft model, LoRA:
            :class:`~kvtuner.core.plan.extras.ExtrasConfig`), counted in every plan; None: none.
        draft_exact: llama-server's figures for the draft (``ExactFigures``), None: kvtuner's.
    """

    model: ModelProfile | None = None
    config: PlanConfig = field(default_factory=PlanConfig)
    gpus: tuple[GpuSpec, ...] = ()
    host: HostSpec | None = None
    detected_gpus: tuple[GpuSpec, ...] | None = None
    calibration: CalibrationStore | None = None
    measure_host_bandwidth: bool = True
    use_compute_cache: bool = True
    use_structure_cache: bool = True
    n_threads: int | None = None
    prefill_tokens: int = 512
    split: DeviceSplit = field(default_factory=DeviceSplit)
    margins: FitMargins = field(default_factory=FitMargins)
    rules: BuildRules = VENDORED
    extras: Any = None
    draft_exact: Any = None
    _verified: tuple[PlanConfig, tuple, DryRunResult] | None = field(default=None, repr=False)
    _structures: dict[str, ModelStructure | None] = field(default_factory=dict, repr=False)
    _inputs: tuple[tuple, SpeedInputs | None, str] | None = field(default=None, repr=False)
    _machine: tuple[tuple, str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.gpus = tuple(self.gpus)

    # -- identity and stores ---------------------------------------------------------------

    @property
    def machine_gpus(self) -> tuple[GpuSpec, ...]:
        """The GPUs this machine really has (what-if cards are not this machine)."""
        if self.detected_gpus is not None:
            return tuple(self.detected_gpus)
        return tuple(g for g in self.gpus if not g.what_if)

    @property
    def machine_id(self) -> str:
        """This machine's one identity (:func:`kvtuner.core.hardware.identity.machine_id`);
        calibration runs are recorded and read under it."""
        key = tuple((g.name, g.total_bytes) for g in self.machine_gpus)
        if self._machine is None or self._machine[0] != key:
            self._machine = (key, machine_id(self.machine_gpus))
        return self._machine[1]

    def calibration_store(self) -> CalibrationStore:
        """The calibration store (opened on first use)."""
        if self.calibration is None:
            self.calibration = CalibrationStore()
        return self.calibration

    def _hardware_key(self) -> tuple:
        """What a dry run's figures depend on: the model file and the devices' capacities (not the
        host's measured bandwidth or available RAM, which change without changing the buffers)."""
        model = self.model.header_sha256 if self.model is not None else None
        gpus = tuple((g.device, g.name, g.total_bytes, g.what_if) for g in self.gpus)
        return (model, gpus, self.host.total_bytes if self.host is not None else None, self.split)

    # -- verified figures --------------------------------------------------------------------

    def set_verified(self, result: DryRunResult | None, config: PlanConfig | None = None) -> None:
        """Record a dry run's report for ``config`` (default: the current one) on the current
        hardware; :meth:`assess` uses it while both stay the same. The exact compute buffers
        are remembered for that configuration (:mod:`kvtuner.core.store.compute_cache`)."""
        if result is None:
            self._verified = None
            return
        cfg = config or self.config
        self._verified = (cfg, self._hardware_key(), result)
        if self.model is not None:
            self.set_structure(report_structure(result, self.model.structure))
        if self.use_compute_cache and self.model is not None and self._verified_applies(result):
            plan = plan_memory(self.planned_model(), cfg, self.gpus, self.host, split=self.split, rules=self.rules)
            compute_cache.store(compute_cache.compute_key(plan), bytes_by_device(result.compute_mib))

    # -- model structure (analytic, or probed from llama.cpp) ------------------------------------

    def set_structure(self, probed: ModelStructure | None) -> None:
        """Use a structure the installed llama.cpp reported for the current model (a structure
        probe or any dry run), and remember it (:mod:`kvtuner.core.store.structure_cache`) when
        kvtuner's own rules are not tested for this architecture or disagree with it."""
        m = self.model
        if m is None or probed is None or probed.n_layer_all != m.n_layer:
            return
        if m.structure.source == "analytic" and not differences(m.structure, probed):
            self._structures[m.header_sha256] = None  # the tested rule is llama.cpp's: nothing to remember
            return
        if m.structure.source == "analytic":
            log.warning(
                "%s: llama.cpp's structure differs from kvtuner's rule (%s); using llama.cpp's",
                m.architecture,
                "; ".join(differences(m.structure, probed)[:3]),
            )
        self._structures[m.header_sha256] = probed
        if self.use_structure_cache:
            structure_cache.store(m.header_sha256, probed)

    def planned_model(self) -> ModelProfile:
        """The model as planned: with the structure probed from llama.cpp when one is known for
        it (this session's dry runs, or the structure cache), else as read from the header.

        Raises:
            ValueError: no model is open.
        """
        m = self.model
        if m is None:
            raise ValueError("no model is open")
        key = m.header_sha256
        if key not in self._structures:
            cached = None
            if self.use_structure_cache and m.structure.source != "analytic":
                cached = structure_cache.lookup(key)
                if cached is not None and cached.n_layer_all != m.n_layer:
                    cached = None
            self._structures[key] = cached
        probed = self._structures[key]
        return m.with_structure(probed) if probed is not None else m

    @property
    def needs_structure_probe(self) -> bool:
        """True when the plan is approximate: no tested rule and no probe of llama.cpp for this
        model (a dry run, e.g. ``plan --verify``, or :func:`kvtuner.runner.dryrun.probe_structure`, fixes it)."""
        return self.model is not None and self.planned_model().structure.is_approximate

    @property
    def verified(self) -> DryRunResult | None:
        """The dry-run report for the current configuration and hardware, or None."""
        v = self._verified
        if v is not None and v[0] == self.config and v[1] == self._hardware_key():
            return v[2]
        return None

    def _verified_applies(self, v: DryRunResult) -> bool:
        """A CPU-only llama.cpp cannot verify a GPU plan's buffers: its figures are shown side by
        side then, never put in the plan."""
        return not (tuple(v.devices) == ("CPU",) and self.gpus)

    # -- speed inputs --------------------------------------------------------------------------

    def set_host_bandwidth(self, bytes_s: float | None) -> None:
        """Use a measured host bandwidth (bytes/s) for speed predictions."""
        if bytes_s and self.host is not None:
            self.host = replace(self.host, mem_bandwidth_bytes_s=float(bytes_s))
            self._inputs = None

    def threads(self) -> int:
        """CPU threads the speed is predicted for (:attr:`n_threads`, else a what-if host's cores,
        else this machine's physical cores)."""
        if self.n_threads:
            return int(self.n_threads)
        if self.host is not None and self.host.what_if and self.host.n_cores:
            return int(self.host.n_cores)
        return physical_cores()

    def probe_threads(self) -> int:
        """Threads this machine's CPU probe runs at: :meth:`threads`, at most this machine's
        physical cores when a what-if host is planned for (its rates are then moved to the
        host's cores by the speed model)."""
        if self.host is not None and self.host.what_if:
            return max(1, min(self.threads(), physical_cores()))
        return self.threads()

    def missing_probe(
        self, kv_pairs: Sequence[tuple[str, str]] = ()
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """Weight types (over 1 % of the model's bytes), attention shapes and MoE expert shapes
        of the model that this machine's stored CPU probe lacks at :meth:`threads` threads (all
        of them when there is no probe): what :func:`kvtuner.runner.probe.run_cpu_probe` should
        measure before a prediction. The attention shapes are wanted with f16 K/V, the
        configuration's K/V pair and each ``(type_k, type_v)`` of ``kv_pairs`` (a tune's
        candidates: the CPU attention cost depends on the pair,
        :func:`~kvtuner.core.speed.cpu_probe.attn_key`); the expert shapes are
        :func:`~kvtuner.core.speed.cpu_probe.probe_expert_needs`. ``((), (), ())`` when nothing is
        missing."""
        if self.model is None:
            return (), (), ()
        pairs = sorted({("f16", "f16"), (self.config.type_k, self.config.type_v), *kv_pairs})
        types, dims = probe_needs(self.model, pairs)
        experts = probe_expert_needs(self.model)
        have = self.calibration_store().cpu_rates(self.probe_threads(), "f16", self.machine_id)
        if have is None:
            return types, dims, experts
        missing_t = tuple(t for t in types if t not in have.decode_bytes_s)
        missing_d = tuple(d for d in dims if d not in have.attn_decode_s)
        missing_e = tuple(e for e in experts if e not in have.expert_decode_bytes_s)
        if not missing_t and not missing_d and not missing_e:
            return (), (), ()
        return missing_t, missing_d or dims[:1], missing_e

    def set_cpu_rates(self, rates: CpuRates, *, record_anyway: bool = False) -> None:
        """Store a CPU probe for this machine and use it from now on.

        Raises:
            BusyMeasurementError: a probe measured on a busy machine, without ``record_anyway``
                (:meth:`~kvtuner.core.speed.calibration.CalibrationStore.set_cpu_rates`).
            CalibrationError: the store cannot be written.
        """
        self.calibration_store().set_cpu_rates(rates, self.machine_id, record_anyway=record_anyway)
        self._inputs = None

    def speed_inputs(self) -> tuple[SpeedInputs | None, str]:
        """The speed model's inputs for this hardware, calibrated for this model family on this
        machine (not when a what-if card is planned for: runs only feed the hardware they ran on), with this machine's CPU probe when one is stored; ``(None, reason)`` when the
        speed model cannot be set up. The probe's attention costs are keyed by K/V pair
        (cpu_probe.attn_key), so one set of inputs serves every KV type. Cached until the hardware
        or the model family changes (:meth:`invalidate_speed`)."""
        family = (self.model.architecture, self.model.file_type) if self.model is not None else None
        key = (
            self._hardware_key(),
            family,
            self.machine_id,
            self.threads(),
            self.host.speed_key() if self.host is not None else None,
        )
        if self._inputs is not None and self._inputs[0] == key:
            return self._inputs[1], self._inputs[2]
        try:
            store = self.calibration_store()
            host = self.host
            if host is not None and not host.mem_bandwidth_bytes_s and not host.what_if:
                bw = store.host_bandwidth_bytes_s(self.machine_id, measure=self.measure_host_bandwidth)
                if bw:
                    host = replace(host, mem_bandwidth_bytes_s=bw)
            cpu = store.model_cpu_rates(self.model, self.probe_threads(), self.machine_id)
            inputs = speed_inputs(
                list(self.gpus), host, measure=self.measure_host_bandwidth, n_threads=self.threads(), cpu=cpu
            )
            what_if_host = self.host is not None and self.host.what_if
            if self.model is not None and not any(g.what_if for g in self.gpus) and not what_if_host:
                # this machine's runs calibrate this machine only: a what-if card keeps the
                # uncalibrated prior (a CPU run says nothing about a card's rates)
                inputs = calibrated_inputs(inputs, self.model, store, self.machine_id)
            result: tuple[SpeedInputs | None, str] = (inputs, "")
        except (SpeedModelError, CalibrationError, OSError, ValueError) as exc:
            result = (None, str(exc))
        self._inputs = (key, *result)
        return result

    def invalidate_speed(self) -> None:
        """Forget the cached speed inputs (after a run was recorded, say)."""
        self._inputs = None

    # -- the question --------------------------------------------------------------------------

    def plan(self) -> MemoryPlan:
        """The memory plan alone (exact compute buffers when known).

        Raises:
            ConfigError: the configuration cannot work with this model (one line).
            ValueError: no model is open.
        """
        if self.model is None:
            raise ValueError("no model is open")
        return self._with_extras(self._plan_model())

    def _with_extras(self, plan: MemoryPlan) -> MemoryPlan:
        """``plan`` with :attr:`extras` (projector, draft, LoRA: an
        :class:`~kvtuner.core.plan.extras.ExtrasConfig`) counted on its devices; the draft's
        figures are :attr:`draft_exact` (llama-server's) when set.

        Raises:
            ConfigError: an extra file llama-server would refuse (one line).
        """
        if self.extras is None or self.extras.empty:
            return plan
        from .plan.extras import plan_extras, with_extras

        return with_extras(
            plan, plan_extras(plan, self.extras, self.gpus, self.host, split=self.split, draft_exact=self.draft_exact)
        )

    def _plan_model(self) -> MemoryPlan:
        model = self.planned_model()
        plan = plan_memory(model, self.config, self.gpus, self.host, split=self.split, rules=self.rules)
        v = self.verified
        if v is not None:
            # llama.cpp's own figures for exactly this configuration: every cache, the recurrent
            # state, and (when it ran on these devices) compute and output buffers
            ef = exact_figures(v, device_figures=self._verified_applies(v))
            if ef.compute is None and self.use_compute_cache:
                ef = replace(ef, compute=compute_cache.exact_for(plan))
            return plan_memory(model, self.config, self.gpus, self.host, exact=ef, split=self.split, rules=self.rules)
        exact: Mapping[str, int] | None = compute_cache.exact_for(plan) if self.use_compute_cache else None
        if exact:
            plan = plan_memory(
                model,
                self.config,
                self.gpus,
                self.host,
                compute_override=dict(exact),
                split=self.split,
                rules=self.rules,
            )
        return plan

    def assess(self, *, live: LiveState | None = None) -> Assessment:
        """Plan, verified figures, speed and advice for the current configuration.

        ``live``: the running model's latest state (the app's live advice).

        Raises:
            ConfigError: the configuration cannot work with this model (one line that says
                what to change).
            ValueError: no model is open.
        """
        plan = self.plan()
        inputs, why = self.speed_inputs()
        speed = None
        if inputs is not None:
            try:
                speed = predict_speed(plan, inputs, prefill_tokens=self.prefill_tokens)
            except SpeedModelError as exc:
                why = str(exc)
        settings = AdvisorSettings(
            vram_margin_bytes=self.margins.vram_margin_bytes, ram_headroom_fraction=self.margins.ram_headroom_fraction
        )
        advice = tuple(
            sorted(
                [*advise(plan, speed, live=live, settings=settings), *advise_backends(plan, self.gpus)],
                key=lambda a: SEVERITIES.index(a.severity),
            )
        )
        verified = self.verified
        analytic = None
        if verified is not None:
            analytic = self._with_extras(
                plan_memory(self.planned_model(), self.config, self.gpus, self.host, split=self.split, rules=self.rules)
            )
        return Assessment(
            plan=plan,
            verified=verified,
            speed=speed,
            advice=advice,
            speed_error=why,
            analytic=analytic,
            margins=self.margins,
        )

    # -- measured runs -------------------------------------------------------------------------

    def record_run(self, plan: MemoryPlan, measurement: Measurement, *, gpus: Sequence[GpuSpec] | None = None) -> str:
        """Record a measured bench of ``plan`` for speed calibration on this machine (file I/O:
        call it off the GUI thread); returns a one-line note for the user.

        ``gpus``: the devices the run really used (default: :attr:`machine_gpus`, never a what-if
        card: a run on this machine says nothing about a card it does not have); the host is this
        machine's too (:func:`~kvtuner.core.hardware.host.detect_host` where a what-if host is
        planned for), and the CPU probe the one this session's predictions read
        (:meth:`probe_threads`).

        Raises:
            BusyMeasurementError: the measurement may not calibrate because the machine was busy
                (:attr:`Measurement.keep <kvtuner.core.speed.measurement.Measurement.keep>`).
            CalibrationError: it may not calibrate for another reason, nothing was measured, or
                the store cannot be written.
        """
        if not measurement.keep.calibrate:
            error = BusyMeasurementError if measurement.busy else CalibrationError
            raise error(measurement.keep.reason or "this measurement may not calibrate")
        store = self.calibration_store()
        used = tuple(self.machine_gpus if gpus is None else gpus)
        # the run ran here: priced with this machine's host, never a what-if host planned for
        host = detect_host() if self.host is not None and self.host.what_if else self.host
        run = record_bench(
            plan,
            measurement,
            gpus=used,
            host=host,
            store=store,
            machine=self.machine_id,
            probe_threads=self.probe_threads(),
        )
        self.invalidate_speed()
        n = sum(1 for r in store.runs(run.machine) if r.family == run.family)
        return f"recorded for speed calibration ({run.family}: {n} run{'s' if n != 1 else ''} on this machine)"

    # -- tuning --------------------------------------------------------------------------------

    def tune(self, goal: TuneGoal, *, exhaustive: bool = False) -> TuneResult:
        """The fastest configuration that fits ``goal`` on this session's hardware
        (:func:`kvtuner.core.tune.tune`), from the current configuration (its ``n_seq``, batch
        and mmap settings stay; its KV types and flash attention are what llama.cpp's ``--fit``
        would keep), with this session's :attr:`margins` (what "fits" means is the same as in
        :meth:`assess`).

        Raises:
            ValueError: no model is open, or the speed model cannot be set up (the reason).
            TuneError: a goal this model cannot have.
        """
        inputs, why = self.speed_inputs()
        if inputs is None:
            raise ValueError(f"no speed prediction, so nothing to rank by: {why}")
        goal = replace(
            goal,
            vram_margin_bytes=self.margins.vram_margin_bytes,
            ram_headroom_fraction=self.margins.ram_headroom_fraction,
        )
        return tune(
            self.planned_model(),
            self.config,
            self.gpus,
            self.host,
            inputs,
            goal,
            exhaustive=exhaustive,
            rules=self.rules,
        )

    @property
    def fit_needs_port(self) -> bool:
        """True when llama.cpp's own llama-fit-params cannot answer for the planned hardware (a
        what-if card: llama.cpp sees only the devices this machine has)."""
        return any(g.what_if for g in self.gpus)

    def confirm_tune(
        self,
        goal: TuneGoal,
        measure: Measure,
        runs: int,
        on_load: Callable[[RealLoad], None] | None = None,
        *,
        tolerance: float = CONFIRM_TOLERANCE,
    ) -> tuple[TuneResult, list[RealLoad]]:
        """Tune, then confirm with up to ``runs`` (<= 3) real loads: each measures the current
        best (``measure``, a bench in the runner child), is recorded for calibration
        (:meth:`record_run`) and the search runs again with the calibrated speed model. It stops
        when the best is a configuration whose last load confirmed the prediction made before it
        (decode within ``tolerance``, a fraction); a best that was measured but missed is loaded
        again, so the calibrated prediction it now carries is checked by a load it has not seen.

        Returns:
            ``(result, loads)``: the last result, its best carrying the last measured figures when
            it was loaded, and one :class:`RealLoad` per load (prediction made before the load).

        Raises:
            ValueError: ``runs`` outside 0..3, or what :meth:`tune` raises.
        """
        from .speed.speed_model import decode_tok_s as _decode
        from .speed.speed_model import prefill_tok_s as _prefill

        if not 0 <= runs <= MAX_REAL_LOADS:
            raise ValueError(f"--runs must be between 0 and {MAX_REAL_LOADS}, not {runs}")
        result = self.tune(goal)
        loads: list[RealLoad] = []
        done: dict[PlanConfig, RealLoad] = {}
        for _ in range(runs):
            best = result.best
            if best is None:
                break
            last = done.get(best.config)
            if last is not None and (last.decode_error is None or not abs(last.decode_error) > tolerance):
                break
            m = measure(best.config)
            inputs, _why = self.speed_inputs()
            plan = best.plan
            depth = min(plan.n_ctx_seq - 1, m.n_depth + m.n_prompt + m.n_gen // 2)
            pred_dec = _decode(plan, inputs, depth) if inputs is not None else float("nan")
            pred_pre = _prefill(plan, inputs, max(1, m.n_prompt), m.n_depth) if inputs is not None else float("nan")
            load = RealLoad(best.config, m, pred_dec, pred_pre)
            loads.append(load)
            done[best.config] = load
            if on_load is not None:
                on_load(load)
            if not m.keep.calibrate:  # measured on a busy machine: shown, never calibrates
                continue
            self.record_run(plan, m)
            result = self.tune(goal)
        if result.best is not None and result.best.config in done:
            m = done[result.best.config].measured
            result = replace(
                result,
                best=replace(result.best, measured_decode_tok_s=m.decode_tok_s, measured_prefill_tok_s=m.prefill_tok_s),
            )
        return result, loads
