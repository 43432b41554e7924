"""SQLite: the file format Hermes writes, and our default backend.

Everything here is SQLite-only syntax or behaviour: PRAGMAs, ``sqlite_master``,
``BEGIN IMMEDIATE``, WAL checkpoints, VACUUM and the FTS5 special commands.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import sys
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from sqlalchemy import Connection, Engine, LargeBinary, event, func, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.util import await_only

from .. import encryption, errors, write_queue
from ..sqlite_journal import WAL_FALLBACK_WARNED
from .base import CLOSED_BY_COMPRESSION, OUR_TABLES, MessageRuns, refused_append, translate_python_error
from .fts5 import (
    FTS_SHADOWS,
    TRIGRAM_FTS,
    WORD_FTS,
    Fts5Storage,
    existing_indexes,
    fts5_command,
)
from ..search import latin_in_cjk as runs
from . import search_fts5
from ..search.fts import TRIGRAM_INDEX, TRIGRAM_SOURCE_VIEW, WORD_INDEX, fts5 as fts5_statements, trigram_sessions

# Warnings keep the facade's logger name: that is where users have filters for them.
log = logging.getLogger("hermes_store.facade")

#: Error texts meaning the filesystem cannot do WAL's shared-memory locking (NFS/SMB),
#: for our own connections ("disk i/o error" left out: it is usually real damage).
_WAL_FALLBACK_CAUSES = ("locking protocol", "not authorized")
#: Labels warned about a WAL fallback: one set for our connections and Hermes' function.
_wal_warned = WAL_FALLBACK_WARNED
#: ``journal_size_limit`` of a WAL connection (64 MiB, Hermes v26's): a checkpoint that
#: empties the ``-wal`` file truncates it back to this size instead of leaving it large.
WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
_LOCKED = ("database is locked", "database is busy", "database table is locked")


def is_lock_message(exc: BaseException) -> bool:
    """Whether an error's text says another connection holds the lock."""
    text_ = str(exc).lower()
    return any(marker in text_ for marker in _LOCKED)


def _quote(name: str) -> str:
    """A double-quoted SQLite identifier."""
    return '"' + name.replace('"', '""') + '"'


def enable_wal(conn: sqlite3.Connection, *, db_label: str = "state.db") -> str:
    """Our connections' journal mode: WAL, or the rollback journal where the filesystem
    refuses WAL (NFS/SMB...). Returns "wal" or "delete".

    A file already in WAL is left alone (no mode switch on every open); a WAL-incapable
    filesystem falls back to DELETE with one warning per label, unless the file on disk
    is in WAL already (other processes rely on it: the error is raised instead). Other
    errors propagate. On macOS, checkpoints get a full fsync barrier and commits
    synchronous=FULL. (Hermes' own rules, which also weigh the SQLite version, are
    :func:`hermes_store.journal.apply_wal_with_fallback`.)
    """
    def mode_now() -> str | None:
        try:
            row = conn.execute("PRAGMA journal_mode").fetchone()  # reads the mode, changes nothing
        except driver_error_types():
            return None
        return str(row[0]).lower() if row else None

    if mode_now() == "wal":
        mode = "wal"
    else:
        try:
            mode = str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
            if mode != "wal":
                raise sqlite3.OperationalError(f"locking protocol (journal_mode stayed {mode})")
        except driver_error_types() as exc:  # an OperationalError, with sqlite3 or SQLCipher
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
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
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
#: Another connection holds the lock: SQLITE_BUSY / SQLITE_LOCKED, or their texts.
#: Translated only where asked (``translate_error(..., locks=True)``: statements outside
#: a transaction, VACUUM, PRAGMAs, checkpoints); elsewhere the retry loops see the
#: driver's own error, as callers and tests of the engine expect.
_LOCK_CODES = frozenset({_SQLITE_BUSY, _SQLITE_LOCKED})


_NO_SUCH_TABLE = re.compile(r"no such table: (?:main\.)?(\w+)")


def dbapi(conn: Connection) -> Any:
    """The DB-API connection under ``conn``, for the raw paths of this module.

    With pysqlite it is the ``sqlite3.Connection`` itself. With aiosqlite it is
    SQLAlchemy's adapter, whose ``execute``/``cursor`` run the driver's coroutines on
    the caller's greenlet; the aiosqlite object (``driver_connection``) only has
    coroutines, so raw calls never go to it.
    """
    return conn.connection.dbapi_connection


def driver_in_transaction(conn: Connection, default: bool = False) -> bool:
    """Whether SQLite itself has a transaction open on ``conn`` (both drivers report it)."""
    return bool(getattr(conn.connection.driver_connection, "in_transaction", default))


def _emit_begin(conn: Connection) -> None:
    """``begin`` hook: start a real SQLite transaction unless the driver already has one.

    A write (``BEGIN IMMEDIATE``) on an engine of ours first takes its file's turn in
    this process (:mod:`hermes_store.write_queue`), so writers of one process wait on
    each other, in order, instead of on SQLite's busy handler; the turn ends with the
    transaction. Sent straight to the DB-API connection: this runs for every
    transaction, and a round trip through SQLAlchemy's execution machinery would double
    its cost. That also bypasses ``handle_error`` (SQLAlchemy runs this hook outside
    its own error handling), so failures are translated here.
    """
    if driver_in_transaction(conn):
        return
    options = conn.get_execution_options()
    mode = options.get(BEGIN_MODE, "DEFERRED")
    raw = dbapi(conn)
    binding = write_queue.binding_of(conn.dialect) if mode != "DEFERRED" else None
    if binding is not None:
        _take_turn(conn, binding, raw, options.get(write_queue.WAIT_OPTION))
    try:
        raw.execute(f"BEGIN {mode}")
    except BaseException as exc:
        if binding is not None:
            binding.queue.release(raw)  # no transaction began: the turn goes on
        # BEGIN IMMEDIATE behind another process's writer: DatabaseLockedError, which the
        # retry loops accept as a lock and a host's UnitOfWork sees typed.
        typed = DIALECT.translate_error(exc, locks=True) if isinstance(exc, driver_error_types()) else None
        if typed is None:
            raise
        raise typed from exc


def _take_turn(conn: Connection, binding: write_queue.Binding, raw: Any, wait: float | None) -> None:
    """Wait for this file's write turn in this process (on an async engine, as a task of
    its loop); past ``wait`` seconds (default: the engine's) DatabaseLockedError."""
    seconds = binding.default_wait_s if wait is None else float(wait)
    queue = binding.queue
    if conn.dialect.is_async:
        took = queue.take_now(raw) or await_only(queue.take_async(raw, seconds))
    else:
        took = queue.take(raw, seconds)
    if not took:
        raise errors.DatabaseLockedError(
            f"{queue.key}: other writers of this process held it for {seconds:.3g}s; giving up")


def _append_on(raw: Any, calls: int, session_id: str, insert: str, values: tuple[Any, ...]) -> tuple[int | None, Any]:
    """One append on a DB-API connection: ``(new id, None)``, or ``(None, the session's
    end_reason row or None)`` when the guarded counter UPDATE matched nothing (unknown
    or closed session: nothing written)."""
    if not raw.execute(_BUMP_ONE, (calls, session_id)).rowcount:
        return None, raw.execute("SELECT end_reason FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return raw.execute(insert, values).lastrowid, None


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


#: The file's FTS5 tables (``SQLiteDialect.fts5``).
_STORAGE = Fts5Storage()
#: Batches at least this large go through a staging table (see SQLiteDialect._insert_staged).
BULK_STAGE_MIN = 64
STAGE = "hermes_store_bulk_stage"
#: Counter update of one append: it is also the existence check and the closed-target
#: guard (a session ended by compression takes no new rows).
_BUMP_ONE = (
    "UPDATE sessions SET message_count = COALESCE(message_count, 0) + 1, "
    f"tool_call_count = COALESCE(tool_call_count, 0) + ? WHERE id = ? AND end_reason IS NOT '{CLOSED_BY_COMPRESSION}'"
)
#: Counter update of one session of a bulk append (guarded by the caller).
_BUMP_N = (
    "UPDATE sessions SET message_count = COALESCE(message_count, 0) + ?, "
    "tool_call_count = COALESCE(tool_call_count, 0) + ? WHERE id = ?"
)
#: INSERTs for the DB-API cursor by (table, schema, column names); the column sets are
#: bounded (only known columns get this far).
_INSERTS: dict[tuple[str, str | None, tuple[str, ...]], str] = {}


def _insert_sql(table_name: str, schema: str | None, names: tuple[str, ...]) -> str:
    """``INSERT INTO [schema.]table (names...) VALUES (?, ...)``: values in ``names`` order."""
    key = (table_name, schema, names)
    sql = _INSERTS.get(key)
    if sql is None:
        target = _quote(table_name) if schema is None else f"{schema}.{_quote(table_name)}"
        sql = _INSERTS[key] = (
            f"INSERT INTO {target} ({', '.join(_quote(n) for n in names)}) VALUES ({', '.join('?' * len(names))})"
        )
    return sql


def _typed(exc: BaseException, *, locks: bool = False) -> errors.HermesStoreError | None:
    """What the engine's error hook would make of an error of a raw DB-API call
    (``locks``: a held lock too, as DatabaseLockedError)."""
    return translate_python_error(exc) or DIALECT.translate_error(exc, locks=locks)


@contextmanager
def driver_errors(*, locks: bool = False) -> Iterator[None]:
    """Typed errors for statements sent straight to the DB-API connection (they bypass
    SQLAlchemy's ``handle_error`` hook). ``locks=True`` where no retry loop sits between
    the statement and its caller (outside a transaction): a held lock becomes
    DatabaseLockedError, which the retry loops accept as a lock."""
    caught: tuple[type[BaseException], ...] = (*driver_error_types(), UnicodeEncodeError, OverflowError)
    try:
        yield
    except errors.HermesStoreError:
        raise
    except caught as exc:
        typed = _typed(exc, locks=locks)
        if typed is None:
            raise
        raise typed from exc
    except DBAPIError as exc:  # engine.connect(): the connect hook's PRAGMAs, wrapped by SQLAlchemy
        typed = _typed(exc.orig, locks=locks) if exc.orig is not None else None
        if typed is None:
            raise
        raise typed from exc


def create_private_file(path: Path) -> None:
    """Create ``path`` readable by its owner only (0600), with its missing folders (0700),
    unless it exists. SQLite would create it with the process umask (0644 typically) at
    the first connection, and its -wal/-shm files copy the database file's mode; every
    entry point (create_engine, UnitOfWork, migrations, alembic, SessionDB) opens files
    through an engine of ours, so this is where the mode is decided once."""
    if path.exists():
        return
    try:
        missing = [p for p in reversed(path.parents) if not p.exists()]
        for folder in missing:  # one by one: mkdir(parents=True) gives the umask's mode above the last
            folder.mkdir(mode=0o700, exist_ok=True)
        for blocked in path.parents:
            if blocked.exists() and not blocked.is_dir():
                raise NotADirectoryError(f"{blocked} is a file")
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        if path.exists():
            return  # another connection or process created it first
        raise errors.InvalidInputError(f"cannot create {path}: a part of its folder path is a file") from None
    except NotADirectoryError:
        raise errors.InvalidInputError(f"cannot create {path}: a part of its folder path is a file") from None
    except PermissionError as exc:
        raise errors.ReadOnlyDatabaseError(f"cannot create {path}: {exc.strerror}") from exc
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot create {path}: {exc.strerror}") from exc


def _keyed_connect(key: encryption.StoreKey) -> Callable[..., Any]:
    """``do_connect`` hook of an encrypted file's engine: SQLCipher's connection, ``PRAGMA
    key`` its first statement and the file read once (a wrong or missing key refused
    with EncryptionKeyError before any PRAGMA or write of ours); returned to SQLAlchemy
    as the DB-API connection. The async engine's twin is in :mod:`hermes_store.aio.engine`."""
    def connect(dialect: Any, _rec: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        database = cargs[0] if cargs else cparams.pop("database")
        return encryption.connect(database, key, *cargs[1:], **cparams)

    return connect


def driver_error_types() -> tuple[type[BaseException], ...]:
    """The DB-API error classes of the drivers in use: sqlite3's, and SQLCipher's once loaded
    (its errors do not derive from sqlite3's)."""
    return (sqlite3.Error, *encryption.driver_errors())


def _private_file_first(dialect: Any, _rec: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    """``do_connect`` hook: a plain file database (not ``:memory:``, not a ``file:`` URI
    such as our read-only one) is created 0600 before SQLite opens it."""
    database = cargs[0] if cargs else cparams.get("database")
    if not isinstance(database, str) or not database or database == ":memory:" or cparams.get("uri") \
            or database.startswith("file:"):
        return
    create_private_file(Path(database).expanduser())


def _outside_transaction(engine: Engine, sql: str, params: Sequence[Any] = ()) -> None:
    """Run a statement that must not sit inside BEGIN (VACUUM, checkpoints).

    Its errors come out typed, a held lock included (DatabaseLockedError): no retry
    loop of a write transaction is around it, so the caller's (``Steps.outside``) sees it.
    """
    with driver_errors(locks=True), engine.connect() as conn:
        # The DB-API connection is in autocommit (our engine issues BEGIN itself).
        dbapi(conn).execute(sql, tuple(params)).fetchall()


#: What a best-effort checkpoint skips: a held lock (typed), and what it skipped before
#: errors were typed there (any OperationalError: I/O, a full disk, a read-only file).
#: Every b-tree of a file by the bytes of its pages (``dbstat``: compiled into most builds).
_FILE_SIZES = (
    "SELECT s.name, COALESCE(m.type, 'table'), COALESCE(m.tbl_name, s.name), SUM(s.pgsize)"
    " FROM dbstat s LEFT JOIN sqlite_master m ON m.name = s.name"
    " GROUP BY s.name ORDER BY SUM(s.pgsize) DESC, s.name"
)
#: An FTS5 index's segments: (segment id, pages, bytes of those pages' blocks).
_FTS_SEGMENTS = (
    "SELECT (id >> 37) & 65535, count(*), sum(length(block)) FROM {data}"
    " WHERE id >= 137438953472 GROUP BY 1 ORDER BY 1"
)
_SKIPPED_CHECKPOINT = (sqlite3.OperationalError, errors.DatabaseLockedError, errors.DatabaseUnavailableError)


class SQLiteDialect:
    """The :class:`hermes_store.dialects.Dialect` of SQLite files."""

    name = "sqlite"
    sync_driver = "pysqlite"
    async_drivers = ("aiosqlite",)
    has_schemas = False
    is_file = True
    replays_hermes_history = True
    keys_may_be_null = True
    #: Hermes' FTS5 tables live in the file (see :mod:`hermes_store.dialects.fts5`).
    fts5: Fts5Storage | None = _STORAGE
    fts5_storage: Fts5Storage = _STORAGE
    #: Triggers and chunked backfills fill the FTS5 tables: a window or a stale flag can leave rows out.
    search_index_can_lag = True
    driver_param_mark = "?"
    holders_on_this_machine = True
    one_writer_at_a_time = True

    def database_path(self, url: URL) -> str | None:
        """An encrypted file (a key in the URL's password part) is None too: nothing may
        read, copy, adopt or back it up behind a keyed connection's back, and nothing
        plain can read it anyway (see :mod:`hermes_store.encryption`)."""
        database = url.database
        return database if database and database != ":memory:" and not url.password else None
    # Search routes: LIKE folds ASCII letters only; CJK queries use the trigram FTS5
    # index; NOT INDEXED keeps a block read on the rowid range.
    caseless_like = "LIKE"
    caseless_like_folds_non_ascii = False
    cjk_by_substring = False
    rowid_walk_hint = " NOT INDEXED"

    def insert(self, table: Any) -> Any:
        return sqlite_insert(table)

    def isolate_failure(self, conn: Connection) -> AbstractContextManager[Any]:
        return nullcontext()  # a failed statement leaves a SQLite transaction usable

    def join_driver_transaction(self, conn: Connection) -> None:
        """pysqlite (in its default mode) sends BEGIN only before INSERT/UPDATE/DELETE; a
        host that began a transaction and ran only DDL or SELECTs so far is still in
        autocommit underneath, and our CREATE TABLEs would commit on their own."""
        if not driver_in_transaction(conn, default=True):
            dbapi(conn).execute("BEGIN")

    def install_batch_hooks(self, conn: Connection) -> bool:
        return True  # ALTER TABLE is limited: revisions rebuild tables in batch mode

    def translate_error(self, exc: BaseException, *, locks: bool = False) -> errors.HermesStoreError | None:
        """sqlite3 errors → typed errors (by result code, else by message). ``locks``:
        SQLITE_BUSY / SQLITE_LOCKED too, as DatabaseLockedError (see :data:`_LOCK_CODES`)."""
        if isinstance(exc, sqlite3.ProgrammingError) and "binding parameter" in str(exc).lower():
            return errors.InvalidInputError(str(exc))
        if not isinstance(exc, driver_error_types()):
            return None
        missing = _NO_SUCH_TABLE.match(str(exc))
        if missing and missing.group(1) in OUR_TABLES:
            return errors.NotMigratedError(
                f"the database has no {missing.group(1)} table: it is not migrated yet; run "
                "hermes_store.migrations.upgrade(<path, URL or Engine>) or `hermes-store upgrade` first"
            )
        code = getattr(exc, "sqlite_errorcode", None)
        if locks and ((isinstance(code, int) and (code & 0xFF) in _LOCK_CODES) or is_lock_message(exc)):
            return errors.DatabaseLockedError(str(exc))
        kind = _BY_CODE.get(code & 0xFF) if isinstance(code, int) else None
        if kind is None:
            text_ = str(exc).lower()
            kind = next((k for needle, k in _BY_MESSAGE if needle in text_), None)
        return None if kind is None else kind(str(exc))

    def engine_kwargs(self, url: URL, kwargs: dict[str, Any], *, prepared_statements: bool) -> dict[str, Any]:
        options = dict(kwargs)  # pysqlite's defaults; our setup is per connection (configure_engine)
        if url.password and not url.get_dialect().is_async:
            # An encrypted file: SQLCipher's DB-API module (the same dialect, our hooks);
            # configure_engine applies the key on every connection before anything else.
            options.setdefault("module", encryption.dbapi_module())
        return options

    def configure_engine(self, engine: Engine, *, foreign_keys: bool, busy_timeout_ms: int) -> None:
        """PRAGMAs on every new connection, our own BEGIN (see :func:`install_begin_hook`),
        and a file that does not exist yet created private (see :func:`create_private_file`)."""
        event.listen(engine, "do_connect", _private_file_first)
        if engine.url.password and not engine.dialect.is_async:  # the async twin: hermes_store.aio.engine
            event.listen(engine, "do_connect", _keyed_connect(encryption.StoreKey(engine.url.password)))

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
        path = engine.url.database if engine.url.database != ":memory:" else None
        if path and not path.startswith("file:"):
            # Writers of this file in this process take turns (see write_queue); the
            # default wait for a turn is the busy timeout a writer would have waited.
            write_queue.install(engine.dialect, path, default_wait_s=busy_timeout_ms / 1000)

    # -------------------------------------------------------------- locking and retries

    def begin_options(self, write: bool) -> dict[str, Any]:
        # Writers take the write lock at BEGIN, so a transaction never fails half-way
        # through on a lock upgrade.
        return {BEGIN_MODE: "IMMEDIATE" if write else "DEFERRED"}

    # Upkeep (checkpoint, index catch-up) runs on the store's upkeep thread, never on the
    # caller's write: its write waits in the file's writer queue like any other writer.
    upkeep_in_background = True

    def try_upkeep_lock(self, conn: Connection, purpose: str) -> bool:
        return True  # the write transaction's file lock already makes it the only one

    def writers_in_progress(self, conn: Connection, table: str) -> list[str] | None:
        return None  # no other writer runs beside a write transaction

    def still_running(self, conn: Connection, writers: Sequence[str]) -> bool:
        return False

    def one_statement_write(self, conn: Connection) -> bool:
        return False  # BEGIN costs nothing here

    def never_ran(self, exc: BaseException) -> bool:
        return False  # no one-statement writes here

    def call_options(self, write: bool) -> dict[str, Any]:
        return self.begin_options(write)  # BEGIN IMMEDIATE / one WAL snapshot per read call

    def is_retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, errors.DatabaseLockedError):
            return True  # a lock translated outside a transaction (see driver_errors)
        if not isinstance(exc, (OperationalError, *driver_error_types())):
            return False
        return is_lock_message(exc)

    def begin_write(self, conn: Connection, seconds: float) -> None:
        return None  # BEGIN IMMEDIATE already holds the write lock; waits end at busy_timeout

    def on_connect(self, dbapi_conn: Any, *, label: str) -> str:
        mode = enable_wal(dbapi_conn, db_label=label)
        if mode == "wal":
            dbapi_conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        # NORMAL is durable across application crashes in WAL mode and saves an fsync
        # per commit (not on macOS, where enable_wal asked for FULL).
        if sys.platform != "darwin":
            dbapi_conn.execute("PRAGMA synchronous=NORMAL")
        return mode

    # -------------------------------------------------------------- upserts


    # -------------------------------------------------------------- message writes
    #
    # The hot path of every agent turn: plain statements on the DB-API connection,
    # inside the caller's transaction (SQLAlchemy's execution machinery would cost
    # more than the statements themselves).

    def append_message(self, conn: Connection, row: Mapping[str, Any], calls: int) -> int:
        """Two statements: the guarded counter UPDATE, then the INSERT. The session is
        looked up only when the UPDATE matched nothing, and then nothing is written."""
        raw = dbapi(conn)
        session_id = row["session_id"]
        insert = _insert_sql("messages", None, tuple(row))
        # An adapter whose driver runs on a thread of its own (aiosqlite, see
        # hermes_store.aio.engine) takes both statements there in one hop.
        on_driver = getattr(raw, "run_on_driver", None)
        try:
            if on_driver is not None:
                new_id, refused = on_driver(_append_on, calls, session_id, insert, tuple(row.values()))
            else:
                new_id, refused = _append_on(raw, calls, session_id, insert, tuple(row.values()))
        except self._append_errors() as exc:
            typed = _typed(exc)
            if typed is None:
                raise
            raise typed from exc
        if new_id is None:
            raise refused_append(session_id, refused)
        return int(new_id)

    @staticmethod
    def _append_errors() -> tuple[type[BaseException], ...]:
        return (*driver_error_types(), OverflowError)

    def add_bigram_pairs(self, conn: Connection, table: str, pairs: Sequence[tuple[str, int]]) -> None:
        # The driver's own executemany with plain tuples (sqlite3 and aiosqlite alike).
        conn.exec_driver_sql(f"INSERT INTO {table} (gram, block) VALUES (?, ?) ON CONFLICT DO NOTHING", list(pairs))

    def bump_message_counts(self, conn: Connection, counts: Iterable[tuple[str, int, int]]) -> None:
        with driver_errors():
            cursor = dbapi(conn).cursor()
            try:
                cursor.executemany(_BUMP_N, [(n, calls, sid) for sid, n, calls in counts])
            finally:
                cursor.close()

    def insert_messages(self, conn: Connection, runs: MessageRuns,
                        column_defaults: Callable[[], Mapping[str, str | None]]) -> None:
        """One executemany per run; batches of ``BULK_STAGE_MIN`` rows or more go through
        a staging table (see :meth:`_insert_staged`)."""
        if not runs:
            return
        with driver_errors():
            cursor = dbapi(conn).cursor()
            try:
                if sum(len(values) for _names, values in runs) >= BULK_STAGE_MIN:
                    self._insert_staged(cursor, runs, column_defaults)
                else:
                    for names, values in runs:
                        cursor.executemany(_insert_sql("messages", None, names), values)
            finally:
                cursor.close()

    @staticmethod
    def _insert_staged(cursor: Any, runs: MessageRuns,
                       column_defaults: Callable[[], Mapping[str, str | None]]) -> None:
        """Stage rows in a TEMP table, then move them with one INSERT … SELECT.

        FTS5 keeps its pending index changes across the rows of one statement but
        flushes them between statements, so one statement for the batch indexes 2–3×
        faster than executemany. Columns a row leaves out get the column's default.
        """
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {STAGE} AS SELECT * FROM main.messages WHERE 0")
        cursor.execute(f"PRAGMA temp.table_info({STAGE})")
        staged = {r[1] for r in cursor.fetchall()}
        columns: list[str] = []
        for names, _rows in runs:
            columns += [n for n in names if n not in columns]
        if not set(columns) <= staged:  # the schema grew since this connection staged
            cursor.execute(f"DROP TABLE temp.{STAGE}")
            cursor.execute(f"CREATE TEMP TABLE {STAGE} AS SELECT * FROM main.messages WHERE 0")
        for names, rows in runs:
            cursor.executemany(_insert_sql(STAGE, "temp", names), rows)
        defaults = column_defaults()
        exprs = [f"COALESCE({c}, {defaults[c]})" if defaults.get(c) is not None else c for c in columns]
        cursor.execute(
            f"INSERT INTO main.messages ({', '.join(columns)}) SELECT {', '.join(exprs)} "
            f"FROM temp.{STAGE} ORDER BY rowid"
        )
        cursor.execute(f"DELETE FROM temp.{STAGE}")

    # -------------------------------------------------------------- search routes

    def word_match(self, conn: Connection, match: str) -> tuple[Any, Any]:
        return match, None  # FTS5 reads the MATCH string itself and cuts the snippets

    def cjk_sessions(self, conn: Connection, params: dict[str, Any], object_sql: Callable[[str], str],
                     candidates: Sequence[tuple[str, Any]] | None = None) -> str:
        """Read from the trigram index's source view the file really has (the sessions
        it leaves out depend on the file's revision: none, cron, cron and sub-agents)."""
        indexed = trigram_sessions(object_sql(TRIGRAM_SOURCE_VIEW))
        return f" AND {indexed}" if indexed else ""

    def latin_in_cjk(self, conn: Connection, query: runs.Query, words: Any, params: dict[str, Any],
                     object_sql: Callable[[str], str]) -> runs.RunsSQL | None:
        """Word-query terms inside CJK runs (:mod:`hermes_store.search.latin_in_cjk`): the
        trigram index finds the rows holding a term, GLOB tells a run, the word index
        answers the word tests and leaves out its own hits (``:q``). None without a
        trigram index (the word index alone answers, as before)."""
        if not object_sql(TRIGRAM_INDEX):
            return None
        names: dict[Any, str] = {}

        def in_run(term: runs.Term) -> str:
            if term not in names:
                names[term] = f"rx{len(names)}"
            n = names[term]
            patterns = runs.glob_patterns(term)
            params.update({f"{n}_{i}": pattern for i, pattern in enumerate(patterns)})
            # A CJK neighbour is a character outside ASCII: text without one (most text
            # holding a common term) is passed over before the GLOBs walk it.
            return " OR ".join(
                f"(length(CAST({col} AS BLOB)) > length({col}) AND ("
                + " OR ".join(f"{col} GLOB :{n}_{i}" for i in range(len(patterns))) + "))"
                for col in ("m.content", "m.tool_name")
            ).join("()")

        def has_words(match: str) -> str:
            if match not in names:
                names[match] = f"rw{len(names)}"
                params[names[match]] = match
            return f"m.id IN (SELECT rowid FROM {WORD_INDEX} WHERE {WORD_INDEX} MATCH :{names[match]})"

        params["rx_q"] = " OR ".join(f'"{t.text}"' for t in query.terms)
        return runs.RunsSQL(
            source=(f"{TRIGRAM_INDEX} CROSS JOIN {{messages}} m ON m.id = {TRIGRAM_INDEX}.rowid"
                    " CROSS JOIN {sessions} s ON s.id = m.session_id"),
            where=(f"{TRIGRAM_INDEX} MATCH :rx_q AND m.role <> 'tool' AND {runs.any_in_run(query, in_run)}"
                   f" AND {runs.condition(query, in_run, has_words)}"
                   f" AND m.id NOT IN (SELECT rowid FROM {WORD_INDEX} WHERE {WORD_INDEX} MATCH :q)"),
            sessions=self.cjk_sessions(conn, params, object_sql),
        )

    @property
    def search(self) -> search_fts5.Fts5SearchRoutes:
        """The search statements of this dialect, per route (:mod:`.search_fts5`)."""
        return search_fts5.ROUTES

    def delegated_sessions(self, conn: Connection, candidates: Sequence[tuple[str, Any]] | None = None) -> list[str]:
        """Never asked: ``json_extract`` decides sub-agent sessions in SQL (:meth:`cjk_sessions`)."""
        return []

    def has_table(self, conn: Connection, name: str) -> bool:
        return conn.execute(
            text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :n"), {"n": name}
        ).first() is not None

    # -------------------------------------------------------------- full-text search

    def fts_indexes(self, conn: Connection) -> list[str]:
        return existing_indexes(conn)

    def fts_search_available(self, conn: Connection) -> bool:
        """Full-text search can be served: FTS5 is compiled in and the word index answers."""
        return _STORAGE.queryable(conn, WORD_FTS)

    def fts_trigram_available(self, conn: Connection) -> bool:
        """The trigram (substring/CJK) index answers (SQLite 3.34+ has the tokenizer)."""
        return _STORAGE.queryable(conn, TRIGRAM_FTS)

    def fts_command(self, conn: Connection, index: str, cmd: str) -> None:
        fts5_command(conn, index, cmd)

    def match_sql(self, index: str) -> str:
        return fts5_statements.match_sql(index)

    def top_sql(self, index: str) -> str:
        return fts5_statements.top_sql(index)

    # -------------------------------------------------------------- maintenance

    def vacuum(self, engine: Engine) -> None:
        _outside_transaction(engine, "VACUUM")

    def checkpoint(self, engine: Engine) -> None:
        """A PASSIVE checkpoint, skipped when busy (retried at the next interval): a
        held lock, or a connection that could not be opened, is never the caller's error."""
        with suppress(*_SKIPPED_CHECKPOINT):
            _outside_transaction(engine, "PRAGMA wal_checkpoint(PASSIVE)")

    def checkpoint_truncate(self, engine: Engine) -> None:
        """Fold the whole WAL into the file and truncate it to 0 bytes (before VACUUM).

        Best effort, as Hermes' ``vacuum()``: a checkpoint blocked by a reader or a
        writer (SQLite then reports it busy in its result row, or DatabaseLockedError)
        is skipped and left for the next one.
        """
        with suppress(*_SKIPPED_CHECKPOINT):
            _outside_transaction(engine, "PRAGMA wal_checkpoint(TRUNCATE)")

    def logical_size_bytes(self, conn: Connection, schema: str | None, tables: Sequence[str]) -> int | None:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
        size = conn.exec_driver_sql("PRAGMA page_size").scalar()
        return None if pages is None or size is None else int(pages) * int(size)

    def text_bytes(self, expr: Any) -> Any:
        """``length(CAST(expr AS BLOB))``: a BLOB's length is its bytes (a TEXT's, characters)."""
        return func.length(expr.cast(LargeBinary))

    def integrity_check(self, conn: Connection, *, quick: bool, max_lines: int) -> list[str]:
        pragma = "quick_check" if quick else "integrity_check"
        return [str(r[0]) for r in conn.exec_driver_sql(f"PRAGMA {pragma}({int(max_lines)})").fetchall()]

    def object_sizes(self, conn: Connection, schema: str | None,
                     tables: Sequence[str]) -> list[tuple[str, str, str, int]] | None:
        """Every b-tree of the file by the bytes of its pages (``dbstat``, compiled into
        most builds; None without it)."""
        try:
            return [tuple(r) for r in conn.exec_driver_sql(_FILE_SIZES).fetchall()]
        except OperationalError as exc:
            if "dbstat" in str(exc):
                return None
            raise

    def space_details(self, conn: Connection, schema: str | None, tables: Sequence[str]) -> dict[str, Any]:
        """Pages (size, count, on the freelist), the unused bytes of partly filled pages
        (``slack_bytes``, where ``dbstat`` is compiled in) and each FTS5 index's segments,
        read from its ``_data`` table's row ids (FTS5 numbers a segment's pages
        ``segid << 37 | …``; a tombstone page's segid is its segment's + 2**16)."""
        def pragma(name: str) -> int:
            return int(conn.exec_driver_sql(f"PRAGMA {name}").scalar() or 0)

        segments: dict[str, list[tuple[int, int, int]]] = {}
        for index in existing_indexes(conn):
            rows = conn.exec_driver_sql(_FTS_SEGMENTS.format(data=f'"{index}_data"')).fetchall()
            segments[index] = [(int(s), int(n), int(b or 0)) for s, n, b in rows]
        details: dict[str, Any] = {"page_size": pragma("page_size"), "page_count": pragma("page_count"),
                                   "freelist_pages": pragma("freelist_count"), "fts_segments": segments}
        for sql in ("SELECT sum(unused) FROM dbstat WHERE aggregate = 1", "SELECT sum(unused) FROM dbstat"):
            try:  # the unused bytes of partly filled pages; ``aggregate`` since SQLite 3.31
                details["slack_bytes"] = int(conn.exec_driver_sql(sql).scalar() or 0)
                break
            except OperationalError:
                continue
        return details

    def export_reader(self, conn: Connection) -> Callable[[str, str, str], list[dict[str, Any]]] | None:
        """Straight from sqlite3's (or SQLAlchemy's aiosqlite adapter's) connection: per
        session, SQLAlchemy's result setup would cost more than the query itself."""
        raw = conn.connection.dbapi_connection
        if raw is None:  # a connection already given back to the pool: the repositories' reads
            return None

        def read(table: str, session_id: str, order_by: str) -> list[dict[str, Any]]:
            cursor = raw.execute(f"SELECT * FROM {table} WHERE session_id = ? ORDER BY {order_by}", (session_id,))
            keys = [d[0] for d in cursor.description]
            return [dict(zip(keys, r, strict=True)) for r in cursor.fetchall()]

        return read

    def defer_foreign_keys(self, conn: Connection) -> None:
        conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")

    def ping(self, conn: Connection) -> None:
        conn.exec_driver_sql("SELECT 1")

    def interrupter(self, conn: Connection) -> Callable[[], bool]:
        """``sqlite3_interrupt``, safe from any thread. aiosqlite runs the statement on the
        connection's own thread, so a cancelled task would otherwise wait it out (keeping
        the write lock) before its rollback could run."""
        driver = conn.connection.driver_connection
        # aiosqlite keeps sqlite3's connection as ``_conn``; pysqlite's is the driver itself.
        raw: Any = driver if isinstance(driver, (sqlite3.Connection, *encryption.connection_types())) \
            else getattr(driver, "_conn", None)

        def interrupt() -> bool:
            with suppress(*driver_error_types(), AttributeError):  # already closed: nothing runs
                if raw is not None:
                    raw.interrupt()
            return True

        return interrupt

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
        sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"),
                           {"t": table}).scalar() or ""
        return "AUTOINCREMENT" in sql.upper()

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
            count = run(f'SELECT count(*) FROM "{name}"').fetchall()[0][0]  # count(*): always one row
            plain.append((name, int(count)))
        return plain, virtual


DIALECT = SQLiteDialect()
