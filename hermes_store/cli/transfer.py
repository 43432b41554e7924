"""Moving sessions in and out: export (JSON Lines, streamed), import (idempotent), and
copy (a whole history from one database to another, resumable and verified)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import click
from rich.text import Text

from .. import encryption
from ..codec import jsonl_line
from ..copying import DEFAULT_BATCH, MAX_BATCH, CopyReport, CopyVerificationError, copy_history
from ..errors import EncryptionKeyError, HermesStoreError
from ._common import (
    TEXT,
    CliError,
    LockWaits,
    Whole,
    _isatty,
    _state,
    atomic_output,
    fitted_table,
    fmt_num,
    global_options,
    printable,
    refuse_store_file,
    session_db,
    stdout_console,
)
from .crypto import KEY_FILE  # a key comes in a 0600 file, never on the command line (ps shows it)

# ---------------------------------------------------------------------------- export / import


def binary_stream(stream: Any) -> Any:
    """The byte stream under stdin/stdout: JSON Lines are UTF-8 whatever the locale says."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        raise CliError("this standard stream cannot carry bytes; use a file instead")
    return buffer


@click.command()
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True), metavar="FILE",
              help="Write here (atomically) instead of stdout.")
@click.option("--source", type=TEXT, metavar="SRC", help="Only sessions from this source.")
@global_options
def export(out_path: Path | None, source: str | None) -> None:
    """Export sessions as JSON Lines (one per line).

    Streamed: memory stays flat however large the database. Written to stdout
    unless --out is given.
    """
    st = _state()
    to_stdout = out_path is None or str(out_path) == "-"
    target = None if to_stdout else out_path.expanduser()  # type: ignore[union-attr]
    if target is not None:
        refuse_store_file(st, target, "--out")  # before anything is opened
        if not target.parent.is_dir():
            raise CliError(f"cannot write {target}: folder {target.parent} does not exist")
    sessions = messages = 0
    with session_db(st) as db:
        total = db.session_count(source, include_archived=True)  # export writes archived ones too
        if target is None:
            sys.stdout.flush()
            stream = binary_stream(sys.stdout)
            # No bar over a terminal the lines go to; progress lines to a log are fine.
            with st.progress(bar=not _isatty(sys.stdout)) as bar:
                task = bar.add_task("Exporting", total=total)
                for record in db.iter_export(source):
                    stream.write((jsonl_line(record) + "\n").encode("utf-8"))
                    bar.advance(task)
            stream.flush()
            return
        # Owner-only, like the database itself: it holds the same conversations.
        with atomic_output(target, store=st.path) as fh, st.progress() as bar:
            task = bar.add_task("Exporting", total=total)
            for record in db.iter_export(source):
                fh.write(jsonl_line(record) + "\n")
                sessions += 1
                messages += len(record.get("messages") or [])
                bar.advance(task)
    doc = {"out": str(target), "sessions": sessions, "messages": messages, "source": source}
    if st.json:
        st.emit(doc)
    else:
        stdout_console().print(Text(f"Exported {fmt_num(sessions)} session(s), {fmt_num(messages)} message(s)"
                                    f" to {printable(target)}"))


def read_jsonl(fh: Any, counter: dict[str, int], on_record: Callable[[], None]) -> Iterator[dict[str, Any]]:
    """Parse and check export lines lazily; a bad line names its number."""
    for lineno, raw in enumerate(fh, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise CliError(f"line {lineno}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except ValueError as exc:
            raise CliError(f"line {lineno}: not valid JSON ({exc})") from None
        if not isinstance(record, dict):
            raise CliError(f"line {lineno}: expected a JSON object (one exported session)")
        if not isinstance(record.get("id"), str) or not record["id"]:
            raise CliError(f"line {lineno}: the session has no 'id'")
        if not isinstance(record.get("source"), str) or not isinstance(record.get("started_at"), (int, float)):
            raise CliError(f"line {lineno}: session {record['id']!r} lacks 'source' or a numeric 'started_at'")
        msgs = record.get("messages") or []
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
            raise CliError(f"line {lineno}: session {record['id']!r} has malformed 'messages'")
        counter["messages"] += len(msgs)
        counter["sessions"] += 1
        yield record
        on_record()


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True))
@global_options
def import_cmd(file: Path) -> None:
    """Import a JSON Lines export (idempotent).

    Sessions already present are skipped, so importing twice changes nothing.
    FILE may be - for stdin.

    While another process holds the database's write lock (Hermes writing, another
    import), the import waits for it, up to a minute a batch: the progress bar says
    "waiting for the database lock (N s)"; when stderr is not a terminal, one line
    says so once a wait has lasted a second (a JSON object with --json, its
    "waiting_for_lock_seconds" set), and the progress lines say so while it lasts;
    with -q nothing is written.
    """
    st = _state()
    from_stdin = str(file) == "-"
    refuse_store_file(st, file, "FILE")  # before the first open() of it, existing or not
    if not from_stdin and not file.exists():
        raise click.BadParameter(f"File {printable(file)!r} does not exist.", param_hint="'FILE'")
    total = None
    if not from_stdin:
        with open(file, "rb") as fh:
            total = sum(1 for line in fh if line.strip())
    counter = {"sessions": 0, "messages": 0}
    # The progress first: opening the store waits for a write lock another process holds too.
    with st.progress() as bar:
        task = bar.add_task("Importing", total=total)
        waits = LockWaits(bar, task, "Importing")
        with session_db(st, create=True, on_wait=waits) as db:
            fh = binary_stream(sys.stdin) if from_stdin else open(file, "rb")
            try:
                imported, skipped = db.import_records(read_jsonl(fh, counter, waits.advance))
            finally:
                if not from_stdin:
                    fh.close()
    doc = {"file": str(file), "read": counter["sessions"], "imported": imported, "skipped": skipped,
           "messages_read": counter["messages"]}
    if st.json:
        st.emit(doc)
    else:
        stdout_console().print(Text(f"Imported {fmt_num(imported)} session(s), skipped {fmt_num(skipped)}"
                                    f" already present ({fmt_num(counter['messages'])} message(s) read from"
                                    f" {printable(file)})"))


# ---------------------------------------------------------------------------- copy

#: Progress bar labels per copy stage (the library reports stage names).
COPY_STAGES = {
    "snapshot": "Snapshotting the source",
    "sessions": "Copying sessions",
    "index": "Indexing search",
    "verify": "Verifying",
}


def copy_progress(bar: Any) -> Callable[[str, int, int | None], None]:
    """One bar per stage of :func:`hermes_store.copying.copy_history`."""
    tasks: dict[str, Any] = {}

    def cb(stage: str, done: int, total: int | None) -> None:
        if stage not in tasks:
            if stage.startswith("adopt:"):
                label = f"Adopting a copy of the source ({stage[6:]})"
            else:
                label = COPY_STAGES.get(stage, f"Copying {stage}")
            tasks[stage] = bar.add_task(label, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    return cb


@click.command("copy")
@click.option("--from", "source", type=TEXT, metavar="SRC",
              help="Copy from this path or URL [default: the --db/--url database].")
@click.option("--to", "destination", type=TEXT, metavar="DST", required=True,
              help="Copy to this path or URL: created, or migrated to the newest revision.")
@click.option("--merge", is_flag=True,
              help="Add to a destination that already holds data (sessions already there are kept, as import does).")
@click.option("--batch", type=Whole(1, MAX_BATCH), default=DEFAULT_BATCH, show_default=True, metavar="N",
              help="Messages (and rows) per transaction.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Where an unadopted source file is adopted in a temporary copy [default: next to a file "
                   "destination, else the temporary folder].")
@click.option("--from-key-file", type=KEY_FILE, metavar="FILE",
              help="The encrypted source file's key, in a file only you can read (0600) "
                   "[default: $HERMES_STORE_KEY / $HERMES_STORE_KEY_FILE].")
@click.option("--to-key-file", type=KEY_FILE, metavar="FILE",
              help="The key to encrypt (or open) the destination file with, in a 0600 file "
                   "[default: $HERMES_STORE_KEY / $HERMES_STORE_KEY_FILE].")
@global_options
def copy_cmd(source: str | None, destination: str, merge: bool, batch: int, work_dir: Path | None,
             from_key_file: Path | None, to_key_file: Path | None) -> None:
    """Copy a whole history between SQLite files and PostgreSQL databases.

    SRC and DST are each a file path or a URL (sqlite:///… or postgresql+psycopg://…).
    The source is only read (an unadopted Hermes file is adopted in a temporary copy).
    Sessions, messages (with their ids), titles, lineage, the usage ledger and the rest
    of the history are copied in batches; a killed copy resumes where it stopped when
    run again, and a finished one changes nothing. At the end row counts and a
    checksum per session are compared on both sides; a mismatch exits with code 1 and
    names the sessions. A destination that already holds data is refused unless
    --merge is given, and one that another copy is writing right now is refused
    (nothing written; run again when that copy is done). Add ?schema=NAME to a
    PostgreSQL URL for a tenant schema.

    Either file may be encrypted (SQLCipher): its key comes from --from-key-file /
    --to-key-file (a 0600 file), else from $HERMES_STORE_KEY / $HERMES_STORE_KEY_FILE,
    as for every command; a file side with no key is plain. So a copy between a plain
    and an encrypted file gives the encrypted side's key file and runs with neither
    variable set. An encrypted destination is encrypted from its first byte.
    """
    st = _state()
    src: Any = source if source is not None else (st.url if st.url is not None else st.path)
    # The --db store's own key (its --url's password part, or the environment's).
    source_key = encryption.read_key_file(from_key_file) if from_key_file is not None else (
        st.key if source is None else None)
    destination_key = encryption.read_key_file(to_key_file) if to_key_file is not None else None
    failure: HermesStoreError | None = None
    with st.progress() as bar:
        try:
            report = copy_history(src, destination, merge=merge, batch=batch, work_dir=work_dir,
                                  progress=copy_progress(bar), source_key=source_key,
                                  destination_key=destination_key)
        except CopyVerificationError as exc:
            report, failure = exc.report, exc
        except EncryptionKeyError as exc:
            raise EncryptionKeyError(f"{exc} (copy: --from-key-file / --to-key-file FILE give each side's "
                                     "key; a side given none takes the environment's)") from exc
    if st.json:
        st.emit(report.as_dict())
    else:
        print_copy_report(report)
    if failure is not None:
        raise CliError(str(failure))


def print_copy_report(report: CopyReport) -> None:
    """The human summary: what moved, per-table counts on both sides, the checks."""
    out = stdout_console()
    where = f"from {printable(report.source)} to {printable(report.destination)}"
    if report.already_complete and not report.sessions_copied:
        out.print(Text(f"Nothing to copy {where}: the destination already holds this copy."))
    else:
        verb = "Resumed and finished the copy" if report.resumed else "Copied"
        out.print(Text(f"{verb} {where}: {fmt_num(report.sessions_copied)} session(s), "
                       f"{fmt_num(report.messages_copied)} message(s) in this run."))
    if report.sessions_present:
        why = ("copied by an earlier run, or there before and kept as they are" if report.merge
               else "copied by an earlier run")
        out.print(Text(f"{fmt_num(report.sessions_present)} session(s) were in the destination already ({why})."))
    rows = [[name, fmt_num(c["source"]), fmt_num(c["destination"])] for name, c in report.tables.items()]
    if rows:
        out.print(fitted_table(out, ["table", "source", "destination"], rows, flex=0, right=(1, 2)))
    notes: list[str] = []
    if report.not_copyable:
        notes.append("not copyable (a NULL key, or rows of a session that does not exist): "
                     + ", ".join(f"{t} {fmt_num(n)}" for t, n in sorted(report.not_copyable.items())))
    if report.renumbered_sessions:
        notes.append(f"{fmt_num(len(report.renumbered_sessions))} session(s) got new message ids (theirs were taken): "
                     + _listed(report.renumbered_sessions))
    if report.renamed_titles:
        notes.append(f"{fmt_num(len(report.renamed_titles))} title(s) were taken and renamed: "
                     + ", ".join(f"{old!r} → {new!r}" for _sid, old, new in report.renamed_titles[:5])
                     + (" …" if len(report.renamed_titles) > 5 else ""))
    if report.dropped_links:
        notes.append(f"{fmt_num(len(report.dropped_links))} parent link(s) to sessions that exist nowhere"
                     " were dropped: " + _listed([child for child, _parent in report.dropped_links]))
    if report.dropped_prompts:
        notes.append(f"{fmt_num(len(report.dropped_prompts))} system prompt reference(s) without their prompt"
                     " were dropped")
    if report.skipped_tables:
        notes.append("not copied: " + ", ".join(f"{t} ({why})" for t, why in sorted(report.skipped_tables.items())))
    if report.skipped_columns:
        notes.append("columns hermes_store does not know, not copied: "
                     + ", ".join(f"{t}.{c}" for t, cols in sorted(report.skipped_columns.items()) for c in cols))
    if report.indexed_rows or report.rebuilt_indexes:
        notes.append(f"search: {fmt_num(report.indexed_rows)} row(s) indexed"
                     + (f", rebuilt {', '.join(report.rebuilt_indexes)}" if report.rebuilt_indexes else ""))
    for note in notes:
        out.print(Text("  " + printable(note), style="dim"))
    checks = f"{fmt_num(report.sessions_checked)} session checksum(s)"
    if report.ok:
        out.print(Text(f"Verified: row counts and {checks} match "
                       f"(source {report.source_checksum[:16]}, destination {report.destination_checksum[:16]})."))
        if report.kept_sessions:
            out.print(Text(f"  {fmt_num(len(report.kept_sessions))} session(s) the destination already had differ from "
                           f"the source and were kept as they are: {_listed(report.kept_sessions)}", style="dim"))
    else:
        out.print(Text(f"Verification FAILED ({checks}; source {report.source_checksum[:16]}, "
                       f"destination {report.destination_checksum[:16]})."))
        if report.mismatched_sessions:
            out.print(Text(f"  sessions that differ: {_listed(report.mismatched_sessions, 20)}"))
        for table, n in sorted(report.mismatched_rows.items()):
            out.print(Text(f"  {table}: {fmt_num(n)} row(s) missing or different"))


def _listed(ids: list[Any], limit: int = 5) -> str:
    shown_ids = ", ".join(printable(repr(i)) for i in ids[:limit])
    return shown_ids + (f" and {fmt_num(len(ids) - limit)} more" if len(ids) > limit else "")


COMMANDS = (export, import_cmd, copy_cmd)
