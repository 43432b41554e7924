"""Upkeep commands: prune (old ended sessions) and fts (search index rebuild, check, optimize)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from ..keys import DAY
from ..repositories import MaintenanceRepository
from ..repositories.transcripts import transcript_files_many
from ._common import (
    DAYS,
    PROG,
    TEXT,
    CliError,
    read,
    _state,
    fitted_table,
    fmt_num,
    fmt_time,
    global_options,
    prune_candidates,
    session_db,
    stdin_is_terminal,
    stdout_console,
)

# ---------------------------------------------------------------------------- prune


#: How many sessions a human dry run lists before the "--all for the rest" line.
DRY_RUN_SHOWN = 20


@click.command()
@click.option("--older-than-days", "days", type=DAYS, required=True, metavar="N",
              help="Delete ended sessions that started more than N days ago (0 to 100,000).")
@click.option("--source", type=TEXT, metavar="SRC", help="Only sessions from this source.")
@click.option("--sessions-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), metavar="DIR",
              help="Also remove their transcript files (<id>.json, <id>.jsonl, request_dump_<id>_*.json) here.")
@click.option("--dry-run", is_flag=True, help="Summarize and list what would be deleted; delete nothing.")
@click.option("--all", "list_all", is_flag=True,
              help=f"With --dry-run: list every session, not only the first {DRY_RUN_SHOWN}.")
@click.option("-y", "--yes", is_flag=True,
              help="Delete without asking (needed when stdin is not a terminal: scripts, cron).")
@global_options
def prune(days: int, source: str | None, sessions_dir: Path | None, dry_run: bool, list_all: bool, yes: bool) -> None:
    """Delete old ended sessions and their messages.

    Only sessions that ended and started more than N days ago go; their
    children are kept, without a parent. Try --dry-run first: it prints how
    many sessions and messages would go and the first ones (--all for every one).
    On a terminal prune asks before deleting; elsewhere it needs --yes.
    """
    if list_all and not dry_run:
        # Refused rather than ignored: "prune --all" reads like "delete everything".
        raise click.UsageError("--all only widens the --dry-run listing; add --dry-run")
    ask = not (dry_run or yes)
    if ask and not stdin_is_terminal():
        # Refused before anything is opened, whatever the database holds: a script
        # that runs today without --yes would delete the day something is old enough.
        raise click.UsageError("prune deletes sessions: add --yes to confirm (no terminal to ask on), "
                               "or --dry-run to see what would go")
    st = _state()
    with session_db(st, write=not dry_run) as db:
        if dry_run or ask:
            cutoff, rows = prune_candidates(db, days, source)
            ids = [r["id"] for r in rows]
            orphan_ids, messages = read(db, lambda c: MaintenanceRepository(c).prune_preview(ids))
            orphans = [{"id": i} for i in orphan_ids]
            found = transcript_files_many(sessions_dir, [r["id"] for r in rows]) if sessions_dir else {}
            files = [str(p) for r in rows for p in found.get(r["id"], [])]
            deleted = len(rows)
        if ask:
            if rows:
                confirm(f"Delete {fmt_num(len(rows))} session(s) with {fmt_num(messages)} message(s) that ended and "
                        f"started before {fmt_time(cutoff)}"
                        + (f", and {fmt_num(len(files))} transcript file(s)" if files else "")
                        + f" from {st.where}?")
        if not dry_run:
            cutoff = time.time() - days * DAY
            rows, orphans, files, messages = [], [], [], 0
            deleted = db.prune_sessions(days, source, sessions_dir)
    starts = [r["started_at"] for r in rows if r["started_at"] is not None]
    doc: dict[str, Any] = {"dry_run": dry_run, "older_than_days": days, "cutoff": cutoff, "source": source,
                           ("would_delete" if dry_run else "deleted"): deleted}
    if dry_run:
        doc.update(would_delete_messages=int(messages), oldest_started_at=min(starts, default=None),
                   newest_started_at=max(starts, default=None), sessions=[dict(r) for r in rows],
                   would_orphan=[o["id"] for o in orphans], transcript_files=files)
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    if not dry_run:
        out.print(Text(f"Deleted {fmt_num(deleted)} session(s) that ended and started before {fmt_time(cutoff)}."))
        return
    if not rows:
        out.print(Text(f"Nothing to prune: no ended session started before {fmt_time(cutoff)}."))
        return
    out.print(Text(f"Would delete {fmt_num(deleted)} session(s) with {fmt_num(messages)} message(s),"))
    if starts:
        out.print(Text(f"started {fmt_time(doc['oldest_started_at'])} to {fmt_time(doc['newest_started_at'])} "
                       f"(cutoff {fmt_time(cutoff)})."))
    else:
        out.print(Text(f"started before {fmt_time(cutoff)}."))
    shown = rows if list_all else rows[:DRY_RUN_SHOWN]
    table_rows = [[r["id"], (r["source"] or "")[:10], fmt_time(r["started_at"]), fmt_num(r["message_count"]),
                   r["title"] or r["end_reason"] or ""] for r in shown]
    out.print(fitted_table(out, ["Session", "Source", "Started", "Msgs", "Title / end"], table_rows, flex=4, right=[3],
                           title=None if len(shown) == len(rows) else f"Oldest {len(shown)} of {fmt_num(len(rows))}"))
    notes = []
    if len(shown) < len(rows):
        notes.append(f"… and {fmt_num(len(rows) - len(shown))} more (--all lists every one).")
    if orphans:
        notes.append(f"{fmt_num(len(orphans))} child session(s) would be kept without a parent.")
    if files:
        notes.append(f"{fmt_num(len(files))} transcript file(s) would be removed.")
    notes.append("Dry run: nothing was changed.")
    for note in notes:
        out.print(Text(note, style="dim"))


def confirm(question: str) -> None:
    """Ask on the terminal (stderr: stdout may be data); anything but yes deletes nothing."""
    if not click.confirm(question, default=False, err=True):
        raise CliError("nothing was deleted (not confirmed)", code="not_confirmed")


# ---------------------------------------------------------------------------- fts


@click.group(no_args_is_help=False)
@global_options
def fts() -> None:
    """Full-text search index upkeep: rebuild, check, optimize."""


@fts.command("rebuild")
@global_options
def fts_rebuild() -> None:
    """Re-index every message in every search index."""
    st = _state()
    with session_db(st, write=True) as db:
        started = time.monotonic()
        with st.progress("spinner") as bar:
            bar.add_task("Rebuilding search indexes", total=None)
            done = db.rebuild_search_indexes()
        messages = db.message_count()
    doc = {"rebuilt": done, "messages": messages, "seconds": round(time.monotonic() - started, 3)}
    if st.json:
        st.emit(doc)
    else:
        rebuilt = ", ".join(done) or "no index"
        stdout_console().print(Text(f"Rebuilt {rebuilt} over {messages:,} message(s) in {doc['seconds']}s"))


@fts.command("check")
@global_options
def fts_check() -> None:
    """Run FTS5's integrity check on every index (exit 1 when one is damaged)."""
    st = _state()
    with session_db(st, write=True) as db:
        result = db.check_fts()
    damaged = {k: v for k, v in result.items() if v}
    doc = {"ok": not damaged, "indexes": {k: ("ok" if v is None else v) for k, v in result.items()}}
    if st.json:
        st.emit(doc)
    else:
        out = stdout_console()
        if not result:
            out.print(Text("No search index to check in this database"))  # never a silent success
        for name, problem in result.items():
            verdict = Text("ok", style="green") if problem is None else Text(problem, style="red")
            out.print(Text(f"{name}: ") + verdict)
    if damaged:
        raise CliError(f"damaged search index: {', '.join(damaged)}; run '{PROG} fts rebuild'")


@fts.command("optimize")
@global_options
def fts_optimize() -> None:
    """Merge each index's segments (faster searches after many writes)."""
    st = _state()
    with session_db(st, write=True) as db:
        done = db.optimize_search_indexes()
    if st.json:
        st.emit({"optimized": done})
    else:
        stdout_console().print(Text(f"Optimized {', '.join(done) or 'no index'}"))


COMMANDS = (prune, fts)
