"""The main window: model, hardware and controls on the left; prediction, live graphs and
advice on the right; run controls on top; live numbers in the status bar.

This module lays the window out and wires it; what it does lives beside it:
:mod:`.plan_presenter` (the configuration and each replan), :mod:`.model_opener` (models and
profiles), :mod:`.probes` (structure, CPU and host-bandwidth probes), :mod:`.verify`,
:mod:`.dialogs` (Export, Tune, Attach), :mod:`.working_configs` (the Known good list),
:mod:`.live_feed` (the pull timer), :mod:`.run_events` (a run's events), :mod:`.actions`
(menus and shortcuts) and :mod:`.window_settings` (what is remembered).

Every figure comes from one :class:`~kvtuner.core.session.Session` (the one the command line
uses too): each replan is :meth:`Session.assess`, a dry run goes in through
:meth:`Session.set_verified`, a finished run through :meth:`Session.record_run`. Everything
slow happens elsewhere: model headers, dry runs, the probes and the stores on
:class:`BackgroundTasks`, the bench in :class:`RunController`'s worker thread, sampling on the
samplers' thread.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from ..core.export import MachineFingerprint
from ..core.hardware.host import detect_host
from ..core.hardware.nvml import nvml_status
from ..core.hardware.specs import GpuSpec, HostSpec
from ..core.hardware.vendors import detect_all_gpus
from ..core.model.profile import ModelProfile
from ..core.plan.config import PlanConfig
from ..core.session import Assessment, Session
from . import actions, dialogs, model_opener, probes, window_settings
from .attach import AttachedServer
from .live_feed import LiveFeed
from .plan_presenter import PlanPresenter
from .run_controller import BenchSettings, RunController
from .run_events import RunEvents
from .settings import AppSettings, open_settings
from .tasks import BackgroundTasks
from .verify import start_verify
from .widgets.advisor_pane import AdvisorPane
from .widgets.controls import ConfigControls
from .widgets.device_list import DeviceListPanel
from .widgets.error_banner import ErrorBanner
from .widgets.extras_panel import ExtrasPanel
from .widgets.graphs_and_advice import GraphsAndAdvice, graphs_box
from .widgets.hardware_panel import HardwarePanel
from .widgets.known_good import KnownGoodPanel
from .widgets.live_graphs import LiveGraphs
from .widgets.model_card import ModelCard
from .widgets.prediction_panel import PredictionPanel
from .widgets.run_controls import RunControls
from .widgets.status_bar import StatusBar
from .widgets.workload_panel import WorkloadPanel
from .working_configs import WorkingConfigs

#: The left column's width (model, hardware, configuration), pixels: fits a 1280-pixel screen.
LEFT_MIN_WIDTH = 430


def _detect_hardware() -> tuple[list[GpuSpec], HostSpec, str]:
    """Detected GPUs (NVML, then AMD/Intel through sysfs), host and why no GPU was found ("" when
    some were)."""
    gpus = detect_all_gpus()
    note = "" if gpus else nvml_status().message.replace("no NVIDIA GPU found: ", "")
    return gpus, detect_host(), note


def _forward(owner: str, name: str, doc: str) -> property:
    """A window attribute that is one of its parts' (``owner``: the attribute holding the part)."""
    return property(
        lambda self: getattr(getattr(self, owner), name),
        lambda self, value: setattr(getattr(self, owner), name, value),
        doc=doc,
    )


class MainWindow(QtWidgets.QMainWindow):
    """kvtuner's window.

    Args:
        config: the configuration given on the command line (``kvtuner gui -c 8192``): used
            for this session, not remembered for the next one unless it is changed in the
            window. None: the remembered configuration, or the defaults.
        settings: where settings persist (default: ``kvtuner.ini`` in the configuration
            directory, :func:`kvtuner.gui.settings.open_settings`; tests pass their own).
        hardware: (gpus, host, note) instead of detecting them (tests).
        bench: the bench the Run button starts.
        sampler: a started-or-not :class:`kvtuner.core.monitor.sampler.Sampler`, kept at its rate
            (default: the window's own, 10 Hz during a run and 1 Hz otherwise).
        plan_for: the command line's "Plan for" choice (``--gpu``): it wins over the saved one
            and is not saved.
        host: the RAM given on the command line (``--ram``): planned as is, not followed.
    """

    measured = _forward("run_events", "measured", "What the last run measured (load_s, tok/s, peak RSS).")
    last_load_progress = _forward("run_events", "last_load_progress", "The run's weight loading, 0..1.")
    live = _forward("run_events", "live", "The live tracker of the running model.")
    live_state = _forward("run_events", "live_state", "The latest LiveState of the running model, or None.")
    auto_stopped = _forward("run_events", "auto_stopped", "The run stopped by itself (under 1 tok/s for 10 s).")
    calibration_note = _forward("run_events", "calibration_note", "What recording the last run said.")
    last_run = _forward("run_events", "last_run", "The last completed run: (model path, configuration, figures).")
    library_note = _forward("run_events", "library_note", "What saving the last run in the library said.")
    saved_run_id = _forward("run_events", "saved_run_id", "The library id of the last saved run, or None.")
    config = _forward("planner", "config", "The configuration shown, planned, run and exported.")
    wanted_config = _forward("planner", "wanted", "The last valid configuration asked for.")
    sampling_fast = _forward("feed", "fast", "Whether the window samples and pulls at 10 Hz (a run), not 1 Hz.")

    def __init__(
        self,
        config: PlanConfig | None = None,
        *,
        settings: QtCore.QSettings | None = None,
        hardware: tuple[list, Any, str] | None = None,
        bench: BenchSettings | None = None,
        sampler: Any = None,
        plan_for: tuple[str, int | None] | None = None,
        host: Any = None,
    ) -> None:
        super().__init__()
        self.setWindowTitle("kvtuner")
        self.setAcceptDrops(True)
        self.settings = settings if settings is not None else open_settings()
        self.app_settings = AppSettings(self.settings)
        self.tasks = BackgroundTasks(self)
        gpus, detected_host, note = hardware or _detect_hardware()
        self.fixed_host = host is not None  # RAM from the command line: planned as is, not followed
        host = host if host is not None else detected_host
        own_sampler = sampler is None
        if sampler is None:
            from ..core.monitor.sampler import Sampler

            sampler = Sampler(interval_s=0.1, capacity=600, gpus=bool(gpus))
        self.sampler = sampler
        self.runner = RunController(bench, sampler=self.sampler)
        self.attached: AttachedServer | None = None  # the running server watched (Run > Attach)
        # what the window shows; its parts read and set these
        self.model: ModelProfile | None = None
        self.model_path: Path | None = None
        self.assessment: Assessment | None = None
        self.stale = ""  # why the configuration asked for was refused: the figures shown are stale
        self.last_error = ""
        self.replan_ms = 0.0
        self.extras_plan: Any = None
        self.profile_warnings: tuple[str, ...] = ()
        self.gpu_last: dict[int, Any] = {}  # the latest GPU sample per GPU index
        # the one session: the model, configuration and hardware shown, this machine's stores;
        # the host bandwidth probe runs on a worker (measure_host_bandwidth=False here)
        detected = tuple(g for g in gpus if not g.what_if)
        self.session = Session(host=host, detected_gpus=detected, measure_host_bandwidth=False)
        self.session.calibration_store()  # opened here, on the GUI thread, before workers share it
        self.machine = MachineFingerprint.current(gpus=list(detected))
        self.run_events = RunEvents(self)
        self.planner = PlanPresenter(self)
        self.working_configs = WorkingConfigs(self)
        self.cli_plan_for = plan_for

        self._build(gpus, host, note)
        window_settings.restore_settings(self, config)
        if plan_for is not None:
            self.hardware.set_choice(*plan_for)
            self.planner.apply_effective()
        if host is not None and host.what_if:
            self.hardware.set_what_if_host(host)
        self.feed = LiveFeed(self, own_sampler)
        self.feed.start()
        probes.measure_host_bandwidth(self)

    # -- layout and wiring -----------------------------------------------------------------------

    def _build(self, gpus: list, host: Any, note: str) -> None:
        self.model_card = ModelCard()
        self.hardware = HardwarePanel(gpus, host, note)
        self.devices = DeviceListPanel()  # extra cards, RPC hosts, -sm/-ts/-mg
        self.devices.set_base(self.hardware.gpus())
        self.controls = ConfigControls()
        self.workload = WorkloadPanel()  # expected-case KV next to -np
        self.extras_panel = ExtrasPanel()  # --mmproj, -md, --lora
        self.prediction = PredictionPanel()
        self.graphs = LiveGraphs()
        self.advisor = AdvisorPane()
        self.run_controls = RunControls()
        self.known_good = KnownGoodPanel()
        self.status = StatusBar()
        self.setStatusBar(self.status)
        # the llama.cpp build the window works with: found on a worker, switched and saved here
        from .widgets.cpu_probe_indicator import CpuProbeIndicator
        from .widgets.engine_selector import EngineSelector

        self.engine_selector = EngineSelector(self.tasks.submit, self.app_settings)
        self.status.addPermanentWidget(self.engine_selector)
        self.engine_selector.engine_changed.connect(self.planner.on_engine_changed)
        self.engine_selector.refresh()
        self.cpu_probe = CpuProbeIndicator()
        self.cpu_probe.finished.connect(self.on_cpu_probe_finished)
        self.status.addPermanentWidget(self.cpu_probe)

        self.banner_row = ErrorBanner()
        self.banner, self.dismiss_button = self.banner_row.label, self.banner_row.dismiss_button

        left = QtWidgets.QWidget()
        ll = QtWidgets.QVBoxLayout(left)
        ll.setContentsMargins(4, 4, 4, 4)
        for panel in (self.model_card, self.hardware, self.devices, self.controls, self.workload, self.extras_panel):
            ll.addWidget(panel)
        ll.addWidget(self.known_good, 1)
        left_scroll = QtWidgets.QScrollArea()
        left_scroll.setWidgetResizable(True)
        left_scroll.setWidget(left)
        left_scroll.setMinimumWidth(max(LEFT_MIN_WIDTH, left.minimumSizeHint().width() + 12))
        left_scroll.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        left_scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)

        self.graphs_box, self.whole_session = graphs_box(self.graphs)
        # the prediction keeps its natural height (its wrapped lines are never cut); the graphs
        # and the advice share the rest
        self.right_split = GraphsAndAdvice(self.graphs_box, self.advisor)

        right = QtWidgets.QWidget()
        rl = QtWidgets.QVBoxLayout(right)
        rl.setContentsMargins(4, 4, 4, 4)
        for part in (self.run_controls, self.banner_row, self.prediction):
            rl.addWidget(part)
        rl.addWidget(self.right_split, 1)

        self.main_split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        self.main_split.addWidget(left_scroll)
        self.main_split.addWidget(right)
        self.main_split.setStretchFactor(1, 1)
        self.main_split.setSizes([LEFT_MIN_WIDTH, 1440 - LEFT_MIN_WIDTH])
        self.setCentralWidget(self.main_split)

        actions.build_actions(self)
        self._shortcuts = actions.install_shortcuts(self)
        p = self.planner
        self.controls.changed.connect(p.on_controls_changed)
        self.extras_panel.changed.connect(self.replan)
        self.controls.fix_requested.connect(p.on_fix_requested)
        self.hardware.changed.connect(p.on_hardware_changed)
        self.devices.changed.connect(p.on_hardware_changed)
        self.advisor.apply_fix.connect(self.apply_fix)
        self.advisor.stop_requested.connect(self.stop_run)
        self.advisor.auto_stop_changed.connect(self.app_settings.set_auto_stop)
        self.known_good.restore_requested.connect(self.restore_working_config)
        self.known_good.delete_requested.connect(self.working_configs.delete)
        self.known_good.remember_changed.connect(self.app_settings.set_remember_working_configs)
        self.run_controls.run_clicked.connect(self.start_run)
        self.run_controls.stop_clicked.connect(self.stop_run)
        self.run_controls.verify_clicked.connect(self.verify)
        self.run_controls.bench.set_settings(self.runner.settings)
        self.run_controls.bench.changed.connect(self._on_bench_changed)
        self.set_model_open(False)
        self.resize(1440, 920)

    def showEvent(self, event: QtGui.QShowEvent) -> None:  # noqa: N802 (Qt API)
        super().showEvent(event)
        self.right_split.first_show()

    def dragEnterEvent(self, event: QtGui.QDragEnterEvent) -> None:  # noqa: N802 (Qt API)
        if model_opener.dropped_path(event.mimeData().urls()) is not None:
            event.acceptProposedAction()

    def dropEvent(self, event: QtGui.QDropEvent) -> None:  # noqa: N802 (Qt API)
        path = model_opener.dropped_path(event.mimeData().urls())
        if path is not None:
            self.open_path(path)
            event.acceptProposedAction()

    def show_error(self, text: str) -> None:
        """Show (or with "" hide) the error banner; plain text only."""
        self.last_error = text
        self.banner_row.show_text(text)

    # -- the window's face: what its parts, the app and the tests call ---------------------------

    open_path = model_opener.open_path
    open_model = model_opener.open_model
    open_profile = model_opener.open_profile
    choose_and_open = model_opener.choose_and_open
    on_cpu_probe_finished = probes.on_cpu_probe_finished
    verify = start_verify
    open_export = dialogs.open_export
    export_measured = dialogs.export_measured
    open_tune = dialogs.open_tune
    open_attach = dialogs.open_attach
    attach_to = dialogs.attach_to
    detach = dialogs.detach
    follow_attached_pid = dialogs.follow_attached_pid
    set_model_open = actions.set_model_open
    update_recent_menu = actions.update_recent_menu
    save_settings = window_settings.save_settings
    replan = _forward("planner", "replan", "Plan, predict and advise for what is shown, and show it.")
    set_config = _forward("planner", "set_config", "Make a configuration the one asked for and replan.")
    apply_fix = _forward("planner", "apply_fix", "Apply an advice's fix (PlanConfig changes) and replan.")
    reset_to_defaults = _forward("planner", "reset_to_defaults", "llama.cpp's defaults into the controls, replanned.")
    refresh_advice = _forward("planner", "refresh_advice", "Advise again with the running model's latest state.")
    refresh_known_good = _forward("working_configs", "refresh", "Reload the Known good list (worker thread).")
    restore_working_config = _forward("working_configs", "restore", "A saved working configuration into the controls.")
    pull = _forward("feed", "pull", "Pull new samples and runner events into the views (the pull timer's tick).")
    update_live = _forward("run_events", "update_live", "The live state, its advice and auto-stop; returns the state.")

    @property
    def plan(self) -> Any:
        """The :class:`~kvtuner.core.plan.memory_plan.MemoryPlan` shown, or None."""
        return self.assessment.plan if self.assessment is not None else None

    @property
    def speed(self) -> Any:
        """The :class:`~kvtuner.core.speed.speed_model.SpeedPrediction` shown, or None."""
        return self.assessment.speed if self.assessment is not None else None

    @property
    def advice(self) -> list | None:
        """The advice shown (None before the first plan)."""
        return list(self.assessment.advice) if self.assessment is not None else None

    @property
    def engine(self) -> Any:
        """The llama.cpp engine in use (:class:`kvtuner.runner.engines.Engine`; the window's selector)."""
        return self.engine_selector.engine

    @property
    def remember_working_configs(self) -> bool:
        """The "Remember working configurations" setting (the environment may still opt out)."""
        return self.known_good.remember.isChecked()

    def recent_models(self) -> list[str]:
        """Recently opened model paths, newest first."""
        return self.app_settings.recent_models()

    def last_model(self) -> Path | None:
        """The model opened last time (None if never)."""
        return self.app_settings.last_model()

    def add_decode_tokens(self, series: Any) -> None:
        """Feed measured decode tokens into the live state: ``(t_s, dt_s)`` pairs, oldest first
        (``time.monotonic()`` when each token finished, and how long it took)."""
        self.run_events.live.tokens(series)

    # -- run ---------------------------------------------------------------------------------------

    def start_run(self) -> bool:
        """Start a bench with the current configuration (False if none can start)."""
        if self.model_path is None or self.runner.running:
            return False
        if self.attached is not None:
            self.status.showMessage("watching a running server: Run > Detach first", 8000)
            return False
        self.show_error("")
        if self.stale:
            return False
        self.runner.engine = self.engine  # Run uses the engine in use: the embedded child or llama-server
        self.run_events.begin(self.model_path, self.config)
        self.graphs.begin_run(time.monotonic())
        self.feed.run_started()
        self.runner.start(self.model_path, self.config)
        self.run_controls.set_running(True)
        self.run_controls.set_progress(None, "starting llama.cpp ...")
        self.status.set_field("runner", "runner: starting")
        return True

    def _on_bench_changed(self, settings: BenchSettings) -> None:
        """The Run controls' bench (prompt/generated tokens, repetitions, threads): the next Run uses it."""
        self.runner.settings = settings

    def stop_run(self) -> None:
        """Stop the running bench and end its child process."""
        if self.runner.running:
            self.runner.stop()
            self.run_controls.set_progress(None, "stopping ...")
            self.status.set_field("runner", "runner: stopping")

    # -- shutdown ----------------------------------------------------------------------------------

    def closeEvent(self, event: QtGui.QCloseEvent) -> None:  # noqa: N802 (Qt API)
        self.save_settings()
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the run, the sampler and the timers (the window can then be dropped)."""
        self.feed.timer.stop()
        if self.attached is not None:
            self.detach(quiet=True, wait_s=3.0)
        if self.runner.running:
            self.runner.stop()
            self.runner.wait(timeout_s)
        self.sampler.stop()
        self.tasks.shutdown()
