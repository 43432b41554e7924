"""Hermes v26's journal-mode and PRAGMA rules for a ``sqlite3`` connection.

Hermes v26 stopped enabling WAL on SQLite builds with the WAL-reset bug (a checkpoint
racing writers of other processes can corrupt the file: fixed in 3.51.3 and the
3.50.7 / 3.44.6 backports). These functions are Hermes' module-level names, for code
that hands us its own connection. Names Hermes' tests patch on ``hermes_state``
(``is_sqlite_wal_reset_vulnerable``, ``resolve_journal_mode``) are looked up on the
facade module at call time, so a patch there steers these functions too: that lookup
(:mod:`hermes_store.patch_points`) and ``config.yaml`` make this module part of the Hermes
layer. What the core shares with it (the warned-labels set, the version check) is
:mod:`hermes_store.sqlite_journal`, below both.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import time
from typing import Any

from . import errors
from .dialects.sqlite import WAL_SIZE_LIMIT_BYTES
from .hermes_config import config_section
from .patch_points import facade_value
from .sqlite_journal import WAL_FALLBACK_WARNED, is_sqlite_wal_reset_vulnerable, sqlite_source_id

log = logging.getLogger("hermes_store.facade")

#: Error texts meaning "this filesystem cannot do WAL's shared-memory locking" (v26: disk I/O is back).
_WAL_INCOMPAT_MARKERS = ("locking protocol", "not authorized", "disk i/o error")
#: ``journal_size_limit`` on a WAL connection (64 MiB): the one our own connections carry.
_WAL_SIZE_LIMIT_BYTES = WAL_SIZE_LIMIT_BYTES
#: Labels already warned about (one warning per label per process and cause); the WAL
#: fallback's set is shared with our own connections (``dialects.sqlite.enable_wal``).
_wal_fallback_warned_paths = WAL_FALLBACK_WARNED
#: Hermes' name: the WAL-reset warning's labels. Tests clear it (the warning fires again)
#: or replace ``hermes_state._wal_reset_bug_warned_paths``: read on the facade at call time.
_wal_reset_bug_warned_paths: set[str] = set()
_wal_reset_warned_labels = _wal_reset_bug_warned_paths  # our earlier name, the same set
_wal_refused_warned_labels: set[str] = set()
#: ``database.<key>`` settings applied as PRAGMAs (``apply_database_pragmas``).
_PRAGMA_KEYS = ("cache_size", "mmap_size", "temp_store", "wal_autocheckpoint", "journal_size_limit")
_EIO_READS = 4
_EIO_PAUSE_S = 0.05
_DISK_IO = "disk i/o error"


def resolve_journal_mode() -> str:
    """``database.journal_mode`` of config.yaml: ``"wal"`` or ``"delete"`` (anything else: ``"wal"``)."""
    try:
        section = config_section("database")
        value = section.get("journal_mode") if section else None
        mode = str(value).strip().lower() if isinstance(value, str) else ""
    except Exception:
        return "wal"
    return mode if mode in ("wal", "delete") else "wal"


def _on_disk_journal_mode(conn: sqlite3.Connection) -> str | None:
    """The file's journal mode now, lowercased; None when it cannot be read.

    A disk I/O error (often a transient lock on network filesystems) is read again,
    up to four times 50 ms apart.
    """
    for attempt in range(_EIO_READS):
        try:
            row = conn.execute("PRAGMA journal_mode").fetchone()
        except sqlite3.OperationalError as exc:
            if _DISK_IO in str(exc).lower() and attempt + 1 < _EIO_READS:
                time.sleep(_EIO_PAUSE_S)
                continue
            return None
        except sqlite3.Error:
            return None
        return str(row[0]).lower() if row and row[0] is not None else None
    return None


def _warn_once(seen: set[str], label: str, level: int, msg: str, *args: Any) -> None:
    if label not in seen:
        seen.add(label)
        log.log(level, msg, *args)


def _macos_barriers(conn: sqlite3.Connection) -> None:
    if sys.platform == "darwin":
        conn.execute("PRAGMA checkpoint_fullfsync=1")  # F_FULLFSYNC at checkpoints: a real barrier on Apple disks
        conn.execute("PRAGMA synchronous=FULL")  # WAL's NORMAL can lose commits on macOS power loss


def _set_delete(conn: sqlite3.Connection, *, wait: bool) -> None:
    """``journal_mode=DELETE``; without ``wait`` a locked file is left as it is (busy_timeout 0)."""
    if wait:
        conn.execute("PRAGMA journal_mode=DELETE").fetchone()
        return
    try:
        before = conn.execute("PRAGMA busy_timeout").fetchone()
        previous = int(before[0]) if before and before[0] is not None else 0
    except (sqlite3.Error, TypeError, ValueError):
        previous = 0
    try:
        conn.execute("PRAGMA busy_timeout=0")
        conn.execute("PRAGMA journal_mode=DELETE").fetchone()
    except sqlite3.OperationalError as exc:
        text = str(exc).lower()
        if "locked" not in text and "busy" not in text:
            raise
    finally:
        try:
            conn.execute(f"PRAGMA busy_timeout={previous}")
        except sqlite3.Error:
            pass


def _require_delete(conn: sqlite3.Connection, db_label: str) -> None:
    mode = _on_disk_journal_mode(conn)
    if mode != "delete":
        raise sqlite3.OperationalError(
            f"{db_label}: database.journal_mode is 'delete' but the file stayed in {mode or 'an unreadable'} mode"
        )


def apply_wal_with_fallback(conn: sqlite3.Connection, *, db_label: str = "state.db", require_wal: bool = False) -> str:
    """Choose the connection's journal mode as Hermes v26 does; returns the mode in force.

    A file already in WAL is never downgraded. On a WAL-reset-vulnerable SQLite a file
    not in WAL is kept in (or switched to) DELETE, with one warning. On a fixed SQLite
    WAL is asked for (``database.journal_mode: delete`` in config.yaml asks for DELETE);
    a filesystem that cannot do WAL (NFS/SMB: the marker errors) gets DELETE, or
    :class:`WalUnsupportedError` with ``require_wal``.
    """
    configured = facade_value("resolve_journal_mode", resolve_journal_mode)()
    vulnerable = facade_value("is_sqlite_wal_reset_vulnerable", is_sqlite_wal_reset_vulnerable)()
    on_disk = _on_disk_journal_mode(conn)
    if vulnerable:
        mode = _vulnerable_mode(conn, db_label, configured, on_disk)
    else:
        mode = _fixed_mode(conn, db_label, configured, on_disk, require_wal)
    _macos_barriers(conn)
    return mode


def _reset_warned() -> set[str]:
    """The WAL-reset warning's set as ``hermes_state`` holds it now."""
    return facade_value("_wal_reset_bug_warned_paths", _wal_reset_bug_warned_paths)


def _vulnerable_mode(conn: sqlite3.Connection, db_label: str, configured: str, on_disk: str | None) -> str:
    if on_disk == "wal":
        _warn_once(_reset_warned(), db_label, logging.WARNING,
                   "%s is in WAL mode and this SQLite (%s) has the WAL-reset bug; keeping WAL "
                   "(upgrade SQLite to 3.51.3+)", db_label, sqlite3.sqlite_version)
        return "wal"
    if on_disk is None:
        if configured == "delete":
            raise sqlite3.OperationalError(f"{db_label}: cannot read the journal mode to switch it to DELETE")
        _warn_once(_reset_warned(), db_label, logging.WARNING,
                   "%s: journal mode unreadable; leaving it as it is", db_label)
        return "wal"
    _set_delete(conn, wait=False)
    if configured == "delete":
        _require_delete(conn, db_label)
    _warn_once(_reset_warned(), db_label, logging.WARNING,
               "%s: SQLite %s has the WAL-reset bug; using the rollback journal (DELETE) instead of "
               "enabling WAL (upgrade SQLite to 3.51.3+ for WAL)", db_label, sqlite3.sqlite_version)
    return "delete"


def _fixed_mode(conn: sqlite3.Connection, db_label: str, configured: str, on_disk: str | None,
                require_wal: bool) -> str:
    if on_disk == "wal":
        return "wal"
    if configured == "delete":
        _set_delete(conn, wait=True)
        _require_delete(conn, db_label)
        return "delete"
    error: sqlite3.OperationalError | None = None
    for attempt in range(3):
        try:
            row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError as exc:
            error = exc
            if _DISK_IO in str(exc).lower() and attempt < 2:
                continue
            break
        mode = str(row[0]).lower() if row and row[0] is not None else ""
        if mode == "wal":
            conn.execute(f"PRAGMA journal_size_limit={_WAL_SIZE_LIMIT_BYTES}")
            return "wal"
        if require_wal:
            raise errors.WalUnsupportedError(f"{db_label}: SQLite kept journal_mode={mode} when asked for WAL")
        _warn_once(_wal_refused_warned_labels, db_label, logging.ERROR,
                   "%s: SQLite refused WAL and kept journal_mode=%s", db_label, mode)
        return mode
    assert error is not None
    if not any(marker in str(error).lower() for marker in _WAL_INCOMPAT_MARKERS):
        raise error
    if on_disk is None or _on_disk_journal_mode(conn) == "wal":
        raise error
    if require_wal:
        raise errors.WalUnsupportedError(f"{db_label}: WAL is not supported here ({error})") from error
    _warn_once(_wal_fallback_warned_paths, db_label, logging.WARNING,
               "%s: WAL mode unavailable (%s); using rollback journal instead", db_label, error)
    conn.execute("PRAGMA journal_mode=DELETE")
    return "delete"


def apply_database_pragmas(conn: sqlite3.Connection, *, db_label: str = "state.db") -> None:
    """config.yaml's ``database.{cache_size, mmap_size, temp_store, wal_autocheckpoint,
    journal_size_limit}`` as PRAGMAs; a non-integer value is skipped with a warning."""
    try:
        section = config_section("database") or {}
    except Exception:
        return
    for key in _PRAGMA_KEYS:
        value = section.get(key)
        if value is None:
            continue
        try:
            number = int(value)
        except (TypeError, ValueError):
            log.warning("%s: ignoring non-integer database.%s=%r", db_label, key, value)
            continue
        try:
            conn.execute(f"PRAGMA {key}={number}")
        except sqlite3.Error:
            pass


def _wal_reset_repair_hint(db_label: str = "state.db") -> str:
    """A sentence for an error message: how to keep the WAL-reset bug away (``''`` where fixed)."""
    if not facade_value("is_sqlite_wal_reset_vulnerable", is_sqlite_wal_reset_vulnerable)():
        return ""
    return (
        f"{db_label} is on SQLite {sqlite3.sqlite_version}, which has the WAL-reset bug: upgrade SQLite to "
        "3.51.3 or later, or set database.journal_mode: delete in config.yaml"
    )


__all__ = [
    "_wal_reset_bug_warned_paths",
    "apply_database_pragmas",
    "apply_wal_with_fallback",
    "is_sqlite_wal_reset_vulnerable",
    "resolve_journal_mode",
    "sqlite_source_id",
]


def checkpoint_passive(conn: sqlite3.Connection) -> None:
    """One ``PRAGMA wal_checkpoint(PASSIVE)`` (SessionDB's ``_try_wal_checkpoint`` and ``close``)."""
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
