"""PostgreSQL (psycopg 3): a server shared by many processes and hosts.

What differs from SQLite: no BEGIN IMMEDIATE (row locks and MVCC; writers wait on the
rows they touch, for at most the caller's budget: ``lock_timeout``), retries on
serialization failures and deadlocks (SQLSTATE 40001/40P01), VACUUM ANALYZE instead of
VACUUM, REINDEX and GIN pending-list merges instead of FTS5's rebuild and optimize, no
WAL checkpoint of ours, the catalogs instead of PRAGMAs, and text that cannot hold U+0000 (see
:mod:`hermes_store.codec`, "NUL on PostgreSQL": the adapters installed by
:func:`install_nul_adapters` make that invisible to callers).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.exc import DBAPIError

from .. import errors
from ..codec import pg_decode_nul, pg_encode_nul
from . import on_conflict_upsert

#: serialization_failure, deadlock_detected, lock_not_available: worth another try.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
#: Columns the search step adds to ``messages`` (not in the models, never returned).
HIDDEN_COLUMNS = frozenset({"search_vector"})


def _sqlstate(exc: BaseException) -> str | None:
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return getattr(orig, "sqlstate", None)


def install_nul_adapters(dbapi_conn: Any) -> None:
    """Make this psycopg connection encode U+0000 on the way in and decode it on the way out.

    Applied to every ``str`` parameter and every text/varchar result, so content, JSON
    columns, titles and query strings all use the same reversible mapping (see
    :func:`hermes_store.codec.pg_encode_nul`); a search term is encoded like the stored
    text it must match.
    """
    adapters = getattr(dbapi_conn, "adapters", None)
    if adapters is None or getattr(dbapi_conn, "_hermes_store_nul", False):
        return
    from psycopg.types.string import StrDumperUnknown, TextLoader

    # The pure-Python classes (the C ones cannot be subclassed); only strings that hold
    # U+0000/U+E000/U+E001 are changed, everything else passes through as before.
    class NulDumper(StrDumperUnknown):  # type: ignore[misc,valid-type]
        def dump(self, obj: str) -> Any:
            return super().dump(pg_encode_nul(obj))

    class NulLoader(TextLoader):  # type: ignore[misc,valid-type]
        def load(self, data: Any) -> Any:
            return pg_decode_nul(super().load(data))

    adapters.register_dumper(str, NulDumper)
    for type_name in ("text", "varchar", "bpchar", "name"):
        adapters.register_loader(type_name, NulLoader)
    # The default loader of unknown types (e.g. string literals) decodes to str too.
    try:
        dbapi_conn._hermes_store_nul = True
    except AttributeError:
        pass


# ------------------------------------------------------------------ tenant schemas
#
# One tenant's tables, functions, triggers, search objects and Alembic version table
# live in one schema (see hermes_store.engine.bind_schema). Names reaching these helpers
# were checked by hermes_store.engine.check_schema (plain identifiers); they are quoted
# all the same.

#: Extensions our revisions use, created once per database and shared by every tenant.
SHARED_EXTENSIONS = ("pg_trgm",)
#: Advisory lock class of our migrations (two int4 keys: this class and a schema hash).
_MIGRATION_LOCK_CLASS = 0x4853  # "HS"
#: Advisory lock class of other one-at-a-time jobs (a copy into a store), keyed by purpose and schema.
_PURPOSE_LOCK_CLASS = 0x4854


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _path_text(schemas: Sequence[str]) -> str:
    return ", ".join(quote_ident(s) for s in schemas)


def set_session_search_path(dbapi_conn: Any, schemas: Sequence[str]) -> None:
    """``search_path`` of a new DB-API connection, committed so the pool's reset keeps it."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"SET search_path TO {_path_text(schemas)}")
    finally:
        cur.close()
    dbapi_conn.commit()


def enter_schema_for_transaction(conn: Connection, schema: str) -> None:
    """Work in ``schema`` until the current transaction ends (``SET LOCAL``).

    For a unit of work on an engine that is not bound to a tenant: the connection goes
    back to the pool with its own search_path, whatever happens inside.
    """
    conn.exec_driver_sql(f"SET LOCAL search_path TO {quote_ident(schema)}")


def current_schema_name(conn: Connection) -> str:
    """Where unqualified new objects go ('' when no schema of the search path exists)."""
    return str(conn.exec_driver_sql("SELECT current_schema()").scalar() or "")


def search_path(conn: Connection) -> str:
    return str(conn.exec_driver_sql("SELECT current_setting('search_path')").scalar())


def set_search_path(conn: Connection, value: str) -> None:
    """Set (or put back) a connection's search_path for the session, as ``search_path`` read it."""
    conn.execute(text("SELECT set_config('search_path', :v, false)"), {"v": value})


def _extension_schema(conn: Connection, name: str) -> str | None:
    return conn.execute(
        text("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = :e"),
        {"e": name},
    ).scalar()


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


def try_session_lock(conn: Connection, purpose: str, schema: str) -> bool:
    """Take the session-level advisory lock for ``purpose`` in ``schema`` unless someone holds it.

    Held by the connection until :func:`release_session_lock` or until the session ends:
    the server drops it when a holder's connection closes or its process dies.
    """
    return bool(conn.execute(text("SELECT pg_try_advisory_lock(:c, hashtext(:k))"),
                             {"c": _PURPOSE_LOCK_CLASS, "k": f"{purpose}:{schema}"}).scalar())


def release_session_lock(conn: Connection, purpose: str, schema: str) -> None:
    conn.execute(text("SELECT pg_advisory_unlock(:c, hashtext(:k))"),
                 {"c": _PURPOSE_LOCK_CLASS, "k": f"{purpose}:{schema}"})


def migration_lock(conn: Connection, schema: str, *, held: bool, transaction: bool = False) -> None:
    """Take (``held=True``) or release the lock serializing migrations of ``schema``.

    Two processes opening the same new store (a tenant, or the default schema) at once
    would otherwise both run its revisions and one would fail half-way; the second now
    waits, then finds it at head. ``transaction``: a lock that ends with the current
    transaction (for a caller's transaction; never released here).
    """
    if transaction:
        fn = "pg_advisory_xact_lock"
        if not held:
            return
    else:
        fn = "pg_advisory_lock" if held else "pg_advisory_unlock"
    conn.execute(text(f"SELECT {fn}(:c, hashtext(:s))"), {"c": _MIGRATION_LOCK_CLASS, "s": schema})


def enter_schema_for_migration(conn: Connection, schema: str, *, create: bool) -> str:
    """Point ``conn`` at tenant ``schema`` for our revisions; returns the search_path to restore.

    With ``create`` (upgrade, stamp) the schema and the shared extensions are made
    first. The path is the tenant, then the schemas of the shared extensions: the
    revisions' raw SQL creates and finds everything in the tenant, ``current_schema()``
    is the tenant, and ``gin_trgm_ops`` resolves where ``pg_trgm`` lives.
    """
    previous = search_path(conn)
    if create:
        conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
        ensure_shared_extensions(conn)
    path = [schema]
    for name in SHARED_EXTENSIONS:
        where = _extension_schema(conn, name)
        if where is not None and where not in path and where != "pg_catalog":
            path.append(where)
    set_search_path(conn, _path_text(path))
    return previous


def offline_tenant_prelude(schema: str) -> list[str]:
    """What :func:`enter_schema_for_migration` does, as SQL text for ``alembic upgrade --sql``
    (no connection to ask where the shared extensions already are: ``public`` is assumed)."""
    q = quote_ident(schema)
    return [
        f"CREATE SCHEMA IF NOT EXISTS {q}",
        *(f"CREATE EXTENSION IF NOT EXISTS {quote_ident(e)} WITH SCHEMA public" for e in SHARED_EXTENSIONS),
        f"SET search_path TO {q}, public",
    ]


def tenant_table_names(conn: Connection, schema: str) -> set[str]:
    """Plain tables of ``schema`` (what autogenerate may compare for a tenant)."""
    return set(
        conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema}
        ).scalars()
    )


class PostgreSQLDialect:
    """The :class:`hermes_store.dialects.Dialect` of PostgreSQL servers."""

    name = "postgresql"

    # -------------------------------------------------------------- locking and retries

    def begin_options(self, write: bool) -> dict[str, Any]:
        # READ COMMITTED and row locks: counters are updated in SQL (x = x + n), so no
        # table lock is needed up front.
        return {}

    def is_retryable(self, exc: BaseException) -> bool:
        return _sqlstate(exc) in RETRYABLE_SQLSTATES

    def bound_lock_wait(self, conn: Connection, seconds: float) -> None:
        """A writer waits in the server's (fair) lock queue, but not past the budget.

        Without it a write behind a transaction left open elsewhere (an idle session
        holding a row lock) would hang forever; with it the wait ends in
        lock_not_available (55P03), which the facade turns into DatabaseLockedError.
        Transaction-local, so nothing leaks to the connection's next user.
        """
        ms = max(1, math.ceil(seconds * 1000))
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")

    def on_connect(self, dbapi_conn: Any, *, label: str) -> str:
        install_nul_adapters(dbapi_conn)
        return "wal"  # the server's own write-ahead log; nothing to set per connection

    # -------------------------------------------------------------- upserts

    upsert_sql = staticmethod(on_conflict_upsert)

    # -------------------------------------------------------------- full-text search

    def fts_indexes(self, conn: Connection) -> list[str]:
        """The GIN indexes search uses (word and trigram) that this database has.

        The server keeps them in step with every write (the tsvector column is
        generated), so upkeep here is about their physical state, not their content.
        """
        from ..alembic_support import PG_SEARCH_INDEXES

        rows = conn.execute(
            text(
                "SELECT c.relname FROM pg_class c WHERE c.relkind = 'i' AND c.relname IN :names"
                " AND c.relnamespace = current_schema()::regnamespace ORDER BY c.relname"
            ).bindparams(bindparam("names", expanding=True)),
            {"names": sorted(PG_SEARCH_INDEXES)},
        )
        return [r[0] for r in rows]

    def fts_command(self, conn: Connection, index: str, cmd: str) -> None:
        """FTS5's upkeep commands, done the PostgreSQL way.

        'rebuild' re-creates the index from the table (REINDEX: the cure for a damaged
        or bloated index); 'optimize' and 'merge' (FTS5's full and bounded segment
        merges) merge the GIN pending list into the index proper, cheap and without
        blocking writers for long;
        'integrity-check' raises when the index is missing or left invalid or unready
        (e.g. by an interrupted CREATE/REINDEX ... CONCURRENTLY), which REINDEX repairs.
        """
        if cmd == "rebuild":
            conn.exec_driver_sql(f'REINDEX INDEX "{index}"')
        elif cmd in ("optimize", "merge"):
            conn.execute(text("SELECT gin_clean_pending_list(CAST(:i AS regclass))"), {"i": f'"{index}"'})
        elif cmd == "integrity-check":
            row = conn.execute(
                text(
                    "SELECT i.indisvalid AND i.indisready AND i.indislive FROM pg_index i"
                    " JOIN pg_class c ON c.oid = i.indexrelid"
                    " WHERE c.relname = :i AND c.relnamespace = current_schema()::regnamespace"
                ),
                {"i": index},
            ).first()
            if row is None:
                raise errors.HermesStoreError(f"search index {index} is missing")
            if not row[0]:
                raise errors.HermesStoreError(f"search index {index} is invalid (an interrupted build?); rebuild it")
        else:
            raise errors.InvalidInputError(f"unknown search index command {cmd!r}")

    def match_sql(self, index: str) -> str:
        from ..search import postgresql as pg_search

        return pg_search.match_sql(index)

    def top_sql(self, index: str) -> str:
        from ..search import postgresql as pg_search

        return pg_search.top_sql(index)

    # -------------------------------------------------------------- maintenance

    def vacuum(self, engine: Engine) -> None:
        """The whole database; a tenant's engine vacuums its own schema's tables only,
        so one tenant's maintenance never works through (or waits on) another's."""
        from ..engine import schema_of

        tenant = schema_of(engine)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if tenant is None:
                conn.exec_driver_sql("VACUUM ANALYZE")
                return
            tables = sorted(tenant_table_names(conn, tenant))
            if tables:
                listed = ", ".join(f"{quote_ident(tenant)}.{quote_ident(t)}" for t in tables)
                conn.exec_driver_sql(f"VACUUM ANALYZE {listed}")

    def checkpoint(self, engine: Engine) -> None:
        return None  # the server checkpoints on its own

    def checkpoint_truncate(self, engine: Engine) -> None:
        return None  # no WAL file of ours to truncate: the server manages its own

    # -------------------------------------------------------------- FTS5 storage upkeep
    #
    # Hermes' optimize-storage machinery is about SQLite FTS5 tables. Here search runs
    # on GIN indexes the server keeps complete on every write: there is no FTS5 table,
    # no rebuild window to backfill, no pre-v23 layout and no trash to tear down.

    def fts_tables(self, conn: Connection) -> dict[str, str]:
        return {}

    def fts_table_exists(self, conn: Connection, name: str) -> bool:
        return False

    def fts_queryable(self, conn: Connection, name: str) -> bool:
        return False

    def fts_search_available(self, conn: Connection) -> bool:
        return True  # the tsvector column is always there; its index only makes it fast

    def fts_trigram_available(self, conn: Connection) -> bool:
        """The pg_trgm index that serves substring and CJK search exists."""
        from ..alembic_support import PG_SEARCH_INDEXES

        trigram = sorted(i for i in PG_SEARCH_INDEXES if "trgm" in i)
        return any(name in trigram for name in self.fts_indexes(conn))

    def fts_layout_is_legacy(self, conn: Connection) -> bool:
        return False

    def fts_backfill(self, conn: Connection, index: str, lo: int, hi: int, *, sweep: bool = False) -> int:
        return 0

    def fts_rebuild_from_source(self, conn: Connection, index: str) -> None:
        self.fts_command(conn, index, "rebuild")

    def fts_trash_tables(self, conn: Connection) -> list[str]:
        return []

    def fts_trash_rows(self, conn: Connection) -> int:
        return 0

    def fts_trash_delete(self, conn: Connection, name: str, rows: int) -> int:
        return 0

    def fts_demote_legacy(self, conn: Connection) -> list[str]:
        return []

    def defer_foreign_keys(self, conn: Connection) -> None:
        conn.exec_driver_sql("SET CONSTRAINTS ALL DEFERRED")

    def ping(self, conn: Connection) -> None:
        conn.exec_driver_sql("SELECT 1")

    def sync_identity(self, conn: Connection, table: str, column: str = "id", *, at_least: int = 0) -> None:
        """After rows were inserted with explicit ids, move the identity past them (and
        past ``at_least``); never backwards, so ids handed out before stay retired."""
        conn.execute(
            text(
                f"SELECT setval(pg_get_serial_sequence(:t, :c), "
                f"GREATEST((SELECT COALESCE(max({column}), 0) FROM {table}), :n, 1, "
                f"COALESCE(pg_sequence_last_value(pg_get_serial_sequence(:t, :c)::regclass), 0)), "
                f"(SELECT max({column}) IS NOT NULL FROM {table}) OR :n > 0"
                f" OR pg_sequence_last_value(pg_get_serial_sequence(:t, :c)::regclass) IS NOT NULL)"
            ),
            {"t": table, "c": column, "n": int(at_least)},
        )

    def identity_high_water(self, conn: Connection, table: str, column: str = "id") -> int:
        largest = conn.exec_driver_sql(f"SELECT COALESCE(max({column}), 0) FROM {table}").scalar() or 0
        # NULL until the sequence handed out its first value, or when this role may read
        # the tables but not the sequence (a reporting role): then the largest id.
        seq = conn.execute(
            text(
                "SELECT CASE WHEN has_sequence_privilege(s, 'SELECT, USAGE') THEN pg_sequence_last_value(s) END"
                " FROM CAST(pg_get_serial_sequence(:t, :c) AS regclass) AS s"
            ),
            {"t": table, "c": column},
        ).scalar()
        return max(int(largest), int(seq or 0))

    # -------------------------------------------------------------- introspection

    def table_info(self, conn: Connection, table: str) -> Sequence[tuple[str, bool, str | None]]:
        rows = conn.execute(
            text(
                "SELECT column_name, is_nullable = 'NO', column_default FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = :t ORDER BY ordinal_position"
            ),
            {"t": table},
        ).fetchall()
        return [(r[0], bool(r[1]), r[2]) for r in rows if r[0] not in HIDDEN_COLUMNS]

    def object_sql(self, conn: Connection, name: str) -> str:
        row = conn.execute(
            text(
                "SELECT pg_get_viewdef(c.oid) FROM pg_class c WHERE c.relname = :n AND c.relkind IN ('v', 'm')"
                " AND c.relnamespace = current_schema()::regnamespace"
            ),
            {"n": name},
        ).first()
        return (row[0] or "") if row else ""

    def table_counts(self, conn: Connection) -> tuple[list[tuple[str, int]], list[str]]:
        names = [
            r[0]
            for r in conn.execute(
                text(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
                    " AND table_type = 'BASE TABLE' ORDER BY table_name"
                )
            )
        ]
        plain = [(n, int(conn.exec_driver_sql(f'SELECT count(*) FROM "{n}"').scalar() or 0)) for n in names]
        return plain, []


DIALECT = PostgreSQLDialect()
