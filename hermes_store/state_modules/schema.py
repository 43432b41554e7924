"""Hermes' ``hermes_state_schema``: ``SessionSchemaMixin`` and ``schema_read_probe_statements``.

Hermes heals older layouts in place at every open; our migrations do that work
before a SessionDB opens a file (``hermes_store.migrations.upgrade``), so on a file
we opened these helpers find a healthy schema and change nothing. They work on the
``sqlite3`` cursor Hermes' own code hands them and keep its answers, for the callers
and tests that reach them directly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
from typing import Dict, Tuple

from sqlalchemy import Connection

from ..dialects.fts5 import FTS_TRASH_PREFIX
from ..hermes_config import hermes_home
from ..hermes_names import ddl_strings, head_table_sql
from ..models import metadata
from ..repositories import FtsUpkeepRepository
from ..sessiondb._host import Host

log = logging.getLogger("hermes_state")

#: Hermes v26's tables (ours add the short-CJK index and post-v26 tables, left out here).
_HERMES_TABLES = (
    "schema_version", "sessions", "messages", "state_meta", "compression_locks", "gateway_routing",
    "session_model_usage", "async_delegations", "system_prompts", "session_turn_leases", "gateway_hygiene_state",
)
#: The primary key Hermes v26 heals an older ``gateway_routing`` to.
_ROUTING_PK = ("scope", "session_key")
#: Columns an FTS UPDATE trigger needs to watch (the word index's, a superset of the others').
_FTS_WATCHED = "content, tool_name, tool_calls, role"
#: Trash rows dropped per teardown step.
_TRASH_STEP_ROWS = 500
_CONSTRAINTS = ("PRIMARY", "UNIQUE", "FOREIGN", "CHECK", "CONSTRAINT")
_CREATE_TABLE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?[\"`\[]?(\w+)[\"`\]]?\s*\(", re.I)
_BROAD_UPDATE = re.compile(r"AFTER\s+UPDATE\s+ON\s+", re.I)


def schema_read_probe_statements() -> tuple:
    """One zero-row SELECT per Hermes table naming every declared column as ``"<t>"."<c>"``:
    running them all proves a file has the columns a reader needs."""
    statements = []
    for name in _HERMES_TABLES:
        table = metadata.tables.get(name)
        if table is None:
            continue
        cols = ", ".join(f'"{name}"."{c.name}"' for c in table.columns)
        statements.append(f'SELECT {cols} FROM "{name}" WHERE 0')
    return tuple(statements)


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
        """Re-create broad FTS UPDATE triggers as ``AFTER UPDATE OF <indexed columns>``; how many."""
        rows = cursor.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'"
            " AND name LIKE 'messages\\_fts%' ESCAPE '\\'"
        ).fetchall()
        changed = 0
        for name, sql in rows:
            if not self._fts_update_trigger_needs_narrowing(sql):
                continue
            cursor.execute(f'DROP TRIGGER IF EXISTS "{name}"')
            cursor.execute(_BROAD_UPDATE.sub(f"AFTER UPDATE OF {_FTS_WATCHED} ON ", sql, count=1))
            changed += 1
        return changed

    def _ensure_fts_cjk_schema(self, cursor: sqlite3.Cursor) -> bool:
        """False: the CJK-tokenizer index needs Hermes' loadable tokenizer, which we do not
        ship (CJK text is served by the trigram and short-CJK indexes)."""
        return False

    def _drop_fts_triggers(self, cursor: sqlite3.Cursor) -> int:
        """Drop every trigger feeding an FTS index (the fail-open step); how many."""
        names = [r[0] for r in cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'messages\\_fts%' ESCAPE '\\'"
        ).fetchall()]
        for name in names:
            cursor.execute(f'DROP TRIGGER IF EXISTS "{name}"')
        return len(names)

    def _has_fts_trash(self) -> bool:
        """Whether tables of a demoted pre-v23 index (``fts_v22_trash_*``) remain."""
        def look(c: Connection) -> bool:
            fts5 = FtsUpkeepRepository(c).fts5
            return fts5 is not None and bool(fts5.trash_tables(c))

        return bool(self._read(look))

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


__all__ = ["FTS_TRASH_PREFIX", "SessionSchemaMixin", "schema_read_probe_statements"]
