"""Schema v7: messages.reasoning_content and the state_meta key/value table.

Hermes v7 keeps provider ``reasoning_content`` separately from ``reasoning`` (some
APIs require it echoed back, even when empty) and starts a small key/value table for
bookkeeping such as the last auto-prune time.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE messages ADD COLUMN reasoning_content TEXT")
    op.execute(
        """CREATE TABLE state_meta (
    key TEXT PRIMARY KEY,
    value TEXT
)"""
    )
    op.execute("UPDATE schema_version SET version = 7")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("DROP TABLE state_meta")
    op.drop_column("messages", "reasoning_content")
    op.execute("UPDATE schema_version SET version = 6")
