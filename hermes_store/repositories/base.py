"""What every repository shares: it borrows the caller's Session or Connection.

Repositories never commit or roll back; the caller (or :class:`UnitOfWork`) owns the
transaction. Statements are Core/text SQL on a Connection so the same repository
serves an ORM Session, a plain Connection, or a fake in tests. Upserts are Core too:
the dialect's own ``insert`` construct (:meth:`Dialect.insert`) with
``on_conflict_do_update`` / ``on_conflict_do_nothing``, built once per dialect
(:func:`per_dialect`).
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Generic, TypeVar
from collections.abc import Callable, Hashable, Iterable, Sequence

from sqlalchemy import Connection, Engine, bindparam, column, insert, literal, select, table, text
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.expression import TableClause

from .. import errors
from ..dialects import Dialect, for_connection
from ..models import Base
from ..targets import refuse_async
from ..tenant_schema import SCHEMA_OPTION, render, schema_of_connection

Executor = OrmSession | Connection

#: The models' tables: portable statements are built from these, not from f-strings.
SESSIONS = Base.metadata.tables["sessions"]
MESSAGES = Base.metadata.tables["messages"]

#: Per engine, then per (tenant schema, object name): a tenant's engine and a plain one
#: can share an Engine object (UnitOfWork(engine, schema=...)), so the schema is part of
#: every key. Only answers that found the object are kept (see _table_info).
_SCHEMA_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[str | None, str], frozenset[str]]] = \
    weakref.WeakKeyDictionary()
_OBJECT_SQL_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[str | None, str], str]] = weakref.WeakKeyDictionary()
_INFO_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[str | None, str], Any]] = weakref.WeakKeyDictionary()
#: Per SQLAlchemy dialect instance (one per engine; its driver fixes the parameter
#: style), then per (table, schema, columns): compiled INSERTs for the DB-API cursor.
_INSERTS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[str, tuple[str, ...]]]] = \
    weakref.WeakKeyDictionary()
#: Raw statements rendered per schema (``{table}`` placeholders → qualified names).
#: Bounded: search assembles statements whose text depends on the query's shape.
_RENDERED: dict[tuple[str, str | None], TextClause] = {}
_MAX_RENDERED = 2048
#: Ids per IN (...) list: well under SQLite's oldest bound-parameter limit (999).
ID_CHUNK = 500


UnknownFieldError = errors.UnknownFieldError  # re-exported: repositories raise it
T = TypeVar("T")
R = TypeVar("R", bound="Repository")


class per_dialect(Generic[T]):
    """A statement built once per dialect (and per extra key), then reused.

    Decorate ``build(dialect, *key) -> statement``; call the result with a Connection
    (or a :class:`Dialect`) and the same ``*key`` (hashable: column names, flags...).
    Upserts need this: each dialect's ``insert`` construct compiles only for it.
    Values always travel as bind parameters, never in the statement.
    """

    #: Distinct keys kept per builder before the cache starts over (column sets vary
    #: with what callers pass; a few dozen is normal).
    LIMIT = 512

    def __init__(self, build: Callable[..., T]) -> None:
        self.build = build
        self.built: dict[tuple[Any, ...], T] = {}
        self.__doc__ = build.__doc__

    def __call__(self, target: Connection | Engine | Dialect, *key: Hashable) -> T:
        dialect = for_connection(target) if isinstance(target, (Connection, Engine)) else target
        full = (dialect, *key)
        found = self.built.get(full)
        if found is None:
            if len(self.built) >= self.LIMIT:
                self.built.clear()
            found = self.built[full] = self.build(dialect, *key)
        return found


#: Where :func:`table_of` finds a table: the models' metadata (``schema_translate_map``
#: names the tenant schema), or else a ``table()`` construct in the schema the key holds.
IN_MODELS = "<models>"
#: (table name, column names, schema or IN_MODELS): a hashable stand-in for a table.
TableKey = tuple[str, tuple[str, ...], str | None]


def table_key(conn: Connection, table_name: str, names: Iterable[str]) -> TableKey:
    """The model's table when it has every one of ``names`` (and they include every
    column the model would fill with a Python-side default: an INSERT of the model's
    table adds those, and the database at hand may lack them); else a ``table()`` of
    those columns in ``conn``'s tenant schema (``schema_translate_map`` does not
    rewrite those)."""
    names = tuple(names)
    model = Base.metadata.tables.get(table_name)
    if model is not None and all(n in model.c for n in names) \
            and all(c.name in names for c in model.c if c.default is not None):
        return (table_name, (), IN_MODELS)
    return (table_name, names, schema_of_connection(conn))


def table_of(key: TableKey) -> TableClause:
    name, names, schema = key
    if schema == IN_MODELS:
        return Base.metadata.tables[name]
    return table(name, *(column(n) for n in names), schema=schema)


@per_dialect
def _insert_or_skip(dialect: Dialect, key: TableKey, conflict: tuple[str, ...]) -> Any:
    stmt = dialect.insert(table_of(key)).on_conflict_do_nothing(index_elements=list(conflict) or None)
    return stmt.execution_options(preserve_rowcount=True)  # callers ask whether the row went in


def insert_or_skip(conn: Connection, table_name: str, names: Iterable[str], conflict: Sequence[str] = ()) -> Any:
    """``INSERT … ON CONFLICT [(conflict)] DO NOTHING`` into ``table_name``, the values
    given as bind parameters named after the columns (``names``: the columns they fill).
    No ``conflict``: a clash on any unique key skips the row."""
    return _insert_or_skip(conn, table_key(conn, table_name, names), tuple(conflict))

def as_connection(executor: Executor) -> Connection:
    """The Connection behind an ORM Session (joined to its transaction), or itself."""
    if isinstance(executor, OrmSession):
        return executor.connection()
    refuse_async(executor, "repositories")
    return executor


#: Execution option carrying the clock repositories stamp rows with (``() -> epoch
#: seconds``): set by whoever owns the connection (``UnitOfWork(clock=...)``, SessionDB
#: on its engine), so the core never reads another layer's globals for the time.
CLOCK_OPTION = "hermes_store_clock"
Clock = Callable[[], float]


def wall_clock() -> float:
    """The default clock: this module's ``time.time()``, Hermes' timestamp format."""
    return time.time()


def clock_of(conn: Connection) -> Clock:
    """The clock attached to ``conn`` (its own, or its engine's), else :func:`wall_clock`."""
    found: Clock | None = conn.get_execution_options().get(CLOCK_OPTION)
    return wall_clock if found is None else found


def clock_options(clock: Clock) -> dict[str, Clock]:
    """Execution options attaching ``clock`` to an engine or connection (see :data:`CLOCK_OPTION`)."""
    return {CLOCK_OPTION: clock}


def now(conn: Connection) -> float:
    """Unix epoch seconds as a float, by ``conn``'s clock (:func:`clock_of`)."""
    return clock_of(conn)()


def schema_text(conn: Connection, template: str) -> TextClause:
    """``template`` (objects written ``{messages}``, literal braces doubled) as a
    statement naming ``conn``'s tenant schema; bare names when it has none (SQLite, the
    default schema). Rendered once per text and schema."""
    key = (template, schema_of_connection(conn))
    found = _RENDERED.get(key)
    if found is None:
        if len(_RENDERED) >= _MAX_RENDERED:
            _RENDERED.clear()
        found = _RENDERED[key] = text(render(template, key[1]))
    return found


def cached_columns(engine: Any, table_name: str) -> frozenset[str] | None:
    """A table's columns as :meth:`Repository.columns_of` read them already for
    ``engine`` (in its tenant schema); None when they were not read yet. Lets a caller
    encode rows before it has a connection (an append, outside the writer's turn)."""
    per_engine = _SCHEMA_CACHE.get(engine)
    if per_engine is None:
        return None
    return per_engine.get((engine.get_execution_options().get(SCHEMA_OPTION), table_name))


class Repository:
    """Base class: holds the connection and offers tiny query helpers.

    The helpers take raw SQL written with ``{table}`` placeholders (literal braces
    doubled): each table is rendered in the connection's tenant schema, so a statement
    never depends on the server connection's ``search_path`` (a pooler hands those out
    to anyone).
    """

    def __init__(self, executor: Executor, *, clock: Clock | None = None) -> None:
        """``clock``: what :meth:`now` reads; None: the one attached to the connection
        (:func:`clock_of`: ``UnitOfWork(clock=...)``, SessionDB's), else ``time.time``."""
        self.conn = as_connection(executor)
        self._clock = clock

    def now(self) -> float:
        """Epoch seconds for the rows this repository stamps, by its clock."""
        clock = self._clock
        return (clock_of(self.conn) if clock is None else clock)()

    def _peer(self, repository: type[R]) -> R:
        """Another repository on this connection, stamping rows by this one's clock."""
        return repository(self.conn, clock=self._clock)

    @property
    def schema(self) -> str | None:
        """The tenant schema this repository's statements work in (None: the default)."""
        return schema_of_connection(self.conn)

    def _sql(self, template: str) -> TextClause:
        return schema_text(self.conn, template)

    def _all(self, sql: str | TextClause, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        result = self.conn.execute(self._sql(sql) if isinstance(sql, str) else sql, params or {})
        keys = list(result.keys())
        return [dict(zip(keys, row, strict=True)) for row in result.fetchall()]

    def _one(self, sql: str | TextClause, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        result = self.conn.execute(self._sql(sql) if isinstance(sql, str) else sql, params or {})
        row = result.fetchone()
        return None if row is None else dict(zip(result.keys(), row, strict=True))

    def _scalar(self, sql: str | TextClause, params: dict[str, Any] | None = None) -> Any:
        return self.conn.execute(self._sql(sql) if isinstance(sql, str) else sql, params or {}).scalar()

    def _exec(self, sql: str | TextClause, params: dict[str, Any] | list[dict[str, Any]] | None = None) -> int:
        return self.conn.execute(self._sql(sql) if isinstance(sql, str) else sql, params or {}).rowcount

    def has_table(self, name: str) -> bool:
        return bool(self.columns_of(name))

    @property
    def dialect(self) -> Dialect:
        """What differs per database kind (search SQL, upserts, maintenance)."""
        return for_connection(self.conn)

    def _table_info(self, table_name: str) -> Sequence[tuple[str, bool, str | None]]:
        """(name, NOT NULL, default) per column, read once per engine.

        Hot paths (append, token counting) would otherwise pay an introspection query
        per call. The schema of a file only changes through migrations, which run
        before an engine is handed to repositories (SessionDB migrates first, then
        connects).
        """
        per_engine = _INFO_CACHE.setdefault(self.conn.engine, {})
        key = (self.schema, table_name)
        info = per_engine.get(key)
        if info is None:
            info = tuple(self.dialect.table_info(self.conn, table_name))
            if info:  # a table not found (yet, or not visible) is asked again next time
                per_engine[key] = info
        return info

    def columns_of(self, table_name: str) -> frozenset[str]:
        """Column names of a table (empty when it does not exist), read once per engine."""
        per_engine = _SCHEMA_CACHE.setdefault(self.conn.engine, {})
        key = (self.schema, table_name)
        cols = per_engine.get(key)
        if cols is None:
            cols = frozenset(r[0] for r in self._table_info(table_name))
            if cols:
                per_engine[key] = cols
        return cols

    def not_null_columns(self, table_name: str) -> frozenset[str]:
        """Columns declared NOT NULL (None for them would fail inside the write)."""
        return frozenset(r[0] for r in self._table_info(table_name) if r[1])

    def column_defaults(self, table_name: str) -> dict[str, str | None]:
        """Declared column defaults (SQL literals) of a table, read once per engine."""
        return {r[0]: r[2] for r in self._table_info(table_name)}

    def object_sql(self, name: str) -> str:
        """Stored SQL of a schema object ('' when absent), read once per engine.

        Search asks which sessions the trigram view leaves out; the answer depends on
        the file's revision, and only migrations change it.
        """
        per_engine = _OBJECT_SQL_CACHE.setdefault(self.conn.engine, {})
        key = (self.schema, name)
        sql = per_engine.get(key)
        if sql is None:
            sql = self.dialect.object_sql(self.conn, name)
            if sql:  # '' (absent, or not visible) is never kept
                per_engine[key] = sql
        return sql

    def session_exists(self, session_id: str) -> bool:
        """THE session-exists check (every repository asks it the same way)."""
        return session_exists(self.conn, session_id)


_EXISTS = select(literal(1)).where(SESSIONS.c.id == bindparam("id")).limit(1)
_PRESENT = select(SESSIONS.c.id).where(SESSIONS.c.id.in_(bindparam("ids", expanding=True)))


def session_exists(conn: Connection, session_id: str) -> bool:
    """Whether ``sessions`` has a row with this id (built from the model's table)."""
    return conn.execute(_EXISTS, {"id": session_id}).first() is not None


def missing_sessions(conn: Connection, session_ids: Iterable[str]) -> list[str]:
    """Which of these session ids have no row (in the given order, duplicates once)."""
    ids = list(dict.fromkeys(session_ids))
    found: set[str] = set()
    for start in range(0, len(ids), ID_CHUNK):
        found.update(r[0] for r in conn.execute(_PRESENT, {"ids": ids[start:start + ID_CHUNK]}))
    return [i for i in ids if i not in found]


def driver_insert(conn: Connection, table_name: str, names: Sequence[str], *, schema: str | None = None
                  ) -> tuple[str, tuple[str, ...]]:
    """THE INSERT builder for rows sent straight to the DB-API cursor (hot paths).

    Compiled once per column set from the model's table (a lightweight table of the
    same name for a staging copy or a column the model lacks), in the driver's own
    parameter style. Returns the SQL and the order the values must be passed in:
    ``tuple(row[k] for k in order)``. ``schema`` (e.g. SQLite's ``temp``) defaults to
    the connection's tenant schema: SQL sent to the cursor bypasses
    ``schema_translate_map``, so the schema is compiled into the text.
    """
    if schema is None:
        schema = schema_of_connection(conn)
    per_dialect_ = _INSERTS.get(conn.dialect)
    if per_dialect_ is None:
        per_dialect_ = _INSERTS.setdefault(conn.dialect, {})
    key = (table_name, schema, tuple(names))
    found = per_dialect_.get(key)
    if found is None:
        model = Base.metadata.tables.get(table_name)
        target: TableClause
        if schema is None and model is not None and all(n in model.c for n in names):
            target = model
        else:
            target = table(table_name, *(column(n) for n in names), schema=schema)
        compiled = insert(target).compile(dialect=conn.dialect, column_keys=list(names))
        order = tuple(compiled.positiontup or ()) if compiled.positional else tuple(names)
        found = per_dialect_[key] = (str(compiled), order)
    return found


def in_filter(column_sql: str, values: Sequence[Any], prefix: str, params: dict[str, Any], *,
              negate: bool = False) -> str:
    """``column IN (:prefix0, :prefix1...)`` (or NOT IN), its values added to ``params``."""
    names = [f"{prefix}{i}" for i in range(len(values))]
    params.update(zip(names, values, strict=True))
    return f"{column_sql} {'NOT IN' if negate else 'IN'} ({', '.join(':' + n for n in names)})"


def source_filter(alias: str, include: Sequence[str], exclude: Sequence[str], params: dict[str, Any],
                  *, prefixes: tuple[str, str] = ("inc", "exc")) -> list[str]:
    """THE source filter of listings and search: conditions on ``alias.source``."""
    where = []
    if include:
        where.append(in_filter(f"{alias}.source", include, prefixes[0], params))
    if exclude:
        where.append(in_filter(f"{alias}.source", exclude, prefixes[1], params, negate=True))
    return where


def like_prefix(value: str) -> str:
    """``value%`` with LIKE wildcards in ``value`` taken literally (ESCAPE '\\')."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def fetch_tuples(result: Any) -> list[Any]:
    """All rows of ``result`` as the driver's tuples, for a statement whose columns need
    no SQLAlchemy result processing (text, integers, floats: no Boolean, no JSON).

    A Row per tuple costs more than the driver's own fetch on a 1,000-row walk; the
    driver cursor is the dialect's own (PostgreSQL's U+0000 decoding included)."""
    cursor = result.cursor
    if cursor is None:  # no rows (a statement without a result)
        return []
    try:
        return list(cursor.fetchall())
    finally:
        result.close()
