"""Coroutine methods that keep the sync method's signature, for type checkers too.

``name = awaited(SYNC.name)`` in a class body, with ``SYNC = methods_of(SyncClass)``,
makes ``await obj.name(...)`` run ``obj._call("name", args, kwargs)``, typed as the
sync method with its result awaited: a host's ``mypy --strict`` reports a misspelt
method, an unknown keyword or a wrong argument type in async code as it does in sync
code. Each coroutine also keeps the sync method's ``inspect.signature`` and docstring
(``functools.wraps``).

:func:`methods_of` is what lets one line borrow a signature: typed as an instance of
the sync class, its attributes are the methods *bound* (no ``self``, which a ParamSpec
could not strip from a method that also takes ``**kwargs``); at run time they are the
class's functions. :func:`awaited_list` is for a method returning an iterator: awaited,
it gives a list (collected while the connection is still the caller's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")


class Caller(Protocol):
    """What a class holding awaited methods provides: the call of a sync method by name."""

    async def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...


class _Functions:
    def __init__(self, cls: type) -> None:
        self._cls = cls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cls, name)


def methods_of(cls: type[S]) -> S:
    """``cls``'s functions as attributes (``methods_of(C).f is C.f``), typed as an instance
    of ``cls`` so that a type checker sees each method bound (see the module docstring)."""
    return cast(S, _Functions(cls))


def _coroutine(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    name = fn.__name__

    @functools.wraps(fn)
    async def method(self: Caller, /, *args: Any, **kwargs: Any) -> Any:
        return await self._call(name, args, kwargs)

    return method


def awaited(fn: Callable[P, T]) -> Callable[Concatenate[Caller, P], Coroutine[Any, Any, T]]:
    """The coroutine method of sync method ``fn`` (a method or staticmethod, read off
    :func:`methods_of`): awaited, it gives what ``fn`` returns."""
    return _coroutine(fn)


def awaited_list(fn: Callable[P, Iterator[T]]) -> Callable[Concatenate[Caller, P], Coroutine[Any, Any, list[T]]]:
    """The coroutine method of sync generator method ``fn``: awaited, the items as a list."""
    return _coroutine(fn)


__all__ = ["Caller", "awaited", "awaited_list", "methods_of"]
