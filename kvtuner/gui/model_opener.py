"""Opening a model or a kvtuner profile in the window (File > Open, the recent list, a drop, the
command line): the header or the profile is read on a worker, then the window shows the model,
replans and starts the probes it needs; an error is shown and the current model stays.

``w`` is the window (:class:`kvtuner.gui.main_window.MainWindow`, which imports this module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6 import QtWidgets

from ..core.export import load_profile
from ..core.model.default_model import default_model_path
from ..core.model.profile import ModelProfile
from ..core.plan.config import PlanConfig
from . import probes

#: What the window opens: GGUF models and kvtuner profiles
OPENABLE_SUFFIXES = (".gguf", ".json")


def choose_and_open(w: Any) -> None:
    """File > Open: a file dialog in the last folder opened from (else home), then :func:`open_path`."""
    start = str(w.app_settings.open_dir())
    path, _ = QtWidgets.QFileDialog.getOpenFileName(
        w,
        "Open a GGUF model or a kvtuner profile",
        start,
        "GGUF models and kvtuner profiles (*.gguf *.json);;GGUF models (*.gguf);;kvtuner profiles (*.json);;"
        "All files (*)",
    )
    if path:
        open_path(w, Path(path))


def open_path(w: Any, path: Path | None) -> None:
    """Open a model, or a kvtuner profile when ``path`` ends in ``.json`` (None: the default model)."""
    if path is not None:
        w.app_settings.set_open_dir(Path(path))
    if path is not None and Path(path).suffix.lower() == ".json":
        open_profile(w, Path(path))
    else:
        open_model(w, path)


def open_model(w: Any, path: Path | None) -> None:
    """Read a model's header in the background (None: the embedded default model).
    Errors are shown in the window; the current model stays."""
    w.status.showMessage(f"reading {path.name if path else 'the default model'} ...")
    w.profile_warnings = ()
    w.advisor.set_notes([])

    def load() -> tuple[Path, ModelProfile]:
        p = Path(path).expanduser() if path is not None else default_model_path()
        return p, ModelProfile.from_gguf(p)

    w.tasks.submit(load, lambda r: _on_model_loaded(w, r), lambda exc, p=path: _on_model_failed(w, p, exc))


def _on_model_loaded(w: Any, result: tuple[Path, ModelProfile]) -> None:
    path, model = result
    w.model, w.model_path = model, Path(path)
    w.session.model = model
    w.session.set_verified(None)  # a dry run of the last model says nothing about this one
    w.run_events.reset_measured()
    w.setWindowTitle(f"kvtuner - {w.model_path.name}")
    w.model_card.set_model(model)
    w.controls.set_model_layers(model.n_layer, model.n_ctx_train, model.n_expert)
    w.planner.apply_effective()
    w.show_error("")
    w.app_settings.add_recent_model(w.model_path)
    w.update_recent_menu()
    w.set_model_open(True)
    w.status.showMessage(f"opened {w.model_path.name}", 5000)
    w.replan()
    w.refresh_known_good()
    probes.structure_if_needed(w)
    probes.cpu_if_needed(w)
    if w.attached is not None:
        w.attached.model_opened()


def _on_model_failed(w: Any, path: Path | None, exc: BaseException) -> None:
    name = path.name if path else "the default model"
    w.show_error(f"Could not open {name}: {exc}")
    w.model_card.show_error(f"Could not open {name}: {exc}")
    w.status.showMessage("model not opened", 5000)


def open_profile(w: Any, path: Path) -> None:
    """Open a kvtuner profile in the background: its configuration goes into the controls
    and its model is opened; warnings (another machine, a changed model file ...) go to the
    status bar and the advice pane. A malformed profile shows one line and changes nothing."""
    path = Path(path)
    w.status.showMessage(f"reading profile {path.name} ...")
    w.tasks.submit(
        lambda: load_profile(path),
        lambda r, p=path: _on_profile_loaded(w, p, r),
        lambda exc, p=path: _on_profile_failed(w, p, exc),
    )


def _on_profile_loaded(w: Any, path: Path, result: tuple[Path, PlanConfig, tuple[str, ...]]) -> None:
    model_path, config, warnings = result
    w.planner.wanted = config
    w.planner.remember = True
    w.planner.apply_effective()
    open_model(w, Path(model_path))
    w.profile_warnings = tuple(warnings)
    w.advisor.set_notes([f"Profile {path.name}: {x}" for x in warnings])
    if warnings:
        w.status.showMessage(
            f"profile {path.name}: {warnings[0]}"
            + (f" (+{len(warnings) - 1} more in the advice pane)" if len(warnings) > 1 else ""),
            15000,
        )
    else:
        w.status.showMessage(f"opened profile {path.name}", 5000)


def _on_profile_failed(w: Any, path: Path, exc: BaseException) -> None:
    text = " ".join(str(exc).split()) or type(exc).__name__
    w.show_error(f"Could not open profile {path.name}: {text}")
    w.status.showMessage("profile not opened", 5000)


def dropped_path(urls: list) -> Path | None:
    """The first dropped file the window opens (a model or a profile), or None."""
    for u in urls:
        if u.toLocalFile().lower().endswith(OPENABLE_SUFFIXES):
            return Path(u.toLocalFile())
    return None
