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
from collections import deque
from contextlib import asynccontextmanager, contextmanager
from collections.abc import AsyncIterator, Iterator

from sqlalchemy.util import await_only

from .. import errors

#: Per event loop, one writer queue per SQLite file.
_WRITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, TaskQueue]] = weakref.WeakKeyDictionary()


class TaskQueue:
    """At most ``size`` tasks at a time, served in arrival order; a task already in may
    enter again (the facade runs its upkeep inside a write call), so nesting never
    deadlocks.

    Taking a free turn costs no await at all (it is taken on every call of a store), and
    a wait is a bare future under ``asyncio.timeout``: no task is created per wait (as
    ``asyncio.wait_for`` would). A released turn goes straight to the first in line.
    """

    def __init__(self, label: str, size: int = 1) -> None:
        self.label = label
        self._free = size
        self._line: deque[asyncio.Future[None]] = deque()
        self._depth: dict[asyncio.Task[object], int] = {}

    def _enter_now(self, task: asyncio.Task[object]) -> bool:
        """Take a turn without waiting if one is free (or re-enter ``task``'s)."""
        depth = self._depth.get(task)
        if depth:
            self._depth[task] = depth + 1
            return True
        if self._free > 0 and not self._line:
            self._free -= 1
            self._depth[task] = 1
            return True
        return False

    async def _wait(self, task: asyncio.Task[object], timeout: float) -> bool:
        """Wait in line for a turn (the releaser hands it over); DatabaseLockedError after ``timeout``."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await turn
        except TimeoutError:
            if not turn.done():  # handed over at the last moment: the turn is ours after all
                self._line.remove(turn)
                raise errors.DatabaseLockedError(
                    f"{self.label}: other tasks of this event loop held it for {timeout:.3g}s; giving up"
                ) from None
        except BaseException:  # cancelled: a turn handed over meanwhile goes to the next in line
            if turn.done() and not turn.cancelled():
                self._hand_on()
            else:
                self._line.remove(turn)
            raise
        self._depth[task] = 1
        return True

    async def acquire(self, timeout: float) -> bool:
        """Wait for a turn (or re-enter the one this task holds); DatabaseLockedError after ``timeout``."""
        task = asyncio.current_task()
        assert task is not None
        if self._enter_now(task):
            return True
        return await self._wait(task, timeout)

    def _hand_on(self) -> None:
        """A turn ended: to the first task still waiting in line, else back to the free ones."""
        while self._line:
            turn = self._line.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def release(self, task: asyncio.Task[object] | None) -> None:
        """End a turn of ``task`` (the task that acquired it: an ending may run in another)."""
        assert task is not None
        self._depth[task] -= 1
        if not self._depth[task]:
            del self._depth[task]
            self._hand_on()

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
        """``with queue.turn_on_greenlet(budget):`` from sync code run by ``aio.run_sync``
        (a free turn is taken without leaving the greenlet)."""
        task = asyncio.current_task()
        assert task is not None
        if not self._enter_now(task):
            await_only(self._wait(task, timeout))
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
