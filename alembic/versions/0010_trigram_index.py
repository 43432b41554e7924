"""Schema v10: a trigram FTS5 index for CJK and substring search.

The unicode61 word index cannot split CJK text into words, so Hermes v10 adds a second,
trigram-tokenized index over the same content (external content on ``messages``) and
backfills it from the rows that already exist.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

UPGRADE = [
    """CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(
    content,
    content=messages,
    content_rowid=id,
    tokenize='trigram'
)""",
    """CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content) VALUES('delete', old.id, old.content);
END""",
    """CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (new.id, new.content);
END""",
    # External content: 'rebuild' reads every existing message into the new index.
    "INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('rebuild')",
    "UPDATE schema_version SET version = 10",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for trigger in ("messages_fts_trigram_update", "messages_fts_trigram_delete", "messages_fts_trigram_insert"):
        op.execute(f"DROP TRIGGER {trigger}")
    op.execute("DROP TABLE messages_fts_trigram")
    op.execute("UPDATE schema_version SET version = 9")
