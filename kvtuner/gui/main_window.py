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
from ..core.hardware.nvml import nvml_status
from ..core.hardware.specs import GpuSpec, HostSpec
from ..core.hardware.vendors import detect_all_gpus
from ..core.model.default_model import default_model_path
from ..core.model.profile import ModelProfile
from ..core.plan.config import ConfigError, PlanConfig
from ..core.session import Assessment, Session
from ..core.store.library import ConfigLibrary, autosave_enabled
from ..runner.dryrun import dry_run, probe_structure
from ..runner.server_verify import verify_with_engine
from .about import install_help_menu
from .attach import AttachDialog, AttachedServer
from .config_state import effective_config, fix_for_error, fix_wording, gui_wording
from .run_controller import BenchSettings, RunController
from .run_events import RunEvents
from .settings import AppSettings, open_settings
from .tasks import BackgroundTasks
from .widgets.advisor_pane import AdvisorPane
from .widgets.controls import ConfigControls
from .widgets.device_list import DeviceListPanel
from .widgets.export_dialog import ExportDialog
from .widgets.extras_panel import ExtrasPanel
from .widgets.hardware_panel import HardwarePanel
from .widgets.known_good import KnownGoodPanel
from .widgets.live_graphs import LiveGraphs
from .widgets.model_card import ModelCard
from .widgets.prediction_panel import PredictionPanel
from .widgets.run_controls import RunControls
from .widgets.status_bar import StatusBar
from .widgets.workload_panel import WorkloadPanel

log = logging.getLogger("kvtuner.gui")

#: How often the window pulls samples and runner events during a run, milliseconds (and the
#: samplers sample, 10 Hz).
PULL_INTERVAL_MS = 100
#: The same with nothing running: 1 Hz keeps the RAM graph and status bar alive while a window
#: left open all day idles under 1% of a core (3.3-3.6% at 10 Hz; benchmarks/gui_idle_cpu.py
#: measures it, docs/development/benchmarks.md has the figures).
IDLE_PULL_INTERVAL_MS = 1000
#: Seconds after a run ends before sampling slows to the idle rate (the graphs show the release).
IDLE_AFTER_S = 3.0
#: How often live advice is re-evaluated during a run, seconds (the pane rebuilds only on change).
LIVE_ADVICE_INTERVAL_S = 0.5
#: The left column's width (model, hardware, configuration), pixels: fits a 1280-pixel screen.
LEFT_MIN_WIDTH = 430
#: Available RAM moving by this much (bytes) replans with the new figure (512 MiB: well above the
#: page cache's second-to-second jitter, well under any model's weights).
RAM_REPLAN_BYTES = 512 << 20
#: The progress text after a dry run (replaced when the configuration changes).
VERIFIED_TEXT = "verified by llama.cpp"
#: The advice pane's least height, pixels (drag the splitter for more).
ADVICE_HEIGHT_PX = 110
#: The most of the graphs-and-advice column the advice pane takes by itself; its rows scroll
#: beyond that (the graphs keep the rest).
ADVICE_MAX_SHARE = 0.6
#: The live graphs' title.
GRAPHS_TITLE = "Live: memory and speed (dashed: predicted; dotted: run phases)"


def _detect_hardware() -> tuple[list[GpuSpec], HostSpec, str]:
    """Detected GPUs (NVML, then AMD/Intel through sysfs), host and why no GPU was found ("" when
    some were)."""
    gpus = detect_all_gpus()
    note = "" if gpus else nvml_status().message.replace("no NVIDIA GPU found: ", "")
    return gpus, detect_host(), note


def _run_state(name: str, doc: str) -> property:
    """A window attribute that is the run-event handler's (:class:`RunEvents`) state."""
    return property(
        lambda self: getattr(self.run_events, name), lambda self, value: setattr(self.run_events, name, value), doc=doc
    )


class _WindowShortcuts(QtCore.QObject):
    """Event filter for the window's text boxes: the window's own shortcuts (Ctrl+E, Ctrl+R ...)
    win over the line edit's (QLineEdit takes Ctrl+E as "end of line" on X11, so Export did
    nothing while a number box had focus)."""

    def __init__(self, actions: list[QtGui.QAction], parent: QtCore.QObject) -> None:
        super().__init__(parent)
        self._keys = [a.shortcut() for a in actions if not a.shortcut().isEmpty()]

    def eventFilter(self, obj: QtCore.QObject, event: QtCore.QEvent) -> bool:  # noqa: N802 (Qt API)
        if event.type() == QtCore.QEvent.Type.ShortcutOverride:
            pressed = QtGui.QKeySequence(event.keyCombination())
            if any(
                pressed.matches(k) == QtGui.QKeySequence.SequenceMatch.ExactMatch
                for k in self._keys
                if k.toString() != "Esc"
            ):
                event.ignore()  # not overridden: the window's shortcut gets it
                return True
        return False


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
        #: RAM given on the command line (``--ram``): planned as is, not followed as it changes
        self.fixed_host = host is not None
        host = host if host is not None else detected_host
        #: the window made its sampler and sets its rate (10 Hz in a run, 1 Hz idle); a sampler
        #: passed in keeps the rate it was given
        self._own_sampler = sampler is None
        if sampler is None:
            from ..core.monitor.sampler import Sampler

            sampler = Sampler(interval_s=0.1, capacity=600, gpus=bool(gpus))
        self.sampler = sampler
        self.runner = RunController(bench, sampler=self.sampler)
        #: the running server the window watches (Run > Attach), or None
        self.attached: AttachedServer | None = None

        self.model: ModelProfile | None = None
        #: why the configuration asked for was refused ("" when it was not): the figures shown are stale
        self.stale = ""
        self._tooltips: dict[Any, str] = {}
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
        #: the command line's "Plan for" choice: it wins over the saved one and is not saved
        self._cli_plan_for = plan_for
        if plan_for is not None:
            self.hardware.set_choice(*plan_for)
            self._apply_effective()
        if host is not None and host.what_if:
            self.hardware.set_what_if_host(host)
        self._pull_timer = QtCore.QTimer(self)
        self._pull_timer.timeout.connect(self.pull)
        self._fast = True
        self._last_busy_t = -math.inf
        self._set_sampling(fast=False)
        self._pull_timer.start()
        self.sampler.start()
        self._measure_host_bandwidth()

    # -- construction ----------------------------------------------------------------------------

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
        from .widgets.engine_selector import EngineSelector

        self.engine_selector = EngineSelector(self.tasks.submit, self.app_settings)
        self.status.addPermanentWidget(self.engine_selector)
        self.engine_selector.engine_changed.connect(self._on_engine_changed)
        self.engine_selector.refresh()
        from .widgets.cpu_probe_indicator import CpuProbeIndicator

        self.cpu_probe = CpuProbeIndicator()
        self.cpu_probe.finished.connect(self._on_cpu_probe_finished)
        self.status.addPermanentWidget(self.cpu_probe)

        self.banner = QtWidgets.QLabel()
        self.banner.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet("background: #fdecea; color: #8a1c13; padding: 6px; border: 1px solid #e6a19a;")
        self.banner.hide()
        self.dismiss_button = QtWidgets.QToolButton()
        self.dismiss_button.setText("Dismiss")
        self.dismiss_button.setToolTip("Hide this message")
        self.dismiss_button.clicked.connect(self.dismiss_error)
        self.banner_row = QtWidgets.QWidget()
        br = QtWidgets.QHBoxLayout(self.banner_row)
        br.setContentsMargins(0, 0, 0, 0)
        br.addWidget(self.banner, 1)
        br.addWidget(self.dismiss_button, 0, QtCore.Qt.AlignmentFlag.AlignTop)
        self.banner_row.hide()

        left = QtWidgets.QWidget()
        ll = QtWidgets.QVBoxLayout(left)
        ll.setContentsMargins(4, 4, 4, 4)
        ll.addWidget(self.model_card)
        ll.addWidget(self.hardware)
        ll.addWidget(self.devices)
        ll.addWidget(self.controls)
        ll.addWidget(self.workload)
        ll.addWidget(self.extras_panel)
        ll.addWidget(self.known_good, 1)
        left_scroll = QtWidgets.QScrollArea()
        left_scroll.setWidgetResizable(True)
        left_scroll.setWidget(left)
        left_scroll.setMinimumWidth(max(LEFT_MIN_WIDTH, left.minimumSizeHint().width() + 12))
        left_scroll.setHorizontalScrollBarPolicy(QtCore.Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        left_scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)

        graphs_box = self.graphs_box = QtWidgets.QGroupBox(GRAPHS_TITLE)
        gl = QtWidgets.QVBoxLayout(graphs_box)
        gl.setContentsMargins(4, 4, 4, 4)
        gl.addWidget(self.graphs)
        self.whole_session = QtWidgets.QCheckBox("&Whole session")
        self.whole_session.setToolTip(
            "Show everything since the window opened; off: the time axis follows the "
            "current run.\nDrag or scroll on a graph to zoom the time axis; double-click "
            "to follow the newest data again."
        )
        self.whole_session.toggled.connect(self.graphs.set_whole_session)
        hint = QtWidgets.QLabel("drag or scroll: zoom time; double-click: follow")
        hint.setEnabled(False)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(self.whole_session)
        row.addStretch(1)
        row.addWidget(hint)
        gl.addLayout(row)

        # the prediction keeps its natural height (its wrapped lines are never cut); the graphs
        # and the advice share the rest
        self.right_split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Vertical)
        self.right_split.addWidget(graphs_box)
        self.right_split.addWidget(self.advisor)
        self.right_split.setStretchFactor(0, 1)
        self.right_split.setStretchFactor(1, 0)
        self.right_split.setChildrenCollapsible(False)

        right = QtWidgets.QWidget()
        rl = QtWidgets.QVBoxLayout(right)
        rl.setContentsMargins(4, 4, 4, 4)
        rl.addWidget(self.run_controls)
        rl.addWidget(self.banner_row)
        rl.addWidget(self.prediction)
        rl.addWidget(self.right_split, 1)

        self.main_split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        self.main_split.addWidget(left_scroll)
        self.main_split.addWidget(right)
        self.main_split.setStretchFactor(1, 1)
        self.main_split.setSizes([LEFT_MIN_WIDTH, 1440 - LEFT_MIN_WIDTH])
        self._split_done = False  # the graphs/advice split is set at the first show (see showEvent)
        self._advice_auto_px = 0  # the advice height the window last set by itself (0: none yet)
        self.setCentralWidget(self.main_split)

        self._build_actions()
        self._shortcuts = _WindowShortcuts(
            [self.export_action, self.run_action, self.verify_action, self.open_action], self
        )
        # on the spin boxes themselves too: QAbstractSpinBox hands ShortcutOverride straight to
        # its line edit's event(), past any filter on the line edit
        for edit in (
            *self.findChildren(QtWidgets.QAbstractSpinBox),
            *self.findChildren(QtWidgets.QLineEdit),
            *self.findChildren(QtWidgets.QComboBox),
        ):
            edit.installEventFilter(self._shortcuts)
        self.controls.changed.connect(self._on_controls_changed)
        self.extras_panel.changed.connect(self.replan)
        self.controls.fix_requested.connect(self._on_fix_requested)
        self.hardware.changed.connect(self._on_hardware_changed)
        self.devices.changed.connect(self._on_hardware_changed)
        self.advisor.apply_fix.connect(self.apply_fix)
        self.advisor.stop_requested.connect(self.stop_run)
        self.advisor.auto_stop_changed.connect(self._on_auto_stop_changed)
        self.advisor.content_changed.connect(self._make_room_for_advice)
        self.known_good.restore_requested.connect(self.restore_working_config)
        self.known_good.delete_requested.connect(self.delete_working_configs)
        self.known_good.remember_changed.connect(self._on_remember_changed)
        self.run_controls.run_clicked.connect(self.start_run)
        self.run_controls.stop_clicked.connect(self.stop_run)
        self.run_controls.verify_clicked.connect(self.verify)
        self.run_controls.bench.set_settings(self.runner.settings)
        self.run_controls.bench.changed.connect(self._on_bench_changed)
        self._set_model_open(False)
        self.resize(1440, 920)

    def _build_actions(self) -> None:
        menu = self.menuBar().addMenu("&File")
        self.open_action = QtGui.QAction(
            "&Open model or profile...",
            self,
            shortcut=QtGui.QKeySequence.StandardKey.Open,
            triggered=self._on_open_triggered,
        )
        self.open_action.setToolTip("Open a GGUF model, or a kvtuner profile (.json) with its model and configuration")
        self.default_action = QtGui.QAction(
            "Open the &default model (Gemma 3 270M)", self, triggered=lambda: self.open_model(None)
        )
        self.recent_menu = QtWidgets.QMenu("&Recent models", self)
        self.export_action = QtGui.QAction(
            "&Export configuration...", self, shortcut="Ctrl+E", triggered=self.open_export
        )
        self.export_action.setToolTip(
            "Export this configuration for llama-server, llama-cpp-python, Ollama, koboldcpp or as a kvtuner profile"
        )
        quit_action = QtGui.QAction("&Quit", self, shortcut=QtGui.QKeySequence.StandardKey.Quit, triggered=self.close)
        self.reset_action = QtGui.QAction("Rese&t configuration to defaults", self, triggered=self.reset_to_defaults)
        self.reset_action.setToolTip("Put llama.cpp's defaults into the controls")
        for a in (self.open_action, self.default_action):
            menu.addAction(a)
        menu.addMenu(self.recent_menu)
        menu.addSeparator()
        menu.addAction(self.export_action)
        menu.addAction(self.reset_action)
        menu.addSeparator()
        menu.addAction(quit_action)
        run_menu = self.menuBar().addMenu("&Run")
        self.run_action = QtGui.QAction("&Run bench", self, shortcut="Ctrl+R", triggered=self.start_run)
        self.stop_action = QtGui.QAction("&Stop", self, shortcut="Esc", triggered=self.stop_run)
        self.verify_action = QtGui.QAction(
            "&Verify with llama.cpp", self, shortcut="Ctrl+Shift+V", triggered=self.verify
        )
        for a in (self.run_action, self.stop_action, self.verify_action):
            run_menu.addAction(a)
        run_menu.addSeparator()
        self.attach_action = QtGui.QAction(
            "&Attach to a running server...", self, shortcut="Ctrl+Shift+A", triggered=self.open_attach
        )
        self.attach_action.setToolTip(
            "Watch a llama-server or Ollama someone else started: its speed, context fill "
            "and memory live, beside kvtuner's plan for its configuration"
        )
        self.detach_action = QtGui.QAction("&Detach", self, triggered=lambda: self.detach())
        self.detach_action.setEnabled(False)
        run_menu.addAction(self.attach_action)
        run_menu.addAction(self.detach_action)
        run_menu.addSeparator()
        install_help_menu(self)  # Help > About, app icon (gui/about.py)
        tb = self.addToolBar("Main")
        tb.setObjectName("main-toolbar")
        tb.setMovable(False)
        tb.addAction(self.open_action)
        tb.addAction(self.export_action)
        # the Tune dialog (kvtuner/gui/tune_panel.py)
        self.tune_action = QtGui.QAction("&Tune...", self, shortcut="Ctrl+T", triggered=self.open_tune)
        self.tune_action.setToolTip("Find the fastest configuration that fits a goal, with its knee chart")
        run_menu.addAction(self.tune_action)
        tb.addAction(self.tune_action)
        self._update_recent_menu()

    def _set_model_open(self, is_open: bool) -> None:
        """Run, Verify, Export and Tune act on a model: disabled, with the reason, until one is open."""
        self.run_controls.set_ready(is_open)
        for action in (self.run_action, self.verify_action, self.export_action):
            action.setEnabled(is_open and not self.stale)
        self.tune_action.setEnabled(is_open)

    # -- settings ----------------------------------------------------------------------------------

    def _restore_settings(self, config: PlanConfig | None) -> None:
        s = self.app_settings
        geometry = s.geometry()
        if geometry is not None:
            self.restoreGeometry(geometry)
        # a configuration from the command line is this session's; the remembered one stays
        # remembered until the configuration is changed in the window
        self._remember_config = config is None
        self._wanted = config or s.config() or PlanConfig()
        choice = s.hardware_choice()
        if choice is not None:
            self.hardware.set_choice(*choice)
        self._apply_effective()
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
            s.set_config(self._wanted)
        if self._cli_plan_for is None or self._cli_plan_for[0] != self.hardware.current_choice():
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
        self._apply_effective()
        self.show_error("")
        self.app_settings.add_recent_model(self.model_path)
        self._update_recent_menu()
        self._set_model_open(True)
        self.status.showMessage(f"opened {self.model_path.name}", 5000)
        self.replan()
        self.refresh_known_good()
        self._probe_structure_if_needed()
        self._probe_cpu_if_needed()
        if self.attached is not None:
            self.attached.model_opened()

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
            self.status.showMessage(
                "llama.cpp could not be asked for the layer structure: the plan stays approximate", 8000
            )

        self.tasks.submit(lambda: probe_structure(path, model.structure), done, failed)

    def _probe_cpu_if_needed(self) -> None:
        """This machine has no CPU probe of the model's kernels and the plan computes on the CPU:
        start the background probe job (:func:`kvtuner.runner.probe_job.background_for`, one at a
        time, as ``kvtuner plan`` does) and show its progress in the status bar; the prediction
        uses assumed rates meanwhile and is refined when the probe lands. ``KVTUNER_CPU_PROBE=off``
        turns it off."""
        import os

        from ..runner import probe_job

        if os.environ.get("KVTUNER_CPU_PROBE", "").lower() in ("off", "0", "no") or self.cpu_probe.following:
            return
        missing, dims, experts = probe_job.probe_missing(self.session)
        if not missing and not dims and not experts:
            return
        note = probe_job.background_for(self.session, missing, dims, experts)
        self.status.showMessage(
            note.replace(" (--probe now waits, --probe off skips)", "").replace(" (--probe now waits for it)", ""),
            10000,
        )
        if probe_job.is_running() or probe_job.read_status().get("state") == "starting":
            self.cpu_probe.follow()

    def _on_cpu_probe_finished(self, state: str, message: str) -> None:
        """The background probe ended: predict with its rates when it stored them, else say why not."""
        if state == "stored":
            self.session.invalidate_speed()
            self.replan()
            self.status.showMessage("CPU probe done: the speed now uses this machine's measured CPU rates", 8000)
        elif state == "busy":
            self.status.showMessage(
                "CPU probe not kept: the machine was busy; the speed keeps assumed CPU rates", 15000
            )
            self.advisor.set_notes([message])
        else:
            self.status.showMessage(
                f"CPU probe failed: {message or 'it ended without a result'}; the speed keeps assumed CPU rates", 15000
            )

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
        self.banner_row.setVisible(bool(text))

    def dismiss_error(self) -> None:
        """Hide the error banner (the Dismiss button); :attr:`last_error` keeps the text."""
        self.banner.hide()
        self.banner_row.hide()

    def reset_to_defaults(self) -> None:
        """Put llama.cpp's defaults (:class:`~kvtuner.core.plan.config.PlanConfig`) into the
        controls and replan (File > Reset configuration to defaults)."""
        self.set_config(PlanConfig())
        self.status.showMessage("configuration reset to the defaults", 5000)

    def _on_open_triggered(self) -> None:
        start = str(self.app_settings.open_dir())  # the last folder opened from, else home
        path, _ = QtWidgets.QFileDialog.getOpenFileName(
            self,
            "Open a GGUF model or a kvtuner profile",
            start,
            "GGUF models and kvtuner profiles (*.gguf *.json);;GGUF models (*.gguf);;kvtuner profiles (*.json);;"
            "All files (*)",
        )
        if path:
            self.open_path(Path(path))

    def open_path(self, path: Path | None) -> None:
        """Open a model, or a kvtuner profile when ``path`` ends in ``.json`` (None: the default model)."""
        if path is not None:
            self.app_settings.set_open_dir(Path(path))
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
        self.tasks.submit(
            lambda: load_profile(path),
            lambda r, p=path: self._on_profile_loaded(p, r),
            lambda exc, p=path: self._on_profile_failed(p, exc),
        )

    def _on_profile_loaded(self, path: Path, result: tuple[Path, PlanConfig, tuple[str, ...]]) -> None:
        model_path, config, warnings = result
        self._wanted = config
        self._remember_config = True
        self._apply_effective()
        self.open_model(Path(model_path))
        self.profile_warnings = tuple(warnings)
        self.advisor.set_notes([f"Profile {path.name}: {w}" for w in warnings])
        if warnings:
            self.status.showMessage(
                f"profile {path.name}: {warnings[0]}"
                + (f" (+{len(warnings) - 1} more in the advice pane)" if len(warnings) > 1 else ""),
                15000,
            )
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
        """The configuration shown, planned, run and exported: the last valid one asked for, as
        it applies to the hardware planned for (:func:`kvtuner.gui.config_state.effective_config`)."""
        return self._config

    @property
    def wanted_config(self) -> PlanConfig:
        """The last valid configuration asked for, with the values of controls that do not
        apply kept (they come back when they apply again)."""
        return self._wanted

    def _apply_effective(self) -> None:
        """Derive the effective configuration from the one asked for and show it in the controls."""
        n_layer = self.model.n_layer if self.model is not None else 0
        eff = effective_config(self._wanted, n_layer, self.hardware.gpus())
        self._config = eff.config
        self.controls.set_config(self._wanted, eff.config, eff.not_applicable)

    def _show_refusal(self, message: str, values: dict | None = None) -> None:
        """A refused combination: say why in the window's words, offer the one-click fix when
        there is one, keep the last valid plan marked stale and block Run and Export."""
        fix = fix_for_error(message, values if values is not None else self.controls.values())
        text = gui_wording(message)
        self.controls.show_error(text, fix)
        self.stale = text
        self.prediction.set_stale(text)
        self.advisor.setEnabled(False)
        for w in (self.run_controls.run_button, self.run_action, self.export_action):
            self._tooltips.setdefault(w, w.toolTip())
            w.setEnabled(False)
            w.setToolTip(f"Change the configuration first: {text}")

    def _clear_refusal(self) -> None:
        if not self.stale:
            return
        self.stale = ""
        self.controls.show_error(None)
        self.prediction.set_stale(None)
        self.advisor.setEnabled(True)
        self.run_controls.set_running(self.runner.running)
        for w in (self.run_action, self.export_action):
            w.setEnabled(True)
        for w, tip in self._tooltips.items():
            w.setToolTip(tip)

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
        values = self.controls.values()
        try:
            config = self.controls.config()
        except ConfigError as exc:
            self._show_refusal(str(exc), values)
            return
        if self.controls.resolved_notes:  # llama-server defaults, shown resolved
            self.status.showMessage(gui_wording("; ".join(self.controls.resolved_notes)), 8000)
        self.set_config(config)

    def _on_fix_requested(self, changes: dict) -> None:
        """The one-click fix of a refused combination: the controls' values with ``changes``."""
        try:
            config = self.controls.config(changes)
        except ConfigError as exc:
            self._show_refusal(str(exc))
            return
        self.set_config(config)
        self.status.showMessage("fixed: " + self.controls.fix_button.text().lower(), 5000)

    def _on_hardware_changed(self) -> None:
        self._apply_effective()
        self.replan()

    def set_config(self, config: PlanConfig) -> None:
        """Make ``config`` the one asked for (a change made in the window: remembered), show
        how it applies to the hardware and replan."""
        self._wanted = config
        self._remember_config = True
        self._apply_effective()
        self.replan()

    def apply_fix(self, fix: dict) -> None:
        """Apply an advice's fix (PlanConfig changes) and replan."""
        try:
            config = self._wanted.with_(**fix)
        except (ConfigError, TypeError) as exc:
            self._show_refusal(f"cannot apply this fix: {exc}")
            return
        self.set_config(config)
        self.status.showMessage("applied: " + fix_wording(fix), 5000)

    def _sync_session(self) -> Session:
        """The session, told the model, configuration and hardware shown."""
        s = self.session
        s.model = self.model
        s.config = self._config
        if s.host is not None:
            s.host = self.hardware.host_for(s.host)
        self.devices.set_base(self.hardware.gpus())
        s.gpus = tuple(self.devices.devices())
        try:
            s.split = self.devices.split()
        except ConfigError:
            pass  # the panel shows why; the last valid split stays
        s.extras = self._checked_extras()
        return s

    def _checked_extras(self) -> Any:
        """The extras panel's files when llama-server would take them with this model (the
        session counts them in every plan), else None with the reason in the panel."""
        from ..core.plan.extras import check_files

        extras = self.extras_panel.extras()
        if extras.empty or self.model is None:
            return None
        try:
            check_files(extras, self.model)
        except ConfigError as exc:
            self.extras_panel.show_result(str(exc), error=True)
            return None
        return extras

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

        self.tasks.submit(
            lambda: store.host_bandwidth_bytes_s(machine, measure=True), self._on_host_bandwidth_measured, failed
        )

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
            self._show_refusal(str(exc))
            return
        self._clear_refusal()
        self.assessment = a
        plan, speed = a.plan, a.speed
        verified = a.to_dict()["verified"] if a.verified is not None else None
        if verified is None and self.run_controls.progress.format() == VERIFIED_TEXT:
            self.run_controls.set_progress(0.0, "not verified for this configuration")
        self.extras_plan = self._plan_extras(plan)
        self.prediction.set_plan(
            plan, speed, verified, speed_error=a.speed_error, margins=a.margins, extras=self.extras_plan
        )
        gpu_specs = self.hardware.gpus()
        self.workload.set_plan(plan, gpu_specs[0].mem_bandwidth_bytes_s if gpu_specs else None)
        self._show_advice()
        self._show_predicted_lines(plan, speed)
        self.replan_ms = (time.perf_counter() - t0) * 1000

    def _plan_extras(self, plan: Any) -> Any:
        """The projector / draft / LoRA the session planned beside ``plan`` (None without them),
        summed up in the extras panel."""
        from ..core.units import fmt_bytes

        xp = getattr(plan, "extras", None)
        if xp is None:
            if self.extras_panel.extras().empty:
                self.extras_panel.show_result("")
            # else a refused file: _checked_extras left the reason in the panel
            return None
        parts = ", ".join(f"{p} {fmt_bytes(xp.part_bytes(p))}" for p in ("mmproj", "draft", "lora") if xp.part_bytes(p))
        self.extras_panel.show_result(
            f"adds {parts}" + (f"; one image takes {xp.image_tokens} tokens" if xp.image_tokens else "")
        )
        return xp

    def _show_predicted_lines(self, plan: Any, speed: Any) -> None:
        """The graphs' dashed lines: predicted for the hardware the runs measure (this machine),
        labelled with it; a plan for a what-if card draws none (the runs measure this machine,
        not the card) and the graphs' title says so."""
        gpus = list(self.session.gpus)  # the cards planned for, with the device list's
        what_if = [g for g in gpus if g.what_if]
        if what_if:
            self.graphs.set_predicted([], [])
            self.graphs_box.setTitle(
                f"Live: memory and speed of this machine (no predicted lines: the plan is for "
                f"{what_if[0].name if 'what-if' in what_if[0].name else 'a what-if ' + what_if[0].name}; "
                "dotted: run phases)"
            )
            return
        where = "this machine, " + (", ".join(g.name for g in gpus) if gpus else "CPU only")
        memory = [(f"GPU{g.device[4:]} total", g.total_bytes) for g in plan.gpus if g.kind == "gpu"]
        memory.append(("runner RAM", plan.host.total_bytes))
        speeds = []
        if speed is not None:
            speeds = [("decode", speed.decode_tok_s), ("prefill", speed.prefill_tok_s)]
        self.graphs.set_predicted(memory, speeds)
        self.graphs_box.setTitle(
            f"Live: memory and speed on {where} (dashed: predicted; solid: measured; dotted: run phases)"
        )

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

    def delete_working_configs(self, run_ids: list) -> None:
        """Delete saved runs from the library (worker thread), then reload the list."""
        ids = [int(i) for i in run_ids]

        def work() -> int:
            with ConfigLibrary() as lib:
                return sum(bool(lib.delete(i)) for i in ids)

        def done(n: int) -> None:
            self.status.showMessage(f"deleted {n} saved run{'s' if n != 1 else ''}", 5000)
            self.refresh_known_good()

        self.tasks.submit(work, done, lambda exc: self.show_error(f"Could not delete: {exc}"))

    def restore_working_config(self, saved: Any) -> None:
        """Put a saved working configuration (a WorkingConfig or a PlanConfig) into the controls."""
        config = getattr(saved, "config", saved)
        self.set_config(config)
        what = f"id {saved.id}, " if hasattr(saved, "id") else ""
        tok = saved.measured.get("decode_tok_s") if hasattr(saved, "measured") else None
        self.status.showMessage(
            f"restored a working configuration ({what}"
            + (f"{tok:.1f} tok/s decode" if tok is not None else "no decode figure")
            + ")",
            8000,
        )

    # -- verify (dry run) --------------------------------------------------------------------------

    def verify(self) -> None:
        """Ask the engine in use for the exact buffers, off the GUI thread, without reading a
        weight: llama-server's own start-up memory breakdown for a llama-server engine, the
        embedded dry run otherwise (:func:`kvtuner.runner.server_verify.verify_with_engine`); the
        session keeps the result for this configuration and hardware."""
        if self.model_path is None:
            return
        config, path, model = self._config, self.model_path, self.model
        gpus = tuple(self.hardware.gpus())
        engine, split = self.engine, self.session.split
        self.run_controls.verify_button.setEnabled(False)
        self.run_controls.set_progress(None, f"verifying with {self._engine_name(engine)} ...")

        def work() -> Any:
            if engine is None or engine.kind == "embedded":
                return dry_run(path, config)
            return verify_with_engine(engine, path, config, split=split)

        self.tasks.submit(work, lambda r: self._on_verified(model, config, gpus, r), self._on_verify_failed)

    @staticmethod
    def _engine_name(engine: Any) -> str:
        """The engine as the progress line names it (``llama-server b11434``, ``llama.cpp``)."""
        if engine is None or engine.kind == "embedded":
            return "llama.cpp"
        return engine.label.split(" (")[0]

    def _on_verified(self, model: Any, config: PlanConfig, gpus: tuple, result: Any) -> None:
        self.run_controls.verify_button.setEnabled(True)
        if model is not self.model or gpus != tuple(self.hardware.gpus()):
            self.run_controls.set_progress(0.0, "model or hardware changed: verify again")
            return
        self.run_controls.set_progress(1.0, VERIFIED_TEXT)
        who = getattr(result, "engine", "") or "llama.cpp"
        how = getattr(result, "method", "")
        self.status.showMessage(f"verified by {who}" + (f" ({how})" if how else ""), 10000)
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
        if self.attached is not None:
            self.status.showMessage("watching a running server: Run > Detach first", 8000)
            return False
        self.show_error("")
        if self.stale:
            return False
        self.runner.engine = self.engine  # Run uses the engine in use: the embedded child or llama-server
        self.run_events.begin(self.model_path, self._config)
        self.graphs.begin_run(time.monotonic())
        self._last_busy_t = time.monotonic()
        self._set_sampling(fast=True)
        self.runner.start(self.model_path, self._config)
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

    # -- the pull timer ----------------------------------------------------------------------------

    def _follow_available_ram(self, available_bytes: int) -> None:
        """The plan's RAM headroom uses the RAM available now, not at start: when it moved by
        more than :data:`RAM_REPLAN_BYTES` (and no run holds memory), replan with it."""
        h = self.session.host
        if (
            h is None
            or self.fixed_host
            or self.runner.running
            or abs(available_bytes - h.available_bytes) < RAM_REPLAN_BYTES
        ):
            return
        from dataclasses import replace

        self.session.host = replace(h, available_bytes=int(available_bytes))
        self.hardware.set_host(self.session.host)
        if self.model is not None and not self.stale:
            self.replan()

    def _set_sampling(self, fast: bool) -> None:
        """10 Hz sampling and pulling during a run, 1 Hz otherwise."""
        if fast == self._fast:
            return
        self._fast = fast
        self._pull_timer.setInterval(PULL_INTERVAL_MS if fast else IDLE_PULL_INTERVAL_MS)
        if self._own_sampler:
            self.sampler.interval_s = PULL_INTERVAL_MS / 1000 if fast else IDLE_PULL_INTERVAL_MS / 1000

    @property
    def sampling_fast(self) -> bool:
        """Whether the window samples and pulls at the run rate (10 Hz) rather than the idle rate."""
        return self._fast

    def pull(self) -> None:
        """Pull new samples and runner events into the views (the timer calls it: every 100 ms
        during a run, every second otherwise)."""
        if self.runner.running:
            self._last_busy_t = time.monotonic()
        elif self._fast and time.monotonic() - self._last_busy_t > IDLE_AFTER_S:
            self._set_sampling(fast=False)
        host = self.sampler.host_samples(self._last_host_t)
        if host:
            self._last_host_t = host[-1].t_s
            self.graphs.add_host_samples(host)
            self.status.show_host(host[-1])
            self._follow_available_ram(host[-1].available_bytes)
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
        if self.attached is not None:
            for sample in self.attached.drain():
                if self.attached is None:
                    break
                self.attached.show(sample)
        if self.runner.running and time.monotonic() - self.run_events.last_live_t >= LIVE_ADVICE_INTERVAL_S:
            self.update_live()
        self.graphs.refresh()

    # -- attach to a running server ----------------------------------------------------------------

    def open_attach(self) -> AttachDialog | None:
        """Run > Attach: the dialog of servers found; attaches to the one chosen."""
        dialog = AttachDialog(self)
        if dialog.exec() != QtWidgets.QDialog.DialogCode.Accepted:
            return None
        chosen = dialog.chosen()
        if chosen:
            self.attach_to(chosen)
        return dialog

    def attach_to(self, target: Any) -> bool:
        """Watch the running server ``target`` (a URL, a PID, or a found server): its samples are
        drawn by :class:`~kvtuner.gui.attach.AttachedServer`. False while a bench runs."""
        if self.runner.running:
            self.status.showMessage("a bench is running: stop it before attaching", 8000)
            return False
        if self.attached is not None:
            self.detach(quiet=True)
        self.attached = AttachedServer(self, target)
        self.graphs.begin_run(time.monotonic())
        self.graphs.mark_phase(time.monotonic(), "attached")
        self.run_controls.set_progress(None, "attaching ...")
        self.detach_action.setEnabled(True)
        self.run_action.setEnabled(False)
        self.attached.start()
        # the server's process is polled once a second; the samplers follow its RSS and VRAM
        QtCore.QTimer.singleShot(1500, self._follow_attached_pid)
        return True

    def _follow_attached_pid(self) -> None:
        a = self.attached
        if a is None:
            return
        if a.monitor is None and a.running:
            QtCore.QTimer.singleShot(500, self._follow_attached_pid)
            return
        pid = a.monitor.server.pid if a.monitor is not None else None
        if pid:
            self.sampler.set_pid(pid)
        self.status.set_field("runner", f"attached: {a.label}")

    def detach(self, quiet: bool = False, wait_s: float = 0.0) -> None:
        """Stop watching the attached server (the server itself runs on). The polling thread ends
        after its current poll; ``wait_s``: how long to wait for it (0: not on the GUI thread)."""
        a, self.attached = self.attached, None
        if a is None:
            return
        a.stop(wait_s)
        self.sampler.set_pid(self.runner.pid if self.runner.running else None)
        self.graphs.end_run(time.monotonic())
        self.detach_action.setEnabled(False)
        self.run_action.setEnabled(True)
        self.run_events.live_state = None
        self.status.set_field("runner", "runner: idle")
        if not quiet:
            self.run_controls.set_progress(0.0, f"detached from {a.label}")
        self.refresh_advice(running=False)

    @property
    def engine(self) -> Any:
        """The llama.cpp engine in use (:class:`kvtuner.runner.engines.Engine`; the window's selector)."""
        return self.engine_selector.engine

    def _on_engine_changed(self, engine: Any) -> None:
        """Plan for the engine now in use: its build's and program's compute rules
        (:func:`kvtuner.core.plan.build_rules.rules_for`)."""
        from ..core.plan.build_rules import rules_for

        self.session.rules = rules_for(engine.kind, engine.build)
        self.replan()

    # -- tune --------------------------------------------------------------------------------------

    def open_tune(self) -> Any:
        """Open the Tune dialog (non-modal; returned for tests); "Apply" puts its result on the controls."""
        from .tune_panel import TunePanel

        def context() -> tuple:
            s = self._sync_session()
            inputs = s.speed_inputs()[0] if s.model is not None else None
            model = s.planned_model() if s.model is not None else None
            return model, self._config, s.gpus, s.host, inputs

        def apply(config: PlanConfig) -> None:
            self.controls.set_config(config)
            self.controls.show_error(None)
            self.set_config(config)
            self.status.showMessage("applied the tuned configuration", 5000)

        def fit(model: Any, config: PlanConfig, gpus: tuple, host: Any, inputs: Any, goal: Any) -> Any:
            from ..runner.fit_params import fit_choice_for  # llama.cpp's own --fit, on the worker

            return fit_choice_for(engine, path, model, config, gpus, host, inputs, goal, split=split)

        engine, path, split = self.engine, self.model_path, self.session.split
        dlg = TunePanel(context, self.tasks.submit, apply, parent=self, fit=fit if path is not None else None)
        dlg.ctx_spin.setValue(self._config.n_ctx)
        dlg.setAttribute(QtCore.Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.show()
        return dlg

    # -- export ------------------------------------------------------------------------------------

    def open_export(self) -> ExportDialog | None:
        """Open the Export dialog for the current configuration (non-modal; returned for tests)."""
        if self.model_path is None or self.stale:
            return None
        # Save starts where the last export went (else the home folder), never the model cache
        last_dir = self.settings.value("export/dir")
        save_dir = str(last_dir) if last_dir and Path(str(last_dir)).is_dir() else str(Path.home())
        s = self._sync_session()
        rpc = tuple(dict.fromkeys(g.endpoint for g in s.gpus if g.endpoint is not None))  # --rpc, in order
        from ..runner.export_check import build_flags

        engine = self.engine
        dlg = ExportDialog(
            self.model_path,
            self._config,
            model=self.model,
            measured=self.export_measured(),
            machine=self.machine,
            save_dir=save_dir,
            parent=self,
            split=s.split,
            rpc=rpc,
            flags_for=lambda target: build_flags(engine, target),
            extras=s.extras,
        )
        dlg.setAttribute(QtCore.Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.finished.connect(
            lambda *_: dlg.last_saved is not None and self.settings.setValue("export/dir", str(dlg.last_saved.parent))
        )
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

    def showEvent(self, event: QtGui.QShowEvent) -> None:  # noqa: N802 (Qt API)
        super().showEvent(event)
        if not self._split_done:  # the graphs get the height, the advice what its rows need
            self._split_done = True
            self._advice_auto_px = 0
            self._make_room_for_advice()

    def _make_room_for_advice(self) -> None:
        """Size the advice pane to its notes and rows (:meth:`AdvisorPane.needed_height`, at
        least :data:`ADVICE_HEIGHT_PX`, at most :data:`ADVICE_MAX_SHARE` of the column, where
        its rows scroll): it grows when advice comes, and shrinks back when advice goes unless
        the splitter was dragged since."""
        if not self._split_done:
            return
        graphs, advice = self.right_split.sizes()
        total = graphs + advice
        if total <= 0:
            return
        want = max(ADVICE_HEIGHT_PX, min(self.advisor.needed_height(), int(total * ADVICE_MAX_SHARE)))
        if advice < want or (advice > want and advice == self._advice_auto_px):
            self.right_split.setSizes([total - want, want])
            self._advice_auto_px = self.right_split.sizes()[1]

    def closeEvent(self, event: QtGui.QCloseEvent) -> None:  # noqa: N802 (Qt API)
        self.save_settings()
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the run, the sampler and the timers (the window can then be dropped)."""
        self._pull_timer.stop()
        if self.attached is not None:
            self.detach(quiet=True, wait_s=3.0)
        if self.runner.running:
            self.runner.stop()
            self.runner.wait(timeout_s)
        self.sampler.stop()
        self.tasks.shutdown()
