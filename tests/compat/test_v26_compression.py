"""Hermes v26 compression surface (SESSIONDB_V26_API.md §2.C), through the swapped
``hermes_state``: lease refresh after expiry, dead-holder reclaim, the live child, the
orphan reopen, one-transaction publication, cooldown snapshots, the anti-thrash count,
and the resume walk that never enters a reset child.

Races are shown with a second SessionDB on the same database (``other_store``) and the
settable ``clock``.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time as real_time
from typing import Any

import pytest
from sqlalchemy import update

from hermes_store.errors import InvalidInputError
from hermes_store.models import Base
from hermes_store.repositories.compression import CompressionRepository

from .helpers import other_store

pytestmark = pytest.mark.both_backends

SESSIONS = Base.metadata.tables["sessions"]
MESSAGES = Base.metadata.tables["messages"]
LOCKS = Base.metadata.tables["compression_locks"]
T0 = 1_700_000_000.0
ROUTING = ("user_id", "session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json")


def set_columns(db, sid: str, **values: Any) -> None:
    db._write(lambda c: c.execute(update(SESSIONS).where(SESSIONS.c.id == sid).values(**values)))


def lock_row(db, sid: str) -> Any:
    return db._read(lambda c: c.execute(LOCKS.select().where(LOCKS.c.session_id == sid)).first())


def rows_of(db, sid: str) -> list[dict[str, Any]]:
    return db._read(lambda c: [dict(r) for r in c.execute(
        MESSAGES.select().where(MESSAGES.c.session_id == sid).order_by(MESSAGES.c.id)).mappings()])


class FakePsutil:
    """``hermes_state.psutil`` as Hermes' tests replace it: ``pid_exists`` answers from a set."""

    def __init__(self, alive: set[int] = frozenset(), error: bool = False) -> None:
        self.alive = set(alive)
        self.error = error
        self.asked: list[int] = []

    def pid_exists(self, pid: int) -> bool:
        self.asked.append(pid)
        if self.error:
            raise RuntimeError("probe failed")
        return pid in self.alive


def exited_pid() -> int:
    """The id of a process that has certainly exited (waited for)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ===================================================================== signatures


def shape(fn: Any) -> list[tuple[str, str, str | None]]:
    """(name, kind, default) of each parameter after ``self``."""
    params = list(inspect.signature(fn).parameters.values())
    assert params[0].name == "self"
    return [(p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in params[1:]]


POS, KW = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
SIGNATURES = {
    "publish_compression_child": [
        ("parent_session_id", KW, None), ("child_session_id", KW, None), ("source", KW, None),
        ("messages", KW, None), ("model", KW, "None"), ("model_config", KW, "None"), ("system_prompt", KW, "None"),
        ("cwd", KW, "None"), ("profile_name", KW, "None"), ("compression_lock_holder", KW, "None"),
        ("require_compression_lease", KW, "True"), ("watermark", KW, "None"), ("watermark_ceiling", KW, "None"),
    ],
    "find_live_compression_child": [("parent_session_id", POS, None)],
    "reopen_orphaned_compression_session": [("session_id", POS, None)],
    "get_compression_failure_cooldown_row": [("session_id", POS, None)],
    "restore_compression_failure_cooldown_row": [("session_id", POS, None), ("snapshot", POS, None)],
    "get_compression_ineffective_count": [("session_id", POS, None)],
    "set_compression_ineffective_count": [("session_id", POS, None), ("count", POS, None)],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_are_hermes_v26(hermes_state, name: str) -> None:
    assert shape(getattr(hermes_state.SessionDB, name)) == SIGNATURES[name]


# ===================================================================== refresh after expiry (§2.C, §6.10)


def test_refresh_revives_an_expired_lease_only_while_it_is_still_the_holders(hermes_state, db, clock) -> None:
    other = other_store(hermes_state, db)
    try:
        assert db.try_acquire_compression_lock("s", "A", 10)
        clock.now = T0 + 60  # long expired, nobody took it
        assert other.get_compression_lock_holder("s") is None
        assert db.refresh_compression_lock("s", "A", 30) is True
        assert other.get_compression_lock_holder("s") == "A"
        assert other.try_acquire_compression_lock("s", "B", 30) is False  # revived: held again
        clock.now = T0 + 200
        assert other.try_acquire_compression_lock("s", "B", 30) is True  # expired again: B takes it
        assert db.refresh_compression_lock("s", "A", 30) is False  # A cannot take it back
        assert lock_row(db, "s").holder == "B"
        other.release_compression_lock("s", "B")
        assert db.refresh_compression_lock("s", "B", 30) is False  # released: nothing to extend
        assert lock_row(db, "s") is None
    finally:
        other.close()


# ===================================================================== dead holders


def test_a_provably_dead_pid_holder_is_reclaimed_on_a_file_ttl_only_on_a_server(
        hermes_state, db, clock, monkeypatch, backend) -> None:
    probe = FakePsutil(alive={4242})
    monkeypatch.setattr(hermes_state, "psutil", probe)
    assert db.try_acquire_compression_lock("dead", "host:pid=999999:tid=1", 300)
    assert db.try_acquire_compression_lock("alive", "pid=4242:tid=1", 300)
    other = other_store(hermes_state, db)
    try:
        won = other.try_acquire_compression_lock("dead", "pid=4242:tid=2", 300)
        assert other.try_acquire_compression_lock("alive", "pid=4242:tid=2", 300) is False
    finally:
        other.close()
    if backend == "sqlite":
        assert won is True and lock_row(db, "dead").holder == "pid=4242:tid=2"
        assert 999999 in probe.asked
    else:  # the holder may run on another host: a local probe proves nothing
        assert won is False and lock_row(db, "dead").holder == "host:pid=999999:tid=1"
        assert probe.asked == []
    assert lock_row(db, "alive").holder == "pid=4242:tid=1"


def test_own_pid_unstructured_holders_and_probe_errors_keep_the_ttl(hermes_state, db, clock, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "psutil", FakePsutil(alive=set()))  # every pid "dead"
    mine = f"pid={os.getpid()}:tid=7"
    assert db.try_acquire_compression_lock("own", mine)
    assert db.try_acquire_compression_lock("opaque", "worker-12345")
    assert db.try_acquire_compression_lock("ppid", "ppid=999999")
    for sid in ("own", "opaque", "ppid"):
        assert db.try_acquire_compression_lock(sid, "pid=1:other") is False, sid
    monkeypatch.setattr(hermes_state, "psutil", FakePsutil(error=True))
    assert db.try_acquire_compression_lock("err", "pid=999999")
    assert db.try_acquire_compression_lock("err", "pid=1:other") is False
    clock.now = T0 + 301  # the TTL still frees all of them
    assert db.try_acquire_compression_lock("own", "pid=1:other") is True


def test_without_psutil_the_posix_probe_decides(hermes_state, db, clock, monkeypatch, backend) -> None:
    monkeypatch.setattr(hermes_state, "psutil", None)
    gone = exited_pid()
    assert db.try_acquire_compression_lock("gone", f"pid={gone}")
    assert db.try_acquire_compression_lock("parent", f"pid={os.getppid()}")  # alive
    assert db.try_acquire_compression_lock("gone", "pid=1:x") is (backend == "sqlite")
    assert db.try_acquire_compression_lock("parent", "pid=1:x") is False


# ===================================================================== find_live_compression_child


def test_live_child_is_the_one_unended_continuation(db, clock) -> None:
    db.create_session("p", "cli")
    assert db.find_live_compression_child("p") is None  # not ended 'compression'
    db.end_session("p", "compression")
    assert db.find_live_compression_child("p") is None  # no child
    db.create_session("tool", "tool", parent_session_id="p")
    db.create_session("br", "cli", parent_session_id="p", model_config={"_branched_from": "p"})
    db.create_session("dl", "cli", parent_session_id="p", model_config={"_delegate_from": "p"})
    db.create_session("old", "cli", parent_session_id="p")
    db.end_session("old", "user_exit")
    assert db.find_live_compression_child("p") is None  # forks and ended rows do not count
    db.create_session("c", "cli", parent_session_id="p", model="m1")
    found = db.find_live_compression_child("p")
    assert found["id"] == "c" and found["parent_session_id"] == "p" and found["model"] == "m1"
    assert found == db.get_session("c")
    db.create_session("x", "cli", parent_session_id="p", model_config={"_delegate_from": "elsewhere"})
    assert db.find_live_compression_child("p") is None  # two continuations: ambiguous
    assert db.find_live_compression_child("") is None
    assert db.find_live_compression_child("ghost") is None


# ===================================================================== reopen_orphaned_compression_session


def test_orphan_reopen_needs_a_compression_end_and_no_continuation(db, clock) -> None:
    db.create_session("live", "cli")
    assert db.reopen_orphaned_compression_session("live") is False
    db.create_session("reset", "cli")
    db.end_session("reset", "session_reset")
    assert db.reopen_orphaned_compression_session("reset") is False
    db.create_session("p", "cli")
    db.end_session("p", "compression")
    db.create_session("c", "cli", parent_session_id="p")
    db.end_session("c", "user_exit")  # an ended continuation still counts
    assert db.reopen_orphaned_compression_session("p") is False
    assert db.get_session("p")["end_reason"] == "compression"
    db.create_session("q", "cli")
    db.end_session("q", "compression")
    db.create_session("qt", "tool", parent_session_id="q")  # a fork is no continuation
    db.create_session("qd", "cli", parent_session_id="q", model_config={"_delegate_from": "q"})
    assert db.reopen_orphaned_compression_session("q") is True
    row = db.get_session("q")
    assert row["ended_at"] is None and row["end_reason"] is None
    assert db.reopen_orphaned_compression_session("q") is False  # now live
    assert db.reopen_orphaned_compression_session("") is False
    assert db.reopen_orphaned_compression_session("ghost") is False


def test_orphan_reopen_respects_a_live_lease_and_removes_an_expired_one(hermes_state, db, clock) -> None:
    db.create_session("p", "cli")
    db.end_session("p", "compression")
    other = other_store(hermes_state, db)
    try:
        assert other.try_acquire_compression_lock("p", "compressor", 60)
        clock.now = T0 + 60  # expires_at == now: still live
        assert db.reopen_orphaned_compression_session("p") is False
        assert db.get_session("p")["end_reason"] == "compression"
        clock.now = T0 + 61
        assert db.reopen_orphaned_compression_session("p") is True
        assert lock_row(db, "p") is None
        assert other.refresh_compression_lock("p", "compressor") is False  # the lease is gone for good
    finally:
        other.close()


def test_orphan_reopen_loses_to_a_refresh_that_landed_after_its_read(db, clock, monkeypatch) -> None:
    """Compare-and-delete: the expired lease as read differs from the row now (refreshed)."""
    db.create_session("p", "cli")
    db.end_session("p", "compression")
    assert db.try_acquire_compression_lock("p", "compressor", 10)
    clock.now = T0 + 20
    stale = lock_row(db, "p")
    assert db.refresh_compression_lock("p", "compressor", 10)  # the racing refresh
    clock.now = T0 + 40  # expired again, but not as the stale read says
    monkeypatch.setattr(CompressionRepository, "_lease", lambda self, sid: (stale.holder, stale.expires_at))
    assert db.reopen_orphaned_compression_session("p") is False
    assert db.get_session("p")["end_reason"] == "compression"
    assert lock_row(db, "p").expires_at == T0 + 30


# ===================================================================== publish_compression_child


def parent_with_rows(db, clock, sid: str = "p") -> list[int]:
    db.create_session(sid, "telegram", cwd="/work", profile_name="team", git_repo_root="/work",
                      user_id="u1", session_key="agent:main:telegram:dm:1", chat_id="c1", chat_type="dm",
                      thread_id="t1")
    set_columns(db, sid, git_branch="main", display_name="Ada", origin_json='{"chat": "c1"}')
    ids = [db.append_message(sid, "user", "q1"),
           db.append_message(sid, "assistant", "a1"),
           db.append_message(sid, "user", "q2"),
           db.append_message(sid, "assistant", None, tool_calls=[{"id": "t", "function": {"name": "ls"}}],
                             reasoning="thinking"),
           db.append_message(sid, "tool", "out", tool_call_id="t", tool_name="ls")]
    return ids


def test_publish_creates_the_child_with_inherited_columns_and_ends_the_parent(db, clock) -> None:
    parent_with_rows(db, clock)
    assert db.try_acquire_compression_lock("p", "H", 300)
    clock.now = T0 + 5
    compacted = [{"role": "user", "content": "summary of q1/a1"}, {"role": "assistant", "content": "ok"}]
    assert db.publish_compression_child(
        parent_session_id="p", child_session_id="c", source="telegram", messages=compacted, model="m2",
        model_config={"temperature": 0.1}, system_prompt="be brief", compression_lock_holder="H",
    ) is None
    parent, child = db.get_session("p"), db.get_session("c")
    assert parent["end_reason"] == "compression" and parent["ended_at"] == T0 + 5
    assert child["parent_session_id"] == "p" and child["source"] == "telegram" and child["ended_at"] is None
    assert child["model"] == "m2" and json.loads(child["model_config"]) == {"temperature": 0.1}
    assert child["system_prompt"] == "be brief"
    assert (child["cwd"], child["profile_name"], child["git_branch"], child["git_repo_root"]) == \
        ("/work", "team", "main", "/work")
    assert {k: child[k] for k in ROUTING} == {k: parent[k] for k in ROUTING}
    assert [(m["role"], m["content"]) for m in db.get_messages("c")] == \
        [("user", "summary of q1/a1"), ("assistant", "ok")]
    assert child["message_count"] == 2 and child["tool_call_count"] == 0
    assert len(db.get_messages("p")) == 5  # the parent's transcript stays as it was
    assert db.find_live_compression_child("p")["id"] == "c"
    assert db.get_compression_tip("p") == "c"
    assert lock_row(db, "p").holder == "H"  # releasing is the compressor's call


def test_publish_inserts_through_the_shared_row_inserter(db, clock, monkeypatch) -> None:
    """``_insert_message_rows`` is reached through ``self`` (code may wrap it) and sets ``_row_id``."""
    parent_with_rows(db, clock)
    seen: list[tuple[str, int]] = []
    real = db._insert_message_rows

    def wrapped(conn: Any, session_id: str, messages: Any) -> Any:
        seen.append((session_id, len(messages)))
        return real(conn, session_id, messages)

    monkeypatch.setattr(db, "_insert_message_rows", wrapped)
    compacted = [{"role": "user", "content": "s1"}, {"role": "assistant", "content": "s2"}]
    db.publish_compression_child(parent_session_id="p", child_session_id="c", source="cli", messages=compacted,
                                 require_compression_lease=False)
    assert seen == [("c", 2)]
    assert [m["_row_id"] for m in compacted] == [r["id"] for r in rows_of(db, "c")]


def test_publish_takes_given_cwd_and_profile_over_the_parents(db, clock) -> None:
    parent_with_rows(db, clock)
    db.publish_compression_child(parent_session_id="p", child_session_id="c", source="cli",
                                 messages=[{"role": "user", "content": "s"}], cwd="/elsewhere",
                                 profile_name="solo", require_compression_lease=False)
    child = db.get_session("c")
    assert (child["cwd"], child["profile_name"], child["git_branch"]) == ("/elsewhere", "solo", "main")


def test_publish_clones_the_parents_live_tail_between_watermark_and_ceiling(db, clock) -> None:
    ids = parent_with_rows(db, clock)
    db.publish_compression_child(
        parent_session_id="p", child_session_id="c", source="cli", messages=[{"role": "user", "content": "s"}],
        require_compression_lease=False, watermark=ids[2], watermark_ceiling=ids[3],
    )
    rows = rows_of(db, "c")
    assert [(r["role"], r["content"]) for r in rows] == [("user", "s"), ("assistant", None)]
    parent_rows = {r["id"]: r for r in rows_of(db, "p")}
    clone, source = rows[1], parent_rows[ids[3]]
    assert clone["id"] > max(parent_rows) and clone["active"] == 1 and clone["session_id"] == "c"
    skip = {"id", "session_id", "active", "compacted", "search_vector"}
    assert {k: v for k, v in clone.items() if k not in skip} == {k: v for k, v in source.items() if k not in skip}
    assert db.get_session("c")["message_count"] == 2 and db.get_session("c")["tool_call_count"] == 1
    # without a ceiling the whole live tail comes along, in id order
    parent_with_rows(db, clock, "q")
    q_ids = [r["id"] for r in rows_of(db, "q")]
    db.publish_compression_child(parent_session_id="q", child_session_id="qc", source="cli",
                                 messages=[{"role": "user", "content": "s"}], require_compression_lease=False,
                                 watermark=q_ids[2])
    assert [r["content"] for r in rows_of(db, "qc")] == ["s", None, "out"]
    assert db.get_session("qc")["message_count"] == 3


def test_publish_clone_skips_rows_that_are_not_live(db, clock) -> None:
    ids = parent_with_rows(db, clock)
    db.rewind_to_message("p", ids[2])  # later rows become inactive
    live_after = [r["id"] for r in rows_of(db, "p") if r["active"] == 1 and r["id"] > ids[1]]
    db.publish_compression_child(parent_session_id="p", child_session_id="c", source="cli",
                                 messages=[{"role": "user", "content": "s"}], require_compression_lease=False,
                                 watermark=ids[1])
    assert len(rows_of(db, "c")) == 1 + len(live_after)


def nothing_published(db, parent: str = "p", child: str = "c") -> bool:
    return db.get_session(child) is None and db.get_session(parent)["ended_at"] is None \
        and rows_of(db, child) == []


@pytest.mark.parametrize("case", ["no lease", "other holder", "expired", "no holder given"])
def test_publish_fails_fast_when_the_lease_is_lost(hermes_state, db, clock, case: str) -> None:
    parent_with_rows(db, clock)
    holder = "H"
    if case == "other holder":
        assert db.try_acquire_compression_lock("p", "someone else", 300)
    elif case == "expired":
        assert db.try_acquire_compression_lock("p", "H", 10)
        clock.now = T0 + 11
    elif case == "no holder given":
        assert db.try_acquire_compression_lock("p", "H", 300)
        holder = None
    started = real_time.monotonic()
    with pytest.raises(hermes_state.CompressionSessionBusyError) as raised:
        db.publish_compression_child(parent_session_id="p", child_session_id="c", source="cli",
                                     messages=[{"role": "user", "content": "s"}], compression_lock_holder=holder)
    assert real_time.monotonic() - started < 2.0  # not retried like the transient busy error
    assert str(raised.value).startswith("Compression lease lost before publication: ")
    assert isinstance(raised.value, RuntimeError)
    assert not isinstance(raised.value, hermes_state.SessionCompressionInProgressError)
    assert nothing_published(db)


def test_publish_runtime_errors_write_nothing(hermes_state, db, clock) -> None:
    def publish(parent: str, child: str = "c", messages: Any = ({"role": "user", "content": "s"},)) -> None:
        db.publish_compression_child(parent_session_id=parent, child_session_id=child, source="cli",
                                     messages=list(messages), require_compression_lease=False)

    with pytest.raises(RuntimeError):
        publish("ghost")
    assert db.get_session("c") is None
    parent_with_rows(db, clock)
    with pytest.raises(RuntimeError):
        publish("p", messages=[])
    assert nothing_published(db)
    db.create_session("taken", "cli")
    with pytest.raises(RuntimeError):
        publish("p", child="taken")
    assert db.get_session("p")["ended_at"] is None and rows_of(db, "taken") == []
    db.end_session("p", "user_exit")
    with pytest.raises(RuntimeError):
        publish("p")
    assert db.get_session("c") is None and db.get_session("p")["end_reason"] == "user_exit"


def test_publish_is_all_or_nothing_when_a_later_step_fails(db, clock, monkeypatch) -> None:
    ids = parent_with_rows(db, clock)
    assert db.try_acquire_compression_lock("p", "H")
    with pytest.raises(ValueError):  # a message that is not a dict, checked while inserting
        db.publish_compression_child(parent_session_id="p", child_session_id="c", source="cli",
                                     messages=[{"role": "user", "content": "s"}, "not a message"],
                                     compression_lock_holder="H")
    assert nothing_published(db)

    def boom(self, *a: Any) -> None:
        raise RuntimeError("disk went away mid-publication")

    monkeypatch.setattr(CompressionRepository, "_clone_tail", boom)
    with pytest.raises(RuntimeError, match="mid-publication"):
        db.publish_compression_child(parent_session_id="p", child_session_id="c", source="cli",
                                     messages=[{"role": "user", "content": "s"}], compression_lock_holder="H",
                                     watermark=ids[0])
    assert nothing_published(db)
    assert lock_row(db, "p").holder == "H"


def test_two_compressors_only_the_lease_holder_publishes(hermes_state, db, clock) -> None:
    parent_with_rows(db, clock)
    other = other_store(hermes_state, db)
    try:
        assert db.try_acquire_compression_lock("p", "A", 60)
        assert other.try_acquire_compression_lock("p", "B", 60) is False
        with pytest.raises(hermes_state.CompressionSessionBusyError):
            other.publish_compression_child(parent_session_id="p", child_session_id="cB", source="cli",
                                            messages=[{"role": "user", "content": "B"}], compression_lock_holder="B")
        clock.now = T0 + 61  # A stalled past its lease; B takes over and publishes
        assert other.try_acquire_compression_lock("p", "B", 60) is True
        other.publish_compression_child(parent_session_id="p", child_session_id="cB", source="cli",
                                        messages=[{"role": "user", "content": "B"}], compression_lock_holder="B")
        with pytest.raises(hermes_state.CompressionSessionBusyError):
            db.publish_compression_child(parent_session_id="p", child_session_id="cA", source="cli",
                                         messages=[{"role": "user", "content": "A"}], compression_lock_holder="A")
        assert db.get_session("cA") is None and db.find_live_compression_child("p")["id"] == "cB"
    finally:
        other.close()


def test_publish_rejects_bad_watermarks_before_writing(db, clock) -> None:
    parent_with_rows(db, clock)
    for bad in ("3", 2.5, True):
        with pytest.raises(InvalidInputError):
            db.publish_compression_child(parent_session_id="p", child_session_id="c", source="cli",
                                         messages=[{"role": "user", "content": "s"}],
                                         require_compression_lease=False, watermark=bad)
    assert nothing_published(db)


# ===================================================================== cooldown snapshots, anti-thrash count


def test_cooldown_row_is_unfiltered_and_restores_exactly(db, clock) -> None:
    assert db.get_compression_failure_cooldown_row("ghost") == \
        {"session_exists": False, "cooldown_until": None, "error": None}
    db.create_session("s", "cli")
    assert db.get_compression_failure_cooldown_row("s") == \
        {"session_exists": True, "cooldown_until": None, "error": None}
    db.record_compression_failure_cooldown("s", T0 + 60, "provider 529")
    snapshot = db.get_compression_failure_cooldown_row("s")
    clock.now = T0 + 120  # over: the filtered reader says None, the row reader does not
    assert db.get_compression_failure_cooldown("s") is None
    assert db.get_compression_failure_cooldown_row("s") == \
        {"session_exists": True, "cooldown_until": T0 + 60, "error": "provider 529"}
    db.clear_compression_failure_cooldown("s")
    assert db.restore_compression_failure_cooldown_row("s", snapshot) is None
    assert db.get_compression_failure_cooldown_row("s") == snapshot
    db.restore_compression_failure_cooldown_row("s", {"session_exists": True, "cooldown_until": None, "error": None})
    assert db.get_session("s")["compression_failure_cooldown_until"] is None


def test_cooldown_restore_on_a_missing_row_raises(db, clock) -> None:
    with pytest.raises(RuntimeError):
        db.restore_compression_failure_cooldown_row("ghost", {"cooldown_until": T0, "error": None})
    assert db.get_session("ghost") is None


def test_ineffective_count_round_trip(hermes_state, db, clock) -> None:
    db.create_session("s", "cli")
    assert db.get_compression_ineffective_count("s") == 0
    db.set_compression_ineffective_count("s", 3)
    assert db.get_compression_ineffective_count("s") == 3
    assert db.get_session("s")["compression_ineffective_count"] == 3
    db.set_compression_ineffective_count("s", -2)
    assert db.get_compression_ineffective_count("s") == 0
    db.set_compression_ineffective_count("", 5)  # no-op
    db.set_compression_ineffective_count("ghost", 5)
    assert db.get_compression_ineffective_count("ghost") == 0
    with pytest.raises((TypeError, ValueError)):
        db.set_compression_ineffective_count("s", "many")
    other = other_store(hermes_state, db)
    other.set_compression_ineffective_count("s", 2)
    other.close()
    assert db.get_compression_ineffective_count("s") == 2
    assert other.get_compression_ineffective_count("s") == 0  # a closed store reads 0


# ===================================================================== resume never walks into a reset child


def test_resume_stops_before_a_reset_child(db, clock) -> None:
    key = "agent:main:telegram:dm:1"
    db.create_session("old", "telegram", session_key=key)
    db.append_message("old", "user", "before the reset")
    db.end_session("old", "session_reset")
    clock.now = T0 + 10
    db.create_session("fresh", "telegram", session_key=key, parent_session_id="old")
    db.append_message("fresh", "user", "after the reset")
    assert db.resolve_resume_session_id("old") == "old"  # legacy: same key, parent ended by a reset
    db.create_session("marked", "cli")
    db.append_message("marked", "user", "x")
    db.end_session("marked", "user_exit")
    clock.now = T0 + 20
    db.create_session("mk", "cli", parent_session_id="marked", model_config={"_reset_from": "marked"})
    db.append_message("mk", "user", "y")
    assert db.resolve_resume_session_id("marked") == "marked"  # the marker alone is enough


def test_resume_still_walks_into_children_that_are_no_reset(db, clock) -> None:
    db.create_session("a", "telegram", session_key="k1")
    db.append_message("a", "user", "x")
    db.end_session("a", "session_reset")
    clock.now = T0 + 10
    db.create_session("b", "telegram", session_key="k2", parent_session_id="a")  # other key
    db.append_message("b", "user", "y")
    assert db.resolve_resume_session_id("a") == "b"
    db.create_session("c", "cli")
    db.end_session("c", "user_exit")  # no reset reason: a shared key is no reset
    clock.now = T0 + 20
    db.create_session("d", "cli", parent_session_id="c")
    db.append_message("d", "user", "z")
    assert db.resolve_resume_session_id("c") == "d"
    db.create_session("e", "cli", session_key="")
    db.end_session("e", "idle")
    clock.now = T0 + 30
    db.create_session("f", "cli", session_key="", parent_session_id="e")  # empty keys never match
    db.append_message("f", "user", "w")
    assert db.resolve_resume_session_id("e") == "f"


def test_resume_through_a_compression_chain_stops_at_a_reset_below_the_tip(db, clock) -> None:
    key = "agent:main:telegram:dm:9"
    db.create_session("r", "telegram", session_key=key)
    db.append_message("r", "user", "x")
    db.end_session("r", "compression")
    clock.now = T0 + 10
    db.create_session("tip", "telegram", parent_session_id="r")  # inherits the key
    db.append_message("tip", "user", "y")
    db.end_session("tip", "daily")
    clock.now = T0 + 20
    db.create_session("next", "telegram", session_key=key, parent_session_id="tip")
    db.append_message("next", "user", "z")
    assert db.get_session("tip")["session_key"] == key
    assert db.get_compression_tip("r") == "tip"
    assert db.resolve_resume_session_id("r") == "tip"
