"""Schema v28: the word index keeps only the first 8192 characters of a tool result.

Why: tool results (file dumps, web pages, command output) can be megabytes, and
``messages_fts`` indexed all of it, so one large result cost far more index than
whole conversations and slowed every write. Hermes v28 (PR #101720, the only state.db
change between the 27 and 29 bumps) indexes a tool row's content as
``substr(COALESCE(content, ''), 1, 8192)``, for rows above the high-water mark
``state_meta['fts_tool_full_content_high_water']``. Rows at or below it were indexed
in full before the change and keep being treated that way by the triggers, so the
index stays consistent without a rebuild.

Upgrade does what Hermes' ``_migrate_bounded_tool_fts_triggers`` does: when the mark
is absent it stamps it to the current ``MAX(id)`` (0 for an empty table), then
replaces the three ``messages_fts`` triggers with Hermes' v28 text. The trigram index
is unchanged.

Downgrade restores the full-content triggers. Tool rows above the mark are indexed
truncated, which the old triggers could not delete correctly, so both indexes are
rebuilt from their content (one FTS5 ``'rebuild'`` each) and any pending
``fts_rebuild_*`` window, now obsolete, is cleared; then the mark is removed.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

HIGH_WATER = "fts_tool_full_content_high_water"

STAMP_HIGH_WATER = f"""INSERT INTO state_meta (key, value)
SELECT '{HIGH_WATER}', CAST(COALESCE(MAX(id), 0) AS TEXT) FROM messages
WHERE NOT EXISTS (SELECT 1 FROM state_meta WHERE key = '{HIGH_WATER}')"""

DROP_TRIGGERS = [
    "DROP TRIGGER messages_fts_insert",
    "DROP TRIGGER messages_fts_delete",
    "DROP TRIGGER messages_fts_update",
]

# ---- v28, verbatim from Hermes ------------------------------------------------------

TRIGGERS_V28 = [
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
WHEN (new.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'fts_rebuild_high_water'), -1)
   OR new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                          WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (
        new.id,
        CASE WHEN new.role = 'tool'
              AND new.id > COALESCE((SELECT CAST(value AS INTEGER)
                                         FROM state_meta
                                         WHERE key = 'fts_tool_full_content_high_water'), -1)
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END,
        new.tool_name,
        new.tool_calls
    );
END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
WHEN (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'fts_rebuild_high_water'), -1)
   OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                          WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES (
        'delete',
        old.id,
        CASE WHEN old.role = 'tool'
              AND old.id > COALESCE((SELECT CAST(value AS INTEGER)
                                         FROM state_meta
                                         WHERE key = 'fts_tool_full_content_high_water'), -1)
         THEN substr(COALESCE(old.content, ''), 1, 8192)
         ELSE old.content END,
        old.tool_name,
        old.tool_calls
    );
END""",
    """CREATE TRIGGER messages_fts_update
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
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES (
        'delete',
        old.id,
        CASE WHEN old.role = 'tool'
              AND old.id > COALESCE((SELECT CAST(value AS INTEGER)
                                         FROM state_meta
                                         WHERE key = 'fts_tool_full_content_high_water'), -1)
         THEN substr(COALESCE(old.content, ''), 1, 8192)
         ELSE old.content END,
        old.tool_name,
        old.tool_calls
    );
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (
        new.id,
        CASE WHEN new.role = 'tool'
              AND new.id > COALESCE((SELECT CAST(value AS INTEGER)
                                         FROM state_meta
                                         WHERE key = 'fts_tool_full_content_high_water'), -1)
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END,
        new.tool_name,
        new.tool_calls
    );
END""",
]

# ---- v27 (= v24), as frozen in revisions 0023 and 0024 --------------------------------

TRIGGERS_V27 = [
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
WHEN (new.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'fts_rebuild_high_water'), -1)
   OR new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                          WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (new.id, new.content, new.tool_name, new.tool_calls);
END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
WHEN (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'fts_rebuild_high_water'), -1)
   OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                          WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);
END""",
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
]

REBUILD_BOTH = [
    "INSERT INTO messages_fts(messages_fts) VALUES('rebuild')",
    "INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('rebuild')",
    "DELETE FROM state_meta WHERE key IN ('fts_rebuild_high_water', 'fts_rebuild_progress')",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute(STAMP_HIGH_WATER)
    for sql in DROP_TRIGGERS + TRIGGERS_V28:
        op.execute(sql)
    op.execute("UPDATE schema_version SET version = 28")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in DROP_TRIGGERS + TRIGGERS_V27 + REBUILD_BOTH:
        op.execute(sql)
    op.execute(f"DELETE FROM state_meta WHERE key = '{HIGH_WATER}'")
    op.execute("UPDATE schema_version SET version = 27")
