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

``schema_version`` stays 23: Hermes can still open the file and ignores these objects.
The index starts empty (high water -1 = nothing indexed, everything scanned) and is
built by the first SessionDB open or ``hermes-store fts rebuild``, so upgrading a large
file stays quick.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

from alembic import op

revision = "0024"
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
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    op.execute("DROP TRIGGER messages_cjk_bigram_dirty_update")
    op.execute("DROP TRIGGER messages_cjk_bigram_dirty_insert")
    op.execute("DROP INDEX idx_messages_timestamp")
    op.execute("DROP TABLE messages_cjk_bigram_dirty")
    op.execute("DROP TABLE messages_cjk_bigram")
    op.execute("DELETE FROM state_meta WHERE key = 'hermes_store.cjk_bigram_high_water'")
