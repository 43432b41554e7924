"""PostgreSQL tenant schemas: creating them, migrating them one at a time, finding them.

One tenant's tables, functions, triggers, search objects and Alembic version table
live in one schema. The tenant is named in each statement at run time (see
:mod:`hermes_store.tenant_schema`); what is here serves the migrations, whose frozen revision
SQL names objects without a schema and so runs with a transaction-local search path.

Nothing here outlives a transaction: behind a transaction pooler (PgBouncer in
transaction mode) a session setting or a session advisory lock stays on a server
connection that the next client gets, while our own next transaction runs elsewhere.
So the locks are ``pg_advisory_xact_lock`` and the search path is set with
``set_config(…, true)`` (``SET LOCAL``), both ended by the transaction's COMMIT or
ROLLBACK, which a killed holder's connection gets from the server too.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, text

from ..tenant_schema import qualified, quote_ident

# Names reaching these helpers were checked by hermes_store.tenant_schema.check_schema (plain
# identifiers); they are quoted all the same.

#: Extensions our revisions use, created once per database and shared by every tenant.
SHARED_EXTENSIONS = ("pg_trgm",)
#: Advisory lock class of our migrations (two int4 keys: this class and a schema hash).
_MIGRATION_LOCK_CLASS = 0x4853  # "HS"
#: Advisory lock class of other one-at-a-time jobs (a copy into a store), keyed by purpose and schema.
_PURPOSE_LOCK_CLASS = 0x4854


def _path_text(schemas: Sequence[str]) -> str:
    return ", ".join(quote_ident(s) for s in schemas)


def current_schema_name(conn: Connection) -> str:
    """Where unqualified new objects go ('' when no schema of the search path exists)."""
    return str(conn.exec_driver_sql("SELECT current_schema()").scalar() or "")


def search_path(conn: Connection) -> str:
    return str(conn.exec_driver_sql("SELECT current_setting('search_path')").scalar())


def set_local_search_path(conn: Connection, value: str) -> None:
    """Set (or put back) ``conn``'s search_path until its transaction ends (``SET LOCAL``).

    ``value`` as :func:`search_path` read it. Never for the session: through a pooler the
    session is someone else's next.
    """
    conn.execute(text("SELECT set_config('search_path', :v, true)"), {"v": value})


def _extension_schema(conn: Connection, name: str) -> str | None:
    return conn.execute(
        text("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = :e"),
        {"e": name},
    ).scalar()


def schema_exists(conn: Connection, schema: str) -> bool:
    return bool(conn.execute(text("SELECT 1 FROM pg_namespace WHERE nspname = :s"), {"s": schema}).scalar())


def ensure_shared_extensions(conn: Connection) -> None:
    """Create our extensions in ``public`` when the database has none of them yet.

    The revisions say ``CREATE EXTENSION IF NOT EXISTS``, which puts a missing one in
    the first schema of the search path: during a tenant's migration, the tenant's own
    schema, where other tenants could not use it and a ``DROP SCHEMA`` would take it
    away from them. Concurrent first migrations of two tenants are serialized by a
    transaction-level advisory lock (CREATE EXTENSION itself races).
    """
    for name in SHARED_EXTENSIONS:
        if _extension_schema(conn, name) is not None:
            continue
        conn.execute(text("SELECT pg_advisory_xact_lock(:c, 0)"), {"c": _MIGRATION_LOCK_CLASS})
        if _extension_schema(conn, name) is None:
            conn.exec_driver_sql(f"CREATE EXTENSION IF NOT EXISTS {quote_ident(name)} WITH SCHEMA public")


def try_transaction_lock(conn: Connection, purpose: str, schema: str) -> bool:
    """Take the advisory lock for ``purpose`` in ``schema`` unless someone holds it.

    Held until ``conn``'s current transaction ends: the caller keeps that transaction
    open (and so, through a pooler, its server connection) for as long as it needs the
    lock. A killed holder's connection closes and the server rolls it back, lock included.
    """
    return bool(conn.execute(text("SELECT pg_try_advisory_xact_lock(:c, hashtext(:k))"),
                             {"c": _PURPOSE_LOCK_CLASS, "k": f"{purpose}:{schema}"}).scalar())


def migration_lock(conn: Connection, schema: str) -> None:
    """Wait for, then hold until this transaction ends, the lock serializing migrations of ``schema``.

    Two processes opening the same new store (a tenant, or the default schema) at once
    would otherwise both run its revisions and one would fail half-way; the second now
    waits, then finds it at head. Taken in the transaction that runs the revisions, so
    it guards exactly them, and no failure or kill can leave it held.
    """
    conn.execute(text("SELECT pg_advisory_xact_lock(:c, hashtext(:s))"), {"c": _MIGRATION_LOCK_CLASS, "s": schema})


#: Transaction-local settings a migration run needs on a Citus coordinator (none on plain
#: PostgreSQL). ``citus.enable_unsafe_triggers``: Citus refuses triggers on distributed
#: tables unless told they are safe, and our revisions create them (the short-CJK index's
#: dirty marks, the display order). Ours are: each touches only its own tenant's tables,
#: which Citus keeps co-located on one node.
CITUS_MIGRATION_SETTINGS = """DO $citus$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
END
$citus$"""


def citus_migration_settings(conn: Connection) -> None:
    """:data:`CITUS_MIGRATION_SETTINGS`, in ``conn``'s transaction (which must be the run's own)."""
    conn.exec_driver_sql(CITUS_MIGRATION_SETTINGS)


def revision_in(conn: Connection, schema: str | None, version_table: str) -> str | None:
    """The revision recorded in ``schema``'s version table (None: no table, or empty).

    The table is named with its schema (``to_regclass`` of the qualified name), so the
    answer never depends on the connection's search_path; ``schema=None`` means the
    default schema, which is what the search path says. Never fails on a missing table,
    so it is safe inside a caller's transaction.
    """
    name = qualified(schema, version_table) if schema is not None else quote_ident(version_table)
    if conn.execute(text("SELECT to_regclass(:n)"), {"n": name}).scalar() is None:
        return None
    return conn.exec_driver_sql(f"SELECT version_num FROM {name}").scalar()


def enter_schema_for_migration(conn: Connection, schema: str, *, create: bool) -> str:
    """Point ``conn`` at tenant ``schema`` for our revisions, until its transaction ends;
    returns the search_path to put back (locally) afterwards.

    With ``create`` (upgrade, stamp) the schema and the shared extensions are made
    first, when missing (no DDL at all when they exist). The path is the tenant, then
    the schemas of the shared extensions: the revisions' raw SQL creates and finds
    everything in the tenant, ``current_schema()`` is the tenant, and ``gin_trgm_ops``
    resolves where ``pg_trgm`` lives. Call it inside the migration's transaction.
    """
    previous = search_path(conn)
    if create:
        if not schema_exists(conn, schema):
            conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
        ensure_shared_extensions(conn)
    path = [schema]
    for name in SHARED_EXTENSIONS:
        where = _extension_schema(conn, name)
        if where is not None and where not in path and where != "pg_catalog":
            path.append(where)
    set_local_search_path(conn, _path_text(path))
    return previous


def offline_tenant_prelude(schema: str) -> list[str]:
    """What :func:`enter_schema_for_migration` does, as SQL text for ``alembic upgrade --sql``
    (no connection to ask where the shared extensions already are: ``public`` is assumed).

    The script runs as one transaction and the path is ``SET LOCAL``: run through a
    pooler, it leaves nothing on the server connection. The Citus setting the online run
    makes comes first, as there (a no-op without Citus): a tenant that is a distributed
    schema takes our triggers only with it.
    """
    q = quote_ident(schema)
    return [
        CITUS_MIGRATION_SETTINGS,
        f"CREATE SCHEMA IF NOT EXISTS {q}",
        *(f"CREATE EXTENSION IF NOT EXISTS {quote_ident(e)} WITH SCHEMA public" for e in SHARED_EXTENSIONS),
        f"SET LOCAL search_path TO {q}, public",
    ]


def tenant_table_names(conn: Connection, schema: str) -> set[str]:
    """Plain tables of ``schema`` (what autogenerate may compare for a tenant)."""
    return set(
        conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema}
        ).scalars()
    )


#: What depends on the named tables (and their indexes) of a schema from outside them:
#: a foreign key of another table, a view, a rule, a policy, a function with a SQL
#: body... A DROP TABLE of ours fails on each (2BP01). Constraints and views are named
#: as a person writes them; anything else as the server describes it.
_HOST_DEPENDENTS = text(
    "WITH named AS (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    "  WHERE n.nspname = COALESCE(CAST(:schema AS text), current_schema())"
    " AND c.relname = ANY(CAST(:names AS text[]))),"
    " ours AS (SELECT oid FROM named UNION SELECT i.indexrelid FROM pg_index i"
    " WHERE i.indrelid IN (SELECT oid FROM named)),"
    " deps AS (SELECT d.classid, d.objid, d.objsubid, CASE d.classid"
    "   WHEN CAST('pg_constraint' AS regclass) THEN (SELECT conrelid FROM pg_constraint WHERE oid = d.objid)"
    "   WHEN CAST('pg_rewrite' AS regclass) THEN (SELECT ev_class FROM pg_rewrite WHERE oid = d.objid)"
    "   WHEN CAST('pg_trigger' AS regclass) THEN (SELECT tgrelid FROM pg_trigger WHERE oid = d.objid)"
    "   WHEN CAST('pg_attrdef' AS regclass) THEN (SELECT adrelid FROM pg_attrdef WHERE oid = d.objid)"
    "   WHEN CAST('pg_policy' AS regclass) THEN (SELECT polrelid FROM pg_policy WHERE oid = d.objid)"
    "   WHEN CAST('pg_class' AS regclass) THEN d.objid END AS owner"
    "  FROM pg_depend d WHERE d.refclassid = CAST('pg_class' AS regclass) AND d.deptype = 'n'"
    "   AND d.refobjid IN (SELECT oid FROM ours))"
    " SELECT DISTINCT CASE"
    "   WHEN classid = CAST('pg_rewrite' AS regclass) THEN CASE (SELECT relkind FROM pg_class WHERE oid = owner)"
    "     WHEN 'm' THEN 'materialized view ' ELSE 'view ' END || CAST(CAST(owner AS regclass) AS text)"
    "   WHEN classid = CAST('pg_constraint' AS regclass) THEN 'constraint '"
    "     || (SELECT quote_ident(conname) FROM pg_constraint WHERE oid = objid)"
    "     || ' on table ' || CAST(CAST(owner AS regclass) AS text)"
    "   ELSE pg_describe_object(classid, objid, objsubid) END AS what"
    " FROM deps WHERE owner IS NULL OR owner NOT IN (SELECT oid FROM ours) ORDER BY 1"
)


def host_dependents(conn: Connection, schema: str | None, tables: Sequence[str]) -> list[str]:
    """The objects outside ``tables`` (of ``schema``, else the default schema) that keep
    them from being dropped, as the server names them: ``constraint host_notes_sid_fkey
    on table host_notes``, ``view host_view``…; empty when nothing does."""
    return list(conn.execute(_HOST_DEPENDENTS, {"schema": schema, "names": list(tables)}).scalars())
