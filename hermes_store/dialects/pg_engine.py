"""PostgreSQL engines: our connection defaults, and psycopg's errors as typed errors.

Part of the PostgreSQL dialect (:mod:`hermes_store.dialects.postgresql` answers the
:class:`~hermes_store.dialects.base.Dialect` calls with these). Every default is chosen
so that an engine is correct behind a transaction pooler: nothing is left on a server
connection, prepared statements included.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL

from .. import errors
from ..tenancy import SCHEMA_PARAM, schema_in_query, tenant_options
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


def translate_error(exc: BaseException, *, locks: bool = False) -> errors.HermesStoreError | None:
    """psycopg errors (by SQLSTATE) → typed errors; None for anything else."""
    if type(exc).__module__.split(".")[0] != "psycopg":
        return None
    state = getattr(exc, "sqlstate", None)
    if locks and state in LOCK_SQLSTATES:
        return errors.DatabaseLockedError(str(exc).strip())
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
