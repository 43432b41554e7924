"""``aio.create_async_engine``: set up like the sync ``create_engine`` (PRAGMAs, a real
BEGIN, foreign keys, typed errors, pooler-safe PostgreSQL defaults), and the URL each
target maps to."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from hermes_store import aio
from hermes_store.dialects import pg_asyncpg

from .aio_support import async_url_for


@pytest.mark.parametrize(("given", "driver"), [
    ("sqlite:///x.db", "sqlite+aiosqlite"),
    ("x.db", "sqlite+aiosqlite"),
    ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite"),
    ("postgresql://u@h/d", "postgresql+asyncpg"),
    ("postgresql+psycopg2://u@h/d", "postgresql+asyncpg"),
    ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg"),
    ("postgresql+psycopg://u@h/d", "postgresql+psycopg"),
])
def test_urls_map_to_an_async_driver(given: str, driver: str) -> None:
    assert aio.async_url(given).drivername == driver


def test_sqlite_engine_has_our_pragmas_and_a_real_begin(tmp_path: Path) -> None:
    async def run() -> None:
        engine = aio.create_async_engine(tmp_path / "e.db", busy_timeout_ms=1234)
        await aio.upgrade(engine)
        try:
            async with engine.connect() as conn:
                assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar() == 1
                assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 1234
                await conn.rollback()
                await conn.begin()
                await conn.execute(text("SELECT 1"))
                # a real transaction at SQLite after a SELECT (pysqlite-style lazy BEGIN would say False)
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver.in_transaction
                await conn.rollback()
                # foreign keys are enforced
                with pytest.raises(IntegrityError, match="FOREIGN KEY"):
                    async with conn.begin():
                        await conn.execute(text(
                            "INSERT INTO messages (session_id, role, timestamp) VALUES ('nobody', 'user', 0)"))
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_asyncpg_defaults_are_pooler_safe(pg_database: str) -> None:
    async def run() -> None:
        engine = aio.create_async_engine(async_url_for("asyncpg", pg_url=pg_database))
        try:
            async with engine.connect() as conn:
                raw = await conn.get_raw_connection()
                adapter = raw.dbapi_connection
                assert adapter._prepared_statement_name_func() == ""  # unnamed: replaced by the next one
                assert raw.driver_connection._stmt_cache.get_max_size() == 0
                # after statements with parameters, nothing named is left on the server connection
                for i in range(3):
                    assert (await conn.execute(text("SELECT CAST(:v AS int) + 1"), {"v": i})).scalar() == i + 1
                left = (await conn.execute(text("SELECT count(*) FROM pg_prepared_statements"))).scalar()
                assert left == 0
                # NUL round-trips through the text codecs
                assert (await conn.execute(text("SELECT CAST(:v AS text)"), {"v": "a\x00b"})).scalar() == "a\x00b"
                stored = (await conn.execute(text("SELECT strpos(CAST(:v AS text), chr(57345))"),
                                             {"v": "a\x00b"})).scalar()
                assert stored == 2  # U+0000 travelled as U+E001
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_prepared_statements_keep_asyncpg_caches_on() -> None:
    kwargs = pg_asyncpg.DIALECT.engine_kwargs(aio.async_url("postgresql://u@h/d"), {}, prepared_statements=True)
    assert "statement_cache_size" not in kwargs["connect_args"]
    off = pg_asyncpg.DIALECT.engine_kwargs(aio.async_url("postgresql://u@h/d"), {}, prepared_statements=False)
    assert off["connect_args"]["statement_cache_size"] == 0
    # descriptions of unnamed statements, kept on the client only (nothing on the server)
    assert off["connect_args"]["prepared_statement_cache_size"] == pg_asyncpg.DESCRIBED_STATEMENTS


def _count_hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each call that goes to aiosqlite's thread (a "hop"), by the name of what it runs."""
    import aiosqlite

    hops: list[str] = []
    original = aiosqlite.Connection._execute

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await original(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    return hops


def test_sqlite_statements_take_one_hop_each_and_begin_rides_with_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A statement is one trip to aiosqlite's thread (executed, fetched and closed there);
    a BEGIN waits for the next trip; a transaction that ran nothing costs no trip."""
    async def run() -> None:
        engine = aio.create_async_engine(tmp_path / "hops.db")
        try:
            await aio.upgrade(engine)
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))  # the pool's connection is set up before counting
                await conn.rollback()
                hops = _count_hops(monkeypatch)
                await conn.begin()
                assert hops == []
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver.in_transaction  # the waiting BEGIN counts
                rows = (await conn.execute(text("SELECT 1 UNION ALL SELECT 2"))).all()
                assert [r[0] for r in rows] == [1, 2]
                assert len(hops) == 1
                assert driver._conn.in_transaction  # SQLite's own transaction, opened in that trip
                await conn.rollback()
                assert len(hops) == 2
                await conn.begin()
                await conn.commit()  # nothing ran: nothing sent
                assert len(hops) == 2 and not driver.in_transaction
        finally:
            await engine.dispose()

    asyncio.run(run())


@pytest.mark.parametrize("here", [False, True], ids=["on the driver's thread", "on the loop"])
def test_sqlite_append_is_one_hop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: bool) -> None:
    """AsyncSessionDB.append_message: BEGIN IMMEDIATE with the counter UPDATE, the INSERT
    and the COMMIT, all run on the driver's thread in one go, or on the loop's thread
    without any hop where short writes run there (the default off macOS)."""
    from hermes_store.aio import engine

    monkeypatch.setattr(engine, "RUN_SHORT_WRITES_HERE", here)

    async def run() -> None:
        async with aio.AsyncSessionDB(tmp_path / "three.db") as db:
            await db.create_session("s", "cli")
            await db.append_message("s", "user", "warm-up")
            await db.wait_for_upkeep()  # the open's index catch-up runs as a task of the loop
            hops = _count_hops(monkeypatch)
            new_id = await db.append_message("s", "user", "counted")
            assert hops == ([] if here else ["whole_call"]), hops
            assert [m["content"] for m in await db.get_messages("s")] == ["warm-up", "counted"]
            assert new_id == (await db.get_messages("s"))[-1]["id"]

    asyncio.run(run())


def test_a_begin_refused_by_another_process_fails_the_write_typed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The BEGIN IMMEDIATE that rides with the next statement still fails that write, as a
    DatabaseLockedError once the budget is spent, and writes nothing."""
    import sqlite3

    from hermes_store import errors, facade

    async def run() -> None:
        path = tmp_path / "held.db"
        async with aio.AsyncSessionDB(path, busy_timeout_ms=50) as db:
            await db.create_session("s", "cli")
            holder = sqlite3.connect(path, isolation_level=None)  # another writer, as another process would be
            holder.execute("BEGIN IMMEDIATE")
            try:
                for name in ("WRITE_BUDGET_S", "TRANSCRIPT_BUDGET_S"):  # read at call time
                    monkeypatch.setattr(facade, name, 0.3)
                with pytest.raises(errors.DatabaseLockedError):
                    await db.append_message("s", "user", "refused")
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            await db.append_message("s", "user", "after")
            assert [m["content"] for m in await db.get_messages("s")] == ["after"]

    asyncio.run(run())
