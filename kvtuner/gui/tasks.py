"""Background work for the GUI without blocking its thread: a small thread pool whose results
are collected by a QTimer on the GUI thread (pull, never a cross-thread call into widgets)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from PySide6 import QtCore


class BackgroundTasks(QtCore.QObject):
    """Run callables on worker threads; ``on_done(result)`` / ``on_error(exc)`` are called on the
    GUI thread by a 50 ms timer. :attr:`pending` counts tasks not yet delivered."""

    def __init__(self, parent: QtCore.QObject | None = None, max_workers: int = 2, poll_ms: int = 50) -> None:
        super().__init__(parent)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kvtuner-gui")
        self._jobs: list[tuple[Future, Callable[[Any], None] | None, Callable[[BaseException], None] | None]] = []
        self._timer = QtCore.QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self.poll)

    @property
    def pending(self) -> int:
        """Tasks submitted and not yet delivered."""
        return len(self._jobs)

    def submit(
        self,
        fn: Callable[[], Any],
        on_done: Callable[[Any], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Future:
        """Run ``fn()`` on a worker thread."""
        fut = self._pool.submit(fn)
        self._jobs.append((fut, on_done, on_error))
        if not self._timer.isActive():
            self._timer.start()
        return fut

    def poll(self) -> None:
        """Deliver finished tasks (called by the timer; tests may call it directly)."""
        done = [j for j in self._jobs if j[0].done()]
        if not done:
            return
        self._jobs = [j for j in self._jobs if not j[0].done()]
        for fut, on_done, on_error in done:
            exc = fut.exception()
            if exc is not None:
                if on_error is not None:
                    on_error(exc)
            elif on_done is not None:
                on_done(fut.result())
        if not self._jobs:
            self._timer.stop()

    def shutdown(self) -> None:
        """Stop accepting work; running tasks finish on their own (threads are not killed)."""
        self._timer.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
