"""The decode rate the live graph draws: a rolling rate over the last tokens, not each token's
own ``1 / dt`` (one token delayed by another process reads 0.3 tok/s beside 80 tok/s, a
sawtooth that hides the speed the user gets).

For the tokens of the current decode phase whose end lies within ``window_s`` of the newest
one, and never fewer than ``min_tokens`` of them (fewer only at the start of a phase)::

    rate_tok_s = n / sum(dt_s of those n tokens)

``dt_s`` is the time the runner measured for each token, so the prefill before a phase and the
gaps between events do not count. :meth:`RollingRate.reset` starts a new phase (each
repetition's decode starts afresh; nothing is drawn after the run).
"""

from __future__ import annotations

import collections

#: Seconds of tokens the rate averages over (about a second and a half of decode).
WINDOW_S = 1.5
#: The fewest tokens the rate averages over once a phase has that many (a slow decode of
#: 2 tok/s still averages 8 tokens, not the 3 that finish in 1.5 s).
MIN_TOKENS = 8


class RollingRate:
    """Rolling decode rate over the last tokens of a phase.

    Args:
        window_s: seconds of tokens to average (positive).
        min_tokens: the fewest tokens to average once there are that many (1 or more).

    Raises:
        ValueError: ``window_s`` not positive or ``min_tokens`` under 1.
    """

    def __init__(self, window_s: float = WINDOW_S, min_tokens: int = MIN_TOKENS) -> None:
        if not window_s > 0 or min_tokens < 1:
            raise ValueError("window_s must be positive and min_tokens 1 or more")
        self.window_s = float(window_s)
        self.min_tokens = int(min_tokens)
        self._tokens: collections.deque[tuple[float, float]] = collections.deque()  # (end t_s, dt_s)
        self._sum_dt_s = 0.0

    def reset(self) -> None:
        """Forget the tokens: the next one starts a new decode phase."""
        self._tokens.clear()
        self._sum_dt_s = 0.0

    def add(self, t_s: float, dt_s: float) -> float | None:
        """One token that finished at ``t_s`` (seconds, any monotonic clock) after ``dt_s``
        seconds; returns the rolling rate in tok/s, or None while no token has a duration."""
        if dt_s > 0:
            self._tokens.append((float(t_s), float(dt_s)))
            self._sum_dt_s += dt_s
        while len(self._tokens) > self.min_tokens and self._tokens[0][0] < t_s - self.window_s:
            self._sum_dt_s -= self._tokens.popleft()[1]
        return self.rate_tok_s

    @property
    def rate_tok_s(self) -> float | None:
        """The rolling rate now (tok/s), or None before the first token."""
        if not self._tokens or self._sum_dt_s <= 0:
            return None
        return len(self._tokens) / self._sum_dt_s


__all__ = ["MIN_TOKENS", "WINDOW_S", "RollingRate"]
