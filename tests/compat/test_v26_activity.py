"""Hermes v26 activity, lineage-wide flags and lifecycle statuses through ``hermes_state`` (§2.A, §3).

touch/clear/get of the activity triple, pinned/hidden/read over the archive lineage,
session_unread, session_lifecycle_statuses and the module-level names behind them.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest
from sqlalchemy import event

pytestmark = pytest.mark.both_backends


def row(db, sid: str) -> dict[str, Any]:
    found = db.get_session(sid)
    assert found is not None, sid
    return found


def triple(db, sid: str) -> tuple:
    got = row(db, sid)
    return got["last_activity_at"], got["last_activity_description"], got["last_activity_provenance"]


class Updates:
    """Counts UPDATE statements on sessions sent through the store's engine."""

    def __init__(self, db) -> None:
        self.engine = db.engine
        self.seen: list[str] = []

    def __enter__(self) -> Updates:
        event.listen(self.engine, "before_cursor_execute", self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        event.remove(self.engine, "before_cursor_execute", self._hook)

    def _hook(self, conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "SESSIONS" in statement.upper().split("SET")[0]:
            self.seen.append(statement)


# ---------------------------------------------------------------------- module names


def test_module_level_names(hermes_state) -> None:
    assert (hermes_state.SESSION_STATUS_COMPLETE, hermes_state.SESSION_STATUS_INTERRUPTED,
            hermes_state.SESSION_STATUS_ERROR, hermes_state.SESSION_STATUS_EMPTY) == \
        ("complete", "interrupted", "error", "empty")
    assert set(hermes_state._RESET_END_REASONS) == {
        "session_reset", "session_switch", "idle", "daily", "suspended", "resume_pending_expired"}
    assert set(hermes_state._BARE_BILLING_PROVIDERS) == {"auto", "custom"}


@pytest.mark.parametrize(("role", "calls", "finish", "expected"), [
    ("assistant", False, "stop", "complete"),
    ("assistant", True, "tool_calls", "interrupted"),
    ("assistant", False, None, "complete"),
    ("user", False, None, "interrupted"),
    ("tool", False, None, "interrupted"),
    ("assistant", True, "error", "error"),
    ("user", False, "agent_error", "error"),
    ("assistant", False, "content_filter", "error"),
    ("system", False, None, "complete"),
    (None, False, None, "complete"),
])
def test_classify_session_status(hermes_state, role, calls, finish, expected) -> None:
    assert hermes_state.classify_session_status(role, calls, finish) == expected


# ---------------------------------------------------------------------- touch / clear / get


def test_touch_sets_the_triple_at_now_by_default(db, clock) -> None:
    db.create_session("s", "cli")
    assert db.touch_session_activity("s", description="  running tests \n", provenance="agent.compression") is None
    assert triple(db, "s") == (clock.now, "running tests", "agent.compression")
    db.touch_session_activity("s", clock.now + 10)
    assert triple(db, "s") == (clock.now + 10, "", "unknown")


def test_touch_bounds_the_description(db) -> None:
    db.create_session("s", "cli")
    db.touch_session_activity("s", 1.0, description="x" * 120)
    assert triple(db, "s")[1] == "x" * 120
    db.touch_session_activity("s", 2.0, description="y" * 121)
    assert triple(db, "s")[1] == "y" * 119 + "\u2026"
    db.touch_session_activity("s", 3.0, description="  " + "z" * 119 + "  ")
    assert triple(db, "s")[1] == "z" * 119


# Hermes' own shape, (str, Enum), kept on purpose: str() of a member is
# "Provenance.COMPRESSION_TIMEOUT", not the value as with StrEnum; the store must read the value.
class Provenance(str, enum.Enum):  # noqa: UP042
    COMPRESSION_TIMEOUT = "agent.compression_timeout"


@pytest.mark.parametrize(("given", "stored"), [
    ("agent.compression_cooldown", "agent.compression_cooldown"),
    (Provenance.COMPRESSION_TIMEOUT, "agent.compression_timeout"),
    ("something.else", "unknown"),
    (None, "unknown"),
    (42, "unknown"),
])
def test_touch_records_known_provenances_only(db, given, stored) -> None:
    db.create_session("s", "cli")
    db.touch_session_activity("s", 5.0, provenance=given)
    assert triple(db, "s")[2] == stored


def test_touch_never_moves_the_stamp_back(db) -> None:
    db.create_session("s", "cli")
    db.touch_session_activity("s", 100.0, description="newest", provenance="agent.compression")
    db.touch_session_activity("s", 50.0, description="older")
    db.touch_session_activity("s", 100.0, description="same time")
    assert triple(db, "s") == (100.0, "newest", "agent.compression")


def test_touch_of_an_unknown_or_falsy_id_writes_nothing(db) -> None:
    db.touch_session_activity("ghost", 1.0, description="x")
    db.touch_session_activity("", 1.0)
    assert db.get_session("ghost") is None
    with pytest.raises(TypeError):
        db.touch_session_activity("s", 1.0, "positional description")  # type: ignore[misc]


def test_touch_refuses_a_time_that_is_not_a_number(db) -> None:
    db.create_session("s", "cli")
    with pytest.raises(ValueError):
        db.touch_session_activity("s", "soon")
    assert triple(db, "s") == (None, None, None)


def test_clear_labels_keeps_the_time_and_skips_clean_rows(db) -> None:
    db.create_session("s", "cli")
    db.touch_session_activity("s", 10.0, description="compressing", provenance="agent.compression")
    with Updates(db) as updates:
        db.clear_session_activity_labels("s")
    assert len(updates.seen) == 1  # the counter sees the store's updates
    assert triple(db, "s") == (10.0, "", "unknown")
    with Updates(db) as updates:
        db.clear_session_activity_labels("s")
    assert updates.seen == []
    db.create_session("never", "cli")
    with Updates(db) as updates:
        db.clear_session_activity_labels("never")
    assert updates.seen == [] and triple(db, "never") == (None, None, None)
    db.clear_session_activity_labels("ghost")
    assert db.get_session("ghost") is None


def test_get_session_activity(db, clock) -> None:
    assert db.get_session_activity("ghost") is None
    db.create_session("s", "cli")
    bare = db.get_session_activity("s")
    assert bare == {
        "last_activity_at": None, "last_activity_description": None, "last_activity_provenance": None,
        "seconds_since_activity": None, "last_activity_ts": None, "last_activity_desc": None,
        "description": None, "provenance": None,
    }
    db.touch_session_activity("s", clock.now - 30, description="tool call", provenance="agent.compression")
    got = db.get_session_activity("s")
    assert got == {
        "last_activity_at": clock.now - 30, "last_activity_description": "tool call",
        "last_activity_provenance": "agent.compression", "seconds_since_activity": pytest.approx(30.0),
        "last_activity_ts": clock.now - 30, "last_activity_desc": "tool call",
        "description": "tool call", "provenance": "agent.compression",
    }


# ---------------------------------------------------------------------- lineage-wide flags


def _lineage(db) -> None:
    """root → mid → tip by compression, a delegate of mid, a branch of root, and strangers."""
    db.create_session("root", "cli")
    db.create_session("mid", "cli", parent_session_id="root")
    db.create_session("delegate", "tool", parent_session_id="mid")
    db.create_session("tip", "cli", parent_session_id="mid")
    db.end_session("root", "compression")
    db.end_session("mid", "compression")
    db.create_session("live_parent", "cli")
    db.create_session("live_child", "tool", parent_session_id="live_parent")
    db.create_session("stranger", "cli")


def flagged(db, column: str) -> set[str]:
    ids = ("root", "mid", "delegate", "tip", "live_parent", "live_child", "stranger")
    return {sid for sid in ids if row(db, sid)[column]}


@pytest.mark.parametrize("start", ["root", "mid", "tip", "delegate"])
def test_flags_cover_the_archive_row_set(db, start: str) -> None:
    _lineage(db)
    assert db.set_session_archived(start, True) is True
    archived = flagged(db, "archived")
    assert {"root", "mid", "tip"} <= archived and "stranger" not in archived
    assert db.set_session_pinned(start, True) is True
    assert db.set_session_hidden(start, True) is True
    assert db.set_session_read(start) is True
    assert flagged(db, "pinned") == flagged(db, "hidden") == flagged(db, "last_read_at") == archived


def test_flags_are_cleared_the_same_way(db, clock) -> None:
    _lineage(db)
    for sid in ("tip", "stranger"):
        db.set_session_pinned(sid, True)
        db.set_session_hidden(sid, True)
        db.set_session_read(sid)
    assert row(db, "root")["last_read_at"] == clock.now
    assert db.set_session_pinned("root", False) is True
    assert db.set_session_hidden("root", False) is True
    assert db.set_session_read("root", False) is True
    assert flagged(db, "pinned") == flagged(db, "hidden") == {"stranger"}
    assert row(db, "tip")["last_read_at"] == 0.0 and row(db, "stranger")["last_read_at"] == clock.now


def test_a_live_parent_takes_no_children_along(db) -> None:
    _lineage(db)
    assert db.set_session_pinned("live_parent", True) is True
    assert flagged(db, "pinned") == {"live_parent"}


@pytest.mark.parametrize("sid", ["ghost", "", None])
def test_flags_of_an_unknown_or_falsy_id_are_false(db, sid) -> None:
    assert db.set_session_pinned(sid, True) is False
    assert db.set_session_hidden(sid, True) is False
    assert db.set_session_read(sid) is False


@pytest.mark.parametrize(("session_row", "unread"), [
    ({"last_read_at": None, "last_active": 100.0, "started_at": 1.0}, False),
    ({"last_read_at": 50.0, "last_active": 100.0, "started_at": 1.0}, True),
    ({"last_read_at": 100.0, "last_active": 100.0, "started_at": 1.0}, False),
    ({"last_read_at": 50.0, "started_at": 60.0}, True),
    ({"last_read_at": 50.0, "last_active": None, "started_at": 40.0}, False),
    ({"last_read_at": 0.0, "started_at": 1.0}, True),
])
def test_session_unread(hermes_state, session_row, unread) -> None:
    assert hermes_state.SessionDB.session_unread(session_row) is unread


def test_read_state_of_stored_rows(db, clock) -> None:
    db.create_session("s", "cli")
    assert db.session_unread(row(db, "s")) is False  # never read
    db.set_session_read("s", False)
    assert db.session_unread(row(db, "s")) is True
    db.set_session_read("s")
    assert db.session_unread(row(db, "s")) is False
    assert db.session_unread({**row(db, "s"), "last_active": clock.now + 1}) is True


# ---------------------------------------------------------------------- lifecycle statuses (v26)


def test_session_lifecycle_statuses(db) -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}]
    db.create_session("empty", "cli")
    db.create_session("done", "cli")
    db.append_message("done", "user", "hi")
    db.append_message("done", "assistant", "hello", finish_reason="stop")
    db.create_session("asked_tools", "cli")
    db.append_message("asked_tools", "user", "run it")
    db.append_message("asked_tools", "assistant", None, tool_calls=calls, finish_reason="tool_calls")
    db.create_session("tool_last", "cli")
    db.append_message("tool_last", "assistant", None, tool_calls=calls)
    db.append_message("tool_last", "tool", "output", tool_call_id="c1")
    db.create_session("user_last", "cli")
    db.append_message("user_last", "user", "anyone?")
    db.create_session("failed", "cli")
    db.append_message("failed", "assistant", "partial", finish_reason="error")
    db.create_session("empty_calls", "cli")
    db.append_message("empty_calls", "assistant", "done", tool_calls=[])
    ids = ["empty", "done", "asked_tools", "tool_last", "user_last", "failed", "empty_calls", "ghost"]
    assert db.session_lifecycle_statuses(ids) == {
        "empty": "empty", "done": "complete", "asked_tools": "interrupted", "tool_last": "interrupted",
        "user_last": "interrupted", "failed": "error", "empty_calls": "complete", "ghost": "empty",
    }
    assert db.session_lifecycle_statuses([]) == {}
    assert db.session_lifecycle_statuses(["done", "done"]) == {"done": "complete"}


def test_lifecycle_reads_the_newest_live_row(db) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "assistant", "answer")
    tail = db.append_message("s", "user", "rewound question")
    assert db.session_lifecycle_statuses(["s"]) == {"s": "interrupted"}
    db._execute_write(lambda c: c.execute(f"UPDATE messages SET active = 0 WHERE id = {int(tail)}"))
    assert db.session_lifecycle_statuses(["s"]) == {"s": "complete"}
