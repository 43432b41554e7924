"""The private corners of Hermes' SessionDB that Hermes' own application reaches into.

``hermes_cli``, ``agent/insights.py`` and the gateway use ``db._conn`` as a plain
``sqlite3.Connection`` (``?`` parameters, rows read by column name, ``commit()``),
``db._execute_write(fn)`` and ``with db._lock:``. These make that code run on our
store unchanged, without weakening our own write path:

- ``_conn`` is a separate autocommit connection to the same file. Each statement
  commits on its own, so it can never hold the write lock across our transactions;
  it waits for ours with a busy timeout and ours retry around it. It is opened
  lazily, through ``sqlite3.connect`` looked up at call time (tests patch it).
- ``_execute_write(fn)`` hands ``fn`` the DB-API connection of one of our write
  transactions (``BEGIN IMMEDIATE`` on SQLite), with ``sqlite3.Row`` rows for the
  duration, and our retries; ``fn``'s result comes back unchanged.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from typing import Any, Callable, TypeVar

from sqlalchemy import Connection

from .. import errors
from ..hermes_names import open_raw_connection
from ..repositories.base import driver_errors
from ._host import Host

T = TypeVar("T")

#: How long a raw ``_conn`` statement waits for our write lock (seconds).
RAW_BUSY_TIMEOUT_S = 10.0


class NoRawConnectionError(errors.UnsupportedDatabaseError, AttributeError):
    """``_conn`` on a server database: there is no sqlite3 connection to hand out.

    Also an AttributeError, so Hermes' ``getattr(db, "_conn", None)`` probes fall back.
    """


def _sqlite3() -> Any:
    """The ``sqlite3`` module the facade names now (``hermes_state.sqlite3`` after the swap)."""
    facade = sys.modules.get("hermes_store.facade")
    return getattr(facade, "sqlite3", sqlite3)


class PrivateSurfaceMixin(Host):
    _raw_conn: sqlite3.Connection | None = None
    _raw_lock = threading.Lock()

    @property
    def _conn(self) -> sqlite3.Connection:
        """A plain ``sqlite3.Connection`` on the same file (autocommit, ``sqlite3.Row`` rows)."""
        conn = self._raw_conn
        if conn is not None:
            return conn
        path = getattr(self, "db_path", None)
        if path is None:
            raise NoRawConnectionError(
                "_conn is a sqlite3 connection and this SessionDB is on a server; "
                "use the public methods or a repository on db.engine"
            )
        with self._raw_lock:
            if self._raw_conn is None:
                self._raw_conn = open_raw_connection(
                    _sqlite3().connect, path,
                    read_only=getattr(self, "read_only", False), busy_timeout_s=RAW_BUSY_TIMEOUT_S,
                )
            return self._raw_conn

    def _close_raw(self) -> None:
        """Close ``_conn`` if it was ever opened (SessionDB.close calls this)."""
        with self._raw_lock:
            conn, self._raw_conn = self._raw_conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def _execute_write(self, fn: Callable[[Any], T]) -> T:
        """Hermes' hook: ``fn(conn)`` inside one of our write transactions, retried on lock.

        On SQLite ``conn`` is the ``sqlite3.Connection`` in ``BEGIN IMMEDIATE`` with
        ``sqlite3.Row`` rows; an exception rolls everything back and propagates.
        On PostgreSQL it is the psycopg connection of the transaction.
        """
        def run(conn: Connection) -> T:
            driver = conn.connection.driver_connection
            with driver_errors():  # typed errors for a full disk etc.; "locked" still retries
                if isinstance(driver, sqlite3.Connection):
                    before = driver.row_factory
                    driver.row_factory = sqlite3.Row
                    try:
                        return fn(driver)
                    finally:
                        driver.row_factory = before
                return fn(driver)

        return self._write(run)
