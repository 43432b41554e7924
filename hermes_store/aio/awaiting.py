"""Coroutine methods that keep the sync method's signature, for type checkers too.

``name = awaited(SyncClass.name)`` in a class body makes ``await obj.name(...)`` run
``obj._call("name", args, kwargs)``, and types it as the sync method does, with the
result awaited: a host's ``mypy --strict`` reports a misspelt method, an unknown
keyword or a wrong argument type in async code as it does in sync code. Each wrapper
also keeps the sync method's ``inspect.signature`` and docstring (``functools.wraps``).

Three spellings, for what the sync method is; they differ only in their types:

- :func:`awaited`: a method; ``await`` gives what it returns;
- :func:`awaited_list`: a method returning an iterator; ``await`` gives a list (the
  caller collects it while the connection is still its own);
- :func:`awaited_static`: a staticmethod; the coroutine is still called on the instance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Caller(Protocol):
    """What a class holding awaited methods provides: the call of a sync method by name."""

    async def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...


def _coroutine(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    name = fn.__name__

    @functools.wraps(fn)
    async def method(self: Caller, /, *args: Any, **kwargs: Any) -> Any:
        return await self._call(name, args, kwargs)

    return method


def awaited(fn: Callable[Concatenate[Any, P], T]) -> Callable[Concatenate[Caller, P], Coroutine[Any, Any, T]]:
    """The coroutine method of sync method ``fn`` (see the module docstring)."""
    return _coroutine(fn)


def awaited_list(
    fn: Callable[Concatenate[Any, P], Iterator[T]],
) -> Callable[Concatenate[Caller, P], Coroutine[Any, Any, list[T]]]:
    """The coroutine method of sync generator method ``fn``: awaited, the items as a list."""
    return _coroutine(fn)


def awaited_static(fn: Callable[P, T]) -> Callable[Concatenate[Caller, P], Coroutine[Any, Any, T]]:
    """The coroutine method of sync staticmethod ``fn`` (taken from the class: a plain function)."""
    return _coroutine(fn)


__all__ = ["Caller", "awaited", "awaited_list", "awaited_static"]
