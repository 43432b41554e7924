"""Files Hermes v26 opens (and heals) are adopted on open, not refused (issue 35, item 1).

Hermes' own migration tests build an older file on the current table DDL: every table
as v26 (or our ``SCHEMA_SQL``) declares it, so ``sessions`` carries later columns and
the later foreign key ``system_prompt_hash -> system_prompts.hash``, with the
full-text layout of the older version and ``schema_version`` set back. Hermes opens
such files, adds what is missing and sets ``messages.active`` NULLs to 1 (§5.6). Each
shape is built by hand (tests/layouts.py) and opened through the swapped
``hermes_state`` module; every row must survive, word/trigram/CJK search must find old
and new rows, and a refused or failed adoption must leave the file byte for byte.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes_store import adopt as adopt_mod
from hermes_store import errors
from hermes_store.adopt import swap as swap_mod
from hermes_store.adopt import work as work_mod
from hermes_store.hermes_names import ddl_strings

from ..compat.conftest import hermes_state  # noqa: F401 (the swapped module, as a fixture)
from ..layouts import PROMPTS, older_fts_on_newer_tables
from ..test_cli import ok
from .test_adopt import ro, rows, sha, state

#: name -> builder arguments (see :func:`older_fts_on_newer_tables`).
SHAPES: dict[str, dict[str, Any]] = {
    # v22's inline FTS on v26's tables, as Hermes' tests build it.
    "v22_inline_fts_on_v26_tables": {"version": 22, "fts_of": "22"},
    # The same through the swapped module: our SCHEMA_SQL (v30 tables and our own).
    "v22_inline_fts_on_schema_sql": {"version": 22, "fts_of": "22", "schema_sql": "SCHEMA_SQL"},
    # v10's tool-call FTS (tool_name/tool_calls indexed inline) on v26's tables.
    "v10_tool_call_fts_on_v26_tables": {"version": 10, "fts_of": "10"},
    # v10's external-content FTS on v26's tables.
    "v10_external_fts_on_v26_tables": {"version": 10, "fts_of": "10_external_fts"},
    # v12 with messages.active declared nullable and NULL in some rows.
    "v12_null_active": {"version": 12, "fts_of": "12", "nullable_active": True},
}

#: Text each message holds, and the words/phrases that must find it.
WORDS = {"lighthouse": {1, 5}, "zebrafish": {3}, "kubectl": {2}, "quokka": {8}, "web_search": {8, 9}}
CJK_TERMS = {"迁移": {6, 7}, "数据库迁移": {6, 7}}


def build(tmp_path: Path, shape: str) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    p = folder / "state.db"
    kw = dict(SHAPES[shape])
    if kw.get("schema_sql"):
        kw["schema_sql"] = ddl_strings()[kw["schema_sql"]]
    older_fts_on_newer_tables(p, **kw)
    return p


def snapshot_rows(p: Path) -> dict[str, dict[Any, dict[str, Any]]]:
    with ro(p) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        out = {t: rows(conn, t) for t in ("sessions", "messages") if t in tables}
        for t in ("system_prompts", "session_model_usage"):
            if t in tables:
                # Keyed by primary key: a table put back gets new rowids.
                out[t] = {tuple(sorted(r.items())): r for r in rows(conn, t).values()}
        return out


def assert_every_row_kept(before: dict[str, dict[Any, dict[str, Any]]], p: Path) -> None:
    """Every value written is still there (``messages.active`` NULL read as 1)."""
    after = snapshot_rows(p)
    for table, old in before.items():
        assert len(after[table]) == len(old), table
        if table in ("system_prompts", "session_model_usage"):
            new = [dict(r) for r in after[table].values()]
            for row in old.values():
                assert any(all(n.get(k) == v for k, v in row.items()) for n in new), (table, row)
            continue
        for key, row in old.items():
            got = after[table][key]
            for col, value in row.items():
                want = 1 if (table, col, value) == ("messages", "active", None) else value
                assert got[col] == want, (table, key, col, got[col], want)


def hit_ids(db: Any, query: str) -> set[int]:
    return {h["id"] for h in db.search_messages(query, limit=50)}


# ------------------------------------------------------------------------- opening


@pytest.mark.parametrize("shape", list(SHAPES))
def test_hermes_built_file_opens_with_every_row_and_search(
    shape: str, tmp_path: Path, hermes_state: Any  # noqa: F811
) -> None:
    p = build(tmp_path, shape)
    before = snapshot_rows(p)
    original = sha(p)
    nulls = {k for k, r in before["messages"].items() if "active" in r and r["active"] is None}
    assert (shape == "v12_null_active") == bool(nulls)

    db = hermes_state.SessionDB(p)
    try:
        backup = p.with_name("state.db.pre-adopt.bak")
        assert sha(backup) == original  # the original, kept as it was
        assert_every_row_kept(before, p)
        for word, ids in WORDS.items():
            assert hit_ids(db, word) == ids, word
        for term, ids in CJK_TERMS.items():
            assert hit_ids(db, term) == ids, term
        # Titles and prompts read back as written (prompts by their hash).
        root = db.get_session("s_root")
        assert root["title"] == "Deploy the lighthouse"
        assert root["system_prompt"] in PROMPTS.values()
        assert db.get_session("s_cjk")["title"] == "数据库迁移计划"
        assert db.get_session("s_cont")["parent_session_id"] == "s_root"
        # NULL active rows are active and visible, as Hermes makes them.
        visible = {m["id"] for m in db.get_messages("s_root")} | {m["id"] for m in db.get_messages("s_cjk")}
        assert {n for n in nulls if before["messages"][n]["session_id"] in ("s_root", "s_cjk")} <= visible
        if shape == "v12_null_active":  # a row rewound (active = 0) stays out
            assert 4 not in {m["id"] for m in db.get_messages("s_cont")}
        # Rows appended after the open are found by every index.
        new = db.append_message("s_cjk", "user", "新的数据库迁移 lighthouse keeper")
        assert new in hit_ids(db, "lighthouse") and new in hit_ids(db, "迁移") and new in hit_ids(db, "数据库迁移")
        assert hit_ids(db, "lighthouse") == WORDS["lighthouse"] | {new}
    finally:
        db.close()
    with ro(p) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] >= 26
        assert conn.execute("SELECT count(*) FROM messages WHERE active IS NULL").fetchone()[0] == 0
        # The trigram index holds old rows (substring match, not only words).
        tri = {r[0] for r in conn.execute(
            "SELECT rowid FROM messages_fts_trigram WHERE messages_fts_trigram MATCH '\"ighthou\"'")}
        assert {1, 5} <= tri
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_detect_and_the_cli_check_list_repairs_and_no_problems(shape: str, tmp_path: Path) -> None:
    p = build(tmp_path, shape)
    before = state(p)
    det = adopt_mod.detect(p)
    assert det.problems == [] and det.adoptable
    kinds = {r.kind for r in det.repairs}
    assert "set_aside_column" in kinds  # system_prompt_hash / title_source hold data
    if SHAPES[shape]["version"] < 25:
        hash_repair = next(r for r in det.repairs if r.column == "system_prompt_hash")
        assert hash_repair.kind == "set_aside_column" and hash_repair.sql is None  # goes with the rebuild
        rebuild = next(r for r in det.repairs if r.kind == "rebuild_table" and r.table == "sessions")
        assert "system_prompt_hash->system_prompts.hash" in rebuild.description
    if shape == "v12_null_active":
        assert any(r.column == "active" and r.kind == "set_aside_column" for r in det.repairs)
    doc = ok("--db", p, "--json", "adopt", "--check").json()
    assert doc["detected"]["problems"] == []
    assert doc["detected"]["repairs"] == [r.description for r in det.repairs]
    assert state(p) == before


# ------------------------------------------------------------- refusal and failure


def _unknown_key(p: Path) -> None:
    """A foreign key no Hermes version declared (sessions.user_id -> system_prompts)."""
    conn = sqlite3.connect(p)
    try:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'sessions'").fetchone()[0]
        edited = sql.replace("user_id TEXT,", "user_id TEXT REFERENCES system_prompts(hash),", 1)
        assert edited != sql
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'sessions'", (edited,))
        conn.execute("PRAGMA writable_schema = OFF")
        conn.commit()
    finally:
        conn.close()


def test_a_key_no_hermes_declared_is_refused_byte_for_byte(tmp_path: Path, hermes_state: Any) -> None:  # noqa: F811
    p = build(tmp_path, "v22_inline_fts_on_v26_tables")
    _unknown_key(p)
    det = adopt_mod.detect(p)
    assert det.problems == [
        "foreign keys of sessions are ['parent_session_id->sessions.id', 'system_prompt_hash->system_prompts.hash',"
        " 'user_id->system_prompts.hash'], expected ['parent_session_id->sessions.id']"
    ]
    before = state(p)
    with pytest.raises(errors.AdoptionError, match=r"user_id->system_prompts\.hash"):
        hermes_state.SessionDB(p)
    assert state(p) == before


@pytest.mark.parametrize("where", ["_set_aside", "_rebuild_table", "_put_back"])
def test_a_failure_mid_way_leaves_the_original_byte_for_byte(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hermes_state: Any  # noqa: F811
) -> None:
    p = build(tmp_path, "v22_inline_fts_on_v26_tables")
    before = state(p)

    def boom(*_a: Any, **_k: Any) -> None:
        raise RuntimeError(f"injected failure in {where}")

    monkeypatch.setattr(work_mod, where, boom)
    with pytest.raises(errors.AdoptionError, match="injected failure"):
        hermes_state.SessionDB(p)
    assert state(p) == before


def test_the_original_is_untouched_until_the_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hermes_state: Any  # noqa: F811
) -> None:
    p = build(tmp_path, "v10_tool_call_fts_on_v26_tables")
    original = sha(p)
    seen: list[tuple[bool, str]] = []
    real = swap_mod.swap_in

    def watch(path: Path, *a: Any, **k: Any) -> Any:
        seen.append((path.exists(), sha(path)))
        return real(path, *a, **k)

    monkeypatch.setattr(swap_mod, "swap_in", watch)
    hermes_state.SessionDB(p).close()
    assert seen == [(True, original)]
    assert sha(p) != original and sha(p.with_name("state.db.pre-adopt.bak")) == original


# ------------------------------------------------- later columns and their keys


@pytest.mark.parametrize("version", [11, 20, 22, 24])
@pytest.mark.parametrize("spelling", ["table_level", "inline"])
@pytest.mark.parametrize("with_hashes", [True, False], ids=["hashes", "no_hashes"])
def test_a_later_column_with_its_key_is_handled_like_the_column(
    version: int, spelling: str, with_hashes: bool, tmp_path: Path
) -> None:
    """v25's key on v25's column, spelled either way, with or without values: set aside
    (or dropped when empty) by rebuilding sessions, the values back after the upgrade."""
    folder = tmp_path / "home"
    folder.mkdir()
    p = folder / "state.db"
    schema = ddl_strings()["SCHEMA_SQL"] if spelling == "inline" else None
    older_fts_on_newer_tables(p, version, fts_of="22" if version >= 11 else "10", schema_sql=schema)
    if not with_hashes:
        conn = sqlite3.connect(p)
        conn.execute("UPDATE sessions SET system_prompt_hash = NULL")
        conn.execute("DELETE FROM system_prompts")
        conn.commit()
        conn.close()
    before = snapshot_rows(p)
    det = adopt_mod.detect(p)
    assert det.problems == []
    hash_repair = next(r for r in det.repairs if r.column == "system_prompt_hash")
    assert hash_repair.kind == ("set_aside_column" if with_hashes else "drop_column")
    report = adopt_mod.adopt(p)
    assert report.adopted
    assert_every_row_kept(before, p)
    with ro(p) as conn:
        fks = {(r[3], r[2], r[4]) for r in conn.execute("PRAGMA foreign_key_list(sessions)")}
        assert ("system_prompt_hash", "system_prompts", "hash") in fks
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_a_later_column_with_another_type_is_still_refused(tmp_path: Path) -> None:
    """Hermes never checks types, but a value a revision would store differently is not
    adopted silently: only nullability and default may differ."""
    folder = tmp_path / "home"
    folder.mkdir()
    p = folder / "state.db"
    older_fts_on_newer_tables(p, 12, fts_of="12")
    conn = sqlite3.connect(p)
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'messages'",
                 (sql.replace("api_content TEXT", "api_content INTEGER"),))
    conn.execute("PRAGMA writable_schema = OFF")
    conn.commit()
    conn.close()
    before = state(p)
    det = adopt_mod.detect(p)
    assert any("messages.api_content" in problem for problem in det.problems)
    with pytest.raises(errors.AdoptionError, match="api_content"):
        adopt_mod.adopt(p)
    assert state(p) == before


def test_rows_of_our_own_tables_in_a_hermes_file_are_kept(tmp_path: Path) -> None:
    """A file written on our SCHEMA_SQL carries our own tables: moved out of the way of
    the revision that creates them and their rows put back."""
    p = build(tmp_path, "v22_inline_fts_on_schema_sql")
    conn = sqlite3.connect(p)
    conn.execute("INSERT INTO hermes_store_retention (source, delete_after_days, updated_at) VALUES ('cron', 30, 1.0)")
    conn.commit()
    conn.close()
    det = adopt_mod.detect(p)
    assert ("set_aside_table", "hermes_store_retention") in {(r.kind, r.table) for r in det.repairs}
    assert ("drop_table", "messages_cjk_bigram") in {(r.kind, r.table) for r in det.repairs}
    adopt_mod.adopt(p)
    with ro(p) as conn:
        assert conn.execute("SELECT source, delete_after_days FROM hermes_store_retention").fetchall() == [("cron", 30)]
    assert json.dumps(sorted(os.listdir(p.parent))) == json.dumps(["state.db", "state.db.pre-adopt.bak"])
