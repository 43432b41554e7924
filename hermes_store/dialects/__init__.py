"""What differs per database kind, behind one small interface.

Portable queries live in the repositories, written once against the models' tables.
What truly differs per dialect (full-text and substring search statements, upserts,
locking and which errors are worth a retry, maintenance such as VACUUM, checkpoints
and FTS upkeep, schema introspection) lives in one module per dialect implementing
:class:`Dialect`. Callers pick the module with :func:`for_connection` or
:func:`for_dialect`; nothing else branches on the dialect name.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from .. import errors
from . import pg_asyncpg, postgresql, sqlite
from .base import Dialect

#: Dialect modules by SQLAlchemy dialect name.
_REGISTRY: Mapping[str, Dialect] = {sqlite.DIALECT.name: sqlite.DIALECT, postgresql.DIALECT.name: postgresql.DIALECT}
#: Where one driver of a database speaks its protocol differently (asyncpg prepares
#: every statement): (dialect name, driver name) -> module.
_BY_DRIVER: Mapping[tuple[str, str], Dialect] = {("postgresql", "asyncpg"): pg_asyncpg.DIALECT}


def find(name: str) -> Dialect | None:
    """The module for SQLAlchemy dialect (or URL backend) ``name``, None when we have none."""
    return _REGISTRY.get(name)


def all_dialects() -> tuple[Dialect, ...]:
    return tuple(_REGISTRY.values())


def for_dialect(name: str) -> Dialect:
    """The module for SQLAlchemy dialect ``name``; UnsupportedDatabaseError otherwise."""
    found = _REGISTRY.get(name)
    if found is None:
        raise errors.UnsupportedDatabaseError(
            f"{name!r} databases are not supported; supported: {', '.join(sorted(_REGISTRY))}"
        )
    return found


def _named_driver(url: URL) -> str:
    """The driver a URL names ("" for the database's default), read from the text alone:
    asking SQLAlchemy would load the dialect, and fail on a kind of database it lacks."""
    return url.drivername.partition("+")[2]


def for_connection(conn: Connection | Engine) -> Dialect:
    """The module for whatever database ``conn`` (a Connection or Engine) talks to."""
    return _BY_DRIVER.get((conn.dialect.name, conn.dialect.driver)) or for_dialect(conn.dialect.name)


def for_url(url: URL) -> Dialect:
    """The module for the database a URL names, before any driver is imported."""
    return _BY_DRIVER.get((url.get_backend_name(), _named_driver(url))) or for_dialect(url.get_backend_name())


def find_for(target: URL | Connection | Engine) -> Dialect | None:
    """The module for a URL, Engine or Connection; None when we have none for it."""
    driver = _named_driver(target) if isinstance(target, URL) else target.dialect.driver
    return _BY_DRIVER.get((backend_name(target), driver)) or _REGISTRY.get(backend_name(target))


def with_driver(url: URL, *, asyncio: bool) -> URL:
    """``url`` with a driver of the other flavour when it has the wrong one: for asyncio
    the dialect's default async driver (``sqlite+aiosqlite``, ``postgresql+asyncpg``)
    unless it names an accepted one; for sync code the dialect's sync driver."""
    dialect = for_url(url)
    driver = url.drivername.partition("+")[2]
    if asyncio:
        wanted = driver if driver in dialect.async_drivers else dialect.async_drivers[0]
    else:
        asyncio_only = set(dialect.async_drivers) - {dialect.sync_driver}
        wanted = driver if driver and driver not in asyncio_only else dialect.sync_driver
    return url.set(drivername=f"{dialect.name}+{wanted}")


def backend_name(target: URL | Connection | Engine) -> str:
    """The database kind a URL, Engine or Connection talks to ("sqlite", "postgresql"…)."""
    return target.get_backend_name() if isinstance(target, URL) else target.dialect.name


__all__ = [
    "Dialect",
    "all_dialects",
    "backend_name",
    "find",
    "find_for",
    "for_connection",
    "for_dialect",
    "for_url",
    "with_driver",
]
