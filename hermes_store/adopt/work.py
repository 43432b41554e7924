"""The copy: made, stamped, repaired, upgraded and verified next to the original.

Everything here writes only the private work file (``.state.db.adopting-*.tmp``); the
original is only read, through SQLite's backup API, which also folds in its
uncheckpointed WAL content. :func:`build_copy` returns the report of a copy that
passed every check; the swap (``swap.py``) decides when it replaces the original.
"""

from __future__ import annotations

import json
import re
import sqlite3
import tempfile
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any, Callable

from alembic import command

from .. import errors
from ..introspect import diff, snapshot
from ..paths import create_private_database, migration_connection, readonly_connection, run_alembic
from .shape import AdoptionReport, Detected, _q, _table_names
from .swap import step

Progress = Callable[[str, float], None]

#: state_meta keys of a pending v23 FTS rebuild; a full rebuild makes them obsolete.
FTS_WINDOW_KEYS = ("fts_rebuild_high_water", "fts_rebuild_progress")

#: What the v10-late, v11–v22 inline FTS tables index (NULLs as '').
INLINE_FTS_TEXT = "COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"

# The documented v10 FTS layout (both indexes external-content on messages.content),
# frozen here: a late-v10 file is converted to it so that revision 0011 finds what it
# expects. Same DDL as Hermes v10 / revision 0010.
V10_DOCUMENTED_FTS = [
    "DROP TRIGGER IF EXISTS messages_fts_insert",
    "DROP TRIGGER IF EXISTS messages_fts_delete",
    "DROP TRIGGER IF EXISTS messages_fts_update",
    "DROP TRIGGER IF EXISTS messages_fts_trigram_insert",
    "DROP TRIGGER IF EXISTS messages_fts_trigram_delete",
    "DROP TRIGGER IF EXISTS messages_fts_trigram_update",
    "DROP TABLE IF EXISTS messages_fts",
    "DROP TABLE IF EXISTS messages_fts_trigram",
    """CREATE VIRTUAL TABLE messages_fts USING fts5(
    content,
    content=messages,
    content_rowid=id
)""",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(
    content,
    content=messages,
    content_rowid=id,
    tokenize='trigram'
)""",
    """CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content) VALUES('delete', old.id, old.content);
END""",
    """CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (new.id, new.content);
END""",
    "INSERT INTO messages_fts(messages_fts) VALUES('rebuild')",
    "INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('rebuild')",
]

# ------------------------------------------------------------------ fresh schema and Alembic on the copy

_fresh_lock = threading.Lock()
_fresh_cache: dict[tuple[str, str], dict[str, Any]] = {}


def _fresh_snapshot(revision: str, version_table: str) -> dict[str, Any]:
    """Schema of an empty database upgraded to ``revision`` (what adoption must match)."""
    key = (revision, version_table)
    with _fresh_lock:
        if key not in _fresh_cache:
            with tempfile.TemporaryDirectory(prefix="hermes-store-fresh-") as tmp:
                fresh = Path(tmp) / "fresh.db"
                create_private_database(fresh)
                _upgrade_copy(fresh, revision, version_table=version_table)
                conn = sqlite3.connect(fresh)
                try:
                    _fresh_cache[key] = snapshot(conn)
                finally:
                    conn.close()
        return _fresh_cache[key]


def _stamp(path: Path, revision: str, *, version_table: str) -> None:
    """Record ``revision`` in the copy without running it."""
    with migration_connection(path) as conn:
        run_alembic(conn, command.stamp, revision, version_table=version_table)


def _upgrade_copy(path: Path, revision: str = "head", *, version_table: str) -> None:
    """Run our revisions on the copy (a plain upgrade: the copy is already stamped)."""
    with migration_connection(path) as conn:
        run_alembic(conn, command.upgrade, revision, version_table=version_table)


def _open_rw(p: Path) -> sqlite3.Connection:
    return sqlite3.connect(p, isolation_level=None)


def _fts_tables(conn: sqlite3.Connection) -> list[tuple[str, str, str | None]]:
    """(name, sql, external content table or None for inline) of every FTS5 table."""
    out = []
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%'"):
        if not re.search(r"using\s+fts5", sql, re.I):
            continue
        m = re.search(r"\bcontent\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|([^\s,)]+))", sql, re.I)
        content = None if m is None else next(g for g in m.groups() if g is not None)
        out.append((name, sql, content))
    return out


def _rebuild_fts(conn: sqlite3.Connection) -> list[str]:
    """Re-index every message in every FTS5 table of the file's current shape.

    External-content tables use FTS5's own ``'rebuild'``. The inline message indexes
    (late v10, v11–v22) are dropped and recreated from their own DDL, then refilled with
    the text their triggers index, so a damaged index cannot survive.
    """
    done = []
    for name, sql, content in _fts_tables(conn):
        if content:
            conn.execute(f"INSERT INTO {_q(name)}({_q(name)}) VALUES('rebuild')")
            done.append(name)
        elif content is None and name in ("messages_fts", "messages_fts_trigram"):
            cols = [r[1] for r in conn.execute(f"PRAGMA table_info({_q(name)})")]
            if cols != ["content"]:
                conn.execute(f"INSERT INTO {_q(name)}({_q(name)}) VALUES('rebuild')")
            else:
                conn.execute(f"DROP TABLE {_q(name)}")
                conn.execute(sql)
                conn.execute(f"INSERT INTO {_q(name)}(rowid, content) SELECT id, {INLINE_FTS_TEXT} FROM messages")
            done.append(name)
    # A pending v23 rebuild window would make the triggers skip rows we just indexed.
    if "state_meta" in _table_names(conn):
        conn.execute(f"DELETE FROM state_meta WHERE key IN ({', '.join('?' * len(FTS_WINDOW_KEYS))})", FTS_WINDOW_KEYS)
    return done


def _check_fts(conn: sqlite3.Connection) -> None:
    """FTS5 integrity-check on every index; inline message indexes must hold every message."""
    messages = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    for name, _sql, content in _fts_tables(conn):
        if content:
            conn.execute(f"INSERT INTO {_q(name)}({_q(name)}, rank) VALUES('integrity-check', 1)")
        else:
            conn.execute(f"INSERT INTO {_q(name)}({_q(name)}) VALUES('integrity-check')")
            if name in ("messages_fts", "messages_fts_trigram"):
                have = conn.execute(f"SELECT count(*) FROM {_q(name)}").fetchone()[0]
                if have != messages:
                    raise errors.AdoptionError(f"{name} indexes {have} of {messages} messages")


def _row_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows per plain table (FTS machinery and SQLite internals excluded)."""
    fts = {name for name, _s, _c in _fts_tables(conn)}
    shadows = {f"{n}_{s}" for n in fts for s in ("data", "idx", "content", "docsize", "config")}
    out = {}
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall():
        if name.startswith("sqlite_") or name in fts or name in shadows:
            continue
        if (sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            continue
        out[name] = conn.execute(f"SELECT count(*) FROM {_q(name)}").fetchone()[0]
    return out


def _comparable_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Row counts that adoption must keep equal.

    ``state_meta`` is counted without the keys hermes_store manages itself: revisions
    record bookkeeping under ``hermes_store.*`` (e.g. 0016's delegate markers), and a
    full FTS rebuild closes a pending v23 rebuild window (``fts_rebuild_*``).
    """
    counts = _row_counts(conn)
    if "state_meta" in counts:
        marks = ", ".join("?" * len(FTS_WINDOW_KEYS))
        counts["state_meta"] = conn.execute(
            f"SELECT count(*) FROM state_meta WHERE substr(key, 1, 13) <> 'hermes_store.' AND key NOT IN ({marks})",
            FTS_WINDOW_KEYS,
        ).fetchone()[0]
    return counts


def _strip_extras(live: dict[str, Any], det: Detected) -> dict[str, Any]:
    """``live`` without the unknown extras the original carried (they are kept on purpose)."""
    out = json.loads(json.dumps(live))
    for table, cols in det.extra_columns.items():
        spec = out["tables"].get(table)
        if spec is None:
            continue
        for col in cols:
            spec["columns"].pop(col, None)
            if col in spec["order"]:
                spec["order"].remove(col)
    for kind, names in det.extra_objects.items():
        for name in names:
            out[kind].pop(name, None)
    return out


def _missing_extras(live: dict[str, Any], det: Detected) -> list[str]:
    lost = [
        f"{table}.{col}"
        for table, cols in det.extra_columns.items()
        for col in cols
        if col not in live["tables"].get(table, {}).get("columns", {})
    ]
    lost += [f"{kind} {name}" for kind, names in det.extra_objects.items() for name in names if name not in live[kind]]
    return lost


def build_copy(
    p: Path, work: Path, det: Detected, target: str, vt: str, report_progress: Progress
) -> AdoptionReport:
    """Copy, stamp, repair, upgrade and verify ``work``; the original is only read."""
    report_progress("copy", 0.0)
    dst = _open_rw(work)
    try:
        with readonly_connection(p) as src:

            def _copy_progress(_status: int, remaining: int, total: int) -> None:
                report_progress("copy", 1.0 - remaining / total if total else 1.0)

            src.backup(dst, pages=4096, progress=_copy_progress)
        original_counts = _row_counts(dst)
        expected = _comparable_counts(dst)
    finally:
        dst.close()
    report_progress("copy", 1.0)
    step("copied")

    report_progress("upgrade", 0.0)
    _stamp(work, det.revision, version_table=vt)  # type: ignore[arg-type]
    conn = _open_rw(work)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for repair in det.repairs:
            if repair.kind == "fts_v10_late":
                for sql in V10_DOCUMENTED_FTS:
                    conn.execute(sql)
            else:
                conn.execute(repair.sql)  # type: ignore[arg-type]
        # External-content indexes corrupt themselves when a row they never indexed is
        # updated or deleted through a trigger; re-index before any revision runs (the
        # late-v10 conversion above already rebuilt its indexes).
        _canonical_ledger_fk(conn)
        converted = any(r.kind == "fts_v10_late" for r in det.repairs)
        if not converted and any(content for _n, _s, content in _fts_tables(conn)):
            _rebuild_fts(conn)
        step("repairing")  # a kill here leaves the copy with a hot journal
        conn.execute("COMMIT")
    except BaseException:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()

    if target != det.revision:
        _upgrade_copy(work, target, version_table=vt)
    report_progress("upgrade", 1.0)

    report_progress("verify", 0.0)
    notes = list(det.notes)
    conn = _open_rw(work)
    try:
        try:
            _check_fts(conn)
        except (sqlite3.DatabaseError, errors.AdoptionError) as first:
            conn.execute("BEGIN IMMEDIATE")
            _rebuild_fts(conn)
            conn.execute("COMMIT")
            _check_fts(conn)
            notes.append(f"full-text indexes were re-built after the upgrade ({first})")
        bad = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        if bad != ["ok"]:
            raise errors.AdoptionError(f"the adopted copy fails quick_check: {'; '.join(bad[:3])}")
        counts = _comparable_counts(conn)
        lost = {t: (n, counts.get(t)) for t, n in expected.items() if counts.get(t) != n}
        if lost:
            raise errors.AdoptionError(
                "row counts changed during adoption: "
                + ", ".join(f"{t} {a} -> {b}" for t, (a, b) in sorted(lost.items()))
            )
        live = snapshot(conn)
        at = conn.execute(f"SELECT version_num FROM {_q(vt)}").fetchone()
        if conn.in_transaction:
            conn.execute("COMMIT")
        # Back to a single file: no WAL content may be left behind when it is renamed.
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if mode == "wal":
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    for side in ("-wal", "-shm", "-journal"):
        f = Path(f"{work}{side}")
        if f.exists():
            if side == "-wal" and f.stat().st_size:
                raise errors.AdoptionError("the adopted copy still has WAL content after its last connection closed")
            f.unlink()

    if at is None or at[0] != target:
        raise errors.AdoptionError(f"the copy ended at revision {at and at[0]!r}, expected {target}")
    lost_extras = _missing_extras(live, det)
    if lost_extras:
        raise errors.AdoptionError(
            "the upgrade would lose data the original carries outside Hermes' schema: " + ", ".join(lost_extras)
        )
    problems = diff(_fresh_snapshot(target, vt), _strip_extras(live, det))
    if problems:
        raise errors.AdoptionError(
            "the adopted schema differs from a fresh upgrade:\n  " + "\n  ".join(problems)
        )
    report_progress("verify", 1.0)
    return AdoptionReport(
        path=p,
        adopted=True,
        message=f"adopted {p}: Hermes schema_version {det.schema_version} -> revision {target}",
        schema_version=det.schema_version,
        stamped=det.revision,
        revision=target,
        repairs=[r.description for r in det.repairs],
        notes=notes,
        row_counts=original_counts,
    )


_INLINE_LEDGER_FK = re.compile(r"\s+REFERENCES\s+sessions\s*\(\s*id\s*\)\s+ON\s+DELETE\s+CASCADE", re.I)


def _canonical_ledger_fk(conn: sqlite3.Connection) -> None:
    """Rewrite Hermes' inline ledger foreign key as a table-level clause.

    Hermes declares ``session_model_usage.session_id … REFERENCES sessions(id) ON DELETE
    CASCADE`` inline. SQLite enforces both spellings alike, but SQLAlchemy only reads
    ON DELETE from a table-level ``FOREIGN KEY`` clause, so an adopted v22/v23 file
    would make ``alembic check`` report a change our revisions never produce. The table
    is rebuilt (rows and indexes kept) with the clause our revisions write.
    """
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'session_model_usage'"
    ).fetchone()
    if row is None or not _INLINE_LEDGER_FK.search(row[0]) or "FOREIGN KEY" in row[0].upper():
        return
    body = _INLINE_LEDGER_FK.sub("", row[0], count=1).rstrip()
    if not body.endswith(")"):
        return
    body = body[:-1].rstrip() + ",\n    FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE\n)"
    indexes = [
        r[0]
        for r in conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'session_model_usage' AND sql IS NOT NULL"
        )
    ]
    cols = ", ".join(_q(r[1]) for r in conn.execute('PRAGMA table_info("session_model_usage")'))
    conn.execute("ALTER TABLE session_model_usage RENAME TO _hermes_store_ledger_old")
    conn.execute(body)
    conn.execute(f"INSERT INTO session_model_usage ({cols}) SELECT {cols} FROM _hermes_store_ledger_old")
    conn.execute("DROP TABLE _hermes_store_ledger_old")
    for sql in indexes:
        conn.execute(sql)
