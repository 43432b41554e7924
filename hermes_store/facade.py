"""``SessionDB``: Hermes' public session-store API, built on the repositories.

Code written against Hermes' own class runs unchanged: same method names, arguments,
defaults and dict shapes. Underneath, every write is one transaction (``BEGIN
IMMEDIATE`` on a SQLite file; plain READ COMMITTED with counters updated in SQL on a
PostgreSQL server) retried with random jitter while other processes hold the lock, or
after a serialization failure or deadlock (40001/40P01) on the server. On a server a
write waits in the lock queue instead, but never past its budget (``lock_timeout``),
and a kept connection the server dropped (restart, idle timeout) is replaced before
the call fails. Past the budget the caller gets :class:`~hermes_store.errors.DatabaseLockedError`.
"""

from __future__ import annotations

import asyncio  # noqa: F401 - a hermes_state module global Hermes code reaches for
import logging
import math
import os
import random  # noqa: F401 - tests patch facade.random.uniform; the jitter (hermes_store.retry) draws from it
import sqlite3
import sys  # noqa: F401 - Hermes' tests patch hermes_state.sys.platform
import threading
import time
import weakref
from pathlib import Path
from contextlib import contextmanager
from typing import Optional, Any, Callable, Iterator, Literal, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError

from . import encryption, errors, migrations, paths, retry, write_queue
from .adopt import finish_interrupted
from .dialects import backend_name, find_for, for_connection
from .dialects.base import LOCK_BUDGET_OPTION
from .dialects.sqlite import _wal_warned
from .engine import create_engine, default_db_path, keyed_url, schema_in_url, to_url, with_schema
from .paths import create_private_database  # noqa: F401 - kept importable from here (CLI)
from .repositories import MaintenanceRepository
from .repositories.base import clock_options
from .repositories.transcripts import remove_committed_files
from .operations.search_index import BACKGROUND_CATCH_UP_ROWS as _BACKGROUND_CATCH_UP_ROWS, CATCH_UP_ROWS
from .operations.steps import with_lock_budget
from .sessiondb.activity import ACTIVITY_BUDGET_S
from .sessiondb.private import RAW_BUSY_TIMEOUT_S
from .targets import refuse_async
from .upkeep import Upkeep
from .repair import (  # noqa: F401 - Hermes' module-level names, served by the swap
    _MAX_MALFORMED_BACKUPS,
    _MAX_PERSISTENT_REPAIR_ATTEMPTS,
    _REPAIR_LOCK_TIMEOUT_SECONDS,
    _backup_db_file,
    _claim_repair_attempt,
    _db_opens_cleanly,
    _existing_malformed_backups,
    _repair_attempted as _repair_attempted_paths,
    repair_state_db_schema,
)
from .hermes_names import (  # noqa: F401 - Hermes' module-level names, served by the swap
    DDL_NAMES,
    _apply_macos_checkpoint_barrier,
    _cjk_fts_config_enabled,
    _collect_delegate_child_ids,
    _cwd_prefix_clause,
    _delegate_from_json,
    _delete_delegate_children,
    _enforce_macos_synchronous_full,
    _ephemeral_child_sql,
    _scrub_surrogates,
    ddl_strings,
    open_raw_connection,
    fts5_cjk_so_path,
    is_malformed_db_error,
    load_fts5_cjk_extension,
    workspace_key,
)
from .review_turns import (  # noqa: F401 - Hermes' module-level names, served by the swap
    _is_background_review_harness_message,
    _strip_background_review_harness,
)
from .state_modules.common import *  # noqa: F403 - Hermes' module-level names, served by the swap
from .state_modules.portability import SessionPortabilityMixin
from .state_modules.schema import SessionSchemaMixin, schema_read_probe_statements  # noqa: F401
from .state_modules.search import SessionSearchMixin
from .state_modules.provider import SQLiteProviderMixin, SessionDBProvider
from .isolation import (  # noqa: F401 - Hermes v25/v26's live-system guard; tests set these here
    _STATE_DB_GUARD_BYPASS,
    _STATE_DB_GUARD_BYPASS_ENV,
    _STATE_DB_GUARD_EXTRA_DENY_ROOTS,
    _ensure_test_isolation,
    _in_test_context,
    _process_looks_like_pytest,
    _real_platform_state_root,
    _running_under_pytest,
)
from .journal import *  # noqa: F403 - Hermes' module-level names, served by the swap
from .journal import apply_database_pragmas
from .journal import (  # noqa: F401 - private Hermes names
    _WAL_INCOMPAT_MARKERS,
    _WAL_SIZE_LIMIT_BYTES,
    _on_disk_journal_mode,
    _wal_reset_repair_hint,
    checkpoint_passive,
)
from .state_files import *  # noqa: F403 - Hermes' module-level names, served by the swap
from .state_files import (
    is_zeroed_state_db,
    preflight_db_writability,
    quarantine_zeroed_state_db,
    track_close,
    track_open,
)
from .errors import (  # noqa: F401 - Hermes v24-v26 error classes, importable from hermes_state
    MAX_SAFE_EXPORT_MESSAGES,
    MAX_SAFE_RESUME_MESSAGES,
    CompressionSessionBusyError,
    CompressionSessionClosedError,
    SessionCompressionInProgressError,
    SessionExportTooLargeError,
    SessionResumeTooLargeError,
    SessionTurnLeaseLostError,
    WalUnsupportedError,
)
from .sessiondb import HermesSurface
from .sessiondb.activity import *  # noqa: F403 - Hermes' module-level names
from .sessiondb.display import *  # noqa: F403 - Hermes' module-level names
from .sessiondb.leases import *  # noqa: F403 - Hermes' module-level names
from .sessiondb.messages import *  # noqa: F403 - Hermes' module-level names
from .sessiondb.orphans import *  # noqa: F403 - Hermes' module-level names
from .sessiondb.async_wrapper import ThreadedSessionDB as AsyncSessionDB  # noqa: F401 - Hermes' gateway wrapper
# Exported by name (``as``): aio.sessiondb reads the write budget off this module at call time.
from .sessiondb._host import TRANSCRIPT_BUDGET_S, WRITE_BUDGET_S as WRITE_BUDGET_S
#: Jitter windows: short sleeps for the first EARLY_PHASE_S seconds, then longer ones.
from .keys import EARLY_JITTER_S, EARLY_PHASE_S, LATE_JITTER_S

log = logging.getLogger(__name__)
#: Hermes' own logger name, for the messages Hermes' code and tests look for there.
hermes_log = logging.getLogger("hermes_state")
T = TypeVar("T")

#: A PASSIVE WAL checkpoint after this many successful writes (and on close).
CHECKPOINT_EVERY = 50
#: SQLite's own busy wait before our jittered retry takes over (milliseconds).
BUSY_TIMEOUT_MS = 100
#: Idle connections kept per kind (reads, writes) between calls.
MAX_IDLE_CONNECTIONS = 4
#: Rows the short-CJK index catches up on at open and at each checkpoint interval.
BIGRAM_CATCH_UP_ROWS = CATCH_UP_ROWS
#: Rows one background catch-up transaction indexes: it holds the index's upkeep lock,
#: so it stays short, and the next one starts right after it.
BACKGROUND_CATCH_UP_ROWS = _BACKGROUND_CATCH_UP_ROWS
#: Rows one catch-up transaction after writes indexes where one writer writes at a time
#: (SQLite): it holds the file's only write turn, so it stays about as short as a batch
#: of appends, and the writers queued behind it go first between two of them.
QUEUED_CATCH_UP_ROWS = 48
#: Upkeep after writes goes after this process's writers of the file: it starts once
#: their line has been idle this long (seconds), or after UPKEEP_PATIENCE_S at the latest,
#: so a burst of appends never queues behind index upkeep, and a steady stream still
#: gets it every UPKEEP_PATIENCE_S (the rows in between are found by a direct scan).
UPKEEP_IDLE_S = 0.02
UPKEEP_PATIENCE_S = 1.5

#: Hermes' default file, computed at import as Hermes does. Code may patch it;
#: while unpatched, ``SessionDB()`` reads ``$HERMES_HOME`` at call time instead.
DEFAULT_DB_PATH = default_db_path()
_IMPORT_DEFAULT_DB_PATH = DEFAULT_DB_PATH
_IMPORTED_DEFAULT_DB_PATH = _IMPORT_DEFAULT_DB_PATH  # our name for it before v26
#: Set to a URL (``postgresql+psycopg://…`` or ``sqlite:///…``) to point ``SessionDB()`` elsewhere.
URL_ENV = "HERMES_STORE_URL"
#: Labels already warned about a WAL fallback (Hermes' name for it).
_wal_fallback_warned_paths = _wal_warned
#: Hermes v26's write patience (seconds): ordinary, transcript and activity writes, and
#: how long a write waits out a compression in progress.
_WRITE_PATIENCE_S = WRITE_BUDGET_S
_TRANSCRIPT_WRITE_PATIENCE_S = TRANSCRIPT_BUDGET_S
_ACTIVITY_WRITE_PATIENCE_S = ACTIVITY_BUDGET_S
_COMPRESSION_BUSY_WAIT_S = 5.0
#: Hermes v26's read pool and repair limits.
_READ_POOL_MAX = 8
_READ_OPEN_RETRY_SECONDS = 60
#: ``psutil`` when installed, else None (read at call time: tests replace it).
try:
    import psutil
except ImportError:  # optional, as in Hermes
    psutil = None


def _wall_clock() -> float:
    """This module's ``time.time()`` looked up now: the clock the repositories of a
    SessionDB stamp rows with (Hermes' tests replace ``hermes_state.time``)."""
    return time.time()


def _monotonic() -> float:
    """This module's ``time.monotonic()`` looked up now (tests replace ``hermes_state.time``)."""
    return time.monotonic()


def _default_db_path() -> Path:
    """``DEFAULT_DB_PATH`` when code re-pointed it, else ``$HERMES_HOME/state.db`` now."""
    patched = globals()["DEFAULT_DB_PATH"]
    if patched != _IMPORT_DEFAULT_DB_PATH:
        return Path(patched).expanduser()
    return default_db_path()

_last_init_error: Optional[str] = None
_init_error_lock = threading.Lock()


def _set_last_init_error(msg: str | None) -> None:
    """Record (or clear, with None) why the last SessionDB open failed."""
    global _last_init_error
    with _init_error_lock:
        _last_init_error = msg


def get_last_init_error() -> str | None:
    """``"ExcType: message"`` of the last failed SessionDB open (not cleared on success)."""
    return _last_init_error


def format_session_db_unavailable(prefix: str = "Session database not available") -> str:
    """A sentence for users explaining why the session database could not be opened."""
    err = _last_init_error
    if not err:
        return f"{prefix}."
    if any(marker in err.lower() for marker in _WAL_INCOMPAT_MARKERS):
        return (
            f"{prefix}: {err} (the filesystem holding it, e.g. NFS/SMB, does not support the "
            "WAL locking SQLite needs)."
        )
    return f"{prefix}: {err}."


def _log_wal_fallback_once(db_label: str, exc: Exception) -> None:
    """One warning per label per process about falling back from WAL."""
    if db_label not in _wal_fallback_warned_paths:
        _wal_fallback_warned_paths.add(db_label)
        log.warning("%s: WAL mode unavailable (%s); using rollback journal instead", db_label, exc)


def __getattr__(name: str) -> Any:
    """Hermes' DDL constants (``SCHEMA_SQL``…), built from our migrations on first use."""
    if name in DDL_NAMES:
        return ddl_strings()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _database_target(db_path: Any, url: str | URL | None, engine: Engine | None) -> Path | URL:
    """The SQLite file, or the server URL, behind whichever of path / URL / Engine was given.

    Checked before anything is created: an unsupported dialect or an in-memory URL
    gets one clear error, never a folder named ``sqlite:`` or ``mysql+…:``.
    """
    given = [x for x in (db_path, url, engine) if x is not None]
    for each in given:
        refuse_async(each, "SessionDB")
    if len(given) > 1:
        raise errors.InvalidInputError("give SessionDB one of db_path, url= or engine=, not several")
    target = given[0] if given else None
    if target is None:
        target = os.environ.get(URL_ENV) or None
    if target is None:
        return _default_db_path()
    if isinstance(target, Engine):
        target = target.url
    if isinstance(target, URL) or (isinstance(target, str) and "://" in target):
        parsed = to_url(target)
        refuse_async(parsed, "SessionDB")
        dialect = find_for(parsed)
        if dialect is None:
            raise errors.UnsupportedDatabaseError(
                f"{backend_name(parsed)} databases are not supported by SessionDB; "
                "use a SQLite file (a path or a sqlite:///… URL) or a postgresql+psycopg://… URL"
            )
        if not dialect.holders_on_this_machine:  # a server: SessionDB connects by its URL
            return parsed
        if schema_in_url(parsed) is not None:
            raise errors.InvalidInputError("?schema= names a PostgreSQL tenant schema; a SQLite file has none")
        if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
            raise errors.InvalidInputError(f"SessionDB needs a database file, not {parsed.render_as_string()}")
        return Path(parsed.database).expanduser()
    return Path(target).expanduser()


def _key_in_target(db_path: Any, url: str | URL | None, engine: Engine | None) -> str | None:
    """The key a URL or an Engine given to SessionDB carries (its password part), if any."""
    given = next((x for x in (db_path, url, engine) if x is not None), None)
    if isinstance(given, Engine):
        given = given.url
    if isinstance(given, URL) or (isinstance(given, str) and "://" in given):
        parsed = to_url(given)
        found = find_for(parsed)
        if found is not None and found.holders_on_this_machine:
            return parsed.password
    return None


def _database_file(db_path: Any, url: str | URL | None, engine: Engine | None) -> Path:
    """The SQLite file behind the arguments (UnsupportedDatabaseError for a server URL)."""
    found = _database_target(db_path, url, engine)
    if isinstance(found, URL):
        raise errors.UnsupportedDatabaseError(f"{backend_name(found)} is a server, not a database file")
    return found


def _held_lock(url: URL | None, exc: BaseException) -> bool:
    """Whether an open failed only because another process holds the lock for now: our
    typed lock error, or the dialect's own retryable-lock test, on the error or its cause."""
    if isinstance(exc, errors.DatabaseLockedError):
        return True
    dialect = find_for(url) if url is not None else None
    return dialect is not None and any(err is not None and dialect.is_retryable(err) for err in (exc, exc.__cause__))


class _BatchAgain(Exception):
    """A job of a write batch failed: the batch is rolled back and written again without it."""


class _StaleConnection(Exception):
    """A kept idle connection failed before doing anything: the server dropped it."""


# The contract's methods take ``**kwargs`` (Hermes passes its whole keyword set); ours
# name each keyword, which mypy counts as a narrower override.
class SessionDB(HermesSurface, SessionSearchMixin, SessionSchemaMixin, SessionPortabilityMixin,  # type: ignore[misc]
                SQLiteProviderMixin, SessionDBProvider):
    """Hermes-compatible session store on one SQLite file or one PostgreSQL database.

    Also Hermes v30's :class:`~hermes_store.state_modules.provider.SessionDBProvider`
    (the mixin before the ABC, as Hermes' own): write hooks run around every write
    transaction (see :meth:`_write`).
    """

    #: Hermes v26's write patience as a class attribute (its tests lower it here); the
    #: module's value and our ``WRITE_BUDGET_S`` count too: the lowest of the three wins.
    _WRITE_PATIENCE_S = _WRITE_PATIENCE_S
    #: Writes between two PASSIVE checkpoints (Hermes' ``_CHECKPOINT_EVERY_N_WRITES``).
    _CHECKPOINT_EVERY_N_WRITES = CHECKPOINT_EVERY

    # Hermes v26's sanitizer (capped at MAX_FTS5_QUERY_CHARS) over the listing mixin's v23 one.
    _sanitize_fts5_query = SessionSearchMixin.__dict__["_sanitize_fts5_query"]

    def __init__(
        self,
        db_path: str | os.PathLike[str] | URL | Engine | None = None,
        read_only: bool = False,
        *,
        url: str | URL | None = None,
        engine: Engine | None = None,
        schema: Optional[str] = None,
        key: encryption.KeyLike | None = None,
    ) -> None:
        """Open (creating 0600, adopting or migrating as needed) the store at ``db_path``.

        ``db_path`` keeps Hermes' signature (a path; None means ``$HERMES_HOME/state.db``)
        and also takes what SQLAlchemy users pass: a ``sqlite:///…`` URL string, a
        ``URL`` or an ``Engine`` (or ``url=`` / ``engine=``). A URL is never taken for a
        path. Given an Engine, SessionDB opens the same file with its own engine (it
        needs its own locking setup) and never disposes yours.

        Nothing is written before the path is known to be usable: a dangling symlink,
        a folder, a path below a file or a read-only file/folder raise a typed
        :class:`~hermes_store.errors.HermesStoreError` with the file left as it was.
        A symlink to a real database is followed (see :func:`hermes_store.paths.resolve_link`).

        A ``postgresql+psycopg://…`` URL (or an Engine on one) opens that database and
        migrates it to head; ``db_path`` is then None and ``url`` says where it lives.

        With no target at all: ``$HERMES_STORE_URL`` when set, else ``DEFAULT_DB_PATH``
        of this module when code patched it, else ``$HERMES_HOME/state.db`` now.

        ``read_only=True`` (Hermes v23) opens an existing file as it is: no folder,
        migration, adoption or WAL switch; every write raises
        :class:`~hermes_store.errors.ReadOnlyDatabaseError` (also a
        ``sqlite3.OperationalError``, as Hermes' callers expect).

        A file whose schema SQLite reports malformed is repaired once per process
        (:func:`repair_state_db_schema`, after a raw backup) and opened again.

        ``schema="team_a"`` (PostgreSQL only) keeps this store in that tenant's schema.

        ``key`` (a passphrase, or a raw 256-bit key ``x'<64 hex>'``) opens an encrypted
        file (the ``encryption`` extra); without it, the URL's password part,
        ``$HERMES_STORE_KEY`` or ``$HERMES_STORE_KEY_FILE``. A wrong or missing key, or a
        key for a plain file, raises :class:`~hermes_store.errors.EncryptionKeyError` and
        leaves the file unchanged. An encrypted file is never adopted or made from a
        Hermes file automatically (``hermes-store encrypt`` does that), and Hermes itself
        cannot open it.
        """
        self._key_arg = encryption.as_key(key)
        try:
            self._open_patiently(db_path, read_only, url, engine, schema)
        except Exception as exc:
            path = getattr(self, "db_path", None)
            if path is not None and not read_only and is_malformed_db_error(exc) \
                    and _claim_repair_attempt(path):
                log.warning("%s: malformed database (%s); repairing it (a backup is kept)", path, exc)
                self._dispose_quietly()
                outcome = repair_state_db_schema(path)
                if outcome.get("repaired"):
                    try:
                        self._open_patiently(db_path, read_only, url, engine, schema)
                        return
                    except Exception as again:
                        exc = again
            _set_last_init_error(f"{type(exc).__name__}: {exc}")
            raise exc

    def _open_patiently(self, db_path: Any, read_only: bool, url: Any, engine: Any, schema: str | None) -> None:
        """:meth:`_open`, tried again while another process holds the file's lock (Hermes
        v26's open-lock patience): a writer mid-transaction, an adoption or migration
        under way elsewhere. Each failed try drops what it opened; any other error, a
        read-only open, or a lock still held after ``_WRITE_PATIENCE_S`` (read now)
        propagates at once."""
        def attempt(_deadline: float) -> None:
            self._open(db_path, read_only, url, engine, schema)

        def triage(exc: BaseException) -> retry.Verdict:
            return retry.RAISE if read_only or not _held_lock(getattr(self, "url", None), exc) else retry.WAIT

        def give_up(exc: BaseException, waited: float) -> BaseException:
            error = errors.DatabaseLockedError(
                f"database is locked (another process held {db_path or 'the database'}'s lock for over "
                f"{waited:.3g}s while this one opened it): {exc}"
            )
            error.__cause__ = exc
            return error

        def drop(exc: BaseException) -> None:
            log.debug("%s: locked while opening (%s); trying again", db_path, exc)
            self._dispose_quietly()

        retry.run(attempt, budget=self._write_patience(), triage=triage, give_up=give_up, before_wait=drop,
                  **self._patience())

    def _open(self, db_path: Any, read_only: bool, url: Any, engine: Any, schema: Optional[str] = None) -> None:
        target = _database_target(db_path, url, engine)
        if isinstance(target, Path):
            _ensure_test_isolation(target)  # Hermes v25: before anything touches the file
        self.read_only = bool(read_only)
        self._open_args = (db_path, read_only, url, engine, schema)
        if schema is not None:  # as ?schema= in the URL: hermes_store.engine.with_schema
            target = with_schema(target, schema)
        #: The SQLite file (None on a server); ``url`` is set either way.
        self.db_path: Path | None = target if isinstance(target, Path) else None
        self.url: URL = to_url(target)
        #: An encrypted file's key rides on ``url`` (masked in every rendering of it).
        self._encrypted = False
        if self.db_path is not None:
            given = self._key_arg if self._key_arg is not None else _key_in_target(db_path, url, engine)
            self.url = keyed_url(self.url, given)
            self._encrypted = bool(self.url.password)
        self._writes = 0
        # Reentrant: Hermes' code holds ``with db._lock:`` around its own ``_conn`` use
        # and may call our methods inside, which take it briefly too.
        self._lock = threading.RLock()
        # Idle connections kept open between calls, one stack for readers and one for
        # writers (each stack's connections carry their BEGIN flavour). Checking a
        # connection out of the pool for every append costs as much as the append.
        self._idle: dict[bool, list[Connection]] = {False: [], True: []}
        #: Appends posted while one is being written go together (group commit, where one
        #: writer writes at a time: see write_queue.Batcher); made with the engine.
        self._batcher: write_queue.Batcher = write_queue.Batcher()
        #: Where upkeep runs when the dialect keeps it off the caller's path.
        self._upkeep = self._new_upkeep(target.name if isinstance(target, Path) else (self.url.database or "server"))
        if self.db_path is not None and self.read_only:
            # As it is on disk: must exist; nothing created, migrated or switched.
            paths.check_target(self.db_path, write=False, create=False, make_parents=False)
            ro_url = URL.create("sqlite", database=f"file:{self.db_path}", query={"mode": "ro", "uri": "true"},
                                password=self.url.password)
            self._engine = self._clocked_engine(ro_url, busy_timeout_ms=BUSY_TIMEOUT_MS, max_overflow=-1)
            self._dialect = for_connection(self._engine)
            self.journal_mode = None
            self._wal_active = False
            with self._engine.connect() as conn:
                self._dialect.ping(conn)
                if not self._encrypted:  # a keyed open read the file already; here SQLite reads it now
                    try:
                        self._dialect.object_sql(conn, "sessions")
                    except DBAPIError as exc:
                        refused = encryption.refused_without_key(paths.resolve_link(self.db_path), exc)
                        if refused is exc:
                            raise
                        raise refused from exc
            self._tracked = paths.resolve_link(self.db_path)
            track_open(self._tracked)
            return
        if self.db_path is not None:
            # Path kind and permissions first (a dangling link, a folder, a read-only
            # file or folder, a path below a file): typed errors, nothing created.
            real = paths.check_target(self.db_path, write=True, create=True, make_parents=True)
            paths.make_parents(real)
            preflight_db_writability(real, db_label=real.name)  # the -wal/-shm files too
            self._quarantine_if_zeroed(real)
            if self._encrypted:
                self._migrate_keyed(real, self.url)
            else:
                # Creates the file 0600 when missing, finishes an interrupted adoption,
                # adopts a Hermes-made file, migrates our own older revisions.
                self._migrate_plain(self.db_path)
            # No pool cap: how many threads use one SessionDB is the application's call.
            self._engine = self._clocked_engine(self.url if self._encrypted else self.db_path,
                                                busy_timeout_ms=BUSY_TIMEOUT_MS, max_overflow=-1)
            self._batcher = self._new_batcher(self.db_path)
            label = self.db_path.name
        else:
            if self.read_only:
                raise errors.UnsupportedDatabaseError(
                    "read_only=True opens a SQLite file; on a server use a read-only role instead"
                )
            # A server: no file checks, adoption, WAL or PRAGMAs. Our own pooled
            # engine (pre-ping, NUL mapping, typed errors), never the caller's.
            self._engine = self._clocked_engine(self.url, max_overflow=-1)
            migrations.upgrade(self._engine)
            label = self.url.database or backend_name(self.url)
        self._dialect = dialect = for_connection(self._engine)

        # Hook: every new DB-API connection gets the dialect's session setup (WAL on SQLite).
        # Through a weak reference: SQLAlchemy keeps checked-out connections (our idle
        # ones) reachable from a global table, so a strong one here would keep this store
        # alive forever and ``__del__`` would never close it.
        me = weakref.ref(self)
        is_file = self.db_path is not None

        @event.listens_for(self._engine, "connect")
        def _journal(dbapi_conn: Any, _rec: Any) -> None:
            mode = dialect.on_connect(dbapi_conn, label=label)
            store = me()
            if store is not None:
                store.journal_mode = mode
            if is_file:
                apply_database_pragmas(dbapi_conn, db_label=label)  # config.yaml's database.* (Hermes v26)

        with self._engine.connect() as conn:
            dialect.ping(conn)
        #: Hermes' flag (assignable): this store's connections run in WAL mode.
        self._wal_active = getattr(self, "journal_mode", None) == "wal"
        if self.db_path is not None:
            self._tracked = paths.resolve_link(self.db_path)
            track_open(self._tracked)
        # Opening catches the short-CJK index up (bounded; skipped while another process
        # is at it), so a store opened after a bulk load searches at full speed at once.
        # Here, not on the upkeep thread: a short-lived store (a CLI command) would close
        # before it ran, and the tail above the index's mark would only grow.
        self._catch_up_search_index()

    @property
    def _conn(self) -> Any:
        """Hermes' plain connection (see :mod:`hermes_store.sessiondb.private`); on an
        encrypted file, SQLCipher's, opened with the store's key (rows ``sqlcipher3.Row``)."""
        path = self.__dict__.get("db_path")
        if self.__dict__.get("_encrypted") and path is not None and self._raw_conn is None:
            key = encryption.StoreKey(self.url.password or "")

            def keyed(database: str, **kwargs: Any) -> Any:
                return encryption.connect(database, key, **kwargs)

            with self._raw_lock:
                if self._raw_conn is None:
                    conn = open_raw_connection(keyed, path, read_only=self.read_only,
                                               busy_timeout_s=RAW_BUSY_TIMEOUT_S)
                    conn.row_factory = encryption.dbapi_module().Row
                    self._raw_conn = conn
        return super()._conn

    @_conn.setter
    def _conn(self, value: Any) -> None:
        self._raw_conn = value

    def _quarantine_if_zeroed(self, real: Path) -> None:
        """Hermes v26: a file whose first bytes are all NUL (a lost write) is moved aside
        (kept, renamed ``.zeroed-<stamp>-<pid>.bak``) and a fresh database made in its place."""
        if not is_zeroed_state_db(real):
            return
        moved = quarantine_zeroed_state_db(real)
        note = (f"state.db looks ZEROED (its first bytes are all NUL): {real} moved aside to {moved}; "
                "starting with a fresh database")
        if moved is None:
            if is_zeroed_state_db(real):
                raise sqlite3.DatabaseError(f"state.db looks ZEROED and could not be moved aside: {real}")
            return
        log.error("%s", note)
        _set_last_init_error(note)

    # ------------------------------------------------------------------ plumbing

    # How this store reaches its database; hermes_store.aio's store replaces these four
    # to run the same code on an event loop (async driver, loop-friendly waits).

    def _new_engine(self, target: Any, **kwargs: Any) -> Engine:
        return create_engine(target, **kwargs)

    def _clocked_engine(self, target: Any, **kwargs: Any) -> Engine:
        """:meth:`_new_engine`, its connections carrying this module's clock: the
        repositories stamp rows by it (:func:`hermes_store.repositories.base.clock_of`),
        so code that patches ``hermes_state.time`` moves every timestamp we write."""
        engine = self._new_engine(target, **kwargs)
        engine.update_execution_options(**clock_options(_wall_clock))
        return engine

    def _migrate_plain(self, path: Path) -> None:
        """:meth:`_migrate_file`; a file SQLite refuses that looks encrypted is refused with
        EncryptionKeyError, naming the key to supply."""
        try:
            self._migrate_file(path)
        except errors.NotADatabaseError as exc:
            refused = encryption.refused_without_key(paths.resolve_link(path), exc)
            if refused is exc:
                raise
            raise refused from exc

    def _migrate_file(self, path: Path) -> None:
        """Create, adopt or migrate the file before its engine opens it."""
        migrations.upgrade(path)

    def _migrate_keyed(self, path: Path, url: URL) -> None:
        """:meth:`_migrate_file` for an encrypted file: never adopted (a Hermes file is
        plain), migrated through a keyed connection only, once an interrupted
        encrypt/rekey swap (adoption's) is finished."""
        finish_interrupted(path)
        migrations.upgrade(url)

    def _new_upkeep(self, label: str) -> Upkeep:
        return Upkeep(label)

    def _sleep(self, seconds: float) -> None:
        """The wait between two tries of a locked write."""
        time.sleep(seconds)

    def _now(self) -> float:
        """The clock: this module's ``time`` looked up at call time.

        Hermes' tests patch ``hermes_state.time`` (this module, through the swap);
        repositories read the same clock, attached to this store's engine (:meth:`_clocked_engine`).
        """
        return time.time()

    def _label(self) -> str:
        """Where the data lives, for messages (never a password)."""
        return str(self.db_path) if self.db_path is not None else self.url.render_as_string(hide_password=True)

    @property
    def engine(self) -> Engine:
        return self._engine

    def _dispose_quietly(self) -> None:
        """Drop a half-opened engine and its open-file registration (before an open is
        tried again, after a repair or a held lock)."""
        self._untrack()
        engine = getattr(self, "_engine", None)
        self._engine = None  # type: ignore[assignment]
        if engine is not None:
            engine.dispose()

    def close(self) -> None:
        """Close the store (idempotent): token writer drained, pooled and raw connections
        closed, one PASSIVE checkpoint (writable files), engine disposed."""
        stop_writer = getattr(self, "_close_token_writer", None)
        if stop_writer is not None:
            stop_writer()
        upkeep = getattr(self, "_upkeep", None)
        if upkeep is not None:
            upkeep.close()  # a catch-up under way ends its transaction first
        self._close_read_pool()
        if getattr(self, "_engine", None) is None:
            self._close_raw()
            self._untrack()
            return
        try:
            if not self.read_only:
                self._close_checkpoint()
        finally:
            self._close_raw()
            self._untrack()
            with self._lock:
                idle = self._idle[False] + self._idle[True]
                self._idle = {False: [], True: []}
            for conn in idle:
                try:
                    conn.close()
                except Exception:  # already unusable; dispose() below cleans up
                    pass
            self._engine.dispose()
            self._engine = None  # type: ignore[assignment]

    def _untrack(self) -> None:
        """Drop this store's entry in Hermes' open-connection registry (idempotent)."""
        tracked = self.__dict__.pop("_tracked", None)
        if tracked is not None:
            track_close(tracked)

    def _open_engine(self) -> Engine:
        """The engine, or a typed error once :meth:`close` has run (not AttributeError)."""
        engine = getattr(self, "_engine", None)
        if engine is None:
            raise errors.StoreClosedError(f"{self._label()}: this SessionDB is closed")
        return engine

    @contextmanager
    def _borrow(self, write: bool) -> Iterator[tuple[Connection, bool]]:
        """An idle kept connection for a read or a write (a new one when none is idle),
        and whether it was kept (it may have died meanwhile: see :class:`_StaleConnection`)."""
        engine = self._open_engine()
        with self._lock:
            stack = self._idle[write]
            idle = stack.pop() if stack else None
        kept = not (idle is None or idle.closed or idle.invalidated)
        if idle is None or not kept:
            # The pool pre-pings what it hands out; a kept connection skips that check.
            conn = engine.connect()
            conn.execution_options(**self._dialect.call_options(write))
        else:
            conn = idle
        try:
            yield conn, kept
        except BaseException:
            # After a failure (a lock at BEGIN, a driver error) start clean next time.
            try:
                conn.close()
            except Exception:
                pass
            raise
        with self._lock:
            keep = self._engine is not None and len(self._idle[write]) < MAX_IDLE_CONNECTIONS
            if keep:
                self._idle[write].append(conn)
        if not keep:
            conn.close()

    def __enter__(self) -> SessionDB:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        self.close()
        return False

    def __del__(self) -> None:
        """Close a store nobody closed (Hermes v25). A store whose plumbing runs on an
        event loop (``hermes_store.aio``) is closed by its owner instead."""
        if getattr(self, "_engine", None) is None or type(self)._new_engine is not SessionDB._new_engine:
            return
        try:
            self.close()
        except Exception:
            pass

    def _checkpoint(self) -> None:
        self._dialect.checkpoint(self._engine)  # best effort: a busy one waits for the next interval

    def _interval_checkpoint(self) -> None:
        """The write interval's PASSIVE checkpoint, through Hermes' ``_try_wal_checkpoint``
        on a file (code may replace it on the instance), through the dialect on a server."""
        if self.db_path is not None:
            self._try_wal_checkpoint()
        else:
            self._checkpoint()

    def _try_wal_checkpoint(self) -> bool:
        """One PASSIVE checkpoint: on ``_conn`` when it is open (Hermes' own place for it,
        where its tests trace statements), else on one of our connections."""
        if self._raw_conn is not None:
            return super()._try_wal_checkpoint()
        self._checkpoint()
        return True

    def _close_checkpoint(self) -> None:
        """Hermes v26's close: exactly one PASSIVE checkpoint (never TRUNCATE), on ``_conn``
        when it is open; a failure is only a DEBUG line (the store is closing anyway)."""
        try:
            raw = self._raw_conn
            if raw is not None:
                checkpoint_passive(raw)
            else:
                self._checkpoint()
        except Exception as exc:
            hermes_log.debug("WAL checkpoint (PASSIVE) at close failed: %s", exc)

    def _read(self, fn: Callable[[Connection], T]) -> T:
        while True:
            try:
                with self._borrow(write=False) as (conn, kept):
                    try:
                        return fn(conn)
                    except Exception as exc:
                        # A read is safe to repeat: on a fresh connection when the kept one
                        # turned out dead (server restart, idle timeout).
                        if kept and conn.invalidated:
                            raise _StaleConnection from exc
                        raise
                    finally:
                        if not conn.invalidated:
                            conn.rollback()  # end the read snapshot so WAL checkpoints can progress
            except _StaleConnection:
                continue  # each stale connection is dropped, so this ends with a fresh one

    def _write(
        self, fn: Callable[[Connection], T], *, budget: Optional[float] = None, _maintenance: bool = False,
        one_statement: bool = False, combine: bool = False,
    ) -> T:
        """Run ``fn`` in one write transaction; retry on lock with jitter within ``budget``.

        ``budget`` defaults to :data:`WRITE_BUDGET_S`, read at call time so an
        application can change it. On a server, lock waits inside the transaction are
        bounded by what is left of the budget too (:meth:`Dialect.begin_write`).

        ``one_statement``: ``fn`` sends a single statement (an append), which a server
        runs as its own transaction, budget included (:meth:`Dialect.one_statement_write`).

        ``combine``: ``fn`` is a short write, safe to run again after a rollback, that may
        share its transaction with this store's other writes posted meanwhile, where one
        writer writes at a time (:meth:`_write_batch`): eight threads appending cost one
        commit and one search-index flush per batch, not per message.
        """
        if budget is None:
            budget = self._write_patience()
        if self.read_only:
            raise errors.ReadOnlyDatabaseError(f"{self._label()}: opened with read_only=True")
        dialect = self._dialect
        # Hermes v30's provider hooks (never around our own upkeep): with a pre-commit hook
        # each write has its own transaction, so a veto rolls back that write alone.
        pre_commit = () if _maintenance else tuple(self.__dict__.get("_pre_commit_hooks") or ())
        post_write = () if _maintenance else tuple(self.__dict__.get("_post_write_hooks") or ())
        if pre_commit:
            combine = one_statement = False
            fn = self._with_pre_commit_hooks(fn, pre_commit)

        def combined(deadline: float) -> T:
            def write(jobs: list[write_queue.Job]) -> None:
                self._write_batch(jobs, deadline)

            def timed_out() -> BaseException:
                return errors.DatabaseLockedError(f"{self._label()}: this store's other writes held it; giving up")

            result: T = self._batcher.submit(fn, write, deadline - _monotonic(), timed_out, self._batch_signal,
                                             self._batch_pause)
            return result

        def attempt(deadline: float) -> T:
            with self._borrow(write=True) as (conn, kept):
                if one_statement and dialect.one_statement_write(conn):
                    return self._one_statement(conn, kept, fn, deadline)
                # In line behind this process's other writers of the file, for at most
                # what is left of the budget (write_queue; SQLite only).
                conn.execution_options(**{write_queue.WAIT_OPTION: max(0.0, deadline - _monotonic())})
                try:
                    with conn.begin():
                        try:
                            dialect.begin_write(conn, deadline - time.monotonic())
                        except Exception as exc:
                            # Nothing of ``fn`` ran yet, so a kept connection the server
                            # dropped is simply replaced (a write is never repeated
                            # once it may have reached the server).
                            if kept and conn.invalidated:
                                raise _StaleConnection from exc
                            raise
                        result = fn(conn)
                except BaseException:
                    remove_committed_files(conn, committed=False)
                    raise
                remove_committed_files(conn)  # transcript files go only once the rows are gone
                return result

        def triage(exc: BaseException) -> retry.Verdict:
            if isinstance(exc, _StaleConnection):
                return retry.AGAIN  # each stale connection is dropped, so this ends with a fresh one
            if isinstance(exc, errors.SessionCompressionInProgressError):
                # Hermes v26: a compression finishing soon; waited out for a few seconds.
                return retry.Busy(_COMPRESSION_BUSY_WAIT_S)
            if isinstance(exc, (DBAPIError, sqlite3.DatabaseError)):
                # BEGIN IMMEDIATE reports a held lock as the driver's own error; a
                # server reports serialization failures and deadlocks (40001/40P01).
                if dialect.is_retryable(exc):
                    return retry.WAIT
                # Hermes v23: a damaged search index is rebuilt once per instance
                # and the write runs again (sessiondb.fts._on_write_error decides).
                if not _maintenance and self._on_write_error(exc):
                    return retry.AGAIN
            return retry.RAISE

        batched = combine and dialect.one_writer_at_a_time
        result = retry.run(combined if batched else attempt, budget=budget, triage=triage,
                           give_up=retry.locked_error(self._label, budget), **self._patience())
        if _maintenance:
            return result
        with self._lock:
            self._writes += 1
            writes = self._writes
            due = writes % max(1, int(self._CHECKPOINT_EVERY_N_WRITES)) == 0
        for hook in post_write:
            self._run_post_write_hook(hook)
        self._upkeep_after_commit(writes, due)
        return result

    def _write_patience(self) -> float:
        """The default write budget now: the lowest of our ``WRITE_BUDGET_S`` and Hermes'
        ``_WRITE_PATIENCE_S`` on the module and on the class or instance (tests lower any)."""
        return float(min(WRITE_BUDGET_S, _WRITE_PATIENCE_S, self._WRITE_PATIENCE_S))

    @staticmethod
    def _with_pre_commit_hooks(fn: Callable[[Connection], T], hooks: tuple[Callable[[Any], Any], ...]
                               ) -> Callable[[Connection], T]:
        """``fn``, then Hermes v30's ``hook(conn)`` for each hook, inside the same write
        transaction (after the change, before the commit), given the driver's connection
        (``sqlite3.Connection`` on a file, psycopg's on a server). An exception propagates,
        so the transaction rolls back."""
        def run(conn: Connection) -> T:
            result = fn(conn)
            driver = conn.connection.driver_connection
            for hook in hooks:
                hook(driver)
            return result

        return run

    def _run_post_write_hook(self, hook: Callable[[], Any]) -> None:
        """Hermes v30: ``hook()`` after the commit. The write is durable by now, so a
        failing hook is logged, never turned into the write's error."""
        try:
            hook()
        except Exception:
            hermes_log.warning("%s: post-write hook %r failed after a committed write", self._label(), hook,
                               exc_info=True)

    def _write_batch(self, jobs: list[write_queue.Job], deadline: float) -> None:
        """Write ``jobs`` in one transaction and record each outcome.

        No savepoint per job (two more statements each, and two more trips to the
        driver's thread on aiosqlite): a job that fails rolls the whole batch back, gets
        its error, and the batch is written again without it (failures are rare: an
        unknown or closed session). An error before any job ran (the lock) or at the
        COMMIT (the disk) is every job's outcome: nothing of the batch was committed."""
        pending = list(jobs)
        with self._borrow(write=True) as (conn, _kept):
            while pending:
                conn.execution_options(**{write_queue.WAIT_OPTION: max(0.0, deadline - _monotonic())})
                results: list[tuple[write_queue.Job, Any]] = []
                failed: write_queue.Job | None = None
                try:
                    with conn.begin():
                        for job in pending:
                            try:
                                results.append((job, job.run(conn)))
                            except Exception as exc:
                                if len(pending) == 1:
                                    raise
                                job.error, job.result, failed = exc, None, job
                                raise _BatchAgain from exc
                except _BatchAgain:
                    remove_committed_files(conn, committed=False)
                    pending.remove(failed)  # type: ignore[arg-type]  # set before _BatchAgain
                    continue
                except BaseException as exc:
                    remove_committed_files(conn, committed=False)
                    for job in pending:
                        job.error, job.result = exc, None
                    return
                remove_committed_files(conn)
                for job, value in results:
                    job.error, job.result = None, value
                return

    def _batch_signal(self) -> write_queue.Signal:
        """What a caller whose write another caller is writing sleeps on (a thread's event)."""
        return threading.Event()

    def _new_batcher(self, path: Path) -> write_queue.Batcher:
        """The batcher of this store's appends: shared with every other thread-driven store
        of the file in this process (they set their connections up alike, so any of their
        callers may write the others' appends)."""
        return write_queue.batcher_for(path)

    def _batch_pause(self) -> None:
        """Let the threads just woken from a batch post their next writes first (the GIL)."""
        time.sleep(0)

    def _patience(self) -> dict[str, Any]:
        """The retry runner's clock, sleep and jitter windows: this store's sleep, and this
        module's ``time`` and windows read now (code and tests change them here)."""
        return {"sleep": self._sleep, "monotonic": _monotonic,
                "early": EARLY_JITTER_S, "late": LATE_JITTER_S, "phase": EARLY_PHASE_S}

    def _outside(self, fn: Callable[[Engine], T], *, budget: Optional[float] = None) -> T:
        """``fn(engine)`` outside any transaction (VACUUM, checkpoints asked for), a held
        lock retried as a write's is, within ``budget`` (None: the write budget read now),
        then :class:`~hermes_store.errors.DatabaseLockedError`. Each try gets what is left
        of the budget as its lock budget (a server's VACUUM waits no longer)."""
        engine = self._open_engine()
        if self.read_only:
            raise errors.ReadOnlyDatabaseError(f"{self._label()}: opened with read_only=True")
        if budget is None:
            budget = self._write_patience()
        return retry.run(lambda deadline: fn(with_lock_budget(engine, deadline - _monotonic())), budget=budget,
                         triage=retry.locks(self._dialect.is_retryable),
                         give_up=retry.locked_error(self._label, budget), **self._patience())

    def _one_statement(self, conn: Connection, kept: bool, fn: Callable[[Connection], T], deadline: float) -> T:
        """``fn``'s one statement, committed by itself (driver autocommit), carrying what is
        left of the budget as its lock timeout. A kept connection the server had ended
        before the statement arrived is replaced, and the statement sent again."""
        ms = max(1, math.ceil((deadline - time.monotonic()) * 1000))
        conn.execution_options(**{LOCK_BUDGET_OPTION: ms})
        try:
            result = fn(conn)
        except Exception as exc:
            if kept and self._dialect.never_ran(exc):
                raise _StaleConnection from exc
            if not conn.invalidated:
                conn.rollback()  # ends SQLAlchemy's own bookkeeping; nothing is open at the server
            raise
        conn.commit()  # the same: the statement committed itself
        return result

    def _upkeep_after_commit(self, writes: int, due: bool) -> None:
        """Periodic upkeep after a committed write: checkpoint, short-CJK index catch-up,
        Hermes v23's FTS optimize every 1000 writes. The write is already durable, so
        nothing here may turn it into an error: a failure is logged and left for the
        next interval."""
        try:
            if due:
                self._schedule("WAL checkpoint", self._interval_checkpoint)
                self._schedule("short-CJK index catch-up", self._catch_up_after_writes)
            self._after_write(writes)
        except Exception:
            log.warning("%s: search index upkeep after a committed write failed; retried later",
                        self._label(), exc_info=True)

    def _schedule(self, name: str, job: Callable[[], Any]) -> None:
        """Run upkeep ``job`` now (one writer at a time: SQLite) or on this store's upkeep
        thread (writers side by side: a server), never failing the caller either way."""
        if self._dialect.upkeep_in_background:
            self._upkeep.submit(name, job)
        else:
            job()

    def wait_for_upkeep(self, timeout: Optional[float] = None) -> bool:
        """Wait until this store's background upkeep has nothing left to do (tests, tools);
        False when ``timeout`` ran out first. Always True where upkeep runs inline."""
        return self._upkeep.wait_idle(timeout)

    def _catch_up_after_writes(self) -> int:
        """The catch-up of the write interval, in short transactions where writers queue
        for one write turn (each lets the queued writers in before the next)."""
        if not self._dialect.one_writer_at_a_time:
            return self._catch_up_search_index()
        if not self._after_writers():
            return 0
        return self._catch_up_search_index(step=QUEUED_CATCH_UP_ROWS)

    def _after_writers(self) -> bool:
        """On the upkeep thread: wait until this process's line of writers to the file has
        been idle for UPKEEP_IDLE_S, at most UPKEEP_PATIENCE_S; False when the store is
        closing meanwhile."""
        binding = write_queue.binding_of(self._open_engine().dialect)
        if binding is None:
            return True
        deadline = _monotonic() + UPKEEP_PATIENCE_S
        while True:
            idle = binding.queue.idle_for()
            if idle >= UPKEEP_IDLE_S or _monotonic() >= deadline:
                return True
            if self._upkeep.pause(UPKEEP_IDLE_S - idle):
                return False

    def _catch_up_search_index(self, limit: int | None = BIGRAM_CATCH_UP_ROWS, *, step: int | None = None) -> int:
        """Extend the short-CJK index over rows written since (by us or by Hermes).

        Bounded per call so opening a huge, never-indexed file stays quick; rows not
        covered yet are still found, by a direct scan. One process at a time does it
        (an upkeep lock each transaction tries, and skips when held), in transactions of
        BACKGROUND_CATCH_UP_ROWS on a server, until caught up, the limit or close.

        Where writers take turns (SQLite) a read first spares the write turn when nothing
        is behind; on a server writers run side by side, so the write transaction asks
        itself (a run with nothing to do costs its reads, and saves a checkout and four
        statements on every run that has work, which is nearly every one).
        """
        if self._dialect.one_writer_at_a_time:
            try:
                with self._open_engine().connect() as conn:
                    if not MaintenanceRepository(conn).search_index_behind():
                        return 0
            except (OperationalError, errors.DatabaseLockedError, errors.DatabaseUnavailableError):
                return 0  # best effort: runs after a committed write, which must not look failed
        if step is None:
            step = limit
            if self._dialect.upkeep_in_background:
                step = BACKGROUND_CATCH_UP_ROWS if limit is None else min(limit, BACKGROUND_CATCH_UP_ROWS)
        done = 0
        try:
            while True:
                n = self._write(
                    lambda c: MaintenanceRepository(c).catch_up_search_index(step, single_owner=True),
                    budget=1.0, _maintenance=True,
                )
                done += n
                if step is None or n < step or (limit is not None and done >= limit) or self._upkeep.closing:
                    return done
        except (errors.DatabaseLockedError, errors.DatabaseUnavailableError):
            return done  # someone else is writing (or the disk is full); the next interval will do it
        except Exception:
            log.warning("%s: short-CJK index catch-up failed; retried later", self._label(), exc_info=True)
            return done
