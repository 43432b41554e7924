"""Revisions 0012-0023: exact schemas, data steps (delegate tags, usage ledger, ledger
rebuild), the v23 FTS redesign, and round trips with data back to 0011.

Databases are filled with plain SQL at the revision under test, the way Hermes (or a
user's months-old file) would have written them, then migrated.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from collections.abc import Callable

import pytest
from sqlalchemy import event

from hermes_store import introspect, migrations
from hermes_store.engine import create_engine

from ..helpers import integrity_check, reference_schema, rev, snap

Raw = Callable[[], sqlite3.Connection]

SESSION_COLS_V11 = (
    "id, source, user_id, model, model_config, system_prompt, parent_session_id, started_at, ended_at, "
    "end_reason, message_count, tool_call_count, input_tokens, output_tokens, title, cache_read_tokens, "
    "cache_write_tokens, reasoning_tokens, billing_provider, billing_base_url, billing_mode, "
    "estimated_cost_usd, actual_cost_usd, cost_status, cost_source, pricing_version, api_call_count, "
    "handoff_state, handoff_platform, handoff_error"
)
MESSAGE_COLS_V11 = (
    "id, session_id, role, content, tool_call_id, tool_calls, tool_name, timestamp, token_count, "
    "finish_reason, reasoning, reasoning_details, codex_reasoning_items, reasoning_content, codex_message_items"
)

# ------------------------------------------------------------------ a v11 history

# id, model, parent, started, ended, end_reason, title,
# (input, output, cache_read, cache_write, reasoning), billing (provider, base_url, mode),
# (estimated, actual), cost_status, cost_source, api_call_count
LEDGER_SESSIONS = [
    ("u_full", "anthropic/claude-sonnet-4", None, 1000.0, 1100.0, "completed", "Full billing",
     (100, 50, 10, 5, 3), ("anthropic", "https://api.anthropic.com", "api"), (0.12, 0.10),
     "estimated", "pricing_table", 4),
    ("u_nullmodel", None, None, 2000.0, None, None, "No model yet",
     (0, None, None, None, 7), (None, None, None), (None, None), None, None, None),
    ("u_cont", "openai/gpt-5", "u_full", 1200.0, None, None, None,
     (1, 0, 0, 0, 0), ("openrouter", None, "subscription"), (None, 0.5), "actual", None, 2),
    ("u_zero", "openai/gpt-5", None, 3000.0, 3001.0, "completed", "Zero usage",
     (0, 0, 0, 0, 0), (None, None, None), (0.0, 0.0), None, None, 1),
    ("u_allnull", None, None, 4000.0, None, None, "Nothing at all",
     (None, None, None, None, None), (None, None, None), (None, None), None, None, None),
]

# session, role, content, tool_name, tool_calls
HISTORY = [
    ("u_full", "user", "please deploy the zebrafish pipeline", None, None),
    ("u_full", "assistant", None, None,
     '[{"id": "c1", "type": "function", "function": {"name": "terminal", '
     '"arguments": "{\\"cmd\\": \\"kubectl rollout quokka\\"}"}}]'),
    ("u_full", "tool", "rollout finished ocelot 工具输出结果", "terminal", None),
    ("u_full", "assistant", "数据库迁移测试 完成 marmot", None, None),
    ("u_cont", "user", "继续数据库迁移测试 wombat", None, None),
    ("u_cont", "assistant", "summary of narwhal findings", None, None),
    ("u_nullmodel", "user", "hello axolotl", None, None),
]


def seed_v11(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN")
    for (sid, model, parent, started, ended, reason, title, toks, billing, costs, status, source,
         calls) in LEDGER_SESSIONS:
        conn.execute(
            "INSERT INTO sessions (id, source, model, parent_session_id, started_at, ended_at, end_reason, "
            "title, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, "
            "billing_provider, billing_base_url, billing_mode, estimated_cost_usd, actual_cost_usd, "
            "cost_status, cost_source, api_call_count, model_config, handoff_state) "
            "VALUES (?, 'cli', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (sid, model, parent, started, ended, reason, title, *toks, *billing, *costs, status, source, calls,
             '{"temperature": 0.2}' if sid == "u_full" else None, "idle" if sid == "u_zero" else None),
        )
    # u_full ended with 'completed', so its child u_cont is a delegate by rule (a).
    for i, (sid, role, content, tool_name, tool_calls) in enumerate(HISTORY):
        conn.execute(
            "INSERT INTO messages (session_id, role, content, tool_name, tool_calls, tool_call_id, "
            "timestamp, reasoning) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (sid, role, content, tool_name, tool_calls, "c1" if role == "tool" else None, 5000.0 + i,
             "thinking" if role == "assistant" else None),
        )
    conn.execute("COMMIT")


def rows(conn: sqlite3.Connection, table: str, cols: str) -> list[tuple]:
    return conn.execute(f"SELECT {cols} FROM {table} ORDER BY 1").fetchall()




def fts_find(conn: sqlite3.Connection, table: str, term: str) -> set[int]:
    phrase = '"' + term.replace('"', '""') + '"'
    return {r[0] for r in conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ?", (phrase,))}




def msg_id(conn: sqlite3.Connection, content_like: str) -> int:
    return conn.execute("SELECT id FROM messages WHERE content LIKE ?", (f"%{content_like}%",)).fetchone()[0]


@pytest.fixture
def seeded_v11(migrate, db_path: Path, raw: Raw) -> Path:
    migrate("0011")
    conn = raw()
    seed_v11(conn)
    conn.close()
    return db_path


# ------------------------------------------------------------------ schemas


def test_each_revision_12_to_23_gives_hermes_schema_up_and_down(migrate, db_path: Path) -> None:
    migrate("0011")
    for n in range(12, 24):
        migrations.upgrade(db_path, rev(n))
        live = snap(db_path)
        assert introspect.diff(reference_schema(n), live) == [], n
        assert live["schema_version"] == n
    for n in range(22, 10, -1):
        migrations.downgrade(db_path, rev(n))
        live = snap(db_path)
        assert introspect.diff(reference_schema(n), live) == [], n
        assert live["schema_version"] == n
        assert migrations.current(db_path) == rev(n)


def test_ledger_foreign_key_cascades(migrate, db_path: Path, raw: Raw) -> None:
    migrate("head")
    conn = raw()
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1.0)")
    conn.execute("INSERT INTO session_model_usage (session_id, model) VALUES ('s', 'm')")
    conn.execute("INSERT INTO session_model_usage (session_id, model, task) VALUES ('s', 'm', 'title')")
    conn.execute("DELETE FROM sessions WHERE id = 's'")
    assert conn.execute("SELECT count(*) FROM session_model_usage").fetchone()[0] == 0


# ------------------------------------------------------------------ data through the chain


def test_v11_history_survives_to_23(seeded_v11: Path, raw: Raw) -> None:
    conn = raw()
    sessions_before = rows(conn, "sessions", SESSION_COLS_V11)
    messages_before = rows(conn, "messages", MESSAGE_COLS_V11)
    conn.close()
    migrations.upgrade(seeded_v11, "0023")
    conn = raw()
    sessions_after = rows(conn, "sessions", SESSION_COLS_V11)
    assert rows(conn, "messages", MESSAGE_COLS_V11) == messages_before
    # The only change to old columns: 0016 tags the delegate child in model_config.
    mc = SESSION_COLS_V11.split(", ").index("model_config")
    for before, after in zip(sessions_before, sessions_after, strict=True):
        assert before[:mc] + before[mc + 1:] == after[:mc] + after[mc + 1:]
    tags = {r[0]: r[1] for r in conn.execute("SELECT id, json_extract(model_config, '$._delegate_from') FROM sessions")}
    assert tags == {"u_full": None, "u_nullmodel": None, "u_cont": "u_full", "u_zero": None, "u_allnull": None}
    assert json.loads(conn.execute("SELECT model_config FROM sessions WHERE id='u_cont'").fetchone()[0]) == {
        "_delegate_from": "u_full"
    }
    # New columns carry their defaults on old rows.
    assert conn.execute(
        "SELECT DISTINCT active, compacted, observed FROM messages"
    ).fetchall() == [(1, 0, 0)]
    assert conn.execute(
        "SELECT DISTINCT rewind_count, archived, expiry_finalized, compression_fallback_streak FROM sessions"
    ).fetchall() == [(0, 0, 0, 0)]
    integrity_check(conn)
    conn.close()


def expected_ledger() -> list[tuple]:
    out = []
    for (sid, model, _parent, started, ended, _reason, _title, toks, billing, costs, status, source,
         calls) in LEDGER_SESSIONS:
        if sum(t or 0 for t in toks) <= 0:
            continue
        out.append((
            sid, model or "unknown", *(b or "" for b in billing), calls or 0, *(t or 0 for t in toks),
            *(float(c or 0) for c in costs), status, source, started, ended if ended is not None else started,
        ))
    return sorted(out)


LEDGER_COLS = (
    "session_id, model, billing_provider, billing_base_url, billing_mode, api_call_count, input_tokens, "
    "output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, estimated_cost_usd, "
    "actual_cost_usd, cost_status, cost_source, first_seen, last_seen"
)


def test_ledger_seeded_per_session(seeded_v11: Path, raw: Raw) -> None:
    migrations.upgrade(seeded_v11, "0020")
    conn = raw()
    got = rows(conn, "session_model_usage", LEDGER_COLS)
    assert got == expected_ledger()
    assert {r[0] for r in got} == {"u_full", "u_nullmodel", "u_cont"}  # zero/NULL usage: no row
    conn.close()


def test_v22_keeps_ledger_and_task_joins_the_key(seeded_v11: Path, raw: Raw) -> None:
    migrations.upgrade(seeded_v11, "0022")
    conn = raw()
    assert rows(conn, "session_model_usage", LEDGER_COLS) == expected_ledger()
    assert conn.execute("SELECT DISTINCT task FROM session_model_usage").fetchall() == [("",)]
    # Two rows that differ only by task now coexist ...
    conn.execute(
        "INSERT INTO session_model_usage (session_id, model, billing_provider, billing_base_url, billing_mode, "
        "task, api_call_count, input_tokens, output_tokens, estimated_cost_usd, first_seen, last_seen, cost_status) "
        "VALUES ('u_full', 'anthropic/claude-sonnet-4', 'anthropic', 'https://api.anthropic.com', 'api', "
        "'title', 1, 20, 2, 0.01, 900.0, 1500.0, 'title-status')"
    )
    # ... but the same task twice does not.
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO session_model_usage (session_id, model, billing_provider, billing_base_url, "
            "billing_mode, task) VALUES ('u_full', 'anthropic/claude-sonnet-4', 'anthropic', "
            "'https://api.anthropic.com', 'api', 'title')"
        )
    conn.close()

    # Downgrade merges them back into one row per 5-column key.
    migrations.downgrade(seeded_v11, "0021")
    conn = raw()
    merged = {r[0]: r for r in rows(conn, "session_model_usage", LEDGER_COLS)}
    full = dict(zip([c.strip() for c in LEDGER_COLS.split(",")], merged["u_full"], strict=True))
    assert (full["api_call_count"], full["input_tokens"], full["output_tokens"]) == (5, 120, 52)
    assert full["estimated_cost_usd"] == pytest.approx(0.13)
    assert (full["first_seen"], full["last_seen"]) == (900.0, 1500.0)
    assert full["cost_status"] == "estimated"  # labels come from the task-less row
    others = [r for r in expected_ledger() if r[0] != "u_full"]
    assert [merged[r[0]] for r in others] == others
    conn.close()
    assert introspect.diff(reference_schema(21), snap(seeded_v11)) == []


# ------------------------------------------------------------------ v16 delegate tagging

# id, parent, started, ended, end_reason, title, model_config, (messages: roles)
TAGGING = [
    ("p_done", None, 100.0, 200.0, "completed", "parent done", None, ["user", "tool"]),
    ("c_delegate", "p_done", 150.0, None, None, None, None, ["user"]),
    ("c_delegate_cfg", "p_done", 160.0, None, None, None, '{"temperature": 0.5, "tools": ["web"]}', []),
    ("c_branch_marker", "p_done", 170.0, None, None, None, '{"_branched_from": "p_done"}', []),
    ("c_has_tag", "p_done", 180.0, None, None, None, '{"_delegate_from": "somewhere", "x": 1}', []),
    ("c_bad_json", "p_done", 190.0, None, None, None, "not json {", []),
    ("p_branched", None, 300.0, 400.0, "branched", "parent branched", None, []),
    ("c_branch", "p_branched", 400.0, None, None, None, None, ["user"]),
    ("c_early_of_branched", "p_branched", 350.0, None, None, None, None, []),
    ("p_comp", None, 500.0, 600.0, "compression", "parent compressed", None, []),
    ("c_comp", "p_comp", 601.0, None, None, None, None, ["user"]),
    ("c_comp_early", "p_comp", 550.0, None, None, None, None, []),
    ("orphan", None, 700.0, None, None, None, None, ["user", "assistant", "tool", "assistant"]),
    ("orphan_cfg", None, 710.0, None, None, None, '{"max_turns": 3}', ["tool"]),
    ("titled", None, 800.0, None, None, "has a title", None, ["user", "tool"]),
    ("no_tool", None, 900.0, None, None, None, None, ["user", "assistant"]),
    ("too_long", None, 1000.0, None, None, None, None, ["tool"] + ["user"] * 25),
    ("just_25", None, 1050.0, None, None, None, None, ["tool"] + ["user"] * 24),
    ("branched_root", None, 1100.0, None, None, None, '{"_branched_from": "gone"}', ["tool"]),
    ("has_child", None, 1200.0, 1300.0, "completed", None, None, ["tool"]),
    ("c_of_has_child", "has_child", 1250.0, None, None, "child titled", None, []),
]

EXPECTED_TAGS = {
    "c_delegate": "p_done",
    "c_delegate_cfg": "p_done",
    "c_has_tag": "somewhere",  # untouched
    "c_early_of_branched": "p_branched",  # started before the branch point
    "c_comp_early": "p_comp",  # started before the compression ended the parent
    "orphan": "__orphaned__",
    "orphan_cfg": "__orphaned__",
    "just_25": "__orphaned__",
    "c_of_has_child": "has_child",
}


def seed_tagging(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN")
    t = 10_000.0
    for sid, parent, started, ended, reason, title, cfg, roles in TAGGING:
        conn.execute(
            "INSERT INTO sessions (id, source, parent_session_id, started_at, ended_at, end_reason, title, "
            "model_config) VALUES (?, 'cli', ?, ?, ?, ?, ?, ?)",
            (sid, parent, started, ended, reason, title, cfg),
        )
        for role in roles:
            t += 1
            conn.execute(
                "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                (sid, role, f"{role} line", t),
            )
    conn.execute("COMMIT")


def test_v16_tags_delegates_and_orphans_and_downgrade_restores(migrate, db_path: Path, raw: Raw) -> None:
    migrate("0015")
    conn = raw()
    seed_tagging(conn)
    before = dict(conn.execute("SELECT id, model_config FROM sessions").fetchall())
    conn.close()

    migrate("0016")
    conn = raw()
    after = dict(conn.execute("SELECT id, model_config FROM sessions").fetchall())
    tags = {
        sid: json.loads(cfg).get("_delegate_from")
        for sid, cfg in after.items()
        if cfg is not None and cfg != "not json {" and json.loads(cfg).get("_delegate_from")
    }
    assert tags == EXPECTED_TAGS
    assert after["c_bad_json"] == "not json {"
    assert after["c_has_tag"] == before["c_has_tag"]
    assert json.loads(after["c_delegate_cfg"]) == {"temperature": 0.5, "tools": ["web"], "_delegate_from": "p_done"}
    assert json.loads(after["orphan_cfg"]) == {"max_turns": 3, "_delegate_from": "__orphaned__"}
    untouched = set(before) - set(EXPECTED_TAGS)
    assert {sid: after[sid] for sid in untouched} == {sid: before[sid] for sid in untouched}
    assert snap(db_path)["schema_version"] == 16
    conn.close()

    # Downgrade: the original text comes back verbatim (NULL stays NULL), and tags that
    # were there before the step survive.
    migrate("0015")
    conn = raw()
    assert dict(conn.execute("SELECT id, model_config FROM sessions").fetchall()) == before
    assert conn.execute("SELECT count(*) FROM state_meta WHERE key LIKE 'hermes_store.%'").fetchone()[0] == 0
    conn.close()
    assert introspect.diff(reference_schema(15), snap(db_path)) == []

    # Up again: same tags (the step is deterministic).
    migrate("0016")
    conn = raw()
    assert dict(conn.execute("SELECT id, model_config FROM sessions").fetchall()) == after
    conn.close()


def test_v16_downgrade_only_removes_its_own_marker(migrate, db_path: Path, raw: Raw) -> None:
    migrate("0015")
    conn = raw()
    seed_tagging(conn)
    conn.close()
    migrate("0016")
    conn = raw()
    # After the upgrade the application edits one tagged config and re-targets another,
    # and tags a session itself.
    conn.execute(
        "UPDATE sessions SET model_config = json_set(model_config, '$.temperature', 0.9) WHERE id = 'c_delegate'"
    )
    conn.execute(
        "UPDATE sessions SET model_config = json_set(model_config, '$._delegate_from', 'p_comp') WHERE id = 'orphan'"
    )
    conn.execute(
        "UPDATE sessions SET model_config = '{\"_delegate_from\": \"p_done\"}' WHERE id = 'c_branch'"
    )
    conn.close()
    migrate("0015")
    conn = raw()
    cfg = dict(conn.execute("SELECT id, model_config FROM sessions").fetchall())
    assert json.loads(cfg["c_delegate"]) == {"temperature": 0.9}  # our key removed, the edit kept
    assert json.loads(cfg["orphan"]) == {"_delegate_from": "p_comp"}  # not ours any more
    assert json.loads(cfg["c_branch"]) == {"_delegate_from": "p_done"}  # the application's own
    conn.close()


# ------------------------------------------------------------------ v23 FTS


def test_v23_fts_finds_content_tool_fields_and_cjk(seeded_v11: Path, raw: Raw) -> None:
    migrations.upgrade(seeded_v11, "0023")
    conn = raw()
    integrity_check(conn)
    ids = {r[0] for r in conn.execute("SELECT id FROM messages")}
    tool_ids = {r[0] for r in conn.execute("SELECT id FROM messages WHERE role = 'tool'")}
    zebra, call, tool = msg_id(conn, "zebrafish"), 2, msg_id(conn, "ocelot")
    assert conn.execute("SELECT tool_calls IS NOT NULL FROM messages WHERE id = ?", (call,)).fetchone() == (1,)

    assert fts_find(conn, "messages_fts", "zebrafish") == {zebra}
    assert fts_find(conn, "messages_fts", "quokka") == {call}  # tool-call arguments
    assert fts_find(conn, "messages_fts", "terminal") == {call, tool}  # tool name + arguments
    assert fts_find(conn, "messages_fts", "ocelot") == {tool}
    assert {r[0] for r in conn.execute(
        "SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'tool_name : terminal'"
    )} == {tool}
    # Word index: every message is there.
    assert {r[0] for r in conn.execute("SELECT rowid FROM messages_fts")} == ids

    # Trigram: CJK substrings of non-tool rows; tool rows are left out.
    cjk = {msg_id(conn, "数据库迁移测试 完成"), msg_id(conn, "继续数据库")}
    assert fts_find(conn, "messages_fts_trigram", "据库迁移") == cjk
    assert fts_find(conn, "messages_fts_trigram", "工具输出") == set()
    assert fts_find(conn, "messages_fts_trigram", "ocelot") == set()
    assert fts_find(conn, "messages_fts_trigram", "quokka") == {call}
    assert fts_find(conn, "messages_fts_trigram", "hello axo") == {msg_id(conn, "axolotl")}
    assert {r[0] for r in conn.execute("SELECT rowid FROM messages_fts_trigram")} == ids - tool_ids
    conn.close()


def test_v23_triggers_keep_both_indexes_consistent(seeded_v11: Path, raw: Raw) -> None:
    migrations.upgrade(seeded_v11, "0023")
    conn = raw()
    conn.execute("BEGIN")
    user = conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) VALUES ('u_full', 'user', '新的搜索词 capybara', 1)"
    ).lastrowid
    tool = conn.execute(
        "INSERT INTO messages (session_id, role, content, tool_name, timestamp) "
        "VALUES ('u_full', 'tool', '工具专用文本 pangolin', 'browser', 2)"
    ).lastrowid
    assert fts_find(conn, "messages_fts", "capybara") == {user}
    assert fts_find(conn, "messages_fts_trigram", "的搜索") == {user}
    assert fts_find(conn, "messages_fts", "pangolin") == {tool}
    assert fts_find(conn, "messages_fts", "browser") == {tool}
    assert fts_find(conn, "messages_fts_trigram", "工具专用") == set()

    conn.execute("UPDATE messages SET content = '改过的内容 lemur' WHERE id = ?", (user,))
    assert fts_find(conn, "messages_fts", "capybara") == set()
    assert fts_find(conn, "messages_fts", "lemur") == {user}
    assert fts_find(conn, "messages_fts_trigram", "的搜索") == set()
    assert fts_find(conn, "messages_fts_trigram", "过的内") == {user}
    # Untouched indexed columns: the update triggers do nothing, the index stays right.
    conn.execute("UPDATE messages SET token_count = 5, active = 0 WHERE id = ?", (user,))
    # A role change moves a row into / out of the trigram index.
    conn.execute("UPDATE messages SET role = 'assistant' WHERE id = ?", (tool,))
    assert fts_find(conn, "messages_fts_trigram", "工具专用") == {tool}
    conn.execute("UPDATE messages SET role = 'tool', tool_name = 'shell' WHERE id = ?", (tool,))
    assert fts_find(conn, "messages_fts_trigram", "工具专用") == set()
    assert fts_find(conn, "messages_fts", "shell") == {tool}
    assert fts_find(conn, "messages_fts", "browser") == set()
    integrity_check(conn)

    conn.execute("DELETE FROM messages WHERE id IN (?, ?)", (user, tool))
    assert fts_find(conn, "messages_fts", "lemur") == set()
    assert fts_find(conn, "messages_fts", "shell") == set()
    assert fts_find(conn, "messages_fts_trigram", "过的内") == set()
    # Old rows: delete one tool row and one CJK row through the triggers.
    conn.execute("DELETE FROM messages WHERE content LIKE '%ocelot%' OR content LIKE '继续%'")
    assert fts_find(conn, "messages_fts", "ocelot") == set()
    assert fts_find(conn, "messages_fts_trigram", "继续数据") == set()
    integrity_check(conn)
    conn.execute("COMMIT")
    conn.close()


def test_v23_upgrade_clears_a_stale_rebuild_window(migrate, db_path: Path, raw: Raw) -> None:
    migrate("0022")
    conn = raw()
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1)")
    for i in range(5):
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', ?, ?)",
                     (f"row{i} gecko", i))
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('fts_rebuild_high_water', '1000')")
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('fts_rebuild_progress', '0')")
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('last_auto_prune', '123')")
    conn.close()
    migrate("0023")
    conn = raw()
    assert dict(conn.execute("SELECT key, value FROM state_meta")) == {"last_auto_prune": "123"}
    assert len(fts_find(conn, "messages_fts", "gecko")) == 5
    new = conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'fresh gecko', 9)").lastrowid
    assert new in fts_find(conn, "messages_fts", "gecko")
    assert new in fts_find(conn, "messages_fts_trigram", "fresh gec")
    # Hermes' rebuild window, as the triggers read it: rows in (progress, high_water]
    # are left to the rebuild.
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('fts_rebuild_high_water', ?)", (new + 10,))
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('fts_rebuild_progress', ?)", (new - 1,))
    conn.execute("UPDATE messages SET content = 'window iguana' WHERE id = ?", (new,))
    assert fts_find(conn, "messages_fts", "iguana") == set()
    conn.close()


def test_v23_backfill_in_chunks_covers_sparse_ids(migrate, db_path: Path, raw: Raw) -> None:
    migrate("0022")
    conn = raw()
    conn.execute("BEGIN")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('big', 'cli', 1)")
    payload = [(i, "user" if i % 3 else "tool", f"bulk{i} heron 鹭鸟记录{i}", float(i))
               for i in list(range(1, 6002)) + list(range(100_000, 105_500))]
    conn.executemany(
        "INSERT INTO messages (id, session_id, role, content, timestamp) VALUES (?, 'big', ?, ?, ?)", payload
    )
    conn.execute("COMMIT")
    conn.close()
    migrate("0023")
    conn = raw()
    integrity_check(conn)
    assert conn.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'heron'").fetchone()[0] == len(payload)
    non_tool = sum(1 for p in payload if p[1] != "tool")
    assert conn.execute(
        "SELECT count(*) FROM messages_fts_trigram WHERE messages_fts_trigram MATCH '鹭鸟记'"
    ).fetchone()[0] == non_tool
    assert fts_find(conn, "messages_fts", "bulk105499") == {105_499}
    assert fts_find(conn, "messages_fts", "bulk6001") == {6001}
    conn.close()


def test_downgrade_23_to_22_gives_working_inline_fts(seeded_v11: Path, raw: Raw) -> None:
    migrations.upgrade(seeded_v11, "0023")
    migrations.downgrade(seeded_v11, "0022")
    assert introspect.diff(reference_schema(22), snap(seeded_v11)) == []
    conn = raw()
    integrity_check(conn)
    ids = {r[0] for r in conn.execute("SELECT id FROM messages")}
    for table in ("messages_fts", "messages_fts_trigram"):
        # every message is indexed again, tool rows included (v22 trigram has them)
        assert {r[0] for r in conn.execute(f"SELECT rowid FROM {table}")} == ids
        for (mid, content, tool_name, tool_calls) in conn.execute(
            "SELECT id, content, tool_name, tool_calls FROM messages"
        ):
            word = re.findall(r"[a-z]{5,}", f"{content or ''} {tool_name or ''} {tool_calls or ''}")[-1]
            assert mid in fts_find(conn, table, word)
    assert fts_find(conn, "messages_fts", "quokka") == {2}
    assert fts_find(conn, "messages_fts_trigram", "工具输出") == {msg_id(conn, "ocelot")}
    # and the v22 triggers work
    new = conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) VALUES ('u_full', 'user', 'back to v22 tapir', 9)"
    ).lastrowid
    assert fts_find(conn, "messages_fts", "tapir") == {new}
    conn.execute("DELETE FROM messages WHERE id = ?", (new,))
    assert fts_find(conn, "messages_fts_trigram", "tapir") == set()
    integrity_check(conn)
    conn.close()


# ------------------------------------------------------------------ round trips


def test_up_down_up_11_to_23_with_data(seeded_v11: Path, raw: Raw) -> None:
    conn = raw()
    sessions_v11 = rows(conn, "sessions", SESSION_COLS_V11)
    messages_v11 = rows(conn, "messages", MESSAGE_COLS_V11)
    conn.close()

    migrations.upgrade(seeded_v11, "0023")
    conn = raw()
    sessions_23 = rows(conn, "sessions", "*")
    messages_23 = rows(conn, "messages", "*")
    ledger_23 = rows(conn, "session_model_usage", "*")
    conn.close()

    migrations.downgrade(seeded_v11, "0011")
    assert introspect.diff(reference_schema(11), snap(seeded_v11)) == []
    conn = raw()
    assert rows(conn, "sessions", SESSION_COLS_V11) == sessions_v11
    assert rows(conn, "messages", MESSAGE_COLS_V11) == messages_v11
    assert conn.execute("SELECT count(*) FROM state_meta").fetchone()[0] == 0
    for table in ("messages_fts", "messages_fts_trigram"):
        assert fts_find(conn, table, "marmot") == {msg_id(conn, "marmot")}
    conn.close()

    migrations.upgrade(seeded_v11, "0023")
    assert introspect.diff(reference_schema(23), snap(seeded_v11)) == []
    conn = raw()
    assert rows(conn, "sessions", "*") == sessions_23
    assert rows(conn, "messages", "*") == messages_23
    assert rows(conn, "session_model_usage", "*") == ledger_23
    integrity_check(conn)
    assert fts_find(conn, "messages_fts", "wombat") == {msg_id(conn, "wombat")}
    conn.close()


# ------------------------------------------------------------------ atomicity


@pytest.mark.parametrize(
    "start, target, pattern",
    [
        ("0015", "0016", r"^UPDATE sessions SET model_config"),
        ("0019", "0020", r"^INSERT INTO session_model_usage"),
        ("0021", "0022", r"^DROP TABLE hermes_store_0022_usage_old"),
        ("0022", "0023", r"^INSERT INTO messages_fts_trigram\(rowid"),
        ("0023", "0022", r"^INSERT INTO messages_fts_trigram\(rowid"),
        ("0022", "0021", r"^CREATE INDEX idx_session_model_usage_model"),
    ],
)
def test_failing_data_step_leaves_previous_revision(
    start: str, target: str, pattern: str, seeded_v11: Path, raw: Raw
) -> None:
    migrations.upgrade(seeded_v11, start)
    before = snap(seeded_v11)
    conn = raw()
    data_before = {t: rows(conn, t, "*") for t in ("sessions", "messages", "state_meta")}
    conn.close()
    engine = create_engine(seeded_v11, foreign_keys=False)

    @event.listens_for(engine, "before_cursor_execute")
    def _boom(_conn, _cursor, statement, *_args):
        if re.search(pattern, statement.lstrip()):
            raise RuntimeError("injected failure")

    with pytest.raises(RuntimeError, match="injected failure"):
        if target > start:
            migrations.upgrade(engine, target)
        else:
            migrations.downgrade(engine, target)
    engine.dispose()
    assert snap(seeded_v11) == before
    assert migrations.current(seeded_v11) == start
    conn = raw()
    assert {t: rows(conn, t, "*") for t in data_before} == data_before
    if int(start) >= 10:
        for table in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
    conn.close()
    # The same step then applies cleanly.
    (migrations.upgrade if target > start else migrations.downgrade)(seeded_v11, target)
    assert migrations.current(seeded_v11) == target


# ------------------------------------------------------------------ models at head


def test_head_models_round_trip_new_tables(session) -> None:
    from sqlalchemy import func, select
    from sqlalchemy.exc import InvalidRequestError
    from sqlalchemy.orm import selectinload

    from hermes_store.models import (
        AgentSession as Session,
        AsyncDelegation,
        CompressionLock,
        GatewayRouting,
        Message,
        SessionModelUsage,
    )

    s = Session(id="orm_s", source="cli", started_at=1.0, session_key="k1", chat_id="c", profile_name="p")
    session.add(s)
    session.add_all([
        SessionModelUsage(session=s, model="m", input_tokens=3),
        SessionModelUsage(session=s, model="m", task="title", input_tokens=1),
        Message(session=s, role="user", content="hi", timestamp=2.0, api_content="hi!"),
        CompressionLock(session_id="orm_s", holder="pid:1", acquired_at=1.0, expires_at=61.0),
        GatewayRouting(session_key="k1", entry_json="{}", updated_at=1.0),
        AsyncDelegation(delegation_id="d1", origin_session="orm_s", state="running", dispatched_at=1.0,
                        updated_at=1.0),
    ])
    session.flush()
    session.expire_all()
    # Server defaults come from the DDL.
    row = session.get(SessionModelUsage, ("orm_s", "m", "", "", "", ""))
    assert (row.api_call_count, row.estimated_cost_usd, row.task) == (0, 0.0, "")
    assert session.get(GatewayRouting, ("", "k1")).scope == ""
    assert session.get(AsyncDelegation, "d1").delivery_state == "pending"
    msg = session.scalars(select(Message).where(Message.session_id == "orm_s")).one()
    assert (msg.active, msg.compacted, msg.observed) == (1, 0, 0)
    loaded = session.get(Session, "orm_s")
    assert (loaded.rewind_count, loaded.archived, loaded.compression_fallback_streak) == (0, 0, 0)
    # No accidental lazy loads.
    with pytest.raises(InvalidRequestError):
        _ = loaded.model_usage
    loaded = session.scalars(
        select(Session).where(Session.id == "orm_s").options(selectinload(Session.model_usage))
    ).one()
    assert sorted(u.task for u in loaded.model_usage) == ["", "title"]
    # Deleting the session deletes its ledger rows through ON DELETE CASCADE in the
    # database, without the ORM loading them first (passive_deletes).
    session.execute(Message.__table__.delete().where(Message.session_id == "orm_s"))
    session.expire_all()
    unloaded = session.get(Session, "orm_s")
    session.delete(unloaded)
    session.flush()
    assert session.scalar(select(func.count()).select_from(SessionModelUsage)) == 0
