"""The main window: model, hardware and controls on the left; prediction, live graphs and
advice on the right; run controls on top; live numbers in the status bar.

Every figure comes from one :class:`~kvtuner.core.session.Session` (the one the command line
uses too): each replan is :meth:`Session.assess`, a dry run goes in through
:meth:`Session.set_verified`, a finished run through :meth:`Session.record_run` (see
:mod:`.run_events`). Settings live in :mod:`.settings`.

Everything slow happens elsewhere: model headers, dry runs, the host bandwidth probe and the
stores on :class:`BackgroundTasks`, the bench in :class:`RunController`'s worker thread,
sampling on the samplers' thread. One QTimer (100 ms) pulls samples and runner events into the
views.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from ..core.export import MachineFingerprint, ModelIdentity, load_profile
from ..core.hardware.host import detect_host
from ..core.hardware.nvml import detect_gpus, nvml_status
from ..core.hardware.specs import GpuSpec, HostSpec
from ..core.model.default_model import default_model_path
from ..core.model.profile import ModelProfile
from ..core.plan.config import ConfigError, PlanConfig
from ..core.session import Assessment, Session
from ..core.speed.speed_model import speed_band
from ..core.store.library import ConfigLibrary, autosave_enabled
from ..runner.dryrun import dry_run, probe_structure
from .about import install_help_menu
from .run_controller import BenchSettings, RunController
from .run_events import RunEvents
from .settings import AppSettings, open_settings
from .tasks import BackgroundTasks
from .widgets.advisor_pane import AdvisorPane
from .widgets.controls import ConfigControls
from .widgets.export_dialog import ExportDialog
from .widgets.hardware_panel import HardwarePanel
from .widgets.device_list import DeviceListPanel
from .widgets.known_good import KnownGoodPanel
from .widgets.live_graphs import LiveGraphs
from .widgets.model_card import ModelCard
from .widgets.prediction_panel import PredictionPanel
from .widgets.workload_panel import WorkloadPanel
from .widgets.run_controls import RunControls
from .widgets.status_bar import StatusBar

log = logging.getLogger("kvtuner.gui")

#: How often the window pulls samples and runner events, milliseconds.
PULL_INTERVAL_MS = 100
#: How often live advice is re-evaluated during a run, seconds (the pane rebuilds only on change).
LIVE_ADVICE_INTERVAL_S = 0.5


def _detect_hardware() -> tuple[list[GpuSpec], HostSpec, str]:
    """Detected GPUs, host and why no GPU was found ("" when some were)."""
    gpus = detect_gpus()
    note = "" if gpus else nvml_status().message.replace("no NVIDIA GPU found: ", "")
    return gpus, detect_host(), note


def _run_state(name: str, doc: str) -> property:
    """A window attribute that is the run-event handler's (:class:`RunEvents`) state."""
    return property(lambda self: getattr(self.run_events, name),
                    lambda self, value: setattr(self.run_events, name, value), doc=doc)


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
        sampler: a started-or-not :class:`kvtuner.core.monitor.sampler.Sampler` (default: a 10 Hz one).
    """

    measured = _run_state("measured", "Figures the last run measured (load_s, prefill/decode tok/s, peak RSS).")
    last_load_progress = _run_state("last_load_progress", "The current run's weight loading progress, 0..1.")
    live = _run_state("live", "The live tracker of the running model.")
    live_state = _run_state("live_state", "The latest LiveState of the running model, or None.")
    auto_stopped = _run_state("auto_stopped", "The run was stopped by itself (under 1 tok/s for 10 s).")
    calibration_note = _run_state("calibration_note", "What recording the last run for calibration said.")
    last_run = _run_state("last_run", "The last completed run: (model path, configuration, measured figures).")
    library_note = _run_state("library_note", "What saving the last run in the library said.")
    saved_run_id = _run_state("saved_run_id", "The library id of the last saved run, or None.")

    def __init__(self, config: PlanConfig | None = None, *, settings: QtCore.QSettings | None = None,
                 hardware: tuple[list, Any, str] | None = None, bench: BenchSettings | None = None,
                 sampler: Any = None) -> None:
        super().__init__()
        self.setWindowTitle("kvtuner")
        self.setAcceptDrops(True)
        self.settings = settings if settings is not None else open_settings()
        self.app_settings = AppSettings(self.settings)
        self.tasks = BackgroundTasks(self)
        gpus, host, note = hardware or _detect_hardware()
        if sampler is None:
            from ..core.monitor.sampler import Sampler

            sampler = Sampler(interval_s=0.1, capacity=600, gpus=bool(gpus))
        self.sampler = sampler
        self.runner = RunController(bench, sampler=self.sampler)

        self.model: ModelProfile | None = None
        self.model_path: Path | None = None
        self.assessment: Assessment | None = None
        self.last_error = ""
        self.replan_ms = 0.0
        self.profile_warnings: tuple[str, ...] = ()
        self._last_host_t = -math.inf
        self._last_gpu_t: dict[int, float] = {}
        #: the latest GPU sample per GPU index (free memory when an allocation fails)
        self.gpu_last: dict[int, Any] = {}
        self._known_good_seq = 0
        # the one session: the model, configuration and hardware shown, this machine's stores;
        # the host bandwidth probe runs on a worker (measure_host_bandwidth=False here)
        detected = tuple(g for g in gpus if not g.what_if)
        self.session = Session(host=host, detected_gpus=detected, measure_host_bandwidth=False)
        self.session.calibration_store()  # opened here, on the GUI thread, before workers share it
        self.machine = MachineFingerprint.current(gpus=list(detected))
        self.run_events = RunEvents(self)

        self._build(gpus, host, note)
        self._restore_settings(config)
        self._pull_timer = QtCore.QTimer(self)
        self._pull_timer.setInterval(PULL_INTERVAL_MS)
        self._pull_timer.timeout.connect(self.pull)
        self._pull_timer.start()
        self.sampler.start()
        self._measure_host_bandwidth()

    # -- construction ----------------------------------------------------------------------------

    def _build(self, gpus: list, host: Any, note: str) -> None:
        self.model_card = ModelCard()
        self.hardware = HardwarePanel(gpus, host, note)
        self.devices = DeviceListPanel()  # issue 14: extra cards, RPC hosts, -sm/-ts/-mg
        self.devices.set_base(self.hardware.gpus())
        self.controls = ConfigControls()
        self.workload = WorkloadPanel()  # issue 16: expected-case KV next to -np
        self.prediction = PredictionPanel()
        self.graphs = LiveGraphs()
        self.advisor = AdvisorPane()
        self.run_controls = RunControls()
        self.known_good = KnownGoodPanel()
        self.status = StatusBar()
        self.setStatusBar(self.status)

        self.banner = QtWidgets.QLabel()
        self.banner.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet("background: #fdecea; color: #8a1c13; padding: 6px; border: 1px solid #e6a19a;")
        self.banner.hide()

        left = QtWidgets.QWidget()
        ll = QtWidgets.QVBoxLayout(left)
        ll.setContentsMargins(4, 4, 4, 4)
        ll.addWidget(self.model_card)
        ll.addWidget(self.hardware)
        ll.addWidget(self.devices)
        ll.addWidget(self.controls)
        ll.addWidget(self.workload)
        ll.addWidget(self.known_good, 1)
        left_scroll = QtWidgets.QScrollArea()
        left_scroll.setWidgetResizable(True)
        left_scroll.setWidget(left)
        left_scroll.setMinimumWidth(max(450, left.minimumSizeHint().width() + 12))
        left_scroll.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        left_scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)

        graphs_box = QtWidgets.QGroupBox("Live: memory and speed (dashed: predicted; dotted: run phases)")
        gl = QtWidgets.QVBoxLayout(graphs_box)
        gl.setContentsMargins(4, 4, 4, 4)
        gl.addWidget(self.graphs)

        self.right_split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Vertical)
        self.right_split.addWidget(self.prediction)
        self.right_split.addWidget(graphs_box)
        self.right_split.addWidget(self.advisor)
        self.right_split.setStretchFactor(0, 0)
        self.right_split.setStretchFactor(1, 1)
        self.right_split.setStretchFactor(2, 0)
        self.right_split.setChildrenCollapsible(False)

        right = QtWidgets.QWidget()
        rl = QtWidgets.QVBoxLayout(right)
        rl.setContentsMargins(4, 4, 4, 4)
        rl.addWidget(self.run_controls)
        rl.addWidget(self.banner)
        rl.addWidget(self.right_split, 1)

        self.main_split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        self.main_split.addWidget(left_scroll)
        self.main_split.addWidget(right)
        self.main_split.setStretchFactor(1, 1)
        self.main_split.setSizes([450, 990])
        self.setCentralWidget(self.main_split)

        self._build_actions()
        self.controls.changed.connect(self._on_controls_changed)
        self.hardware.changed.connect(self._on_hardware_changed)
        self.devices.changed.connect(self._on_hardware_changed)
        self.advisor.apply_fix.connect(self.apply_fix)
        self.advisor.stop_requested.connect(self.stop_run)
        self.advisor.auto_stop_changed.connect(self._on_auto_stop_changed)
        self.known_good.restore_requested.connect(self.restore_working_config)
        self.known_good.remember_changed.connect(self._on_remember_changed)
        self.run_controls.run_clicked.connect(self.start_run)
        self.run_controls.stop_clicked.connect(self.stop_run)
        self.run_controls.verify_clicked.connect(self.verify)
        self.resize(1440, 920)

    def _build_actions(self) -> None:
        menu = self.menuBar().addMenu("&File")
        self.open_action = QtGui.QAction("&Open model or profile...", self,
                                         shortcut=QtGui.QKeySequence.StandardKey.Open,
                                         triggered=self._on_open_triggered)
        self.open_action.setToolTip("Open a GGUF model, or a kvtuner profile (.json) with its model and configuration")
        self.default_action = QtGui.QAction("Open the &default model (Gemma 3 270M)", self,
                                            triggered=lambda: self.open_model(None))
        self.recent_menu = QtWidgets.QMenu("&Recent models", self)
        self.export_action = QtGui.QAction("&Export configuration...", self, shortcut="Ctrl+E",
                                           triggered=self.open_export)
        self.export_action.setToolTip("Export this configuration for llama-server, llama-cpp-python, Ollama, "
                                      "koboldcpp or as a kvtuner profile")
        quit_action = QtGui.QAction("&Quit", self, shortcut=QtGui.QKeySequence.StandardKey.Quit, triggered=self.close)
        for a in (self.open_action, self.default_action):
            menu.addAction(a)
        menu.addMenu(self.recent_menu)
        menu.addSeparator()
        menu.addAction(self.export_action)
        menu.addSeparator()
        menu.addAction(quit_action)
        run_menu = self.menuBar().addMenu("&Run")
        self.run_action = QtGui.QAction("&Run bench", self, shortcut="Ctrl+R", triggered=self.start_run)
        self.stop_action = QtGui.QAction("&Stop", self, shortcut="Esc", triggered=self.stop_run)
        self.verify_action = QtGui.QAction("&Verify with llama.cpp", self, shortcut="Ctrl+Shift+V", triggered=self.verify)
        for a in (self.run_action, self.stop_action, self.verify_action):
            run_menu.addAction(a)
        install_help_menu(self)  # Help > About, app icon (gui/about.py)
        tb = self.addToolBar("Main")
        tb.setObjectName("main-toolbar")
        tb.setMovable(False)
        tb.addAction(self.open_action)
        tb.addAction(self.export_action)
        self._update_recent_menu()

    # -- settings ----------------------------------------------------------------------------------

    def _restore_settings(self, config: PlanConfig | None) -> None:
        s = self.app_settings
        geometry = s.geometry()
        if geometry is not None:
            self.restoreGeometry(geometry)
        # a configuration from the command line is this session's; the remembered one stays
        # remembered until the configuration is changed in the window
        self._remember_config = config is None
        self._config = config or s.config() or PlanConfig()
        choice = s.hardware_choice()
        if choice is not None:
            self.hardware.set_choice(*choice)
        self.controls.set_config(self._config)
        self.advisor.auto_stop.setChecked(s.auto_stop())
        self.known_good.remember.setChecked(s.remember_working_configs())
        if not autosave_enabled():
            self.known_good.remember.setEnabled(False)
            self.known_good.remember.setToolTip("Saving is turned off: KVTUNER_LIBRARY=off in the environment.")

    def _on_auto_stop_changed(self, enabled: bool) -> None:
        self.app_settings.set_auto_stop(enabled)

    def _on_remember_changed(self, enabled: bool) -> None:
        self.app_settings.set_remember_working_configs(enabled)

    def save_settings(self) -> None:
        """Persist geometry, the configuration (unless it came from the command line and was
        not changed here), the hardware choice, the switches and the model."""
        s = self.app_settings
        s.set_geometry(self.saveGeometry())
        if self._remember_config:
            s.set_config(self._config)
        s.set_hardware_choice(self.hardware.current_choice(), self.hardware.custom_bytes())
        s.set_auto_stop(self.advisor.auto_stop.isChecked())
        s.set_remember_working_configs(self.known_good.remember.isChecked())
        if self.model_path is not None:
            s.set_last_model(self.model_path)
        s.sync()

    @property
    def remember_working_configs(self) -> bool:
        """The "Remember working configurations" setting (the environment may still opt out)."""
        return self.known_good.remember.isChecked()

    def recent_models(self) -> list[str]:
        """Recently opened model paths, newest first."""
        return self.app_settings.recent_models()

    def _update_recent_menu(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_models()
        for p in recent:
            act = self.recent_menu.addAction(Path(p).name)
            act.setToolTip(p)
            act.triggered.connect(lambda _=False, p=p: self.open_model(Path(p)))
        self.recent_menu.setEnabled(bool(recent))

    def last_model(self) -> Path | None:
        """The model opened last time (None if never)."""
        return self.app_settings.last_model()

    # -- model -------------------------------------------------------------------------------------

    def open_model(self, path: Path | None) -> None:
        """Read a model's header in the background (None: the embedded default model).
        Errors are shown in the window; the current model stays."""
        self.status.showMessage(f"reading {path.name if path else 'the default model'} ...")
        self.profile_warnings = ()
        self.advisor.set_notes([])

        def load() -> tuple[Path, ModelProfile]:
            p = Path(path).expanduser() if path is not None else default_model_path()
            return p, ModelProfile.from_gguf(p)

        self.tasks.submit(load, self._on_model_loaded, lambda exc, p=path: self._on_model_failed(p, exc))

    def _on_model_loaded(self, result: tuple[Path, ModelProfile]) -> None:
        path, model = result
        self.model, self.model_path = model, Path(path)
        self.session.model = model
        self.session.set_verified(None)  # a dry run of the last model says nothing about this one
        self.run_events.reset_measured()
        self.setWindowTitle(f"kvtuner - {self.model_path.name}")
        self.model_card.set_model(model)
        self.controls.set_model_layers(model.n_layer, model.n_ctx_train, model.n_expert)
        self.controls.set_config(self._config)
        self.show_error("")
        self.app_settings.add_recent_model(self.model_path)
        self._update_recent_menu()
        self.status.showMessage(f"opened {self.model_path.name}", 5000)
        self.replan()
        self.refresh_known_good()
        self._probe_structure_if_needed()

    def _probe_structure_if_needed(self) -> None:
        """A model whose layer structure kvtuner's rules do not cover (the plan says "approximate"):
        read it from the installed llama.cpp once, off the GUI thread (a no_alloc load in a child
        process, remembered by the session's structure store), then replan; as ``kvtuner plan``
        does (cli/plan.py ``probe``)."""
        if self.model_path is None or not self.session.needs_structure_probe:
            return
        model, path = self.model, self.model_path
        self.status.showMessage(f"reading {model.architecture}'s layer structure from llama.cpp (once per model) ...")

        def done(probed: Any) -> None:
            if model is not self.model:
                return
            self.session.set_structure(probed)
            self.status.showMessage(f"{model.architecture}'s layer structure read from llama.cpp", 5000)
            self.replan()

        def failed(exc: BaseException) -> None:
            log.warning("structure probe of %s failed: %s", path, exc)
            self.status.showMessage("llama.cpp could not be asked for the layer structure: the plan stays approximate",
                                    8000)

        self.tasks.submit(lambda: probe_structure(path, model.structure), done, failed)

    def _on_model_failed(self, path: Path | None, exc: BaseException) -> None:
        name = path.name if path else "the default model"
        self.show_error(f"Could not open {name}: {exc}")
        self.model_card.show_error(f"Could not open {name}: {exc}")
        self.status.showMessage("model not opened", 5000)

    def show_error(self, text: str) -> None:
        """Show (or with "" hide) the error banner; plain text only."""
        self.last_error = text
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    def _on_open_triggered(self) -> None:
        start = str(self.model_path.parent) if self.model_path else str(Path.home())
        path, _ = QtWidgets.QFileDialog.getOpenFileName(
            self, "Open a GGUF model or a kvtuner profile", start,
            "GGUF models and kvtuner profiles (*.gguf *.json);;GGUF models (*.gguf);;kvtuner profiles (*.json);;"
            "All files (*)")
        if path:
            self.open_path(Path(path))

    def open_path(self, path: Path | None) -> None:
        """Open a model, or a kvtuner profile when ``path`` ends in ``.json`` (None: the default model)."""
        if path is not None and Path(path).suffix.lower() == ".json":
            self.open_profile(Path(path))
        else:
            self.open_model(path)

    def open_profile(self, path: Path) -> None:
        """Open a kvtuner profile in the background: its configuration goes into the controls
        and its model is opened; warnings (another machine, a changed model file ...) go to the
        status bar and the advice pane. A malformed profile shows one line and changes nothing."""
        path = Path(path)
        self.status.showMessage(f"reading profile {path.name} ...")
        self.tasks.submit(lambda: load_profile(path), lambda r, p=path: self._on_profile_loaded(p, r),
                          lambda exc, p=path: self._on_profile_failed(p, exc))

    def _on_profile_loaded(self, path: Path, result: tuple[Path, PlanConfig, tuple[str, ...]]) -> None:
        model_path, config, warnings = result
        self._config = config
        self._remember_config = True
        self.controls.set_config(config)
        self.open_model(Path(model_path))
        self.profile_warnings = tuple(warnings)
        self.advisor.set_notes([f"Profile {path.name}: {w}" for w in warnings])
        if warnings:
            self.status.showMessage(f"profile {path.name}: {warnings[0]}" + (
                f" (+{len(warnings) - 1} more in the advice pane)" if len(warnings) > 1 else ""), 15000)
        else:
            self.status.showMessage(f"opened profile {path.name}", 5000)

    def _on_profile_failed(self, path: Path, exc: BaseException) -> None:
        text = " ".join(str(exc).split()) or type(exc).__name__
        self.show_error(f"Could not open profile {path.name}: {text}")
        self.status.showMessage("profile not opened", 5000)

    def dragEnterEvent(self, event: QtGui.QDragEnterEvent) -> None:  # noqa: N802 (Qt API)
        if any(u.toLocalFile().lower().endswith((".gguf", ".json")) for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QtGui.QDropEvent) -> None:  # noqa: N802 (Qt API)
        for u in event.mimeData().urls():
            if u.toLocalFile().lower().endswith((".gguf", ".json")):
                self.open_path(Path(u.toLocalFile()))
                event.acceptProposedAction()
                return

    # -- planning ----------------------------------------------------------------------------------

    @property
    def config(self) -> PlanConfig:
        """The configuration shown (the last valid one)."""
        return self._config

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

    def _on_controls_changed(self) -> None:
        try:
            config = self.controls.config()
        except ConfigError as exc:
            self.controls.show_error(str(exc))
            return
        self.controls.show_error(None)
        if self.controls.resolved_notes:  # llama-server defaults, shown resolved
            self.status.showMessage("; ".join(self.controls.resolved_notes), 8000)
        self.set_config(config)

    def _on_hardware_changed(self) -> None:
        self.replan()

    def set_config(self, config: PlanConfig) -> None:
        """Make ``config`` current (a change made in the window: remembered) and replan."""
        self._config = config
        self._remember_config = True
        self.controls.remember(config)
        self.replan()

    def apply_fix(self, fix: dict) -> None:
        """Apply an advice's fix (PlanConfig changes) and replan."""
        try:
            config = self._config.with_(**fix)
        except (ConfigError, TypeError) as exc:
            self.controls.show_error(f"cannot apply this fix: {exc}")
            return
        self.controls.set_config(config)
        self.controls.show_error(None)
        self.set_config(config)
        self.status.showMessage("applied: " + ", ".join(f"{k} = {v}" for k, v in fix.items()), 5000)

    def _sync_session(self) -> Session:
        """The session, told the model, configuration and hardware shown."""
        s = self.session
        s.model = self.model
        s.config = self._config
        self.devices.set_base(self.hardware.gpus())
        s.gpus = tuple(self.devices.devices())
        try:
            s.split = self.devices.split()
        except ConfigError:
            pass  # the panel shows why; the last valid split stays
        return s

    def _live_for_advice(self) -> Any:
        ev = self.run_events
        return ev.live_state if ev.live_applies() else None

    def _assess(self) -> Assessment:
        return self._sync_session().assess(live=self._live_for_advice())

    def _measure_host_bandwidth(self) -> None:
        """The host bandwidth probe (~0.25 s, once a week per machine: the calibration store
        keeps it) on a worker; the session predicts with it once it is there."""
        store, machine = self.session.calibration_store(), self.session.machine_id

        def failed(exc: BaseException) -> None:
            log.warning("host bandwidth probe failed: %s", exc)

        self.tasks.submit(lambda: store.host_bandwidth_bytes_s(machine, measure=True),
                          self._on_host_bandwidth_measured, failed)

    def _on_host_bandwidth_measured(self, bw: float | None) -> None:
        if not bw:
            return
        session = self._sync_session()
        verified = session.verified
        session.set_host_bandwidth(bw)
        if verified is not None:  # the host's bandwidth does not change what llama.cpp allocates
            session.set_verified(verified)
        self.replan()

    def replan(self) -> None:
        """Plan, predict speed and advise for the current model, configuration and hardware
        (:meth:`Session.assess`) and show it."""
        if self.model is None:
            self.prediction.set_plan(None)
            return
        t0 = time.perf_counter()
        try:
            a = self._assess()
        except ConfigError as exc:
            self.controls.show_error(str(exc))
            return
        self.assessment = a
        plan, speed = a.plan, a.speed
        self.controls.set_kv_layers_max(plan.n_gpu_repeating)
        badge = speed_band(speed.decode_tok_s) if speed is not None else None
        verified = a.to_dict()["verified"] if a.verified is not None else None
        self.prediction.set_plan(plan, speed, verified, badge, speed_error=a.speed_error)
        gpu_specs = self.hardware.gpus()
        self.workload.set_plan(plan, gpu_specs[0].mem_bandwidth_bytes_s if gpu_specs else None)
        self._show_advice()
        gpus = list(self.session.gpus)
        memory = [(f"GPU{g.device[4:]} total", g.total_bytes) for g in gpus if g.kind == "gpu" and not g.what_if]
        memory.append(("runner RAM", plan.host.total_bytes))
        speeds = []
        if speed is not None:
            what_if = " (what-if GPU plan)" if any(g.what_if for g in gpus) else ""
            speeds = [("decode" + what_if, speed.decode_tok_s), ("prefill" + what_if, speed.prefill_tok_s)]
        self.graphs.set_predicted(memory, speeds)
        self.replan_ms = (time.perf_counter() - t0) * 1000

    def _show_advice(self, running: bool | None = None) -> None:
        if self.assessment is None:
            return
        live = self._live_for_advice() is not None
        running = self.runner.running if running is None else running
        self.advisor.set_advice(list(self.assessment.advice), live=live and running)

    def refresh_advice(self, running: bool | None = None) -> None:
        """Advise again with the running model's latest state (the live advice timer)."""
        if self.model is None or self.assessment is None:
            return
        try:
            self.assessment = self._assess()
        except ConfigError:
            return
        self._show_advice(running)

    # -- live advice -------------------------------------------------------------------------------

    def add_decode_tokens(self, series: Any) -> None:
        """Feed measured decode tokens into the live state: ``(t_s, dt_s)`` pairs, oldest first
        (``time.monotonic()`` when each token finished, and how long it took). The runner's
        token events arrive here; a recorded series can be replayed the same way."""
        self.run_events.live.tokens(series)

    def update_live(self, now: float | None = None, *, running: bool | None = None) -> Any:
        """:meth:`RunEvents.update_live`: the live state, its advice and auto-stop; returns the state."""
        return self.run_events.update_live(now, running=running)

    # -- working-configs library -------------------------------------------------------------------

    def refresh_known_good(self) -> None:
        """Reload the Known good list for the current model on this machine (worker thread)."""
        model = self.model
        if model is None:
            self.known_good.set_runs([])
            return
        self._known_good_seq += 1
        seq, machine = self._known_good_seq, self.machine

        def work() -> list:
            with ConfigLibrary() as lib:
                return lib.known_good(ModelIdentity.from_profile(model), machine, limit=50)

        def done(runs: list) -> None:
            if seq == self._known_good_seq and self.model is model:
                self.known_good.set_runs(runs)

        def failed(exc: BaseException) -> None:
            if seq == self._known_good_seq:
                self.known_good.set_runs([], empty_text=f"Cannot read the library: {exc}")

        self.tasks.submit(work, done, failed)

    def restore_working_config(self, saved: Any) -> None:
        """Put a saved working configuration (a WorkingConfig or a PlanConfig) into the controls."""
        config = getattr(saved, "config", saved)
        self.controls.set_config(config)
        self.controls.show_error(None)
        self.set_config(config)
        what = f"id {saved.id}, " if hasattr(saved, "id") else ""
        tok = saved.measured.get("decode_tok_s") if hasattr(saved, "measured") else None
        self.status.showMessage(f"restored a working configuration ({what}"
                                + (f"{tok:.1f} tok/s decode" if tok is not None else "no decode figure") + ")", 8000)

    # -- verify (dry run) --------------------------------------------------------------------------

    def verify(self) -> None:
        """Ask llama.cpp for the exact buffers (dry run in a child process, off the GUI thread);
        the session keeps the result for this configuration and hardware."""
        if self.model_path is None:
            return
        config, path, model = self._config, self.model_path, self.model
        gpus = tuple(self.hardware.gpus())
        self.run_controls.verify_button.setEnabled(False)
        self.run_controls.set_progress(None, "verifying with llama.cpp ...")
        self.tasks.submit(lambda: dry_run(path, config), lambda r: self._on_verified(model, config, gpus, r),
                          self._on_verify_failed)

    def _on_verified(self, model: Any, config: PlanConfig, gpus: tuple, result: Any) -> None:
        self.run_controls.verify_button.setEnabled(True)
        if model is not self.model or gpus != tuple(self.hardware.gpus()):
            self.run_controls.set_progress(0.0, "model or hardware changed: verify again")
            return
        self.run_controls.set_progress(1.0, "verified by llama.cpp")
        self._sync_session().set_verified(result, config)
        self.replan()

    def _on_verify_failed(self, exc: BaseException) -> None:
        self.run_controls.verify_button.setEnabled(True)
        self.run_controls.set_progress(0.0, "verify failed")
        self.show_error(f"llama.cpp refused this configuration: {exc}")

    # -- run ---------------------------------------------------------------------------------------

    def start_run(self) -> bool:
        """Start a bench with the current configuration (False if none can start)."""
        if self.model_path is None or self.runner.running:
            return False
        self.show_error("")
        self.run_events.begin(self.model_path, self._config)
        self.runner.start(self.model_path, self._config)
        self.run_controls.set_running(True)
        self.run_controls.set_progress(None, "starting llama.cpp ...")
        self.status.set_field("runner", "runner: starting")
        return True

    def stop_run(self) -> None:
        """Stop the running bench and end its child process."""
        if self.runner.running:
            self.runner.stop()
            self.run_controls.set_progress(None, "stopping ...")
            self.status.set_field("runner", "runner: stopping")

    # -- the pull timer ----------------------------------------------------------------------------

    def pull(self) -> None:
        """Pull new samples and runner events into the views (the 100 ms timer calls it)."""
        host = self.sampler.host_samples(self._last_host_t)
        if host:
            self._last_host_t = host[-1].t_s
            self.graphs.add_host_samples(host)
            self.status.show_host(host[-1])
        gpu_latest = None
        for index in self.sampler.gpu_indices():
            samples = self.sampler.gpu_samples(index, self._last_gpu_t.get(index, -math.inf))
            if samples:
                self._last_gpu_t[index] = samples[-1].t_s
                self.graphs.add_gpu_samples(index, samples)
                self.gpu_last[index] = samples[-1]
                if gpu_latest is None:
                    gpu_latest = samples[-1]
        if gpu_latest is not None or not self.sampler.gpu_indices():
            self.status.show_gpu(gpu_latest)
        for t_s, ev in self.runner.drain():
            self.run_events.handle(t_s, ev)
        if self.runner.running and time.monotonic() - self.run_events.last_live_t >= LIVE_ADVICE_INTERVAL_S:
            self.update_live()
        self.graphs.refresh()

    # -- export ------------------------------------------------------------------------------------

    def open_export(self) -> ExportDialog | None:
        """Open the Export dialog for the current configuration (non-modal; returned for tests)."""
        if self.model_path is None:
            return None
        s = self._sync_session()
        rpc = tuple(dict.fromkeys(g.endpoint for g in s.gpus if g.endpoint is not None))  # --rpc, in order
        dlg = ExportDialog(self.model_path, self._config, model=self.model, measured=self.export_measured(),
                           machine=self.machine, save_dir=str(self.model_path.parent), parent=self,
                           split=s.split, rpc=rpc)
        dlg.setAttribute(QtCore.Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.show()
        return dlg

    def export_measured(self) -> dict | None:
        """Measured figures of the last completed run when it ran the model and configuration
        shown (written into a profile export), else None."""
        if self.last_run is None:
            return None
        path, config, figures = self.last_run
        return dict(figures) if path == self.model_path and config == self._config else None

    # -- shutdown ----------------------------------------------------------------------------------

    def closeEvent(self, event: QtGui.QCloseEvent) -> None:  # noqa: N802 (Qt API)
        self.save_settings()
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the run, the sampler and the timers (the window can then be dropped)."""
        self._pull_timer.stop()
        if self.runner.running:
            self.runner.stop()
            self.runner.wait(timeout_s)
        self.sampler.stop()
        self.tasks.shutdown()
