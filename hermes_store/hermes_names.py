"""Hermes' module-level ``hermes_state`` names that are not SessionDB methods.

Hermes' application imports these from ``hermes_state`` (``workspace_key``,
``is_malformed_db_error``, ``repair_state_db_schema``, ``_db_opens_cleanly``...), so
the facade module re-exports every one; the swap then serves them. They work on a
SQLite file with plain ``sqlite3`` (that is what Hermes' callers hand them), and the
few that build SQL fragments return SQLite SQL, as Hermes' do.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import migrations
from .paths import VERSION_TABLE
from .state_files import has_live_connection

log = logging.getLogger("hermes_store.facade")

#: Hermes' limits and storage markers (hermes_state v23 names).
MAX_FTS5_QUERY_CHARS = 2048
FTS_STORAGE_VERSION = 1
FTS_CJK_STALE_KEY = "fts_cjk_stale"

#: "Malformed" errors Hermes repairs by itself (``is_malformed_db_error``).
_MALFORMED_MARKERS = ("malformed database schema", "database disk image is malformed")
#: FTS tables Hermes knows; ours are the first two (the CJK one needs a loadable tokenizer).
_FTS_TABLES = ("messages_fts", "messages_fts_trigram", "messages_fts_cjk")
#: Prefixes of the two "review the conversation" prompts Hermes' background review injects.
_HARNESS_PREFIXES = (
    "Review the conversation above and",
)

_repair_lock = threading.Lock()
#: Paths SessionDB already tried to repair in this process (Hermes' ``_repair_attempted_paths``).
_repair_attempted: set[str] = set()
#: Malformed-file backups kept per database (the newest ones).
_MAX_MALFORMED_BACKUPS = 3


# ----------------------------------------------------------------------------- small helpers

def workspace_key(row: dict[str, Any]) -> str | None:
    """The project a session belongs to: its git root, else its cwd (stripped), else None."""
    for key in ("git_repo_root", "cwd"):
        value = row.get(key) if row else None
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _scrub_surrogates(value: Any) -> Any:
    """Replace lone UTF-16 surrogates in a ``str`` with U+FFFD; anything else passes through."""
    if not isinstance(value, str):
        return value
    if not _has_surrogate(value):
        return value
    return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in value)


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in text)


def is_malformed_db_error(exc: BaseException) -> bool:
    """A ``sqlite3.DatabaseError`` saying the file's schema or pages are malformed."""
    if not isinstance(exc, sqlite3.DatabaseError):
        cause = getattr(exc, "orig", None) or exc.__cause__
        if not isinstance(cause, sqlite3.DatabaseError):
            return False
        exc = cause
    text = str(exc).lower()
    return any(marker in text for marker in _MALFORMED_MARKERS)


def _cjk_fts_config_enabled() -> bool:
    """``HERMES_CJK_FTS`` (default on; 0/false/off/no turn it off)."""
    return os.environ.get("HERMES_CJK_FTS", "1").strip().lower() not in ("0", "false", "off", "no")


def fts5_cjk_so_path() -> Path:
    """Where Hermes looks for its optional CJK tokenizer extension."""
    explicit = os.environ.get("HERMES_FTS5_CJK_SO")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HERMES_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".hermes"
    return base / "lib" / "libfts5_cjk.so"


def load_fts5_cjk_extension(conn: sqlite3.Connection) -> bool:
    """Best-effort load of Hermes' ``cjk_unicode61`` tokenizer; never raises.

    We do not need it (CJK is served by the trigram and bigram indexes), but a file
    Hermes indexed with it stays readable when the extension is present.
    """
    if not _cjk_fts_config_enabled():
        return False
    path = fts5_cjk_so_path()
    if not path.is_file():
        return False
    try:
        conn.enable_load_extension(True)
        try:
            conn.load_extension(str(path))
        finally:
            conn.enable_load_extension(False)
        return True
    except Exception as exc:  # noqa: BLE001 - best effort by contract
        log.debug("CJK tokenizer not loaded from %s: %s", path, exc)
        return False


# ----------------------------------------------------------------------------- PRAGMA helpers

def open_raw_connection(connect: Any, path: Path, *, read_only: bool, busy_timeout_s: float) -> sqlite3.Connection:
    """The plain connection behind ``SessionDB._conn``, set up as Hermes sets up its own.

    Autocommit (``isolation_level=None``: each statement commits alone, so it never
    holds the write lock across our transactions), usable from any thread (Hermes
    guards it with ``_lock``), ``sqlite3.Row`` rows. ``connect`` is the
    ``sqlite3.connect`` the facade names at call time (tests patch it).
    """
    if read_only:
        conn = connect(f"file:{path}?mode=ro", uri=True, timeout=1.0, isolation_level=None, check_same_thread=False)
    else:
        conn = connect(str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA foreign_keys=ON")  # as Hermes' own connection: references enforced
    conn.row_factory = sqlite3.Row
    return conn


def _apply_macos_checkpoint_barrier(conn: sqlite3.Connection) -> None:
    """On macOS, make WAL checkpoints use F_FULLFSYNC (a real barrier on Apple disks)."""
    if sys.platform == "darwin":
        conn.execute("PRAGMA checkpoint_fullfsync=1")


def _enforce_macos_synchronous_full(conn: sqlite3.Connection) -> None:
    """On macOS, synchronous=FULL: WAL's NORMAL can lose commits there on power loss."""
    if sys.platform == "darwin":
        conn.execute("PRAGMA synchronous=FULL")


# ----------------------------------------------------------------------------- SQL fragments

def _delegate_from_json(col: str = "model_config") -> str:
    """SQLite expression: the ``_delegate_from`` marker of a model_config JSON column."""
    return f"(CASE WHEN json_valid({col}) THEN json_extract({col}, '$._delegate_from') END)"


def _cwd_prefix_clause(cwd_prefix: str) -> tuple[str, list[str]]:
    """SQLite WHERE fragment and parameters: ``cwd`` is the prefix folder or below it.

    Unlike Hermes' fragment, the LIKE patterns are escaped, so ``_`` and ``%`` in a
    folder name match only themselves.
    """
    base = (cwd_prefix or "").rstrip("/\\")
    escaped = base.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    clause = "(cwd = ? OR cwd LIKE ? ESCAPE '\\' OR cwd LIKE ? ESCAPE '\\')"
    return clause, [base, escaped + "/%", escaped + "\\\\%"]


def _ephemeral_child_sql(alias: str = "s") -> str:
    """SQLite condition: the session has a parent but is neither a branch nor a compression child."""
    return (
        f"({alias}.parent_session_id IS NOT NULL"
        f" AND COALESCE({_delegate_from_json(alias + '.model_config')}, '') = ''"
        f" AND NOT (CASE WHEN json_valid({alias}.model_config)"
        f" THEN json_extract({alias}.model_config, '$._branched_from') END) IS NOT NULL"
        f" AND NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = {alias}.parent_session_id"
        f" AND p.end_reason IN ('compression', 'branched')))"
    )


def _collect_delegate_child_ids(conn: sqlite3.Connection, parent_ids: list[str]) -> list[str]:
    """Every session delegated (recursively) from ``parent_ids``, the parents left out."""
    parents = [p for p in dict.fromkeys(parent_ids) if isinstance(p, str) and p]
    if not parents:
        return []
    marks = ",".join("?" * len(parents))
    rows = conn.execute(
        f"""WITH RECURSIVE tree(id) AS (
                SELECT id FROM sessions WHERE id IN ({marks})
                UNION
                SELECT s.id FROM sessions s JOIN tree t
                  ON {_delegate_from_json('s.model_config')} = t.id
                  OR (s.parent_session_id = t.id AND {_delegate_from_json('s.model_config')} IS NOT NULL)
            )
            SELECT id FROM tree""",
        parents,
    ).fetchall()
    doomed = set(parents)
    return [r[0] for r in rows if r[0] not in doomed]


def _delete_delegate_children(conn: sqlite3.Connection, parent_ids: list[str]) -> list[str]:
    """Delete the delegate children of ``parent_ids`` (rows and messages); orphan stragglers."""
    children = _collect_delegate_child_ids(conn, parent_ids)
    if not children:
        return []
    marks = ",".join("?" * len(children))
    conn.execute(f"UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id IN ({marks})"
                 f" AND id NOT IN ({marks})", children + children)
    conn.execute(f"DELETE FROM messages WHERE session_id IN ({marks})", children)
    conn.execute(f"DELETE FROM sessions WHERE id IN ({marks})", children)
    return children


# ----------------------------------------------------------------------------- background review

def _is_background_review_harness_message(msg: dict[str, Any]) -> bool:
    """A user/system turn injected by Hermes' background review ("Review the conversation above and …")."""
    if not isinstance(msg, dict) or msg.get("role") not in ("user", "system"):
        return False
    content = msg.get("content")
    return isinstance(content, str) and content.lstrip().startswith(_HARNESS_PREFIXES)


def _strip_background_review_harness(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop each harness turn and the assistant reply right after it."""
    kept: list[dict[str, Any]] = []
    skip_reply = False
    for msg in messages:
        if _is_background_review_harness_message(msg):
            skip_reply = True
            continue
        if skip_reply and isinstance(msg, dict) and msg.get("role") == "assistant":
            skip_reply = False
            continue
        skip_reply = False
        kept.append(msg)
    return kept


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
            conn.execute("ROLLBACK")
        return None
    except sqlite3.Error as exc:
        if _absent(exc):
            return None
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def _absent(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "no such table" in text or "no such tokenizer" in text or "no such module" in text


def _claim_repair_attempt(db_path: Path) -> bool:
    """True the first time for a path in this process: SessionDB repairs a file at most once."""
    key = os.path.realpath(os.fspath(db_path))
    with _repair_lock:
        if key in _repair_attempted:
            return False
        _repair_attempted.add(key)
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
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o600)
    for old in _existing_backups(path)[:-_MAX_MALFORMED_BACKUPS]:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{old}{suffix}").unlink(missing_ok=True)
    return target, None


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
        if x.exists() and (x.stat().st_size != y.stat().st_size or x.read_bytes() != y.read_bytes()):
            return False
    return True


def repair_state_db_schema(db_path: Path, *, backup: bool = True) -> dict[str, Any]:
    """Repair a damaged ``state.db`` in place, trying the gentlest fix first.

    After a raw backup, each strategy runs only if the file still fails
    :func:`_db_opens_cleanly`: ``already_healthy``, ``rebuild_fts`` (FTS5 'rebuild'
    from the messages table), ``reindex_btree`` (REINDEX), ``dedup_schema``
    (duplicate ``sqlite_master`` entries removed), ``drop_fts_rebuild`` (the FTS
    tables dropped and made again by our migrations, then rebuilt). Messages and
    sessions are never deleted by any strategy.
    """
    path = Path(db_path)
    result: dict[str, Any] = {"repaired": False, "strategy": None, "backup_path": None, "error": None}
    if not path.exists():
        result["error"] = f"{path} does not exist"
        return result
    if _db_opens_cleanly(path) is None:
        result.update(repaired=True, strategy="already_healthy")
        return result
    if backup:
        try:
            saved, refusal = _patched_backup()(path)
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
        except Exception as exc:  # noqa: BLE001 - the next strategy may still work
            last_error = f"{name}: {type(exc).__name__}: {exc}"
            continue
        reason = _db_opens_cleanly(path)
        if reason is None:
            result.update(repaired=True, strategy=name)
            return result
        last_error = f"{name}: {reason}"
    result["error"] = last_error or "no strategy repaired the file"
    return result


def _patched_backup() -> Any:
    """``hermes_state._backup_db_file`` as it is now (Hermes' tests patch it there)."""
    facade = sys.modules.get("hermes_store.facade")
    return getattr(facade, "_backup_db_file", _backup_db_file) if facade is not None else _backup_db_file


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
            conn.execute(
                "DELETE FROM sqlite_master WHERE rowid NOT IN"
                " (SELECT MIN(rowid) FROM sqlite_master GROUP BY type, name)"
            )
        finally:
            conn.execute("PRAGMA writable_schema=OFF")
    finally:
        conn.close()


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


__all__ = [
    "FTS_CJK_STALE_KEY",
    "FTS_STORAGE_VERSION",
    "MAX_FTS5_QUERY_CHARS",
    "fts5_cjk_so_path",
    "is_malformed_db_error",
    "load_fts5_cjk_extension",
    "repair_state_db_schema",
    "workspace_key",
]


# ----------------------------------------------------------------------------- DDL strings

#: Hermes' DDL constants, served from a database our migrations built (see :func:`ddl_strings`).
DDL_NAMES = (
    "SCHEMA_SQL", "DEFERRED_INDEX_SQL", "FTS_SQL", "FTS_TRIGRAM_SQL", "FTS_CJK_TABLE_SQL",
    "FTS_CJK_TRIGGER_SQL", "LEGACY_FTS_SQL", "LEGACY_FTS_TRIGRAM_SQL",
)
_ddl_cache: dict[str, str] = {}


def _objects(path: Path) -> list[tuple[str, str, str, str]]:
    conn = sqlite3.connect(str(path))
    try:
        return [tuple(r) for r in conn.execute(  # type: ignore[misc]
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
        )]
    finally:
        conn.close()


def _script(statements: list[str]) -> str:
    return "".join(s.rstrip().rstrip(";") + ";\n" for s in statements)


def ddl_strings() -> dict[str, str]:
    """Hermes' ``SCHEMA_SQL``, ``FTS_SQL``… as executable scripts, built once per process.

    Made from what our migrations create (head, and revision 0022 for the legacy
    inline FTS tables Hermes calls ``LEGACY_*``), so they can never drift from the
    schema we write. The CJK-tokenizer strings are empty: that index needs Hermes'
    loadable tokenizer, which we do not ship (CJK is served by trigram and bigram).
    """
    if _ddl_cache:
        return _ddl_cache
    with tempfile.TemporaryDirectory(prefix="hermes-store-ddl-") as tmp:
        head = Path(tmp) / "head.db"
        migrations.upgrade(head)
        legacy = Path(tmp) / "v22.db"
        migrations.upgrade(legacy, "0022")
        now, old = _objects(head), _objects(legacy)
    fts = {"messages_fts", "messages_fts_src"}
    tri = {"messages_fts_trigram", "messages_fts_trigram_src"}

    def of(objs: list[tuple[str, str, str, str]], names: set[str]) -> list[str]:
        """The named tables/views, then the triggers that write into them."""
        found = [sql for kind, name, _t, sql in objs if kind in ("table", "view") and name in names]
        targets = [n for n in names if not n.endswith("_src")]
        found += [sql for kind, _n, _t, sql in objs
                  if kind == "trigger" and any(re.search(rf"\b{n}\b", sql) for n in targets)]
        return found

    plain = [sql for kind, name, _t, sql in now
             if kind in ("table", "view") and not name.startswith(("messages_fts", "sqlite_"))
             and name != VERSION_TABLE]  # our Alembic bookkeeping is not Hermes' schema
    _ddl_cache.update(
        SCHEMA_SQL=_script(plain),
        DEFERRED_INDEX_SQL=_script([sql for kind, _n, _t, sql in now if kind == "index"]),
        FTS_SQL=_script(of(now, fts)),
        FTS_TRIGRAM_SQL=_script(of(now, tri)),
        FTS_CJK_TABLE_SQL="",
        FTS_CJK_TRIGGER_SQL="",
        LEGACY_FTS_SQL=_script(of(old, fts)),
        LEGACY_FTS_TRIGRAM_SQL=_script(of(old, tri)),
    )
    return _ddl_cache
