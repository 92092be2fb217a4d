"""An attached server beside kvtuner's plan for it: what ``kvtuner monitor`` prints and what the
window's "Attach to a running server" graphs.

:class:`Monitor` resolves a target (a URL, a PID, or nothing: the one server found), reads the
process's command line into a :class:`~kvtuner.core.plan.config.PlanConfig` with the parser its
caller hands in (the CLI's configuration catalogue: :func:`kvtuner.cli.args.config_from_server_argv`;
the engine code never imports the CLI), plans it with a
:class:`~kvtuner.core.session.Session` on this machine's hardware, and then, per
:meth:`Monitor.step`, joins one poll of the server (:class:`~kvtuner.runner.attach.ServerWatcher`)
with the process's RSS, swap and VRAM (:func:`~kvtuner.runner.attach.process_stats`), the host's
RAM and swap-in rate, and the live advice (:class:`~kvtuner.core.monitor.live.LiveState`:
measured decode speed against the abandon line, swap, VRAM headroom).

The predicted decode speed "now" is the speed model's curve at the deepest slot's tokens;
"at full context" its value at the slot's whole window (``decode_tok_s_at_full_ctx``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .attach import (
    AttachError,
    FoundServer,
    OllamaWatcher,
    ServerSample,
    ServerWatcher,
    find_servers,
    is_ollama,
    normalize_url,
    pid_listening_on,
    process_argv,
    process_stats,
    server_argv_value,
    url_of_argv,
)

#: Seconds between two assessments with live advice (plan + speed + advice: milliseconds, but
#: no need to do it on every poll).
ADVICE_INTERVAL_S = 5.0


def _interp(curve: Any, depth: int) -> float | None:
    """The speed curve's decode tok/s at ``depth`` (linear between its points)."""
    pts = [(int(d), float(v)) for d, v in curve or ()]
    if not pts:
        return None
    if depth <= pts[0][0]:
        return pts[0][1]
    for (d0, v0), (d1, v1) in zip(pts, pts[1:]):
        if d0 <= depth <= d1:
            return v0 if d1 == d0 else v0 + (v1 - v0) * (depth - d0) / (d1 - d0)
    return pts[-1][1]


def resolve_target(target: str | None) -> FoundServer:
    """The server ``target`` names: a PID (digits), a URL (``http://127.0.0.1:8080``,
    ``127.0.0.1:8080``), or None for the one server found on this machine.

    Raises:
        AttachError: nothing there, or several servers found without a target (the message
            lists them).
    """
    if target is None:
        found = find_servers()
        servers = [s for s in found if s.kind == "llama-server"] or found
        if not servers:
            raise AttachError(
                "no running llama-server or Ollama found on this machine: give its URL (http://127.0.0.1:PORT) or PID"
            )
        if len(servers) > 1:
            raise AttachError(
                "several servers found: give one of "
                + "; ".join(f"{s.url}" + (f" or {s.pid}" if s.pid else "") for s in servers)
            )
        return servers[0]
    t = target.strip()
    if t.isdigit():
        pid = int(t)
        argv = process_argv(pid)
        exe = os.path.basename(argv[0]) if argv else ""
        if "ollama" in exe:
            return FoundServer("ollama", normalize_url(os.environ.get("OLLAMA_HOST", "127.0.0.1:11434")), pid, argv)
        if not any("llama-server" in a for a in argv[:2]):
            raise AttachError(
                f"process {pid} is not a llama-server ({exe or 'no command line'}): "
                "give the PID of a llama-server, or its URL"
            )
        return FoundServer("llama-server", url_of_argv(argv), pid, argv)
    url = normalize_url(t)
    if url.endswith(":11434") or is_ollama(url):
        return FoundServer("ollama", url)
    listening = pid_listening_on(url)
    argv = process_argv(listening) if listening else ()
    return FoundServer("llama-server", url, listening, argv)


class Monitor:
    """One attached server, planned. Construct with :meth:`attach`; call :meth:`step` about once a
    second (it sleeps to keep :data:`~kvtuner.runner.attach.MIN_INTERVAL_S`); never raises after
    construction.

    Attributes:
        server: what was attached (URL, PID, command line).
        config: the configuration parsed from the command line (or from ``/props`` when the
            process is not local); None for Ollama.
        not_understood: command-line arguments kvtuner does not know.
        resolved: llama-server defaults as resolved (``-c 0`` -> the training context ...).
        session: the plan of ``config`` on this machine (None when the model file is not readable).
        assessment: the latest :class:`~kvtuner.core.session.Assessment` (with live advice).
        notes: lines worth telling once (why there is no plan ...).
    """

    def __init__(
        self,
        server: FoundServer,
        *,
        api_key: str | None = None,
        plan: bool = True,
        router_model: str = "",
        parse_argv: Callable[..., Any] | None = None,
    ) -> None:
        #: ``parse_argv(argv, model=profile) -> (config, namespace, not_understood)``, raising
        #: ValueError or the caller's own error for a configuration llama.cpp would refuse; None:
        #: the command line is not read (the configuration comes from ``/props``)
        self._parse_argv = parse_argv
        self.server = server
        self.kind = server.kind
        self.notes: list[str] = []
        self.config: Any = None
        self.not_understood: list[str] = []
        self.resolved: list[str] = []
        self.session: Any = None
        self.assessment: Any = None
        self.model_path = ""
        self.threads: int | None = None
        self._advice_t = -float("inf")
        self._host_prev: tuple[float, int] | None = None
        self._below_since: float | None = None
        key = api_key or (server_argv_value(server.argv, ("--api-key",)) if server.argv else "") or None
        if self.kind == "ollama":
            self.watcher: Any = OllamaWatcher(server.url)
        else:
            self.watcher = ServerWatcher(server.url, api_key=key, model=router_model)
        self._want_plan = plan
        self._planned = False

    @classmethod
    def attach(cls, target: str | None, **kwargs: Any) -> Monitor:
        """Resolve ``target`` (:func:`resolve_target`) and attach.

        Raises:
            AttachError: see :func:`resolve_target`.
        """
        return cls(resolve_target(target), **kwargs)

    # -- configuration and plan -----------------------------------------------------------------

    def _model_file(self, props_path: str) -> str:
        m = server_argv_value(self.server.argv, ("-m", "--model")) if self.server.argv else ""
        if m and not os.path.isabs(m) and self.server.pid:
            try:
                import psutil

                m = os.path.join(psutil.Process(self.server.pid).cwd(), m)
            except Exception:
                pass
        return m or props_path

    def _plan(self, sample: ServerSample) -> None:
        """Parse the command line (or ``/props``) and plan it, once the server has answered."""
        self._planned = True
        from ..core.model.profile import GGUFError, ModelProfile
        from ..core.plan.config import PlanConfig

        self.model_path = self._model_file(sample.model_path)
        profile = None
        if self.model_path and os.access(self.model_path, os.R_OK):
            try:
                profile = ModelProfile.from_gguf(Path(self.model_path))
            except (GGUFError, OSError, ValueError) as exc:
                self.notes.append(f"no plan: cannot read {self.model_path} ({exc})")
        elif self.model_path:
            self.notes.append(f"no plan: the model file {self.model_path} is not readable here")
        else:
            self.notes.append("no plan: the server does not say which model file it serves")
        try:
            if self.server.argv and self._parse_argv is not None:
                cfg, ns, self.not_understood = self._parse_argv(self.server.argv, model=profile)
                self.resolved = list(getattr(ns, "resolved_notes", ()))
                t = ns.server_threads
                self.threads = int(t) if t and str(t).lstrip("-").isdigit() and int(t) > 0 else None
            elif sample.total_slots and sample.n_ctx_slot:
                cfg = PlanConfig(n_ctx=sample.n_ctx_slot * sample.total_slots, n_seq=sample.total_slots)
                self.notes.append(
                    "not a local process: the configuration is read from /props "
                    "(context and slots; the rest at llama-server's defaults)"
                )
            else:
                cfg = None
        except Exception as exc:  # the parser's refusal (ConfigError, the CLI's UserError): a note, not a crash
            self.notes.append(f"no plan: {exc}")
            cfg = None
        self.config = cfg
        if cfg is None or profile is None or not self._want_plan:
            return
        from ..core.hardware.host import detect_host
        from ..core.hardware.nvml import detect_gpus
        from ..core.session import Session

        gpus = tuple(detect_gpus())
        self.session = Session(
            model=profile, config=cfg, gpus=gpus, host=detect_host(), detected_gpus=gpus, n_threads=self.threads
        )
        self._assess(None)

    def _assess(self, live: Any) -> None:
        from ..core.plan.config import ConfigError

        try:
            self.assessment = self.session.assess(live=live)
        except (ConfigError, ValueError) as exc:
            self.notes.append(f"no plan: {exc}")
            self.session = None

    def _plan_ollama(self, m: dict[str, Any]) -> dict[str, Any] | None:
        """kvtuner's plan for one model Ollama holds (its blob at its ``context_length``, one
        sequence, Ollama's other settings unknown and left at llama.cpp's defaults), cached by
        digest; None when the blob is not readable here or not a GGUF kvtuner can read."""
        cache: dict[str, Any] = self.__dict__.setdefault("_ollama_plans", {})
        key = f"{m.get('digest')}|{m.get('context_length')}"
        if key in cache:
            return cache[key]
        plan = None
        if m.get("blob"):
            from ..core.hardware.host import detect_host
            from ..core.hardware.nvml import detect_gpus
            from ..core.model.profile import GGUFError, ModelProfile
            from ..core.plan.config import ConfigError, PlanConfig
            from ..core.session import Session

            try:
                profile = ModelProfile.from_gguf(Path(m["blob"]))
                cfg = PlanConfig(n_ctx=int(m["context_length"] or 4096))
                gpus = tuple(detect_gpus())
                a = Session(model=profile, config=cfg, gpus=gpus, host=detect_host(), detected_gpus=gpus).assess()
                plan = {
                    "config": cfg.to_dict(),
                    "total_bytes": sum(d.total_bytes for d in a.plan.devices),
                    "gpu_bytes": sum(d.total_bytes for d in a.plan.gpus),
                    "host_bytes": a.plan.host.total_bytes,
                    "kv_bytes": a.plan.kv_bytes,
                    "decode_tok_s": a.speed.decode_tok_s if a.speed is not None else None,
                    "decode_tok_s_at_full_ctx": a.speed.decode_tok_s_at_full_ctx if a.speed is not None else None,
                }
            except (GGUFError, ConfigError, OSError, ValueError) as exc:
                plan = {"error": str(exc)}
        cache[key] = plan
        return plan

    def header(self) -> dict[str, Any]:
        """What was attached and kvtuner's plan for it (the first ``--json`` line)."""
        return {
            "type": "attached",
            "kind": self.kind,
            "url": self.server.url,
            "pid": self.server.pid,
            "argv": list(self.server.argv),
            "model_path": self.model_path,
            "config": self.config.to_dict() if self.config is not None else None,
            "not_understood": list(self.not_understood),
            "resolved": list(self.resolved),
            "plan": self.assessment.to_dict() if self.assessment is not None else None,
            "notes": list(self.notes),
        }

    # -- sampling -------------------------------------------------------------------------------

    def _host(self, now: float) -> tuple[int, int, float | None]:
        from ..core.hardware.host import read_host_counters

        total, avail, _swap, sin, _sout = read_host_counters()
        rate = None
        if self._host_prev is not None and now > self._host_prev[0]:
            rate = max(0, sin - self._host_prev[1]) / (now - self._host_prev[0])
        self._host_prev = (now, sin)
        return total, avail, rate

    def step(self) -> dict[str, Any]:
        """One poll: the server's sample, the process, the host, the prediction and the advice
        (a ``"sample"`` JSON object; keys in docs/how-to/monitor.md)."""
        s = self.watcher.poll()
        out = {"type": "sample", **s.to_dict()}
        if self.kind == "ollama":
            for m in out["models"]:
                m["planned"] = self._plan_ollama(m)
            return out
        if any("now serves" in n or "answers again" in n or "restarted" in n for n in s.notes):
            # another process, perhaps another model and configuration: read them again
            pid = pid_listening_on(self.server.url)
            try:
                argv = process_argv(pid) if pid else ()
            except AttachError:
                argv = ()
            self.server = FoundServer(self.server.kind, self.server.url, pid, argv)
            self._planned, self.session, self.assessment, self.config = False, None, None, None
            self.notes = []
        if not self._planned and s.state == "ok":
            self._plan(s)
        now = s.t_s
        total, avail, swap_in = self._host(now)
        out["host"] = {"total_bytes": total, "available_bytes": avail, "swap_in_bytes_s": swap_in}
        if self.server.pid:
            ps = process_stats(self.server.pid)
            out["process"] = {
                "pid": ps.pid,
                "alive": ps.alive,
                "rss_bytes": ps.rss_bytes,
                "swap_bytes": ps.swap_bytes,
                "vram_bytes": {str(k): v for k, v in ps.vram_bytes.items()},
            }
            if not ps.alive and s.state == "gone":
                out["notes"] = [*out["notes"], f"process {ps.pid} has exited"]
        tok_s = s.decode_tok_s if s.decode_tok_s is not None else s.decode_tok_s_finished
        if tok_s is not None:
            from ..core.speed.speed_model import ABANDON_TOK_S

            if tok_s < ABANDON_TOK_S:
                self._below_since = self._below_since if self._below_since is not None else now
            else:
                self._below_since = None
        if self.session is not None and now - self._advice_t >= ADVICE_INTERVAL_S:
            self._advice_t = now
            from ..core.hardware.nvml import gpu_processes
            from ..core.monitor.live import LiveState

            live = LiveState(
                total_ram_bytes=total,
                available_ram_bytes=avail,
                swap_in_bytes_s=swap_in,
                decode_tok_s=tok_s,
                below_abandon_s=(now - self._below_since) if self._below_since is not None else 0.0,
                gpu_processes=tuple(gpu_processes()),
                own_pids=tuple(p for p in (os.getpid(), self.server.pid) if p),
            )
            self._assess(live)
        a = self.assessment
        if a is not None:
            speed = a.speed
            depth = max((sl.tokens for sl in s.slots), default=0)
            out["predicted"] = {
                "decode_tok_s_now": _interp(speed.curve, depth) if speed is not None else None,
                "decode_tok_s_at_full_ctx": speed.decode_tok_s_at_full_ctx if speed is not None else None,
                "prefill_tok_s": speed.prefill_tok_s if speed is not None else None,
                "depth_tokens": depth,
                "host_bytes": a.plan.host.total_bytes,
                "gpu_bytes": {d.device: d.total_bytes for d in a.plan.gpus},
                "kv_bytes": a.plan.kv_bytes,
            }
            out["advice"] = [{"id": x.id, "severity": x.severity, "message": x.message} for x in a.advice]
        return out


def watch(monitor: Monitor, duration_s: float | None, interval_s: float, emit: Any, stop: Any = None) -> int:
    """Call :meth:`Monitor.step` every ``interval_s`` (at least one second) until ``duration_s``
    passes (None: until ``stop()`` is true or interrupted) and hand each sample to ``emit``;
    returns the number of samples."""
    start = time.monotonic()
    n = 0
    interval_s = max(1.0, float(interval_s))
    next_t = start
    while True:
        if stop is not None and stop():
            break
        if duration_s is not None and time.monotonic() - start >= duration_s:
            break
        emit(monitor.step())
        n += 1
        next_t += interval_s
        delay = next_t - time.monotonic()
        if duration_s is not None:
            delay = min(delay, start + duration_s - time.monotonic())
        if delay > 0:
            time.sleep(delay)
        else:
            next_t = time.monotonic()
    return n


__all__ = ["Monitor", "resolve_target", "watch"]
