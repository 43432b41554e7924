"""Citus (distributed PostgreSQL, schema-based sharding): what a tenant schema that Citus
distributes needs of us beyond plain PostgreSQL.

A distributed schema lives whole on one worker node; its tables are co-located
single-shard tables that Citus places and moves. Everything here is transaction-local
and written so that plain PostgreSQL, where the extension is absent, runs it as a no-op:
nothing of it is set on a host's session or left on a pooled server connection. (The
setting a migration run needs is ``pg_tenants.citus_migration_settings``, beside the
run's other steps: this module is never loaded on a SQLite store's path.)
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import Connection, Engine, text

from .. import errors
from ..tenant_schema import quote_ident

_IS_CITUS = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')"
_IS_DISTRIBUTED = ("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_schema d"
                   " WHERE d.schemaid = CAST(CAST(:s AS text) AS regnamespace))")
#: The tables of a schema that carry triggers of their own (ours: the short-CJK index's
#: dirty marks, the display order).
_TRIGGERED_TABLES = (
    "SELECT DISTINCT c.relname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid"
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s AND NOT t.tgisinternal"
    " ORDER BY 1"
)


def has_tenants(bind: Connection | Engine) -> bool:
    """Whether ``bind``'s database keeps stores in schemas (PostgreSQL; not a SQLite file).
    Asked of an Engine, it connects to nothing."""
    return bind.dialect.name == "postgresql"


def is_citus(conn: Connection) -> bool:
    """Whether the database ``conn`` reaches has the Citus extension (a coordinator); never
    on another kind of database."""
    return has_tenants(conn) and bool(conn.exec_driver_sql(_IS_CITUS).scalar())


def is_distributed(conn: Connection, schema: str) -> bool:
    """Whether ``schema`` is a distributed schema (Citus schema-based sharding)."""
    return bool(conn.execute(text(_IS_DISTRIBUTED), {"s": quote_ident(schema)}).scalar())


def distribute_schema(conn: Connection, schema: str) -> None:
    """Make an existing tenant schema a distributed schema, in ``conn``'s transaction.

    ``citus_schema_distribute`` copies each table to a worker; our triggers (which
    Citus accepts only with ``citus.enable_unsafe_triggers``) would fire for the rows
    copied, on the worker, before the tables they write to are there (issue 33, point
    2). So, for this transaction only: the setting on, the schema's own triggers off,
    the distribution, the triggers on again. The tables stay locked until COMMIT, as
    the distribution itself keeps them.
    """
    conn.exec_driver_sql("SET LOCAL citus.enable_unsafe_triggers = on")
    tables = list(conn.execute(text(_TRIGGERED_TABLES), {"s": schema}).scalars())
    q = quote_ident(schema)
    for table in tables:
        conn.exec_driver_sql(f"ALTER TABLE {q}.{quote_ident(table)} DISABLE TRIGGER USER")
    conn.execute(text("SELECT citus_schema_distribute(CAST(CAST(:s AS text) AS regnamespace))"), {"s": q})
    for table in tables:
        conn.exec_driver_sql(f"ALTER TABLE {q}.{quote_ident(table)} ENABLE TRIGGER USER")


#: Per engine (its SQLAlchemy dialect object): whether it reaches a Citus coordinator.
_ON_CITUS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def on_citus(conn: Connection) -> bool:
    """:func:`is_citus` for ``conn``'s engine, asked once and then kept (an engine reaches
    one database for its life)."""
    found = _ON_CITUS.get(conn.dialect)
    if found is None:
        found = _ON_CITUS[conn.dialect] = is_citus(conn)
    return found


def lock_budget(conn: Connection, ms: int) -> str:
    """The statement (or statements) bounding a write transaction's lock waits at ``ms``.

    ``SET LOCAL lock_timeout`` binds the node that runs it; on Citus the waits happen on
    the worker holding the tenant, which gets a ``SET LOCAL`` only when told to pass
    them on (``citus.propagate_set_commands = 'local'``, itself local to the
    transaction: issue 33, point 5). Both end with the transaction, so nothing is left
    on a pooled server connection.
    """
    budget = f"SET LOCAL lock_timeout = {max(1, int(ms))}"
    return f"SET LOCAL citus.propagate_set_commands = 'local'; {budget}" if on_citus(conn) else budget


#: Each distributed schema with the worker holding it (``host:port``; its tables are all
#: co-located on one) and its size there (bytes, as Citus reports it).
_PLACEMENTS = (
    "SELECT n.nspname, min(s.nodename || ':' || s.nodeport), sum(s.shard_size)"
    " FROM pg_catalog.pg_dist_schema d JOIN pg_catalog.pg_namespace n ON n.oid = d.schemaid"
    " JOIN citus_shards s ON s.colocation_id = d.colocationid GROUP BY n.nspname"
)


def placements(conn: Connection) -> dict[str, tuple[str, int]]:
    """``{schema: (host:port, bytes)}`` of every distributed schema, in one statement."""
    return {str(r[0]): (str(r[1]), int(r[2] or 0)) for r in conn.exec_driver_sql(_PLACEMENTS)}


#: The nodes a tenant can be placed on: active primaries that take shards (the workers).
_NODES = ("SELECT nodeid, nodename, nodeport FROM pg_catalog.pg_dist_node"
          " WHERE isactive AND noderole = 'primary' AND shouldhaveshards ORDER BY nodename, nodeport")
#: The nodes holding a placement of a distributed schema's tables (one when it is whole).
_SCHEMA_NODES = (
    "SELECT DISTINCT s.nodename || ':' || s.nodeport FROM pg_catalog.pg_dist_schema d"
    " JOIN citus_shards s ON s.colocation_id = d.colocationid"
    " WHERE d.schemaid = CAST(CAST(:s AS text) AS regnamespace) ORDER BY 1"
)
#: How Citus copies a tenant: ``auto`` (logical replication where every table has a key or
#: a replica identity, as ours all have: writers go on), ``force_logical``, or
#: ``block_writes`` (writers wait for the copy).
TRANSFER_MODES = ("auto", "force_logical", "block_writes")


def nodes(conn: Connection) -> dict[str, int]:
    """``{host:port: node id}`` of the nodes a tenant can live on."""
    return {f"{r[1]}:{r[2]}": int(r[0]) for r in conn.exec_driver_sql(_NODES)}


def schema_nodes(conn: Connection, schema: str) -> list[str]:
    """The ``host:port`` of each node holding a table of the distributed ``schema``."""
    return list(conn.execute(text(_SCHEMA_NODES), {"s": quote_ident(schema)}).scalars())


#: What Citus says (SQLSTATE XX000, no code of its own) when a leftover of an earlier,
#: cut-off move is still in use and could not be dropped before this move: it can be
#: dropped once whatever holds it lets go, so the move is worth trying again.
_LEFTOVER_IN_USE = "leftover from the previous move could not be cleaned up"


def leftover_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` is Citus refusing a move over an earlier move's leftover it could
    not drop yet (see :data:`_LEFTOVER_IN_USE`)."""
    cause = getattr(exc, "orig", None) or exc
    return _LEFTOVER_IN_USE in str(cause)


def move_schema(conn: Connection, schema: str, node_id: int, mode: str) -> None:
    """Move the distributed ``schema`` to node ``node_id`` through Citus' own move
    (``citus_schema_move``): ``conn`` is in autocommit, as a logical-replication move
    runs its own transactions. Leftovers of an earlier, interrupted move (recorded by
    Citus for cleanup) are removed first, so a killed move never blocks the next."""
    if mode not in TRANSFER_MODES:
        raise errors.InvalidInputError(f"transfer mode {mode!r} is not one of {', '.join(TRANSFER_MODES)}")
    conn.exec_driver_sql("CALL citus_cleanup_orphaned_resources()")
    conn.execute(text("SELECT citus_schema_move(CAST(CAST(:s AS text) AS regnamespace), :n,"
                      " CAST(:m AS citus.shard_transfer_mode))"), {"s": quote_ident(schema), "n": node_id, "m": mode})
