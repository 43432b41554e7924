"""Hermes v23 lineage, resume, compression locks, failure cooldowns and fallback streaks
(SESSIONDB_V23_API.md §0 forward edge, §1.C, §3), through the swapped ``hermes_state``.

Time is moved by patching ``hermes_state.time`` (as Hermes' own tests do); the lock
race runs real processes against one SQLite file or one PostgreSQL database.
"""

from __future__ import annotations

import inspect
import multiprocessing
import threading
from typing import Any

import pytest
from sqlalchemy import text, update

from hermes_store.models import Base

pytestmark = pytest.mark.both_backends

SESSIONS = Base.metadata.tables["sessions"]
MESSAGES = Base.metadata.tables["messages"]
LOCKS = Base.metadata.tables["compression_locks"]

T0 = 1_700_000_000.0


class Clock:
    """Stands in for the ``time`` module inside hermes_state: ``time()`` is ours to set."""

    def __init__(self, real: Any, now: float) -> None:
        self._real = real
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:  # monotonic, sleep... stay real
        return getattr(self._real, name)


@pytest.fixture
def clock(hermes_state, monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock(hermes_state.time, T0)
    monkeypatch.setattr(hermes_state, "time", c)
    return c


def make(db, clock: Clock, sid: str, at: float, *, parent: str | None = None, source: str = "cli",
         ended: tuple[float, str] | None = None, config: dict | None = None, messages: list[float] = ()) -> str:
    """A session started at T0+at (optionally ended at T0+ended[0] with reason ended[1]),
    with a user message at each of the given offsets."""
    clock.now = T0 + at
    kwargs: dict[str, Any] = {}
    if parent is not None:
        kwargs["parent_session_id"] = parent
    if config is not None:
        kwargs["model_config"] = config
    db.create_session(sid, source, **kwargs)
    for when in messages:
        clock.now = T0 + when
        db.append_message(sid, "user", f"{sid} at {when}")
    if ended is not None:
        clock.now = T0 + ended[0]
        db.end_session(sid, ended[1])
    return sid


def set_parent(db, sid: str, parent: str | None) -> None:
    """Re-point a parent link (how a corrupt cycle gets into a file)."""
    db._write(lambda c: c.execute(update(SESSIONS).where(SESSIONS.c.id == sid).values(parent_session_id=parent)))


def chain(db, clock: Clock, n: int, prefix: str = "c") -> list[str]:
    """n sessions, each compressed into the next (the last one live)."""
    ids = [f"{prefix}{i:04d}" for i in range(n)]
    for i, sid in enumerate(ids):
        make(db, clock, sid, 10.0 * i, parent=ids[i - 1] if i else None,
             ended=(10.0 * i + 5, "compression") if i < n - 1 else None)
    return ids


# ===================================================================== signatures (§1.C, §3)

SIGNATURES = {
    "get_compression_tip": [("session_id", None)],
    "resolve_resume_session_id": [("session_id", None)],
    "get_conversation_root": [("session_id", None)],
    "get_compression_lineage": [("session_id", None)],
    "record_compression_failure_cooldown": [("session_id", None), ("cooldown_until", None), ("error", "None")],
    "get_compression_failure_cooldown": [("session_id", None)],
    "clear_compression_failure_cooldown": [("session_id", None)],
    "get_compression_fallback_streak": [("session_id", None)],
    "set_compression_fallback_streak": [("session_id", None), ("streak", None)],
    "try_acquire_compression_lock": [("session_id", None), ("holder", None), ("ttl_seconds", "300.0")],
    "refresh_compression_lock": [("session_id", None), ("holder", None), ("ttl_seconds", "300.0")],
    "release_compression_lock": [("session_id", None), ("holder", None)],
    "get_compression_lock_holder": [("session_id", None)],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_are_hermes_v23(hermes_state, name: str) -> None:
    params = list(inspect.signature(getattr(hermes_state.SessionDB, name)).parameters.values())
    assert params[0].name == "self"
    got = [(p.name, None if p.default is inspect.Parameter.empty else repr(p.default)) for p in params[1:]]
    assert got == SIGNATURES[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


def test_compressor_probe_finds_real_class_attributes(hermes_state, db) -> None:
    """agent/conversation_compression.py: ``type(lock_db) is SessionDB`` and getattr_static."""
    assert type(db) is hermes_state.SessionDB
    missing = object()
    for name in ("try_acquire_compression_lock", "refresh_compression_lock", "release_compression_lock",
                 "get_compression_lock_holder"):
        found = inspect.getattr_static(hermes_state.SessionDB, name, missing)
        assert found is not missing and inspect.isfunction(found), name


# ===================================================================== get_compression_tip


def test_tip_has_no_timestamp_condition(db, clock) -> None:
    """v11 required child.started_at >= parent.ended_at; v23 does not."""
    make(db, clock, "p", 0, ended=(100, "compression"))
    make(db, clock, "early", 50, parent="p")  # started before its parent ended
    assert db.get_compression_tip("p") == "early"


def test_tip_follows_the_chain_from_any_step(db, clock) -> None:
    ids = chain(db, clock, 5)
    assert db.get_compression_tip(ids[0]) == ids[-1]
    assert db.get_compression_tip(ids[2]) == ids[-1]
    assert db.get_compression_tip(ids[-1]) == ids[-1]


@pytest.mark.parametrize("child", [
    dict(config={"_branched_from": "p"}),
    dict(config={"_delegate_from": "p"}),
    dict(source="tool"),
])
def test_tip_skips_branch_delegate_and_tool_children(db, clock, child: dict) -> None:
    make(db, clock, "p", 0, ended=(10, "compression"))
    make(db, clock, "kid", 20, parent="p", **child)
    assert db.get_compression_tip("p") == "p"
    make(db, clock, "cont", 5, parent="p")  # an older, plain continuation still counts
    assert db.get_compression_tip("p") == "cont"


def test_tip_marker_with_json_null_or_malformed_config_is_no_marker(db, clock) -> None:
    make(db, clock, "p", 0, ended=(10, "compression"))
    make(db, clock, "kid", 20, parent="p", config={"_branched_from": None, "x": 1})
    assert db.get_compression_tip("p") == "kid"
    db._write(lambda c: c.execute(update(SESSIONS).where(SESSIONS.c.id == "kid")
                                  .values(model_config='{"_delegate_from": "p"')))  # truncated JSON
    assert db.get_compression_tip("p") == "kid"


def test_tip_needs_a_compression_end_on_the_parent(db, clock) -> None:
    make(db, clock, "live", 0)
    make(db, clock, "c1", 10, parent="live")
    assert db.get_compression_tip("live") == "live"
    make(db, clock, "br", 20, ended=(30, "branched"))
    make(db, clock, "c2", 40, parent="br")
    assert db.get_compression_tip("br") == "br"


def test_tip_child_preference_compressed_then_live_then_others(db, clock) -> None:
    make(db, clock, "p", 0, ended=(10, "compression"))
    make(db, clock, "other", 40, parent="p", ended=(90, "user_exit"), messages=[80])
    make(db, clock, "live", 30, parent="p", messages=[70])
    make(db, clock, "comp", 20, parent="p", ended=(25, "compression"))  # oldest, least active
    assert db.get_compression_tip("p") == "comp"
    db.delete_session("comp")
    assert db.get_compression_tip("p") == "live"
    db.delete_session("live")
    assert db.get_compression_tip("p") == "other"


def test_tip_ties_by_latest_activity_then_start_then_id(db, clock) -> None:
    make(db, clock, "p", 0, ended=(10, "compression"))
    make(db, clock, "a", 20, parent="p", messages=[90])  # started first, newest message
    make(db, clock, "b", 30, parent="p", messages=[50])
    assert db.get_compression_tip("p") == "a"
    # No messages: activity is the start time, so a later start beats an older message.
    make(db, clock, "c", 95, parent="p")
    assert db.get_compression_tip("p") == "c"


def test_tip_equal_activity_falls_back_to_start_then_id(db, clock) -> None:
    make(db, clock, "p", 0, ended=(10, "compression"))
    make(db, clock, "x", 20, parent="p", messages=[60])
    make(db, clock, "y", 30, parent="p", messages=[60])  # same newest message time, later start
    assert db.get_compression_tip("p") == "y"
    make(db, clock, "q", 100, ended=(110, "compression"))
    make(db, clock, "m", 120, parent="q")
    make(db, clock, "n", 120, parent="q")  # same start, no messages
    assert db.get_compression_tip("q") == "n"  # id DESC


def test_tip_of_unknown_or_falsy_ids(db) -> None:
    assert db.get_compression_tip("nope") == "nope"
    assert db.get_compression_tip("") == ""
    assert db.get_compression_tip(None) is None


def test_tip_stops_in_a_cycle(db, clock) -> None:
    for sid in ("x", "y", "z"):
        make(db, clock, sid, 0, ended=(1, "compression"))
    set_parent(db, "y", "x")
    set_parent(db, "z", "y")
    set_parent(db, "x", "z")
    assert db.get_compression_tip("x") == "z"  # x → y → z, then x again: stop
    assert db.get_compression_tip("y") == "x"


def test_tip_of_a_chain_deeper_than_hermes_bound(db, clock) -> None:
    """Hermes stops after 100 hops; we follow the chain to its real end (deliberate)."""
    ids = chain(db, clock, 150)
    assert db.get_compression_tip(ids[0]) == ids[-1]


# ===================================================================== resolve_resume_session_id


def test_resume_falsy_and_unknown(db) -> None:
    assert db.resolve_resume_session_id("") == ""
    assert db.resolve_resume_session_id(None) is None
    assert db.resolve_resume_session_id("ghost") == "ghost"


def test_resume_jumps_to_the_tip_even_without_messages(db, clock) -> None:
    """v11 returned the input as soon as it had messages; v23 goes to the tip first."""
    make(db, clock, "root", 0, ended=(10, "compression"), messages=[5])
    make(db, clock, "mid", 10, parent="root", ended=(20, "compression"), messages=[15])
    make(db, clock, "tip", 20, parent="mid")
    assert db.resolve_resume_session_id("root") == "tip"
    db.append_message("tip", "user", "hello")
    assert db.resolve_resume_session_id("mid") == "tip"


def test_resume_walks_below_the_tip_to_the_deepest_session_with_messages(db, clock) -> None:
    make(db, clock, "root", 0, ended=(10, "compression"))
    make(db, clock, "tip", 10, parent="root", ended=(20, "user_exit"), messages=[12])
    make(db, clock, "d1", 30, parent="tip", messages=[31])
    make(db, clock, "d2", 40, parent="d1")
    assert db.resolve_resume_session_id("root") == "d1"  # d2 has nothing yet
    clock.now = T0 + 45
    db.append_message("d2", "user", "later")
    assert db.resolve_resume_session_id("root") == "d2"
    assert db.resolve_resume_session_id("tip") == "d2"


def test_resume_follows_the_most_recently_started_child(db, clock) -> None:
    make(db, clock, "tip", 0, ended=(10, "user_exit"))
    make(db, clock, "older", 20, parent="tip", messages=[21])
    make(db, clock, "newer", 30, parent="tip")
    # newer is on the path but empty; older has messages but is off the path.
    assert db.resolve_resume_session_id("tip") == "tip"
    clock.now = T0 + 31
    db.append_message("tip", "user", "own message")
    assert db.resolve_resume_session_id("tip") == "tip"
    db.append_message("newer", "user", "n")
    assert db.resolve_resume_session_id("tip") == "newer"


@pytest.mark.parametrize("child", [
    dict(config={"_branched_from": "tip"}),
    dict(config={"_delegate_from": "tip"}),
    dict(source="tool"),
])
def test_resume_walk_skips_branch_delegate_and_tool_children(db, clock, child: dict) -> None:
    make(db, clock, "tip", 0, messages=[1])
    make(db, clock, "kid", 10, parent="tip", messages=[11], **child)
    assert db.resolve_resume_session_id("tip") == "tip"


def test_resume_counts_inactive_message_rows(db, clock) -> None:
    make(db, clock, "tip", 0)
    make(db, clock, "kid", 10, parent="tip", messages=[11])
    db._write(lambda c: c.execute(update(MESSAGES).where(MESSAGES.c.session_id == "kid").values(active=0)))
    assert db.resolve_resume_session_id("tip") == "kid"


def test_resume_walk_is_bounded_to_32_hops(db, clock) -> None:
    make(db, clock, "tip", 0)
    below = [f"d{i:02d}" for i in range(1, 34)]
    for i, sid in enumerate(below):
        make(db, clock, sid, 10.0 + i, parent=below[i - 1] if i else "tip")
    db.append_message(below[-1], "user", "33 hops down")  # out of reach
    assert db.resolve_resume_session_id("tip") == "tip"
    db.append_message(below[31], "user", "32 hops down")
    assert db.resolve_resume_session_id("tip") == below[31]


def test_resume_walk_stops_in_a_cycle(db, clock) -> None:
    make(db, clock, "p", 0)
    make(db, clock, "q", 10, parent="p", messages=[11])
    set_parent(db, "p", "q")
    assert db.resolve_resume_session_id("p") == "q"


def test_resume_falls_back_to_the_tip_when_the_walk_fails(db, clock, monkeypatch) -> None:
    import sqlite3

    from hermes_store.repositories.lineage import LineageRepository

    make(db, clock, "root", 0, ended=(10, "compression"))
    make(db, clock, "tip", 10, parent="root")
    make(db, clock, "below", 20, parent="tip", messages=[21])
    assert db.resolve_resume_session_id("root") == "below"

    def broken(self, session_id):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(LineageRepository, "resume_target", broken)
    assert db.resolve_resume_session_id("root") == "tip"


# ===================================================================== get_conversation_root


def test_conversation_root_follows_every_parent_link(db, clock) -> None:
    make(db, clock, "root", 0, ended=(5, "branched"))
    make(db, clock, "branch", 10, parent="root", config={"_branched_from": "root"}, ended=(20, "compression"))
    make(db, clock, "cont", 20, parent="branch")
    make(db, clock, "helper", 30, parent="cont", config={"_delegate_from": "cont"})
    assert db.get_conversation_root("helper") == "root"
    assert db.get_conversation_root("cont") == "root"
    assert db.get_conversation_root("root") == "root"


def test_conversation_root_as_is_for_unknown_parentless_and_empty(db, clock) -> None:
    make(db, clock, "alone", 0)
    assert db.get_conversation_root("alone") == "alone"
    assert db.get_conversation_root("ghost") == "ghost"
    assert db.get_conversation_root("") == ""
    assert db.get_conversation_root(None) is None


def test_conversation_root_in_a_cycle_and_a_deep_chain(db, clock) -> None:
    for sid in ("x", "y", "z"):
        make(db, clock, sid, 0)
    set_parent(db, "x", "z")
    set_parent(db, "z", "y")
    set_parent(db, "y", "x")
    assert db.get_conversation_root("x") == "y"  # x → z → y, then x again: y is the farthest
    ids = chain(db, clock, 150, prefix="d")
    assert db.get_conversation_root(ids[-1]) == ids[0]  # past Hermes' 100 hops (deliberate)


# ===================================================================== get_compression_lineage


def test_compression_lineage_root_first_through_the_whole_chain(db, clock) -> None:
    ids = chain(db, clock, 4)
    for sid in ids:
        assert db.get_compression_lineage(sid) == ids


def test_compression_lineage_unknown_empty_and_branch_child(db, clock) -> None:
    assert db.get_compression_lineage("ghost") == []
    assert db.get_compression_lineage("") == []
    make(db, clock, "p", 0, ended=(10, "compression"))
    make(db, clock, "b", 20, parent="p", config={"_branched_from": "p"}, ended=(30, "compression"))
    make(db, clock, "bc", 40, parent="b")
    assert db.get_compression_lineage("b") == ["b"]
    assert db.get_compression_lineage("bc") == ["b", "bc"]  # the climb stops at the branch child


def test_compression_lineage_takes_the_earliest_child_that_is_not_a_fork(db, clock) -> None:
    """v26: a delegate (or branch) of its own parent is a fork; an earlier one no longer
    takes the chain over. A marker naming another session is no fork."""
    make(db, clock, "root", 0, ended=(100, "compression"))
    make(db, clock, "branch", 10, parent="root", config={"_branched_from": "root"})
    make(db, clock, "deleg", 20, parent="root", config={"_delegate_from": "root"})
    make(db, clock, "later", 30, parent="root")
    make(db, clock, "latest", 40, parent="root")
    assert db.get_compression_lineage("deleg") == ["deleg"]
    assert db.get_compression_lineage("root") == ["root", "later"]
    assert db.get_compression_lineage("later") == ["root", "later"]
    assert db.get_compression_lineage("latest") == ["latest"]  # not on the root's path
    make(db, clock, "r2", 50, ended=(100, "compression"))
    make(db, clock, "foreign", 60, parent="r2", config={"_delegate_from": "elsewhere"})
    make(db, clock, "after", 70, parent="r2")
    assert db.get_compression_lineage("after") == ["after"]
    assert db.get_compression_lineage("r2") == ["r2", "foreign"]


def test_compression_lineage_skips_tool_children_and_stops_at_live_parents(db, clock) -> None:
    make(db, clock, "root", 0, ended=(10, "compression"))
    make(db, clock, "t", 20, parent="root", source="tool")
    assert db.get_compression_lineage("t") == ["t"]  # v26: a tool run is a fork
    assert db.get_compression_lineage("root") == ["root"]
    make(db, clock, "live", 30)
    make(db, clock, "kid", 40, parent="live", ended=(50, "compression"))
    make(db, clock, "next", 60, parent="kid")
    assert db.get_compression_lineage("next") == ["kid", "next"]


def test_compression_lineage_in_a_cycle(db, clock) -> None:
    for sid in ("x", "y", "z"):
        make(db, clock, sid, {"x": 0, "y": 1, "z": 2}[sid], ended=(5, "compression"))
    set_parent(db, "y", "x")
    set_parent(db, "z", "y")
    set_parent(db, "x", "z")
    got = db.get_compression_lineage("y")
    assert sorted(got) == ["x", "y", "z"] and len(got) == 3


# ===================================================================== failure cooldown


def test_cooldown_round_trip_and_expiry(db, clock) -> None:
    make(db, clock, "s", 0)
    clock.now = T0 + 100
    assert db.record_compression_failure_cooldown("s", T0 + 160, "provider 529") is None
    assert db.get_compression_failure_cooldown("s") == {
        "cooldown_until": T0 + 160, "remaining_seconds": 60.0, "error": "provider 529",
    }
    clock.now = T0 + 159.5
    assert db.get_compression_failure_cooldown("s")["remaining_seconds"] == pytest.approx(0.5)
    clock.now = T0 + 160  # cooldown_until > now is required
    assert db.get_compression_failure_cooldown("s") is None
    row = db.get_session("s")
    assert row["compression_failure_cooldown_until"] == T0 + 160  # kept, just not running


def test_cooldown_default_error_and_clear(db, clock) -> None:
    make(db, clock, "s", 0)
    db.record_compression_failure_cooldown("s", T0 + 50)
    assert db.get_compression_failure_cooldown("s")["error"] is None
    db.record_compression_failure_cooldown("s", T0 + 70, "again")
    assert db.get_compression_failure_cooldown("s")["error"] == "again"
    assert db.clear_compression_failure_cooldown("s") is None
    assert db.get_compression_failure_cooldown("s") is None
    row = db.get_session("s")
    assert row["compression_failure_cooldown_until"] is None and row["compression_failure_error"] is None


def test_cooldown_falsy_unknown_and_bad_input(db, clock) -> None:
    from hermes_store.errors import InvalidInputError

    make(db, clock, "s", 0)
    for falsy in ("", None):
        db.record_compression_failure_cooldown(falsy, T0 + 50, "x")
        db.clear_compression_failure_cooldown(falsy)
        assert db.get_compression_failure_cooldown(falsy) is None
    db.record_compression_failure_cooldown("ghost", T0 + 50, "x")
    assert db.get_compression_failure_cooldown("ghost") is None
    assert db.get_compression_failure_cooldown("s") is None  # NULL
    with pytest.raises(InvalidInputError):
        db.record_compression_failure_cooldown("s", "soon", "x")
    assert db.get_session("s")["compression_failure_error"] is None
    db.record_compression_failure_cooldown("s", T0 + 50, "bad \ud800 text")  # kept, surrogate replaced
    assert db.get_compression_failure_cooldown("s")["error"] == "bad \ufffd text"


def test_cooldown_writes_swallow_database_errors(db, clock) -> None:
    make(db, clock, "s", 0)
    db._write(lambda c: c.execute(text("ALTER TABLE sessions DROP COLUMN compression_failure_error")))
    db.record_compression_failure_cooldown("s", T0 + 50, "x")  # logged, not raised
    db.clear_compression_failure_cooldown("s")


# ===================================================================== fallback streak


def test_fallback_streak_round_trip(db, clock) -> None:
    make(db, clock, "s", 0)
    assert db.get_compression_fallback_streak("s") == 0
    assert db.set_compression_fallback_streak("s", 3) is None
    assert db.get_compression_fallback_streak("s") == 3
    db.set_compression_fallback_streak("s", -4)
    assert db.get_compression_fallback_streak("s") == 0
    db.set_compression_fallback_streak("s", 2.9)
    assert db.get_compression_fallback_streak("s") == 2
    db.set_compression_fallback_streak("s", "7")
    assert db.get_compression_fallback_streak("s") == 7
    assert db.get_session("s")["compression_fallback_streak"] == 7


def test_fallback_streak_falsy_unknown_bad_and_closed(hermes_state, db, clock) -> None:
    make(db, clock, "s", 0)
    db.set_compression_fallback_streak("s", 5)
    with pytest.raises(ValueError):
        db.set_compression_fallback_streak("s", "many")
    with pytest.raises(TypeError):
        db.set_compression_fallback_streak("s", None)
    assert db.get_compression_fallback_streak("s") == 5  # nothing written
    db.set_compression_fallback_streak("", 9)
    db.set_compression_fallback_streak(None, 9)
    db.set_compression_fallback_streak("ghost", 9)
    assert db.get_compression_fallback_streak("") == 0
    assert db.get_compression_fallback_streak(None) == 0
    assert db.get_compression_fallback_streak("ghost") == 0
    db.close()
    assert db.get_compression_fallback_streak("s") == 0


@pytest.mark.sqlite_only
def test_fallback_streak_junk_value_reads_as_zero(db, clock) -> None:
    """SQLite lets a hand-written row hold text in the INTEGER column."""
    import sqlite3

    make(db, clock, "s", 0)
    raw = sqlite3.connect(db.db_path)
    raw.execute("UPDATE sessions SET compression_fallback_streak = 'lots' WHERE id = 's'")
    raw.commit()
    raw.close()
    assert db.get_compression_fallback_streak("s") == 0


# ===================================================================== compression lock (one process)


def lock_row(db, sid: str):
    return db._read(lambda c: c.execute(LOCKS.select().where(LOCKS.c.session_id == sid)).first())


def test_lock_acquire_is_exclusive_and_reentrant_without_extending(db, clock) -> None:
    assert db.try_acquire_compression_lock("s", "A", 300.0) is True
    assert lock_row(db, "s")._mapping == {"session_id": "s", "holder": "A", "acquired_at": T0, "expires_at": T0 + 300}
    clock.now = T0 + 100
    assert db.try_acquire_compression_lock("s", "B") is False
    assert db.try_acquire_compression_lock("s", "A") is True  # re-entrant
    assert lock_row(db, "s").expires_at == T0 + 300  # not extended
    assert db.get_compression_lock_holder("s") == "A"
    assert db.try_acquire_compression_lock("other", "B") is True  # locks are per session


def test_lock_expiry_boundary_and_takeover(db, clock) -> None:
    assert db.try_acquire_compression_lock("s", "A", 10)
    clock.now = T0 + 10  # expires_at == now: still held
    assert db.get_compression_lock_holder("s") == "A"
    assert db.try_acquire_compression_lock("s", "B", 10) is False
    clock.now = T0 + 10.5
    assert db.get_compression_lock_holder("s") is None
    assert db.try_acquire_compression_lock("s", "B", 10) is True
    assert lock_row(db, "s").acquired_at == T0 + 10.5
    assert db.get_compression_lock_holder("s") == "B"


def test_lock_refresh_only_by_the_holder_even_after_expiry(db, clock) -> None:
    assert db.try_acquire_compression_lock("s", "A", 10)
    clock.now = T0 + 5
    assert db.refresh_compression_lock("s", "B", 100) is False
    assert db.refresh_compression_lock("s", "A", 100) is True
    assert lock_row(db, "s").expires_at == T0 + 105
    clock.now = T0 + 50
    assert db.get_compression_lock_holder("s") == "A"
    clock.now = T0 + 106
    assert db.get_compression_lock_holder("s") is None
    assert db.refresh_compression_lock("s", "A", 100) is True  # v26: expired, still A's row: revived
    assert lock_row(db, "s").expires_at == T0 + 206
    assert db.get_compression_lock_holder("s") == "A"
    clock.now = T0 + 300
    assert db.try_acquire_compression_lock("s", "B", 10) is True  # taken over once expired...
    assert db.refresh_compression_lock("s", "A", 100) is False  # ...then A cannot revive it
    assert db.get_compression_lock_holder("s") == "B"
    assert db.refresh_compression_lock("ghost", "A") is False
    assert db.refresh_compression_lock("", "A") is False
    assert db.refresh_compression_lock("s", "") is False
    assert db.refresh_compression_lock(None, None) is False


def test_lock_release_only_by_the_holder_and_idempotent(db, clock) -> None:
    assert db.try_acquire_compression_lock("s", "A")
    assert db.release_compression_lock("s", "B") is None
    assert db.get_compression_lock_holder("s") == "A"
    db.release_compression_lock("s", "A")
    assert db.get_compression_lock_holder("s") is None
    assert lock_row(db, "s") is None
    db.release_compression_lock("s", "A")
    db.release_compression_lock("", "A")
    db.release_compression_lock("s", None)
    assert db.try_acquire_compression_lock("s", "B") is True


def test_lock_falsy_ids_and_holder_reads(db, clock) -> None:
    assert db.try_acquire_compression_lock("", "A") is False
    assert db.try_acquire_compression_lock(None, "A") is False
    assert db.get_compression_lock_holder("") is None
    assert db.get_compression_lock_holder(None) is None
    assert db.get_compression_lock_holder("free") is None
    assert lock_row(db, "free") is None  # reading takes nothing
    assert db.try_acquire_compression_lock("s", None) is False  # NOT NULL holder: a database error


def test_lock_database_errors_give_false(db, clock) -> None:
    db._write(lambda c: c.execute(text("DROP TABLE compression_locks")))
    assert db.try_acquire_compression_lock("s", "A") is False
    assert db.refresh_compression_lock("s", "A") is False
    assert db.release_compression_lock("s", "A") is None


def test_lock_bad_ttl_is_a_typed_error(db) -> None:
    from hermes_store.errors import InvalidInputError

    with pytest.raises(InvalidInputError):
        db.try_acquire_compression_lock("s", "A", "300")
    with pytest.raises(InvalidInputError):
        db.refresh_compression_lock("s", "A", float("nan"))
    assert db.get_compression_lock_holder("s") is None


def test_lock_threads_race_on_one_instance(db) -> None:
    n = 8
    start = threading.Barrier(n)
    results: dict[str, bool] = {}

    def run(i: int) -> None:
        start.wait()
        results[f"t{i}"] = db.try_acquire_compression_lock("s", f"t{i}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [h for h, ok in results.items() if ok]
    assert len(results) == n and len(winners) == 1
    assert db.get_compression_lock_holder("s") == winners[0]


# ===================================================================== compression lock (processes)


#: The rounds every racing process plays: (action, clock skew in seconds).
ROUNDS = [
    ("acquire", 0.0),  # all race for a fresh lease
    ("acquire", 301.0),  # 301 s later the 300 s lease has expired: the others race again
    ("refresh", 302.0),  # everyone tries to extend it under their own name
]


def _lock_worker(target: str, holder: str, barriers: list, out: Any) -> None:
    """One process: open the store once, then play each round in step with the others.

    A round starts when every process reached its barrier, so the previous round is
    finished everywhere; then each process reports what it got and who holds the lease.
    """
    import time as real_time

    import hermes_store.facade as facade

    class Skewed:
        skew = 0.0

        def time(self) -> float:
            return real_time.time() + self.skew

        def __getattr__(self, name: str) -> Any:
            return getattr(real_time, name)

    clock = Skewed()
    facade.time = clock  # type: ignore[assignment]
    db = facade.SessionDB(target)
    won_first = False
    try:
        for i, (action, skew) in enumerate(ROUNDS):
            clock.skew = skew
            barriers[2 * i].wait(timeout=300)
            result: Any = None
            try:
                if action == "acquire" and not (i == 1 and won_first):  # the first winner sits out
                    result = db.try_acquire_compression_lock("shared", holder, 300.0)
                    won_first = won_first or (i == 0 and result is True)
                elif action == "refresh":
                    result = db.refresh_compression_lock("shared", holder, 300.0)
            except Exception as exc:  # reported, so the parent fails with the reason
                result = f"error: {exc!r}"
            barriers[2 * i + 1].wait(timeout=300)
            out.put((i, holder, result, db.get_compression_lock_holder("shared")))
    finally:
        db.close()


@pytest.fixture
def target(db, backend: str) -> str:
    """Where the processes meet: the SQLite file or the PostgreSQL URL of ``db``."""
    if backend == "sqlite":
        return str(db.db_path)
    return db.url.render_as_string(hide_password=False)


def test_lock_processes_race_exactly_one_wins_then_expiry_and_refresh(db, target: str) -> None:
    holders = [f"p{i}" for i in range(5)]
    ctx = multiprocessing.get_context("spawn")
    barriers = [ctx.Barrier(len(holders)) for _ in range(2 * len(ROUNDS))]
    out = ctx.Queue()
    procs = [ctx.Process(target=_lock_worker, args=(target, h, barriers, out)) for h in holders]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=600) for _ in range(len(holders) * len(ROUNDS))]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * len(holders)
    rounds: list[dict[str, Any]] = [{} for _ in ROUNDS]
    seen: list[set] = [set() for _ in ROUNDS]
    for i, holder, result, current in reports:
        rounds[i][holder] = result
        seen[i].add(current)

    first = [h for h, ok in rounds[0].items() if ok is True]
    assert len(first) == 1 and all(isinstance(v, bool) for v in rounds[0].values()), rounds[0]
    assert seen[0] == {first[0]}  # every process sees the one winner

    second = {h: ok for h, ok in rounds[1].items() if h != first[0]}
    assert all(isinstance(v, bool) for v in second.values()), rounds[1]
    taker = [h for h, ok in second.items() if ok]
    assert len(taker) == 1, rounds[1]  # the expired lease went to exactly one other process
    assert seen[1] == {taker[0]}

    assert rounds[2] == {h: h == taker[0] for h in holders}  # only the holder refreshes
    assert seen[2] == {taker[0]}
    row = lock_row(db, "shared")
    assert row.holder == taker[0] and row.expires_at > row.acquired_at + 300.0  # moved by the refresh
