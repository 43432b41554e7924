"""What a workflow of several transactions runs its steps on.

A workflow (optimize-storage, an import in batches, auto-prune and vacuum, a chunked
backfill) is a plain function whose first argument is a :class:`Steps`: each
``steps.write(fn)`` / ``steps.read(fn)`` is one transaction of its own, so other
writers get the lock between two steps and a failure in one step leaves the steps
before it committed. Who runs the steps decides how:

- :class:`UnitOfWorkSteps` (here): one :class:`~hermes_store.uow.UnitOfWork` per step on
  an Engine (and tenant schema), a locked write retried within a budget by the package's
  one retry runner (:mod:`hermes_store.retry`);
- ``SessionDB`` passes an adapter over its own ``_write`` / ``_read`` (kept
  connections, Hermes' upkeep hooks), so its methods behave exactly as before;
- an async caller passes a runner whose ``sleep`` does not block its event loop.

A workflow never sleeps or reads a clock by itself: it asks ``steps.sleep``,
``steps.monotonic`` and ``steps.now``, which the runner supplies.
"""

from __future__ import annotations

import math
import time
from typing import Protocol, TypeVar, runtime_checkable
from collections.abc import Callable

from sqlalchemy import Connection, Engine

from .. import retry
from ..keys import EARLY_JITTER_S, EARLY_PHASE_S, LATE_JITTER_S, LONG_BUDGET_S, WRITE_BUDGET_S
from ..retry import jitter  # importable from here as before (sessiondb.private)
from ..dialects import for_connection
from ..dialects.base import LOCK_BUDGET_OPTION
from ..engine import schema_of
from ..repositories.base import Clock
from ..uow import UnitOfWork, _in_schema

T = TypeVar("T")



@runtime_checkable
class Steps(Protocol):
    """Runs a workflow's steps, each in its own transaction."""

    @property
    def engine(self) -> Engine:
        """The engine the steps run on (a closed store raises DatabaseUnavailableError)."""

    @property
    def schema(self) -> str | None:
        """The tenant schema the steps work in (None: the engine's default)."""

    def write(self, fn: Callable[[Connection], T], *, budget: float | None = None) -> T:
        """``fn(conn)`` in one write transaction, committed before this returns; a lock
        held elsewhere is waited out for ``budget`` seconds (None: the runner's default),
        then :class:`~hermes_store.errors.DatabaseLockedError`."""

    def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` in one read transaction."""

    def outside(self, fn: Callable[[Engine], T]) -> T:
        """``fn(engine)`` outside any transaction (VACUUM, checkpoints): the engine works
        in the runner's tenant schema. Counts as a write (a read-only store refuses): a
        held lock is retried within the write budget, then DatabaseLockedError."""

    def sleep(self, seconds: float) -> None:
        """The pause between two steps (an async runner does not block its loop)."""

    def monotonic(self) -> float:
        """The clock pauses are measured with."""

    def now(self) -> float:
        """Wall-clock time (seconds since the epoch) for stamps a workflow stores."""


def with_lock_budget(engine: Engine, seconds: float) -> Engine:
    """``engine`` whose connections carry ``seconds`` as their lock budget
    (:data:`~hermes_store.dialects.base.LOCK_BUDGET_OPTION`, in ms): a statement outside a
    transaction that can wait on a server's lock queue (VACUUM) waits no longer."""
    return engine.execution_options(**{LOCK_BUDGET_OPTION: max(1, math.ceil(seconds * 1000))})


class _StepUnitOfWork(UnitOfWork):
    """A write unit of work started the way SessionDB starts one: on a server the
    transaction waits for other writers' row locks for at most what is left of the
    budget (``lock_timeout``, via :meth:`Dialect.begin_write`), never forever."""

    def __init__(self, engine: Engine, schema: str | None, seconds: float, clock: Clock | None) -> None:
        super().__init__(engine, write=True, schema=schema, clock=clock)
        self._seconds = seconds

    def _begin(self, conn: Connection) -> None:
        dialect = for_connection(conn)
        conn.execution_options(**dialect.call_options(True))
        conn.begin()
        dialect.begin_write(conn, self._seconds)


class UnitOfWorkSteps:
    """The default runner: every step is one :class:`~hermes_store.uow.UnitOfWork` on
    ``engine`` (in tenant ``schema``), a locked write retried with random jitter
    within its budget as ``SessionDB`` does.

    ``sleep``, ``monotonic`` and ``now`` may be given (or assigned later): an async
    caller substitutes a sleep that yields to its event loop, a test one that records.
    A ``now`` of its own is also the clock the steps' repositories stamp rows with
    (else the engine's, see :func:`hermes_store.repositories.base.clock_of`).
    """

    def __init__(
        self,
        engine: Engine,
        schema: str | None = None,
        *,
        sleep: Callable[[float], None] | None = None,
        monotonic: Callable[[], float] | None = None,
        now: Callable[[], float] | None = None,
    ) -> None:
        # Checked here, once: a bad name or a schema on SQLite fails before any step.
        probe = UnitOfWork(engine, write=False, schema=schema)
        self.engine = engine
        self.schema = probe.schema
        # Outside a transaction (VACUUM) the tenant is the engine's connections' own.
        tenant = self.schema if schema_of(engine) is None else None
        self._outside = engine if tenant is None else _in_schema(engine, tenant)
        self.sleep: Callable[[float], None] = sleep if sleep is not None else time.sleep
        self.monotonic: Callable[[], float] = monotonic if monotonic is not None else time.monotonic
        self.now: Callable[[], float] = now if now is not None else time.time

    def _label(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def _clock(self) -> Clock | None:
        """The clock handed to each step's unit of work: ``now`` when one was given."""
        return None if self.now is time.time else self.now

    def write(self, fn: Callable[[Connection], T], *, budget: float | None = None) -> T:
        def attempt(deadline: float) -> T:
            # BEGIN IMMEDIATE reports a held lock as the driver's own error; a server
            # reports lock timeouts, serialization failures and deadlocks.
            with _StepUnitOfWork(self.engine, self.schema, deadline - self.monotonic(), self._clock()) as uow:
                assert uow.conn is not None
                return fn(uow.conn)

        return self._retry(attempt, WRITE_BUDGET_S if budget is None else budget)

    def _retry(self, attempt: Callable[[float], T], budget: float) -> T:
        """The package's one retry runner (:func:`hermes_store.retry.run`) with this runner's clock."""
        return retry.run(attempt, budget=budget, triage=retry.locks(for_connection(self.engine).is_retryable),
                         give_up=retry.locked_error(self._label(), budget), sleep=self.sleep,
                         monotonic=self.monotonic)

    def read(self, fn: Callable[[Connection], T]) -> T:
        with UnitOfWork(self.engine, write=False, schema=self.schema, clock=self._clock()) as uow:
            assert uow.conn is not None
            return fn(uow.conn)

    def outside(self, fn: Callable[[Engine], T]) -> T:
        """A held lock is waited out within :data:`WRITE_BUDGET_S` (read now), as a write's."""
        return self._retry(lambda deadline: fn(with_lock_budget(self._outside, deadline - self.monotonic())),
                           WRITE_BUDGET_S)


__all__ = [
    "EARLY_JITTER_S",
    "EARLY_PHASE_S",
    "LATE_JITTER_S",
    "LONG_BUDGET_S",
    "WRITE_BUDGET_S",
    "Steps",
    "UnitOfWorkSteps",
    "jitter",
    "with_lock_budget",
]
