"""Schema v29: cron sessions leave the trigram (substring) index.

Why: scheduled (cron) sessions write the same reports over and over; in the trigram
index, which stores every three-character window of a text, they were most of the
index and most of the noise in substring searches. Hermes v29 (PR #101725) feeds the
trigram index through ``messages_fts_trigram_src`` joined to ``sessions`` and leaves
out ``source = 'cron'``; the three trigram triggers carry the same test. Cron messages
stay in the word index (``messages_fts``).

Upgrade does what Hermes' one-time ``_migrate_trigram_cron_exclusion`` does: drop the
three trigram triggers and the view, create the v29 ones, and rebuild the trigram
index once (FTS5 ``'rebuild'``), so rows indexed under the old view do not linger. If
a rebuild window (``fts_rebuild_*`` in ``state_meta``) is pending, the word index is
rebuilt too and the window, now covered, is cleared: resuming it would index rows a
second time.

The SQL is that of the reference v29 file. Upstream's exact v29 text was never
published; the predicate ``source <> 'cron'`` is the documented reconstruction
(PROVENANCE.md, "synthesized").

Downgrade restores the v23/v24 trigram view and triggers and rebuilds the trigram
index the same way, so cron messages are found again.

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

DROP_TRIGRAM = [
    "DROP TRIGGER messages_fts_trigram_insert",
    "DROP TRIGGER messages_fts_trigram_delete",
    "DROP TRIGGER messages_fts_trigram_update",
    "DROP VIEW messages_fts_trigram_src",
]

REBUILD = [
    "INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('rebuild')",
    # A pending window means the word index is mid-rebuild too: finish it here.
    """INSERT INTO messages_fts(messages_fts) SELECT 'rebuild'
WHERE EXISTS (SELECT 1 FROM state_meta WHERE key IN ('fts_rebuild_high_water', 'fts_rebuild_progress'))""",
    "DELETE FROM state_meta WHERE key IN ('fts_rebuild_high_water', 'fts_rebuild_progress')",
]

# ---- v29, verbatim from the reference file ------------------------------------------

TRIGRAM_V29 = [
    """CREATE VIEW messages_fts_trigram_src AS
    SELECT m.id, m.role, m.content, m.tool_name, m.tool_calls
    FROM messages AS m
    JOIN sessions AS s ON s.id = m.session_id
    WHERE m.role <> 'tool' AND s.source <> 'cron'""",
    """CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages
WHEN new.role <> 'tool'
   AND EXISTS (SELECT 1 FROM sessions
               WHERE id = new.session_id AND source <> 'cron')
   AND (new.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls)
    VALUES (new.id, new.content, new.tool_name, new.tool_calls);
END""",
    """CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages
WHEN old.role <> 'tool'
   AND EXISTS (SELECT 1 FROM sessions
               WHERE id = old.session_id AND source <> 'cron')
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name, tool_calls)
    VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);
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
    WHERE old.role <> 'tool'
      AND EXISTS (SELECT 1 FROM sessions
                  WHERE id = old.session_id AND source <> 'cron');
    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls)
    SELECT new.id, new.content, new.tool_name, new.tool_calls
    WHERE new.role <> 'tool'
      AND EXISTS (SELECT 1 FROM sessions
                  WHERE id = new.session_id AND source <> 'cron');
END""",
]

# ---- v28 (= v23 view and insert/delete triggers, v24 update trigger), as frozen in 0023/0024

TRIGRAM_V28 = [
    """CREATE VIEW messages_fts_trigram_src AS
    SELECT id, role, content, tool_name, tool_calls
    FROM messages
    WHERE role <> 'tool'""",
    """CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages
WHEN new.role <> 'tool'
   AND (new.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls)
    VALUES (new.id, new.content, new.tool_name, new.tool_calls);
END""",
    """CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages
WHEN old.role <> 'tool'
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name, tool_calls)
    VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);
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


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in DROP_TRIGRAM + TRIGRAM_V29 + REBUILD:
        op.execute(sql)
    op.execute("UPDATE schema_version SET version = 29")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in DROP_TRIGRAM + TRIGRAM_V28 + REBUILD:
        op.execute(sql)
    op.execute("UPDATE schema_version SET version = 28")
