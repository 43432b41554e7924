"""Engines and connections for SQLite files, with the transaction handling we rely on.

Python's ``sqlite3`` module (3.11) opens transactions lazily and only before DML, so
DDL and SELECTs run in autocommit and ``BEGIN IMMEDIATE`` is never issued. We take
transaction control away from the driver (``isolation_level = None``) and emit our own
``BEGIN`` from SQLAlchemy's ``begin`` event. That makes migrations atomic, lets writers
take the write lock up front, and makes SAVEPOINT-based test fixtures roll back cleanly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy import create_engine as _sa_create_engine
from sqlalchemy.engine import URL, make_url

#: Execution option naming the BEGIN flavour for a connection ("DEFERRED"/"IMMEDIATE").
BEGIN_MODE = "hermes_store_begin"

DEFAULT_BUSY_TIMEOUT_MS = 1000


def default_db_path() -> Path:
    """``$HERMES_HOME/state.db``, else ``~/.hermes/state.db`` (Hermes' own default)."""
    home = os.environ.get("HERMES_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".hermes"
    return base / "state.db"


def to_url(target: str | os.PathLike[str] | URL) -> URL:
    """Accept a SQLAlchemy URL or a plain file path."""
    if isinstance(target, URL):
        return target
    s = os.fspath(target)
    if "://" in s:
        return make_url(s)
    return make_url("sqlite://").set(database=str(Path(s).expanduser()))


def _emit_begin(conn: Connection) -> None:
    """``begin`` hook: start a real SQLite transaction unless the driver already has one.

    Sent straight to the DB-API connection: this runs for every transaction, and a
    round trip through SQLAlchemy's execution machinery would double its cost.
    """
    dbapi = conn.connection.driver_connection
    if getattr(dbapi, "in_transaction", False):
        return
    mode = conn.get_execution_options().get(BEGIN_MODE, "DEFERRED")
    dbapi.execute(f"BEGIN {mode}")


def install_begin_hook(target: Engine | Connection) -> None:
    """Make SQLAlchemy's ``begin()`` emit a real ``BEGIN`` on pysqlite.

    Works on an Engine (all its connections) or on a single Connection; harmless when
    the driver is already inside a transaction. Used by migrations on connections a
    host application hands us, without touching the host's engine.
    """
    if target.dialect.name != "sqlite":
        return
    if not event.contains(target, "begin", _emit_begin):
        event.listen(target, "begin", _emit_begin)


def create_engine(
    target: str | os.PathLike[str] | URL,
    *,
    foreign_keys: bool = True,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    **kwargs: Any,
) -> Engine:
    """Create an Engine for a SQLite file with our PRAGMAs and transaction handling."""
    url = to_url(target)
    engine = _sa_create_engine(url, **kwargs)
    if engine.dialect.name != "sqlite":
        return engine

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # We issue BEGIN ourselves (see module docstring); the driver must not.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            # Enforce parent/child references Hermes declares (off by default in SQLite).
            cur.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
            # Wait briefly for another writer instead of failing at once; callers that
            # need longer budgets retry above this (see SessionDB).
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        finally:
            cur.close()

    install_begin_hook(engine)
    return engine
