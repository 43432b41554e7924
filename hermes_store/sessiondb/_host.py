"""What every theme mixin may use from the class that assembles them (facade.SessionDB).

The mixins hold Hermes' public methods, one theme per module; they never open
connections or transactions themselves. They call:

- ``self._read(fn)``: ``fn(conn)`` on a read connection (snapshot ended afterwards);
- ``self._write(fn, budget=...)``: ``fn(conn)`` in one write transaction, retried on
  lock/serialization failures; transcript files deleted only after commit;
- ``self._schedule(name, job)``: upkeep a write made due, run after it or on the
  store's upkeep thread (the dialect says which), never failing the caller;
- ``self._now()``: the clock (the facade module's ``time.time()`` at call time, so
  code that patches ``hermes_state.time`` moves our timestamps too);
- ``self._dialect``, ``self.read_only``, ``self._engine``.

Repositories do the SQL; a mixin method is argument handling plus one repository call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

T = TypeVar("T")

#: Retry budget for ordinary writes and for transcript writes (seconds).
WRITE_BUDGET_S = 20.0
TRANSCRIPT_BUDGET_S = 60.0

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

    from ..dialects import Dialect

    class Host:
        read_only: bool
        _engine: Engine
        _dialect: Dialect

        def _read(self, fn: Callable[[Connection], T]) -> T: ...
        def _write(self, fn: Callable[[Connection], T], *, budget: float = ..., _maintenance: bool = ...,
                   one_statement: bool = ...) -> T: ...
        def _schedule(self, name: str, job: Callable[[], Any]) -> None: ...
        def _now(self) -> float: ...
        def _open_engine(self) -> Engine: ...
        def get_meta(self, key: str) -> str | None: ...
        def vacuum(self) -> Any: ...
        def index_search(self) -> int: ...
        def _index_search_after_commit(self) -> int: ...
else:
    class Host:
        """Typing stand-in: the real methods come from facade.SessionDB."""
