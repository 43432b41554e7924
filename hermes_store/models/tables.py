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


class AgentSession(Base):
    """One agent session; ``parent_session_id`` links compression/branch/delegate children.

    Not called ``Session``: that name shadowed ``sqlalchemy.orm.Session`` in host code.
    """

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
    # v14
    cwd: Mapped[Optional[str]] = mapped_column(TEXT)
    rewind_count: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    archived: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    # v16
    git_branch: Mapped[Optional[str]] = mapped_column(TEXT)
    git_repo_root: Mapped[Optional[str]] = mapped_column(TEXT)
    # v17: gateway peer and compression failures
    session_key: Mapped[Optional[str]] = mapped_column(TEXT)
    chat_id: Mapped[Optional[str]] = mapped_column(TEXT)
    chat_type: Mapped[Optional[str]] = mapped_column(TEXT)
    thread_id: Mapped[Optional[str]] = mapped_column(TEXT)
    compression_failure_cooldown_until: Mapped[Optional[float]] = mapped_column(REAL)
    compression_failure_error: Mapped[Optional[str]] = mapped_column(TEXT)
    # v18
    display_name: Mapped[Optional[str]] = mapped_column(TEXT)
    origin_json: Mapped[Optional[str]] = mapped_column(TEXT)
    expiry_finalized: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    # v21
    compression_fallback_streak: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    profile_name: Mapped[Optional[str]] = mapped_column(TEXT)

    parent: Mapped[Optional["AgentSession"]] = relationship(
        remote_side=[id], back_populates="children", lazy="raise_on_sql"
    )
    children: Mapped[list["AgentSession"]] = relationship(
        back_populates="parent", lazy="raise_on_sql", passive_deletes=True
    )
    messages: Mapped[list["Message"]] = relationship(
        back_populates="session", lazy="raise_on_sql", order_by="Message.id", passive_deletes=True
    )
    # The ledger rows go with their session in the database (ON DELETE CASCADE); the ORM
    # never loads them just to delete them.
    model_usage: Mapped[list["SessionModelUsage"]] = relationship(
        back_populates="session",
        lazy="raise_on_sql",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )

    __table_args__ = (
        Index("idx_sessions_source", "source"),
        Index("idx_sessions_source_id", "source", "id"),
        Index("idx_sessions_parent", "parent_session_id"),
        Index(
            "idx_sessions_title_unique",
            "title",
            unique=True,
            sqlite_where=text("title IS NOT NULL"),
        ),
        Index("idx_sessions_handoff_state", "handoff_state", "started_at"),
    )


# Declared after the class so they can name the mapped columns with DESC ordering.
Index("idx_sessions_started", AgentSession.started_at.desc())
Index("idx_sessions_session_key", AgentSession.session_key, AgentSession.started_at.desc())
Index(
    "idx_sessions_gateway_peer",
    AgentSession.source,
    AgentSession.user_id,
    AgentSession.chat_id,
    AgentSession.chat_type,
    AgentSession.thread_id,
    AgentSession.started_at.desc(),
)


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
    # v12
    platform_message_id: Mapped[Optional[str]] = mapped_column(TEXT)
    # v13
    observed: Mapped[Optional[int]] = mapped_column(INTEGER, server_default=text("0"))
    # v14: rewound messages are kept with active = 0
    active: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("1"))
    # v16
    compacted: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    # v19
    effect_disposition: Mapped[Optional[str]] = mapped_column(TEXT)
    # v22
    api_content: Mapped[Optional[str]] = mapped_column(TEXT)

    session: Mapped[AgentSession] = relationship(back_populates="messages", lazy="raise_on_sql")

    __table_args__ = (
        Index("idx_messages_session", "session_id", "timestamp"),
        # hermes_store's own (revision 0024): newest-first substring scans stop early.
        Index("idx_messages_timestamp", "timestamp"),
        Index(
            "idx_messages_platform_msg_id",
            "session_id",
            "platform_message_id",
            sqlite_where=text("platform_message_id IS NOT NULL"),
        ),
        Index("idx_messages_session_active", "session_id", "active", "timestamp"),
        Index("idx_messages_active_null", "active", sqlite_where=text("active IS NULL")),
        {"sqlite_autoincrement": True},
    )


class StateMeta(Base):
    """Key/value bookkeeping (auto-prune stamp, FTS rebuild window, ...)."""

    __tablename__ = "state_meta"

    key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    value: Mapped[Optional[str]] = mapped_column(TEXT)


class CompressionLock(Base):
    """A lease serializing context compression of one session across processes (v14)."""

    __tablename__ = "compression_locks"

    session_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    holder: Mapped[str] = mapped_column(TEXT, nullable=False)
    acquired_at: Mapped[float] = mapped_column(REAL, nullable=False)
    expires_at: Mapped[float] = mapped_column(REAL, nullable=False)

    __table_args__ = (Index("idx_compression_locks_expires", "expires_at"),)


class GatewayRouting(Base):
    """One gateway routing entry (JSON), keyed by scope and session key (v19)."""

    __tablename__ = "gateway_routing"

    scope: Mapped[str] = mapped_column(
        TEXT, primary_key=True, nullable=False, default="", server_default=text("''")
    )
    session_key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=False)
    entry_json: Mapped[str] = mapped_column(TEXT, nullable=False)
    updated_at: Mapped[float] = mapped_column(REAL, nullable=False)


class SessionModelUsage(Base):
    """Usage ledger: one row per session, model, billing route and task (v20, task v22)."""

    __tablename__ = "session_model_usage"

    session_id: Mapped[str] = mapped_column(
        TEXT, ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True, nullable=False
    )
    model: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=False)
    # Key parts with a DDL default also default in Python, so a new row's identity is
    # known before the INSERT.
    billing_provider: Mapped[str] = mapped_column(
        TEXT, primary_key=True, nullable=False, default="", server_default=text("''")
    )
    billing_base_url: Mapped[str] = mapped_column(
        TEXT, primary_key=True, nullable=False, default="", server_default=text("''")
    )
    billing_mode: Mapped[str] = mapped_column(
        TEXT, primary_key=True, nullable=False, default="", server_default=text("''")
    )
    task: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=False, default="", server_default=text("''"))
    api_call_count: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    input_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    output_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    cache_read_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    cache_write_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    reasoning_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    estimated_cost_usd: Mapped[float] = mapped_column(REAL, nullable=False, server_default=text("0"))
    actual_cost_usd: Mapped[float] = mapped_column(REAL, nullable=False, server_default=text("0"))
    cost_status: Mapped[Optional[str]] = mapped_column(TEXT)
    cost_source: Mapped[Optional[str]] = mapped_column(TEXT)
    first_seen: Mapped[Optional[float]] = mapped_column(REAL)
    last_seen: Mapped[Optional[float]] = mapped_column(REAL)

    session: Mapped[AgentSession] = relationship(back_populates="model_usage", lazy="raise_on_sql")

    __table_args__ = (
        Index("idx_session_model_usage_session", "session_id"),
        Index("idx_session_model_usage_model", "model"),
    )


class AsyncDelegation(Base):
    """A sub-agent task dispatched asynchronously and its result delivery state (v21)."""

    __tablename__ = "async_delegations"

    delegation_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    origin_session: Mapped[str] = mapped_column(TEXT, nullable=False)
    origin_ui_session_id: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=text("''"))
    # Plain text, no foreign key: Hermes declares none.
    parent_session_id: Mapped[Optional[str]] = mapped_column(TEXT)
    state: Mapped[str] = mapped_column(TEXT, nullable=False)
    dispatched_at: Mapped[float] = mapped_column(REAL, nullable=False)
    completed_at: Mapped[Optional[float]] = mapped_column(REAL)
    updated_at: Mapped[float] = mapped_column(REAL, nullable=False)
    event_json: Mapped[Optional[str]] = mapped_column(TEXT)
    result_json: Mapped[Optional[str]] = mapped_column(TEXT)
    delivery_state: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=text("'pending'"))
    delivery_attempts: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    delivered_at: Mapped[Optional[float]] = mapped_column(REAL)
    owner_pid: Mapped[Optional[int]] = mapped_column(INTEGER)
    owner_started_at: Mapped[Optional[int]] = mapped_column(INTEGER)
    task_json: Mapped[Optional[str]] = mapped_column(TEXT)
    delivery_claim: Mapped[Optional[str]] = mapped_column(TEXT)
    delivery_claimed_at: Mapped[Optional[float]] = mapped_column(REAL)

    __table_args__ = (Index("idx_async_delegations_delivery", "delivery_state", "completed_at"),)


__all__ = [
    "AsyncDelegation",
    "CompressionLock",
    "GatewayRouting",
    "Message",
    "SchemaVersion",
    "AgentSession",
    "SessionModelUsage",
    "StateMeta",
]


class CjkBigram(Base):
    """hermes_store's short-CJK search index (revision 0024): adjacent CJK pairs per block.

    Maintained by :mod:`hermes_store.search.bigram`; see that module for the rules.
    """

    __tablename__ = "messages_cjk_bigram"

    gram: Mapped[str] = mapped_column(TEXT, primary_key=True)
    block: Mapped[int] = mapped_column(INTEGER, primary_key=True, autoincrement=False)
    __table_args__ = {"sqlite_with_rowid": False}


class CjkBigramDirty(Base):
    """Blocks whose rows changed below the index's high-water mark (filled by triggers)."""

    __tablename__ = "messages_cjk_bigram_dirty"

    block: Mapped[int] = mapped_column(INTEGER, primary_key=True, autoincrement=False, nullable=True)
