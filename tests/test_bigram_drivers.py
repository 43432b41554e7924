"""The short-CJK index's pairs go in through each driver's own ``executemany`` (its own
placeholders: ``?``, ``%s``, ``$1``): on every driver a catch-up stores the same pairs
as the pure cutter computes, moves the high-water mark, and a two-character search
finds the row through the index."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text

from hermes_store import SessionDB, aio
from hermes_store.search.cjk_pairs import BLOCK, HIGH_WATER_KEY, bigrams

from .aio_support import ASYNC_DRIVERS, async_url_for

ROWS = ["部署失败了，请检查日志", "普通的英文 message without CJK pairs", "数据库连接超时，重试一次"]
PAIRS_SQL = "SELECT gram, block FROM messages_cjk_bigram ORDER BY gram, block"
MARK_SQL = f"SELECT value FROM state_meta WHERE key = '{HIGH_WATER_KEY}'"


def _expected(ids: list[int]) -> list[tuple[str, int]]:
    return sorted({(g, i // BLOCK) for i, row in zip(ids, ROWS, strict=True) for g in bigrams(row)})


def _sync(target: str | Path) -> tuple[list[tuple[str, int]], list[tuple[str, int]], str, bool]:
    with SessionDB(target) as db:
        db.create_session("s", "cli")
        ids = [db.append_message("s", "user", row) for row in ROWS]
        assert db.index_search() >= len(ROWS)
        with db.engine.connect() as conn:
            pairs = [tuple(r) for r in conn.execute(text(PAIRS_SQL))]
            mark = conn.execute(text(MARK_SQL)).scalar_one()
        found = [m["id"] for m in db.search_messages("超时")]
    return pairs, _expected(ids), mark, found == [ids[2]]


async def _async(url: str) -> tuple[list[tuple[str, int]], list[tuple[str, int]], str, bool]:
    async with aio.AsyncSessionDB(url) as db:
        await db.create_session("s", "cli")
        ids = [await db.append_message("s", "user", row) for row in ROWS]
        assert await db.index_search() >= len(ROWS)
        async with db.engine.connect() as conn:
            pairs = [tuple(r) for r in await conn.execute(text(PAIRS_SQL))]
            mark = (await conn.execute(text(MARK_SQL))).scalar_one()
        found = [m["id"] for m in await db.search_messages("超时")]
    return pairs, _expected(ids), mark, found == [ids[2]]


def _check(pairs: list[tuple[str, int]], expected: list[tuple[str, int]], mark: str, found: bool) -> None:
    assert expected and pairs == expected
    assert int(mark) >= 3
    assert found  # the third row, and only it


def test_sqlite3(tmp_path: Path) -> None:
    _check(*_sync(tmp_path / "sync.db"))


def test_psycopg(pg_database: str) -> None:
    _check(*_sync(pg_database))


@pytest.mark.parametrize("driver", list(ASYNC_DRIVERS))
def test_async_drivers(driver: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if ASYNC_DRIVERS[driver] == "sqlite":
        url = async_url_for(driver, sqlite_path=tmp_path / "async.db")
    else:
        url = async_url_for(driver, pg_url=request.getfixturevalue("pg_database"))
    _check(*asyncio.run(_async(url)))
