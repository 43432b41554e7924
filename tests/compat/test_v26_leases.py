"""Hermes v25 turn leases (SESSIONDB_V26_API.md §2.C), through the swapped ``hermes_state``:
one holder per conversation (the root reached through parents that ended
'compression'), re-entrant, expiring, dead-holder reclaim, holder-checked refresh and
release, and the waiting acquire (polls, notices, abort, locked-class retries).

Races use a second SessionDB on the same database (``other_store``); time is the
settable ``clock`` or, for the waiting acquire, a clock whose ``sleep`` moves it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

import pytest
from sqlalchemy import select

from hermes_store.errors import DatabaseLockedError, InvalidInputError
from hermes_store.models import Base

from .helpers import FakeTime, other_store
from .test_v26_compression import FakePsutil, shape

pytestmark = pytest.mark.both_backends

LEASES = Base.metadata.tables["session_turn_leases"]
T0 = 1_700_000_000.0


def lease_rows(db) -> list[tuple[Any, ...]]:
    return db._read(lambda c: [tuple(r) for r in c.execute(
        select(LEASES.c.conversation_id, LEASES.c.holder, LEASES.c.acquired_at, LEASES.c.expires_at)
        .order_by(LEASES.c.conversation_id))])


class SteppingTime(FakeTime):
    """``hermes_state.time`` whose ``sleep`` moves both clocks; ``on_sleep`` runs first."""

    def __init__(self, now: float) -> None:
        super().__init__(now)
        self.mono = 1000.0
        self.sleeps: list[float] = []
        self.on_sleep: Any = None

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))
        self.mono += seconds
        self.now += seconds


@pytest.fixture
def stepping(hermes_state, monkeypatch: pytest.MonkeyPatch) -> SteppingTime:
    fake = SteppingTime(T0)
    monkeypatch.setattr(hermes_state, "time", fake)
    return fake


# ===================================================================== signatures

POS, KW = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
SIGNATURES = {
    "try_acquire_session_turn_lease": [
        ("session_id", POS, None), ("holder", POS, None), ("ttl_seconds", KW, "300.0"), ("patience_s", KW, "None"),
    ],
    "acquire_session_turn_lease": [
        ("session_id", POS, None), ("holder", POS, None), ("ttl_seconds", KW, "300.0"),
        ("wait_seconds", KW, "1800.0"), ("poll_interval_seconds", KW, "1.0"), ("on_wait", KW, "None"),
        ("wait_notice_interval_seconds", KW, "15.0"), ("should_abort", KW, "None"),
        ("acquire_patience_s", KW, "0.5"),
    ],
    "refresh_session_turn_lease": [("session_id", POS, None), ("holder", POS, None), ("ttl_seconds", KW, "300.0")],
    "release_session_turn_lease": [("session_id", POS, None), ("holder", POS, None)],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_are_hermes_v26(hermes_state, name: str) -> None:
    assert shape(getattr(hermes_state.SessionDB, name)) == SIGNATURES[name]


# ===================================================================== try / refresh / release


def test_one_holder_per_conversation_reentrant_without_extending(hermes_state, db, clock) -> None:
    db.create_session("s", "cli")
    other = other_store(hermes_state, db)
    try:
        assert db.try_acquire_session_turn_lease("s", "A", ttl_seconds=60) is True
        assert lease_rows(db) == [("s", "A", T0, T0 + 60)]
        clock.now = T0 + 30
        assert other.try_acquire_session_turn_lease("s", "B", ttl_seconds=60) is False
        assert db.try_acquire_session_turn_lease("s", "A", ttl_seconds=60) is True  # re-entrant
        assert other.try_acquire_session_turn_lease("s", "A") is True  # the holder, not the store, owns it
        assert lease_rows(db) == [("s", "A", T0, T0 + 60)]  # not extended
        clock.now = T0 + 60  # expires_at == now: still held
        assert other.try_acquire_session_turn_lease("s", "B", ttl_seconds=60) is False
        clock.now = T0 + 61
        assert other.try_acquire_session_turn_lease("s", "B", ttl_seconds=60) is True
        assert lease_rows(db) == [("s", "B", T0 + 61, T0 + 121)]
        assert db.try_acquire_session_turn_lease("s", "A") is False
    finally:
        other.close()


def test_the_key_is_the_root_through_compression_parents(db, clock) -> None:
    db.create_session("root", "cli")
    db.end_session("root", "compression")
    db.create_session("mid", "cli", parent_session_id="root")
    db.end_session("mid", "compression")
    db.create_session("tip", "cli", parent_session_id="mid")
    db.create_session("live", "cli")
    db.create_session("delegate", "cli", parent_session_id="live", model_config={"_delegate_from": "live"})
    assert db.try_acquire_session_turn_lease("tip", "A") is True
    assert [r[:2] for r in lease_rows(db)] == [("root", "A")]
    for sid in ("root", "mid", "tip"):
        assert db.try_acquire_session_turn_lease(sid, "B") is False, sid
        assert db.try_acquire_session_turn_lease(sid, "A") is True, sid
    # a live parent is not a compression parent: its child has a lease of its own
    assert db.try_acquire_session_turn_lease("live", "A") is True
    assert db.try_acquire_session_turn_lease("delegate", "B") is True
    assert db.try_acquire_session_turn_lease("ghost", "C") is True  # unknown: keyed by itself
    assert [r[:2] for r in lease_rows(db)] == [("delegate", "B"), ("ghost", "C"), ("live", "A"), ("root", "A")]
    db.release_session_turn_lease("mid", "A")  # released through any member of the chain
    assert db.try_acquire_session_turn_lease("root", "B") is True


def test_the_key_is_resolved_when_the_lease_is_taken(db, clock) -> None:
    db.create_session("p", "cli")
    db.create_session("c", "cli", parent_session_id="p")
    assert db.try_acquire_session_turn_lease("c", "A") is True  # p is live: keyed "c"
    db.end_session("p", "compression")
    assert db.try_acquire_session_turn_lease("c", "B") is True  # now keyed "p", which is free
    assert [r[:2] for r in lease_rows(db)] == [("c", "A"), ("p", "B")]


def test_refresh_is_holder_checked_and_revives_an_untaken_lease(hermes_state, db, clock) -> None:
    other = other_store(hermes_state, db)
    try:
        assert db.try_acquire_session_turn_lease("s", "A", ttl_seconds=10)
        clock.now = T0 + 5
        assert other.refresh_session_turn_lease("s", "B", ttl_seconds=100) is False
        assert other.refresh_session_turn_lease("s", "A", ttl_seconds=100) is True
        assert lease_rows(db) == [("s", "A", T0, T0 + 105)]
        clock.now = T0 + 200  # expired, nobody took it: the holder may still extend it
        assert db.refresh_session_turn_lease("s", "A", ttl_seconds=10) is True
        assert other.try_acquire_session_turn_lease("s", "B") is False
        clock.now = T0 + 211
        assert other.try_acquire_session_turn_lease("s", "B") is True
        assert db.refresh_session_turn_lease("s", "A") is False  # taken over: lost for good
        assert db.refresh_session_turn_lease("ghost", "A") is False
        assert db.refresh_session_turn_lease("", "A") is False
        assert db.refresh_session_turn_lease("s", "") is False
    finally:
        other.close()


def test_release_is_holder_checked_and_idempotent(hermes_state, db, clock) -> None:
    assert db.try_acquire_session_turn_lease("s", "A")
    other = other_store(hermes_state, db)
    try:
        assert other.release_session_turn_lease("s", "B") is None
        assert [r[1] for r in lease_rows(db)] == ["A"]
        other.release_session_turn_lease("s", "A")
        assert lease_rows(db) == []
        other.release_session_turn_lease("s", "A")
        db.release_session_turn_lease("", "A")
        db.release_session_turn_lease("s", None)
        assert other.try_acquire_session_turn_lease("s", "B") is True
    finally:
        other.close()


def test_falsy_arguments_and_bad_ttls(db, clock) -> None:
    assert db.try_acquire_session_turn_lease("", "A") is False
    assert db.try_acquire_session_turn_lease(None, "A") is False
    assert db.try_acquire_session_turn_lease("s", "") is False
    assert db.acquire_session_turn_lease("", "A", wait_seconds=5) is False
    assert lease_rows(db) == []
    for bad in ("300", float("nan"), None):
        with pytest.raises(InvalidInputError):
            db.try_acquire_session_turn_lease("s", "A", ttl_seconds=bad)
        with pytest.raises(InvalidInputError):
            db.refresh_session_turn_lease("s", "A", ttl_seconds=bad)
    assert lease_rows(db) == []


def test_dead_pid_holders_lose_the_lease_on_a_file_only(hermes_state, db, clock, monkeypatch, backend) -> None:
    monkeypatch.setattr(hermes_state, "psutil", FakePsutil(alive={4242}))
    assert db.try_acquire_session_turn_lease("dead", "pid=999999:turn")
    assert db.try_acquire_session_turn_lease("alive", "pid=4242:turn")
    assert db.try_acquire_session_turn_lease("own", f"pid={os.getpid()}:turn")
    assert db.try_acquire_session_turn_lease("opaque", "gateway-worker")
    assert db.try_acquire_session_turn_lease("dead", "pid=4242:next") is (backend == "sqlite")
    for sid in ("alive", "own", "opaque"):
        assert db.try_acquire_session_turn_lease(sid, "pid=4242:next") is False, sid


def test_threads_on_two_stores_race_for_one_winner(hermes_state, db) -> None:
    other = other_store(hermes_state, db)
    n = 8
    start = threading.Barrier(n)
    results: dict[str, Any] = {}

    def run(i: int) -> None:
        store = db if i % 2 else other
        start.wait()
        try:
            results[f"h{i}"] = store.try_acquire_session_turn_lease("s", f"h{i}")
        except Exception as exc:  # reported, so the assertion shows the reason
            results[f"h{i}"] = repr(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        other.close()
    winners = [h for h, ok in results.items() if ok is True]
    assert len(results) == n and len(winners) == 1, results
    assert all(v is False for h, v in results.items() if h != winners[0]), results
    assert [r[1] for r in lease_rows(db)] == winners


# ===================================================================== the waiting acquire


def test_acquire_waits_until_the_holder_releases(hermes_state, db, stepping) -> None:
    other = other_store(hermes_state, db)
    try:
        assert other.try_acquire_session_turn_lease("s", "A")
        notices: list[float] = []
        stepping.on_sleep = lambda n: other.release_session_turn_lease("s", "A") if n == 40 else None
        assert db.acquire_session_turn_lease("s", "B", poll_interval_seconds=1.0, on_wait=notices.append,
                                             wait_notice_interval_seconds=15.0) is True
        assert stepping.sleeps == [1.0] * 40
        assert notices == [0.0, 15.0, 30.0]  # after the first miss, then every 15 s
        assert [r[1] for r in lease_rows(db)] == ["B"]
    finally:
        other.close()


def test_acquire_gives_up_after_wait_seconds(hermes_state, db, stepping) -> None:
    assert db.try_acquire_session_turn_lease("s", "A", ttl_seconds=10_000)
    tries: list[int] = []
    real = db.try_acquire_session_turn_lease

    def counting(*a: Any, **kw: Any) -> bool:
        tries.append(kw["patience_s"])
        return real(*a, **kw)

    db.try_acquire_session_turn_lease = counting
    assert db.acquire_session_turn_lease("s", "B", wait_seconds=5.0, poll_interval_seconds=2.0,
                                         acquire_patience_s=0.25) is False
    assert stepping.sleeps == [2.0, 2.0, 1.0]  # never sleeps past the wait
    assert tries == [0.25] * 4
    assert [r[1] for r in lease_rows(db)] == ["A"]
    assert db.acquire_session_turn_lease("s", "B", wait_seconds=0) is False  # one try, no wait
    assert len(tries) == 5 and len(stepping.sleeps) == 3


def test_acquire_takes_an_expired_lease_while_waiting(db, stepping) -> None:
    assert db.try_acquire_session_turn_lease("s", "A", ttl_seconds=3.5)
    assert db.acquire_session_turn_lease("s", "B", wait_seconds=60) is True
    assert stepping.sleeps == [1.0] * 4  # the wall clock moved with the sleeps
    assert [r[1] for r in lease_rows(db)] == ["B"]


def test_should_abort_ends_the_wait(db, stepping) -> None:
    assert db.try_acquire_session_turn_lease("s", "A")
    asked: list[int] = []

    def abort() -> bool:
        asked.append(1)
        return len(asked) >= 3

    assert db.acquire_session_turn_lease("s", "B", should_abort=abort) is False
    assert len(asked) == 3 and len(stepping.sleeps) == 2
    assert db.acquire_session_turn_lease("free", "B", should_abort=lambda: True) is False  # before any try
    assert [r[0] for r in lease_rows(db)] == ["s"]


def test_a_failing_notice_does_not_end_the_wait(db, stepping) -> None:
    assert db.try_acquire_session_turn_lease("s", "A", ttl_seconds=2.5)

    def broken(elapsed: float) -> None:
        raise RuntimeError("ui went away")

    assert db.acquire_session_turn_lease("s", "B", on_wait=broken, wait_notice_interval_seconds=0) is True


@pytest.mark.parametrize("error", [sqlite3.OperationalError("database is locked"),
                                   DatabaseLockedError("db: database stayed locked for 0.5s; giving up"),
                                   sqlite3.OperationalError("database table is busy")])
def test_locked_class_errors_are_retried(db, stepping, error: Exception) -> None:
    real = db.try_acquire_session_turn_lease
    calls: list[int] = []

    def flaky(*a: Any, **kw: Any) -> bool:
        calls.append(1)
        if len(calls) <= 2:
            raise error
        return real(*a, **kw)

    db.try_acquire_session_turn_lease = flaky
    assert db.acquire_session_turn_lease("s", "B") is True
    assert len(calls) == 3 and stepping.sleeps == [1.0, 1.0]


def test_other_errors_are_raised(db, stepping) -> None:
    def broken(*a: Any, **kw: Any) -> bool:
        raise sqlite3.OperationalError("no such table: session_turn_leases")

    db.try_acquire_session_turn_lease = broken
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        db.acquire_session_turn_lease("s", "B")
    assert stepping.sleeps == []


def test_two_waiters_take_turns(hermes_state, db, stepping) -> None:
    """A waiter in one store gets the lease the other store's turn gives back."""
    other = other_store(hermes_state, db)
    try:
        assert db.acquire_session_turn_lease("s", "turn-1") is True
        stepping.on_sleep = lambda n: db.release_session_turn_lease("s", "turn-1") if n == 3 else None
        assert other.acquire_session_turn_lease("s", "turn-2") is True
        assert db.try_acquire_session_turn_lease("s", "turn-1") is False
        assert [r[1] for r in lease_rows(db)] == ["turn-2"]
    finally:
        other.close()


# ===================================================================== with the transcript guard


def test_appends_follow_the_lease_taken_here(hermes_state, db, clock) -> None:
    """append_message's guard reads the lease these methods write (same key, same holder)."""
    db.create_session("p", "cli")
    db.end_session("p", "compression")
    db.create_session("c", "cli", parent_session_id="p")
    assert db.try_acquire_session_turn_lease("c", "A", ttl_seconds=10)
    assert db.append_message("c", "user", "mine", turn_lease_holder="A") > 0
    with pytest.raises(hermes_state.SessionTurnLeaseLostError):
        db.append_message("c", "user", "not mine", turn_lease_holder="B")
    db.release_session_turn_lease("p", "A")  # the root's lease is the continuation's
    with pytest.raises(hermes_state.SessionTurnLeaseLostError):
        db.append_message("c", "user", "released", turn_lease_holder="A")
    assert [m["content"] for m in db.get_messages("c")] == ["mine"]
