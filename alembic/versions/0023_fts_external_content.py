"""Schema v23: both FTS indexes become external-content, 3-column FTS5 tables.

The v11 inline indexes store a second copy of every message (content ‖ tool name ‖
tool-call arguments glued into one column), doubling the text stored, and the trigram
index also holds tool results, which are large and rarely what a CJK/substring search
is after. Hermes v23 redesigns both:

* ``messages_fts`` indexes ``content``, ``tool_name`` and ``tool_calls`` as three
  columns with external content on ``messages`` (no copy of the text);
* ``messages_fts_trigram`` does the same, but its content table is the view
  ``messages_fts_trigram_src``, which leaves out ``role = 'tool'`` rows;
* the triggers keep both in step, and skip rows inside a pending rebuild window kept in
  ``state_meta``: ids above ``fts_rebuild_high_water`` (rows written after a rebuild
  started) and at or below ``fts_rebuild_progress`` (rows the rebuild already covered)
  are handled by the triggers, the rows in between by the rebuild itself. With neither
  key present every row is handled by the triggers.

This revision drops the v22 tables and triggers, creates Hermes' v23 DDL verbatim and
backfills both indexes inside the revision's transaction, in chunks of
``CHUNK`` message ids (``INSERT … SELECT … WHERE id BETWEEN``), so a large history is
never fed to FTS5 as one giant statement. Because the backfill is complete when the
transaction commits, any ``fts_rebuild_*`` window left in ``state_meta`` is obsolete and
is deleted first (a stale window would make the triggers skip live rows). In ``--sql``
(offline) mode, where rows cannot be counted, the backfill is one FTS5 ``'rebuild'``
per index instead.

Downgrade restores the v11–v22 inline tables and triggers and backfills them the same
chunked way, so every message is found again.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

from alembic import context, op

from hermes_store.alembic_support import sqlite_history_only
from sqlalchemy import text

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

#: Message ids per backfill statement.
CHUNK = 5000

DROP_TRIGGERS = [
    "DROP TRIGGER IF EXISTS messages_fts_insert",
    "DROP TRIGGER IF EXISTS messages_fts_delete",
    "DROP TRIGGER IF EXISTS messages_fts_update",
    "DROP TRIGGER IF EXISTS messages_fts_trigram_insert",
    "DROP TRIGGER IF EXISTS messages_fts_trigram_delete",
    "DROP TRIGGER IF EXISTS messages_fts_trigram_update",
]

CLEAR_REBUILD_WINDOW = (
    "DELETE FROM state_meta WHERE key IN ('fts_rebuild_high_water', 'fts_rebuild_progress')"
)

# ---- v23, verbatim from Hermes ------------------------------------------------------

EXTERNAL_FTS_V23 = [
    """CREATE VIRTUAL TABLE messages_fts USING fts5(
    content,
    tool_name,
    tool_calls,
    content='messages',
    content_rowid='id'
)""",
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
    """CREATE VIEW messages_fts_trigram_src AS
    SELECT id, role, content, tool_name, tool_calls
    FROM messages
    WHERE role <> 'tool'""",
    """CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(
    content,
    tool_name,
    tool_calls,
    content='messages_fts_trigram_src',
    content_rowid='id',
    tokenize='trigram'
)""",
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

BACKFILL_V23 = [
    """INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    SELECT id, content, tool_name, tool_calls FROM messages
    WHERE id BETWEEN :lo AND :hi""",
    """INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls)
    SELECT id, content, tool_name, tool_calls FROM messages_fts_trigram_src
    WHERE id BETWEEN :lo AND :hi""",
]

REBUILD_V23 = [
    "INSERT INTO messages_fts(messages_fts) VALUES('rebuild')",
    "INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('rebuild')",
]

DROP_V23 = [
    "DROP TABLE IF EXISTS messages_fts",
    "DROP TABLE IF EXISTS messages_fts_trigram",
    "DROP VIEW IF EXISTS messages_fts_trigram_src",
]

# ---- v22 (= v11), as frozen in revision 0011 ----------------------------------------

DROP_V22 = [
    "DROP TABLE IF EXISTS messages_fts",
    "DROP TABLE IF EXISTS messages_fts_trigram",
]

INLINE_FTS_V22 = [
    """CREATE VIRTUAL TABLE messages_fts USING fts5(
    content
)""",
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END""",
    """CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(
    content,
    tokenize='trigram'
)""",
    """CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END""",
    """CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
END""",
    """CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END""",
]

_INLINE_TEXT = "COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"

BACKFILL_V22 = [
    f"""INSERT INTO messages_fts(rowid, content)
    SELECT id, {_INLINE_TEXT} FROM messages
    WHERE id BETWEEN :lo AND :hi""",
    f"""INSERT INTO messages_fts_trigram(rowid, content)
    SELECT id, {_INLINE_TEXT} FROM messages
    WHERE id BETWEEN :lo AND :hi""",
]


def _backfill(statements: list[str]) -> None:
    """Run each ``statements`` (with ``:lo``/``:hi``) over ``messages`` in id chunks.

    Chunks hold ``CHUNK`` existing ids each (boundaries come from the ids themselves,
    so sparse ids cost nothing), all inside the revision's transaction.
    """
    bind = op.get_bind()
    lo = bind.execute(text("SELECT MIN(id) FROM messages")).scalar()
    while lo is not None:
        hi = bind.execute(
            text("SELECT MAX(id) FROM (SELECT id FROM messages WHERE id >= :lo ORDER BY id LIMIT :n)"),
            {"lo": lo, "n": CHUNK},
        ).scalar()
        for sql in statements:
            bind.execute(text(sql), {"lo": lo, "hi": hi})
        lo = bind.execute(text("SELECT MIN(id) FROM messages WHERE id > :hi"), {"hi": hi}).scalar()


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in DROP_TRIGGERS + DROP_V22:
        op.execute(sql)
    op.execute(CLEAR_REBUILD_WINDOW)
    for sql in EXTERNAL_FTS_V23:
        op.execute(sql)
    if context.is_offline_mode():
        for sql in REBUILD_V23:
            op.execute(sql)
    else:
        _backfill(BACKFILL_V23)
    op.execute("UPDATE schema_version SET version = 23")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in DROP_TRIGGERS + DROP_V23:
        op.execute(sql)
    # v22 triggers know no rebuild window; the backfill below covers every row anyway.
    op.execute(CLEAR_REBUILD_WINDOW)
    for sql in INLINE_FTS_V22:
        op.execute(sql)
    if context.is_offline_mode():
        for sql in BACKFILL_V22:
            op.execute(sql.replace("WHERE id BETWEEN :lo AND :hi", ""))
    else:
        _backfill(BACKFILL_V22)
    op.execute("UPDATE schema_version SET version = 22")
