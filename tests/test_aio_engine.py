"""``aio.create_async_engine``: set up like the sync ``create_engine`` (PRAGMAs, a real
BEGIN, foreign keys, typed errors, pooler-safe PostgreSQL defaults), and the URL each
target maps to."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
                assert adapter._prepared_statement_cache is None  # nothing cached across transactions
                name = adapter._prepared_statement_name_func()
                assert name.startswith("__hermes_store_") and name != adapter._prepared_statement_name_func()
                assert raw.driver_connection._stmt_cache.get_max_size() == 0
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
    assert off["connect_args"]["prepared_statement_cache_size"] == 0
