"""Alembic environment of hermes_store.

Written to run inside someone else's process: it never reconfigures logging when
called programmatically, keeps its own version table (``hermes_store_version``), and
ignores FTS5 virtual/shadow tables and views, which are created by raw SQL in the
revisions and are not part of our metadata.

On PostgreSQL DDL is transactional natively: the SQLite hooks (our BEGIN, the batch
trigger keeper) are not installed, batch mode is off, and the search objects of the
baseline revision (hs0002) are hidden from autogenerate like FTS5 tables are on SQLite.

Per-tenant schemas (PostgreSQL): ``-x schema=NAME``, ``?schema=NAME`` in the URL, or
``hermes_store.migrations.*(…, schema=NAME)`` run the revisions inside that schema.
The revisions are plain SQL with unqualified names, so the ``search_path`` is pointed
at the tenant (then at the schema of the shared ``pg_trgm``) for the run; the version
table lives in the tenant too. Other schemas are never read or written.

On PostgreSQL a whole run is ONE transaction: the advisory lock that serializes
migrations of one schema across processes, on Citus the settings a distributed schema
needs (``pg_tenants.citus_migration_settings``, transaction-local), the tenant's schema and the shared
extension, the transaction-local search path, every revision and the version table,
then COMMIT. Behind a transaction pooler nothing of it outlives that transaction (a
session lock or a session ``search_path`` would stay on a server connection the next
client gets, while our next statement ran on another). In a caller's transaction the
run is part of it, and the caller's search path is put back, locally, at the end.
"""

from __future__ import annotations

import logging
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection
from sqlalchemy import inspect as sa_inspect

from hermes_store.alembic_support import (
    foreign_names,
    keep_triggers_across_batch,
    make_include_name,
    other_version_tables,
    name_own_revision,
    quiet_reflection,
    revision_directives,
)
from hermes_store.dialects import pg_tenants as pg
from hermes_store.engine import create_engine, default_db_path, install_begin_hook, tenant_of, to_url
from hermes_store.keys import VERSION_TABLE
from hermes_store.models import metadata
from hermes_store.paths import CREATE_SCHEMA_ATTRIBUTE, SCHEMA_ATTRIBUTE

config = context.config
x_args = context.get_x_argument(as_dictionary=True)

# Only the alembic command line gets the ini's logging setup, and only when the
# process has none yet: a host application's logging is never touched.
if config.cmd_opts is not None and config.config_file_name and not logging.getLogger().handlers:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def resolve_url() -> str:
    """-x url=… > $HERMES_STORE_URL > sqlalchemy.url in the ini > $HERMES_HOME/state.db."""
    url = x_args.get("url") or os.environ.get("HERMES_STORE_URL") or config.get_main_option("sqlalchemy.url")
    return url or to_url(default_db_path()).render_as_string(hide_password=False)


version_table = x_args.get("version_table") or config.get_main_option("version_table") or VERSION_TABLE


def wanted_schema() -> str | None:
    """The tenant asked for by the caller (migrations.*) or on the command line (-x schema=)."""
    return config.attributes.get(SCHEMA_ATTRIBUTE) or x_args.get("schema")


def may_create_schema() -> bool:
    """Upgrade and stamp may create the tenant's schema; current, downgrade, check never do.

    hermes_store.migrations says which it runs; for ``alembic upgrade`` (the command line
    or ``alembic.command``), the command's per-revision callback tells.
    """
    if CREATE_SCHEMA_ATTRIBUTE in config.attributes:
        return bool(config.attributes[CREATE_SCHEMA_ATTRIBUTE])
    opts = getattr(getattr(context, "_proxy", None), "context_opts", None) or {}
    return getattr(opts.get("fn"), "__name__", "") in ("upgrade", "do_stamp")


def run_migrations_offline() -> None:
    url = resolve_url()
    schema = tenant_of(url, wanted_schema())
    context.configure(
        url=url,
        target_metadata=metadata,
        version_table=version_table,
        version_table_schema=schema,
        literal_binds=True,
        render_as_batch=to_url(url).get_backend_name() == "sqlite",
        process_revision_directives=name_own_revision,
        transactional_ddl=True,
        # A tenant's script is one BEGIN … COMMIT: its search path is SET LOCAL, which
        # must cover every revision (and must not outlive the script behind a pooler).
        transaction_per_migration=schema is None,
    )
    with context.begin_transaction():
        if schema is not None:
            for statement in pg.offline_tenant_prelude(schema):
                context.execute(statement)
        context.run_migrations()


def run_on(connection: Connection) -> None:
    schema = tenant_of(connection, wanted_schema())
    if connection.dialect.name != "postgresql":
        run_in_schema(connection, None)
        return
    if connection.in_transaction():
        run_postgresql(connection, schema, hosted=True)  # part of the caller's transaction
        return
    with connection.begin():  # ours: one transaction, committed here (rolled back on failure)
        run_postgresql(connection, schema, hosted=False)


def run_postgresql(connection: Connection, schema: str | None, *, hosted: bool) -> None:
    """Lock, schema, extension, search path and revisions, all in the current transaction.

    Processes opening one new store (a tenant, or the default schema) at once would all
    run the same revisions; the others wait at the lock, then Alembic, reading the
    version table after it, finds the store at head and runs nothing. A failed run is
    rolled back whole, lock and path included.
    """
    key = schema if schema is not None else pg.current_schema_name(connection)
    pg.migration_lock(connection, key)
    pg.citus_migration_settings(connection)  # nothing on plain PostgreSQL
    if schema is None:
        run_in_schema(connection, None)
        return
    dialect = connection.dialect
    default_schema = dialect.default_schema_name
    previous = pg.enter_schema_for_migration(connection, schema, create=may_create_schema())
    # Reflection (autogenerate, the FK targets it reports) reads the tenant as "the default".
    dialect.default_schema_name = schema
    try:
        run_in_schema(connection, schema)
    finally:
        dialect.default_schema_name = default_schema
    if hosted:
        # The rest of the caller's transaction runs with its own path again. (A failed
        # run skips this: the caller's rollback undoes the path with everything else.)
        pg.set_local_search_path(connection, previous)


def run_in_schema(connection: Connection, schema: str | None) -> None:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # SQLite DDL is transactional once a real BEGIN is sent; pysqlite never sends it
        # for DDL, so we hook SQLAlchemy's begin on this connection only.
        install_begin_hook(connection)
        # Batch rebuilds drop triggers and trip over views; restore both automatically.
        keep_triggers_across_batch(connection)
    was_in_transaction = connection.in_transaction()
    ignored = foreign_names(connection) if sqlite else set()
    # A host's own Alembic version table is not ours to compare (or drop).
    ignored |= other_version_tables(connection, version_table, skip=ignored)
    if schema is not None:
        # Along the search path autogenerate also sees tables of the shared
        # extensions' schema (public): none of them is this tenant's to compare.
        ignored |= set(sa_inspect(connection).get_table_names()) - pg.tenant_table_names(connection, schema)
    if connection.in_transaction() and not was_in_transaction:
        connection.commit()  # end only the read we just started, never a host's transaction
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=version_table,
        version_table_schema=schema,
        # Alembic assumes SQLite DDL is not transactional; with our BEGIN it is, and
        # each revision commits or rolls back as one unit. On PostgreSQL the run is
        # already inside one transaction (run_on), which Alembic then leaves alone.
        transactional_ddl=True,
        transaction_per_migration=True,
        # Autogenerate on SQLite must emit batch operations (ALTER is limited);
        # PostgreSQL has a full ALTER TABLE.
        render_as_batch=sqlite,
        include_name=make_include_name(ignored, version_table),
        compare_type=True,
        # `alembic revision` ids follow our namespace (hs0001...), never random hex;
        # the NULL-able keys of Hermes' DDL are not reported as changes (PostgreSQL).
        process_revision_directives=revision_directives,
    )
    # SQLite cannot reflect expression indexes, so autogenerate cannot compare Hermes'
    # idx_sessions_effective_activity (v27) and warns; the schema snapshot tests do compare it.
    with quiet_reflection(), context.begin_transaction():
        context.run_migrations()


def plain_revision_command() -> bool:
    """``alembic revision`` without ``--autogenerate`` (env.py runs for it only so the
    new revision gets an id of our namespace; see ``revision_environment`` in alembic.ini)."""
    opts = config.cmd_opts
    return opts is not None and hasattr(opts, "rev_id") and not getattr(opts, "autogenerate", False)


def run_migrations_online() -> None:
    if plain_revision_command():
        # Nothing is compared, so no real database is opened (none is created either).
        engine = create_engine("sqlite://")
        with engine.connect() as conn:
            context.configure(connection=conn, target_metadata=metadata, process_revision_directives=name_own_revision)
            with context.begin_transaction():
                context.run_migrations()
        engine.dispose()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    engine = create_engine(resolve_url(), foreign_keys=False, schema=x_args.get("schema"))
    try:
        with engine.connect() as conn:
            run_on(conn)
            if conn.in_transaction():
                conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
