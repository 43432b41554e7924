"""The SessionDB surface where Hermes v24-v30 behaviour depends on the schema.

* v24: listing recency is Hermes' ``_sql_session_last_active`` (activity stamp or
  newest message, else start);
* v25: system prompts stored once by SHA-256 and read back as full text; the session
  flags ``hidden`` / ``pinned`` / ``title_source`` / ``last_read_at``;
* v29/v30: the trigram index leaves out cron and sub-agent sessions, and every other
  route a CJK query can take leaves out the same sessions.

Reference data comes from tests/data (Hermes-written files and Hermes' v30 schema).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest

from hermes_store import SessionDB
from hermes_store.errors import InvalidInputError
from hermes_store.dialects import cjk_bigram as bigram
from hermes_store.search import plan_search

from .factories import set_times
from .helpers import HERMES_DBS, reference_schema, snap


def raw_rows(path: Path, sql: str, args: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def reference_records(version: str) -> list[dict[str, Any]]:
    """The sessions (with messages) of a Hermes-written reference file, as export records."""
    conn = sqlite3.connect(HERMES_DBS / f"hermes_v{version}.db")
    conn.row_factory = sqlite3.Row
    try:
        out = []
        for s in conn.execute("SELECT * FROM sessions ORDER BY started_at"):
            record = dict(s)
            record["messages"] = [dict(m) for m in conn.execute(
                "SELECT * FROM messages WHERE session_id = ? ORDER BY id", (s["id"],))]
            out.append(record)
        return out
    finally:
        conn.close()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ====================================================================== v24: recency


def test_hermes_appends_leave_the_activity_stamp_alone_and_so_do_ours(db: SessionDB) -> None:
    """Hermes v24-v26 wrote 12 messages per session and never stamped last_activity_at:
    the stamp is the watchdog's, recency of a chat comes from its messages."""
    for version in ("24", "25", "26"):
        rows = raw_rows(HERMES_DBS / f"hermes_v{version}.db",
                        "SELECT last_activity_at, message_count FROM sessions")
        assert rows and all(stamp is None and count == 12 for stamp, count in rows), version
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    db.append_messages([{"session_id": "s", "role": "assistant", "content": "hi"}])
    row = db.get_session("s")
    assert (row["last_activity_at"], row["last_activity_description"], row["last_activity_provenance"]) == \
        (None, None, None)


def test_listing_recency_follows_hermes_last_active(db: SessionDB) -> None:
    """last_active = the later of the activity stamp and the newest message, else start."""
    for sid, started in (("quiet", 100.0), ("chatty", 200.0), ("busy", 300.0), ("stamped_old", 400.0)):
        db.create_session(sid, "cli")
        set_times(db, sid, started_at=started)
    db.append_message("chatty", "user", "m", timestamp=1000.0)
    db.append_message("busy", "user", "m", timestamp=900.0)
    assert db.record_session_activity("busy", "running tests", "unknown", at=2000.0) is True
    db.append_message("stamped_old", "user", "m", timestamp=1500.0)
    db.record_session_activity("stamped_old", at=450.0)  # older than its newest message
    expected = [("busy", 2000.0), ("stamped_old", 1500.0), ("chatty", 1000.0), ("quiet", 100.0)]
    assert [(r["id"], r["last_active"]) for r in db.search_sessions()] == expected
    listed = db.list_sessions_rich(order_by_last_active=True)
    assert [(r["id"], r["last_active"]) for r in listed] == expected
    # Without the flag the listing is by start, and still reports Hermes' last_active.
    assert [(r["id"], r["last_active"]) for r in db.list_sessions_rich()] == sorted(
        expected, key=lambda x: {"quiet": 100, "chatty": 200, "busy": 300, "stamped_old": 400}[x[0]], reverse=True)


def test_chain_recency_counts_the_activity_of_every_member(db: SessionDB) -> None:
    db.create_session("root", "cli")
    set_times(db, "root", started_at=10.0, ended_at=20.0, end_reason="compression")
    db.create_session("tip", "cli", parent_session_id="root")
    set_times(db, "tip", started_at=21.0)
    db.create_session("other", "cli")
    set_times(db, "other", started_at=30.0)
    db.append_message("other", "user", "m", timestamp=500.0)
    assert [r["id"] for r in db.list_sessions_rich(order_by_last_active=True)] == ["other", "tip"]
    db.record_session_activity("tip", "compressing", "agent.compression", at=600.0)
    listed = db.list_sessions_rich(order_by_last_active=True)
    assert [(r["id"], r.get("_lineage_root_id"), r["last_active"]) for r in listed] == \
        [("tip", "root", 600.0), ("other", None, 500.0)]


def test_activity_stamp_on_reference_sessions_moves_one_to_the_top(db: SessionDB) -> None:
    """Sessions Hermes v26 wrote, imported: recency is by messages until one is stamped."""
    assert db.import_records(reference_records("26")) == (5, 0)
    by_messages = [r["id"] for r in db.search_sessions()]
    newest = {sid: ts for sid, ts in raw_rows(HERMES_DBS / "hermes_v26.db",
                                              "SELECT session_id, max(timestamp) FROM messages GROUP BY 1")}
    assert by_messages == sorted(newest, key=newest.get, reverse=True)
    oldest = by_messages[-1]
    db.record_session_activity(oldest, "x" * 500, "agent.compression_timeout", at=max(newest.values()) + 60)
    assert next(r["id"] for r in db.search_sessions()) == oldest
    row = db.get_session(oldest)
    assert row["last_activity_description"] == "x" * 120  # Hermes bounds it to 120 characters
    assert row["last_activity_provenance"] == "agent.compression_timeout"
    assert db.record_session_activity("no-such-session") is False


# ====================================================================== v25: system prompts


PROMPT_A = "You are Hermes. " * 200 + "系统提示"
PROMPT_B = "You are a terse assistant."


def test_prompts_are_stored_once_by_sha256_and_read_back_whole(db: SessionDB) -> None:
    db.create_session("a1", "cli", system_prompt=PROMPT_A)
    db.create_session("a2", "telegram", system_prompt=PROMPT_A)
    db.create_session("b", "cli", system_prompt=PROMPT_B)
    db.create_session("none", "cli")
    stored = dict(raw_rows(db.db_path, "SELECT hash, prompt FROM system_prompts"))
    assert stored == {sha(PROMPT_A): PROMPT_A, sha(PROMPT_B): PROMPT_B}  # identical prompts share a row
    inline = dict(raw_rows(db.db_path, "SELECT id, system_prompt FROM sessions"))
    assert set(inline.values()) == {None}  # new writes never fill the legacy column
    for sid, prompt in (("a1", PROMPT_A), ("a2", PROMPT_A), ("b", PROMPT_B)):
        row = db.get_session(sid)
        assert (row["system_prompt"], row["system_prompt_hash"]) == (prompt, sha(prompt))
    assert (db.get_session("none")["system_prompt"], db.get_session("none")["system_prompt_hash"]) == (None, None)
    for rows in (db.list_sessions_rich(limit=10), db.search_sessions(limit=10), db.export_all()):
        assert {r["id"]: r["system_prompt"] for r in rows} == {"a1": PROMPT_A, "a2": PROMPT_A, "b": PROMPT_B,
                                                               "none": None}
    # Hermes' own read (COALESCE over a LEFT JOIN) gets the same text from our file.
    hermes_read = dict(raw_rows(db.db_path, "SELECT s.id, COALESCE(sp.prompt, s.system_prompt) FROM sessions s "
                                            "LEFT JOIN system_prompts sp ON sp.hash = s.system_prompt_hash"))
    assert hermes_read == {"a1": PROMPT_A, "a2": PROMPT_A, "b": PROMPT_B, "none": None}
    assert raw_rows(db.db_path, "PRAGMA foreign_key_check") == []


def test_inline_prompts_are_read_through_the_fallback(db: SessionDB) -> None:
    """A session Hermes had not moved yet (v25 allows a partial migration) reads the same."""
    db.create_session("legacy", "cli")
    db.create_session("hashed", "cli", system_prompt=PROMPT_B)
    db._execute_write(lambda c: c.execute("UPDATE sessions SET system_prompt = ? WHERE id = 'legacy'", (PROMPT_A,)))
    assert db.get_session("legacy")["system_prompt"] == PROMPT_A
    assert db.get_session("legacy")["system_prompt_hash"] is None
    assert {r["id"]: r["system_prompt"] for r in db.search_sessions()} == {"legacy": PROMPT_A, "hashed": PROMPT_B}
    # create_session fills only what is missing: the inline prompt stays, nothing is stored for it.
    db.create_session("legacy", "cli", system_prompt="another prompt")
    assert db.get_session("legacy")["system_prompt"] == PROMPT_A
    assert raw_rows(db.db_path, "SELECT count(*) FROM system_prompts") == [(1,)]
    # An update moves it into the store like Hermes' migration would.
    db.update_system_prompt("legacy", PROMPT_A)
    assert raw_rows(db.db_path, "SELECT system_prompt, system_prompt_hash FROM sessions WHERE id = 'legacy'") == \
        [(None, sha(PROMPT_A))]
    assert db.get_session("legacy")["system_prompt"] == PROMPT_A


def test_update_and_delete_keep_only_prompts_in_use(db: SessionDB) -> None:
    db.create_session("s1", "cli", system_prompt=PROMPT_A)
    db.create_session("s2", "cli", system_prompt=PROMPT_A)
    db.update_system_prompt("s1", PROMPT_B)
    assert db.get_session("s1")["system_prompt"] == PROMPT_B
    assert sorted(h for (h,) in raw_rows(db.db_path, "SELECT hash FROM system_prompts")) == \
        sorted([sha(PROMPT_A), sha(PROMPT_B)])  # s2 still uses A
    db.update_session("s2", system_prompt=None)
    assert db.get_session("s2")["system_prompt"] is None
    assert raw_rows(db.db_path, "SELECT hash FROM system_prompts") == [(sha(PROMPT_B),)]
    db.create_session("s3", "cli", system_prompt=PROMPT_B)
    assert db.delete_session("s1") is True
    assert raw_rows(db.db_path, "SELECT hash FROM system_prompts") == [(sha(PROMPT_B),)]  # s3 uses it
    assert db.delete_session("s3") is True
    assert raw_rows(db.db_path, "SELECT count(*) FROM system_prompts") == [(0,)]
    db.update_system_prompt("missing", PROMPT_A)  # unknown session: nothing is left behind
    assert raw_rows(db.db_path, "SELECT count(*) FROM system_prompts") == [(0,)]


def test_prompt_text_is_hashed_as_stored(db: SessionDB) -> None:
    """Lone surrogates become U+FFFD (as in every text column); the hash is of what is kept."""
    db.create_session("s", "cli", system_prompt="half \ud800 pair")
    assert db.get_session("s")["system_prompt_hash"] == sha("half \ufffd pair")
    db.update_system_prompt("s", "caf\u00e9".encode())
    assert db.get_session("s")["system_prompt"] == "caf\u00e9"
    before = db.get_session("s")
    with pytest.raises(InvalidInputError, match="not valid UTF-8"):
        db.update_system_prompt("s", b"\xff")
    with pytest.raises(InvalidInputError, match="system_prompt must be str"):
        db.create_session("t", "cli", system_prompt=12)
    assert db.get_session("s") == before and db.get_session("t") is None


def test_prompts_round_trip_through_export_and_import(db: SessionDB, tmp_path: Path) -> None:
    db.create_session("a", "cli", system_prompt=PROMPT_A)
    db.create_session("b", "cli", system_prompt=PROMPT_A)
    db.append_message("a", "user", "hi")
    exported = db.export_all()
    with SessionDB(tmp_path / "other.db") as other:
        assert other.import_records(exported) == (2, 0)
        assert other.import_records(exported) == (0, 2)
        assert raw_rows(other.db_path, "SELECT hash, prompt FROM system_prompts") == [(sha(PROMPT_A), PROMPT_A)]
        assert raw_rows(other.db_path, "SELECT DISTINCT system_prompt FROM sessions") == [(None,)]
        again = other.export_all()
    def strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "messages"} for r in rows]

    assert strip(again) == strip(exported)


def test_import_keeps_a_hash_only_with_its_text(db: SessionDB) -> None:
    db.import_records([
        {"id": "orphan", "source": "cli", "started_at": 1.0, "system_prompt": None, "system_prompt_hash": "f" * 64},
        {"id": "text", "source": "cli", "started_at": 2.0, "system_prompt": PROMPT_B, "system_prompt_hash": "0" * 64},
    ])
    assert db.get_session("orphan")["system_prompt_hash"] is None  # would point at nothing
    assert db.get_session("text")["system_prompt_hash"] == sha(PROMPT_B)  # recomputed from the text
    assert raw_rows(db.db_path, "PRAGMA foreign_key_check") == []


# ====================================================================== v25: session flags


def test_flags_are_readable_and_writable(db: SessionDB) -> None:
    db.create_session("s", "cli")
    row = db.get_session("s")
    assert {k: row[k] for k in ("hidden", "pinned", "title_source", "last_read_at")} == \
        {"hidden": 0, "pinned": 0, "title_source": None, "last_read_at": None}
    assert db.update_session("s", hidden=True, pinned=1, last_read_at=1234.5, title_source="llm") is True
    want = {"hidden": 1, "pinned": 1, "title_source": "llm", "last_read_at": 1234.5}
    assert {k: db.get_session("s")[k] for k in want} == want
    for rows in (db.list_sessions_rich(include_hidden=True), db.search_sessions(), [db.export_session("s")]):
        assert {k: rows[0][k] for k in want} == want
    before = db.get_session("s")
    with pytest.raises(InvalidInputError, match="hidden"):
        db.update_session("s", pinned=0, hidden=None)  # NOT NULL: refused before writing
    assert db.get_session("s") == before
    assert db.update_session("missing", hidden=1) is False


def test_titles_record_their_source_like_hermes(db: SessionDB) -> None:
    """Hermes v25 wrote the reference file's user-set title with title_source 'user'."""
    assert raw_rows(HERMES_DBS / "hermes_v25.db", "SELECT title, title_source FROM sessions WHERE title IS NOT NULL") \
        == [("compat root title", "user")]
    db.create_session("s", "cli")
    assert db.set_session_title("s", "compat root title") is True
    assert db.get_session("s")["title_source"] == "user"
    assert db.set_session_title("s", "generated", title_source="llm") is False  # never over a user title
    assert db.get_session_title("s") == "compat root title"
    db.create_session("t", "cli")
    assert db.set_session_title("t", "derived one", title_source="derived") is True
    assert db.set_session_title("t", "better", title_source="llm") is True  # llm outranks derived
    assert db.set_session_title("t", "worse", title_source="derived") is False
    assert (db.get_session_title("t"), db.get_session("t")["title_source"]) == ("better", "llm")
    assert db.set_session_title("t", None) is True
    assert (db.get_session_title("t"), db.get_session("t")["title_source"]) == (None, None)
    with pytest.raises(InvalidInputError, match="title_source"):
        db.set_session_title("t", "x", title_source="robot")
    # A title from before v25 (unknown source) is not replaced by an automatic one.
    db._execute_write(lambda c: c.execute("UPDATE sessions SET title = 'old', title_source = NULL WHERE id = 't'"))
    assert db.set_session_title("t", "auto", title_source="llm") is False
    assert db.get_session_title("t") == "old"


# ====================================================================== v29/v30: search exclusions


CJK_TEXT = "我们完成了数据库迁移工作"
CALL_TEXT = "调用终端工具清理缓存"


def _corpus(db: SessionDB) -> None:
    sessions = [
        ("normal", "cli", None),
        ("broken_config", "telegram", "{not json"),           # malformed model_config: indexed
        ("cron_run", "cron", None),
        ("subagent_src", "subagent", None),
        ("delegate", "cli", json.dumps({"_delegate_from": "normal"})),
        ("branch", "cli", json.dumps({"_branched_from": "normal"})),
    ]
    for sid, source, config in sessions:
        db.create_session(sid, source)
        if config is not None:
            db._execute_write(lambda c, s=sid, m=config: c.execute(
                "UPDATE sessions SET model_config = ? WHERE id = ?", (m, s)))
    for sid, _source, _config in sessions:
        db.append_message(sid, "user", f"{CJK_TEXT} kubernetes {sid}")
        db.append_message(sid, "assistant", None, tool_calls=[
            {"id": "c1", "type": "function", "function": {"name": "terminal",
                                                        "arguments": json.dumps({"cmd": f"{CALL_TEXT} zebraarg"},
                                                                                ensure_ascii=False)}}])
        db.append_message(sid, "tool", f"工具输出 数据库 {sid}", tool_name="terminal")


@pytest.fixture
def corpus(db: SessionDB) -> Iterator[SessionDB]:
    _corpus(db)
    yield db


def _indexed_sessions(path: Path) -> set[str]:
    """Hermes' own answer: the sessions whose messages its trigram view feeds to the index."""
    return {sid for (sid,) in raw_rows(path, "SELECT DISTINCT m.session_id FROM messages_fts_trigram_src v "
                                            "JOIN messages m ON m.id = v.id")}


def _brute(path: Path, term: str, sessions: set[str]) -> set[int]:
    return {mid for mid, sid, *cols in raw_rows(path, "SELECT id, session_id, content, tool_name, tool_calls "
                                                      "FROM messages")
            if sid in sessions and any(c is not None and term in c for c in cols)}


def test_trigram_view_is_hermes_v30(db: SessionDB) -> None:
    """Our file's trigram view and triggers are Hermes' late-v30 text, so the sessions
    the index leaves out (the routes below follow it) are the ones Hermes leaves out."""
    ours, want = snap(db.db_path), reference_schema(30)
    assert ours["views"]["messages_fts_trigram_src"] == want["views"]["messages_fts_trigram_src"]
    assert "'cron','subagent'" in want["views"]["messages_fts_trigram_src"]
    for name in ("messages_fts_trigram_insert", "messages_fts_trigram_delete", "messages_fts_trigram_update"):
        assert ours["triggers"][name] == want["triggers"][name]


@pytest.mark.parametrize("strategy", ["scan", "bigram blocks"])
@pytest.mark.parametrize("term,kind", [("库", "substring"), ("迁移", "substring"), ("数据库迁移", "trigram"),
                                       ("终端", "substring"), ("终端工具", "trigram"), ("工具输出", "trigram")])
def test_every_cjk_route_leaves_out_what_the_trigram_index_leaves_out(
    corpus: SessionDB, monkeypatch, strategy: str, term: str, kind: str
) -> None:
    db = corpus
    if strategy == "bigram blocks":
        db.index_search()
        monkeypatch.setattr(bigram, "estimate_blocks", lambda conn, grams, **_: 0)
    assert plan_search(term).kind == kind
    indexed = _indexed_sessions(db.db_path)
    assert indexed == {"normal", "broken_config", "branch"}
    hits = db.search_messages(term, limit=100)
    assert {h["session_id"] for h in hits} <= indexed
    assert {h["id"] for h in hits} == _brute(db.db_path, term, indexed)
    # Filters cannot bring an excluded session back.
    assert db.search_messages(term, source_filter=["cron", "subagent"]) == []


def test_trigram_hits_are_the_index_plus_rows_it_cannot_hold(corpus: SessionDB) -> None:
    """3+ characters: Hermes' index answers for plain rows; tool rows and tool calls
    (not in the v30 trigram index) are matched by substring, in indexed sessions only."""
    db = corpus
    from_index = {r for (r,) in raw_rows(db.db_path, "SELECT rowid FROM messages_fts_trigram "
                                                     "WHERE messages_fts_trigram MATCH '\"数据库迁移\"'")}
    assert len(from_index) == 3
    assert {h["id"] for h in db.search_messages("数据库迁移")} == from_index
    calls = db.search_messages(CALL_TEXT[:6])  # only in tool-call arguments
    assert sorted(h["session_id"] for h in calls) == ["branch", "broken_config", "normal"]
    assert raw_rows(db.db_path, "SELECT count(*) FROM messages_fts_trigram WHERE messages_fts_trigram MATCH ?",
                    (f'"{CALL_TEXT[:6]}"',)) == [(0,)]


def test_word_search_still_finds_cron_and_subagent_rows(corpus: SessionDB) -> None:
    db = corpus
    everyone = {"normal", "broken_config", "cron_run", "subagent_src", "delegate", "branch"}
    assert {h["session_id"] for h in db.search_messages("kubernetes", limit=100)} == everyone
    # Tool-call arguments are in the word index (messages_fts_src keeps tool_calls).
    args = db.search_messages("zebraarg", limit=100)
    assert {h["session_id"] for h in args} == everyone and {h["role"] for h in args} == {"assistant"}
    assert {h["source"] for h in db.search_messages("kubernetes", source_filter=["cron", "subagent"])} == \
        {"cron", "subagent"}


def test_a_v29_file_leaves_out_cron_only(migrate) -> None:
    """The routes follow the index the file has: at revision 0029 only cron is left out."""
    from hermes_store.engine import create_engine
    from hermes_store.repositories import MessageRepository, SearchRepository, SessionRepository
    from hermes_store.uow import UnitOfWork

    path = migrate("0029")
    engine = create_engine(path)
    try:
        with UnitOfWork(engine) as uow:
            for sid, source in (("normal", "cli"), ("cron_run", "cron"), ("subagent_src", "subagent")):
                SessionRepository(uow.conn).create(sid, source)
                MessageRepository(uow.conn).append(sid, "user", f"{CJK_TEXT} {sid}")
        for term in ("迁", "迁移", "数据库迁移"):
            with engine.connect() as conn:
                hits = SearchRepository(conn).search_messages(term)
            assert sorted(h["session_id"] for h in hits) == ["normal", "subagent_src"], term
    finally:
        engine.dispose()
