"""Schema v20: session_model_usage, a per-session, per-model, per-route usage ledger.

A session can switch models and billing routes mid-way, and the counters on
``sessions`` only hold totals. Hermes v20 keeps one ledger row per (session, model,
billing provider, base URL, billing mode), deleted with its session (ON DELETE
CASCADE). Sessions that already used tokens are seeded with one row carrying their
totals, so per-model reports also cover history:

* only sessions whose five token counters (input, output, cache read, cache write,
  reasoning; NULL as 0) sum to more than 0;
* ``model`` NULL → ``'unknown'``; billing provider/base URL/mode NULL → ``''`` (they are
  part of the primary key and NOT NULL);
* counters, ``api_call_count`` and both costs copied, NULL → 0; ``cost_status`` and
  ``cost_source`` copied as they are;
* ``first_seen`` = ``started_at``; ``last_seen`` = ``ended_at``, else ``started_at``.

The downgrade drops the ledger; the totals it was seeded from are still on ``sessions``.

One deliberate difference from Hermes' DDL text: Hermes writes the cascade as a column
constraint (``session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE``); we
write the same constraint as a table constraint (``FOREIGN KEY (session_id) REFERENCES
sessions(id) ON DELETE CASCADE``). SQLite stores the identical foreign key either way
(``PRAGMA foreign_key_list`` and the reference schema agree), but SQLAlchemy's SQLite
reflection only reads ON DELETE from the table-constraint form; with the column form
autogenerate would report the model's ``ondelete="CASCADE"`` as a change forever.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

UPGRADE = [
    """CREATE TABLE session_model_usage (
    session_id TEXT NOT NULL,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    api_call_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0,
    actual_cost_usd REAL NOT NULL DEFAULT 0,
    cost_status TEXT,
    cost_source TEXT,
    first_seen REAL,
    last_seen REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode),
    FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE
)""",
    "CREATE INDEX idx_session_model_usage_session ON session_model_usage(session_id)",
    "CREATE INDEX idx_session_model_usage_model ON session_model_usage(model)",
    """INSERT INTO session_model_usage (
    session_id, model, billing_provider, billing_base_url, billing_mode,
    api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    reasoning_tokens, estimated_cost_usd, actual_cost_usd, cost_status, cost_source,
    first_seen, last_seen
)
SELECT
    id,
    COALESCE(model, 'unknown'),
    COALESCE(billing_provider, ''),
    COALESCE(billing_base_url, ''),
    COALESCE(billing_mode, ''),
    COALESCE(api_call_count, 0),
    COALESCE(input_tokens, 0),
    COALESCE(output_tokens, 0),
    COALESCE(cache_read_tokens, 0),
    COALESCE(cache_write_tokens, 0),
    COALESCE(reasoning_tokens, 0),
    COALESCE(estimated_cost_usd, 0),
    COALESCE(actual_cost_usd, 0),
    cost_status,
    cost_source,
    started_at,
    COALESCE(ended_at, started_at)
FROM sessions
WHERE id IS NOT NULL
  AND COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) + COALESCE(cache_read_tokens, 0)
      + COALESCE(cache_write_tokens, 0) + COALESCE(reasoning_tokens, 0) > 0""",
    "UPDATE schema_version SET version = 20",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute("DROP INDEX idx_session_model_usage_model")
    op.execute("DROP INDEX idx_session_model_usage_session")
    op.execute("DROP TABLE session_model_usage")
    op.execute("UPDATE schema_version SET version = 19")
