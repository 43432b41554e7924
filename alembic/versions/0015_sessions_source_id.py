"""Schema v15: index sessions(source, id).

Listing and paging sessions of one source (``WHERE source = ? ORDER BY id``) scanned
the whole source bucket; Hermes v15 adds a covering index for it.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("CREATE INDEX idx_sessions_source_id ON sessions(source, id)")
    op.execute("UPDATE schema_version SET version = 15")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("DROP INDEX idx_sessions_source_id")
    op.execute("UPDATE schema_version SET version = 14")
