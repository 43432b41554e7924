"""PostgreSQL through asyncpg (``postgresql+asyncpg://``, :mod:`hermes_store.aio` only).

The same SQL as :mod:`.postgresql`; what differs is how asyncpg talks to the server:

- Every statement is prepared (Parse/Describe, then Bind/Execute, two round trips).
  Outside a transaction a transaction pooler may send those two halves to different
  server connections, so reads run in a transaction too (no driver autocommit) and a
  write is BEGIN … COMMIT, never one autocommitted statement.
- Prepared statements get a unique name and are never cached across transactions: a
  pooler hands a server connection to the next client, who must not meet (or collide
  with) ours. SQLAlchemy's asyncpg adapter opens the transaction itself at the first
  statement, so the lock budget is a ``SET LOCAL`` inside it, not part of a BEGIN.
- U+0000 is mapped by codecs on the text types (asyncpg has no loader/cursor hooks).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from sqlalchemy import Connection

from sqlalchemy import Engine

from .. import errors
from ..codec import pg_decode_nul, pg_encode_nul
from . import pg_engine
from .postgresql import PostgreSQLDialect

#: The types asyncpg returns as ``str`` that hold what callers stored.
_TEXT_TYPES = ("text", "varchar", "bpchar")


def _statement_name() -> str:
    """A prepared statement's name no other client of a pooled server connection has."""
    return f"__hermes_store_{uuid.uuid4().hex}__"


async def _install_codecs(driver: Any) -> None:
    for name in _TEXT_TYPES:
        await driver.set_type_codec(name, schema="pg_catalog", encoder=pg_encode_nul, decoder=pg_decode_nul,
                                    format="text")


def install_nul_codecs(dbapi_conn: Any) -> None:
    """``connect`` hook: the NUL mapping of :mod:`hermes_store.codec` on a new asyncpg
    connection (SQLAlchemy's adapter runs the coroutine on the caller's greenlet)."""
    dbapi_conn.run_async(_install_codecs)


async def _connect(*args: Any, **kwargs: Any) -> Any:
    """asyncpg's ``connect``, with a socket error typed: SQLAlchemy's adapter passes an
    ``OSError`` (refused, reset by a pooler that went away, a timeout) through as it is,
    past every ``handle_error`` hook. Given as the adapter's ``async_creator_fn``."""
    import asyncpg

    try:
        return await asyncpg.connect(*args, **kwargs)
    except OSError as exc:  # ConnectionRefusedError, ConnectionResetError, TimeoutError...
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise errors.DatabaseUnavailableError(f"cannot connect to the database server: {reason}") from exc


class AsyncpgDialect(PostgreSQLDialect):
    """:class:`~.postgresql.PostgreSQLDialect` with asyncpg's protocol differences."""

    one_statement_writes = False

    def engine_kwargs(self, url: Any, kwargs: dict[str, Any], *, prepared_statements: bool) -> dict[str, Any]:
        out = super().engine_kwargs(url, kwargs, prepared_statements=prepared_statements)
        args = dict(out.get("connect_args") or {})
        if not prepared_statements:
            # asyncpg's own statement cache and SQLAlchemy's adapter cache both keep
            # statements across transactions; off, and a fresh name for each.
            args.setdefault("statement_cache_size", 0)
            args.setdefault("prepared_statement_cache_size", 0)
            args.setdefault("prepared_statement_name_func", _statement_name)
        args.setdefault("async_creator_fn", _connect)
        out["connect_args"] = args
        return out

    def configure_engine(self, engine: Engine, *, foreign_keys: bool, busy_timeout_ms: int) -> None:
        pg_engine.configure_engine(engine, install_nul_codecs)

    def call_options(self, write: bool) -> dict[str, Any]:
        return {}  # a transaction per call: see the module docstring

    def begin_write(self, conn: Connection, seconds: float) -> None:
        """The lock budget, inside the transaction the adapter began (nothing outlives it)."""
        ms = max(1, math.ceil(seconds * 1000))
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")

    def on_connect(self, dbapi_conn: Any, *, label: str) -> str:
        return "wal"  # the codecs came with the engine's own connect hook


DIALECT = AsyncpgDialect()
