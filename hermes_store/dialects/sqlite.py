"""SQLite: the file format Hermes writes, and our default backend.

Everything here is SQLite-only syntax or behaviour: PRAGMAs, ``sqlite_master``,
``BEGIN IMMEDIATE``, WAL checkpoints, VACUUM and the FTS5 special commands.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from typing import Any, Sequence

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

from ..engine import BEGIN_MODE
from . import on_conflict_upsert
from ..search.fts import fts5

# Warnings keep the facade's logger name: that is where users have filters for them.
log = logging.getLogger("hermes_store.facade")

#: Error texts meaning the filesystem cannot do WAL's shared-memory locking (NFS/SMB),
#: as Hermes v23 ("disk i/o error" was dropped there: it is usually real damage).
_WAL_FALLBACK_CAUSES = ("locking protocol", "not authorized")
_wal_warned: set[str] = set()
_LOCKED = ("database is locked", "database is busy", "database table is locked")
#: Suffixes of the shadow tables FTS5 keeps next to each virtual table.
FTS_SHADOWS = ("_data", "_idx", "_content", "_docsize", "_config")


def apply_wal_with_fallback(conn: sqlite3.Connection, *, db_label: str = "state.db") -> str:
    """Switch to WAL; on filesystems that refuse it (NFS/SMB...) use rollback journal.

    Returns "wal" or "delete", as Hermes v23: a file already in WAL is left alone
    (no mode switch on every open); a WAL-incapable filesystem falls back to DELETE
    with one warning per label, unless the file on disk is in WAL already (other
    processes rely on it: the error is raised instead). Other errors propagate. On
    macOS, checkpoints get a full fsync barrier and commits synchronous=FULL.
    """
    def mode_now() -> str | None:
        try:
            row = conn.execute("PRAGMA journal_mode").fetchone()  # reads the mode, changes nothing
        except sqlite3.Error:
            return None
        return str(row[0]).lower() if row else None

    if mode_now() == "wal":
        mode = "wal"
    else:
        try:
            mode = str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
            if mode != "wal":
                raise sqlite3.OperationalError(f"locking protocol (journal_mode stayed {mode})")
        except sqlite3.OperationalError as exc:
            if not any(cause in str(exc).lower() for cause in _WAL_FALLBACK_CAUSES):
                raise
            if mode_now() == "wal":
                raise
            if db_label not in _wal_warned:
                _wal_warned.add(db_label)
                log.warning("%s: WAL mode unavailable (%s); using rollback journal instead", db_label, exc)
            conn.execute("PRAGMA journal_mode=DELETE")
            mode = "delete"
    if sys.platform == "darwin":
        conn.execute("PRAGMA checkpoint_fullfsync=1")  # F_FULLFSYNC at checkpoints: a real barrier on Apple disks
        conn.execute("PRAGMA synchronous=FULL")  # WAL's NORMAL can lose commits on macOS power loss
    return mode


def _outside_transaction(engine: Engine, sql: str) -> None:
    """Run a statement that must not sit inside BEGIN (VACUUM, checkpoints)."""
    with engine.connect() as conn:
        # The DB-API connection is in autocommit (our engine issues BEGIN itself).
        conn.connection.driver_connection.execute(sql).fetchall()


class SQLiteDialect:
    """The :class:`hermes_store.dialects.Dialect` of SQLite files."""

    name = "sqlite"

    # -------------------------------------------------------------- locking and retries

    def begin_options(self, write: bool) -> dict[str, Any]:
        # Writers take the write lock at BEGIN, so a transaction never fails half-way
        # through on a lock upgrade.
        return {BEGIN_MODE: "IMMEDIATE" if write else "DEFERRED"}

    def is_retryable(self, exc: BaseException) -> bool:
        if not isinstance(exc, (OperationalError, sqlite3.OperationalError)):
            return False
        text = str(exc).lower()
        return any(marker in text for marker in _LOCKED)

    def bound_lock_wait(self, conn: Connection, seconds: float) -> None:
        return None  # BEGIN IMMEDIATE already holds the write lock; waits end at busy_timeout

    def on_connect(self, dbapi_conn: Any, *, label: str) -> str:
        mode = apply_wal_with_fallback(dbapi_conn, db_label=label)
        # NORMAL is durable across application crashes in WAL mode and saves an fsync
        # per commit (not on macOS, where apply_wal_with_fallback asked for FULL).
        if sys.platform != "darwin":
            dbapi_conn.execute("PRAGMA synchronous=NORMAL")
        return mode

    # -------------------------------------------------------------- upserts

    upsert_sql = staticmethod(on_conflict_upsert)

    # -------------------------------------------------------------- full-text search

    def fts_indexes(self, conn: Connection) -> list[str]:
        return fts5.existing_indexes(conn)

    def fts_command(self, conn: Connection, index: str, cmd: str) -> None:
        fts5.command(conn, index, cmd)

    def match_sql(self, index: str) -> str:
        return fts5.match_sql(index)

    def top_sql(self, index: str) -> str:
        return fts5.top_sql(index)

    # -------------------------------------------------------------- maintenance

    def vacuum(self, engine: Engine) -> None:
        _outside_transaction(engine, "VACUUM")

    def checkpoint(self, engine: Engine) -> None:
        try:
            _outside_transaction(engine, "PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.OperationalError:
            pass  # a busy checkpoint is simply retried at the next interval

    def defer_foreign_keys(self, conn: Connection) -> None:
        conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")

    def ping(self, conn: Connection) -> None:
        conn.exec_driver_sql("SELECT 1")

    def sync_identity(self, conn: Connection, table: str, column: str = "id") -> None:
        return None  # INTEGER PRIMARY KEY always continues after the largest id

    # -------------------------------------------------------------- introspection

    def table_info(self, conn: Connection, table: str) -> Sequence[tuple[str, bool, str | None]]:
        return [(r[1], bool(r[3]), r[4]) for r in conn.exec_driver_sql(f'PRAGMA main.table_info("{table}")')]

    def object_sql(self, conn: Connection, name: str) -> str:
        return conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).scalar() or ""

    def table_counts(self, conn: Connection | sqlite3.Connection) -> tuple[list[tuple[str, int]], list[str]]:
        run = conn.exec_driver_sql if isinstance(conn, Connection) else conn.execute
        rows = run(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
            "ORDER BY name"
        ).fetchall()
        virtual = [n for n, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL TABLE")]
        shadows = {v + s for v in virtual for s in FTS_SHADOWS}
        plain = []
        for name, _sql in rows:
            if name in shadows or name in virtual:
                continue
            count = run(f'SELECT count(*) FROM "{name}"').fetchone()[0]
            plain.append((name, int(count)))
        return plain, virtual


DIALECT = SQLiteDialect()
