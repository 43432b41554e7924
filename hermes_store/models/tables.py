"""Typed models of the plain tables at head.

These mirror the DDL of the newest revision exactly (``alembic check`` proves it).
FTS5 virtual tables and their view are not here: see :mod:`hermes_store.models.fts`.
Timestamps are Unix epoch floats, as Hermes writes them.
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy import INTEGER, REAL, TEXT, ForeignKey, Index, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from .base import Base


class SchemaVersion(Base):
    """Hermes' own one-row version marker; kept in step so Hermes can open the file."""

    __tablename__ = "schema_version"
    # Hermes declares no primary key; rowid is the only identity the table has.
    version: Mapped[int] = mapped_column(INTEGER, nullable=False)
    __mapper_args__ = {"primary_key": [version]}


class Session(Base):
    """One agent session; ``parent_session_id`` links compression/branch/delegate children."""

    __tablename__ = "sessions"

    # SQLite lets a non-INTEGER PRIMARY KEY hold NULL; Hermes' DDL does not forbid it.
    id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    source: Mapped[str] = mapped_column(TEXT, nullable=False)
    user_id: Mapped[Optional[str]] = mapped_column(TEXT)
    model: Mapped[Optional[str]] = mapped_column(TEXT)
    model_config: Mapped[Optional[str]] = mapped_column(TEXT)
    system_prompt: Mapped[Optional[str]] = mapped_column(TEXT)
    parent_session_id: Mapped[Optional[str]] = mapped_column(TEXT, ForeignKey("sessions.id"))
    started_at: Mapped[float] = mapped_column(REAL, nullable=False)
    ended_at: Mapped[Optional[float]] = mapped_column(REAL)
    end_reason: Mapped[Optional[str]] = mapped_column(TEXT)
    message_count: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    tool_call_count: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    input_tokens: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    output_tokens: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    # v3
    title: Mapped[Optional[str]] = mapped_column(TEXT)
    # v5: billing
    cache_read_tokens: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    cache_write_tokens: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    reasoning_tokens: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    billing_provider: Mapped[Optional[str]] = mapped_column(TEXT)
    billing_base_url: Mapped[Optional[str]] = mapped_column(TEXT)
    billing_mode: Mapped[Optional[str]] = mapped_column(TEXT)
    estimated_cost_usd: Mapped[Optional[float]] = mapped_column(REAL)
    actual_cost_usd: Mapped[Optional[float]] = mapped_column(REAL)
    cost_status: Mapped[Optional[str]] = mapped_column(TEXT)
    cost_source: Mapped[Optional[str]] = mapped_column(TEXT)
    pricing_version: Mapped[Optional[str]] = mapped_column(TEXT)
    # v8
    api_call_count: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    # v11
    handoff_state: Mapped[Optional[str]] = mapped_column(TEXT)
    handoff_platform: Mapped[Optional[str]] = mapped_column(TEXT)
    handoff_error: Mapped[Optional[str]] = mapped_column(TEXT)

    parent: Mapped[Optional["Session"]] = relationship(
        remote_side=[id], back_populates="children", lazy="raise_on_sql"
    )
    children: Mapped[list["Session"]] = relationship(
        back_populates="parent", lazy="raise_on_sql", passive_deletes=True
    )
    messages: Mapped[list["Message"]] = relationship(
        back_populates="session", lazy="raise_on_sql", order_by="Message.id", passive_deletes=True
    )

    __table_args__ = (
        Index("idx_sessions_source", "source"),
        Index("idx_sessions_parent", "parent_session_id"),
        Index(
            "idx_sessions_title_unique",
            "title",
            unique=True,
            sqlite_where=text("title IS NOT NULL"),
        ),
    )


# Declared after the class so it can name the mapped column with DESC ordering.
Index("idx_sessions_started", Session.started_at.desc())


class Message(Base):
    """One message of a session; ``content`` may hold Hermes' ``\\x00json:`` encoding."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(INTEGER, primary_key=True, autoincrement=True, nullable=True)
    session_id: Mapped[str] = mapped_column(TEXT, ForeignKey("sessions.id"), nullable=False)
    role: Mapped[str] = mapped_column(TEXT, nullable=False)
    content: Mapped[Optional[str]] = mapped_column(TEXT)
    tool_call_id: Mapped[Optional[str]] = mapped_column(TEXT)
    tool_calls: Mapped[Optional[str]] = mapped_column(TEXT)
    tool_name: Mapped[Optional[str]] = mapped_column(TEXT)
    timestamp: Mapped[float] = mapped_column(REAL, nullable=False)
    token_count: Mapped[Optional[int]] = mapped_column(INTEGER)
    # v2
    finish_reason: Mapped[Optional[str]] = mapped_column(TEXT)
    # v6
    reasoning: Mapped[Optional[str]] = mapped_column(TEXT)
    reasoning_details: Mapped[Optional[str]] = mapped_column(TEXT)
    codex_reasoning_items: Mapped[Optional[str]] = mapped_column(TEXT)
    # v7
    reasoning_content: Mapped[Optional[str]] = mapped_column(TEXT)
    # v9
    codex_message_items: Mapped[Optional[str]] = mapped_column(TEXT)

    session: Mapped[Session] = relationship(back_populates="messages", lazy="raise_on_sql")

    __table_args__ = (
        Index("idx_messages_session", "session_id", "timestamp"),
        {"sqlite_autoincrement": True},
    )


class StateMeta(Base):
    """Key/value bookkeeping (auto-prune stamp, FTS rebuild window, ...)."""

    __tablename__ = "state_meta"

    key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    value: Mapped[Optional[str]] = mapped_column(TEXT)


__all__ = ["Message", "SchemaVersion", "Session", "StateMeta"]
