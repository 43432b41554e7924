"""Schema v24: session activity tracking, narrower FTS update triggers, an Insights index.

Why: Hermes v24 (2026-08-02/03) records when a session last showed life
(``last_activity_at`` / ``_description`` / ``_provenance``), so listings and the
gateway's stall watchdog no longer scan messages to tell recency. The same version
narrows both FTS update triggers to ``AFTER UPDATE OF`` the indexed columns, so writes
to status columns (``active``, ``compacted``, ``observed``...) stop doing FTS work,
and indexes assistant tool-call rows for the Insights queries.

Columns Hermes added under v23 without a version bump (the "late v23" shape:
``display_kind``/``display_metadata`` on messages, ``compression_ineffective_count``
and ``pinned`` on sessions, the activity columns and ``idx_messages_session_id``) first
appear in a fresh file at v24, so this revision adds them: ``upgrade 0024`` gives
exactly what Hermes v24 creates.

The trigger change needs no FTS rebuild: only *when* the triggers fire changes, not
what they write. Downgrade restores the v23 triggers and drops what v24 added; the
surviving columns keep their data.

Revision ID: 0024
Revises: hs0001
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0024"
down_revision = "hs0001"
branch_labels = None
depends_on = None

ADD_COLUMNS = [
    ("sessions", "last_activity_at", "REAL"),
    ("sessions", "last_activity_description", "TEXT"),
    ("sessions", "last_activity_provenance", "TEXT"),
    ("sessions", "compression_ineffective_count", "INTEGER NOT NULL DEFAULT 0"),
    ("sessions", "pinned", "INTEGER NOT NULL DEFAULT 0"),
    ("messages", "display_kind", "TEXT"),
    ("messages", "display_metadata", "TEXT"),
]

INDEXES_V24 = [
    "CREATE INDEX idx_messages_session_id ON messages(session_id, id)",
    """CREATE INDEX idx_messages_assistant_calls_by_session
    ON messages(session_id)
    WHERE role = 'assistant' AND tool_calls IS NOT NULL""",
]

DROP_UPDATE_TRIGGERS = [
    "DROP TRIGGER messages_fts_update",
    "DROP TRIGGER messages_fts_trigram_update",
]

# ---- v24, verbatim from Hermes ------------------------------------------------------

UPDATE_TRIGGERS_V24 = [
    """CREATE TRIGGER messages_fts_update
AFTER UPDATE OF content, tool_name, tool_calls ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.tool_calls IS NOT new.tool_calls)
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (new.id, new.content, new.tool_name, new.tool_calls);
END""",
    """CREATE TRIGGER messages_fts_trigram_update
AFTER UPDATE OF content, tool_name, tool_calls, role ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.tool_calls IS NOT new.tool_calls
    OR old.role IS NOT new.role)
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name, tool_calls)
    SELECT 'delete', old.id, old.content, old.tool_name, old.tool_calls
    WHERE old.role <> 'tool';
    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls)
    SELECT new.id, new.content, new.tool_name, new.tool_calls
    WHERE new.role <> 'tool';
END""",
]

# ---- v23, as frozen in revision 0023 ------------------------------------------------

UPDATE_TRIGGERS_V23 = [
    """CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.tool_calls IS NOT new.tool_calls)
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (new.id, new.content, new.tool_name, new.tool_calls);
END""",
    """CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.tool_calls IS NOT new.tool_calls
    OR old.role IS NOT new.role)
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name, tool_calls)
    SELECT 'delete', old.id, old.content, old.tool_name, old.tool_calls
    WHERE old.role <> 'tool';
    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls)
    SELECT new.id, new.content, new.tool_name, new.tool_calls
    WHERE new.role <> 'tool';
END""",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for table, column, spec in ADD_COLUMNS:
        op.execute(f"ALTER TABLE {table} ADD COLUMN {column} {spec}")
    for sql in INDEXES_V24:
        op.execute(sql)
    for sql in DROP_UPDATE_TRIGGERS + UPDATE_TRIGGERS_V24:
        op.execute(sql)
    op.execute("UPDATE schema_version SET version = 24")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in DROP_UPDATE_TRIGGERS + UPDATE_TRIGGERS_V23:
        op.execute(sql)
    op.execute("DROP INDEX idx_messages_assistant_calls_by_session")
    op.execute("DROP INDEX idx_messages_session_id")
    for table, column, _spec in reversed(ADD_COLUMNS):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    op.execute("UPDATE schema_version SET version = 23")
