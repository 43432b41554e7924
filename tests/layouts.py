"""Older Hermes table layouts, made by hand on a current file (Hermes repairs these on
open; adoption and the schema mixin's healers must keep every row)."""

from __future__ import annotations

import sqlite3


#: The ledger before Hermes put ``task`` in its primary key: the reconciler appended it.
LEDGER_WITHOUT_TASK_IN_KEY = """CREATE TABLE session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
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
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode)
)"""

LEDGER_COLS = ("session_id, model, billing_provider, billing_base_url, billing_mode, api_call_count, input_tokens, "
               "output_tokens, estimated_cost_usd, cost_status, first_seen, last_seen")


def ledger_without_task_in_key(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("CREATE TABLE ledger_rows AS SELECT * FROM session_model_usage")
    conn.execute("DROP TABLE session_model_usage")
    conn.execute(LEDGER_WITHOUT_TASK_IN_KEY)
    conn.execute(f"INSERT INTO session_model_usage ({LEDGER_COLS}) SELECT {LEDGER_COLS} FROM ledger_rows")
    conn.execute("DROP TABLE ledger_rows")
    conn.execute("ALTER TABLE session_model_usage ADD COLUMN task TEXT NOT NULL DEFAULT ''")
    conn.execute("CREATE INDEX idx_session_model_usage_session ON session_model_usage(session_id)")
    conn.execute("CREATE INDEX idx_session_model_usage_model ON session_model_usage(model)")
    rows_ = [
        ("compat_000", "gpt-4o", "openai", "", "", 3, 1200, 340, 0.0125, "estimated", 1.7e9, 1.7e9 + 60, ""),
        ("compat_001", "claude", "anthropic", "https://api.example", "api", 1, 10, 2, 0.5, None, None, None, "compression"),
        # An orphan (its session was deleted with foreign keys off): Hermes keeps it, so do we.
        ("gone_session", "gpt-4o", "", "", "", 7, 77, 7, 0, "actual", 1.6e9, 1.6e9, "vision"),
    ]
    conn.executemany(f"INSERT INTO session_model_usage ({LEDGER_COLS}, task) VALUES ({', '.join('?' * 13)})", rows_)


def routing_keyed_by_session_key(conn: sqlite3.Connection) -> None:
    """The routing table before scopes: keyed by session_key alone, scope appended later."""
    conn.execute("DROP TABLE gateway_routing")
    conn.execute("CREATE TABLE gateway_routing (session_key TEXT PRIMARY KEY, entry_json TEXT NOT NULL, "
                 "updated_at REAL NOT NULL)")
    conn.execute("ALTER TABLE gateway_routing ADD COLUMN scope TEXT NOT NULL DEFAULT ''")
    conn.executemany(
        "INSERT INTO gateway_routing (session_key, entry_json, updated_at, scope) VALUES (?, ?, ?, ?)",
        [("agent:main:telegram:dm:1", '{"session_id": "compat_000"}', 1.7e9, ""),
         ("agent:main:discord:group:2", '{"session_id": "compat_001", "note": "é✓"}', 1.7e9 + 1.5, "profile-b"),
         ("agent:main:cli", "{}", 1.7e9 + 2, "")],
    )
