"""A FastAPI-style host on ``hermes_store.aio``: its own models and AsyncSession, our
tables migrated from its code, its row and ours in one transaction (commit keeps both,
rollback neither), and an AsyncSessionDB whose cancelled calls leave nothing half done."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import String, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from hermes_store import aio, errors

from .aio_support import async_url_for


class HostBase(DeclarativeBase):
    pass


class Ticket(HostBase):
    """The host application's own table, beside ours in the same database."""

    __tablename__ = "host_tickets"
    id: Mapped[int] = mapped_column(primary_key=True)
    session_ref: Mapped[str] = mapped_column(String(64))


def _url(driver: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if driver == "aiosqlite":
        return async_url_for(driver, sqlite_path=tmp_path / "host.db")
    return async_url_for(driver, pg_url=request.getfixturevalue("pg_database"))


@pytest.mark.parametrize("driver", ["aiosqlite", "asyncpg"])
def test_host_row_and_ours_commit_and_roll_back_together(driver: str, tmp_path: Path,
                                                           request: pytest.FixtureRequest) -> None:
    url = _url(driver, tmp_path, request)

    async def run() -> None:
        engine = aio.create_async_engine(url)
        async with engine.begin() as conn:  # the host's startup: its tables, then ours
            await conn.run_sync(HostBase.metadata.create_all)
            await aio.upgrade(conn)
        sessions = async_sessionmaker(engine, expire_on_commit=False)

        async def get_db() -> AsyncIterator[AsyncSession]:  # a FastAPI dependency
            async with sessions() as session:
                yield session

        async def open_ticket(session: AsyncSession, sid: str, fail: bool) -> None:  # a request handler
            async with session.begin():
                session.add(Ticket(session_ref=sid))
                await aio.SessionRepository(session).create(sid, "api")
                await aio.MessageRepository(session).append(sid, "user", "my order did not arrive")
                if fail:
                    raise RuntimeError("the handler failed after both writes")

        async for session in get_db():
            await open_ticket(session, "ok-1", fail=False)
        async for session in get_db():
            with pytest.raises(RuntimeError):
                await open_ticket(session, "bad-1", fail=True)
        async for session in get_db():
            refs = (await session.execute(select(Ticket.session_ref))).scalars().all()
            assert refs == ["ok-1"]
            assert await aio.SessionRepository(session).get("bad-1") is None
            found = await aio.SearchRepository(session).search_messages("arrive")
            assert [h["session_id"] for h in found] == ["ok-1"]
            # the repositories joined the host's transaction: nothing of theirs committed on its own
            assert (await session.execute(text("SELECT count(*) FROM messages"))).scalar() == 1
        assert engine.sync_engine.pool.checkedout() == 0
        await engine.dispose()

    asyncio.run(run())


@pytest.mark.parametrize("driver", ["aiosqlite", "asyncpg"])
def test_cancelled_store_calls_leave_no_half_write_and_no_lock(driver: str, tmp_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    url = _url(driver, tmp_path, request)

    async def run() -> None:
        rng = random.Random(7)
        async with aio.AsyncSessionDB(url) as db:
            await db.create_session("s", "cli")
            cancelled = 0
            for i in range(40):
                # cancel at a random point: before, during or after the append's statements
                # (counted in loop turns: an append is one hop to the driver's thread, shorter
                # than the loop's clock can tell apart)
                task = asyncio.ensure_future(db.append_message("s", "user", f"m{i}"))
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
                if not task.done():
                    task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
            session = await db.get_session("s")
            messages = await db.get_messages("s")
            assert session["message_count"] == len(messages), "a cancelled append was half done"
            assert cancelled > 0, "no call was cancelled: the test proves nothing"
            # nothing stays locked: a write goes through at once
            await asyncio.wait_for(db.set_session_title("s", "after"), timeout=5)
            assert db.engine.sync_engine.pool.checkedout() <= 8  # only the idle connections it keeps
            engine = db.engine
        assert engine.sync_engine.pool.checkedout() == 0

    asyncio.run(run())


def test_a_unit_of_work_outside_its_block_is_a_typed_error(tmp_path: Path) -> None:
    async def run() -> Any:
        engine = aio.create_async_engine(tmp_path / "u.db")
        await aio.upgrade(engine)
        uow = aio.AsyncUnitOfWork(engine)
        try:
            with pytest.raises(errors.HermesStoreError, match="outside its 'async with' block"):
                await uow.run_sync(lambda c: c.execute(select(func.now())))
        finally:
            await engine.dispose()

    asyncio.run(run())


ASYNC_ENV_PY = '''
import asyncio
from alembic import context
from sqlalchemy import MetaData
from hermes_store import aio

config = context.config
target_metadata = MetaData()


def do_run_migrations(connection):
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    connectable = aio.create_async_engine(config.get_main_option("sqlalchemy.url"))
    async with connectable.begin() as connection:
        await aio.upgrade(connection)                    # hermes_store_version, in this transaction
        await connection.run_sync(do_run_migrations)     # your revisions, your alembic_version
    await connectable.dispose()


asyncio.run(run_async_migrations())
'''

HOST_REVISION = '''
from alembic import op
import sqlalchemy as sa

revision = "host0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("host_notes", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("host_notes")
'''


def test_the_readme_async_env_py_runs_ours_then_the_hosts(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine, inspect

    # README's whole async env.py (these two steps, under `if upgrading():`) is run with the
    # real alembic command by test_host_embedding.py::test_async_ours_first.
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for step in ("await aio.upgrade(connection)", "await connection.run_sync(do_run_migrations)"):
        assert step in ASYNC_ENV_PY and step in readme

    (tmp_path / "migrations" / "versions").mkdir(parents=True)
    (tmp_path / "migrations" / "env.py").write_text(ASYNC_ENV_PY)
    (tmp_path / "migrations" / "script.py.mako").write_text("")
    (tmp_path / "migrations" / "versions" / "host0001.py").write_text(HOST_REVISION)
    db = tmp_path / "app.db"
    cfg = Config()
    cfg.set_main_option("script_location", str(tmp_path / "migrations"))
    cfg.set_main_option("sqlalchemy.url", f"sqlite+aiosqlite:///{db}")
    command.upgrade(cfg, "head")

    engine = create_engine(f"sqlite:///{db}")
    try:
        tables = set(inspect(engine).get_table_names())
        assert {"host_notes", "alembic_version", "hermes_store_version", "sessions", "messages"} <= tables
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "host0001"
            assert conn.execute(text("SELECT count(*) FROM hermes_store_version")).scalar() == 1
    finally:
        engine.dispose()
