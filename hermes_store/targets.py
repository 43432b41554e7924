"""Which API a database target belongs to: the sync one, or :mod:`hermes_store.aio`.

An AsyncEngine handed to ``SessionDB`` (or a sync Engine handed to ``aio``) would fail
deep inside SQLAlchemy with a bare TypeError or MissingGreenlet; both APIs check their
targets on the way in and say, in one line, which one to use instead.
"""

from __future__ import annotations

import sys
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import Session

from . import errors

SYNC_TYPES = (Engine, Connection, Session)
#: SQLAlchemy's asyncio layer: looked up, never imported here (it loads greenlet and
#: asyncio, which a sync store never needs), since no async object exists before it is.
_ASYNCIO_MODULE = "sqlalchemy.ext.asyncio"


def async_types() -> tuple[type, ...]:
    """SQLAlchemy's AsyncEngine, AsyncConnection and AsyncSession once its asyncio layer
    is loaded; () before (and without the ``async`` extra), when nothing can be one."""
    module = sys.modules.get(_ASYNCIO_MODULE)
    if module is None:
        return ()
    return (module.AsyncEngine, module.AsyncConnection, module.AsyncSession)


def async_driver(url: URL) -> bool:
    """Whether ``url`` names an asyncio driver (``+asyncpg``, ``+aiosqlite``…)."""
    try:
        return bool(getattr(url.get_dialect(), "is_async", False))
    except (NoSuchModuleError, ArgumentError):
        return False  # not a dialect SQLAlchemy knows: the caller's own check refuses it


def refuse_async(target: Any, api: str) -> None:
    """InvalidInputError when the sync ``api`` is given an async engine, connection,
    session or async-driver URL."""
    if isinstance(target, async_types()):
        kind = type(target).__name__
        raise errors.InvalidInputError(
            f"{api} takes a sync {kind.removeprefix('Async')}, not an {kind}: "
            "use hermes_store.aio (AsyncSessionDB, AsyncUnitOfWork, aio.upgrade …) on async ones"
        )
    if isinstance(target, URL) and async_driver(target):
        raise errors.InvalidInputError(
            f"{api}: {target.drivername} is an asyncio driver; use hermes_store.aio with it, "
            "or a sync driver (sqlite://, postgresql+psycopg://) here"
        )


def refuse_session(target: Any, api: str) -> None:
    """InvalidInputError for an ORM Session (sync or async) where migrations need a
    connection: DDL runs on the connection, inside the transaction it is in."""
    if isinstance(target, Session) or type(target).__name__ == "AsyncSession":
        raise errors.InvalidInputError(
            f"{api} takes an engine, a connection, a URL or a path, not a {type(target).__name__}: "
            "pass the session's connection (session.connection(), or await session.connection())"
        )


def refuse_sync(target: Any, api: str) -> None:
    """InvalidInputError when ``hermes_store.aio``'s ``api`` is given a sync engine,
    connection or session."""
    if isinstance(target, SYNC_TYPES):
        kind = type(target).__name__
        raise errors.InvalidInputError(
            f"aio.{api} takes an async engine or connection, not a sync {kind}: "
            "use hermes_store's sync API (SessionDB, UnitOfWork, migrations …) with it, "
            "or hermes_store.aio.create_async_engine(url)"
        )


__all__ = ["SYNC_TYPES", "async_driver", "async_types", "refuse_async", "refuse_session", "refuse_sync"]
