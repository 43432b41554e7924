"""Hermes v26 §2.D gateway: peer recording (insert, no clearing, compression ancestors),
the resume lookup's new rules, origin lookups across users, and the handoff state
machine; through the swapped ``hermes_state`` module, on both backends."""

from __future__ import annotations

import inspect
import threading

import pytest
from sqlalchemy import text

from .helpers import other_store

pytestmark = pytest.mark.both_backends

E = inspect.Parameter.empty


def params(S, name: str) -> list:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(getattr(S, name)).parameters.values()]


def test_signatures(hermes_state) -> None:
    S = hermes_state.SessionDB
    pk, kw = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    assert params(S, "record_gateway_session_peer") == [
        ("self", pk, E), ("session_id", pk, E), ("source", kw, E), ("user_id", kw, None), ("session_key", kw, None),
        ("chat_id", kw, None), ("chat_type", kw, None), ("thread_id", kw, None), ("display_name", kw, None),
        ("origin_json", kw, None), ("include_compression_ancestors", kw, False)]
    assert params(S, "request_handoff") == [("self", pk, E), ("session_id", pk, E), ("platform", pk, E)]
    assert params(S, "bind_telegram_topic") == [
        ("self", pk, E), ("chat_id", kw, E), ("thread_id", kw, E), ("user_id", kw, E), ("session_key", kw, E),
        ("session_id", kw, E), ("managed_mode", kw, "auto")]
    for name in ("claim_handoff", "complete_handoff", "get_handoff_state"):
        assert params(S, name) == [("self", pk, E), ("session_id", pk, E)], name
    assert params(S, "list_pending_handoffs") == [("self", pk, E)]


def peer(db, sid: str) -> tuple:
    row = db.get_session(sid)
    return tuple(row[k] for k in ("session_key", "source", "user_id", "chat_id", "chat_type", "thread_id"))


# ---------------------------------------------------------------------------- record_gateway_session_peer


def compression_chain(db, users: tuple) -> None:
    """a ─compression→ b ─compression→ c (live); users per row."""
    for sid, parent, user in zip("abc", (None, "a", "b"), users, strict=True):
        db.create_session(sid, "telegram", user_id=user, **({"parent_session_id": parent} if parent else {}))
        if sid != "c":
            db.end_session(sid, "compression")


def test_ancestors_follow_compression_ends(db) -> None:
    compression_chain(db, ("u1", "u1", "u1"))
    db.create_session("unrelated", "telegram")
    db.record_gateway_session_peer("c", source="telegram", session_key="K", user_id="u1", chat_id="c1",
                                   chat_type="dm", include_compression_ancestors=True)
    assert [peer(db, s)[0] for s in ("a", "b", "c", "unrelated")] == ["K", "K", "K", None]
    db.record_gateway_session_peer("c", source="telegram", session_key="K2")
    assert [peer(db, s)[0] for s in "abc"] == ["K", "K", "K2"]  # without the flag: the row alone


def test_ancestors_of_another_user_are_not_rewritten(db) -> None:
    compression_chain(db, ("intruder", "u1", "u1"))
    db.record_gateway_session_peer("c", source="telegram", session_key="K", user_id="u1",
                                   include_compression_ancestors=True)
    assert [peer(db, s)[0] for s in "abc"] == [None, "K", "K"]


def test_an_ancestor_not_ended_by_compression_stops_the_walk(db) -> None:
    db.create_session("a", "telegram")
    db.end_session("a", "session_reset")
    db.create_session("b", "telegram", parent_session_id="a")
    db.record_gateway_session_peer("b", source="telegram", session_key="K", include_compression_ancestors=True)
    assert (peer(db, "a")[0], peer(db, "b")[0]) == (None, "K")


def test_none_never_clears_and_a_missing_row_is_inserted(db) -> None:
    db.record_gateway_session_peer("new", source="discord", session_key="K", user_id=7, chat_id=-5, chat_type="dm")
    assert peer(db, "new") == ("K", "discord", "7", "-5", "dm", None)
    db.record_gateway_session_peer("new", source="discord", session_key="K", thread_id="t")
    assert peer(db, "new") == ("K", "discord", "7", "-5", "dm", "t")
    assert db.get_session("new")["started_at"] > 0
    db.record_gateway_session_peer("ghost", source="discord", session_key="K", include_compression_ancestors=True)
    assert db.get_session("ghost") is None  # the lineage form updates rows, it inserts none


# ---------------------------------------------------------------------------- resume lookup


def session(db, sid: str, *, started: float, key: str = "k", user: str | None = "u1", messages: int = 0,
            activity: float | None = None) -> None:
    db.create_session(sid, "telegram")
    db.update_session(sid, started_at=started, last_activity_at=activity)
    db.record_gateway_session_peer(sid, source="telegram", session_key=key, user_id=user, chat_id="c1",
                                   chat_type="dm")
    for i in range(messages):
        db.append_message(sid, "user", f"m{i}")
    if messages:
        db._write(lambda c: c.execute(text("UPDATE messages SET timestamp = :t WHERE session_id = :s"),
                                      {"t": started + 1, "s": sid}))


def found(db, **kwargs) -> str | None:
    row = db.find_latest_gateway_session_for_peer(source="telegram", **kwargs)
    return None if row is None else row["id"]


def test_pass_one_takes_a_message_less_row_but_prefers_messages(db) -> None:
    session(db, "empty", started=100)
    assert found(db, session_key="k") == "empty"
    session(db, "talked", started=50, messages=1)
    assert found(db, session_key="k") == "talked"


def test_pass_one_orders_by_activity_then_start(db) -> None:
    session(db, "started-late", started=300, messages=1)
    session(db, "active-late", started=200, messages=1, activity=400)
    assert found(db, session_key="k") == "active-late"


def test_a_reset_after_the_candidates_activity_rejects_it(db) -> None:
    session(db, "old", started=100, messages=1)
    session(db, "reset", started=150)
    db.end_session("reset", "session_reset")
    db._write(lambda c: c.execute(text("UPDATE sessions SET ended_at = 500 WHERE id = 'reset'")))
    assert found(db, session_key="k") is None
    assert found(db, session_key="other-key", chat_id="c1", chat_type="dm", user_id="u1") is None  # pass 2 too
    session(db, "after", started=600, messages=1)  # active after the reset: fine
    assert found(db, session_key="k") == "after"


def test_an_old_reset_does_not_reject_a_later_session(db) -> None:
    session(db, "reset", started=10)
    db.end_session("reset", "daily")
    db._write(lambda c: c.execute(text("UPDATE sessions SET ended_at = 20 WHERE id = 'reset'")))
    session(db, "live", started=100, messages=1)
    assert found(db, session_key="k") == "live"


def test_pass_one_never_hands_over_another_users_session(db) -> None:
    session(db, "theirs", started=100, user="u2", messages=1)
    assert found(db, session_key="k", user_id="u1") is None
    assert found(db, session_key="k", user_id="u2") == "theirs"
    assert found(db, session_key="k") == "theirs"  # no user given: the key decides
    session(db, "anon", started=50, user=None, messages=1)
    assert found(db, session_key="k", user_id="u1") == "anon"


def test_origin_never_crosses_users(db) -> None:
    session(db, "theirs", started=100, user="u2")
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", user_id="u1") is None
    assert db.find_session_by_origin(platform="telegram", chat_id="c1", user_id="u2") == "theirs"


# ---------------------------------------------------------------------------- handoffs


def test_handoff_state_machine(db) -> None:
    db.create_session("s", "telegram")
    assert db.get_handoff_state("s") == {"state": None, "platform": None, "error": None}
    assert db.get_handoff_state("ghost") is None
    assert db.claim_handoff("s") is False  # nothing requested
    assert db.request_handoff("s", "discord") is True
    assert db.request_handoff("s", "slack") is False  # already pending
    assert [r["id"] for r in db.list_pending_handoffs()] == ["s"]
    assert db.claim_handoff("s") is True and db.claim_handoff("s") is False
    assert db.list_pending_handoffs() == []
    assert db.request_handoff("s", "slack") is False  # running
    assert db.fail_handoff("s", "x" * 800) is True
    state = db.get_handoff_state("s")
    assert (state["state"], state["platform"], len(state["error"])) == ("failed", "discord", 500)
    assert db.request_handoff("s", "slack") is True  # from failed
    assert db.get_handoff_state("s") == {"state": "pending", "platform": "slack", "error": None}
    assert db.complete_handoff("s") is True
    assert db.get_handoff_state("s")["state"] == "completed"
    assert db.complete_handoff("s") is False
    assert db.request_handoff("s", "cli") is True  # from completed
    assert db.request_handoff("ghost", "cli") is False


def test_pending_handoffs_oldest_first(db) -> None:
    for sid, started in (("b", 200.0), ("a", 100.0), ("c", 300.0)):
        db.create_session(sid, "telegram")
        db.update_session(sid, started_at=started)
        db.request_handoff(sid, "discord")
    db.claim_handoff("c")
    assert [r["id"] for r in db.list_pending_handoffs()] == ["a", "b"]


def test_one_claimer_wins(db, hermes_state) -> None:
    db.create_session("s", "telegram")
    db.request_handoff("s", "discord")
    stores = [other_store(hermes_state, db) for _ in range(3)]
    barrier = threading.Barrier(len(stores))
    results: list = []

    def claim(store) -> None:
        barrier.wait()
        results.append(store.claim_handoff("s"))

    threads = [threading.Thread(target=claim, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert sorted(results) == [False, False, True]
