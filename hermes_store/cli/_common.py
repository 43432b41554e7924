"""What every command group shares: options and argument types, output (consoles,
number and time formats, tables), database access, and turning failures into one line.
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

from .. import adopt as adopt_mod, errors, migrations, paths
from ..dialects import backend_name, find_for, for_connection, for_dialect
from ..engine import create_engine, schema_in_url, to_url, with_schema
from ..facade import SessionDB
from ..paths import create_private_database
from ..repositories.maintenance import DAY
from ..repositories.sessions import SessionRepository

PROG = "hermes-store"
SORT_CHOICES = ("rank", "newest", "oldest")
USAGE_KEYS = {
    "model": ("model",),
    "task": ("task",),
    "route": ("billing_provider", "billing_base_url", "billing_mode"),
}


class CliError(Exception):
    """A refusal worth one line on stderr and exit code 1 (not a bug, not bad arguments)."""


def shown(value: str) -> str:
    """An argument as the user typed it, for an error line: undecodable bytes as \\xNN."""
    if has_surrogates(value):
        return repr(_as_bytes(value))[1:]
    return repr(value)


def printable(value: Any) -> str:
    """Text any UTF-8 stream can carry: undecodable bytes (in a file name) as \\xNN escapes."""
    return _as_bytes(str(value)).decode("utf-8", "backslashreplace")


def _as_bytes(value: str) -> bytes:
    """The bytes the OS gave us back (surrogate escapes undone), or escapes for lone surrogates."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace")


def has_surrogates(value: str) -> bool:
    """True when ``value`` holds bytes the OS gave us that are not UTF-8 (surrogate-escaped)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class Whole(click.ParamType):
    """A whole number within bounds, with plainer messages than click's IntRange.

    The bounds keep every value inside SQLite's 64-bit integers (and a useful size), so a
    typo like ``--limit 1e20`` or thirty nines is a bad argument, not a driver overflow.
    """

    name = "integer"

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number, label = value, str(value)
        else:
            raw = str(value).strip()
            # ASCII digits only: int() would also take '١٢', '1_0' and 4,000-digit strings.
            if not re.fullmatch(r"[+-]?[0-9]+", raw):
                self.fail(f"{shown(str(value))} is not a whole number", param, ctx)
            label = raw if len(raw) <= 24 else raw[:20] + "…"
            digits = raw.lstrip("+-").lstrip("0")
            # Past 40 digits only the sign matters (and int() has a digit limit of its own).
            number = int(raw, 10) if len(digits) <= 40 else (-1 if raw.startswith("-") else 1) * 10**40
        if number < self.low:
            what = "negative" if number < 0 else "too small"
            self.fail(f"{label} is {what}; use {self.low} to {self.high:,}", param, ctx)
        if number > self.high:
            self.fail(f"{label} is too large; use {self.low} to {self.high:,}", param, ctx)
        return number


#: Rows per page (sessions, search hits).
LIMIT = Whole(1, 1_000_000)
#: Rows to skip: up to 2**62, so offset + limit still fits a SQLite integer.
OFFSET = Whole(0, 2**62)
#: Age in days for prune: 100,000 days is about 270 years.
DAYS = Whole(0, 100_000)


class TextArg(click.ParamType):
    """A text argument that SQLite can store: refuses bytes that are not UTF-8, and empty text
    where nothing could match it."""

    name = "text"

    def __init__(self, allow_empty: bool = True) -> None:
        self.allow_empty = allow_empty

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if has_surrogates(text):
            self.fail(f"{shown(text)} is not UTF-8 text (the shell passed undecodable bytes)", param, ctx)
        if not self.allow_empty and not text.strip():
            self.fail("must not be empty", param, ctx)
        return text


TEXT = TextArg()
NONEMPTY = TextArg(allow_empty=False)


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

    path: Path | None  # the SQLite file; None when ``url`` names a server
    json: bool = False
    quiet: bool = False
    url: str | None = None  # a PostgreSQL URL (--url postgresql+psycopg://...)

    @property
    def where(self) -> str:
        """The database as users should see it (a server URL without its password)."""
        return str(self.path) if self.url is None else to_url(self.url).render_as_string(hide_password=True)

    def emit(self, doc: Any) -> None:
        """The one JSON document a ``--json`` run writes to stdout.

        UTF-8 when the text allows it; ASCII escapes when it holds undecodable bytes
        (a file name, say), which no UTF-8 stream can carry.
        """
        out = json.dumps(doc, ensure_ascii=False, indent=2, default=str)
        if has_surrogates(out):
            out = json.dumps(doc, indent=2, default=str)
        click.echo(out)

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
    """Every count a person reads, in one format: exact, with thousands separators.

    (Compact ``58.9k`` next to ``4,477`` made columns hard to compare.)
    """
    return f"{int(n or 0):,}"


def fmt_compact(n: int | float | None) -> str:
    """The fallback for a table whose exact counts cannot fit the terminal: every count
    in it compact (``975``, ``4.5k``, ``58.9k``, ``12.3B``), never a mix, never cut."""
    n = int(n or 0)
    for size, unit in ((1_000_000_000, "B"), (1_000_000, "M"), (1_000, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


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


def _content_widths(headers: list[str], rows: list[list[Any]], footers: list[str] | None) -> list[int]:
    widths = []
    for i, head in enumerate(headers):
        cells = [head, *(_plain(r[i]) for r in rows), *([footers[i]] if footers else [])]
        widths.append(max(cell_len(c) for c in cells))
    return widths


def table_fits(console: Console, headers: list[str], rows: list[list[Any]], *, flex: int,
               footers: list[str] | None = None) -> bool:
    """Whether every column but ``flex`` gets its full width, ``flex`` keeping at least 8."""
    widths = _content_widths(headers, rows, footers)
    return sum(w for i, w in enumerate(widths) if i != flex) + 2 * (len(headers) - 1) + min(widths[flex], 8) <= console.width


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
    widths = _content_widths(headers, rows, footers)
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


def parse_target(url: str, *, schema: str | None = None) -> tuple[Path | None, str | None]:
    """``--url``: the file behind a ``sqlite:///`` URL, or a PostgreSQL server URL.

    ``schema`` (``--schema``) is folded into the server URL as ``?schema=``, so every
    command, and everything it calls with that URL, works inside that tenant; a bad
    name, a ``?schema=`` naming another one, or a schema on SQLite are bad arguments.
    """
    try:
        parsed = to_url(url if "://" in url else f"sqlite:///{url}")
    except Exception as exc:  # sqlalchemy.exc.ArgumentError and friends
        raise click.BadParameter(f"not a database URL: {exc}", param_hint="'--url'") from exc
    kind = find_for(parsed)
    if kind is None:
        raise click.BadParameter(f"only sqlite:/// and postgresql:// URLs are supported, got {backend_name(parsed)!r}",
                                 param_hint="'--url'")
    if not kind.has_schemas and schema is not None:
        raise click.BadParameter("--schema needs a PostgreSQL URL (a SQLite file has no schemas)",
                                 param_hint="'--schema'")
    try:
        bound = with_schema(parsed, schema) if kind.has_schemas else schema_in_url(parsed)
    except errors.InvalidInputError as exc:
        raise click.BadParameter(str(exc), param_hint="'--schema'" if schema is not None else "'--url'") from exc
    if not kind.is_file:
        return None, url if schema is None else bound.render_as_string(hide_password=False)
    if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
        raise click.BadParameter("the URL must name a database file (sqlite:///path/to/state.db)", param_hint="'--url'")
    return Path(parsed.database).expanduser(), None


def check_path_kind(path: Path) -> None:
    """Refuse a path that cannot hold a database file before anything opens or creates it.

    A dangling symlink would otherwise surface as "File exists" from the create, and a
    file standing where a folder should be as "Not a directory".
    """
    if path.is_symlink() and not path.exists():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise CliError(f"{path} is a symbolic link to {target}, which does not exist (or loops)")
    if path.is_dir():
        raise CliError(f"{path} is a folder, not a database file")
    for folder in path.absolute().parents:
        if folder.exists():
            if not folder.is_dir():
                raise CliError(f"{folder} is a file, not a folder, so {path} cannot be there")
            break


def require_file(path: Path) -> None:
    """An existing database file (reading commands never create one)."""
    check_path_kind(path)
    if not path.exists():
        raise CliError(f"no database at {path} (create one with '{PROG} --db {path} upgrade' or '... demo')")


def refuse_unadopted(path: Path) -> None:
    """Commands other than upgrade/adopt never silently rewrite a Hermes-made file."""
    if path.exists() and adopt_mod.needs_adoption(path):
        raise CliError(
            f"{path} was written by Hermes and is not adopted yet; run '{PROG} --db {path} adopt' first "
            "(the original is kept as a backup)"
        )


def open_db(state: State, *, create: bool = False) -> SessionDB:
    """Open (and, for our own older revisions, upgrade) the database, as SessionDB does."""
    if state.url is not None:
        return SessionDB(state.url)  # a server: no file to check, nothing to adopt
    assert state.path is not None
    if create:
        check_path_kind(state.path)
    else:
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


def read(db: SessionDB, fn: Callable[[Any], Any]) -> Any:
    """Run ``fn(connection)`` for a read on the facade's engine (for the few views the
    facade lacks: they are repository methods, the CLI issues no SQL of its own)."""
    with db.engine.connect() as conn:
        try:
            return fn(conn)
        finally:
            conn.rollback()


def sessions_by_id(db: SessionDB, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    ids = list(ids)
    if not ids:
        return {}
    return read(db, lambda c: SessionRepository(c).get_many(ids))  # prompts resolved (v25)


def resolve(db: SessionDB, prefix: str) -> str:
    """An exact id or a unique prefix; unknown or ambiguous prefixes are refusals."""
    sid = db.resolve_session_id(prefix)
    if sid:
        return sid
    matches = read(db, lambda c: SessionRepository(c).ids_with_prefix(prefix, 6)) if prefix else []
    if len(matches) > 1:
        listed = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise errors.NotFoundError(f"session id prefix {prefix!r} is ambiguous: {listed}")
    raise errors.NotFoundError(f"no session matches {prefix!r}")


def prune_candidates(db: SessionDB, older_than_days: float, source: str | None) -> tuple[float, list[dict[str, Any]]]:
    """What prune_sessions would delete (the library's own selection), read only."""
    return time.time() - float(older_than_days) * DAY, db.prune_candidates(older_than_days, source)


def schema_tables(path: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """Plain tables with row counts, and FTS5 indexes (their shadow tables left out).

    Read through a read-only connection: this runs right after upgrade/adopt, and must
    not open (or migrate) the file as a store would.
    """
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return for_dialect("sqlite").table_counts(conn)


def server_tables(url: str) -> tuple[list[tuple[str, int]], list[str]]:
    """:func:`schema_tables` on a server: its tables with row counts, and the indexes
    its search runs on (PostgreSQL has no FTS5 tables: GIN indexes on ``messages``)."""
    engine = create_engine(url)
    try:
        with paths.connect(engine) as conn:
            try:
                dialect = for_connection(conn)
                return dialect.table_counts(conn)[0], dialect.fts_indexes(conn)
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def create_private_file(path: Path) -> None:
    """A new database is created readable by its owner only, as SessionDB does."""
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




class DbPath(click.Path):
    """``--db PATH``: a file path (not a folder), never empty, and one SQLite can open.

    SQLite takes file names as UTF-8, so a name holding undecodable bytes is refused up
    front instead of failing somewhere inside the driver.
    """

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            if not value.strip():
                self.fail("the path is empty", param, ctx)
            if has_surrogates(value):
                self.fail(f"{shown(value)} is not a UTF-8 file name; SQLite cannot open it (rename it or link to it)",
                          param, ctx)
        return super().convert(value, param, ctx)


# ---------------------------------------------------------------------------- failures → one line


class PipeClosed(Exception):
    """stdout's reader went away (``sessions | head -1``).

    Raised in place of BrokenPipeError so it reaches :func:`run` instead of click's own
    EPIPE handling, which calls ``sys.exit(1)`` even outside standalone mode.
    """


class Group(click.Group):
    """click's group, with a closed stdout reported as :class:`PipeClosed`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise PipeClosed() from exc


#: Exit codes. 130 and 141 are what a shell reports for a program stopped by SIGINT
#: or SIGPIPE (128 + signal), so scripts treat us like any other tool.
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE_CLOSED = 0, 1, 2, 130, 141

#: Set to show the traceback of an unexpected error instead of its one line.
DEBUG_ENV = "HERMES_STORE_DEBUG"


def say(message: str) -> None:
    """One line on stderr, whatever the message held."""
    click.echo(f"{PROG}: " + " ".join(str(message).split()), err=True)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests, wrappers)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _os_error_line(exc: OSError) -> str:
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    where = " → ".join(names)
    return f"{where + ': ' if where else ''}{exc.strerror or exc}"


def run(group: click.Group, argv: list[str] | None) -> int:
    """Run the command line; every failure becomes one line on stderr and an exit code.

    0 success; 1 a refusal or failure (unknown session, library or database error, a
    file that cannot be read or written); 2 bad arguments; 130 interrupted; 141 stdout
    closed by its reader (quietly).
    """
    from sqlalchemy.exc import DBAPIError

    try:
        try:
            rv = group.main(args=argv, prog_name=PROG, standalone_mode=False)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
            return rv if isinstance(rv, int) else EXIT_OK
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
            return EXIT_USAGE
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else PROG
            say(f"error: {exc.format_message()} (see '{where} --help')")
            return EXIT_USAGE
        except click.exceptions.Exit as exc:
            return exc.exit_code
        except (click.exceptions.Abort, KeyboardInterrupt):
            say("interrupted")
            return EXIT_INTERRUPTED
        except click.ClickException as exc:  # e.g. FileError from click.File
            say(exc.format_message())
            return EXIT_FAILURE
        except (CliError, errors.HermesStoreError) as exc:
            say(str(exc))
            return EXIT_FAILURE
        except DBAPIError as exc:
            say(f"database error: {exc.orig}")
            return EXIT_FAILURE
        except sqlite3.Error as exc:  # the facade's raw DB-API paths (export, import)
            say(f"database error: {exc}")
            return EXIT_FAILURE
        except (PipeClosed, BrokenPipeError, SystemExit):
            # SystemExit: click's own EPIPE path when the pipe closed while it wrote help.
            _silence_stdout()
            return EXIT_PIPE_CLOSED
        except OSError as exc:
            say(_os_error_line(exc))
            return EXIT_FAILURE
        except Exception as exc:
            if os.environ.get(DEBUG_ENV):
                raise
            say(f"unexpected error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback, and please report it)")
            return EXIT_FAILURE
    except KeyboardInterrupt:  # a second ^C while the first one was being reported
        return EXIT_INTERRUPTED
