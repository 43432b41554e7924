"""Schema v12: messages.platform_message_id and its lookup index.

Gateways (Telegram, Slack, ...) edit or delete a message they already delivered, and
must find the stored row from the platform's own id. Hermes v12 keeps that id on each
message and indexes it per session; most rows have none, so the index is partial.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE messages ADD COLUMN platform_message_id TEXT")
    op.execute(
        "CREATE INDEX idx_messages_platform_msg_id ON messages(session_id, platform_message_id) "
        "WHERE platform_message_id IS NOT NULL"
    )
    op.execute("UPDATE schema_version SET version = 12")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    # SQLite refuses to drop an indexed column; the index goes first.
    op.execute("DROP INDEX idx_messages_platform_msg_id")
    op.drop_column("messages", "platform_message_id")
    op.execute("UPDATE schema_version SET version = 11")
