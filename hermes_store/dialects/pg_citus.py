"""Citus (distributed PostgreSQL, schema-based sharding): what a tenant schema that Citus
distributes needs of us beyond plain PostgreSQL.

A distributed schema lives whole on one worker node; its tables are co-located
single-shard tables that Citus places and moves. Everything here is transaction-local
and written so that plain PostgreSQL, where the extension is absent, runs it as a no-op:
nothing of it is set on a host's session or left on a pooled server connection.
"""

from __future__ import annotations

from sqlalchemy import Connection

#: Transaction-local settings a migration run needs on a Citus coordinator (none on plain
#: PostgreSQL). ``citus.enable_unsafe_triggers``: Citus refuses triggers on distributed
#: tables unless told they are safe, and our revisions create them (the short-CJK index's
#: dirty marks, the display order). Ours are: each touches only its own tenant's tables,
#: which Citus keeps co-located on one node.
MIGRATION_SETTINGS = """DO $citus$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
END
$citus$"""


def migration_settings(conn: Connection) -> None:
    """:data:`MIGRATION_SETTINGS`, in ``conn``'s transaction (which must be the run's own)."""
    conn.exec_driver_sql(MIGRATION_SETTINGS)
