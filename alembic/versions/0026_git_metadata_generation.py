"""Schema v26: a compare-and-set guard for async git metadata; gateway hygiene cooldowns.

Why: Hermes fills a session's cwd/git columns asynchronously, and a slow, older lookup
could overwrite a newer one. v26 adds ``sessions.git_metadata_generation``, bumped on
every async write and checked by the next (``... AND git_metadata_generation = ?``), so
late metadata can no longer win. Under the same version (no bump, so first present in a
fresh v26 file) the gateway got ``gateway_hygiene_state``: the failure streak of its
per-chat hygiene step, kept across restarts so the cooldown does not reset.

Downgrade drops both; nothing else refers to them.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

# ---- v26, verbatim from Hermes ------------------------------------------------------

UPGRADE = [
    "ALTER TABLE sessions ADD COLUMN git_metadata_generation INTEGER NOT NULL DEFAULT 0",
    """CREATE TABLE gateway_hygiene_state (
    session_key TEXT PRIMARY KEY,
    failure_streak INTEGER NOT NULL DEFAULT 0
)""",
    "UPDATE schema_version SET version = 26",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("DROP TABLE gateway_hygiene_state")
    op.execute("ALTER TABLE sessions DROP COLUMN git_metadata_generation")
    op.execute("UPDATE schema_version SET version = 25")
