"""Schema v27: a durable compression recovery deadline, plus the late-v26 additions.

Why: a session whose context compression kept failing is "tripped" and must recover by
a deadline; before v27 that deadline lived in memory and a gateway agent rebuild lost
it, leaving the session stuck. v27 stores it in ``sessions.compression_recovery_deadline``
(epoch seconds; 0/NULL = disarmed).

Hermes added more under v26 without a version bump, after the newest v26 file we have
(so they first appear in a fresh file at v27, and this revision adds them):

* ``sessions.tool_names`` (the tools a session used, for filtering) and
  ``messages._compressed_summary`` (marks a compression summary message, so it is not
  summarized again);
* ``conversation_generations``: a per-peer counter that only ever increases, so a
  prompt-cache scope is never reused after sessions are pruned (never garbage-collected);
* ``gateway_heartbeats``: a liveness row per backend process, so the startup orphan
  sweep does not reap sessions of a backend that is alive but idle;
* ``idx_sessions_effective_activity``: recency browsing without scanning messages.

No data migration. Downgrade drops all of it; the surviving columns keep their data.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

ADD_COLUMNS = [
    ("sessions", "tool_names", "TEXT"),
    ("messages", "_compressed_summary", "INTEGER NOT NULL DEFAULT 0"),
    ("sessions", "compression_recovery_deadline", "REAL"),
]

# ---- v27 (late v26 + v27), verbatim from Hermes --------------------------------------

OBJECTS = [
    """CREATE TABLE conversation_generations (
    source TEXT NOT NULL,
    session_key TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (source, session_key)
)""",
    """CREATE TABLE gateway_heartbeats (
    backend_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    profile TEXT NOT NULL DEFAULT '',
    host TEXT NOT NULL DEFAULT ''
)""",
    """CREATE INDEX idx_sessions_effective_activity
    ON sessions(COALESCE(last_activity_at, started_at) DESC, started_at DESC)""",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for table, column, spec in ADD_COLUMNS:
        op.execute(f"ALTER TABLE {table} ADD COLUMN {column} {spec}")
    for sql in OBJECTS:
        op.execute(sql)
    op.execute("UPDATE schema_version SET version = 27")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("DROP INDEX idx_sessions_effective_activity")
    op.execute("DROP TABLE gateway_heartbeats")
    op.execute("DROP TABLE conversation_generations")
    for table, column, _spec in reversed(ADD_COLUMNS):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    op.execute("UPDATE schema_version SET version = 26")
