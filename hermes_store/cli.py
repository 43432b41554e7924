"""``hermes-store``: the command line over a Hermes ``state.db``.

People get rich tables sized for an 80-column terminal; scripts pass ``--json`` and get
one JSON document on stdout (JSON Lines for ``export``) with stable keys and raw values
(epoch-float timestamps, integer token counts). Progress bars go to stderr and only to
an interactive terminal, so pipes and logs stay clean.

Exit codes: 0 success, 1 a refusal or failure (unknown session, not a Hermes file,
damaged index...), 2 bad arguments. Every error is one line on stderr, never a
traceback: ``hermes-store: error: ...`` for arguments, ``hermes-store: ...`` otherwise.

Commands that only read never rewrite a file Hermes made: a ``state.db`` that has not
been adopted yet is refused with a pointer to ``hermes-store adopt``, which keeps a
backup and reports what it did.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import click
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from . import __version__, adopt as adopt_mod, errors, migrations
from .engine import default_db_path, to_url
from .facade import SessionDB
from .repositories.base import like_prefix
from .repositories.maintenance import DAY, transcript_files

PROG = "hermes-store"
SORT_CHOICES = ("rank", "newest", "oldest")
USAGE_KEYS = {
    "model": ("model",),
    "task": ("task",),
    "route": ("billing_provider", "billing_base_url", "billing_mode"),
}
#: Suffixes of the shadow tables FTS5 keeps next to each virtual table.
FTS_SHADOWS = ("_data", "_idx", "_content", "_docsize", "_config")


class CliError(Exception):
    """A refusal worth one line on stderr and exit code 1 (not a bug, not bad arguments)."""


class Count(click.ParamType):
    """A whole number ≥ 0, with messages plainer than click's IntRange."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value).strip(), 10)
            except ValueError:
                self.fail(f"{value!r} is not a whole number", param, ctx)
        if number < 0:
            self.fail(f"{number} is negative; use 0 or more", param, ctx)
        return number


COUNT = Count()


# ---------------------------------------------------------------------------- consoles


def stdout_console() -> Console:
    """Built per call: click's test runner swaps sys.stdout between invocations.

    Plain lines soft-wrap (the terminal wraps them) so paths and ids are never split
    by an inserted newline; tables are still sized to the width.
    """
    return Console(highlight=False, soft_wrap=True)


def stderr_console() -> Console:
    """Where progress bars and human side-notes go (stdout may be data)."""
    return Console(stderr=True, highlight=False)


@dataclass
class State:
    """Global options, shared with every subcommand through click's context."""

    path: Path
    json: bool = False
    quiet: bool = False

    def emit(self, doc: Any) -> None:
        """The one JSON document a ``--json`` run writes to stdout."""
        click.echo(json.dumps(doc, ensure_ascii=False, indent=2, default=str))

    @contextmanager
    def progress(self, kind: str = "count") -> Iterator[Progress]:
        """A progress display on stderr; a no-op unless stderr is an interactive terminal.

        ``kind``: "count" (sessions done / total), "percent" (stages), "spinner"
        (one long statement with nothing to count).
        """
        console = stderr_console()
        columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
        if kind == "count":
            columns += [BarColumn(), MofNCompleteColumn()]
        elif kind == "percent":
            columns += [BarColumn(), TaskProgressColumn()]
        columns.append(TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True,
                      disable=self.quiet or not console.is_interactive) as bar:
            yield bar


# ---------------------------------------------------------------------------- formatting


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "—"
    try:
        return datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return str(ts)


def fmt_num(n: int | float | None) -> str:
    """Compact counts so token columns fit an 80-column table."""
    n = int(n or 0)
    if abs(n) < 10_000:
        return f"{n:,}"
    if abs(n) < 1_000_000:
        return f"{n / 1000:.1f}k"
    if abs(n) < 1_000_000_000:
        return f"{n / 1_000_000:.2f}M"
    return f"{n / 1_000_000_000:.2f}B"


def fmt_cost(x: float | None) -> str:
    x = float(x or 0)
    if x == 0:
        return "$0"
    return f"${x:.4f}" if x < 1 else f"${x:,.2f}"


def one_line(value: Any, limit: int | None = None) -> str:
    text = re.sub(r"\s+", " ", content_text(value)).strip()
    if limit is not None and len(text) > limit:
        return text[: max(limit - 1, 0)] + "…"
    return text


def content_text(value: Any) -> str:
    """Message content as text: multimodal parts become their text or a placeholder."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                else:
                    parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return " ".join(parts)
    return json.dumps(value, ensure_ascii=False)


def highlight_snippet(snippet: str, styled: bool) -> Text:
    """Matches between ``>>>``/``<<<`` shown in reverse video; markers kept without colour."""
    if not styled:
        return Text(snippet)
    out = Text()
    pos = 0
    for m in re.finditer(r">>>(.*?)<<<", snippet, flags=re.S):
        out.append(snippet[pos:m.start()])
        out.append(m.group(1), style="bold reverse")
        pos = m.end()
    out.append(snippet[pos:])
    return out


def fmt_ago(ts: float | None) -> str:
    """Relative time for lists: short, and what people scan for."""
    if ts is None:
        return "—"
    delta = time.time() - float(ts)
    if delta < 0:
        return fmt_time(ts)[:10]
    for limit, unit, size in ((60, "", 0), (3600, "m", 60), (86400, "h", 3600), (30 * 86400, "d", 86400)):
        if delta < limit:
            return "just now" if not unit else f"{int(delta // size)}{unit} ago"
    return fmt_time(ts)[:10]


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def fitted_table(
    console: Console,
    headers: list[str],
    rows: list[list[Any]],
    *,
    flex: int,
    right: Iterable[int] = (),
    footers: list[str] | None = None,
    title: str | None = None,
) -> Table:
    """A table sized to the terminal by hand.

    Rich squeezes ``no_wrap`` columns down to nothing when a long cell sits next to
    them; instead every column gets its content width and the ``flex`` column (a title
    or preview) gets what is left, cut with an ellipsis.
    """
    right = set(right)
    widths = []
    for i, head in enumerate(headers):
        cells = [head, *(_plain(r[i]) for r in rows), *([footers[i]] if footers else [])]
        widths.append(max(cell_len(c) for c in cells))
    others = sum(w for i, w in enumerate(widths) if i != flex) + 2 * (len(headers) - 1)
    widths[flex] = max(min(widths[flex], console.width - others), 8)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, show_footer=footers is not None,
                  title=title, title_justify="left", title_style="bold")
    for i, head in enumerate(headers):
        table.add_column(head, footers[i] if footers else "", width=widths[i], no_wrap=True, overflow="ellipsis",
                         justify="right" if i in right else "left")
    for r in rows:
        table.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in r))
    return table


def model_config_of(row: dict[str, Any]) -> dict[str, Any]:
    raw = row.get("model_config")
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def relation(child: dict[str, Any], parent: dict[str, Any] | None) -> str:
    """How a child came to be: compression continuation, branch, delegate or plain child."""
    cfg = model_config_of(child)
    if parent is None:
        return "orphan"
    ended, started = parent.get("ended_at"), child.get("started_at") or 0
    if cfg.get("_branched_from") or (parent.get("end_reason") == "branched" and ended is not None and started >= ended):
        return "branch"
    if parent.get("end_reason") == "compression" and ended is not None and started >= ended:
        return "compression"
    if cfg.get("_delegate_from"):
        return "delegate"
    return "child"


# ---------------------------------------------------------------------------- database access


def _sqlite_path(url: str) -> Path:
    """The file behind a ``sqlite:///`` URL; anything else is a bad argument."""
    try:
        parsed = to_url(url if "://" in url else f"sqlite:///{url}")
    except Exception as exc:  # sqlalchemy.exc.ArgumentError and friends
        raise click.BadParameter(f"not a database URL: {exc}", param_hint="'--url'") from exc
    if parsed.get_backend_name() != "sqlite":
        raise click.BadParameter(f"only sqlite:/// URLs are supported, got {parsed.get_backend_name()!r}", param_hint="'--url'")
    if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
        raise click.BadParameter("the URL must name a database file (sqlite:///path/to/state.db)", param_hint="'--url'")
    return Path(parsed.database).expanduser()


def require_file(path: Path) -> None:
    if not path.exists():
        raise CliError(f"no database at {path} (create one with '{PROG} --db {path} upgrade' or '... demo')")
    if path.is_dir():
        raise CliError(f"{path} is a folder, not a database file")


def refuse_unadopted(path: Path) -> None:
    """Commands other than upgrade/adopt never silently rewrite a Hermes-made file."""
    if path.exists() and adopt_mod.needs_adoption(path):
        raise CliError(
            f"{path} was written by Hermes and is not adopted yet; run '{PROG} --db {path} adopt' first "
            "(the original is kept as a backup)"
        )


def open_db(state: State, *, create: bool = False) -> SessionDB:
    """Open (and, for our own older revisions, upgrade) the database, as SessionDB does."""
    if not create:
        require_file(state.path)
    refuse_unadopted(state.path)
    return SessionDB(state.path)


@contextmanager
def session_db(state: State, *, create: bool = False) -> Iterator[SessionDB]:
    db = open_db(state, create=create)
    try:
        yield db
    finally:
        db.close()


def _rows(db: SessionDB, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A read-only query on the facade's engine (for the few views the facade lacks)."""
    from sqlalchemy import text

    with db.engine.connect() as conn:
        try:
            result = conn.execute(text(sql), params or {})
            keys = list(result.keys())
            return [dict(zip(keys, r)) for r in result.fetchall()]
        finally:
            conn.rollback()


def sessions_by_id(db: SessionDB, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    ids = list(ids)
    if not ids:
        return {}
    rows = _rows(db, "SELECT * FROM sessions WHERE id IN (SELECT value FROM json_each(:ids))", {"ids": json.dumps(ids)})
    return {r["id"]: r for r in rows}


def resolve(db: SessionDB, prefix: str) -> str:
    """An exact id or a unique prefix; unknown or ambiguous prefixes are refusals."""
    sid = db.resolve_session_id(prefix)
    if sid:
        return sid
    matches = [r["id"] for r in _rows(db, "SELECT id FROM sessions WHERE id LIKE :p ESCAPE '\\' ORDER BY id LIMIT 6", {"p": like_prefix(prefix)})] if prefix else []
    if len(matches) > 1:
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise errors.NotFoundError(f"session id prefix {prefix!r} is ambiguous: {shown}")
    raise errors.NotFoundError(f"no session matches {prefix!r}")


def prune_candidates(db: SessionDB, older_than_days: float, source: str | None) -> tuple[float, list[dict[str, Any]]]:
    """What prune_sessions would delete (the library's own selection), read only."""
    return time.time() - float(older_than_days) * DAY, db.prune_candidates(older_than_days, source)


def schema_tables(path: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """Plain tables with row counts, and FTS5 indexes (their shadow tables left out)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
        ).fetchall()
        virtual = [n for n, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL TABLE")]
        shadows = {v + s for v in virtual for s in FTS_SHADOWS}
        plain = []
        for name, _sql in rows:
            if name in shadows or name in virtual:
                continue
            count = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
            plain.append((name, int(count)))
    return plain, virtual


def create_private_file(path: Path) -> None:
    """A new database is created readable by its owner only, as SessionDB does."""
    from .facade import create_private_database

    path.parent.mkdir(parents=True, exist_ok=True)
    create_private_database(path)


def known_revisions() -> list[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrations.make_config())
    return sorted(rev.revision for rev in script.walk_revisions())


def adopt_progress(bar: Progress) -> Callable[[str, float], None]:
    """Map adopt()'s (stage, fraction) callbacks onto one bar per stage."""
    tasks: dict[str, Any] = {}
    labels = {"copy": "Copying", "upgrade": "Upgrading", "verify": "Verifying", "swap": "Swapping in"}

    def cb(stage: str, fraction: float) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(labels.get(stage, stage), total=100)
        bar.update(tasks[stage], completed=round(max(0.0, min(fraction, 1.0)) * 100))

    return cb


# ---------------------------------------------------------------------------- group


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` is accepted after the subcommand too (``hermes-store sessions --json``)."""

    def set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            ctx.find_object(State).json = True  # type: ignore[union-attr]

    return click.option("--json", "json_flag", is_flag=True, expose_value=False, callback=set_json,
                        help="Machine output: one JSON document on stdout.")(f)


def _state() -> State:
    return click.get_current_context().find_object(State)  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), metavar="PATH",
              help="Database file [default: $HERMES_HOME/state.db, else ~/.hermes/state.db].")
@click.option("--url", metavar="URL", help="Database as a sqlite:///path URL (instead of --db).")
@click.option("--json", "as_json", is_flag=True, help="Machine output: one JSON document on stdout (JSON Lines for export).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or side-notes.")
@click.version_option(__version__, prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, db_path: Path | None, url: str | None, as_json: bool, quiet: bool) -> None:
    """Inspect and maintain a Hermes Agent session store (state.db)."""
    if db_path is not None and url is not None:
        raise click.UsageError("use either --db or --url, not both")
    path = _sqlite_path(url) if url is not None else (db_path.expanduser() if db_path else default_db_path())
    ctx.obj = State(path=path, json=as_json, quiet=quiet)


# ---------------------------------------------------------------------------- schema


@cli.command()
@click.option("--revision", default="head", show_default=True, metavar="REV", help="Target revision (0001 … head).")
@json_option
def upgrade(revision: str) -> None:
    """Create or migrate the database to a revision.

    A file written by Hermes is adopted first (the original is kept as a backup).
    """
    st = _state()
    if revision != "head" and revision not in known_revisions():
        raise click.BadParameter(f"unknown revision {revision!r} (known: 0001 … {migrations.head()}, head)", param_hint="'--revision'")
    path = st.path
    existed = path.exists()
    if existed and path.is_dir():
        raise CliError(f"{path} is a folder, not a database file")
    adopted: adopt_mod.AdoptionReport | None = None
    if existed and adopt_mod.needs_adoption(path):
        previous = None
        with st.progress("percent") as bar:
            adopted = adopt_mod.adopt(path, revision=revision, progress=adopt_progress(bar))
        new = adopted.revision
    else:
        previous = migrations.current(path) if existed else None
        target = migrations.head() if revision == "head" else revision
        if previous and previous.isdigit() and target.isdigit() and target < previous:
            raise CliError(f"{path} is at revision {previous}; upgrade cannot go back to {target}")
        if not existed:
            create_private_file(path)
        new = migrations.upgrade(path, revision)
    tables, indexes = schema_tables(path)
    doc = {
        "db": str(path),
        "created": not existed,
        "previous": previous,
        "revision": new,
        "head": migrations.head(),
        "adopted": adopted is not None,
        "hermes_schema_version": adopted.schema_version if adopted else None,
        "backup": str(adopted.backup_path) if adopted and adopted.backup_path else None,
        "tables": {name: count for name, count in tables},
        "fts_indexes": indexes,
    }
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    if adopted:
        line = Text(f"Adopted Hermes schema_version {adopted.schema_version} → revision {new}")
    elif not existed:
        line = Text(f"Created {path} at revision {new}")
    elif previous == new:
        line = Text(f"{path} is already at revision {new}")
    else:
        line = Text(f"Upgraded {path}: {previous or 'empty'} → {new}")
    out.print(line)
    if doc["backup"]:
        out.print(Text(f"Original kept as {doc['backup']}"))
    out.print(fitted_table(out, ["Table", "Rows"], [[name, f"{count:,}"] for name, count in tables], flex=0, right=[1]))
    if indexes:
        out.print(Text("Search indexes: " + ", ".join(indexes)))


@cli.command()
@json_option
def current() -> None:
    """Show the database's revision and whether it is at head."""
    st = _state()
    require_file(st.path)
    adopt_mod.check_file(st.path, recovery_ok=True)
    head = migrations.head()
    doc: dict[str, Any] = {"db": str(st.path), "revision": None, "head": head, "up_to_date": False,
                           "needs_adoption": False, "hermes_schema_version": None}
    if adopt_mod.needs_adoption(st.path):
        det = adopt_mod.detect(st.path, deep=False)
        doc.update(needs_adoption=True, hermes_schema_version=det.schema_version)
    else:
        rev = migrations.current(st.path)
        doc.update(revision=rev, up_to_date=rev == head)
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    if doc["needs_adoption"]:
        out.print(Text(f"{st.path}: Hermes schema_version {doc['hermes_schema_version']}, not adopted "
                       f"(run '{PROG} adopt'; head is {head})"))
    elif doc["revision"] is None:
        out.print(Text(f"{st.path}: no hermes_store revision yet (run '{PROG} upgrade'; head is {head})"))
    else:
        status = "head" if doc["up_to_date"] else f"head is {head}; run '{PROG} upgrade'"
        out.print(Text(f"{doc['revision']} ({status})"))


@cli.command()
@click.option("--check", "check_only", is_flag=True, help="Only report what was detected; change nothing.")
@click.option("--no-backup", is_flag=True, help="Do not keep the original as <name>.pre-adopt.bak.")
@json_option
def adopt(check_only: bool, no_backup: bool) -> None:
    """Adopt a Hermes-made state.db, keeping every row.

    Works on files from Hermes schema_version 1 to 23. The original is kept as
    <name>.pre-adopt.bak unless --no-backup.
    """
    st = _state()
    require_file(st.path)
    det = adopt_mod.detect(st.path, deep=False)
    detected = {
        "schema_version": det.schema_version,
        "shape": det.shape,
        "stamp": det.revision if not det.already_adopted else None,
        "repairs": [r.description for r in det.repairs],
        "notes": list(det.notes),
        "problems": list(det.problems),
    }
    doc: dict[str, Any] = {"db": str(st.path), "detected": detected, "adopted": False, "already_adopted": det.already_adopted,
                           "revision": det.revision if det.already_adopted else None, "backup": None, "backup_wal": None,
                           "row_counts": {}, "message": None}
    out = stdout_console()
    if not st.json:
        if det.already_adopted:
            out.print(Text(f"{st.path} is already a hermes_store database (revision {det.revision}); nothing to adopt"))
            return
        out.print(Text(f"Detected: Hermes schema_version {det.schema_version}, shape {det.shape}"))
        for label, items in (("Repair", detected["repairs"]), ("Note", detected["notes"]), ("Problem", detected["problems"])):
            for item in items:
                out.print(Text(f"  {label}: {item}"))
    if det.already_adopted or check_only:
        if st.json:
            doc["message"] = "already adopted" if det.already_adopted else "check only; nothing changed"
            st.emit(doc)
        elif det.problems:
            raise CliError(f"{st.path} cannot be adopted as it is ({len(det.problems)} problem(s) above)")
        else:
            out.print(Text("Adoptable; nothing changed (--check)."))
        return
    with st.progress("percent") as bar:
        report = adopt_mod.adopt(st.path, backup=not no_backup, progress=adopt_progress(bar))
    doc.update(
        adopted=report.adopted, revision=report.revision, message=report.message,
        backup=str(report.backup_path) if report.backup_path else None,
        backup_wal=str(report.backup_wal_path) if report.backup_wal_path else None,
        row_counts=dict(report.row_counts),
    )
    doc["detected"]["stamp"] = report.stamped or det.revision
    if st.json:
        st.emit(doc)
        return
    out.print(Text(f"Stamped {report.stamped or det.revision}, upgraded to {report.revision}"))
    if report.backup_path:
        out.print(Text(f"Backup: {report.backup_path}" + (f" (+ {report.backup_wal_path})" if report.backup_wal_path else "")))
    else:
        out.print(Text("No backup kept (--no-backup)"))
    if report.row_counts:
        kept = ", ".join(f"{k} {v:,}" for k, v in sorted(report.row_counts.items()) if v)
        out.print(Text(f"Rows kept: {kept or 'none'}"))


# ---------------------------------------------------------------------------- demo


def _demo_id(ts: float, suffix: str) -> str:
    """Hermes' session id format: local start time plus a short hex tail."""
    return datetime.fromtimestamp(ts).strftime("%Y%m%d_%H%M%S_") + suffix


def write_demo(db: SessionDB) -> list[str]:
    """A few realistic sessions: English and CJK text, tool calls and results, a title,
    a compression chain, a delegate child, usage with a side task, and one old session
    that ``prune --older-than-days 90`` would remove."""
    now = time.time()
    ids: list[str] = []

    def session(start: float, suffix: str, source: str, model: str, **kw: Any) -> str:
        sid = _demo_id(start, suffix)
        db.create_session(sid, source, model=model, started_at=start, **kw)
        ids.append(sid)
        return sid

    def call(cid: str, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}]

    def msgs(sid: str, start: float, items: list[dict[str, Any]]) -> None:
        # One by one: ids must follow conversation order (append_messages groups rows
        # by column set, so mixed rows would not keep their order).
        for i, m in enumerate(items):
            m = dict(m)
            db.append_message(sid, m.pop("role"), m.pop("content", None), timestamp=start + 20 * i, **m)

    def end(sid: str, at: float, reason: str) -> None:
        db.update_session(sid, ended_at=at, end_reason=reason)

    # 1. A titled debugging session, compressed once: root → continuation.
    t1 = now - 2 * DAY
    root = session(t1, "a41c9e", "cli", "anthropic/claude-sonnet-4",
                   system_prompt="You are Hermes, a helpful agent with a terminal.")
    db.set_session_title(root, "Debugging a CrashLoopBackOff")
    msgs(root, t1, [
        {"role": "user", "content": "My api pod keeps restarting with CrashLoopBackOff in the staging Kubernetes cluster. Can you find out why?"},
        {"role": "assistant", "content": "Let me look at the pod's logs first.", "finish_reason": "tool_calls",
         "tool_calls": call("call_k1", "terminal", {"command": "kubectl logs deploy/api -n staging --previous --tail 20"})},
        {"role": "tool", "tool_call_id": "call_k1", "tool_name": "terminal",
         "content": "Error: connect ECONNREFUSED 10.0.3.17:5432\n    at TCPConnectWrap.afterConnect\npanic: database not reachable"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "The container exits because it cannot reach Postgres at 10.0.3.17:5432. "
                    "The DATABASE_URL secret still points at the old database service."},
        {"role": "user", "content": "Fix the secret and restart the deployment."},
        {"role": "assistant", "finish_reason": "tool_calls", "content": "",
         "tool_calls": call("call_k2", "terminal", {"command": "kubectl rollout restart deploy/api -n staging"})},
        {"role": "tool", "tool_call_id": "call_k2", "tool_name": "terminal", "content": "deployment.apps/api restarted"},
    ])
    db.update_token_counts(root, input_tokens=48_210, output_tokens=3_904, cache_read_tokens=31_000,
                           model="anthropic/claude-sonnet-4", estimated_cost_usd=0.2032, api_call_count=4,
                           billing_provider="openrouter", billing_base_url="https://openrouter.ai/api/v1",
                           billing_mode="chat_completions", cost_status="estimated", cost_source="pricing_table")
    db.update_token_counts(root, input_tokens=1_210, output_tokens=14, model="google/gemini-2.5-flash",
                           estimated_cost_usd=0.0004, api_call_count=1, task="title_generation",
                           billing_provider="openrouter", billing_base_url="https://openrouter.ai/api/v1",
                           billing_mode="chat_completions")
    db.update_token_counts(root, input_tokens=52_880, output_tokens=1_650, model="google/gemini-2.5-flash",
                           estimated_cost_usd=0.0201, api_call_count=1, task="compression",
                           billing_provider="openrouter", billing_base_url="https://openrouter.ai/api/v1",
                           billing_mode="chat_completions")
    end(root, t1 + 200, "compression")
    t2 = t1 + 201
    tip = session(t2, "a41c9f", "cli", "anthropic/claude-sonnet-4", parent_session_id=root)
    db.set_session_title(tip, db.get_next_title_in_lineage("Debugging a CrashLoopBackOff"))
    msgs(tip, t2, [
        {"role": "user", "content": "[Context summary] The api pod crashed because DATABASE_URL pointed at the old Postgres service; the secret was fixed and the deployment restarted."},
        {"role": "user", "content": "Is the pod healthy now?"},
        {"role": "assistant", "finish_reason": "tool_calls", "content": "",
         "tool_calls": call("call_k3", "terminal", {"command": "kubectl get pods -n staging -l app=api"})},
        {"role": "tool", "tool_call_id": "call_k3", "tool_name": "terminal",
         "content": "NAME                   READY   STATUS    RESTARTS   AGE\napi-7d9f8c6b5d-x2kq9   1/1     Running   0          2m"},
        {"role": "assistant", "finish_reason": "stop", "content": "Yes: the new api pod is Running with 0 restarts."},
    ])
    db.update_token_counts(tip, input_tokens=9_870, output_tokens=512, model="anthropic/claude-sonnet-4",
                           estimated_cost_usd=0.0373, api_call_count=2, billing_provider="openrouter",
                           billing_base_url="https://openrouter.ai/api/v1", billing_mode="chat_completions")
    end(tip, t2 + 120, "user_exit")

    # 2. A delegate the continuation spawned (hidden from the list unless --all).
    t3 = t2 + 60
    child = session(t3, "b7d210", "cli", "openai/gpt-4.1-mini", parent_session_id=tip,
                    model_config={"_delegate_from": tip})
    msgs(child, t3, [
        {"role": "user", "content": "Check whether any other deployment in staging uses the old database host 10.0.3.17."},
        {"role": "assistant", "finish_reason": "tool_calls", "content": "",
         "tool_calls": call("call_g1", "search_files", {"pattern": "10.0.3.17", "path": "k8s/staging"})},
        {"role": "tool", "tool_call_id": "call_g1", "tool_name": "search_files", "content": "k8s/staging/worker.yaml:41: host: 10.0.3.17"},
        {"role": "assistant", "finish_reason": "stop", "content": "The worker deployment still uses 10.0.3.17 (k8s/staging/worker.yaml line 41)."},
    ])
    db.update_token_counts(child, input_tokens=6_020, output_tokens=388, model="openai/gpt-4.1-mini",
                           estimated_cost_usd=0.0030, api_call_count=2, billing_provider="openai",
                           billing_base_url="https://api.openai.com/v1", billing_mode="responses")
    end(child, t3 + 80, "completed")

    # 3. Chinese and Japanese on a messaging gateway, with a web search.
    t4 = now - 5 * 3600
    cjk = session(t4, "c3e5f1", "telegram", "openai/gpt-4.1")
    db.set_session_title(cjk, "分布式系统文章总结")
    msgs(cjk, t4, [
        {"role": "user", "content": "帮我总结一下这篇关于分布式系统一致性的文章，重点是 Raft 协议。"},
        {"role": "assistant", "finish_reason": "tool_calls", "content": "",
         "tool_calls": call("call_w1", "web_search", {"query": "Raft 共识算法 领导者选举 日志复制"})},
        {"role": "tool", "tool_call_id": "call_w1", "tool_name": "web_search",
         "content": "Raft 是一种易于理解的共识算法，分为领导者选举、日志复制和安全性三个部分。"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "文章要点：Raft 通过领导者选举和日志复制实现强一致性；多数派确认后日志才提交。"},
        {"role": "user", "content": "ありがとう。日本語で一文にまとめてください。"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "Raftはリーダー選出とログ複製によって分散システムの一貫性を保つ合意アルゴリズムです。"},
    ])
    db.update_token_counts(cjk, input_tokens=7_450, output_tokens=1_120, model="openai/gpt-4.1",
                           estimated_cost_usd=0.0239, api_call_count=3, billing_provider="openai",
                           billing_base_url="https://api.openai.com/v1", billing_mode="responses")

    # 4. A quick question still open (no end).
    t5 = now - 600
    quick = session(t5, "d90a44", "cli", "anthropic/claude-sonnet-4")
    msgs(quick, t5, [
        {"role": "user", "content": "What does `git rebase --onto` do, in one sentence?"},
        {"role": "assistant", "finish_reason": "stop",
         "content": "It replays the commits after <upstream> onto <newbase>, moving a branch to a new starting point."},
    ])
    db.update_token_counts(quick, input_tokens=820, output_tokens=61, model="anthropic/claude-sonnet-4",
                           estimated_cost_usd=0.0034, api_call_count=1)

    # 5. A scheduled job from four months ago: what 'prune --older-than-days 90' removes.
    t6 = now - 120 * DAY
    old = session(t6, "e1f2a3", "cron", "openai/gpt-4.1-mini")
    msgs(old, t6, [
        {"role": "user", "content": "Daily report: summarize yesterday's failed CI runs."},
        {"role": "assistant", "finish_reason": "stop", "content": "No CI runs failed yesterday."},
    ])
    db.update_token_counts(old, input_tokens=1_540, output_tokens=40, model="openai/gpt-4.1-mini",
                           estimated_cost_usd=0.0007, api_call_count=1)
    end(old, t6 + 45, "cron_complete")
    return ids


#: state_meta key marking a database written by ``demo`` (so a second run is a no-op).
DEMO_MARKER = "hermes_store.demo"


@cli.command()
@json_option
def demo() -> None:
    """Create a demo database with a few sessions.

    Refuses a database that already holds other sessions; on a demo database it
    only says so.
    """
    st = _state()
    if st.path.exists() and not st.path.is_dir():
        refuse_unadopted(st.path)
    with session_db(st, create=True) as db:
        existing = db.session_count()
        already = existing and db.get_meta(DEMO_MARKER) is not None
        if existing and not already:
            raise CliError(f"{st.path} already holds {existing} session(s); demo only writes into a new or empty database")
        if not already:
            db.set_meta(DEMO_MARKER, "1")
            ids = write_demo(db)
        else:  # running the README's first command twice is fine
            ids = [r["id"] for r in db.search_sessions(limit=1000)]
        doc = {"db": str(st.path), "sessions": db.session_count(), "messages": db.message_count(), "session_ids": ids,
               "created": not already}
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    verb = "written to" if not already else "already in"
    out.print(Text(f"Demo database {verb} {st.path}: {doc['sessions']} sessions, {doc['messages']} messages."))
    out.print(Text("Next: sessions, show ID, lineage ID, search kubernetes, search 一致性, stats", style="dim"))


# ---------------------------------------------------------------------------- sessions


def session_doc(row: dict[str, Any]) -> dict[str, Any]:
    """Stable keys for a listed session."""
    return {
        "id": row.get("id"),
        "title": row.get("title"),
        "source": row.get("source"),
        "model": row.get("model"),
        "parent_session_id": row.get("parent_session_id"),
        "lineage_root_id": row.get("_lineage_root_id"),
        "started_at": row.get("started_at"),
        "ended_at": row.get("ended_at"),
        "end_reason": row.get("end_reason"),
        "last_active": row.get("last_active"),
        "message_count": row.get("message_count") or 0,
        "preview": row.get("preview") or "",
    }


@cli.command("sessions")
@click.option("--source", "sources", multiple=True, metavar="SRC", help="Only these sources (repeatable).")
@click.option("--exclude-source", "exclude", multiple=True, metavar="SRC", help="Leave out these sources (repeatable).")
@click.option("--limit", type=COUNT, default=20, show_default=True)
@click.option("--offset", type=COUNT, default=0, show_default=True)
@click.option("--all", "include_children", is_flag=True, help="Include child sessions (delegates, compression steps).")
@click.option("--by-activity", is_flag=True, help="Order by latest activity across a compression chain.")
@json_option
def sessions_cmd(sources: tuple[str, ...], exclude: tuple[str, ...], limit: int, offset: int,
                 include_children: bool, by_activity: bool) -> None:
    """List sessions, newest first, with a preview.

    A compression chain is shown once, as its newest step; --all lists every
    session including delegates and compression steps.
    """
    st = _state()
    src: Any = None if not sources else (sources[0] if len(sources) == 1 else list(sources))
    with session_db(st) as db:
        rows = db.list_sessions_rich(source=src, exclude_sources=list(exclude) or None, limit=limit, offset=offset,
                                     include_children=include_children, order_by_last_active=by_activity)
    docs = [session_doc(r) for r in rows]
    if st.json:
        st.emit({"sessions": docs, "count": len(docs), "limit": limit, "offset": offset})
        return
    out = stdout_console()
    if not docs:
        out.print("No sessions." if offset == 0 else "No sessions at this offset.")
        return
    rows = []
    for d in docs:
        label = Text()
        if d["title"]:
            label.append(d["title"], style="bold")
            if d["preview"]:
                label.append(" — " + d["preview"], style="dim")
        else:
            label.append(d["preview"] or "(no user message)")
        sid = Text(d["id"])
        if d["lineage_root_id"]:
            sid.append(" ↺", style="cyan")
        rows.append([sid, (d["source"] or "")[:10], d["message_count"], fmt_ago(d["last_active"]), label])
    out.print(fitted_table(out, ["Session", "Source", "Msgs", "Active", "Title / preview"], rows, flex=4, right=[2]))
    more = f"; --offset {offset + limit} for more" if limit and len(docs) == limit else ""
    out.print(Text(f"{len(docs)} session(s) from offset {offset}{more}. ↺ = newest step of a compression chain.", style="dim"))


@cli.command()
@click.argument("session_id", metavar="ID")
@click.option("--full", is_flag=True, help="Show whole message contents (default: cut at 600 characters).")
@click.option("--no-messages", is_flag=True, help="Session details only.")
@json_option
def show(session_id: str, full: bool, no_messages: bool) -> None:
    """Show one session (ID or a unique prefix) and its messages."""
    st = _state()
    with session_db(st) as db:
        sid = resolve(db, session_id)
        row = db.get_session(sid) or {}
        messages = [] if no_messages else db.get_messages(sid)
        lineage = db.get_session_lineage(sid)
    if st.json:
        st.emit({"session": dict(row), "lineage": lineage, "messages": messages})
        return
    out = stdout_console()
    header = Table.grid(padding=(0, 2))
    header.add_column(style="bold", no_wrap=True)
    header.add_column(overflow="fold")
    ended = fmt_time(row.get("ended_at")) + (f" ({row['end_reason']})" if row.get("end_reason") else "")
    fields = [
        ("Session", row.get("id")),
        ("Title", row.get("title")),
        ("Source", row.get("source")),
        ("Model", row.get("model")),
        ("Parent", row.get("parent_session_id")),
        ("Started", fmt_time(row.get("started_at"))),
        ("Ended", ended if row.get("ended_at") else "— (open)"),
        ("Messages", f"{row.get('message_count') or 0} ({row.get('tool_call_count') or 0} tool calls)"),
        ("Tokens", f"in {fmt_num(row.get('input_tokens'))} · out {fmt_num(row.get('output_tokens'))} · "
                   f"cache r/w {fmt_num(row.get('cache_read_tokens'))}/{fmt_num(row.get('cache_write_tokens'))} · "
                   f"reasoning {fmt_num(row.get('reasoning_tokens'))}"),
        ("Cost", f"{fmt_cost(row.get('estimated_cost_usd'))} estimated"
                 + (f", {fmt_cost(row.get('actual_cost_usd'))} actual" if row.get("actual_cost_usd") else "")
                 + f" · {row.get('api_call_count') or 0} API calls"),
        ("Billing", " · ".join(str(row[k]) for k in ("billing_provider", "billing_mode", "billing_base_url") if row.get(k))),
    ]
    if len(lineage) > 1:
        fields.append(("Lineage", f"{len(lineage)} sessions, root {lineage[0]} (see '{PROG} lineage {sid}')"))
    for label, value in fields:
        if value not in (None, ""):
            header.add_row(label, Text(str(value)))
    out.print(header)
    limit = None if full else 600
    for m in messages:
        out.print()
        head = Text(f"#{m.get('id')} ", style="dim")
        role = m.get("role") or "?"
        head.append(role, style={"user": "bold green", "assistant": "bold blue", "tool": "bold magenta"}.get(role, "bold"))
        if m.get("tool_name"):
            head.append(f" {m['tool_name']}", style="magenta")
        head.append(f" · {fmt_time(m.get('timestamp'))}", style="dim")
        if m.get("finish_reason"):
            head.append(f" · {m['finish_reason']}", style="dim")
        out.print(head)
        body = content_text(m.get("content"))
        if limit is not None and len(body) > limit:
            body = body[:limit] + f"… [{len(body) - limit} more characters; --full]"
        if body.strip():
            out.print(Text(body))
        if m.get("reasoning"):
            out.print(Text(f"(reasoning: {len(m['reasoning'])} characters)", style="dim"))
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {}) if isinstance(tc, dict) else {}
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            out.print(Text(f"→ {fn.get('name', '?')}({one_line(args, None if full else 200)})", style="yellow"))


@cli.command()
@click.argument("session_id", metavar="ID")
@json_option
def lineage(session_id: str) -> None:
    """Show a session's chain (root → tip) and descendants."""
    st = _state()
    with session_db(st) as db:
        sid = resolve(db, session_id)
        chain = db.get_session_lineage(sid) or [sid]
        below = db.get_session_descendants(sid)
        below = [d for d in below if d not in set(chain)]
        info = sessions_by_id(db, [*chain, *below])
        parents = sessions_by_id(db, {info[d]["parent_session_id"] for d in below if info.get(d, {}).get("parent_session_id")} - set(info))
    everything = {**parents, **info}

    def item(i: str) -> dict[str, Any]:
        r = info.get(i, {"id": i})
        return {"id": i, "title": r.get("title"), "source": r.get("source"), "parent_session_id": r.get("parent_session_id"),
                "started_at": r.get("started_at"), "ended_at": r.get("ended_at"), "end_reason": r.get("end_reason"),
                "message_count": r.get("message_count") or 0}

    chain_docs = [item(i) for i in chain]
    desc_docs = []
    for d in below:
        doc = item(d)
        doc["relation"] = relation(info.get(d, {}), everything.get(doc["parent_session_id"] or ""))
        desc_docs.append(doc)
    if st.json:
        st.emit({"session": sid, "root": chain[0], "tip": chain[-1], "chain": chain_docs, "descendants": desc_docs})
        return
    out = stdout_console()
    rows = []
    for n, d in enumerate(chain_docs):
        marker = "▶" if d["id"] == sid else str(n + 1)
        ended = d["end_reason"] or ("ended" if d["ended_at"] else "open")
        rows.append([marker, Text(d["id"], style="bold" if d["id"] == sid else ""), fmt_time(d["started_at"]),
                     ended[:16], d["message_count"], d["title"] or ""])
    out.print(fitted_table(out, ["", "Session", "Started", "Ended as", "Msgs", "Title"], rows, flex=5, right=[4],
                           title="Chain, root → tip"))
    if desc_docs:
        out.print()
        rows = [[d["id"], d["relation"], fmt_time(d["started_at"]), d["message_count"], d["parent_session_id"] or "—"]
                for d in desc_docs]
        out.print(fitted_table(out, ["Session", "Relation", "Started", "Msgs", "Parent"], rows, flex=4, right=[3],
                               title="Descendants"))
    else:
        out.print(Text("No other descendants.", style="dim"))


# ---------------------------------------------------------------------------- search


@cli.command()
@click.argument("query")
@click.option("--source", "sources", multiple=True, metavar="SRC", help="Only these sources (repeatable).")
@click.option("--exclude-source", "exclude", multiple=True, metavar="SRC", help="Leave out these sources (repeatable).")
@click.option("--role", "roles", multiple=True, metavar="ROLE", help="Only these roles: user, assistant, tool... (repeatable).")
@click.option("--sort", type=click.Choice(SORT_CHOICES), default="rank", show_default=True)
@click.option("--limit", type=COUNT, default=20, show_default=True)
@click.option("--offset", type=COUNT, default=0, show_default=True)
@click.option("-C", "--context", "show_context", is_flag=True, help="Also show the messages before and after each hit.")
@json_option
def search(query: str, sources: tuple[str, ...], exclude: tuple[str, ...], roles: tuple[str, ...], sort: str,
           limit: int, offset: int, show_context: bool) -> None:
    """Full-text search over all messages.

    QUERY supports words, "phrases", prefix*, OR, NOT and CJK text.
    """
    st = _state()
    with session_db(st) as db:
        hits = db.search_messages(query, source_filter=list(sources) or None, exclude_sources=list(exclude) or None,
                                  role_filter=list(roles) or None, limit=limit, offset=offset,
                                  sort=None if sort == "rank" else sort)
    if st.json:
        st.emit({"query": query, "sort": sort, "limit": limit, "offset": offset, "count": len(hits), "results": hits})
        return
    out = stdout_console()
    if not hits:
        out.print(Text(f"No messages match {query!r}."))
        return
    styled = out.color_system is not None and not out.no_color
    for n, h in enumerate(hits, start=offset + 1):
        head = Text(f"{n}. ", style="dim")
        head.append(h["session_id"], style="bold")
        head.append(f" · {h['role']}")
        if h.get("tool_name"):
            head.append(f" ({h['tool_name']})")
        head.append(f" · {fmt_time(h.get('timestamp'))} · {h.get('source') or '?'}", style="dim")
        out.print(head)
        snippet = highlight_snippet(re.sub(r"\s+", " ", h.get("snippet") or ""), styled)
        snippet.pad_left(3)
        out.print(snippet)
        if show_context:
            for c in h.get("context") or []:
                prefix = f"     {c.get('role')}: "
                body = one_line(c.get("content"), max(out.width - cell_len(prefix), 10)) or "(no text)"
                out.print(Text(prefix + body, style="dim"))
    more = f"; --offset {offset + limit} for more" if limit and len(hits) == limit else ""
    out.print(Text(f"{len(hits)} result(s), sorted by {sort}{more}.", style="dim"))


# ---------------------------------------------------------------------------- stats


@cli.command()
@click.option("--by", type=click.Choice(tuple(USAGE_KEYS)), default="model", show_default=True,
              help="Group usage by model, side task (title_generation, compression...) or billing route.")
@click.option("--source", metavar="SRC", help="Only sessions from this source.")
@json_option
def stats(by: str, source: str | None) -> None:
    """Token and cost usage by model, task or route."""
    st = _state()
    with session_db(st) as db:
        rows = db.usage(by=by, source=source)
        where = "" if source is None else " WHERE s.source = :src"
        counts = _rows(db, f"SELECT count(*) AS sessions, (SELECT count(*) FROM messages m JOIN sessions s ON s.id = m.session_id{where})"
                       f" AS messages FROM sessions s{where}", {"src": source})[0]
    metrics = ("sessions", "api_call_count", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
               "reasoning_tokens", "estimated_cost_usd", "actual_cost_usd")
    docs = []
    for r in rows:
        d: dict[str, Any] = dict(zip(USAGE_KEYS[by], r.key))
        d.update({m: getattr(r, m) for m in metrics})
        docs.append(d)
    totals: dict[str, Any] = {"sessions": int(counts["sessions"]), "messages": int(counts["messages"])}
    for m in metrics[1:]:
        totals[m] = sum(d[m] for d in docs)
    totals["estimated_cost_usd"] = round(totals["estimated_cost_usd"], 10)
    totals["actual_cost_usd"] = round(totals["actual_cost_usd"], 10)
    if st.json:
        st.emit({"by": by, "source": source, "rows": docs, "totals": totals})
        return
    out = stdout_console()
    label = {"model": "Model", "task": "Task", "route": "Billing route"}[by]
    rows = []
    for d in docs:
        if by == "model":
            name = d["model"]
        elif by == "task":
            name = d["task"] or "main loop"
        else:
            name = " · ".join(x for x in (d["billing_provider"], d["billing_mode"], d["billing_base_url"]) if x) or "(no route)"
        rows.append([name, d["sessions"], fmt_num(d["api_call_count"]), fmt_num(d["input_tokens"]),
                     fmt_num(d["output_tokens"]), fmt_num(d["cache_read_tokens"]), fmt_cost(d["estimated_cost_usd"])])
    footers = ["Total", str(totals["sessions"]), fmt_num(totals["api_call_count"]), fmt_num(totals["input_tokens"]),
               fmt_num(totals["output_tokens"]), fmt_num(totals["cache_read_tokens"]), fmt_cost(totals["estimated_cost_usd"])]
    if not docs:
        out.print(Text("No token usage recorded yet."))
    else:
        out.print(fitted_table(out, [label, "Sess", "Calls", "Input", "Output", "Cache rd", "Est. cost"], rows,
                               flex=0, right=range(1, 7), footers=footers))
    extra = f"; actual cost {fmt_cost(totals['actual_cost_usd'])}" if totals["actual_cost_usd"] else ""
    out.print(Text(f"{totals['sessions']} session(s), {totals['messages']:,} message(s) in total"
                   f"{' from ' + source if source else ''}{extra}. Sess: sessions with usage on that row.", style="dim"))


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


@cli.command()
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True), metavar="FILE",
              help="Write here (atomically) instead of stdout.")
@click.option("--source", metavar="SRC", help="Only sessions from this source.")
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
        total = db.session_count(source)
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
        stdout_console().print(Text(f"Exported {sessions} session(s), {messages:,} message(s) to {target}"))


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


@cli.command("import")
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
                imported, skipped = db.import_sessions(read_jsonl(fh, counter, lambda: bar.advance(task)))
        finally:
            if not from_stdin:
                fh.close()
    doc = {"file": str(file), "read": counter["sessions"], "imported": imported, "skipped": skipped,
           "messages_read": counter["messages"]}
    if st.json:
        st.emit(doc)
    else:
        stdout_console().print(Text(f"Imported {imported} session(s), skipped {skipped} already present "
                                    f"({counter['messages']:,} message(s) read from {file})"))


# ---------------------------------------------------------------------------- prune


@cli.command()
@click.option("--older-than-days", "days", type=COUNT, required=True, metavar="N",
              help="Delete ended sessions that started more than N days ago.")
@click.option("--source", metavar="SRC", help="Only sessions from this source.")
@click.option("--sessions-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), metavar="DIR",
              help="Also remove their transcript files (<id>.json, <id>.jsonl, request_dump_<id>_*.json) here.")
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@json_option
def prune(days: int, source: str | None, sessions_dir: Path | None, dry_run: bool) -> None:
    """Delete old ended sessions and their messages.

    Only sessions that ended and started more than N days ago go; their
    children are kept, without a parent. Try --dry-run first.
    """
    st = _state()
    with session_db(st) as db:
        if dry_run:
            cutoff, rows = prune_candidates(db, days, source)
            ids = [r["id"] for r in rows]
            orphans = _rows(db, "SELECT id FROM sessions WHERE parent_session_id IN (SELECT value FROM json_each(:ids))"
                            " AND id NOT IN (SELECT value FROM json_each(:ids)) ORDER BY id", {"ids": json.dumps(ids)}) if ids else []
            files = [str(p) for i in ids for p in transcript_files(sessions_dir, i)] if sessions_dir else []
            deleted = len(ids)
        else:
            cutoff = time.time() - days * DAY
            rows, orphans, files = [], [], []
            deleted = db.prune_sessions(days, source, sessions_dir)
    doc = {"dry_run": dry_run, "older_than_days": days, "cutoff": cutoff, "source": source,
           ("would_delete" if dry_run else "deleted"): deleted}
    if dry_run:
        doc.update(sessions=[dict(r) for r in rows], would_orphan=[o["id"] for o in orphans], transcript_files=files)
    if st.json:
        st.emit(doc)
        return
    out = stdout_console()
    if not dry_run:
        out.print(Text(f"Deleted {deleted} session(s) that ended and started before {fmt_time(cutoff)}."))
        return
    if not rows:
        out.print(Text(f"Nothing to prune: no ended session started before {fmt_time(cutoff)}."))
        return
    table_rows = [[r["id"], (r["source"] or "")[:10], fmt_time(r["started_at"]), r["message_count"] or 0,
                   r["title"] or r["end_reason"] or ""] for r in rows]
    out.print(fitted_table(out, ["Session", "Source", "Started", "Msgs", "Title / end"], table_rows, flex=4, right=[3]))
    notes = [f"Dry run: {len(rows)} session(s) would be deleted; nothing was changed."]
    if orphans:
        notes.append(f"{len(orphans)} child session(s) would be kept without a parent.")
    if files:
        notes.append(f"{len(files)} transcript file(s) would be removed.")
    out.print(Text(" ".join(notes), style="dim"))


# ---------------------------------------------------------------------------- fts


@cli.group(no_args_is_help=False)
def fts() -> None:
    """Full-text search index upkeep: rebuild, check, optimize."""


@fts.command("rebuild")
@json_option
def fts_rebuild() -> None:
    """Re-index every message in every search index."""
    st = _state()
    with session_db(st) as db:
        started = time.monotonic()
        with st.progress("spinner") as bar:
            bar.add_task("Rebuilding search indexes", total=None)
            done = db.rebuild_fts()
        messages = db.message_count()
    doc = {"rebuilt": done, "messages": messages, "seconds": round(time.monotonic() - started, 3)}
    if st.json:
        st.emit(doc)
    else:
        stdout_console().print(Text(f"Rebuilt {', '.join(done) or 'no index'} over {messages:,} message(s) in {doc['seconds']}s"))


@fts.command("check")
@json_option
def fts_check() -> None:
    """Run FTS5's integrity check on every index (exit 1 when one is damaged)."""
    st = _state()
    with session_db(st) as db:
        result = db.check_fts()
    damaged = {k: v for k, v in result.items() if v}
    doc = {"ok": not damaged, "indexes": {k: ("ok" if v is None else v) for k, v in result.items()}}
    if st.json:
        st.emit(doc)
    else:
        out = stdout_console()
        for name, problem in result.items():
            out.print(Text(f"{name}: ") + (Text("ok", style="green") if problem is None else Text(problem, style="red")))
    if damaged:
        raise CliError(f"damaged search index: {', '.join(damaged)}; run '{PROG} fts rebuild'")


@fts.command("optimize")
@json_option
def fts_optimize() -> None:
    """Merge each index's segments (faster searches after many writes)."""
    st = _state()
    with session_db(st) as db:
        done = db.optimize_fts()
    if st.json:
        st.emit({"optimized": done})
    else:
        stdout_console().print(Text(f"Optimized {', '.join(done) or 'no index'}"))


# ---------------------------------------------------------------------------- entry point


def _say(message: str) -> None:
    """One line on stderr, whatever the message held."""
    click.echo(f"{PROG}: " + " ".join(str(message).split()), err=True)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: exit 0 ok, 1 refusal/failure, 2 bad arguments; no tracebacks for user errors."""
    from sqlalchemy.exc import DBAPIError

    try:
        rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        return 2
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else PROG
        hint = f" (see '{where} --help')"
        _say(f"error: {exc.format_message()}{hint}")
        return 2
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        _say("interrupted")
        return 130
    except click.ClickException as exc:  # e.g. FileError from click.File
        _say(exc.format_message())
        return 1
    except (CliError, errors.HermesStoreError) as exc:
        _say(str(exc))
        return 1
    except DBAPIError as exc:
        _say(f"database error: {exc.orig}")
        return 1
    except BrokenPipeError:
        # The reader went away (`export | head`): not an error worth a message.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as exc:
        _say(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
