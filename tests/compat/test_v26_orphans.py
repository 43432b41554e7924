"""Hermes v25-v26 gateway repair: hygiene streaks, never-active keyed sessions, orphaned
gateway sessions and their adoption; through the swapped ``hermes_state`` module, on
both backends."""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from hermes_store import errors

pytestmark = pytest.mark.both_backends

DAY = 86_400.0
E = inspect.Parameter.empty


def keyed(db, sid: str, key: str, *, source: str = "telegram", user: str | None = "u1", started: float,
          messages: int = 0, last: float | None = None) -> str:
    db.create_session(sid, source)
    db.update_session(sid, started_at=started)
    db.record_gateway_session_peer(sid, source=source, session_key=key, user_id=user, chat_id="c1", chat_type="dm")
    stamp(db, sid, messages, last if last is not None else started)
    return sid


def unkeyed(db, sid: str, *, source: str = "telegram", user: str | None = "u1", started: float,
            messages: int = 1, last: float | None = None, **kwargs) -> str:
    db.create_session(sid, source, user_id=user, **kwargs)
    db.update_session(sid, started_at=started)
    stamp(db, sid, messages, last if last is not None else started + 60)
    return sid


def stamp(db, sid: str, messages: int, at: float) -> None:
    for i in range(messages):
        db.append_message(sid, "user", f"m{i}")
    if messages:
        db._write(lambda c: c.execute(text("UPDATE messages SET timestamp = :t WHERE session_id = :s"),
                                      {"t": at, "s": sid}))


def test_signatures(hermes_state) -> None:
    S = hermes_state.SessionDB

    def params(name: str) -> list:
        return [(p.name, p.kind.name, p.default) for p in inspect.signature(getattr(S, name)).parameters.values()]

    pk, kw = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    assert params("increment_hygiene_failure_streak") == [("self", pk, E), ("session_key", pk, E)]
    assert params("reset_hygiene_failure_streak") == [("self", pk, E), ("session_key", pk, E)]
    assert params("list_never_active_keyed_sessions") == [("self", pk, E), ("older_than_days", kw, E)]
    assert params("prune_never_active_keyed_sessions") == [("self", pk, E), ("older_than_days", kw, E),
                                                           ("sessions_dir", kw, None)]
    assert params("find_orphaned_gateway_sessions") == [("self", pk, E), ("max_gap_s", kw, None)]
    assert params("adopt_orphaned_gateway_session") == [("self", pk, E), ("orphan_id", pk, E), ("donor_id", pk, E)]


# ---------------------------------------------------------------------------- hygiene streaks


def test_hygiene_streak_counts_up_per_key_and_resets(db) -> None:
    assert [db.increment_hygiene_failure_streak("k1") for _ in range(3)] == [1, 2, 3]
    assert db.increment_hygiene_failure_streak("k2") == 1
    db.reset_hygiene_failure_streak("k1")
    assert db.increment_hygiene_failure_streak("k1") == 1
    assert db.increment_hygiene_failure_streak("k2") == 2
    assert db.increment_hygiene_failure_streak("") == 1 and db.increment_hygiene_failure_streak(None) == 1
    db.reset_hygiene_failure_streak("")  # no-op
    rows = db._read(lambda c: c.execute(text("SELECT session_key, failure_streak FROM gateway_hygiene_state "
                                             "ORDER BY session_key")).all())
    assert [tuple(r) for r in rows] == [("k1", 1), ("k2", 2)]


# ---------------------------------------------------------------------------- never-active keyed sessions


def test_never_active_lists_only_untouched_keyed_sessions(db) -> None:
    old = time.time() - 10 * DAY
    keyed(db, "idle", "k-idle", started=old)
    keyed(db, "young", "k-young", started=time.time() - 3600)
    keyed(db, "talked", "k-talked", started=old, messages=1)
    keyed(db, "titled", "k-titled", started=old)
    db.set_session_title("titled", "Named")
    keyed(db, "pinned", "k-pinned", started=old)
    db.set_session_pinned("pinned", True)
    keyed(db, "ended", "k-ended", started=old)
    db.end_session("ended", "idle")
    keyed(db, "active", "k-active", started=old)
    db.update_session("active", last_activity_at=old + 5)
    keyed(db, "tokens", "k-tokens", started=old)
    db.update_session("tokens", input_tokens=10)
    unkeyed(db, "plain", started=old, messages=0)
    rows = db.list_never_active_keyed_sessions(older_than_days=1)
    assert rows == [{"id": "idle", "session_key": "k-idle", "source": "telegram", "chat_id": "c1",
                     "chat_type": "dm", "user_id": "u1", "started_at": old}]
    assert [r["id"] for r in db.list_never_active_keyed_sessions(older_than_days=0)] == ["idle", "young"]


def test_never_active_prune_deletes_them_with_their_own_routing(db, tmp_path: Path) -> None:
    old = time.time() - 10 * DAY
    keyed(db, "idle", "k-idle", started=old)
    keyed(db, "shared", "k-shared", started=old)
    keyed(db, "talked", "k-talked", started=old, messages=1)
    db.save_gateway_routing_entry("k-idle", json.dumps({"session_id": "idle"}))
    db.save_gateway_routing_entry("k-idle", json.dumps({"session_id": "idle"}), scope="profile-b")
    db.save_gateway_routing_entry("k-idle-x", json.dumps({"session_id": "idlex"}))  # a near miss
    db.save_gateway_routing_entry("k-shared", json.dumps({"session_id": "shared"}))
    db.save_gateway_routing_entry("k-other", json.dumps({"session_id": "shared"}))  # another key routes to it
    db.save_gateway_routing_entry("k-talked", json.dumps({"session_id": "talked"}))
    db.save_gateway_routing_entry("k-bad", "not json")
    (tmp_path / "idle.jsonl").write_text("{}")
    assert db.prune_never_active_keyed_sessions(older_than_days=1, sessions_dir=tmp_path) == (1, 2)
    assert db.get_session("idle") is None and not (tmp_path / "idle.jsonl").exists()
    assert db.get_session("shared") is not None and db.get_session("talked") is not None
    assert db.load_gateway_routing_entries() == {
        "k-bad": "not json", "k-idle-x": json.dumps({"session_id": "idlex"}),
        "k-other": json.dumps({"session_id": "shared"}), "k-shared": json.dumps({"session_id": "shared"}),
        "k-talked": json.dumps({"session_id": "talked"}),
    }
    assert db.load_gateway_routing_entries(scope="profile-b") == {}
    assert db.prune_never_active_keyed_sessions(older_than_days=1) == (0, 0)


def test_never_active_rejects_a_non_number(db) -> None:
    with pytest.raises(errors.InvalidInputError):
        db.list_never_active_keyed_sessions(older_than_days="ten")
    with pytest.raises(errors.InvalidInputError):
        db.prune_never_active_keyed_sessions(older_than_days=None)


# ---------------------------------------------------------------------------- orphans


def test_contiguity_finds_the_one_donor_that_went_quiet_before(db) -> None:
    t = time.time() - DAY
    keyed(db, "donor", "K", started=t, messages=2, last=t + 100)
    unkeyed(db, "orphan", started=t + 400, last=t + 900)
    keyed(db, "too-early", "K2", started=t - 9000, messages=1, last=t - 8000)
    keyed(db, "other-source", "K3", source="discord", started=t, messages=1, last=t + 100)
    found = db.find_orphaned_gateway_sessions()
    assert found == [{
        "orphan_id": "orphan", "source": "telegram", "message_count": 1, "started_at": t + 400,
        "last_active": pytest.approx(t + 900), "donor_id": "donor", "session_key": "K",
        "evidence": "contiguity", "adoptable": True, "reason": None,
    }]
    assert db.find_orphaned_gateway_sessions(max_gap_s=100)[0]["adoptable"] is False


def test_lineage_donor_and_what_is_never_an_orphan(db) -> None:
    t = time.time() - DAY
    keyed(db, "parent", "KP", started=t - 50000, messages=1, last=t - 40000)
    unkeyed(db, "child", started=t, parent_session_id="parent")
    unkeyed(db, "tool-run", source="tool", started=t)
    unkeyed(db, "branch", started=t, parent_session_id="parent", model_config={"_branched_from": "parent"})
    unkeyed(db, "silent", started=t, messages=0)
    found = {r["orphan_id"]: r for r in db.find_orphaned_gateway_sessions()}
    assert set(found) == {"child"}
    assert (found["child"]["donor_id"], found["child"]["evidence"], found["child"]["adoptable"]) == (
        "parent", "lineage", True)


def test_users_must_agree_and_a_donor_is_claimed_once(db) -> None:
    t = time.time() - DAY
    keyed(db, "d-empty", "KE", user=None, started=t, messages=1, last=t + 10)
    unkeyed(db, "o-user", user="u1", started=t + 20, last=t + 500)
    found = {r["orphan_id"]: r for r in db.find_orphaned_gateway_sessions()}
    assert (found["o-user"]["donor_id"], found["o-user"]["adoptable"], found["o-user"]["reason"]) == (
        "d-empty", False, "user_unverified")
    assert db.adopt_orphaned_gateway_session("o-user", "d-empty") is False  # an empty user is not "the same"
    keyed(db, "d2", "K2", source="discord", user="u7", started=t, messages=1, last=t + 10)
    unkeyed(db, "o2a", source="discord", user="u7", started=t + 20, last=t + 500)
    unkeyed(db, "o2b", source="discord", user="u7", started=t + 30, last=t + 600)
    found = {r["orphan_id"]: r for r in db.find_orphaned_gateway_sessions()}
    assert [(found[o]["donor_id"], found[o]["adoptable"], found[o]["reason"]) for o in ("o2a", "o2b")] == [
        ("d2", False, "donor_claimed_twice")] * 2
    keyed(db, "d3", "K3", source="slack", user="u8", started=t, messages=1, last=t + 10)
    unkeyed(db, "o3", source="slack", user="u9", started=t + 20, last=t + 500)
    assert {r["orphan_id"]: r["reason"] for r in db.find_orphaned_gateway_sessions()}["o3"] == "no_donor"


def test_adopt_moves_the_key_fills_nulls_and_retires_the_donor(db) -> None:
    t = time.time() - DAY
    keyed(db, "donor", "K", started=t, messages=1, last=t + 10)
    db.record_gateway_session_peer("donor", source="telegram", session_key="K", user_id="u1", chat_id="c1",
                                   chat_type="dm", display_name="Ann")
    unkeyed(db, "orphan", started=t + 20, last=t + 500)
    assert db.adopt_orphaned_gateway_session("orphan", "donor") is True
    o, d = db.get_session("orphan"), db.get_session("donor")
    assert (o["session_key"], o["parent_session_id"], o["chat_id"], o["chat_type"], o["display_name"],
            o["user_id"]) == ("K", "donor", "c1", "dm", "Ann", "u1")
    assert d["end_reason"] == "superseded_by_repair" and d["ended_at"] is not None
    assert db.adopt_orphaned_gateway_session("orphan", "donor") is False  # the orphan is keyed now
    assert db.find_orphaned_gateway_sessions() == []


def test_adopt_rechecks_source_and_existence(db) -> None:
    t = time.time() - DAY
    keyed(db, "donor", "K", source="discord", started=t, messages=1)
    unkeyed(db, "orphan", started=t + 20)
    assert db.adopt_orphaned_gateway_session("orphan", "donor") is False
    assert db.adopt_orphaned_gateway_session("orphan", "ghost") is False
    assert db.adopt_orphaned_gateway_session("", "donor") is False
    assert db.get_session("donor")["ended_at"] is None and db.get_session("orphan")["session_key"] is None
