"""Tenant placement on a Citus cluster: a tenant schema made a distributed schema, every
row kept (issue 33). The Citus statements are :mod:`hermes_store.dialects.pg_citus`'s;
this module checks, counts before and after, and reports.

On plain PostgreSQL (or SQLite) it says that Citus is needed and changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import URL

from .. import errors
from ..dialects import pg_citus
from ..engine import create_engine
from ..keys import VERSION_TABLE
from ..tenancy import check_schema, quote_ident

__all__ = ["TenantInfo", "TenantPlacement", "distribute_tenant", "list_tenants"]

_TABLES = ("SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = :s ORDER BY 1")
_SCHEMA_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = :s)"
#: The schemas holding a store of ours: those with our version table.
_STORES = ("SELECT table_schema FROM information_schema.tables WHERE table_name = :v AND table_type = 'BASE TABLE'"
           " ORDER BY 1")


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


def _rows(conn: Any, schema: str) -> dict[str, int]:
    q = quote_ident(schema)
    return {t: int(conn.exec_driver_sql(f"SELECT count(*) FROM {q}.{quote_ident(t)}").scalar() or 0)
            for t in conn.execute(text(_TABLES), {"s": schema}).scalars()}


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
            if not pg_citus.is_citus(conn):
                raise errors.UnsupportedDatabaseError(
                    "distributing a tenant needs Citus (a coordinator with the citus extension)")
            if not conn.execute(text(_SCHEMA_EXISTS), {"s": schema}).scalar():
                raise errors.NotFoundError(f"no tenant schema {schema!r} on this database")
            before = pg_citus.is_distributed(conn, schema)
            placement = TenantPlacement(schema, before, before, dry_run, _rows(conn, schema))
            if before or dry_run:
                return placement
            pg_citus.distribute_schema(conn, schema)
        with engine.connect() as conn:
            after = _rows(conn, schema)
            placement.distributed = pg_citus.is_distributed(conn, schema)
        if after != placement.rows or not placement.distributed:
            raise errors.HermesStoreError(
                f"tenant {schema!r} after distribution: rows {after} (before {placement.rows}),"
                f" distributed={placement.distributed}")
        return placement


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


def list_tenants(url: str | URL) -> list[TenantInfo]:
    """Every store of the PostgreSQL database at ``url`` (each schema holding our version
    table), with its placement where the database is a Citus coordinator (read once for
    all). Sessions and messages are counted exactly: one statement per store. Raises
    :class:`~hermes_store.errors.UnsupportedDatabaseError` on SQLite (one store, no tenants)."""
    with _server(url, "tenants are schemas of a PostgreSQL database") as engine, engine.connect() as conn:
        placed = pg_citus.placements(conn) if pg_citus.is_citus(conn) else {}
        found = []
        for schema in conn.execute(text(_STORES), {"v": VERSION_TABLE}).scalars():
            q = quote_ident(schema)
            sessions, messages = conn.exec_driver_sql(
                f"SELECT (SELECT count(*) FROM {q}.sessions), (SELECT count(*) FROM {q}.messages)").one()
            node, size = placed.get(schema, (None, None))
            found.append(TenantInfo(schema, schema in placed, node, size, int(sessions), int(messages)))
        return found
