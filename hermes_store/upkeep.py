"""A store's housekeeping thread: index upkeep that no caller waits for.

Where writers run side by side (a server), the upkeep a write makes due (catching the
short-CJK index up, merging an index's pending list) runs here, on one daemon thread
per store, after the caller's call has returned. A job asked for again while it is
still waiting runs once. Failures are logged and the job is simply asked for again at
the next interval: rows the index does not cover yet are still found by a scan.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Seconds a worker with nothing to do waits before it ends.
IDLE_EXIT_S = 30.0


class Upkeep:
    """One worker thread, started on the first job; :meth:`close` stops it."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._jobs: dict[str, Callable[[], object]] = {}
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running: str | None = None
        self._closed = False
        self._pid = os.getpid()

    def submit(self, name: str, job: Callable[[], object]) -> None:
        """Run ``job`` soon on the worker (once, however often it is asked for meanwhile)."""
        if self._pid != os.getpid():
            self._after_fork()
        with self._cv:
            if self._closed:
                return
            self._jobs.setdefault(name, job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=f"hermes-store upkeep {self._label}",
                                                daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _after_fork(self) -> None:
        """A forked child has none of the parent's threads (nor a usable lock state):
        start from nothing, so its own upkeep still runs."""
        self._cv = threading.Condition()
        self._jobs = {}
        self._thread = None
        self._running = None
        self._pid = os.getpid()

    @property
    def closing(self) -> bool:
        """Whether :meth:`close` was called (a long job stops between its transactions)."""
        return self._closed

    def _work(self) -> None:
        while True:
            with self._cv:
                # An idle worker ends (the next job starts another), so a store that was
                # never closed leaves no thread behind, and no reference to itself.
                if not self._cv.wait_for(lambda: self._jobs or self._closed, IDLE_EXIT_S) or self._closed:
                    self._thread = None
                    self._cv.notify_all()
                    return
                name = next(iter(self._jobs))
                job: Callable[[], object] | None = self._jobs.pop(name)
                self._running = name
            try:
                assert job is not None
                job()
            except Exception:
                log.warning("%s: background %s failed; retried later", self._label, name, exc_info=True)
            finally:
                job = None
                with self._cv:
                    self._running = None
                    self._cv.notify_all()

    def pause(self, seconds: float) -> bool:
        """Sleep on the worker for ``seconds`` (a job yielding to callers); True, at once,
        when the store is closing."""
        with self._cv:
            return self._cv.wait_for(lambda: self._closed, seconds)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no job is waiting or running; False when ``timeout`` ran out first."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._jobs and self._running is None, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Drop waiting jobs and let a running one finish (each is one bounded transaction)."""
        with self._cv:
            self._closed = True
            self._jobs.clear()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
