"""PostgreSQL (psycopg 3): a server shared by many processes and hosts.

What differs from SQLite: no BEGIN IMMEDIATE (row locks and MVCC; writers wait on the
rows they touch, for at most the caller's budget: ``lock_timeout``), retries on
serialization failures and deadlocks (SQLSTATE 40001/40P01), VACUUM ANALYZE instead of
VACUUM, REINDEX and GIN pending-list merges instead of FTS5's rebuild and optimize, no
WAL checkpoint of ours, the catalogs instead of PRAGMAs, and text that cannot hold U+0000 (see
:mod:`hermes_store.codec`, "NUL on PostgreSQL": the adapters installed by
:func:`install_nul_adapters` make that invisible to callers).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager

import functools
import math
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from sqlalchemy import (
    Connection, Engine, Text, bindparam, cast, column, exists, func, insert, literal_column, select, table,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import TextClause

from .. import errors
from ..keys import PG_SEARCH_INDEXES
from ..models import Base
from ..search import latin_in_cjk as runs
from ..search import postgresql as pg_search
from ..search.delegated import DELEGATED_CANDIDATE
from ..tenant_schema import qualified, quote_ident, schema_of_connection
from . import pg_citus, pg_engine, pg_tenants, search_pg
from .base import CLOSED_BY_COMPRESSION, LOCK_BUDGET_OPTION, MessageRuns, refused_append
from .fts5 import NO_FTS5_STORAGE, Fts5Storage
from .pg_nul import install_nul_adapters
from .pg_tenants import tenant_table_names

#: The on-disk size of our tables (with indexes and TOAST) in the schema we work in.
_SERVER_SIZE = text(
    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = COALESCE(:schema, current_schema()) AND c.relkind IN ('r', 'm', 'p')"
    " AND c.relname IN :names"
).bindparams(bindparam("names", expanding=True))
#: Our tables (with their TOAST and indexes) and each of their indexes, in the schema we work in.
_SERVER_SIZES = text(
    "SELECT c.relname, CASE WHEN c.relkind = 'i' THEN 'index' ELSE 'table' END, COALESCE(t.relname, c.relname),"
    " CASE WHEN c.relkind = 'i' THEN pg_relation_size(c.oid) ELSE pg_total_relation_size(c.oid) END"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid"
    " WHERE n.nspname = COALESCE(:schema, current_schema()) AND c.relkind IN ('r', 'p', 'm', 'i')"
    " AND COALESCE(t.relname, c.relname) IN :names"
    " ORDER BY 4 DESC, 1"
).bindparams(bindparam("names", expanding=True))
#: Live and dead rows of our tables in the schema we work in (the statistics collector's).
_SERVER_ROWS = text(
    "SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables"
    " WHERE schemaname = COALESCE(:schema, current_schema()) AND relname IN :names"
).bindparams(bindparam("names", expanding=True))
#: libpq's PQTRANS_IDLE: no transaction open at the server.
_IDLE = 0
#: The server had ended the session before a statement arrived.
SESSION_ENDED_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "57P05"})
#: serialization_failure, deadlock_detected, lock_not_available: worth another try.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
#: Columns the search step adds to ``messages`` (not in the models, never returned).
HIDDEN_COLUMNS = frozenset({"search_vector"})
#: The schema a catalog query asks about: the connection's tenant (bound as ``:schema``),
#: else the default schema. Never ``current_schema()`` alone when a tenant is set: that
#: answers for whatever search_path the (pooled) server connection was left with.
_IN_SCHEMA = "COALESCE(CAST(:schema AS text), current_schema())"
_NAMESPACE = f"(SELECT n.oid FROM pg_namespace n WHERE n.nspname = {_IN_SCHEMA})"
_FTS_INDEXES = text(
    "SELECT c.relname FROM pg_class c WHERE c.relkind = 'i' AND c.relname IN :names"
    f" AND c.relnamespace = {_NAMESPACE} ORDER BY c.relname"
).bindparams(bindparam("names", expanding=True))
_INDEX_HEALTH = text(
    "SELECT i.indisvalid AND i.indisready AND i.indislive FROM pg_index i"
    " JOIN pg_class c ON c.oid = i.indexrelid"
    f" WHERE c.relname = :i AND c.relnamespace = {_NAMESPACE}"
)
_COLUMNS = text(
    "SELECT column_name, is_nullable = 'NO', column_default FROM information_schema.columns"
    f" WHERE table_schema = {_IN_SCHEMA} AND table_name = :t ORDER BY ordinal_position"
)
_VIEW_SQL = text(
    "SELECT pg_get_viewdef(c.oid) FROM pg_class c WHERE c.relname = :n AND c.relkind IN ('v', 'm')"
    f" AND c.relnamespace = {_NAMESPACE}"
)
#: ``Inspector.has_table``'s test, in a schema or on the search path (pg_catalog left out).
_TABLE_LIKE = (
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relname = CAST(:name AS name) AND c.relkind IN ('r', 'p', 'f', 'v', 'm') AND "
)
_HAS_TABLE_IN = text(_TABLE_LIKE + "n.nspname = CAST(:schema AS name))")
_HAS_TABLE_VISIBLE = text(_TABLE_LIKE + "pg_catalog.pg_table_is_visible(c.oid) AND n.nspname <> 'pg_catalog')")
_BASE_TABLES = text(
    f"SELECT table_name FROM information_schema.tables WHERE table_schema = {_IN_SCHEMA}"
    " AND table_type = 'BASE TABLE' ORDER BY table_name"
)

#: Transactions of other backends that hold or wait for a write lock on a table.
_WRITERS = text(
    "SELECT DISTINCT l.virtualtransaction FROM pg_locks l WHERE l.locktype = 'relation'"
    " AND l.relation = to_regclass(:t) AND l.mode = 'RowExclusiveLock' AND l.pid IS DISTINCT FROM pg_backend_pid()"
)
#: Whether any of those transactions is still open (each holds its own virtualxid lock).
_RUNNING = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'virtualxid' AND virtualxid = ANY(:v))"
)

#: A row's content as one value read out of TOAST (``|| ''`` makes the copy; OFFSET 0
#: keeps the planner from folding the subquery back into each test of it).
_DETOASTED = "SELECT COALESCE(m.content, '') || '' AS c OFFSET 0"
#: The sources whose sessions the trigram index leaves out (v30), on ``sessions s``.
_TRIGRAM_SOURCES = " AND s.source NOT IN ('cron', 'subagent')"

_MESSAGES = Base.metadata.tables["messages"]
_SESSIONS = Base.metadata.tables["sessions"]
#: Counter update of one append / one session of a bulk append, done in SQL so
#: concurrent appends to one session never lose a count.
_BUMP = (
    update(_SESSIONS)
    .where(_SESSIONS.c.id == bindparam("sid"))
    .values(
        message_count=func.coalesce(_SESSIONS.c.message_count, 0) + bindparam("n"),
        tool_call_count=func.coalesce(_SESSIONS.c.tool_call_count, 0) + bindparam("calls"),
    )
)
#: The bump of one append: also the existence check and the closed-target guard.
_BUMP_OPEN = _BUMP.where(_SESSIONS.c.end_reason.is_distinct_from(literal_column(f"'{CLOSED_BY_COMPRESSION}'")))
#: The one lookup made when that bump matched nothing.
_END_REASON = select(_SESSIONS.c.end_reason).where(_SESSIONS.c.id == bindparam("sid"))


@functools.lru_cache(maxsize=128)
def _append_stmt(names: tuple[str, ...], budgeted: bool = False) -> Any:
    """One append in one statement: the counter bump as a CTE, the INSERT fed by its row.

    No session, no bumped row, nothing inserted (no id comes back): the bump is the
    existence check, and its row lock still orders the appends of one session. Built
    once per column set; the values are bind parameters (``v_<column>``), cast to the
    column's type because a SELECT list gives an untyped parameter no type of its own.

    ``budgeted``: the statement sets its own ``lock_timeout`` (``:lt`` ms, local to its
    transaction) before it locks the session row: a materialized CTE the bump's WHERE
    tests, which the plan runs as a one-time filter ahead of the row scan.
    """
    bump_open = _BUMP_OPEN
    if budgeted:
        setting = func.set_config(literal_column("'lock_timeout'"), cast(bindparam("lt"), Text), literal_column("true"))
        budget = select(setting.label("v")).cte("budget")
        bump_open = _BUMP_OPEN.where(exists(select(budget.prefix_with("MATERIALIZED").c.v)))
    bump = bump_open.returning(_SESSIONS.c.id).cte("bump")
    values = [cast(bindparam(f"v_{n}"), _MESSAGES.c[n].type) for n in names]
    return (
        insert(_MESSAGES)
        .from_select([_MESSAGES.c[n] for n in names], select(*values).select_from(bump))
        .returning(_MESSAGES.c.id)
    )


#: Column sets of appends: whether the models have every column (the one-statement path).
_MODELLED: dict[tuple[str, ...], bool] = {}
#: An append's statement rendered for the driver, per (dialect class, column set,
#: budgeted, schema translation): its SQL text and the parameters it always takes.
_Rendered = tuple[str, tuple[tuple[str, Any], ...], tuple[str, ...]]
_RENDERED: dict[tuple[Any, ...], _Rendered | None] = {}
_UNSEEN: Any = object()
#: Where a connection keeps its append cursor (``info`` of SQLAlchemy's pooled connection:
#: it follows the DB-API connection): one cursor per connection, not one per append.
_APPEND_CURSOR = "hermes_store.append_cursor"
#: Rendered statements kept at most (column sets times tenants); past it, all are dropped.
_RENDERED_MAX = 320


@functools.cache
def _plain_fetchone() -> Callable[[Any], Any]:
    """psycopg's own ``Cursor.fetchone`` (without pg_nul's text decoding); psycopg is
    imported on first use, not with this module."""
    import psycopg

    return psycopg.Cursor.fetchone


def _driver_path(conn: Connection) -> Any:
    """The psycopg connection under ``conn`` when a statement may go to it directly with
    the same outcome as through SQLAlchemy, else None.

    Only a sync psycopg connection with its usual named parameters (asyncpg and
    psycopg's async face keep their own path), with nothing listening to SQLAlchemy's
    statement events or logging them (meters, tracers, ``echo``: they see every
    statement as before), and where the statement lands inside a transaction
    SQLAlchemy ends, or in none (driver autocommit): never one psycopg would open
    behind SQLAlchemy's back.
    """
    dialect = conn.dialect
    if dialect.is_async or dialect.driver != "psycopg" or dialect.paramstyle != "pyformat" or conn._echo:
        return None
    if conn._has_events or conn.engine._has_events:
        return None
    driver = conn.connection.driver_connection
    if driver is None or not (getattr(driver, "autocommit", False) or conn.in_transaction()):
        return None
    return driver


def _render_append(conn: Connection, names: tuple[str, ...], budgeted: bool, translate: Any,
                   key: tuple[Any, ...]) -> _Rendered | None:
    """:func:`_append_stmt` as SQLAlchemy renders it for ``conn``'s dialect, the tenant's
    schema written in (as SQLAlchemy does per execution), with the values of its literal
    binds. Assembled from :func:`_append_template` when it holds for the dialect (a new
    column set then costs a string join, not a compile), else compiled."""
    template = _append_template(conn.dialect, budgeted, key[0], key[3], translate)
    if template is not None:
        sql: str | None = template.render(names)
        fixed = template.fixed
    else:
        compiled = _append_stmt(names, budgeted).compile(
            dialect=conn.dialect, schema_translate_map=translate, render_schema_translate=bool(translate))
        fixed = tuple((name, bind.effective_value) for name, bind in compiled.binds.items() if not bind.required)
        processed = compiled._bind_processors or compiled.literal_execute_params or compiled.post_compile_params
        # Parameters SQLAlchemy would convert or expand (none today): that column set
        # keeps SQLAlchemy's path (None cached).
        sql = None if processed else compiled.string
    if len(_RENDERED) >= _RENDERED_MAX:
        _RENDERED.clear()
    rendered = _RENDERED[key] = None if sql is None else (sql, (*fixed, ("n", 1)), tuple(f"v_{n}" for n in names))
    return rendered


class _AppendTemplate:
    """The text of :func:`_append_stmt` around its column list, for one dialect, budget
    flag and tenant: ``head`` (the counter bump's CTEs), the table as written, each
    column's quoted name and cast parameter."""

    def __init__(self, head: str, target: str, columns: Mapping[str, tuple[str, str]],
                 fixed: tuple[tuple[str, Any], ...]) -> None:
        self.head, self.target, self.columns, self.fixed = head, target, columns, fixed

    def render(self, names: Sequence[str]) -> str:
        cols = ", ".join(self.columns[n][0] for n in names)
        values = ", ".join(f"{self.columns[n][1]} AS anon_{i}" for i, n in enumerate(names, 1))
        return f"{self.head}INSERT INTO {self.target} ({cols}) SELECT {values} \nFROM bump RETURNING {self.target}.id"


#: Per (dialect class, budgeted, schema translation): the template, or None where it
#: does not reproduce SQLAlchemy's own text (each column set is compiled then).
_TEMPLATES: dict[tuple[Any, ...], _AppendTemplate | None] = {}


def _append_template(dialect: Any, budgeted: bool, kind: Any, translated: Any, translate: Any
                     ) -> _AppendTemplate | None:
    """Build (once) the template of ``dialect`` and check it: SQLAlchemy's compiled text
    of every modelled column at once must come out of it character for character, with
    nothing SQLAlchemy would convert or expand."""
    key = (kind, budgeted, translated)
    if key in _TEMPLATES:
        return _TEMPLATES[key]
    everything = tuple(c.name for c in _MESSAGES.c if c.name != "id")
    compiled = _append_stmt(everything, budgeted).compile(
        dialect=dialect, schema_translate_map=translate, render_schema_translate=bool(translate))
    template = None
    text_ = compiled.string
    at = text_.rfind(" INSERT INTO ")
    if at >= 0 and not (compiled._bind_processors or compiled.literal_execute_params
                        or compiled.post_compile_params):
        target = text_[at + len(" INSERT INTO "):text_.find(" (", at)]
        quote = dialect.identifier_preparer.quote
        columns = {}
        for n in everything:
            casted = cast(bindparam(f"v_{n}"), _MESSAGES.c[n].type).compile(dialect=dialect).string
            columns[n] = (quote(n), casted)
        fixed = tuple((name, bind.effective_value) for name, bind in compiled.binds.items() if not bind.required)
        candidate = _AppendTemplate(text_[:at + 1], target, columns, fixed)
        if candidate.render(everything) == text_:
            template = candidate
    if len(_TEMPLATES) >= _RENDERED_MAX:
        _TEMPLATES.clear()
    _TEMPLATES[key] = template
    return template


def _messages_target(names: Sequence[str], schema: str | None) -> Any:
    """The model's ``messages`` when it has every column (``schema_translate_map`` then
    names the tenant), else a lightweight table of ``names`` in ``schema``, the
    connection's tenant: the map only rewrites the models' tables."""
    if all(n in _MESSAGES.c for n in names):
        return _MESSAGES
    return table("messages", *(column(n) for n in names), schema=schema)


def _own_transaction(conn: Connection) -> bool:
    """Whether the next statement on ``conn`` is a transaction of its own (driver
    autocommit, nothing open at the server)."""
    driver = conn.connection.driver_connection
    if driver is None or not getattr(driver, "autocommit", False):
        return False
    return bool(driver.info.transaction_status == _IDLE)


def _refused_append(conn: Connection, session_id: Any) -> errors.HermesStoreError:
    """Why an append's guarded bump matched nothing (one lookup, on that path only)."""
    return refused_append(session_id, conn.execute(_END_REASON, {"sid": session_id}).first())


def _sqlstate(exc: BaseException) -> str | None:
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return getattr(orig, "sqlstate", None)


@contextmanager
def _locks_typed() -> Iterator[None]:
    """A maintenance statement's held lock (55P03 lock timeout, 40P01 deadlock) as
    DatabaseLockedError chained from the driver's error, whichever driver (psycopg,
    asyncpg) raised it: no write loop is around it to retry the driver's own error."""
    try:
        yield
    except DBAPIError as exc:
        if _sqlstate(exc) in pg_engine.LOCK_SQLSTATES:
            raise errors.DatabaseLockedError(f"{str(exc.orig or exc).strip()}") from exc
        raise


class PostgreSQLDialect:
    """The :class:`hermes_store.dialects.Dialect` of PostgreSQL servers."""

    name = "postgresql"
    sync_driver = "psycopg"
    async_drivers = ("asyncpg", "psycopg")  # psycopg 3 runs on asyncio as it is
    has_schemas = True
    is_file = False
    replays_hermes_history = False
    keys_may_be_null = False
    #: No FTS5 tables: search runs on GIN indexes the server keeps complete on every
    #: write (no rebuild window to backfill, no pre-v23 layout, no trash to tear down).
    fts5: Fts5Storage | None = None
    fts5_storage: Fts5Storage = NO_FTS5_STORAGE
    search_index_can_lag = False
    driver_param_mark = "%s"
    holders_on_this_machine = False
    one_writer_at_a_time = False

    def database_path(self, url: Any) -> str | None:
        return None  # a server: no file of ours on this machine
    # Search routes: ILIKE folds every letter (narrowed to ASCII where SQLite's LIKE
    # must be matched); CJK queries go by substring over the pg_trgm index; the planner
    # keeps a block read on the id range by itself.
    caseless_like = "ILIKE"
    caseless_like_folds_non_ascii = True
    cjk_by_substring = True
    rowid_walk_hint = ""

    def insert(self, table: Any) -> Any:
        return pg_insert(table)

    def isolate_failure(self, conn: Connection) -> AbstractContextManager[Any]:
        """A failed statement aborts the whole transaction (a host's, or our migration's):
        a SAVEPOINT confines the failure to it."""
        return conn.begin_nested()

    def join_driver_transaction(self, conn: Connection) -> None:
        return None  # psycopg begins a real transaction with the first statement

    def install_batch_hooks(self, conn: Connection) -> bool:
        return False  # a full ALTER TABLE: no batch rebuilds

    # -------------------------------------------------------------- engines and errors

    def engine_kwargs(self, url: Any, kwargs: dict[str, Any], *, prepared_statements: bool) -> dict[str, Any]:
        return pg_engine.engine_kwargs(url, kwargs, prepared_statements=prepared_statements)

    def configure_engine(self, engine: Engine, *, foreign_keys: bool, busy_timeout_ms: int) -> None:
        """``foreign_keys``/``busy_timeout_ms`` are SQLite settings: the server enforces
        references always and waits on locks for at most the caller's lock_timeout."""
        pg_engine.configure_engine(engine, install_nul_adapters)

    def translate_error(self, exc: BaseException, *, locks: bool = False) -> errors.HermesStoreError | None:
        return pg_engine.translate_error(exc, locks=locks)

    # -------------------------------------------------------------- locking and retries

    def begin_options(self, write: bool) -> dict[str, Any]:
        # READ COMMITTED and row locks: counters are updated in SQL (x = x + n), so no
        # table lock is needed up front.
        return {}

    upkeep_in_background = True

    def try_upkeep_lock(self, conn: Connection, purpose: str) -> bool:
        return pg_tenants.try_transaction_lock(conn, purpose, schema_of_connection(conn) or "")

    def writers_in_progress(self, conn: Connection, table: str) -> list[str] | None:
        """Every other transaction holding (or queued for) a write lock on the table.

        A transaction takes RowExclusiveLock on ``messages`` before its INSERT draws an
        id, and keeps it until it ends, so once these are gone every id drawn before
        this call is committed or gone for good (how CREATE INDEX CONCURRENTLY waits)."""
        name = qualified(schema_of_connection(conn), table)
        return list(conn.execute(_WRITERS, {"t": name}).scalars())

    def still_running(self, conn: Connection, writers: Sequence[str]) -> bool:
        return bool(writers) and bool(conn.execute(_RUNNING, {"v": list(writers)}).scalar())

    def one_statement_write(self, conn: Connection) -> bool:
        # On Citus the wait happens on a worker, which a set_config() inside the statement
        # never reaches (issue 33, point 5): there the write opens its transaction with a
        # propagated SET LOCAL (begin_write).
        return not pg_citus.on_citus(conn)

    def never_ran(self, exc: BaseException) -> bool:
        # The server ended the session (admin_shutdown, crash_shutdown, cannot_connect_now,
        # idle_session_timeout): its FATAL came back instead of the statement's result.
        seen: BaseException | None = exc
        while seen is not None:  # the driver's error, also under our typed one
            if _sqlstate(seen) in SESSION_ENDED_SQLSTATES:
                return True
            seen = seen.__cause__
        return False

    def call_options(self, write: bool) -> dict[str, Any]:
        # Autocommit at the driver: no BEGIN and ROLLBACK around a read (two round trips
        # of a one-statement call), and a write's BEGIN goes with its lock budget in
        # one round trip (begin_write); COMMIT/ROLLBACK are still sent by the driver.
        return {"isolation_level": "AUTOCOMMIT"}

    def is_retryable(self, exc: BaseException) -> bool:
        """40001/40P01/55P03, also under a DatabaseLockedError they were typed as (a
        maintenance statement's); a statement cut off by statement_timeout is not."""
        if isinstance(exc, errors.DatabaseLockedError):
            exc = exc.__cause__ if exc.__cause__ is not None else exc
        return _sqlstate(exc) in RETRYABLE_SQLSTATES

    def begin_write(self, conn: Connection, seconds: float) -> None:
        """BEGIN and the lock budget in one round trip (a parameterless statement goes
        by the simple protocol, which takes several), on a connection in driver autocommit.

        A writer waits in the server's (fair) lock queue, but not past the budget.
        Without it a write behind a transaction left open elsewhere (an idle session
        holding a row lock) would hang forever; with it the wait ends in
        lock_not_available (55P03), which the facade turns into DatabaseLockedError.
        ``SET LOCAL``: nothing outlives the transaction, so nothing leaks to the server
        connection's next user behind a pooler. The driver sees the open transaction and
        sends COMMIT or ROLLBACK when SQLAlchemy ends it.
        """
        ms = max(1, math.ceil(seconds * 1000))
        conn.exec_driver_sql(f"BEGIN; {pg_citus.lock_budget(conn, ms)}")

    def on_connect(self, dbapi_conn: Any, *, label: str) -> str:
        install_nul_adapters(dbapi_conn)
        return "wal"  # the server's own write-ahead log; nothing to set per connection

    # -------------------------------------------------------------- upserts


    # -------------------------------------------------------------- message writes

    def append_message(self, conn: Connection, row: Mapping[str, Any], calls: int) -> int:
        """The counter bump and the INSERT … RETURNING id as one statement (one round trip:
        the floor's own count). A column the models lack (a Hermes-added one) takes the
        two-statement path: bump first, so the row lock and the existence check come first too.

        The hot path of every agent turn: on a sync psycopg connection nobody listens to
        (:func:`_driver_path`), the statement's text, rendered once per column set and
        tenant, goes straight to a DB-API cursor, and a failure takes SQLAlchemy's own
        error handling (typed errors, a dead connection invalidated)."""
        names = tuple(row)
        modelled = _MODELLED.get(names)
        if modelled is None:
            modelled = _MODELLED[names] = all(n in _MESSAGES.c for n in names)
        if modelled:
            driver = _driver_path(conn)
            if driver is not None:
                new_id = self._append_on_driver(conn, driver, names, row, calls)
                if new_id is not None:
                    return new_id
            params = {f"v_{n}": v for n, v in row.items()}
            params.update(n=1, calls=calls, sid=row["session_id"])
            # A one-statement write (SessionDB's, no transaction open): the budget rides along.
            budget = conn.get_execution_options().get(LOCK_BUDGET_OPTION)
            if budget is not None and not self.statement_alone(conn):
                budget = None
            if budget is not None:
                params["lt"] = str(int(budget))
            found = conn.execute(_append_stmt(names, budget is not None), params)
            mid = found.scalar()
            if mid is None:
                raise _refused_append(conn, row["session_id"])
            return int(mid)
        if not conn.execute(_BUMP_OPEN, {"n": 1, "calls": calls, "sid": row["session_id"]}).rowcount:
            raise _refused_append(conn, row["session_id"])
        target = _messages_target(names, schema_of_connection(conn))
        return int(conn.execute(insert(target).returning(_MESSAGES.c.id), row).scalar_one())

    def _append_on_driver(self, conn: Connection, driver: Any, names: tuple[str, ...], row: Mapping[str, Any],
                          calls: int) -> int | None:
        """:meth:`append_message`'s statement on a cursor of ``driver`` (the psycopg
        connection under ``conn``): the same text and parameters SQLAlchemy would send."""
        options = conn.get_execution_options()
        budget = options.get(LOCK_BUDGET_OPTION)
        if budget is not None and not (driver.autocommit and driver.info.transaction_status == _IDLE):
            budget = None  # a transaction is open: its own budget (begin_write) holds
        translate = options.get("schema_translate_map")
        key = (type(conn.dialect), names, budget is not None, tuple(translate.items()) if translate else None)
        rendered = _RENDERED.get(key, _UNSEEN)
        if rendered is _UNSEEN:
            rendered = _render_append(conn, names, budget is not None, translate, key)
        if rendered is None:
            return None
        sql, fixed, values = rendered
        params = dict(fixed)
        params.update(zip(values, row.values(), strict=True))
        params["calls"] = calls
        params["sid"] = row["session_id"]
        if budget is not None:
            params["lt"] = str(int(budget))
        info = conn.connection.info
        cursor = info.get(_APPEND_CURSOR)
        try:
            if cursor is None or cursor.closed or cursor.connection is not driver:
                cursor = info[_APPEND_CURSOR] = driver.cursor()
            cursor.execute(sql, params)
            # The one column is the new id (bigint): no text to decode (pg_nul's cursor).
            found = _plain_fetchone()(cursor)
        except BaseException as exc:
            # SQLAlchemy's handling of a failed statement, as conn.execute() would have
            # it: handle_error hooks (our typed errors), a disconnect invalidates the
            # connection. A non-driver error keeps its own type (no statement given).
            info.pop(_APPEND_CURSOR, None)
            dbapi_error = isinstance(exc, conn.dialect.loaded_dbapi.Error)
            try:
                conn._handle_dbapi_exception(exc, sql if dbapi_error else None, params, cursor, None)
            finally:
                if cursor is not None:
                    cursor.close()
        if found is None:
            raise _refused_append(conn, row["session_id"])
        return int(found[0])

    def statement_alone(self, conn: Connection) -> bool:
        """Whether the next statement on ``conn`` is a transaction of its own (driver
        autocommit, nothing open at the server): an append then carries its lock budget."""
        return _own_transaction(conn)

    def add_bigram_pairs(self, conn: Connection, table: str, pairs: Sequence[tuple[str, int]]) -> None:
        # One statement, the pairs as two arrays: a pipelined executemany costs the client
        # and the server a statement per pair (22 ms of client CPU for 50 messages' pairs).
        conn.execute(_bigram_pairs_insert(table), {"grams": [g for g, _ in pairs], "blocks": [b for _, b in pairs]})

    def bump_message_counts(self, conn: Connection, counts: Iterable[tuple[str, int, int]]) -> None:
        conn.execute(_BUMP, [{"n": n, "calls": calls, "sid": sid} for sid, n, calls in counts])

    def insert_messages(self, conn: Connection, runs: MessageRuns,
                        column_defaults: Callable[[], Mapping[str, str | None]]) -> None:
        """Core executemany per column set (psycopg batches it), input order kept; the
        server fills in column defaults itself."""
        schema = schema_of_connection(conn) if runs else None
        for names, values in runs:
            conn.execute(insert(_messages_target(names, schema)), [dict(zip(names, v, strict=True)) for v in values])

    # -------------------------------------------------------------- search routes

    def word_match(self, conn: Connection, match: str) -> tuple[Any, Any]:
        """Terms are folded by the function that built the index (one round trip at
        most), so both sides cut and fold words alike; snippets are cut in Python."""
        words = search_pg.word_query(conn, match)
        return words.tsquery, words

    def cjk_sessions(self, conn: Connection, params: dict[str, Any], object_sql: Callable[[str], str],
                     candidates: Sequence[tuple[str, Any]] | None = None) -> str:
        """v30's trigram-index sessions (the head schema): not cron, not sub-agents.

        The delegated sessions are read once per search and bound as one array, however
        many statements (candidate blocks, unindexed tail, tool rows) repeat the clause.
        """
        clause = _TRIGRAM_SOURCES
        delegated = search_pg.delegated_sessions(conn, candidates)
        if delegated:
            params["dlg"] = delegated
            clause += " AND s.id <> ALL(CAST(:dlg AS text[]))"
        return clause

    def latin_in_cjk(self, conn: Connection, query: runs.Query, words: Any, params: dict[str, Any],
                     object_sql: Callable[[str], str]) -> runs.RunsSQL:
        """Word-query terms inside CJK runs (:mod:`hermes_store.search.latin_in_cjk`): the
        pg_trgm index finds the term beside a character outside ASCII, a regular
        expression tells a run, the tsvector answers the word tests (folded as the query
        was: ``words``) and leaves out its own hits (``:q``). The trigram sessions as :meth:`cjk_sessions` keeps
        them, but the sub-agent test is left to the caller (``maybe_delegated``): it
        needs the JSON read in Python, which only the rare lookup row in such a
        session should cost."""
        names: dict[Any, str] = {}

        def name(term: runs.Term) -> str:
            if term not in names:
                n = names[term] = f"rx{len(names)}"
                params[n + "n"], params[n + "r"] = runs.regex_beside_non_ascii(term), runs.regex(term)
            return names[term]

        def may_be_in_run(term: runs.Term) -> str:
            # What the pg_trgm index answers: the term beside a character outside ASCII
            # (a CJK neighbour is one), cheap to cut into trigrams. The pattern is an
            # InitPlan's value, unknown when the statement is planned: a bound value
            # made the planner run every such regex over the column's histogram of long
            # texts (2-4 ms of planning for a three-word query) and, trusting its
            # estimates, leave the rarest term's index scan out of the BitmapAnd.
            n = name(term)
            return f"(m.content ~ (SELECT CAST(:{n}n AS text)) OR m.tool_name ~ (SELECT CAST(:{n}n AS text)))"

        def in_run(term: runs.Term) -> str:
            # The rule itself, on the index's candidates only: on ``d.c``, the content
            # read out of TOAST once per row (every test of ``m.content`` reads it again).
            n = name(term)
            return f"(d.c ~ :{n}r OR COALESCE(m.tool_name, '') ~ :{n}r)"

        def has_words(match: str) -> str:
            if match not in names:
                names[match] = f"rw{len(names)}"
                params[names[match]] = pg_search.tsquery_text(match, words.folded)
            return f"m.search_vector @@ CAST(:{names[match]} AS tsquery)"

        return runs.RunsSQL(
            source=("{messages} m JOIN {sessions} s ON s.id = m.session_id"
                    f" CROSS JOIN LATERAL ({_DETOASTED}) d"),
            where=(f"m.role <> 'tool' AND {runs.any_in_run(query, may_be_in_run)}"
                   f" AND {runs.condition(query, may_be_in_run, has_words)}"
                   f" AND {runs.any_in_run(query, in_run)} AND {runs.condition(query, in_run, has_words)}"
                   " AND NOT (m.search_vector @@ CAST(:q AS tsquery))"),
            sessions=_TRIGRAM_SOURCES,
            maybe_delegated=f"s.{DELEGATED_CANDIDATE}",
        )

    @property
    def search(self) -> search_pg.PgSearchRoutes:
        """The search statements of this dialect, per route (:mod:`.search_pg`)."""
        return search_pg.ROUTES

    def delegated_sessions(self, conn: Connection, candidates: Sequence[tuple[str, Any]] | None = None) -> list[str]:
        """Sub-agent sessions among ``candidates`` (read here when None): PostgreSQL 15
        has no safe JSON test in SQL, so they are decided in Python."""
        return search_pg.delegated_sessions(conn, candidates)

    def has_table(self, conn: Connection, name: str) -> bool:
        """SQLAlchemy's ``Inspector.has_table`` test (a table, view or materialized view
        of that name in the schema; visible on the search path when none is named) as
        one plain statement: the upkeep after writes asks it several times per run,
        and an Inspector costs three times the query."""
        schema = schema_of_connection(conn)
        if schema is None:
            return bool(conn.execute(_HAS_TABLE_VISIBLE, {"name": name}).scalar())
        return bool(conn.execute(_HAS_TABLE_IN, {"name": name, "schema": schema}).scalar())

    # -------------------------------------------------------------- full-text search

    def fts_indexes(self, conn: Connection) -> list[str]:
        """The GIN indexes search uses (word and trigram) that this database has.

        The server keeps them in step with every write (the tsvector column is
        generated), so upkeep here is about their physical state, not their content.
        """
        rows = conn.execute(
            _FTS_INDEXES, {"names": sorted(PG_SEARCH_INDEXES), "schema": schema_of_connection(conn)}
        )
        return [r[0] for r in rows]

    def fts_command(self, conn: Connection, index: str, cmd: str) -> None:
        """FTS5's upkeep commands, done the PostgreSQL way.

        'rebuild' re-creates the index from the table (REINDEX: the cure for a damaged
        or bloated index); 'optimize' and 'merge' (FTS5's full and bounded segment
        merges) merge the GIN pending list into the index proper, cheap and without
        blocking writers for long;
        'integrity-check' raises when the index is missing or left invalid or unready
        (e.g. by an interrupted CREATE/REINDEX ... CONCURRENTLY), which REINDEX repairs.
        """
        schema = schema_of_connection(conn)
        if cmd == "rebuild":
            conn.exec_driver_sql(f"REINDEX INDEX {qualified(schema, index) if schema else quote_ident(index)}")
        elif cmd in ("optimize", "merge"):
            named = qualified(schema, index) if schema else quote_ident(index)
            conn.execute(text("SELECT gin_clean_pending_list(CAST(:i AS regclass))"), {"i": named})
        elif cmd == "integrity-check":
            row = conn.execute(_INDEX_HEALTH, {"i": index, "schema": schema}).first()
            if row is None:
                raise errors.HermesStoreError(f"search index {index} is missing")
            if not row[0]:
                raise errors.HermesStoreError(f"search index {index} is invalid (an interrupted build?); rebuild it")
        else:
            raise errors.InvalidInputError(f"unknown search index command {cmd!r}")

    def match_sql(self, index: str) -> str:
        return pg_search.match_sql(index)

    def top_sql(self, index: str) -> str:
        return pg_search.top_sql(index)

    # -------------------------------------------------------------- maintenance

    def vacuum(self, engine: Engine) -> None:
        """The whole database; a tenant's engine vacuums its own schema's tables only,
        so one tenant's maintenance never works through (or waits on) another's. The
        tenant is the one the engine's connections carry (its URL's, or the options of
        an engine made for one tenant).

        VACUUM cannot run in a transaction, so it cannot carry a ``SET LOCAL
        lock_timeout``, and a session-level SET would leak behind a pooler. With a lock
        budget on the engine (``LOCK_BUDGET_OPTION``, set by ``Steps.outside``) our
        tables' locks are first taken and released in a transaction bounded by it: a
        table another transaction holds (``LOCK TABLE``, a long DDL) ends in
        DatabaseLockedError, which the caller retries, instead of a wait without end.
        """
        budget = engine.get_execution_options().get(LOCK_BUDGET_OPTION)
        with _locks_typed():
            if budget is not None:
                self._wait_for_table_locks(engine, int(budget))
            self._vacuum_now(engine)

    @staticmethod
    def _vacuum_now(engine: Engine) -> None:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            tenant = schema_of_connection(conn)
            if tenant is None:
                conn.exec_driver_sql("VACUUM ANALYZE")
                return
            tables = sorted(tenant_table_names(conn, tenant))
            if tables:
                listed = ", ".join(f"{quote_ident(tenant)}.{quote_ident(t)}" for t in tables)
                conn.exec_driver_sql(f"VACUUM ANALYZE {listed}")

    @staticmethod
    def _wait_for_table_locks(engine: Engine, ms: int) -> None:
        """Take (then release, by rolling back) VACUUM's own lock on our tables in one
        transaction that waits ``ms`` at most (``SET LOCAL``: nothing outlives it)."""
        with engine.connect() as conn, conn.begin() as tx:
            schema = schema_of_connection(conn) or conn.exec_driver_sql("SELECT current_schema()").scalar()
            ours = sorted(tenant_table_names(conn, schema) & set(Base.metadata.tables)) if schema else []
            if schema and ours:
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, ms)}")
                listed = ", ".join(f"{quote_ident(schema)}.{quote_ident(t)}" for t in ours)
                conn.exec_driver_sql(f"LOCK TABLE {listed} IN SHARE UPDATE EXCLUSIVE MODE")
            tx.rollback()

    def checkpoint(self, engine: Engine) -> None:
        return None  # the server checkpoints on its own

    def checkpoint_truncate(self, engine: Engine) -> None:
        return None  # no WAL file of ours to truncate: the server manages its own

    def logical_size_bytes(self, conn: Connection, schema: str | None, tables: Sequence[str]) -> int | None:
        """The on-disk size of our tables in this schema (indexes and TOAST included),
        the nearest a server has to a file's size."""
        total = conn.execute(_SERVER_SIZE, {"schema": schema, "names": sorted(tables)}).scalar()
        return int(total or 0)

    def text_bytes(self, expr: Any) -> Any:
        return func.octet_length(expr)

    def integrity_check(self, conn: Connection, *, quick: bool, max_lines: int) -> list[str]:
        return []  # a server has no such check of its own

    def object_sizes(self, conn: Connection, schema: str | None,
                     tables: Sequence[str]) -> list[tuple[str, str, str, int]] | None:
        """Our tables (with their TOAST and indexes) and each of their indexes."""
        rows = conn.execute(_SERVER_SIZES, {"schema": schema, "names": sorted(tables)}).fetchall()
        return [tuple(r) for r in rows]

    def space_details(self, conn: Connection, schema: str | None, tables: Sequence[str]) -> dict[str, Any]:
        """Live and dead rows per table of ours, the statistics collector's estimate
        (``pg_stat_user_tables``: what VACUUM would make reusable, not exact); a table's
        bytes in :meth:`object_sizes` include its indexes."""
        rows = conn.execute(_SERVER_ROWS, {"schema": schema, "names": sorted(tables)}).fetchall()
        return {"rows": {str(name): (int(live or 0), int(dead or 0)) for name, live, dead in rows},
                "table_bytes_include_indexes": True}

    def export_reader(self, conn: Connection) -> Callable[[str, str, str], list[dict[str, Any]]] | None:
        return None  # the repositories' reads: a round trip costs more than their setup

    def fts_search_available(self, conn: Connection) -> bool:
        return True  # the tsvector column is always there; its index only makes it fast

    def fts_trigram_available(self, conn: Connection) -> bool:
        """The pg_trgm index that serves substring and CJK search exists."""
        trigram = sorted(i for i in PG_SEARCH_INDEXES if "trgm" in i)
        return any(name in trigram for name in self.fts_indexes(conn))

    def defer_foreign_keys(self, conn: Connection) -> None:
        conn.exec_driver_sql("SET CONSTRAINTS ALL DEFERRED")

    def ping(self, conn: Connection) -> None:
        conn.exec_driver_sql("SELECT 1")

    def interrupter(self, conn: Connection) -> Callable[[], bool]:
        return lambda: False  # asyncpg and psycopg send the server a cancel request themselves

    def sync_identity(self, conn: Connection, table: str, column: str = "id", *, at_least: int = 0) -> None:
        """After rows were inserted with explicit ids, move the identity past them (and
        past ``at_least``); never backwards, so ids handed out before stay retired.
        The table is named in the connection's schema, in the SQL and in the string
        ``pg_get_serial_sequence`` resolves."""
        named = qualified(schema_of_connection(conn), table)
        # Two statements: the largest id first, then setval naming no table. Citus runs a
        # statement that reads a distributed table on the worker holding it, whose own
        # copy of the sequence has another range: one statement moved that copy, and
        # the coordinator's, which hands out the ids, stayed behind (issue 33, point 4).
        largest = conn.exec_driver_sql(f"SELECT max({column}) FROM {named}").scalar()
        conn.execute(
            text(
                "SELECT setval(pg_get_serial_sequence(:t, :c), "
                "GREATEST(:m, :n, 1, COALESCE(pg_sequence_last_value(pg_get_serial_sequence(:t, :c)::regclass), 0)), "
                ":m > 0 OR :n > 0 OR pg_sequence_last_value(pg_get_serial_sequence(:t, :c)::regclass) IS NOT NULL)"
            ),
            {"t": named, "c": column, "n": int(at_least), "m": int(largest or 0)},
        )

    def identity_high_water(self, conn: Connection, table: str, column: str = "id") -> int:
        named = qualified(schema_of_connection(conn), table)
        largest = conn.exec_driver_sql(f"SELECT COALESCE(max({column}), 0) FROM {named}").scalar() or 0
        # NULL until the sequence handed out its first value, or when this role may read
        # the tables but not the sequence (a reporting role): then the largest id.
        seq = conn.execute(
            text(
                "SELECT CASE WHEN has_sequence_privilege(s, 'SELECT, USAGE') THEN pg_sequence_last_value(s) END"
                " FROM CAST(pg_get_serial_sequence(:t, :c) AS regclass) AS s"
            ),
            {"t": named, "c": column},
        ).scalar()
        return max(int(largest), int(seq or 0))

    # -------------------------------------------------------------- introspection

    def table_info(self, conn: Connection, table: str) -> Sequence[tuple[str, bool, str | None]]:
        rows = conn.execute(_COLUMNS, {"t": table, "schema": schema_of_connection(conn)}).fetchall()
        return [(r[0], bool(r[1]), r[2]) for r in rows if r[0] not in HIDDEN_COLUMNS]

    def object_sql(self, conn: Connection, name: str) -> str:
        row = conn.execute(_VIEW_SQL, {"n": name, "schema": schema_of_connection(conn)}).first()
        return (row[0] or "") if row else ""

    def table_counts(self, conn: Connection) -> tuple[list[tuple[str, int]], list[str]]:
        schema = schema_of_connection(conn)
        names = [r[0] for r in conn.execute(_BASE_TABLES, {"schema": schema})]
        plain = [
            (n, int(conn.exec_driver_sql(f"SELECT count(*) FROM {qualified(schema, n) if schema else quote_ident(n)}")
                    .scalar() or 0))
            for n in names
        ]
        return plain, []


@functools.lru_cache(maxsize=64)
def _bigram_pairs_insert(table: str) -> TextClause:
    """:meth:`PostgreSQLDialect.add_bigram_pairs`' statement for one (qualified) table."""
    return text(
        f"INSERT INTO {table} (gram, block) SELECT unnest(CAST(:grams AS text[])), unnest(CAST(:blocks AS bigint[]))"
        " ON CONFLICT DO NOTHING"
    )


DIALECT = PostgreSQLDialect()
