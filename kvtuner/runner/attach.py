"""Watch a llama-server (or Ollama) that someone else started: find it, poll its HTTP
endpoints, and turn what it answers into samples kvtuner can graph and advise on.

Endpoints and field names are llama.cpp's server (tools/server, b11434):

- ``GET /health``: ``{"status": "ok"}``; 503 while the model loads (server-http.cpp middleware).
- ``GET /props``: ``model_path``, ``total_slots``, ``default_generation_settings.n_ctx`` (the
  context of one slot), ``build_info``, ``endpoint_metrics`` (server-context.cpp ``get_res_props``).
- ``GET /slots`` (on unless ``--no-slots``): one object per slot with ``id``, ``n_ctx``,
  ``is_processing``, ``id_task``, ``n_prompt_tokens`` (the tokens in the slot's cache: prompt
  and what was generated so far, ``server_slot::to_json``) and ``next_token`` whose
  ``n_decoded`` counts the tokens generated for the current task. ``next_token`` is a
  one-element array in this build and an object in older ones; both are read.
- ``GET /metrics`` (only with ``--metrics``; 501 otherwise): Prometheus text whose counters
  ``llamacpp:prompt_tokens_total``, ``prompt_seconds_total``, ``tokens_predicted_total`` and
  ``tokens_predicted_seconds_total`` grow when a request finishes (``metrics_on_prediction``)
  and gauges ``requests_processing`` and ``requests_deferred`` (server-task.cpp ``to_metrics``).

Live rates come from deltas between two polls, never from the ``*_tokens_seconds`` gauges:

- decode tok/s (live): for each slot generating the same task at both polls, with tokens
  already generated at the first one (its prompt done), ``delta n_decoded / delta t``; summed
  over slots (the server's generation throughput). Between two requests nothing is counted.
- prefill tok/s (live): the growth of ``n_prompt_tokens`` of a slot whose ``n_decoded`` is
  still 0 (its prompt is being processed), over the poll interval.
- decode tok/s of finished requests (with ``--metrics``): ``delta tokens_predicted_total /
  delta tokens_predicted_seconds_total``, the same sums the server's per-request
  ``timings.predicted_per_second`` is made of.

Watching costs the server little: one request per endpoint per poll, at most one poll per
second (:data:`MIN_INTERVAL_S`), 1.5 s timeouts; an endpoint that times out is skipped for
2, 4, 8 ... up to 30 s. A bad answer (HTML, truncated JSON, 401, a hang, a refused
connection) becomes one line in the sample's ``problems``; the watcher keeps polling.

Ollama: ``GET /api/ps`` on 127.0.0.1:11434 (docs/api.md "List Running Models": ``models[]``
with ``name``, ``model``, ``size``, ``size_vram``, ``digest``, ``context_length``,
``expires_at``); the model blob is ``<models dir>/blobs/sha256-<digest>``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Fewest seconds between two polls of one server (one request per endpoint per poll).
MIN_INTERVAL_S = 1.0
#: Seconds one HTTP request may take before it is abandoned.
TIMEOUT_S = 1.5
#: Longest back-off of an endpoint that timed out, seconds.
MAX_BACKOFF_S = 30.0
#: Ports a llama-server answers on by default (common/common.h ``port``: 8080; newer builds 9931).
DEFAULT_PORTS = (8080, 9931)
#: Ollama's default address (``OLLAMA_HOST``).
OLLAMA_URL = "http://127.0.0.1:11434"
#: Most bytes read from one answer (a /slots answer of many slots with their prompts).
MAX_BODY_BYTES = 8 << 20


class AttachError(ValueError):
    """A URL or PID that names no server to watch; the message says what to give."""


# ----------------------------------------------------------------------------------------------
# HTTP


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: ``status`` (0: no answer), the body, and ``problem``: one line when the
    request failed (refused, timed out, 401 ...), "" otherwise. ``timed_out``: no answer in time."""

    status: int
    body: bytes = b""
    content_type: str = ""
    headers: dict = field(default_factory=dict)  # names in lower case
    problem: str = ""
    timed_out: bool = False
    refused: bool = False

    def json(self) -> Any:
        """The body as JSON.

        Raises:
            ValueError: the body is not JSON (HTML, truncated, empty), with a one-line message.
        """
        text = self.body.decode("utf-8", "replace").strip()
        if not text:
            raise ValueError("an empty answer")
        try:
            return json.loads(text)
        except ValueError:
            head = text[:40].replace("\n", " ")
            what = "HTML" if text.lstrip().lower().startswith(("<!doctype", "<html")) else "not JSON"
            raise ValueError(f"{what} ({head!r}...)") from None


def http_get(url: str, *, timeout_s: float = TIMEOUT_S, api_key: str | None = None) -> Answer:
    """``GET url`` with a timeout; never raises (a failure is an :class:`Answer` with a problem)."""
    req = urllib.request.Request(url, headers={"Accept": "application/json, text/plain"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read(MAX_BODY_BYTES)
            return Answer(
                resp.status, body, resp.headers.get("Content-Type", ""), {k.lower(): v for k, v in resp.headers.items()}
            )
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(MAX_BODY_BYTES)
        except Exception:
            body = b""
        problem = f"HTTP {exc.code}"
        if exc.code == 401:
            problem = "HTTP 401: the server wants an API key (give --api-key)"
        return Answer(exc.code, body, exc.headers.get("Content-Type", "") if exc.headers else "", {}, problem)
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return Answer(0, problem=f"no answer within {timeout_s:g} s", timed_out=True)
        if isinstance(reason, ConnectionRefusedError):
            return Answer(0, problem="connection refused", refused=True)
        return Answer(0, problem=f"cannot connect ({reason})", refused=True)
    except TimeoutError:
        return Answer(0, problem=f"no answer within {timeout_s:g} s", timed_out=True)
    except (ConnectionError, OSError) as exc:
        return Answer(0, problem=f"connection failed ({exc.__class__.__name__})", refused=True)
    except Exception as exc:  # http.client.IncompleteRead, BadStatusLine ...
        return Answer(0, problem=f"a broken answer ({exc.__class__.__name__})")


def normalize_url(text: str) -> str:
    """``http://host:port`` from ``host:port``, ``:port``, a bare port or a URL (path dropped).

    Raises:
        AttachError: not a URL, or no port.
    """
    t = text.strip()
    if t.isdigit():
        t = f"127.0.0.1:{t}"
    if t.startswith(":"):
        t = "127.0.0.1" + t
    if "://" not in t:
        t = "http://" + t
    p = urllib.parse.urlsplit(t)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise AttachError(f"{text!r} is not a server address: give http://HOST:PORT or a PID")
    try:
        port = p.port
    except ValueError:
        raise AttachError(f"{text!r} has a bad port: give http://HOST:PORT") from None
    host = p.hostname
    if ":" in host:
        host = f"[{host}]"
    return f"{p.scheme}://{host}:{port or (443 if p.scheme == 'https' else 80)}"


# ----------------------------------------------------------------------------------------------
# answers


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> ``{name: value}`` for the ``llamacpp:`` series (prefix dropped; labelled
    series are left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "{" in line:
            continue
        parts = line.split()
        if len(parts) < 2 or not parts[0].startswith("llamacpp:"):
            continue
        try:
            out[parts[0][len("llamacpp:") :]] = float(parts[1])
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class SlotState:
    """One slot of ``/slots``: ``n_ctx`` tokens it may hold, ``tokens`` it holds now (prompt and
    generated, ``n_prompt_tokens``; ``n_past`` where a build reports it instead), ``n_decoded``
    tokens generated for ``id_task``, ``processing`` whether a task runs in it."""

    id: int
    n_ctx: int
    processing: bool
    id_task: int | None
    tokens: int
    n_decoded: int

    @property
    def fill(self) -> float | None:
        """Share of the slot's context in use (None without ``n_ctx``)."""
        return self.tokens / self.n_ctx if self.n_ctx > 0 else None


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_slots(data: Any) -> list[SlotState]:
    """``/slots`` JSON -> slots.

    Raises:
        ValueError: not a list of slot objects.
    """
    if not isinstance(data, list):
        raise ValueError(f"/slots answered a {type(data).__name__}, not a list of slots")
    slots = []
    for i, s in enumerate(data):
        if not isinstance(s, dict):
            raise ValueError("/slots holds something that is not a slot object")
        nt = s.get("next_token")
        if isinstance(nt, list):
            nt = nt[0] if nt and isinstance(nt[0], dict) else {}
        if not isinstance(nt, dict):
            nt = {}
        tokens = s.get("n_past", s.get("n_prompt_tokens", 0))
        slots.append(
            SlotState(
                id=_int(s.get("id"), i),
                n_ctx=_int(s.get("n_ctx")),
                processing=bool(s.get("is_processing", False)),
                id_task=_int(s["id_task"]) if s.get("id_task") is not None else None,
                tokens=_int(tokens),
                n_decoded=_int(nt.get("n_decoded", s.get("n_decoded", 0))),
            )
        )
    return slots


@dataclass(frozen=True)
class ServerSample:
    """One poll of a watched server.

    Attributes:
        t_s: ``time.monotonic()`` of the poll; ``time_unix_s`` wall clock.
        url: the server; ``state``: ``ok``, ``loading`` (503), ``gone`` (nothing answers),
            ``error`` (it answers, but not as a llama-server).
        model_path, build_info, total_slots, n_ctx_slot: from ``/props`` (None/"" unknown).
        slots: ``/slots`` (empty when disabled or unreadable).
        decode_tok_s: live generation throughput (see module doc), None when nothing decoded
            during the interval; ``prefill_tok_s`` the same for prompts.
        decode_tokens, decode_span_s: the tokens behind ``decode_tok_s`` and the slot-seconds
            they took (sums over samples give a rate over a whole window).
        decode_tok_s_finished, prefill_tok_s_finished: from ``/metrics`` counter deltas of the
            requests that finished during the interval (None without ``--metrics`` or none finished).
        requests_processing, requests_deferred: ``/metrics`` gauges (processing falls back to
            the slots busy).
        tokens_in_context: tokens held in all slots; ``context_fill`` the fullest slot's share.
        metrics_enabled: whether ``/metrics`` answered.
        problems: one line per endpoint that answered badly during this poll.
        notes: events worth one line (a restart with another model, the server came back).
    """

    t_s: float
    time_unix_s: float
    url: str
    state: str
    model_path: str = ""
    build_info: str = ""
    total_slots: int | None = None
    n_ctx_slot: int | None = None
    slots: tuple[SlotState, ...] = ()
    decode_tok_s: float | None = None
    prefill_tok_s: float | None = None
    decode_tokens: int = 0
    decode_span_s: float = 0.0
    decode_tok_s_finished: float | None = None
    prefill_tok_s_finished: float | None = None
    tokens_predicted_total: int | None = None
    requests_processing: int | None = None
    requests_deferred: int | None = None
    tokens_in_context: int | None = None
    context_fill: float | None = None
    metrics_enabled: bool | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (slots as objects)."""
        d = asdict(self)
        d["slots"] = [asdict(s) | {"fill": s.fill} for s in self.slots]
        return d


class _Endpoint:
    """Back-off state of one endpoint."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.next_t = 0.0
        self.backoff_s = 0.0
        self.disabled = ""  # why the endpoint is not asked any more ("" = asked)

    def due(self, now: float) -> bool:
        return not self.disabled and now >= self.next_t

    def answered(self, ans: Answer, now: float) -> None:
        if ans.timed_out:
            self.backoff_s = min(MAX_BACKOFF_S, max(2.0, self.backoff_s * 2))
            self.next_t = now + self.backoff_s
        else:
            self.backoff_s = 0.0
            self.next_t = now


class ServerWatcher:
    """Polls one llama-server; :meth:`poll` returns a :class:`ServerSample` and never raises.

    Args:
        url: ``http://HOST:PORT`` (see :func:`normalize_url`).
        api_key: the server's ``--api-key`` (sent as ``Authorization: Bearer``).
        timeout_s: per request.
        model: the ``?model=`` of a router (llama-server ``--models-dir`` mode), "" for none.
    """

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = TIMEOUT_S, model: str = "") -> None:
        self.url = normalize_url(url)
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.model = model
        self.n_requests = 0
        self._ep = {p: _Endpoint(p) for p in ("/health", "/props", "/slots", "/metrics")}
        self._props: dict[str, Any] = {}
        self._props_t = -float("inf")
        self._prev_slots: dict[int, SlotState] = {}
        self._prev_slots_t: float | None = None
        self._prev_metrics: dict[str, float] | None = None
        self._start_time = ""
        self._last_state = ""
        self._last_t = -float("inf")

    def _get(self, path: str) -> Answer:
        self.n_requests += 1
        q = f"?model={urllib.parse.quote(self.model)}" if self.model and path != "/health" else ""
        return http_get(self.url + path + q, timeout_s=self.timeout_s, api_key=self.api_key)

    def poll(self) -> ServerSample:
        """Ask the endpoints that are due and fold the answers into a sample. Sleeps when called
        sooner than :data:`MIN_INTERVAL_S` after the previous poll."""
        wait = self._last_t + MIN_INTERVAL_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        now = time.monotonic()
        self._last_t = now
        problems: list[str] = []
        notes: list[str] = []
        health = self._ep["/health"]
        ans = self._get("/health")
        health.answered(ans, now)
        if ans.status == 0:
            state = "gone" if ans.refused else "error"
            if ans.refused and self._last_state not in ("gone", ""):
                notes.append(f"the server at {self.url} is gone (connection refused); still watching")
            self._last_state = state
            self._prev_slots, self._prev_slots_t, self._prev_metrics = {}, None, None
            return ServerSample(
                now, time.time(), self.url, state, problems=(f"/health: {ans.problem}",), notes=tuple(notes)
            )
        if ans.status == 503:
            state = "loading"
        elif ans.status == 200:
            state = "ok"
        else:
            state = "error"
            problems.append(f"/health: {ans.problem or f'HTTP {ans.status}'}")
        if self._last_state == "gone" and state != "gone":
            notes.append(f"the server at {self.url} answers again")
            self._props_t = -float("inf")
        self._last_state = state
        if state == "loading":
            return ServerSample(
                now,
                time.time(),
                self.url,
                state,
                model_path=str(self._props.get("model_path", "")),
                problems=tuple(problems),
                notes=tuple(notes),
            )

        # /props: at the start, after a restart, and every 10 s (a server that swapped its model)
        props_ep = self._ep["/props"]
        if props_ep.due(now) and now - self._props_t >= 10.0:
            a = self._get("/props")
            props_ep.answered(a, now)
            if a.problem:
                problems.append(f"/props: {a.problem}")
            else:
                try:
                    data = a.json()
                    if not isinstance(data, dict):
                        raise ValueError("not an object")
                    old = self._props.get("model_path")
                    if old and data.get("model_path") and data.get("model_path") != old:
                        notes.append(f"the server now serves {data.get('model_path')} (was {old})")
                        self._prev_slots, self._prev_slots_t, self._prev_metrics = {}, None, None
                    self._props = data
                    self._props_t = now
                    if data.get("endpoint_metrics") is False:
                        self._ep["/metrics"].disabled = "started without --metrics"
                    elif data.get("endpoint_metrics") is True:
                        self._ep["/metrics"].disabled = ""
                except ValueError as exc:
                    problems.append(f"/props: {exc}")

        slots: list[SlotState] | None = None
        slots_ep = self._ep["/slots"]
        if slots_ep.due(now):
            a = self._get("/slots")
            t_slots = time.monotonic()
            slots_ep.answered(a, t_slots)
            if a.status == 501:
                slots_ep.disabled = "started with --no-slots"
            elif a.problem:
                problems.append(f"/slots: {a.problem}")
            else:
                try:
                    slots = parse_slots(a.json())
                except ValueError as exc:
                    problems.append(f"/slots: {exc}")
        decode = prefill = None
        dec_n, dec_span = 0, 0.0
        if slots is not None:
            decode, prefill, dec_n, dec_span = self._slot_rates(slots, t_slots)
        metrics: dict[str, float] | None = None
        m_ep = self._ep["/metrics"]
        if m_ep.due(now):
            a = self._get("/metrics")
            m_ep.answered(a, time.monotonic())
            if a.status == 501:
                m_ep.disabled = "started without --metrics"
            elif a.problem:
                problems.append(f"/metrics: {a.problem}")
            else:
                metrics = parse_metrics(a.body.decode("utf-8", "replace"))
                if not metrics:
                    problems.append("/metrics: no llamacpp: series in the answer")
                    metrics = None
                start = str(a.headers.get("process-start-time-unix", ""))
                if start and self._start_time and start != self._start_time:
                    notes.append("the server restarted")
                    self._prev_metrics = None
                self._start_time = start or self._start_time
        dec_fin = pre_fin = None
        if metrics is not None:
            prev = self._prev_metrics
            if prev is not None:
                dec_fin = _rate(metrics, prev, "tokens_predicted_total", "tokens_predicted_seconds_total")
                pre_fin = _rate(metrics, prev, "prompt_tokens_total", "prompt_seconds_total")
            self._prev_metrics = metrics
        dgs = self._props.get("default_generation_settings")
        n_ctx_slot = _int(dgs.get("n_ctx"), 0) if isinstance(dgs, dict) else 0
        total_slots = self._props.get("total_slots")
        processing = None
        if metrics is not None and "requests_processing" in metrics:
            processing = int(metrics["requests_processing"])
        elif slots is not None:
            processing = sum(1 for s in slots if s.processing)
        in_ctx = sum(s.tokens for s in slots) if slots else None
        fills = [s.fill for s in slots or () if s.fill is not None]
        return ServerSample(
            now,
            time.time(),
            self.url,
            state,
            model_path=str(self._props.get("model_path", "")),
            build_info=str(self._props.get("build_info", "")),
            total_slots=int(total_slots) if isinstance(total_slots, int) else (len(slots) if slots else None),
            n_ctx_slot=n_ctx_slot or (slots[0].n_ctx if slots else None),
            slots=tuple(slots or ()),
            decode_tok_s=decode,
            prefill_tok_s=prefill,
            decode_tokens=dec_n,
            decode_span_s=dec_span,
            decode_tok_s_finished=dec_fin,
            prefill_tok_s_finished=pre_fin,
            tokens_predicted_total=int(metrics["tokens_predicted_total"])
            if metrics and "tokens_predicted_total" in metrics
            else None,
            requests_processing=processing,
            requests_deferred=int(metrics["requests_deferred"]) if metrics and "requests_deferred" in metrics else None,
            tokens_in_context=in_ctx,
            context_fill=max(fills) if fills else None,
            metrics_enabled=(not m_ep.disabled) if (m_ep.disabled or metrics is not None) else None,
            problems=tuple(problems),
            notes=tuple(notes),
        )

    def _slot_rates(self, slots: list[SlotState], t_s: float) -> tuple[float | None, float | None, int, float]:
        """(decode tok/s, prefill tok/s, decoded tokens, slot-seconds of decoding) since the
        previous ``/slots`` answer (module doc)."""
        prev, prev_t = self._prev_slots, self._prev_slots_t
        self._prev_slots, self._prev_slots_t = {s.id: s for s in slots}, t_s
        if prev_t is None or t_s <= prev_t:
            return None, None, 0, 0.0
        dt = t_s - prev_t
        dec = pre = 0.0
        n_dec, span = 0, 0.0
        any_dec = any_pre = False
        for s in slots:
            p = prev.get(s.id)
            if p is None or not (s.processing and p.processing) or s.id_task != p.id_task:
                continue
            if p.n_decoded > 0 and s.n_decoded >= p.n_decoded:
                dec += (s.n_decoded - p.n_decoded) / dt
                n_dec += s.n_decoded - p.n_decoded
                span += dt
                any_dec = True
            elif s.n_decoded == 0 and s.tokens > p.tokens:
                pre += (s.tokens - p.tokens) / dt
                any_pre = True
        return (dec if any_dec else None), (pre if any_pre else None), n_dec, span


def _rate(now: dict[str, float], prev: dict[str, float], count: str, seconds: str) -> float | None:
    if count not in now or seconds not in now or count not in prev or seconds not in prev:
        return None
    dn, ds = now[count] - prev[count], now[seconds] - prev[seconds]
    return dn / ds if dn > 0 and ds > 0 else None


# ----------------------------------------------------------------------------------------------
# processes


@dataclass(frozen=True)
class ProcessStats:
    """A local server process: ``rss_bytes``, ``swap_bytes`` (Linux ``VmSwap``; None elsewhere),
    ``vram_bytes`` per GPU index (NVML by PID; empty without NVML)."""

    pid: int
    alive: bool
    rss_bytes: int | None = None
    swap_bytes: int | None = None
    vram_bytes: dict = field(default_factory=dict)


def process_stats(pid: int) -> ProcessStats:
    """RSS, swap and VRAM of ``pid`` now."""
    import psutil

    from ..core.hardware.nvml import gpu_processes

    try:
        p = psutil.Process(pid)
        rss = int(p.memory_info().rss)
    except (psutil.Error, OSError):
        return ProcessStats(pid, False)
    swap = None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmSwap:"):
                    swap = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    vram: dict[int, int] = {}
    for gp in gpu_processes():
        if gp.pid == pid and gp.used_bytes is not None:
            vram[gp.gpu_index] = vram.get(gp.gpu_index, 0) + gp.used_bytes
    return ProcessStats(pid, True, rss, swap, vram)


def _looks_like_server(name: str, argv: Sequence[str]) -> bool:
    exe = os.path.basename(argv[0]) if argv else ""
    return "llama-server" in name or exe.startswith("llama-server")


@dataclass(frozen=True)
class FoundServer:
    """A server found on this machine: ``kind`` ``llama-server`` or ``ollama``; ``pid`` and
    ``argv`` of its process when known; ``answers`` whether its ``/health`` answered."""

    kind: str
    url: str
    pid: int | None = None
    argv: tuple[str, ...] = ()
    answers: bool = False

    @property
    def label(self) -> str:
        """``llama-server http://127.0.0.1:8080 (pid 1234, gemma.gguf)`` for lists."""
        model = server_argv_value(self.argv, ("-m", "--model"))
        bits = [f"pid {self.pid}" if self.pid else "", Path(model).name if model else ""]
        extra = ", ".join(b for b in bits if b)
        return f"{self.kind} {self.url}" + (f" ({extra})" if extra else "")


def server_argv_value(argv: Sequence[str], names: Sequence[str]) -> str:
    """The value of the last of ``names`` in ``argv`` (``--port 8081`` or ``--port=8081``), ""."""
    value = ""
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            value = argv[i + 1]
        else:
            for n in names:
                if n.startswith("--") and a.startswith(n + "="):
                    value = a[len(n) + 1 :]
    return value


def url_of_argv(argv: Sequence[str]) -> str:
    """The URL a llama-server command line listens on (``--host``/``--port``, default
    127.0.0.1:8080; ``0.0.0.0`` is reached at 127.0.0.1; ``LLAMA_ARG_PORT`` is not seen)."""
    host = server_argv_value(argv, ("--host",)) or "127.0.0.1"
    if host in ("0.0.0.0", "::", "") or host.endswith(".sock"):
        host = "127.0.0.1"
    port = server_argv_value(argv, ("--port",)) or str(DEFAULT_PORTS[0])
    return normalize_url(f"{host}:{port}")


def process_argv(pid: int) -> tuple[str, ...]:
    """The command line of ``pid``.

    Raises:
        AttachError: no such process, or not readable.
    """
    import psutil

    try:
        return tuple(psutil.Process(pid).cmdline())
    except psutil.NoSuchProcess:
        raise AttachError(f"no process {pid}: give the PID of a running llama-server") from None
    except (psutil.Error, OSError) as exc:
        raise AttachError(f"cannot read the command line of process {pid} ({exc.__class__.__name__})") from None


def scan_processes() -> list[FoundServer]:
    """llama-server processes of this machine (by executable name and command line)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            argv = tuple(p.info.get("cmdline") or ())
            name = p.info.get("name") or ""
        except (psutil.Error, OSError):
            continue
        if _looks_like_server(name, argv):
            out.append(FoundServer("llama-server", url_of_argv(argv), int(p.info["pid"]), argv))
    return out


def find_servers(
    *, ports: Iterable[int] = DEFAULT_PORTS, ollama_url: str = OLLAMA_URL, timeout_s: float = 0.5
) -> list[FoundServer]:
    """llama-server processes of this machine, servers answering ``/health`` on 127.0.0.1 at
    ``ports``, and Ollama when ``/api/ps`` answers at ``ollama_url``; one entry per URL."""
    found = {s.url: s for s in scan_processes()}
    for port in ports:
        url = f"http://127.0.0.1:{port}"
        if url in found:
            continue
        if http_get(url + "/health", timeout_s=timeout_s).status in (200, 503):
            found[url] = FoundServer("llama-server", url, answers=True)
    out = list(found.values())
    if ollama_url and http_get(normalize_url(ollama_url) + "/api/ps", timeout_s=timeout_s).status == 200:
        out.append(FoundServer("ollama", normalize_url(ollama_url), answers=True))
    return out


def pid_listening_on(url: str) -> int | None:
    """The local llama-server process whose command line listens on ``url``'s port, or None."""
    port = urllib.parse.urlsplit(url).port
    for s in scan_processes():
        if urllib.parse.urlsplit(s.url).port == port:
            return s.pid
    return None


# ----------------------------------------------------------------------------------------------
# Ollama


@dataclass(frozen=True)
class OllamaModel:
    """One model Ollama holds (``/api/ps``): ``size_bytes`` in memory, ``vram_bytes`` of it on
    GPUs, ``context_length``, ``expires_at`` (ISO text), and ``blob``: the GGUF file under the
    model directory when readable (None otherwise)."""

    name: str
    model: str
    size_bytes: int
    vram_bytes: int
    context_length: int | None
    expires_at: str
    digest: str
    blob: str | None = None

    @property
    def ram_bytes(self) -> int:
        """The part held in host memory (``size - size_vram``)."""
        return max(0, self.size_bytes - self.vram_bytes)


def ollama_models_dir() -> Path:
    """Ollama's model directory: ``$OLLAMA_MODELS``, else ``~/.ollama/models`` (Linux service
    installs use ``/usr/share/ollama/.ollama/models``, tried too by :func:`ollama_blob`)."""
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".ollama" / "models"


def ollama_blob(digest: str, models_dir: Path | None = None) -> str | None:
    """The blob file of ``digest`` (``sha256:...`` or bare hex) when it exists and is readable."""
    hexpart = digest.split(":", 1)[-1]
    if not re.fullmatch(r"[0-9a-fA-F]{16,128}", hexpart):
        return None
    dirs = [models_dir] if models_dir else [ollama_models_dir(), Path("/usr/share/ollama/.ollama/models")]
    for d in dirs:
        p = Path(d) / "blobs" / f"sha256-{hexpart}"
        if p.is_file() and os.access(p, os.R_OK):
            return str(p)
    return None


def parse_ollama_ps(data: Any, models_dir: Path | None = None) -> list[OllamaModel]:
    """``/api/ps`` JSON -> models.

    Raises:
        ValueError: not ``{"models": [...]}``.
    """
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise ValueError('/api/ps did not answer {"models": [...]}')
    out = []
    for m in data["models"]:
        if not isinstance(m, dict):
            continue
        digest = str(m.get("digest", ""))
        ctx = m.get("context_length")
        out.append(
            OllamaModel(
                name=str(m.get("name", "")),
                model=str(m.get("model", m.get("name", ""))),
                size_bytes=_int(m.get("size")),
                vram_bytes=_int(m.get("size_vram")),
                context_length=int(ctx) if isinstance(ctx, int) else None,
                expires_at=str(m.get("expires_at", "")),
                digest=digest,
                blob=ollama_blob(digest, models_dir) if digest else None,
            )
        )
    return out


@dataclass(frozen=True)
class OllamaSample:
    """One poll of Ollama: ``state`` ``ok``/``gone``/``error``, the models it holds, problems."""

    t_s: float
    time_unix_s: float
    url: str
    state: str
    models: tuple[OllamaModel, ...] = ()
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d = asdict(self)
        d["models"] = [asdict(m) | {"ram_bytes": m.ram_bytes} for m in self.models]
        return d


class OllamaWatcher:
    """Polls Ollama's ``/api/ps``; :meth:`poll` never raises."""

    def __init__(self, url: str = OLLAMA_URL, *, timeout_s: float = TIMEOUT_S, models_dir: Path | None = None) -> None:
        self.url = normalize_url(url)
        self.timeout_s = timeout_s
        self.models_dir = models_dir
        self._last_t = -float("inf")
        self.n_requests = 0

    def poll(self) -> OllamaSample:
        """One ``/api/ps`` (at most one a second)."""
        wait = self._last_t + MIN_INTERVAL_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        now = self._last_t = time.monotonic()
        self.n_requests += 1
        a = http_get(self.url + "/api/ps", timeout_s=self.timeout_s)
        if a.status == 0:
            return OllamaSample(
                now, time.time(), self.url, "gone" if a.refused else "error", problems=(f"/api/ps: {a.problem}",)
            )
        if a.problem:
            return OllamaSample(now, time.time(), self.url, "error", problems=(f"/api/ps: {a.problem}",))
        try:
            models = parse_ollama_ps(a.json(), self.models_dir)
        except ValueError as exc:
            return OllamaSample(now, time.time(), self.url, "error", problems=(f"/api/ps: {exc}",))
        return OllamaSample(now, time.time(), self.url, "ok", tuple(models))


def is_ollama(url: str, timeout_s: float = TIMEOUT_S) -> bool:
    """Whether ``url`` answers like Ollama (``GET /api/version`` with a ``version``)."""
    a = http_get(normalize_url(url) + "/api/version", timeout_s=timeout_s)
    try:
        return a.status == 200 and isinstance(a.json(), dict) and "version" in a.json()
    except ValueError:
        return False


__all__ = [
    "Answer",
    "AttachError",
    "FoundServer",
    "OllamaModel",
    "OllamaSample",
    "OllamaWatcher",
    "ProcessStats",
    "ServerSample",
    "ServerWatcher",
    "SlotState",
    "find_servers",
    "http_get",
    "is_ollama",
    "normalize_url",
    "parse_metrics",
    "parse_ollama_ps",
    "parse_slots",
    "pid_listening_on",
    "process_argv",
    "process_stats",
    "scan_processes",
    "url_of_argv",
]
