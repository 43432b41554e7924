"""``hermes_store.aio`` under concurrency: 50 tasks on one SQLite file all succeed,
PostgreSQL units of work run side by side, the event loop is never blocked (a 5 ms
ticker's lag), asyncpg needs no thread pool, and a cancelled task rolls back and
leaves no connection checked out and no lock held."""

from __future__ import annotations

import asyncio
import concurrent.futures
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from sqlalchemy import text

from hermes_store import aio

from .aio_support import async_url_for

N_TASKS = 50


class _NoThreads(concurrent.futures.ThreadPoolExecutor):
    """A default executor that refuses work: any ``to_thread``/``run_in_executor`` fails."""

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a thread pool was used")


async def _with_ticker(work: Callable[[], Awaitable[Any]], period: float = 0.005) -> tuple[Any, list[float]]:
    """Run ``work`` while a ticker measures how late each 5 ms tick fires (seconds)."""
    lags: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        while not done.is_set():
            due = time.perf_counter() + period
            await asyncio.sleep(period)
            lags.append(max(0.0, time.perf_counter() - due))

    ticker = asyncio.create_task(tick())
    try:
        result = await work()
    finally:
        done.set()
        await ticker
    return result, lags


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


#: Rounds of 50 concurrent tasks: enough ticks that p99 is not just the slowest one.
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


def _loop_lag_case(url: str, *, forbid_threads: bool) -> None:
    async def run() -> None:
        if forbid_threads:
            asyncio.get_running_loop().set_default_executor(_NoThreads())
        async with aio.AsyncSessionDB(url) as db:
            threads_before = threading.active_count()
            results, lags = await _with_ticker(lambda: _fifty_appends_and_searches(db))
            if forbid_threads:
                assert threading.active_count() <= threads_before, "threads were started"
            assert all(r for r in results), "a search missed rows appended before it"
            assert await db.message_count() == 2 * N_TASKS * ROUNDS
            assert await db.session_count() == N_TASKS * ROUNDS
        assert len(lags) >= 50, f"the ticker hardly ran: {len(lags)} ticks"
        assert _p99(lags) < 0.050, f"p99 loop lag {_p99(lags) * 1000:.1f} ms over {len(lags)} ticks"

    asyncio.run(run())


def test_fifty_tasks_on_one_sqlite_file_keep_the_loop_free(tmp_path: Path) -> None:
    _loop_lag_case(async_url_for("aiosqlite", sqlite_path=tmp_path / "s.db"), forbid_threads=False)


def test_fifty_tasks_on_asyncpg_keep_the_loop_free_without_threads(pg_database: str) -> None:
    _loop_lag_case(async_url_for("asyncpg", pg_url=pg_database), forbid_threads=True)


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
    async def run() -> float:
        engine = aio.create_async_engine(async_url_for("asyncpg", pg_url=pg_database))
        await aio.upgrade(engine)

        async def one(i: int) -> None:
            async with aio.AsyncUnitOfWork(engine) as uow:
                await uow.sessions.create(f"p{i}", "cli")
                await uow.run_sync(lambda c: c.exec_driver_sql("SELECT pg_sleep(0.5)"))

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(8)))
        took = time.perf_counter() - start
        async with aio.AsyncUnitOfWork(engine, write=False) as uow:
            assert await uow.run_sync(lambda c: c.exec_driver_sql("SELECT count(*) FROM sessions").scalar()) == 8
        await engine.dispose()
        return took

    took = asyncio.run(run())
    assert took < 8 * 0.5 / 2, f"8 units of work of 0.5 s took {took:.2f} s: they did not overlap"


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

    await asyncio.wait_for(write(), timeout=5)


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
