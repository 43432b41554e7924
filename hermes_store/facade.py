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

import logging
import os
import random
import sqlite3
import threading
import time
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, OperationalError

from . import errors, migrations, paths
from .dialects import for_connection
from .dialects.sqlite import _wal_warned, apply_wal_with_fallback  # noqa: F401 - public here since v1
from .engine import create_engine, default_db_path, to_url
from .paths import create_private_database  # noqa: F401 - kept importable from here (CLI)
from .repositories import (
    LineageRepository,
    MaintenanceRepository,
    MessageRepository,
    SearchRepository,
    SessionRepository,
)
from .repositories.base import driver_errors
from .repositories.maintenance import remove_committed_files
from .search.query import contains_cjk, sanitize_fts5_query
from .titles import sanitize_title

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Retry budget for ordinary writes and for transcript writes (seconds).
WRITE_BUDGET_S = 20.0
TRANSCRIPT_BUDGET_S = 60.0
#: Jitter windows: short sleeps for the first 2 s, then longer ones.
EARLY_JITTER_S = (0.020, 0.150)
LATE_JITTER_S = (0.250, 1.0)
EARLY_PHASE_S = 2.0
#: A PASSIVE WAL checkpoint after this many successful writes (and on close).
CHECKPOINT_EVERY = 50
#: SQLite's own busy wait before our jittered retry takes over (milliseconds).
BUSY_TIMEOUT_MS = 100
#: Idle connections kept per kind (reads, writes) between calls.
MAX_IDLE_CONNECTIONS = 4
#: Rows the short-CJK index catches up on at open and at each checkpoint interval.
BIGRAM_CATCH_UP_ROWS = 20_000

_last_init_error: str | None = None


def get_last_init_error() -> str | None:
    """``"ExcType: message"`` of the last failed SessionDB open (not cleared on success)."""
    return _last_init_error


def format_session_db_unavailable(prefix: str = "Session database not available") -> str:
    """A sentence for users explaining why the session database could not be opened."""
    err = _last_init_error
    if not err:
        return f"{prefix}."
    if "locking protocol" in err.lower():
        return (
            f"{prefix}: the filesystem holding it (e.g. NFS/SMB) does not support the "
            f"WAL locking SQLite needs ({err})."
        )
    return f"{prefix}: {err}"


#: Dialects SessionDB opens: SQLite files, and PostgreSQL servers (shared by many writers).
SERVER_DIALECTS = ("postgresql",)


def _database_target(db_path: Any, url: str | URL | None, engine: Engine | None) -> Path | URL:
    """The SQLite file, or the server URL, behind whichever of path / URL / Engine was given.

    Checked before anything is created: an unsupported dialect or an in-memory URL
    gets one clear error, never a folder named ``sqlite:`` or ``mysql+…:``.
    """
    given = [x for x in (db_path, url, engine) if x is not None]
    if len(given) > 1:
        raise errors.InvalidInputError("give SessionDB one of db_path, url= or engine=, not several")
    target = given[0] if given else None
    if target is None:
        return default_db_path()
    if isinstance(target, Engine):
        target = target.url
    if isinstance(target, URL) or (isinstance(target, str) and "://" in target):
        parsed = to_url(target)
        backend = parsed.get_backend_name()
        if backend in SERVER_DIALECTS:
            return parsed
        if backend != "sqlite":
            raise errors.UnsupportedDatabaseError(
                f"{backend} databases are not supported by SessionDB; "
                "use a SQLite file (a path or a sqlite:///… URL) or a postgresql+psycopg://… URL"
            )
        if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
            raise errors.InvalidInputError(f"SessionDB needs a database file, not {parsed.render_as_string()}")
        return Path(parsed.database).expanduser()
    return Path(target).expanduser()


def _database_file(db_path: Any, url: str | URL | None, engine: Engine | None) -> Path:
    """The SQLite file behind the arguments (UnsupportedDatabaseError for a server URL)."""
    found = _database_target(db_path, url, engine)
    if isinstance(found, URL):
        raise errors.UnsupportedDatabaseError(f"{found.get_backend_name()} is a server, not a database file")
    return found


class _StaleConnection(Exception):
    """A kept idle connection failed before doing anything: the server dropped it."""


class SessionDB:
    """Hermes-compatible session store on one SQLite file or one PostgreSQL database."""

    def __init__(
        self,
        db_path: str | os.PathLike[str] | URL | Engine | None = None,
        *,
        url: str | URL | None = None,
        engine: Engine | None = None,
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
        """
        global _last_init_error
        target = _database_target(db_path, url, engine)
        #: The SQLite file (None on a server); ``url`` is set either way.
        self.db_path: Path | None = target if isinstance(target, Path) else None
        self.url: URL = to_url(target)
        self._writes = 0
        self._lock = threading.Lock()
        # Idle connections kept open between calls, one stack for readers and one for
        # writers (each stack's connections carry their BEGIN flavour). Checking a
        # connection out of the pool for every append costs as much as the append.
        self._idle: dict[bool, list[Connection]] = {False: [], True: []}
        try:
            if self.db_path is not None:
                # Path kind and permissions first (a dangling link, a folder, a read-only
                # file or folder, a path below a file): typed errors, nothing created.
                real = paths.check_target(self.db_path, write=True, create=True, make_parents=True)
                paths.make_parents(real)
                # Creates the file 0600 when missing, finishes an interrupted adoption,
                # adopts a Hermes-made file, migrates our own older revisions.
                migrations.upgrade(self.db_path)
                # No pool cap: how many threads use one SessionDB is the application's call.
                self._engine = create_engine(self.db_path, busy_timeout_ms=BUSY_TIMEOUT_MS, max_overflow=-1)
                label = self.db_path.name
            else:
                # A server: no file checks, adoption, WAL or PRAGMAs. Our own pooled
                # engine (pre-ping, NUL mapping, typed errors), never the caller's.
                self._engine = create_engine(self.url, max_overflow=-1)
                migrations.upgrade(self._engine)
                label = self.url.database or self.url.get_backend_name()
            self._dialect = dialect = for_connection(self._engine)

            @event.listens_for(self._engine, "connect")
            def _journal(dbapi_conn: Any, _rec: Any) -> None:
                self.journal_mode = dialect.on_connect(dbapi_conn, label=label)

            with self._engine.connect() as conn:
                dialect.ping(conn)
            self._catch_up_search_index()
        except Exception as exc:
            _last_init_error = f"{type(exc).__name__}: {exc}"
            raise

    # ------------------------------------------------------------------ plumbing

    def _label(self) -> str:
        """Where the data lives, for messages (never a password)."""
        return str(self.db_path) if self.db_path is not None else self.url.render_as_string(hide_password=True)

    @property
    def engine(self):  # type: ignore[no-untyped-def]
        return self._engine

    def close(self) -> None:
        if getattr(self, "_engine", None) is None:
            return
        try:
            self._checkpoint()
        finally:
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

    def _open_engine(self) -> Engine:
        """The engine, or a typed error once :meth:`close` has run (not AttributeError)."""
        engine = getattr(self, "_engine", None)
        if engine is None:
            raise errors.DatabaseUnavailableError(f"{self._label()}: this SessionDB is closed")
        return engine

    @contextmanager
    def _borrow(self, write: bool) -> Iterator[tuple[Connection, bool]]:
        """An idle kept connection for a read or a write (a new one when none is idle),
        and whether it was kept (it may have died meanwhile: see :class:`_StaleConnection`)."""
        engine = self._open_engine()
        with self._lock:
            stack = self._idle[write]
            conn = stack.pop() if stack else None
        kept = not (conn is None or conn.closed or conn.invalidated)
        if not kept:
            # The pool pre-pings what it hands out; a kept connection skips that check.
            conn = engine.connect()
            conn.execution_options(**self._dialect.begin_options(write))
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

    def __enter__(self) -> "SessionDB":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _checkpoint(self) -> None:
        self._dialect.checkpoint(self._engine)  # best effort: a busy one waits for the next interval

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
        self, fn: Callable[[Connection], T], *, budget: float | None = None, _maintenance: bool = False
    ) -> T:
        """Run ``fn`` in one write transaction; retry on lock with jitter within ``budget``.

        ``budget`` defaults to :data:`WRITE_BUDGET_S`, read at call time so an
        application can change it. On a server, lock waits inside the transaction are
        bounded by what is left of the budget too (:meth:`Dialect.bound_lock_wait`).
        """
        if budget is None:
            budget = WRITE_BUDGET_S
        start = time.monotonic()
        deadline = start + budget
        while True:
            try:
                with self._borrow(write=True) as (conn, kept):
                    try:
                        with conn.begin():
                            try:
                                self._dialect.bound_lock_wait(conn, deadline - time.monotonic())
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
                break
            except _StaleConnection:
                continue  # each stale connection is dropped, so this ends with a fresh one
            except (DBAPIError, sqlite3.OperationalError) as exc:
                # BEGIN IMMEDIATE reports a held lock as the driver's own error; a
                # server reports serialization failures and deadlocks (40001/40P01).
                if not self._dialect.is_retryable(exc):
                    raise
                now = time.monotonic()
                if now >= deadline:
                    raise errors.DatabaseLockedError(
                        f"{self._label()}: database stayed locked for {budget:.3g}s; giving up"
                    ) from exc
                low, high = EARLY_JITTER_S if now - start < EARLY_PHASE_S else LATE_JITTER_S
                time.sleep(min(random.uniform(low, high), max(deadline - now, 0)))
        if _maintenance:
            return result
        with self._lock:
            self._writes += 1
            due = self._writes % CHECKPOINT_EVERY == 0
        if due:
            self._checkpoint()
            self._catch_up_search_index()
        return result

    def _catch_up_search_index(self, limit: int | None = BIGRAM_CATCH_UP_ROWS) -> int:
        """Extend the short-CJK index over rows written since (by us or by Hermes).

        Bounded per call so opening a huge, never-indexed file stays quick; rows not
        covered yet are still found, by a direct scan.
        """
        try:
            with self._open_engine().connect() as conn:
                if not MaintenanceRepository(conn).search_index_behind():
                    return 0
        except (OperationalError, errors.DatabaseUnavailableError):
            return 0  # best effort: runs after a committed write, which must not look failed
        try:
            return self._write(
                lambda c: MaintenanceRepository(c).catch_up_search_index(limit), budget=1.0, _maintenance=True
            )
        except (errors.DatabaseLockedError, errors.DatabaseUnavailableError):
            return 0  # someone else is writing (or the disk is full); the next interval will do it

    def _execute_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Hermes' hook: ``fn`` gets the DB-API connection inside the write transaction."""
        def run(conn: Connection) -> T:
            with driver_errors():  # typed errors for a full disk etc.; "locked" still retries
                return fn(conn.connection.driver_connection)

        return self._write(run)

    # ------------------------------------------------------------------ static helpers

    _sanitize_fts5_query = staticmethod(sanitize_fts5_query)
    _contains_cjk = staticmethod(contains_cjk)
    sanitize_title = staticmethod(sanitize_title)

    # ------------------------------------------------------------------ sessions

    def create_session(self, session_id: str, source: str, **kwargs: Any) -> str:
        return self._write(lambda c: SessionRepository(c).create(session_id, source, **kwargs))

    def ensure_session(self, session_id: str, source: str = "unknown", model: str | None = None, **kwargs: Any) -> str:
        return self._write(lambda c: SessionRepository(c).ensure(session_id, source, model, **kwargs))

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        return self._read(lambda c: SessionRepository(c).get(session_id))  # type: ignore[return-value]

    def end_session(self, session_id: str, end_reason: str | None) -> None:
        self._write(lambda c: SessionRepository(c).end(session_id, end_reason))

    def reopen_session(self, session_id: str) -> None:
        self._write(lambda c: SessionRepository(c).reopen(session_id))

    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> None:
        self._write(lambda c: SessionRepository(c).update_system_prompt(session_id, system_prompt))

    def update_session(self, session_id: str, **fields: Any) -> bool:
        """Set other known session columns (cwd, archived, git_branch, hidden, pinned,
        title_source, last_read_at, ...). False for an unknown id."""
        return self._write(lambda c: SessionRepository(c).update_fields(session_id, **fields))

    def record_session_activity(
        self,
        session_id: str,
        description: str | None = None,
        provenance: str | None = "unknown",
        at: float | None = None,
    ) -> bool:
        """Stamp a sign of life without a message (v24 ``last_activity_*``).

        What Hermes' activity watchdog records during long tool calls or compression;
        listings then order the session by it. False for an unknown id.
        """
        return self._write(lambda c: SessionRepository(c).record_activity(session_id, description, provenance, at))

    def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str | None = None,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: float | None = None,
        actual_cost_usd: float | None = None,
        cost_status: str | None = None,
        cost_source: str | None = None,
        pricing_version: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        billing_mode: str | None = None,
        api_call_count: int = 0,
        absolute: bool = False,
        task: str = "",
    ) -> None:
        args = dict(locals())
        args.pop("self")
        self._write(lambda c: SessionRepository(c).update_token_counts(**args))

    # ------------------------------------------------------------------ titles

    def set_session_title(self, session_id: str, title: str | None, *, title_source: str = "user") -> bool:
        """Set the title (v25: recorded as set by ``title_source``, 'user' by default).

        An automatic source ('llm', 'derived') never replaces a higher-ranked title;
        that call returns False.
        """
        return self._write(lambda c: SessionRepository(c).set_title(session_id, title, title_source))

    def get_session_title(self, session_id: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).get_title(session_id))

    def get_session_by_title(self, title: str) -> dict[str, Any] | None:
        return self._read(lambda c: SessionRepository(c).get_by_title(title))  # type: ignore[return-value]

    def resolve_session_by_title(self, title: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).resolve_by_title(title))

    def get_next_title_in_lineage(self, base_title: str) -> str:
        return self._read(lambda c: SessionRepository(c).next_title_in_lineage(base_title))

    # ------------------------------------------------------------------ lookup and lineage

    def resolve_session_id(self, session_id_or_prefix: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).resolve_id(session_id_or_prefix))

    def get_compression_tip(self, session_id: str) -> str | None:
        if not session_id:
            return session_id
        return self._read(lambda c: LineageRepository(c).compression_tip(session_id))

    def resolve_resume_session_id(self, session_id: str) -> str:
        if not session_id:
            return session_id
        return self._read(lambda c: LineageRepository(c).resume_target(session_id))

    def get_session_lineage(self, session_id: str) -> list[str]:
        """Root → … → tip ids of the session's chain."""
        return self._read(lambda c: LineageRepository(c).chain(session_id))

    def get_session_ancestors(self, session_id: str) -> list[str]:
        """Root first, ending with the session itself."""
        return self._read(lambda c: LineageRepository(c).ancestors(session_id))

    def get_session_descendants(self, session_id: str) -> list[str]:
        """Every session below this one, nearest first."""
        return self._read(lambda c: LineageRepository(c).descendants(session_id))

    # ------------------------------------------------------------------ listing

    def list_sessions_rich(
        self,
        source: str | Iterable[str] | None = None,
        exclude_sources: Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        project_compression_tips: bool = True,
        order_by_last_active: bool = False,
    ) -> list[dict[str, Any]]:
        return self._read(  # type: ignore[return-value]
            lambda c: SessionRepository(c).list_rich(
                source, exclude_sources, limit, offset, include_children, project_compression_tips, order_by_last_active
            )
        )

    def search_sessions(self, source: str | None = None, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        return self._read(lambda c: SessionRepository(c).search(source, limit, offset))  # type: ignore[return-value]

    def session_count(self, source: str | None = None) -> int:
        return self._read(lambda c: SessionRepository(c).count(source))

    def message_count(self, session_id: str | None = None) -> int:
        return self._read(lambda c: MessageRepository(c).count(session_id))

    # ------------------------------------------------------------------ messages

    def append_message(
        self,
        session_id: str,
        role: str,
        content: Any = None,
        tool_name: str | None = None,
        tool_calls: Any = None,
        tool_call_id: str | None = None,
        token_count: int | None = None,
        finish_reason: str | None = None,
        reasoning: str | None = None,
        reasoning_content: str | None = None,
        reasoning_details: Any = None,
        codex_reasoning_items: Any = None,
        codex_message_items: Any = None,
        **extra: Any,
    ) -> int:
        fields = {
            "tool_name": tool_name, "tool_calls": tool_calls, "tool_call_id": tool_call_id,
            "token_count": token_count, "finish_reason": finish_reason, "reasoning": reasoning,
            "reasoning_content": reasoning_content, "reasoning_details": reasoning_details,
            "codex_reasoning_items": codex_reasoning_items, "codex_message_items": codex_message_items,
            **extra,
        }
        return self._write(
            lambda c: MessageRepository(c).append(session_id, role, content, **fields), budget=TRANSCRIPT_BUDGET_S
        )

    def append_messages(self, messages: Iterable[dict[str, Any]]) -> int:
        """Bulk append for imports and replays (dicts with session_id, role, ...)."""
        items = list(messages)
        # The short-CJK index is not extended here: it would halve bulk throughput,
        # and rows above its high-water mark are found by a direct scan until the next
        # maintenance interval (or index_search()) covers them.
        return self._write(lambda c: MessageRepository(c).bulk_append(items), budget=TRANSCRIPT_BUDGET_S)

    def get_messages(self, session_id: str) -> list[dict[str, Any]]:
        return self._read(lambda c: MessageRepository(c).get_messages(session_id))  # type: ignore[return-value]

    def get_messages_as_conversation(self, session_id: str, include_ancestors: bool = False) -> list[dict[str, Any]]:
        def run(c: Connection) -> list[dict[str, Any]]:
            ids = LineageRepository(c).ancestors(session_id) if include_ancestors else [session_id]
            return MessageRepository(c).conversation(ids or [session_id])

        return self._read(run)

    def replace_messages(self, session_id: str, messages: list[dict[str, Any]]) -> None:
        self._write(lambda c: MessageRepository(c).replace(session_id, messages), budget=TRANSCRIPT_BUDGET_S)

    def clear_messages(self, session_id: str) -> None:
        self._write(lambda c: MessageRepository(c).clear(session_id), budget=TRANSCRIPT_BUDGET_S)

    def get_messages_around(self, session_id: str, around_message_id: int, window: int = 5) -> dict[str, Any]:
        return self._read(lambda c: MessageRepository(c).around(session_id, around_message_id, window).as_dict())

    def get_anchored_view(
        self,
        session_id: str,
        around_message_id: int,
        window: int = 5,
        bookend: int = 3,
        keep_roles: Iterable[str] | None = ("user", "assistant"),
    ) -> dict[str, Any]:
        roles = tuple(keep_roles) if keep_roles is not None else None
        return self._read(
            lambda c: MessageRepository(c)
            .anchored_view(session_id, around_message_id, window, bookend, roles)
            .as_dict(bookends=True)
        )

    # ------------------------------------------------------------------ search

    def search_messages(
        self,
        query: str,
        source_filter: Iterable[str] | None = None,
        exclude_sources: Iterable[str] | None = None,
        role_filter: Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        sort: str | None = None,
    ) -> list[dict[str, Any]]:
        return self._read(  # type: ignore[return-value]
            lambda c: SearchRepository(c).search_messages(
                query, source_filter, exclude_sources, role_filter, limit, offset, sort
            )
        )

    # ------------------------------------------------------------------ export and maintenance

    def export_session(self, session_id: str) -> dict[str, Any] | None:
        return self._read(lambda c: MaintenanceRepository(c).export_session(session_id))

    def export_all(self, source: str | None = None) -> list[dict[str, Any]]:
        return list(self.iter_export(source))

    def iter_export(self, source: str | None = None) -> Iterator[dict[str, Any]]:
        """Streamed export: one session (with messages) at a time, flat memory."""
        with self._open_engine().connect() as conn:
            try:
                yield from MaintenanceRepository(conn).iter_export(source)
            finally:
                conn.rollback()

    def import_sessions(self, records: Iterable[dict[str, Any]], batch: int = 200) -> tuple[int, int]:
        """Import exported sessions idempotently; returns (imported, skipped)."""
        imported = skipped = 0
        chunk: list[dict[str, Any]] = []
        # Children met before their parent, carried across batches until it arrives.
        pending: list[tuple[str, str]] = []

        def flush(rows: list[dict[str, Any]]) -> tuple[int, int]:
            def run(c: Connection) -> tuple[int, int]:
                repo = MaintenanceRepository(c, pending_parents=pending)
                repo.defer_foreign_keys()
                done = sum(1 for r in rows if repo.import_session(r))
                return done, len(rows) - done

            return self._write(run, budget=TRANSCRIPT_BUDGET_S)

        for record in records:
            chunk.append(record)
            if len(chunk) >= batch:
                a, b = flush(chunk)
                imported, skipped, chunk = imported + a, skipped + b, []
        if chunk:
            a, b = flush(chunk)
            imported, skipped = imported + a, skipped + b
        if imported:
            self.index_search()  # an import is maintenance: leave the short-CJK index complete
        return imported, skipped

    def delete_session(self, session_id: str, sessions_dir: str | os.PathLike[str] | None = None) -> bool:
        return self._write(lambda c: MaintenanceRepository(c).delete_session(session_id, sessions_dir))

    def prune_sessions(
        self, older_than_days: int = 90, source: str | None = None, sessions_dir: str | os.PathLike[str] | None = None
    ) -> int:
        return self._write(lambda c: MaintenanceRepository(c).prune_sessions(older_than_days, source, sessions_dir))

    def prune_candidates(self, older_than_days: int = 90, source: str | None = None) -> list[dict[str, Any]]:
        """Read-only: the sessions :meth:`prune_sessions` would delete."""
        return self._read(lambda c: MaintenanceRepository(c).prune_candidates(older_than_days, source))

    def prune_empty_ghost_sessions(self, sessions_dir: str | os.PathLike[str] | None = None) -> int:
        return self._write(lambda c: MaintenanceRepository(c).prune_empty_ghost_sessions(sessions_dir))

    def finalize_orphaned_compression_sessions(self) -> int:
        return self._write(lambda c: MaintenanceRepository(c).finalize_orphaned_compression_sessions())

    def maybe_auto_prune_and_vacuum(
        self,
        retention_days: int = 90,
        min_interval_hours: float = 24,
        vacuum: bool = True,
        sessions_dir: str | os.PathLike[str] | None = None,
    ) -> dict[str, Any]:
        """Prune (and VACUUM) at most once per interval, tracked in state_meta."""
        result: dict[str, Any] = {"skipped": False, "pruned": 0, "vacuumed": False}
        try:
            last_raw = self.get_meta("last_auto_prune")
            try:
                last = float(last_raw) if last_raw is not None else None
            except ValueError:
                last = None  # unreadable stamp: treat as never run
            if last is not None and time.time() - last < float(min_interval_hours) * 3600:
                result["skipped"] = True
                return result

            def run(c: Connection) -> int:
                repo = MaintenanceRepository(c)
                pruned = repo.prune_sessions(retention_days, None, sessions_dir)
                repo.set_meta("last_auto_prune", repr(time.time()))
                return pruned

            result["pruned"] = self._write(run)
            if vacuum and result["pruned"]:
                self.vacuum()
                result["vacuumed"] = True
        except Exception as exc:  # reported, never raised: this runs on startup paths
            result["error"] = f"{type(exc).__name__}: {exc}"
        return result

    def vacuum(self) -> None:
        with driver_errors():
            self._dialect.vacuum(self._open_engine())

    def get_meta(self, key: str) -> str | None:
        return self._read(lambda c: MaintenanceRepository(c).get_meta(key))

    def set_meta(self, key: str, value: Any) -> None:
        self._write(lambda c: MaintenanceRepository(c).set_meta(key, value))

    def rebuild_fts(self) -> list[str]:
        """Rebuild both FTS5 indexes and the short-CJK index from the messages table."""
        return self._write(lambda c: MaintenanceRepository(c).rebuild_search(), budget=TRANSCRIPT_BUDGET_S)

    def index_search(self) -> int:
        """Bring the short-CJK index fully up to date now; returns rows indexed."""
        return self._write(lambda c: MaintenanceRepository(c).catch_up_search_index(), budget=TRANSCRIPT_BUDGET_S)

    def optimize_fts(self) -> list[str]:
        return self._write(lambda c: MaintenanceRepository(c).fts_optimize(), budget=TRANSCRIPT_BUDGET_S)

    def check_fts(self) -> dict[str, str | None]:
        return self._read(lambda c: MaintenanceRepository(c).fts_integrity_check())

    def usage(self, by: str = "model", source: str | None = None) -> list[Any]:
        return self._read(lambda c: MaintenanceRepository(c).usage(by, source))
