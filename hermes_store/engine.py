"""Engines and connections for SQLite files, with the transaction handling we rely on.

Python's ``sqlite3`` module (3.11) opens transactions lazily and only before DML, so
DDL and SELECTs run in autocommit and ``BEGIN IMMEDIATE`` is never issued. We take
transaction control away from the driver (``isolation_level = None``) and emit our own
``BEGIN`` from SQLAlchemy's ``begin`` event. That makes migrations atomic, lets writers
take the write lock up front, and makes SAVEPOINT-based test fixtures roll back cleanly.

On PostgreSQL one database can hold several stores, one per tenant schema
(``create_engine(url, schema="team_a")`` or ``…?schema=team_a``), named in every
statement (:mod:`hermes_store.tenancy`), never set on a connection.
Schema names are checked here (:func:`check_schema`), before anything connects.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from sqlalchemy import Connection, Engine, event
from sqlalchemy import create_engine as _sa_create_engine
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import DBAPIError

from . import errors
from .tenancy import SCHEMA_OPTION, SCHEMA_PARAM, check_schema, tenant_options

#: Execution option naming the BEGIN flavour for a connection ("DEFERRED"/"IMMEDIATE").
BEGIN_MODE = "hermes_store_begin"

DEFAULT_BUSY_TIMEOUT_MS = 1000




def _blank_schema(url: str) -> bool:
    """Whether a URL string has a ``schema`` query parameter with an empty value."""
    query = url.split("?", 1)[1] if "?" in url else ""
    return any(k == SCHEMA_PARAM and not v for k, v in parse_qsl(query, keep_blank_values=True))


def schema_in_url(url: URL) -> str | None:
    """The tenant schema a URL names (``?schema=``), checked; None when it names none."""
    raw = url.query.get(SCHEMA_PARAM)
    if raw is None:
        return None
    if url.get_backend_name() != "postgresql":
        raise errors.InvalidInputError(
            f"?{SCHEMA_PARAM}= names a PostgreSQL schema; a {url.get_backend_name()} database has none"
        )
    if isinstance(raw, tuple):
        raise errors.InvalidInputError(f"the URL names {len(raw)} schemas; give one ?{SCHEMA_PARAM}=")
    return check_schema(raw)


def with_schema(target: str | os.PathLike[str] | URL, schema: str | None) -> URL:
    """``target`` as a URL that keeps one tenant in PostgreSQL schema ``schema``.

    ``None`` leaves the URL as it is (a ``?schema=`` it holds is still checked). A
    SQLite target, a bad name, or a URL already naming another schema is refused with
    :class:`~hermes_store.errors.InvalidInputError`, before anything connects.
    """
    url = to_url(target)
    bound = schema_in_url(url)
    if schema is None:
        return url
    check_schema(schema)
    if url.get_backend_name() != "postgresql":
        raise errors.InvalidInputError(
            f"schema={schema!r}: per-tenant schemas exist on PostgreSQL only; "
            f"a {url.get_backend_name()} database has no schemas"
        )
    if bound is not None and bound != schema:
        raise errors.InvalidInputError(f"the URL names schema {bound!r} and schema={schema!r} was given; pick one")
    return url.update_query_dict({SCHEMA_PARAM: schema})


def schema_of(target: Engine | Connection | URL | str | os.PathLike[str]) -> str | None:
    """The tenant schema an Engine, Connection or URL is bound to (None: the default schema)."""
    if isinstance(target, Connection):
        found = target.get_execution_options().get(SCHEMA_OPTION)
        return found if found is not None else schema_of(target.engine)
    if isinstance(target, Engine):
        return schema_in_url(target.url)
    return schema_in_url(to_url(target))


def tenant_of(target: Engine | Connection | URL | str | os.PathLike[str], schema: str | None) -> str | None:
    """The schema to work in: ``schema`` or the one ``target`` is bound to.

    Both given and different, a SQLite target with a schema, or a bad name:
    InvalidInputError, before any connection.
    """
    if schema is not None:
        check_schema(schema)
    if isinstance(target, (Engine, Connection)):
        bound = schema_of(target)
        if schema is not None and target.dialect.name != "postgresql":
            raise errors.InvalidInputError(
                f"schema={schema!r}: per-tenant schemas exist on PostgreSQL only; "
                f"a {target.dialect.name} database has no schemas"
            )
        if schema is not None and bound is not None and bound != schema:
            raise errors.InvalidInputError(
                f"this engine works in schema {bound!r} and schema={schema!r} was given; pick one"
            )
        return schema if schema is not None else bound
    return schema_in_url(with_schema(target, schema))


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
        url = make_url(s)
        if SCHEMA_PARAM not in url.query and _blank_schema(s):
            # The URL parser drops "?schema=" with no value; that would silently mean
            # the default schema, which is not what was written.
            check_schema("")
        return url
    return make_url("sqlite://").set(database=str(Path(s).expanduser()))


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
#: Tables every migrated database has; missing one means "not migrated", not a bug.
_OUR_TABLES = frozenset({"sessions", "messages", "state_meta", "schema_version", "session_model_usage"})


def translate_driver_error(exc: BaseException) -> errors.HermesStoreError | None:
    """The typed error a caller should see for a driver failure, or None to keep it.

    One table for every path: SQLAlchemy's ``handle_error`` hook uses it, and code
    that talks to the DB-API connection directly calls it in its ``except``. "Locked"
    and "busy" are deliberately left alone: the facade retries those. The caller
    raises the result ``from exc`` so the driver error stays attached.
    """
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    if isinstance(exc, errors.HermesStoreError):
        return None  # already typed
    if isinstance(exc, UnicodeEncodeError):
        return errors.InvalidInputError(
            "text with a lone surrogate (U+D800-U+DFFF) cannot be stored: "
            f"{exc.object[exc.start:exc.end]!r} at position {exc.start}"
        )
    if isinstance(exc, OverflowError):
        return errors.InvalidInputError(f"value out of range for SQLite: {exc}")
    if isinstance(exc, sqlite3.ProgrammingError) and "binding parameter" in str(exc).lower():
        return errors.InvalidInputError(str(exc))
    if not isinstance(exc, sqlite3.Error):
        return _translate_pg(exc)
    missing = _NO_SUCH_TABLE.match(str(exc))
    if missing and missing.group(1) in _OUR_TABLES:
        return errors.NotMigratedError(
            f"the database has no {missing.group(1)} table: it is not migrated yet; run "
            "hermes_store.migrations.upgrade(<path, URL or Engine>) or `hermes-store upgrade` first"
        )
    code = getattr(exc, "sqlite_errorcode", None)
    kind = _BY_CODE.get(code & 0xFF) if isinstance(code, int) else None
    if kind is None:
        text = str(exc).lower()
        kind = next((k for needle, k in _BY_MESSAGE if needle in text), None)
    if kind is None:
        return None
    return kind(str(exc))


#: PostgreSQL SQLSTATEs callers can meet, by the typed error they become. Serialization
#: failures and deadlocks (40001/40P01) are left alone: the facade retries them.
_PG_BY_SQLSTATE: dict[str, type[errors.HermesStoreError]] = {
    "53100": errors.DiskFullError,  # disk_full
    "25006": errors.ReadOnlyDatabaseError,  # read_only_sql_transaction (a standby, read-only mode)
    "22021": errors.InvalidInputError,  # character_not_in_repertoire
    "22P05": errors.InvalidInputError,  # untranslatable_character
    "22003": errors.InvalidInputError,  # numeric_value_out_of_range
    "54000": errors.InvalidInputError,  # program_limit_exceeded (a value too large for a row)
}


#: SQLSTATEs (or classes) meaning "the server or database cannot be used right now":
#: connection_exception, invalid_authorization_specification, invalid_catalog_name
#: (no such database), admin/crash shutdown and cannot_connect_now.
_PG_UNAVAILABLE = ("08", "28", "3D000", "57P01", "57P02", "57P03")


def _translate_pg(exc: BaseException) -> errors.HermesStoreError | None:
    """psycopg errors (by SQLSTATE) → typed errors; None for anything else."""
    if type(exc).__module__.split(".")[0] != "psycopg":
        return None
    state = getattr(exc, "sqlstate", None)
    if state is None and any(k.__name__ == "OperationalError" for k in type(exc).__mro__):
        # No SQLSTATE: the client never got an answer (server down, refused, no such
        # database or role at connect time, connection lost). The message names host
        # and port, never the password.
        return errors.DatabaseUnavailableError(f"cannot use the database server: {str(exc).strip()}")
    if not isinstance(state, str):
        return None
    message = str(exc).strip()
    if state == "57014" or (state == "08P01" and "timeout" in message.lower()):
        # A statement cut off for running too long: the server's statement_timeout
        # (57014), or a pooler's query_timeout, which PgBouncer reports as a protocol
        # error (08P01) after it gave up waiting. The server is up; something (usually
        # a lock another transaction holds) kept this statement waiting.
        return errors.DatabaseLockedError(f"the statement was cut off after waiting too long: {message}")
    if state.startswith(_PG_UNAVAILABLE):
        return errors.DatabaseUnavailableError(message)
    if state == "42P01":  # undefined_table
        missing = re.search(r'relation "(?:\w+\.)?(\w+)"', str(exc))
        if missing and missing.group(1) in _OUR_TABLES:
            return errors.NotMigratedError(
                f"the database has no {missing.group(1)} table: it is not migrated yet; run "
                "hermes_store.migrations.upgrade(<URL or Engine>) or `hermes-store upgrade` first"
            )
        return None
    kind = _PG_BY_SQLSTATE.get(state)
    return None if kind is None else kind(str(exc).strip())


def _translate_hook(context: ExceptionContext) -> None:
    """``handle_error`` hook: raise the typed error instead of the driver's.

    SQLAlchemy chains the original driver exception as ``__cause__``. Never during a
    pool pre-ping: that failure must stay the driver's, so the pool replaces the dead
    connection instead of handing the caller an error.
    """
    if context.is_pre_ping:
        return
    typed = translate_driver_error(context.original_exception)
    if typed is not None:
        raise typed


def install_error_translation(engine: Engine) -> None:
    """Turn driver errors callers can meet (full disk, read-only, bad text) into typed errors.

    Idempotent by looking at the dialect's own listener list, not ``event.contains``:
    SQLAlchemy's registry keys listeners by ``id()`` of the dialect, so a new engine
    whose dialect reuses a dead one's address could be judged "already hooked" and
    pass a raw driver error to a caller (seen once in CI, under SQLAlchemy 2.1).
    """
    if engine.dialect.name not in ("sqlite", "postgresql"):
        return
    if not any(fn is _translate_hook for fn in engine.dialect.dispatch.handle_error):
        event.listen(engine, "handle_error", _translate_hook)


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
        typed = translate_driver_error(exc)
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


def create_engine(
    target: str | os.PathLike[str] | URL,
    *,
    schema: str | None = None,
    foreign_keys: bool = True,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    prepared_statements: bool = False,
    **kwargs: Any,
) -> Engine:
    """Create an Engine for a SQLite file with our PRAGMAs, transaction handling and typed errors.

    Any other URL (PostgreSQL) gets a plain pooled engine with ``pool_pre_ping``, so a
    connection the server dropped (restart, idle timeout) is replaced before use
    instead of failing a caller; its DDL is transactional without our BEGIN hook, and
    ``foreign_keys``/``busy_timeout_ms`` are SQLite settings it ignores.

    ``schema`` (or ``?schema=`` in the URL) keeps one tenant in its own PostgreSQL
    schema: every statement names it (:mod:`hermes_store.tenancy`); no connection is
    ever pointed at it. A bad name or a SQLite target is refused here.

    PostgreSQL statements are not prepared on the server by default (psycopg's
    ``prepare_threshold=None``): behind a transaction pooler that does not track them
    (PgBouncer before 1.21, or without ``max_prepared_statements``) a prepared statement
    lands on a server connection another client uses next. ``prepared_statements=True``
    (or ``?prepare_threshold=N`` in the URL, or ``connect_args``) turns them back on, for
    a direct connection or a pooler that supports them.
    """
    url = with_schema(target, schema)
    if url.get_backend_name() == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
        tenant = schema_in_url(url)
        if tenant is not None:
            kwargs["execution_options"] = {**kwargs.get("execution_options", {}), **tenant_options(tenant)}
        kwargs["connect_args"] = _pg_connect_args(url, kwargs.get("connect_args"), prepared_statements)
        engine = _sa_create_engine(url, **kwargs)
        from .dialects.postgresql import install_nul_adapters

        # Text cannot hold U+0000 there: the reversible mapping of hermes_store.codec.
        event.listen(engine, "connect", lambda dbapi_conn, _rec: install_nul_adapters(dbapi_conn))
        event.listen(engine, "do_connect", _drop_schema_param)
        install_error_translation(engine)
        return engine
    if url.get_backend_name() != "sqlite":
        kwargs.setdefault("pool_pre_ping", True)
        return _sa_create_engine(url, **kwargs)
    engine = _sa_create_engine(url, **kwargs)

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
    install_error_translation(engine)
    return engine


def _drop_schema_param(_dialect: Any, _rec: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
    """``do_connect`` hook: ``?schema=`` is ours, not a libpq option; a
    ``?prepare_threshold=`` of the URL arrives as text and psycopg wants a number."""
    cparams.pop(SCHEMA_PARAM, None)
    threshold = cparams.get("prepare_threshold")
    if isinstance(threshold, str):
        cparams["prepare_threshold"] = None if threshold.lower() in ("", "none", "off") else int(threshold)


#: psycopg's own default: prepare a statement on the server after 5 executions.
PREPARE_THRESHOLD_ON = 5


def _pg_connect_args(url: URL, given: dict[str, Any] | None, prepared: bool) -> dict[str, Any]:
    """psycopg connection arguments with server-side prepares off unless asked for.

    An explicit ``prepare_threshold`` (in ``connect_args`` or the URL) always wins.
    """
    args = dict(given or {})
    if "prepare_threshold" in args or "prepare_threshold" in url.query:
        return args
    if url.get_driver_name() in ("psycopg", "psycopg_async"):
        args["prepare_threshold"] = PREPARE_THRESHOLD_ON if prepared else None
    return args
