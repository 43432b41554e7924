"""Telegram DM topic bindings: which private-chat topic (thread) talks to which session.

An opt-in schema step, as Hermes keeps it: the two tables are never created on open
nor by a revision. :meth:`TelegramTopicRepository.apply_migration` creates them (one
transaction, idempotent) and stamps ``telegram_dm_topic_schema_version`` in
``state_meta``; until then every read finds nothing and every write changes nothing.

The tables are SQLAlchemy Core ``Table`` objects in a MetaData of their own, *not* the
models' metadata: our revisions and autogenerate must not know them (see
``hermes_store.alembic_support``, which hides them from ``alembic check``).

* ``telegram_dm_topic_mode(chat_id PK, enabled, updated_at)``: whether a chat uses
  one topic per session.
* ``telegram_dm_topic_bindings(chat_id, thread_id, session_id, title, created_at,
  updated_at)``, key ``(chat_id, thread_id)``; ``session_id`` references
  ``sessions(id) ON DELETE CASCADE``, so deleting a session drops its bindings.

Locking: a write that touches both tables locks the chat's mode row first (upsert, or
``SELECT … FOR UPDATE``; SQLite's writer lock already serializes), then the bindings.
Two concurrent unbinds of a chat's last two topics therefore cannot both miss that the
chat has none left, and no two writers wait on each other in opposite orders.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    INTEGER,
    TEXT,
    Column,
    ForeignKey,
    Index,
    MetaData,
    Table,
    delete,
    func,
    literal,
    select,
    text,
    update,
)

from ..dialects import Dialect
from ..tenant_schema import qualified
from ..models.tables import DOUBLE
from .base import Repository, per_dialect, session_exists
from .state_meta import stamp_meta

#: The ``state_meta`` key Hermes stamps when the topic tables exist, and our version.
SCHEMA_KEY = "telegram_dm_topic_schema_version"
SCHEMA_VERSION = 1

#: Ours alone: the opt-in tables, plus a stand-in ``sessions`` so the foreign key
#: resolves. Only the two topic tables are ever created from it.
TOPIC_METADATA = MetaData()
_SESSIONS_REF = Table("sessions", TOPIC_METADATA, Column("id", TEXT, primary_key=True))

TOPIC_MODE = Table(
    "telegram_dm_topic_mode",
    TOPIC_METADATA,
    Column("chat_id", TEXT, primary_key=True),
    Column("enabled", INTEGER, nullable=False, server_default=text("0")),
    Column("updated_at", DOUBLE),
)

TOPIC_BINDINGS = Table(
    "telegram_dm_topic_bindings",
    TOPIC_METADATA,
    Column("chat_id", TEXT, primary_key=True),
    Column("thread_id", TEXT, primary_key=True),
    Column("session_id", TEXT, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    Column("title", TEXT),
    Column("created_at", DOUBLE),
    Column("updated_at", DOUBLE),
    # Hermes v26's bind_telegram_topic: who the topic belongs to and how it is managed.
    Column("user_id", TEXT),
    Column("session_key", TEXT),
    Column("managed_mode", TEXT),
    Index("idx_telegram_dm_topic_bindings_session", "session_id"),
)

#: Names the opt-in step creates (alembic_support hides them from autogenerate).
TOPIC_TABLES = (TOPIC_MODE.name, TOPIC_BINDINGS.name)
_OPTIONAL_BINDING_COLUMNS = ("title", "created_at", "updated_at", "user_id", "session_key", "managed_mode")
#: Columns added after the first version of the step: applying it again adds them.
_LATER_BINDING_COLUMNS = ("user_id", "session_key", "managed_mode")


@per_dialect
def _set_mode(dialect: Dialect) -> Any:
    """The chat's mode row: a clash on the chat takes the new flag and stamp."""
    ins = dialect.insert(TOPIC_MODE)
    return ins.on_conflict_do_update(
        index_elements=[TOPIC_MODE.c.chat_id],
        set_={"enabled": ins.excluded.enabled, "updated_at": ins.excluded.updated_at},
    )


@per_dialect
def _bind(dialect: Dialect, columns: frozenset[str]) -> Any:
    """A topic's binding: a rebind takes the new session (and its user, key and mode),
    keeps ``created_at``, keeps the title unless a new one is given, and moves
    ``updated_at`` (the columns a Hermes-made or older table lacks are left out)."""
    ins = dialect.insert(TOPIC_BINDINGS)
    t = TOPIC_BINDINGS.c
    sets: dict[str, Any] = {"session_id": ins.excluded.session_id}
    if "title" in columns:
        sets["title"] = func.coalesce(ins.excluded.title, t.title)
    for name in ("updated_at", *_LATER_BINDING_COLUMNS):
        if name in columns:
            sets[name] = ins.excluded[name]
    return ins.on_conflict_do_update(index_elements=[t.chat_id, t.thread_id], set_=sets)


class TelegramTopicRepository(Repository):
    """Reads and writes of the topic tables; every method copes with them being absent."""

    # ------------------------------------------------------------------ schema

    def _columns(self, table: Table) -> frozenset[str]:
        """Columns the database has for ``table`` (empty when missing).

        Asked every time, never cached: the opt-in step adds the tables while stores
        (ours in other processes too) are open.
        """
        return frozenset(r[0] for r in self.dialect.table_info(self.conn, table.name))

    def present(self) -> bool:
        return bool(self._columns(TOPIC_MODE)) and bool(self._columns(TOPIC_BINDINGS))

    def apply_migration(self) -> bool:
        """Create the missing topic tables and stamp the version; True if anything was created.

        The stamp is written first, and an existing stamp is kept as it is (Hermes may
        have written its own): the upsert's row lock makes a concurrent apply on
        PostgreSQL wait for this one, then find the tables and create nothing.
        """
        stamp_meta(self.conn, SCHEMA_KEY, SCHEMA_VERSION)
        missing = [t for t in (TOPIC_MODE, TOPIC_BINDINGS) if not self._columns(t)]
        if missing:
            TOPIC_METADATA.create_all(self.conn, tables=missing, checkfirst=False)
        have = self._columns(TOPIC_BINDINGS)
        for name in _LATER_BINDING_COLUMNS:
            if name not in have:  # a table made by an earlier step of ours: nullable text, added in place
                table = qualified(self.schema, TOPIC_BINDINGS.name)
                self.conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {name} TEXT")
        return bool(missing)

    # ------------------------------------------------------------------ DM topic mode

    def topic_mode(self, chat_id: str) -> bool:
        if not self._columns(TOPIC_MODE):
            return False
        value = self.conn.execute(select(TOPIC_MODE.c.enabled).where(TOPIC_MODE.c.chat_id == chat_id)).scalar()
        return bool(value)

    def _upsert_mode(self, chat_id: str, enabled: bool) -> None:
        values = {"chat_id": chat_id, "enabled": 1 if enabled else 0, "updated_at": self.now()}
        self.conn.execute(_set_mode(self.conn), values)

    def set_topic_mode(self, chat_id: str, enabled: bool) -> int:
        if not self._columns(TOPIC_MODE):
            return 0
        self._upsert_mode(chat_id, enabled)
        return 1

    def _lock_mode(self, chat_id: str) -> None:
        """Row-lock the chat's mode row (PostgreSQL; SQLite's writer lock already serializes)."""
        self.conn.execute(select(TOPIC_MODE.c.chat_id).where(TOPIC_MODE.c.chat_id == chat_id).with_for_update())

    # ------------------------------------------------------------------ bindings

    def bind(self, chat_id: str, thread_id: str, session_id: str, title: str | None = None,
             owner: dict[str, str | None] | None = None) -> int:
        """Point the topic at the session (rebinding keeps ``created_at`` and, when
        ``title`` is None, the title; ``owner``: ``user_id``, ``session_key``,
        ``managed_mode``) and turn the chat's topic mode on. 0 when the tables or the
        session do not exist."""
        if not self.present() or not session_exists(self.conn, session_id):
            return 0
        self._upsert_mode(chat_id, True)  # mode row first: the lock order of every topic write
        have = self._columns(TOPIC_BINDINGS)
        stamp = self.now()
        values: dict[str, Any] = {"chat_id": chat_id, "thread_id": thread_id, "session_id": session_id,
                                  "title": title, "created_at": stamp, "updated_at": stamp, **(owner or {})}
        names = [n for n in values if n in have or n not in _OPTIONAL_BINDING_COLUMNS]
        self.conn.execute(_bind(self.conn, frozenset(names)), {n: values[n] for n in names})
        return 1

    def _binding_columns(self) -> list[Any]:
        have = self._columns(TOPIC_BINDINGS)
        return [c for c in TOPIC_BINDINGS.c if c.name in have]

    def binding(self, chat_id: str, thread_id: str) -> dict[str, Any] | None:
        cols = self._binding_columns()
        if not cols or not self._columns(TOPIC_MODE):
            return None
        row = self.conn.execute(
            select(*cols).where(TOPIC_BINDINGS.c.chat_id == chat_id, TOPIC_BINDINGS.c.thread_id == thread_id)
        ).mappings().first()
        return None if row is None else dict(row)

    def _listed(self, *where: Any) -> list[dict[str, Any]]:
        cols = self._binding_columns()
        if not cols or not self._columns(TOPIC_MODE):
            return []
        order = [TOPIC_BINDINGS.c.chat_id, TOPIC_BINDINGS.c.thread_id]
        if "created_at" in {c.name for c in cols}:
            order.insert(0, TOPIC_BINDINGS.c.created_at)
        stmt = select(*cols).where(*where).order_by(*order)
        return [dict(r) for r in self.conn.execute(stmt).mappings()]

    def bindings_of_session(self, session_id: str) -> list[dict[str, Any]]:
        return self._listed(TOPIC_BINDINGS.c.session_id == session_id)

    def bindings_of_chat(self, chat_id: str) -> list[dict[str, Any]]:
        return self._listed(TOPIC_BINDINGS.c.chat_id == chat_id)

    def touch(self, chat_id: str, thread_id: str, title: str | None) -> int:
        """Stamp ``updated_at`` (and rename when ``title`` is given); rows changed."""
        have = self._columns(TOPIC_BINDINGS)
        if not have or not self._columns(TOPIC_MODE):
            return 0
        values: dict[str, Any] = {}
        if "updated_at" in have:
            values["updated_at"] = self.now()
        if title is not None and "title" in have:
            values["title"] = title
        if not values:  # a foreign table with neither column: report whether the topic is bound
            return 1 if self.binding(chat_id, thread_id) is not None else 0
        return self.conn.execute(
            update(TOPIC_BINDINGS)
            .where(TOPIC_BINDINGS.c.chat_id == chat_id, TOPIC_BINDINGS.c.thread_id == thread_id)
            .values(**values)
        ).rowcount

    def delete(self, chat_id: str, thread_id: str) -> int:
        """Drop the binding; if it was the chat's last, turn the chat's topic mode off."""
        if not self.present():
            return 0
        self._lock_mode(chat_id)
        deleted = self.conn.execute(
            delete(TOPIC_BINDINGS).where(TOPIC_BINDINGS.c.chat_id == chat_id, TOPIC_BINDINGS.c.thread_id == thread_id)
        ).rowcount
        if deleted:
            left = self.conn.execute(
                select(literal(1)).where(TOPIC_BINDINGS.c.chat_id == chat_id).limit(1)
            ).first()
            if left is None:
                self.conn.execute(
                    update(TOPIC_MODE).where(TOPIC_MODE.c.chat_id == chat_id).values(enabled=0, updated_at=self.now())
                )
        return deleted
