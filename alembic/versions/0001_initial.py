"""Schema v1: sessions, messages, schema_version and the external-content word index.

The first schema Hermes shipped. Everything here is frozen DDL copied from what Hermes
v1 creates, so a file made by this revision is the file Hermes would have made.

Revision ID: 0001
Revises: <base>
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0001"
down_revision = None
branch_labels = ("hermes_store",)  # lets a host run `alembic upgrade hermes_store@head`
depends_on = None

UPGRADE = [
    """CREATE TABLE schema_version (
    version INTEGER NOT NULL
)""",
    """CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
)""",
    """CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER
)""",
    "CREATE INDEX idx_sessions_source ON sessions(source)",
    "CREATE INDEX idx_sessions_parent ON sessions(parent_session_id)",
    "CREATE INDEX idx_sessions_started ON sessions(started_at DESC)",
    "CREATE INDEX idx_messages_session ON messages(session_id, timestamp)",
    """CREATE VIRTUAL TABLE messages_fts USING fts5(
    content,
    content=messages,
    content_rowid=id
)""",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END""",
    "INSERT INTO schema_version (version) VALUES (1)",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for trigger in ("messages_fts_update", "messages_fts_delete", "messages_fts_insert"):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    op.execute("DROP TABLE IF EXISTS messages_fts")
    op.execute("DROP TABLE messages")
    op.execute("DROP TABLE sessions")
    op.execute("DROP TABLE schema_version")
    # sqlite_sequence keeps an AUTOINCREMENT high-water row for messages; forget it so
    # that base is really empty.
    op.execute("DELETE FROM sqlite_sequence WHERE name = 'messages'")
