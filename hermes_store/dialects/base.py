"""The interface every dialect module implements, and what they share.

A leaf of the dialects package: the dialect modules import it, never the package
itself, so ``hermes_store.dialects`` can import them all at its top without a cycle.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, Sequence, runtime_checkable

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from .. import errors

#: Tables every migrated database has; missing one means "not migrated", not a bug.
OUR_TABLES = frozenset({"sessions", "messages", "state_meta", "schema_version", "session_model_usage"})


@runtime_checkable
class Dialect(Protocol):
    """The per-dialect operations the repositories, facade and CLI rely on."""

    #: SQLAlchemy's dialect name this module serves ("sqlite", "postgresql"...).
    name: str
    #: Whether one database holds several stores, one per tenant schema.
    has_schemas: bool
    #: Whether the database is one file on this machine (paths, modes, flock, adoption)
    #: rather than a server reached over a connection.
    is_file: bool
    #: Whether revisions 0001…0030 (Hermes' own SQLite history, step by step) apply; on
    #: other databases they are no-ops and one baseline revision builds the head schema.
    replays_hermes_history: bool
    #: Whether a non-INTEGER primary-key column may hold NULL (as Hermes' SQLite DDL
    #: says); a server makes key columns NOT NULL whatever the DDL says.
    keys_may_be_null: bool

    # -------------------------------------------------------------- engines and errors

    def engine_kwargs(self, url: URL, kwargs: dict[str, Any], *, prepared_statements: bool) -> dict[str, Any]:
        """``create_engine`` keyword arguments for ``url``: the caller's, plus our defaults."""

    def configure_engine(self, engine: Engine, *, foreign_keys: bool, busy_timeout_ms: int) -> None:
        """Hooks a new engine of ours needs (per-connection setup, transaction handling)."""

    def translate_error(self, exc: BaseException) -> "errors.HermesStoreError | None":
        """The typed error for one of this driver's errors, or None to keep it."""

    def isolate_failure(self, conn: Connection) -> "AbstractContextManager[Any]":
        """Around a statement whose failure the caller catches: keep the rest of the
        transaction usable (a SAVEPOINT where a failed statement aborts it)."""

    def join_driver_transaction(self, conn: Connection) -> None:
        """Make a caller's open transaction real at the driver, so our DDL joins it."""

    def install_batch_hooks(self, conn: Connection) -> bool:
        """Whether batch table rebuilds (and so the trigger/view keeper) apply here."""

    # -------------------------------------------------------------- locking and retries

    def begin_options(self, write: bool) -> dict[str, Any]:
        """Execution options that make ``begin()`` take the right lock for a reader/writer."""

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether a failed transaction is worth retrying (lock held, serialization failure)."""

    def on_connect(self, dbapi_conn: Any, *, label: str) -> str:
        """Per-connection setup a long-lived store wants; returns the journal mode in use."""

    def bound_lock_wait(self, conn: Connection, seconds: float) -> None:
        """In a write transaction just begun: stop waiting for other writers' locks after
        ``seconds`` with an error :meth:`is_retryable` accepts (the caller's budget)."""

    # -------------------------------------------------------------- upserts

    def insert(self, table: Any) -> Any:
        """This dialect's ``insert(table)`` construct, which has ``on_conflict_do_update``
        / ``on_conflict_do_nothing`` and ``.excluded`` (SQLite 3.24+ and PostgreSQL share
        the syntax). ``table`` is a model table or a ``table()`` construct."""

    def upsert_sql(self, table: str, names: Sequence[str], conflict: Sequence[str], updates: str | None) -> str:
        """INSERT of ``names`` (``:name`` binds); on a ``conflict`` clash run ``updates``
        (SQL using ``excluded.col``), or do nothing when ``updates`` is None."""

    # -------------------------------------------------------------- full-text search

    def fts_indexes(self, conn: Connection) -> list[str]:
        """The full-text indexes this database has."""

    def fts_command(self, conn: Connection, index: str, cmd: str) -> None:
        """Index upkeep: 'rebuild', 'optimize', 'merge' (bounded work, for periodic upkeep)
        or 'integrity-check' (raises when unhealthy)."""

    def match_sql(self, index: str) -> str:
        """Hits of ``:q`` in ``index`` with snippet and rank."""

    def top_sql(self, index: str) -> str:
        """The ``:window`` best-ranked hits of ``:q`` in ``index``, with snippets."""

    # -------------------------------------------------------------- maintenance

    def vacuum(self, engine: Engine) -> None:
        """Give free pages back to the filesystem (outside any transaction)."""

    def checkpoint(self, engine: Engine) -> None:
        """Fold the write-ahead log into the main file when nobody blocks it (best effort)."""

    def defer_foreign_keys(self, conn: Connection) -> None:
        """Check references at commit, not per statement (imports of children first)."""

    def ping(self, conn: Connection) -> None:
        """Round trip that proves the connection works."""

    def sync_identity(self, conn: Connection, table: str, column: str = "id", *, at_least: int = 0) -> None:
        """After inserts with explicit ids, make the next generated id follow them (and
        follow ``at_least``: ids another store handed out, so none is ever reused)."""

    def identity_high_water(self, conn: Connection, table: str, column: str = "id") -> int:
        """The highest id the table's counter ever handed out (0 when none): higher
        than every row's when the newest rows were deleted."""

    # -------------------------------------------------------------- introspection

    def table_info(self, conn: Connection, table: str) -> Sequence[tuple[str, bool, str | None]]:
        """(column name, NOT NULL, default SQL) of each column; empty when no such table."""

    def object_sql(self, conn: Connection, name: str) -> str:
        """Stored definition of a schema object ('' when absent or not kept by the dialect)."""

    def table_counts(self, conn: Connection) -> tuple[list[tuple[str, int]], list[str]]:
        """Plain tables with their row counts, and the full-text index names."""

    # FTS upkeep of Hermes v23 (rebuild windows, legacy layouts); no-ops on a server.
    def checkpoint_truncate(self, engine: Engine) -> None: ...
    def fts_tables(self, conn: Connection) -> dict[str, str]: ...
    def fts_table_exists(self, conn: Connection, name: str) -> bool: ...
    def fts_queryable(self, conn: Connection, name: str) -> bool: ...
    def fts_search_available(self, conn: Connection) -> bool: ...
    def fts_trigram_available(self, conn: Connection) -> bool: ...
    def fts_layout_is_legacy(self, conn: Connection) -> bool: ...
    def fts_backfill(self, conn: Connection, index: str, lo: int, hi: int, *, sweep: bool = False) -> int: ...
    def fts_rebuild_from_source(self, conn: Connection, index: str) -> None: ...
    def fts_trash_tables(self, conn: Connection) -> list[str]: ...
    def fts_trash_rows(self, conn: Connection) -> int: ...
    def fts_trash_delete(self, conn: Connection, name: str, rows: int) -> int: ...
    def fts_demote_legacy(self, conn: Connection) -> list[str]: ...


def on_conflict_upsert(table: str, names: Sequence[str], conflict: Sequence[str], updates: str | None) -> str:
    """``INSERT … ON CONFLICT`` in the syntax SQLite (3.24+) and PostgreSQL share.

    ``updates`` must qualify target columns (``table.col``): PostgreSQL sees
    ``excluded`` and the table at once.
    """
    target = f"({', '.join(conflict)})" if conflict else ""
    action = "DO NOTHING" if updates is None else f"DO UPDATE SET {updates}"
    return (
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)}) "
        f"ON CONFLICT{target} {action}"
    )
