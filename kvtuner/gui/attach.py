"""Run > "Attach to a running server": the window watches a llama-server (or Ollama) someone else
started, as it watches a run of its own.

:class:`AttachedServer` runs a :class:`~kvtuner.runner.attach_monitor.Monitor` on its own thread
(one poll a second; the HTTP requests never block the window) and queues its samples; the
window's pull timer hands them to :meth:`AttachedServer.show`, which draws the measured decode
and prefill tok/s in the speed graph, the context fill as the KV bytes holding tokens (the plan's
KV cache times the share of the slots' cells in use) in the memory graph, points the samplers at the server's process (its RSS and
VRAM become the graphs' "runner" curves), opens the model and configuration its command line
gives (so the prediction, the dashed predicted lines and the advice are kvtuner's plan for
exactly that configuration), shows the context fill of the fullest slot in the progress bar,
feeds the live advice, and puts each problem the monitor reports on the status bar in one line.

:class:`AttachDialog` lists the servers found on this machine
(:func:`kvtuner.runner.attach.find_servers`, on a worker) and takes a URL or PID.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from PySide6 import QtWidgets

from ..cli.args import config_from_server_argv
from ..core.monitor.live import LiveState
from ..runner.attach import AttachError, FoundServer, find_servers
from ..runner.attach_monitor import Monitor

log = logging.getLogger("kvtuner.gui")


class AttachedServer:
    """One attached server and its polling thread.

    Args:
        window: the :class:`~kvtuner.gui.main_window.MainWindow`.
        target: a URL or PID (see :func:`kvtuner.runner.attach_monitor.resolve_target`), or a
            :class:`~kvtuner.runner.attach.FoundServer` from the dialog's list.
    """

    def __init__(self, window: Any, target: str | FoundServer) -> None:
        self.window = window
        self.target = target
        self.monitor: Monitor | None = None
        self.samples: queue.Queue[dict] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="kvtuner-attach", daemon=True)
        self.error = ""
        self.latest: dict | None = None
        self.n_samples = 0
        self._applied = False
        self.pending_config: Any = None
        self._below_since: float | None = None

    @property
    def label(self) -> str:
        """What is attached, for the status bar."""
        m = self.monitor
        if m is None:
            return str(getattr(self.target, "url", self.target))
        return f"{m.kind} {m.server.url}" + (f" (pid {m.server.pid})" if m.server.pid else "")

    def start(self) -> None:
        """Start polling (the target is resolved on the thread: a scan or a URL may take a moment)."""
        self._thread.start()

    def stop(self, timeout_s: float = 3.0) -> None:
        """Stop polling; wait up to ``timeout_s`` for the thread (it ends after its current poll:
        a few 1.5 s timeouts at most)."""
        self._stop.set()
        if timeout_s > 0 and self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """Whether the polling thread is alive."""
        return self._thread.is_alive()

    def _work(self) -> None:
        try:
            if isinstance(self.target, FoundServer):
                self.monitor = Monitor(self.target, parse_argv=config_from_server_argv)
            else:
                self.monitor = Monitor.attach(self.target, parse_argv=config_from_server_argv)
        except AttachError as exc:
            self.error = str(exc)
            self.samples.put({"type": "error", "message": str(exc)})
            return
        except Exception as exc:  # never a traceback in the window
            log.exception("attach failed")
            self.error = f"cannot attach: {exc}"
            self.samples.put({"type": "error", "message": self.error})
            return
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.samples.put(self.monitor.step())
            except Exception as exc:  # a bug must not end the watch silently
                log.exception("attach poll failed")
                self.samples.put({"type": "error", "message": f"poll failed: {exc}", "keep": True})
            next_t += 1.0
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def drain(self) -> list[dict]:
        """Samples queued since the last call."""
        out = []
        while True:
            try:
                out.append(self.samples.get_nowait())
            except queue.Empty:
                return out

    # -- the window --------------------------------------------------------------------------------

    def show(self, sample: dict) -> None:
        """Draw one sample in the window (GUI thread)."""
        w = self.window
        if sample.get("type") == "error":
            w.status.showMessage(f"attach: {sample['message']}", 15000)
            w.run_controls.set_progress(0.0, f"not attached: {sample['message']}"[:120])
            if not sample.get("keep"):
                w.detach(quiet=True)
            return
        self.latest = sample
        self.n_samples += 1
        m = self.monitor
        t = float(sample["t_s"])
        if m is not None and m.kind == "ollama":
            self._show_ollama(sample)
            return
        if not self._applied and m is not None and (m.config is not None or m.notes):
            self._applied = True
            self._apply_plan(m)
        if sample.get("decode_tok_s") is not None:
            w.graphs.add_decode(t, float(sample["decode_tok_s"]))
            w.status.set_field("decode", f"decode {sample['decode_tok_s']:.1f} tok/s")
        if sample.get("prefill_tok_s") is not None:
            w.graphs.add_prefill(t, float(sample["prefill_tok_s"]))
        slots = sample.get("slots") or []
        plan = w.plan
        cells = sum(sl["n_ctx"] for sl in slots)
        if plan is not None and cells and sample["state"] == "ok":
            # the share of the KV cells that hold tokens, in bytes of the plan's KV cache
            w.graphs.add_context(t, plan.kv_bytes * sum(sl["tokens"] for sl in slots) / cells)
        fullest = max(slots, key=lambda s: s["tokens"] / s["n_ctx"] if s["n_ctx"] else 0, default=None)
        if sample["state"] == "ok" and fullest is not None:
            fill = fullest["tokens"] / fullest["n_ctx"] if fullest["n_ctx"] else 0.0
            rate = sample.get("decode_tok_s")
            pred = (sample.get("predicted") or {}).get("decode_tok_s_now")
            text = (
                f"attached: context {fullest['tokens']}/{fullest['n_ctx']} ({fill:.0%}), decode {rate:.1f} tok/s"
                if rate is not None
                else f"attached: context {fullest['tokens']}/{fullest['n_ctx']} ({fill:.0%})"
            )
            if pred is not None:
                text += f" (predicted {pred:.1f})"
            w.run_controls.set_progress(fill, text)
        elif sample["state"] != "ok":
            w.run_controls.set_progress(0.0, f"attached: server {sample['state']}")
        lines = [*sample.get("problems", ()), *sample.get("notes", ())]
        if lines:
            w.status.showMessage(f"{self.label}: " + "; ".join(lines), 10000)
        self._live(sample)

    def _apply_plan(self, m: Monitor) -> None:
        """Open the server's model with its configuration (kvtuner's plan for it)."""
        w = self.window
        for note in m.notes:
            w.status.showMessage(f"attach: {note}", 15000)
        if m.not_understood:
            w.status.showMessage("attach: not understood on its command line: " + "; ".join(m.not_understood), 15000)
        if m.config is None:
            return
        path = Path(m.model_path) if m.model_path else None
        if path is not None and path.is_file() and path != w.model_path:
            self.pending_config = m.config
            w.open_model(path)  # the configuration follows in model_opened()
        else:
            w.set_config(m.config)

    def model_opened(self) -> None:
        """The window opened the server's model: now show its configuration."""
        if self.pending_config is not None:
            cfg, self.pending_config = self.pending_config, None
            self.window.set_config(cfg)

    def _live(self, sample: dict) -> None:
        """The live advice from this sample (decode speed, host RAM and swap, the process's VRAM)."""
        w = self.window
        if w.model is None or w.model_path is None:
            return
        from ..core.speed.speed_model import ABANDON_TOK_S

        rate = sample.get("decode_tok_s")
        t = float(sample["t_s"])
        if rate is not None:
            self._below_since = (self._below_since or t) if rate < ABANDON_TOK_S else None
        host = sample.get("host") or {}
        procs = w.sampler.gpu_processes() if hasattr(w.sampler, "gpu_processes") else ()
        pid = self.monitor.server.pid if self.monitor is not None else None
        ev = w.run_events
        ev.run_config, ev.run_model_path = w.config, w.model_path
        ev.live_state = LiveState(
            total_ram_bytes=host.get("total_bytes"),
            available_ram_bytes=host.get("available_bytes"),
            swap_in_bytes_s=host.get("swap_in_bytes_s"),
            decode_tok_s=rate,
            below_abandon_s=(t - self._below_since) if self._below_since is not None else 0.0,
            gpu_processes=tuple(procs),
            own_pids=tuple(p for p in (pid,) if p),
        )
        w.refresh_advice(running=True)

    def _show_ollama(self, sample: dict) -> None:
        w = self.window
        if sample["state"] != "ok":
            w.run_controls.set_progress(0.0, f"attached: Ollama {sample['state']}")
            w.status.showMessage(f"{self.label}: " + "; ".join(sample.get("problems", ())), 10000)
            return
        models = sample.get("models") or []
        if not models:
            w.run_controls.set_progress(0.0, "attached: Ollama holds no model")
            return
        mm = models[0]
        share = mm["vram_bytes"] / mm["size_bytes"] if mm["size_bytes"] else 0.0
        w.run_controls.set_progress(
            share,
            f"attached: Ollama {mm['name']}, ctx {mm['context_length']}, "
            f"{mm['size_bytes'] / (1 << 30):.1f} GiB ({share:.0%} in VRAM)",
        )
        if not self._applied and mm.get("blob") and mm.get("context_length"):
            self._applied = True
            from ..core.plan.config import PlanConfig

            self.pending_config = PlanConfig(n_ctx=int(mm["context_length"]))
            w.open_model(Path(mm["blob"]))


class AttachDialog(QtWidgets.QDialog):
    """The servers found on this machine, and a field for a URL or PID."""

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.setWindowTitle("Attach to a running server")
        self.window_ = window
        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(
            QtWidgets.QLabel(
                "llama-server processes and servers answering on 127.0.0.1:8080, :9931 and Ollama's :11434:"
            )
        )
        self.list = QtWidgets.QListWidget()
        self.list.itemDoubleClicked.connect(lambda *_: self.accept())
        self.list.currentRowChanged.connect(self._on_row)
        layout.addWidget(self.list, 1)
        form = QtWidgets.QFormLayout()
        self.target = QtWidgets.QLineEdit()
        self.target.setPlaceholderText("http://127.0.0.1:8080 or a PID")
        form.addRow("URL or PID:", self.target)
        layout.addLayout(form)
        self.note = QtWidgets.QLabel("looking for servers ...")
        layout.addWidget(self.note)
        buttons = QtWidgets.QDialogButtonBox(QtWidgets.QDialogButtonBox.StandardButton.Cancel)
        self.attach_button = buttons.addButton("&Attach", QtWidgets.QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.found: list[FoundServer] = []
        self.resize(560, 320)
        window.tasks.submit(find_servers, self.set_found, self._scan_failed)

    def set_found(self, found: list[FoundServer]) -> None:
        """Show the servers found."""
        self.found = list(found)
        self.list.clear()
        for s in self.found:
            self.list.addItem(s.label)
        self.note.setText(f"{len(self.found)} found" if self.found else "none found: give a URL or PID")
        if self.found:
            self.list.setCurrentRow(0)

    def _scan_failed(self, exc: BaseException) -> None:
        self.note.setText(f"the scan failed ({exc}): give a URL or PID")

    def _on_row(self, row: int) -> None:
        if 0 <= row < len(self.found):
            self.target.setText(self.found[row].url)

    def chosen(self) -> str | FoundServer | None:
        """The server chosen: the list's entry when the field still shows its URL, else the text."""
        text = self.target.text().strip()
        row = self.list.currentRow()
        if 0 <= row < len(self.found) and text == self.found[row].url:
            return self.found[row]
        return text or None


__all__ = ["AttachDialog", "AttachedServer"]
