"""The one write-retry runner: a try that met a held lock is tried again with jitter
within a budget, then gives up typed.

Every retrying caller runs on :func:`run`: the facade's writes (``SessionDB._write``),
its open path (``SessionDB._open_patiently``), maintenance outside a transaction, and
the steps of :mod:`hermes_store.operations`. What differs between them is said by
arguments, never by another loop:

- ``triage(exc)``: what a failed try means (:data:`AGAIN` at once, :data:`WAIT` for a
  held lock, :class:`Busy` for a short transient wait, :data:`RAISE`). :func:`locks`
  builds the usual one from the dialect's ``is_retryable``;
- ``give_up(exc, waited)``: the typed error past the budget (default
  :func:`locked_error`: ``DatabaseLockedError`` chained from the driver's error);
- ``sleep`` / ``monotonic``: the clock, injected (a test records, an async store
  yields to its loop, the facade reads ``hermes_state.time`` at call time);
- the jitter windows (:func:`jitter`), passed by a caller that keeps its own knobs.

This module is the only place that sleeps between two tries of a write. It sits at the
bottom of the package: it imports only :mod:`errors` and :mod:`keys`.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from sqlalchemy.exc import DBAPIError

from . import errors
from .keys import EARLY_JITTER_S, EARLY_PHASE_S, LATE_JITTER_S

T = TypeVar("T")

#: What a held lock arrives as: the driver's error (wrapped or not), or already typed
#: by the engine for a statement outside a transaction.
LOCK_ERRORS = (DBAPIError, sqlite3.DatabaseError, errors.DatabaseLockedError)

#: Try again at once, without waiting and without counting against the budget
#: (a kept connection the server had dropped, a search index just rebuilt).
AGAIN: Final = "again"
#: A held lock: wait with jitter and try again until the budget is spent, then give up typed.
WAIT: Final = "wait"
#: Not a retry case: the error propagates as it is.
RAISE: Final = "raise"


@dataclass(frozen=True)
class Busy:
    """A transient state worth a short wait (a compression finishing): tried again with
    jitter for at most ``seconds`` after the first try (and never past the budget),
    then the error itself propagates."""

    seconds: float


Verdict = str | Busy
Triage = Callable[[BaseException], Verdict]
#: ``give_up(exc, waited)``: the error raised (chained from ``exc``) once the budget is spent.
GiveUp = Callable[[BaseException, float], BaseException]


def jitter(elapsed: float, left: float, *, early: tuple[float, float] | None = None,
           late: tuple[float, float] | None = None, phase: float | None = None) -> float:
    """Seconds to wait before the next try of a locked write, never past the budget:
    short sleeps for the first ``phase`` seconds, longer ones after (the defaults are
    :mod:`hermes_store.keys`'; the facade passes its own, which code may change)."""
    phase = EARLY_PHASE_S if phase is None else phase
    low, high = (EARLY_JITTER_S if early is None else early) if elapsed < phase else \
        (LATE_JITTER_S if late is None else late)
    return min(random.uniform(low, high), max(left, 0.0))


def driver_cause(exc: BaseException) -> BaseException:
    """The driver's own error behind ``exc`` (an engine-typed lock error keeps it as its cause)."""
    if isinstance(exc, errors.DatabaseLockedError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def locked_error(label: str | Callable[[], str], budget: float) -> GiveUp:
    """The usual give-up: ``DatabaseLockedError`` saying where (``label``, or a callable
    asked only then) and for how long, chained from the driver's error (also when the
    engine had typed it already)."""
    def give_up(exc: BaseException, _waited: float) -> BaseException:
        where = label if isinstance(label, str) else label()
        error = errors.DatabaseLockedError(f"{where}: database stayed locked for {budget:.3g}s; giving up")
        error.__cause__ = driver_cause(exc)
        return error

    return give_up


def locks(is_retryable: Callable[[BaseException], bool]) -> Triage:
    """The usual triage: a driver error the dialect calls retryable (a held lock, a
    serialization failure or deadlock on a server) waits, anything else is raised."""
    def triage(exc: BaseException) -> Verdict:
        return WAIT if isinstance(exc, LOCK_ERRORS) and is_retryable(exc) else RAISE

    return triage


def run(
    attempt: Callable[[float], T],
    *,
    budget: float,
    triage: Triage,
    give_up: GiveUp,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    before_wait: Callable[[BaseException], None] | None = None,
    early: tuple[float, float] | None = None,
    late: tuple[float, float] | None = None,
    phase: float | None = None,
) -> T:
    """``attempt(deadline)`` (``deadline`` a ``monotonic()`` value) until it returns.

    After a failed try ``triage`` decides: :data:`AGAIN` tries at once, :data:`WAIT`
    sleeps a :func:`jitter` and tries again until ``budget`` seconds have passed, then
    raises ``give_up(exc, waited)``; a :class:`Busy` waits the same way within its own
    shorter limit, then raises the error itself; :data:`RAISE` raises it.
    ``before_wait(exc)`` runs before each sleep (drop what the try left open, log).
    """
    start = monotonic()
    deadline = start + budget
    while True:
        try:
            return attempt(deadline)
        except Exception as exc:
            verdict = triage(exc)
            if verdict == AGAIN:
                continue
            if verdict == RAISE:
                raise
            now = monotonic()
            if isinstance(verdict, Busy):
                limit = min(deadline, start + verdict.seconds)
                if now >= limit:
                    raise
            else:
                limit = deadline
                if now >= limit:
                    error = give_up(exc, now - start)
                    raise error from error.__cause__
            if before_wait is not None:
                before_wait(exc)
            sleep(jitter(now - start, limit - now, early=early, late=late, phase=phase))


__all__ = [
    "AGAIN",
    "LOCK_ERRORS",
    "RAISE",
    "WAIT",
    "Busy",
    "GiveUp",
    "Triage",
    "Verdict",
    "driver_cause",
    "jitter",
    "locked_error",
    "locks",
    "run",
]
