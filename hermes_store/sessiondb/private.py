"""The private corners of Hermes' SessionDB that Hermes' own application reaches into.

``hermes_cli``, ``agent/insights.py`` and the gateway use ``db._conn`` as a plain
``sqlite3.Connection`` (``?`` parameters, rows read by column name, ``commit()``),
``db._execute_write(fn)`` and ``with db._lock:``. These make that code run on our
store unchanged, without weakening our own write path:

- ``_conn`` is a separate autocommit connection to the same file. Each statement
  commits on its own, so it can never hold the write lock across our transactions;
  it waits for ours with a busy timeout and ours retry around it. It is opened
  lazily, through Hermes' ``_connect_tracked_db`` looked up on ``hermes_state`` at
  call time (tests patch it, and the ``sqlite3.connect`` it calls).
- ``_execute_write(fn)`` hands ``fn`` the DB-API connection of one of our write
  transactions (``BEGIN IMMEDIATE`` on SQLite), with ``sqlite3.Row`` rows for the
  duration, and our retries; ``fn``'s result comes back unchanged.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time as _time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from sqlalchemy import Connection

from .. import errors
from ..hermes_names import open_raw_connection
from ..dialects.sqlite import driver_errors
from ..journal import checkpoint_passive
from ..state_files import _connect_tracked_db, _is_not_a_database_error, limit_wal_size
from ..operations.steps import jitter
from ._host import Host
from ..patch_points import facade_value

log = logging.getLogger("hermes_store.facade")

T = TypeVar("T")

#: How long a raw ``_conn`` statement waits for our write lock (seconds).
RAW_BUSY_TIMEOUT_S = 10.0


class NoRawConnectionError(errors.UnsupportedDatabaseError, AttributeError):
    """``_conn`` on a server database: there is no sqlite3 connection to hand out.

    Also an AttributeError, so Hermes' ``getattr(db, "_conn", None)`` probes fall back.
    """


def _tracked_connect(database: Any, **kwargs: Any) -> sqlite3.Connection:
    """Open a raw connection through ``hermes_state._connect_tracked_db`` as it is now."""
    return facade_value("_connect_tracked_db", _connect_tracked_db)(database, **kwargs)


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
                    _tracked_connect, path,
                    read_only=getattr(self, "read_only", False), busy_timeout_s=RAW_BUSY_TIMEOUT_S,
                )
            return self._raw_conn

    @_conn.setter
    def _conn(self, value: Any) -> None:
        """Hermes' ``_conn`` is a plain attribute: tests put a mock, a wrapper or None there.
        None means "not open": the next use opens a fresh one."""
        self._raw_conn = value

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

    # ------------------------------------------------------------------ Hermes v25/v26 internals

    def _try_wal_checkpoint(self) -> bool:
        """One PASSIVE checkpoint on ``_conn``; a failure is a WARNING, never an error."""
        try:
            checkpoint_passive(self._conn)
        except (sqlite3.Error, errors.HermesStoreError, AttributeError) as exc:
            log.warning("WAL checkpoint (PASSIVE) failed: %s", exc)
            return False
        return True

    def _sleep_before_write_retry(self, deadline: float, patience_s: float) -> bool:
        """One jittered wait before the next try of a locked write; False once ``deadline``
        (a ``time.monotonic()`` value) has passed."""
        clock = facade_value("time", _time)
        now = clock.monotonic()
        left = deadline - now
        if left <= 0:
            return False
        self._sleep(jitter(max(0.0, patience_s - left), left))
        return True

    @staticmethod
    def _is_not_a_database_error(exc: BaseException) -> bool:
        """A ``sqlite3.DatabaseError`` saying "file is not a database" (a swapped or damaged
        file); the module-level ``hermes_state._is_not_a_database_error`` as it is now."""
        return bool(facade_value("_is_not_a_database_error", _is_not_a_database_error)(exc))

    def _reconnect_after_notadb(self) -> bool:
        """Reopen the store once, as the constructor does (the file was replaced under us);
        False when already tried or the reopen fails (the caller re-raises its error)."""
        if self.__dict__.get("_notadb_reconnected") or getattr(self, "db_path", None) is None:
            return False
        self.__dict__["_notadb_reconnected"] = True
        try:
            self.close()
            self._open(*self._open_args)
        except Exception as exc:
            log.warning("%s: reopening after 'file is not a database' failed: %s", self._label(), exc)
            return False
        return True

    # Hermes v25's read pool: read-only ``sqlite3`` connections for code that reads raw
    # while another thread writes. Our own reads use the engine's pool.

    @property
    def _read_pool(self) -> list[sqlite3.Connection]:
        """Idle pooled read connections."""
        return self.__dict__.setdefault("_read_pool_list", [])

    @property
    def _read_permits(self) -> threading.BoundedSemaphore:
        """At most ``_READ_POOL_MAX`` live pooled read connections."""
        found = self.__dict__.get("_read_permits_sem")
        if found is None:
            found = self.__dict__["_read_permits_sem"] = threading.BoundedSemaphore(
                int(facade_value("_READ_POOL_MAX", 8)))
        return found

    def _get_read_conn(self) -> sqlite3.Connection | None:
        """A pooled read-only connection, or None when reads should use ``_conn``: not WAL,
        read-only store, a server, all permits taken, or opening failed in the last 60 s."""
        return self._checkout_read_conn()

    def _checkout_read_conn(self) -> sqlite3.Connection | None:
        path = getattr(self, "db_path", None)
        if path is None or self.read_only or not getattr(self, "_wal_active", False):
            return None
        retry_after = self.__dict__.get("_read_open_failed_at")
        clock = facade_value("time", _time)
        if retry_after is not None and clock.monotonic() - retry_after < float(
                facade_value("_READ_OPEN_RETRY_SECONDS", 60)):
            return None
        if not self._read_permits.acquire(blocking=False):
            return None
        with self._raw_lock:
            if self._read_pool:
                return self._read_pool.pop()
        try:
            conn = _tracked_connect(f"file:{path}?mode=ro", uri=True, timeout=RAW_BUSY_TIMEOUT_S,
                                    check_same_thread=False)
        except sqlite3.Error:
            self.__dict__["_read_open_failed_at"] = clock.monotonic()
            self._read_permits.release()
            return None
        try:
            conn.row_factory = sqlite3.Row
            limit_wal_size(conn)
            facade_value("apply_database_pragmas", lambda *_a, **_k: None)(conn, db_label=path.name)
        except BaseException:
            conn.close()
            self._read_permits.release()
            raise
        return conn

    def _close_read_conn(self, conn: sqlite3.Connection | None) -> None:
        """Close a checked-out read connection and free its permit."""
        if conn is None:
            return
        try:
            conn.close()
        except sqlite3.Error:
            pass
        self._read_permits.release()

    @contextmanager
    def _read_ctx(self) -> Iterator[sqlite3.Connection]:
        """A ``sqlite3`` connection to read with: a pooled read-only one under WAL (no
        ``_lock``), else ``_conn`` under ``_lock``."""
        conn = self._checkout_read_conn()
        if conn is None:
            with self._lock:
                yield self._conn
            return
        try:
            yield conn
        except BaseException:
            self._close_read_conn(conn)
            raise
        with self._raw_lock:
            self._read_pool.append(conn)
        self._read_permits.release()

    def _close_read_pool(self) -> None:
        """Close the idle pooled read connections (``close()``)."""
        with self._raw_lock:
            idle, self.__dict__["_read_pool_list"] = list(self.__dict__.get("_read_pool_list", [])), []
        for conn in idle:
            try:
                conn.close()
            except sqlite3.Error:
                pass
