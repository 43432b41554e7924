"""``aio.AsyncSessionDB`` against ``SessionDB``: the same calls give the same results and
the same typed errors, on aiosqlite, asyncpg and async psycopg (through the pooler when
one runs)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from hermes_store import SessionDB, aio, errors

from .aio_support import ASYNC_DRIVERS, SCENARIO, async_outcome, async_url_for, frozen_clock, outcome, restart_clock
from .helpers import server_database

__all__ = ["frozen_clock"]  # the fixture, imported for this module


def _sync_run(target: str | Path) -> list:
    with SessionDB(target) as db:
        # The method looked up first, as the async run below does (a partial binds this row's call).
        return [outcome(functools.partial(getattr(db, name), *args, **kwargs)) for name, args, kwargs in SCENARIO]


async def _async_run(url: str) -> list:
    async with aio.AsyncSessionDB(url) as db:
        assert isinstance(db.engine, AsyncEngine)
        return [await async_outcome(getattr(db, name)(*args, **kwargs)) for name, args, kwargs in SCENARIO]


@pytest.fixture(params=list(ASYNC_DRIVERS))
def driver(request: pytest.FixtureRequest) -> str:
    return request.param


def test_same_results_as_the_sync_facade(driver: str, tmp_path: Path, request: pytest.FixtureRequest,
                                          monkeypatch: pytest.MonkeyPatch, frozen_clock: object) -> None:
    if ASYNC_DRIVERS[driver] == "sqlite":
        sync_target: str | Path = tmp_path / "sync.db"
        url = async_url_for(driver, sqlite_path=tmp_path / "async.db")
        expected = _sync_run(sync_target)
        restart_clock(monkeypatch)
        got = asyncio.run(_async_run(url))
    else:
        pg_url = request.getfixturevalue("pg_url")
        url = async_url_for(driver, pg_url=request.getfixturevalue("pg_database"))
        with server_database(pg_url) as sync_db:
            expected = _sync_run(sync_db)
        restart_clock(monkeypatch)
        got = asyncio.run(_async_run(url))
    assert len(got) == len(expected) == len(SCENARIO)
    for (name, args, _kw), want, have in zip(SCENARIO, expected, got, strict=True):
        assert have == want, f"{name}{args!r}"
    # the scenario really exercised both outcomes
    kinds = {o[1] for o in expected if o[0] == "error"}
    assert {"TitleConflictError", "UnknownSessionError"} <= kinds, kinds
    assert any(o[0] == "ok" and o[1] for o in expected[19:25]), "searches found nothing"


def test_every_public_method_is_a_coroutine() -> None:
    public = {n for n, f in inspect.getmembers(SessionDB, inspect.isfunction) if not n.startswith("_")}
    assert len(public) > 100
    for name in public:
        method = getattr(aio.AsyncSessionDB, name)
        assert inspect.iscoroutinefunction(method), name
        assert inspect.signature(method) == inspect.signature(getattr(SessionDB, name)), name


def test_iter_export_is_collected_on_the_loop(tmp_path: Path) -> None:
    async def run() -> list:
        async with aio.AsyncSessionDB(tmp_path / "s.db") as db:
            await db.create_session("a", "cli")
            await db.append_message("a", "user", "hi")
            return await db.iter_export()

    rows = asyncio.run(run())
    assert [r["id"] for r in rows] == ["a"] and rows[0]["messages"][0]["content"] == "hi"


def test_queued_token_counts_are_applied_on_the_loop_at_once(tmp_path: Path) -> None:
    """No writer thread behind an event-loop store: the delta is in before the call returns."""
    async def run() -> tuple[Any, list[str]]:
        async with aio.AsyncSessionDB(tmp_path / "s.db") as db:
            await db.create_session("a", "cli")
            await db.queue_token_counts("a", input_tokens=7, output_tokens=3, api_call_count=1, model="m")
            row = await db.get_session("a")
            threads = [t.name for t in threading.enumerate()]
            return row, threads

    row, threads = asyncio.run(run())
    assert (row["input_tokens"], row["output_tokens"]) == (7, 3)
    assert "session-db-token-writer" not in threads


def test_closed_store_and_sync_targets_are_typed_errors(tmp_path: Path) -> None:
    sync_db = SessionDB(tmp_path / "s.db")
    try:
        with pytest.raises(errors.InvalidInputError, match=r"aio\.AsyncSessionDB takes an async"):
            aio.AsyncSessionDB(sync_db.engine)
    finally:
        sync_db.close()

    async def run() -> None:
        db = aio.AsyncSessionDB(tmp_path / "s.db")
        await db.create_session("a", "cli")  # opens on first use
        await db.close()
        await db.close()  # twice is fine
        again = await db.get_session("a")  # reopens: a closed AsyncSessionDB opens again on use
        assert again is not None and again["id"] == "a"
        await db.close()

    asyncio.run(run())
