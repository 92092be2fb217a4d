"""The engine selector: which llama.cpp build the window plans, verifies, runs and exports for.

A combo box listing :func:`kvtuner.runner.engines.find_engines` (found on a worker thread: each
llama-server is asked for ``--version``, ``--help`` and ``--list-devices``), the engine in use
shown as ``name build (backends)``, and a last entry "Choose llama-server..." that takes a path.
The choice is saved (:meth:`kvtuner.gui.settings.AppSettings.set_engine_choice`) and read again
at the next start (:func:`kvtuner.runner.engines.resolve_engine` with that setting).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6 import QtCore, QtWidgets

from ...runner.engines import Engine, EngineError, embedded_engine, find_engines, resolve_engine, server_engine

#: The combo entry that asks for a path.
CHOOSE_TEXT = "Choose llama-server..."


def _key(e: Engine) -> tuple[str, str]:
    return e.kind, str(e.server.resolve()) if e.server is not None else ""


def _describe(e: Engine) -> str:
    """Tooltip lines: the binary, how it was found, what it printed."""
    lines = [e.label]
    if e.server is not None:
        lines.append(str(e.server))
    lines.append(f"found by: {e.origin}" + (f" ({e.package})" if e.package else ""))
    if e.version_text:
        lines.append(e.version_text)
    for d in e.devices:
        lines.append(f"{d.name}: {d.description} ({d.total_mib} MiB, {d.free_mib} MiB free)")
    if e.kind == "server":
        lines.append("llama-fit-params: " + (str(e.fit_params) if e.fit_params else "not beside it"))
    return "\n".join(lines)


class EngineSelector(QtWidgets.QWidget):
    """Combo box of engines with the one in use; emits :attr:`engine_changed` (the new
    :class:`~kvtuner.runner.engines.Engine`) when the user switches.

    Args:
        submit: ``submit(fn, on_done, on_error)``, the window's background runner.
        settings: the :class:`~kvtuner.gui.settings.AppSettings` that keep the choice (None: not saved).

    :attr:`ask_path` ``() -> path or None`` is the file dialog "Choose llama-server..." opens
    (tests set it). :attr:`error` is the last problem, "" when none.
    """

    engine_changed = QtCore.Signal(object)

    def __init__(
        self, submit: Callable[..., Any], settings: Any = None, parent: QtWidgets.QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._submit, self._settings = submit, settings
        self.engine: Engine = embedded_engine()
        self.engines: list[Engine] = [self.engine]
        self.error = ""
        self.busy = False
        self.ask_path: Callable[[], str | None] = self._ask_path
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.title = QtWidgets.QLabel("Engine")
        self.combo = QtWidgets.QComboBox()
        self.combo.setSizeAdjustPolicy(QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.combo.setToolTip("The llama.cpp build kvtuner plans, verifies, runs and exports for")
        self.title.setBuddy(self.combo)
        lay.addWidget(self.title)
        lay.addWidget(self.combo)
        self._fill()
        self.combo.activated.connect(self._on_activated)

    # -- discovery -----------------------------------------------------------------------------

    def setting(self) -> str | None:
        """The saved choice (``embedded``, ``server``, a path) or None."""
        return self._settings.engine_choice() if self._settings is not None else None

    def refresh(self) -> None:
        """Look for engines on a worker thread; the list and the engine in use follow when done."""
        setting = self.setting()
        self.busy = True

        def work() -> tuple[list[Engine], Engine, str]:
            engines = find_engines(setting, list_devices=False)
            try:
                current = resolve_engine(None, setting)
                why = ""
            except EngineError as exc:  # the saved engine is gone: the default, and say why
                current = resolve_engine(None, None)
                why = f"the saved engine cannot be used ({exc}); using {current.label}"
            return engines, current, why

        self._submit(work, self._found, self._failed)

    def _found(self, payload: tuple[list[Engine], Engine, str]) -> None:
        engines, current, why = payload
        self.busy = False
        self.error = why
        listed = {_key(e): e for e in engines}
        listed[_key(current)] = current  # the one in use carries its devices
        self.engines = list(listed.values())
        self._use(current, save=False)

    def _failed(self, exc: BaseException) -> None:
        self.busy = False
        self.error = f"could not look for llama.cpp engines: {exc}"
        self.combo.setToolTip(self.error)

    # -- choice --------------------------------------------------------------------------------

    def _fill(self) -> None:
        self.combo.blockSignals(True)
        self.combo.clear()
        for e in self.engines:
            self.combo.addItem(e.label + (f"  [{e.origin}]" if e.kind == "server" else ""))
            self.combo.setItemData(self.combo.count() - 1, _describe(e), QtCore.Qt.ItemDataRole.ToolTipRole)
        self.combo.addItem(CHOOSE_TEXT)
        self.combo.setItemData(
            self.combo.count() - 1,
            "Use a llama-server binary of your own (its llama-fit-params "
            "and llama-bench are used when they sit beside it)",
            QtCore.Qt.ItemDataRole.ToolTipRole,
        )
        keys = [_key(e) for e in self.engines]
        self.combo.setCurrentIndex(keys.index(_key(self.engine)) if _key(self.engine) in keys else 0)
        self.combo.blockSignals(False)
        self.combo.setToolTip(_describe(self.engine) + (f"\n{self.error}" if self.error else ""))

    def _use(self, engine: Engine, *, save: bool = True) -> None:
        changed = _key(engine) != _key(self.engine)
        self.engine = engine
        if _key(engine) not in [_key(e) for e in self.engines]:
            self.engines.insert(
                len(self.engines) - 1 if self.engines and self.engines[-1].kind == "embedded" else len(self.engines),
                engine,
            )
        self._fill()
        if save and self._settings is not None:
            self._settings.set_engine_choice("embedded" if engine.kind == "embedded" else str(engine.server))
        if changed:
            self.engine_changed.emit(engine)

    def select(self, index: int) -> None:
        """Use the engine at combo ``index`` (the last entry asks for a path)."""
        self._on_activated(index)

    def _on_activated(self, index: int) -> None:
        if index == self.combo.count() - 1:
            path = self.ask_path()
            if path:
                self.choose_path(path)
            else:
                self._fill()  # back to the engine in use
            return
        if 0 <= index < len(self.engines):
            self.error = ""
            self._use(self.engines[index])

    def choose_path(self, path: str) -> None:
        """Use the llama-server at ``path`` (checked on a worker: it must answer ``--version``);
        a path that is not one leaves the engine as it was and says why in :attr:`error`."""
        self.busy = True

        def done(engine: Engine) -> None:
            self.busy = False
            self.error = ""
            self._use(engine)

        def failed(exc: BaseException) -> None:
            self.busy = False
            self.error = str(exc)
            self._fill()
            self.combo.setToolTip(f"{_describe(self.engine)}\n{self.error}")

        self._submit(lambda: server_engine(path, origin="setting"), done, failed)

    def _ask_path(self) -> str | None:
        path, _ = QtWidgets.QFileDialog.getOpenFileName(
            self, "Choose llama-server", "", "llama-server (llama-server*);;All files (*)"
        )
        return path or None
