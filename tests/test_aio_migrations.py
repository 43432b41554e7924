"""``await aio.upgrade/downgrade/stamp/current`` on aiosqlite, asyncpg and async psycopg:
the revisions and the tables they leave equal the sync API's; an AsyncConnection joins the
caller's transaction (a rollback leaves nothing, a commit keeps everything); URL and path
targets work; each API refuses the other's engines with a typed error and a hint."""

from __future__ import annotations

import asyncio
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from hermes_store import aio, errors, migrations, paths
from hermes_store.engine import create_engine
from hermes_store.migrations import VERSION_TABLE

from .aio_support import ASYNC_DRIVERS, async_url_for
from .helpers import server_database

HEAD = paths.head()


@dataclass
class Databases:
    """A fresh database for the async API and another one for the sync API (same kind)."""

    driver: str
    async_url: str  #: the async API's database, with the driver's async URL
    sync_view: str | Path  #: the same database, as a sync target (to look at it)
    sync_target: str | Path  #: the sync API's own database

    @property
    def kind(self) -> str:
        return ASYNC_DRIVERS[self.driver]


@pytest.fixture(params=list(ASYNC_DRIVERS))
def dbs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Databases]:
    driver = request.param
    if ASYNC_DRIVERS[driver] == "sqlite":
        path = tmp_path / "async.db"
        yield Databases(driver, async_url_for(driver, sqlite_path=path), path, tmp_path / "sync.db")
        return
    pg_url = request.getfixturevalue("pg_url")
    database = request.getfixturevalue("pg_database")
    with server_database(pg_url) as sync_db:
        yield Databases(driver, async_url_for(driver, pg_url=database), database, sync_db)


@contextmanager
def _sync_engine(target: str | Path) -> Iterator[Any]:
    engine = create_engine(target)
    try:
        yield engine
    finally:
        engine.dispose()


def tables(target: str | Path) -> set[str]:
    """Table and view names of the database, looked at through a sync engine."""
    with _sync_engine(target) as engine, engine.connect() as conn:
        insp = inspect(conn)
        return set(insp.get_table_names()) | set(insp.get_view_names())


def pg_routines(target: str | Path) -> int:
    """Functions and procedures in ``public`` (our triggers' and search functions)."""
    with _sync_engine(target) as engine, engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
        )).scalar_one())


async def _with_engine(url: str, fn: Any) -> Any:
    engine = aio.create_async_engine(url)
    try:
        return await fn(engine)
    finally:
        await engine.dispose()


def run(url: str, fn: Any) -> Any:
    return asyncio.run(_with_engine(url, fn))


# ------------------------------------------------------------------ engine target


def test_up_down_up_same_revisions_and_tables_as_the_sync_api(dbs: Databases) -> None:
    async def up_down_up(engine: AsyncEngine) -> list[Any]:
        seen = [await aio.current(engine)]
        seen.append(await aio.upgrade(engine))
        seen.append(await aio.current(engine))
        seen.append(tables(dbs.sync_view))
        seen.append(migrations.current(dbs.sync_view))  # the sync API reads what aio wrote
        seen.append(await aio.upgrade(engine))  # at head already: nothing to do, head again
        seen.append(await aio.downgrade(engine, "base"))
        seen.append(await aio.current(engine))
        seen.append(tables(dbs.sync_view))
        seen.append(await aio.upgrade(engine))
        seen.append(await aio.current(engine))
        seen.append(tables(dbs.sync_view))
        return seen

    (before, reached, after, head_tables, sync_reads, again, down, at_base, base_tables, re_reached, re_current,
     re_tables) = run(dbs.async_url, up_down_up)

    assert before is None
    assert reached == after == sync_reads == again == HEAD == migrations.head()
    assert down is None and at_base is None
    assert re_reached == re_current == HEAD

    # the sync API on its own database, the same steps
    assert migrations.current(dbs.sync_target) is None
    assert migrations.upgrade(dbs.sync_target) == HEAD
    sync_head_tables = tables(dbs.sync_target)
    assert migrations.downgrade(dbs.sync_target, "base") is None
    sync_base_tables = tables(dbs.sync_target)

    assert {"sessions", "messages", "system_prompts", "session_model_usage", VERSION_TABLE} <= head_tables
    assert head_tables == sync_head_tables == re_tables
    assert base_tables == sync_base_tables
    assert not base_tables & {"sessions", "messages", "system_prompts"}


def test_stamp_records_a_revision_and_creates_no_table(dbs: Databases) -> None:
    async def stamp(engine: AsyncEngine) -> list[Any]:
        await aio.stamp(engine, HEAD)
        seen = [await aio.current(engine), tables(dbs.sync_view), migrations.current(dbs.sync_view)]
        await aio.stamp(engine, "base")
        seen.append(await aio.current(engine))
        return seen

    stamped, stamped_tables, sync_reads, unstamped = run(dbs.async_url, stamp)
    assert stamped == sync_reads == HEAD
    assert unstamped is None
    migrations.stamp(dbs.sync_target, HEAD)
    assert stamped_tables == tables(dbs.sync_target) == {VERSION_TABLE}


# ------------------------------------------------------------------ URL and path targets


def test_url_target(dbs: Databases) -> None:
    async def by_url() -> list[Any]:
        return [await aio.current(dbs.async_url), await aio.upgrade(dbs.async_url), await aio.current(dbs.async_url)]

    assert asyncio.run(by_url()) == [None, HEAD, HEAD]
    assert migrations.current(dbs.sync_view) == HEAD
    migrations.upgrade(dbs.sync_target)
    assert tables(dbs.sync_view) == tables(dbs.sync_target)
    if dbs.kind == "sqlite":
        assert stat.S_IMODE(Path(dbs.sync_view).stat().st_mode) == 0o600
    assert asyncio.run(aio.downgrade(dbs.async_url, "base")) is None
    assert asyncio.run(aio.current(dbs.async_url)) is None


def test_sqlite_path_targets_create_the_file_0600(tmp_path: Path) -> None:
    as_path = tmp_path / "by-path.db"
    as_str = tmp_path / "by-str.db"
    as_sync_url = tmp_path / "by-sync-url.db"

    async def go() -> list[Any]:
        return [
            await aio.current(as_path),  # asking creates nothing
            as_path.exists(),
            await aio.upgrade(as_path),
            await aio.current(as_path),
            await aio.upgrade(str(as_str)),
            await aio.current(str(as_str)),
            await aio.upgrade(f"sqlite:///{as_sync_url}"),  # a sync-driver URL is made async
            await aio.current(f"sqlite+aiosqlite:///{as_sync_url}"),
        ]

    assert asyncio.run(go()) == [None, False, HEAD, HEAD, HEAD, HEAD, HEAD, HEAD]
    for path in (as_path, as_str, as_sync_url):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert migrations.current(path) == HEAD
    assert tables(as_path) == tables(as_str) == tables(as_sync_url)
    assert "sessions" in tables(as_path)


# ------------------------------------------------------------------ the caller's transaction


def test_async_connection_joins_the_callers_transaction(dbs: Databases) -> None:
    async def rolled_back(engine: AsyncEngine) -> list[Any]:
        async with engine.connect() as conn:
            async with conn.begin() as tx:
                reached = await aio.upgrade(conn)
                inside = await aio.current(conn)
                still_open = conn.in_transaction() and tx.is_active
                await tx.rollback()
        return [reached, inside, still_open, await aio.current(engine)]

    reached, inside, still_open, after = run(dbs.async_url, rolled_back)
    assert reached == inside == HEAD  # the revisions ran, in the caller's transaction
    assert still_open  # and aio committed nothing, ended nothing
    assert after is None
    assert tables(dbs.sync_view) == set()  # no table, no version table
    if dbs.kind == "postgresql":
        assert pg_routines(dbs.sync_view) == 0

    async def committed(engine: AsyncEngine) -> list[Any]:
        async with engine.connect() as conn:
            async with conn.begin() as tx:
                reached = await aio.upgrade(conn)
                await tx.commit()
        return [reached, await aio.current(engine)]

    assert run(dbs.async_url, committed) == [HEAD, HEAD]
    migrations.upgrade(dbs.sync_target)
    assert tables(dbs.sync_view) == tables(dbs.sync_target)

    async def downgrade_rolled_back(engine: AsyncEngine) -> list[Any]:
        async with engine.connect() as conn:
            async with conn.begin() as tx:
                down = await aio.downgrade(conn, "base")
                inside = await aio.current(conn)
                await tx.rollback()
        return [down, inside, await aio.current(engine)]

    assert run(dbs.async_url, downgrade_rolled_back) == [None, None, HEAD]
    assert tables(dbs.sync_view) == tables(dbs.sync_target)  # the rollback took the downgrade back too
    assert VERSION_TABLE in tables(dbs.sync_view) and "sessions" in tables(dbs.sync_view)
    assert migrations.current(dbs.sync_view) == HEAD
    if dbs.kind == "postgresql":
        assert pg_routines(dbs.sync_view) == pg_routines(dbs.sync_target) > 0


# ------------------------------------------------------------------ each API refuses the other's engines


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_aio_refuses_a_sync_engine_or_connection(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    target: str | Path = tmp_path / "sync.db" if kind == "sqlite" else request.getfixturevalue("pg_database")
    with _sync_engine(target) as engine:
        for call in (lambda: aio.upgrade(engine), lambda: aio.downgrade(engine, "base"),
                     lambda: aio.stamp(engine, HEAD), lambda: aio.current(engine)):
            with pytest.raises(errors.InvalidInputError, match="async engine or connection, not a sync Engine"):
                asyncio.run(call())
        with engine.connect() as conn:
            with pytest.raises(errors.InvalidInputError, match="not a sync Connection"):
                asyncio.run(aio.upgrade(conn))
    assert tables(target) == set()  # nothing was migrated


def test_sync_migrations_refuse_an_async_engine_with_a_hint(dbs: Databases) -> None:
    hint = r"hermes_store\.aio"

    async def refused(engine: AsyncEngine) -> list[str]:
        messages = []
        for call in (lambda: migrations.upgrade(engine), lambda: migrations.downgrade(engine, "base"),
                     lambda: migrations.stamp(engine, HEAD), lambda: migrations.current(engine)):
            with pytest.raises(errors.InvalidInputError, match=hint) as caught:
                call()
            messages.append(str(caught.value))
        async with engine.connect() as conn:
            with pytest.raises(errors.InvalidInputError, match=hint):
                migrations.upgrade(conn)  # type: ignore[arg-type]
        return messages

    messages = run(dbs.async_url, refused)
    assert all("not an AsyncEngine" in m for m in messages), messages
    if dbs.driver != "psycopg_async":  # postgresql+psycopg:// is a sync URL too (psycopg 3 is both)
        with pytest.raises(errors.InvalidInputError, match=hint):
            migrations.upgrade(dbs.async_url)  # an asyncio-driver URL
    if dbs.kind == "sqlite":  # the engine connected once (an empty file), nothing was written
        assert Path(dbs.sync_view).stat().st_size == 0
    assert tables(dbs.sync_view) == set()  # nothing was migrated
