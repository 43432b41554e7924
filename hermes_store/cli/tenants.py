"""``hermes-store tenants``: the stores of a PostgreSQL database and, on a Citus cluster,
where each lives (list), making one a distributed schema (distribute), moving one to
another worker while it runs (move). The work is :mod:`hermes_store.tenancy`'s."""

from __future__ import annotations

import click
from rich.text import Text

from .. import tenancy
from ._common import TEXT, CliError, State, _state, fitted_table, fmt_bytes, fmt_num, global_options, stdout_console


def _server_url(st: State) -> str:
    """The ``--url`` of the run: tenants are schemas of a PostgreSQL database, never a file."""
    if st.url is None:
        raise CliError("tenants are schemas of a PostgreSQL database: give its --url "
                       "(postgresql+psycopg://… ; on a Citus cluster, the coordinator's)", code="needs_server")
    return st.url


@click.group(no_args_is_help=False)
@global_options
def tenants() -> None:
    """Tenants of a PostgreSQL database; on Citus: list, distribute, move."""


@tenants.command("list")
@global_options
def tenants_list() -> None:
    """Every store of the database: schema, node and size (Citus), sessions, messages."""
    st = _state()
    found = tenancy.list_tenants(_server_url(st))
    if st.json:
        st.emit({"tenants": [t.as_dict() for t in found]})
        return
    out = stdout_console()
    if not found:
        out.print(Text("No store in this database (no schema holds a hermes_store version table)"))
        return
    rows = [[t.schema, t.node or ("—" if not t.distributed else "?"), fmt_bytes(t.size_bytes),
             fmt_num(t.sessions), fmt_num(t.messages)] for t in found]
    out.print(fitted_table(out, ["Tenant", "Node", "Size", "Sessions", "Messages"], rows, flex=0, right=[2, 3, 4]))


@tenants.command("distribute")
@click.argument("name", type=TEXT)
@click.option("--dry-run", is_flag=True, help="Check and count; change nothing.")
@global_options
def tenants_distribute(name: str, dry_run: bool) -> None:
    """Make the tenant NAME a distributed schema (Citus schema-based sharding), every row kept.

    It then lives whole on one worker, chosen by Citus. Its tables are locked
    while they are copied there (one transaction).
    """
    st = _state()
    done = tenancy.distribute_tenant(_server_url(st), name, dry_run=dry_run)
    if st.json:
        st.emit(done.as_dict())
        return
    rows = sum(done.rows.values())
    if done.distributed_before:
        line = f"{name} is already a distributed schema ({fmt_num(rows)} rows); nothing to do."
    elif dry_run:
        line = f"Would distribute {name}: {len(done.rows)} tables, {fmt_num(rows)} rows. Dry run: nothing was changed."
    else:
        line = f"Distributed {name}: {len(done.rows)} tables, {fmt_num(rows)} rows, every one counted again after."
    stdout_console().print(Text(line))


@tenants.command("move")
@click.argument("name", type=TEXT)
@click.option("--to", "to", type=TEXT, required=True, metavar="NODE",
              help="The worker: host:port, its node id, or a host only one node has.")
@click.option("--mode", type=click.Choice(tenancy.TRANSFER_MODES), default="auto", show_default=True,
              help="Citus' transfer mode: auto and force_logical keep writers going; block_writes makes them wait.")
@click.option("--dry-run", is_flag=True, help="Check, count and checksum; move nothing.")
@global_options
def tenants_move(name: str, to: str, mode: str, dry_run: bool) -> None:
    """Move the distributed tenant NAME to another worker, online, through Citus' move.

    Each table's rows and checksum are read before and after; the tenant must end
    whole on NODE. Writers may go on meanwhile (the tables they changed are named).
    """
    st = _state()
    move = tenancy.move_tenant(_server_url(st), name, to, mode=mode, dry_run=dry_run)
    if st.json:
        st.emit(move.as_dict())
        return
    rows = sum(b[0] for b in move.before.values())
    source = ", ".join(move.source)
    if not move.moved and move.source == [move.target]:
        line = f"{name} is already on {move.target}; nothing to do."
    elif dry_run:
        line = (f"Would move {name} from {source} to {move.target} ({mode}): {len(move.before)} tables, "
                f"{fmt_num(rows)} rows. Dry run: nothing was changed.")
    else:
        after = sum(a[0] for a in move.after.values())
        checked = ("every table identical (rows and checksums)" if move.identical
                   else f"written to meanwhile: {', '.join(move.changed)} changed")
        line = (f"Moved {name} from {source} to {move.target} ({mode}): {len(move.before)} tables, "
                f"{fmt_num(rows)} rows before, {fmt_num(after)} after; {checked}.")
    stdout_console().print(Text(line))


COMMANDS = (tenants,)
