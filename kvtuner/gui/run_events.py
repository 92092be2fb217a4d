"""What the window does with a run: the runner's events go to the graphs, the progress bar and
the status bar; the running model's latest state feeds the live advice (and auto-stop). The
same events feed a :class:`~kvtuner.core.monitor.measurement.RunRecorder` (as ``kvtuner bench``
does): a completed run's :class:`~kvtuner.core.speed.measurement.Measurement` says what it may
calibrate and enter, and is recorded for speed calibration through the window's
:class:`~kvtuner.core.session.Session` and saved in the working-configs library accordingly,
both on a worker thread.

:class:`RunEvents` keeps one run's state; the window (:class:`kvtuner.gui.main_window.MainWindow`)
creates one, calls :meth:`RunEvents.begin` when a run starts, hands it every ``(t_s, event)``
that :meth:`kvtuner.gui.run_controller.RunController.drain` returns and calls
:meth:`RunEvents.update_live` on its timer.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.advice.advisor import AdvisorSettings, should_auto_stop
from ..core.monitor.contention import quiet_limit
from ..core.monitor.live import SWAP_WINDOW_S, LiveState, LiveTracker, free_bytes_on
from ..core.monitor.measurement import RunRecorder
from ..core.monitor.rolling import RollingRate
from ..core.plan.config import PlanConfig
from ..core.session import Session
from ..core.speed.measurement import Measurement
from ..core.store.library import record_completed_run
from ..runner import protocol as P
from ..runner.bench import measured_figures, record_event
from ..runner.llama_log import allocation_request
from .run_controller import RunFinished, RunStarted

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hardware.identity import MachineFingerprint
    from ..core.model.profile import ModelProfile
    from .run_controller import RunController
    from .tasks import BackgroundTasks
    from .widgets.advisor_pane import AdvisorPane
    from .widgets.live_graphs import LiveGraphs
    from .widgets.run_controls import RunControls
    from .widgets.status_bar import StatusBar

log = logging.getLogger("kvtuner.gui")


class RunWindow(Protocol):
    """What :class:`RunEvents` needs from the window it serves
    (:class:`kvtuner.gui.main_window.MainWindow`)."""

    model: ModelProfile | None
    model_path: Path | None
    session: Session
    machine: MachineFingerprint
    tasks: BackgroundTasks
    runner: RunController
    sampler: Any
    graphs: LiveGraphs
    status: StatusBar
    run_controls: RunControls
    advisor: AdvisorPane
    #: the latest GPU sample per GPU index
    gpu_last: dict[int, Any]

    @property
    def config(self) -> PlanConfig: ...

    @property
    def remember_working_configs(self) -> bool: ...

    def show_error(self, text: str) -> None: ...

    def stop_run(self) -> None: ...

    def replan(self) -> None: ...

    def refresh_advice(self, running: bool | None = None) -> None: ...

    def refresh_known_good(self) -> None: ...


class RunEvents:
    """One run's state and what the window does with its events.

    Attributes:
        measured: figures measured by the last run (load_s, prefill/decode tok/s, peak RSS).
        last_load_progress: the weights' load progress of the current run, 0..1.
        live: the live tracker (token rate, flash attention, KV types, allocation failures).
        live_state: the latest :class:`~kvtuner.core.monitor.live.LiveState`, or None.
        auto_stopped: the run was stopped by itself (decode under 1 tok/s for 10 s).
        run_config, run_model_path: what the current (or last) run runs.
        measurement: the last finished run's measurement (with ``keep``: what it may calibrate
            and enter), or None.
        calibration_note: what recording the last run for calibration said.
        last_run: the last completed run: (model path, configuration, measured figures).
        library_note, saved_run_id: what saving it in the working-configs library said.
    """

    def __init__(self, window: RunWindow) -> None:
        self.window = window
        self.measured: dict[str, float] = {}
        self.last_load_progress = 0.0
        self.live = LiveTracker()
        #: the decode rate the live graph draws (rolling over the last tokens, not per token)
        self.decode_rate = RollingRate()
        self.live_state: LiveState | None = None
        self.auto_stopped = False
        self.run_config: PlanConfig | None = None
        self.run_model_path: Path | None = None
        #: the current run's recorder (:class:`~kvtuner.core.monitor.measurement.RunRecorder`) and
        #: the last finished run's measurement, with what it may calibrate and enter
        self.recorder: RunRecorder | None = None
        self.measurement: Measurement | None = None
        self.calibration_note = ""
        self.last_run: tuple[Path, PlanConfig, dict] | None = None
        self.library_note = ""
        self.saved_run_id: int | None = None
        self.last_live_t = -math.inf
        self._marks: set[str] = set()
        #: cores other processes may keep busy during a run that still counts (calibration and
        #: Known good): the rule every measurement follows (core.monitor.contention.quiet_limit)
        self.quiet_max_other_cores = quiet_limit()

    def begin(self, model_path: Path, config: PlanConfig) -> None:
        """A run of ``config`` on ``model_path`` starts: forget the last run's live state and
        start recording this one (the bench of the run controller's settings, on its engine)."""
        self._marks = set()
        self.last_load_progress = 0.0
        self.live.reset()
        self.decode_rate.reset()
        self.live_state = None
        self.auto_stopped = False
        self.run_config, self.run_model_path = config, model_path
        if self.calibration_note.startswith("the machine was busy"):
            self.window.advisor.set_notes([])  # the last run's busy note
        self.calibration_note = ""
        runner = self.window.runner
        s, engine = runner.settings, runner.engine
        self.measurement = None
        self.recorder = RunRecorder(
            n_prompt=s.n_prompt,
            n_gen=s.n_gen,
            model_path=str(model_path),
            config=config,
            engine=engine.kind if engine is not None else "embedded",
            limit=self.quiet_max_other_cores,
        ).start()

    @property
    def other_cores(self) -> float | None:
        """Cores other processes kept busy during the last finished run (None: not measured)."""
        return self.measurement.other_cores if self.measurement is not None else None

    def reset_measured(self) -> None:
        """A new model is open: the measured figures were another model's."""
        self.measured = {}

    def live_applies(self) -> bool:
        """Whether the live state describes the configuration shown (the run's own)."""
        w = self.window
        return self.live_state is not None and self.run_config == w.config and self.run_model_path == w.model_path

    # -- events --------------------------------------------------------------------------------------

    def _mark_once(self, t_s: float, name: str) -> None:
        if name not in self._marks:
            self._marks.add(name)
            self.window.graphs.mark_phase(t_s, name)

    def handle(self, t_s: float, ev: Any) -> None:
        """Show one runner event (``t_s``: ``time.monotonic()`` when it arrived)."""
        w = self.window
        if self.recorder is not None:
            record_event(self.recorder, ev)
        if isinstance(ev, RunStarted):
            w.status.set_field("runner", f"runner: pid {ev.pid}")
        elif isinstance(ev, P.ContextEvent):
            self.live.set_flash_attn(ev.flash_attn)
        elif isinstance(ev, P.LoadProgressEvent):
            self._mark_once(t_s, "weights")
            self.last_load_progress = max(self.last_load_progress, ev.progress)
            w.run_controls.set_progress(ev.progress, f"loading weights {ev.progress:.0%}")
        elif isinstance(ev, (P.BufferEvent, P.KvCacheEvent)):
            kind = "kv" if isinstance(ev, P.KvCacheEvent) else ev.buffer.kind
            if isinstance(ev, P.KvCacheEvent):
                self.live.kv_cache(ev.cache.type_k, ev.cache.type_v)
            if kind == "kv":
                self._mark_once(t_s, "KV")
            elif kind == "compute":
                self._mark_once(t_s, "compute")
        elif isinstance(ev, P.LoadedEvent):
            w.run_controls.set_progress(1.0, f"loaded in {ev.load_s:.1f} s")
            self.measured["load_s"] = ev.load_s
        elif isinstance(ev, P.PrefillProgressEvent):
            self._mark_once(t_s, f"prefill {ev.rep}" if ev.rep > 0 else "prefill")
            w.run_controls.set_progress(ev.n_done / max(ev.n_total, 1), f"prefill {ev.n_done}/{ev.n_total}")
        elif isinstance(ev, P.PrefillResultEvent):
            w.graphs.add_prefill(t_s, ev.tok_s)
            w.status.show_speed(ev.tok_s, None)
            self.measured["prefill_tok_s"] = ev.tok_s
        elif isinstance(ev, P.TokenEvent):
            if ev.index == 0:
                self._mark_once(t_s, f"decode {ev.rep}" if ev.rep > 0 else "decode")
                self.decode_rate.reset()
            rate = self.decode_rate.add(ev.t_s, ev.dt_s)  # the graph draws the rolling rate
            if rate is not None:
                w.graphs.add_decode(t_s, rate)
            self.live.token(t_s, ev.dt_s)
            n_gen = w.runner.settings.n_gen
            w.run_controls.set_progress((ev.index + 1) / n_gen, f"decode {ev.index + 1}/{n_gen}")
        elif isinstance(ev, P.RepResultEvent):
            self.live.end_decode()
            self.decode_rate.reset()
            w.graphs.break_decode(t_s)  # the next repetition's decode is a line of its own
            if ev.decode_s > 0:
                rate = ev.n_gen / ev.decode_s
                w.status.show_speed(None, rate)
                self.measured["decode_tok_s"] = rate
        elif isinstance(ev, P.BenchResultEvent):
            self.measured["peak_rss_bytes"] = ev.peak_rss_bytes
        elif isinstance(ev, P.ErrorEvent):
            if ev.kind == "out_of_memory":
                self._on_allocation_error(ev)
            if ev.kind != "cancelled":
                w.show_error(f"Run failed ({ev.kind}): {ev.message}")
        elif isinstance(ev, RunFinished):
            w.graphs.end_run(t_s)
            w.run_controls.set_running(False)
            text = "done" if ev.ok else ("stopped" if ev.stopped else "failed")
            if ev.ok:
                w.run_controls.set_progress(1.0, "bench done")
            else:
                w.run_controls.set_progress(0.0, text)
            w.status.set_field("runner", f"runner: {text}")
            self.live.end_decode()
            self.update_live(t_s, running=False)
            if self.recorder is None:
                return
            m = self.measurement = self.recorder.finish(completed=ev.ok)
            self.recorder = None
            if not ev.ok:
                return
            if m.keep.calibrate:
                self.record_run(m)
            self.remember_working_config(ev.result, save=m.keep.library)
            if m.busy and not m.keep.library:  # it measured the other load, not this configuration
                self.calibration_note = self.library_note = (
                    f"the machine was busy during this run ({m.other_cores:.1f} cores of other load): "
                    "not used for calibration or Known good; run again when it is quiet"
                )
                w.status.showMessage(f"busy machine ({m.other_cores:.1f} cores of other load): run not kept", 15000)
                w.advisor.set_notes([self.calibration_note])

    def _on_allocation_error(self, ev: P.ErrorEvent) -> None:
        req = allocation_request([ev.message, *ev.log_tail])
        if req is None:
            return
        device, requested = req
        w = self.window
        host = w.sampler.host_samples(time.monotonic() - 2.0)
        free = free_bytes_on(device, host[-1] if host else None, w.gpu_last)
        self.live.allocation_failed(device, requested, free)

    # -- live advice ---------------------------------------------------------------------------------

    def update_live(self, now: float | None = None, *, running: bool | None = None) -> LiveState:
        """Build the live state from the samplers' latest samples and the run's events, show the
        advice it gives, and stop the run when decode has stayed under 1 tok/s for 10 s and the
        user enabled auto-stop. Cheap (no blocking calls). ``running``: whether a run is in
        progress (default: ask the run controller). Returns the state."""
        w = self.window
        now = time.monotonic() if now is None else now
        self.last_live_t = time.monotonic()
        running = w.runner.running if running is None else running
        host = w.sampler.host_samples(now - SWAP_WINDOW_S - 1.0) if running else []
        procs = w.sampler.gpu_processes() if running and hasattr(w.sampler, "gpu_processes") else ()
        own = (w.runner.pid,) if w.runner.pid else ()
        self.live_state = self.live.state(now, host, running=running, gpu_processes=procs, own_pids=own)
        w.refresh_advice(running)
        if (
            running
            and not self.auto_stopped
            and self.live_applies()
            and w.advisor.auto_stop.isChecked()
            and should_auto_stop(self.live_state, AdvisorSettings(auto_stop_below_abandon=True))
        ):
            self.auto_stopped = True
            rate = self.live_state.decode_tok_s or 0.0
            w.stop_run()
            w.status.showMessage(
                f"stopped by itself: decode stayed at {rate:.2f} tok/s, under 1 tok/s, "
                f"for {self.live_state.below_abandon_s:.0f} s",
                15000,
            )
        return self.live_state

    # -- calibration -----------------------------------------------------------------------------------

    def record_run(self, measurement: Measurement) -> None:
        """Record the finished bench's ``measurement`` for speed calibration through the session
        (on a worker thread: file I/O), under this machine's identity, then re-predict with it."""
        w = self.window
        model, config = w.model, self.run_config
        if model is None or config is None or self.run_model_path != w.model_path:
            return
        session = w.session
        # the run's own devices: this machine's GPUs when llama.cpp offloaded, else the CPU alone
        # (never a what-if card the window happens to plan for); same machine, same store
        run_session = Session(
            model=model,
            config=config,
            gpus=session.machine_gpus if measurement.gpu_offload else (),
            host=session.host,
            detected_gpus=session.machine_gpus,
            calibration=session.calibration_store(),
            measure_host_bandwidth=False,
        )

        def work() -> str:
            return run_session.record_run(run_session.plan(), measurement)

        def done(note: str) -> None:
            self.calibration_note = note
            w.status.showMessage(note, 8000)
            session.invalidate_speed()
            if w.model is model:
                w.replan()

        def failed(exc: BaseException) -> None:
            self.calibration_note = f"run not recorded for calibration: {exc}"
            w.status.showMessage(self.calibration_note, 8000)

        w.tasks.submit(work, done, failed)

    # -- working-configs library -------------------------------------------------------------------

    def remember_working_config(self, bench_result: Any, *, save: bool = True) -> None:
        """Keep the completed run's figures (for the profile export) and save it in the library
        unless the user opted out or ``save`` is False (on a worker thread, which opens its own
        connection)."""
        w = self.window
        model, config, path = w.model, self.run_config, self.run_model_path
        if bench_result is None or config is None or path is None:
            return
        try:
            figures = measured_figures(bench_result)
        except (ValueError, TypeError, KeyError) as exc:  # a summary the library cannot take
            self.library_note = f"run not saved: {exc}"
            return
        self.measured.update(figures)
        self.last_run = (path, config, dict(figures))
        if model is None or path != w.model_path or not save:
            return
        enabled, machine = w.remember_working_configs, w.machine

        def done(run_id: int | None) -> None:
            self.saved_run_id = run_id
            if run_id is not None:
                self.library_note = f"saved as a working configuration (id {run_id})"
                w.status.showMessage(self.library_note, 8000)
                w.refresh_known_good()
            else:
                self.library_note = "not saved: remembering working configurations is off"

        def failed(exc: BaseException) -> None:
            self.library_note = f"run not saved in the library: {exc}"
            w.status.showMessage(self.library_note, 8000)

        w.tasks.submit(
            lambda: record_completed_run(model, config, figures, model_path=path, machine=machine, enabled=enabled),
            done,
            failed,
        )
