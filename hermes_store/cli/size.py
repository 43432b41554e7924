"""``hermes-store size``: where a store's bytes are, read without changing a byte of it.

Per table (its own b-tree and its indexes) and per search index (an FTS5 index with its
shadow tables, a server's GIN index, the short-CJK bigram tables), each with its share
of the total; free pages; the WAL; and what ``VACUUM`` and ``hermes-store fts optimize``
would give back. Every reclaim figure says how it was obtained (``how``: exact or
estimate); ``--exact`` measures both on a private copy of a file (SQLite's backup API
into the temporary folder, as ``doctor``'s FTS check does), at the cost of copying it;
an encrypted store's copy is encrypted with its key from the first byte.

A file is read through one read-only connection (:func:`hermes_store.paths.readonly_connection`)
and per-object bytes come from SQLite's ``dbstat`` table where the build has it; without
it the totals are still exact (``page_count``, ``freelist_count``) and only the search
indexes' bytes are estimated, from their segments' payload. The WAL's size is the
``-wal`` file's ``stat`` (never opened: closing any descriptor of a database file drops
the process's locks on it). A server is read in a transaction that is rolled back, its
tenant schema named in each statement.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from .. import migrations, paths
from ..copying.endpoints import readonly_engine
from ..engine import create_engine
from ..operations.fts import vacuum_now
from ..repositories import MaintenanceRepository
from ..repositories.health import HealthRepository
from ._common import (
    CliError,
    State,
    _state,
    fitted_table,
    fmt_bytes,
    fmt_num,
    global_options,
    printable,
    require_file,
    revision_on,
    stdout_console,
    store_revision,
)
from .doctor import file_modes, private_copy, refusal

#: Indexes a person is shown (the largest); --json has every one.
INDEXES_SHOWN = 12


@click.command()
@click.option("--exact", is_flag=True,
              help="Measure what vacuum and fts optimize give back on a private copy of the file (slower).")
@global_options
def size(exact: bool) -> None:
    """Where the bytes are: tables, indexes, search indexes, free space.

    Read-only: the database file's bytes and time stamp stay as they were. Figures
    that are estimates say so (--json: each reclaim's "how"); --exact measures the
    reclaims on a private copy of a file instead. With --json, one object.
    """
    st = _state()
    if exact and st.url is not None:
        raise click.UsageError("--exact measures on a private copy of a file; a server's figures are its own")
    report = file_report(st, exact) if st.url is None else server_report(st)
    if st.json:
        st.emit(report)
    else:
        print_report(report)


# ---------------------------------------------------------------------------- what is read


def measured_on_a_copy(engine: Engine, before: dict[str, Any]) -> dict[str, Any]:
    """What VACUUM and an FTS optimize really give back, done on a private copy: the
    file's bytes before and after VACUUM, then each search index's bytes before and
    after the optimize (the pages it frees go to the free list for the next VACUUM)."""
    vacuum_now(engine)
    vacuumed = space_on(engine)
    with engine.begin() as conn:
        MaintenanceRepository(conn).fts_optimize()
    optimized = space_on(engine)
    by_name = {i["name"]: i["bytes"] for i in optimized["search_indexes"]}
    per_index = {i["name"]: (i["bytes"] or 0) - (by_name.get(i["name"]) or 0)
                 for i in vacuumed["search_indexes"] if i["name"] in by_name}
    return {
        "vacuum": {"bytes": before["total_bytes"] - vacuumed["total_bytes"],
                   "how": "exact: vacuum run on a private copy"},
        "fts_optimize": {"bytes": vacuumed["used_bytes"] - optimized["used_bytes"],
                         "how": "exact: optimize run on a private copy (pages freed; a vacuum then gives them back)",
                         "per_index": per_index},
    }


def space_on(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        try:
            return HealthRepository(conn).space()
        finally:
            conn.rollback()


def file_report(st: State, exact: bool) -> dict[str, Any]:
    assert st.path is not None
    require_file(st.path)  # missing, a folder, a dangling link: refused, nothing created
    real = paths.resolve_link(st.path)
    files = file_modes(real)  # stat only, before we open: a reader may add sidecars of its own
    try:
        with readonly_engine(real, st.key) as engine:
            with engine.connect() as conn:
                try:
                    revision, _ = revision_on(conn)
                    space = HealthRepository(conn).space()
                finally:
                    conn.rollback()
            measured = None
            if exact:
                with engine.connect() as conn:
                    raw = conn.connection.dbapi_connection
                    # An encrypted store's copy is encrypted with its key (never a plaintext copy).
                    with private_copy(raw, st.key) as copy:
                        measured = measured_on_a_copy(copy, space_on(copy))
    except DBAPIError as exc:
        if isinstance(exc.orig, sqlite3.DatabaseError):
            raise refusal(real, exc.orig, st.key) from exc
        raise
    except sqlite3.DatabaseError as exc:
        raise refusal(real, exc, st.key) from exc
    wal = next((f["size_bytes"] for f in files if f["path"].endswith("-wal")), 0)
    return report_doc(st, space, revision, measured, {"file": str(real), "wal_bytes": wal,
                                                       "file_bytes": next(f["size_bytes"] for f in files)})


def server_report(st: State) -> dict[str, Any]:
    assert st.url is not None
    revision, _ = store_revision(st)  # never creates the schema it asks about
    engine = create_engine(st.url)
    try:
        with paths.connect(engine) as conn:
            try:
                space = HealthRepository(conn).space()
            finally:
                conn.rollback()
    finally:
        engine.dispose()
    return report_doc(st, space, revision, None, {})


def report_doc(st: State, space: dict[str, Any], revision: str | None, measured: dict[str, Any] | None,
               extra: dict[str, Any]) -> dict[str, Any]:
    notes = []
    if st.url is None and not space["exact"]:
        notes.append("this SQLite has no dbstat table: per-table bytes are not available, the totals are exact "
                     "(page counts) and the search indexes' bytes are estimates (their segments' payload)")
    if st.url is not None:
        notes.append("the word index's tsvector column is stored in the messages table; its GIN index is listed "
                     "as the search index")
    if measured is not None:
        per_index = measured["fts_optimize"].pop("per_index")
        for entry in space["search_indexes"]:
            if entry["name"] in per_index:
                entry["optimize_reclaim_bytes"] = per_index[entry["name"]]
                entry["optimize_reclaim_how"] = "exact: measured on a private copy"
        space["reclaim"] = measured
    return {"backend": "sqlite" if st.url is None else "postgresql", "database": st.where, **extra,
            "revision": {"current": revision, "head": migrations.head()}, **space, "notes": notes}


# ---------------------------------------------------------------------------- what is shown


def pct(share: float | None) -> str:
    return "—" if share is None else f"{share * 100:.1f} %"


def reclaim_text(r: dict[str, Any]) -> str:
    """``1.2 MiB``, ``0 B to 2.1 MiB`` for a range, ``none (grows by 4.0 KiB)`` when a
    measured run made the copy bigger; then how the figure was obtained."""
    n = r["bytes"]
    if n is not None and n < 0:
        figure = f"none (grows by {fmt_bytes(-n)})"
    elif r.get("at_most") is not None and r["at_most"] != n:
        figure = f"{fmt_bytes(n)} to {fmt_bytes(r['at_most'])}"
    else:
        figure = fmt_bytes(n)
    return f"{figure} ({r['how']})" if r["how"] else figure


def print_report(report: dict[str, Any]) -> None:
    out = stdout_console()
    rows: list[list[Any]] = [["database", printable(report["database"])]]
    if report["backend"] == "sqlite":
        rows.append(["measured with", "dbstat (exact per table and index)" if report["exact"]
                     else "page counts (no dbstat in this SQLite: per-table bytes not available)"])
        rows.append(["file", f"{fmt_bytes(report['total_bytes'])} ({fmt_num(report['page_count'])} pages of "
                             f"{fmt_num(report['page_size'])} B)"])
        rows.append(["in use", fmt_bytes(report["used_bytes"])])
        rows.append(["free pages", f"{fmt_num(report['free_pages'])} ({fmt_bytes(report['free_bytes'])})"])
        rows.append(["WAL", fmt_bytes(report["wal_bytes"])])
    else:
        rows.append(["total", fmt_bytes(report["total_bytes"])])
    for key, label in (("vacuum", "vacuum would reclaim"), ("fts_optimize", "fts optimize would reclaim")):
        r = report["reclaim"][key]
        rows.append([label, reclaim_text(r)])
    rows += [["note", line] for line in report["notes"]]
    summary = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    summary.add_column("where", no_wrap=True)
    summary.add_column("bytes", overflow="fold")
    for key, value in rows:
        summary.add_row(key, Text(printable(value)))
    out.print(summary)
    search = report["search_indexes"]
    if search:
        headers = ["search index", "size", "share"]
        search_rows = [[i["name"], fmt_bytes(i["bytes"]), pct(i["share"])] for i in search]
        if any(i["segments"] is not None for i in search):  # FTS5's: a server's GIN indexes have none
            headers += ["segments", "optimize frees"]
            for row, i in zip(search_rows, search, strict=True):
                row += ["—" if i["segments"] is None else fmt_num(i["segments"]),
                        reclaim_text({"bytes": i["optimize_reclaim_bytes"], "how": None})]
        out.print(fitted_table(out, headers, search_rows, flex=0, right=range(1, len(headers)),
                               title="Search indexes (with their tables)"))
    tables = [t for t in report["tables"] if t["bytes"]]
    if tables:
        table_rows = [[t["name"], fmt_bytes(t["table_bytes"]), fmt_bytes(t["index_bytes"]), fmt_bytes(t["bytes"]),
                       pct(t["share"])] for t in tables]
        out.print(fitted_table(out, ["table", "rows", "indexes", "total", "share"], table_rows, flex=0,
                               right=(1, 2, 3, 4), title="Tables (with their indexes)"))
    indexes = sorted((i | {"table": t["name"]} for t in report["tables"] for i in t["indexes"]),
                     key=lambda i: (-i["bytes"], i["name"]))
    if indexes:
        shown = indexes[:INDEXES_SHOWN]
        title = "Indexes" + ("" if len(shown) == len(indexes) else
                             f" (largest {len(shown)} of {len(indexes)}; --json lists all)")
        out.print(fitted_table(out, ["index", "table", "size"], [[i["name"], i["table"], fmt_bytes(i["bytes"])]
                                                                 for i in shown], flex=0, right=(2,), title=title))


COMMANDS = (size,)

__all__ = ["COMMANDS", "CliError", "size"]
