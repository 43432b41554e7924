"""``await aio.upgrade(target)`` and friends: our Alembic chain from asyncio code.

The target is an AsyncEngine, an AsyncConnection, a URL or a SQLite file path.

- An AsyncConnection inside the caller's transaction: the revisions join it
  (:func:`hermes_store.migrations.upgrade` on its sync face, run on the loop's
  greenlet); nothing is committed or rolled back here, so a rollback by the caller
  leaves nothing.
- An AsyncEngine: a connection of its own, one transaction per run (as the sync API).
- A SQLite file (path or URL): the sync API's file handling as it is (0600 creation,
  adoption of a Hermes file, interrupted adoptions finished, typed refusals), on a
  worker thread so a long adoption never stalls the loop.
- A server URL: an async engine of our own for the run, disposed afterwards.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, TypeVar
from collections.abc import Callable

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .. import dialects, migrations
from ..keys import VERSION_TABLE
from ..targets import refuse_session, refuse_sync
from .engine import async_url, create_async_engine, run_sync

Target = AsyncEngine | AsyncConnection | URL | str | os.PathLike[str]
T = TypeVar("T")


async def _apply(target: Target, api: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    refuse_session(target, f"aio.{api}")
    refuse_sync(target, api)
    if isinstance(target, AsyncConnection):
        return await target.run_sync(lambda conn: fn(conn, *args, **kwargs))
    if isinstance(target, AsyncEngine):
        return await run_sync(fn, target.sync_engine, *args, **kwargs)
    url = async_url(target)
    if dialects.for_url(url).holders_on_this_machine:
        # A database of this machine's (a file): the sync API's own file checks and
        # adoption, off the loop (pysqlite, a thread).
        sync_target = url.set(drivername="sqlite")
        return await asyncio.to_thread(fn, sync_target, *args, **kwargs)
    engine = create_async_engine(url, foreign_keys=False)
    try:
        return await run_sync(fn, engine.sync_engine, *args, **kwargs)
    finally:
        await engine.dispose()


async def upgrade(target: Target, revision: str = "head", *, version_table: str = VERSION_TABLE,
                  schema: str | None = None) -> str | None:
    """:func:`hermes_store.migrations.upgrade`, awaited; returns the revision reached."""
    return await _apply(target, "upgrade", migrations.upgrade, revision, version_table=version_table, schema=schema)


async def downgrade(target: Target, revision: str, *, version_table: str = VERSION_TABLE,
                    schema: str | None = None) -> str | None:
    """:func:`hermes_store.migrations.downgrade`, awaited."""
    return await _apply(target, "downgrade", migrations.downgrade, revision, version_table=version_table,
                        schema=schema)


async def stamp(target: Target, revision: str, *, version_table: str = VERSION_TABLE,
                schema: str | None = None) -> None:
    """:func:`hermes_store.migrations.stamp`, awaited."""
    await _apply(target, "stamp", migrations.stamp, revision, version_table=version_table, schema=schema)


async def current(target: Target, *, version_table: str = VERSION_TABLE, schema: str | None = None) -> str | None:
    """:func:`hermes_store.migrations.current`, awaited: None when never migrated."""
    return await _apply(target, "current", migrations.current, version_table=version_table, schema=schema)


__all__ = ["current", "downgrade", "stamp", "upgrade"]
