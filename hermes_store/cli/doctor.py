"""``hermes-store doctor``: what a person asks before trusting a store with years of
history, answered without changing a byte of it.

Versions (this package, SQLAlchemy, Alembic, the driver, SQLite or the server), whether
the linked SQLite has the WAL-reset bug and what the store does about it, the revision,
the journal mode, file modes, SQLite's integrity check, each search index's check, the
size of every table and index, and upkeep still pending. A file is read through one
read-only connection that leaves it as found (:func:`hermes_store.paths.readonly_connection`);
FTS5's integrity check is a write statement, so it runs on a private copy taken with
SQLite's backup API in the temporary folder. A server is read in a transaction that is
rolled back. Exit 0 when healthy, 1 when a problem is found.
"""

from __future__ import annotations

import importlib
import os
import platform
import sqlite3
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import alembic
import click
import sqlalchemy
from rich import box
from rich.table import Table
from rich.text import Text
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from .. import __version__, encryption, journal, migrations, paths
from ..copying.endpoints import readonly_engine
from ..dialects import cjk_bigram
from ..engine import create_engine
from ..keys import LAST_AUTO_PRUNE_KEY, TOOL_HIGH_WATER_KEY
from ..locks import PRIVATE
from ..paths import SIDECARS
from ..repositories import MaintenanceRepository
from ..repositories.fts_upkeep import CJK_REBUILD_HIGH_WATER, REBUILD_HIGH_WATER
from ..repositories.health import HealthRepository
from ..state_files import collect_state_db_stats
from ._common import (
    fmt_bytes,
    CliError,
    State,
    _state,
    fitted_table,
    fmt_num,
    fmt_time,
    global_options,
    printable,
    require_file,
    revision_on,
    stdout_console,
    store_revision,
)

#: The first SQLite release with the WAL-reset fix (3.50.7 and 3.44.6 carry it too).
WAL_RESET_FIXED_IN = "3.51.3"
#: Hermes v26's rule for an affected SQLite (hermes_store.journal.apply_wal_with_fallback).
WAL_RESET_RULE = ("no WAL for a new file or a file not in WAL; a file already in WAL stays in WAL "
                  "(a live WAL file is never downgraded)")
#: Tables and indexes a person is shown (the largest); --json has every one.
SIZES_SHOWN = 15


@click.command()
@click.option("--quick", is_flag=True, help="SQLite's quick_check instead of the full integrity_check (faster).")
@global_options
def doctor(quick: bool) -> None:
    """Check a store's health without changing it (versions, integrity, sizes, upkeep).

    Read-only: the database file's bytes and time stamp stay as they were and no file
    is left beside it. Exit code 0 when healthy, 1 when a problem is found (each is
    listed). With --json, one object.
    """
    st = _state()
    report = file_report(st, quick) if st.url is None else server_report(st)
    report["ok"] = not report["problems"]
    if st.json:
        st.emit(report)
    else:
        print_report(report)
    if report["problems"]:
        raise CliError(f"{len(report['problems'])} problem(s) found: " + "; ".join(report["problems"]),
                       code="unhealthy")


# ---------------------------------------------------------------------------- what is read


def versions(driver: str) -> dict[str, Any]:
    """Ours and our dependencies'; the stdlib's sqlite3 goes with Python's version."""
    module = sys.modules.get(driver) or importlib.import_module(driver)
    stdlib = f"Python {platform.python_version()}" if driver == "sqlite3" else None
    version = getattr(module, "__version__", None) or stdlib
    return {"hermes_store": __version__, "sqlalchemy": sqlalchemy.__version__, "alembic": alembic.__version__,
            "driver": {"name": driver, "version": version}}


def sqlcipher_sqlite_version() -> str:
    """The SQLite version SQLCipher's module is built on (an encrypted store's SQLite)."""
    return str(encryption.dbapi_module().sqlite_version)


def wal_reset_bug(journal_mode: str | None) -> dict[str, Any]:
    """The linked SQLite, whether it has the WAL-reset bug, and what that means for this file."""
    affected = journal.is_sqlite_wal_reset_vulnerable()  # the one version check, Hermes v26's
    if not affected:
        doing = "nothing to do: WAL is safe with this SQLite"
    elif journal_mode == "wal":
        doing = ("the file is in WAL and stays in WAL (a live WAL file is never downgraded; hermes_store keeps "
                 "its own stores in WAL, COMPATIBILITY.md, Journal mode); "
                 f"upgrade SQLite to {WAL_RESET_FIXED_IN}+ to be rid of the bug")
    else:
        doing = (f"the file is in {journal_mode or 'an unknown'} journal mode; Hermes v26 does not turn WAL on "
                 "for it on this SQLite, hermes_store's own stores do when they open it (COMPATIBILITY.md, "
                 f"Journal mode); upgrade SQLite to {WAL_RESET_FIXED_IN}+ to be rid of the bug")
    return {"sqlite_version": sqlite3.sqlite_version, "affected": affected, "affected_range": "3.7.0 to 3.51.2",
            "fixed_in": WAL_RESET_FIXED_IN, "rule": WAL_RESET_RULE if affected else None, "this_store": doing}


def file_modes(real: Path) -> list[dict[str, Any]]:
    """The database and each sidecar present, by ``stat`` alone (never opened)."""
    found = []
    for suffix in ("", *SIDECARS):
        try:
            st = os.stat(f"{real}{suffix}")
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        found.append({"path": f"{real}{suffix}", "mode": f"{mode:04o}", "size_bytes": st.st_size,
                      "private": mode & ~PRIVATE == 0})
    return found


def pending_upkeep(conn: Connection, stats: dict[str, Any] | None) -> dict[str, Any]:
    """Work the store still owes itself: FTS rebuild windows, the short-CJK index's
    catch-up, the last auto-prune (and, for a file, the WAL and free pages)."""
    repo = MaintenanceRepository(conn)
    meta = repo.has_table("state_meta")

    def get(key: str) -> str | None:
        return repo.get_meta(key) if meta else None

    windows: dict[str, str | None] = {}
    for key in (REBUILD_HIGH_WATER, CJK_REBUILD_HIGH_WATER, TOOL_HIGH_WATER_KEY):
        value = get(key)
        if value is not None:
            windows[key] = value
    if windows and get("fts_rebuild_progress") is not None:
        windows["fts_rebuild_progress"] = get("fts_rebuild_progress")
    last_prune = get(LAST_AUTO_PRUNE_KEY)
    try:
        last_prune_at: Any = float(last_prune) if last_prune is not None else None
    except ValueError:
        last_prune_at = last_prune
    doc: dict[str, Any] = {
        "fts_rebuild_windows": windows,
        "cjk_bigram_rows_behind": cjk_bigram.pending(conn) if cjk_bigram.installed(conn) else None,
        "last_auto_prune": last_prune_at,
    }
    if stats is not None:
        doc["wal_size_bytes"] = stats.get("wal_size_bytes")
        doc["freelist_pages"] = stats.get("freelist_count")
    return doc


def revision_problem(revision: str | None, hermes_file: bool, host_table: str | None = None) -> str | None:
    head = migrations.head()
    if revision == head:
        return None
    if revision is None:
        return ("a Hermes state.db not adopted yet: run 'hermes-store adopt'" if hermes_file
                else "no hermes_store database here: run 'hermes-store upgrade'")
    if host_table is not None and revision in paths.revision_order():
        return (f"at revision {revision}, head is {head}; recorded in {host_table} by the application that "
                "embeds it: run `alembic upgrade heads` in that project")
    if revision in paths.revision_order() or revision in migrations.LEGACY_IDS:
        return f"at revision {revision}, head is {head}: run 'hermes-store upgrade'"
    return f"at revision {revision}, which this hermes-store does not know (a newer one wrote it)"


def _copy_connection(target: Path, key: encryption.StoreKey | None) -> Any:
    """The private copy's connection: sqlite3's, or for an encrypted store a SQLCipher
    one keyed with the store's key before its first page is written."""
    if key is None:
        return sqlite3.connect(target, isolation_level=None)
    return encryption.connect(str(target), key, isolation_level=None)


@contextmanager
def private_copy(raw: Any, key: encryption.StoreKey | None = None) -> Iterator[Engine]:
    """An engine on a private copy of the file ``raw`` reads (SQLite's backup API, page
    for page, free pages included), in a temporary folder removed afterwards: for what
    writes (FTS5's integrity check, a measured VACUUM) while the store stays untouched.

    An encrypted store (``key``, ``raw`` SQLCipher's connection) is copied into a file
    encrypted with the same key from its first byte: never a plaintext copy on disk."""
    with tempfile.TemporaryDirectory(prefix="hermes-store-doctor-") as folder:
        with closing(_copy_connection(Path(folder) / "copy.db", key)) as copy:
            raw.backup(copy)
            options = {"module": encryption.dbapi_module()} if key is not None else {}
            engine = create_engine("sqlite://", creator=lambda: copy, poolclass=StaticPool, **options)
            try:
                yield engine
            finally:
                engine.dispose()


def fts_on_a_copy(raw: Any, key: encryption.StoreKey | None = None) -> dict[str, str | None]:
    """FTS5's integrity check per index, run on a private copy: the check is an INSERT,
    which a read-only connection refuses, and the store itself must not be written."""
    with private_copy(raw, key) as engine, engine.connect() as conn:
        try:
            return MaintenanceRepository(conn).fts_integrity_check()
        finally:
            conn.rollback()


def keyed_stats(conn: Connection, raw: Any) -> dict[str, Any]:
    """:func:`hermes_store.state_files.collect_state_db_stats`'s figures doctor shows, for
    an encrypted file: read on its keyed connection (a plain ``sqlite3`` open of the file
    could read nothing, and its close would drop the keyed connection's locks)."""
    space = HealthRepository(conn).space()
    return {"journal_mode": journal._on_disk_journal_mode(raw), "freelist_count": space["free_pages"],
            "logical_size_bytes": space["total_bytes"]}


def refusal(real: Path, exc: sqlite3.DatabaseError, key: encryption.StoreKey | None) -> BaseException:
    """The typed refusal of a file SQLite would not read; one that looks encrypted, read
    with no key, is EncryptionKeyError naming the key to supply."""
    typed = paths.sqlite_refusal(real, exc)
    return encryption.refused_without_key(real, typed) if key is None else typed


def file_report(st: State, quick: bool) -> dict[str, Any]:
    assert st.path is not None
    require_file(st.path)  # missing, a folder, a dangling link: refused, nothing created
    real = paths.resolve_link(st.path)
    files = file_modes(real)  # before we open: a reader may add sidecars of its own
    problems: list[str] = []
    warnings: list[str] = []
    try:
        with readonly_engine(real, st.key) as engine, engine.connect() as conn:
            try:
                revision, host_table = revision_on(conn)
                health = HealthRepository(conn)
                hermes_file = revision is None and health.has_table("schema_version")
                raw = conn.connection.dbapi_connection
                stats = collect_state_db_stats(real) if st.key is None else keyed_stats(conn, raw)
                integrity = health.integrity(quick=quick)
                sizes = health.sizes()
                upkeep = pending_upkeep(conn, stats)
                fts = fts_on_a_copy(raw, st.key)
            finally:
                conn.rollback()
    except DBAPIError as exc:
        if isinstance(exc.orig, sqlite3.DatabaseError):
            raise refusal(real, exc.orig, st.key) from exc
        raise
    except sqlite3.DatabaseError as exc:
        raise refusal(real, exc, st.key) from exc
    upkeep["wal_size_bytes"] = next((f["size_bytes"] for f in files if f["path"].endswith("-wal")), 0)
    mode = stats.get("journal_mode")
    wal = wal_reset_bug(mode)
    found = revision_problem(revision, hermes_file, host_table)
    if found:
        problems.append(found)
    if integrity != ["ok"]:
        problems.append(f"{'quick_check' if quick else 'integrity_check'}: " + "; ".join(integrity[:3]))
    damaged = {k: v for k, v in fts.items() if v}
    if damaged:
        problems.append("damaged search index: " + ", ".join(damaged) + " (run 'hermes-store fts rebuild')")
    if wal["affected"] and mode == "wal":
        warnings.append(f"SQLite {sqlite3.sqlite_version} has the WAL-reset bug and this file is in WAL")
    for f in files:
        if not f["private"]:
            warnings.append(f"{f['path']} is mode {f['mode']}, readable by others (chmod 600 it)")
    if sizes is None:
        warnings.append("this SQLite has no dbstat table: sizes per table and index are not available")
    size = stats.get("logical_size_bytes")
    return {
        "backend": "sqlite", "database": str(st.path), "file": str(real),
        "versions": {**versions("sqlite3" if st.key is None else encryption.SQLCIPHER_MODULE),
                     "sqlite": sqlite3.sqlite_version if st.key is None else sqlcipher_sqlite_version()},
        "wal_reset_bug": wal,
        "revision": {"current": revision, "head": migrations.head(), "at_head": revision == migrations.head()},
        "journal_mode": mode, "files": files,
        "integrity": {"check": "quick_check" if quick else "integrity_check", "ok": integrity == ["ok"],
                      "result": integrity},
        "fts": {k: ("ok" if v is None else v.splitlines()[0]) for k, v in fts.items()},
        "sizes": sizes_doc(sizes, size),
        "upkeep": upkeep, "problems": problems, "warnings": warnings,
    }


def server_report(st: State) -> dict[str, Any]:
    assert st.url is not None
    revision, host_table = store_revision(st)  # never creates the schema it asks about
    problems: list[str] = []
    warnings: list[str] = []
    engine = create_engine(st.url)
    try:
        with paths.connect(engine) as conn:
            try:
                server = ".".join(str(p) for p in (conn.dialect.server_version_info or ()))
                driver = type(conn.connection.dbapi_connection).__module__.split(".")[0]
                ours = revision is not None
                sizes = HealthRepository(conn).sizes()
                fts = MaintenanceRepository(conn).fts_integrity_check() if ours else {}
                upkeep = pending_upkeep(conn, None) if ours else {}
            finally:
                conn.rollback()
    finally:
        engine.dispose()
    found = revision_problem(revision, False, host_table)
    if found:
        problems.append(found)
    damaged = {k: v for k, v in fts.items() if v}
    if damaged:
        problems.append("damaged search index: " + ", ".join(damaged) + " (run 'hermes-store fts rebuild')")
    total = sum(s.bytes for s in sizes or () if s.kind == "table")
    return {
        "backend": "postgresql", "database": st.where,
        "versions": {**versions(driver), "server": server},
        "revision": {"current": revision, "head": migrations.head(), "at_head": revision == migrations.head()},
        "fts": {k: ("ok" if v is None else v.splitlines()[0]) for k, v in fts.items()},
        "sizes": sizes_doc(sizes, total),
        "upkeep": upkeep, "problems": problems, "warnings": warnings,
    }


def sizes_doc(sizes: Any, total: int | None) -> dict[str, Any]:
    return {"available": sizes is not None, "total_bytes": total,
            "objects": [{"name": s.name, "kind": s.kind, "table": s.table, "bytes": s.bytes} for s in sizes or ()]}


# ---------------------------------------------------------------------------- what is shown


def print_report(report: dict[str, Any]) -> None:
    out = stdout_console()
    v = report["versions"]
    rows: list[list[Any]] = [
        ["database", printable(report["database"])],
        ["hermes_store", v["hermes_store"]],
        ["SQLAlchemy / Alembic", f"{v['sqlalchemy']} / {v['alembic']}"],
        ["driver", f"{v['driver']['name']} {v['driver']['version'] or ''}".strip()],
    ]
    if report["backend"] == "sqlite":
        wal = report["wal_reset_bug"]
        rows.append(["SQLite", v["sqlite"]])
        rows.append(["WAL-reset bug", f"affected (SQLite {wal['affected_range']}; fixed in {wal['fixed_in']})"
                     if wal["affected"] else "not affected"])
        rows.append(["  what the store does", wal["this_store"]])
    else:
        rows.append(["PostgreSQL server", v["server"]])
    rev = report["revision"]
    at_head = " (head)" if rev["at_head"] else f" (head is {rev['head']})"
    rows.append(["revision", f"{rev['current'] or 'none'}{at_head}"])
    if report["backend"] == "sqlite":
        rows.append(["journal mode", report["journal_mode"] or "unknown"])
        for f in report["files"]:
            rows.append([f"file {Path(f['path']).name}",
                         f"mode {f['mode']}{'' if f['private'] else ' (expected 0600)'}, {fmt_bytes(f['size_bytes'])}"])
        integ = report["integrity"]
        rows.append([integ["check"], "ok" if integ["ok"] else "; ".join(integ["result"][:3])])
    for name, result in report["fts"].items():
        rows.append([f"search index {name}", result])
    up = report["upkeep"]
    if up:
        windows = up["fts_rebuild_windows"]
        rows.append(["FTS rebuild windows", ", ".join(f"{k}={v}" for k, v in windows.items()) or "none"])
        behind = up["cjk_bigram_rows_behind"]
        rows.append(["short-CJK index", "not installed" if behind is None else
                     ("up to date" if behind == 0 else f"{fmt_num(behind)} row(s) to catch up")])
        if "wal_size_bytes" in up:
            rows.append(["WAL size", fmt_bytes(up["wal_size_bytes"])])
            rows.append(["free pages", fmt_num(up["freelist_pages"]) if up["freelist_pages"] is not None else "—"])
        last = up["last_auto_prune"]
        rows.append(["last auto-prune", fmt_time(last) if isinstance(last, float) else (last or "never")])
    sizes = report["sizes"]
    rows.append(["size", fmt_bytes(sizes["total_bytes"])])
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("check", no_wrap=True)
    table.add_column("result", overflow="fold")  # wrapped, never cut: each line is an answer
    for key, value in rows:
        table.add_row(key, Text(printable(value)))
    out.print(table)
    objects = sizes["objects"]
    if objects:
        shown = objects[:SIZES_SHOWN]
        size_rows = [[s["name"], s["kind"], s["table"], fmt_bytes(s["bytes"])] for s in shown]
        title = "Size by table and index" + ("" if len(shown) == len(objects) else
                                             f" (largest {len(shown)} of {len(objects)}; --json lists all)")
        out.print(fitted_table(out, ["object", "kind", "table", "size"], size_rows, flex=0, right=(3,), title=title))
    for line in report["warnings"]:
        out.print(Text(f"warning: {printable(line)}", style="yellow"))
    for line in report["problems"]:
        out.print(Text(f"problem: {printable(line)}", style="red"))
    if not report["problems"]:
        out.print(Text("Healthy: no problem found.", style="green"))


COMMANDS = (doctor,)

__all__ = ["COMMANDS", "doctor"]
