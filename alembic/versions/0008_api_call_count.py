"""Schema v8: sessions.api_call_count.

Hermes v8 counts API calls per session for cost reporting.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE sessions ADD COLUMN api_call_count INTEGER DEFAULT 0")
    op.execute("UPDATE schema_version SET version = 8")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("sessions", "api_call_count")
    op.execute("UPDATE schema_version SET version = 7")
