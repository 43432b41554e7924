"""Tenants of a PostgreSQL database and, on a Citus cluster, where each one lives.

A tenant is one schema holding a store (``…/db?schema=team_a``; every statement names
it, :mod:`hermes_store.tenant_schema`, whose names a host needs are re-exported here).
On Citus with schema-based sharding a tenant schema is a *distributed schema*: it lives
whole on one worker node, placed and moved by Citus (issue 33). This module lists the
tenants, makes an existing one distributed, and moves one to another node, checking
each time that every row is where it was. The Citus statements themselves are
:mod:`hermes_store.dialects.pg_citus`'s. The CLI's ``hermes-store tenants`` calls these.

On plain PostgreSQL (or SQLite) the placement calls say that Citus is needed and change
nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL

from . import errors, retry
from .dialects import pg_citus
from .engine import create_engine
from .keys import LONG_BUDGET_S, VERSION_TABLE
from .tenant_schema import SCHEMA_PARAM, SchemaSQL, check_schema, quote_ident, tenant_options

__all__ = [
    "SCHEMA_PARAM",
    "TRANSFER_MODES",
    "SchemaSQL",
    "TenantInfo",
    "TenantMove",
    "TenantPlacement",
    "check_schema",
    "distribute_tenant",
    "list_tenants",
    "move_tenant",
    "tenant_options",
]

TRANSFER_MODES = pg_citus.TRANSFER_MODES
#: How long a move waits, trying again, for an earlier cut-off move's leftover to be
#: released (its server backend still ending, a reader of the old placement finishing):
#: a long step's budget.
MOVE_LEFTOVER_BUDGET_S = LONG_BUDGET_S

_TABLES = ("SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = :s ORDER BY 1")
_SCHEMA_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = :s)"
#: The schemas holding a store of ours: those with our version table.
#: A tenant being created meanwhile (its version table there, its sessions not yet) is
#: not one yet: it is left out rather than failing the count.
_STORES = ("SELECT table_schema FROM information_schema.tables WHERE table_name = :v AND table_type = 'BASE TABLE'"
           " AND to_regclass(quote_ident(table_schema) || '.sessions') IS NOT NULL"
           " AND to_regclass(quote_ident(table_schema) || '.messages') IS NOT NULL ORDER BY 1")
#: One table's rows and a checksum of their content, independent of their order (each
#: row's text hashed, the hashes sorted and hashed again).
_CONTENT = ("SELECT count(*), coalesce(md5(string_agg(md5(CAST(t AS text)), '' ORDER BY md5(CAST(t AS text)))), '')"
            " FROM {q}.{t} AS t")


@contextlib.contextmanager
def _server(url: str | URL, refusal: str) -> Iterator[Engine]:
    """An engine on the PostgreSQL database at ``url``, disposed after; a SQLite target is
    refused (``refusal``) before anything connects, so no file is created."""
    engine = create_engine(url)
    try:
        if not pg_citus.has_tenants(engine):
            raise errors.UnsupportedDatabaseError(refusal)
        yield engine
    finally:
        engine.dispose()


def _tenant_on_citus(conn: Connection, schema: str, doing: str) -> None:
    """Refuse, typed, a database without Citus or a schema that is not there."""
    if not pg_citus.is_citus(conn):
        raise errors.UnsupportedDatabaseError(
            f"{doing} needs Citus (a coordinator with the citus extension); this is plain PostgreSQL")
    if not conn.execute(text(_SCHEMA_EXISTS), {"s": schema}).scalar():
        raise errors.NotFoundError(f"no tenant schema {schema!r} on this database")


def _tables(conn: Connection, schema: str) -> list[str]:
    return list(conn.execute(text(_TABLES), {"s": schema}).scalars())


def _rows(conn: Connection, schema: str) -> dict[str, int]:
    q = quote_ident(schema)
    return {t: int(conn.exec_driver_sql(f"SELECT count(*) FROM {q}.{quote_ident(t)}").scalar() or 0)
            for t in _tables(conn, schema)}


def _content(conn: Connection, schema: str) -> dict[str, tuple[int, str]]:
    """``{table: (rows, checksum)}`` of the tenant, read in one snapshot."""
    q = quote_ident(schema)
    found = {}
    for t in _tables(conn, schema):
        count, digest = conn.exec_driver_sql(_CONTENT.format(q=q, t=quote_ident(t))).one()
        found[t] = (int(count), str(digest))
    return found


@dataclass
class TenantPlacement:
    """What :func:`distribute_tenant` found and did: the rows of each table of the tenant
    before (and, when it changed anything, after: checked equal)."""

    schema: str
    distributed_before: bool
    distributed: bool
    dry_run: bool
    rows: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "distributed_before": self.distributed_before,
                "distributed": self.distributed, "dry_run": self.dry_run, "rows": dict(self.rows)}


def distribute_tenant(url: str | URL, schema: str, *, dry_run: bool = False) -> TenantPlacement:
    """Make the existing tenant ``schema`` of the Citus coordinator at ``url`` a
    distributed schema (schema-based sharding: it then lives whole on one worker, placed
    and moved by Citus), in one transaction; its rows are counted before and after.

    ``dry_run``: report only. A tenant already distributed is left as it is. Raises
    :class:`~hermes_store.errors.UnsupportedDatabaseError` where Citus is absent,
    :class:`~hermes_store.errors.NotFoundError` for a schema that does not exist.
    """
    check_schema(schema)
    with _server(url, "distributing a tenant needs Citus, on PostgreSQL") as engine:
        with engine.begin() as conn:
            _tenant_on_citus(conn, schema, "distributing a tenant")
            before = pg_citus.is_distributed(conn, schema)
            placement = TenantPlacement(schema, before, before, dry_run, _rows(conn, schema))
            if before or dry_run:
                return placement
            pg_citus.distribute_schema(conn, schema)
        with engine.connect() as conn:
            after = _rows(conn, schema)
            placement.distributed = pg_citus.is_distributed(conn, schema)
        if after != placement.rows or not placement.distributed:
            raise errors.TenantPlacementError(
                f"tenant {schema!r} after distribution: rows {after} (before {placement.rows}),"
                f" distributed={placement.distributed}")
        return placement


@dataclass
class TenantMove:
    """What :func:`move_tenant` found and did.

    ``before`` and ``after`` are each table's rows and checksum. When nobody wrote to
    the tenant meanwhile they are equal (``identical``); tables its writers changed
    during the move are listed in ``changed`` (the move itself is Citus' logical
    replication, which carries those writes over).
    """

    schema: str
    source: list[str]
    target: str
    mode: str
    dry_run: bool
    moved: bool = False
    before: dict[str, tuple[int, str]] = field(default_factory=dict)
    after: dict[str, tuple[int, str]] = field(default_factory=dict)
    nodes_after: list[str] = field(default_factory=list)

    @property
    def changed(self) -> list[str]:
        return sorted(t for t in self.before if self.after and self.after.get(t) != self.before[t])

    @property
    def identical(self) -> bool | None:
        return None if not self.after else not self.changed

    def as_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "from": self.source, "to": self.target, "mode": self.mode,
                "dry_run": self.dry_run, "moved": self.moved, "nodes_after": self.nodes_after,
                "identical": self.identical, "changed": self.changed,
                "tables": {t: {"rows_before": b[0], "checksum_before": b[1],
                               "rows_after": self.after[t][0] if t in self.after else None,
                               "checksum_after": self.after[t][1] if t in self.after else None}
                           for t, b in self.before.items()}}


def _node(found: dict[str, int], wanted: str) -> str:
    """The ``host:port`` of the node ``wanted`` names: itself, its node id, or a host
    that only one node has. A name matching none is refused with the choices."""
    wanted = wanted.strip()
    if wanted in found:
        return wanted
    by_id = [n for n, i in found.items() if str(i) == wanted]
    by_host = [n for n in found if n.rsplit(":", 1)[0] == wanted]
    for match in (by_id, by_host):
        if len(match) == 1:
            return match[0]
    raise errors.InvalidInputError(
        f"no single worker node {wanted!r}: use host:port or a node id, one of "
        + ", ".join(f"{n} (id {i})" for n, i in found.items()))


def move_tenant(url: str | URL, schema: str, to: str, *, mode: str = "auto",
                dry_run: bool = False) -> TenantMove:
    """Move the distributed tenant ``schema`` to the worker ``to`` (``host:port``, a node
    id, or a host only one node has) through Citus' online move, while its writers go on.

    Every table's rows and checksum are read before and after; afterwards the tenant
    must be whole on ``to`` with all its tables, and when nothing wrote to it meanwhile
    every checksum equal (``identical``; else ``changed`` names what its writers
    changed). ``mode`` is Citus' transfer mode
    (:data:`TRANSFER_MODES`; ``auto`` uses logical replication: writers do not wait).
    A tenant already there is left alone. Raises :class:`~hermes_store.errors.
    UnsupportedDatabaseError` without Citus, :class:`~hermes_store.errors.NotFoundError`
    for a missing schema, :class:`~hermes_store.errors.InvalidInputError` for an unknown
    node, a mode Citus lacks, or a tenant not distributed yet, and
    :class:`~hermes_store.errors.TenantPlacementError` when the result does not check out.
    """
    check_schema(schema)
    if mode not in TRANSFER_MODES:
        raise errors.InvalidInputError(f"transfer mode {mode!r} is not one of {', '.join(TRANSFER_MODES)}")
    with _server(url, "moving a tenant needs Citus, on PostgreSQL") as engine:
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            _tenant_on_citus(conn, schema, "moving a tenant")
            if not pg_citus.is_distributed(conn, schema):
                raise errors.InvalidInputError(
                    f"tenant {schema!r} is not a distributed schema yet: distribute it first"
                    " (hermes-store tenants distribute)")
            workers = pg_citus.nodes(conn)
            target = _node(workers, to)
            move = TenantMove(schema, pg_citus.schema_nodes(conn, schema), target, mode, dry_run,
                              before=_content(conn, schema))
        if dry_run or move.source == [target]:
            move.nodes_after = move.source
            return move
        def attempt(_deadline: float) -> None:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                pg_citus.move_schema(conn, schema, workers[target], mode)

        def give_up(exc: BaseException, waited: float) -> BaseException:
            error = errors.TenantPlacementError(
                f"tenant {schema!r} did not move: a cut-off earlier move left a copy Citus could not drop"
                f" for {waited:.0f}s (still in use); the tenant is whole where it was, try again later")
            error.__cause__ = exc
            return error

        retry.run(attempt, budget=MOVE_LEFTOVER_BUDGET_S, give_up=give_up,
                  triage=lambda exc: retry.WAIT if pg_citus.leftover_in_use(exc) else retry.RAISE,
                  early=(0.2, 0.5), late=(1.0, 2.0), phase=5.0)
        move.moved = True
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            move.nodes_after = pg_citus.schema_nodes(conn, schema)
            move.after = _content(conn, schema)
        if move.nodes_after != [target] or set(move.after) != set(move.before):
            raise errors.TenantPlacementError(
                f"tenant {schema!r} after its move to {target}: on {move.nodes_after},"
                f" tables {sorted(move.after)} (before {sorted(move.before)})")
        return move


@dataclass
class TenantInfo:
    """One store of a database (:func:`list_tenants`): its schema, where Citus keeps it
    (``node`` ``host:port`` and ``size_bytes`` when it is a distributed schema), and its
    sessions and messages (counted)."""

    schema: str
    distributed: bool
    node: str | None
    size_bytes: int | None
    sessions: int
    messages: int

    def as_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "distributed": self.distributed, "node": self.node,
                "size_bytes": self.size_bytes, "sessions": self.sessions, "messages": self.messages}


#: Stores counted per statement by :func:`list_tenants` (a UNION ALL of one row each).
_COUNTED_PER_STATEMENT = 250


def _counts(conn: Connection, schemas: list[str]) -> dict[str, tuple[int, int]]:
    """``{schema: (sessions, messages)}``, counted exactly, many stores per statement."""
    found: dict[str, tuple[int, int]] = {}
    for start in range(0, len(schemas), _COUNTED_PER_STATEMENT):
        part = schemas[start:start + _COUNTED_PER_STATEMENT]
        rows = " UNION ALL ".join(
            f"SELECT {n}, (SELECT count(*) FROM {quote_ident(s)}.sessions),"
            f" (SELECT count(*) FROM {quote_ident(s)}.messages)" for n, s in enumerate(part))
        for n, sessions, messages in conn.exec_driver_sql(rows):
            found[part[int(n)]] = (int(sessions), int(messages))
    return found


def list_tenants(url: str | URL) -> list[TenantInfo]:
    """Every store of the PostgreSQL database at ``url`` (each schema holding our version
    table), with its placement where the database is a Citus coordinator (read once for
    all). Sessions and messages are counted exactly, 250 stores per statement.
    Raises :class:`~hermes_store.errors.UnsupportedDatabaseError` on SQLite (one store,
    no tenants)."""
    with _server(url, "tenants are schemas of a PostgreSQL database") as engine, engine.connect() as conn:
        placed = pg_citus.placements(conn) if pg_citus.is_citus(conn) else {}
        schemas = list(conn.execute(text(_STORES), {"v": VERSION_TABLE}).scalars())
        counts = _counts(conn, schemas)
        found = []
        for schema in schemas:
            node, size = placed.get(schema, (None, None))
            sessions, messages = counts[schema]
            found.append(TenantInfo(schema, schema in placed, node, size, sessions, messages))
        return found
