"""``hermes_store.aio`` under concurrency: 50 tasks on one SQLite file all succeed,
PostgreSQL units of work run side by side, the event loop is never blocked, asyncpg
needs no thread pool, and a cancelled task rolls back and leaves no connection checked
out and no lock held.

"Never blocked" is checked by its cause, not by a clock: while the tasks run, a profile
hook on every thread records where each blocking call ran (every method of sqlite3's
connections and cursors, psycopg's blocking waits, ``time.sleep``), and none may have
run on the loop's thread, except a store's short SQLite append run there with SQLite's
lock waits off (``BeginWithNext.run_here``, told apart and checked on its own). A lag figure measured on a busy machine says more about the
machine (a p99 of 287 ms failed CI once); ``bench/aio_bench.py`` prints it instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import text

from hermes_store import aio
from hermes_store.aio.engine import BeginWithNext

from .aio_support import async_url_for

N_TASKS = 50


class _NoThreads(concurrent.futures.ThreadPoolExecutor):
    """A default executor that refuses work: any ``to_thread``/``run_in_executor`` fails."""

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a thread pool was used")


#: psycopg's blocking waits (its sync driver's I/O; the async driver awaits ``wait_async``).
_BLOCKING_WAITS = frozenset({"wait", "wait_c", "wait_select", "wait_epoll", "wait_poll", "wait_conn",
                             "wait_conn_c"})
#: The recorders on, for the DB-API wrappers below.
_ACTIVE: list[BlockingCalls] = []


def _note(what: str) -> None:
    for recorder in _ACTIVE:
        recorder.record(what)


class _RecordingCursor(sqlite3.Cursor):
    def execute(self, *a: Any, **k: Any) -> Any:
        _note("sqlite3.Cursor.execute")
        return super().execute(*a, **k)

    def executemany(self, *a: Any, **k: Any) -> Any:
        _note("sqlite3.Cursor.executemany")
        return super().executemany(*a, **k)

    def executescript(self, *a: Any, **k: Any) -> Any:
        _note("sqlite3.Cursor.executescript")
        return super().executescript(*a, **k)

    def fetchone(self) -> Any:
        _note("sqlite3.Cursor.fetchone")
        return super().fetchone()

    def fetchmany(self, *a: Any, **k: Any) -> Any:
        _note("sqlite3.Cursor.fetchmany")
        return super().fetchmany(*a, **k)

    def fetchall(self) -> Any:
        _note("sqlite3.Cursor.fetchall")
        return super().fetchall()


class _RecordingConnection(sqlite3.Connection):
    def cursor(self, factory: Any = None) -> Any:  # type: ignore[override]
        _note("sqlite3.Connection.cursor")
        return super().cursor(factory or _RecordingCursor)

    def execute(self, *a: Any, **k: Any) -> Any:
        _note("sqlite3.Connection.execute")
        return super().execute(*a, **k)

    def executemany(self, *a: Any, **k: Any) -> Any:
        _note("sqlite3.Connection.executemany")
        return super().executemany(*a, **k)

    def executescript(self, *a: Any, **k: Any) -> Any:
        _note("sqlite3.Connection.executescript")
        return super().executescript(*a, **k)

    def commit(self) -> None:
        _note("sqlite3.Connection.commit")
        super().commit()

    def rollback(self) -> None:
        _note("sqlite3.Connection.rollback")
        super().rollback()

    def close(self) -> None:
        _note("sqlite3.Connection.close")
        super().close()


class BlockingCalls:
    """Records the thread of every blocking DB-API call (and ``time.sleep``) while active.

    sqlite3, at the DB-API level: ``sqlite3.connect`` hands out connections (and cursors)
    whose every statement, fetch, commit, rollback and close says which thread ran it,
    whoever calls them (aiosqlite's worker threads through ``functools.partial``, a sync
    engine). psycopg's blocking waits and ``time.sleep``: a ``sys.setprofile`` hook on this
    thread and a ``threading.setprofile`` one on the threads started meanwhile. Slow, and
    never timed. Calls are kept only while ``recording`` is true: the hooks go in before
    a store opens (its connections are made by the patched ``connect``), and the record
    covers what the test looks at.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []  # (thread ident, what)
        #: What ran inside ``BeginWithNext.run_here`` (a short write run by the loop's
        #: thread itself, with nothing in it allowed to wait), kept apart.
        self.short_writes: list[str] = []
        self._short_writers: set[int] = set()
        self.recording = True
        self._lock = threading.Lock()
        self._connect: Any = None

    def record(self, what: str) -> None:
        if self.recording:
            with self._lock:
                if self.short_write_on(threading.get_ident()):
                    self.short_writes.append(what)
                else:
                    self.calls.append((threading.get_ident(), what))

    def short_write_on(self, thread: int) -> bool:
        """Whether ``thread`` is running a short write on sqlite3 itself (see :meth:`__enter__`)."""
        return thread in self._short_writers

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            if arg is time.sleep:
                self.record("time.sleep")
            elif getattr(arg, "__name__", "") in _BLOCKING_WAITS and "psycopg" in str(getattr(arg, "__module__", "")):
                self.record(f"{arg.__module__}.{arg.__name__}")
        elif event == "call" and frame.f_code.co_name in _BLOCKING_WAITS \
                and frame.f_globals.get("__name__") == "psycopg.waiting":
            self.record(f"psycopg.waiting.{frame.f_code.co_name}")

    def __enter__(self) -> BlockingCalls:
        self._connect = connect = sqlite3.connect

        def recording_connect(*a: Any, **k: Any) -> Any:
            k.setdefault("factory", _RecordingConnection)
            return connect(*a, **k)

        sqlite3.connect = recording_connect  # type: ignore[assignment]
        # An append may run on the loop's thread, on sqlite3 itself, with every wait of
        # SQLite's off (hermes_store.aio.engine.BeginWithNext.run_here): those calls are
        # told apart, and test_a_short_write_on_the_loop_cannot_wait checks the waits are off.
        self._run_here = run_here = BeginWithNext.run_here
        short_writers = self._short_writers

        def marked(driver: Any, fn: Any, *args: Any) -> Any:
            me = threading.get_ident()
            short_writers.add(me)
            try:
                return run_here(driver, fn, *args)
            finally:
                short_writers.discard(me)

        BeginWithNext.run_here = marked  # type: ignore[method-assign]
        _ACTIVE.append(self)
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *_exc: Any) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        _ACTIVE.remove(self)
        sqlite3.connect = self._connect
        BeginWithNext.run_here = self._run_here  # type: ignore[method-assign]

    def on(self, thread: int) -> list[str]:
        with self._lock:
            return [what for ident, what in self.calls if ident == thread]

    def off(self, thread: int) -> list[str]:
        with self._lock:
            return [what for ident, what in self.calls if ident != thread]


#: Rounds of 50 concurrent tasks.
ROUNDS = 3


async def _fifty_appends_and_searches(db: aio.AsyncSessionDB) -> list[Any]:
    async def one(i: int) -> Any:
        sid = f"s{i}"
        await db.create_session(sid, "cli")
        await db.append_message(sid, "user", f"task {i} asks about kubernetes rollouts 数据库")
        await db.append_message(sid, "assistant", f"answer {i}")
        return await db.search_messages("kubernetes", limit=5)

    results: list[Any] = []
    for r in range(ROUNDS):
        results += await asyncio.gather(*(one(r * N_TASKS + i) for i in range(N_TASKS)))
    return results


def _loop_free_case(url: str, *, forbid_threads: bool) -> BlockingCalls:
    """Run the 50-task rounds with the recorder on; every call the tasks made, on and off the loop's thread."""
    recorder = BlockingCalls()

    async def run() -> None:
        if forbid_threads:
            asyncio.get_running_loop().set_default_executor(_NoThreads())
        loop_thread = threading.get_ident()
        recorder.recording = False
        with recorder:  # before the open: the driver's threads (aiosqlite's) carry the hook
            async with aio.AsyncSessionDB(url) as db:
                threads_before = threading.active_count()
                recorder.recording = True
                results = await _fifty_appends_and_searches(db)
                recorder.recording = False
                if forbid_threads:
                    assert threading.active_count() <= threads_before, "threads were started"
                assert all(r for r in results), "a search missed rows appended before it"
                assert await db.message_count() == 2 * N_TASKS * ROUNDS
                assert await db.session_count() == N_TASKS * ROUNDS
        blocked = recorder.on(loop_thread)
        assert not blocked, f"blocking calls ran on the event loop's thread: {sorted(set(blocked))[:10]}"
        assert "time.sleep" not in recorder.short_writes

    asyncio.run(run())
    return recorder


def test_fifty_tasks_on_one_sqlite_file_keep_the_loop_free(tmp_path: Path) -> None:
    recorder = _loop_free_case(async_url_for("aiosqlite", sqlite_path=tmp_path / "s.db"), forbid_threads=False)
    # The recorder saw the driver at work (off the loop, on aiosqlite's threads), so its
    # silence on the loop's thread means something.
    assert any(c.startswith("sqlite3.") for c in recorder.off(threading.get_ident())), "no sqlite3 call was seen"


def test_a_short_write_on_the_loop_cannot_wait_for_a_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append run by the loop's thread on sqlite3 itself (the calls the check above
    sets apart) runs with SQLite's busy timeout at 0: a lock held elsewhere fails it at
    once, and it hops instead (test_aio_speed_hops). The timeout is the connection's own
    again afterwards, for every other call. And the loop turns every few such writes of
    one task: a task writing in a tight loop does not starve the others."""
    from hermes_store.aio import engine, sessiondb

    seen: list[tuple[int, bool, int]] = []
    drivers: list[Any] = []
    write_jobs = sessiondb._write_jobs

    def looking(conn: Any, transaction: Any, pending: list[Any]) -> Any:
        driver = conn.connection.dbapi_connection._connection
        drivers.append(driver)
        seen.append((threading.get_ident(), driver.on_own_thread(),
                     conn.exec_driver_sql("PRAGMA busy_timeout").scalar()))
        return write_jobs(conn, transaction, pending)

    monkeypatch.setattr(sessiondb, "_write_jobs", looking)

    async def run() -> None:
        async with aio.AsyncSessionDB(tmp_path / "w.db", busy_timeout_ms=2500) as db:
            await db.create_session("s", "cli")
            await db.wait_for_upkeep()
            seen.clear()
            await db.append_message("s", "user", "short")
            assert seen == [(threading.get_ident(), True, 0)], seen
            driver = drivers[0]
            assert driver.idle()  # back in the pool: asked here, on sqlite3 itself
            assert driver._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
            turns = 0

            async def other() -> None:
                nonlocal turns
                while True:
                    await asyncio.sleep(0)
                    turns += 1

            beside = asyncio.ensure_future(other())
            await asyncio.sleep(0)
            before = turns
            for n in range(20):
                await db.append_message("s", "user", f"tight {n}")
            assert turns - before >= 20 // engine.YIELD_EVERY, (before, turns)
            beside.cancel()

    asyncio.run(run())


def test_the_recorder_sees_a_blocking_call_on_the_loop(tmp_path: Path) -> None:
    """The check above would catch it: a sqlite3 call made on the loop's thread is recorded there."""
    recorder = BlockingCalls()

    async def run() -> list[str]:
        with recorder:
            conn = sqlite3.connect(tmp_path / "b.db")
            conn.execute("SELECT 1")
            conn.close()
            time.sleep(0)
        return recorder.on(threading.get_ident())

    seen = asyncio.run(run())
    assert "sqlite3.Connection.execute" in seen and "time.sleep" in seen, seen


def test_fifty_tasks_on_asyncpg_keep_the_loop_free_without_threads(pg_database: str) -> None:
    _loop_free_case(async_url_for("asyncpg", pg_url=pg_database), forbid_threads=True)


def test_fifty_tasks_on_async_psycopg_keep_the_loop_free(pg_database: str) -> None:
    _loop_free_case(async_url_for("psycopg_async", pg_url=pg_database), forbid_threads=False)


def test_fifty_units_of_work_on_one_sqlite_file_all_commit(tmp_path: Path) -> None:
    async def run() -> None:
        engine = aio.create_async_engine(tmp_path / "u.db")
        await aio.upgrade(engine)

        async def one(i: int) -> int:
            async with aio.AsyncUnitOfWork(engine) as uow:
                await uow.sessions.create(f"s{i}", "cli")
                mid = await uow.messages.append(f"s{i}", "user", f"row {i}")
                await asyncio.sleep(0)  # let the others queue up while this one holds the file
                return mid

        ids = await asyncio.gather(*(one(i) for i in range(N_TASKS)))
        assert sorted(ids) == list(range(1, N_TASKS + 1))
        async with aio.AsyncUnitOfWork(engine, write=False) as uow:
            counts = await uow.run_sync(lambda c: c.execute(text(
                "SELECT count(*), sum(message_count) FROM sessions")).one())
        assert tuple(counts) == (N_TASKS, N_TASKS)
        assert engine.sync_engine.pool.checkedout() == 0
        await engine.dispose()

    asyncio.run(run())


@pytest.mark.pg_direct  # more server connections at once than the pooler's 2
def test_postgresql_units_of_work_run_side_by_side(pg_database: str) -> None:
    """8 units of work are all inside their transactions at once, on 8 server backends.

    Each waits, inside its transaction, until all 8 are inside: if the library ran them
    one after another (a lock, a pool of one), they could never all get there and the
    wait would end in the hang guard's timeout instead."""
    n = 8

    async def run() -> set[int]:
        engine = aio.create_async_engine(async_url_for("asyncpg", pg_url=pg_database))
        await aio.upgrade(engine)
        inside = 0
        all_inside = asyncio.Event()
        backends: set[int] = set()

        async def one(i: int) -> None:
            nonlocal inside
            async with aio.AsyncUnitOfWork(engine) as uow:
                await uow.sessions.create(f"p{i}", "cli")
                backends.add(await uow.run_sync(lambda c: c.exec_driver_sql("SELECT pg_backend_pid()").scalar()))
                inside += 1
                if inside == n:
                    all_inside.set()
                await all_inside.wait()

        # A hang guard, not a timing check: serialized units of work would wait forever.
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), timeout=120)
        async with aio.AsyncUnitOfWork(engine, write=False) as uow:
            assert await uow.run_sync(lambda c: c.exec_driver_sql("SELECT count(*) FROM sessions").scalar()) == n
        await engine.dispose()
        return backends

    backends = asyncio.run(run())
    assert len(backends) == n, f"{n} units of work open at once shared server backends: {backends}"


def _cancellation_case(url: str, slow_sql: str, held_check: Callable[[Any], Awaitable[None]]) -> None:
    async def run() -> None:
        engine = aio.create_async_engine(url)
        await aio.upgrade(engine)
        async with aio.AsyncUnitOfWork(engine) as uow:
            await uow.sessions.create("keep", "cli")

        async def doomed() -> None:
            async with aio.AsyncUnitOfWork(engine) as uow:
                await uow.messages.append("keep", "user", "never committed")
                await uow.sessions.create("gone", "cli")
                await uow.run_sync(lambda c: c.exec_driver_sql(slow_sql))

        with pytest.raises((asyncio.TimeoutError, TimeoutError)):
            await asyncio.wait_for(doomed(), timeout=0.5)
        await asyncio.sleep(0.05)
        assert engine.sync_engine.pool.checkedout() == 0, "a connection stayed checked out"
        await held_check(engine)  # the next writer gets the rows the cancelled one had locked
        async with aio.AsyncUnitOfWork(engine, write=False) as uow:
            assert await uow.sessions.get("gone") is None
            assert await uow.messages.get_messages("keep") == []
            assert (await uow.sessions.get("keep"))["message_count"] == 0
        await engine.dispose()

    asyncio.run(run())


async def _write_now(engine: Any) -> None:
    async def write() -> None:
        async with aio.AsyncUnitOfWork(engine) as uow:
            await uow.run_sync(lambda c: c.execute(text("UPDATE sessions SET title = 'x' WHERE id = 'keep'")))
            await uow.run_sync(lambda c: c.execute(text("UPDATE sessions SET title = NULL WHERE id = 'keep'")))

    # A hang guard, not a timing check: a lock the cancelled task still held would keep this waiting.
    await asyncio.wait_for(write(), timeout=60)


def test_a_cancelled_unit_of_work_rolls_back_on_asyncpg(pg_database: str) -> None:
    _cancellation_case(async_url_for("asyncpg", pg_url=pg_database), "SELECT pg_sleep(30)", _write_now)


def test_a_cancelled_unit_of_work_rolls_back_on_psycopg_async(pg_database: str) -> None:
    _cancellation_case(async_url_for("psycopg_async", pg_url=pg_database), "SELECT pg_sleep(30)", _write_now)


def test_a_cancelled_unit_of_work_rolls_back_on_aiosqlite(tmp_path: Path) -> None:
    # About a minute of work if nothing stopped it (3,000,000 rows took only 0.44 s on an idle
    # machine, under the 0.5 s timeout): the cancellation has to interrupt it.
    slow = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000000) "
            "SELECT count(*) FROM n")
    _cancellation_case(async_url_for("aiosqlite", sqlite_path=tmp_path / "c.db"), slow, _write_now)
