"""PostgreSQL engines: our connection defaults, and psycopg's errors as typed errors.

Part of the PostgreSQL dialect (:mod:`hermes_store.dialects.postgresql` answers the
:class:`~hermes_store.dialects.base.Dialect` calls with these). Every default is chosen
so that an engine is correct behind a transaction pooler: nothing is left on a server
connection, prepared statements included.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL

from .. import errors
from ..tenant_schema import SCHEMA_PARAM, schema_in_query, tenant_options
from .base import OUR_TABLES

#: psycopg's own default when preparing is wanted: prepare on the server after 5 executions.
PREPARE_THRESHOLD_ON = 5


def engine_kwargs(url: URL, kwargs: dict[str, Any], *, prepared_statements: bool) -> dict[str, Any]:
    """``create_engine`` arguments: the caller's, with ``pool_pre_ping`` (a connection the
    server dropped is replaced before use), the tenant's execution options, and
    server-side prepares off unless asked for.

    psycopg prepares a statement on the server after 5 executions; a pooler that does not
    track prepared statements (PgBouncer before 1.21, or without
    ``max_prepared_statements``) then hands it to another client. An explicit
    ``prepare_threshold`` (``connect_args`` or ``?prepare_threshold=`` in the URL) wins.
    """
    out = dict(kwargs)
    out.setdefault("pool_pre_ping", True)
    tenant = schema_in_query(url)
    if tenant is not None:
        out["execution_options"] = {**out.get("execution_options", {}), **tenant_options(tenant)}
    args = dict(out.get("connect_args") or {})
    if "prepare_threshold" not in args and "prepare_threshold" not in url.query:
        if url.get_driver_name() in ("psycopg", "psycopg_async"):
            args["prepare_threshold"] = PREPARE_THRESHOLD_ON if prepared_statements else None
    out["connect_args"] = args
    return out


def _connect_params(_dialect: Any, _rec: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
    """``do_connect`` hook: ``?schema=`` is ours, not a libpq option; a
    ``?prepare_threshold=`` of the URL arrives as text and psycopg wants a number."""
    cparams.pop(SCHEMA_PARAM, None)
    threshold = cparams.get("prepare_threshold")
    if isinstance(threshold, str):
        cparams["prepare_threshold"] = None if threshold.lower() in ("", "none", "off") else int(threshold)


def configure_engine(engine: Engine, install_nul_adapters: Any) -> None:
    """Connection hooks of a new engine: our URL parameters taken out before libpq sees
    them, and the NUL mapping on every new DB-API connection (``text`` cannot hold
    U+0000: see :mod:`hermes_store.codec`)."""
    event.listen(engine, "do_connect", _connect_params)
    event.listen(engine, "connect", lambda dbapi_conn, _rec: install_nul_adapters(dbapi_conn))


#: PostgreSQL SQLSTATEs callers can meet, by the typed error they become. Serialization
#: failures and deadlocks (40001/40P01) are left alone: the facade retries them.
_BY_SQLSTATE: dict[str, type[errors.HermesStoreError]] = {
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
_UNAVAILABLE = ("08", "28", "3D000", "57P01", "57P02", "57P03")


#: A held lock: lock_not_available (``lock_timeout``) and deadlock_detected. Typed only
#: where asked (``locks=True``: maintenance outside a write's retry loop).
LOCK_SQLSTATES = frozenset({"55P03", "40P01"})


#: The modules whose errors are a PostgreSQL driver's: psycopg 3, asyncpg, and the
#: DB-API face SQLAlchemy's asyncpg adapter puts on asyncpg's errors (the asyncpg error
#: chained under it, its SQLSTATE copied onto it).
_DRIVER_MODULES = ("psycopg", "asyncpg")
_ASYNCPG_ADAPTER = "sqlalchemy.dialects.postgresql.asyncpg"
#: The SQLSTATEs of a lost connection (connection_exception): the client's side of a
#: server or pooler closing it under a statement.
_LOST_SQLSTATES = frozenset({"08000", "08003", "08006"})
#: What asyncpg says when a connection cannot carry on: it was closed under the
#: operation, or a cancelled operation left its protocol in another state.
_LOST_WORDS = ("connection was closed", "connection is closed", "cannot switch to state",
               "another operation is in progress", "underlying connection is closed")
#: duplicate_prepared_statement, invalid_sql_statement_name and protocol_violation
#: ("bind message supplies 1 parameters, but prepared statement "_pg3_0" requires 3":
#: another client's statement of that name): with a name a driver gave its own
#: statement, the sign of a pooler handing server connections (and the statements
#: prepared on them) from one client to another.
_PREPARED_SQLSTATES = frozenset({"42P05", "26000", "08P01"})
_DRIVER_STATEMENT = re.compile(r'prepared statement "?(_pg3_\d+|__asyncpg_\w+|__hermes_store_\w+)"?')

PREPARED_STATEMENTS_HINT = (
    "a transaction pooler between here and the server (PgBouncer before 1.21, or 1.21+ without "
    "max_prepared_statements) hands prepared statements from one client to another; drop "
    "?prepare_threshold= from the URL (or prepared_statements=True: hermes_store prepares nothing "
    "by default), or upgrade PgBouncer to 1.21+ and set max_prepared_statements"
)


def prepared_statements_refused(message: str) -> errors.PreparedStatementsUnsupportedError:
    """The typed error of a driver's prepared statement met on another client's server
    connection (or missing from the one a statement landed on)."""
    return errors.PreparedStatementsUnsupportedError(f"{message.splitlines()[0].strip()}: {PREPARED_STATEMENTS_HINT}")


def _driver(exc: BaseException) -> str | None:
    """``"psycopg"``/``"asyncpg"`` when ``exc`` is one of their errors (or SQLAlchemy's
    asyncpg adapter's), else None."""
    module = type(exc).__module__
    if module == _ASYNCPG_ADAPTER:
        return "asyncpg"
    top = module.split(".")[0]
    return top if top in _DRIVER_MODULES else None


def _raised_in_driver(exc: BaseException) -> bool:
    """Whether a plain Python error (a socket's ``ConnectionResetError``) came out of
    psycopg's or asyncpg's own code, not ours or SQLite's."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__", "")
        if name.split(".")[0] in _DRIVER_MODULES or name == _ASYNCPG_ADAPTER:
            return True
        tb = tb.tb_next
    return False


def connection_lost(exc: BaseException) -> errors.ConnectionLostError | None:
    """The typed error for a connection that broke under a statement, or None.

    A socket error raised by the driver (``ConnectionResetError: [Errno 104]`` when a
    pooler closes or crashes), asyncpg's "connection was closed in the middle of
    operation" (SQLSTATE 08003) and its "cannot switch to state …; another operation is
    in progress" (a cancelled statement left the protocol mid-way)."""
    cause = exc.__cause__ if _driver(exc) == "asyncpg" and exc.__cause__ is not None else exc
    if isinstance(exc, OSError) and not isinstance(exc, (ConnectionError, socket.gaierror, TimeoutError)):
        return None
    if isinstance(exc, OSError):
        if not _raised_in_driver(exc):
            return None
    elif _driver(exc) != "asyncpg":
        return None
    elif getattr(exc, "sqlstate", None) not in _LOST_SQLSTATES and not isinstance(cause, OSError) and not any(
        w in str(exc) for w in _LOST_WORDS
    ):
        return None
    reason = " ".join(str(cause).split()) or type(cause).__name__
    return errors.ConnectionLostError(f"lost the connection to the database server: {reason}")


def translate_error(exc: BaseException, *, locks: bool = False) -> errors.HermesStoreError | None:
    """psycopg and asyncpg errors (by SQLSTATE), and a connection lost under the driver
    (a socket error it raised), as typed errors; None for anything else."""
    lost = connection_lost(exc)
    if lost is not None:
        return lost
    driver = _driver(exc)
    if driver is None:
        return None
    state = getattr(exc, "sqlstate", None)
    if locks and state in LOCK_SQLSTATES:
        return errors.DatabaseLockedError(str(exc).strip())
    if driver == "psycopg" and state is None and any(k.__name__ == "OperationalError" for k in type(exc).__mro__):
        # No SQLSTATE: the client never got an answer (server down, refused, no such
        # database or role at connect time, connection lost). The message names host
        # and port, never the password.
        return errors.DatabaseUnavailableError(f"cannot use the database server: {str(exc).strip()}")
    if not isinstance(state, str):
        return None
    message = str(exc).strip()
    if state in _PREPARED_SQLSTATES and _DRIVER_STATEMENT.search(message):
        return prepared_statements_refused(message)
    if state == "2BP01":  # dependent_objects_still_exist: the server's DETAIL names them
        return errors.DependentObjectsError(message.split("\nHINT:")[0])
    if state == "57014" or (state == "08P01" and "timeout" in message.lower()):
        # A statement cut off for running too long: the server's statement_timeout
        # (57014), or a pooler's query_timeout, which PgBouncer reports as a protocol
        # error (08P01) after it gave up waiting. The server is up; something (usually
        # a lock another transaction holds) kept this statement waiting.
        return errors.DatabaseLockedError(f"the statement was cut off after waiting too long: {message}")
    if state.startswith(_UNAVAILABLE):
        return errors.DatabaseUnavailableError(message)
    if state == "42P01":  # undefined_table
        missing = re.search(r'relation "(?:\w+\.)?(\w+)"', message)
        if missing and missing.group(1) in OUR_TABLES:
            return errors.NotMigratedError(
                f"the database has no {missing.group(1)} table: it is not migrated yet; run "
                "hermes_store.migrations.upgrade(<URL or Engine>) or `hermes-store upgrade` first"
            )
        return None
    kind = _BY_SQLSTATE.get(state)
    return None if kind is None else kind(message)
