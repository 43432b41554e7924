"""What a file is: the Hermes ``schema_version`` and the real *shape* it has.

Read-only: nothing here writes. :func:`detect` compares the file's schema with the
reference schemas shipped in ``hermes_store/reference_schemas`` (``hermes_vNN.json`` is
the shape revision ``00NN`` reproduces; ``hermes_vNN_late`` / ``_early`` are other
shapes Hermes wrote under the same number) and lists what the copy needs repaired to
take the shape of revision ``00NN`` (:class:`Repair`), what it keeps as unknown extras,
and the problems adoption cannot repair. The result types of adoption live here too.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import tempfile
import threading
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command

from .. import errors
from ..introspect import diff, snapshot
from ..paths import (
    VERSION_TABLE,
    as_path,
    check_file,
    create_private_database,
    head,
    migration_connection,
    run_alembic,
    host_revision_raw,
    readonly_connection,
    revision_order,
    sqlite_refusal,
)

#: Tables a Hermes state.db always has.
HERMES_TABLES = frozenset({"schema_version", "sessions", "messages"})


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Repair:
    """One change the copy needs before the stamped revision's assumptions hold."""

    #: ``drop_object`` (an index/trigger/view of a later version), ``drop_table`` /
    #: ``drop_column`` (of a later version, holding nothing), ``set_aside_table`` /
    #: ``set_aside_column`` (of a later version, holding data: moved aside, dropped, and
    #: put back once the revision that creates it has run), ``add_column``,
    #: ``create_table``, ``rename_titles`` (duplicate titles made unique),
    #: ``rebuild_table`` (a table whose columns Hermes declares otherwise, e.g. an older
    #: primary key or a nullable ``messages.active``, rebuilt as the stamped revision
    #: declares it; NULLs of a NOT NULL column take its default, as Hermes does),
    #: ``add_foreign_key``, ``create_object`` / ``replace_object`` (an
    #: index/trigger/view of the stamped revision), ``fts_reset``.
    kind: str
    description: str
    table: str | None = None
    column: str | None = None
    sql: str | None = None
    #: Name of the index/trigger/view/table a ``*_object`` or ``create_table`` repair is about.
    name: str | None = None


@dataclass
class Detected:
    """What :func:`detect` found out about a file."""

    path: Path
    #: Hermes' ``schema_version`` (None for a file hermes_store already owns).
    schema_version: int | None
    #: Revision to stamp before upgrading; the current revision when already adopted.
    revision: str | None
    #: Name of the reference shape the file matches (``"hermes_v10_late"``…).
    shape: str | None = None
    repairs: list[Repair] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Shape differences adoption cannot repair; :func:`adopt` refuses while non-empty.
    problems: list[str] = field(default_factory=list)
    #: Unknown columns per table (kept as they are).
    extra_columns: dict[str, list[str]] = field(default_factory=dict)
    #: Unknown tables/indexes/triggers/views/virtual tables (kept as they are).
    extra_objects: dict[str, list[str]] = field(default_factory=dict)
    already_adopted: bool = False

    @property
    def adoptable(self) -> bool:
        return not self.already_adopted and not self.problems


@dataclass
class AdoptionReport:
    """Outcome of :func:`adopt`."""

    path: Path
    #: False when there was nothing to do (already a hermes_store database).
    adopted: bool
    message: str
    schema_version: int | None = None
    stamped: str | None = None
    revision: str | None = None
    backup_path: Path | None = None
    #: Always None since the backup folds the original's WAL in (kept for callers that read it).
    backup_wal_path: Path | None = None
    repairs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    row_counts: dict[str, int] = field(default_factory=dict)
    #: Sessions kept but not in the default session list, by why (see
    #: :data:`HIDDEN_REASONS`): a count of 5 sessions and a list of 1 is then explained.
    hidden_sessions: dict[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------ fresh schemas

_fresh_lock = threading.Lock()
_fresh_cache: dict[tuple[str, str], Fresh] = {}


@dataclass(frozen=True)
class Fresh:
    """An empty database upgraded to one revision: what adoption compares with and
    re-creates missing pieces from (the revisions hold Hermes' DDL verbatim)."""

    snapshot: dict[str, Any]
    #: name -> (type, table, sql) of every table, index, trigger and view.
    objects: dict[str, tuple[str, str, str]]
    #: table -> foreign keys as (column, parent table, parent column, ON UPDATE, ON DELETE).
    fks: dict[str, list[tuple[str, str, str | None, str, str]]]


def _fresh(revision: str, version_table: str) -> Fresh:
    key = (revision, version_table)
    with _fresh_lock:
        if key not in _fresh_cache:
            with tempfile.TemporaryDirectory(prefix="hermes-store-fresh-") as tmp:
                fresh = Path(tmp) / "fresh.db"
                create_private_database(fresh)
                with migration_connection(fresh) as mconn:
                    run_alembic(mconn, command.upgrade, revision, version_table=version_table)
                conn = sqlite3.connect(fresh)
                try:
                    objects = {
                        name: (type_, tbl, sql)
                        for type_, name, tbl, sql in conn.execute(
                            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
                        )
                    }
                    fks = {
                        name: [
                            (r[3], r[2], r[4], r[5], r[6])
                            for r in conn.execute(f"PRAGMA foreign_key_list({_q(name)})")
                        ]
                        for name, (type_, _t, _s) in objects.items()
                        if type_ == "table"
                    }
                    _fresh_cache[key] = Fresh(snapshot(conn), objects, fks)
                finally:
                    conn.close()
        return _fresh_cache[key]


# ------------------------------------------------------------------ reference data


@cache
def reference_schema(name: str) -> dict[str, Any]:
    """A normalized Hermes schema shipped in ``hermes_store/reference_schemas``."""
    res = resources.files("hermes_store").joinpath("reference_schemas", f"hermes_v{name}.json")
    try:
        return json.loads(res.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise errors.AdoptionError(f"no reference schema for Hermes v{name} in this installation") from exc


@cache
def reference_names() -> tuple[str, ...]:
    """Every shipped reference shape: ``"23"``, ``"23_late"``, ``"30_early"``..."""
    folder = resources.files("hermes_store").joinpath("reference_schemas")
    names = []
    for res in folder.iterdir():
        m = re.fullmatch(r"hermes_v(\d+(?:_[a-z]+)?)\.json", res.name)
        if m:
            names.append(m.group(1))
    return tuple(sorted(names, key=lambda n: (int(n.split("_")[0]), n)))


def _shapes(version: int) -> list[str]:
    """Reference shapes a Hermes file at ``version`` can have: the one our revision
    reproduces first, then the variants Hermes wrote under the same number (columns
    added without a version bump, other FTS layouts)."""
    return [str(version)] + [n for n in reference_names() if n.startswith(f"{version}_")]


@cache
def fts_names() -> frozenset[str]:
    """Names of Hermes' full-text objects in any known shape (tables, views, triggers).

    They hold nothing of their own: every index is derived from ``messages``, so
    adoption may replace them all with the stamped revision's and re-index. Hermes'
    optional CJK index (``messages_fts_cjk*``) needs a loadable tokenizer and is left
    alone, as an unknown extra.
    """
    names: set[str] = set()
    for n in reference_names():
        ref = reference_schema(n)
        for kind in ("virtual", "views", "triggers"):
            names.update(k for k in ref[kind] if k.startswith("messages_fts") and not k.startswith("messages_fts_cjk"))
    return frozenset(names)


def _later_objects(version: int, newest: int) -> dict[str, dict[str, Any]]:
    """What only later Hermes shapes create, with the spec/SQL they create it with.

    A file carries such "early" objects when Hermes added them without bumping
    ``schema_version`` (the declarative reconciler: the late-v23 and late-v26 shapes),
    when Hermes crashed between adding them and bumping the version (its migrations add
    columns first, bump last), or when a development build wrote it. The revision that
    creates them would then fail, so adoption takes them out first (and puts their data
    back afterwards).
    """
    own = reference_schema(str(version))
    kinds = ("tables", "columns", "indexes", "triggers", "views", "virtual", "table_shapes", "fks")
    out: dict[str, dict[str, Any]] = {k: {} for k in kinds}
    for name in reference_names():
        v = int(name.split("_")[0])
        if v < version or v > newest or name == str(version):
            continue
        ref = reference_schema(name)
        for t, spec in ref["tables"].items():
            own_cols = own["tables"].get(t, {}).get("columns", {})
            if t not in own["tables"]:
                out["tables"].setdefault(t, spec)
                # Every shape a later version gave the table (Hermes' tests build older
                # files on the current DDL, so a v10 file may carry v26's ledger).
                out["table_shapes"].setdefault(t, []).append(spec)
            for c, cspec in spec["columns"].items():
                if c not in own_cols:
                    out["columns"].setdefault(f"{t}.{c}", cspec)
            for fk in spec["fks"]:
                # A later key on a later column goes with that column.
                if fk.split("->")[0] not in own_cols:
                    out["fks"].setdefault(t, set()).add(fk)
        for kind in ("indexes", "triggers", "views", "virtual"):
            for n, sql in ref[kind].items():
                if n not in own[kind]:
                    out[kind].setdefault(n, sql)
    return out


@cache
def own_objects() -> dict[str, str]:
    """Objects only hermes_store's own revisions create (name -> ``table``/``index``/
    ``trigger``/``view``): no Hermes version has them.

    A Hermes-stamped file carries them when it was written by Hermes' code running on
    our ``SCHEMA_SQL`` (Hermes' own tests do that through the swapped module). Our
    revision that creates them would then fail, so adoption takes them out first and
    puts any rows back afterwards, as it does for a later Hermes version's tables.
    """
    hermes: set[str] = set()
    for n in reference_names():
        ref = reference_schema(n)
        for kind in ("tables", "indexes", "triggers", "views", "virtual"):
            hermes.update(ref[kind])
    fresh = _fresh(head(), VERSION_TABLE)
    virtual = [
        n for n, (t, _t, sql) in fresh.objects.items() if t == "table" and sql.upper().startswith("CREATE VIRTUAL")
    ]
    return {
        name: type_
        for name, (type_, _tbl, _sql) in fresh.objects.items()
        if name not in hermes
        and name != VERSION_TABLE
        and not name.startswith("sqlite_")
        and not any(name.startswith(f"{v}_") for v in virtual)
    }


_SPEC = re.compile(r"^(?P<type>.*?)(?P<nn> NOT NULL)?(?: DEFAULT (?P<dflt>.*?))?(?P<pk> PK\d+)?$")
_LITERAL = re.compile(r"^(-?\d+(\.\d+)?|'[^']*'|NULL|TRUE|FALSE)$", re.I)
#: The primary-key place at the end of a reference column spec (`` PK2``).
_PK = re.compile(r" PK\d+$")


def _add_column_sql(table: str, column: str, spec: str) -> str | None:
    """``ALTER TABLE … ADD COLUMN`` reproducing a reference column spec, if SQLite allows it."""
    m = _SPEC.match(spec)
    if not m or m.group("pk"):
        return None
    dflt = m.group("dflt")
    if dflt is not None and not _LITERAL.match(dflt):
        return None
    if m.group("nn") and dflt is None:
        return None
    parts = [f'ALTER TABLE "{table}" ADD COLUMN "{column}"']
    if m.group("type"):
        parts.append(m.group("type"))
    if m.group("nn"):
        parts.append("NOT NULL")
    if dflt is not None:
        parts.append(f"DEFAULT {dflt}")
    return " ".join(parts)


def _only_defaults(conn: sqlite3.Connection, table: str, column: str, spec: str) -> bool:
    """True when no row holds anything but NULL or the column's declared default."""
    m = _SPEC.match(spec)
    dflt = m.group("dflt") if m else None
    if dflt is not None and not _LITERAL.match(dflt):
        return False
    cond = f"{_q(column)} IS NOT NULL" + (f" AND {_q(column)} IS NOT {dflt}" if dflt is not None else "")
    return conn.execute(f"SELECT EXISTS (SELECT 1 FROM {_q(table)} WHERE {cond})").fetchone()[0] == 0


def _type_of(spec: str) -> str:
    """The declared type of a reference column spec (nullability, default and key place aside)."""
    m = _SPEC.match(spec)
    return m.group("type") if m else spec


def _nulls_without_default(conn: sqlite3.Connection, table: str, column: str, spec: str) -> bool:
    """True when ``column`` holds NULL but ``spec`` is NOT NULL without a literal default
    (Hermes' own declaration could not take those rows back)."""
    m = _SPEC.match(spec)
    if not m or not m.group("nn") or (m.group("dflt") is not None and _LITERAL.match(m.group("dflt"))):
        return False
    return conn.execute(f"SELECT EXISTS (SELECT 1 FROM {_q(table)} WHERE {_q(column)} IS NULL)").fetchone()[0] == 1


#: Order in which repairs run: take out what a later revision creates, then add what
#: the stamped revision assumes, then the full-text indexes (they read the final tables).
_REPAIR_ORDER = {
    "drop_object": 0,
    "drop_table": 1,
    "set_aside_table": 1,
    "drop_column": 2,
    "set_aside_column": 2,
    "add_column": 3,
    "create_table": 3,
    "rename_titles": 3,
    "rebuild_table": 4,
    "add_foreign_key": 4,
    "replace_object": 5,
    "create_object": 5,
    "fts_reset": 6,
}

_LABELS = {"indexes": "index", "triggers": "trigger", "views": "view", "virtual": "virtual table"}


def _compare(
    ref: dict[str, Any], live: dict[str, Any], later: dict[str, dict[str, Any]], conn: sqlite3.Connection
) -> Detected:
    """Classify how ``live`` differs from ``ref``: repairs, problems, harmless extras.

    Repaired, because nothing is lost: early objects (created by a later version than
    the file claims; their data is set aside and put back after the upgrade), missing
    columns Hermes' reconciler would add, missing tables, indexes, triggers and views
    (re-created from the stamped revision), a missing foreign key (migrated v25+ files
    lack ``system_prompt_hash``'s), and any difference in the full-text objects (every
    index is derived from ``messages``: replaced and re-indexed). Refused, as problems:
    a column whose type differs, a column or table Hermes never had the way the file
    has it, a foreign key Hermes never declared.
    """
    det = Detected(path=Path(), schema_version=None, revision=None)
    fts = fts_names()
    for table in live["tables"]:
        if table in ref["tables"]:
            continue
        want = later["tables"].get(table)
        if want is None and table not in fts and own_objects().get(table) == "table":
            det.repairs.append(_out_of_the_way(conn, table, "hermes_store's own revision creates it"))
            continue
        if want is None:
            det.extra_objects.setdefault("tables", []).append(table)
            continue
        got = live["tables"][table]
        if not any(
            got["columns"] == shape["columns"] and sorted(got["fks"]) == sorted(shape["fks"])
            for shape in later["table_shapes"].get(table, [want])
        ):
            det.problems.append(
                f"table {table} belongs to a later Hermes schema than the file's schema_version "
                "and differs from it"
            )
        else:
            det.repairs.append(_out_of_the_way(conn, table, "a later revision creates it"))
    rebuild_for: set[str] = set()
    for table, spec in ref["tables"].items():
        got = live["tables"].get(table)
        if got is None:
            det.repairs.append(
                Repair("create_table", f"create missing table {table} (it holds nothing yet)", table, name=table)
            )
            continue
        missing: list[Repair] = []
        declared: list[tuple[str, str, str]] = []
        for col, want in spec["columns"].items():
            have = got["columns"].get(col)
            if have is None:
                sql = _add_column_sql(table, col, want)
                if sql is None:
                    det.problems.append(f"column {table}.{col} ({want}) is missing and cannot be added")
                else:
                    missing.append(Repair("add_column", f"add missing column {table}.{col} {want}", table, col, sql))
            elif have != want:
                declared.append((col, have, want))
        extras: list[str] = []
        have_fks, want_fks = set(got["fks"]), set(spec["fks"])
        # Foreign keys a later Hermes declares on its later columns: they go with the
        # column. SQLite cannot drop a column a table-level key names, so the table is
        # rebuilt as the stamped revision declares it (values set aside first).
        later_fks = (have_fks - want_fks) & later["fks"].get(table, set())
        keyed = {fk.split("->")[0] for fk in later_fks}
        if later_fks:
            rebuild_for.add(table)
        for col, have in got["columns"].items():
            if col in spec["columns"]:
                continue
            want = later["columns"].get(f"{table}.{col}")
            if want is None:
                det.extra_columns.setdefault(table, []).append(col)
                extras.append(col)
            elif _type_of(have) != _type_of(want):
                det.problems.append(
                    f"column {table}.{col} belongs to a later Hermes schema than the file's schema_version "
                    f"and differs from it ({have!r}, expected {want!r})"
                )
            elif _nulls_without_default(conn, table, col, want):
                det.problems.append(
                    f"column {table}.{col} belongs to a later Hermes schema than the file's schema_version "
                    f"and holds NULL where Hermes' declaration {want!r} requires a value"
                )
            elif _only_defaults(conn, table, col, want):
                if _PK.search(have) or col in keyed:
                    # In the key Hermes healed to (a file whose version Hermes held back):
                    # SQLite cannot drop a key column, the table's rebuild leaves it out.
                    det.repairs.append(
                        Repair("drop_column", f"drop column {table}.{col} (only NULL/default values; a later "
                               f"revision adds it) by rebuilding {table} as the file's version declares it",
                               table, col)
                    )
                    rebuild_for.add(table)
                else:
                    det.repairs.append(
                        Repair("drop_column", f"drop column {table}.{col} (only NULL/default values); a later "
                               "revision adds it", table, col, f"ALTER TABLE {_q(table)} DROP COLUMN {_q(col)}")
                    )
            elif _PK.search(have):
                det.problems.append(
                    f"column {table}.{col} belongs to a later Hermes schema than the file's schema_version, is part "
                    f"of {table}'s primary key and holds values the file's version has no place for"
                )
            else:
                det.repairs.append(
                    Repair("set_aside_column", f"set aside the values of {table}.{col} (a later revision adds "
                           "it) and put them back after the upgrade" + (
                               f", rebuilding {table} as the file's version declares it" if col in keyed else ""),
                           table, col, None if col in keyed else f"ALTER TABLE {_q(table)} DROP COLUMN {_q(col)}")
                )
        if declared or table in rebuild_for:
            # Hermes never checks a kept column's declaration and heals older primary
            # keys by a rebuild; the copy is rebuilt as the stamped revision declares
            # the table (which also adds missing columns and foreign keys).
            det.repairs += _rebuild_repairs(conn, table, got, declared, extras, det.problems, later_fks)
            unknown_fks = have_fks - want_fks - later_fks
            if unknown_fks:
                det.problems.append(f"foreign keys of {table} are {got['fks']}, expected {spec['fks']}")
            continue
        det.repairs += missing
        if have_fks < want_fks:
            det.repairs.append(
                Repair("add_foreign_key", f"add the foreign key {', '.join(sorted(want_fks - have_fks))} of "
                       f"{table} (Hermes declares it only in files it creates)", table)
            )
        elif have_fks != want_fks:
            det.problems.append(f"foreign keys of {table} are {got['fks']}, expected {spec['fks']}")
        if spec.get("autoincrement", False) != got.get("autoincrement", False):
            det.problems.append(f"AUTOINCREMENT of {table} differs from Hermes' schema")
    if "sessions" in ref["tables"] and "title" in ref["tables"]["sessions"]["columns"]:
        renames = title_renames(conn)
        if renames:
            det.repairs.append(
                Repair("rename_titles", f"{len(renames)} sessions share a title with another one (Hermes' schema "
                       "keeps titles unique; Hermes would erase theirs): renamed, the newest keeps it: "
                       + "; ".join(f"{sid}: {old!r} -> {new!r}" for _rowid, sid, old, new in renames),
                       "sessions", "title")
            )
    fts_changes: list[str] = []
    for kind, label in _LABELS.items():
        for name, sql in ref[kind].items():
            have = live[kind].get(name)
            if have == sql:
                continue
            if name in fts:
                fts_changes.append(f"{label} {name} {'is missing' if have is None else 'differs'}")
            elif kind == "virtual":
                det.problems.append(f"{label} {name} {'is missing' if have is None else 'differs'}")
            elif have is None:
                det.repairs.append(Repair("create_object", f"create missing {label} {name}", name=name))
            else:
                det.repairs.append(
                    Repair("replace_object", f"re-create {label} {name} as Hermes' schema has it", name=name,
                           sql=f"DROP {label.upper()} {_q(name)}")
                )
        for name in live[kind]:
            if name in ref[kind]:
                continue
            if name in fts:
                fts_changes.append(f"{label} {name} is not in this version's layout")
            elif name not in later[kind] and kind != "virtual" and own_objects().get(name) == label:
                det.repairs.append(
                    Repair("drop_object", f"drop {label} {name}; hermes_store's own revision creates it", name=name,
                           sql=f"DROP {label.upper()} {_q(name)}")
                )
            elif name not in later[kind]:
                det.extra_objects.setdefault(kind, []).append(name)
            elif kind == "virtual":
                det.problems.append(f"{label} {name} belongs to a later Hermes schema than the file's schema_version")
            else:
                det.repairs.append(
                    Repair("drop_object", f"drop {label} {name}; a later revision creates it", name=name,
                           sql=f"DROP {label.upper()} {_q(name)}")
                )
    if fts_changes:
        det.repairs.append(
            Repair("fts_reset", "re-create the full-text indexes as Hermes' schema has them and re-index every "
                   "message (" + "; ".join(fts_changes) + ")")
        )
    det.repairs.sort(key=lambda r: _REPAIR_ORDER[r.kind])
    return det


def _out_of_the_way(conn: sqlite3.Connection, table: str, why: str) -> Repair:
    """Drop ``table`` when empty, else set its rows aside to put back after the upgrade."""
    if conn.execute(f"SELECT NOT EXISTS (SELECT 1 FROM {_q(table)})").fetchone()[0]:
        return Repair("drop_table", f"drop empty table {table}; {why}", table, sql=f"DROP TABLE {_q(table)}")
    return Repair("set_aside_table", f"set aside the rows of {table} ({why}) and put them back after the upgrade",
                  table)


def _rebuild_repairs(
    conn: sqlite3.Connection,
    table: str,
    got: dict[str, Any],
    declared: list[tuple[str, str, str]],
    extras: list[str],
    problems: list[str],
    later_fks: set[str] | None = None,
) -> list[Repair]:
    """The repair that turns ``table`` into the stamped revision's declaration.

    NULLs of a column it declares NOT NULL take the declared default (Hermes'
    ``active IS NULL → 1``); every other value is kept as stored (the copy checks it,
    and adoption stops rather than convert one). What cannot be kept is a problem: a
    NULL where no default exists, an unknown extra column ``ADD COLUMN`` cannot re-create.
    """
    fills = []
    for col, _have, want in declared:
        m = _SPEC.match(want)
        if not m or not m.group("nn"):
            continue
        nulls = conn.execute(f"SELECT count(*) FROM {_q(table)} WHERE {_q(col)} IS NULL").fetchone()[0]
        if not nulls:
            continue
        dflt = m.group("dflt")
        if dflt is None or not _LITERAL.match(dflt):
            problems.append(f"column {table}.{col} holds NULL in {nulls} rows; Hermes' schema requires a value")
        else:
            fills.append(f"{nulls} NULL values of {col} set to its default {dflt}, as Hermes does")
    for col in extras:
        spec = got["columns"][col]
        m = _SPEC.match(spec)
        if m is None or m.group("pk") or _add_column_sql(table, col, spec) is None:
            problems.append(f"column {table}.{col} ({spec}) would be lost rebuilding {table} as Hermes declares it")
    changes = "; ".join(f"{col} {have!r} -> {want!r}" for col, have, want in declared)
    if later_fks:
        changes = "; ".join(filter(None, [changes, "without the later foreign keys " + ", ".join(sorted(later_fks))]))
    changes = changes or "its primary key"
    kept = "; ".join(fills) if fills else "every value kept"
    return [
        Repair("rebuild_table", f"rebuild {table} as Hermes' schema declares it ({changes}); every row kept, {kept}",
               table, name=table)
    ]


def title_renames(conn: sqlite3.Connection) -> list[tuple[int, str, str, str]]:
    """(rowid, session id, title, new title) for sessions whose title another one has.

    The newest (highest rowid) keeps the title, which is the one Hermes keeps; the
    others get `` (2)``, `` (3)``… in rowid order, skipping titles already in use,
    so no title is lost and the unique index can be built.
    """
    cols = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    if "title" not in cols:
        return []
    dupes = conn.execute(
        "SELECT rowid, id, title FROM sessions WHERE title IN "
        "(SELECT title FROM sessions WHERE title IS NOT NULL GROUP BY title HAVING count(*) > 1) "
        "AND rowid <> (SELECT max(s2.rowid) FROM sessions AS s2 WHERE s2.title = sessions.title) "
        "ORDER BY title, rowid"
    ).fetchall()
    if not dupes:
        return []
    taken = {r[0] for r in conn.execute("SELECT title FROM sessions WHERE title IS NOT NULL")}
    out = []
    for rowid, sid, title in dupes:
        n = 2
        while f"{title} ({n})" in taken:
            n += 1
        new = f"{title} ({n})"
        taken.add(new)
        out.append((rowid, sid, title, new))
    return out


def _closest_shape(version: int, live: dict[str, Any]) -> str:
    """The known shape of ``version`` the file differs least from (for reports)."""
    best, fewest = str(version), None
    for name in _shapes(version):
        n = len(diff(reference_schema(name), live))
        if fewest is None or n < fewest:
            best, fewest = name, n
    return best


# ------------------------------------------------------------------------- detect


def is_hermes_revision(revision: str) -> bool:
    """Hermes schema version N is revision ``00NN``; every other id in the chain is ours."""
    return re.fullmatch(r"\d{4}", revision) is not None


def _head_version() -> int:
    """The newest Hermes schema version our chain reproduces (ids of our own are not numbers)."""
    return max(int(r) for r in revision_order() if is_hermes_revision(r))


def _table_names(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def needs_adoption(path: str | os.PathLike[str], version_table: str | None = None) -> bool:
    """True for an existing, un-stamped file that has Hermes' ``schema_version`` table."""
    p = as_path(path)
    if not p.is_file() or p.stat().st_size == 0:
        return False
    vt = version_table or VERSION_TABLE
    try:
        with readonly_connection(p) as conn:
            tables = _table_names(conn)
            if "schema_version" not in tables or vt in tables:
                return False
            # Our revisions run by a host's Alembic (branch mode) are not a Hermes file.
            return host_revision_raw(conn, vt) is None
    except sqlite3.DatabaseError:
        return False


def detect(path: str | os.PathLike[str], *, version_table: str | None = None, deep: bool = True) -> Detected:
    """Find out what a file is, without changing it.

    Raises the typed refusals: :class:`~hermes_store.errors.NotADatabaseError` (empty,
    text, truncated, corrupt), :class:`~hermes_store.errors.NotAHermesDatabaseError`
    and :class:`~hermes_store.errors.SchemaTooNewError`. Otherwise returns the Hermes
    schema_version, the revision to stamp, the repairs the copy will need, notes about
    unknown extras kept as they are, and ``problems`` (shape differences adoption
    cannot repair). ``deep`` runs ``PRAGMA quick_check`` over the whole file.
    """
    vt = version_table or VERSION_TABLE
    p = as_path(path)
    check_file(p)
    try:
        with readonly_connection(p) as conn:
            tables = _table_names(conn)
            hosted = None if vt in tables else host_revision_raw(conn, vt)
            if vt in tables or hosted:
                if hosted:
                    rev: tuple[Any, ...] | None = (hosted[1],)
                    where = f" in the host application's {hosted[0]}"
                else:
                    rev = conn.execute(f'SELECT version_num FROM "{vt}"').fetchone()
                    where = ""
                return Detected(
                    path=p,
                    schema_version=None,
                    revision=rev[0] if rev else None,
                    already_adopted=True,
                    notes=[f"already a hermes_store database (revision {rev[0] if rev else 'none'}{where})"],
                )
            if not HERMES_TABLES <= tables:
                missing = ", ".join(sorted(HERMES_TABLES - tables))
                raise errors.NotAHermesDatabaseError(
                    f"{p} is a SQLite database but not a Hermes state.db (no {missing} table); left unchanged"
                )
            rows = conn.execute("SELECT version FROM schema_version").fetchall()
            if not rows:
                raise errors.NotAHermesDatabaseError(f"{p} has an empty schema_version table; left unchanged")
            raw = rows[0][0]
            if isinstance(raw, str) and raw.strip().isdigit():
                raw = int(raw)
            if not isinstance(raw, int) or raw < 1:
                raise errors.NotAHermesDatabaseError(
                    f"{p} has schema_version {raw!r}, which no Hermes release wrote; left unchanged"
                )
            version = raw
            newest = _head_version()
            if version > newest:
                raise errors.SchemaTooNewError(
                    f"{p} has Hermes schema_version {version}, newer than this hermes_store understands "
                    f"(up to {newest}); upgrade hermes_store. Left unchanged"
                )
            if deep:
                bad = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
                if bad != ["ok"]:
                    raise errors.NotADatabaseError(f"{p} is corrupt ({'; '.join(bad[:3])}); left unchanged")
            live = snapshot(conn)
            best = _compare(reference_schema(str(version)), live, _later_objects(version, newest), conn)
            best.shape = f"hermes_v{_closest_shape(version, live)}"
    except sqlite3.DatabaseError as exc:
        raise sqlite_refusal(p, exc) from exc
    best.path, best.schema_version, best.revision = p, version, f"{version:04d}"
    if len(rows) > 1:
        best.notes.append(f"schema_version has {len(rows)} rows; using the first ({version}) as Hermes does")
    for table, cols in best.extra_columns.items():
        best.notes.append(f"unknown columns kept on {table}: {', '.join(cols)}")
    for kind, names in best.extra_objects.items():
        best.notes.append(f"unknown {kind} kept: {', '.join(names)}")
    return best


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
