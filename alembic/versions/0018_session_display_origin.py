"""Schema v18: sessions.display_name, origin_json and expiry_finalized.

Hermes v18 shows a human name for gateway sessions (``display_name``), keeps where a
session came from as JSON (``origin_json``) and flags sessions whose idle expiry has
already been finalized (``expiry_finalized``), so it happens once.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE sessions ADD COLUMN display_name TEXT")
    op.execute("ALTER TABLE sessions ADD COLUMN origin_json TEXT")
    op.execute("ALTER TABLE sessions ADD COLUMN expiry_finalized INTEGER DEFAULT 0")
    op.execute("UPDATE schema_version SET version = 18")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("sessions", "expiry_finalized")
    op.drop_column("sessions", "origin_json")
    op.drop_column("sessions", "display_name")
    op.execute("UPDATE schema_version SET version = 17")
