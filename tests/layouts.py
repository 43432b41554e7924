"""Older Hermes table layouts, made by hand on a current file (Hermes repairs these on
open; adoption and the schema mixin's healers must keep every row)."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path


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


# ----------------------------------------------- older FTS layouts on newer table DDL
#
# Hermes' own migration tests build an "older" file the quick way: the CURRENT table
# DDL for every table (so the file carries later columns, tables and foreign keys),
# the full-text objects of the older version, and ``schema_version`` set back. Hermes
# opens such a file and heals it (SESSIONDB_V26_API.md §5.6); so must adoption. The
# DDL text is the real text, read from Hermes-written reference files.

HERMES_DBS = Path(__file__).parent / "data" / "hermes-dbs"

#: sha256 hex keys of the two prompts the builders store in ``system_prompts``.
PROMPTS = {
    hashlib.sha256(p.encode()).hexdigest(): p
    for p in ("You are Hermes, a helpful agent.", "你是一个乐于助人的助手。")
}


def hermes_ddl(name: str) -> tuple[list[str], list[str]]:
    """(plain DDL, full-text DDL) of a reference file, in its ``sqlite_master`` order.

    Plain: tables (no SQLite internals, no FTS shadow tables) then indexes. Full-text:
    every ``messages_fts*`` virtual table, view and trigger."""
    with closing(sqlite3.connect(f"file:{HERMES_DBS / f'hermes_v{name}.db'}?mode=ro", uri=True)) as conn:
        objs = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
        ).fetchall()
    fts = {n for t, n, s in objs if t == "table" and s.upper().startswith("CREATE VIRTUAL")}
    shadows = {f"{n}_{s}" for n in fts for s in ("data", "idx", "content", "docsize", "config")}
    plain, text = [], []
    for type_, name_, sql in objs:
        if name_.startswith("sqlite_") or name_ in shadows:
            continue
        if name_.startswith("messages_fts"):
            text.append((type_, sql))
        elif type_ in ("table", "index"):
            plain.append((type_, sql))
    order = {"table": 0, "view": 1, "index": 2, "trigger": 3}
    return ([s for _t, s in sorted(plain, key=lambda r: order[r[0]])],
            [s for _t, s in sorted(text, key=lambda r: order[r[0]])])


def older_fts_on_newer_tables(
    path: Path, version: int, *, fts_of: str, tables_of: str = "26", schema_sql: str | None = None,
    nullable_active: bool = False,
) -> None:
    """A file at ``version`` with the tables of ``tables_of`` (or the script
    ``schema_sql``: ``hermes_state.SCHEMA_SQL``), the full-text objects of ``fts_of``
    and the sample history of :func:`write_history`. ``nullable_active`` declares
    ``messages.active`` as an early build added it (``INTEGER DEFAULT 1``) and leaves
    some of it NULL, which Hermes sets to 1 on open."""
    plain, _ = hermes_ddl(tables_of)
    _, text = hermes_ddl(fts_of)
    with closing(sqlite3.connect(path)) as conn:
        if schema_sql is not None:
            conn.executescript(schema_sql)
        else:
            for sql in plain:
                conn.execute(sql)
        if nullable_active:
            sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute(
                "UPDATE sqlite_master SET sql = ? WHERE name = 'messages'",
                (sql.replace("active INTEGER NOT NULL DEFAULT 1", "active INTEGER DEFAULT 1"),),
            )
            conn.execute("PRAGMA writable_schema = OFF")
            conn.commit()
        with closing(sqlite3.connect(path)) as again:  # a new connection reads the edited schema
            for sql in text:
                again.execute(sql)
            again.execute("DELETE FROM schema_version")
            again.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            write_history(again)
            if nullable_active:
                again.execute("UPDATE messages SET active = NULL WHERE id % 3 = 0")
                again.execute("UPDATE messages SET active = 0 WHERE id = 4")
            again.commit()


def write_history(conn: sqlite3.Connection) -> None:
    """Sessions and messages as Hermes writes them, using only the columns the file has:
    titles, tool calls, CJK text, a compression chain, prompts by hash (where the file
    has ``system_prompts``), a usage-ledger row."""
    scols = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    hashes = sorted(PROMPTS)
    if "system_prompts" in tables:
        conn.executemany("INSERT INTO system_prompts (hash, prompt) VALUES (?, ?)", sorted(PROMPTS.items()))
    sessions = [
        # id, source, parent, title, end_reason, prompt hash
        ("s_root", "cli", None, "Deploy the lighthouse", "compression", hashes[0]),
        ("s_cont", "cli", "s_root", "Deploy the lighthouse #2", None, hashes[0]),
        ("s_cjk", "telegram", None, "数据库迁移计划", None, hashes[1]),
        ("s_tools", "cli", None, "Quokka research", "user_exit", None),
    ]
    for i, (sid, source, parent, title, end, h) in enumerate(sessions):
        row: dict[str, object] = {"id": sid, "source": source, "parent_session_id": parent,
                                  "started_at": 1_700_000_000.0 + i * 100, "model": "gpt-4o"}
        if "title" in scols:
            row["title"] = title
        if end:
            row["ended_at"] = 1_700_000_050.0 + i * 100
            row["end_reason"] = end
        if h and "system_prompt_hash" in scols:
            row["system_prompt_hash"] = h
        elif h:
            row["system_prompt"] = PROMPTS[h]
        if "title_source" in scols and title:
            row["title_source"] = "user"
        conn.execute(f"INSERT INTO sessions ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                     tuple(row.values()))
    msgs = [
        ("s_root", "user", "please deploy the lighthouse beacon", None, None),
        ("s_root", "assistant", None, None, '[{"id": "c1", "function": {"name": "terminal", '
                                            '"arguments": "{\\"command\\": \\"kubectl rollout\\"}"}}]'),
        ("s_root", "tool", "rollout finished: zebrafish-7 ready", "terminal", None),
        ("s_cont", "user", "[CONTEXT COMPACTION] the beacon was deployed", None, None),
        ("s_cont", "assistant", "the lighthouse beacon is live", None, None),
        ("s_cjk", "user", "请帮我检查数据库迁移的进度", None, None),
        ("s_cjk", "assistant", "数据库迁移已经完成了百分之八十", None, None),
        ("s_tools", "assistant", "", None, '[{"id": "c2", "function": {"name": "web_search", '
                                          '"arguments": "{\\"q\\": \\"quokka habitat\\"}"}}]'),
        ("s_tools", "tool", "quokkas live on Rottnest Island", "web_search", None),
    ]
    for i, (sid, role, content, tool_name, tool_calls) in enumerate(msgs):
        conn.execute(
            "INSERT INTO messages (session_id, role, content, tool_name, tool_calls, timestamp) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (sid, role, content, tool_name, tool_calls, 1_700_000_001.0 + i),
        )
    conn.execute("UPDATE sessions SET message_count = "
                 "(SELECT count(*) FROM messages WHERE messages.session_id = sessions.id)")
    if "session_model_usage" in tables:
        ucols = {r[1] for r in conn.execute("PRAGMA table_info(session_model_usage)")}
        row = {"session_id": "s_root", "model": "gpt-4o", "billing_provider": "openai", "api_call_count": 3,
               "input_tokens": 1200, "output_tokens": 340, "estimated_cost_usd": 0.0125}
        row = {k: v for k, v in row.items() if k in ucols}
        conn.execute(f"INSERT INTO session_model_usage ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                     tuple(row.values()))
