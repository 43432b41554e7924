"""Adopt a ``state.db`` written by Hermes Agent (schema_version 1–23) into hermes_store.

Hermes versions its file with a one-row ``schema_version`` table and hand-written
migrations; hermes_store uses Alembic revisions ``0001``…``0023`` that reproduce those
schemas exactly. Adoption bridges the two: detect which Hermes schema (and which real
*shape*, since some releases shipped variants) the file has, record the matching
revision in our version table, repair what that revision assumes, and upgrade.

All-or-nothing: every step runs on a copy next to the original. The original is
replaced (atomically, ``os.replace``) only after the copy passed verification, and it
is kept as ``state.db.pre-adopt.bak`` (plus ``state.db.pre-adopt.bak-wal`` when it had
uncheckpointed WAL content). On any failure the original is byte-for-byte unchanged
and the copy is removed.

Public API: :func:`check_file`, :func:`detect`, :func:`adopt`, :func:`needs_adoption`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import stat
import tempfile
import threading
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator

from . import errors
from .introspect import diff, snapshot

SQLITE_HEADER = b"SQLite format 3\x00"

#: Tables a Hermes state.db always has.
HERMES_TABLES = frozenset({"schema_version", "sessions", "messages"})

#: Suffix of the backup kept next to the adopted file.
BACKUP_SUFFIX = ".pre-adopt.bak"

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

Progress = Callable[[str, float], None]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Repair:
    """One change the copy needs before the stamped revision's assumptions hold."""

    kind: str  # "drop_index" | "drop_table" | "drop_column" | "add_column" | "fts_v10_late"
    description: str
    table: str | None = None
    column: str | None = None
    sql: str | None = None


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
    backup_wal_path: Path | None = None
    repairs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    row_counts: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------- file checks


def _as_path(target: str | os.PathLike[str]) -> Path:
    s = os.fspath(target)
    if "://" in s:
        from .engine import to_url

        url = to_url(s)
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            raise errors.AdoptionError(f"adoption needs a SQLite file, got {url.render_as_string()}")
        s = url.database
    return Path(s).expanduser()


def check_file(path: str | os.PathLike[str], *, recovery_ok: bool = False) -> None:
    """Refuse, without touching it, a file that cannot be a usable SQLite database.

    Cheap checks only (stat, the 100-byte header, one read of the schema): an empty
    file, a text file, a truncated copy or a file whose schema cannot be read. SQLite
    itself would treat a 0-byte file as an empty database and happily write into it;
    an empty ``state.db`` is far more likely a failed copy, so we refuse it.

    A hot rollback journal next to the file means a writer crashed mid-transaction;
    only a read-write open can roll it back. ``recovery_ok`` (ordinary upgrades) lets
    SQLite do that; adoption, which must not write the original, refuses instead.
    """
    p = _as_path(path)
    try:
        st = p.stat()
    except FileNotFoundError as exc:
        raise errors.DatabaseUnavailableError(f"{p} does not exist") from exc
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot read {p}: {exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise errors.NotADatabaseError(f"{p} is not a regular file; left unchanged")
    if st.st_size == 0:
        raise errors.NotADatabaseError(
            f"{p} is an empty file (0 bytes), not a SQLite database; refusing to use it, left unchanged"
        )
    try:
        with open(p, "rb") as fh:
            header = fh.read(100)
    except OSError as exc:
        raise errors.DatabaseUnavailableError(f"cannot read {p}: {exc}") from exc
    if not header.startswith(SQLITE_HEADER):
        raise errors.NotADatabaseError(
            f"{p} is not a SQLite database (no SQLite header; a text file or an encrypted database?); left unchanged"
        )
    if len(header) < 100:
        raise errors.NotADatabaseError(f"{p} is truncated ({st.st_size} bytes); left unchanged")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise errors.NotADatabaseError(f"{p} is corrupt (invalid page size {page_size}); left unchanged")
    pages = int.from_bytes(header[28:32], "big")
    # The in-header page count is trustworthy only when its "valid-for" counter matches.
    if header[24:28] == header[92:96] and pages and st.st_size < pages * page_size:
        raise errors.NotADatabaseError(
            f"{p} is truncated: the header promises {pages} pages of {page_size} bytes "
            f"({pages * page_size} bytes) but the file has {st.st_size}; left unchanged"
        )
    if st.st_size % page_size:
        raise errors.NotADatabaseError(
            f"{p} is truncated or corrupt: {st.st_size} bytes is not a whole number of "
            f"{page_size}-byte pages; left unchanged"
        )
    journal = Path(f"{p}-journal")
    if journal.exists() and journal.stat().st_size > 0:
        if recovery_ok:
            return
        raise errors.AdoptionError(
            f"{p} has an unfinished transaction ({journal.name}); open it once with Hermes or the "
            "sqlite3 shell to recover it, then adopt. Left unchanged"
        )
    try:
        with _readonly(p) as conn:
            conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError as exc:
        raise _sqlite_refusal(p, exc) from exc


def _sqlite_refusal(p: Path, exc: sqlite3.DatabaseError) -> errors.HermesStoreError:
    """Map a driver error met while only reading to the typed refusal it means."""
    msg = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and (
        "unable to open" in msg or "readonly" in msg or "locked" in msg or "busy" in msg
    ):
        return errors.DatabaseUnavailableError(f"cannot read {p}: {msg}; left unchanged")
    if "malformed" in msg or "corrupt" in msg:
        return errors.NotADatabaseError(f"{p} is corrupt ({msg}); left unchanged")
    return errors.NotADatabaseError(f"{p} is not a usable SQLite database ({msg}); left unchanged")


@contextmanager
def _readonly(p: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection that leaves the file exactly as it found it.

    A reader of a WAL-mode file creates ``-wal``/``-shm`` sidecars when they are
    missing, and a read-only connection cannot remove them again. When we created
    them (and the WAL stayed empty) one short read-write open lets SQLite itself
    remove them; SQLite only does so when no other connection uses the file, and an
    empty WAL means nothing is written to the database file.
    """
    wal, shm = Path(f"{p}-wal"), Path(f"{p}-shm")
    had_wal, had_shm = wal.exists(), shm.exists()
    conn = sqlite3.connect(p.absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()
        if not had_wal and wal.exists() and not had_shm:
            with suppress(OSError, sqlite3.Error):
                if wal.stat().st_size == 0 and os.access(p, os.W_OK):
                    rw = sqlite3.connect(p.absolute().as_uri() + "?mode=rw", uri=True, isolation_level=None)
                    try:
                        rw.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
                    finally:
                        rw.close()


# ------------------------------------------------------------------ reference data


@lru_cache(maxsize=None)
def reference_schema(name: str) -> dict[str, Any]:
    """A normalized Hermes schema shipped in ``hermes_store/reference_schemas``."""
    res = resources.files("hermes_store").joinpath("reference_schemas", f"hermes_v{name}.json")
    try:
        return json.loads(res.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise errors.AdoptionError(f"no reference schema for Hermes v{name} in this installation") from exc


def _shapes(version: int) -> list[tuple[str, list[Repair]]]:
    """Candidate shapes of a Hermes file at ``version`` and the repairs each implies."""
    shapes: list[tuple[str, list[Repair]]] = [(str(version), [])]
    if version == 10:
        shapes.append(
            (
                "10_late",
                [
                    Repair(
                        "fts_v10_late",
                        "convert the late-v10 inline FTS tables to the documented v10 "
                        "external-content layout and rebuild both indexes",
                    )
                ],
            )
        )
    return shapes


def _later_objects(version: int, newest: int) -> dict[str, dict[str, Any]]:
    """What only later Hermes versions create, with the spec/SQL they create it with.

    A file can carry such "early" objects when Hermes crashed between adding them and
    bumping ``schema_version`` (its migrations add columns first, bump last), or when a
    development build wrote it. The revision that creates them would then fail.
    """
    own = reference_schema(str(version))
    out: dict[str, dict[str, Any]] = {k: {} for k in ("tables", "columns", "indexes", "triggers", "views", "virtual")}
    for v in range(version + 1, newest + 1):
        try:
            ref = reference_schema(str(v))
        except errors.AdoptionError:
            continue
        for t, spec in ref["tables"].items():
            if t not in own["tables"]:
                out["tables"].setdefault(t, spec)
            for c, cspec in spec["columns"].items():
                if c not in own["tables"].get(t, {}).get("columns", {}):
                    out["columns"].setdefault(f"{t}.{c}", cspec)
        for kind in ("indexes", "triggers", "views", "virtual"):
            for n, sql in ref[kind].items():
                if n not in own[kind]:
                    out[kind].setdefault(n, sql)
    return out


_SPEC = re.compile(r"^(?P<type>.*?)(?P<nn> NOT NULL)?(?: DEFAULT (?P<dflt>.*?))?(?P<pk> PK\d+)?$")
_LITERAL = re.compile(r"^(-?\d+(\.\d+)?|'[^']*'|NULL|TRUE|FALSE)$", re.I)


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


def _compare(
    ref: dict[str, Any], live: dict[str, Any], later: dict[str, dict[str, Any]], conn: sqlite3.Connection
) -> Detected:
    """Classify how ``live`` differs from ``ref``: repairs, problems, harmless extras.

    Early objects (created by a later version than the file claims) become repairs
    when dropping them loses nothing — an index with the later DDL, an empty table, a
    column holding only NULL/its default — since the revision re-creates them
    identically. Otherwise they are problems and adoption refuses.
    """
    det = Detected(path=Path(), schema_version=None, revision=None)
    early_tables: list[str] = []
    for table in live["tables"]:
        if table in ref["tables"]:
            continue
        want = later["tables"].get(table)
        if want is None:
            det.extra_objects.setdefault("tables", []).append(table)
            continue
        got = live["tables"][table]
        empty = conn.execute(f"SELECT NOT EXISTS (SELECT 1 FROM {_q(table)})").fetchone()[0]
        if got["columns"] == want["columns"] and sorted(got["fks"]) == sorted(want["fks"]) and empty:
            early_tables.append(table)
            det.repairs.append(
                Repair("drop_table", f"drop empty table {table}; a later revision creates it", table,
                       sql=f"DROP TABLE {_q(table)}")
            )
        else:
            det.problems.append(
                f"table {table} belongs to a later Hermes schema than the file's schema_version "
                "and differs from it or holds rows"
            )
    for table, spec in ref["tables"].items():
        got = live["tables"].get(table)
        if got is None:
            det.problems.append(f"table {table} is missing")
            continue
        for col, want in spec["columns"].items():
            have = got["columns"].get(col)
            if have is None:
                sql = _add_column_sql(table, col, want)
                if sql is None:
                    det.problems.append(f"column {table}.{col} ({want}) is missing and cannot be added")
                else:
                    det.repairs.append(Repair("add_column", f"add missing column {table}.{col} {want}", table, col, sql))
            elif have != want:
                det.problems.append(f"column {table}.{col} is {have!r}, expected {want!r}")
        for col, have in got["columns"].items():
            if col in spec["columns"]:
                continue
            want = later["columns"].get(f"{table}.{col}")
            if want is None:
                det.extra_columns.setdefault(table, []).append(col)
            elif have == want and _only_defaults(conn, table, col, want):
                det.repairs.append(
                    Repair("drop_column", f"drop column {table}.{col} (only NULL/default values); a later "
                           "revision adds it", table, col, f"ALTER TABLE {_q(table)} DROP COLUMN {_q(col)}")
                )
            else:
                det.problems.append(
                    f"column {table}.{col} belongs to a later Hermes schema than the file's schema_version "
                    "and differs from it or holds data"
                )
        if sorted(spec["fks"]) != sorted(got["fks"]):
            det.problems.append(f"foreign keys of {table} are {got['fks']}, expected {spec['fks']}")
        if spec.get("autoincrement", False) != got.get("autoincrement", False):
            det.problems.append(f"AUTOINCREMENT of {table} differs from Hermes' schema")
    for kind, label in (("indexes", "index"), ("triggers", "trigger"), ("views", "view"), ("virtual", "virtual table")):
        for name, sql in ref[kind].items():
            have = live[kind].get(name)
            if have is None:
                det.problems.append(f"{label} {name} is missing")
            elif have != sql:
                det.problems.append(f"{label} {name} differs from Hermes' schema: {have}")
        for name, have in live[kind].items():
            if name in ref[kind]:
                continue
            want = later[kind].get(name)
            if want is None:
                det.extra_objects.setdefault(kind, []).append(name)
            elif kind == "indexes" and have == want:
                det.repairs.append(
                    Repair("drop_index", f"drop index {name}; a later revision creates it", sql=f"DROP INDEX {_q(name)}")
                )
            else:
                det.problems.append(f"{label} {name} belongs to a later Hermes schema than the file's schema_version")
    # Drop order: indexes, then tables, then columns; additions and FTS work come after.
    order = {"drop_index": 0, "drop_table": 1, "drop_column": 2}
    det.repairs.sort(key=lambda r: order.get(r.kind, 3))
    return det


# ------------------------------------------------------------------------- detect


def _head_version() -> int:
    from . import migrations

    return int(migrations.head())


def _table_names(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def needs_adoption(path: str | os.PathLike[str], version_table: str | None = None) -> bool:
    """True for an existing, un-stamped file that has Hermes' ``schema_version`` table."""
    from .migrations import VERSION_TABLE

    p = _as_path(path)
    if not p.is_file() or p.stat().st_size == 0:
        return False
    try:
        with _readonly(p) as conn:
            tables = _table_names(conn)
    except sqlite3.DatabaseError:
        return False
    return "schema_version" in tables and (version_table or VERSION_TABLE) not in tables


def detect(path: str | os.PathLike[str], *, version_table: str | None = None, deep: bool = True) -> Detected:
    """Find out what a file is, without changing it.

    Raises the typed refusals: :class:`~hermes_store.errors.NotADatabaseError` (empty,
    text, truncated, corrupt), :class:`~hermes_store.errors.NotAHermesDatabaseError`
    and :class:`~hermes_store.errors.SchemaTooNewError`. Otherwise returns the Hermes
    schema_version, the revision to stamp, the repairs the copy will need, notes about
    unknown extras kept as they are, and ``problems`` (shape differences adoption
    cannot repair). ``deep`` runs ``PRAGMA quick_check`` over the whole file.
    """
    from .migrations import VERSION_TABLE

    vt = version_table or VERSION_TABLE
    p = _as_path(path)
    check_file(p)
    try:
        with _readonly(p) as conn:
            tables = _table_names(conn)
            if vt in tables:
                rev = conn.execute(f'SELECT version_num FROM "{vt}"').fetchone()
                return Detected(
                    path=p,
                    schema_version=None,
                    revision=rev[0] if rev else None,
                    already_adopted=True,
                    notes=[f"already a hermes_store database (revision {rev[0] if rev else 'none'})"],
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
            later = _later_objects(version, newest)
            best: Detected | None = None
            for name, implied in _shapes(version):
                cand = _compare(reference_schema(name), live, later, conn)
                cand.repairs += implied
                cand.shape = f"hermes_v{name}"
                if best is None or len(cand.problems) < len(best.problems):
                    best = cand
    except sqlite3.DatabaseError as exc:
        raise _sqlite_refusal(p, exc) from exc
    assert best is not None
    best.path, best.schema_version, best.revision = p, version, f"{version:04d}"
    if len(rows) > 1:
        best.notes.append(f"schema_version has {len(rows)} rows; using the first ({version}) as Hermes does")
    for table, cols in best.extra_columns.items():
        best.notes.append(f"unknown columns kept on {table}: {', '.join(cols)}")
    for kind, names in best.extra_objects.items():
        best.notes.append(f"unknown {kind} kept: {', '.join(names)}")
    return best


# ------------------------------------------------------------------------- adopt

_fresh_lock = threading.Lock()
_fresh_cache: dict[tuple[str, str], dict[str, Any]] = {}


def _fresh_snapshot(revision: str, version_table: str) -> dict[str, Any]:
    """Schema of an empty database upgraded to ``revision`` (what adoption must match)."""
    from . import migrations

    key = (revision, version_table)
    with _fresh_lock:
        if key not in _fresh_cache:
            with tempfile.TemporaryDirectory(prefix="hermes-store-fresh-") as tmp:
                fresh = Path(tmp) / "fresh.db"
                migrations.upgrade(fresh, revision, version_table=version_table)
                conn = sqlite3.connect(fresh)
                try:
                    _fresh_cache[key] = snapshot(conn)
                finally:
                    conn.close()
        return _fresh_cache[key]


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


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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


def _fingerprint(p: Path) -> tuple[Any, ...]:
    """Cheap identity of the original and its WAL, to notice a writer during adoption."""
    out: list[Any] = []
    for f in (p, Path(f"{p}-wal")):
        try:
            st = f.stat()
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            out.append(None)
    return tuple(out)


def _free_backup_path(p: Path) -> Path:
    """``state.db.pre-adopt.bak``; never overwrite an earlier backup (``.1.bak``, …)."""
    candidate = p.with_name(p.name + BACKUP_SUFFIX)
    n = 1
    while candidate.exists() or Path(f"{candidate}-wal").exists():
        candidate = p.with_name(f"{p.name}.pre-adopt.{n}.bak")
        n += 1
    return candidate


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard link (instant, same bytes); copy where the filesystem has no hard links."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
        _fsync(dst)


def _fsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(d: Path) -> None:
    with suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_db_files(p: Path) -> None:
    for f in (p, Path(f"{p}-wal"), Path(f"{p}-shm"), Path(f"{p}-journal")):
        with suppress(FileNotFoundError):
            f.unlink()


def _open_rw(p: Path) -> sqlite3.Connection:
    return sqlite3.connect(p, isolation_level=None)


def adopt(
    path: str | os.PathLike[str],
    *,
    backup: bool = True,
    revision: str = "head",
    version_table: str | None = None,
    progress: Progress | None = None,
) -> AdoptionReport:
    """Turn a Hermes-made ``state.db`` into a hermes_store database, keeping every row.

    Steps, all on a copy in the same folder (made with SQLite's backup API, which also
    folds in uncheckpointed WAL content): stamp the revision matching the file's
    ``schema_version``, apply the repairs :func:`detect` found (late-v10 FTS layout,
    missing columns) and re-index FTS, upgrade to ``revision``, then verify — row
    counts per table equal the original's, FTS5 integrity-check passes, ``PRAGMA
    quick_check`` is ok, and the schema equals a fresh upgrade modulo unknown extras the
    original carried. Only then is the copy swapped in with ``os.replace``.

    With ``backup=True`` the original stays next to it as ``state.db.pre-adopt.bak``
    (``.pre-adopt.1.bak``… if that name is taken), together with
    ``state.db.pre-adopt.bak-wal`` when the original had a WAL file; the original's
    ``-wal``/``-shm`` sidecars are moved away before the swap so they can never be
    replayed onto the new file. Stop Hermes while adopting: a write by another process
    during adoption is detected and aborts it.

    Any failure raises :class:`~hermes_store.errors.AdoptionError` (chained from the
    cause) or one of the typed refusals, with the original byte-for-byte unchanged and
    no copy left behind. A file hermes_store already owns is a no-op
    (``report.adopted`` is False).
    """
    from . import migrations

    vt = version_table or migrations.VERSION_TABLE
    report_progress = progress or (lambda _stage, _fraction: None)
    # Work next to the real file: a symlinked state.db keeps pointing at the result.
    p = Path(os.path.realpath(_as_path(path)))
    det = detect(p, version_table=vt)
    if det.already_adopted:
        return AdoptionReport(
            path=p,
            adopted=False,
            message=f"{p} is already a hermes_store database (revision {det.revision}); nothing to adopt",
            revision=det.revision,
        )
    if det.problems:
        raise errors.AdoptionError(
            f"{p} (Hermes schema_version {det.schema_version}) has a shape adoption cannot repair; "
            "left unchanged:\n  - " + "\n  - ".join(det.problems)
        )
    target = migrations.head() if revision == "head" else revision
    if not re.fullmatch(r"\d{4}", target) or int(target) < det.schema_version:  # type: ignore[operator]
        raise errors.AdoptionError(
            f"{p} is at Hermes schema_version {det.schema_version}; it can only be adopted to revision "
            f"{det.revision} or later, not {target!r}. Left unchanged"
        )

    size = p.stat().st_size + (Path(f"{p}-wal").stat().st_size if Path(f"{p}-wal").exists() else 0)
    with suppress(OSError):
        free = shutil.disk_usage(p.parent).free
        if free < size * 2:
            raise errors.AdoptionError(
                f"not enough free space in {p.parent} to adopt {p} ({size} bytes needs about {size * 2} free, "
                f"{free} available); left unchanged"
            )

    before = _fingerprint(p)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{p.name}.adopting-", suffix=".tmp", dir=p.parent)
    os.close(fd)
    work = Path(tmp_name)
    try:
        report = _adopt_copy(p, work, det, target, vt, report_progress)
        if _fingerprint(p) != before:
            raise errors.AdoptionError(
                f"{p} was written to by another process during adoption (is Hermes running?); "
                "stop it and adopt again"
            )
        report_progress("swap", 0.0)
        with suppress(OSError):
            os.chmod(work, stat.S_IMODE(p.stat().st_mode))
        _fsync(work)
        _swap(p, work, backup, report)
    except errors.HermesStoreError as exc:
        _remove_db_files(work)
        if isinstance(exc, errors.AdoptionError):
            raise
        raise errors.AdoptionError(f"adopting {p} failed, left unchanged: {exc}") from exc
    except BaseException as exc:
        _remove_db_files(work)
        if not isinstance(exc, Exception):
            raise
        raise errors.AdoptionError(f"adopting {p} failed, left unchanged: {type(exc).__name__}: {exc}") from exc
    report_progress("swap", 1.0)
    return report


def _adopt_copy(
    p: Path, work: Path, det: Detected, target: str, vt: str, report_progress: Progress
) -> AdoptionReport:
    """Copy, stamp, repair, upgrade and verify ``work``; the original is only read."""
    from . import migrations

    report_progress("copy", 0.0)
    dst = _open_rw(work)
    try:
        with _readonly(p) as src:

            def _copy_progress(_status: int, remaining: int, total: int) -> None:
                report_progress("copy", 1.0 - remaining / total if total else 1.0)

            src.backup(dst, pages=4096, progress=_copy_progress)
        original_counts = _row_counts(dst)
        expected = _comparable_counts(dst)
    finally:
        dst.close()
    report_progress("copy", 1.0)

    report_progress("upgrade", 0.0)
    migrations.stamp(work, det.revision, version_table=vt)  # type: ignore[arg-type]
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
        conn.execute("COMMIT")
    except BaseException:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()

    if target != det.revision:
        migrations.upgrade(work, target, version_table=vt)
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


def _swap(p: Path, work: Path, backup: bool, report: AdoptionReport) -> None:
    """Put ``work`` in place of ``p`` atomically; undo everything if a step fails.

    The original's WAL belongs to the old file: it is kept with the backup and moved
    away before the rename, because SQLite would otherwise replay it onto the new file.
    The ``-shm`` index is only a cache of the WAL and is dropped.
    """
    wal, shm = Path(f"{p}-wal"), Path(f"{p}-shm")
    created: list[Path] = []
    moved: list[tuple[Path, Path]] = []
    try:
        if backup:
            bak = _free_backup_path(p)
            _link_or_copy(p, bak)
            created.append(bak)
            report.backup_path = bak
            if wal.exists():
                bak_wal = Path(f"{bak}-wal")
                _link_or_copy(wal, bak_wal)
                created.append(bak_wal)
                report.backup_wal_path = bak_wal
        if wal.exists():
            stash = work.with_name(work.name + ".orig-wal")
            os.replace(wal, stash)
            moved.append((stash, wal))
        os.replace(work, p)
    except BaseException:
        if not work.exists():
            # The rename itself happened (an interrupt landed right after it): the new
            # file is in place, and the old WAL must not come back next to it.
            raise
        for stash, orig in reversed(moved):
            with suppress(OSError):
                os.replace(stash, orig)
        for f in created:
            with suppress(OSError):
                f.unlink()
        report.backup_path = report.backup_wal_path = None
        raise
    for stash, _orig in moved:
        with suppress(OSError):
            stash.unlink()
    with suppress(FileNotFoundError):
        shm.unlink()
    _fsync_dir(p.parent)
