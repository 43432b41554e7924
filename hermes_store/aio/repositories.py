"""Async faces of the repositories: the same methods, arguments and results, awaited.

One query layer: each method runs the sync repository's own code on the event loop's
greenlet (SQLAlchemy's ``run_sync``), where every statement awaits the async driver.
Nothing here builds SQL or decodes rows, so the two APIs cannot drift apart.

On a host's ``AsyncSession`` or ``AsyncConnection`` they never commit, like the sync
ones: ``await aio.MessageRepository(session).append(...)`` joins the host's transaction.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, ClassVar
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from .. import errors, repositories
from ..targets import refuse_sync
from .engine import run_interruptible


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


def _coroutine(name: str, sync_method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(sync_method)
    async def method(self: AsyncRepository, *args: Any, **kwargs: Any) -> Any:
        return await self._call(name, args, kwargs)

    return method


def async_repository(sync_class: type) -> type[AsyncRepository]:
    """An :class:`AsyncRepository` class with a coroutine for each public method of ``sync_class``."""
    namespace: dict[str, Any] = {
        "sync_class": sync_class,
        "__doc__": f"Async :class:`hermes_store.repositories.{sync_class.__name__}`: every method awaited.",
        "__module__": __name__,
        "__qualname__": sync_class.__name__,
    }
    for name, member in inspect.getmembers(sync_class, inspect.isfunction):
        if not name.startswith("_"):
            namespace[name] = _coroutine(name, member)
    return type(sync_class.__name__, (AsyncRepository,), namespace)


#: The async face of every repository of :data:`hermes_store.repositories.REPOSITORIES`,
#: by class name, each also a name of this module (``aio.SessionRepository``...).
ASYNC_REPOSITORIES: dict[str, type[AsyncRepository]] = {
    sync.__name__: async_repository(sync) for sync in repositories.REPOSITORIES
}
globals().update(ASYNC_REPOSITORIES)


def async_of(sync_class: type) -> type[AsyncRepository]:
    """The async face of a repository class of the registry."""
    return ASYNC_REPOSITORIES[sync_class.__name__]


def __getattr__(name: str) -> type[AsyncRepository]:
    """Only reached for a name the registry did not add (AttributeError); it also tells a
    type checker what the registry's names above are: async repository classes."""
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ASYNC_REPOSITORIES", "AsyncRepository", "async_of", "async_repository"]
__all__ += list(ASYNC_REPOSITORIES)  # the async repository classes, by name
