"""hermes_store's own index for short CJK search terms (not a Hermes schema version).

Why: a CJK term of one or two characters cannot use the trigram index, so Hermes
answers it with a LIKE scan over every message — hundreds of milliseconds on a large
history. This revision adds what such a search needs:

* ``messages_cjk_bigram(gram, block)``: every pair of adjacent CJK characters found in
  a message's content, tool name or tool calls, keyed by the message's *block* (its id
  divided by 64). Blocks keep the table small: a common pair is stored once per 64
  messages, not once per message. A search reads the candidate blocks of its term's
  pairs and then verifies each candidate with the same LIKE as the plain scan, so a
  stale entry can only cost time, never a wrong answer.
* The index is filled by hermes_store (in Python, after writes and on open) up to the
  message id stored in ``state_meta['hermes_store.cjk_bigram_high_water']``. Rows above it are
  scanned directly, so rows written by another program (Hermes itself) are found at
  once. Rows at or below it that change, or that are inserted with an explicit older id,
  are recorded by two small triggers in ``messages_cjk_bigram_dirty`` and are scanned
  until re-indexed. Deleted rows need nothing: their candidates fail verification.
* ``idx_messages_timestamp`` lets a common short term stop after the newest hits
  instead of sorting every match.

``schema_version`` is left alone: Hermes can still open the file and ignores these
objects. The index starts empty (high water -1 = nothing indexed, everything scanned)
and is built by the first SessionDB open or ``hermes-store fts rebuild``, so upgrading
a large file stays quick.

Why its id is ``hs0001`` and why it sits right after 0023: ids of our own start with
``hs`` so they can never take the id of a Hermes schema version (it was once "0024",
which Hermes v24 needed). It comes after 0023 because it needs what v23 has
(``state_meta``, ``messages.timestamp``), and before 0024 because it was written at
v23. It adds only objects of our own and alters none of Hermes', so it commutes with
every later Hermes revision: they neither see nor touch what it adds (its triggers fire
on ``messages`` and only write ``messages_cjk_bigram_dirty``).

Revision ID: hs0001
Revises: 0023
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "hs0001"
down_revision = "0023"
branch_labels = None
depends_on = None

UPGRADE = [
    """CREATE TABLE messages_cjk_bigram (
    gram TEXT NOT NULL,
    block INTEGER NOT NULL,
    PRIMARY KEY (gram, block)
) WITHOUT ROWID""",
    """CREATE TABLE messages_cjk_bigram_dirty (
    block INTEGER PRIMARY KEY
)""",
    "CREATE INDEX idx_messages_timestamp ON messages(timestamp)",
    """CREATE TRIGGER messages_cjk_bigram_dirty_insert AFTER INSERT ON messages
WHEN new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'hermes_store.cjk_bigram_high_water'), -1)
BEGIN
    INSERT OR IGNORE INTO messages_cjk_bigram_dirty(block) VALUES (new.id / 64);
END""",
    """CREATE TRIGGER messages_cjk_bigram_dirty_update
AFTER UPDATE OF content, tool_name, tool_calls ON messages
WHEN new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'hermes_store.cjk_bigram_high_water'), -1)
BEGIN
    INSERT OR IGNORE INTO messages_cjk_bigram_dirty(block) VALUES (new.id / 64);
END""",
    # Upsert, never INSERT OR REPLACE.
    """INSERT INTO state_meta (key, value) VALUES ('hermes_store.cjk_bigram_high_water', '-1')
ON CONFLICT(key) DO UPDATE SET value = excluded.value""",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("DROP TRIGGER messages_cjk_bigram_dirty_update")
    op.execute("DROP TRIGGER messages_cjk_bigram_dirty_insert")
    op.execute("DROP INDEX idx_messages_timestamp")
    op.execute("DROP TABLE messages_cjk_bigram_dirty")
    op.execute("DROP TABLE messages_cjk_bigram")
    op.execute("DELETE FROM state_meta WHERE key = 'hermes_store.cjk_bigram_high_water'")
