"""PostgreSQL through asyncpg (``postgresql+asyncpg://``, :mod:`hermes_store.aio` only).

The same SQL as :mod:`.postgresql`; what differs is how asyncpg talks to the server:

- A statement new to a connection is prepared (Parse/Describe), then bound and run
  (Parse again, Bind/Execute), two round trips; behind a transaction pooler those two
  may reach different server connections, which is harmless as the second carries its
  own Parse. So calls run in driver autocommit, as on psycopg: a read is one round trip
  per statement, an append one statement with its lock budget inside it, and another
  write opens its transaction itself (``BEGIN; SET LOCAL lock_timeout``), which the
  adapter ends (:class:`PoolerSafeConnection`).
- Statements are unnamed and nothing of them is kept on the server: a pooler hands a
  server connection to the next client, who must not meet (or collide with) ours. An
  unnamed statement is replaced by the next one and never needs closing; named ones
  (each with a fresh name, as before) were closed one round trip each, at the next
  prepare, often in another transaction and so on another server connection, leaving
  the statement behind on the first. What the Describe told (types, codecs) is kept on
  the client, per connection (SQLAlchemy's adapter cache): asyncpg sends an unnamed
  statement's Parse again with each Bind/Execute, so a statement the connection has
  met before costs one round trip, not two.
- Outside driver autocommit (a host's connection), SQLAlchemy's asyncpg adapter opens
  the transaction itself at the first statement; a write's lock budget (``SET LOCAL``)
  goes with that ``BEGIN`` in one simple-protocol round trip (:class:`PoolerSafeConnection`).
- U+0000 is mapped by codecs on the text types (asyncpg has no loader/cursor hooks).
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection, AsyncAdapt_asyncpg_dbapi
from sqlalchemy.util import await_only

from .. import errors
from ..codec import pg_decode_nul, pg_encode_nul
from . import pg_citus, pg_engine
from .postgresql import PostgreSQLDialect

#: Statements whose description (parameter and result types) a connection keeps.
DESCRIBED_STATEMENTS = 256

#: The types asyncpg returns as ``str`` that hold what callers stored.
_TEXT_TYPES = ("text", "varchar", "bpchar")


def _unnamed() -> str:
    """The unnamed statement (see the module docstring)."""
    return ""


class _BeginWith:
    """The asyncpg connection as ``Transaction.start`` sees it: its ``BEGIN`` carries
    ``extra`` (statements without parameters) in the same simple-protocol round trip."""

    __slots__ = ("_conn", "_extra")

    def __init__(self, conn: Any, extra: str) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_extra", extra)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._conn, name, value)

    async def execute(self, query: str) -> Any:
        return await self._conn.execute(f"{query} {self._extra}")


class PoolerSafeConnection(AsyncAdapt_asyncpg_connection):
    """SQLAlchemy's asyncpg connection adapter, with :meth:`open_with`; in driver
    autocommit, a transaction :meth:`open_with` began is ended by :meth:`commit` and
    :meth:`rollback` (SQLAlchemy's adapter only ends the ones it began itself)."""

    __slots__ = ()

    def _in_own_block(self) -> bool:
        """A transaction open at the server that the adapter does not know of (ours)."""
        return (self._transaction is None and self.isolation_level == "autocommit"
                and bool(self._connection.is_in_transaction()))  # type: ignore[attr-defined]  # asyncpg's

    def statement_alone(self) -> bool:
        """Whether the next statement is a transaction of its own (autocommit, nothing open)."""
        return (self.isolation_level == "autocommit" and self._transaction is None
                and not self._connection.is_in_transaction())  # type: ignore[attr-defined]  # asyncpg's

    def _end_own_block(self, sql: str) -> None:
        async def end() -> None:
            async with self._execute_mutex:
                await self._connection.execute(sql)  # type: ignore[attr-defined]  # asyncpg's

        try:
            await_only(end())
        except Exception as error:
            self._handle_exception(error)

    def commit(self) -> None:
        if self._in_own_block():
            self._end_own_block("COMMIT")
        else:
            super().commit()  # type: ignore[no-untyped-call]  # SQLAlchemy's adapter, untyped

    def rollback(self) -> None:
        if not self._connection.is_closed() and self._in_own_block():
            self._end_own_block("ROLLBACK")
        else:
            super().rollback()  # type: ignore[no-untyped-call]  # SQLAlchemy's adapter, untyped

    async def _open_with(self, sql: str) -> None:
        async with self._execute_mutex:
            if self._transaction is not None or self.isolation_level == "autocommit":
                if self._transaction is None and not self._connection.is_in_transaction():  # type: ignore[attr-defined]
                    sql = f"BEGIN; {sql}"  # autocommit: the transaction is ours (see commit)
                try:
                    await self._connection.execute(sql)  # type: ignore[attr-defined]  # asyncpg's, untyped here
                except Exception as error:
                    self._handle_exception(error)
                return
            from asyncpg.transaction import Transaction

            transaction = Transaction(_BeginWith(self._connection, sql), self.isolation_level,
                                      self.readonly, self.deferrable)
            try:
                await transaction.start()
            except Exception as error:
                self._handle_exception(error)
            transaction._connection = self._connection
            self._transaction = transaction

    def open_with(self, sql: str) -> None:
        """Run ``sql`` (statements without parameters) first in this connection's
        transaction, beginning it if the adapter has not yet: one round trip either way."""
        await_only(self._open_with(sql))


class PoolerSafeAsyncpg(AsyncAdapt_asyncpg_dbapi):
    """The DB-API module our asyncpg engines are given (``module=``): SQLAlchemy's, with
    :class:`PoolerSafeConnection` for connections."""

    def connect(self, *arg: Any, **kw: Any) -> PoolerSafeConnection:
        adapted = super().connect(*arg, **kw)  # type: ignore[no-untyped-call]
        adapted.__class__ = PoolerSafeConnection
        return adapted  # type: ignore[no-any-return]


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

    def statement_alone(self, conn: Connection) -> bool:
        """Our adapter knows whether a transaction is open (asyncpg has no autocommit flag)."""
        raw = conn.connection.dbapi_connection
        return isinstance(raw, PoolerSafeConnection) and raw.statement_alone()

    def engine_kwargs(self, url: Any, kwargs: dict[str, Any], *, prepared_statements: bool) -> dict[str, Any]:
        out = super().engine_kwargs(url, kwargs, prepared_statements=prepared_statements)
        args = dict(out.get("connect_args") or {})
        if not prepared_statements:
            # asyncpg's own cache keeps named statements on the server: off, and each
            # statement unnamed. SQLAlchemy's adapter cache keeps what a statement's
            # Describe told (its types and codecs) on the client only: asyncpg re-sends
            # an unnamed statement's Parse with every Bind/Execute (it marks it
            # unprepared when its own cache is off), so a statement met before on the
            # connection costs one round trip, and nothing outlives it on the server.
            args.setdefault("statement_cache_size", 0)
            args.setdefault("prepared_statement_cache_size", DESCRIBED_STATEMENTS)
            args.setdefault("prepared_statement_name_func", _unnamed)
        args.setdefault("async_creator_fn", _connect)
        out["connect_args"] = args
        if "module" not in out:
            import asyncpg

            out["module"] = PoolerSafeAsyncpg(asyncpg)  # type: ignore[no-untyped-call]
        return out

    def configure_engine(self, engine: Engine, *, foreign_keys: bool, busy_timeout_ms: int) -> None:
        pg_engine.configure_engine(engine, install_nul_codecs)

    def call_options(self, write: bool) -> dict[str, Any]:
        """Driver autocommit, as on psycopg: a read sends no BEGIN and ROLLBACK, an append
        is its one statement (:meth:`append_message`), another write opens its own
        transaction with its lock budget (:meth:`begin_write`), ended by the adapter.
        Each statement is Parse+Bind+Execute in one message run, so it reaches one
        server connection whole behind a pooler."""
        return {"isolation_level": "AUTOCOMMIT"}

    def begin_write(self, conn: Connection, seconds: float) -> None:
        """BEGIN (unless a transaction is open) and the lock budget, in one round trip
        (nothing outlives the transaction)."""
        ms = max(1, math.ceil(seconds * 1000))
        raw = conn.connection.dbapi_connection
        if isinstance(raw, PoolerSafeConnection):
            raw.open_with(pg_citus.lock_budget(conn, ms))
        else:
            conn.exec_driver_sql(pg_citus.lock_budget(conn, ms))

    def on_connect(self, dbapi_conn: Any, *, label: str) -> str:
        return "wal"  # the codecs came with the engine's own connect hook


DIALECT = AsyncpgDialect()
