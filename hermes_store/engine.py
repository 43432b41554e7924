"""Engines and connections for SQLite files, with the transaction handling we rely on.

Python's ``sqlite3`` module (3.11) opens transactions lazily and only before DML, so
DDL and SELECTs run in autocommit and ``BEGIN IMMEDIATE`` is never issued. We take
transaction control away from the driver (``isolation_level = None``) and emit our own
``BEGIN`` from SQLAlchemy's ``begin`` event. That makes migrations atomic, lets writers
take the write lock up front, and makes SAVEPOINT-based test fixtures roll back cleanly.

On PostgreSQL one database can hold several stores, one per tenant schema
(``create_engine(url, schema="team_a")`` or ``…?schema=team_a``), named in every
statement (:mod:`hermes_store.tenant_schema`), never set on a connection.
Schema names are checked here (:func:`check_schema`), before anything connects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from sqlalchemy import Connection, Engine, event
from sqlalchemy import create_engine as _sa_create_engine
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import DBAPIError

from . import dialects, encryption, errors
from .dialects.base import translate_python_error
from .dialects.sqlite import BEGIN_MODE, install_begin_hook
from .targets import refuse_async
from .tenant_schema import SCHEMA_OPTION, SCHEMA_PARAM, check_schema, schema_in_query

__all__ = [
    "BEGIN_MODE",
    "SCHEMA_OPTION",
    "check_schema",
    "create_engine",
    "default_db_path",
    "install_begin_hook",
    "install_error_translation",
    "keyed_url",
    "schema_in_url",
    "schema_of",
    "tenant_of",
    "to_url",
    "translate_driver_error",
    "with_schema",
]

DEFAULT_BUSY_TIMEOUT_MS = 1000




def _blank_schema(url: str) -> bool:
    """Whether a URL string has a ``schema`` query parameter with an empty value."""
    query = url.split("?", 1)[1] if "?" in url else ""
    return any(k == SCHEMA_PARAM and not v for k, v in parse_qsl(query, keep_blank_values=True))


def schema_in_url(url: URL) -> str | None:
    """The tenant schema a URL names (``?schema=``), checked; None when it names none."""
    if url.query.get(SCHEMA_PARAM) is None:
        return None
    if not _has_schemas(url):
        raise errors.InvalidInputError(
            f"?{SCHEMA_PARAM}= names a PostgreSQL schema; a {dialects.backend_name(url)} database has none"
        )
    return schema_in_query(url)


def _has_schemas(target: URL | Engine | Connection) -> bool:
    """Whether ``target``'s kind of database holds tenant schemas."""
    found = dialects.find_for(target)
    return found is not None and found.has_schemas


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
    if not _has_schemas(url):
        raise errors.InvalidInputError(
            f"schema={schema!r}: per-tenant schemas exist on PostgreSQL only; "
            f"a {dialects.backend_name(url)} database has no schemas"
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
        if schema is not None and not _has_schemas(target):
            raise errors.InvalidInputError(
                f"schema={schema!r}: per-tenant schemas exist on PostgreSQL only; "
                f"a {dialects.backend_name(target)} database has no schemas"
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
    """Accept a SQLAlchemy URL or a plain file path (``postgres://`` read as ``postgresql://``)."""
    if isinstance(target, URL):
        return _known_scheme(target)
    s = os.fspath(target)
    if "://" in s:
        url = _known_scheme(make_url(s))
        if SCHEMA_PARAM not in url.query and _blank_schema(s):
            # The URL parser drops "?schema=" with no value; that would silently mean
            # the default schema, which is not what was written.
            check_schema("")
        return url
    return make_url("sqlite://").set(database=str(Path(s).expanduser()))


#: Scheme names other tools write for a kind of database SQLAlchemy knows by another
#: name: ``postgres://`` (Heroku's DATABASE_URL, libpq) is ``postgresql://``.
SCHEME_ALIASES = {"postgres": "postgresql"}


def _known_scheme(url: URL) -> URL:
    """``url`` with an aliased scheme renamed, its driver (``+asyncpg``…) kept."""
    scheme, plus, driver = url.drivername.partition("+")
    if scheme in SCHEME_ALIASES:
        return url.set(drivername=SCHEME_ALIASES[scheme] + plus + driver)
    return url


def keyed_url(url: URL, key: encryption.KeyLike | None = None) -> URL:
    """``url`` carrying the key its database is opened with, as its password part (masked
    whenever SQLAlchemy renders it): ``key``, the URL's own, else the environment's
    (:func:`hermes_store.encryption.resolve`). Only a database of this machine's takes a
    key: a server's at-rest encryption is the server's, and ``key=`` for one is refused."""
    found = dialects.find_for(url)
    if found is None or not found.holders_on_this_machine:
        if key is not None:
            raise errors.InvalidInputError(
                "key= opens an encrypted SQLite file; a server database's encryption at rest is the server's "
                "(its disk or provider)"
            )
        return url
    if key is None and not url.password and url.database in (None, "", ":memory:"):
        return url  # the environment's key is for files: an in-memory database (or a creator's) stays plain
    return encryption.url_with_key(url, encryption.resolve(key, url))


def translate_driver_error(exc: BaseException, *, locks: bool = False) -> errors.HermesStoreError | None:
    """The typed error a caller should see for a driver failure, or None to keep it.

    One table for every path: SQLAlchemy's ``handle_error`` hook uses it, and code
    that talks to the DB-API connection directly calls it in its ``except``. What is
    driver-specific is asked of each dialect module (``translate_error``). "Locked"
    and "busy" are left alone unless ``locks``: the facade retries those (maintenance
    outside a transaction, and failures reported rather than raised, ask for
    DatabaseLockedError). The caller raises the result ``from exc`` so the driver error
    stays attached.
    """
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    if isinstance(exc, errors.HermesStoreError):
        return None  # already typed
    typed = translate_python_error(exc)
    if typed is not None:
        return typed
    # Only the loaded modules: a driver's error comes from a database reached through one,
    # and asking the others would import them (a SQLite store's first error would load
    # the PostgreSQL modules).
    for dialect in dialects.loaded_dialects():
        typed = dialect.translate_error(exc, locks=locks)
        if typed is not None:
            return typed
    return None


def _translate_hook(context: ExceptionContext) -> None:
    """``handle_error`` hook: raise the typed error instead of the driver's.

    SQLAlchemy chains the original driver exception as ``__cause__``. Never during a
    pool pre-ping: that failure must stay the driver's, so the pool replaces the dead
    connection instead of handing the caller an error.
    """
    if context.is_pre_ping:
        return
    # A held lock too (DatabaseLockedError): whoever retries locks (the facade's writes,
    # the operations layer) accepts the typed error as one, and a host's own unit of
    # work meets a typed error instead of the driver's.
    typed = translate_driver_error(context.original_exception, locks=True)
    if typed is not None:
        if isinstance(typed, errors.ConnectionLostError) and not context.is_disconnect:
            # Whatever the driver says, this connection cannot carry on (asyncpg's "another
            # operation is in progress" after a cancel): discarded, never handed out
            # again; the pool's other connections are not suspect for it.
            context.is_disconnect = True
            context.invalidate_pool_on_disconnect = False
        raise typed


def install_error_translation(engine: Engine) -> None:
    """Turn driver errors callers can meet (full disk, read-only, bad text) into typed errors.

    Idempotent by looking at the dialect's own listener list, not ``event.contains``:
    SQLAlchemy's registry keys listeners by ``id()`` of the dialect, so a new engine
    whose dialect reuses a dead one's address could be judged "already hooked" and
    pass a raw driver error to a caller (seen once in CI, under SQLAlchemy 2.1).
    """
    if dialects.find_for(engine) is None:
        return
    if not any(fn is _translate_hook for fn in engine.dialect.dispatch.handle_error):
        event.listen(engine, "handle_error", _translate_hook)


def create_engine(
    target: str | os.PathLike[str] | URL,
    *,
    schema: str | None = None,
    foreign_keys: bool = True,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    prepared_statements: bool = False,
    key: encryption.KeyLike | None = None,
    **kwargs: Any,
) -> Engine:
    """Create an Engine for a SQLite file with our PRAGMAs, transaction handling and typed errors.

    Any other URL (PostgreSQL) gets a plain pooled engine with ``pool_pre_ping``, so a
    connection the server dropped (restart, idle timeout) is replaced before use
    instead of failing a caller; its DDL is transactional without our BEGIN hook, and
    ``foreign_keys``/``busy_timeout_ms`` are SQLite settings it ignores.

    ``schema`` (or ``?schema=`` in the URL) keeps one tenant in its own PostgreSQL
    schema: every statement names it (:mod:`hermes_store.tenant_schema`); no connection is
    ever pointed at it. A bad name or a SQLite target is refused here.

    PostgreSQL statements are not prepared on the server by default (psycopg's
    ``prepare_threshold=None``): behind a transaction pooler that does not track them
    (PgBouncer before 1.21, or without ``max_prepared_statements``) a prepared statement
    lands on a server connection another client uses next. ``prepared_statements=True``
    (or ``?prepare_threshold=N`` in the URL, or ``connect_args``) turns them back on, for
    a direct connection or a pooler that supports them.

    ``key`` (or the URL's password part, ``$HERMES_STORE_KEY``, ``$HERMES_STORE_KEY_FILE``)
    opens an encrypted SQLite store (:mod:`hermes_store.encryption`); refused for a server.
    """
    url = keyed_url(with_schema(target, schema), key)
    refuse_async(url, "create_engine")
    dialect = dialects.find_for(url)
    if dialect is None:  # not ours to set up (migrations and SessionDB refuse it with a clear error)
        kwargs.setdefault("pool_pre_ping", True)
        return _sa_create_engine(url, **kwargs)
    if "+" not in url.drivername:
        # A bare URL means our sync driver (postgresql:// is psycopg 3), whatever
        # SQLAlchemy's default for it (psycopg2 before 2.1); where SQLAlchemy already
        # picks ours, the URL is left as given.
        driven = dialects.with_driver(url, asyncio=False)
        if driven.get_dialect() is not url.get_dialect():
            url = driven
    engine = _sa_create_engine(encryption.url_without_key(url),
                               **dialect.engine_kwargs(url, kwargs, prepared_statements=prepared_statements))
    if url.password and dialect.holders_on_this_machine:
        # The key rides on the engine's URL (SQLAlchemy masks it when rendering; its SQLite
        # dialects refuse a password part, so it is given the URL without it): whoever
        # makes an engine from this one's URL opens the file with the same key.
        engine.url = url
    dialect.configure_engine(engine, foreign_keys=foreign_keys, busy_timeout_ms=busy_timeout_ms)
    install_error_translation(engine)
    return engine
