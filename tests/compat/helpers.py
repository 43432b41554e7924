"""Helpers shared by the compat modules (fixtures are in conftest.py)."""

from __future__ import annotations

import time as real_time
from typing import Any


class FakeTime:
    """Stands in for ``hermes_state.time``: a settable ``time()``, the rest real."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(real_time, name)


def other_store(hermes_state: Any, db: Any) -> Any:
    """A second SessionDB on the same database (another process, as far as locking goes)."""
    return hermes_state.SessionDB(db.db_path if db.db_path is not None else db.url)
