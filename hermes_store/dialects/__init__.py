"""What differs per database kind, behind one small interface.

Portable queries live in the repositories, written once against the models' tables.
What truly differs per dialect (full-text and substring search statements, upserts,
locking and which errors are worth a retry, maintenance such as VACUUM, checkpoints
and FTS upkeep, schema introspection) lives in one module per dialect implementing
:class:`Dialect`. Callers pick the module with :func:`for_connection` or
:func:`for_dialect`; nothing else branches on the dialect name.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Mapping

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from .. import errors
from .base import Dialect

#: Dialect modules (each exporting ``DIALECT``) by SQLAlchemy dialect name, imported on
#: first use: a SQLite store never loads the PostgreSQL modules (nor SQLAlchemy's
#: PostgreSQL dialect). A new database kind is one line here and one module beside this one.
_MODULES: Mapping[str, str] = {
    "sqlite": f"{__name__}.sqlite",
    "postgresql": f"{__name__}.postgresql",
}
#: Where one driver of a database speaks its protocol differently (asyncpg prepares
#: every statement): (dialect name, driver name) -> module, imported on first use too.
_DRIVER_MODULES: Mapping[tuple[str, str], str] = {
    ("postgresql", "asyncpg"): f"{__name__}.pg_asyncpg",
}


@functools.cache
def _load(module: str) -> Dialect:
    dialect: Dialect = importlib.import_module(module).DIALECT
    return dialect


def _by_name(name: str) -> Dialect | None:
    module = _MODULES.get(name)
    return _load(module) if module is not None else None


def _by_driver(name: str, driver: str) -> Dialect | None:
    module = _DRIVER_MODULES.get((name, driver))
    return _load(module) if module is not None else None


def find(name: str) -> Dialect | None:
    """The module for SQLAlchemy dialect (or URL backend) ``name``, None when we have none."""
    return _by_name(name)


def all_dialects() -> tuple[Dialect, ...]:
    """Every dialect module (importing those not loaded yet)."""
    return tuple(_load(module) for module in _MODULES.values())


def loaded_dialects() -> tuple[Dialect, ...]:
    """The dialect modules imported so far, without importing the others: what translates
    a driver's error (a database only ever reaches us through a loaded module)."""
    return tuple(_load(module) for module in _MODULES.values() if module in sys.modules)


def for_dialect(name: str) -> Dialect:
    """The module for SQLAlchemy dialect ``name``; UnsupportedDatabaseError otherwise."""
    found = _by_name(name)
    if found is None:
        raise errors.UnsupportedDatabaseError(
            f"{name!r} databases are not supported; supported: {', '.join(sorted(_MODULES))}"
        )
    return found


def _named_driver(url: URL) -> str:
    """The driver a URL names ("" for the database's default), read from the text alone:
    asking SQLAlchemy would load the dialect, and fail on a kind of database it lacks."""
    return url.drivername.partition("+")[2]


def for_connection(conn: Connection | Engine) -> Dialect:
    """The module for whatever database ``conn`` (a Connection or Engine) talks to."""
    return _by_driver(conn.dialect.name, conn.dialect.driver) or for_dialect(conn.dialect.name)


def for_url(url: URL) -> Dialect:
    """The module for the database a URL names, before any driver is imported."""
    return _by_driver(url.get_backend_name(), _named_driver(url)) or for_dialect(url.get_backend_name())


def find_for(target: URL | Connection | Engine) -> Dialect | None:
    """The module for a URL, Engine or Connection; None when we have none for it."""
    driver = _named_driver(target) if isinstance(target, URL) else target.dialect.driver
    return _by_driver(backend_name(target), driver) or _by_name(backend_name(target))


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
    "loaded_dialects",
    "with_driver",
]
