"""Hermes v26 transcript surface (v26 reference §2.B, §3 "Transcript filter"): display
fields, the transcript guards of append_message, replace_messages' archive mode,
watermark compaction, the new get_messages modes and the conversation readers.

Through the swapped ``hermes_state`` module, on SQLite and PostgreSQL. Batch appends
are in test_v26_batch.py.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from hermes_store.errors import (
    CompressionSessionClosedError,
    SessionCompressionInProgressError,
    SessionTurnLeaseLostError,
)
from hermes_store.repositories.base import MESSAGES
from hermes_store.repositories.turn_leases import LEASES
from hermes_store.sessiondb import messages as messages_module

pytestmark = pytest.mark.both_backends

CALLS = [{"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": "{}"}}]


def stored(db: Any, sid: str = "s") -> list[dict[str, Any]]:
    return db.get_messages(sid, include_inactive=True)


def put_lease(db: Any, key: str, holder: str, expires_at: float) -> None:
    db._write(lambda c: c.execute(insert(LEASES).values(
        conversation_id=key, holder=holder, acquired_at=0.0, expires_at=expires_at)))


def lease_expiry(db: Any, key: str) -> Any:
    return db._read(lambda c: c.execute(select(LEASES.c.expires_at).where(LEASES.c.conversation_id == key)).scalar())


def set_raw_metadata(db: Any, row_id: int, raw: Any) -> None:
    db._write(lambda c: c.execute(update(MESSAGES).where(MESSAGES.c.id == row_id).values(display_metadata=raw)))


def raw_metadata(db: Any, row_id: int) -> Any:
    return db._read(lambda c: c.execute(select(MESSAGES.c.display_metadata).where(MESSAGES.c.id == row_id)).scalar())


# ----------------------------------------------------------------- display fields


@pytest.mark.parametrize(("given", "kept"), [
    ({"step": 2, "名": "值"}, {"step": 2, "名": "值"}),
    ('{"raw": true}', '{"raw": true}'),  # JSON text of an object: stored as given
    ('[1, 2]', None), ('"text"', None), ("not json", None), ("", None), ([1], None), (7, None),
])
def test_display_metadata_write_rules(db: Any, given: Any, kept: Any) -> None:
    db.create_session("s", "cli")
    mid = db.append_message("s", "assistant", "x", display_metadata=given)
    raw = raw_metadata(db, mid)
    if isinstance(kept, dict):
        assert json.loads(raw) == kept
    else:
        assert raw == kept


def test_display_kind_is_stored_only_as_text(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "assistant", "a", display_kind="status")
    db.append_message("s", "assistant", "b", display_kind=3)
    assert [m["display_kind"] for m in stored(db)] == ["status", None]


@pytest.mark.parametrize(("raw", "decoded"), [
    ('{"a": 1}', {"a": 1}),
    (json.dumps(json.dumps({"a": 1})), {"a": 1}),  # one extra string layer unwrapped
    (None, None), ("", None), ("{broken", None), ("[1]", None), ("3", None), ('"plain"', None),
    (json.dumps(json.dumps([1])), None),
])
def test_every_reader_decodes_display_metadata(db: Any, raw: Any, decoded: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "q")
    mid = db.append_message("s", "assistant", "a", display_kind="note")
    set_raw_metadata(db, mid, raw)
    assert db.get_messages("s")[1]["display_metadata"] == decoded
    assert db.get_messages_around("s", mid)["window"][1]["display_metadata"] == decoded
    assert db.get_anchored_view("s", mid)["window"][-1]["display_metadata"] == decoded
    turn = db.get_messages_as_conversation("s")[1]
    assert turn["display_kind"] == "note" and turn.get("display_metadata") == decoded
    model, display = db.get_resume_conversations("s")
    assert model[1].get("display_metadata") == decoded and display[1].get("display_metadata") == decoded


# ----------------------------------------------------------------- append guards


def test_append_message_with_a_held_turn_lease(db: Any, clock: Any) -> None:
    db.create_session("s", "cli")
    put_lease(db, "s", "me", clock.now + 100)
    mid = db.append_message("s", "user", "hi", turn_lease_holder="me")
    assert [m["id"] for m in stored(db)] == [mid]
    assert lease_expiry(db, "s") == clock.now + 100  # a live lease is left as it is


def test_append_message_renews_the_holders_expired_lease(db: Any, clock: Any) -> None:
    db.create_session("s", "cli")
    put_lease(db, "s", "me", clock.now - 1)
    db.append_message("s", "user", "hi", turn_lease_holder="me", turn_lease_ttl_seconds=42.0)
    assert lease_expiry(db, "s") == pytest.approx(clock.now + 42.0)


@pytest.mark.parametrize("holder_in_row", [None, "someone else"])
def test_append_message_without_the_lease_writes_nothing(db: Any, clock: Any, holder_in_row: Any) -> None:
    db.create_session("s", "cli")
    if holder_in_row is not None:
        put_lease(db, "s", holder_in_row, clock.now + 100)
    with pytest.raises(SessionTurnLeaseLostError) as info:
        db.append_message("s", "user", "hi", turn_lease_holder="me")
    assert isinstance(info.value, RuntimeError)
    assert stored(db) == [] and db.get_session("s")["message_count"] == 0


def test_a_compression_continuation_shares_its_roots_lease(db: Any, clock: Any) -> None:
    db.create_session("root", "cli")
    db.end_session("root", "compression")
    db.create_session("kid", "cli", parent_session_id="root")
    put_lease(db, "root", "me", clock.now + 100)
    db.append_message("kid", "user", "continued", turn_lease_holder="me")
    with pytest.raises(SessionTurnLeaseLostError):
        db.append_message("kid", "user", "stolen", turn_lease_holder="other")
    assert [m["content"] for m in stored(db, "kid")] == ["continued"]


def test_append_message_to_a_session_closed_by_compression(db: Any, clock: Any) -> None:
    db.create_session("p", "cli")
    db.end_session("p", "compression")
    put_lease(db, "p", "me", clock.now + 100)
    with pytest.raises(CompressionSessionClosedError) as info:
        db.append_message("p", "user", "late", turn_lease_holder="me")
    assert info.value.session_id == "p" and isinstance(info.value, RuntimeError)
    assert "closed by compression" in str(info.value)
    assert stored(db, "p") == []


@pytest.mark.parametrize("end_reason", ["compression", "user_exit", None])
def test_a_plain_append_refuses_only_a_session_closed_by_compression(db: Any, end_reason: Any) -> None:
    """No lease holder: the counter bump itself is the guard, and a refusal writes nothing."""
    db.create_session("p", "cli")
    db.append_message("p", "user", "before")
    if end_reason is not None:
        db.end_session("p", end_reason)
    if end_reason == "compression":
        with pytest.raises(CompressionSessionClosedError) as info:
            db.append_message("p", "assistant", "late", tool_calls=CALLS)
        assert info.value.session_id == "p"
        assert [m["content"] for m in stored(db, "p")] == ["before"]
        row = db.get_session("p")
        assert (row["message_count"], row["tool_call_count"]) == (1, 0)
    else:
        db.append_message("p", "assistant", "after", tool_calls=CALLS)
        assert [m["content"] for m in stored(db, "p")] == ["before", "after"]
        assert db.get_session("p")["tool_call_count"] == 1


def test_a_plain_append_to_a_missing_session_is_still_unknown(db: Any) -> None:
    with pytest.raises(sqlite3.IntegrityError) as info:
        db.append_message("nobody", "user", "hi")
    assert type(info.value).__name__ == "UnknownSessionError"
    assert db.get_session("nobody") is None


def test_append_message_ignores_the_compression_lock_holder(db: Any) -> None:
    db.create_session("s", "cli")
    assert db.try_acquire_compression_lock("s", "compressor", 300)
    db.append_message("s", "user", "hi", compression_lock_holder="not the holder")
    assert [m["content"] for m in stored(db)] == ["hi"]


# ----------------------------------------------------------------- replace / compact


def _turns(db: Any, n: int = 4) -> list[int]:
    db.create_session("s", "cli")
    return [db.append_message("s", "user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(n)]


def test_replace_messages_archive_dropped_keeps_the_live_rows_inactive(db: Any) -> None:
    ids = _turns(db)
    db.rewind_to_message("s", ids[2])  # m2, m3 already inactive
    db.replace_messages("s", [{"role": "user", "content": "fresh"}], archive_dropped=True)
    assert [(m["content"], m["active"]) for m in stored(db)] == [
        ("m0", 0), ("m1", 0), ("m2", 0), ("m3", 0), ("fresh", 1)]
    assert db.get_session("s")["message_count"] == 1
    db.replace_messages("s", [{"role": "user", "content": "again"}])  # default still deletes
    assert [m["content"] for m in stored(db)] == ["again"]


def test_replace_messages_refuses_a_session_closed_by_compression(db: Any) -> None:
    _turns(db, 2)
    db.end_session("s", "compression")
    with pytest.raises(CompressionSessionClosedError):
        db.replace_messages("s", [{"role": "user", "content": "lost"}])
    assert [m["content"] for m in stored(db)] == ["m0", "m1"]


def test_archive_and_compact_checks_the_compression_lease(db: Any, clock: Any) -> None:
    _turns(db, 2)
    summary = [{"role": "user", "content": "summary"}]
    with pytest.raises(SessionCompressionInProgressError):
        db.archive_and_compact("s", summary, lock_holder="me")  # no lease at all
    assert db.try_acquire_compression_lock("s", "other", 60)
    with pytest.raises(SessionCompressionInProgressError):
        db.archive_and_compact("s", summary, lock_holder="me", model_config_patch={"k": 1})
    assert [m["active"] for m in stored(db)] == [1, 1]
    assert db.get_session("s")["model_config"] in (None, "")
    db.release_compression_lock("s", "other")
    assert db.try_acquire_compression_lock("s", "me", 60)
    assert db.archive_and_compact("s", summary, lock_holder="me") == 1
    clock.now += 120  # the lease expired: refused again
    with pytest.raises(SessionCompressionInProgressError):
        db.archive_and_compact("s", summary, lock_holder="me")


def test_archive_and_compact_merges_the_model_config_patch(db: Any) -> None:
    db.create_session("s", "cli", model_config={"keep": 1, "drop": 2})
    db.append_message("s", "user", "m0")
    db.archive_and_compact("s", [{"role": "user", "content": "sum"}],
                           model_config_patch={"drop": None, "added": "x"})
    assert json.loads(db.get_session("s")["model_config"]) == {"keep": 1, "added": "x"}
    with pytest.raises(ValueError, match="Session not found"):
        db.archive_and_compact("missing", [], model_config_patch={"a": 1})


def test_archive_and_compact_with_a_watermark_keeps_the_tail(db: Any) -> None:
    ids = _turns(db, 2)
    mark = db.get_active_message_watermark("s")
    assert mark == ids[-1]
    db.append_message("s", "user", "late question")  # arrived while the summary was written
    db.append_message("s", "assistant", None, tool_calls=CALLS, display_kind="tool")
    n = db.archive_and_compact("s", [{"role": "user", "content": "summary"}], watermark=mark)
    assert n == 3
    rows = stored(db)
    assert [(m["content"], m["active"], m["compacted"]) for m in rows] == [
        ("m0", 0, 1), ("m1", 0, 1), ("late question", 0, 1), (None, 0, 1),
        ("summary", 1, 0), ("late question", 1, 0), (None, 1, 0)]
    clone, original = rows[-1], rows[3]
    assert clone["id"] > rows[-3]["id"]
    for key in ("role", "tool_calls", "timestamp", "display_kind", "session_id"):
        assert clone[key] == original[key]
    session = db.get_session("s")
    assert (session["message_count"], session["tool_call_count"]) == (3, 1)
    assert db.get_active_message_watermark("s") == clone["id"]
    # include_compacted: the archived original and its live clone are one message
    merged = db.get_messages("s", include_compacted=True)
    assert [(m["content"], m["active"]) for m in merged] == [
        ("m0", 0), ("m1", 0), ("summary", 1), ("late question", 1), (None, 1)]


def test_active_watermark_of_an_empty_or_unknown_session_is_zero(db: Any) -> None:
    db.create_session("s", "cli")
    assert db.get_active_message_watermark("s") == 0
    assert db.get_active_message_watermark("missing") == 0


# ----------------------------------------------------------------- get_messages modes


def test_get_messages_latest_pages_back_from_the_newest(db: Any) -> None:
    ids = _turns(db, 6)
    def got(**kw):
        return [m["id"] for m in db.get_messages("s", **kw)]
    assert got(latest=True, limit=2) == ids[4:]
    assert got(latest=True, limit=2, offset=2) == ids[2:4]
    assert got(latest=True) == ids


def test_get_messages_after_id(db: Any) -> None:
    ids = _turns(db, 4)
    assert [m["id"] for m in db.get_messages("s", after_id=ids[1])] == ids[2:]
    assert [m["id"] for m in db.get_messages("s", after_id=ids[1], limit=1)] == [ids[2]]
    assert db.get_messages("s", after_id=ids[-1]) == []
    for bad in ({"latest": True}, {"offset": 1}, {"include_compacted": True}):
        with pytest.raises(ValueError):
            db.get_messages("s", after_id=ids[0], **bad)


def test_include_inactive_wins_over_include_compacted(db: Any) -> None:
    ids = _turns(db, 4)
    db.rewind_to_message("s", ids[2])  # rewound, not compacted
    assert [m["id"] for m in db.get_messages("s", include_compacted=True)] == ids[:2]
    assert [m["id"] for m in db.get_messages("s", include_inactive=True, include_compacted=True)] == ids


def test_include_compacted_pages_after_the_dedupe(db: Any) -> None:
    _turns(db, 2)
    mark = db.get_active_message_watermark("s")
    db.append_message("s", "user", "tail")
    db.archive_and_compact("s", [{"role": "user", "content": "sum"}], watermark=mark)
    page = db.get_messages("s", include_compacted=True, limit=2, offset=2)
    assert [(m["content"], m["active"]) for m in page] == [("sum", 1), ("tail", 1)]


# ----------------------------------------------------------------- conversations


def test_conversation_row_ids_and_display_fields(db: Any) -> None:
    db.create_session("s", "cli")
    a = db.append_message("s", "user", "q")
    b = db.append_message("s", "assistant", "shown", display_kind="status", display_metadata={"n": 1})
    plain = db.get_messages_as_conversation("s")
    assert all("_row_id" not in m for m in plain)
    assert "display_kind" not in plain[0] and "display_metadata" not in plain[0]
    assert (plain[1]["display_kind"], plain[1]["display_metadata"]) == ("status", {"n": 1})
    with_ids = db.get_messages_as_conversation("s", include_row_ids=True)
    assert [m["_row_id"] for m in with_ids] == [a, b]


def test_conversation_blanks_stale_tool_call_markers(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "q")
    db.append_message("s", "assistant", " [web_search] ", tool_calls=CALLS)
    db.append_message("s", "tool", "result", tool_call_id="c1")
    db.append_message("s", "assistant", "[not a marker]", tool_calls=CALLS)
    db.append_message("s", "assistant", "[web_search]")  # no tool calls: a real reply
    conv = db.get_messages_as_conversation("s")
    assert [m["content"] for m in conv] == ["q", "", "result", "[not a marker]", "[web_search]"]
    assert db.get_resume_conversations("s")[1][1]["content"] == ""
    assert stored(db)[1]["content"] == " [web_search] "  # the row itself is untouched


def _branch(db: Any) -> None:
    db.create_session("root", "cli")
    db.append_message("root", "user", "hello")
    db.append_message("root", "assistant", "hi")
    db.create_session("b", "cli", parent_session_id="root", model_config={"_branched_from": "root"})
    db.append_message("b", "user", "branched question")


def test_a_branch_replays_only_its_own_rows(db: Any) -> None:
    _branch(db)
    own = [("user", "branched question")]
    def pairs(conv):
        return [(m["role"], m["content"]) for m in conv]
    assert pairs(db.get_messages_as_conversation("b", include_ancestors=True)) == own
    model, display = db.get_resume_conversations("b")
    assert pairs(model) == own and pairs(display) == own
    assert db.get_ancestor_display_prefix("b") == []


def test_resume_conversations_carry_row_ids(db: Any) -> None:
    db.create_session("p", "cli")
    first = db.append_message("p", "user", "one")
    db.end_session("p", "compression")
    db.create_session("c", "cli", parent_session_id="p")
    second = db.append_message("c", "assistant", "two")
    model, display = db.get_resume_conversations("c")
    assert [m["_row_id"] for m in model] == [second]
    assert [m["_row_id"] for m in display] == [first, second]
    assert [m["content"] for m in db.get_ancestor_display_prefix("c")] == ["one"]


def test_transcript_filter_functions() -> None:
    """§3: the module-level filter (re-exported by hermes_state through the module's __all__)."""
    is_marker = messages_module._is_stale_tool_call_marker_message
    assert "_strip_stale_tool_call_markers" in messages_module.__all__
    assert is_marker({"role": "assistant", "content": "[a_b.c-1]", "tool_calls": CALLS})
    for msg in ({"role": "assistant", "content": "[1abc]", "tool_calls": CALLS},
                {"role": "assistant", "content": "[a] b", "tool_calls": CALLS},
                {"role": "assistant", "content": "[abc]", "tool_calls": []},
                {"role": "user", "content": "[abc]", "tool_calls": CALLS},
                {"role": "assistant", "content": ["[abc]"], "tool_calls": CALLS}, "not a dict"):
        assert not is_marker(msg)
    msgs = [{"role": "assistant", "content": "\n[tool]\n", "tool_calls": CALLS}, {"role": "user", "content": "[x]"}]
    messages_module._strip_stale_tool_call_markers(msgs)
    assert [m["content"] for m in msgs] == ["", "[x]"]


def test_unknown_session_still_raises_integrity_error_with_a_lease(db: Any, clock: Any) -> None:
    put_lease(db, "ghost", "me", clock.now + 100)
    with pytest.raises(sqlite3.IntegrityError):
        db.append_message("ghost", "user", "hi", turn_lease_holder="me")
