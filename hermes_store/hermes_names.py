"""Hermes' module-level ``hermes_state`` names that are not SessionDB methods.

Hermes' application imports these from ``hermes_state`` (``workspace_key``,
``is_malformed_db_error``, ``escape_like``...; the repair names are in
:mod:`hermes_store.repair`), so
the facade module re-exports every one; the swap then serves them. They work on a
SQLite file with plain ``sqlite3`` (that is what Hermes' callers hand them), and the
few that build SQL fragments return SQLite SQL, as Hermes' do.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import migrations
from .keys import FTS_CJK_STALE_KEY, MAX_FTS5_QUERY_CHARS, VERSION_TABLE
from .repositories.lineage import COMPRESSION, MAX_DEPTH, delegate_tree_sql
from .review_turns import _is_background_review_harness_message, _strip_background_review_harness  # noqa: F401
from .state_files import limit_wal_size

log = logging.getLogger("hermes_store.facade")

#: Hermes' limits and storage markers (hermes_state v23 names).
FTS_STORAGE_VERSION = 1

#: "Malformed" errors Hermes repairs by itself (``is_malformed_db_error``).
_MALFORMED_MARKERS = ("malformed database schema", "database disk image is malformed")



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
    except Exception as exc:
        log.debug("CJK tokenizer not loaded from %s: %s", path, exc)
        return False


# ----------------------------------------------------------------------------- PRAGMA helpers

def open_raw_connection(connect: Any, path: Path, *, read_only: bool, busy_timeout_s: float) -> sqlite3.Connection:
    """The plain connection behind ``SessionDB._conn``, set up as Hermes sets up its own.

    Autocommit (``isolation_level=None``: each statement commits alone, so it never
    holds the write lock across our transactions), usable from any thread (Hermes
    guards it with ``_lock``), ``sqlite3.Row`` rows, ``journal_size_limit`` 64 MiB when
    the file is in WAL. ``connect`` is Hermes' ``_connect_tracked_db`` as the facade
    names it at call time (tests patch it), or an encrypted file's keyed connect.
    """
    if read_only:
        conn = connect(f"file:{path}?mode=ro", uri=True, timeout=1.0, isolation_level=None, check_same_thread=False)
    else:
        conn = connect(str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA foreign_keys=ON")  # as Hermes' own connection: references enforced
    limit_wal_size(conn)
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


def _param_mark(conn: Any) -> str:
    """The DB-API parameter marker of a raw connection: ``%s`` for a ``format``/``pyformat``
    driver (psycopg), else ``?`` (sqlite3), read from the driver module's ``paramstyle``."""
    module = sys.modules.get(type(conn).__module__.split(".")[0])
    return "%s" if getattr(module, "paramstyle", "qmark") in ("format", "pyformat") else "?"


def raw_turn_lease_key(conn: Any, session_id: str) -> str:
    """The turn-lease key (``repositories.turn_leases.turn_lease_key``) on a DB-API connection (``db._conn``, or the one
    ``_execute_write`` hands out): climb while the parent ended 'compression'."""
    sql = ("SELECT p.id FROM sessions s JOIN sessions p ON p.id = s.parent_session_id"
           f" WHERE s.id = {_param_mark(conn)} AND p.end_reason = '{COMPRESSION}'")
    key, seen = session_id, {session_id}
    for _hop in range(MAX_DEPTH):
        row = conn.execute(sql, (key,)).fetchone()
        if row is None or row[0] in seen:
            break
        key = row[0]
        seen.add(key)
    return key


def _collect_delegate_child_ids(conn: sqlite3.Connection, parent_ids: list[str]) -> list[str]:
    """Every session delegated (recursively) from ``parent_ids``, the parents left out."""
    parents = [p for p in dict.fromkeys(parent_ids) if isinstance(p, str) and p]
    if not parents:
        return []
    marks = ",".join("?" * len(parents))
    rows = conn.execute(delegate_tree_sql(marks, _delegate_from_json), parents).fetchall()
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


__all__ = [
    "FTS_CJK_STALE_KEY",
    "FTS_STORAGE_VERSION",
    "MAX_FTS5_QUERY_CHARS",
    "fts5_cjk_so_path",
    "is_malformed_db_error",
    "load_fts5_cjk_extension",
    "workspace_key",
]


# ----------------------------------------------------------------------------- DDL strings

def head_table_sql(table: str) -> tuple[str | None, list[str]]:
    """Our head's ``CREATE TABLE`` of ``table`` (None if head has no such table), and the
    ``CREATE INDEX``/``CREATE TRIGGER`` statements on it: the shape a rebuild restores."""
    ddl_strings()
    create = next((sql for kind, name, _t, sql in _head_objects if kind == "table" and name == table), None)
    extras = [sql for kind, _n, tbl, sql in _head_objects if kind in ("index", "trigger") and tbl == table]
    return create, extras


#: Hermes' DDL constants, served from a database our migrations built (see :func:`ddl_strings`).
DDL_NAMES = (
    "SCHEMA_SQL", "DEFERRED_INDEX_SQL", "FTS_SQL", "FTS_TRIGRAM_SQL", "FTS_CJK_TABLE_SQL",
    "FTS_CJK_TRIGGER_SQL", "LEGACY_FTS_SQL", "LEGACY_FTS_TRIGRAM_SQL",
)
_ddl_cache: dict[str, str] = {}
#: ``(type, name, tbl_name, sql)`` of every object at head, filled by :func:`ddl_strings`.
_head_objects: list[tuple[str, str, str, str]] = []


def _objects(path: Path) -> list[tuple[str, str, str, str]]:
    conn = sqlite3.connect(str(path))
    try:
        return [tuple(r) for r in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
        )]
    finally:
        conn.close()


#: A CREATE statement without ``IF NOT EXISTS`` (what ``sqlite_master`` keeps).
_BARE_CREATE = re.compile(
    r"^(\s*CREATE\s+(?:UNIQUE\s+|VIRTUAL\s+)?(?:TABLE|INDEX|VIEW|TRIGGER)\s+)(?!IF\s+NOT\s+EXISTS\b)", re.I)


def _script(statements: list[str]) -> str:
    """One executable script, every CREATE made ``IF NOT EXISTS`` as Hermes writes its
    own: ``executescript(SCHEMA_SQL)`` on a file that has the tables is a no-op, not
    "table gateway_routing already exists"."""
    return "".join(_BARE_CREATE.sub(r"\1IF NOT EXISTS ", s, count=1).rstrip().rstrip(";") + ";\n"
                   for s in statements)


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
    _head_objects[:] = now
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
