"""Helpers shared by the compat modules (fixtures are in conftest.py)."""

from __future__ import annotations

import sqlite3
import time as real_time
from pathlib import Path
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


def break_schema(path: Path) -> None:
    """A duplicate index entry in sqlite_master: SQLite then reports 'malformed database schema'."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        name, tbl, sql = conn.execute(
            "SELECT name, tbl_name, sql FROM sqlite_master WHERE type='index' AND sql IS NOT NULL LIMIT 1"
        ).fetchone()
        conn.execute("PRAGMA writable_schema=ON")
        conn.execute(
            "INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) VALUES ('index', ?, ?, 0, ?)",
            (name, tbl, sql),
        )
        conn.execute("PRAGMA writable_schema=OFF")
    finally:
        conn.close()
