"""``aio.AsyncSessionDB``: every public ``SessionDB`` method as a coroutine, natively async.

No thread pool: the sync facade's own code (its retries, budgets, row shapes and Hermes
semantics) runs on the event loop's greenlet over an async engine, so every statement
awaits the driver and the loop serves other tasks meanwhile. What would block a loop
is swapped for a loop-friendly equivalent:

- the wait between two tries of a locked write is ``asyncio.sleep``;
- background index upkeep (PostgreSQL) is an asyncio task, not a thread;
- creating, adopting or migrating a SQLite file runs on a worker thread (it is file
  work, and Hermes users have 1 GB files).

On SQLite, aiosqlite runs each connection's statements on a thread of its own, and a
trip there and back (a "hop": two thread wake-ups) costs about what a short statement
does. So a call's work on its connection goes there whole (``run_whole``): a read runs
its statements and ends its snapshot in one hop, a batch of appends runs its jobs and
its COMMIT in one, another write its statements and its COMMIT in one. The loop keeps
what needs the loop: the turns, the BEGIN's write turn, retries and waits. A batch of
appends the driver's thread is idle for runs on the loop's thread itself instead (no
hop; ``OneHopConnection.run_whole``'s ``here``), unless another process holds the lock.

Hermes' own thread-wrapper ``AsyncSessionDB(db)`` stays in ``hermes_state`` for Hermes' code.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
from pathlib import Path
from typing import Any
from collections.abc import Callable, Coroutine

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only

from .. import dialects, errors, facade, migrations, write_queue
from ..dialects import for_url
from ..engine import with_schema
from ..facade import MAX_IDLE_CONNECTIONS, URL_ENV, SessionDB
from ..repositories.transcripts import remove_committed_files
from ..targets import refuse_sync
from .engine import OneHopAiosqlite, OneHopConnection, async_url, create_async_engine, run_sync
from .queues import TaskQueue, writer_queue
from .surface import SessionDBAwaited

log = logging.getLogger(__name__)

#: Calls of one kind (reads, writes) one store runs at once on a server. More tasks
#: than this wait their turn on the loop; the store's pool holds about twice as many.
SERVER_CALLS = 8


class LoopUpkeep:
    """:class:`hermes_store.upkeep.Upkeep` on an event loop: each job an asyncio task."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._again: set[str] = set()
        self._closed = False

    @property
    def closing(self) -> bool:
        return self._closed

    def submit(self, name: str, job: Callable[[], object]) -> None:
        """Run ``job`` soon (once more after a run under way, however often it is asked)."""
        if self._closed:
            return
        running = self._tasks.get(name)
        if running is not None and not running.done():
            self._again.add(name)
            return
        self._tasks[name] = asyncio.get_running_loop().create_task(self._run(name, job))

    async def _run(self, name: str, job: Callable[[], object]) -> None:
        while True:
            try:
                await run_sync(job)
            except Exception:
                log.warning("%s: background %s failed; retried later", self._label, name, exc_info=True)
            if name not in self._again or self._closed:
                return
            self._again.discard(name)

    def pause(self, seconds: float) -> bool:
        """A job yielding to callers for ``seconds`` (on the loop's greenlet: the loop runs
        them meanwhile); True, at once, when the store is closing."""
        if not self._closed:
            await_only(asyncio.sleep(max(0.0, seconds)))
        return self._closed

    def _pending(self) -> list[asyncio.Task[Any]]:
        return [t for t in self._tasks.values() if not t.done()]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Called on the loop's greenlet (``await db.wait_for_upkeep()``)."""
        pending = self._pending()
        if pending:
            await_only(asyncio.wait(pending, timeout=timeout))
        return not self._pending()

    def close(self, timeout: float = 30.0) -> None:
        """Let a running job end its transaction; waiting repeats are dropped."""
        self._closed = True
        self._again.clear()
        self.wait_idle(timeout)


class LoopSessionDB(SessionDB):
    """The sync facade, driven on an event loop's greenlets (see the module docstring).
    Made by :class:`AsyncSessionDB`; its methods must run under :func:`run_sync`."""

    #: Queued token deltas are applied at once: a writer thread would drive this store's
    #: connections outside the loop's greenlets.
    _token_counts_in_background = False

    def __init__(self, *args: Any, async_driver: str, engine_options: dict[str, Any], **kwargs: Any) -> None:
        self._async_driver = async_driver
        self._engine_options = engine_options
        # AsyncSessionDB(path, key=...): the sync facade opens and migrates the encrypted file with it.
        kwargs.setdefault("key", engine_options.get("key"))
        self.async_engine: AsyncEngine | None = None
        self._writers: TaskQueue | None = None
        self._readers: TaskQueue | None = None
        #: Whether a call's work goes to its connection's thread whole (see the module docstring).
        self._whole = False
        super().__init__(*args, **kwargs)

    def _write(self, fn: Callable[..., Any], *, budget: float | None = None, **kwargs: Any) -> Any:
        hooked = bool(self.__dict__.get("_pre_commit_hooks"))  # Hermes v30: one write, one transaction
        if self._writers is None or (kwargs.get("combine") and self._dialect.one_writer_at_a_time and not hooked):
            # A write that may go in a batch (an append on a file) waits in the store's
            # batcher instead (write_queue.Batcher): the tasks in line are written together,
            # in one hop (_write_batch).
            return super()._write(fn, budget=budget, **kwargs)
        if self._whole and not hooked:
            # The statements and the COMMIT in one hop (a pre-commit hook must run before
            # that COMMIT, so a hooked write keeps the facade's own).
            fn = _whole(fn, commit=True)
        with self._writers.turn_on_greenlet(budget if budget is not None else write_budget()):
            return super()._write(fn, budget=budget, **kwargs)

    def _write_batch(self, jobs: list[write_queue.Job], deadline: float) -> None:
        """The facade's batch (one transaction, a failing job's batch written again
        without it), with its jobs and COMMIT in one hop to the connection's thread. The
        BEGIN is made on the loop, where waiting for the file's write turn can await."""
        if not self._whole:
            return super()._write_batch(jobs, deadline)
        pending = list(jobs)
        with self._borrow(write=True) as (conn, _kept):
            raw = conn.connection.dbapi_connection
            assert isinstance(raw, OneHopConnection)
            while pending:
                conn.execution_options(**{write_queue.WAIT_OPTION: max(0.0, deadline - facade._monotonic())})
                try:
                    transaction = conn.begin()  # the turn; the BEGIN itself rides with the hop
                    raw.run_whole(_write_jobs, conn, transaction, pending, here=True)
                except _JobFailed as failed:
                    remove_committed_files(conn, committed=False)
                    pending.remove(failed.job)
                    continue
                except BaseException as exc:
                    # Nothing committed, unless the leader was cancelled while its hop ran
                    # on: then the jobs hold their outcomes (error None), and the leader's
                    # caller still sees its cancellation (swallowed, it would break the
                    # caller's timeouts), its message written as after any late cancel.
                    committed = all(job.error is None for job in pending)
                    if not committed:
                        _end(conn)
                    for job in pending:
                        if not committed or job.lead:
                            job.error, job.result = exc, None
                    remove_committed_files(conn, committed=committed)
                    return
                remove_committed_files(conn)
                return

    def _outside(self, fn: Callable[..., Any], *, budget: float | None = None) -> Any:
        """A VACUUM or checkpoint takes this loop's writer turn, as a write does."""
        if self._writers is None:
            return super()._outside(fn, budget=budget)
        with self._writers.turn_on_greenlet(budget if budget is not None else write_budget()):
            return super()._outside(fn, budget=budget)

    def _read(self, fn: Callable[..., Any]) -> Any:
        if self._whole:
            fn = _whole(fn, end=True)  # the statements and the end of the snapshot in one hop
        if self._readers is None:
            return super()._read(fn)
        with self._readers.turn_on_greenlet(write_budget()):
            return super()._read(fn)

    def _new_engine(self, target: Any, **kwargs: Any) -> Engine:
        if self.db_path is not None:
            # A file: this loop's writers take turns, and readers hold at most the
            # connections a store keeps idle (hermes_store.aio.queues says why).
            self._writers = writer_queue(str(self.db_path))
            self._readers = TaskQueue(f"{self.db_path} readers", MAX_IDLE_CONNECTIONS)
        else:
            # A server: calls run side by side, SERVER_CALLS of each kind at a time, so the
            # Python work of many tasks is spread over loop turns, not stacked in one.
            label = self.url.render_as_string(hide_password=True)
            self._writers = TaskQueue(f"{label} writers", SERVER_CALLS)
            self._readers = TaskQueue(f"{label} readers", SERVER_CALLS)
        url = async_url(target).set(drivername=self._async_driver)
        self.async_engine = create_async_engine(url, **{**kwargs, **self._engine_options})
        self._whole = isinstance(getattr(self.async_engine.dialect, "loaded_dbapi", None), OneHopAiosqlite)
        return self.async_engine.sync_engine

    def _migrate_file(self, path: Path) -> None:
        await_only(asyncio.to_thread(migrations.upgrade, path))

    def _migrate_keyed(self, path: Path, url: Any) -> None:
        await_only(asyncio.to_thread(super()._migrate_keyed, path, url))  # off the loop, as a plain file's

    def _new_upkeep(self, label: str) -> LoopUpkeep:  # type: ignore[override]
        return LoopUpkeep(label)

    def _sleep(self, seconds: float) -> None:
        await_only(asyncio.sleep(seconds))

    def _new_batcher(self, path: Path) -> write_queue.Batcher:
        return write_queue.Batcher()  # this store's tasks only: they wait on its loop

    def _batch_signal(self) -> write_queue.Signal:
        return TaskSignal()  # the task waits; its loop runs the one writing the batch

    def _batch_pause(self) -> None:
        """The tasks just woken from a batch post their next appends first: one loop turn,
        as a :class:`TaskSignal` set on the loop wakes its task in the next turn."""
        await_only(asyncio.sleep(0))


class TaskSignal:
    """The :class:`~hermes_store.write_queue.Signal` a task of this store's batcher sleeps
    on (on its greenlet: the loop runs the others meanwhile, the leader among them).

    Cheap on purpose, as every follower of every batch makes one: set on the loop's
    thread (a leader's, the usual case) it wakes the task in the next loop turn, without
    the self-pipe write of a thread-safe call; a wait awaits its own future, under a
    plain timer, so the task steps as soon as that future is set (a shield or a timeout
    block would cost another loop turn per wake-up, for each follower)."""

    __slots__ = ("_loop", "_set", "_thread", "_waiting")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._set = False
        self._waiting: asyncio.Future[None] | None = None

    def set(self) -> None:
        if threading.get_ident() == self._thread:
            self._wake()
        else:
            with contextlib.suppress(RuntimeError):  # a closed loop has nobody left to wake
                self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._set = True
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def wait(self, timeout: float | None = None) -> bool:
        if not self._set:
            await_only(self._wait(timeout))
        return self._set

    async def _wait(self, timeout: float | None) -> None:
        waiting = self._waiting = self._loop.create_future()
        timer = None if timeout is None else self._loop.call_later(timeout, _time_up, waiting)
        try:
            await waiting
        finally:
            self._waiting = None
            if timer is not None:
                timer.cancel()


def _time_up(waiting: asyncio.Future[None]) -> None:
    if not waiting.done():
        waiting.set_result(None)


class _JobFailed(Exception):
    """A job of a batch failed: the batch was rolled back, to be written again without it."""

    def __init__(self, job: write_queue.Job) -> None:
        super().__init__()
        self.job = job


def _write_jobs(conn: Connection, transaction: Any, jobs: list[write_queue.Job]) -> None:
    """On the connection's thread: ``jobs`` then the COMMIT, then each job's outcome
    (recorded here, so a caller cancelled meanwhile cannot lose a committed one)."""
    results: list[tuple[write_queue.Job, Any]] = []
    with transaction:  # commits at the end; rolls back on an error, the COMMIT's too
        for job in jobs:
            try:
                results.append((job, job.run(conn)))
            except Exception as exc:
                if len(jobs) == 1:
                    raise
                job.error, job.result = exc, None
                raise _JobFailed(job) from exc
    for job, value in results:
        job.error, job.result = None, value


def _end(conn: Connection) -> None:
    """After a failed batch: no transaction left open on a connection going back to idle."""
    try:
        if conn.in_transaction() and not conn.invalidated:
            conn.rollback()
    except Exception:
        conn.invalidate()


def _whole(fn: Callable[[Connection], Any], *, end: bool = False, commit: bool = False
           ) -> Callable[[Connection], Any]:
    """``fn(conn)`` in one hop to the thread of ``conn``'s aiosqlite connection; with
    ``end``, the read snapshot ends in the same hop; with ``commit``, the write's
    transaction is committed there once ``fn`` returns (the facade's own COMMIT, which
    comes right after ``fn``, then finds nothing left to commit)."""
    def run(conn: Connection) -> Any:
        raw = conn.connection.dbapi_connection
        if not isinstance(raw, OneHopConnection):
            return fn(conn)
        if end:
            return raw.run_whole(_read_and_end, conn, fn)
        if commit:
            return raw.run_whole(_write_and_commit, conn, fn)
        return raw.run_whole(fn, conn)
    return run


def _write_and_commit(conn: Connection, fn: Callable[[Connection], Any]) -> Any:
    result = fn(conn)
    conn.commit()
    return result


def _read_and_end(conn: Connection, fn: Callable[[Connection], Any]) -> Any:
    try:
        return fn(conn)
    finally:
        if not conn.invalidated:
            conn.rollback()


def write_budget() -> float:
    """The facade's write budget, read at call time as the facade reads it."""
    return float(facade.WRITE_BUDGET_S)


def _sync_face(target: Any, schema: str | None) -> tuple[Path | URL | None, str]:
    """(what the sync facade is given, the async driver to reach it with)."""
    if target is None:
        return None, "aiosqlite"  # $HERMES_STORE_URL or Hermes' default file, as SessionDB
    if isinstance(target, AsyncEngine):
        target = target.url
    url = async_url(with_schema(target, schema) if schema is not None else target)
    driver = url.drivername
    dialect = for_url(url)
    path = dialect.database_path(url)
    if path is not None:
        return Path(path).expanduser(), driver
    if dialect.holders_on_this_machine:  # a database of this machine's without a file: in memory
        raise errors.InvalidInputError(f"AsyncSessionDB needs a database file, not {url.render_as_string()}")
    return dialects.with_driver(url, asyncio=False), driver


#: Method name -> whether SessionDB's method is a generator (awaited, its items as a list);
#: filled on first call of each name.
_GENERATORS: dict[str, bool] = {}


def _is_generator(name: str) -> bool:
    known = _GENERATORS.get(name)
    if known is None:
        known = _GENERATORS[name] = inspect.isgeneratorfunction(getattr(SessionDB, name))
    return known


class AsyncSessionDB(SessionDBAwaited):
    """Hermes' ``SessionDB`` API, awaited: ``async with AsyncSessionDB(url) as db``.

    ``target``: a SQLite file path, a URL (``sqlite+aiosqlite://``, ``postgresql+asyncpg://``,
    ``postgresql+psycopg://``; a sync-driver URL gets its database's default async
    driver) or an AsyncEngine (its URL: the store opens its own engine, as SessionDB
    does, and never disposes yours). Opening happens at ``async with`` / :meth:`open`,
    or at the first call.

    Every public SessionDB method is a coroutine here with the sync method's signature,
    for type checkers too (:mod:`hermes_store.aio.surface`, generated).
    """

    def __init__(self, target: str | os.PathLike[str] | URL | AsyncEngine | None = None, *,
                 schema: str | None = None, read_only: bool = False, **engine_options: Any) -> None:
        refuse_sync(target, "AsyncSessionDB")
        self._face, self._driver = _sync_face(target, schema)
        self._read_only = read_only
        self._engine_options = engine_options
        self._db: LoopSessionDB | None = None
        self._opening: asyncio.Lock | None = None

    async def open(self) -> AsyncSessionDB:
        """Open (create, adopt or migrate as needed) the store; once."""
        if self._db is not None:
            return self
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._db is None:
                if self._face is None and os.environ.get(URL_ENV):
                    # As SessionDB(): $HERMES_STORE_URL at open time, else Hermes' default file.
                    self._face, self._driver = _sync_face(os.environ[URL_ENV], None)
                self._db = await run_sync(LoopSessionDB, self._face, self._read_only, async_driver=self._driver,
                                          engine_options=self._engine_options)
        return self

    async def close(self) -> None:
        """Finish upkeep under way, close every connection and dispose our engine."""
        db, self._db = self._db, None
        if db is not None:
            await run_sync(db.close)

    async def __aenter__(self) -> AsyncSessionDB:
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def engine(self) -> AsyncEngine | None:
        """Our AsyncEngine (None before the store is opened)."""
        return self._db.async_engine if self._db is not None else None

    @property
    def db_path(self) -> Path | None:
        return self._db.db_path if self._db is not None else self._face if isinstance(self._face, Path) else None

    @property
    def url(self) -> URL | None:
        return self._db.async_engine.url if self._db is not None and self._db.async_engine is not None else None

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Coroutine[Any, Any, Any]:
        """The call's coroutine: on an open store, :func:`run_sync` itself (no coroutine
        of ours in between, as this runs for every call)."""
        db = self._db
        if db is None:
            return self._open_then_call(name, args, kwargs)
        if _is_generator(name):
            method = getattr(db, name)
            return run_sync(lambda: list(method(*args, **kwargs)))
        return run_sync(getattr(db, name), *args, **kwargs)

    async def _open_then_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        await self.open()
        return await self._call(name, args, kwargs)


__all__ = ["AsyncSessionDB", "LoopSessionDB", "LoopUpkeep"]
