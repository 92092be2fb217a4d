"""The main window: model, hardware and controls on the left; prediction, live graphs and
advice on the right; run controls on top; live numbers in the status bar.

Everything slow happens elsewhere: model headers and dry runs on :class:`BackgroundTasks`,
the bench in :class:`RunController`'s worker thread, sampling on the samplers' thread. One
QTimer (100 ms) pulls samples and runner events into the views.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from PySide6 import QtCore, QtGui, QtWidgets

from ..core.plan.config import ConfigError, PlanConfig
from ..core.monitor.live import SWAP_WINDOW_S, LiveTracker, free_bytes_on
from ..core.plan.memory_plan import plan_memory
from . import bridge
from .run_controller import BenchSettings, RunController, RunFinished, RunStarted
from .tasks import BackgroundTasks
from .widgets.advisor_pane import AdvisorPane
from .widgets.controls import ConfigControls
from .widgets.export_dialog import ExportDialog
from .widgets.hardware_panel import HardwarePanel
from .widgets.known_good import KnownGoodPanel
from .widgets.live_graphs import LiveGraphs
from .widgets.model_card import ModelCard
from .widgets.prediction_panel import PredictionPanel
from .widgets.run_controls import RunControls
from .widgets.status_bar import StatusBar

#: How often the window pulls samples and runner events, milliseconds.
PULL_INTERVAL_MS = 100
#: How often live advice is re-evaluated during a run, seconds (the pane rebuilds only on change).
LIVE_ADVICE_INTERVAL_S = 0.5
MAX_RECENT = 8


def _detect_hardware() -> tuple[list, Any, str]:
    """Detected GPUs, host and why no GPU was found ("" when some were)."""
    from ..core.hardware.nvml import detect_gpus, nvml_status
    from ..core.hardware.host import detect_host

    gpus = detect_gpus()
    note = "" if gpus else nvml_status().message.replace("no NVIDIA GPU found: ", "")
    return gpus, detect_host(), note


class MainWindow(QtWidgets.QMainWindow):
    """kvtuner's window.

    Args:
        config: the starting configuration (None: the one saved in settings, or defaults).
        settings: where settings persist (tests pass a QSettings on a temporary file).
        hardware: (gpus, host, note) instead of detecting them (tests).
        bench: the bench the Run button starts.
        sampler: a started-or-not :class:`kvtuner.core.monitor.sampler.Sampler` (default: a 10 Hz one).
    """

    def __init__(self, config: PlanConfig | None = None, *, settings: QtCore.QSettings | None = None,
                 hardware: tuple[list, Any, str] | None = None, bench: BenchSettings | None = None,
                 sampler: Any = None) -> None:
        super().__init__()
        self.setWindowTitle("kvtuner")
        self.setAcceptDrops(True)
        self.settings = settings or QtCore.QSettings("kvtuner", "kvtuner")
        self.tasks = BackgroundTasks(self)
        gpus, host, note = hardware or _detect_hardware()
        if sampler is None:
            from ..core.monitor.sampler import Sampler

            sampler = Sampler(interval_s=0.1, capacity=600, gpus=bool(gpus))
        self.sampler = sampler
        self.runner = RunController(bench, sampler=self.sampler)

        self.model: Any = None
        self.model_path: Path | None = None
        self.plan: Any = None
        self.speed: Any = None
        self.advice: list | None = None
        self.verified: tuple[PlanConfig, tuple, Any] | None = None  # (config, hardware key, DryRunResult)
        self.measured: dict[str, float] = {}
        self.last_load_progress = 0.0
        self.last_error = ""
        self._speed_inputs: Any = None
        self._host_bw: float | None = None
        self._run_marks: set[str] = set()
        self._last_host_t = -math.inf
        self._last_gpu_t: dict[int, float] = {}
        self._n_gen = 0
        self.replan_ms = 0.0
        self._detected_gpus = [g for g in gpus if not getattr(g, "what_if", False)]
        # live advice: what the running model reports, for the configuration it runs with
        self.live = LiveTracker()
        self.live_state: Any = None
        self.auto_stopped = False
        self._run_config: PlanConfig | None = None
        self._run_model_path: Path | None = None
        self._run_gpu_offload = False
        self._run_result: Any = None
        self._last_live_t = -math.inf
        self._gpu_last: dict[int, Any] = {}
        self.calibration_note = ""
        # working-configs library: the last completed run (model path, config, measured figures)
        self.last_run: tuple[Path, PlanConfig, dict] | None = None
        self.library_note = ""
        self.saved_run_id: int | None = None
        self.profile_warnings: tuple[str, ...] = ()
        self.machine = bridge.machine_fingerprint(self._detected_gpus)
        self._known_good_seq = 0

        self._build(gpus, host, note)
        self._restore_settings(config)
        self._pull_timer = QtCore.QTimer(self)
        self._pull_timer.setInterval(PULL_INTERVAL_MS)
        self._pull_timer.timeout.connect(self.pull)
        self._pull_timer.start()
        self.sampler.start()
        self._refresh_speed_inputs()
        self.tasks.submit(bridge.measure_host_bandwidth, self._on_host_bandwidth_measured, lambda exc: None)

    # -- construction ----------------------------------------------------------------------------

    def _build(self, gpus: list, host: Any, note: str) -> None:
        self.model_card = ModelCard()
        self.hardware = HardwarePanel(gpus, host, note)
        self.controls = ConfigControls()
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
        ll.addWidget(self.controls)
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
        if not bridge.export_targets():
            self.export_action.setEnabled(False)
            self.export_action.setToolTip("Export is not available in this build (kvtuner.core.export is missing)")
        else:
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
        tb = self.addToolBar("Main")
        tb.setObjectName("main-toolbar")
        tb.setMovable(False)
        tb.addAction(self.open_action)
        tb.addAction(self.export_action)
        self._update_recent_menu()

    # -- settings ----------------------------------------------------------------------------------

    def _restore_settings(self, config: PlanConfig | None) -> None:
        # a hand-edited or foreign settings file must not keep the app from starting: a value of
        # the wrong type is ignored like a missing one
        geometry = self.settings.value("window/geometry")
        if isinstance(geometry, (QtCore.QByteArray, bytes, bytearray)):
            self.restoreGeometry(geometry)
        if config is None:
            raw = self.settings.value("config")
            if raw:
                try:
                    config = PlanConfig.from_dict(json.loads(str(raw)))
                except (ValueError, TypeError, ConfigError):
                    config = None
        self._config = config or PlanConfig()
        choice = self.settings.value("hardware/choice")
        if choice:
            custom = self.settings.value("hardware/custom_bytes")
            try:
                custom_bytes = int(custom) if custom else None
            except (TypeError, ValueError):
                custom_bytes = None
            self.hardware.set_choice(str(choice), custom_bytes)
        self.controls.set_config(self._config)
        auto = self.settings.value("advisor/auto_stop", False)
        self.advisor.auto_stop.setChecked(str(auto).lower() in ("true", "1"))
        remember = self.settings.value("library/remember", True)
        self.known_good.remember.setChecked(str(remember).lower() in ("true", "1"))
        if not bridge.library_autosave_allowed():
            self.known_good.remember.setEnabled(False)
            self.known_good.remember.setToolTip("Saving is turned off: KVTUNER_LIBRARY=off in the environment "
                                                "(or the library is not installed).")

    def _on_auto_stop_changed(self, enabled: bool) -> None:
        self.settings.setValue("advisor/auto_stop", bool(enabled))
        self.settings.sync()

    def save_settings(self) -> None:
        """Persist geometry, the configuration, the hardware choice and the model."""
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("config", json.dumps(self._config.to_dict()))
        self.settings.setValue("hardware/choice", self.hardware.current_choice())
        self.settings.setValue("hardware/custom_bytes", self.hardware.custom_bytes())
        self.settings.setValue("advisor/auto_stop", self.advisor.auto_stop.isChecked())
        self.settings.setValue("library/remember", self.known_good.remember.isChecked())
        if self.model_path is not None:
            self.settings.setValue("model/last", str(self.model_path))
        self.settings.sync()

    def _on_remember_changed(self, enabled: bool) -> None:
        self.settings.setValue("library/remember", bool(enabled))
        self.settings.sync()

    @property
    def remember_working_configs(self) -> bool:
        """The "Remember working configurations" setting (the environment may still opt out)."""
        return self.known_good.remember.isChecked()

    def recent_models(self) -> list[str]:
        """Recently opened model paths, newest first."""
        raw = self.settings.value("model/recent") or "[]"
        try:
            paths = json.loads(str(raw))
        except ValueError:
            return []
        return [str(p) for p in paths] if isinstance(paths, list) else []

    def _remember_recent(self, path: Path) -> None:
        recent = [str(path)] + [p for p in self.recent_models() if p != str(path)]
        self.settings.setValue("model/recent", json.dumps(recent[:MAX_RECENT]))
        self._update_recent_menu()

    def _update_recent_menu(self) -> None:
        self.recent_menu.clear()
        for p in self.recent_models():
            act = self.recent_menu.addAction(Path(p).name)
            act.setToolTip(p)
            act.triggered.connect(lambda _=False, p=p: self.open_model(Path(p)))
        self.recent_menu.setEnabled(bool(self.recent_models()))

    def last_model(self) -> Path | None:
        """The model opened last time (None if never)."""
        v = self.settings.value("model/last")
        return Path(str(v)) if v else None

    # -- model -------------------------------------------------------------------------------------

    def open_model(self, path: Path | None) -> None:
        """Read a model's header in the background (None: the embedded default model).
        Errors are shown in the window; the current model stays."""
        self.status.showMessage(f"reading {path.name if path else 'the default model'} ...")
        self.profile_warnings = ()
        self.advisor.set_notes([])

        def load() -> tuple[Path, Any]:
            from ..core.model.profile import ModelProfile

            p = path
            if p is None:
                from ..core.model.default_model import default_model_path

                p = default_model_path()
            return p, ModelProfile.from_gguf(Path(p).expanduser())

        self.tasks.submit(load, self._on_model_loaded, lambda exc, p=path: self._on_model_failed(p, exc))

    def _on_model_loaded(self, result: tuple[Path, Any]) -> None:
        path, model = result
        self.model, self.model_path = model, Path(path)
        self.verified = None
        self.measured = {}
        self.setWindowTitle(f"kvtuner - {self.model_path.name}")
        self.model_card.set_model(model)
        self.controls.set_model_layers(model.n_layer, model.n_ctx_train)
        self.controls.set_config(self._config)
        self.show_error("")
        self._remember_recent(self.model_path)
        self.settings.setValue("model/last", str(self.model_path))
        self.status.showMessage(f"opened {self.model_path.name}", 5000)
        self._refresh_speed_inputs()
        self.replan()
        self.refresh_known_good()

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
        if path is not None and bridge.is_profile_path(path):
            self.open_profile(Path(path))
        else:
            self.open_model(path)

    def open_profile(self, path: Path) -> None:
        """Open a kvtuner profile in the background: its configuration goes into the controls
        and its model is opened; warnings (another machine, a changed model file ...) go to the
        status bar and the advice pane. A malformed profile shows one line and changes nothing."""
        path = Path(path)
        self.status.showMessage(f"reading profile {path.name} ...")
        self.tasks.submit(lambda: bridge.load_profile(path), lambda r, p=path: self._on_profile_loaded(p, r),
                          lambda exc, p=path: self._on_profile_failed(p, exc))

    def _on_profile_loaded(self, path: Path, result: tuple[Path, PlanConfig, tuple[str, ...]]) -> None:
        model_path, config, warnings = result
        self._config = config
        self.controls.set_config(config)
        self.open_model(model_path)
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

    def _hardware_key(self) -> tuple:
        return (self.hardware.current_choice(), self.hardware.custom_bytes())

    def _on_controls_changed(self) -> None:
        try:
            config = self.controls.config()
        except ConfigError as exc:
            self.controls.show_error(str(exc))
            return
        self.controls.show_error(None)
        self.set_config(config)

    def _on_hardware_changed(self) -> None:
        self._refresh_speed_inputs()
        self.replan()

    def set_config(self, config: PlanConfig) -> None:
        """Make ``config`` current and replan (controls updated when it came from elsewhere)."""
        self._config = config
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

    def _host_for_speed(self) -> Any:
        host = self.hardware.host()
        if self._host_bw is not None:
            from dataclasses import replace

            host = replace(host, mem_bandwidth_bytes_s=self._host_bw)
        return host

    def _refresh_speed_inputs(self) -> None:
        self._speed_inputs = bridge.speed_inputs_for(self.hardware.gpus(), self._host_for_speed(), self.model,
                                                     measure=False)

    def _on_host_bandwidth_measured(self, bw: float | None) -> None:
        if bw:
            self._host_bw = bw
            self._refresh_speed_inputs()
            self.replan()

    def replan(self) -> None:
        """Plan, predict speed and advise for the current model, configuration and hardware."""
        if self.model is None:
            self.prediction.set_plan(None)
            return
        t0 = time.perf_counter()
        verified = None
        compute_override = None
        if self.verified is not None and self.verified[0] == self._config and self.verified[1] == self._hardware_key():
            verified = self.verified[2]
        try:
            # exact compute buffers apply to the devices the dry run ran on (not to a what-if GPU)
            if verified is not None and self.plan is not None and not any(g.what_if for g in self.hardware.gpus()):
                from ..cli.report import plan_dict

                compute_override = plan_dict(self.plan, verified)["verified"]["compute_bytes"]
            plan = plan_memory(self.model, self._config, self.hardware.gpus(), self.hardware.host(),
                               compute_override=compute_override)
        except ConfigError as exc:
            self.controls.show_error(str(exc))
            return
        self.plan = plan
        self.controls.set_kv_layers_max(plan.n_gpu_repeating)
        self.speed = bridge.predict_speed(plan, self._speed_inputs)
        badge = bridge.speed_band(self.speed.decode_tok_s) if self.speed is not None else None
        verified_dict = None
        if verified is not None:
            from ..cli.report import plan_dict

            verified_dict = plan_dict(plan, verified)["verified"]
        self.prediction.set_plan(plan, self.speed, verified_dict, badge)
        self._advise()
        memory = [(f"GPU{g.device[4:]} total", g.total_bytes) for g, spec in zip(plan.gpus, self.hardware.gpus())
                  if not spec.what_if]
        memory.append(("runner RAM", plan.host.total_bytes))
        speeds = []
        if self.speed is not None:
            what_if = " (what-if GPU plan)" if any(g.what_if for g in self.hardware.gpus()) else ""
            speeds = [("decode" + what_if, self.speed.decode_tok_s), ("prefill" + what_if, self.speed.prefill_tok_s)]
        self.graphs.set_predicted(memory, speeds)
        self.replan_ms = (time.perf_counter() - t0) * 1000

    def _live_applies(self) -> bool:
        """Whether the live state describes the configuration shown (the run's own)."""
        return (self.live_state is not None and self._run_config == self._config
                and self._run_model_path == self.model_path)

    def _advise(self, running: bool | None = None) -> None:
        """Advice for the current plan, with the live state when it is the running configuration."""
        if self.plan is None:
            return
        live = self.live_state if self._live_applies() else None
        running = self.runner.running if running is None else running
        self.advice = bridge.advise(self.plan, self.speed, live)
        self.advisor.set_advice(self.advice, live=live is not None and running)

    # -- live advice -------------------------------------------------------------------------------

    def add_decode_tokens(self, series: Any) -> None:
        """Feed measured decode tokens into the live state: ``(t_s, dt_s)`` pairs, oldest first
        (``time.monotonic()`` when each token finished, and how long it took). The runner's
        token events arrive here; a recorded series can be replayed the same way."""
        self.live.tokens(series)

    def update_live(self, now: float | None = None, *, running: bool | None = None) -> Any:
        """Build the :class:`~kvtuner.core.monitor.live.LiveState` from the samplers' latest samples
        and the run's events, show the advice it gives, and stop the run when decode has stayed
        under 1 tok/s for 10 s and the user enabled auto-stop. Cheap (no blocking calls); the
        pull timer calls it every :data:`LIVE_ADVICE_INTERVAL_S` during a run. ``running``:
        whether a run is in progress (default: ask the run controller). Returns the state."""
        now = time.monotonic() if now is None else now
        self._last_live_t = time.monotonic()
        running = self.runner.running if running is None else running
        host = self.sampler.host_samples(now - SWAP_WINDOW_S - 1.0) if running else []
        procs = self.sampler.gpu_processes() if running and hasattr(self.sampler, "gpu_processes") else ()
        own = (self.runner.pid,) if self.runner.pid else ()
        self.live_state = self.live.state(now, host, running=running, gpu_processes=procs, own_pids=own)
        self._advise(running)
        if running and not self.auto_stopped and self._live_applies() and bridge.should_auto_stop(
                self.live_state, self.advisor.auto_stop.isChecked()):
            self.auto_stopped = True
            rate = self.live_state.decode_tok_s or 0.0
            self.stop_run()
            self.status.showMessage(f"stopped by itself: decode stayed at {rate:.2f} tok/s, under 1 tok/s, "
                                    f"for {self.live_state.below_abandon_s:.0f} s", 15000)
        return self.live_state

    def _on_allocation_error(self, ev: Any) -> None:
        from ..runner.llama_log import allocation_request

        req = allocation_request([ev.message, *ev.log_tail])
        if req is None:
            return
        device, requested = req
        host = self.sampler.host_samples(time.monotonic() - 2.0)
        free = free_bytes_on(device, host[-1] if host else None, self._gpu_last)
        self.live.allocation_failed(device, requested, free)

    # -- calibration -------------------------------------------------------------------------------

    def _record_run(self) -> None:
        """Record the finished bench for speed calibration (off the GUI thread), then re-predict
        with the calibrated constants."""
        ev, model, config = self._run_result, self.model, self._run_config
        if ev is None or model is None or config is None or self._run_model_path != self.model_path:
            return
        s = self.runner.settings
        pre = [r["n_prompt"] / r["prefill_s"] for r in ev.reps if r.get("n_prompt") and r.get("prefill_s", 0) > 0]
        dec = [r["n_gen"] / r["decode_s"] for r in ev.reps if r.get("n_gen") and r.get("decode_s", 0) > 0]
        if not pre and not dec:
            return
        import statistics

        gpus = list(self._detected_gpus)
        plan_gpus = gpus if self._run_gpu_offload else []
        host = self.hardware.host()
        n_depth = int(ev.reps[0].get("n_depth", 0)) if ev.reps else 0
        speed_gpus, speed_host = self.hardware.gpus(), self._host_for_speed()  # widgets: read here, not in the task

        def work() -> tuple[str, Any]:
            plan = plan_memory(model, config, plan_gpus, host)
            note = bridge.record_calibration(
                plan, gpus=gpus, host=host, n_threads=ev.n_threads, n_depth=n_depth, n_prompt=s.n_prompt,
                n_gen=s.n_gen, prefill_tok_s=statistics.median(pre) if pre else None,
                decode_tok_s=statistics.median(dec) if dec else None)
            return note, bridge.speed_inputs_for(speed_gpus, speed_host, model, measure=False)

        def done(result: tuple[str, Any]) -> None:
            note, inputs = result
            self.calibration_note = note
            self.status.showMessage(note, 8000)
            if self.model is model and inputs is not None:
                self._speed_inputs = inputs
                self.replan()

        def failed(exc: BaseException) -> None:
            self.calibration_note = f"run not recorded for calibration: {exc}"
            self.status.showMessage(self.calibration_note, 8000)

        self.tasks.submit(work, done, failed)

    # -- working-configs library -------------------------------------------------------------------

    def _remember_working_config(self, bench_result: Any) -> None:
        """Keep the completed run's figures (for the profile export) and save it in the library
        unless the user opted out (on a worker thread, which opens its own connection)."""
        model, config, path = self.model, self._run_config, self._run_model_path
        if bench_result is None or config is None or path is None:
            return
        try:
            figures = bridge.measured_figures(bench_result)
        except Exception as exc:
            self.library_note = f"run not saved: {exc}"
            return
        self.measured.update(figures)
        self.last_run = (path, config, dict(figures))
        if model is None or path != self.model_path:
            return
        enabled, machine = self.remember_working_configs, self.machine

        def done(run_id: int | None) -> None:
            self.saved_run_id = run_id
            if run_id is not None:
                self.library_note = f"saved as a working configuration (id {run_id})"
                self.status.showMessage(self.library_note, 8000)
                self.refresh_known_good()
            else:
                self.library_note = "not saved: remembering working configurations is off"

        def failed(exc: BaseException) -> None:
            self.library_note = f"run not saved in the library: {exc}"
            self.status.showMessage(self.library_note, 8000)

        self.tasks.submit(lambda: bridge.library_record(model, config, figures, model_path=path, machine=machine,
                                                        enabled=enabled), done, failed)

    def refresh_known_good(self) -> None:
        """Reload the Known good list for the current model on this machine (worker thread)."""
        model = self.model
        if model is None or not bridge.library_available():
            self.known_good.set_runs(None if not bridge.library_available() else [])
            return
        self._known_good_seq += 1
        seq, machine = self._known_good_seq, self.machine

        def done(runs: list) -> None:
            if seq == self._known_good_seq and self.model is model:
                self.known_good.set_runs(runs)

        def failed(exc: BaseException) -> None:
            if seq == self._known_good_seq:
                self.known_good.set_runs([], empty_text=f"Cannot read the library: {exc}")

        self.tasks.submit(lambda: bridge.library_known_good(model, machine), done, failed)

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
        """Ask llama.cpp for the exact buffers (dry run in a child process, off the GUI thread)."""
        if self.model_path is None:
            return
        config, key, path = self._config, self._hardware_key(), self.model_path
        self.run_controls.verify_button.setEnabled(False)
        self.run_controls.set_progress(None, "verifying with llama.cpp ...")

        def work() -> Any:
            from ..runner.dryrun import dry_run

            return dry_run(path, config)

        self.tasks.submit(work, lambda r: self._on_verified(config, key, r), self._on_verify_failed)

    def _on_verified(self, config: PlanConfig, key: tuple, result: Any) -> None:
        self.run_controls.verify_button.setEnabled(True)
        self.run_controls.set_progress(1.0, "verified by llama.cpp")
        self.verified = (config, key, result)
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
        self._run_marks = set()
        self.last_load_progress = 0.0
        self.live.reset()
        self.live_state = None
        self.auto_stopped = False
        self._run_config, self._run_model_path = self._config, self.model_path
        self._run_gpu_offload = False
        self._run_result = None
        self.calibration_note = ""
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

    def _mark_once(self, t_s: float, name: str) -> None:
        if name not in self._run_marks:
            self._run_marks.add(name)
            self.graphs.mark_phase(t_s, name)

    def _on_runner_event(self, t_s: float, ev: Any) -> None:
        from ..runner import protocol as P

        if isinstance(ev, RunStarted):
            self.status.set_field("runner", f"runner: pid {ev.pid}")
        elif isinstance(ev, P.StartedEvent):
            self._run_gpu_offload = bool(ev.gpu_offload_supported)
        elif isinstance(ev, P.ContextEvent):
            self.live.set_flash_attn(ev.flash_attn)
        elif isinstance(ev, P.LoadProgressEvent):
            self._mark_once(t_s, "weights")
            self.last_load_progress = max(self.last_load_progress, ev.progress)
            self.run_controls.set_progress(ev.progress, f"loading weights {ev.progress:.0%}")
        elif isinstance(ev, (P.BufferEvent, P.KvCacheEvent)):
            kind = "kv" if isinstance(ev, P.KvCacheEvent) else ev.kind
            if isinstance(ev, P.KvCacheEvent):
                self.live.kv_cache(ev.type_k, ev.type_v)
            if kind == "kv":
                self._mark_once(t_s, "KV")
            elif kind == "compute":
                self._mark_once(t_s, "compute")
        elif isinstance(ev, P.LoadedEvent):
            self.run_controls.set_progress(1.0, f"loaded in {ev.load_s:.1f} s")
            self.measured["load_s"] = ev.load_s
        elif isinstance(ev, P.PrefillProgressEvent):
            self._mark_once(t_s, f"prefill {ev.rep}" if ev.rep > 0 else "prefill")
            self.run_controls.set_progress(ev.n_done / max(ev.n_total, 1), f"prefill {ev.n_done}/{ev.n_total}")
        elif isinstance(ev, P.PrefillResultEvent):
            self.graphs.add_prefill(t_s, ev.tok_s)
            self.status.show_speed(ev.tok_s, None)
            self.measured["prefill_tok_s"] = ev.tok_s
        elif isinstance(ev, P.TokenEvent):
            if ev.index == 0:
                self._mark_once(t_s, f"decode {ev.rep}" if ev.rep > 0 else "decode")
            if ev.dt_s > 0:
                self.graphs.add_decode(t_s, 1.0 / ev.dt_s)
            self.live.token(t_s, ev.dt_s)
            n_gen = self.runner.settings.n_gen
            self.run_controls.set_progress((ev.index + 1) / n_gen, f"decode {ev.index + 1}/{n_gen}")
        elif isinstance(ev, P.RepResultEvent):
            self.live.end_decode()
            if ev.decode_s > 0:
                rate = ev.n_gen / ev.decode_s
                self.status.show_speed(None, rate)
                self.measured["decode_tok_s"] = rate
        elif isinstance(ev, P.BenchResultEvent):
            self.measured["peak_rss_bytes"] = ev.peak_rss_bytes
            self._run_result = ev
        elif isinstance(ev, P.ErrorEvent):
            if ev.kind == "out_of_memory":
                self._on_allocation_error(ev)
            if ev.kind != "cancelled":
                self.show_error(f"Run failed ({ev.kind}): {ev.message}")
        elif isinstance(ev, RunFinished):
            self.graphs.end_run(t_s)
            self.run_controls.set_running(False)
            text = "done" if ev.ok else ("stopped" if ev.stopped else "failed")
            if ev.ok:
                self.run_controls.set_progress(1.0, "bench done")
            else:
                self.run_controls.set_progress(0.0, text)
            self.status.set_field("runner", f"runner: {text}")
            self.live.end_decode()
            self.update_live(t_s, running=False)
            if ev.ok:
                self._record_run()
                self._remember_working_config(ev.result)

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
                self._gpu_last[index] = samples[-1]
                if gpu_latest is None:
                    gpu_latest = samples[-1]
        if gpu_latest is not None or not self.sampler.gpu_indices():
            self.status.show_gpu(gpu_latest)
        for t_s, ev in self.runner.drain():
            self._on_runner_event(t_s, ev)
        if self.runner.running and time.monotonic() - self._last_live_t >= LIVE_ADVICE_INTERVAL_S:
            self.update_live()
        self.graphs.refresh()

    # -- export ------------------------------------------------------------------------------------

    def open_export(self) -> ExportDialog | None:
        """Open the Export dialog for the current configuration (non-modal; returned for tests)."""
        if self.model_path is None or not bridge.export_targets():
            return None
        dlg = ExportDialog(self.model_path, self._config, model=self.model, measured=self.export_measured(),
                           machine=self.machine, save_dir=str(self.model_path.parent), parent=self)
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
