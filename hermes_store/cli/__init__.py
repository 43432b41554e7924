"""``hermes-store``: the command line over a Hermes ``state.db``.

People get rich tables sized for an 80-column terminal; scripts pass ``--json`` and get
one JSON document on stdout (JSON Lines for ``export``) with stable keys and raw values
(epoch-float timestamps, integer token counts). Progress bars go to stderr and only to
an interactive terminal, so pipes and logs stay clean.

Exit codes: 0 success, 1 a refusal or failure (unknown session, not a Hermes file,
damaged index, a file that cannot be read or written...), 2 bad arguments, 130
interrupted, 141 stdout closed by its reader (``sessions | head -1``, no message).
Every error is one line on stderr, never a traceback: ``hermes-store: error: ...`` for
arguments, ``hermes-store: ...`` otherwise.

Commands that only read never rewrite a file Hermes made: a ``state.db`` that has not
been adopted yet is refused with a pointer to ``hermes-store adopt``, which keeps a
backup and reports what it did.

One module per command group: ``schema`` (upgrade, current, adopt, demo), ``browse``
(sessions, show, lineage, search, stats), ``transfer`` (export, import, copy), ``maintain``
(prune, fts); ``_common`` holds what they share.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import __version__
from ..engine import default_db_path
from . import browse, maintain, schema, transfer
from ._common import (
    PROG,
    TEXT,
    CliError,
    DbPath,
    Group,
    State,
    parse_target,
    content_text,
    fmt_num,
    fmt_time,
    highlight_snippet,
    run,
    stderr_console,
    stdout_console,
)

__all__ = [
    "CliError", "cli", "content_text", "fmt_num", "fmt_time", "highlight_snippet", "main", "stderr_console",
    "stdout_console",
]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--db", "db_path", type=DbPath(), metavar="PATH",
              help="Database file [default: $HERMES_HOME/state.db, else ~/.hermes/state.db].")
@click.option("--url", metavar="URL", type=TEXT, help="Database URL instead of --db: sqlite:///path or postgresql+psycopg://user@host/db.")
@click.option("--schema", metavar="NAME", type=TEXT,
              help="With a PostgreSQL --url: the schema of one tenant (created by upgrade); "
                   "same as ?schema=NAME in the URL.")
@click.option("--json", "as_json", is_flag=True, help="Machine output: one JSON document on stdout (JSON Lines for export).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or side-notes.")
@click.version_option(__version__, prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, db_path: Path | None, url: str | None, schema: str | None, as_json: bool,
        quiet: bool) -> None:
    """Inspect and maintain a Hermes Agent session store (state.db)."""
    if db_path is not None and url is not None:
        raise click.UsageError("use either --db or --url, not both")
    if schema is not None and url is None:
        raise click.UsageError("--schema needs a PostgreSQL --url (a SQLite file has no schemas)")
    if url is not None:
        path, server = parse_target(url, schema=schema)
    else:
        path, server = db_path.expanduser() if db_path else default_db_path(), None
    ctx.obj = State(path=path, json=as_json, quiet=quiet, url=server)


for _module in (schema, browse, transfer, maintain):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry (``hermes_store.cli:main``): returns the exit code, never a traceback."""
    return run(cli, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
