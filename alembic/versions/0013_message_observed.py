"""Schema v13: messages.observed.

Hermes v13 adds an ``observed`` flag (INTEGER, default 0) to every message, so rows the
agent saw but was not asked to answer (such as gateway chat lines not addressed to it)
can be told apart from conversation turns. Existing rows read as 0.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE messages ADD COLUMN observed INTEGER DEFAULT 0")
    op.execute("UPDATE schema_version SET version = 13")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("messages", "observed")
    op.execute("UPDATE schema_version SET version = 12")
