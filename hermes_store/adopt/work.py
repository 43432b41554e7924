"""The copy: made, repaired, stamped, upgraded and verified next to the original.

Everything here writes only the private work file (``.state.db.adopting-*.tmp``); the
original is only read, through SQLite's backup API, which also folds in its
uncheckpointed WAL content. :func:`build_copy` returns the report of a copy that
passed every check; the swap (``swap.py``) decides when it replaces the original.
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from alembic import command

from .. import errors
from ..introspect import diff, snapshot
from ..keys import TOOL_HIGH_WATER_KEY
from ..paths import migration_connection, readonly_connection, revision_order, run_alembic
from .shape import (
    _LITERAL,
    _SPEC,
    AdoptionReport,
    Detected,
    Fresh,
    Repair,
    _fresh,
    _q,
    _table_names,
    fts_names,
    is_hermes_revision,
    title_renames,
)
from .swap import step

Progress = Callable[[str, float], None]

#: state_meta keys of a pending v23 FTS rebuild; a full rebuild makes them obsolete.
FTS_WINDOW_KEYS = ("fts_rebuild_high_water", "fts_rebuild_progress")
#: FTS bookkeeping in state_meta: rebuilt, moved or deleted with the indexes, not data.
FTS_BOOKKEEPING_KEYS = (*FTS_WINDOW_KEYS, TOOL_HIGH_WATER_KEY)
#: Prefix of the work tables adoption uses on the copy (never left behind).
WORK_TABLE_PREFIX = "_hermes_store_adopt_"

#: What the v10-late, v11–v22 inline FTS tables index (NULLs as '').
INLINE_FTS_TEXT = "COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"

# ------------------------------------------------------------------ fresh schema and Alembic on the copy

def _fresh_snapshot(revision: str, version_table: str) -> dict[str, Any]:
    """Schema of an empty database upgraded to ``revision`` (what adoption must match)."""
    return _fresh(revision, version_table).snapshot


def _stamp(path: Path, revision: str, *, version_table: str) -> None:
    """Record ``revision`` in the copy without running it."""
    with migration_connection(path) as conn:
        run_alembic(conn, command.stamp, revision, version_table=version_table)


def _upgrade_copy(path: Path, revision: str = "head", *, version_table: str) -> None:
    """Run our revisions on the copy (a plain upgrade: the copy is already stamped)."""
    with migration_connection(path) as conn:
        run_alembic(conn, command.upgrade, revision, version_table=version_table)


def _stamp_as_hermes(path: Path, revision: str, *, version_table: str) -> None:
    """Bring the copy of a Hermes file at ``revision`` (``00NN``) to that revision.

    Hermes' file has every Hermes revision up to NN applied but none of our own
    (``hs…``). Our own revisions add only objects of our own and alter none of Hermes',
    so they commute with Hermes' revisions: each one that lies before NN in the chain is
    applied on the file as it is (after stamping the revision just before it), then NN
    is stamped. Places in the chain decide "before", never the ids as numbers.
    """
    order = revision_order()
    at: str | None = None
    for i, rev in enumerate(order[: order.index(revision)]):
        if is_hermes_revision(rev):
            continue
        if i and at != order[i - 1]:
            _stamp(path, order[i - 1], version_table=version_table)
        _upgrade_copy(path, rev, version_table=version_table)
        at = rev
    if at != revision:
        _stamp(path, revision, version_table=version_table)


def _open_rw(p: Path) -> sqlite3.Connection:
    return sqlite3.connect(p, isolation_level=None)


def _fts_tables(conn: sqlite3.Connection) -> list[tuple[str, str, str | None]]:
    """(name, sql, external content table or None for inline) of every FTS5 table."""
    out = []
    for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%'"
    ):
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
    tables = _table_names(conn)
    bounded = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND sql LIKE ?)",
        (f"%{TOOL_HIGH_WATER_KEY}%",),
    ).fetchone()[0]
    if bounded and "state_meta" in tables:
        # v28–early-v30 triggers index a tool row truncated only above the mark; the
        # rebuild below indexes every row in full, so the mark moves to the last row
        # (what Hermes' own rebuild does), or a later delete would corrupt the index.
        conn.execute(
            "INSERT INTO state_meta (key, value) SELECT ?, CAST(COALESCE(MAX(id), 0) AS TEXT) FROM messages "
            "WHERE true ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (TOOL_HIGH_WATER_KEY,),
        )
    elif "state_meta" in tables:
        # No trigger reads the mark (FTS layout 3 indexes what its view computes): obsolete,
        # and Hermes deletes it when it moves a file to that layout.
        conn.execute("DELETE FROM state_meta WHERE key = ?", (TOOL_HIGH_WATER_KEY,))
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
    if "state_meta" in tables:
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
    record bookkeeping under ``hermes_store.*`` (e.g. 0016's delegate markers), and the
    FTS bookkeeping keys go with the indexes (a full rebuild closes a pending v23
    rebuild window, revision 0030 deletes v28's tool-row mark as Hermes' FTS layout 3 does).
    """
    counts = _row_counts(conn)
    if "state_meta" in counts:
        marks = ", ".join("?" * len(FTS_BOOKKEEPING_KEYS))
        counts["state_meta"] = conn.execute(
            f"SELECT count(*) FROM state_meta WHERE substr(key, 1, 13) <> 'hermes_store.' AND key NOT IN ({marks})",
            FTS_BOOKKEEPING_KEYS,
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
    with _write_transaction(work) as conn:
        aside = _apply_repairs(conn, det, lambda: _fresh(det.revision, vt))  # type: ignore[arg-type]
        _canonical_ledger_fk(conn)
        # External-content indexes corrupt themselves when a row they never indexed is
        # updated or deleted through a trigger; re-index before any revision runs (an
        # FTS reset above already did).
        reset = any(r.kind == "fts_reset" for r in det.repairs)
        if not reset and any(content for _n, _s, content in _fts_tables(conn)):
            _rebuild_fts(conn)
        step("repairing")  # a kill here leaves the copy with a hot journal

    _stamp_as_hermes(work, det.revision, version_table=vt)  # type: ignore[arg-type]
    if target != det.revision:
        _upgrade_copy(work, target, version_table=vt)
    if aside:
        _put_back(work, aside, target)
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
        hidden = hidden_sessions(conn)
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
        notes=notes + ([hidden_note(hidden, original_counts.get("sessions", 0))] if hidden else []),
        row_counts=original_counts,
        hidden_sessions=hidden,
    )


#: Why a kept session is not in the default list (``hermes-store sessions``,
#: ``list_sessions_rich``), in the order a session is counted under (first match wins).
HIDDEN_REASONS = (
    ("hidden", "hidden by the user", "hidden = 1"),
    ("archived", "archived", "archived = 1"),
    ("orphaned sub-agent runs", "sub-agent runs whose parent link was lost (tagged at v16)",
     "json_valid(model_config) AND json_extract(model_config, '$._delegate_from') = '__orphaned__'"),
    ("sub-agent runs", "sub-agent runs, listed under the session that started them",
     "json_valid(model_config) AND json_extract(model_config, '$._delegate_from') IS NOT NULL"),
    ("continuations", "continuations of a compressed or branched session, listed as one conversation",
     "parent_session_id IS NOT NULL"),
)


def hidden_sessions(conn: sqlite3.Connection) -> dict[str, int]:
    """How many sessions of the adopted copy the default session list leaves out, by reason."""
    cols = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    out: dict[str, int] = {}
    taken: list[str] = []
    for key, _why, predicate in HIDDEN_REASONS:
        if key in ("hidden", "archived") and key not in cols:
            continue
        not_before = "".join(f" AND NOT ({p})" for p in taken)
        n = conn.execute(f"SELECT count(*) FROM sessions WHERE ({predicate}){not_before}").fetchone()[0]
        taken.append(predicate)
        if n:
            out[key] = int(n)
    return out


def hidden_note(hidden: dict[str, int], total: int) -> str:
    """One sentence for the report: what of ``total`` sessions the list will not show."""
    why = dict((k, w) for k, w, _p in HIDDEN_REASONS)
    parts = "; ".join(f"{why[k]}: {n}" for k, n in hidden.items())
    return (f"{sum(hidden.values())} of {total} sessions are kept but not in the default session list: {parts}. "
            "`hermes-store sessions --all` (and --archived) shows them")


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
            "SELECT sql FROM sqlite_master"
            " WHERE type = 'index' AND tbl_name = 'session_model_usage' AND sql IS NOT NULL"
        )
    ]
    cols = ", ".join(_q(r[1]) for r in conn.execute('PRAGMA table_info("session_model_usage")'))
    conn.execute("ALTER TABLE session_model_usage RENAME TO _hermes_store_ledger_old")
    conn.execute(body)
    conn.execute(f"INSERT INTO session_model_usage ({cols}) SELECT {cols} FROM _hermes_store_ledger_old")
    conn.execute("DROP TABLE _hermes_store_ledger_old")
    for sql in indexes:
        conn.execute(sql)


# ------------------------------------------------------------------ repairs on the copy


@dataclass(frozen=True)
class SetAside:
    """Data of a later version's table or column, kept in a work table while the
    revisions run (the revision that creates the table/column would fail on it)."""

    table: str
    column: str | None  # None: the whole table
    work_table: str
    keys: tuple[str, ...] = ()


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """Stored columns of ``table`` (generated ones cannot be written)."""
    return [r[1] for r in conn.execute(f"PRAGMA table_xinfo({_q(table)})") if r[6] == 0]


def _row_keys(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    """Columns that identify a row of ``table`` across revisions: its primary key, else rowid."""
    pk = sorted((r[5], r[1]) for r in conn.execute(f"PRAGMA table_info({_q(table)})") if r[5])
    return tuple(name for _pos, name in pk) or ("rowid",)


def _set_aside(conn: sqlite3.Connection, repair: Repair, n: int) -> SetAside:
    """Copy a later version's data into an untyped work table (values stay as stored)."""
    table = repair.table
    assert table is not None
    work = f"{WORK_TABLE_PREFIX}{n}"
    if repair.column is None:
        cols = _columns(conn, table)
        conn.execute(f"CREATE TABLE {_q(work)} ({', '.join(_q(c) for c in cols)})")
        names = ", ".join(_q(c) for c in cols)
        conn.execute(f"INSERT INTO {_q(work)} ({names}) SELECT {names} FROM {_q(table)} ORDER BY rowid")
        conn.execute(f"DROP TABLE {_q(table)}")
        return SetAside(table, None, work)
    keys = _row_keys(conn, table)
    slots = [f"k{i}" for i in range(len(keys))]
    conn.execute(
        f"CREATE TABLE {_q(work)} ({', '.join(slots)}, v, PRIMARY KEY ({', '.join(slots)})) WITHOUT ROWID"
    )
    conn.execute(
        f"INSERT INTO {_q(work)} SELECT {', '.join(_q(k) for k in keys)}, {_q(repair.column)} FROM {_q(table)}"
    )
    if repair.sql:  # else the table's rebuild leaves the column out
        conn.execute(repair.sql)
    return SetAside(table, repair.column, work, keys)


@contextmanager
def _write_transaction(path: Path) -> Iterator[sqlite3.Connection]:
    """One BEGIN IMMEDIATE … COMMIT on the work copy, rolled back on any failure.

    Foreign keys are off: table rebuilds must not cascade (the default, said out loud).
    """
    conn = _open_rw(path)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("BEGIN IMMEDIATE")
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


def _put_back(path: Path, aside: list[SetAside], target: str) -> None:
    """Return set-aside data once the revisions have created its table/column again.

    The table's triggers are set aside meanwhile: putting data back is not an edit
    (it must not, say, reset v30's display order or touch the FTS indexes).
    """
    with _write_transaction(path) as conn:
        for item in aside:
            if item.table not in _table_names(conn) or (
                item.column is not None and item.column not in _columns(conn, item.table)
            ):
                what = item.table if item.column is None else f"{item.table}.{item.column}"
                raise errors.AdoptionError(
                    f"revision {target} has no {what}, which holds data in this file; adopt to a later revision"
                )
            triggers = conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? ORDER BY rowid",
                (item.table,),
            ).fetchall()
            for name, _sql in triggers:
                conn.execute(f"DROP TRIGGER {_q(name)}")
            if item.column is None:
                cols = _columns(conn, item.work_table)
                names = ", ".join(_q(c) for c in cols)
                # A row a revision already wrote identically (v25's prompt move puts a
                # prompt under the same content hash) is not written twice.
                same = " AND ".join(f"t.{_q(c)} IS w.{_q(c)}" for c in cols)
                conn.execute(
                    f"INSERT INTO {_q(item.table)} ({names}) SELECT {names} FROM {_q(item.work_table)} AS w "
                    f"WHERE NOT EXISTS (SELECT 1 FROM {_q(item.table)} AS t WHERE {same}) ORDER BY w.rowid"
                )
            else:
                match = " AND ".join(f"w.k{i} = {_q(item.table)}.{_q(k)}" for i, k in enumerate(item.keys))
                conn.execute(
                    f"UPDATE {_q(item.table)} SET {_q(item.column)} = "
                    f"(SELECT {_filled(conn, item.table, item.column, 'w.v')} FROM {_q(item.work_table)} AS w "
                    f"WHERE {match}) WHERE EXISTS (SELECT 1 FROM {_q(item.work_table)} AS w WHERE {match})"
                )
            conn.execute(f"DROP TABLE {_q(item.work_table)}")
            for _name, sql in triggers:
                conn.execute(sql)


def _filled(conn: sqlite3.Connection, table: str, column: str, value: str) -> str:
    """``value``, or the column's declared default where it is NULL and the column is
    NOT NULL (an early build declared the column nullable; Hermes' ``active IS NULL → 1``)."""
    for _cid, name, _type, notnull, dflt, _pk in conn.execute(f"PRAGMA table_info({_q(table)})"):
        if name == column and notnull and dflt is not None and _LITERAL.match(str(dflt)):
            return f"COALESCE({value}, {dflt})"
    return value


def _apply_repairs(conn: sqlite3.Connection, det: Detected, fresh: Callable[[], Fresh]) -> list[SetAside]:
    """Run :func:`~.shape.detect`'s repairs on the copy, in their order. Missing pieces
    come from ``fresh()`` (an empty file at the stamped revision: Hermes' DDL of that
    version; made only when needed). Returns the data set aside for :func:`_put_back`."""
    aside: list[SetAside] = []
    for repair in det.repairs:
        if repair.kind in ("set_aside_table", "set_aside_column"):
            aside.append(_set_aside(conn, repair, len(aside)))
        elif repair.kind in ("create_table", "create_object", "replace_object"):
            if repair.sql:
                conn.execute(repair.sql)
            conn.execute(fresh().objects[repair.name][2])  # type: ignore[index]
        elif repair.kind == "add_foreign_key":
            _add_foreign_keys(conn, repair.table, fresh().fks.get(repair.table, []))  # type: ignore[arg-type]
        elif repair.kind == "fts_reset":
            _reset_fts(conn, fresh())
        elif repair.kind == "rebuild_table":
            # A later version's column in a key (sql None) goes with the rebuild.
            leave = {
                r.column
                for r in det.repairs
                if r.kind in ("drop_column", "set_aside_column") and r.table == repair.table and not r.sql
            }
            _rebuild_as_declared(conn, repair.table, fresh(), leave)  # type: ignore[arg-type]
        elif repair.kind == "rename_titles":
            for rowid, _sid, _old, new in title_renames(conn):
                conn.execute("UPDATE sessions SET title = ? WHERE rowid = ?", (new, rowid))
        elif repair.sql:
            conn.execute(repair.sql)
    return aside


def _reset_fts(conn: sqlite3.Connection, fresh: Fresh) -> None:
    """Replace every Hermes full-text object by the stamped revision's, then re-index.

    Lossless: each index is derived from ``messages``. Covers a file without the
    trigram table (SQLite without the trigram tokenizer), without any FTS (SQLite
    without FTS5), with a missing or edited trigger, and the FTS layouts Hermes wrote
    under one version number (late v10, v29/v30 layouts 1–3).
    """
    names = fts_names()
    live = conn.execute("SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'table', 'view')").fetchall()
    rank = {"trigger": 0, "table": 1, "view": 2}
    for type_, name in sorted(live, key=lambda r: rank[r[0]]):
        if name in names:
            conn.execute(f"DROP {type_.upper()} {_q(name)}")
    wanted = [(t, sql) for name, (t, _tbl, sql) in fresh.objects.items() if name in names]
    for _type, sql in sorted(wanted, key=lambda r: -rank[r[0]]):
        conn.execute(sql)
    _rebuild_fts(conn)


def _add_foreign_keys(
    conn: sqlite3.Connection, table: str, wanted: list[tuple[str, str, str | None, str, str]]
) -> None:
    """Declare the foreign keys of ``wanted`` that ``table`` lacks, as table constraints.

    Hermes' reconciler adds v25's ``system_prompt_hash`` with ``ADD COLUMN`` and no
    ``REFERENCES``, so only files Hermes created at v25+ have that key; SQLite cannot
    add a constraint in place, so the table is rebuilt with it (rows and rowids kept).
    """
    have = {(r[3], r[2], r[4]) for r in conn.execute(f"PRAGMA foreign_key_list({_q(table)})")}
    clauses = []
    for col, parent, parent_col, on_update, on_delete in wanted:
        if (col, parent, parent_col) in have:
            continue
        clause = f"FOREIGN KEY ({_q(col)}) REFERENCES {_q(parent)}" + (f"({_q(parent_col)})" if parent_col else "")
        if on_delete and on_delete != "NO ACTION":
            clause += f" ON DELETE {on_delete}"
        if on_update and on_update != "NO ACTION":
            clause += f" ON UPDATE {on_update}"
        clauses.append(clause)
    if not clauses:
        return
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()[0]
    close = sql.rindex(")")
    body = sql[sql.index("(") : close].rstrip() + ",\n    " + ",\n    ".join(clauses) + "\n" + sql[close:]
    _rebuild_table(conn, table, body)


_NOT_NAME = r"[^A-Za-z0-9_$]"


def _rebuild_as_declared(conn: sqlite3.Connection, table: str, fresh: Fresh, leave: set[str | None]) -> None:
    """Rebuild ``table`` with the stamped revision's own ``CREATE TABLE`` (what Hermes'
    primary-key heals do), unknown extra columns re-added after it and the columns in
    ``leave`` (a later version's, holding only defaults) left out. A NULL in a column
    declared NOT NULL takes the declared default; every other value stays as stored."""
    sql = fresh.objects[table][2]
    wanted = fresh.snapshot["tables"][table]["columns"]
    extra, fill = [], {}
    for _cid, name, type_, notnull, dflt, _pk in conn.execute(f"PRAGMA table_info({_q(table)})").fetchall():
        if name in leave:
            continue
        if name not in wanted:
            extra.append(" ".join(
                [_q(name), type_ or ""]
                + (["NOT NULL"] if notnull else [])
                + ([f"DEFAULT {dflt}"] if dflt is not None else [])
            ))
            continue
        m = _SPEC.match(wanted[name])
        if m and m.group("nn") and m.group("dflt") is not None and _LITERAL.match(m.group("dflt")):
            fill[name] = m.group("dflt")
    _rebuild_table(conn, table, sql[sql.index("("):], extra=extra, fill=fill)


def _same_values(conn: sqlite3.Connection, old: str, new: str, cols: list[str], fill: dict[str, str]) -> bool:
    """Every value of ``cols`` in ``old`` (NULLs of ``fill`` as their default) is in
    ``new`` with the same storage class, and back."""
    def pick(filled: bool) -> str:
        exprs = [f"COALESCE({_q(c)}, {fill[c]})" if filled and c in fill else _q(c) for c in cols]
        return ", ".join(f"{e}, typeof({e})" for e in exprs)

    for a, b, filled in ((old, new, True), (new, old, False)):
        other = pick(not filled)
        differs = f"SELECT EXISTS (SELECT {pick(filled)} FROM {_q(a)} EXCEPT SELECT {other} FROM {_q(b)})"
        if conn.execute(differs).fetchone()[0]:
            return False
    return True


def _rebuild_table(
    conn: sqlite3.Connection,
    table: str,
    body: str,
    *,
    extra: list[str] | None = None,
    fill: dict[str, str] | None = None,
) -> None:
    """Replace ``table`` by ``CREATE TABLE table <body>``, keeping rows, rowids, the
    AUTOINCREMENT counter, indexes, triggers and views.

    The new table is filled under a work name and renamed; views and triggers that name
    the table are set aside meanwhile, since SQLite checks them when renaming.
    ``extra`` column definitions are added to the new table first. With ``fill``
    (column -> default SQL) NULLs of those columns are copied as the default, and a
    value the new declaration would store differently stops adoption instead.
    """
    work = f"{WORK_TABLE_PREFIX}rebuild"
    conn.execute(f"CREATE TABLE {_q(work)} {body}")
    for column in extra or ():
        conn.execute(f"ALTER TABLE {_q(work)} ADD COLUMN {column}")
    # Columns the new declaration leaves out (a later version's defaults) are not copied.
    kept = set(_columns(conn, work))
    cols = [c for c in _columns(conn, table) if c in kept]
    without_rowid = bool(re.search(r"\)\s*WITHOUT\s+ROWID", body, re.I))
    info = list(conn.execute(f"PRAGMA table_info({_q(table)})"))
    pk = [r for r in info if r[5]]
    alias = len(pk) == 1 and pk[0][2].upper() == "INTEGER"  # the rowid itself
    names = ", ".join(_q(c) for c in cols)
    values = names if fill is None else ", ".join(f"COALESCE({_q(c)}, {fill[c]})" if c in fill else _q(c) for c in cols)
    keep_rowid = "" if without_rowid or alias else "rowid, "
    mention = re.compile(rf"(^|{_NOT_NAME}){re.escape(table)}($|{_NOT_NAME})", re.I)
    indexes = [r[0] for r in conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL ORDER BY rowid",
        (table,),
    )]
    triggers = [
        (name, tbl, sql)
        for name, tbl, sql in conn.execute(
            "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY rowid"
        )
        if tbl == table or mention.search(sql)
    ]
    views = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY rowid").fetchall()
    seq = None
    if "sqlite_sequence" in _table_names(conn):
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
        seq = row[0] if row else None
    for name, _sql in views:
        conn.execute(f"DROP VIEW {_q(name)}")
    for name, tbl, _sql in triggers:
        if tbl != table:
            conn.execute(f"DROP TRIGGER {_q(name)}")
    conn.execute(f"INSERT INTO {_q(work)} ({keep_rowid}{names}) SELECT {keep_rowid}{values} FROM {_q(table)}")
    if fill is not None and not _same_values(conn, table, work, cols, fill):
        raise errors.AdoptionError(
            f"rebuilding {table} as Hermes' schema declares it would change stored values "
            "(a column's type differs); left unchanged"
        )
    conn.execute(f"DROP TABLE {_q(table)}")
    conn.execute(f"ALTER TABLE {_q(work)} RENAME TO {_q(table)}")
    if seq is not None:
        conn.execute("DELETE FROM sqlite_sequence WHERE name IN (?, ?)", (table, work))
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq))
    for sql in [*indexes, *(sql for _n, sql in views), *(sql for _n, _t, sql in triggers)]:
        conn.execute(sql)
