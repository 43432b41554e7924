"""Pieces env.py needs to live politely inside SQLite and inside a host application.

* :func:`foreign_names` finds what autogenerate must not touch: FTS5 virtual tables,
  their shadow tables (``_data/_idx/_content/_docsize/_config``), views and SQLite
  internals. None of them is in our metadata, and none is ours to drop.
* :func:`keep_triggers_across_batch` repairs the known SQLite batch-mode trap: a
  table rebuild (create ``_alembic_tmp_X`` / copy / drop X / rename) silently drops
  every trigger on X, and the rename fails while a view still names X.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from sqlalchemy import Connection, event

SHADOW_SUFFIXES = ("_data", "_idx", "_content", "_docsize", "_config")

_CREATE_TMP = re.compile(r"^\s*CREATE TABLE\s+[\"`]?_alembic_tmp_(\w+)", re.I)
_RENAME_TMP = re.compile(r"^\s*ALTER TABLE\s+[\"`]?_alembic_tmp_(\w+)[\"`]?\s+RENAME TO", re.I)


def foreign_names(conn: Connection) -> set[str]:
    """Names in the file that autogenerate must ignore (FTS, shadows, views, internals)."""
    rows = conn.exec_driver_sql("SELECT type, name, sql FROM sqlite_master").all()
    names: set[str] = set()
    for type_, name, sql in rows:
        if name.startswith("sqlite_") or type_ == "view":
            names.add(name)
        elif type_ == "table" and (sql or "").lstrip().upper().startswith("CREATE VIRTUAL TABLE"):
            names.add(name)
            names.update(name + s for s in SHADOW_SUFFIXES)
    return names


def make_include_name(
    ignored: set[str], version_table: str
) -> Callable[[str | None, str, dict[str, Any]], bool]:
    """``include_name`` hook: reflect only plain tables that are not FTS machinery."""

    def include_name(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
        if type_ == "table":
            return name not in ignored and name != version_table
        return True

    return include_name


def keep_triggers_across_batch(conn: Connection) -> None:
    """Re-create triggers and views around every batch rebuild run on ``conn``."""
    saved: dict[str, tuple[list[str], list[str]]] = {}

    @event.listens_for(conn, "before_cursor_execute")
    def _before(c: Connection, cursor: Any, statement: str, *_: Any) -> None:
        m = _CREATE_TMP.match(statement)
        if not m:
            return
        table = m.group(1)
        # Snapshot through the raw cursor: executing through ``c`` would re-enter events.
        triggers = [
            r[0]
            for r in cursor.execute(
                "SELECT sql FROM sqlite_master WHERE type='trigger' AND tbl_name=? AND sql IS NOT NULL",
                (table,),
            ).fetchall()
        ]
        views = cursor.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='view' AND sql IS NOT NULL"
        ).fetchall()
        # A view naming the table would make the final RENAME fail; park it meanwhile.
        for name, _sql in views:
            cursor.execute(f'DROP VIEW "{name}"')
        saved[table] = (triggers, [sql for _n, sql in views])

    @event.listens_for(conn, "after_cursor_execute")
    def _after(c: Connection, cursor: Any, statement: str, *_: Any) -> None:
        m = _RENAME_TMP.match(statement)
        if not m or m.group(1) not in saved:
            return
        triggers, views = saved.pop(m.group(1))
        for sql in views:
            cursor.execute(sql)
        for sql in triggers:
            cursor.execute(sql)
