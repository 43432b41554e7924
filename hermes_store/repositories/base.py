"""What every repository shares: it borrows the caller's Session or Connection.

Repositories never commit or roll back; the caller (or :class:`UnitOfWork`) owns the
transaction. Statements are Core/text SQL on a Connection so the same repository
serves an ORM Session, a plain Connection, or a fake in tests.
"""

from __future__ import annotations

import sqlite3
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session as OrmSession

from .. import errors
from ..engine import translate_driver_error

Executor = OrmSession | Connection

_SCHEMA_CACHE: "weakref.WeakKeyDictionary[Any, dict[str, frozenset[str]]]" = weakref.WeakKeyDictionary()
_OBJECT_SQL_CACHE: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()


UnknownFieldError = errors.UnknownFieldError  # re-exported: repositories raise it

@contextmanager
def driver_errors() -> Iterator[None]:
    """Typed errors for statements sent straight to the DB-API connection.

    SQLAlchemy's ``handle_error`` hook (engine.py) translates what goes through
    SQLAlchemy; raw-cursor fast paths get the same table here.
    """
    try:
        yield
    except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
        typed = translate_driver_error(exc)
        if typed is None:
            raise
        raise typed from exc


def as_connection(executor: Executor) -> Connection:
    """The Connection behind an ORM Session (joined to its transaction), or itself."""
    if isinstance(executor, OrmSession):
        return executor.connection()
    return executor


def now() -> float:
    """Unix epoch seconds as a float, Hermes' timestamp format."""
    return time.time()


class Repository:
    """Base class: holds the connection and offers tiny query helpers."""

    def __init__(self, executor: Executor) -> None:
        self.conn = as_connection(executor)

    def _all(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        result = self.conn.execute(text(sql), params or {})
        keys = list(result.keys())
        return [dict(zip(keys, row)) for row in result.fetchall()]

    def _one(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        result = self.conn.execute(text(sql), params or {})
        row = result.fetchone()
        return None if row is None else dict(zip(result.keys(), row))

    def _scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        return self.conn.execute(text(sql), params or {}).scalar()

    def _exec(self, sql: str, params: dict[str, Any] | list[dict[str, Any]] | None = None) -> int:
        return self.conn.execute(text(sql), params or {}).rowcount

    def has_table(self, name: str) -> bool:
        return bool(self.columns_of(name))

    def columns_of(self, table_name: str) -> frozenset[str]:
        """Column names of a table (empty when it does not exist), read once per engine.

        Hot paths (append, token counting) would otherwise pay a PRAGMA per call. The
        schema of a file only changes through migrations, which run before an engine
        is handed to repositories (SessionDB migrates first, then connects).
        """
        per_engine = _SCHEMA_CACHE.setdefault(self.conn.engine, {})
        cols = per_engine.get(table_name)
        if cols is None:
            cols = per_engine[table_name] = frozenset(
                r[1] for r in self.conn.exec_driver_sql(f'PRAGMA table_info("{table_name}")')
            )
        return cols

    def not_null_columns(self, table_name: str) -> frozenset[str]:
        """Columns declared NOT NULL (None for them would fail inside the write)."""
        per_engine = _SCHEMA_CACHE.setdefault(self.conn.engine, {})
        key = f"{table_name}\x00notnull"
        cols = per_engine.get(key)
        if cols is None:
            cols = per_engine[key] = frozenset(
                r[1] for r in self.conn.exec_driver_sql(f'PRAGMA table_info("{table_name}")') if r[3]
            )
        return cols

    def object_sql(self, name: str) -> str:
        """Stored SQL of a schema object ('' when absent), read once per engine.

        Search asks which sessions the trigram view leaves out; the answer depends on
        the file's revision, and only migrations change it.
        """
        per_engine = _OBJECT_SQL_CACHE.setdefault(self.conn.engine, {})
        sql = per_engine.get(name)
        if sql is None:
            sql = per_engine[name] = (
                self.conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).scalar() or ""
            )
        return sql


def like_prefix(value: str) -> str:
    """``value%`` with LIKE wildcards in ``value`` taken literally (ESCAPE '\\')."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
