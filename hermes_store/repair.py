"""Repairing a damaged ``state.db`` in place (Hermes v26's ``repair_state_db_schema``).

Gentlest fix first, after a raw backup, each step only while the file still fails
:func:`_db_opens_cleanly`. Two guards make the repair safe to run from many processes:
the surgery holds ``<name>.repair.lock`` (an ``flock``, so a killed holder never blocks
the next one), and a ledger ``<name>.repair-attempts.json`` counts failed repairs of one
unchanged file (size and mtime), so a file no strategy can fix is not backed up and
operated on at every open: after :data:`_MAX_PERSISTENT_REPAIR_ATTEMPTS` failures it is
left alone until it changes. Messages and sessions are never deleted by any strategy.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from . import errors, held_files
from .dialects.fts5 import HERMES_FTS_TABLES as _FTS_TABLES
from .locks import release_flock, wait_flock
from .state_files import has_live_connection
from .patch_points import facade_value

log = logging.getLogger("hermes_store.facade")

_repair_lock = threading.Lock()
#: Paths SessionDB already tried to repair in this process (Hermes' ``_repair_attempted_paths``).
_repair_attempted: set[str] = set()
#: Malformed-file backups kept per database (the newest ones).
_MAX_MALFORMED_BACKUPS = 3
#: How long a repair waits for another process's repair of the same file (seconds).
_REPAIR_LOCK_TIMEOUT_SECONDS = 120
#: Failed repairs of one unchanged file after which it is left alone.
_MAX_PERSISTENT_REPAIR_ATTEMPTS = 3


# ----------------------------------------------------------------------------- health and repair

def _connect(path: Path) -> sqlite3.Connection:
    # Through the module attribute at call time: Hermes' tests patch sqlite3.connect.
    return sqlite3.connect(str(path), timeout=5.0, isolation_level=None)


def _db_opens_cleanly(db_path: Path) -> str | None:
    """None when a fresh connection can read and write the file; else the reason.

    Probes what a damaged file breaks first: the journal PRAGMA, SQLite's
    ``integrity_check``, a read of ``sessions``, a MATCH on each FTS table, and a
    message insert (firing the index triggers) that is rolled back. A missing
    table or tokenizer is not damage: the file may simply be new or older.
    """
    path = Path(db_path)
    if not path.exists():
        return f"{path} does not exist"
    try:
        conn = _connect(path)
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        conn.execute("PRAGMA journal_mode").fetchone()
        row = conn.execute("PRAGMA integrity_check").fetchone()
        if not row or str(row[0]).lower() != "ok":
            return f"integrity_check: {row[0] if row else 'no answer'}"
        conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
        for table in _FTS_TABLES:
            try:
                conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH 'probe' LIMIT 1").fetchall()
                _read_whole_index(conn, table)
            except sqlite3.OperationalError as exc:
                if not _absent(exc):
                    raise
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('__hermes_store_probe__', 'probe', 0)")
            conn.execute(
                "INSERT INTO messages (session_id, role, content, timestamp)"
                " VALUES ('__hermes_store_probe__', 'user', 'probe', 0)"
            )
        finally:
            # SQLite has already rolled back after some errors (a corrupt page): a second
            # ROLLBACK would hide the real reason behind "no transaction is active".
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        return None
    except sqlite3.Error as exc:
        if _absent(exc):
            return None
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def _read_whole_index(conn: sqlite3.Connection, table: str) -> None:
    """Read every term of an FTS5 index (an ``fts5vocab`` table in ``temp``): a damaged
    leaf page only fails a query whose terms are on it, so one MATCH proves little."""
    vocab = f"temp.{table}_hermes_probe_vocab"
    conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {vocab} USING fts5vocab(main, {table}, 'instance')")
    try:
        conn.execute(f"SELECT count(*) FROM {vocab}").fetchone()
    finally:
        conn.execute(f"DROP TABLE IF EXISTS {vocab}")


def _absent(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "no such table" in text or "no such tokenizer" in text or "no such module" in text


def _claim_repair_attempt(db_path: Path) -> bool:
    """True the first time for a path in this process: SessionDB repairs a file at most once."""
    key = os.path.realpath(os.fspath(db_path))
    # Through the facade: Hermes' tests clear or replace ``_repair_attempted_paths`` there.
    attempted = facade_value("_repair_attempted_paths", _repair_attempted)
    with _repair_lock:
        if key in attempted:
            return False
        attempted.add(key)
        return True


def _backup_db_file(db_path: Path) -> tuple[Path | None, str | None]:
    """A raw copy ``<name>.malformed-backup-<stamp>`` (plus -wal/-shm), 0600: ``(path, None)``,
    or ``(None, reason)`` when there is nothing to copy or a copy would not be safe.

    Refused while this process has the file open (a live connection may be writing it);
    the newest backup is reused when it is identical; only the newest
    :data:`_MAX_MALFORMED_BACKUPS` are kept.
    """
    path = Path(db_path)
    if not path.exists():
        return None, f"{path} does not exist"
    if has_live_connection(path):
        return None, f"{path} has a live connection in this process; close it before backing the file up"
    backups = _existing_backups(path)
    if backups and _same_bytes(path, backups[-1]):
        return backups[-1], None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = f"{path.name}.malformed-backup-{stamp}"
    # Past the highest number of this second, so a pruned name is never handed out again.
    used = [m.group(1) or "1" for m in (re.fullmatch(rf"{re.escape(base)}(?:-(\d+))?(?:-wal|-shm)?", p.name)
                                         for p in path.parent.glob(f"{base}*")) if m]
    n = max((int(u) for u in used), default=0) + 1
    target = path.with_name(base if n == 1 else f"{base}-{n}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            dst = Path(f"{target}{suffix}")
            # Read through the process's kept descriptor, never open()+close() of the
            # store's own files (that would drop SQLite's locks: hermes_store.held_files).
            fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                held_files.copy_into(src, fd)
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
    for old in _existing_backups(path)[:-_kept_backups()]:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{old}{suffix}").unlink(missing_ok=True)
    return target, None


def _kept_backups() -> int:
    """:data:`_MAX_MALFORMED_BACKUPS` as the facade names it now (tests may lower it); at least 1."""
    return max(1, int(facade_value("_MAX_MALFORMED_BACKUPS", _MAX_MALFORMED_BACKUPS)))


def _existing_malformed_backups(db_path: Path) -> list[Path]:
    """Hermes v26: the pre-repair backups that exist for ``db_path``, newest first (at
    most :data:`_MAX_MALFORMED_BACKUPS`: :func:`_backup_db_file` removes older ones)."""
    path = Path(db_path)
    if not path.parent.is_dir():
        return []
    return list(reversed(_existing_backups(path)))


def _existing_backups(path: Path) -> list[Path]:
    """The file's malformed-backups, oldest first (by modification time, then name)."""
    prefix = f"{path.name}.malformed-backup-"
    found = [p for p in path.parent.glob(f"{path.name}.malformed-backup-*")
             if p.name.startswith(prefix) and not p.name.endswith(("-wal", "-shm"))]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _same_bytes(a: Path, b: Path) -> bool:
    """Whether two files (and their -wal files) hold the same bytes."""
    for suffix in ("", "-wal"):
        x, y = Path(f"{a}{suffix}"), Path(f"{b}{suffix}")
        if x.exists() != y.exists():
            return False
        if x.exists() and not held_files.same_bytes(x, y):
            return False
    return True


def repair_state_db_schema(db_path: Path, *, backup: bool = True) -> dict[str, Any]:
    """Repair a damaged ``state.db`` in place, trying the gentlest fix first.

    Returns ``{repaired, strategy, backup_path, error}``. Under ``<name>.repair.lock``
    (another process's repair is waited for, :data:`_REPAIR_LOCK_TIMEOUT_SECONDS`): the
    file is checked (``already_healthy``), backed up raw (a refused or failed backup stops
    everything, the file untouched), then each strategy runs only if the file still
    fails :func:`_db_opens_cleanly`: ``rebuild_fts`` (FTS5 'rebuild' from the messages
    table), ``reindex_btree`` (REINDEX), ``dedup_schema`` (duplicate ``sqlite_master``
    entries removed), ``drop_fts_rebuild`` (the FTS tables dropped and made again from
    their own definitions, then rebuilt). A lock not had in time while the file now
    opens cleanly is ``repaired_by_other_process``. A file that failed
    :data:`_MAX_PERSISTENT_REPAIR_ATTEMPTS` repairs unchanged is refused untouched.
    """
    path = Path(db_path)
    result: dict[str, Any] = {"repaired": False, "strategy": None, "backup_path": None, "error": None}
    if not path.exists():
        result["error"] = f"{path} does not exist"
        return result
    lock_path = path.with_name(f"{path.name}.repair.lock")
    try:
        timeout = float(facade_value("_REPAIR_LOCK_TIMEOUT_SECONDS", _REPAIR_LOCK_TIMEOUT_SECONDS))
        fd = wait_flock(lock_path, timeout, error=errors.DatabaseUnavailableError)
    except errors.HermesStoreError as exc:
        result["error"] = f"cannot take the repair lock: {exc}"
        return result
    if fd is None:
        if _opens_cleanly(path) is None:
            result.update(repaired=True, strategy="repaired_by_other_process")
        else:
            result["error"] = f"another process is repairing {path} (its {lock_path.name} stayed held)"
        return result
    try:
        return _repair_locked(path, result, backup)
    finally:
        release_flock(lock_path, fd)


def _opens_cleanly(path: Path) -> str | None:
    """:func:`_db_opens_cleanly` as the facade names it now (Hermes' tests patch it);
    a patched one may answer a bool (True: healthy)."""
    answer = facade_value("_db_opens_cleanly", _db_opens_cleanly)(path)
    if isinstance(answer, bool):
        return None if answer else "reported unhealthy"
    return answer


def _repair_locked(path: Path, result: dict[str, Any], backup: bool) -> dict[str, Any]:
    if _opens_cleanly(path) is None:
        _forget_failures(path)
        result.update(repaired=True, strategy="already_healthy")
        return result
    failures = _recorded_failures(path)
    limit = int(facade_value("_MAX_PERSISTENT_REPAIR_ATTEMPTS", _MAX_PERSISTENT_REPAIR_ATTEMPTS))
    if failures >= limit:
        result["error"] = (f"repair refused: {failures} earlier repairs of this file failed and it has not "
                           f"changed since; restore it from a backup (see {_ledger_path(path).name})")
        return result
    if backup:
        try:
            saved, refusal = facade_value("_backup_db_file", _backup_db_file)(path)
        except OSError as exc:
            saved, refusal = None, f"backup failed: {exc}"
        if saved is None:
            # No copy, no surgery: the file is left exactly as it was.
            result["error"] = f"pre-repair backup refused; {refusal or 'no backup was made'}"
            return result
        result["backup_path"] = str(saved)
    last_error: str | None = None
    for name, strategy in _STRATEGIES:
        try:
            strategy(path)
        except Exception as exc:
            last_error = f"{name}: {type(exc).__name__}: {exc}"
            continue
        reason = _opens_cleanly(path)
        if reason is None:
            _forget_failures(path)
            result.update(repaired=True, strategy=name)
            return result
        last_error = f"{name}: {reason}"
    result["error"] = last_error or "no strategy repaired the file"
    _record_failure(path, result["error"])
    return result


# ----------------------------------------------------------------------------- the ledger

def _ledger_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.repair-attempts.json")


def _fingerprint(path: Path) -> str | None:
    """``size:mtime_ns`` of the file: a restored or rewritten file gets a fresh count."""
    try:
        st = path.stat()
    except OSError:
        return None
    return f"{st.st_size}:{st.st_mtime_ns}"


def _recorded_failures(path: Path) -> int:
    """Failed repairs recorded for the file as it is now (0 when it changed, or no ledger)."""
    try:
        entry = json.loads(_ledger_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    if not isinstance(entry, dict) or entry.get("fingerprint") != _fingerprint(path):
        return 0
    count = entry.get("failures")
    return count if isinstance(count, int) and count > 0 else 0


def _record_failure(path: Path, error: str) -> None:
    """One more failure of the file as the failed repair left it; written atomically, 0600."""
    entry = {"fingerprint": _fingerprint(path), "failures": _recorded_failures(path) + 1,
             "last_error": error[:500], "updated_at": time.time()}
    ledger = _ledger_path(path)
    tmp = ledger.with_name(f"{ledger.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(entry, out)
        os.replace(tmp, ledger)
    except OSError as exc:  # a ledger we cannot write only costs a repeated attempt
        log.warning("%s: could not record the failed repair: %s", ledger, exc)
        tmp.unlink(missing_ok=True)


def _forget_failures(path: Path) -> None:
    _ledger_path(path).unlink(missing_ok=True)


def _fts_tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%fts5%'"
    )]


def _rebuild_fts(path: Path) -> None:
    conn = _connect(path)
    try:
        for table in _fts_tables(conn):
            conn.execute(f"INSERT INTO {table}({table}) VALUES('rebuild')")
    finally:
        conn.close()


def _reindex(path: Path) -> None:
    conn = _connect(path)
    try:
        conn.execute("REINDEX")
    finally:
        conn.close()


def _dedup_schema(path: Path) -> None:
    """Remove repeated ``sqlite_master`` entries (same type and name), keeping the first."""
    conn = _connect(path)
    try:
        conn.execute("PRAGMA writable_schema=ON")
        try:
            removed = conn.execute(
                "DELETE FROM sqlite_master WHERE rowid NOT IN"
                " (SELECT MIN(rowid) FROM sqlite_master GROUP BY type, name)"
            ).rowcount
            if removed:
                _bump_schema_version(conn)
        finally:
            conn.execute("PRAGMA writable_schema=OFF")
    finally:
        conn.close()


def _bump_schema_version(conn: sqlite3.Connection) -> None:
    """After an edit of ``sqlite_master``: other connections' cached schema is stale, and
    only a changed schema cookie makes them read it again."""
    version = int(conn.execute("PRAGMA schema_version").fetchone()[0])
    conn.execute(f"PRAGMA schema_version = {version + 1}")


def _drop_fts_rebuild(path: Path) -> None:
    """Drop every FTS table and make it again from its own saved definition, then rebuild.

    The CREATE statements of the tables and of the triggers that feed them are read
    first; a table whose DROP fails is removed by a schema edit. Only index data is
    lost, and the rebuild makes it again from the messages table.
    """
    conn = _connect(path)
    try:
        conn.execute("PRAGMA writable_schema=ON")  # read definitions even from a damaged schema
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%fts5%'"
        ).fetchall()
        names = [name for name, _ in tables]
        triggers = [
            sql for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
            if any(t in (sql or "") for t in names)
        ]
        conn.execute("PRAGMA writable_schema=OFF")
        for name in names:
            try:
                conn.execute(f"DROP TABLE IF EXISTS {name}")
            except sqlite3.DatabaseError:
                conn.execute("PRAGMA writable_schema=ON")
                conn.execute("DELETE FROM sqlite_master WHERE name = ? OR name LIKE ? ESCAPE '!'",
                             (name, name.replace("_", "!_") + "!_%"))
                _bump_schema_version(conn)
                conn.execute("PRAGMA writable_schema=OFF")
        for _, sql in tables:
            conn.execute(sql)
        for sql in triggers:
            conn.execute(sql.replace("CREATE TRIGGER ", "CREATE TRIGGER IF NOT EXISTS ", 1))
        for name in names:
            conn.execute(f"INSERT INTO {name}({name}) VALUES('rebuild')")
    finally:
        conn.close()


_STRATEGIES = (
    ("rebuild_fts", _rebuild_fts),
    ("reindex_btree", _reindex),
    ("dedup_schema", _dedup_schema),
    ("drop_fts_rebuild", _drop_fts_rebuild),
)


