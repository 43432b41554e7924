"""Schema v3: sessions.title.

Sessions get a human title. Hermes never released v3 on its own; it is the step
'title column, no unique index yet' that v4 completes.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE sessions ADD COLUMN title TEXT")
    op.execute("UPDATE schema_version SET version = 3")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("sessions", "title")
    op.execute("UPDATE schema_version SET version = 2")
