"""Revisions 0024-0030: Hermes v24-v30 data steps and round trips.

* v25 moves inline system prompts into ``system_prompts`` by SHA-256 (identical prompts
  share a row, NULL stays NULL, an empty prompt is a prompt); downgrade puts them back,
  also for a fresh-Hermes file whose key is a table constraint.
* v28 bounds tool rows in the word index above a high-water mark; v29 / v30 rebuild the
  trigram index without cron / subagent sessions while the word index keeps them.
* Every step 24..30 up and back down leaves every row of every table as it was, and
  the indexes answer as the reference files Hermes' own SQL built.

Files are filled with plain SQL, the way Hermes writes them.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
from pathlib import Path
from collections.abc import Callable

import pytest

from hermes_store import errors, introspect, migrations
from hermes_store.engine import create_engine

from ..helpers import HERMES_DBS, integrity_check, reference_schema, sha, snap

Raw = Callable[[], sqlite3.Connection]
#: A schema difference that only adds to Hermes' objects (see test_migrations.ADDITION).
ADDITION = re.compile(r"^(?:extra (?:table|indexes|triggers|views|virtual) \w+|\w+: extra column \w+)$")


def sha256(prompt: str) -> str:
    """Hermes' key of a prompt (hermes_state: ``hashlib.sha256(p.encode("utf-8")).hexdigest()``)."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def fts_find(conn: sqlite3.Connection, table: str, term: str) -> set[int]:
    phrase = '"' + term.replace('"', '""') + '"'
    return {r[0] for r in conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ?", (phrase,))}


def plain_integrity_check(conn: sqlite3.Connection) -> None:
    """FTS5's check of each index against itself; layouts before v30 cannot pass the
    ``rank = 1`` variant with long tool rows (upstream defect #114169)."""
    for table in ("messages_fts", "messages_fts_trigram"):
        conn.execute(f"INSERT INTO {table}({table}) VALUES('integrity-check')")


def add_session(conn: sqlite3.Connection, sid: str, source: str = "cli", prompt: str | None = None,
                model_config: str | None = None) -> None:
    conn.execute(
        "INSERT INTO sessions (id, source, started_at, system_prompt, model_config) VALUES (?, ?, 1000.0, ?, ?)",
        (sid, source, prompt, model_config),
    )


def add_message(conn: sqlite3.Connection, sid: str, content: str | None, role: str = "user",
                tool_calls: str | None = None) -> int:
    cur = conn.execute(
        "INSERT INTO messages (session_id, role, content, tool_calls, timestamp) VALUES (?, ?, ?, ?, 2000.0)",
        (sid, role, content, tool_calls),
    )
    return cur.lastrowid


def state_meta(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM state_meta"))


# ------------------------------------------------------------------ v25: system prompts

PROMPTS = {
    "p_a1": "You are Hermes, a helpful agent.",
    "p_a2": "You are Hermes, a helpful agent.",  # identical: shares one row with p_a1
    "p_cjk": "你是一个助手 — ünïcode ✓",
    "p_empty": "",  # IS NOT NULL: Hermes moves it too
    "p_none": None,
}


@pytest.fixture
def prompts_v24(migrate, db_path: Path, raw: Raw) -> Path:
    migrate("0024")
    conn = raw()
    for sid, prompt in PROMPTS.items():
        add_session(conn, sid, prompt=prompt)
    add_message(conn, "p_a1", "hello prompt world")
    conn.close()
    return db_path


def test_v25_moves_every_inline_prompt_by_sha256(prompts_v24: Path, raw: Raw) -> None:
    migrations.upgrade(prompts_v24, "0025")
    conn = raw()
    stored = dict(conn.execute("SELECT hash, prompt FROM system_prompts"))
    distinct = {p for p in PROMPTS.values() if p is not None}
    assert stored == {sha256(p): p for p in distinct}
    assert len(stored) == 3  # the two identical prompts share one row
    rows = {sid: (h, inline) for sid, h, inline in conn.execute(
        "SELECT id, system_prompt_hash, system_prompt FROM sessions")}
    for sid, prompt in PROMPTS.items():
        if prompt is None:
            assert rows[sid] == (None, None)
        else:
            assert rows[sid] == (sha256(prompt), None)  # the inline copy is gone
    # Read back the way Hermes does: the prompt table first, the legacy column as fallback.
    resolved = dict(conn.execute(
        "SELECT s.id, COALESCE(sp.prompt, s.system_prompt) FROM sessions s "
        "LEFT JOIN system_prompts sp ON sp.hash = s.system_prompt_hash"))
    assert resolved == PROMPTS
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 25


def test_v25_downgrade_restores_inline_prompts(prompts_v24: Path, raw: Raw) -> None:
    conn = raw()
    before = conn.execute("SELECT * FROM sessions ORDER BY id").fetchall()
    conn.close()
    migrations.upgrade(prompts_v24, "0025")
    conn = raw()
    # Written the v25 way after the upgrade (hash only), and a legacy row still inline.
    conn.execute("INSERT INTO system_prompts (hash, prompt) VALUES (?, ?)", (sha256("new style"), "new style"))
    conn.execute("INSERT INTO sessions (id, source, started_at, system_prompt_hash) VALUES ('p_new', 'cli', 1, ?)",
                 (sha256("new style"),))
    conn.execute("INSERT INTO sessions (id, source, started_at, system_prompt) VALUES ('p_legacy', 'cli', 1, 'old')")
    conn.close()
    migrations.downgrade(prompts_v24, "0024")
    conn = raw()
    after = conn.execute("SELECT * FROM sessions WHERE id NOT IN ('p_new', 'p_legacy') ORDER BY id").fetchall()
    assert after == before  # every column of every session, prompts inline again
    assert dict(conn.execute("SELECT id, system_prompt FROM sessions WHERE id IN ('p_new', 'p_legacy')")) == {
        "p_new": "new style", "p_legacy": "old"}
    assert "system_prompts" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    problems = [p for p in introspect.diff(reference_schema(24), snap(prompts_v24)) if not p.startswith("extra ")]
    assert problems == []


def test_v25_prompt_move_is_all_or_nothing(prompts_v24: Path, raw: Raw) -> None:
    """A failure on the last statement of the move rolls back every earlier one."""
    from sqlalchemy import event

    engine = create_engine(prompts_v24, foreign_keys=False)

    @event.listens_for(engine, "before_cursor_execute")
    def _boom(conn, cursor, statement, *args):
        if statement.startswith("UPDATE schema_version SET version = 25"):
            raise RuntimeError("injected failure after the prompt move")

    before = sha(prompts_v24)
    with pytest.raises(RuntimeError, match="injected"):
        migrations.upgrade(engine, "0025")
    engine.dispose()
    assert sha(prompts_v24) == before
    assert migrations.current(prompts_v24) == "0024"


def _fresh_hermes_v25_at_0025(tmp_path: Path) -> Path:
    """Hermes' own fresh v25 file (table-level key to system_prompts), recorded at 0025,
    with an inline prompt, a moved one, a column a newer Hermes adds (v31 fork), and a
    host's view and trigger that name ``sessions``."""
    path = tmp_path / "fresh_v25.db"
    shutil.copyfile(HERMES_DBS / "hermes_v25.db", path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE hermes_store_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
    conn.execute("INSERT INTO hermes_store_version VALUES ('0025')")
    conn.execute("ALTER TABLE sessions ADD COLUMN auto_archived INTEGER NOT NULL DEFAULT 0")
    conn.execute("INSERT INTO system_prompts (hash, prompt) VALUES (?, 'moved prompt')", (sha256("moved prompt"),))
    conn.execute("UPDATE sessions SET system_prompt_hash = ?, auto_archived = 1 WHERE id = 'compat_001'",
                 (sha256("moved prompt"),))
    conn.execute("UPDATE sessions SET system_prompt = 'inline prompt', pinned = 1 WHERE id = 'compat_002'")
    conn.execute("CREATE VIEW app_pinned AS SELECT id FROM sessions WHERE pinned = 1")
    conn.execute("CREATE TRIGGER app_touch AFTER INSERT ON messages BEGIN "
                 "UPDATE sessions SET last_activity_description = 'touched :note' WHERE id = new.session_id; END")
    conn.close()
    return path


def test_v25_downgrade_rebuilds_a_table_level_key(tmp_path: Path) -> None:
    path = _fresh_hermes_v25_at_0025(tmp_path)
    conn = sqlite3.connect(path)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(sessions)")]
    kept = [c for c in cols if c not in ("system_prompt_hash", "title_source", "hidden", "last_read_at",
                                         "system_prompt")]
    before = conn.execute(f"SELECT rowid, {', '.join(kept)} FROM sessions ORDER BY id").fetchall()
    messages = conn.execute("SELECT * FROM messages ORDER BY id").fetchall()
    docker = fts_find(conn, "messages_fts", "docker")
    conn.close()
    assert docker  # the reference rows are searchable

    migrations.downgrade(path, "0024")
    conn = sqlite3.connect(path)
    assert conn.execute(f"SELECT rowid, {', '.join(kept)} FROM sessions ORDER BY id").fetchall() == before
    assert dict(conn.execute("SELECT id, system_prompt FROM sessions WHERE system_prompt IS NOT NULL")) == {
        "compat_001": "moved prompt", "compat_002": "inline prompt"}
    assert conn.execute("SELECT auto_archived FROM sessions WHERE id = 'compat_001'").fetchone() == (1,)
    assert conn.execute("SELECT * FROM messages ORDER BY id").fetchall() == messages
    assert fts_find(conn, "messages_fts", "docker") == docker
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    integrity_check(conn)
    # The host's view and trigger came back and still work on the new table.
    assert conn.execute("SELECT id FROM app_pinned").fetchall() == [("compat_002",)]
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('compat_003', 'user', 'x', 1)")
    assert conn.execute("SELECT last_activity_description FROM sessions WHERE id = 'compat_003'").fetchone() == (
        "touched :note",)
    conn.rollback()
    conn.close()
    live = snap(path)
    problems = introspect.diff(reference_schema(24), live)
    # Exactly Hermes v24, plus what the file brought along.
    assert sorted(problems) == ["extra triggers app_touch", "extra views app_pinned",
                                "sessions: extra column auto_archived"], problems
    assert migrations.current(path) == "0024"


def test_v25_rebuild_refuses_with_foreign_keys_on_and_changes_nothing(tmp_path: Path) -> None:
    """Dropping the old sessions table with enforcement on would cascade into the usage
    ledger; the revision refuses before anything is written."""
    path = _fresh_hermes_v25_at_0025(tmp_path)
    before = sha(path)
    engine = create_engine(path, foreign_keys=True)
    with pytest.raises(errors.HermesStoreError, match="foreign_keys"):
        migrations.downgrade(engine, "0024")
    engine.dispose()
    assert sha(path) == before


# ------------------------------------------------------------------ v28-v30: FTS

LONG_TOOL = "x " * 5000 + "tailtoken"  # past the 8192-character prefix


@pytest.fixture
def fts_v27(migrate, db_path: Path, raw: Raw) -> tuple[Path, dict[str, int]]:
    migrate("0027")
    conn = raw()
    add_session(conn, "s_cli")
    add_session(conn, "s_cron", source="cron")
    add_session(conn, "s_sub", source="subagent")
    add_session(conn, "s_deleg", model_config='{"_delegate_from": "s_cli"}')
    add_session(conn, "s_badjson", model_config="{not json")
    ids = {
        "cli": add_message(conn, "s_cli", "ordinary pelican question"),
        "cron": add_message(conn, "s_cron", "nightly pelican digest"),
        "sub": add_message(conn, "s_sub", "subagent pelican answer"),
        "deleg": add_message(conn, "s_deleg", "delegated pelican answer"),
        "badjson": add_message(conn, "s_badjson", "malformed config pelican"),
        "tool": add_message(conn, "s_cli", "pelican tool output", role="tool"),
        "calls": add_message(conn, "s_cli", None, role="assistant",
                             tool_calls='[{"function": {"name": "flamingo_lookup"}}]'),
        "old_long": add_message(conn, "s_cli", LONG_TOOL, role="tool"),
    }
    conn.close()
    return db_path, ids


def trigram_pelicans(conn: sqlite3.Connection, ids: dict[str, int]) -> set[str]:
    found = fts_find(conn, "messages_fts_trigram", "pelican")
    return {name for name, mid in ids.items() if mid in found}


ALL_PELICANS = {"cli", "cron", "sub", "deleg", "badjson", "tool"}


def test_trigram_exclusions_follow_v29_and_v30_and_word_index_keeps_all(fts_v27, raw: Raw) -> None:
    path, ids = fts_v27
    conn = raw()
    assert trigram_pelicans(conn, ids) == ALL_PELICANS - {"tool"}  # v23..v28: tool rows only
    conn.close()
    expected = {
        "0028": ALL_PELICANS - {"tool"},
        "0029": ALL_PELICANS - {"tool", "cron"},
        "0030": ALL_PELICANS - {"tool", "cron", "sub", "deleg"},  # a malformed model_config stays in
    }
    for target in ("0028", "0029", "0030"):
        migrations.upgrade(path, target)
        conn = raw()
        assert trigram_pelicans(conn, ids) == expected[target], target
        word = fts_find(conn, "messages_fts", "pelican")
        assert word == {ids[n] for n in ALL_PELICANS}, target  # the word index keeps every row
        plain_integrity_check(conn)
        # New rows follow the same rule through the triggers (and a malformed
        # model_config never makes a write fail).
        conn.execute("BEGIN")
        fresh = {sid: add_message(conn, sid, f"heron{target} note") for sid in
                 ("s_cli", "s_cron", "s_sub", "s_deleg", "s_badjson")}
        got = fts_find(conn, "messages_fts_trigram", f"heron{target}")
        want_out = {"0028": set(), "0029": {"s_cron"}, "0030": {"s_cron", "s_sub", "s_deleg"}}[target]
        assert got == {mid for sid, mid in fresh.items() if sid not in want_out}, target
        for mid in fresh.values():
            conn.execute("DELETE FROM messages WHERE id = ?", (mid,))
        assert fts_find(conn, "messages_fts_trigram", f"heron{target}") == set()
        plain_integrity_check(conn)
        conn.execute("COMMIT")
        conn.close()
    # Down again: each step gives its rows back to the trigram index.
    for target in ("0029", "0028"):
        migrations.downgrade(path, target)
        conn = raw()
        assert trigram_pelicans(conn, ids) == expected[target], target
        plain_integrity_check(conn)
        conn.close()


def test_v30_trigram_drops_tool_calls_word_index_keeps_them(fts_v27, raw: Raw) -> None:
    path, ids = fts_v27
    migrations.upgrade(path, "0029")
    conn = raw()
    assert fts_find(conn, "messages_fts_trigram", "flamingo") == {ids["calls"]}  # layout 1
    conn.close()
    migrations.upgrade(path, "0030")
    conn = raw()
    assert fts_find(conn, "messages_fts_trigram", "flamingo") == set()  # layout 2: content, tool_name
    assert fts_find(conn, "messages_fts", "flamingo") == {ids["calls"]}
    conn.close()


def test_v28_bounds_new_tool_rows_and_v30_realigns_the_word_index(fts_v27, raw: Raw) -> None:
    path, ids = fts_v27
    migrations.upgrade(path, "0028")
    conn = raw()
    # The mark is the newest id at upgrade time: older rows stay indexed in full.
    assert state_meta(conn)["fts_tool_full_content_high_water"] == str(max(ids.values()))
    new_long = add_message(conn, "s_cli", LONG_TOOL, role="tool")
    assert fts_find(conn, "messages_fts", "tailtoken") == {ids["old_long"]}  # the new row's tail is cut
    plain_integrity_check(conn)
    conn.close()

    migrations.upgrade(path, "0030")
    conn = raw()
    assert "fts_tool_full_content_high_water" not in state_meta(conn)
    assert fts_find(conn, "messages_fts", "tailtoken") == set()  # layout 3: every tool row bounded
    integrity_check(conn)  # the rank = 1 variant passes again: index and view agree
    conn.close()

    migrations.downgrade(path, "0029")
    conn = raw()
    assert state_meta(conn)["fts_tool_full_content_high_water"] == str(new_long)
    assert fts_find(conn, "messages_fts", "tailtoken") == {ids["old_long"], new_long}  # rebuilt in full
    plain_integrity_check(conn)
    conn.execute("DELETE FROM messages WHERE id = ?", (new_long,))  # the triggers agree with the index
    assert fts_find(conn, "messages_fts", "tailtoken") == {ids["old_long"]}
    plain_integrity_check(conn)
    conn.close()

    migrations.downgrade(path, "0027")
    conn = raw()
    assert "fts_tool_full_content_high_water" not in state_meta(conn)
    assert fts_find(conn, "messages_fts", "tailtoken") == {ids["old_long"]}
    integrity_check(conn)
    conn.close()


def test_pending_rebuild_window_is_settled_by_the_trigram_rebuild(fts_v27, raw: Raw) -> None:
    """A Hermes rebuild window left in state_meta would make the triggers skip rows that
    the one-time rebuild has already indexed; the revision completes and clears it."""
    path, ids = fts_v27
    migrations.upgrade(path, "0028")
    conn = raw()
    top = max(ids.values())
    conn.execute("INSERT INTO state_meta VALUES ('fts_rebuild_high_water', ?), ('fts_rebuild_progress', '0')",
                 (str(top),))
    conn.close()
    migrations.upgrade(path, "0029")
    conn = raw()
    assert not {"fts_rebuild_high_water", "fts_rebuild_progress"} & set(state_meta(conn))
    conn.execute("UPDATE messages SET content = 'changed albatross' WHERE id = ?", (ids["cli"],))
    assert fts_find(conn, "messages_fts", "albatross") == {ids["cli"]}
    assert fts_find(conn, "messages_fts_trigram", "albatross") == {ids["cli"]}
    assert fts_find(conn, "messages_fts_trigram", "ordinary") == set()
    plain_integrity_check(conn)
    conn.close()


def test_v30_display_order_for_new_rows_pending_for_old(fts_v27, raw: Raw) -> None:
    path, _ids = fts_v27
    migrations.upgrade(path, "0030")
    conn = raw()
    assert conn.execute("SELECT count(*) FROM messages WHERE display_order IS NOT NULL").fetchone()[0] == 0
    new = add_message(conn, "s_cli", "after v30")
    assert conn.execute("SELECT display_order, display_identity FROM messages WHERE id = ?",
                        (new,)).fetchone() == (new, None)
    # As in Hermes' own fresh v30 file, whose rows were all written through the trigger.
    ref = sqlite3.connect(HERMES_DBS / "hermes_v30.db")
    assert ref.execute("SELECT count(*) FROM messages WHERE display_order IS NOT id").fetchone()[0] == 0
    ref.close()
    conn.close()


# ------------------------------------------------------------------ against Hermes' files


def _copy_rows(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> None:
    dst_cols = {r[1] for r in dst.execute(f"PRAGMA table_info({table})")}
    cols = [r[1] for r in src.execute(f"PRAGMA table_info({table})") if r[1] in dst_cols]
    names = ", ".join(cols)
    marks = ", ".join("?" for _ in cols)
    rows = src.execute(f"SELECT {names} FROM {table} ORDER BY rowid").fetchall()
    dst.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)


SEARCHES = [("messages_fts", "docker"), ("messages_fts", "UNIQUEARG"), ("messages_fts", "web_search"),
            ("messages_fts_trigram", "记忆断裂"), ("messages_fts_trigram", "web_search")]


def test_indexes_answer_like_hermes_reference_files_26_to_30(migrate, db_path: Path, raw: Raw) -> None:
    """Hermes' v26 rows, migrated by us step by step, give at every version the hits
    Hermes' own SQL gives on its reference file of that version (same rows)."""
    migrate("0026")
    src = sqlite3.connect(HERMES_DBS / "hermes_v26.db")
    conn = raw()
    conn.execute("BEGIN")
    for table in ("sessions", "messages"):
        _copy_rows(src, conn, table)
    conn.execute("COMMIT")
    conn.close()
    src.close()
    for v in range(26, 31):
        migrations.upgrade(db_path, f"{v:04d}")
        ref = sqlite3.connect(HERMES_DBS / f"hermes_v{v}.db")
        conn = raw()
        for table, term in SEARCHES:
            want = fts_find(ref, table, term)
            assert fts_find(conn, table, term) == want, (v, table, term)
            # Every term hits, except tool-call text in v30's two-column trigram index.
            assert bool(want) == (v < 30 or (table, term) != ("messages_fts_trigram", "web_search"))
        integrity_check(conn)
        ref.close()
        conn.close()


# ------------------------------------------------------------------ every step, up and down

NEW_TABLE_ROWS = {
    "session_turn_leases": "INSERT INTO session_turn_leases VALUES ('conv-1', 'pid-9', 1.5, 2.5)",
    "gateway_hygiene_state": "INSERT INTO gateway_hygiene_state VALUES ('peer-1', 3)",
    "conversation_generations": "INSERT INTO conversation_generations VALUES ('telegram', 'peer-1', 4)",
    "gateway_heartbeats": "INSERT INTO gateway_heartbeats VALUES ('backend-1', 42, 1.0, 2.0, 'default', 'host')",
}
FILL = {"TEXT": "'v{n}:{col}'", "INTEGER": "{n}", "REAL": "{n}.25", "BLOB": "x'0a0b'"}


def dump(conn: sqlite3.Connection) -> dict[str, tuple[list[str], list[tuple]]]:
    """Every row of every plain table (FTS machinery and our version table aside)."""
    virtual = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%'")]
    shadows = {f"{v}_{s}" for v in virtual for s in introspect.FTS_SHADOW_SUFFIXES} | set(virtual)
    out = {}
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        if name in shadows or name == migrations.VERSION_TABLE:
            continue
        cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')]
        out[name] = (cols, sorted(conn.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr))
    return out


def fill_new_columns(conn: sqlite3.Connection, n: int, before: dict) -> None:
    """Write a value into every column and table revision ``n`` added."""
    for table, (cols, _rows) in dump(conn).items():
        if table not in before:
            if table in NEW_TABLE_ROWS:
                conn.execute(NEW_TABLE_ROWS[table])
            continue
        for col in cols:
            if col in before[table][0] or col == "system_prompt_hash":
                continue
            typ = next(r[2] for r in conn.execute(f'PRAGMA table_info("{table}")') if r[1] == col)
            conn.execute(f'UPDATE "{table}" SET "{col}" = {FILL[typ].format(n=n, col=col)}')


def test_each_step_24_to_30_up_and_down_keeps_every_row(migrate, db_path: Path, raw: Raw) -> None:
    migrate("0023")
    conn = raw()
    conn.execute("BEGIN")
    add_session(conn, "r_cli", prompt="You are Hermes.")
    add_session(conn, "r_cron", source="cron", prompt="You are Hermes.")
    add_session(conn, "r_sub", source="subagent")
    for i in range(6):
        for sid in ("r_cli", "r_cron", "r_sub"):
            add_message(conn, sid, f"row {i} of {sid} kestrel", role=("user", "assistant", "tool")[i % 3])
    conn.execute(
        "INSERT INTO async_delegations (delegation_id, origin_session, state, dispatched_at, updated_at) "
        "VALUES ('d1', 'r_cli', 'done', 1.0, 2.0)")
    conn.execute("COMMIT")
    seen = {23: dump(conn)}
    conn.close()
    revs = ["hs0001", *(f"{v:04d}" for v in range(24, 31))]
    for target in revs:
        migrations.upgrade(db_path, target)
        conn = raw()
        v = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        if target != "hs0001":
            conn.execute("BEGIN")
            fill_new_columns(conn, v, seen[v - 1])
            conn.execute("COMMIT")
        seen[v] = dump(conn)
        assert fts_find(conn, "messages_fts", "kestrel") and fts_find(conn, "messages_fts_trigram", "kestrel")
        integrity_check(conn)
        conn.close()
    for v in range(29, 22, -1):
        migrations.downgrade(db_path, f"{v:04d}" if v > 23 else "hs0001")
        conn = raw()
        assert dump(conn) == seen[v], v  # every surviving column holds what it held at v
        plain_integrity_check(conn)
        cron_hits = fts_find(conn, "messages_fts_trigram", "r_cron")
        assert bool(cron_hits) == (v < 29), v
        conn.close()
    # And up again: every object of Hermes v30 exactly as Hermes makes it. Revisions of
    # ours (and a contributor's later one) may only add: tables, indexes, triggers, and
    # columns on a table of Hermes (test_migrations.py holds them to their own deltas).
    migrations.upgrade(db_path, "head")
    problems = introspect.diff(reference_schema(30), snap(db_path))
    assert [p for p in problems if not ADDITION.match(p)] == [], problems
    assert "extra table messages_cjk_bigram" in problems  # hs0001's index is there, and reported
