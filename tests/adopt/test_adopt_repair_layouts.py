"""Older layouts Hermes repairs on open are adopted, not refused (issue 22, point 4).

Hermes' open (SESSIONDB_V26_API.md §5.6) never checks a kept column's declaration: it
re-runs its schema, adds missing columns, rebuilds ``gateway_routing`` and
``session_model_usage`` to their current primary keys (foreign keys off, orphans
kept), sets ``messages.active`` NULLs to 1, narrows broad FTS UPDATE triggers, moves
inline system prompts into ``system_prompts`` below v25, and makes titles unique.
Each test here builds one such file with plain ``sqlite3`` from a Hermes-written
reference file plus the deviation, adopts it, and checks that every row survives
(contents compared before and after), the schema is exactly head's, SQLite's and
FTS5's integrity checks pass, and SessionDB reads it.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest

from hermes_store import SessionDB, errors, migrations
from hermes_store import adopt as adopt_mod
from hermes_store.introspect import diff, snapshot

from ..layouts import ledger_without_task_in_key, routing_keyed_by_session_key
from .test_adopt import adopt_and_check, hermes, place, ro, rows, state


@pytest.fixture(scope="module")
def fresh_head(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    p = tmp_path_factory.mktemp("fresh") / "fresh.db"
    migrations.upgrade(p, "head")
    with ro(p) as conn:
        return snapshot(conn)


# ------------------------------------------------------------------ building shapes


def rebuild(conn: sqlite3.Connection, table: str, edit: Callable[[str], str]) -> None:
    """Give ``table`` the declaration ``edit`` makes of its own, rows (and rowids),
    indexes and triggers kept: how an older Hermes left the table."""
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()[0]
    new = edit(sql)
    assert new != sql, "the deviation did not apply"
    cols = ", ".join(f'"{r[1]}"' for r in conn.execute(f'PRAGMA table_info("{table}")'))
    saved = [s for (s,) in conn.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND type IN ('index', 'trigger') AND sql IS NOT NULL", (table,)
    )]
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA legacy_alter_table = ON")
    conn.execute(re.sub(rf"^CREATE TABLE {table}\b", f"CREATE TABLE {table}_old_shape", new))
    conn.execute(f"INSERT INTO {table}_old_shape (rowid, {cols}) SELECT rowid, {cols} FROM {table}")
    conn.execute(f"DROP TABLE {table}")
    conn.execute(f"ALTER TABLE {table}_old_shape RENAME TO {table}")
    for s in saved:
        conn.execute(s)
    conn.execute("PRAGMA legacy_alter_table = OFF")


def build(version: int | str, tmp_path: Path, deviate: Callable[[sqlite3.Connection], None]) -> Path:
    p = place(hermes(version), tmp_path)
    conn = sqlite3.connect(p)
    try:
        deviate(conn)
        conn.commit()
    finally:
        conn.close()
    return p


def contents(p: Path, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``table`` as sorted (column, value, storage class) items: the
    comparison ignores column order (a rebuild declares Hermes' order) and rowids."""
    with ro(p) as conn:
        cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
        picks = ", ".join(f'"{c}", typeof("{c}")' for c in cols)
        out = []
        for r in conn.execute(f'SELECT {picks} FROM "{table}"'):
            out.append(tuple(sorted((c, r[2 * i], r[2 * i + 1]) for i, c in enumerate(cols))))
    return sorted(out, key=repr)


def assert_healthy_and_readable(p: Path) -> None:
    """SQLite's full check is ok, and SessionDB reads every session and its messages."""
    with ro(p) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        ids = [r[0] for r in conn.execute("SELECT id FROM sessions")]
        counts = dict(conn.execute("SELECT session_id, count(*) FROM messages WHERE active = 1 GROUP BY session_id"))
    db = SessionDB(p)
    try:
        for sid in ids:
            assert db.get_session(sid)["id"] == sid
            assert len(db.get_messages(sid)) == counts.get(sid, 0)
        assert db.list_sessions_rich(limit=100)
    finally:
        db.close()


def repairs_of(p: Path) -> list[str]:
    det = adopt_mod.detect(p)
    assert det.adoptable, det.problems
    return [r.kind for r in det.repairs]


# ------------------------------------------------------ session_model_usage's primary key


@pytest.mark.parametrize("version", [22, 23, 26, 30])
def test_a_ledger_without_task_in_its_key_is_rebuilt_with_every_row(
    version: int, tmp_path: Path, fresh_head: dict[str, Any]
) -> None:
    p = build(version, tmp_path, ledger_without_task_in_key)
    before = contents(p, "session_model_usage")
    assert len(before) >= 3
    assert "rebuild_table" in repairs_of(p)
    report = adopt_and_check(p, fresh_head)
    assert any("rebuild session_model_usage" in r for r in report.repairs)
    assert contents(p, "session_model_usage") == before
    with ro(p) as conn:
        pk = sorted((r[5], r[1]) for r in conn.execute("PRAGMA table_info(session_model_usage)") if r[5])
        assert [name for _n, name in pk] == ["session_id", "model", "billing_provider", "billing_base_url",
                                            "billing_mode", "task"]
        assert conn.execute("SELECT count(*) FROM session_model_usage WHERE session_id = 'gone_session'").fetchone()[0] == 1
    assert_healthy_and_readable(p)


# ------------------------------------------------------------ gateway_routing's primary key


@pytest.mark.parametrize("version", [19, 22, 26])
def testrouting_keyed_by_session_key_alone_is_rebuilt_with_every_row(
    version: int, tmp_path: Path, fresh_head: dict[str, Any]
) -> None:
    p = build(version, tmp_path, routing_keyed_by_session_key)
    before = contents(p, "gateway_routing")
    assert repairs_of(p) == ["rebuild_table"]
    adopt_and_check(p, fresh_head)
    assert contents(p, "gateway_routing") == before
    assert_healthy_and_readable(p)
    db = SessionDB(p)
    try:
        assert db.load_gateway_routing_entries(scope="profile-b") == {
            "agent:main:discord:group:2": '{"session_id": "compat_001", "note": "é✓"}'
        }
        db.save_gateway_routing_entry("agent:main:cli", '{"x": 1}', scope="profile-b")  # the new key allows it
        assert db.load_gateway_routing_entries()["agent:main:cli"] == "{}"
    finally:
        db.close()


# --------------------------------------------------------------- messages.active IS NULL


def _nullable_active(conn: sqlite3.Connection) -> None:
    rebuild(conn, "messages", lambda s: s.replace("active INTEGER NOT NULL DEFAULT 1", "active INTEGER DEFAULT 1"))
    conn.execute("UPDATE messages SET active = NULL WHERE id % 5 = 0")
    conn.execute("UPDATE messages SET active = 0 WHERE id = 3")


@pytest.mark.parametrize("version", [14, 22, 26, 30])
def test_null_active_messages_become_active_as_hermes_makes_them(
    version: int, tmp_path: Path, fresh_head: dict[str, Any]
) -> None:
    p = build(version, tmp_path, _nullable_active)
    with ro(p) as conn:
        before = rows(conn, "messages")
        nulls = {k for k, r in before.items() if r["active"] is None}
    assert nulls
    report = adopt_mod.detect(p)
    assert [r.kind for r in report.repairs] == ["rebuild_table"]
    assert f"{len(nulls)} NULL values of active set to its default 1" in report.repairs[0].description
    adopt_and_check_messages(p, fresh_head, before, nulls)
    assert_healthy_and_readable(p)


def adopt_and_check_messages(p: Path, fresh_head: dict[str, Any], before: dict[Any, dict[str, Any]], nulls: set[Any]) -> None:
    """Like adopt_and_check, with the one value Hermes' repair changes: NULL active -> 1."""
    adopt_mod.adopt(p)
    with ro(p) as conn:
        assert diff(fresh_head, snapshot(conn)) == []
        after = rows(conn, "messages")
    assert set(after) == set(before)
    for key, row in before.items():
        want = dict(row, active=1) if key in nulls else row
        assert {c: after[key][c] for c in row if c not in ("display_order",)} == {
            c: v for c, v in want.items() if c not in ("display_order",)
        }, key
    assert after[3]["active"] == 0
    conn = sqlite3.connect(p)
    try:
        for table in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
    finally:
        conn.close()


# ----------------------------------------------------------- git_metadata_generation missing


def _without_git_generation(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE sessions DROP COLUMN git_metadata_generation")


@pytest.mark.parametrize("version", [26, 27, 30])
def test_a_missing_git_metadata_generation_column_is_added(version: int, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = build(version, tmp_path, _without_git_generation)
    assert "add_column" in repairs_of(p)
    adopt_and_check(p, fresh_head)
    with ro(p) as conn:
        assert conn.execute("SELECT count(*) FROM sessions WHERE git_metadata_generation = 0").fetchone()[0] == 5
    assert_healthy_and_readable(p)


# ------------------------------------------------------------------ inline system prompts


PROMPTS = {"compat_000": "You are Hermes.", "compat_001": "You are Hermes.", "compat_003": "Système ✓ 日本語"}


def _inline_prompts(conn: sqlite3.Connection) -> None:
    for sid, prompt in PROMPTS.items():
        conn.execute("UPDATE sessions SET system_prompt = ? WHERE id = ?", (prompt, sid))


@pytest.mark.parametrize("version", [10, 21, 22, 24, 26])
def test_inline_system_prompts_are_kept_and_moved_below_v25(version: int, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    """Below v25 Hermes moves each inline prompt into ``system_prompts`` (stored once);
    from v25 on an inline prompt is a read fallback. Either way every session reads
    its own prompt back."""
    p = build(version, tmp_path, _inline_prompts)
    adopt_and_check(p, fresh_head)  # compares sessions with system_prompt as readers resolve it
    with ro(p) as conn:
        if version < 25:
            assert conn.execute("SELECT count(*) FROM sessions WHERE system_prompt IS NOT NULL").fetchone()[0] == 0
            stored = dict(conn.execute("SELECT hash, prompt FROM system_prompts"))
            assert stored == {hashlib.sha256(v.encode()).hexdigest(): v for v in PROMPTS.values()}
    assert_healthy_and_readable(p)
    db = SessionDB(p)
    try:
        for sid, prompt in PROMPTS.items():
            assert db.get_session(sid)["system_prompt"] == prompt
    finally:
        db.close()


# ---------------------------------------------------------------- broad FTS UPDATE triggers


def _broad_update_triggers(conn: sqlite3.Connection) -> None:
    """The pre-v24 ``AFTER UPDATE ON messages`` triggers (every UPDATE re-indexes)."""
    for name in ("messages_fts_update", "messages_fts_trigram_update"):
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
        broad = re.sub(r"AFTER UPDATE OF [^\n]*? ON messages", "AFTER UPDATE ON messages", sql, count=1)
        assert broad != sql
        conn.execute(f"DROP TRIGGER {name}")
        conn.execute(broad)


@pytest.mark.parametrize("version", [24, 26, 30])
def test_broad_fts_update_triggers_are_narrowed(version: int, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    p = build(version, tmp_path, _broad_update_triggers)
    assert "fts_reset" in repairs_of(p)
    adopt_and_check(p, fresh_head)  # head's narrowed triggers, every message searchable
    with ro(p) as conn:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts_update'").fetchone()[0]
        assert "AFTER UPDATE OF" in sql
    assert_healthy_and_readable(p)


# --------------------------------------------------------------------- duplicate titles


def _duplicate_titles(conn: sqlite3.Connection) -> None:
    """Titles two sessions share (a file whose unique index was lost), and a title
    already spelled like the first free suffix."""
    conn.execute("DROP INDEX idx_sessions_title_unique")
    conn.execute("UPDATE sessions SET title = 'Deploy plan' WHERE id IN ('compat_000', 'compat_002', 'compat_004')")
    conn.execute("UPDATE sessions SET title = 'Deploy plan (2)' WHERE id = 'compat_001'")


@pytest.mark.parametrize("version", [4, 22, 26, 30])
def test_duplicate_titles_are_kept_under_unique_names(version: int, tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    """Hermes NULLs every duplicate but the newest (SESSIONDB_V26_API.md §6.9: a title
    lost). Adoption keeps the newest as it is and renames the others, and says so."""
    p = build(version, tmp_path, _duplicate_titles)
    with ro(p) as conn:
        before = rows(conn, "sessions", skip=("title", "model_config"))
        newest = conn.execute("SELECT id FROM sessions WHERE title = 'Deploy plan' ORDER BY rowid DESC").fetchone()[0]
    report = adopt_mod.adopt(p)
    renamed = next(r for r in report.repairs if "share a title" in r)
    with ro(p) as conn:
        assert diff(fresh_head, snapshot(conn)) == []
        titles = dict(conn.execute("SELECT id, title FROM sessions WHERE title LIKE 'Deploy plan%'"))
        after = rows(conn, "sessions", skip=("title", "model_config"))
    assert titles[newest] == "Deploy plan"
    others = sorted({"compat_000", "compat_002", "compat_004"} - {newest})
    assert sorted(titles[s] for s in others) == ["Deploy plan (3)", "Deploy plan (4)"]
    assert titles["compat_001"] == "Deploy plan (2)"
    for sid in others:
        assert f"{sid}: 'Deploy plan' -> {titles[sid]!r}" in renamed
    assert {k: {c: after[k][c] for c in v} for k, v in before.items()} == before
    assert_healthy_and_readable(p)


# ------------------------------------------------------------ a file Hermes held back


def test_a_file_whose_version_hermes_held_back_keeps_its_later_rows(tmp_path: Path, fresh_head: dict[str, Any]) -> None:
    """Hermes bumps schema_version only where FTS5 exists: a v24 file opened by a v26
    Hermes without FTS5 has v26's tables and columns, prompts moved, and says 24."""
    p = build(24, tmp_path, _inline_prompts)
    conn = sqlite3.connect(p)
    try:
        with ro(hermes(26)) as ref:
            for name in ("system_prompts", "session_turn_leases", "gateway_hygiene_state"):
                conn.execute(ref.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0])
        for spec in ("system_prompt_hash TEXT", "title_source TEXT", "hidden INTEGER NOT NULL DEFAULT 0",
                     "last_read_at REAL", "git_metadata_generation INTEGER NOT NULL DEFAULT 0"):
            conn.execute(f"ALTER TABLE sessions ADD COLUMN {spec}")
        for sid, prompt in PROMPTS.items():
            digest = hashlib.sha256(prompt.encode()).hexdigest()
            conn.execute("INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?, ?)", (digest, prompt))
            conn.execute("UPDATE sessions SET system_prompt_hash = ?, system_prompt = NULL WHERE id = ?", (digest, sid))
        conn.execute("UPDATE sessions SET hidden = 1, title_source = 'user' WHERE id = 'compat_002'")
        conn.commit()
    finally:
        conn.close()
    with ro(p) as conn:
        later = contents(p, "system_prompts")
        flags = conn.execute("SELECT id, hidden, title_source, system_prompt_hash FROM sessions ORDER BY id").fetchall()
    adopt_and_check(p, fresh_head)
    assert contents(p, "system_prompts") == later
    with ro(p) as conn:
        assert conn.execute("SELECT id, hidden, title_source, system_prompt_hash FROM sessions ORDER BY id").fetchall() == flags
    assert_healthy_and_readable(p)


def _v21_held_back(heal: bool, task: str) -> Callable[[sqlite3.Connection], None]:
    """A v21 file a v22+ Hermes without FTS5 opened: ``task`` appended to the ledger
    (``heal``: and put in its key, as Hermes' PK heal does), version still 21."""

    def deviate(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE session_model_usage ADD COLUMN task TEXT NOT NULL DEFAULT ''")
        if heal:
            rebuild(conn, "session_model_usage", lambda s: s.replace("billing_mode)", "billing_mode, task)"))
        conn.executemany(
            "INSERT INTO session_model_usage (session_id, model, billing_provider, input_tokens, first_seen, task) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [("compat_000", "gpt-4o", "openai", 120, 1.7e9, task), ("compat_002", "claude", "", 9, None, ""),
             ("orphan", "gpt-4o", "", 1, 1.6e9, "")],
        )

    return deviate


@pytest.mark.parametrize("heal", [False, True], ids=["appended", "in_the_key"])
def test_a_v21_ledger_hermes_gave_its_v22_task_column_is_adopted(
    heal: bool, tmp_path: Path, fresh_head: dict[str, Any]
) -> None:
    """The later column holds only defaults: it is taken out (by a rebuild where it is
    in the key, SQLite cannot drop a key column), revision 0022 brings it back."""
    p = build(21, tmp_path, _v21_held_back(heal, ""))
    with ro(p) as conn:
        pk = [r[1] for r in conn.execute("PRAGMA table_info(session_model_usage)") if r[5]]
    assert ("task" in pk) == heal
    before = contents(p, "session_model_usage")
    kinds = repairs_of(p)
    assert "drop_column" in kinds and ("rebuild_table" in kinds) == heal
    adopt_and_check(p, fresh_head)
    assert contents(p, "session_model_usage") == before
    assert_healthy_and_readable(p)


def test_a_v21_ledger_with_task_values_in_its_key_is_refused(tmp_path: Path) -> None:
    """Values of a later key column the file's version has no place for are not guessed
    at: refused, the file unchanged (Hermes with FTS5 would bump it to a version that has them)."""
    p = build(21, tmp_path, _v21_held_back(True, "vision"))
    before = state(p)
    with pytest.raises(errors.AdoptionError, match=r"session_model_usage\.task"):
        adopt_mod.adopt(p)
    assert state(p) == before


# -------------------------------------------------------------- what is still refused


def test_a_rebuild_that_would_convert_values_is_refused(tmp_path: Path) -> None:
    """A declaration SQLite would store differently (text in a column Hermes declares
    REAL) is not rebuilt: converting a value is not keeping it."""
    def deviate(conn: sqlite3.Connection) -> None:
        routing_keyed_by_session_key(conn)
        rebuild(conn, "gateway_routing", lambda s: s.replace("updated_at REAL NOT NULL", "updated_at TEXT NOT NULL"))
        conn.execute("UPDATE gateway_routing SET updated_at = '1700000000.5' WHERE session_key = 'agent:main:cli'")

    p = build(22, tmp_path, deviate)
    before = state(p)
    with pytest.raises(errors.AdoptionError, match="would change stored values"):
        adopt_mod.adopt(p)
    assert state(p) == before


def test_a_null_where_hermes_requires_a_value_is_refused(tmp_path: Path) -> None:
    def deviate(conn: sqlite3.Connection) -> None:
        routing_keyed_by_session_key(conn)
        conn.execute("INSERT INTO gateway_routing (session_key, entry_json, updated_at) VALUES (NULL, '{}', 1)")

    p = build(22, tmp_path, deviate)
    before = state(p)
    det = adopt_mod.detect(p)
    assert not det.adoptable and "gateway_routing.session_key holds NULL in 1 rows" in det.problems[0]
    with pytest.raises(errors.AdoptionError, match="session_key"):
        adopt_mod.adopt(p)
    assert state(p) == before
