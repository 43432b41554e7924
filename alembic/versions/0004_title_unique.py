"""Schema v4: titles are unique among titled sessions.

Hermes resolves sessions by title, so two sessions must never share one. NULL titles
are exempt (a partial index), matching Hermes v4.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("CREATE UNIQUE INDEX idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL")
    op.execute("UPDATE schema_version SET version = 4")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("DROP INDEX idx_sessions_title_unique")
    op.execute("UPDATE schema_version SET version = 3")
