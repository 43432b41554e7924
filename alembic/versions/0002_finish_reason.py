"""Schema v2: messages.finish_reason.

Hermes v2 records why the model stopped (stop, length, tool_calls) on each message.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE messages ADD COLUMN finish_reason TEXT")
    op.execute("UPDATE schema_version SET version = 2")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("messages", "finish_reason")
    op.execute("UPDATE schema_version SET version = 1")
