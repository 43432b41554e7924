"""Moving sessions in and out: export (JSON Lines, streamed) and import (idempotent)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import click
from rich.text import Text

from ._common import TEXT, CliError, _state, fmt_num, json_option, printable, session_db, stdout_console

# ---------------------------------------------------------------------------- export / import


def binary_stream(stream: Any) -> Any:
    """The byte stream under stdin/stdout: JSON Lines are UTF-8 whatever the locale says."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        raise CliError("this standard stream cannot carry bytes; use a file instead")
    return buffer


def jsonl_line(record: dict[str, Any]) -> str:
    """UTF-8 JSON when the text allows it; ASCII escapes when it holds lone surrogates."""
    line = json.dumps(record, ensure_ascii=False, default=str)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, default=str)
    return line


@click.command()
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True), metavar="FILE",
              help="Write here (atomically) instead of stdout.")
@click.option("--source", type=TEXT, metavar="SRC", help="Only sessions from this source.")
@json_option
def export(out_path: Path | None, source: str | None) -> None:
    """Export sessions as JSON Lines (one per line).

    Streamed: memory stays flat however large the database. Written to stdout
    unless --out is given.
    """
    st = _state()
    to_stdout = out_path is None or str(out_path) == "-"
    sessions = messages = 0
    with session_db(st) as db:
        total = db.session_count(source, include_archived=True)  # export writes archived ones too
        if to_stdout:
            sys.stdout.flush()
            stream = binary_stream(sys.stdout)
            for record in db.iter_export(source):
                stream.write((jsonl_line(record) + "\n").encode("utf-8"))
            stream.flush()
            return
        assert out_path is not None
        target = out_path.expanduser()
        if not target.parent.is_dir():
            raise CliError(f"cannot write {target}: folder {target.parent} does not exist")
        # Written next to the target and renamed at the end: an interrupted export
        # never leaves a truncated file under the real name. Owner-only, like the
        # database itself: it holds the same conversations.
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            fh = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8", newline="\n")
        except OSError as exc:
            raise CliError(f"cannot write {target}: {exc.strerror or exc}") from None
        try:
            with fh, st.progress() as bar:
                task = bar.add_task("Exporting", total=total)
                for record in db.iter_export(source):
                    fh.write(jsonl_line(record) + "\n")
                    sessions += 1
                    messages += len(record.get("messages") or [])
                    bar.advance(task)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    doc = {"out": str(target), "sessions": sessions, "messages": messages, "source": source}
    if st.json:
        st.emit(doc)
    else:
        stdout_console().print(Text(f"Exported {fmt_num(sessions)} session(s), {fmt_num(messages)} message(s) to {printable(target)}"))


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
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path, allow_dash=True))
@json_option
def import_cmd(file: Path) -> None:
    """Import a JSON Lines export (idempotent).

    Sessions already present are skipped, so importing twice changes nothing.
    FILE may be - for stdin.
    """
    st = _state()
    from_stdin = str(file) == "-"
    total = None
    if not from_stdin:
        with open(file, "rb") as fh:
            total = sum(1 for line in fh if line.strip())
    counter = {"sessions": 0, "messages": 0}
    with session_db(st, create=True) as db:
        fh = binary_stream(sys.stdin) if from_stdin else open(file, "rb")
        try:
            with st.progress() as bar:
                task = bar.add_task("Importing", total=total)
                imported, skipped = db.import_records(read_jsonl(fh, counter, lambda: bar.advance(task)))
        finally:
            if not from_stdin:
                fh.close()
    doc = {"file": str(file), "read": counter["sessions"], "imported": imported, "skipped": skipped,
           "messages_read": counter["messages"]}
    if st.json:
        st.emit(doc)
    else:
        stdout_console().print(Text(f"Imported {fmt_num(imported)} session(s), skipped {fmt_num(skipped)} already present "
                                    f"({fmt_num(counter['messages'])} message(s) read from {printable(file)})"))


COMMANDS = (export, import_cmd)
