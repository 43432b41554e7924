"""The interface every dialect module implements, and what they share.

A leaf of the dialects package: the dialect modules import it, never the package
itself, so ``hermes_store.dialects`` can import them all at its top without a cycle.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable, Iterable, Mapping, Sequence

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from .. import errors
from ..keys import COMPRESSION_END_REASON
from .fts5 import Fts5Storage

#: Tables every migrated database has; missing one means "not migrated", not a bug.
OUR_TABLES = frozenset({"sessions", "messages", "state_meta", "schema_version", "session_model_usage"})
#: Message rows to insert, as runs of rows sharing one column set: (column names,
#: [values in that order, one tuple per row]); the runs are in input order.
MessageRuns = Sequence[tuple[tuple[str, ...], Sequence[tuple[Any, ...]]]]
#: Execution option ``SessionDB`` sets on a connection for a one-statement write: the
#: lock budget in milliseconds, which the statement then carries itself.
LOCK_BUDGET_OPTION = "hermes_store_lock_budget_ms"


@runtime_checkable
class Dialect(Protocol):
    """The per-dialect operations the repositories, facade and CLI rely on."""

    #: SQLAlchemy's dialect name this module serves ("sqlite", "postgresql"...).
    name: str
    #: SQLAlchemy driver names: the sync one our facade opens a URL with, and the
    #: asyncio ones ``hermes_store.aio`` accepts (the first is its default).
    sync_driver: str
    async_drivers: tuple[str, ...]
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
    #: Hermes' FTS5 tables (rebuild windows, legacy layouts, trash) where full-text
    #: search runs on them; None where the server keeps its own indexes complete.
    fts5: Fts5Storage | None
    #: The same tables, never None: where there are none, a storage that holds no table
    #: and sends no statement (:class:`~hermes_store.dialects.fts5.NoFts5Storage`).
    fts5_storage: Fts5Storage
    #: Whether the full-text index can miss rows: it is filled by triggers and chunked
    #: backfills (a rebuild window, a stale flag, Hermes v23 optimize-storage), so search
    #: checks for a gap and upkeep has bookkeeping to heal. False where the server keeps
    #: its indexes complete on every write.
    search_index_can_lag: bool
    #: Whether the processes that share the database run on this machine, so a lease
    #: holder's pid can be probed here (a file); False where they connect from anywhere.
    holders_on_this_machine: bool
    #: Whether the database lets one writer in at a time (SQLite's write lock), so
    #: writes of one process are best queued per database rather than left to contend.
    one_writer_at_a_time: bool
    #: The placeholder the driver's own cursors take (``?`` for sqlite3, ``%s`` for
    #: psycopg): for a statement run on a DB-API cursor a host hands us.
    driver_param_mark: str

    # -------------------------------------------------------------- engines and errors

    def database_path(self, url: URL) -> str | None:
        """The file on this machine ``url`` names (paths, modes, flock, adoption), None
        for a server, an in-memory database or a URL without a database."""

    def engine_kwargs(self, url: URL, kwargs: dict[str, Any], *, prepared_statements: bool) -> dict[str, Any]:
        """``create_engine`` keyword arguments for ``url``: the caller's, plus our defaults."""

    def configure_engine(self, engine: Engine, *, foreign_keys: bool, busy_timeout_ms: int) -> None:
        """Hooks a new engine of ours needs (per-connection setup, transaction handling)."""

    def translate_error(self, exc: BaseException, *, locks: bool = False) -> errors.HermesStoreError | None:
        """The typed error for one of this driver's errors, or None to keep it.

        A held lock (busy, lock timeout, deadlock) is kept unless ``locks``: the write
        loops retry the driver's error; a statement outside a transaction (VACUUM,
        PRAGMAs, checkpoints) asks for DatabaseLockedError, which :meth:`is_retryable`
        accepts."""

    def isolate_failure(self, conn: Connection) -> AbstractContextManager[Any]:
        """Around a statement whose failure the caller catches: keep the rest of the
        transaction usable (a SAVEPOINT where a failed statement aborts it)."""

    def join_driver_transaction(self, conn: Connection) -> None:
        """Make a caller's open transaction real at the driver, so our DDL joins it."""

    def install_batch_hooks(self, conn: Connection) -> bool:
        """Whether batch table rebuilds (and so the trigger/view keeper) apply here."""

    # -------------------------------------------------------------- locking and retries

    def begin_options(self, write: bool) -> dict[str, Any]:
        """Execution options that make ``begin()`` take the right lock for a reader/writer."""

    #: Whether index upkeep (short-CJK catch-up, index merges) runs on a worker thread
    #: of the store instead of after the caller's write: where writers run side by side
    #: (a server), one caller must not wait on housekeeping every other writer also tries.
    upkeep_in_background: bool

    def try_upkeep_lock(self, conn: Connection, purpose: str) -> bool:
        """In a write transaction: whether this transaction is the one doing ``purpose``'s
        upkeep now (held until it ends). False: another process is at it; skip."""

    def writers_in_progress(self, conn: Connection, table: str) -> list[str] | None:
        """The transactions that may be inserting into ``table`` now, or None where no
        other writer can run beside this write transaction (SQLite's write lock)."""

    def still_running(self, conn: Connection, writers: Sequence[str]) -> bool:
        """Whether any of the transactions :meth:`writers_in_progress` listed is still open."""

    def call_options(self, write: bool) -> dict[str, Any]:
        """Execution options of the connections ``SessionDB`` keeps for its calls.

        A read call is a few statements that need no transaction around them on a
        server (each READ COMMITTED statement has its own snapshot anyway), while a
        SQLite reader wants one snapshot for the whole call; a write call's transaction
        starts as :meth:`begin_write` says."""

    def one_statement_write(self, conn: Connection) -> bool:
        """Whether a write that is one statement (an append) runs on ``conn`` as that
        statement alone, committed by itself, with its lock budget inside it: one round
        trip instead of BEGIN, the statement and COMMIT. Where BEGIN costs nothing
        (SQLite), or where the budget would not reach the node that waits (Citus), False."""

    def never_ran(self, exc: BaseException) -> bool:
        """Whether a failed one-statement write certainly did not run: the server had
        ended the session before it arrived (a restart, an idle timeout), so sending it
        again on a new connection cannot write it twice."""

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether a failed transaction is worth retrying (lock held, serialization failure),
        the driver's error or a lock :meth:`translate_error` typed as DatabaseLockedError."""

    def on_connect(self, dbapi_conn: Any, *, label: str) -> str:
        """Per-connection setup a long-lived store wants; returns the journal mode in use."""

    def begin_write(self, conn: Connection, seconds: float) -> None:
        """In a ``SessionDB`` write transaction just begun (on a connection with
        :meth:`call_options`): start it at the server where that is still to do, and
        stop waiting for other writers' locks after ``seconds`` with an error
        :meth:`is_retryable` accepts (the caller's budget)."""

    # -------------------------------------------------------------- upserts

    def insert(self, table: Any) -> Any:
        """This dialect's ``insert(table)`` construct, which has ``on_conflict_do_update``
        / ``on_conflict_do_nothing`` and ``.excluded`` (SQLite 3.24+ and PostgreSQL share
        the syntax). ``table`` is a model table or a ``table()`` construct."""

    # -------------------------------------------------------------- message writes

    def append_message(self, conn: Connection, row: Mapping[str, Any], calls: int) -> int:
        """Insert one encoded message ``row`` and add 1 message and ``calls`` tool calls
        to its session's counters, in the caller's transaction; returns the new id.
        An unknown session raises UnknownSessionError with nothing written; driver
        failures come out typed."""

    def add_bigram_pairs(self, conn: Connection, table: str, pairs: Sequence[tuple[str, int]]) -> None:
        """Add short-CJK index pairs ``(gram, block)`` to ``table`` (qualified, quoted),
        skipping those already there: a catch-up adds thousands, so in one go (never a
        statement per pair through SQLAlchemy's per-row parameter processing)."""

    def bump_message_counts(self, conn: Connection, counts: Iterable[tuple[str, int, int]]) -> None:
        """Add ``(session id, messages, tool calls)`` to each session's counters."""

    def insert_messages(self, conn: Connection, runs: MessageRuns,
                        column_defaults: Callable[[], Mapping[str, str | None]]) -> None:
        """Insert encoded message rows (see :data:`MessageRuns`) so ids follow the input
        order; no counters are touched. ``column_defaults`` gives the declared
        defaults (SQL) of ``messages``' columns, asked only when a path needs them."""

    # -------------------------------------------------------------- search routes

    #: The operator of a substring test that ignores case (SQLite's LIKE folds ASCII
    #: letters; PostgreSQL's LIKE folds nothing, its ILIKE folds every letter).
    caseless_like: str
    #: Whether :attr:`caseless_like` folds letters beyond ASCII (search narrows it to
    #: ASCII folding where SQLite's answer must be matched).
    caseless_like_folds_non_ascii: bool
    #: Whether CJK queries are answered by substring over the messages (a trigram
    #: index of the server's serves LIKE) rather than by a trigram full-text index.
    cjk_by_substring: bool
    #: Written after ``messages AS m`` in a block-range read, to keep the planner on
    #: the id range ('' where the planner needs no hint).
    rowid_walk_hint: str

    def latin_in_cjk(self, conn: Connection, query: Any, words: Any, params: dict[str, Any],
                     object_sql: Callable[[str], str]) -> Any:
        """The SQL that finds a word query's 3+ character ASCII terms written inside CJK
        runs (:mod:`hermes_store.search.latin_in_cjk`), through the dialect's trigram
        index; None where there is none (the word index alone answers)."""

    def word_match(self, conn: Connection, match: str) -> tuple[Any, Any]:
        """For a sanitized FTS5 MATCH string: the ``:q`` value :meth:`match_sql` and
        :meth:`top_sql` take, and what a snippet cut in Python needs (a
        :class:`hermes_store.search.word_hits.WordQuery`), or None when the index
        cuts the snippets itself."""

    def cjk_sessions(self, conn: Connection, params: dict[str, Any], object_sql: Callable[[str], str],
                     candidates: Sequence[tuple[str, Any]] | None = None) -> str:
        """Conditions on ``sessions s`` (``" AND ..."``, or '') keeping the sessions
        the trigram index holds, any values bound into ``params``. ``object_sql``
        reads a schema object's stored definition (the caller caches it);
        ``candidates``: the ``(id, model_config)`` rows of possible sub-agent sessions,
        when the caller read them already (where the dialect decides those in Python)."""

    def has_table(self, conn: Connection, name: str) -> bool:
        """Whether the connection's schema has a table of that name."""

    @property
    def search(self) -> Any:
        """The search statement builders of this dialect, one per route (a
        :class:`hermes_store.dialects.search_base.SearchRoutes`)."""

    def delegated_sessions(self, conn: Connection, candidates: Sequence[tuple[str, Any]] | None = None) -> list[str]:
        """Where :meth:`cjk_sessions` leaves sub-agent sessions to Python (``cjk_by_substring``
        dialects): those among ``candidates`` (``(id, model_config)`` rows, read here
        when None)."""

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

    def interrupter(self, conn: Connection) -> Callable[[], bool]:
        """A call that stops the statement ``conn`` runs at that moment, from outside it
        (a cancelled task), so the rollback that follows need not wait for it to finish;
        it returns False where the driver does that itself when its task is cancelled."""

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

    def checkpoint_truncate(self, engine: Engine) -> None:
        """Fold the whole write-ahead log into the file and truncate it (before a
        VACUUM; best effort). Nothing to do where the server keeps its own log."""

    def logical_size_bytes(self, conn: Connection, schema: str | None, tables: Sequence[str]) -> int | None:
        """The store's size: a file's ``page_count × page_size``; on a server the on-disk
        size of ``tables`` in ``schema`` (indexes and TOAST included). None when unknown."""

    def integrity_check(self, conn: Connection, *, quick: bool, max_lines: int) -> list[str]:
        """The database's own integrity check (``["ok"]`` when sound, else up to
        ``max_lines`` problems); ``[]`` where the database has no such check."""

    def object_sizes(self, conn: Connection, schema: str | None,
                     tables: Sequence[str]) -> list[tuple[str, str, str, int]] | None:
        """``(name, 'table'|'index', table, bytes)`` of each table and index of ours,
        largest first; None where the database cannot say (a SQLite build without ``dbstat``)."""

    def text_bytes(self, expr: Any) -> Any:
        """A SQL expression: the UTF-8 size in bytes of the text ``expr`` (NULL for NULL),
        for retention's byte estimates (SQLite before 3.43 has no ``octet_length``)."""

    def space_details(self, conn: Connection, schema: str | None, tables: Sequence[str]) -> dict[str, Any]:
        """What ``hermes-store size`` adds to :meth:`object_sizes`, read-only: a file's
        ``page_size``, ``page_count``, ``freelist_pages`` and ``slack_bytes`` (unused bytes
        of partly filled pages), and per full-text index its
        ``fts_segments`` (``[(segment id, pages, bytes)]``); a server's ``rows`` per table
        (``(live, dead)``, the statistics collector's estimate) and
        ``table_bytes_include_indexes`` when a table's bytes there count its indexes too.
        Keys a database cannot answer are left out."""

    def export_reader(self, conn: Connection) -> Callable[[str, str, str], list[dict[str, Any]]] | None:
        """A reader of one session's rows straight from the driver, ``(table, session id,
        ORDER BY columns) -> rows as dicts``, where that is much cheaper than SQLAlchemy's
        per-statement result setup (SQLite, on a big export); None where the
        repositories' own reads serve as well."""

    def fts_search_available(self, conn: Connection) -> bool:
        """Full-text search can be served here."""

    def fts_trigram_available(self, conn: Connection) -> bool:
        """The index serving substring and CJK search is there and answers."""


def translate_python_error(exc: BaseException) -> errors.HermesStoreError | None:
    """The typed error for what Python raises while a driver binds a value (any driver):
    a lone surrogate, an int out of range. None for anything else."""
    if isinstance(exc, UnicodeEncodeError):
        return errors.InvalidInputError(
            "text with a lone surrogate (U+D800-U+DFFF) cannot be stored: "
            f"{exc.object[exc.start:exc.end]!r} at position {exc.start}"
        )
    if isinstance(exc, OverflowError):
        return errors.InvalidInputError(f"value out of range for SQLite: {exc}")
    return None


#: The end reason of a session closed by compression: no append may land in it (Hermes
#: v26 points writers at its live continuation instead).
CLOSED_BY_COMPRESSION = COMPRESSION_END_REASON


def refused_append(session_id: Any, row: Sequence[Any] | None) -> errors.HermesStoreError:
    """Why an append's guarded counter bump matched no row: the session is missing
    (``row`` None), or compression closed it. ``row`` is ``(end_reason,)`` from the one
    lookup made only then."""
    if row is not None and row[0] == CLOSED_BY_COMPRESSION:
        return errors.CompressionSessionClosedError(session_id)
    return errors.UnknownSessionError(f"unknown session {session_id!r}: no such session (FOREIGN KEY)")

