"""The base of the async repositories: how an awaited method runs the sync one.

One query layer: each method runs the sync repository's own code on the event loop's
greenlet (SQLAlchemy's ``run_sync``), where every statement awaits the async driver.
Nothing here builds SQL or decodes rows, so the two APIs cannot drift apart. The
classes themselves, one per sync repository, are generated in
:mod:`hermes_store.aio.repositories` (typed like the sync ones, see :mod:`.awaiting`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from ... import errors
from ...targets import refuse_sync
from ..engine import run_interruptible


def _invoke(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = method(*args, **kwargs)
    # A generator would run its queries after we left the greenlet: collect it here.
    return list(result) if inspect.isgenerator(result) else result


class AsyncRepository:
    """Base of the async repositories (see the module docstring)."""

    sync_class: ClassVar[type]
    #: Set by :meth:`bound_to` (a face on a unit of work's connection), read only then.
    _interrupt: Callable[[], bool]

    def __init__(self, executor: AsyncSession | AsyncConnection) -> None:
        refuse_sync(executor, type(self).__name__)
        if not isinstance(executor, (AsyncSession, AsyncConnection)):
            raise errors.InvalidInputError(
                f"aio.{type(self).__name__} takes an AsyncSession or AsyncConnection, not {type(executor).__name__}"
            )
        self._executor: AsyncSession | AsyncConnection | None = executor
        self._bound: Any = None

    @classmethod
    def bound_to(cls, sync_repository: Any, interrupt: Callable[[], bool]) -> AsyncRepository:
        """The async face of a sync repository on a connection driven by this loop's
        greenlets (an :class:`AsyncUnitOfWork`'s); ``interrupt`` stops its statement
        when the caller is cancelled (see :func:`~hermes_store.aio.engine.run_interruptible`)."""
        face = cls.__new__(cls)
        face._executor = None
        face._bound = sync_repository
        face._interrupt = interrupt
        return face

    async def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._bound is not None:
            return await run_interruptible(self._interrupt, _invoke, getattr(self._bound, name), args, kwargs)
        assert self._executor is not None
        return await self._executor.run_sync(
            lambda sync: _invoke(getattr(self.sync_class(sync), name), args, kwargs)
        )


__all__ = ["AsyncRepository"]
