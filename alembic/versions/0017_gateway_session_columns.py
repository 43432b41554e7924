"""Schema v17: gateway identity and compression-failure columns on sessions.

The messaging gateway resolves "the current session for this chat" on every incoming
message. Hermes v17 stores the gateway peer on the session itself (``session_key``,
``chat_id``, ``chat_type``, ``thread_id``) with indexes for both lookups, indexes the
handoff state machine, and remembers a failed context compression
(``compression_failure_cooldown_until``, ``compression_failure_error``) so it is not
retried in a loop.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

COLUMNS = [
    ("session_key", "TEXT"),
    ("chat_id", "TEXT"),
    ("chat_type", "TEXT"),
    ("thread_id", "TEXT"),
    ("compression_failure_cooldown_until", "REAL"),
    ("compression_failure_error", "TEXT"),
]

INDEXES = [
    """CREATE INDEX idx_sessions_session_key
    ON sessions(session_key, started_at DESC)""",
    """CREATE INDEX idx_sessions_gateway_peer
    ON sessions(source, user_id, chat_id, chat_type, thread_id, started_at DESC)""",
    """CREATE INDEX idx_sessions_handoff_state
    ON sessions(handoff_state, started_at)""",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for name, type_ in COLUMNS:
        op.execute(f"ALTER TABLE sessions ADD COLUMN {name} {type_}")
    for sql in INDEXES:
        op.execute(sql)
    op.execute("UPDATE schema_version SET version = 17")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    # Indexes first: SQLite will not drop a column an index still names.
    for index in ("idx_sessions_handoff_state", "idx_sessions_gateway_peer", "idx_sessions_session_key"):
        op.execute(f"DROP INDEX {index}")
    for name, _type in reversed(COLUMNS):
        op.drop_column("sessions", name)
    op.execute("UPDATE schema_version SET version = 16")
