"""The Known good list of the window: the working configurations the library holds for the model
shown on this machine (read and deleted on a worker thread), and restoring one into the controls."""

from __future__ import annotations

from typing import Any

from ..core.export import ModelIdentity
from ..core.store.library import ConfigLibrary


class WorkingConfigs:
    """Fills the Known good panel of ``window`` (the :class:`~kvtuner.gui.main_window.MainWindow`)
    and acts on its buttons."""

    def __init__(self, window: Any) -> None:
        self.w = window
        self._seq = 0  # the latest reload: an older one that finishes later is dropped

    def refresh(self) -> None:
        """Reload the Known good list for the current model on this machine (worker thread)."""
        w = self.w
        model = w.model
        if model is None:
            w.known_good.set_runs([])
            return
        self._seq += 1
        seq, machine = self._seq, w.machine

        def work() -> list:
            with ConfigLibrary() as lib:
                return lib.known_good(ModelIdentity.from_profile(model), machine, limit=50)

        def done(runs: list) -> None:
            if seq == self._seq and w.model is model:
                w.known_good.set_runs(runs)

        def failed(exc: BaseException) -> None:
            if seq == self._seq:
                w.known_good.set_runs([], empty_text=f"Cannot read the library: {exc}")

        w.tasks.submit(work, done, failed)

    def delete(self, run_ids: list) -> None:
        """Delete saved runs from the library (worker thread), then reload the list."""
        w = self.w
        ids = [int(i) for i in run_ids]

        def work() -> int:
            with ConfigLibrary() as lib:
                return sum(bool(lib.delete(i)) for i in ids)

        def done(n: int) -> None:
            w.status.showMessage(f"deleted {n} saved run{'s' if n != 1 else ''}", 5000)
            self.refresh()

        w.tasks.submit(work, done, lambda exc: w.show_error(f"Could not delete: {exc}"))

    def restore(self, saved: Any) -> None:
        """Put a saved working configuration (a WorkingConfig or a PlanConfig) into the controls."""
        w = self.w
        config = getattr(saved, "config", saved)
        w.set_config(config)
        what = f"id {saved.id}, " if hasattr(saved, "id") else ""
        tok = saved.measured.get("decode_tok_s") if hasattr(saved, "measured") else None
        w.status.showMessage(
            f"restored a working configuration ({what}"
            + (f"{tok:.1f} tok/s decode" if tok is not None else "no decode figure")
            + ")",
            8000,
        )
