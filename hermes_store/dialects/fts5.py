"""SQLite's FTS5 storage: an optional capability of a dialect (``Dialect.fts5``).

Hermes v23's optimize-storage machinery (see repositories/fts_upkeep.py for the
portable half) is about FTS5 virtual tables: which of Hermes' tables exist and
answer, chunked backfill of an external-content index, the pre-v23 ("legacy",
inline) layout and its demotion to plain ``fts_v22_trash_*`` tables, and the chunked
teardown of those. A dialect whose search runs on indexes the server keeps complete
(PostgreSQL's GIN indexes) has no such storage: its ``fts5`` is None, and callers
take the answer "no FTS5 table" from that.

A leaf of the dialects package: it imports neither the package nor a dialect module.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from pathlib import Path
from collections.abc import Sequence

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from .. import errors
from ..search.fts import FTS_INDEXES, MERGE_PAGES

# Warnings keep the facade's logger name: that is where users have filters for them.
log = logging.getLogger("hermes_store.facade")

#: Suffixes of the shadow tables FTS5 keeps next to each virtual table.
FTS_SHADOWS = ("_data", "_idx", "_content", "_docsize", "_config")
#: Hermes' FTS5 tables (v23 ``_FTS_TABLES``): word, trigram, and the optional CJK one.
WORD_FTS, TRIGRAM_FTS, CJK_FTS = HERMES_FTS_TABLES = ("messages_fts", "messages_fts_trigram", "messages_fts_cjk")
#: Name prefix of the plain tables a demoted pre-v23 index leaves (Hermes' ``_FTS_TRASH_PREFIX``).
FTS_TRASH_PREFIX = "fts_v22_trash_"
_OPTION = r"\b{}\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|([^\s,)]+))"

#: (type, name, CREATE) of an FTS object, as ``sqlite_master`` keeps it.
FtsObject = tuple[str, str, str]


def _quote(name: str) -> str:
    """A double-quoted SQLite identifier."""
    return '"' + name.replace('"', '""') + '"'


def _like_prefix(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _fts_option(sql: str, option: str) -> str | None:
    """An option (``content``, ``content_rowid``...) of a stored ``CREATE VIRTUAL TABLE``."""
    found = re.search(_OPTION.format(re.escape(option)), sql, re.I)
    return None if found is None else next(g for g in found.groups() if g is not None)


def fts5_command(conn: Connection, index: str, cmd: str) -> None:
    """Run an FTS5 special command ('rebuild', 'optimize', 'merge', 'integrity-check', 'delete-all')."""
    if cmd == "integrity-check":
        # rank=1 also compares the index with its external content.
        conn.exec_driver_sql(f"INSERT INTO {index}({index}, rank) VALUES('integrity-check', 1)")
    elif cmd == "merge":
        # Bounded upkeep: at most about MERGE_PAGES pages of segment merging, and
        # only where automerge left a level with enough segments (positive N).
        conn.exec_driver_sql(f"INSERT INTO {index}({index}, rank) VALUES('merge', {MERGE_PAGES})")
    else:
        conn.exec_driver_sql(f"INSERT INTO {index}({index}) VALUES('{cmd}')")


def existing_indexes(conn: Connection) -> list[str]:
    """Our two message indexes (word, trigram) this file has as FTS5 virtual tables."""
    names = {
        r[0]
        for r in conn.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type='table' AND sql LIKE 'CREATE VIRTUAL TABLE%'"
        )
    }
    return [i for i in FTS_INDEXES if i in names]


def fts_objects_of(path: Path | str) -> tuple[FtsObject, ...]:
    """(type, name, CREATE) of every message FTS object of the SQLite file at ``path``
    in creation order: views, then the virtual tables, then the triggers that feed them
    (the CJK index is Hermes' optional one, never ours, and is left out).

    Read from a file our migrations built, this is the layout a demotion creates
    (see :func:`hermes_store.operations.fts.head_fts_objects`).
    """
    raw = sqlite3.connect(str(path))
    try:
        rows = raw.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL"
            " AND name LIKE 'messages\\_fts%' ESCAPE '\\' ORDER BY rowid"
        ).fetchall()
    finally:
        raw.close()
    rows = [r for r in rows if not r[1].startswith(CJK_FTS)]
    views = [r for r in rows if r[0] == "view"]
    tables = [r for r in rows if r[0] == "table" and r[2].upper().startswith("CREATE VIRTUAL TABLE")]
    triggers = [r for r in rows if r[0] == "trigger"]
    return tuple(views + tables + triggers)


class Fts5Storage:
    """Hermes' FTS5 tables in a SQLite file: what exists, backfill, legacy layout, trash."""

    def tables(self, conn: Connection) -> dict[str, str]:
        """Hermes' FTS5 tables this file has (word, trigram, CJK), with their stored CREATE."""
        rows = conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)", HERMES_FTS_TABLES
        ).fetchall()
        found = {name: sql or "" for name, sql in rows}
        return {name: found[name] for name in HERMES_FTS_TABLES if name in found}

    def table_exists(self, conn: Connection, name: str) -> bool:
        """A table (virtual, shadow or trash) of that name is in the schema."""
        return conn.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).first() is not None

    def queryable(self, conn: Connection, name: str) -> bool:
        """Whether FTS5 table ``name`` exists and can be read here (its module and
        tokenizer are loaded: a missing one fails when a statement is prepared)."""
        if name not in self.tables(conn):
            return False
        try:
            conn.exec_driver_sql(f"SELECT 1 FROM {_quote(name)} LIMIT 0").fetchall()
        except (DBAPIError, sqlite3.Error):
            return False
        return True

    def layout_is_legacy(self, conn: Connection) -> bool:
        """The word index has Hermes' pre-v23 inline shape (one column, no ``tool_name``)."""
        sql = self.tables(conn).get(WORD_FTS)
        return sql is not None and "tool_name" not in sql

    def backfill(self, conn: Connection, index: str, lo: int, hi: int, *, sweep: bool = False) -> int:
        """Index the rows ``lo < id <= hi`` of ``index``'s own content source.

        Rows the index already holds (its ``_docsize`` shadow table lists every indexed
        rowid) are skipped: FTS5 would silently index a rowid twice, which breaks the
        index. Without that table nothing can be told apart, so a ``sweep`` (repair of
        rows that should be there) does nothing, and a backfill inserts every row.
        Returns how many rows were inserted; an index without external content (no
        source to read back) gets none.
        """
        sql = self.tables(conn).get(index)
        source = _fts_option(sql or "", "content")
        if not source:
            return 0
        key = _fts_option(sql or "", "content_rowid") or "rowid"
        columns = [r[1] for r in conn.exec_driver_sql(f"PRAGMA table_info({_quote(index)})")]
        docsize = f"{index}_docsize"
        known = self.table_exists(conn, docsize)
        if sweep and not known:
            return 0
        skip = (
            f" AND {_quote(key)} NOT IN (SELECT id FROM {_quote(docsize)} WHERE id > :lo AND id <= :hi)"
            if known else ""
        )
        cols = ", ".join(_quote(c) for c in columns)
        return conn.execute(
            text(
                f"INSERT INTO {_quote(index)}(rowid, {cols}) SELECT {_quote(key)}, {cols} FROM {_quote(source)}"
                f" WHERE {_quote(key)} > :lo AND {_quote(key)} <= :hi{skip} ORDER BY {_quote(key)}"
            ),
            {"lo": int(lo), "hi": int(hi)},
        ).rowcount

    def rebuild_from_source(self, conn: Connection, index: str) -> None:
        """FTS5 ``'rebuild'``: the index is dropped and made again from its content."""
        fts5_command(conn, index, "rebuild")

    def trash_tables(self, conn: Connection) -> list[str]:
        """Plain tables left by a demotion (``fts_v22_trash_*``), by name."""
        return [
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ? ESCAPE '\\' ORDER BY name",
                (_like_prefix(FTS_TRASH_PREFIX),),
            )
        ]

    def trash_rows(self, conn: Connection) -> int:
        """Rows still held by the trash tables (progress of a teardown)."""
        return sum(
            int(conn.exec_driver_sql(f"SELECT count(*) FROM {_quote(name)}").scalar() or 0)
            for name in self.trash_tables(conn)
        )

    def trash_delete(self, conn: Connection, name: str, rows: int) -> int:
        """Delete up to ``rows`` rows of trash table ``name``; drop it once empty.

        Returns the rows deleted (0 when the table was empty and is now gone). Only
        ``fts_v22_trash_*`` tables are ever touched.
        """
        if not name.startswith(FTS_TRASH_PREFIX):
            raise errors.InvalidInputError(f"{name!r} is not an FTS trash table")
        sql = conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).scalar()
        if sql is None:
            return 0
        if "WITHOUT ROWID" in sql.upper():
            info = conn.exec_driver_sql(f"PRAGMA table_info({_quote(name)})").fetchall()
            key = ", ".join(_quote(r[1]) for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
        else:
            key = "rowid"
        deleted = conn.execute(
            text(f"DELETE FROM {_quote(name)} WHERE ({key}) IN (SELECT {key} FROM {_quote(name)} LIMIT :n)"),
            {"n": max(1, int(rows))},
        ).rowcount
        if not deleted:
            conn.exec_driver_sql(f"DROP TABLE {_quote(name)}")
        return deleted

    def demote_legacy(self, conn: Connection, head_objects: Sequence[FtsObject]) -> list[str]:
        """Replace Hermes' pre-v23 inline FTS tables with ``head_objects``, cheaply.

        As Hermes' ``_demote_legacy_fts_to_trash``: the old indexes' triggers go, their
        shadow tables are renamed to plain ``fts_v22_trash_*`` tables (emptied later in
        small chunks, so a big index never holds the write lock for long), the virtual
        table definitions are removed from the schema, and the head FTS objects (views,
        tables, gated triggers: ``(type, name, CREATE)`` in creation order, as
        :func:`fts_objects_of` reads them) are created empty. The caller sets the
        rebuild window markers in the same transaction; the backfill then fills the new
        indexes. Where the schema cannot be edited (a defensive-mode connection), the
        old table is dropped outright instead. Returns the demoted tables ([] when not
        legacy).
        """
        if not self.layout_is_legacy(conn):
            return []
        tables = self.tables(conn)
        demoted = [name for name in (WORD_FTS, TRIGRAM_FTS) if name in tables]
        for name, kind in conn.exec_driver_sql(
            "SELECT name, type FROM sqlite_master WHERE type IN ('trigger', 'view')"
            " AND name LIKE 'messages\\_fts%' ESCAPE '\\' AND name NOT LIKE 'messages\\_fts\\_cjk%' ESCAPE '\\'"
        ).fetchall():
            conn.exec_driver_sql(f"DROP {kind.upper()} IF EXISTS {_quote(name)}")
        for name in demoted:
            try:
                with conn.begin_nested():
                    self._move_shadows_to_trash(conn, name)
            except (DBAPIError, sqlite3.Error) as exc:
                log.warning("%s: could not keep the old index's pages for a chunked teardown (%s); dropping it",
                            name, exc)
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {_quote(name)}")
        for _kind, _name, sql in head_objects:
            conn.exec_driver_sql(sql)
        return demoted

    def _move_shadows_to_trash(self, conn: Connection, name: str) -> None:
        """Rename ``name``'s shadow tables to trash names and forget the virtual table."""
        existing = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for suffix in FTS_SHADOWS:
            shadow = name + suffix
            if shadow not in existing:
                continue
            target = FTS_TRASH_PREFIX + shadow
            n = 2
            while target in existing:
                target = f"{FTS_TRASH_PREFIX}{shadow}_{n}"
                n += 1
            conn.exec_driver_sql(f"ALTER TABLE {_quote(shadow)} RENAME TO {_quote(target)}")
            existing.add(target)
        # The module would drop the (now renamed) shadow tables with the table, and
        # cannot even be constructed without them: remove the definition itself, as
        # SQLite documents for a virtual table that can no longer be dropped.
        conn.exec_driver_sql("PRAGMA writable_schema = ON")
        try:
            conn.exec_driver_sql("DELETE FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        finally:
            conn.exec_driver_sql("PRAGMA writable_schema = RESET")  # off, and the schema is read again


class NoFts5Storage(Fts5Storage):
    """The FTS5 storage of a database that has none (a server's search runs on indexes it
    keeps complete): no table, nothing to backfill, demote or tear down, and not one
    statement sent to ask. What ``Dialect.fts5_storage`` is there, so callers ask
    questions instead of testing for None."""

    def tables(self, conn: Connection) -> dict[str, str]:
        return {}

    def table_exists(self, conn: Connection, name: str) -> bool:
        return False

    def queryable(self, conn: Connection, name: str) -> bool:
        return False

    def layout_is_legacy(self, conn: Connection) -> bool:
        return False

    def backfill(self, conn: Connection, index: str, lo: int, hi: int, *, sweep: bool = False) -> int:
        return 0

    def rebuild_from_source(self, conn: Connection, index: str) -> None:
        return None

    def trash_tables(self, conn: Connection) -> list[str]:
        return []

    def trash_rows(self, conn: Connection) -> int:
        return 0

    def trash_delete(self, conn: Connection, name: str, rows: int) -> int:
        return 0

    def demote_legacy(self, conn: Connection, head_objects: Sequence[FtsObject]) -> list[str]:
        return []


#: The one storage of databases without FTS5 tables.
NO_FTS5_STORAGE = NoFts5Storage()
