"""The one binary search over integers that the tuner, the advisor and the export check share.

Memory grows with the context, with the layers offloaded and with what a knob puts on a GPU,
so "does it fit?" is monotone in each of them: true up to some value and false above it (or,
for what a knob moves off the GPU, false below some value and true from it up). A binary
search finds that edge in ``log2(hi - lo + 1) + 1`` calls of the predicate.
"""

from __future__ import annotations

from collections.abc import Callable


def _bisect(ok: Callable[[int], bool], lo: int, hi: int, default: int | None, largest: bool) -> int | None:
    best = default
    while lo <= hi:
        mid = (lo + hi) // 2
        found = ok(mid)
        if found:
            best = mid
        if found == largest:
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def largest_true(ok: Callable[[int], bool], lo: int, hi: int, default: int | None = None) -> int | None:
    """The largest ``x`` in ``lo..hi`` with ``ok(x)``, for an ``ok`` that holds up to some value
    and not above it; ``default`` when it holds nowhere in the range (``lo > hi``: an empty range).

    Probes ``(lo + hi) // 2`` first and halves the range each call; a caller that knows
    ``ok(a)`` searches ``a + 1 .. hi`` with ``default=a``.
    """
    return _bisect(ok, lo, hi, default, largest=True)


def smallest_true(ok: Callable[[int], bool], lo: int, hi: int, default: int | None = None) -> int | None:
    """The smallest ``x`` in ``lo..hi`` with ``ok(x)``, for an ``ok`` that fails below some value
    and holds from it up; ``default`` when it holds nowhere in the range."""
    return _bisect(ok, lo, hi, default, largest=False)
