"""What the command line needs before it knows which command runs: the global options,
the group that loads a command's module only when that command is named, and turning
every failure into one line (or one JSON object) on stderr.

Kept light on purpose: ``hermes-store --version`` and ``--help`` import this module and
click, nothing of SQLAlchemy, Alembic or rich (bench/cli_startup.py measures it). What a
command needs is in :mod:`hermes_store.cli._common`, loaded with the command's module.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from collections.abc import Callable, Iterable, Iterator, Mapping

import click
from click.core import ParameterSource

from .. import errors

PROG = "hermes-store"


class CliError(Exception):
    """A refusal worth one line on stderr and exit code 1 (not a bug, not bad arguments).

    ``code`` is the stable name a ``--json`` run reports it under (``{"error": …,
    "code": …}``): "no_database", "no_store", "needs_upgrade", "needs_adoption"…
    """

    def __init__(self, message: str, code: str = "refused") -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------- text from the OS


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


def json_text(doc: Any, **kw: Any) -> str:
    """JSON in UTF-8 when the text allows it; ASCII escapes when it holds undecodable
    bytes (a file name, say), which no UTF-8 stream can carry."""
    out = json.dumps(doc, ensure_ascii=False, default=str, **kw)
    return json.dumps(doc, default=str, **kw) if has_surrogates(out) else out


# ---------------------------------------------------------------------------- argument types


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


# ---------------------------------------------------------------------------- global options


@dataclass
class Options:
    """The global options as given, before or after the subcommand (``hermes-store --db X
    sessions`` and ``hermes-store sessions --db X`` are the same run). Checked and turned
    into the command's ``State`` when the command starts (:func:`hermes_store.cli._common._state`)."""

    db_path: Path | None = None
    url: str | None = None
    schema: str | None = None
    json: bool = False
    quiet: bool = False
    state: Any = None  # the checked State, built once


#: (option names, field of Options, click keyword arguments): the options every command
#: takes, on the group and on each subcommand alike.
GLOBAL_OPTIONS: tuple[tuple[tuple[str, ...], str, dict[str, Any]], ...] = (
    (("--db",), "db_path", {"type": DbPath(), "metavar": "PATH",
                            "help": "Database file [default: $HERMES_HOME/state.db, else ~/.hermes/state.db]."}),
    (("--url",), "url", {"metavar": "URL", "type": TEXT,
                         "help": "Database URL instead of --db: sqlite:///path, postgresql://user@host/db "
                                 "(postgres:// and postgresql+psycopg:// too)."}),
    (("--schema",), "schema", {"metavar": "NAME", "type": TEXT,
                               "help": "With a PostgreSQL --url: the schema of one tenant (created by upgrade); "
                                       "same as ?schema=NAME in the URL."}),
    (("--json",), "json", {"is_flag": True,
                           "help": "Machine output: one JSON document on stdout (JSON Lines for export); "
                                   "errors as one JSON object on stderr."}),
    (("-q", "--quiet"), "quiet", {"is_flag": True,
                                  "help": "No progress bars, progress lines, side-notes or warnings."}),
)


def group_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The global options on the group, passed to its callback by field name."""
    for names, field, kw in reversed(GLOBAL_OPTIONS):
        f = click.option(*names, field, **kw)(f)
    return f


def _remember(field: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        given = ctx.get_parameter_source(param.name or "") is ParameterSource.COMMANDLINE
        if value is None or value is False or not given:
            return
        setattr(ctx.ensure_object(Options), field, value)  # after the command name: it wins

    return callback


def global_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The global options accepted after the subcommand too (``hermes-store adopt --db PATH``)."""
    for names, field, kw in reversed(GLOBAL_OPTIONS):
        f = click.option(*names, f"global_{field}", expose_value=False, callback=_remember(field), **kw)(f)
    return f


# ---------------------------------------------------------------------------- the group


class PipeClosed(Exception):
    """stdout's reader went away (``sessions | head -1``).

    Raised in place of BrokenPipeError so it reaches :func:`run` instead of click's own
    EPIPE handling, which calls ``sys.exit(1)`` even outside standalone mode.
    """


class Interrupted(Exception):
    """^C (SIGINT) while a command ran.

    Raised in place of KeyboardInterrupt so it reaches :func:`run` as it is: click turns
    a KeyboardInterrupt into ``Abort`` after writing an empty line to stderr, which a
    log or a ``--json`` reader would get before the one line the run ends with.
    """


class Group(click.Group):
    """click's group, with a closed stdout reported as :class:`PipeClosed` and ^C as
    :class:`Interrupted`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise PipeClosed() from exc
        except KeyboardInterrupt as exc:
            raise Interrupted() from exc


class Lazy(NamedTuple):
    """Where a command lives (a module of this package and its name there) and its
    one-line help, which ``--help`` lists without importing the module."""

    module: str
    attr: str
    short_help: str


class LazyGroup(Group):
    """A group whose commands are imported by module name when one is named.

    ``--help`` and ``--version`` then load none of them (nor SQLAlchemy, Alembic or rich,
    which they import). tests/test_cli_conventions.py checks every entry of ``lazy``
    against the command it loads: same name, same one-line help.
    """

    def __init__(self, *args: Any, lazy: Mapping[str, Lazy], package: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)
        self.package = package

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.add_command(self.load(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def load(self, cmd_name: str) -> click.Command:
        spec = self.lazy[cmd_name]
        command = getattr(importlib.import_module(f"{self.package}.{spec.module}"), spec.attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{spec.module}.{spec.attr} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            if name in self.commands:
                if self.commands[name].hidden:
                    continue
                rows.append((name, self.commands[name].get_short_help_str(limit)))
            else:
                # Cut as click cuts a loaded command's line (a Command costs nothing to make).
                rows.append((name, click.Command(name, help=self.lazy[name].short_help).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# ---------------------------------------------------------------------------- failures → one line


#: Exit codes. 130 and 141 are what a shell reports for a program stopped by SIGINT
#: or SIGPIPE (128 + signal), so scripts treat us like any other tool.
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE_CLOSED = 0, 1, 2, 130, 141

#: Set to show the traceback of an unexpected error instead of its one line.
DEBUG_ENV = "HERMES_STORE_DEBUG"


def one_line(message: Any) -> str:
    return " ".join(str(message).split())


def say(message: str) -> None:
    """One line on stderr, whatever the message held."""
    click.echo(f"{PROG}: " + one_line(message), err=True)


def wants_json(args: Iterable[str]) -> bool:
    """Whether ``--json`` was given (before a ``--``), read from the arguments themselves:
    a run can fail before click has parsed them all."""
    for arg in args:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def error_code(exc: BaseException | type[BaseException]) -> str:
    """The stable name of a library error for ``--json``: its class name in snake case
    (NotFoundError → "not_found", DatabaseLockedError → "database_locked",
    NotADatabaseError → "not_a_database", FTSError → "fts").

    A word starts at a capital that follows a small letter or digit, and at a capital
    that follows a capital and precedes a small letter (the "A" of "NotADatabase", the
    "D" of "FTSDamaged"); a run of capitals stays one word.
    """
    cls = exc if isinstance(exc, type) else type(exc)
    name = cls.__name__.removesuffix("Error") or "error"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


class Reporter:
    """Writes the one error a run ends with: a line, or with ``--json`` one JSON object."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def __call__(self, message: str, code: str, exit_code: int, *, usage: bool = False) -> int:
        if self.as_json:
            click.echo(json_text({"error": one_line(message), "code": code, "exit_code": exit_code}), err=True)
        else:
            say(f"error: {message}" if usage else message)
        return exit_code


# ---------------------------------------------------------------------------- the library's log records


#: The loggers the library writes to (its modules', and Hermes' name its mixins keep).
LIBRARY_LOGGERS = ("hermes_store", "hermes_state")


def wants_quiet(args: Iterable[str]) -> bool:
    """Whether ``-q``/``--quiet`` was given (before a ``--``), read from the arguments
    as :func:`wants_json` reads them; :func:`route_library_logs` is told again once
    click has parsed them (:meth:`LogLines.configure`)."""
    for arg in args:
        if arg == "--":
            return False
        if arg in ("-q", "--quiet"):
            return True
    return False


class LogLines(logging.Handler):
    """The library's log records, as this command line writes everything else on stderr.

    A library user configures ``logging`` as they like, and our loggers warn there
    (a slow search, a failed background upkeep). Run as ``hermes-store``, a record is
    one line like the others: ``hermes-store: warning: …`` (its exception, if any, as
    ``(TypeName: message)``, no traceback), one JSON object with ``--json``
    (``{"level": "warning", "message": …, "logger": …}``), and nothing below ERROR
    with ``-q``.
    """

    def __init__(self, as_json: bool, quiet: bool) -> None:
        super().__init__(logging.WARNING)
        self.as_json, self.quiet = as_json, quiet

    def configure(self, *, as_json: bool, quiet: bool) -> None:
        self.as_json, self.quiet = as_json, quiet

    def emit(self, record: logging.LogRecord) -> None:
        if self.quiet and record.levelno < logging.ERROR:
            return
        try:
            message = one_line(record.getMessage())
            exc = record.exc_info[1] if record.exc_info else None
            if exc is not None:
                message += f" ({type(exc).__name__}: {one_line(exc)})"
            level = record.levelname.lower()
            if self.as_json:
                click.echo(json_text({"level": level, "message": message, "logger": record.name}), err=True)
            else:
                say(f"{level}: {message}")
        except Exception:  # a closed stderr, a record that cannot be formatted
            self.handleError(record)


#: The handler of the run under way (None outside :func:`run`).
_active_log: LogLines | None = None


def configure_logs(*, as_json: bool, quiet: bool) -> None:
    """The run's options as click parsed them (global options after the command name too)."""
    if _active_log is not None:
        _active_log.configure(as_json=as_json, quiet=quiet)


@contextmanager
def route_library_logs(as_json: bool, quiet: bool) -> Iterator[LogLines]:
    """For one run: the library's loggers write through :class:`LogLines` only (not
    through the root logger, nor Python's last-resort handler, which printed records as
    bare lines); their handlers, level and propagation are put back afterwards."""
    global _active_log
    handler = LogLines(as_json, quiet)
    saved = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate, logger.level))
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.WARNING)
    previous, _active_log = _active_log, handler
    try:
        yield handler
    finally:
        _active_log = previous
        for logger, handlers, propagate, level in saved:
            logger.handlers = handlers
            logger.propagate = propagate
            logger.setLevel(level)


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


def _driver_error(exc: BaseException) -> Any:
    """The DB-API error behind ``exc`` when it is SQLAlchemy's wrapper of one, else None.

    Looked up in ``sys.modules``: when SQLAlchemy was never imported, nothing raised
    can be one of its errors, and --help need not import it to find out.
    """
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None and isinstance(exc, sa_exc.DBAPIError):
        return exc.orig
    return None


def run(group: click.Group, argv: list[str] | None) -> int:
    """Run the command line; every failure becomes one line on stderr and an exit code.

    0 success; 1 a refusal or failure (unknown session, library or database error, a
    file that cannot be read or written); 2 bad arguments; 130 interrupted; 141 stdout
    closed by its reader (quietly). With ``--json`` the line is one JSON object,
    ``{"error": message, "code": name, "exit_code": n}``.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    fail = Reporter(wants_json(args))
    with route_library_logs(fail.as_json, wants_quiet(args)):
        return _run(group, args, fail)


def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


def _run(group: click.Group, args: list[str], fail: Reporter) -> int:
    try:
        try:
            rv = group.main(args=args, prog_name=PROG, standalone_mode=False)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
            return rv if isinstance(rv, int) else EXIT_OK
        except click.exceptions.NoArgsIsHelpError as exc:
            if fail.as_json:
                return fail(f"missing command (see '{PROG} --help')", "usage", EXIT_USAGE, usage=True)
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
            return EXIT_USAGE
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else PROG
            return fail(f"{exc.format_message()} (see '{where} --help')", "usage", EXIT_USAGE, usage=True)
        except click.exceptions.Exit as exc:
            return exc.exit_code
        except (Interrupted, KeyboardInterrupt):
            if _stderr_is_terminal():
                click.echo(err=True)  # after the terminal's "^C", the line starts on a line of its own
            return fail("interrupted", "interrupted", EXIT_INTERRUPTED)
        except click.exceptions.Abort:
            return fail("interrupted", "interrupted", EXIT_INTERRUPTED)
        except click.ClickException as exc:  # e.g. FileError from click.File
            return fail(exc.format_message(), "file_error", EXIT_FAILURE)
        except CliError as exc:
            return fail(str(exc), exc.code, EXIT_FAILURE)
        except errors.HermesStoreError as exc:
            return fail(str(exc), error_code(exc), EXIT_FAILURE)
        except (PipeClosed, BrokenPipeError, SystemExit):
            # SystemExit: click's own EPIPE path when the pipe closed while it wrote help.
            _silence_stdout()
            return EXIT_PIPE_CLOSED
        except Exception as exc:
            orig = _driver_error(exc)
            if orig is not None:
                return fail(f"database error: {orig}", "database_error", EXIT_FAILURE)
            sqlite3 = sys.modules.get("sqlite3")
            if sqlite3 is not None and isinstance(exc, sqlite3.Error):  # the facade's raw DB-API paths
                return fail(f"database error: {exc}", "database_error", EXIT_FAILURE)
            if isinstance(exc, OSError):
                return fail(_os_error_line(exc), "os_error", EXIT_FAILURE)
            if os.environ.get(DEBUG_ENV):
                raise
            return fail(f"unexpected error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback, "
                        "and please report it)", "unexpected", EXIT_FAILURE)
    except KeyboardInterrupt:  # a second ^C while the first one was being reported
        return EXIT_INTERRUPTED
