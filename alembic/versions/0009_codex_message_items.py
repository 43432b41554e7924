"""Schema v9: messages.codex_message_items.

Hermes v9 stores the Codex Responses API message items so they can be replayed
verbatim.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE messages ADD COLUMN codex_message_items TEXT")
    op.execute("UPDATE schema_version SET version = 9")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("messages", "codex_message_items")
    op.execute("UPDATE schema_version SET version = 8")
