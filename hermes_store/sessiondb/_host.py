"""What every theme mixin may use from the class that assembles them (facade.SessionDB).

The mixins hold Hermes' public methods, one theme per module; they never open
connections or transactions themselves. They call:

- ``self._read(fn)``: ``fn(conn)`` on a read connection (snapshot ended afterwards);
- ``self._write(fn, budget=...)``: ``fn(conn)`` in one write transaction, retried on
  lock/serialization failures; transcript files deleted only after commit;
- ``self._schedule(name, job)``: upkeep a write made due, run after it or on the
  store's upkeep thread (the dialect says which), never failing the caller;
- ``self._now()``: the clock (the facade module's ``time.time()`` at call time, so
  code that patches ``hermes_state.time`` moves our timestamps too); ``self._sleep(s)``
  the wait (the same module's ``time.sleep``; an async store's does not block its loop);
- ``self._dialect``, ``self.read_only``, ``self._engine``.

Repositories do the SQL; a mixin method is argument handling plus one repository call.
A workflow of several transactions is a function of ``hermes_store.operations``, which
a mixin runs over :class:`HostSteps`: each of its steps is one ``_write``/``_read`` of
this store, so budgets, retries, upkeep hooks and Hermes' semantics stay the store's.
"""

from __future__ import annotations

import time as _time
from collections.abc import Mapping
from typing import Optional, TYPE_CHECKING, Any, Callable, TypeVar, cast, overload

from ..engine import schema_of
from ..operations.steps import LONG_BUDGET_S, WRITE_BUDGET_S
from ..patch_points import facade_value

T = TypeVar("T")
R = TypeVar("R", bound=Mapping[str, Any])

#: Retry budget for ordinary writes and for transcript writes (seconds): the
#: operations layer's, so a workflow's steps and the store's own writes agree.
TRANSCRIPT_BUDGET_S = LONG_BUDGET_S

__all__ = [
    "TRANSCRIPT_BUDGET_S", "WRITE_BUDGET_S", "Host", "HostSteps", "as_dict", "as_dicts", "transcript_budget",
]


def transcript_budget() -> float:
    """Retry budget of a transcript write (appends, batches, session-row creation):
    Hermes v26's ``_TRANSCRIPT_WRITE_PATIENCE_S`` and our ``TRANSCRIPT_BUDGET_S``, as the
    facade holds them now (applications and tests lower either), whichever is shorter."""
    return min(float(facade_value("TRANSCRIPT_BUDGET_S", TRANSCRIPT_BUDGET_S)),
               float(facade_value("_TRANSCRIPT_WRITE_PATIENCE_S", TRANSCRIPT_BUDGET_S)))


@overload
def as_dict(record: None) -> None: ...
@overload
def as_dict(record: Mapping[str, Any]) -> dict[str, Any]: ...
@overload
def as_dict(record: Mapping[str, Any] | None) -> dict[str, Any] | None: ...
def as_dict(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A repository record (a TypedDict) as Hermes' signature names it, ``Dict[str, Any]``.

    A TypedDict is a plain dict at run time, but mypy keeps it apart from
    ``dict[str, Any]`` (its keys are fixed); this says so in one place, with no copy."""
    return cast("dict[str, Any] | None", record)


def as_dicts(records: list[R]) -> list[dict[str, Any]]:
    """A list of repository records as Hermes' ``List[Dict[str, Any]]`` (see :func:`as_dict`)."""
    return cast("list[dict[str, Any]]", records)


def _clock() -> Any:
    """The ``time`` module the facade names now (``hermes_state.time`` after the swap):
    code that patches it to skip waits skips the workflows' pauses too."""
    return facade_value("time", _time)


if TYPE_CHECKING:
    import sqlite3
    import threading

    from sqlalchemy import Connection, Engine

    from ..dialects import Dialect

    class Host:
        read_only: bool
        _engine: Engine
        _dialect: Dialect
        _lock: threading.RLock
        _open_args: tuple[Any, ...]

        @property
        def _conn(self) -> sqlite3.Connection: ...
        def _open(self, db_path: Any, read_only: bool, url: Any, engine: Any, schema: Optional[str] = None) -> None: ...
        def close(self) -> None: ...
        def search_sessions(self, source: Optional[str] = None, limit: int = 20, offset: int = 0,
                            workspace_key: Optional[str] = None) -> list[dict[str, Any]]: ...
        def _insert_message_rows(self, conn: Connection, session_id: str, messages: list[dict[str, Any]]
                                 ) -> tuple[int, int]: ...

        def _read(self, fn: Callable[[Connection], T]) -> T: ...
        def _write(self, fn: Callable[[Connection], T], *, budget: float | None = ..., _maintenance: bool = ...,
                   one_statement: bool = ..., combine: bool = ...) -> T: ...
        def _outside(self, fn: Callable[[Engine], T], *, budget: float | None = ...) -> T: ...
        def _schedule(self, name: str, job: Callable[[], Any]) -> None: ...
        def _now(self) -> float: ...
        def _sleep(self, seconds: float) -> None: ...
        def _label(self) -> str: ...
        def _open_engine(self) -> Engine: ...
        def vacuum(self) -> Any: ...
else:
    class Host:
        """Typing stand-in: the real methods come from facade.SessionDB."""


class HostSteps:
    """:class:`hermes_store.operations.Steps` over a SessionDB's own plumbing.

    ``write`` is the store's ``_write`` (its kept connections, lock retries with jitter,
    ``lock_timeout`` on a server, FTS-corruption rebuild, upkeep counter), ``read`` its
    ``_read``; ``maintenance=True`` marks every write as upkeep, as Hermes' index
    maintenance is (no periodic upkeep counted, no rebuild-and-retry). Pauses and clocks
    are the facade's ``time`` looked up at call time, as before the move.
    """

    def __init__(self, host: Host, *, maintenance: bool = False) -> None:
        self._host = host
        self._maintenance = maintenance

    @property
    def engine(self) -> Engine:
        return self._host._open_engine()

    @property
    def schema(self) -> str | None:
        return schema_of(self.engine)

    def write(self, fn: Callable[[Connection], T], *, budget: Optional[float] = None) -> T:
        return self._host._write(fn, budget=budget, _maintenance=self._maintenance)

    def read(self, fn: Callable[[Connection], T]) -> T:
        return self._host._read(fn)

    def outside(self, fn: Callable[[Engine], T]) -> T:
        """``fn(engine)`` outside a transaction, a held lock retried within the store's
        write budget (its ``_outside``): a closed store says so, a read-only one refuses."""
        return self._host._outside(fn)

    def sleep(self, seconds: float) -> None:
        """The store's own wait (the facade's ``time.sleep``; ``asyncio.sleep`` on an async store)."""
        self._host._sleep(seconds)

    def monotonic(self) -> float:
        return _clock().monotonic()

    def now(self) -> float:
        return self._host._now()
