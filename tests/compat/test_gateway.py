"""Hermes v23 gateway state through the swapped ``hermes_state`` (reference §1.E).

Session peers and expiry, routing entries (per scope), the gateway's session listing,
origin lookups and the resume lookup of a peer.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from .helpers import other_store
from sqlalchemy import text

pytestmark = pytest.mark.both_backends

PEER = ("session_key", "source", "user_id", "chat_id", "chat_type", "thread_id", "display_name", "origin_json")





def peer_of(db, sid: str) -> dict[str, Any]:
    found = db.get_session(sid)
    assert found is not None, sid
    return {k: found[k] for k in PEER}


def query(db, sql: str, **params: Any) -> list[dict[str, Any]]:
    return db._read(lambda c: [dict(r) for r in c.execute(text(sql), params).mappings()])


def execute(db, sql: str, **params: Any) -> None:
    db._write(lambda c: c.execute(text(sql), params))


def gateway_session(db, sid: str, *, started_at: float, source: str = "telegram", key: str | None = "k",
                    user: str | None = "u1", chat: str | None = "c1", chat_type: str | None = "dm",
                    thread: str | None = None, messages: int = 0) -> str:
    db.create_session(sid, source, started_at=started_at)
    if key is not None:
        db.record_gateway_session_peer(sid, source=source, user_id=user, session_key=key, chat_id=chat,
                                       chat_type=chat_type, thread_id=thread)
    for i in range(messages):
        db.append_message(sid, "user", f"m{i}", timestamp=started_at + 1 + i)
    return sid


# ---------------------------------------------------------------------- peers


def test_peer_sets_given_columns_and_never_clears_with_none(db) -> None:
    db.create_session("s", "cli")
    db.record_gateway_session_peer("s", source="telegram", user_id="u", session_key="agent:main:tg:dm:1",
                                   chat_id="c", chat_type="dm", thread_id="t", display_name="Alice",
                                   origin_json='{"platform": "telegram"}')
    assert peer_of(db, "s") == {
        "session_key": "agent:main:tg:dm:1", "source": "telegram", "user_id": "u", "chat_id": "c",
        "chat_type": "dm", "thread_id": "t", "display_name": "Alice", "origin_json": '{"platform": "telegram"}',
    }
    # Key and source always change; None keeps the identity columns (ours: Hermes v26 clears
    # them, losing who the session talks to), and display_name / origin_json stay when not given.
    db.record_gateway_session_peer("s", source="discord", session_key="k2")
    assert peer_of(db, "s") == {
        "session_key": "k2", "source": "discord", "user_id": "u", "chat_id": "c", "chat_type": "dm",
        "thread_id": "t", "display_name": "Alice", "origin_json": '{"platform": "telegram"}',
    }
    db.record_gateway_session_peer("s", source="discord", session_key="k2", chat_id="c2")
    assert (peer_of(db, "s")["chat_id"], peer_of(db, "s")["user_id"]) == ("c2", "u")
    db.record_gateway_session_peer("s", source="discord", session_key="k2", display_name="Bob", origin_json="{}")
    assert (peer_of(db, "s")["display_name"], peer_of(db, "s")["origin_json"]) == ("Bob", "{}")


@pytest.mark.parametrize("sid, key", [("", "k"), (None, "k"), ("s", ""), ("s", None)])
def test_peer_is_a_no_op_without_session_id_or_session_key(db, sid, key) -> None:
    db.create_session("s", "cli", user_id="u")
    before = db.get_session("s")
    db.record_gateway_session_peer(sid, source="telegram", session_key=key, user_id="other", chat_id="c")
    assert db.get_session("s") == before


def test_peer_of_an_unknown_session_inserts_its_row(db) -> None:
    """Hermes v26: without include_compression_ancestors a missing row is inserted."""
    assert db.record_gateway_session_peer("ghost", source="telegram", session_key="k", user_id="u") is None
    row = db.get_session("ghost")
    assert (row["source"], row["session_key"], row["user_id"], row["ended_at"]) == ("telegram", "k", "u", None)
    assert query(db, "SELECT count(*) AS n FROM sessions") == [{"n": 1}]


def test_integer_peer_ids_are_stored_as_their_text(db) -> None:
    """Telegram ids are ints: SQLite's TEXT affinity stores '-100'; PostgreSQL gets the same text."""
    db.create_session("s", "telegram")
    db.record_gateway_session_peer("s", source="telegram", session_key="k", user_id=42, chat_id=-100, thread_id=7)
    got = peer_of(db, "s")
    assert (got["user_id"], got["chat_id"], got["thread_id"]) == ("42", "-100", "7")
    assert db.find_session_by_origin(platform="telegram", chat_id=-100, thread_id=7, user_id=42) == "s"


def test_bad_peer_values_are_refused_before_anything_is_written(db, hermes_state) -> None:
    db.create_session("s", "cli", user_id="u")
    before = db.get_session("s")
    for bad in ({"chat_id": {"id": 1}}, {"user_id": 1.5}, {"display_name": b"bytes"}, {"source": None}):
        kwargs = {"source": "telegram", "session_key": "k", **bad}
        with pytest.raises(hermes_state.errors.InvalidInputError):
            db.record_gateway_session_peer("s", **kwargs)
    assert db.get_session("s") == before


def test_a_lone_surrogate_in_a_display_name_keeps_the_row(db) -> None:
    db.create_session("s", "telegram")
    db.record_gateway_session_peer("s", source="telegram", session_key="k", display_name="A\ud800B")
    assert peer_of(db, "s")["display_name"] == "A\ufffdB"


def test_expiry_finalized_defaults_to_true_and_can_be_cleared(db) -> None:
    db.create_session("s", "telegram")
    assert db.get_session("s")["expiry_finalized"] == 0
    assert db.set_expiry_finalized("s") is None
    assert db.get_session("s")["expiry_finalized"] == 1
    db.set_expiry_finalized("s", False)
    assert db.get_session("s")["expiry_finalized"] == 0
    db.set_expiry_finalized("s", finalized=1)  # truthy, stored as 1
    assert db.get_session("s")["expiry_finalized"] == 1


def test_expiry_finalized_ignores_falsy_and_unknown_ids(db) -> None:
    db.create_session("s", "telegram")
    for sid in ("", None, "ghost"):
        db.set_expiry_finalized(sid)
    assert db.get_session("s")["expiry_finalized"] == 0
    assert db.get_session("ghost") is None


# ---------------------------------------------------------------------- routing entries


def test_save_upserts_per_scope_and_stamps_updated_at(db, clock) -> None:
    db.save_gateway_routing_entry("k1", '{"v": 1}')
    clock.now += 5
    db.save_gateway_routing_entry("k1", '{"v": 2}')
    db.save_gateway_routing_entry("k1", '{"other": true}', scope="bot2")
    assert db.load_gateway_routing_entries() == {"k1": '{"v": 2}'}
    assert db.load_gateway_routing_entries(scope="bot2") == {"k1": '{"other": true}'}
    rows = query(db, "SELECT scope, updated_at FROM gateway_routing ORDER BY scope")
    assert rows == [{"scope": "", "updated_at": clock.now}, {"scope": "bot2", "updated_at": clock.now}]


@pytest.mark.parametrize("key, entry", [("", "{}"), (None, "{}"), ("k", ""), ("k", None)])
def test_save_is_a_no_op_for_a_falsy_key_or_entry(db, key, entry) -> None:
    db.save_gateway_routing_entry(key, entry)
    assert query(db, "SELECT count(*) AS n FROM gateway_routing") == [{"n": 0}]


def test_load_of_an_empty_or_unknown_scope_is_an_empty_dict_in_key_order_otherwise(db) -> None:
    assert db.load_gateway_routing_entries() == {}
    for key in ("b", "c", "a"):
        db.save_gateway_routing_entry(key, key.upper())
    got = db.load_gateway_routing_entries()
    assert got == {"a": "A", "b": "B", "c": "C"} and list(got) == ["a", "b", "c"]
    assert db.load_gateway_routing_entries(scope="nope") == {}


def test_replace_swaps_one_scope_skipping_falsy_pairs(db) -> None:
    db.save_gateway_routing_entry("old", "1")
    db.save_gateway_routing_entry("keep", "x", scope="other")
    assert db.replace_gateway_routing_entries({"a": "A", "b": "B", "": "no-key", "c": ""}) is None
    assert db.load_gateway_routing_entries() == {"a": "A", "b": "B"}
    assert db.load_gateway_routing_entries(scope="other") == {"keep": "x"}
    db.replace_gateway_routing_entries({}, scope="")
    assert db.load_gateway_routing_entries() == {}
    assert db.load_gateway_routing_entries(scope="other") == {"keep": "x"}


def test_replace_with_a_bad_entry_leaves_the_scope_as_it_was(db, hermes_state) -> None:
    db.replace_gateway_routing_entries({"a": "A"})
    with pytest.raises(hermes_state.errors.InvalidInputError):
        db.replace_gateway_routing_entries({"b": "B", "c": {"not": "json text"}})
    with pytest.raises(hermes_state.errors.InvalidInputError):
        db.replace_gateway_routing_entries([("b", "B")])  # type: ignore[arg-type]
    assert db.load_gateway_routing_entries() == {"a": "A"}


def test_integer_keys_are_text_and_a_text_twin_wins_as_in_a_dict(db) -> None:
    db.replace_gateway_routing_entries({1: "int", "2": "two", 2: "int-two"})  # type: ignore[dict-item]
    assert db.load_gateway_routing_entries() == {"1": "int", "2": "int-two"}


def test_delete_removes_the_listed_keys_of_one_scope(db) -> None:
    db.replace_gateway_routing_entries({"a": "1", "b": "2", "c": "3"})
    db.replace_gateway_routing_entries({"a": "x"}, scope="s2")
    assert db.delete_gateway_routing_entries(["a", "c", "missing", "a"]) is None
    assert db.load_gateway_routing_entries() == {"b": "2"}
    assert db.load_gateway_routing_entries(scope="s2") == {"a": "x"}
    db.delete_gateway_routing_entries([])
    db.delete_gateway_routing_entries(["a"], scope="s2")
    assert db.load_gateway_routing_entries(scope="s2") == {}
    assert db.load_gateway_routing_entries() == {"b": "2"}


def test_delete_of_more_keys_than_one_statement_binds(db) -> None:
    keys = [f"k{i:04d}" for i in range(1_300)]
    db.replace_gateway_routing_entries({k: "v" for k in keys})
    db.delete_gateway_routing_entries(keys[:1_250])
    assert list(db.load_gateway_routing_entries()) == keys[1_250:]


def test_routing_rejects_a_bare_string_of_keys_and_a_non_text_scope(db, hermes_state) -> None:
    db.save_gateway_routing_entry("abc", "1")
    with pytest.raises(hermes_state.errors.InvalidInputError):
        db.delete_gateway_routing_entries("abc")  # would delete 'a', 'b', 'c' one by one
    for call in (lambda: db.load_gateway_routing_entries(scope=None),
                 lambda: db.save_gateway_routing_entry("x", "1", scope=None),
                 lambda: db.replace_gateway_routing_entries({}, scope=1)):
        with pytest.raises(hermes_state.errors.InvalidInputError):
            call()
    assert db.load_gateway_routing_entries() == {"abc": "1"}


def test_a_reader_never_sees_half_a_replacement(db, hermes_state) -> None:
    """replace_* is one transaction: a concurrent reader sees the old set or the new one."""
    old = {f"k{i}": "old" for i in range(20)}
    new = {f"k{i}": "new" for i in range(20)}
    db.replace_gateway_routing_entries(old)
    reader = other_store(hermes_state, db)
    seen: list[dict[str, str]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(reader.load_gateway_routing_entries())

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for i in range(30):
            db.replace_gateway_routing_entries(new if i % 2 == 0 else old)
    finally:
        done.set()
        thread.join()
        reader.close()
    assert seen and all(s in (old, new) for s in seen), [s for s in seen if s not in (old, new)][:1]


# ---------------------------------------------------------------------- list_gateway_sessions


def test_list_returns_the_newest_session_of_each_key_with_last_active(db) -> None:
    gateway_session(db, "k1-old", started_at=100, key="k1", messages=1)
    gateway_session(db, "k1-new", started_at=200, key="k1")
    gateway_session(db, "k2", started_at=150, key="k2", messages=2)  # messages at 151, 152
    db.create_session("plain", "telegram", started_at=300)  # no session_key: never listed
    rows = db.list_gateway_sessions()
    assert [(r["id"], r["last_active"]) for r in rows] == [("k1-new", 200), ("k2", 152)]
    full = db.get_session("k2")
    assert {k: v for k, v in rows[1].items() if k != "last_active"} == full


def test_list_active_only_drops_a_key_whose_newest_session_ended(db) -> None:
    gateway_session(db, "live-old", started_at=100, key="k")
    gateway_session(db, "ended-new", started_at=200, key="k")
    db.end_session("ended-new", "user_exit")
    assert db.list_gateway_sessions() == []  # the older live one does not stand in
    assert [r["id"] for r in db.list_gateway_sessions(active_only=False)] == ["ended-new"]


def test_list_filters_platform_case_insensitively(db) -> None:
    gateway_session(db, "tg", started_at=100, source="Telegram", key="a")
    gateway_session(db, "dc", started_at=200, source="discord", key="b")
    assert [r["id"] for r in db.list_gateway_sessions(platform="TELEGRAM")] == ["tg"]
    assert [r["id"] for r in db.list_gateway_sessions(platform="slack")] == []
    assert [r["id"] for r in db.list_gateway_sessions(platform=None)] == ["dc", "tg"]


def test_list_keeps_every_session_tied_on_the_newest_start(db) -> None:
    gateway_session(db, "a", started_at=100, key="k")
    gateway_session(db, "b", started_at=100, key="k")
    gateway_session(db, "c", started_at=50, key="k")
    assert sorted(r["id"] for r in db.list_gateway_sessions()) == ["a", "b"]


def test_list_resolves_the_full_system_prompt(db) -> None:
    prompt = "You are the gateway agent. " * 20
    db.create_session("s", "telegram", system_prompt=prompt, session_key="k")
    (row,) = db.list_gateway_sessions()
    assert row["system_prompt"] == prompt


# ---------------------------------------------------------------------- find_session_by_origin


@pytest.mark.parametrize("platform, chat_id", [("", "c1"), (None, "c1"), ("telegram", None), ("telegram", "")])
def test_origin_needs_a_platform_and_a_chat(db, platform, chat_id) -> None:
    gateway_session(db, "s", started_at=100, chat="")
    assert db.find_session_by_origin(platform=platform, chat_id=chat_id) is None


def test_origin_finds_the_newest_live_keyed_session_of_the_chat(db) -> None:
    gateway_session(db, "old", started_at=100)
    gateway_session(db, "new", started_at=200)
    gateway_session(db, "ended", started_at=300)
    db.end_session("ended", "user_exit")
    gateway_session(db, "other-chat", started_at=400, chat="c2")
    db.create_session("unkeyed", "telegram", chat_id="c1", started_at=500)  # no session_key
    assert db.find_session_by_origin(platform="TeleGram", chat_id="c1") == "new"
    assert db.find_session_by_origin(platform="discord", chat_id="c1") is None


def test_origin_chat_zero_is_a_chat(db) -> None:
    gateway_session(db, "s", started_at=100, chat="0")
    assert db.find_session_by_origin(platform="telegram", chat_id=0) == "s"


def test_origin_thread_matches_null_as_empty_and_none_means_any(db) -> None:
    gateway_session(db, "no-thread", started_at=100, thread=None)
    gateway_session(db, "thread-7", started_at=200, thread="7")
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", thread_id="7") == "thread-7"
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", thread_id=7) == "thread-7"
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", thread_id="") == "no-thread"
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", thread_id="8") is None
    assert db.find_session_by_origin(platform="telegram", chat_id="c1") == "thread-7"


def test_origin_without_user_refuses_a_chat_shared_by_several_users(db) -> None:
    gateway_session(db, "anon", started_at=50, user=None)
    gateway_session(db, "alice", started_at=100, user="alice")
    assert db.find_session_by_origin(platform="telegram", chat_id="c1") == "alice"  # empty user: no conflict
    gateway_session(db, "bob", started_at=200, user="bob")
    assert db.find_session_by_origin(platform="telegram", chat_id="c1") is None


def test_origin_with_user_returns_that_users_newest_session(db) -> None:
    gateway_session(db, "alice-old", started_at=100, user="alice")
    gateway_session(db, "alice-new", started_at=200, user="alice")
    gateway_session(db, "bob", started_at=300, user="bob")
    got = db.find_session_by_origin(platform="telegram", chat_id="c1", user_id="alice")
    assert got == "alice-new" and type(got) is str
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", user_id="carol") is None


def test_origin_never_hands_a_lone_session_of_another_user_over(db) -> None:
    """Deliberate difference: Hermes returns a single non-matching candidate here."""
    gateway_session(db, "bob", started_at=100, user="bob")
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", user_id="alice") is None
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", user_id="bob") == "bob"
    # Without a user the lone session is still found (there is no one to confuse it with).
    assert db.find_session_by_origin(platform="telegram", chat_id="c1") == "bob"


# ---------------------------------------------------------------------- find_latest_gateway_session_for_peer


def latest(db, **kwargs: Any) -> str | None:
    found = db.find_latest_gateway_session_for_peer(**kwargs)
    return None if found is None else found["id"]


@pytest.mark.parametrize("key", ["", None])
def test_peer_lookup_needs_a_session_key(db, key) -> None:
    gateway_session(db, "s", started_at=100, messages=1)
    assert db.find_latest_gateway_session_for_peer(source="telegram", session_key=key, chat_id="c1",
                                                   chat_type="dm", user_id="u1") is None


def test_peer_lookup_by_key_wants_the_exact_source_and_a_conversation(db) -> None:
    gateway_session(db, "old", started_at=100, messages=1)
    gateway_session(db, "newer-empty", started_at=200)  # no messages: not resumable
    gateway_session(db, "other-source", started_at=300, source="discord", messages=1)
    assert latest(db, source="telegram", session_key="k") == "old"
    assert latest(db, source="Telegram", session_key="k") is None  # exact source
    assert latest(db, source="telegram", session_key="other") is None
    row = db.find_latest_gateway_session_for_peer(source="telegram", session_key="k")
    assert row == db.get_session("old")


def test_peer_lookup_counts_a_message_row_or_a_message_count(db) -> None:
    gateway_session(db, "rows-only", started_at=100, messages=1)
    execute(db, "UPDATE sessions SET message_count = 0 WHERE id = 'rows-only'")
    assert latest(db, source="telegram", session_key="k") == "rows-only"
    gateway_session(db, "count-only", started_at=200)
    execute(db, "UPDATE sessions SET message_count = 3 WHERE id = 'count-only'")
    assert latest(db, source="telegram", session_key="k") == "count-only"


@pytest.mark.parametrize("reason, resumable", [("agent_close", True), ("ws_orphan_reap", True),
                                               ("compression", False), ("user_exit", False)])
def test_peer_lookup_resumes_only_recoverable_ends(db, reason, resumable) -> None:
    gateway_session(db, "older-live", started_at=100, messages=1)
    gateway_session(db, "ended", started_at=200, messages=1)
    db.end_session("ended", reason)
    assert latest(db, source="telegram", session_key="k") == ("ended" if resumable else "older-live")


def test_peer_lookup_falls_back_to_the_peer_columns_only_with_chat_and_type(db) -> None:
    gateway_session(db, "s", started_at=100, key="old-key", user=None, chat="c1", chat_type="dm", thread=None,
                    messages=1)
    assert latest(db, source="telegram", session_key="new-key") is None
    assert latest(db, source="telegram", session_key="new-key", chat_id="c1") is None  # no chat_type
    # NULL user/thread match None and '' alike.
    assert latest(db, source="telegram", session_key="new-key", chat_id="c1", chat_type="dm") == "s"
    assert latest(db, source="telegram", session_key="new-key", chat_id="c1", chat_type="dm",
                  user_id="", thread_id="") == "s"
    for miss in ({"user_id": "u9"}, {"thread_id": "3"}, {"chat_type": "group"}, {"chat_id": "c2"}):
        kwargs = {"source": "telegram", "session_key": "new-key", "chat_id": "c1", "chat_type": "dm", **miss}
        assert latest(db, **kwargs) is None, miss
    assert latest(db, source="discord", session_key="new-key", chat_id="c1", chat_type="dm") is None


def test_peer_lookup_prefers_the_key_pass_over_a_newer_peer_match(db) -> None:
    gateway_session(db, "by-key", started_at=100, key="k", chat="c1", messages=1)
    gateway_session(db, "by-peer", started_at=200, key="other", chat="c9", messages=1)
    execute(db, "UPDATE sessions SET chat_id = 'c1' WHERE id = 'by-peer'")
    assert latest(db, source="telegram", session_key="k", chat_id="c1", chat_type="dm", user_id="u1") == "by-key"


def test_peer_lookup_with_integer_ids(db) -> None:
    db.create_session("s", "telegram", started_at=100)
    db.record_gateway_session_peer("s", source="telegram", session_key="k", user_id=5, chat_id=-100,
                                   chat_type="dm", thread_id=9)
    db.append_message("s", "user", "hi")
    assert latest(db, source="telegram", session_key="x", user_id=5, chat_id=-100, chat_type="dm",
                  thread_id=9) == "s"


@pytest.mark.sqlite_only
def test_gateway_reads_work_on_a_read_only_store(db, hermes_state) -> None:
    gateway_session(db, "s", started_at=100, messages=1)
    db.save_gateway_routing_entry("k", "1")
    path = db.db_path
    db.close()
    ro = hermes_state.SessionDB(path, read_only=True)
    try:
        assert latest(ro, source="telegram", session_key="k") == "s"
        assert ro.find_session_by_origin(platform="telegram", chat_id="c1") == "s"
        assert [r["id"] for r in ro.list_gateway_sessions()] == ["s"]
        assert ro.load_gateway_routing_entries() == {"k": "1"}
        with pytest.raises(hermes_state.errors.ReadOnlyDatabaseError):
            ro.save_gateway_routing_entry("k", "2")
    finally:
        ro.close()
