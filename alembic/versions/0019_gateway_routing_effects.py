"""Schema v19: gateway_routing table, messages.effect_disposition, active-NULL index.

Hermes v19 keeps the gateway's routing entries (which session a chat is routed to) in
the database, in ``gateway_routing`` keyed by (scope, session key), so every process
using the file sees the same map. Messages record what happened to a tool call's side effect
(``effect_disposition``). Hermes v19 also creates a partial index on
``messages(active) WHERE active IS NULL`` (a cheap probe for rows missing the flag, which
files adopted from older layouts can have); it is reproduced as is, so the schema stays
Hermes' own.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

UPGRADE = [
    """CREATE TABLE gateway_routing (
    scope TEXT NOT NULL DEFAULT '',
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, session_key)
)""",
    "ALTER TABLE messages ADD COLUMN effect_disposition TEXT",
    """CREATE INDEX idx_messages_active_null
    ON messages(active) WHERE active IS NULL""",
    "UPDATE schema_version SET version = 19",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("DROP INDEX idx_messages_active_null")
    op.drop_column("messages", "effect_disposition")
    op.execute("DROP TABLE gateway_routing")
    op.execute("UPDATE schema_version SET version = 18")
