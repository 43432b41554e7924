"""``hermes-store``: the command line over a Hermes ``state.db``.

People get rich tables sized for an 80-column terminal; scripts pass ``--json`` and get
one JSON document on stdout (JSON Lines for ``export``) with stable keys and raw values
(epoch-float timestamps, integer token counts). Progress bars go to stderr on an
interactive terminal; when stderr is not one (a log, CI), long commands write a
progress line there every few seconds instead (count, rate, ETA), so pipes stay clean.

Exit codes: 0 success, 1 a refusal or failure (unknown session, not a Hermes file,
damaged index, a file that cannot be read or written...), 2 bad arguments, 130
interrupted, 141 stdout closed by its reader (``sessions | head -1``, no message).
Every error is one line on stderr, never a traceback: ``hermes-store: error: ...`` for
arguments, ``hermes-store: ...`` otherwise; with ``--json``, one JSON object
``{"error": ..., "code": ..., "exit_code": ...}`` (``code``: the library error's class
name in snake case, ``not_a_database``). ^C ends a run with that one line too. A warning
the library logs (a slow search) is one line as well, ``hermes-store: warning: ...``, a
JSON object ``{"level": ..., "message": ..., "logger": ...}`` with ``--json``, and
nothing with ``-q``.

The global options (``--db``, ``--url``, ``--schema``, ``--json``, ``-q``) go before
or after the command name.

Only ``upgrade``, ``adopt``, ``demo``, ``import`` and ``copy`` create or migrate a
store. Every other command opens one that is there and at head, or says how to make
it so and exits 1: a missing or empty database, a server database or schema without
our tables, a store at an older revision (run ``upgrade``; or, when a host
application's Alembic runs our revisions, ``alembic upgrade heads`` in that project),
and a ``state.db`` Hermes made that is not adopted yet (run ``adopt``, which keeps a
backup) are refused. The commands that only read open a file read-only: its bytes
and time stamp stay as they were, whatever WAL another program left beside it.

One module per command group: ``schema`` (upgrade, current, adopt, demo), ``browse``
(sessions, show, lineage, search, stats), ``transfer`` (export, import, copy), ``maintain``
(prune, fts), ``doctor``; ``_common`` holds what they share. A command's module is imported when
the command is named (:class:`~hermes_store.cli._base.LazyGroup`), so ``--help`` and
``--version`` start in a fraction of the time a command takes to load.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import click

from .. import __version__
from ._base import PROG, CliError, Lazy, LazyGroup, Options, group_options, run

__all__ = [
    "CliError", "cli", "content_text", "fmt_num", "fmt_time", "highlight_snippet", "main", "stderr_console",
    "stdout_console",
]

#: Every command: its module, its name there, and the line ``--help`` shows for it
#: (the first line of its docstring; tests/test_cli_conventions.py keeps them equal).
COMMANDS: dict[str, Lazy] = {
    "upgrade": Lazy("schema", "upgrade", "Create or migrate the database to a revision."),
    "current": Lazy("schema", "current", "Show the database's revision and whether it is at head."),
    "adopt": Lazy("schema", "adopt", "Adopt a Hermes-made state.db, keeping every row."),
    "demo": Lazy("schema", "demo", "Create a demo database with a few sessions."),
    "sessions": Lazy("browse", "sessions_cmd", "List sessions, newest first, with a preview."),
    "show": Lazy("browse", "show", "Show one session (ID or a unique prefix) and its messages."),
    "lineage": Lazy("browse", "lineage", "Show a session's chain (root → tip) and descendants."),
    "search": Lazy("browse", "search", "Full-text search over all messages."),
    "stats": Lazy("browse", "stats", "Token and cost usage by model, task or route."),
    "export": Lazy("transfer", "export", "Export sessions as JSON Lines (one per line)."),
    "import": Lazy("transfer", "import_cmd", "Import a JSON Lines export (idempotent)."),
    "copy": Lazy("transfer", "copy_cmd", "Copy a whole history between SQLite files and PostgreSQL databases."),
    "prune": Lazy("maintain", "prune", "Delete old ended sessions and their messages."),
    "fts": Lazy("maintain", "fts", "Full-text search index upkeep: rebuild, check, optimize."),
    "tenants": Lazy("tenants", "tenants", "Tenants of a PostgreSQL database; on Citus: list, distribute, move."),
    "retention": Lazy("retention", "retention", "Retention policies per source: show, set, apply (--dry-run)."),
    "size": Lazy("size", "size", "Where the bytes are: tables, indexes, search indexes, free space."),
    "doctor": Lazy(
        "doctor", "doctor", "Check a store's health without changing it (versions, integrity, sizes, upkeep)."
    ),
    "encrypt": Lazy("crypto", "encrypt",
                    "Encrypt a plain store file with SQLCipher (Hermes itself cannot open the result)."),
    "decrypt": Lazy("crypto", "decrypt", "Turn an encrypted store file back into a plain SQLite file."),
    "rekey": Lazy("crypto", "rekey", "Change an encrypted store's key (a new file, checked, swapped in)."),
}

#: Names this package re-exports from the module that holds them, imported on first use.
_REEXPORTED = {name: "_common" for name in (
    "content_text", "fmt_num", "fmt_time", "highlight_snippet", "stderr_console", "stdout_console",
)}
_SUBMODULES = ("_common", "browse", "crypto", "doctor",
               "maintain", "retention", "schema", "size", "tenants", "transfer")


@click.group(cls=LazyGroup, lazy=COMMANDS, package=__name__,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@group_options
@click.version_option(__version__, prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, db_path: Path | None, url: str | None, schema: str | None, json: bool,
        quiet: bool) -> None:
    """Inspect and maintain a Hermes Agent session store (state.db).

    The options below work after the command name too (hermes-store adopt --db PATH).
    """
    ctx.obj = Options(db_path=db_path, url=url, schema=schema, json=json, quiet=quiet)


def __getattr__(name: str) -> Any:
    """``cli.fmt_num``, ``cli.browse``…: the modules behind them load on first use."""
    if name in _REEXPORTED:
        return getattr(importlib.import_module(f"{__name__}.{_REEXPORTED[name]}"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry (``hermes_store.cli:main``): returns the exit code, never a traceback."""
    return run(cli, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
