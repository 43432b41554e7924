"""Schema v6: reasoning columns on messages.

Hermes v6 keeps the model's reasoning text and provider reasoning payloads so a
conversation can be replayed to reasoning models without losing state.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT")
    op.execute("ALTER TABLE messages ADD COLUMN reasoning_details TEXT")
    op.execute("ALTER TABLE messages ADD COLUMN codex_reasoning_items TEXT")
    op.execute("UPDATE schema_version SET version = 6")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("messages", "codex_reasoning_items")
    op.drop_column("messages", "reasoning_details")
    op.drop_column("messages", "reasoning")
    op.execute("UPDATE schema_version SET version = 5")
