"""The short-CJK index's chunked catch-up: rows written since (by us or by Hermes)
indexed a bounded transaction at a time.

One process at a time does it (an upkeep lock each transaction tries, and skips when
held). On a server, where writers run side by side, each transaction covers at most
BACKGROUND_CATCH_UP_ROWS rows, since it holds the index's upkeep lock; the next
starts right after it. Rows not covered yet are still found, by a direct scan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.exc import OperationalError

from .. import errors
from ..dialects import for_connection
from ..repositories import MaintenanceRepository
from .steps import LONG_BUDGET_S, Steps

log = logging.getLogger(__name__)

#: Rows one catch-up call indexes at most (SessionDB's, at open and every checkpoint).
CATCH_UP_ROWS = 20_000
#: Rows one catch-up transaction indexes where upkeep runs beside other writers.
BACKGROUND_CATCH_UP_ROWS = 2_000
#: Lock budget of one catch-up step: someone else writing means "later", not "wait".
CATCH_UP_BUDGET_S = 1.0


def index_search(steps: Steps) -> int:
    """Bring the short-CJK index fully up to date in one write; rows indexed."""
    return steps.write(lambda c: MaintenanceRepository(c).catch_up_search_index(), budget=LONG_BUDGET_S)


def catch_up_search_index(
    steps: Steps,
    limit: int | None = CATCH_UP_ROWS,
    *,
    step: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> int:
    """Index up to ``limit`` rows (None: all), ``step`` rows a transaction, until caught
    up, the limit, or ``should_stop()`` (a store closing); returns rows indexed.

    ``step`` None: ``limit`` where upkeep runs after the caller's write (SQLite), at most
    BACKGROUND_CATCH_UP_ROWS where it runs beside other writers (a server). Best effort,
    never raising: a busy or unavailable store ends it with what was done so far, any
    other failure is logged too.
    """
    try:
        if not steps.read(lambda c: MaintenanceRepository(c).search_index_behind()):
            return 0
        if step is None:
            step = limit
            if for_connection(steps.engine).upkeep_in_background:
                step = BACKGROUND_CATCH_UP_ROWS if limit is None else min(limit, BACKGROUND_CATCH_UP_ROWS)
    except (OperationalError, errors.DatabaseLockedError, errors.DatabaseUnavailableError):
        return 0  # best effort: runs after a committed write, which must not look failed
    done = 0
    try:
        while True:
            n = steps.write(lambda c: MaintenanceRepository(c).catch_up_search_index(step, single_owner=True),
                            budget=CATCH_UP_BUDGET_S)
            done += n
            if step is None or n < step or (limit is not None and done >= limit) \
                    or (should_stop is not None and should_stop()):
                return done
    except (errors.DatabaseLockedError, errors.DatabaseUnavailableError):
        return done  # someone else is writing (or the disk is full); the next interval will do it
    except Exception:
        log.warning("short-CJK index catch-up failed; retried later", exc_info=True)
        return done
