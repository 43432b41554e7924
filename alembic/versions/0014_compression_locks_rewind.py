"""Schema v14: compression locks, rewindable history, session cwd and archiving.

Two processes (CLI and gateway) may try to compress the same session at once; Hermes
v14 serializes that with a lease table, ``compression_locks``, whose expired leases
are found through an index on ``expires_at``. Rewinding a conversation no longer
deletes messages: ``messages.active`` (NOT NULL, default 1) hides rewound rows, read
through a (session_id, active, timestamp) index, and ``sessions.rewind_count`` counts
the rewinds. Sessions also remember their working directory (``cwd``) and can be
``archived``.

``ALTER TABLE ADD COLUMN`` puts the new columns at the end of the tables, where
Hermes' fresh DDL lists ``cwd`` earlier; column order is not part of the schema
contract (every read names its columns).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = [
    """CREATE TABLE compression_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
)""",
    "CREATE INDEX idx_compression_locks_expires ON compression_locks(expires_at)",
    "ALTER TABLE messages ADD COLUMN active INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE sessions ADD COLUMN cwd TEXT",
    "ALTER TABLE sessions ADD COLUMN rewind_count INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE sessions ADD COLUMN archived INTEGER NOT NULL DEFAULT 0",
    """CREATE INDEX idx_messages_session_active
    ON messages(session_id, active, timestamp)""",
    "UPDATE schema_version SET version = 14",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    # Rewound (active = 0) messages become visible again at v13, which has no notion
    # of rewinding; keeping them is the only choice that loses nothing.
    op.execute("DROP INDEX idx_messages_session_active")
    op.drop_column("sessions", "archived")
    op.drop_column("sessions", "rewind_count")
    op.drop_column("sessions", "cwd")
    op.drop_column("messages", "active")
    op.execute("DROP INDEX idx_compression_locks_expires")
    op.execute("DROP TABLE compression_locks")
    op.execute("UPDATE schema_version SET version = 13")
