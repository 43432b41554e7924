"""SQLite: the file format Hermes writes, and our default backend.

Everything here is SQLite-only syntax or behaviour: PRAGMAs, ``sqlite_master``,
``BEGIN IMMEDIATE``, WAL checkpoints, VACUUM and the FTS5 special commands.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from typing import Any, Sequence

import functools
from contextlib import AbstractContextManager, nullcontext
import re
import tempfile
from pathlib import Path

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError

from .. import errors
from .base import OUR_TABLES, on_conflict_upsert
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
#: Hermes' FTS5 tables (v23 ``_FTS_TABLES``): word, trigram, and the optional CJK one.
WORD_FTS, TRIGRAM_FTS, CJK_FTS = HERMES_FTS_TABLES = ("messages_fts", "messages_fts_trigram", "messages_fts_cjk")
#: Name prefix of the plain tables a demoted pre-v23 index leaves (Hermes' ``_FTS_TRASH_PREFIX``).
FTS_TRASH_PREFIX = "fts_v22_trash_"
_OPTION = r"\b{}\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|([^\s,)]+))"


def _quote(name: str) -> str:
    """A double-quoted SQLite identifier."""
    return '"' + name.replace('"', '""') + '"'


def _like_prefix(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _fts_option(sql: str, option: str) -> str | None:
    """An option (``content``, ``content_rowid``...) of a stored ``CREATE VIRTUAL TABLE``."""
    found = re.search(_OPTION.format(re.escape(option)), sql, re.I)
    return None if found is None else next(g for g in found.groups() if g is not None)


@functools.lru_cache(maxsize=1)
def head_fts_objects() -> tuple[tuple[str, str, str], ...]:
    """(type, name, CREATE) of every FTS object our head schema has, in creation order.

    Read from a database our migrations build (once per process), so the layout a
    demotion creates is exactly what a fresh file gets: views, then the virtual
    tables, then the triggers that feed them (the CJK index is not ours).
    """
    from .. import migrations

    with tempfile.TemporaryDirectory(prefix="hermes-store-fts-") as tmp:
        path = Path(tmp) / "head.db"
        migrations.upgrade(path)
        raw = sqlite3.connect(str(path))
        try:
            rows = raw.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL"
                " AND name LIKE 'messages\\_fts%' ESCAPE '\\' ORDER BY rowid"
            ).fetchall()
        finally:
            raw.close()
    rows = [r for r in rows if not r[1].startswith(CJK_FTS)]
    views = [r for r in rows if r[0] == "view"]
    tables = [r for r in rows if r[0] == "table" and r[2].upper().startswith("CREATE VIRTUAL TABLE")]
    triggers = [r for r in rows if r[0] == "trigger"]
    return tuple(views + tables + triggers)


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


#: Execution option naming the BEGIN flavour for a connection ("DEFERRED"/"IMMEDIATE").
BEGIN_MODE = "hermes_store_begin"

# SQLite primary result codes (extended codes keep them in the low byte).
_SQLITE_READONLY = 8
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
# Fallback by message, for errors raised without a result code.
_BY_MESSAGE: tuple[tuple[str, type[errors.HermesStoreError]], ...] = (
    ("database or disk is full", errors.DiskFullError),
    ("attempt to write a readonly database", errors.ReadOnlyDatabaseError),
    ("unable to open database file", errors.DatabaseUnavailableError),
)
_BY_CODE: dict[int, type[errors.HermesStoreError]] = {
    _SQLITE_FULL: errors.DiskFullError,
    _SQLITE_READONLY: errors.ReadOnlyDatabaseError,
    _SQLITE_CANTOPEN: errors.DatabaseUnavailableError,
}


_NO_SUCH_TABLE = re.compile(r"no such table: (?:main\.)?(\w+)")


def _emit_begin(conn: Connection) -> None:
    """``begin`` hook: start a real SQLite transaction unless the driver already has one.

    Sent straight to the DB-API connection: this runs for every transaction, and a
    round trip through SQLAlchemy's execution machinery would double its cost. That
    also bypasses ``handle_error`` (SQLAlchemy runs this hook outside its own error
    handling), so failures are translated here.
    """
    dbapi = conn.connection.driver_connection
    if getattr(dbapi, "in_transaction", False):
        return
    mode = conn.get_execution_options().get(BEGIN_MODE, "DEFERRED")
    try:
        dbapi.execute(f"BEGIN {mode}")
    except sqlite3.Error as exc:
        typed = DIALECT.translate_error(exc)
        if typed is None:
            raise
        raise typed from exc


def install_begin_hook(target: Engine | Connection) -> None:
    """Make SQLAlchemy's ``begin()`` emit a real ``BEGIN`` on pysqlite.

    Works on an Engine (all its connections) or on a single Connection; harmless when
    the driver is already inside a transaction. Used by migrations on connections a
    host application hands us, without touching the host's engine.
    """
    if target.dialect.name != "sqlite":
        return
    # The listener list itself, not event.contains (keyed by id(), see above); on a
    # Connection it includes the engine's listeners, so a hooked engine is not hooked twice.
    if not any(fn is _emit_begin for fn in target.dispatch.begin):
        event.listen(target, "begin", _emit_begin)


def _outside_transaction(engine: Engine, sql: str) -> None:
    """Run a statement that must not sit inside BEGIN (VACUUM, checkpoints)."""
    with engine.connect() as conn:
        # The DB-API connection is in autocommit (our engine issues BEGIN itself).
        conn.connection.driver_connection.execute(sql).fetchall()


class SQLiteDialect:
    """The :class:`hermes_store.dialects.Dialect` of SQLite files."""

    name = "sqlite"
    has_schemas = False
    is_file = True
    replays_hermes_history = True
    keys_may_be_null = True

    def insert(self, table: Any) -> Any:
        return sqlite_insert(table)

    def isolate_failure(self, conn: Connection) -> AbstractContextManager[Any]:
        return nullcontext()  # a failed statement leaves a SQLite transaction usable

    def join_driver_transaction(self, conn: Connection) -> None:
        """pysqlite (in its default mode) sends BEGIN only before INSERT/UPDATE/DELETE; a
        host that began a transaction and ran only DDL or SELECTs so far is still in
        autocommit underneath, and our CREATE TABLEs would commit on their own."""
        dbapi = conn.connection.driver_connection
        if not getattr(dbapi, "in_transaction", True):
            dbapi.execute("BEGIN")

    def install_batch_hooks(self, conn: Connection) -> bool:
        return True  # ALTER TABLE is limited: revisions rebuild tables in batch mode

    def translate_error(self, exc: BaseException) -> errors.HermesStoreError | None:
        """sqlite3 errors → typed errors (by result code, else by message)."""
        if isinstance(exc, sqlite3.ProgrammingError) and "binding parameter" in str(exc).lower():
            return errors.InvalidInputError(str(exc))
        if not isinstance(exc, sqlite3.Error):
            return None
        missing = _NO_SUCH_TABLE.match(str(exc))
        if missing and missing.group(1) in OUR_TABLES:
            return errors.NotMigratedError(
                f"the database has no {missing.group(1)} table: it is not migrated yet; run "
                "hermes_store.migrations.upgrade(<path, URL or Engine>) or `hermes-store upgrade` first"
            )
        code = getattr(exc, "sqlite_errorcode", None)
        kind = _BY_CODE.get(code & 0xFF) if isinstance(code, int) else None
        if kind is None:
            text_ = str(exc).lower()
            kind = next((k for needle, k in _BY_MESSAGE if needle in text_), None)
        return None if kind is None else kind(str(exc))

    def engine_kwargs(self, url: URL, kwargs: dict[str, Any], *, prepared_statements: bool) -> dict[str, Any]:
        return dict(kwargs)  # pysqlite's defaults; our setup is per connection (configure_engine)

    def configure_engine(self, engine: Engine, *, foreign_keys: bool, busy_timeout_ms: int) -> None:
        """PRAGMAs on every new connection, and our own BEGIN (see :func:`install_begin_hook`)."""

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # We issue BEGIN ourselves (see install_begin_hook); the driver must not.
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

    def checkpoint_truncate(self, engine: Engine) -> None:
        """Fold the whole WAL into the file and truncate it to 0 bytes (before VACUUM).

        Best effort, as Hermes' ``vacuum()``: a checkpoint blocked by a reader is left
        for the next one.
        """
        try:
            _outside_transaction(engine, "PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError:
            pass

    def defer_foreign_keys(self, conn: Connection) -> None:
        conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")

    # -------------------------------------------------------------- FTS5 storage upkeep
    #
    # Hermes v23's optimize-storage machinery (see repositories/fts_upkeep.py for the
    # portable half): which FTS5 tables exist and answer, chunked backfill of an
    # external-content index, the pre-v23 ("legacy", inline) layout and its demotion
    # to plain ``fts_v22_trash_*`` tables, and the chunked teardown of those.

    def fts_tables(self, conn: Connection) -> dict[str, str]:
        """Hermes' FTS5 tables this file has (word, trigram, CJK), with their stored CREATE."""
        rows = conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)", HERMES_FTS_TABLES
        ).fetchall()
        found = {name: sql or "" for name, sql in rows}
        return {name: found[name] for name in HERMES_FTS_TABLES if name in found}

    def fts_table_exists(self, conn: Connection, name: str) -> bool:
        """A table (virtual, shadow or trash) of that name is in the schema."""
        return conn.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).first() is not None

    def fts_queryable(self, conn: Connection, name: str) -> bool:
        """Whether FTS5 table ``name`` exists and can be read here (its module and
        tokenizer are loaded: a missing one fails when a statement is prepared)."""
        if name not in self.fts_tables(conn):
            return False
        try:
            conn.exec_driver_sql(f"SELECT 1 FROM {_quote(name)} LIMIT 0").fetchall()
        except (DBAPIError, sqlite3.Error):
            return False
        return True

    def fts_search_available(self, conn: Connection) -> bool:
        """Full-text search can be served: FTS5 is compiled in and the word index answers."""
        return self.fts_queryable(conn, WORD_FTS)

    def fts_trigram_available(self, conn: Connection) -> bool:
        """The trigram (substring/CJK) index answers (SQLite 3.34+ has the tokenizer)."""
        return self.fts_queryable(conn, TRIGRAM_FTS)

    def fts_layout_is_legacy(self, conn: Connection) -> bool:
        """The word index has Hermes' pre-v23 inline shape (one column, no ``tool_name``)."""
        sql = self.fts_tables(conn).get(WORD_FTS)
        return sql is not None and "tool_name" not in sql

    def fts_backfill(self, conn: Connection, index: str, lo: int, hi: int, *, sweep: bool = False) -> int:
        """Index the rows ``lo < id <= hi`` of ``index``'s own content source.

        Rows the index already holds (its ``_docsize`` shadow table lists every indexed
        rowid) are skipped: FTS5 would silently index a rowid twice, which breaks the
        index. Without that table nothing can be told apart, so a ``sweep`` (repair of
        rows that should be there) does nothing, and a backfill inserts every row.
        Returns how many rows were inserted; an index without external content (no
        source to read back) gets none.
        """
        sql = self.fts_tables(conn).get(index)
        source = _fts_option(sql or "", "content")
        if not source:
            return 0
        key = _fts_option(sql or "", "content_rowid") or "rowid"
        columns = [r[1] for r in conn.exec_driver_sql(f"PRAGMA table_info({_quote(index)})")]
        docsize = f"{index}_docsize"
        known = self.fts_table_exists(conn, docsize)
        if sweep and not known:
            return 0
        skip = (
            f" AND {_quote(key)} NOT IN (SELECT id FROM {_quote(docsize)} WHERE id > :lo AND id <= :hi)"
            if known else ""
        )
        cols = ", ".join(_quote(c) for c in columns)
        return conn.execute(
            text(
                f"INSERT INTO {_quote(index)}(rowid, {cols}) SELECT {_quote(key)}, {cols} FROM {_quote(source)}"
                f" WHERE {_quote(key)} > :lo AND {_quote(key)} <= :hi{skip} ORDER BY {_quote(key)}"
            ),
            {"lo": int(lo), "hi": int(hi)},
        ).rowcount

    def fts_rebuild_from_source(self, conn: Connection, index: str) -> None:
        """FTS5 ``'rebuild'``: the index is dropped and made again from its content."""
        fts5.command(conn, index, "rebuild")

    def fts_trash_tables(self, conn: Connection) -> list[str]:
        """Plain tables left by a demotion (``fts_v22_trash_*``), by name."""
        return [
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ? ESCAPE '\\' ORDER BY name",
                (_like_prefix(FTS_TRASH_PREFIX),),
            )
        ]

    def fts_trash_rows(self, conn: Connection) -> int:
        """Rows still held by the trash tables (progress of a teardown)."""
        return sum(
            int(conn.exec_driver_sql(f"SELECT count(*) FROM {_quote(name)}").scalar() or 0)
            for name in self.fts_trash_tables(conn)
        )

    def fts_trash_delete(self, conn: Connection, name: str, rows: int) -> int:
        """Delete up to ``rows`` rows of trash table ``name``; drop it once empty.

        Returns the rows deleted (0 when the table was empty and is now gone). Only
        ``fts_v22_trash_*`` tables are ever touched.
        """
        if not name.startswith(FTS_TRASH_PREFIX):
            raise errors.InvalidInputError(f"{name!r} is not an FTS trash table")
        sql = conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).scalar()
        if sql is None:
            return 0
        if "WITHOUT ROWID" in sql.upper():
            info = conn.exec_driver_sql(f"PRAGMA table_info({_quote(name)})").fetchall()
            key = ", ".join(_quote(r[1]) for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
        else:
            key = "rowid"
        deleted = conn.execute(
            text(f"DELETE FROM {_quote(name)} WHERE ({key}) IN (SELECT {key} FROM {_quote(name)} LIMIT :n)"),
            {"n": max(1, int(rows))},
        ).rowcount
        if not deleted:
            conn.exec_driver_sql(f"DROP TABLE {_quote(name)}")
        return deleted

    def fts_demote_legacy(self, conn: Connection) -> list[str]:
        """Replace Hermes' pre-v23 inline FTS tables with our head layout, cheaply.

        As Hermes' ``_demote_legacy_fts_to_trash``: the old indexes' triggers go, their
        shadow tables are renamed to plain ``fts_v22_trash_*`` tables (emptied later in
        small chunks, so a big index never holds the write lock for long), the virtual
        table definitions are removed from the schema, and the head FTS objects (views,
        tables, gated triggers) are created empty. The caller sets the rebuild window
        markers in the same transaction; the backfill then fills the new indexes.
        Where the schema cannot be edited (a defensive-mode connection), the old table
        is dropped outright instead. Returns the demoted tables ([] when not legacy).
        """
        if not self.fts_layout_is_legacy(conn):
            return []
        tables = self.fts_tables(conn)
        demoted = [name for name in (WORD_FTS, TRIGRAM_FTS) if name in tables]
        for name, kind in conn.exec_driver_sql(
            "SELECT name, type FROM sqlite_master WHERE type IN ('trigger', 'view')"
            " AND name LIKE 'messages\\_fts%' ESCAPE '\\' AND name NOT LIKE 'messages\\_fts\\_cjk%' ESCAPE '\\'"
        ).fetchall():
            conn.exec_driver_sql(f"DROP {kind.upper()} IF EXISTS {_quote(name)}")
        for name in demoted:
            try:
                with conn.begin_nested():
                    self._move_shadows_to_trash(conn, name)
            except (DBAPIError, sqlite3.Error) as exc:
                log.warning("%s: could not keep the old index's pages for a chunked teardown (%s); dropping it", name, exc)
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {_quote(name)}")
        for _kind, _name, sql in head_fts_objects():
            conn.exec_driver_sql(sql)
        return demoted

    def _move_shadows_to_trash(self, conn: Connection, name: str) -> None:
        """Rename ``name``'s shadow tables to trash names and forget the virtual table."""
        existing = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for suffix in FTS_SHADOWS:
            shadow = name + suffix
            if shadow not in existing:
                continue
            target = FTS_TRASH_PREFIX + shadow
            n = 2
            while target in existing:
                target = f"{FTS_TRASH_PREFIX}{shadow}_{n}"
                n += 1
            conn.exec_driver_sql(f"ALTER TABLE {_quote(shadow)} RENAME TO {_quote(target)}")
            existing.add(target)
        # The module would drop the (now renamed) shadow tables with the table, and
        # cannot even be constructed without them: remove the definition itself, as
        # SQLite documents for a virtual table that can no longer be dropped.
        conn.exec_driver_sql("PRAGMA writable_schema = ON")
        try:
            conn.exec_driver_sql("DELETE FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        finally:
            conn.exec_driver_sql("PRAGMA writable_schema = RESET")  # off, and the schema is read again

    def ping(self, conn: Connection) -> None:
        conn.exec_driver_sql("SELECT 1")

    def sync_identity(self, conn: Connection, table: str, column: str = "id", *, at_least: int = 0) -> None:
        # INTEGER PRIMARY KEY continues after the largest id by itself; AUTOINCREMENT
        # (Hermes' messages) also never goes below sqlite_sequence, raised here.
        if at_least <= 0 or not self._autoincrement(conn, table):
            return
        updated = conn.execute(
            text("UPDATE sqlite_sequence SET seq = :n WHERE name = :t AND seq < :n"), {"n": at_least, "t": table}
        ).rowcount
        if not updated and conn.execute(
                text("SELECT count(*) FROM sqlite_sequence WHERE name = :t"), {"t": table}).scalar() == 0:
            conn.execute(text("INSERT INTO sqlite_sequence (name, seq) VALUES (:t, :n)"), {"n": at_least, "t": table})

    def identity_high_water(self, conn: Connection, table: str, column: str = "id") -> int:
        largest = conn.exec_driver_sql(f'SELECT max("{column}") FROM "{table}"').scalar() or 0
        if not self._autoincrement(conn, table):
            return int(largest)
        seq = conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = :t"), {"t": table}).scalar() or 0
        return max(int(largest), int(seq))

    @staticmethod
    def _autoincrement(conn: Connection, table: str) -> bool:
        """Whether ``table`` keeps a counter in sqlite_sequence (declared AUTOINCREMENT)."""
        sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"), {"t": table}).scalar()
        return bool(sql) and "AUTOINCREMENT" in sql.upper()

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
