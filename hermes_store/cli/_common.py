"""What every command group shares: options and argument types, output (consoles,
number and time formats, tables, progress), database access, and turning failures into
one line (the light part of that, needed before a command loads, is in ``_base``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, closing, contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast
from collections.abc import Callable, Iterable, Iterator

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
from sqlalchemy import Connection, inspect

from .. import adopt as adopt_mod, encryption, errors, migrations, paths
from ..keys import COMPRESSION_END_REASON, DAY, VERSION_TABLE
from ..copying.endpoints import keyed_readonly_connection, readonly_engine, sidecars_as_found, store_file_named
from ..dialects import backend_name, find_for, for_connection, for_dialect
from ..engine import create_engine, default_db_path, schema_in_url, schema_of, to_url, with_schema
from ..facade import SessionDB
from ..paths import check_target, create_private_database, make_parents
from ..repositories.sessions import SessionRepository
from ._base import (
    DEBUG_ENV,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_USAGE,
    NONEMPTY,
    PROG,
    TEXT,
    CliError,
    DbPath,
    Group,
    Options,
    PipeClosed,
    TextArg,
    configure_logs,
    global_options,
    has_surrogates,
    json_text,
    printable,
    run,
    say,
    shown,
)

if TYPE_CHECKING:  # schema_tables hands it a plain sqlite3 connection, which only it reads
    from ..dialects.sqlite import SQLiteDialect

__all__ = [
    "DEBUG_ENV", "EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PIPE_CLOSED", "EXIT_USAGE", "NONEMPTY", "PROG",
    "TEXT", "CliError", "DbPath", "Group", "PipeClosed", "TextArg", "global_options", "has_surrogates", "printable",
    "run", "say", "shown",
]

SORT_CHOICES = ("rank", "newest", "oldest")
USAGE_KEYS = {
    "model": ("model",),
    "task": ("task",),
    "route": ("billing_provider", "billing_base_url", "billing_mode"),
}


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


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


def stdin_is_terminal() -> bool:
    """Whether a person can answer a question (prune's confirmation)."""
    return _isatty(sys.stdin)


@dataclass
class State:
    """Global options, checked, shared with every subcommand through click's context."""

    path: Path | None  # the SQLite file; None when ``url`` names a server
    json: bool = False
    quiet: bool = False
    url: str | None = None  # a PostgreSQL URL (--url postgresql+psycopg://...)
    #: An encrypted file's key (the URL's password part, $HERMES_STORE_KEY, $HERMES_STORE_KEY_FILE).
    key: encryption.StoreKey | None = None

    @property
    def where(self) -> str:
        """The database as users should see it (a server URL without its password)."""
        return str(self.path) if self.url is None else to_url(self.url).render_as_string(hide_password=True)

    @property
    def file(self) -> Path:
        """The SQLite file, for code that has seen ``url`` is None (then ``path`` is set)."""
        if self.path is None:
            raise CliError(f"{self.where} is a server database, not a file")
        return self.path

    @property
    def flag(self) -> str:
        """How this database is named on a command line, for hints (no password in them)."""
        if self.url is None:
            return f"--db {printable(self.path)}"
        schema = schema_in_url(to_url(self.url))
        return "--url URL" + (f" --schema {schema}" if schema else "")

    def emit(self, doc: Any) -> None:
        """The one JSON document a ``--json`` run writes to stdout.

        UTF-8 when the text allows it; ASCII escapes when it holds undecodable bytes
        (a file name, say), which no UTF-8 stream can carry.
        """
        click.echo(json_text(doc, indent=2))

    @contextmanager
    def progress(self, kind: str = "count", *, bar: bool = True) -> Iterator[Any]:
        """Progress on stderr: a bar on an interactive terminal, lines every few seconds
        when stderr is not one (a log, CI), nothing with ``--quiet``.

        ``kind``: "count" (sessions done / total), "percent" (stages), "spinner"
        (one long statement with nothing to count). ``bar=False`` leaves the terminal
        alone (export writing its lines to the same terminal); lines to a log stay.
        The object yielded takes rich's ``add_task``/``update``/``advance`` calls.
        """
        console = stderr_console()
        if not self.quiet and not console.is_interactive:
            with ProgressLog(kind, self.json, every=progress_every()) as log:
                yield log
            return
        columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
        if kind == "count":
            columns += [BarColumn(), MofNCompleteColumn()]
        elif kind == "percent":
            columns += [BarColumn(), TaskProgressColumn()]
        columns.append(TimeElapsedColumn())
        with ExitStack() as stack:
            with signals_for_the_main_thread():  # rich's refresh thread starts here
                shown_bar = stack.enter_context(
                    Progress(*columns, console=console, transient=True, disable=self.quiet or not bar))
            yield shown_bar


@contextmanager
def signals_for_the_main_thread() -> Iterator[None]:
    """Threads started inside never take ^C (SIGINT) or SIGTERM: they inherit a mask that
    blocks both. The kernel hands a process signal to any thread that does not block it;
    one taken by a progress thread would leave the main thread asleep in read(stdin), and
    the interrupt would be lost."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # one that came meanwhile is delivered now


#: Seconds between two progress lines when stderr is not a terminal; the first comes as
#: long after a task starts, so a quick run prints none. ``$HERMES_STORE_PROGRESS_EVERY``
#: sets another interval (0: a line at every step, as tests use).
PROGRESS_EVERY = 5.0
PROGRESS_EVERY_ENV = "HERMES_STORE_PROGRESS_EVERY"


def progress_every() -> float:
    raw = os.environ.get(PROGRESS_EVERY_ENV, "").strip()
    try:
        value = float(raw) if raw else PROGRESS_EVERY
    except ValueError:
        return PROGRESS_EVERY
    return value if value >= 0 else PROGRESS_EVERY


@dataclass
class _Task:
    description: str
    total: float | None
    started: float
    done: float = 0
    first_done: float | None = None  # where this run started counting (a resumed copy)
    first_at: float | None = None
    last_line: float | None = None
    finished: bool = False
    waiting_since: float | None = None  # waiting for another process's lock since then


def fmt_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else (f"{minutes}:{secs:02d}" if minutes else f"{secs}s")


class ProgressLog:
    """Progress as lines on stderr, for logs and CI where no bar can be drawn.

    Takes the calls rich's Progress takes (``add_task``, ``update``, ``advance``). A
    running task gets a line every ``every`` seconds, the first after as long (a
    background thread writes them while a long statement blocks the command); a task
    that got one gets a last line when it finishes. A line says what is done of how
    much, the rate and the time left: ``hermes-store: Copying sessions: 12,000/40,000
    (30%) · 4,100/s · ETA 7s``. With ``--json`` each line is a JSON object instead.
    """

    def __init__(self, kind: str, as_json: bool, *, every: float, clock: Callable[[], float] = time.monotonic,
                 write: Callable[[str], None] | None = None) -> None:
        self.kind, self.as_json, self.every, self.clock = kind, as_json, every, clock
        #: Where a line goes (tests take them): stderr, after "hermes-store: " unless JSON.
        self.write = write or ((lambda line: click.echo(line, err=True)) if as_json else say)
        self.tasks: dict[int, _Task] = {}
        self._wait_told = False  # the one line saying a task waits for a lock was written
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> ProgressLog:
        self._ticker = threading.Thread(target=self._tick, name="hermes-store-progress", daemon=True)
        with signals_for_the_main_thread():
            self._ticker.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()

    def add_task(self, description: str, total: float | None = None, **_kw: Any) -> int:
        with self._lock:
            task_id = len(self.tasks)
            self.tasks[task_id] = _Task(description, total, started=self.clock())
        return task_id

    def update(self, task_id: int, *, completed: float | None = None, total: float | None = None,
               advance: float | None = None, **_kw: Any) -> None:
        now = self.clock()
        with self._lock:
            task = self.tasks[task_id]
            if total is not None:
                task.total = total
            if completed is not None:
                task.done = completed
            if advance:
                task.done += advance
            if task.first_at is None:
                task.first_done, task.first_at = task.done, now
            if completed is not None or advance:
                task.waiting_since = None  # it moved: whatever held it let go
            if task.total is not None and task.done >= task.total and not task.finished:
                task.finished = True
                if task.last_line is not None or self.every == 0:
                    self._write(task, now)
            elif self._due(task, now):
                self._write(task, now)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def waiting(self, task_id: int, since: float | None) -> None:
        """``task_id`` waits for another process's lock since ``since`` (a clock value), or
        no longer (None). Its lines say so; the first time a wait reaches
        :data:`LOCK_NOTICE_S`, a line says so at once (once a run: a store shared with a
        busy Hermes meets short waits all along)."""
        now = self.clock()
        with self._lock:
            task = self.tasks[task_id]
            task.waiting_since = since
            if self._tell_wait(task, now):
                self._write(task, now)

    def _tell_wait(self, task: _Task, now: float) -> bool:
        if self._wait_told or task.finished or task.waiting_since is None:
            return False
        if now - task.waiting_since < LOCK_NOTICE_S:
            return False
        self._wait_told = True
        return True

    def _due(self, task: _Task, now: float) -> bool:
        last = task.last_line if task.last_line is not None else task.started
        return not task.finished and now - last >= self.every

    def _tick(self) -> None:
        while not self._stop.wait(0.25 if self.every < 2 else 1.0):
            now = self.clock()
            with self._lock:
                for task in self.tasks.values():
                    if self._tell_wait(task, now) or self._due(task, now):
                        self._write(task, now)

    def _write(self, task: _Task, now: float) -> None:
        """One line for ``task`` (the lock is held)."""
        task.last_line = now
        elapsed = now - task.started
        # The rate since the first step this run saw (a resumed copy starts past 0); with
        # one step so far, since the task started.
        counted, span = task.done - (task.first_done or 0), now - (task.first_at or task.started)
        if counted <= 0 or span <= 0:
            counted, span = task.done, elapsed
        rate = counted / span if counted > 0 and span > 0 else None
        left = None
        if rate and task.total is not None and not task.finished:
            left = max(task.total - task.done, 0) / rate
        percent = round(100 * task.done / task.total, 1) if task.total else None
        waited = None if task.waiting_since is None or task.finished else max(now - task.waiting_since, 0.0)
        if waited is not None:
            left = None  # no time left to tell while another process holds the lock
        if self.as_json:
            doc = {"progress": task.description, "done": task.done, "total": task.total, "percent": percent,
                   "rate_per_second": round(rate, 1) if rate is not None else None,
                   "eta_seconds": round(left, 1) if left is not None else None,
                   "elapsed_seconds": round(elapsed, 1), "finished": task.finished,
                   "waiting_for_lock_seconds": round(waited, 1) if waited is not None else None}
            self.write(json_text(doc))
            return
        parts = []
        if task.total is None:
            parts.append(f"{fmt_num(task.done)} done" if task.done else f"{fmt_duration(elapsed)} so far")
        elif self.kind == "percent":
            parts.append(f"{percent or 0:g}%")
        else:
            parts.append(f"{fmt_num(task.done)}/{fmt_num(task.total)} ({percent or 0:g}%)")
        if task.finished:
            parts.append(f"done in {fmt_duration(elapsed)}")
        if rate is not None and self.kind == "count":
            parts.append(f"{fmt_num(rate)}/s")
        if left is not None:
            parts.append(f"ETA {fmt_duration(left)}")
        if waited is not None:
            parts.append(waiting_text(waited))
        self.write(f"{task.description}: " + " · ".join(parts))


#: How long a wait for another process's lock lasts before a log (stderr not a
#: terminal) gets a line saying so; shorter waits go by without a word.
LOCK_NOTICE_S = 1.0


def waiting_text(seconds: float) -> str:
    return f"waiting for the database lock ({int(seconds)} s)"


class LockWaits:
    """Tells one progress task that the command waits for another process's lock.

    Given as a store's ``on_wait`` (:class:`CliSessionDB`): each pause between two tries
    of a locked write calls it. A bar shows ``Importing · waiting for the database lock
    (12 s)``; a log gets one line once the wait is :data:`LOCK_NOTICE_S` long, and its
    progress lines say so while it lasts (:meth:`ProgressLog.waiting`). The task moving
    on (:meth:`advance`) ends the wait. With ``-q`` the bar is off: nothing shows.
    """

    def __init__(self, bar: Any, task: Any, description: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.bar, self.task, self.description, self.clock = bar, task, description, clock
        self.since: float | None = None

    def __call__(self) -> None:
        now = self.clock()
        if self.since is None:
            self.since = now
        if isinstance(self.bar, ProgressLog):
            self.bar.waiting(self.task, self.since)
        else:
            self.bar.update(self.task, description=f"{self.description} · {waiting_text(now - self.since)}")

    def advance(self, steps: float = 1) -> None:
        if self.since is not None:
            self.since = None
            if isinstance(self.bar, ProgressLog):
                self.bar.waiting(self.task, None)
            else:
                self.bar.update(self.task, description=self.description)
        self.bar.advance(self.task, steps)


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


def fmt_bytes(n: int | None) -> str:
    """A size a person reads (``12.3 MiB``); ``—`` when unknown."""
    if n is None:
        return "—"
    for size, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


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
    others = sum(w for i, w in enumerate(widths) if i != flex) + 2 * (len(headers) - 1)
    return others + min(widths[flex], 8) <= console.width


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
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                  show_footer=footers is not None, title=title, title_justify="left", title_style="bold")
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
    if parent.get("end_reason") == COMPRESSION_END_REASON and ended is not None and started >= ended:
        return COMPRESSION_END_REASON
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
        if kind.has_schemas:
            bound = with_schema(parsed, schema)
        else:
            schema_in_url(parsed)  # refuses a ?schema= on a file URL
            bound = parsed
    except errors.InvalidInputError as exc:
        raise click.BadParameter(str(exc), param_hint="'--schema'" if schema is not None else "'--url'") from exc
    if not kind.holders_on_this_machine:  # a server: commands connect by its URL
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
        raise CliError(f"no database at {path} (create one with '{PROG} --db {path} upgrade' or '... demo')",
                       code="no_database")


def refuse_unadopted(path: Path) -> None:
    """Commands other than upgrade/adopt never silently rewrite a Hermes-made file."""
    if path.exists() and adopt_mod.needs_adoption(path):
        raise CliError(
            f"{path} was written by Hermes and is not adopted yet; run '{PROG} --db {path} adopt' first "
            "(the original is kept as a backup)", code="needs_adoption",
        )


def revision_on(conn: Connection) -> tuple[str | None, str | None]:
    """``(revision, host table)`` on ``conn``: the store's revision, and the version table
    of the host application whose Alembic records it (README "Way 2": our revisions as a
    branch of theirs), or None when it is our own table (or there is no store). Only
    reads; a transaction this starts is the caller's to end."""
    revision = migrations.current(conn)
    if revision is None:
        return None, None
    schema = schema_of(conn)
    if inspect(conn).has_table(VERSION_TABLE, schema=schema):
        return revision, None
    found = paths.host_revision(conn, schema=schema)
    return revision, (found[0] if found is not None and found[1] == revision else None)


def _revision_here(conn: Connection) -> tuple[str | None, str | None]:
    try:
        return revision_on(conn)
    finally:
        if conn.in_transaction():
            conn.rollback()


def store_revision(state: State) -> tuple[str | None, str | None]:
    """``(revision, host table)`` of the database, read without writing anything.

    A file is read through one read-only connection (:func:`readonly_engine`): a
    read-write one, closed last, would checkpoint another program's WAL into the file
    on its way out. ``host table``: see :func:`_revision_here`.
    """
    if state.url is None:  # an encrypted file through its key (SQLCipher), read-only as well
        assert state.path is not None
        with readonly_engine(state.path, state.key) as engine, paths.connect(engine) as conn:
            return _revision_here(conn)
    engine = create_engine(state.url)
    try:
        with paths.connect(engine) as conn:
            return _revision_here(conn)
    finally:
        engine.dispose()


def host_upgrade_hint(state: State, revision: str, table: str) -> str:
    """What to run for a store a host application's Alembic migrates (README "Way 2")."""
    return (f"{state.where} is at revision {revision} and head is {migrations.head()}; its hermes_store revisions "
            f"are run by the Alembic of the application that embeds it (table {table}): "
            "run `alembic upgrade heads` in that project")


def require_store(state: State) -> None:
    """What every command but upgrade, adopt, demo, import and copy asks first: a
    hermes_store database that is there and at head.

    Nothing is created or migrated on the way (no file, folder, table, extension or
    schema), and a file is only read (no checkpoint of another program's WAL): a
    missing or empty database, one holding only other applications' tables, a schema
    without our tables, a Hermes file not adopted yet, a store at an older revision and
    one from a newer hermes-store are each refused with what to run. An older store is
    not read as it is: the commands read what head has. One whose revisions a host
    application's Alembic runs (README "Way 2") is pointed to that project's
    ``alembic upgrade heads``, which is what migrates it.
    """
    if state.url is None:
        assert state.path is not None
        require_file(state.path)
        if state.key is None:  # an encrypted file is read through its key only (never a Hermes file)
            try:
                adopt_mod.check_file(state.path, recovery_ok=True)  # a text file is refused by name
            except errors.NotADatabaseError as exc:
                raise encryption.refused_without_key(state.path, exc) from exc
            refuse_unadopted(state.path)
    revision, host_table = store_revision(state)
    head = migrations.head()
    if revision == head:
        return
    if revision is None:
        raise CliError(f"{state.where} holds no hermes_store database, and this command creates none; "
                       f"create one with '{PROG} {state.flag} upgrade' (or 'demo' for a sample)", code="no_store")
    if host_table is not None and revision in paths.revision_order():
        raise CliError(host_upgrade_hint(state, revision, host_table), code="managed_by_host")
    if revision in paths.revision_order() or revision in migrations.LEGACY_IDS:
        raise CliError(f"{state.where} is at revision {revision} and head is {head}; this command never migrates: "
                       f"run '{PROG} {state.flag} upgrade' first", code="needs_upgrade")
    raise CliError(f"{state.where} is at revision {revision}, which this hermes-store does not know "
                   f"(its newest is {head}): a newer hermes-store wrote it", code="schema_too_new")


class CliSessionDB(SessionDB):
    """The store a command works on: SessionDB, with its pauses between two tries of a
    write another process holds the lock of reported to ``on_wait`` (the progress
    display says "waiting for the database lock"). ``_sleep`` is the facade's
    override point for that pause (hermes_store.aio's store replaces it too)."""

    def __init__(self, *args: Any, on_wait: Callable[[], None] | None = None, **kwargs: Any) -> None:
        self.on_wait = on_wait  # set first: opening waits for a held lock too
        super().__init__(*args, **kwargs)

    def _sleep(self, seconds: float) -> None:
        hook = self.on_wait
        if hook is not None:
            hook()
        super()._sleep(seconds)


def open_db(state: State, *, create: bool = False, write: bool = False,
            on_wait: Callable[[], None] | None = None) -> SessionDB:
    """Open the database. ``create`` (upgrade, demo, import): created or migrated to head
    as SessionDB does; otherwise only a store already at head (:func:`require_store`).
    Without ``create`` or ``write`` a file is opened read-only (``read_only=True``): no
    checkpoint, no index catch-up, nothing of the file written (see :func:`session_db`)."""
    if not create:
        require_store(state)
    if state.url is not None:
        return CliSessionDB(state.url, on_wait=on_wait)  # a server: no file to check, nothing to adopt
    assert state.path is not None
    if create:
        check_path_kind(state.path)
    if state.key is None:
        refuse_unadopted(state.path)
    return CliSessionDB(state.path, read_only=not (create or write), on_wait=on_wait, key=state.key)


@contextmanager
def session_db(state: State, *, create: bool = False, write: bool = False,
               on_wait: Callable[[], None] | None = None) -> Iterator[SessionDB]:
    """The store for one command, closed afterwards.

    A command that only reads (neither ``create`` nor ``write``) leaves a file as it
    found it, bytes and time stamp: it opens it read-only, so it neither checkpoints a
    WAL another program left (SessionDB's close, and SQLite's own close of the last
    connection, would fold it into the file) nor catches the search index up; and the
    ``-wal``/``-shm`` files a reader of a WAL-mode file creates are removed again
    when it created them (:func:`hermes_store.paths.readonly_connection`).
    ``on_wait``: called at each pause while another process holds a lock the store
    waits for (:class:`CliSessionDB`), opening included.
    """
    reading_file = state.url is None and not (create or write)
    if reading_file and state.key is not None:  # encrypted: SessionDB's own read-only, keyed open
        require_store(state)
        assert state.path is not None
        with sidecars_as_found(paths.resolve_link(state.path), state.key):  # a reader's -wal/-shm removed again
            keyed: SessionDB = CliSessionDB(state.path, read_only=True, key=state.key)
            try:
                yield keyed
            finally:
                keyed.close()
        return
    if not reading_file:
        db = open_db(state, create=create, write=write, on_wait=on_wait)
        try:
            yield db
        finally:
            db.close()
        return
    require_store(state)
    assert state.path is not None
    with paths.readonly_connection(state.path):  # held first, so it sees the sidecars as they were
        db = CliSessionDB(state.path, read_only=True)
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


def schema_tables(path: Path, key: encryption.StoreKey | None = None) -> tuple[list[tuple[str, int]], list[str]]:
    """Plain tables with row counts, and FTS5 indexes (their shadow tables left out).

    Read through a read-only connection: this runs right after upgrade/adopt, and must
    not open (or migrate) the file as a store would. With ``key``, an encrypted file's
    (SQLCipher's connection, the same DB-API).
    """
    counts = cast("SQLiteDialect", for_dialect("sqlite")).table_counts
    if key is not None:
        with keyed_readonly_connection(paths.resolve_link(path), key) as keyed:
            return counts(keyed)
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return counts(conn)


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


def refuse_store_file(state: State, path: Path, role: str) -> None:
    """Refuse, before anything is opened, an output (or input) that is the store itself
    or one of its ``-wal``/``-shm``/``-journal`` files: writing there destroys the store,
    and reading one with a plain ``open()`` drops this process's SQLite locks."""
    if state.path is None or str(path) == "-":
        return
    what = store_file_named(path, state.path)
    if what is None:
        return
    raise CliError(f"{role} {printable(path)} is {what} {printable(state.path)}; refused, nothing was touched",
                   code="output_is_store")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _remove_dead_leftovers(folder: Path, prefix: str, store: Path | None) -> None:
    """Temporary files of earlier runs killed before their rename (``.<name>.<pid>.….tmp``
    whose process is gone) are removed; a running writer's are left alone."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix):-len(".tmp")].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        if store is not None and store_file_named(entry.path, store) is not None:
            continue  # never, whatever its name
        with suppress(OSError):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)


@contextmanager
def atomic_output(target: Path, *, store: Path | None = None) -> Iterator[IO[str]]:
    """A text file that appears under ``target`` whole or not at all.

    Written to a new owner-only temporary file in the same folder, fsynced, renamed over
    ``target`` and the folder fsynced: a crash or a kill leaves the older ``target`` as it
    was (and a temporary file the next run to ``target`` removes); a failure removes it.
    """
    folder = target.parent
    prefix = f".{target.name}."
    _remove_dead_leftovers(folder, prefix, store)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise CliError(f"cannot write {printable(target)}: {exc.strerror or exc}") from None
    renamed = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        renamed = True
        paths.fsync_dir(folder)
    finally:
        if not renamed:
            with suppress(OSError):
                os.unlink(tmp)


def create_private_file(path: Path) -> None:
    """A new database is created readable by its owner only, as SessionDB does; a
    read-only folder anywhere above it (root included) is refused before any folder is made."""
    check_target(path, write=True, create=True, make_parents=True)
    make_parents(path)
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


# ---------------------------------------------------------------------------- the run's options


def _state() -> State:
    """The checked global options of this run (given before or after the command name)."""
    ctx = click.get_current_context()
    opts = ctx.find_object(Options) or ctx.ensure_object(Options)
    if opts.state is None:
        opts.state = state_from(opts)
    return opts.state


def state_from(opts: Options) -> State:
    """Where the command works, from ``--db``/``--url``/``--schema`` (bad combinations are
    bad arguments, refused before anything is opened)."""
    if opts.db_path is not None and opts.url is not None:
        raise click.UsageError("use either --db or --url, not both")
    if opts.schema is not None and opts.url is None:
        raise click.UsageError("--schema needs a PostgreSQL --url (a SQLite file has no schemas)")
    if opts.url is not None:
        path, server = parse_target(opts.url, schema=opts.schema)
    else:
        path, server = opts.db_path.expanduser() if opts.db_path else default_db_path(), None
    configure_logs(as_json=opts.json, quiet=opts.quiet)
    key = None
    if server is None:
        given = to_url(opts.url) if opts.url is not None and "://" in opts.url else None
        key = encryption.resolve(None, given)
    return State(path=path, json=opts.json, quiet=opts.quiet, url=server, key=key)
