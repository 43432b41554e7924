"""Waiting in line on an event loop, instead of in SQLite's busy wait.

A SQLite file has one writer at a time, and aiosqlite gives every connection a thread
of its own. Fifty tasks that each open a connection and spin in ``busy_timeout`` cost
fifty threads fighting for the GIL, and the loop stalls while each one starts. So, on
one event loop, the writers of one file take turns here (one :class:`TaskQueue` per
file, shared by every unit of work and store of that loop), and a store's readers
hold at most as many connections as it keeps idle. Other processes are still met by
``busy_timeout`` and the lock errors it ends in.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from contextlib import asynccontextmanager, contextmanager
from collections.abc import AsyncIterator, Iterator

from sqlalchemy.util import await_only

from .. import errors

#: Per event loop, one writer queue per SQLite file.
_WRITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, TaskQueue]] = weakref.WeakKeyDictionary()


class TaskQueue:
    """At most ``size`` tasks at a time; a task already in may enter again (the facade
    runs its upkeep inside a write call), so nesting never deadlocks."""

    def __init__(self, label: str, size: int = 1) -> None:
        self.label = label
        self._slots = asyncio.Semaphore(size)
        self._depth: dict[asyncio.Task[object], int] = {}

    async def acquire(self, timeout: float) -> bool:
        """Wait for a turn (or re-enter the one this task holds); DatabaseLockedError after ``timeout``."""
        task = asyncio.current_task()
        assert task is not None
        if self._depth.get(task):
            self._depth[task] += 1
            return True
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout)
        except TimeoutError:
            raise errors.DatabaseLockedError(
                f"{self.label}: other tasks of this event loop held it for {timeout:.3g}s; giving up"
            ) from None
        self._depth[task] = 1
        return True

    def release(self, task: asyncio.Task[object] | None) -> None:
        """End a turn of ``task`` (the task that acquired it: an ending may run in another)."""
        assert task is not None
        self._depth[task] -= 1
        if not self._depth[task]:
            del self._depth[task]
            self._slots.release()

    @asynccontextmanager
    async def turn(self, timeout: float) -> AsyncIterator[None]:
        """``async with queue.turn(budget):`` from a coroutine."""
        await self.acquire(timeout)
        task = asyncio.current_task()
        try:
            yield
        finally:
            self.release(task)

    @contextmanager
    def turn_on_greenlet(self, timeout: float) -> Iterator[None]:
        """``with queue.turn_on_greenlet(budget):`` from sync code run by ``aio.run_sync``."""
        await_only(self.acquire(timeout))
        task = asyncio.current_task()
        try:
            yield
        finally:
            self.release(task)


def writer_queue(database: str) -> TaskQueue:
    """The writers' queue of the SQLite file ``database`` on the running loop."""
    per_loop = _WRITERS.setdefault(asyncio.get_running_loop(), {})
    key = os.path.realpath(database)
    if key not in per_loop:
        per_loop[key] = TaskQueue(key)
    return per_loop[key]


__all__ = ["TaskQueue", "writer_queue"]
