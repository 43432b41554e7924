"""Writers of one SQLite file in one process take turns here, first come first served.

SQLite lets one writer at a time into a file. Two writers of the same process that meet
at its write lock learn of each other only through ``SQLITE_BUSY``: the loser sleeps in
SQLite's busy handler (or in our retry jitter) and wakes on a timer, not when the lock
is free, so eight threads spend most of their time asleep. Here they wait on each other
instead: every write transaction of ours (``BEGIN IMMEDIATE`` from any ``SessionDB``,
engine or unit of work on the file) first takes the file's turn, and the holder hands it
straight to the next in line when its transaction ends. Only writers in *other*
processes still meet SQLite's busy handling, and the retry budget above it.

The queue is per file (its resolved path) and per process, shared by every engine of
ours on that file. A turn belongs to the DB-API connection that began the transaction,
and ends when that connection commits, rolls back or closes: :func:`install` wraps those
three calls of an engine's dialect instance (the pool calls the same ones when it resets
or discards a connection, so a turn never outlives its transaction). Waiters are threads
(a ``threading.Event`` each) or event-loop tasks (a future, woken thread-safely), in one
line. A waiter whose budget runs out leaves the line; its caller raises
:class:`~hermes_store.errors.DatabaseLockedError`, which the retry loops accept as a lock.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.util import await_only

from . import errors

#: Connection execution option: seconds a write may wait for its turn (what is left of
#: the caller's budget). Without it, the engine's own default (its busy timeout).
WAIT_OPTION = "hermes_store_turn_wait_s"


@dataclass(eq=False)
class _Waiter:
    """One writer in line. ``granted`` is set under the queue's mutex, so a waiter whose
    wait just timed out can still tell that the turn reached it."""

    owner: object
    event: threading.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[bool] | None = None
    granted: bool = False

    def grant(self) -> bool:
        """Hand the turn over; False when this waiter can no longer take it (its loop closed)."""
        if self.event is not None:
            self.granted = True
            self.event.set()
            return True
        assert self.loop is not None and self.future is not None
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:  # the loop is closed: nobody is left to take the turn
            return False
        self.granted = True
        return True


def _resolve(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(True)


@dataclass(eq=False)
class WriterQueue:
    """The turn to write one file, held by at most one connection, handed over in order."""

    key: str
    _mutex: threading.Lock = field(default_factory=threading.Lock)
    _holder: object | None = None
    _line: deque[_Waiter] = field(default_factory=deque)
    #: ``time.monotonic()`` when the last turn ended with nobody in line.
    _idle_since: float = 0.0

    def _enter(self, owner: object) -> bool:
        """Take the turn at once if it is free and nobody waits (call under the mutex)."""
        if self._holder is None and not self._line:
            self._holder = owner
            return True
        return False

    def take_now(self, owner: object) -> bool:
        """Take the turn if it is free and nobody waits, without waiting: an async taker's
        common case, with no coroutine to await."""
        with self._mutex:
            return self._enter(owner)

    def take(self, owner: object, timeout: float) -> bool:
        """Wait (this thread) for the turn, at most ``timeout`` seconds; False if it never came."""
        with self._mutex:
            if self._enter(owner):
                return True
            waiter = _Waiter(owner, event=threading.Event())
            self._line.append(waiter)
        waiter.event.wait(max(0.0, timeout))  # type: ignore[union-attr]
        return self._settle(waiter)

    async def take_async(self, owner: object, timeout: float) -> bool:
        """:meth:`take` for a task on an event loop: the loop runs other tasks meanwhile."""
        loop = asyncio.get_running_loop()
        with self._mutex:
            if self._enter(owner):
                return True
            waiter = _Waiter(owner, loop=loop, future=loop.create_future())
            self._line.append(waiter)
        assert waiter.future is not None
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await waiter.future
        except TimeoutError:
            pass
        except BaseException:  # cancelled: a turn handed over meanwhile goes to the next
            if self._settle(waiter):
                self.release(owner)
            raise
        return self._settle(waiter)

    def _settle(self, waiter: _Waiter) -> bool:
        """After a wait: whether the turn reached ``waiter``; if not, it leaves the line."""
        with self._mutex:
            if waiter.granted:
                return True
            self._line.remove(waiter)
            return False

    def release(self, owner: object) -> None:
        """End ``owner``'s turn (nothing if it holds none) and hand it to the next in line."""
        with self._mutex:
            if self._holder is not owner:
                return
            while self._line:
                waiter = self._line.popleft()
                if waiter.grant():
                    self._holder = waiter.owner
                    return
            self._holder = None
            self._idle_since = time.monotonic()

    def holds(self, owner: object) -> bool:
        return self._holder is owner

    def waiting(self) -> int:
        """Writers in line now (tests and diagnostics)."""
        return len(self._line)

    def idle_for(self) -> float:
        """Seconds since this process's writers of the file last let go of it; 0 while
        one holds the turn or waits for it (upkeep goes after them)."""
        with self._mutex:
            if self._holder is not None or self._line:
                return 0.0
            return time.monotonic() - self._idle_since


class Signal(Protocol):
    """What a :class:`Job`'s caller sleeps on: set once, from any thread."""

    def set(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class LoopSignal:
    """A :class:`Signal` for a task running sync code on a greenlet of its event loop
    (``hermes_store.aio``): waiting suspends the task, so the loop runs the others,
    among them the one writing the batch."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[bool] = self._loop.create_future()

    def set(self) -> None:
        with suppress(RuntimeError):  # a closed loop has nobody left to wake
            self._loop.call_soon_threadsafe(_resolve, self._future)

    def wait(self, timeout: float | None = None) -> bool:
        return bool(await_only(self._wait(timeout)))

    async def _wait(self, timeout: float | None) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._future)
        except TimeoutError:
            pass
        return self._future.done()


@dataclass(eq=False)
class Job:
    """One write posted to a :class:`Batcher`: ``run(batch_context)`` and its outcome."""

    run: Callable[[Any], Any]
    event: Signal = None  # type: ignore[assignment]  # a follower's, made when it queues
    #: queued -> taken (in a batch being written) -> done
    state: str = "queued"
    lead: bool = False
    result: Any = None
    error: BaseException | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class Batcher:
    """Writes posted while another batch is being written go together, in one transaction.

    Group commit, for one store's hot writes (appends): the first caller leads and writes
    every job posted so far in one transaction (its ``write`` callback, which keeps one
    failing job from taking the others down with it); the others sleep until
    their job's outcome is known, which is after the COMMIT, so nothing is acknowledged
    before it is durable. A leader hands leadership to the oldest job still queued and
    returns, so no caller writes for others longer than one batch. A job still queued
    when its caller's ``timeout`` ends is withdrawn (its caller gives up typed); a job
    already taken into a batch waits for that batch's outcome.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """An empty line with nobody leading (at creation, and in a forked child)."""
        self._mutex = threading.Lock()
        self._queued: list[Job] = []
        self._leading = False
        self._last_size = 0
        self._pid = os.getpid()

    def submit(self, run: Callable[[Any], Any], write: Callable[[list[Job]], None], timeout: float,
               on_timeout: Callable[[], BaseException], signal: Callable[[], Signal] = threading.Event,
               pause: Callable[[], None] | None = None) -> Any:
        """``run``'s outcome, written by this caller (leading) or by another leader.

        ``write(jobs)`` writes a batch and records each job's result or error;
        ``on_timeout()`` is the error of a job withdrawn unwritten; ``signal()`` makes
        what this caller sleeps on (a thread's event, or a :class:`LoopSignal`);
        ``pause()``: see :meth:`_lead`."""
        if self._pid != os.getpid():
            self._reset()  # a forked child: the parent's leader and line are not here
        job = Job(run)
        with self._mutex:
            self._queued.append(job)
            if not self._leading:
                self._leading = job.lead = True
            else:
                job.event = signal()  # only a follower sleeps (made before anyone can wake it)
        if not job.lead:
            try:
                job.event.wait(max(0.0, timeout))
                with self._mutex:
                    if job.state == "queued" and not job.lead:
                        self._queued.remove(job)
                        raise on_timeout()
                if not job.lead:
                    job.event.wait()  # taken into a batch: its outcome comes after that COMMIT
                    return job.outcome()
            except BaseException:
                self._withdraw(job)  # cancelled while waiting: a job not yet taken is not written
                raise
        self._lead(write, pause)
        return job.outcome()

    def _withdraw(self, job: Job) -> None:
        """Take a job not yet in a batch out of the line (leadership it was handed goes on)."""
        with self._mutex:
            if job.state != "queued" or job not in self._queued:
                return
            self._queued.remove(job)
            if job.lead:
                self._hand_on()

    def _hand_on(self) -> None:
        """Leadership to the oldest queued job, or to whoever comes next (under the mutex)."""
        if self._queued:
            heir = self._queued[0]
            heir.lead = True
            heir.event.set()
        else:
            self._leading = False

    def _lead(self, write: Callable[[list[Job]], None], pause: Callable[[], None] | None) -> None:
        """Write one batch (this caller's job is in it), wake its jobs, pass leadership on.

        After a batch of several, ``pause()`` first lets the callers just woken from it
        post their next writes (a thread gives up the GIL, a task its loop turn), so they
        join this batch instead of waiting for the next one."""
        if pause is not None and self._last_size > 1:
            pause()
        # What a job's caller sees unless ``write`` records its outcome.
        unwritten = errors.HermesStoreError("the batch holding this write ended before writing it")
        with self._mutex:
            batch, self._queued = self._queued, []
            for job in batch:
                job.state = "taken"
                job.error = unwritten
            self._last_size = len(batch)
        try:
            write(batch)
        except BaseException as exc:  # recorded, not raised: the leader's own job carries it
            for job in batch:
                if job.error is unwritten:
                    job.error = exc
        finally:
            with self._mutex:
                for job in batch:
                    job.state = "done"
                    if not job.lead:
                        job.event.set()
                self._hand_on()


#: One queue per file in this process (weak: a file nobody has an engine on has none).
_QUEUES: weakref.WeakValueDictionary[str, WriterQueue] = weakref.WeakValueDictionary()
_QUEUES_LOCK = threading.Lock()


def for_file(path: str | os.PathLike[str]) -> WriterQueue:
    """The process's queue for the file at ``path`` (symlinks resolved, so two spellings
    of one file share it)."""
    key = os.path.realpath(os.path.abspath(os.fspath(path)))
    with _QUEUES_LOCK:
        queue = _QUEUES.get(key)
        if queue is None:
            queue = _QUEUES[key] = WriterQueue(key)
        return queue


#: Batchers shared by the stores of one file in this process (weak: gone with the stores).
_BATCHERS: weakref.WeakValueDictionary[str, Batcher] = weakref.WeakValueDictionary()


def batcher_for(path: str | os.PathLike[str]) -> Batcher:
    """The batcher the thread-driven stores of the file at ``path`` share in this process:
    appends posted by any of them while one is being written go into the next batch,
    whichever store's caller writes it (their connections are set up alike)."""
    key = os.path.realpath(os.path.abspath(os.fspath(path)))
    with _QUEUES_LOCK:
        batcher = _BATCHERS.get(key)
        if batcher is None:
            batcher = _BATCHERS[key] = Batcher()
        return batcher


@dataclass(frozen=True)
class Binding:
    """What an engine's dialect instance knows of its file's queue."""

    queue: WriterQueue
    #: Seconds a write without :data:`WAIT_OPTION` waits for its turn.
    default_wait_s: float


#: Dialect instance (one per engine, shared by its option engines) -> its binding.
_BOUND: weakref.WeakKeyDictionary[Any, Binding] = weakref.WeakKeyDictionary()


def _raw(connection: Any) -> Any:
    """The DB-API connection a pool proxy stands for (the owner of a turn)."""
    return getattr(connection, "dbapi_connection", connection)


def install(dialect: Any, path: str | os.PathLike[str], *, default_wait_s: float) -> None:
    """Bind ``dialect`` (an engine's SQLAlchemy dialect instance) to the queue of ``path``,
    and end a connection's turn whenever the dialect commits, rolls back, closes or
    terminates it. Harmless when called again for the same dialect."""
    if dialect in _BOUND:
        return
    binding = Binding(for_file(path), default_wait_s)
    _BOUND[dialect] = binding
    queue = binding.queue
    for name in ("do_commit", "do_rollback", "do_close", "do_terminate"):
        original = getattr(dialect, name)

        def ending(connection: Any, _original: Any = original) -> None:
            try:
                _original(connection)
            finally:
                queue.release(_raw(connection))

        setattr(dialect, name, ending)


def binding_of(dialect: Any) -> Binding | None:
    """The queue binding of an engine's dialect, or None (a host's engine, memory database)."""
    return _BOUND.get(dialect)


def _forget_after_fork() -> None:
    """A forked child inherits turns held by threads that do not exist in it: start clean."""
    global _QUEUES_LOCK
    _QUEUES_LOCK = threading.Lock()
    for queue in list(_QUEUES.values()):
        queue._mutex = threading.Lock()
        queue._holder = None
        queue._line.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


__all__ = [
    "WAIT_OPTION", "Batcher", "Binding", "Job", "LoopSignal", "Signal", "WriterQueue",
    "batcher_for", "binding_of", "for_file", "install",
]
