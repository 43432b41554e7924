"""Typed models of the plain tables at head.

These mirror the DDL of the newest revision exactly (``alembic check`` proves it).
FTS5 virtual tables and their view are not here: see :mod:`hermes_store.models.fts`.
Timestamps are Unix epoch floats, as Hermes writes them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BIGINT, BLOB, INTEGER, REAL, TEXT, ForeignKey, Identity, Index, func, text
from sqlalchemy.dialects.postgresql import BYTEA, DOUBLE_PRECISION
from sqlalchemy.orm import Mapped, mapped_column, relationship

from ..keys import RETENTION_TABLE
from .base import Base

# One model, two dialects: SQLite keeps Hermes' exact declared types, PostgreSQL gets
# types that hold the same values (revision hs0002 creates them).
#: Epoch seconds and costs: SQLite's REAL is 8 bytes, PostgreSQL's ``real`` only 4
#: (a 2025 timestamp would lose everything below ~2 minutes), so ``double precision``.
DOUBLE: REAL[float] = REAL().with_variant(DOUBLE_PRECISION(), "postgresql")
#: Token and call counters and message ids: SQLite integers are 8 bytes, PostgreSQL's
#: ``integer`` only 4, so ``bigint``.
BIG = INTEGER().with_variant(BIGINT(), "postgresql")
#: Raw bytes (``display_identity``): PostgreSQL has no BLOB.
BYTES = BLOB().with_variant(BYTEA(), "postgresql")


def where(sql: str) -> dict[str, Any]:
    """``sqlite_where`` and ``postgresql_where`` for a partial index (same predicate)."""
    return {"sqlite_where": text(sql), "postgresql_where": text(sql)}


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
    user_id: Mapped[str | None] = mapped_column(TEXT)
    model: Mapped[str | None] = mapped_column(TEXT)
    model_config: Mapped[str | None] = mapped_column(TEXT)
    system_prompt: Mapped[str | None] = mapped_column(TEXT)
    parent_session_id: Mapped[str | None] = mapped_column(TEXT, ForeignKey("sessions.id"))
    started_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)
    ended_at: Mapped[float | None] = mapped_column(DOUBLE)
    end_reason: Mapped[str | None] = mapped_column(TEXT)
    message_count: Mapped[int | None] = mapped_column(BIG, server_default=text("0"))
    tool_call_count: Mapped[int | None] = mapped_column(BIG, server_default=text("0"))
    input_tokens: Mapped[int | None] = mapped_column(BIG, server_default=text("0"))
    output_tokens: Mapped[int | None] = mapped_column(BIG, server_default=text("0"))
    # v3
    title: Mapped[str | None] = mapped_column(TEXT)
    # v5: billing
    cache_read_tokens: Mapped[int | None] = mapped_column(BIG, server_default=text("0"))
    cache_write_tokens: Mapped[int | None] = mapped_column(BIG, server_default=text("0"))
    reasoning_tokens: Mapped[int | None] = mapped_column(BIG, server_default=text("0"))
    billing_provider: Mapped[str | None] = mapped_column(TEXT)
    billing_base_url: Mapped[str | None] = mapped_column(TEXT)
    billing_mode: Mapped[str | None] = mapped_column(TEXT)
    estimated_cost_usd: Mapped[float | None] = mapped_column(DOUBLE)
    actual_cost_usd: Mapped[float | None] = mapped_column(DOUBLE)
    cost_status: Mapped[str | None] = mapped_column(TEXT)
    cost_source: Mapped[str | None] = mapped_column(TEXT)
    pricing_version: Mapped[str | None] = mapped_column(TEXT)
    # v8
    api_call_count: Mapped[int | None] = mapped_column(BIG, server_default=text("0"))
    # v11
    handoff_state: Mapped[str | None] = mapped_column(TEXT)
    handoff_platform: Mapped[str | None] = mapped_column(TEXT)
    handoff_error: Mapped[str | None] = mapped_column(TEXT)
    # v14
    cwd: Mapped[str | None] = mapped_column(TEXT)
    rewind_count: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    archived: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    # v16
    git_branch: Mapped[str | None] = mapped_column(TEXT)
    git_repo_root: Mapped[str | None] = mapped_column(TEXT)
    # v17: gateway peer and compression failures
    session_key: Mapped[str | None] = mapped_column(TEXT)
    chat_id: Mapped[str | None] = mapped_column(TEXT)
    chat_type: Mapped[str | None] = mapped_column(TEXT)
    thread_id: Mapped[str | None] = mapped_column(TEXT)
    compression_failure_cooldown_until: Mapped[float | None] = mapped_column(DOUBLE)
    compression_failure_error: Mapped[str | None] = mapped_column(TEXT)
    # v18
    display_name: Mapped[str | None] = mapped_column(TEXT)
    origin_json: Mapped[str | None] = mapped_column(TEXT)
    expiry_finalized: Mapped[int | None] = mapped_column(INTEGER, server_default=text("0"))
    # v21
    compression_fallback_streak: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    profile_name: Mapped[str | None] = mapped_column(TEXT)
    # v24 (added under late v23): activity tracking, anti-thrash count, durable pin
    last_activity_at: Mapped[float | None] = mapped_column(DOUBLE)
    last_activity_description: Mapped[str | None] = mapped_column(TEXT)
    last_activity_provenance: Mapped[str | None] = mapped_column(TEXT)
    compression_ineffective_count: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    pinned: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    # v25: the prompt lives in system_prompts; ``system_prompt`` is the legacy fallback
    system_prompt_hash: Mapped[str | None] = mapped_column(TEXT, ForeignKey("system_prompts.hash"))
    title_source: Mapped[str | None] = mapped_column(TEXT)
    hidden: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    last_read_at: Mapped[float | None] = mapped_column(DOUBLE)
    # v26
    git_metadata_generation: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    # v27 (tool_names added under late v26)
    tool_names: Mapped[str | None] = mapped_column(TEXT)
    compression_recovery_deadline: Mapped[float | None] = mapped_column(DOUBLE)
    # v30 (late)
    created_source: Mapped[str | None] = mapped_column(TEXT)
    compression_overload_streak: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    transport_profile: Mapped[str | None] = mapped_column(TEXT)

    parent: Mapped[AgentSession | None] = relationship(
        remote_side=[id], back_populates="children", lazy="raise_on_sql"
    )
    children: Mapped[list[AgentSession]] = relationship(
        back_populates="parent", lazy="raise_on_sql", passive_deletes=True
    )
    messages: Mapped[list[Message]] = relationship(
        back_populates="session", lazy="raise_on_sql", order_by="Message.id", passive_deletes=True
    )
    # The ledger rows go with their session in the database (ON DELETE CASCADE); the ORM
    # never loads them just to delete them.
    model_usage: Mapped[list[SessionModelUsage]] = relationship(
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
            **where("title IS NOT NULL"),
        ),
        Index("idx_sessions_handoff_state", "handoff_state", "started_at"),
        Index("idx_sessions_system_prompt_hash", "system_prompt_hash"),
        Index("idx_sessions_tool_names", "tool_names"),
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
# v27: recency without scanning messages. SQLite reflection cannot read an expression
# index back, so autogenerate compares it by name only.
Index(
    "idx_sessions_effective_activity",
    func.coalesce(AgentSession.last_activity_at, AgentSession.started_at).desc(),
    AgentSession.started_at.desc(),
)


class Message(Base):
    """One message of a session; ``content`` may hold Hermes' ``\\x00json:`` encoding."""

    __tablename__ = "messages"

    # SQLite: INTEGER PRIMARY KEY AUTOINCREMENT (Hermes' DDL); PostgreSQL: bigint identity.
    id: Mapped[int] = mapped_column(BIG, Identity(), primary_key=True, autoincrement=True, nullable=True)
    session_id: Mapped[str] = mapped_column(TEXT, ForeignKey("sessions.id"), nullable=False)
    role: Mapped[str] = mapped_column(TEXT, nullable=False)
    content: Mapped[str | None] = mapped_column(TEXT)
    tool_call_id: Mapped[str | None] = mapped_column(TEXT)
    tool_calls: Mapped[str | None] = mapped_column(TEXT)
    tool_name: Mapped[str | None] = mapped_column(TEXT)
    timestamp: Mapped[float] = mapped_column(DOUBLE, nullable=False)
    token_count: Mapped[int | None] = mapped_column(BIG)
    # v2
    finish_reason: Mapped[str | None] = mapped_column(TEXT)
    # v6
    reasoning: Mapped[str | None] = mapped_column(TEXT)
    reasoning_details: Mapped[str | None] = mapped_column(TEXT)
    codex_reasoning_items: Mapped[str | None] = mapped_column(TEXT)
    # v7
    reasoning_content: Mapped[str | None] = mapped_column(TEXT)
    # v9
    codex_message_items: Mapped[str | None] = mapped_column(TEXT)
    # v12
    platform_message_id: Mapped[str | None] = mapped_column(TEXT)
    # v13
    observed: Mapped[int | None] = mapped_column(INTEGER, server_default=text("0"))
    # v14: rewound messages are kept with active = 0
    active: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("1"))
    # v16
    compacted: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    # v19
    effect_disposition: Mapped[str | None] = mapped_column(TEXT)
    # v22
    api_content: Mapped[str | None] = mapped_column(TEXT)
    # v24 (added under late v23): typed display events
    display_kind: Mapped[str | None] = mapped_column(TEXT)
    display_metadata: Mapped[str | None] = mapped_column(TEXT)
    # v27 (added under late v26): a compression summary is not summarized again
    _compressed_summary: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    # v30 (late): stable on-screen order; NULL = pending backfill by Hermes
    display_identity: Mapped[bytes | None] = mapped_column(BYTES)
    display_order: Mapped[int | None] = mapped_column(BIG)  # a message id: bigint on PostgreSQL (hs0008)

    session: Mapped[AgentSession] = relationship(back_populates="messages", lazy="raise_on_sql")

    __table_args__ = (
        Index("idx_messages_session", "session_id", "timestamp"),
        # hermes_store's own (revision hs0001): newest-first substring scans stop early.
        Index("idx_messages_timestamp", "timestamp"),
        Index(
            "idx_messages_platform_msg_id",
            "session_id",
            "platform_message_id",
            **where("platform_message_id IS NOT NULL"),
        ),
        Index("idx_messages_session_active", "session_id", "active", "timestamp"),
        Index("idx_messages_active_null", "active", **where("active IS NULL")),
        # v24
        Index("idx_messages_session_id", "session_id", "id"),
        Index(
            "idx_messages_assistant_calls_by_session",
            "session_id",
            **where("role = 'assistant' AND tool_calls IS NOT NULL"),
        ),
        # v30 (late)
        Index(
            "idx_messages_display_backfill",
            "session_id",
            **where(
                "(display_order IS NULL OR display_identity IS NULL) AND (active = 1 OR compacted = 1)"
            ),
        ),
        Index(
            "idx_messages_display_identity",
            "session_id",
            "display_identity",
            "display_order",
            **where("display_identity IS NOT NULL AND (active = 1 OR compacted = 1)"),
        ),
        {"sqlite_autoincrement": True},
    )


Index(
    "idx_messages_display_page",
    Message.session_id,
    Message.display_order,
    Message.active.desc(),
    Message.id.desc(),
    **where("active = 1 OR compacted = 1"),
)


class StateMeta(Base):
    """Key/value bookkeeping (auto-prune stamp, FTS rebuild window, ...)."""

    __tablename__ = "state_meta"

    key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    value: Mapped[str | None] = mapped_column(TEXT)


class CompressionLock(Base):
    """A lease serializing context compression of one session across processes (v14)."""

    __tablename__ = "compression_locks"

    session_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    holder: Mapped[str] = mapped_column(TEXT, nullable=False)
    acquired_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)
    expires_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)

    __table_args__ = (Index("idx_compression_locks_expires", "expires_at"),)


class GatewayRouting(Base):
    """One gateway routing entry (JSON), keyed by scope and session key (v19)."""

    __tablename__ = "gateway_routing"

    scope: Mapped[str] = mapped_column(
        TEXT, primary_key=True, nullable=False, default="", server_default=text("''")
    )
    session_key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=False)
    entry_json: Mapped[str] = mapped_column(TEXT, nullable=False)
    updated_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)


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
    api_call_count: Mapped[int] = mapped_column(BIG, nullable=False, server_default=text("0"))
    input_tokens: Mapped[int] = mapped_column(BIG, nullable=False, server_default=text("0"))
    output_tokens: Mapped[int] = mapped_column(BIG, nullable=False, server_default=text("0"))
    cache_read_tokens: Mapped[int] = mapped_column(BIG, nullable=False, server_default=text("0"))
    cache_write_tokens: Mapped[int] = mapped_column(BIG, nullable=False, server_default=text("0"))
    reasoning_tokens: Mapped[int] = mapped_column(BIG, nullable=False, server_default=text("0"))
    estimated_cost_usd: Mapped[float] = mapped_column(DOUBLE, nullable=False, server_default=text("0"))
    actual_cost_usd: Mapped[float] = mapped_column(DOUBLE, nullable=False, server_default=text("0"))
    cost_status: Mapped[str | None] = mapped_column(TEXT)
    cost_source: Mapped[str | None] = mapped_column(TEXT)
    first_seen: Mapped[float | None] = mapped_column(DOUBLE)
    last_seen: Mapped[float | None] = mapped_column(DOUBLE)

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
    parent_session_id: Mapped[str | None] = mapped_column(TEXT)
    state: Mapped[str] = mapped_column(TEXT, nullable=False)
    dispatched_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)
    completed_at: Mapped[float | None] = mapped_column(DOUBLE)
    updated_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)
    event_json: Mapped[str | None] = mapped_column(TEXT)
    result_json: Mapped[str | None] = mapped_column(TEXT)
    delivery_state: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=text("'pending'"))
    delivery_attempts: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    delivered_at: Mapped[float | None] = mapped_column(DOUBLE)
    owner_pid: Mapped[int | None] = mapped_column(INTEGER)
    owner_started_at: Mapped[int | None] = mapped_column(BIG)
    task_json: Mapped[str | None] = mapped_column(TEXT)
    delivery_claim: Mapped[str | None] = mapped_column(TEXT)
    delivery_claimed_at: Mapped[float | None] = mapped_column(DOUBLE)
    # v30 (late): mirrors the delegation tool's own table
    origin_session_id: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=text("''"))

    __table_args__ = (Index("idx_async_delegations_delivery", "delivery_state", "completed_at"),)


class SystemPrompt(Base):
    """A system prompt stored once, keyed by the SHA-256 hex of its UTF-8 text (v25).

    Sessions point here through ``system_prompt_hash``; readers resolve
    ``COALESCE(system_prompts.prompt, sessions.system_prompt)``.
    """

    __tablename__ = "system_prompts"

    hash: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    prompt: Mapped[str] = mapped_column(TEXT, nullable=False)


class SessionTurnLease(Base):
    """A lease serializing the turns of one conversation across processes (v25)."""

    __tablename__ = "session_turn_leases"

    conversation_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    holder: Mapped[str] = mapped_column(TEXT, nullable=False)
    acquired_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)
    expires_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)

    __table_args__ = (Index("idx_session_turn_leases_expires", "expires_at"),)


class GatewayHygieneState(Base):
    """The failure streak of the gateway's hygiene step per chat, kept across restarts (v26)."""

    __tablename__ = "gateway_hygiene_state"

    session_key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    failure_streak: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))


class ConversationGeneration(Base):
    """A per-peer counter that only increases, so a cache scope is never reused (v27).

    Hermes never deletes these rows, not even with the peer's sessions.
    """

    __tablename__ = "conversation_generations"

    source: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=False)
    session_key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=False)
    generation: Mapped[int] = mapped_column(BIG, nullable=False, server_default=text("0"))


class GatewayHeartbeat(Base):
    """Liveness of one serve/gateway backend, so its idle sessions are not reaped (v27)."""

    __tablename__ = "gateway_heartbeats"

    backend_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    pid: Mapped[int] = mapped_column(INTEGER, nullable=False)
    started_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)
    last_heartbeat: Mapped[float] = mapped_column(DOUBLE, nullable=False)
    profile: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=text("''"))
    host: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=text("''"))


__all__ = [
    "AgentSession",
    "AsyncDelegation",
    "CjkBigram",
    "CjkBigramDirty",
    "CompressionLock",
    "ConversationGeneration",
    "GatewayHeartbeat",
    "GatewayHygieneState",
    "GatewayRouting",
    "Message",
    "RetentionPolicy",
    "SchemaVersion",
    "SessionModelUsage",
    "SessionTurnLease",
    "StateMeta",
    "SystemPrompt",
]


class CjkBigram(Base):
    """hermes_store's short-CJK search index (revision hs0001): adjacent CJK pairs per block.

    Maintained by :mod:`hermes_store.dialects.cjk_bigram`; see that module for the rules.
    """

    __tablename__ = "messages_cjk_bigram"

    gram: Mapped[str] = mapped_column(TEXT, primary_key=True)
    block: Mapped[int] = mapped_column(BIG, primary_key=True, autoincrement=False)
    __table_args__ = {"sqlite_with_rowid": False}


class CjkBigramDirty(Base):
    """Blocks whose rows changed below the index's high-water mark (filled by triggers)."""

    __tablename__ = "messages_cjk_bigram_dirty"

    block: Mapped[int] = mapped_column(BIG, primary_key=True, autoincrement=False, nullable=True)


class RetentionPolicy(Base):
    """hermes_store's retention policy of one source (revision hs0009); the row of source
    ``'*'`` (:data:`hermes_store.keys.RETENTION_DEFAULT_SOURCE`) is the store's default.

    Ended sessions whose ``ended_at`` is ``delete_after_days`` old are deleted; tool
    outputs and reasoning of messages ``redact_after_days`` old are replaced by a short
    marker (NULL: never). Pinned and user-titled sessions are left alone unless
    ``include_pinned`` / ``include_user_titled``. With ``archive_dir`` the deleted
    sessions are first written there as JSON Lines. Applied by
    :func:`hermes_store.operations.retention.apply_retention`.
    """

    __tablename__ = RETENTION_TABLE

    source: Mapped[str] = mapped_column(TEXT, primary_key=True)
    delete_after_days: Mapped[float | None] = mapped_column(DOUBLE)
    redact_after_days: Mapped[float | None] = mapped_column(DOUBLE)
    include_pinned: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    include_user_titled: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=text("0"))
    archive_dir: Mapped[str | None] = mapped_column(TEXT)
    updated_at: Mapped[float] = mapped_column(DOUBLE, nullable=False)
