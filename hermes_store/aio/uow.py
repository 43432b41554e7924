"""``async with AsyncUnitOfWork(engine) as uow``: one transaction, every repository awaited.

The sync :class:`hermes_store.uow.UnitOfWork` does the work (its BEGIN flavour, tenant
options and transcript-file bookkeeping), driven on the loop's greenlet over the
AsyncEngine's sync face. A cancelled task still rolls back and gives its connection
back: the ending is shielded from a second cancellation.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TypeVar
from collections.abc import Callable

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from .. import errors
from ..dialects import for_connection
from ..keys import WRITE_BUDGET_S
from ..repositories import UNIT_OF_WORK
from ..repositories.base import Clock
from ..targets import refuse_sync
from ..uow import UnitOfWork
from . import repositories as arepos
from .engine import run_interruptible, run_sync
from .queues import TaskQueue, writer_queue

T = TypeVar("T")

#: (attribute, async repository class) of what a unit of work offers: the sync registry's.
_REPOSITORIES = tuple((name, arepos.async_of(sync)) for name, sync in UNIT_OF_WORK.items())


class AsyncUnitOfWork(arepos.AsyncRepositories):
    """Opens a connection and transaction; commits on success, rolls back on error.

    Its repositories are the async faces of :data:`hermes_store.repositories.UNIT_OF_WORK`'s,
    bound from that registry on entry; :class:`~.repositories.AsyncRepositories` (generated
    from the same registry) names them for a type checker, so ``await uow.sessions.get(...)``
    is checked as the sync call."""

    def __init__(self, engine: AsyncEngine, *, write: bool = True, schema: str | None = None,
                 clock: Clock | None = None) -> None:
        """As :class:`~hermes_store.uow.UnitOfWork` (``clock``: what rows are stamped with)."""
        refuse_sync(engine, "AsyncUnitOfWork")
        if not isinstance(engine, AsyncEngine):
            raise errors.InvalidInputError(
                f"aio.AsyncUnitOfWork takes an AsyncEngine (aio.create_async_engine(url)), not {type(engine).__name__}"
            )
        self._uow = UnitOfWork(engine.sync_engine, write=write, schema=schema, clock=clock)
        self.engine = engine
        self.schema = self._uow.schema
        # A writer waits its turn in this loop where the database takes one writer at a
        # time and is a file of this machine (the queue is per file).
        dialect = for_connection(engine.sync_engine)
        database = dialect.database_path(engine.url)
        serial = write and dialect.one_writer_at_a_time and database is not None
        self._queue_key = database if serial else None
        self._queue: TaskQueue | None = None
        self._owner: asyncio.Task[object] | None = None

    async def __aenter__(self) -> AsyncUnitOfWork:
        if self._queue_key is not None:
            # One writer of this loop at a time per file (see hermes_store.aio.queues).
            queue = writer_queue(self._queue_key)
            await queue.acquire(WRITE_BUDGET_S)
            self._queue, self._owner = queue, asyncio.current_task()
        try:
            await run_sync(self._uow.__enter__)
        except BaseException:
            self._release()
            raise
        assert self._uow.conn is not None
        self._interrupt = for_connection(self._uow.conn).interrupter(self._uow.conn)
        for name, face in _REPOSITORIES:
            setattr(self, name, face.bound_to(getattr(self._uow, name), self._interrupt))
        return self

    def _release(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.release(self._owner)

    async def run_sync(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` on this unit of work's connection, inside its transaction
        (for statements of the host's own; as ``AsyncConnection.run_sync``)."""
        if self._uow.conn is None:
            raise errors.HermesStoreError("AsyncUnitOfWork.run_sync() called outside its 'async with' block")
        conn = self._uow.conn
        return await run_interruptible(self._interrupt, fn, conn)

    async def commit(self) -> None:
        """Make everything so far durable and start a new transaction for what follows."""
        await run_sync(self._uow.commit)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._uow.conn is None:
            self._release()
            return
        ending = asyncio.ensure_future(run_sync(self._uow.__exit__, exc_type, exc, tb))
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            await asyncio.wait([ending])  # cancelled again: the rollback still finishes first
            raise
        finally:
            if ending.done():
                self._release()
            else:
                ending.add_done_callback(lambda _f: self._release())


__all__ = ["AsyncUnitOfWork"]
