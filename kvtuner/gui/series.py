"""Bounded time series for the live graphs (numpy ring storage, appended on the GUI thread).

A :class:`Series` keeps at most ``capacity`` points (default one hour at 10 Hz); appending
beyond that drops the oldest. :meth:`Series.arrays` returns contiguous views for
``PlotDataItem.setData`` without copying the whole history on every append.
"""

from __future__ import annotations

import numpy as np

#: One hour of 10 Hz samples.
HOUR_AT_10HZ = 36_000


class Series:
    """A bounded (t_s, value) series.

    Storage is a buffer of twice the capacity: points are written at the end and, when it
    fills, the newest ``capacity`` points are moved to the front once (amortised O(1)), so the
    visible window is always one contiguous slice.
    """

    def __init__(self, capacity: int = HOUR_AT_10HZ) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._t = np.empty(2 * capacity, dtype=np.float64)
        self._v = np.empty(2 * capacity, dtype=np.float64)
        self._start = 0
        self._end = 0
        self.version = 0  # bumped on every change: views redraw only when it moved
        self._peak = 0.0
        self._peak_valid = True

    def __len__(self) -> int:
        return self._end - self._start

    def append(self, t_s: float, value: float) -> None:
        """Add one point (``value`` NaN leaves a gap in the curve)."""
        self.extend(np.asarray([t_s], dtype=np.float64), np.asarray([value], dtype=np.float64))

    def extend(self, t_s: np.ndarray, values: np.ndarray) -> None:
        """Add many points at once (oldest first)."""
        n = len(t_s)
        if n == 0:
            return
        values = np.asarray(values, dtype=np.float64)
        if n >= self.capacity:
            t_s, values, n = t_s[-self.capacity :], values[-self.capacity :], self.capacity
            self._start = self._end = 0
            self._peak_valid = False
        if self._end + n > len(self._t):
            keep = min(len(self), self.capacity - n)
            self._drop(len(self) - keep)
            self._t[:keep] = self._t[self._end - keep : self._end]
            self._v[:keep] = self._v[self._end - keep : self._end]
            self._start, self._end = 0, keep
        self._t[self._end : self._end + n] = t_s
        self._v[self._end : self._end + n] = values
        self._end += n
        if len(self) > self.capacity:
            self._drop(len(self) - self.capacity)
            self._start = self._end - self.capacity
        if self._peak_valid and not np.all(np.isnan(values)):
            self._peak = max(self._peak, float(np.nanmax(values)))
        self.version += 1

    def _drop(self, n: int) -> None:
        """Forget the ``n`` oldest points (the caller moves ``_start``); the peak is recomputed
        only if one of them held it."""
        if n > 0 and self._peak_valid:
            dropped = self._v[self._start : self._start + n]
            if len(dropped) and not np.all(np.isnan(dropped)) and np.nanmax(dropped) >= self._peak:
                self._peak_valid = False

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(t_s, values) views of the kept points, oldest first."""
        return self._t[self._start : self._end], self._v[self._start : self._end]

    def peak(self) -> float:
        """The largest value kept (NaN ignored); 0.0 when empty. Kept up to date on append."""
        if not self._peak_valid:
            _, v = self.arrays()
            self._peak = float(np.nanmax(v)) if len(v) and not np.all(np.isnan(v)) else 0.0
            self._peak_valid = True
        return self._peak

    def last(self) -> float | None:
        """The newest value or None."""
        return float(self._v[self._end - 1]) if len(self) else None

    def clear(self) -> None:
        """Drop every point."""
        self._start = self._end = 0
        self._peak, self._peak_valid = 0.0, True
        self.version += 1
