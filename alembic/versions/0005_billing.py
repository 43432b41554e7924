"""Schema v5: billing and cost columns on sessions.

Hermes v5 tracks cache and reasoning tokens, the billing route and estimated/actual
cost, so usage can be priced per session.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("ALTER TABLE sessions ADD COLUMN cache_read_tokens INTEGER DEFAULT 0")
    op.execute("ALTER TABLE sessions ADD COLUMN cache_write_tokens INTEGER DEFAULT 0")
    op.execute("ALTER TABLE sessions ADD COLUMN reasoning_tokens INTEGER DEFAULT 0")
    op.execute("ALTER TABLE sessions ADD COLUMN billing_provider TEXT")
    op.execute("ALTER TABLE sessions ADD COLUMN billing_base_url TEXT")
    op.execute("ALTER TABLE sessions ADD COLUMN billing_mode TEXT")
    op.execute("ALTER TABLE sessions ADD COLUMN estimated_cost_usd REAL")
    op.execute("ALTER TABLE sessions ADD COLUMN actual_cost_usd REAL")
    op.execute("ALTER TABLE sessions ADD COLUMN cost_status TEXT")
    op.execute("ALTER TABLE sessions ADD COLUMN cost_source TEXT")
    op.execute("ALTER TABLE sessions ADD COLUMN pricing_version TEXT")
    op.execute("UPDATE schema_version SET version = 5")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("sessions", "pricing_version")
    op.drop_column("sessions", "cost_source")
    op.drop_column("sessions", "cost_status")
    op.drop_column("sessions", "actual_cost_usd")
    op.drop_column("sessions", "estimated_cost_usd")
    op.drop_column("sessions", "billing_mode")
    op.drop_column("sessions", "billing_base_url")
    op.drop_column("sessions", "billing_provider")
    op.drop_column("sessions", "reasoning_tokens")
    op.drop_column("sessions", "cache_write_tokens")
    op.drop_column("sessions", "cache_read_tokens")
    op.execute("UPDATE schema_version SET version = 4")
