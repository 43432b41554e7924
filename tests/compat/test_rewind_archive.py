"""Hermes v23 rewind / restore and archive-and-compact (reference §0 active/compacted, §1.B).

Through the swapped ``hermes_state`` module, on SQLite and PostgreSQL; the guards are
also raced from two store instances (two "processes") at once.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any
from collections.abc import Callable

import pytest

from hermes_store.errors import HermesStoreError
from hermes_store.repositories import MessageRepository

pytestmark = pytest.mark.both_backends

CALLS = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


def stored(db: Any, sid: str = "s") -> list[dict[str, Any]]:
    return db.get_messages(sid, include_inactive=True)


def flags(db: Any, sid: str = "s") -> list[tuple[Any, int, int]]:
    return [(m["content"], m["active"], m["compacted"]) for m in stored(db, sid)]


def _turns(db: Any, n: int = 6) -> list[int]:
    """user, assistant, user, assistant, ... in session "s"."""
    db.create_session("s", "cli")
    return [db.append_message("s", "user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(n)]


def second_store(hermes_state: Any, db: Any) -> Any:
    """Another SessionDB on the same database (as another process would open it)."""
    return hermes_state.SessionDB(db.db_path if db.db_path is not None else db.url)


def race(n: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` for i in range(n) in threads released together; results in order."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# ----------------------------------------------------------------- rewind_to_message


def test_rewind_hides_target_and_after(db: Any) -> None:
    ids = _turns(db)
    result = db.rewind_to_message("s", ids[2])
    assert set(result) == {"rewound_count", "target_message", "new_head_id"}
    assert result["rewound_count"] == 4
    assert result["new_head_id"] == ids[1]
    target = result["target_message"]
    assert (target["id"], target["role"], target["content"], target["session_id"]) == (ids[2], "user", "m2", "s")
    assert target["active"] == 1  # read before the rewind
    assert [m["id"] for m in db.get_messages("s")] == ids[:2]
    assert [a for _, a, _ in flags(db)] == [1, 1, 0, 0, 0, 0]
    assert [c for _, _, c in flags(db)] == [0] * 6  # a rewind is not a compaction
    row = db.get_session("s")
    assert row["rewind_count"] == 1
    assert row["message_count"] == 6  # not adjusted


def test_rewind_target_message_is_a_full_decoded_row(db: Any) -> None:
    db.create_session("s", "cli")
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:"}}]
    mid = db.append_message("s", "user", parts, platform_message_id="tg-3", api_content="raw")
    target = db.rewind_to_message("s", mid)["target_message"]
    assert target["content"] == parts
    assert target == {**db.get_messages("s", include_inactive=True)[0], "active": 1}
    assert target["platform_message_id"] == "tg-3" and target["api_content"] == "raw"


def test_rewind_to_first_message_leaves_no_head(db: Any) -> None:
    ids = _turns(db, 3)
    result = db.rewind_to_message("s", ids[0])
    assert (result["rewound_count"], result["new_head_id"]) == (3, None)
    assert db.get_messages("s") == []


def test_rewind_counts_every_call_even_when_nothing_changes(db: Any) -> None:
    ids = _turns(db)
    db.rewind_to_message("s", ids[4])
    again = db.rewind_to_message("s", ids[4])  # the target is rewound already: still valid
    assert again["rewound_count"] == 0 and again["new_head_id"] == ids[3]
    assert again["target_message"]["active"] == 0
    assert db.get_session("s")["rewind_count"] == 2


def test_rewind_only_touches_live_rows_of_that_session(db: Any) -> None:
    ids = _turns(db)
    db.create_session("other", "cli")
    other = [db.append_message("other", "user", f"o{i}") for i in range(3)]
    db.rewind_to_message("s", ids[4])
    assert db.rewind_to_message("s", ids[2])["rewound_count"] == 2  # ids[2], ids[3]; 4 and 5 were already
    assert [m["id"] for m in db.get_messages("other")] == other
    assert db.get_session("other")["rewind_count"] == 0


def test_rewind_errors_are_hermes_value_errors(db: Any) -> None:
    ids = _turns(db)
    db.create_session("other", "cli")
    foreign = db.append_message("other", "user", "elsewhere")
    with pytest.raises(ValueError, match=r"^message 999999 not found in session s$"):
        db.rewind_to_message("s", 999999)
    with pytest.raises(ValueError, match=rf"^message {foreign} not found in session s$"):
        db.rewind_to_message("s", foreign)
    with pytest.raises(ValueError, match=rf"^message {ids[0]} not found in session nope$"):
        db.rewind_to_message("nope", ids[0])
    with pytest.raises(ValueError) as info:
        db.rewind_to_message("s", ids[1])
    assert str(info.value) == f"rewind target must be a 'user' message (got role='assistant', id={ids[1]})"
    assert isinstance(info.value, HermesStoreError)
    with pytest.raises(ValueError, match="not found"):
        db.rewind_to_message("", ids[0])
    with pytest.raises(ValueError, match="not found"):
        db.rewind_to_message("s", None)
    # nothing changed by the refused calls
    assert len(db.get_messages("s")) == 6 and db.get_session("s")["rewind_count"] == 0


def test_rewind_accepts_the_text_of_an_id(db: Any) -> None:
    """SQLite compares ``id = '5'`` numerically, so Hermes accepts it; so do we, everywhere."""
    ids = _turns(db)
    assert db.rewind_to_message("s", str(ids[4]))["rewound_count"] == 2


def test_rewound_rows_stay_stored(db: Any) -> None:
    ids = _turns(db)
    db.rewind_to_message("s", ids[2])
    assert db.message_count("s") == 6
    assert db.has_archived_messages("s") is True
    assert db.has_platform_message_id("s", "none") is False


def test_concurrent_rewinds_from_two_stores(hermes_state: Any, db: Any) -> None:
    """Two processes rewinding the same turn: each row is rewound once, both are counted."""
    ids = _turns(db, 8)
    other = second_store(hermes_state, db)
    try:
        stores = [db, other]
        results = race(2, lambda i: stores[i].rewind_to_message("s", ids[2]))
    finally:
        other.close()
    assert sorted(r["rewound_count"] for r in results) == [0, 6]
    assert all(r["new_head_id"] == ids[1] for r in results)
    assert db.get_session("s")["rewind_count"] == 2
    assert [m["id"] for m in db.get_messages("s")] == ids[:2]


# ----------------------------------------------------------------- restore_rewound


def test_restore_rewound(db: Any) -> None:
    ids = _turns(db)
    db.rewind_to_message("s", ids[2])
    before = db.get_session("s")
    assert db.restore_rewound("s", ids[4]) == 2  # only the tail from ids[4]
    assert [m["id"] for m in db.get_messages("s")] == [ids[0], ids[1], ids[4], ids[5]]
    assert db.restore_rewound("s", ids[0]) == 2  # ids[2], ids[3]; the rest were live
    assert [m["id"] for m in db.get_messages("s")] == ids
    assert db.restore_rewound("s", ids[0]) == 0
    after = db.get_session("s")
    assert (after["message_count"], after["tool_call_count"], after["rewind_count"]) == (
        before["message_count"], before["tool_call_count"], before["rewind_count"])
    assert db.has_archived_messages("s") is False


def test_restore_rewound_unknown_and_other_sessions(db: Any) -> None:
    ids = _turns(db)
    db.rewind_to_message("s", ids[2])
    assert db.restore_rewound("nope", ids[0]) == 0
    assert db.restore_rewound("", ids[0]) == 0
    assert db.restore_rewound(None, ids[0]) == 0
    assert db.restore_rewound("s", 10**9) == 0
    assert len(db.get_messages("s")) == 2


def test_restore_rewound_also_reactivates_compacted_rows(db: Any) -> None:
    """As in Hermes: restore does not look at ``compacted``."""
    ids = _turns(db, 4)
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    assert db.restore_rewound("s", ids[2]) == 2
    assert flags(db) == [("m0", 0, 1), ("m1", 0, 1), ("m2", 1, 1), ("m3", 1, 1), ("summary", 1, 0)]


# ----------------------------------------------------------------- archive_and_compact


def test_archive_and_compact(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "q1")
    db.append_message("s", "assistant", None, tool_calls=CALLS + CALLS)
    db.append_message("s", "tool", "r", tool_call_id="c1")
    n = db.archive_and_compact("s", [
        {"role": "user", "content": "summary of the above"},
        {"role": "assistant", "content": "ack", "tool_calls": CALLS, "reasoning": "kept"},
    ])
    assert n == 2
    assert flags(db) == [("q1", 0, 1), (None, 0, 1), ("r", 0, 1),
                         ("summary of the above", 1, 0), ("ack", 1, 0)]
    live = db.get_messages("s")
    assert [m["content"] for m in live] == ["summary of the above", "ack"]
    assert live[1]["reasoning"] == "kept" and live[1]["tool_calls"] == CALLS
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (2, 1)  # the inserted counts
    assert db.has_archived_messages("s") is True
    assert db.message_count("s") == 5  # archived rows stay stored


def test_archive_leaves_rewound_rows_uncompacted(db: Any) -> None:
    ids = _turns(db, 4)
    db.rewind_to_message("s", ids[2])
    db.archive_and_compact("s", [{"role": "user", "content": "s"}])
    assert flags(db) == [("m0", 0, 1), ("m1", 0, 1), ("m2", 0, 0), ("m3", 0, 0), ("s", 1, 0)]


def test_archive_and_compact_twice_and_empty(db: Any) -> None:
    _turns(db, 2)
    assert db.archive_and_compact("s", [{"role": "user", "content": "one"}]) == 1
    assert db.archive_and_compact("s", []) == 0
    assert flags(db) == [("m0", 0, 1), ("m1", 0, 1), ("one", 0, 1)]
    assert db.get_messages("s") == []
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (0, 0)


def test_archive_and_compact_rows_follow_replace_rules(db: Any, hermes_state: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _turns(db, 2)

    class Clock:
        def time(self) -> float:
            return 7000.0

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

    monkeypatch.setattr(hermes_state, "time", Clock())
    db.archive_and_compact("s", [
        {"content": "no role", "message_id": "tg-9", "observed": 1},
        {"role": "user", "content": "x", "timestamp": 50.0, "reasoning": "user reasoning is dropped"},
        {"role": "assistant", "content": "y", "tool_calls": '[{"id": "a"}, {"id": "b"}]'},
    ])
    a, b, c = db.get_messages("s")
    assert (a["role"], a["platform_message_id"], a["observed"], a["timestamp"]) == ("unknown", "tg-9", 1, 7000.0)
    assert (b["timestamp"], b["reasoning"]) == (50.0, None)
    assert c["timestamp"] == pytest.approx(7000.0 + 2e-6, abs=1e-9)
    assert db.get_session("s")["tool_call_count"] == 2


def test_archive_and_compact_unknown_session(db: Any) -> None:
    with pytest.raises(sqlite3.IntegrityError) as info:
        db.archive_and_compact("missing", [{"role": "user", "content": "x"}])
    assert isinstance(info.value, HermesStoreError)
    assert db.message_count() == 0
    assert db.archive_and_compact("missing", []) == 0


def test_archive_and_compact_refuses_bad_items_first(db: Any) -> None:
    _turns(db, 2)
    with pytest.raises(HermesStoreError):
        db.archive_and_compact("s", [{"role": "user", "content": "ok"}, 42])
    assert flags(db) == [("m0", 1, 0), ("m1", 1, 0)]  # nothing archived


def test_has_archived_messages(db: Any) -> None:
    assert db.has_archived_messages("nope") is False
    assert db.has_archived_messages("") is False
    ids = _turns(db, 2)
    assert db.has_archived_messages("s") is False
    db.rewind_to_message("s", ids[0])
    assert db.has_archived_messages("s") is True
    db.restore_rewound("s", ids[0])
    assert db.has_archived_messages("s") is False
    db.archive_and_compact("s", [])
    assert db.has_archived_messages("s") is True


def test_rewind_after_compaction_keeps_the_archive(db: Any) -> None:
    _turns(db, 2)
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}, {"role": "assistant", "content": "ok"}])
    new_user = db.append_message("s", "user", "next")
    db.append_message("s", "assistant", "reply")
    result = db.rewind_to_message("s", new_user)
    assert result["rewound_count"] == 2
    assert [m["content"] for m in db.get_messages("s")] == ["summary", "ok"]
    assert flags(db)[:2] == [("m0", 0, 1), ("m1", 0, 1)]  # the compaction archive is untouched
    assert db.restore_rewound("s", new_user) == 2
    assert [m["content"] for m in db.get_messages("s")] == ["summary", "ok", "next", "reply"]


def test_concurrent_compactions_leave_one_live_transcript(hermes_state: Any, db: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes compacting at once: one runs after the other, never interleaved, so
    exactly one compacted transcript is live and the counters describe it."""
    _turns(db, 6)
    original = MessageRepository.insert_rows

    def slow_insert(self: Any, rows: Any) -> None:
        time.sleep(0.3)  # hold the transaction open between archiving and inserting
        original(self, rows)

    monkeypatch.setattr(MessageRepository, "insert_rows", slow_insert)
    other = second_store(hermes_state, db)
    batches = [[{"role": "user", "content": f"summary {k}.{j}"} for j in range(3)] for k in range(2)]
    try:
        stores = [db, other]
        assert race(2, lambda i: stores[i].archive_and_compact("s", batches[i])) == [3, 3]
    finally:
        other.close()
    live = [m["content"] for m in db.get_messages("s")]
    assert live in ([b["content"] for b in batches[0]], [b["content"] for b in batches[1]])
    assert db.get_session("s")["message_count"] == 3
    assert sum(1 for _, a, c in flags(db) if a == 0 and c == 1) == 9  # 6 originals + the first batch


def test_concurrent_appends_and_api_content_check(hermes_state: Any, db: Any) -> None:
    """set_latest_user_api_content racing appends of newer user turns from another store: it
    tags only the turn whose content it was given, and once a newer turn has taken over it
    never tags again."""
    db.create_session("s", "cli")
    db.append_message("s", "user", "turn 0")
    other = second_store(hermes_state, db)
    try:
        def work(i: int) -> Any:
            if i == 0:
                return [other.append_message("s", "user", f"turn {k}") for k in range(1, 6)]
            return [db.set_latest_user_api_content("s", "turn 0", f"api {k}") for k in range(5)]

        _, tagged = race(2, work)
    finally:
        other.close()
    rows = db.get_messages("s")
    assert all(m["api_content"] is None for m in rows[1:])
    assert (rows[0]["api_content"] is not None) == (sum(tagged) > 0)
    assert tagged == sorted(tagged, reverse=True)  # 1s, then 0s once turn 0 is no longer the latest
