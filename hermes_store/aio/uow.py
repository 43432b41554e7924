"""``async with AsyncUnitOfWork(engine) as uow``: one transaction, every repository awaited.

The sync :class:`hermes_store.uow.UnitOfWork` does the work (its BEGIN flavour, tenant
options and transcript-file bookkeeping), driven on the loop's greenlet over the
AsyncEngine's sync face. A cancelled task still rolls back and gives its connection
back: the ending is shielded from a second cancellation.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from .. import errors
from ..targets import refuse_sync
from ..uow import UnitOfWork
from . import repositories as arepos
from .engine import run_sync

#: (attribute, async repository class) of what a unit of work offers.
_REPOSITORIES = (
    ("sessions", arepos.SessionRepository),
    ("messages", arepos.MessageRepository),
    ("lineage", arepos.LineageRepository),
    ("search", arepos.SearchRepository),
    ("maintenance", arepos.MaintenanceRepository),
    ("listing", arepos.ListingRepository),
    ("usage", arepos.UsageRepository),
    ("compression", arepos.CompressionRepository),
    ("housekeeping", arepos.HousekeepingRepository),
    ("gateway", arepos.GatewayRepository),
)


class AsyncUnitOfWork:
    """Opens a connection and transaction; commits on success, rolls back on error."""

    sessions: Any
    messages: Any
    lineage: Any
    search: Any
    maintenance: Any
    listing: Any
    usage: Any
    compression: Any
    housekeeping: Any
    gateway: Any

    def __init__(self, engine: AsyncEngine, *, write: bool = True, schema: str | None = None) -> None:
        refuse_sync(engine, "AsyncUnitOfWork")
        if not isinstance(engine, AsyncEngine):
            raise errors.InvalidInputError(
                f"aio.AsyncUnitOfWork takes an AsyncEngine (aio.create_async_engine(url)), not {type(engine).__name__}"
            )
        self._uow = UnitOfWork(engine.sync_engine, write=write, schema=schema)
        self.engine = engine
        self.schema = self._uow.schema

    async def __aenter__(self) -> "AsyncUnitOfWork":
        await run_sync(self._uow.__enter__)
        for name, face in _REPOSITORIES:
            setattr(self, name, face.bound_to(getattr(self._uow, name)))
        return self

    async def commit(self) -> None:
        """Make everything so far durable and start a new transaction for what follows."""
        await run_sync(self._uow.commit)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._uow.conn is None:
            return
        ending = asyncio.ensure_future(run_sync(self._uow.__exit__, exc_type, exc, tb))
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            await asyncio.wait([ending])  # cancelled again: the rollback still finishes first
            raise


__all__ = ["AsyncUnitOfWork"]
