"""What the window shows for the model, configuration and hardware: the configuration asked for
and how it applies, refusals with their one-click fixes, and each replan
(:meth:`kvtuner.core.session.Session.assess`) drawn into the prediction, the workload panel,
the graphs' predicted lines and the advice pane.

:class:`PlanPresenter` keeps the configuration asked for (:attr:`PlanPresenter.wanted`) and the
one that applies (:attr:`PlanPresenter.config`); the window's controls, hardware panel, device
list and extras panel are wired to it (:mod:`kvtuner.gui.main_window`).
"""

from __future__ import annotations

import time
from typing import Any

from ..core.plan.config import ConfigError, PlanConfig
from ..core.session import Assessment, Session
from ..core.units import fmt_bytes
from .config_state import effective_config, fix_for_error, fix_wording, gui_wording
from .verify import VERIFIED_TEXT


class PlanPresenter:
    """The window's configuration and its plan.

    Args:
        window: the :class:`~kvtuner.gui.main_window.MainWindow` it serves.

    Attributes:
        wanted: the last valid configuration asked for, with the values of controls that do not
            apply kept (they come back when they apply again).
        config: the configuration shown, planned, run and exported: :attr:`wanted` as it applies
            to the hardware planned for (:func:`kvtuner.gui.config_state.effective_config`).
        remember: whether :attr:`wanted` is saved for the next session (a configuration from
            the command line is not, until it is changed in the window).
    """

    def __init__(self, window: Any) -> None:
        self.w = window
        self.wanted = PlanConfig()
        self.config = PlanConfig()
        self.remember = True
        self._tooltips: dict[Any, str] = {}

    # -- the configuration -----------------------------------------------------------------------

    def apply_effective(self) -> None:
        """Derive the effective configuration from the one asked for and show it in the controls."""
        w = self.w
        n_layer = w.model.n_layer if w.model is not None else 0
        eff = effective_config(self.wanted, n_layer, w.hardware.gpus())
        self.config = eff.config
        w.controls.set_config(self.wanted, eff.config, eff.not_applicable)

    def set_config(self, config: PlanConfig) -> None:
        """Make ``config`` the one asked for (a change made in the window: remembered), show
        how it applies to the hardware and replan."""
        self.wanted = config
        self.remember = True
        self.apply_effective()
        self.replan()

    def show_refusal(self, message: str, values: dict | None = None) -> None:
        """A refused combination: say why in the window's words, offer the one-click fix when
        there is one, keep the last valid plan marked stale and block Run and Export."""
        w = self.w
        fix = fix_for_error(message, values if values is not None else w.controls.values())
        text = gui_wording(message)
        w.controls.show_error(text, fix)
        w.stale = text
        w.prediction.set_stale(text)
        w.advisor.setEnabled(False)
        for widget in (w.run_controls.run_button, w.run_action, w.export_action):
            self._tooltips.setdefault(widget, widget.toolTip())
            widget.setEnabled(False)
            widget.setToolTip(f"Change the configuration first: {text}")

    def clear_refusal(self) -> None:
        """The configuration is valid again: the plan is current, Run and Export come back."""
        w = self.w
        if not w.stale:
            return
        w.stale = ""
        w.controls.show_error(None)
        w.prediction.set_stale(None)
        w.advisor.setEnabled(True)
        w.run_controls.set_running(w.runner.running)
        for action in (w.run_action, w.export_action):
            action.setEnabled(True)
        for widget, tip in self._tooltips.items():
            widget.setToolTip(tip)

    def on_controls_changed(self) -> None:
        """A control moved: plan its configuration, or say why it is refused."""
        w = self.w
        values = w.controls.values()
        try:
            config = w.controls.config()
        except ConfigError as exc:
            self.show_refusal(str(exc), values)
            return
        if w.controls.resolved_notes:  # llama-server defaults, shown resolved
            w.status.showMessage(gui_wording("; ".join(w.controls.resolved_notes)), 8000)
        self.set_config(config)

    def on_fix_requested(self, changes: dict) -> None:
        """The one-click fix of a refused combination: the controls' values with ``changes``."""
        w = self.w
        try:
            config = w.controls.config(changes)
        except ConfigError as exc:
            self.show_refusal(str(exc))
            return
        self.set_config(config)
        w.status.showMessage("fixed: " + w.controls.fix_button.text().lower(), 5000)

    def on_hardware_changed(self) -> None:
        """The hardware planned for changed (card, RAM, device list): apply and replan."""
        self.apply_effective()
        self.replan()

    def apply_fix(self, fix: dict) -> None:
        """Apply an advice's fix (PlanConfig changes) and replan."""
        try:
            config = self.wanted.with_(**fix)
        except (ConfigError, TypeError) as exc:
            self.show_refusal(f"cannot apply this fix: {exc}")
            return
        self.set_config(config)
        self.w.status.showMessage("applied: " + fix_wording(fix), 5000)

    def reset_to_defaults(self) -> None:
        """Put llama.cpp's defaults (:class:`~kvtuner.core.plan.config.PlanConfig`) into the
        controls and replan (File > Reset configuration to defaults)."""
        self.set_config(PlanConfig())
        self.w.status.showMessage("configuration reset to the defaults", 5000)

    def on_engine_changed(self, engine: Any) -> None:
        """Plan for the engine now in use: its build's and program's compute rules
        (:func:`kvtuner.core.plan.build_rules.rules_for`)."""
        from ..core.plan.build_rules import rules_for

        self.w.session.rules = rules_for(engine.kind, engine.build)
        self.replan()

    # -- the session -----------------------------------------------------------------------------

    def sync_session(self) -> Session:
        """The session, told the model, configuration and hardware shown."""
        w = self.w
        s = w.session
        s.model = w.model
        s.config = self.config
        if s.host is not None:
            s.host = w.hardware.host_for(s.host)
        w.devices.set_base(w.hardware.gpus())
        s.gpus = tuple(w.devices.devices())
        try:
            s.split = w.devices.split()
        except ConfigError:
            pass  # the panel shows why; the last valid split stays
        s.extras = self._checked_extras()
        return s

    def _checked_extras(self) -> Any:
        """The extras panel's files when llama-server would take them with this model (the
        session counts them in every plan), else None with the reason in the panel."""
        from ..core.plan.extras import check_files

        w = self.w
        extras = w.extras_panel.extras()
        if extras.empty or w.model is None:
            return None
        try:
            check_files(extras, w.model)
        except ConfigError as exc:
            w.extras_panel.show_result(str(exc), error=True)
            return None
        return extras

    def _live_for_advice(self) -> Any:
        ev = self.w.run_events
        return ev.live_state if ev.live_applies() else None

    def _assess(self) -> Assessment:
        return self.sync_session().assess(live=self._live_for_advice())

    # -- showing a plan --------------------------------------------------------------------------

    def replan(self) -> None:
        """Plan, predict speed and advise for the current model, configuration and hardware
        (:meth:`Session.assess`) and show it."""
        w = self.w
        if w.model is None:
            w.prediction.set_plan(None)
            return
        t0 = time.perf_counter()
        try:
            a = self._assess()
        except ConfigError as exc:
            self.show_refusal(str(exc))
            return
        self.clear_refusal()
        w.assessment = a
        plan, speed = a.plan, a.speed
        verified = a.verified
        if verified is None and w.run_controls.progress.format() == VERIFIED_TEXT:
            w.run_controls.set_progress(0.0, "not verified for this configuration")
        w.extras_plan = self._plan_extras(plan)
        w.prediction.set_plan(plan, speed, verified, speed_error=a.speed_error, margins=a.margins, extras=w.extras_plan)
        gpu_specs = w.hardware.gpus()
        w.workload.set_plan(plan, gpu_specs[0].mem_bandwidth_bytes_s if gpu_specs else None)
        self.show_advice()
        self._show_predicted_lines(plan, speed)
        w.replan_ms = (time.perf_counter() - t0) * 1000

    def _plan_extras(self, plan: Any) -> Any:
        """The projector / draft / LoRA the session planned beside ``plan`` (None without them),
        summed up in the extras panel."""
        panel = self.w.extras_panel
        xp = getattr(plan, "extras", None)
        if xp is None:
            if panel.extras().empty:
                panel.show_result("")
            # else a refused file: _checked_extras left the reason in the panel
            return None
        parts = ", ".join(f"{p} {fmt_bytes(xp.part_bytes(p))}" for p in ("mmproj", "draft", "lora") if xp.part_bytes(p))
        panel.show_result(f"adds {parts}" + (f"; one image takes {xp.image_tokens} tokens" if xp.image_tokens else ""))
        return xp

    def _show_predicted_lines(self, plan: Any, speed: Any) -> None:
        """The graphs' dashed lines: predicted for the hardware the runs measure (this machine),
        labelled with it; a plan for a what-if card draws none (the runs measure this machine,
        not the card) and the graphs' title says so."""
        w = self.w
        gpus = list(w.session.gpus)  # the cards planned for, with the device list's
        what_if = [g for g in gpus if g.what_if]
        if what_if:
            w.graphs.set_predicted([], [])
            w.graphs_box.setTitle(
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
        w.graphs.set_predicted(memory, speeds)
        w.graphs_box.setTitle(
            f"Live: memory and speed on {where} (dashed: predicted; solid: measured; dotted: run phases)"
        )

    def show_advice(self, running: bool | None = None) -> None:
        """The advice of the plan shown, live while a run feeds it."""
        w = self.w
        if w.assessment is None:
            return
        live = self._live_for_advice() is not None
        running = w.runner.running if running is None else running
        w.advisor.set_advice(list(w.assessment.advice), live=live and running)

    def refresh_advice(self, running: bool | None = None) -> None:
        """Advise again with the running model's latest state (the live advice timer)."""
        w = self.w
        if w.model is None or w.assessment is None:
            return
        try:
            w.assessment = self._assess()
        except ConfigError:
            return
        self.show_advice(running)
