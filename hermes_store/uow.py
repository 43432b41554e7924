"""One unit-of-work helper: a transaction with every repository bound to it.

    with UnitOfWork(engine) as uow:
        uow.sessions.create("s1", "cli")
        uow.messages.append("s1", "user", "hello")
        uow.commit()          # optional: persist what came before, keep working
        ...
    # committed here; an exception inside the block rolls back what followed the last commit()

On PostgreSQL, ``UnitOfWork(engine, schema="team_a")`` works inside one tenant's schema
(an engine made with ``create_engine(url, schema=…)`` already does).
"""

from __future__ import annotations

from types import TracebackType

from sqlalchemy import Connection, Engine

from . import errors
from .dialects import for_connection
from .engine import schema_of, tenant_of
from .targets import refuse_async
from .tenant_schema import tenant_options
from .repositories.base import Clock, clock_options
from .repositories.transcripts import remove_committed_files
from .repositories import UNIT_OF_WORK, Repositories


def _in_schema(engine: Engine, schema: str) -> Engine:
    """``engine`` working in tenant ``schema``: the same pool, Core statements naming the
    schema (``schema_translate_map``). One per engine and schema, kept on the engine, so
    what repositories cache per engine (table columns) is never shared between tenants."""
    kept: dict[str, Engine] = engine.__dict__.setdefault("_hermes_store_tenants", {})
    if schema not in kept:
        kept[schema] = engine.execution_options(**tenant_options(schema))
    return kept[schema]


class UnitOfWork(Repositories):
    """Opens a connection and transaction; commits on success, rolls back on error.

    Its repositories are :class:`hermes_store.repositories.Repositories`' (``uow.sessions``,
    ``uow.messages``...), bound to the connection on entry."""

    def __init__(self, engine: Engine, *, write: bool = True, schema: str | None = None,
                 clock: Clock | None = None) -> None:
        """``schema``: the PostgreSQL schema of one tenant (a bad name, a SQLite engine, or
        an engine bound to another schema is an InvalidInputError, raised here).

        ``clock`` (``() -> epoch seconds``): what the repositories stamp rows with; None
        keeps the engine's (see :func:`hermes_store.repositories.base.clock_of`), else
        ``time.time``."""
        refuse_async(engine, "UnitOfWork")
        #: The tenant schema, or None for the engine's own (default) schema.
        self.schema = tenant_of(engine, schema)
        # An engine bound to the tenant names it in every statement already; any other
        # engine is given the tenant's execution options (never a connection setting).
        tenant = self.schema if schema_of(engine) is None else None
        self.engine = engine
        self._source = engine if tenant is None else _in_schema(engine, tenant)
        self.write = write
        self.clock = clock
        self.conn: Connection | None = None

    def _begin(self, conn: Connection) -> None:
        conn.begin()

    def __enter__(self) -> UnitOfWork:
        conn = self._source.connect()
        try:
            # Writers take the write lock at BEGIN (SQLite), so a transaction never
            # fails half-way through on a lock upgrade.
            conn.execution_options(**for_connection(conn).begin_options(self.write))
            if self.clock is not None:
                conn.execution_options(**clock_options(self.clock))
            self._begin(conn)
        except BaseException:
            conn.close()  # a failed BEGIN (locked, read-only) must not leak the connection
            raise
        self.conn = conn
        for name, repository in UNIT_OF_WORK.items():
            setattr(self, name, repository(conn))
        return self

    def commit(self) -> None:
        """Make everything so far durable and start a new transaction for what follows."""
        if self.conn is None:
            raise errors.HermesStoreError("UnitOfWork.commit() called outside its 'with' block")
        self.conn.commit()
        remove_committed_files(self.conn)
        self._begin(self.conn)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.conn is not None
        try:
            if exc_type is None:
                self.conn.commit()
                remove_committed_files(self.conn)
            else:
                self.conn.rollback()
                remove_committed_files(self.conn, committed=False)
        finally:
            self.conn.close()
            self.conn = None
