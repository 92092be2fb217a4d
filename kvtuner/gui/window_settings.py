"""What the window remembers between sessions (:class:`kvtuner.gui.settings.AppSettings`): put
back when it opens, saved when it closes -- geometry, the configuration, the hardware choice,
the switches and the model.

``w`` is the window (:class:`kvtuner.gui.main_window.MainWindow`, which imports this module).
"""

from __future__ import annotations

from typing import Any

from ..core.plan.config import PlanConfig
from ..core.store.library import autosave_enabled


def restore_settings(w: Any, config: PlanConfig | None) -> None:
    """Put the remembered geometry, configuration (unless ``config`` came from the command line),
    hardware choice and switches into ``w``."""
    s = w.app_settings
    geometry = s.geometry()
    if geometry is not None:
        w.restoreGeometry(geometry)
    # a configuration from the command line is this session's; the remembered one stays
    # remembered until the configuration is changed in the window
    w.planner.remember = config is None
    w.planner.wanted = config or s.config() or PlanConfig()
    choice = s.hardware_choice()
    if choice is not None:
        w.hardware.set_choice(*choice)
    w.planner.apply_effective()
    w.advisor.auto_stop.setChecked(s.auto_stop())
    w.known_good.remember.setChecked(s.remember_working_configs())
    if not autosave_enabled():
        w.known_good.remember.setEnabled(False)
        w.known_good.remember.setToolTip("Saving is turned off: KVTUNER_LIBRARY=off in the environment.")


def save_settings(w: Any) -> None:
    """Persist geometry, the configuration (unless it came from the command line and was
    not changed here), the hardware choice, the switches and the model."""
    s = w.app_settings
    s.set_geometry(w.saveGeometry())
    if w.planner.remember:
        s.set_config(w.planner.wanted)
    if w.cli_plan_for is None or w.cli_plan_for[0] != w.hardware.current_choice():
        s.set_hardware_choice(w.hardware.current_choice(), w.hardware.custom_bytes())
    s.set_auto_stop(w.advisor.auto_stop.isChecked())
    s.set_remember_working_configs(w.known_good.remember.isChecked())
    if w.model_path is not None:
        s.set_last_model(w.model_path)
    s.sync()
