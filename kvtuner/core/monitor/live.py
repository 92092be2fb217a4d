"""Live state of a running model for the advisor: the samplers' latest samples plus what the
runner reported, folded into a :class:`LiveState` that the advisor reads.

Headless (no Qt, no runner imports): the GUI feeds a :class:`LiveTracker` with decode tokens
(time stamp and duration of each), the KV types and flash attention the runner's log reports,
and allocation failures, then asks :meth:`LiveTracker.state` for a LiveState on its timer.

Measured decode speed (over the trailing window, ``window_s`` = 10 s)::

    decode_tok_s = tokens finished in (now - span, now] / span,   span = min(window_s, now - decode start)

so a decode that has been producing nothing for 10 s reads 0 tok/s, and a token that takes
20 s is seen while it is still running. ``below_abandon_s`` is how long the decode has gone
without a token faster than the abandon line (``dt < 1 / abandon_tok_s``), counted from the
decode start or the end of the last such token; both are 0 / None outside a decode phase.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..hardware.nvml import GpuProcess
from ..speed.speed_model import ABANDON_TOK_S


@dataclass(frozen=True)
class AllocationFailure:
    """An allocation failure of the running model: the ``device`` (``CUDA0``, ``CPU``),
    ``requested_bytes`` (None if unknown) and what NVML/psutil reported free at that moment."""

    device: str
    requested_bytes: int | None
    free_bytes: int | None


@dataclass(frozen=True)
class LiveState:
    """Latest samples of a running model (all optional).

    Attributes:
        total_ram_bytes, available_ram_bytes: host RAM now.
        swap_in_bytes_s: swap-in rate over the last samples, bytes/s.
        decode_tok_s: measured decode speed over the last ``live_window_s`` (10 s).
        below_abandon_s: for how long the measured decode has stayed under the abandon line, s.
        kv_type_k, kv_type_v: KV types the runner's buffers report (``llama_kv_cache`` log line).
        flash_attn: flash attention as the runner's context reports it (None: unknown).
        gpu_processes: NVML's process list.
        own_pids: pids of kvtuner and its runner (not "other" processes).
        allocation_failure: the latest allocation failure, or None.
    """

    total_ram_bytes: int | None = None
    available_ram_bytes: int | None = None
    swap_in_bytes_s: float | None = None
    decode_tok_s: float | None = None
    below_abandon_s: float = 0.0
    kv_type_k: str | None = None
    kv_type_v: str | None = None
    flash_attn: bool | None = None
    gpu_processes: tuple[GpuProcess, ...] = ()
    own_pids: tuple[int, ...] = ()
    allocation_failure: AllocationFailure | None = None


#: The advisor's window for live speed (seconds).
WINDOW_S = 10.0
#: Host samples averaged for the swap-in rate (seconds).
SWAP_WINDOW_S = 2.0


@dataclass
class _Decode:
    start_t: float
    last_fast_t: float


class LiveTracker:
    """Collects what a run reports and answers :meth:`state`.

    Times are ``time.monotonic()`` seconds (the samplers' and the run controller's clock).
    """

    def __init__(self, window_s: float = WINDOW_S, abandon_tok_s: float = ABANDON_TOK_S) -> None:
        if window_s <= 0 or abandon_tok_s <= 0:
            raise ValueError("window_s and abandon_tok_s must be positive")
        self.window_s = float(window_s)
        self.abandon_tok_s = float(abandon_tok_s)
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new run starts)."""
        self._tokens: collections.deque[float] = collections.deque()  # end times in the window
        self._decode: _Decode | None = None
        self.kv_type_k: str | None = None
        self.kv_type_v: str | None = None
        self.flash_attn: bool | None = None
        self.allocation_failure: AllocationFailure | None = None
        self.n_tokens = 0

    # -- feeding -----------------------------------------------------------------------------

    def start_decode(self, t_s: float) -> None:
        """A decode phase begins at ``t_s`` (before its first token)."""
        self._decode = _Decode(t_s, t_s)
        self._tokens.clear()

    def end_decode(self) -> None:
        """The decode phase is over (the repetition ended, or the run)."""
        self._decode = None
        self._tokens.clear()

    def token(self, t_s: float, dt_s: float) -> None:
        """One token finished at ``t_s`` after ``dt_s`` seconds of decoding. The first token of a
        phase starts it at ``t_s - dt_s`` if :meth:`start_decode` was not called."""
        dt_s = max(0.0, float(dt_s))
        if self._decode is None:
            self.start_decode(t_s - dt_s)
        assert self._decode is not None
        self._tokens.append(t_s)
        self.n_tokens += 1
        if dt_s * self.abandon_tok_s < 1.0:  # faster than the abandon line
            self._decode.last_fast_t = max(self._decode.last_fast_t, t_s)

    def tokens(self, series: Iterable[tuple[float, float]]) -> None:
        """Many :meth:`token` calls: ``(t_s, dt_s)`` pairs, oldest first."""
        for t_s, dt_s in series:
            self.token(t_s, dt_s)

    def kv_cache(self, type_k: str | None, type_v: str | None) -> None:
        """The KV types a ``llama_kv_cache`` line reported."""
        self.kv_type_k = type_k or self.kv_type_k
        self.kv_type_v = type_v or self.kv_type_v

    def set_flash_attn(self, enabled: bool | None) -> None:
        """Flash attention as the runner's context reported it."""
        if enabled is not None:
            self.flash_attn = bool(enabled)

    def allocation_failed(self, device: str, requested_bytes: int | None, free_bytes: int | None) -> None:
        """An allocation of the run failed (``free_bytes``: what the samplers saw free then)."""
        self.allocation_failure = AllocationFailure(device, requested_bytes, free_bytes)

    # -- reading -----------------------------------------------------------------------------

    @property
    def decoding(self) -> bool:
        """Whether a decode phase is in progress."""
        return self._decode is not None

    def decode_rate(self, now: float) -> tuple[float | None, float]:
        """``(decode_tok_s, below_abandon_s)`` at ``now`` (None, 0 outside a decode phase)."""
        d = self._decode
        if d is None:
            return None, 0.0
        while self._tokens and self._tokens[0] <= now - self.window_s:
            self._tokens.popleft()
        span = min(self.window_s, now - d.start_t)
        if span <= 0:
            return None, 0.0
        n = sum(1 for t in self._tokens if t <= now)
        return n / span, max(0.0, now - d.last_fast_t)

    def state(
        self,
        now: float,
        host_samples: Sequence[Any] = (),
        *,
        running: bool = True,
        gpu_processes: Sequence[Any] = (),
        own_pids: Sequence[int] = (),
    ) -> LiveState:
        """The :class:`LiveState` at ``now``.

        ``host_samples``: recent :class:`kvtuner.core.monitor.sampler.HostSample` (oldest first; RAM from
        the newest, swap-in averaged over the last :data:`SWAP_WINDOW_S`); ``gpu_processes``:
        :class:`kvtuner.core.hardware.nvml.GpuProcess` records; ``own_pids``: kvtuner and its runner.
        With ``running`` False only the run's facts remain (KV types, flash attention, an
        allocation failure): memory and speed describe a run, not an idle machine.
        """
        if not running:
            return LiveState(
                kv_type_k=self.kv_type_k,
                kv_type_v=self.kv_type_v,
                flash_attn=self.flash_attn,
                allocation_failure=self.allocation_failure,
            )
        total = avail = None
        swap_in = None
        if host_samples:
            last = host_samples[-1]
            total, avail = int(last.total_bytes), int(last.available_bytes)
            rates = [
                s.swap_in_bytes_s
                for s in host_samples
                if s.swap_in_bytes_s is not None and s.t_s > last.t_s - SWAP_WINDOW_S
            ]
            swap_in = sum(rates) / len(rates) if rates else None
        tok_s, below = self.decode_rate(now)
        procs = tuple(gpu_processes)
        pids = tuple(sorted({os.getpid(), *(int(p) for p in own_pids if p)}))
        return LiveState(
            total_ram_bytes=total,
            available_ram_bytes=avail,
            swap_in_bytes_s=swap_in,
            decode_tok_s=tok_s,
            below_abandon_s=below if tok_s is not None and tok_s < self.abandon_tok_s else 0.0,
            kv_type_k=self.kv_type_k,
            kv_type_v=self.kv_type_v,
            flash_attn=self.flash_attn,
            gpu_processes=procs,
            own_pids=pids,
            allocation_failure=self.allocation_failure,
        )


def free_bytes_on(device: str, host_sample: Any | None, gpu_samples: dict[int, Any]) -> int | None:
    """What the samplers last saw free on ``device`` (``CUDA0`` ..., ``CPU``): a GPU's free
    VRAM, or the host's available RAM; None when unknown."""
    if device.upper().startswith("CPU") or device == "":
        return int(host_sample.available_bytes) if host_sample is not None else None
    digits = "".join(ch for ch in device if ch.isdigit())
    s = gpu_samples.get(int(digits)) if digits else None
    return int(s.free_bytes) if s is not None else None


__all__ = ["SWAP_WINDOW_S", "WINDOW_S", "LiveTracker", "free_bytes_on"]
