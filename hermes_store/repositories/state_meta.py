"""``state_meta``: the key/value bookkeeping every room reads and writes.

A leaf of the repositories package (it needs only :mod:`.base`), so maintenance,
housekeeping, FTS upkeep, the Telegram opt-in step and the copier all reach it
without importing one another. Statements are SQLAlchemy Core on the model table
(``schema_translate_map`` names the tenant schema); the upserts are the dialect's own
``INSERT … ON CONFLICT``, built once per dialect.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, func, literal, select

from ..dialects import Dialect
from ..models import Base
from .base import Executor, Repository, as_connection, per_dialect

STATE_META = Base.metadata.tables["state_meta"]

_GET = select(STATE_META.c.value).where(STATE_META.c.key == bindparam("key"))


@per_dialect
def _set(dialect: Dialect) -> Any:
    """Plain upsert (never INSERT OR REPLACE, which deletes and re-inserts)."""
    ins = dialect.insert(STATE_META)
    return ins.on_conflict_do_update(index_elements=[STATE_META.c.key], set_={"value": ins.excluded.value})


@per_dialect
def _add(dialect: Dialect) -> Any:
    """Insert unless the key exists (the stored value wins)."""
    stmt = dialect.insert(STATE_META).on_conflict_do_nothing(index_elements=[STATE_META.c.key])
    return stmt.execution_options(preserve_rowcount=True)  # an INSERT's rowcount is kept only when asked


@per_dialect
def _stamp(dialect: Dialect) -> Any:
    """Insert unless the key exists, and lock the row either way: the update keeps the
    stored value (``value = state_meta.value``), so a concurrent stamper waits for us."""
    ins = dialect.insert(STATE_META)
    return ins.on_conflict_do_update(index_elements=[STATE_META.c.key], set_={"value": STATE_META.c.value})


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def get_meta(executor: Executor, key: str) -> str | None:
    """The stored value of ``key`` (None when absent)."""
    return as_connection(executor).execute(_GET, {"key": key}).scalar()


def set_meta(executor: Executor, key: str, value: Any) -> None:
    """Store ``value`` (as text; None stays NULL) under ``key``, replacing what was there."""
    conn = as_connection(executor)
    conn.execute(_set(conn), {"key": key, "value": _text(value)})


def add_meta(executor: Executor, key: str, value: Any) -> bool:
    """Store ``value`` under ``key`` only when the key is absent; True when it was stored."""
    conn = as_connection(executor)
    return conn.execute(_add(conn), {"key": key, "value": _text(value)}).rowcount == 1


def stamp_meta(executor: Executor, key: str, value: Any) -> None:
    """Store ``value`` under ``key`` unless one is there (kept as it is), holding the
    row's lock until the transaction ends (PostgreSQL; SQLite's writer lock already
    serializes): the first step of an idempotent opt-in."""
    conn = as_connection(executor)
    conn.execute(_stamp(conn), {"key": key, "value": _text(value)})


def list_meta_prefix(executor: Executor, prefix: str) -> list[tuple[str, str]]:
    """``(key, value)`` of every key starting with ``prefix`` (literally: ``%`` and ``_``
    are plain characters, case counts), in key order."""
    k = STATE_META.c.key
    stmt = (select(k, STATE_META.c.value)
            .where(func.substr(k, 1, func.length(literal(prefix))) == literal(prefix))
            .order_by(k))
    return [(r[0], r[1]) for r in as_connection(executor).execute(stmt)]


class StateMetaRepository(Repository):
    """:func:`get_meta` / :func:`set_meta` on the repository's connection."""

    def get_meta(self, key: str) -> str | None:
        return get_meta(self.conn, key)

    def set_meta(self, key: str, value: Any) -> None:
        set_meta(self.conn, key, value)

    def add_meta(self, key: str, value: Any) -> bool:
        return add_meta(self.conn, key, value)


__all__ = ["STATE_META", "StateMetaRepository", "add_meta", "get_meta", "list_meta_prefix", "set_meta", "stamp_meta"]
