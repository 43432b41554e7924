"""Hermes' ``hermes_state_schema``: ``SessionSchemaMixin`` and ``schema_read_probe_statements``.

Hermes heals older layouts in place at every open; our migrations do that work
before a SessionDB opens a file (``hermes_store.migrations.upgrade``), so on a file
we opened these helpers find a healthy schema and change nothing. They work on the
``sqlite3`` cursor Hermes' own code hands them and keep its answers, for the callers
and tests that reach them directly.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import sqlite3
from typing import Any, Dict, Tuple

from sqlalchemy import Connection

from ..dialects.fts5 import FTS_TRASH_PREFIX
from ..hermes_config import hermes_home
from ..hermes_names import ddl_strings, head_table_sql
from ..keys import FTS_CJK_STALE_KEY
from ..patch_points import facade_value
from ..repositories import FtsUpkeepRepository
from ..sessiondb._host import Host
from .common import _FTS_TRIGGERS, escape_like

log = logging.getLogger("hermes_state")

#: The primary key Hermes v26 heals an older ``gateway_routing`` to.
_ROUTING_PK = ("scope", "session_key")
#: Columns an FTS UPDATE trigger needs to watch (the word index's, a superset of the others').
_FTS_WATCHED = "content, tool_name, tool_calls, role"
#: Trash rows dropped per teardown step.
_TRASH_STEP_ROWS = 500
_CONSTRAINTS = ("PRIMARY", "UNIQUE", "FOREIGN", "CHECK", "CONSTRAINT")
_CREATE_TABLE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?[\"`\[]?(\w+)[\"`\]]?\s*\(", re.I)
_BROAD_UPDATE = re.compile(r"AFTER\s+UPDATE\s+ON\s+", re.I)
_UPDATE_OF = re.compile(r"AFTER\s+UPDATE\s+OF\s+(.+?)\s+ON\s+", re.I | re.S)
#: The CJK-tokenizer index's update trigger: never re-created here (see _migrate_broad_fts_update_triggers).
_CJK_UPDATE_TRIGGER = "messages_fts_cjk_update"


@functools.cache
def schema_read_probe_statements() -> tuple:
    """One zero-row SELECT per table of ``SCHEMA_SQL`` naming every declared column as
    ``"<t>"."<c>"``: running them all proves a file has the columns a reader needs (a
    missing one fails with "no such column"). Built once; the same tuple every call."""
    statements = []
    for table, columns in _parse_columns(ddl_strings()["SCHEMA_SQL"]).items():
        cols = ", ".join(f"{_ident(table)}.{_ident(c)}" for c in columns)
        statements.append(f"SELECT {cols} FROM {_ident(table)} WHERE 0")
    return tuple(statements)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _fts_triggers() -> tuple:
    """``hermes_state._FTS_TRIGGERS`` as it is now."""
    return tuple(facade_value("_FTS_TRIGGERS", _FTS_TRIGGERS))


def _watched_columns(name: str) -> str:
    """The columns our head's trigger ``name`` fires on, else the word index's superset."""
    create, extras = head_table_sql("messages")
    for sql in extras if create is not None else []:
        found = _UPDATE_OF.search(sql)
        if found and re.search(rf"\bTRIGGER\s+(?:IF\s+NOT\s+EXISTS\s+)?\"?{re.escape(name)}\b", sql, re.I):
            return " ".join(found.group(1).split())
    return _FTS_WATCHED


def _split_top_level(body: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _parse_columns(sql: str) -> Dict[str, Dict[str, str]]:
    tables: Dict[str, Dict[str, str]] = {}
    for match in _CREATE_TABLE.finditer(sql):
        depth, end = 1, match.end()
        while end < len(sql) and depth:
            depth += {"(": 1, ")": -1}.get(sql[end], 0)
            end += 1
        columns: Dict[str, str] = {}
        for part in _split_top_level(sql[match.end():end - 1]):
            first = part.split(None, 1)
            if first[0].upper() in _CONSTRAINTS:
                continue
            columns[first[0].strip('"`[]')] = first[1].strip() if len(first) > 1 else ""
        tables[match.group(1)] = columns
    return tables


class SessionSchemaMixin(Host):
    """Hermes' open-time schema healing, on a ``sqlite3`` cursor."""

    @staticmethod
    def _fts_update_trigger_needs_narrowing(sql: str) -> bool:
        """A broad ``AFTER UPDATE ON`` trigger (fires on every column) rather than ``AFTER UPDATE OF``."""
        text = " ".join((sql or "").split()).upper()
        return "AFTER UPDATE ON" in text and "AFTER UPDATE OF" not in text

    @staticmethod
    def _parse_schema_columns(sql: str) -> Dict[str, Dict[str, str]]:
        """``{table: {column: type expression}}`` of the CREATE TABLEs in ``sql``, cached
        in ``$HERMES_HOME/cache/schema_columns.json`` by the script's hash."""
        digest = hashlib.sha256((sql or "").encode("utf-8")).hexdigest()
        cache = hermes_home() / "cache" / "schema_columns.json"
        try:
            stored = json.loads(cache.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stored = {}
        if isinstance(stored, dict) and isinstance(stored.get(digest), dict):
            return stored[digest]
        parsed = _parse_columns(sql or "")
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({digest: parsed}), encoding="utf-8")
        except OSError:
            pass  # a cache only
        return parsed

    def _reconcile_columns(self, cursor: sqlite3.Cursor) -> None:
        """ADD the columns Hermes' schema declares that the file lacks (types never checked)."""
        declared = self._parse_schema_columns(ddl_strings()["SCHEMA_SQL"])
        for table, columns in declared.items():
            have = {r[1] for r in cursor.execute(f'PRAGMA table_info("{table}")').fetchall()}
            if not have:
                continue
            for column, type_expr in columns.items():
                if column in have:
                    continue
                try:
                    cursor.execute(f'ALTER TABLE "{table}" ADD COLUMN "{column}" {type_expr}')
                except sqlite3.OperationalError as exc:
                    text = str(exc).lower()
                    if "duplicate column" in text:
                        log.debug("column %s.%s appeared meanwhile", table, column)
                    elif "locked" in text or "busy" in text:
                        raise
                    else:
                        log.warning("could not reconcile column %s.%s: %s", table, column, exc)

    @staticmethod
    def _pk_columns(cursor: sqlite3.Cursor, table: str) -> Tuple[str, ...]:
        rows = cursor.execute(f'PRAGMA table_info("{table}")').fetchall()
        return tuple(r[1] for r in sorted((r for r in rows if r[5]), key=lambda r: r[5]))

    def _heal_gateway_routing_pk(self, cursor: sqlite3.Cursor) -> bool:
        """Rebuild an older ``gateway_routing`` (keyed without ``scope``) to the key
        ``(scope, session_key)``, every row kept; False when it is healthy or absent."""
        found = self._pk_columns(cursor, "gateway_routing")
        if not found or found == _ROUTING_PK:
            return False
        return self._rebuild_to_head_shape(cursor, "gateway_routing", f"primary key {found}")

    def _heal_session_model_usage_pk(self, cursor: sqlite3.Cursor) -> bool:
        """Rebuild a usage ledger whose key lacks ``task`` to the head key, every row kept
        (orphans too: foreign keys are off for it); False when healthy or absent."""
        found = self._pk_columns(cursor, "session_model_usage")
        if not found or "task" in found:
            return False
        return self._rebuild_to_head_shape(cursor, "session_model_usage", f"primary key {found}")

    @staticmethod
    def _rebuild_to_head_shape(cursor: sqlite3.Cursor, table: str, why: str) -> bool:
        """Copy ``table`` into our head's definition of it, in one savepoint: new table,
        rows by column name (head defaults fill new columns), old table dropped, new one
        renamed, its indexes made. Any failure puts everything back and logs; False then.

        Foreign keys are switched off around it when no transaction is open (a ledger
        row may outlive its session, and Hermes keeps those). The rename runs with
        ``legacy_alter_table`` on, so a view elsewhere cannot block it.
        """
        create, extras = head_table_sql(table)
        if create is None:
            return False
        conn = cursor.connection
        old_cols = [r[1] for r in cursor.execute(f'PRAGMA table_info("{table}")')]
        temp = f"{table}__hermes_store_rebuild"
        restore_fk = not conn.in_transaction and bool(cursor.execute("PRAGMA foreign_keys").fetchone()[0])
        if restore_fk:
            cursor.execute("PRAGMA foreign_keys = OFF")  # only outside a transaction; see the docstring
        legacy = cursor.execute("PRAGMA legacy_alter_table").fetchone()[0]
        cursor.execute("PRAGMA legacy_alter_table = ON")  # rename without re-checking every view
        cursor.execute("SAVEPOINT hermes_store_heal")
        try:
            cursor.execute(f'DROP TABLE IF EXISTS "{temp}"')
            cursor.execute(_CREATE_TABLE.sub(f'CREATE TABLE "{temp}" (', create, count=1))
            shared = ", ".join(f'"{r[1]}"' for r in cursor.execute(f'PRAGMA table_info("{temp}")') if r[1] in old_cols)
            cursor.execute(f'INSERT INTO "{temp}" ({shared}) SELECT {shared} FROM "{table}"')
            cursor.execute(f'DROP TABLE "{table}"')
            cursor.execute(f'ALTER TABLE "{temp}" RENAME TO "{table}"')
            for sql in extras:
                cursor.execute(sql)
            cursor.execute("RELEASE hermes_store_heal")
        except sqlite3.Error as exc:
            cursor.execute("ROLLBACK TO hermes_store_heal")
            cursor.execute("RELEASE hermes_store_heal")
            if "locked" in str(exc).lower() or "busy" in str(exc).lower():
                raise
            log.warning("could not rebuild %s (%s): %s; left as it was", table, why, exc)
            return False
        finally:
            cursor.execute(f"PRAGMA legacy_alter_table = {int(legacy)}")
            if restore_fk:
                cursor.execute("PRAGMA foreign_keys = ON")
        log.info("rebuilt %s to its current primary key (it had %s)", table, why)
        return True

    def _migrate_broad_fts_update_triggers(self, cursor: sqlite3.Cursor) -> int:
        """Hermes v24's in-place migration, run at every open: an FTS UPDATE trigger that
        fires on every column (``AFTER UPDATE ON``) is dropped and re-created as ``AFTER
        UPDATE OF <indexed columns>``, its body unchanged (no FTS rebuild). The
        CJK-tokenizer index's trigger cannot be re-created without Hermes' tokenizer, which
        we do not ship: it stays dropped and ``fts_cjk_stale`` is set. Returns how many
        triggers were migrated (the dropped CJK one included)."""
        names = [n for n in _fts_triggers() if n.endswith("_update")]
        if not names:
            return 0
        marks = ", ".join("?" * len(names))
        rows = cursor.execute(
            f"SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name IN ({marks})", names
        ).fetchall()
        changed = 0
        cjk_dropped = False
        for name, sql in rows:
            if not self._fts_update_trigger_needs_narrowing(sql):
                continue
            cursor.execute(f"DROP TRIGGER IF EXISTS {_ident(name)}")
            changed += 1
            if name == _CJK_UPDATE_TRIGGER:
                cjk_dropped = True
                continue
            cursor.execute(_BROAD_UPDATE.sub(f"AFTER UPDATE OF {_watched_columns(name)} ON ", sql, count=1))
        if cjk_dropped:
            _mark_cjk_stale(cursor)
        if changed:
            log.info("narrowed %d broad FTS UPDATE trigger(s) to AFTER UPDATE OF", changed)
        return changed

    def _ensure_fts_cjk_schema(self, cursor: sqlite3.Cursor) -> bool:
        """False: the CJK-tokenizer index needs Hermes' loadable tokenizer, which we do not
        ship (CJK text is served by the trigram and short-CJK indexes)."""
        return False

    def _drop_fts_triggers(self, cursor: sqlite3.Cursor) -> int:
        """Drop every trigger feeding an FTS index (``_FTS_TRIGGERS``, and any other
        ``messages_fts*`` trigger): the fail-open step. Returns how many existed."""
        names = set(_fts_triggers())
        names.update(r[0] for r in cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'messages\\_fts%' ESCAPE '\\'"
        ).fetchall())
        existing = {r[0] for r in cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall()}
        for name in sorted(names & existing):
            cursor.execute(f"DROP TRIGGER IF EXISTS {_ident(name)}")
        return len(names & existing)

    def _has_fts_trash(self, cursor: Any = None) -> bool:
        """Whether tables of a demoted pre-v23 index (``fts_v22_trash_*``) remain: on the
        cursor or connection Hermes hands in, else on this store."""
        def look(c: Connection) -> bool:
            fts5 = FtsUpkeepRepository(c).fts5
            return fts5 is not None and bool(fts5.trash_tables(c))

        if cursor is None:
            return bool(self._read(look))
        if isinstance(cursor, Connection):
            return look(cursor)
        row = cursor.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name LIKE ? ESCAPE '\\' LIMIT 1",
            (escape_like(FTS_TRASH_PREFIX) + "%",),
        ).fetchone()
        return row is not None

    def _fts_teardown_trash_step(self) -> bool:
        """Drop up to 500 trash rows (a table once empty); True while trash remains."""
        if self.read_only:
            return self._has_fts_trash()
        _deleted, remains = self._write(lambda c: FtsUpkeepRepository(c).teardown_chunk(_TRASH_STEP_ROWS),
                                        _maintenance=True)
        return remains

    def _repair_optimize_bookkeeping(self) -> bool:
        """Hermes v25's heal before optimize-storage: a backfill mark without progress
        gets progress 0 (its partial index emptied, so every row is indexed once); an
        empty index beside messages gets a full backfill window. True if it seeded keys."""
        if self.read_only or not getattr(self, "_fts_enabled", True):
            return False
        return bool(self._write(lambda c: FtsUpkeepRepository(c).heal_optimize_bookkeeping(), _maintenance=True))


def _mark_cjk_stale(cursor: sqlite3.Cursor) -> None:
    """``state_meta('fts_cjk_stale', '1')``: the CJK index misses rows until a capable host rebuilds it."""
    try:
        cursor.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, '1')", (FTS_CJK_STALE_KEY,))
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc).lower():
            raise
        log.debug("no state_meta table to mark %s in", FTS_CJK_STALE_KEY)


__all__ = ["FTS_TRASH_PREFIX", "SessionSchemaMixin", "schema_read_probe_statements"]
