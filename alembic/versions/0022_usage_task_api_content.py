"""Schema v22: the usage ledger is split by task; messages.api_content.

Hermes v22 attributes usage not only to a model and billing route but also to the task
that spent it (the main turn, title generation, compression, ...):
``session_model_usage.task`` (NOT NULL DEFAULT '') joins the primary key. SQLite cannot
change a primary key in place, so the table is rebuilt: the old table is renamed aside,
the new one is created from Hermes' DDL, every row is copied with ``task = ''``, the old
table is dropped and both indexes are created again. Nothing references the ledger, so
the rename touches no other table. The same version adds ``messages.api_content``
(TEXT; NULL on existing rows).

Downgrade rebuilds the 5-column key. Rows that differ only by task would collide there,
so they are merged into one: counters and costs summed, ``first_seen`` the earliest,
``last_seen`` the latest, ``cost_status``/``cost_source`` taken from the task-less row if
there is one, else from the most recently seen row. Totals per (session, model, route)
are therefore unchanged.

As in 0020, the cascade to ``sessions`` is written as a table constraint (same foreign
key to SQLite, visible to SQLAlchemy's reflection).

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

OLD = "hermes_store_0022_usage_old"

USAGE_V22 = """CREATE TABLE session_model_usage (
    session_id TEXT NOT NULL,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
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
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task),
    FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE
)"""

USAGE_V21 = """CREATE TABLE session_model_usage (
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
)"""

INDEXES = [
    "CREATE INDEX idx_session_model_usage_session ON session_model_usage(session_id)",
    "CREATE INDEX idx_session_model_usage_model ON session_model_usage(model)",
]

KEY = "session_id, model, billing_provider, billing_base_url, billing_mode"
COUNTERS = (
    "api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, "
    "reasoning_tokens, estimated_cost_usd, actual_cost_usd"
)
REST = "cost_status, cost_source, first_seen, last_seen"


def _set_aside() -> None:
    # The indexes would travel with the renamed table and block the new ones' names.
    op.execute("DROP INDEX idx_session_model_usage_model")
    op.execute("DROP INDEX idx_session_model_usage_session")
    op.execute(f"ALTER TABLE session_model_usage RENAME TO {OLD}")


def _finish() -> None:
    op.execute(f"DROP TABLE {OLD}")
    for sql in INDEXES:
        op.execute(sql)


def _pick(column: str) -> str:
    """``column`` of the row a merged group keeps its labels from."""
    return f"""(SELECT o2.{column} FROM {OLD} o2
        WHERE o2.session_id = o.session_id AND o2.model = o.model
          AND o2.billing_provider = o.billing_provider
          AND o2.billing_base_url = o.billing_base_url
          AND o2.billing_mode = o.billing_mode
        ORDER BY o2.task = '' DESC, o2.last_seen IS NULL, o2.last_seen DESC
        LIMIT 1)"""


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    _set_aside()
    op.execute(USAGE_V22)
    op.execute(
        f"INSERT INTO session_model_usage ({KEY}, task, {COUNTERS}, {REST}) "
        f"SELECT {KEY}, '', {COUNTERS}, {REST} FROM {OLD}"
    )
    _finish()
    op.execute("ALTER TABLE messages ADD COLUMN api_content TEXT")
    op.execute("UPDATE schema_version SET version = 22")


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.drop_column("messages", "api_content")
    _set_aside()
    op.execute(USAGE_V21)
    sums = ", ".join(f"SUM(o.{c.strip()})" for c in COUNTERS.split(","))
    op.execute(
        f"""INSERT INTO session_model_usage ({KEY}, {COUNTERS}, {REST})
    SELECT o.session_id, o.model, o.billing_provider, o.billing_base_url, o.billing_mode,
           {sums},
           {_pick('cost_status')},
           {_pick('cost_source')},
           MIN(o.first_seen),
           MAX(o.last_seen)
    FROM {OLD} o
    GROUP BY o.session_id, o.model, o.billing_provider, o.billing_base_url, o.billing_mode"""
    )
    _finish()
    op.execute("UPDATE schema_version SET version = 21")
