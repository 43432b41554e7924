"""Async engines set up like :func:`hermes_store.engine.create_engine`.

The same dialect modules configure them: their ``connect`` and ``begin`` hooks go on
the AsyncEngine's ``sync_engine``, where SQLAlchemy runs them (on the caller's
greenlet), so an async engine gets the same PRAGMAs, the same real BEGIN, foreign
keys, typed errors and pooler-safe PostgreSQL defaults as a sync one.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, TypeVar
from collections.abc import Callable

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as _sa_create_async_engine
from sqlalchemy.util import greenlet_spawn

from .. import dialects, errors
from ..engine import DEFAULT_BUSY_TIMEOUT_MS, install_error_translation, to_url, with_schema
from ..targets import refuse_sync

T = TypeVar("T")

def async_url(target: str | os.PathLike[str] | URL) -> URL:
    """``target`` (a URL or a SQLite file path) with an asyncio driver: ``sqlite://``
    and a path become ``sqlite+aiosqlite://``, ``postgresql://`` (or ``+psycopg2``,
    ``+pg8000``) ``postgresql+asyncpg://``; ``postgresql+psycopg://`` stays (psycopg 3
    is async too). Another kind of database is an UnsupportedDatabaseError."""
    url = to_url(target)
    if dialects.find_for(url) is None:
        raise errors.UnsupportedDatabaseError(
            f"{dialects.backend_name(url)} databases are not supported; hermes_store.aio runs on "
            "sqlite+aiosqlite://, postgresql+asyncpg:// and postgresql+psycopg://"
        )
    return dialects.with_driver(url, asyncio=True)


def create_async_engine(
    target: str | os.PathLike[str] | URL,
    *,
    schema: str | None = None,
    foreign_keys: bool = True,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    prepared_statements: bool = False,
    **kwargs: Any,
) -> AsyncEngine:
    """An AsyncEngine with our setup (see the module docstring); the arguments mean what
    they mean for :func:`hermes_store.engine.create_engine`."""
    refuse_sync(target, "create_async_engine")
    if isinstance(target, AsyncEngine):
        raise errors.InvalidInputError("aio.create_async_engine takes a URL or a path; this is an engine already")
    url = async_url(with_schema(target, schema))
    dialect = dialects.for_url(url)
    engine = _sa_create_async_engine(url, **dialect.engine_kwargs(url, kwargs, prepared_statements=prepared_statements))
    dialect.configure_engine(engine.sync_engine, foreign_keys=foreign_keys, busy_timeout_ms=busy_timeout_ms)
    install_error_translation(engine.sync_engine)
    return engine


async def run_sync(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run sync ``fn`` on a greenlet of this event loop: each statement it sends through an
    async engine awaits the driver, so the loop goes on serving other tasks meanwhile."""
    return await greenlet_spawn(fn, *args, **kwargs)


async def run_interruptible(interrupt: Callable[[], bool], fn: Callable[..., T], *args: Any) -> T:
    """:func:`run_sync`, where cancelling the caller first stops the statement under way
    (``interrupt``, a dialect's :meth:`~hermes_store.dialects.base.Dialect.interrupter`)
    and lets ``fn`` end with the driver's error, so the connection stays usable and the
    rollback that follows runs at once. Where the driver cancels the statement at the
    server itself (``interrupt`` returns False), ``fn``'s task is cancelled instead."""
    inner = asyncio.ensure_future(run_sync(fn, *args))
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        if not inner.done() and not interrupt():
            inner.cancel()
        await asyncio.wait([inner])
        if not inner.cancelled():
            inner.exception()  # retrieved: the caller sees its own cancellation, not this
        raise


__all__ = ["async_url", "create_async_engine", "run_interruptible", "run_sync"]
