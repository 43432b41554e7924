"""Hermes v26 ``append_messages_batch`` and the shared row inserter (v26 reference §2.B):
one transaction, guards once, rows identical to single appends, all or nothing,
``chunk_rows``, ``msg["_row_id"]``, and ``_insert_message_rows`` reached through self.

Through the swapped ``hermes_state`` module, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import inspect
import json
import sqlite3
from typing import Any

import pytest
from sqlalchemy import insert

from hermes_store.errors import CompressionSessionClosedError, SessionTurnLeaseLostError
from hermes_store.repositories.turn_leases import LEASES

pytestmark = pytest.mark.both_backends

CALLS = [{"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": "{}"}},
         {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]


def stored(db: Any, sid: str = "s") -> list[dict[str, Any]]:
    return db.get_messages(sid, include_inactive=True)


def put_lease(db: Any, key: str, holder: str, expires_at: float) -> None:
    db._write(lambda c: c.execute(insert(LEASES).values(
        conversation_id=key, holder=holder, acquired_at=0.0, expires_at=expires_at)))


def test_signature_is_hermes(hermes_state: Any) -> None:
    found = inspect.signature(hermes_state.SessionDB.append_messages_batch).parameters
    assert [(p.name, p.default) for p in list(found.values())[1:]] == [
        ("session_id", inspect.Parameter.empty), ("messages", inspect.Parameter.empty),
        ("compression_lock_holder", None), ("turn_lease_holder", None), ("chunk_rows", None),
        ("turn_lease_ttl_seconds", 300.0)]


def test_an_empty_batch_writes_nothing(db: Any) -> None:
    assert db.append_messages_batch("missing", []) == 0  # not even the session is checked
    db.create_session("s", "cli")
    assert db.append_messages_batch("s", []) == 0
    assert db.get_session("s")["message_count"] == 0


#: One turn of each kind, with every key a batch honours.
TURNS = [
    {"role": "user", "content": "q", "platform_message_id": "tg-1", "observed": True, "api_content": "raw q",
     "effect_disposition": "sent", "token_count": 5, "display_kind": "note", "display_metadata": {"n": 1},
     "timestamp": 1000.0},
    {"role": "assistant", "content": None, "tool_calls": CALLS, "finish_reason": "tool_calls",
     "reasoning": "why", "reasoning_content": "", "reasoning_details": [{"k": 1}],
     "codex_reasoning_items": [{"r": 1}], "codex_message_items": [{"m": 1}], "timestamp": 1001.0},
    {"role": "tool", "content": "r1", "tool_call_id": "c1", "tool_name": "web_search", "timestamp": 1002.0},
    {"role": "assistant", "content": "done", "display_metadata": '{"raw": true}', "timestamp": 1003.0},
]


#: Where a row is, not what it holds (v30's display order counts across sessions).
_PLACE = ("id", "session_id", "display_order", "display_identity")


def _comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in _PLACE} for r in rows]


def test_rows_are_identical_to_single_appends(db: Any) -> None:
    db.create_session("single", "cli")
    db.create_session("s", "cli")
    for turn in TURNS:
        db.append_message("single", **{k: v for k, v in turn.items()})
    assert db.append_messages_batch("s", [dict(t) for t in TURNS]) == len(TURNS)
    assert _comparable(stored(db)) == _comparable(stored(db, "single"))
    batch, single = db.get_session("s"), db.get_session("single")
    assert (batch["message_count"], batch["tool_call_count"]) == (single["message_count"], single["tool_call_count"])
    assert (batch["message_count"], batch["tool_call_count"]) == (4, 2)


def test_json_text_tool_calls_are_parsed_and_reasoning_kept_for_assistants_only(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_messages_batch("s", [
        {"role": "assistant", "content": None, "tool_calls": json.dumps(CALLS)},
        {"role": "user", "content": "u", "reasoning": "dropped", "reasoning_details": [{"x": 1}]},
    ])
    asst, user = stored(db)
    assert asst["tool_calls"] == CALLS
    assert (user["reasoning"], user["reasoning_details"]) == (None, None)
    assert db.get_session("s")["tool_call_count"] == 2


def test_each_input_dict_gets_its_row_id(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "before")
    msgs = [{"role": "user", "content": f"m{i}"} for i in range(3)]
    db.append_messages_batch("s", msgs)
    rows = stored(db)
    assert [m["_row_id"] for m in msgs] == [r["id"] for r in rows[1:]]
    assert [r["content"] for r in rows] == ["before", "m0", "m1", "m2"]


def test_a_bad_message_leaves_nothing(db: Any) -> None:
    db.create_session("s", "cli")
    with pytest.raises(ValueError):
        db.append_messages_batch("s", [{"role": "user", "content": "ok"}, "not a dict"])
    assert stored(db) == [] and db.get_session("s")["message_count"] == 0


def test_a_failure_after_the_rows_rolls_them_back(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hermes' tests wrap ``_insert_message_rows`` through self: the write is all or nothing."""
    db.create_session("s", "cli")
    real = db._insert_message_rows
    calls: list[int] = []

    def boom(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        calls.append(1)
        raise RuntimeError("boom")

    monkeypatch.setattr(db, "_insert_message_rows", boom)
    with pytest.raises(RuntimeError, match="boom"):
        db.append_messages_batch("s", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])
    assert calls == [1]
    assert stored(db) == [] and db.get_session("s")["message_count"] == 0


def test_chunk_rows_commits_one_transaction_per_chunk(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    db.create_session("s", "cli")
    real = db._insert_message_rows
    chunks: list[int] = []

    def spy(conn: Any, session_id: str, messages: list[dict[str, Any]]) -> Any:
        chunks.append(len(messages))
        if len(chunks) == 3:
            raise RuntimeError("third chunk fails")
        return real(conn, session_id, messages)

    monkeypatch.setattr(db, "_insert_message_rows", spy)
    msgs = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    assert db.append_messages_batch("s", msgs[:4], chunk_rows=2) == 4
    assert chunks == [2, 2]
    with pytest.raises(RuntimeError):
        db.append_messages_batch("s", msgs, chunk_rows=10)  # one chunk: the whole batch
    assert chunks == [2, 2, 5]
    chunks.clear()
    with pytest.raises(RuntimeError):
        db.append_messages_batch("s", msgs, chunk_rows=2)  # the first two chunks stay
    assert [m["content"] for m in stored(db)] == ["m0", "m1", "m2", "m3", "m0", "m1", "m2", "m3"]
    assert db.get_session("s")["message_count"] == 8


def test_guards_run_once_for_the_batch(db: Any, clock: Any) -> None:
    db.create_session("s", "cli")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(SessionTurnLeaseLostError):
        db.append_messages_batch("s", msgs, turn_lease_holder="me")
    put_lease(db, "s", "me", clock.now - 5)  # expired, still ours: renewed
    assert db.append_messages_batch("s", msgs, turn_lease_holder="me", turn_lease_ttl_seconds=30) == 2
    with pytest.raises(SessionTurnLeaseLostError):
        db.append_messages_batch("s", msgs, turn_lease_holder="other")
    assert db.append_messages_batch("s", msgs, compression_lock_holder="ignored") == 2
    db.end_session("s", "compression")
    with pytest.raises(CompressionSessionClosedError):
        db.append_messages_batch("s", msgs)
    assert len(stored(db)) == 4


def test_unknown_session_is_an_integrity_error(db: Any) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        db.append_messages_batch("missing", [{"role": "user", "content": "x"}])
    assert db.message_count() == 0
