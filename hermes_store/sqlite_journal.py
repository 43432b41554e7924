"""Facts about the linked SQLite's journal that the core and the Hermes layer share.

The core's own connections choose their journal mode in :mod:`hermes_store.dialects.sqlite`
(``enable_wal``); Hermes v26's rules for a connection a host hands us, which read
``config.yaml`` and names Hermes' tests patch on ``hermes_state``, stay in the Hermes
layer (:mod:`hermes_store.journal`). What both need sits here, below both: the set of
labels already warned about a WAL fallback (one warning per label per process, whichever
path fell back) and the WAL-reset version check, a fact about the SQLite build.
"""

from __future__ import annotations

import sqlite3

#: Labels already warned about a WAL fallback (one warning per label per process), shared
#: by our connections and Hermes' ``apply_wal_with_fallback``.
WAL_FALLBACK_WARNED: set[str] = set()


def is_sqlite_wal_reset_vulnerable(version_info: tuple[int, ...] | None = None) -> bool:
    """Whether this SQLite (or ``version_info``) has the WAL-reset corruption bug.

    A checkpoint racing writers of other processes can corrupt the file. Versions before
    3.7.0 have no WAL; 3.51.3+, 3.50.7-3.50.x and 3.44.6-3.44.x carry the fix.
    """
    raw = tuple(sqlite3.sqlite_version_info if version_info is None else version_info)
    version = tuple(int(p) for p in (*raw, 0, 0, 0)[:3])
    if version < (3, 7, 0) or version >= (3, 51, 3):
        return False
    if (3, 50, 7) <= version < (3, 51, 0) or (3, 44, 6) <= version < (3, 45, 0):
        return False
    return True


def sqlite_source_id() -> str:
    """``sqlite_source_id()`` of the linked library; ``''`` when it cannot be asked."""
    try:
        conn = sqlite3.connect(":memory:")
        try:
            row = conn.execute("SELECT sqlite_source_id()").fetchone()
        finally:
            conn.close()
        return str(row[0]) if row and row[0] is not None else ""
    except Exception:
        return ""
