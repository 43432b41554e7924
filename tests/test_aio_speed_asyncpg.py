"""asyncpg keeps each statement's description on the client, nothing on the server (issue 32).

A statement a connection has met before is sent as Parse+Bind+Execute in one round trip
(asyncpg re-parses unnamed statements when its own cache is off), so only its first use
on a connection is prepared. These tests check that behaviour, and that it stays safe
behind a transaction pooler (the default PostgreSQL route of these tests when one runs).
No timing is measured.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from hermes_store import aio
from hermes_store.dialects import pg_asyncpg
from .aio_support import async_url_for


def _record_calls(monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """The query of each call of asyncpg's ``Connection.<method>`` from now on:
    ``prepare`` (a statement prepared) or ``execute`` (one sent by the simple protocol:
    a BEGIN, a ROLLBACK)."""
    import asyncpg

    seen: list[str] = []
    original = getattr(asyncpg.connection.Connection, method)

    async def counted(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(query)
        return await original(self, query, *args, **kwargs)

    monkeypatch.setattr(asyncpg.connection.Connection, method, counted)
    return seen


def _count_prepares(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return _record_calls(monkeypatch, "prepare")


def _count_simple_queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return _record_calls(monkeypatch, "execute")


def test_a_statement_met_before_is_not_prepared_again(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        async with aio.AsyncSessionDB(async_url_for("asyncpg", pg_url=pg_database)) as db:
            await db.create_session("s", "cli")
            first = await db.append_message("s", "user", "kubernetes rollout")
            await db.get_messages("s")
            await db.wait_for_upkeep()
            prepared = _count_prepares(monkeypatch)
            second = await db.append_message("s", "assistant", "rolled back")
            rows = await db.get_messages("s")
            assert prepared == []
            assert [r["id"] for r in rows] == [first, second]
            assert [r["content"] for r in rows] == ["kubernetes rollout", "rolled back"]
            assert (await db.get_session("s"))["message_count"] == 2

    asyncio.run(run())


def test_a_read_sends_no_begin_or_rollback(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads run in driver autocommit, as on psycopg: only their statements travel."""
    async def run() -> None:
        async with aio.AsyncSessionDB(async_url_for("asyncpg", pg_url=pg_database)) as db:
            await db.create_session("s", "cli")
            await db.append_message("s", "user", "kubernetes rollout")
            await db.wait_for_upkeep()
            simple = _count_simple_queries(monkeypatch)
            assert [h["session_id"] for h in await db.search_messages("kubernetes")] == ["s"]
            assert (await db.get_session("s"))["message_count"] == 1
            assert simple == []
            await db.set_session_title("s", "written")  # a write still opens its transaction
            assert any(q.startswith("BEGIN") for q in simple) and await db.get_session_title("s") == "written"

    asyncio.run(run())


def test_nothing_named_is_left_on_the_server(pg_database: str) -> None:
    async def run() -> None:
        engine = aio.create_async_engine(async_url_for("asyncpg", pg_url=pg_database))
        try:
            async with engine.connect() as conn:
                raw = await conn.get_raw_connection()
                assert raw.dbapi_connection._prepared_statement_name_func() == ""
                for i in range(5):  # the same statement again and again: described once, parsed each time
                    assert (await conn.execute(text("SELECT CAST(:v AS int) + 1"), {"v": i})).scalar() == i + 1
                assert (await conn.execute(text("SELECT count(*) FROM pg_prepared_statements"))).scalar() == 0
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_described_statements_are_kept_per_connection_only_without_prepared_statements() -> None:
    off = pg_asyncpg.DIALECT.engine_kwargs(aio.async_url("postgresql://u@h/d"), {}, prepared_statements=False)
    assert off["connect_args"]["statement_cache_size"] == 0  # asyncpg names nothing on the server
    assert off["connect_args"]["prepared_statement_cache_size"] == pg_asyncpg.DESCRIBED_STATEMENTS > 0
    assert off["connect_args"]["prepared_statement_name_func"]() == ""


def test_many_stores_sharing_the_pooler_read_and_write_exactly(pg_database: str) -> None:
    """Three stores, four tasks each, through the pooler's two server connections when
    one runs: every statement lands on whichever server connection the pooler picks,
    with only its description kept by our client. Every row and counter is exact."""
    url = async_url_for("asyncpg", pg_url=pg_database)

    async def run() -> None:
        stores = [aio.AsyncSessionDB(url) for _ in range(3)]
        try:
            for db in stores:
                await db.open()

            async def worker(db: aio.AsyncSessionDB, sid: str) -> None:
                await db.create_session(sid, "cli")
                for n in range(8):
                    await db.append_message(sid, "user", f"{sid} says kubernetes {n}")
                    rows = await db.get_messages(sid)
                    assert [r["content"] for r in rows] == [f"{sid} says kubernetes {k}" for k in range(n + 1)]
                    assert (await db.get_session(sid))["message_count"] == n + 1
                    await db.set_session_title(sid, f"{sid} title {n}")

            await asyncio.gather(*(worker(db, f"s{k}-{t}") for k, db in enumerate(stores) for t in range(4)))
            for k, db in enumerate(stores):
                for t in range(4):
                    sid = f"s{k}-{t}"
                    assert await db.get_session_title(sid) == f"{sid} title 7"
                    assert len(await db.get_messages(sid)) == 8
        finally:
            for db in stores:
                await db.close()

    asyncio.run(run())


def test_an_append_is_one_statement_with_its_lock_budget(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No BEGIN or COMMIT around an append (one round trip, as on psycopg); its lock
    budget travels inside it, so a session row held elsewhere ends in a typed error
    once the budget is spent, and nothing is written."""
    from hermes_store import errors, facade

    async def run() -> None:
        async with aio.AsyncSessionDB(async_url_for("asyncpg", pg_url=pg_database)) as db:
            await db.create_session("s", "cli")
            await db.append_message("s", "user", "first")
            await db.wait_for_upkeep()
            simple = _count_simple_queries(monkeypatch)
            await db.append_message("s", "assistant", "second")
            assert simple == []
            monkeypatch.undo()

            holder = aio.create_async_engine(async_url_for("asyncpg", pg_url=pg_database))
            try:
                async with holder.connect() as conn:
                    await conn.execute(text("SELECT id FROM sessions WHERE id = 's' FOR UPDATE"))
                    monkeypatch.setattr(facade, "TRANSCRIPT_BUDGET_S", 0.5)
                    with pytest.raises(errors.DatabaseLockedError):
                        await db.append_message("s", "user", "blocked")
                    await conn.rollback()
            finally:
                await holder.dispose()
            assert [m["content"] for m in await db.get_messages("s")] == ["first", "second"]
            assert (await db.get_session("s"))["message_count"] == 2
            await db.append_message("s", "user", "third")
            assert (await db.get_session("s"))["message_count"] == 3

    asyncio.run(run())
