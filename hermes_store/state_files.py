"""The state.db file itself, as Hermes v26 looks after it before and beside SQLite.

Writability preflight, zeroed-file detection and quarantine, read-only statistics,
how many processes hold the file, and the classification of persistence errors
Hermes' callers report. Work on paths and plain ``sqlite3``; never on our engine.

Also the in-process registry of open connections per file (Hermes'
``has_live_connection``): a file with a live connection is never backed up, judged
zeroed or quarantined, because a connection may be writing it right now.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import stat
import sys
import threading
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from . import errors, held_files
from .dialects.sqlite import WAL_SIZE_LIMIT_BYTES
from .hermes_config import hermes_home
from .patch_points import facade_value
from .paths import SIDECARS, readonly_connection

log = logging.getLogger("hermes_store.facade")

#: What ``classify_persistence_error`` can answer.
PERSISTENCE_ERROR_CAUSES = ("locked", "compression", "compression_closed", "turn_lease", "corrupt", "disk", "unknown")
_DISK_FULL_TEXTS = ("no space left on device", "not enough space", "database or disk is full", "disk full",
                    "full disk", "enospc")
_SIDECARS = SIDECARS  # the store's sidecar suffixes, kept once in paths
_QUARANTINE_LOCK_S = 5.0
_STATS_KEYS = (
    "page_count", "page_size", "freelist_count", "logical_size_bytes", "wal_size_bytes", "journal_mode",
    "messages", "sessions", "fts_tables", "fts_storage_version", "fts_rebuild_pending",
    "fts_rebuild_high_water", "fts_rebuild_progress",
)

_live: Counter[str] = Counter()
_live_lock = threading.Lock()


def _key(path: Any) -> str:
    return os.path.realpath(os.fspath(path))


def track_open(path: Any) -> None:
    """Count one more open connection (a SessionDB) on ``path``."""
    with _live_lock:
        _live[_key(path)] += 1


def track_close(path: Any) -> None:
    with _live_lock:
        key = _key(path)
        if _live[key] > 1:
            _live[key] -= 1
        else:
            _live.pop(key, None)


def has_live_connection(path: Any) -> bool:
    """Whether this process has a SessionDB or a tracked connection open on ``path``."""
    with _live_lock:
        return _live.get(_key(path), 0) > 0


# ----------------------------------------------------------------------------- tracked connections

#: ``sqlite3.connect`` as imported: only a real connect gets the tracking factory (a
#: replacement a test installs may not take ``factory=``).
_REAL_CONNECT = sqlite3.connect


class _Untrack:
    """Drops one registry count exactly once: at ``close()`` or, failing that, when the
    connection is garbage-collected."""

    def __init__(self, key: str) -> None:
        self.key: str | None = key

    def __call__(self) -> None:
        key, self.key = self.key, None
        if key is not None:
            track_close(key)


class _TrackedConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` counted in the registry until it is closed."""

    #: Code that finds a connection's driver by ``type(conn).__module__`` (its DB-API
    #: ``paramstyle``) must still find sqlite3 here.
    __module__ = "sqlite3"
    _untrack: _Untrack | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            untrack = self._untrack
            if untrack is not None:
                untrack()


def _file_of(database: Any) -> str | None:
    """The file a ``connect`` argument names (``file:`` URIs unwrapped); None for memory."""
    text = os.fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else ""
    if text.startswith("file:"):
        text = unquote(text[len("file:"):].split("?", 1)[0])
    if not text or text == ":memory:":
        return None
    return text


def _connect_tracked_db(path: Any, **kwargs: Any) -> sqlite3.Connection:
    """Hermes v26's single door for raw ``sqlite3`` connections: ``sqlite3.connect`` (the
    facade's, looked up now: tests patch it) with the connection counted by
    :func:`has_live_connection` until ``close()``. A failing connect leaves the registry
    as it was. Hermes' tests patch ``hermes_state._connect_tracked_db`` to watch opens."""
    connect = facade_value("sqlite3", sqlite3).connect
    tracked = connect is _REAL_CONNECT and "factory" not in kwargs
    if tracked:
        kwargs["factory"] = _TrackedConnection
    conn = connect(path, **kwargs)
    target = _file_of(path)
    if tracked and target is not None and isinstance(conn, _TrackedConnection):
        untrack = _Untrack(_key(target))
        track_open(target)
        conn._untrack = untrack
        weakref.finalize(conn, untrack)
    return conn


def limit_wal_size(conn: Any) -> None:
    """``journal_size_limit`` (64 MiB) on a connection to a file in WAL mode, as Hermes'
    WAL connections carry: a checkpointed ``-wal`` file is truncated back to it."""
    try:
        row = conn.execute("PRAGMA journal_mode").fetchone()
        if row and str(row[0]).lower() == "wal":
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
    except sqlite3.Error:
        pass  # a setting, not a reason to refuse the connection


# ----------------------------------------------------------------------------- preflight

def _allowed(st: os.stat_result, *, folder: bool) -> bool:
    """Read and write (and search, for a folder) by the bits that apply to us; root only
    counts bits someone has (it could write a 0400 file, but the owner said no)."""
    need_x = folder
    euid = os.geteuid()
    mode = st.st_mode
    if euid == st.st_uid:
        return bool(mode & stat.S_IRUSR) and bool(mode & stat.S_IWUSR) and (not need_x or bool(mode & stat.S_IXUSR))
    if euid == 0:
        return bool(mode & 0o222) and (not need_x or bool(mode & 0o111))
    return True  # the kernel decides for others (os.access)


def _usable(p: Path, *, folder: bool) -> bool:
    try:
        st = p.stat()
    except OSError:
        return True  # missing: created later, by someone allowed to
    flags = os.R_OK | os.W_OK | (os.X_OK if folder else 0)
    return _allowed(st, folder=folder) and os.access(p, flags)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return False
    return True


def preflight_db_writability(db_path: Path, *, db_label: str = "state.db") -> None:
    """Refuse early, with how to fix it, a database SQLite could open but not write.

    The folder, then the file and its ``-wal``/``-shm`` files when they exist, need read
    and write permission. Inside ``$HERMES_HOME`` Hermes' own files get ``u+rw`` back
    (folders ``u+rwx``); elsewhere :class:`~hermes_store.errors.ReadOnlyDatabaseError`
    (a ``sqlite3.OperationalError``) is raised. ``:memory:`` and ``file:`` URIs are skipped.
    """
    text = os.fspath(db_path)
    if text == ":memory:" or text.startswith("file:"):
        return
    path = Path(text).expanduser()
    home = hermes_home()
    checks = [(path.parent, True)] + [(Path(f"{path}{suffix}"), False) for suffix in ("", "-wal", "-shm")]
    for p, folder in checks:
        if _usable(p, folder=folder):
            continue
        if _inside(p, home):
            try:
                os.chmod(p, stat.S_IMODE(p.stat().st_mode) | stat.S_IRUSR | stat.S_IWUSR
                         | (stat.S_IXUSR if folder else 0))
            except OSError:
                pass
            if _usable(p, folder=folder):
                continue
        fix = f"chmod u+rw{'x' if folder else ''} {p}"
        hint = " Do NOT delete the -wal file: it holds committed data." if p.name.endswith("-wal") else ""
        raise errors.ReadOnlyDatabaseError(f"{db_label} is not writable: {p} lacks read/write permission. "
                                           f"Fix with: {fix}.{hint}")


# ----------------------------------------------------------------------------- error classes

def is_disk_full_error(exc: BaseException | str | None) -> bool:
    """ENOSPC, or an error text saying the disk or database is full."""
    if exc is None:
        return False
    if isinstance(exc, BaseException) and getattr(exc, "errno", None) == errno.ENOSPC:
        return True
    text = str(exc).lower()
    return any(needle in text for needle in _DISK_FULL_TEXTS)


def _is_not_a_database_error(exc: BaseException) -> bool:
    """A ``sqlite3.DatabaseError`` (or one wrapped by SQLAlchemy or us) saying "file is not
    a database": the file was swapped or damaged under an open store."""
    cause = exc if isinstance(exc, sqlite3.DatabaseError) else getattr(exc, "orig", None) or exc.__cause__
    return isinstance(cause, sqlite3.DatabaseError) and "file is not a database" in str(cause).lower()


def classify_persistence_error(exc_or_str: Any) -> str:
    """One of :data:`PERSISTENCE_ERROR_CAUSES`: by type first, then by the text."""
    if isinstance(exc_or_str, errors.SessionTurnLeaseLostError):
        return "turn_lease"
    if isinstance(exc_or_str, errors.CompressionSessionClosedError):
        return "compression_closed"
    if isinstance(exc_or_str, errors.CompressionSessionBusyError):
        return "compression"
    text = str(exc_or_str or "").lower()
    if "turn lease" in text:
        return "turn_lease"
    if "closed by compression" in text:
        return "compression_closed"
    if "being compressed" in text or "compression lease" in text:
        return "compression"
    if "malformed" in text or "not a database" in text:
        return "corrupt"
    if "locked" in text or "busy" in text:
        return "locked"
    if is_disk_full_error(text) or "disk" in text or "readonly" in text or "read-only" in text:
        return "disk"
    return "unknown"


# ----------------------------------------------------------------------------- zeroed files

def is_zeroed_state_db(path: Path, *, probe_bytes: int = 100, force: bool = False) -> bool:
    """A non-empty file whose first ``max(16, probe_bytes)`` bytes are all NUL (a lost
    write left it so); False while this process has it open, unless ``force``."""
    p = Path(path)
    if not force and has_live_connection(p):
        return False
    try:
        if p.stat().st_size <= 0:
            return False
        if not _refused_as_not_a_database(p):
            return False  # SQLite reads a header there: not zeroed
        # Never open()+close() the file ourselves: that drops every SQLite lock the
        # process holds on it (see hermes_store.held_files).
        head = held_files.read_prefix(p, max(16, int(probe_bytes)))
    except OSError:
        return False
    return bool(head) and head.count(0) == len(head)


def _refused_as_not_a_database(p: Path) -> bool:
    """Whether SQLite itself calls ``p`` "not a database" (a zeroed file is one).

    Asked first so a healthy file's bytes are never read outside SQLite; a file another
    process holds locked, or one SQLite reads, is not judged zeroed."""
    try:
        with readonly_connection(p) as conn:
            conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error as exc:
        return getattr(exc, "sqlite_errorname", None) == "SQLITE_NOTADB"
    return False


def quarantine_zeroed_state_db(path: Path) -> Path | None:
    """Move a zeroed file (and its sidecars) aside as ``<name>.zeroed-<stamp>-<pid>[-n].bak``.

    Under ``<name>.quarantine.lock`` (waited for at most 5 s, else None), after checking
    again that the file is still zeroed. Returns the new path, or None when nothing moved.
    """
    p = Path(path)
    lock_path = p.with_name(f"{p.name}.quarantine.lock")
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        deadline = time.monotonic() + _QUARANTINE_LOCK_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)
        if not is_zeroed_state_db(p):
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = f"{p.name}.zeroed-{stamp}-{os.getpid()}"
        target = p.with_name(f"{base}.bak")
        n = 1
        while target.exists():
            n += 1
            target = p.with_name(f"{base}-{n}.bak")
        os.rename(p, target)
        for suffix in _SIDECARS:
            side = Path(f"{p}{suffix}")
            if side.exists():
                os.rename(side, Path(f"{target}{suffix}"))
        return target
    except OSError as exc:
        log.error("%s: could not quarantine the zeroed file: %s", p, exc)
        return None
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- statistics

def _one(conn: sqlite3.Connection, sql: str, params: tuple = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


def collect_state_db_stats(db_path: Path) -> dict[str, Any]:
    """Size, journal and index facts about a state.db, read-only; a value that cannot be
    read is None, and this never raises."""
    stats: dict[str, Any] = dict.fromkeys(_STATS_KEYS)
    p = Path(db_path)
    try:
        stats["wal_size_bytes"] = os.path.getsize(f"{p}-wal")
    except OSError:
        stats["wal_size_bytes"] = 0 if p.exists() else None
    try:
        conn = facade_value("_connect_tracked_db", _connect_tracked_db)(f"file:{p}?mode=ro", uri=True, timeout=1.0)
    except Exception:
        return stats
    try:
        probes = {
            "page_count": lambda: _one(conn, "PRAGMA page_count"),
            "page_size": lambda: _one(conn, "PRAGMA page_size"),
            "freelist_count": lambda: _one(conn, "PRAGMA freelist_count"),
            "journal_mode": lambda: str(_one(conn, "PRAGMA journal_mode")).lower(),
            "messages": lambda: _one(conn, "SELECT count(*) FROM messages"),
            "sessions": lambda: _one(conn, "SELECT count(*) FROM sessions"),
            "fts_tables": lambda: sorted(r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%fts5%'")),
            "fts_storage_version": lambda: _meta_int(conn, "fts_storage_version"),
            "fts_rebuild_high_water": lambda: _meta_int(conn, "fts_rebuild_high_water"),
            "fts_rebuild_progress": lambda: _meta_int(conn, "fts_rebuild_progress"),
        }
        for key, probe in probes.items():
            try:
                stats[key] = probe()
            except Exception:
                stats[key] = None
        if stats["page_count"] is not None and stats["page_size"] is not None:
            stats["logical_size_bytes"] = int(stats["page_count"]) * int(stats["page_size"])
        try:
            stats["fts_rebuild_pending"] = _one(
                conn, "SELECT count(*) FROM state_meta WHERE key = 'fts_rebuild_high_water'") > 0
        except Exception:
            stats["fts_rebuild_pending"] = None
    finally:
        conn.close()
    return stats


def _meta_int(conn: sqlite3.Connection, key: str) -> int | None:
    value = _one(conn, "SELECT value FROM state_meta WHERE key = ?", (key,))
    return None if value is None else int(value)


def count_db_holders(db_path: Path) -> int | None:
    """How many processes have the file (or its -wal/-shm) open, from Linux's /proc;
    None where /proc cannot tell."""
    if not sys.platform.startswith("linux") or not os.path.isdir("/proc"):
        return None
    base = os.path.realpath(os.fspath(db_path))
    names = {base, base + "-wal", base + "-shm", base + "-journal"}
    holders = 0
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in names:
                    holders += 1
                    break
            except OSError:
                continue
    return holders


__all__ = [
    "PERSISTENCE_ERROR_CAUSES",
    "_connect_tracked_db",
    "_is_not_a_database_error",
    "classify_persistence_error",
    "collect_state_db_stats",
    "count_db_holders",
    "is_disk_full_error",
    "is_zeroed_state_db",
    "preflight_db_writability",
    "quarantine_zeroed_state_db",
]
