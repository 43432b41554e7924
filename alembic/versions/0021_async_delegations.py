"""Schema v21: async_delegations, and compression fallback / profile columns.

Hermes v21 lets a session hand work to a sub-agent asynchronously and receive the
result later, possibly in another process: ``async_delegations`` is that durable queue
(dispatch and completion times, result, delivery state with attempts and a claim, the
owning process), with an index to find what still has to be delivered. Sessions count
consecutive compression fallbacks (``compression_fallback_streak``) and remember the
profile they ran under (``profile_name``).

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

UPGRADE = [
    """CREATE TABLE async_delegations (
    delegation_id TEXT PRIMARY KEY,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '',
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at REAL NOT NULL,
    completed_at REAL,
    updated_at REAL NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at REAL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at REAL
)""",
    """CREATE INDEX idx_async_delegations_delivery
    ON async_delegations(delivery_state, completed_at)""",
    "ALTER TABLE sessions ADD COLUMN compression_fallback_streak INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE sessions ADD COLUMN profile_name TEXT",
    "UPDATE schema_version SET version = 21",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("sessions", "profile_name")
    op.drop_column("sessions", "compression_fallback_streak")
    op.execute("DROP INDEX idx_async_delegations_delivery")
    op.execute("DROP TABLE async_delegations")
    op.execute("UPDATE schema_version SET version = 20")
