"""Hermes v23 messages (reference §1.B, §2): append, read, replace, conversations, windows.

Everything goes through the swapped ``hermes_state`` module, on SQLite and PostgreSQL.
Rewind/restore and archive-and-compact are in test_rewind_archive.py.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import sqlite3
import time
from typing import Any

import pytest

from hermes_store.errors import HermesStoreError

pytestmark = pytest.mark.both_backends

CALLS = [
    {"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": "{}"}},
    {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
]
HARNESS_MEMORY = "Review the conversation above and consider saving to memory if appropriate."
HARNESS_SKILL = "Review the conversation above and decide whether a skill should be saved."
_EMPTY = inspect.Parameter.empty


class Clock:
    """A stand-in for ``hermes_state.time``: ``time()`` is ours, the rest is real."""

    def __init__(self, t: float) -> None:
        self.t = t

    def time(self) -> float:
        return self.t

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(hermes_state: Any, monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Hermes' tests patch ``hermes_state.time``; every timestamp we write follows it."""
    fake = Clock(1_700_000_000.0)
    monkeypatch.setattr(hermes_state, "time", fake)
    return fake


def params(fn: Any) -> list[tuple[str, Any]]:
    """Hermes' parameters (name, default); ours may only follow as keyword-only ones."""
    found = list(inspect.signature(fn).parameters.values())
    hermes = [p for p in found if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not _EMPTY
               for p in found[len(hermes):]), fn
    return [(p.name, p.default) for p in hermes]


def stored(db: Any, sid: str = "s") -> list[dict[str, Any]]:
    return db.get_messages(sid, include_inactive=True)


# ----------------------------------------------------------------- signatures


def test_signatures_match_v23(hermes_state: Any) -> None:
    S = hermes_state.SessionDB
    # v23's parameters stay a prefix, in order and with their defaults; v26 appends
    # more (test_signatures_v26.py checks the exact v26 signature).
    v23_append = [
        ("self", _EMPTY), ("session_id", _EMPTY), ("role", _EMPTY), ("content", None), ("tool_name", None),
        ("tool_calls", None), ("tool_call_id", None), ("token_count", None), ("finish_reason", None),
        ("reasoning", None), ("reasoning_content", None), ("reasoning_details", None),
        ("codex_reasoning_items", None), ("codex_message_items", None), ("platform_message_id", None),
        ("observed", False), ("effect_disposition", None), ("timestamp", None), ("api_content", None),
    ]
    assert params(S.append_message)[:len(v23_append)] == v23_append
    assert "active" not in inspect.signature(S.append_message).parameters
    assert params(S.replace_messages)[:4] == [("self", _EMPTY), ("session_id", _EMPTY), ("messages", _EMPTY),
                                              ("active_only", False)]
    # v26 re-signed these two (include_compacted before limit; include_row_ids appended):
    # every v23 parameter is still there with its default, and v26's order is checked
    # exactly by test_signatures_v26.py.
    assert {("include_inactive", False), ("limit", None), ("offset", 0)} <= set(params(S.get_messages))
    assert {("include_ancestors", False), ("include_inactive", False), ("repair_alternation", False)} <= set(
        params(S.get_messages_as_conversation))
    assert params(S.get_resume_conversations) == [("self", _EMPTY), ("session_id", _EMPTY)]
    assert params(S.get_ancestor_display_prefix) == [("self", _EMPTY), ("session_id", _EMPTY)]
    assert params(S.has_platform_message_id) == [("self", _EMPTY), ("session_id", _EMPTY),
                                                 ("platform_message_id", _EMPTY)]
    assert params(S.set_latest_user_api_content) == [("self", _EMPTY), ("session_id", _EMPTY),
                                                     ("content", _EMPTY), ("api_content", _EMPTY)]
    assert params(S.list_recent_user_messages) == [("self", _EMPTY), ("session_id", _EMPTY), ("limit", 20),
                                                   ("include_inactive", False)]
    assert params(S.get_messages_around) == [("self", _EMPTY), ("session_id", _EMPTY),
                                             ("around_message_id", _EMPTY), ("window", 5)]
    assert params(S.message_count) == [("self", _EMPTY), ("session_id", None)]
    assert params(S.clear_messages) == [("self", _EMPTY), ("session_id", _EMPTY)]


# ----------------------------------------------------------------- append_message


def test_append_stores_v23_fields_live(db: Any) -> None:
    db.create_session("s", "cli")
    mid = db.append_message("s", "user", "hi", platform_message_id="tg-1", observed=True,
                            effect_disposition="delivered", api_content="hi (raw)")
    row = stored(db)[0]
    assert row["id"] == mid
    assert (row["platform_message_id"], row["observed"], row["effect_disposition"], row["api_content"]) == (
        "tg-1", 1, "delivered", "hi (raw)")
    assert (row["active"], row["compacted"]) == (1, 0)
    plain = db.append_message("s", "assistant", "ok")
    assert plain > mid
    row = stored(db)[1]
    assert (row["observed"], row["platform_message_id"], row["api_content"], row["effect_disposition"]) == (
        0, None, None, None)


def test_append_observed_is_stored_as_0_or_1(db: Any) -> None:
    db.create_session("s", "cli")
    for value in (True, "yes", 7, False, 0, None, ""):
        db.append_message("s", "user", "x", observed=value)
    assert [m["observed"] for m in stored(db)] == [1, 1, 1, 0, 0, 0, 0]


def test_api_content_only_when_str_and_scrubbed(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "a", api_content={"not": "text"})
    db.append_message("s", "user", "b", api_content=b"bytes are not str")
    db.append_message("s", "user", "c", api_content="bad\ud800half")
    db.append_message("s", "user", "d", api_content="")
    assert [m["api_content"] for m in stored(db)] == [None, None, "bad\ufffdhalf", ""]


def test_lone_surrogates_are_scrubbed_in_text_fields(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "assistant", "c\ud800", tool_name="t\udfff", reasoning="r\ud800",
                      reasoning_content="rc\ud800")
    row = stored(db)[0]
    assert (row["content"], row["tool_name"], row["reasoning"], row["reasoning_content"]) == (
        "c\ufffd", "t\ufffd", "r\ufffd", "rc\ufffd")


@pytest.mark.parametrize(
    ("tool_calls", "expected_stored", "calls"),
    [
        (CALLS, CALLS, 2),
        (json.dumps(CALLS), CALLS, 2),  # v23: JSON text is parsed first
        ("[]", None, 0),
        ([], None, 0),
        ("{not json", [], 0),  # unparsable: the text is kept (Hermes stores NULL), read as [], counting 0
        ({"id": "solo"}, {"id": "solo"}, 1),  # any other non-None value counts 1
        ('{"id": "solo"}', {"id": "solo"}, 1),
        (None, None, 0),
    ],
)
def test_tool_calls_storage_and_counter(db: Any, tool_calls: Any, expected_stored: Any, calls: int) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "assistant", "calling", tool_calls=tool_calls)
    assert stored(db)[0]["tool_calls"] == expected_stored
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (1, calls)


def test_counters_follow_the_v23_rule(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "q")
    db.append_message("s", "assistant", None, tool_calls=CALLS)
    db.append_message("s", "tool", "r1", tool_call_id="c1", tool_name="web_search")  # adds nothing
    db.append_message("s", "tool", "r2", tool_call_id="c2", tool_name="read_file")
    db.append_message("s", "assistant", "done", tool_calls={"odd": "shape"})
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (5, 3)


def test_reasoning_fields_are_json_encoded_when_truthy(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "assistant", "a", reasoning_details=[{"type": "summary", "text": "t"}],
                      codex_reasoning_items=[{"id": "r1"}], codex_message_items={"id": "m1"})
    db.append_message("s", "assistant", "b", reasoning_details=[], codex_reasoning_items={},
                      codex_message_items="")
    first, second = stored(db)
    assert json.loads(first["reasoning_details"]) == [{"type": "summary", "text": "t"}]  # raw JSON text
    assert json.loads(first["codex_reasoning_items"]) == [{"id": "r1"}]
    assert json.loads(first["codex_message_items"]) == {"id": "m1"}
    assert (second["reasoning_details"], second["codex_reasoning_items"], second["codex_message_items"]) == (
        None, None, None)


@pytest.mark.parametrize(
    "given",
    [1_650_000_000.25, 1_650_000_000, dt.datetime(2022, 4, 15, 5, 20, tzinfo=dt.UTC), "1650000000.25"],
)
def test_explicit_timestamp(db: Any, given: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "x", timestamp=given)
    expected = given.timestamp() if isinstance(given, dt.datetime) else float(given)
    assert stored(db)[0]["timestamp"] == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["yesterday", object(), float("nan"), float("inf"), [1, 2]])
def test_unconvertible_timestamp_falls_back_to_the_clock(db: Any, clock: Clock, bad: Any) -> None:
    db.create_session("s", "cli")
    clock.t = 1_234_567_890.5
    db.append_message("s", "user", "x", timestamp=bad)
    assert stored(db)[0]["timestamp"] == 1_234_567_890.5


def test_append_to_unknown_session_is_an_integrity_error(db: Any) -> None:
    """Hermes' callers catch sqlite3.IntegrityError (the foreign key) — on every backend."""
    for sid in ("missing", "", None):
        with pytest.raises(sqlite3.IntegrityError) as info:
            db.append_message(sid, "user", "hi")
        assert isinstance(info.value, HermesStoreError)
    assert db.message_count() == 0


def test_v26_display_and_guard_parameters_follow_api_content(hermes_state: Any, db: Any) -> None:
    """Hermes v26: the display fields and the guard holders are ordinary parameters."""
    extras = list(inspect.signature(hermes_state.SessionDB.append_message).parameters.values())[19:]
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert [(p.name, p.kind, p.default) for p in extras] == [
        ("display_kind", positional, None), ("display_metadata", positional, None),
        ("compression_lock_holder", positional, None), ("turn_lease_holder", positional, None),
        ("turn_lease_ttl_seconds", positional, 300.0)]
    db.create_session("s", "cli")
    db.append_message("s", "assistant", "shown", display_kind="status", display_metadata={"step": 2})
    db.append_message("s", "assistant", "plain", display_metadata='{"raw": true}')
    a, b = stored(db)
    assert (a["display_kind"], a["display_metadata"]) == ("status", {"step": 2})
    assert (b["display_kind"], b["display_metadata"]) == (None, {"raw": True})
    with pytest.raises(TypeError):
        db.append_message("s", "user", "x", active=0)  # there is no active parameter
    with pytest.raises(TypeError):
        db.append_message("s", "user", "x", no_such_column=1)
    assert db.message_count("s") == 2


# ----------------------------------------------------------------- get_messages


def _five_with_two_rewound(db: Any) -> list[int]:
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(5)]
    db.rewind_to_message("s", ids[2])  # ids[2:] rewound
    return ids


def test_get_messages_is_live_only_by_default(db: Any) -> None:
    ids = _five_with_two_rewound(db)
    assert [m["id"] for m in db.get_messages("s")] == ids[:2]
    every = db.get_messages("s", include_inactive=True)
    assert [m["id"] for m in every] == ids
    assert [m["active"] for m in every] == [1, 1, 0, 0, 0]


def test_get_messages_limit_and_offset(db: Any) -> None:
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", f"m{i}") for i in range(6)]
    def got(**kw):
        return [m["id"] for m in db.get_messages("s", **kw)]
    assert got(limit=2) == ids[:2]
    assert got(limit=2, offset=3) == ids[3:5]
    assert got(offset=4) == ids[4:]  # offset alone pages too
    assert got(offset=6) == [] and got(limit=3, offset=99) == []
    assert got(limit=0) == []
    assert got(limit=-1) == ids  # SQLite's LIMIT -1: no cap
    assert got(offset=-3) == ids  # a negative offset skips nothing
    assert got(limit=2, include_inactive=True) == ids[:2]
    assert db.get_messages("s", False, False, 1, 1)[0]["id"] == ids[1]  # positional order as Hermes v26


def test_get_messages_unknown_and_falsy_sessions(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "x")
    assert db.get_messages("nope") == []
    assert db.get_messages("") == []
    assert db.get_messages(None) == []


def test_get_messages_decodes_content_and_tool_calls(db: Any) -> None:
    db.create_session("s", "cli")
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    db.append_message("s", "user", parts)
    db.append_message("s", "assistant", None, tool_calls=CALLS)
    # Our bulk append keeps JSON text verbatim: a way to store a damaged tool_calls value.
    db.append_messages([{"session_id": "s", "role": "assistant", "content": "x", "tool_calls": "{broken"}])
    a, b, c = db.get_messages("s")
    assert a["content"] == parts and b["tool_calls"] == CALLS
    assert c["tool_calls"] == []  # bad JSON → []


# ----------------------------------------------------------------- conversations


def test_conversation_keys(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "system", "  sys prompt  ")
    db.append_message("s", "user", "  <memory-context>\nold\n</memory-context>\n  What now?  ",
                      platform_message_id="tg-7", observed=True, api_content="raw user text",
                      effect_disposition="queued")
    db.append_message("s", "assistant", " Calling. ", tool_calls=CALLS, finish_reason="tool_calls",
                      reasoning="thinking", reasoning_content="", reasoning_details=[{"type": "summary"}],
                      codex_reasoning_items=[{"id": "r1"}], codex_message_items=[{"id": "m1"}])
    db.append_message("s", "tool", " 42 ", tool_name="web_search", tool_call_id="c1", finish_reason="ignored",
                      reasoning="ignored too")
    db.append_message("s", "assistant", "Done.", finish_reason="stop", reasoning="")
    conv = db.get_messages_as_conversation("s")
    stamps = [m["timestamp"] for m in db.get_messages("s")]
    assert [m.pop("timestamp") for m in conv] == stamps
    assert conv[0] == {"role": "system", "content": "  sys prompt  "}  # only user/assistant are cleaned
    assert conv[1] == {"role": "user", "content": "What now?", "api_content": "raw user text",
                       "effect_disposition": "queued", "message_id": "tg-7", "observed": True}
    assert conv[2] == {
        "role": "assistant", "content": "Calling.", "tool_calls": CALLS, "finish_reason": "tool_calls",
        "reasoning": "thinking", "reasoning_content": "", "reasoning_details": [{"type": "summary"}],
        "codex_reasoning_items": [{"id": "r1"}], "codex_message_items": [{"id": "m1"}],
    }
    assert conv[3] == {"role": "tool", "content": " 42 ", "tool_call_id": "c1", "tool_name": "web_search"}
    assert conv[4] == {"role": "assistant", "content": "Done.", "finish_reason": "stop"}


def test_conversation_bad_json_fallbacks(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_messages([{"session_id": "s", "role": "assistant", "content": "x", "tool_calls": "{broken",
                         "reasoning_details": "not json", "codex_message_items": "[1,"}])
    (turn,) = db.get_messages_as_conversation("s")
    assert turn["tool_calls"] == []
    assert turn["reasoning_details"] is None and turn["codex_message_items"] is None


def test_conversation_is_live_only_unless_asked(db: Any) -> None:
    ids = _five_with_two_rewound(db)
    assert [m["content"] for m in db.get_messages_as_conversation("s")] == ["m0", "m1"]
    every = db.get_messages_as_conversation("s", include_inactive=True)
    assert [m["content"] for m in every] == [f"m{i}" for i in range(5)]
    assert len(ids) == 5


def _chain(db: Any) -> None:
    db.create_session("p", "cli")
    db.append_message("p", "user", "question one")
    db.append_message("p", "assistant", "answer one")
    db.append_message("p", "user", "question two")
    db.end_session("p", "compression")
    db.create_session("c", "cli", parent_session_id="p")
    db.append_message("c", "user", "question two")  # replayed into the continuation
    db.append_message("c", "assistant", "answer two")
    db.append_message("c", "user", "question one")  # asked again after a reply: kept


CHAIN_DISPLAY = [("user", "question one"), ("assistant", "answer one"), ("user", "question two"),
                 ("assistant", "answer two"), ("user", "question one")]


def pairs(conv: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["role"], m["content"]) for m in conv]


def test_ancestors_root_first_with_replayed_user_dedup(db: Any) -> None:
    _chain(db)
    assert pairs(db.get_messages_as_conversation("c", include_ancestors=True)) == CHAIN_DISPLAY
    assert pairs(db.get_messages_as_conversation("c")) == CHAIN_DISPLAY[2:]
    assert pairs(db.get_messages_as_conversation("p", include_ancestors=True)) == CHAIN_DISPLAY[:3]


def test_ancestors_follow_every_parent_link(db: Any) -> None:
    """Not only compression: a delegate child's display starts at its root; an explicit
    branch (Hermes v26) replays only its own rows."""
    db.create_session("root", "cli")
    db.append_message("root", "user", "hello")
    db.create_session("delegate", "cli", parent_session_id="root", model_config={"_delegate_from": "root"})
    db.append_message("delegate", "assistant", "delegated reply")
    assert pairs(db.get_messages_as_conversation("delegate", include_ancestors=True)) == [
        ("user", "hello"), ("assistant", "delegated reply")]
    db.create_session("branch", "cli", parent_session_id="root", model_config={"_branched_from": "root"})
    db.append_message("branch", "assistant", "branched reply")
    assert pairs(db.get_messages_as_conversation("branch", include_ancestors=True)) == [
        ("assistant", "branched reply")]


def test_ancestor_walk_is_cycle_safe(db: Any) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli", parent_session_id="a")
    db.update_session("a", parent_session_id="b")  # a corrupt cycle a ↔ b
    db.append_message("a", "user", "in a")
    db.append_message("b", "assistant", "in b")
    conv = db.get_messages_as_conversation("b", include_ancestors=True)
    assert sorted(pairs(conv)) == [("assistant", "in b"), ("user", "in a")]
    assert db.get_ancestor_display_prefix("b") == [
        {"role": "user", "content": "in a", "timestamp": db.get_messages("a")[0]["timestamp"]}]


def test_ancestor_mode_skips_rewound_rows(db: Any) -> None:
    _chain(db)
    db.rewind_to_message("p", db.get_messages("p")[2]["id"])
    assert pairs(db.get_messages_as_conversation("c", include_ancestors=True)) == [
        ("user", "question one"), ("assistant", "answer one"), ("user", "question two"),
        ("assistant", "answer two"), ("user", "question one")]
    every = db.get_messages_as_conversation("c", include_ancestors=True, include_inactive=True)
    assert pairs(every) == CHAIN_DISPLAY


@pytest.mark.parametrize("prompt", [HARNESS_MEMORY, HARNESS_SKILL])
def test_background_review_harness_is_stripped(db: Any, prompt: str) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "real question")
    db.append_message("s", "assistant", "real answer")
    db.append_message("s", "user", "\n   " + prompt)
    db.append_message("s", "assistant", "Saved a memory.")  # the harness reply: stripped too
    db.append_message("s", "user", "next question")
    db.append_message("s", "system", prompt + " (system flavour)")
    db.append_message("s", "tool", "not an assistant turn", tool_call_id="x")  # kept
    db.append_message("s", "assistant", "final")
    assert pairs(db.get_messages_as_conversation("s")) == [
        ("user", "real question"), ("assistant", "real answer"), ("user", "next question"),
        ("tool", "not an assistant turn"), ("assistant", "final")]
    assert len(db.get_messages("s")) == 8  # the DB keeps everything


def test_harness_text_later_in_a_turn_is_not_a_harness(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "Please: " + HARNESS_MEMORY)
    db.append_message("s", "assistant", HARNESS_MEMORY)  # assistants are never harness turns
    assert len(db.get_messages_as_conversation("s")) == 2


def test_repair_alternation_only_changes_the_returned_list(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "part one")
    db.append_message("s", "user", "part two")
    db.append_message("s", "tool", "stray result", tool_call_id="ghost")
    db.append_message("s", "assistant", None, tool_calls=CALLS)
    db.append_message("s", "tool", "r1", tool_call_id="c1")
    db.append_message("s", "tool", "r1 again", tool_call_id="c1")  # already answered: stray
    db.append_message("s", "tool", "r2", tool_call_id="c2")
    db.append_message("s", "assistant", "summary")
    db.append_message("s", "assistant", "more")
    plain = db.get_messages_as_conversation("s")
    assert len(plain) == 9
    fixed = db.get_messages_as_conversation("s", repair_alternation=True)
    assert pairs(fixed) == [
        ("user", "part one\n\npart two"), ("assistant", None), ("tool", "r1"), ("tool", "r2"),
        ("assistant", "summary\n\nmore")]
    assert fixed[1]["tool_calls"] == CALLS
    assert len(db.get_messages("s")) == 9 and db.get_session("s")["message_count"] == 9


def test_resume_conversations(db: Any) -> None:
    _chain(db)
    db.append_message("c", "user", "and a follow-up")  # two user turns in a row
    model, display = db.get_resume_conversations("c")
    assert model == db.get_messages_as_conversation("c", repair_alternation=True, include_row_ids=True)
    assert display == db.get_messages_as_conversation("c", include_ancestors=True, include_row_ids=True)
    assert pairs(model)[-1] == ("user", "question one\n\nand a follow-up")
    assert pairs(display)[:5] == CHAIN_DISPLAY
    db.rewind_to_message("c", db.get_messages("c")[-1]["id"])
    model, display = db.get_resume_conversations("c")
    assert pairs(display) == CHAIN_DISPLAY and pairs(model)[-1] == ("user", "question one")
    assert db.get_resume_conversations("nope") == ([], [])
    assert db.get_resume_conversations(None) == ([], [])


def test_ancestor_display_prefix(db: Any) -> None:
    _chain(db)
    prefix = db.get_ancestor_display_prefix("c")
    assert pairs(prefix) == CHAIN_DISPLAY[:3]
    assert prefix == db.get_messages_as_conversation("p", include_ancestors=True)
    assert db.get_ancestor_display_prefix("p") == []  # no ancestors
    db.create_session("lonely_parent", "cli")
    db.create_session("kid", "cli", parent_session_id="lonely_parent")
    db.append_message("kid", "user", "hi")
    assert db.get_ancestor_display_prefix("kid") == []  # ancestors without rows
    assert db.get_ancestor_display_prefix("unknown") == []
    assert db.get_ancestor_display_prefix("") == []
    db.rewind_to_message("p", db.get_messages("p")[0]["id"])
    assert db.get_ancestor_display_prefix("c") == []  # live rows only


# ----------------------------------------------------------------- platform ids, recent users, api_content


def test_has_platform_message_id_ignores_active(db: Any) -> None:
    db.create_session("s", "cli")
    db.create_session("other", "cli")
    mid = db.append_message("s", "user", "x", platform_message_id="tg-100")
    db.append_message("other", "user", "y", platform_message_id="tg-200")
    assert db.has_platform_message_id("s", "tg-100") is True
    assert db.has_platform_message_id("s", "tg-200") is False  # another session's
    assert db.has_platform_message_id("s", "tg-999") is False
    assert db.has_platform_message_id("nope", "tg-100") is False
    db.rewind_to_message("s", mid)
    assert db.has_platform_message_id("s", "tg-100") is True  # rewound rows count
    db.append_message("s", "user", "z", platform_message_id=12345)
    assert db.has_platform_message_id("s", "12345") is True


def test_list_recent_user_messages(db: Any) -> None:
    db.create_session("s", "cli")
    long = "word " * 30
    ids = [
        db.append_message("s", "user", "  first\n\n\tline  "),
        db.append_message("s", "assistant", "not a user row"),
        db.append_message("s", "user", long),
        db.append_message("s", "user", "x" * 80),
        db.append_message("s", "user", [{"type": "text", "text": "see"}, {"type": "image_url"},
                                        {"type": "text", "text": " this   picture"}]),
        db.append_message("s", "user", [{"type": "image_url", "image_url": {"url": "data:"}}]),
        db.append_message("s", "user", None),
    ]
    got = db.list_recent_user_messages("s")
    assert [g["id"] for g in got] == [ids[6], ids[5], ids[4], ids[3], ids[2], ids[0]]
    assert set(got[0]) == {"id", "timestamp", "preview"}
    previews = [g["preview"] for g in got]
    assert previews[0] == ""
    assert previews[1] == "[multimodal content]"
    assert previews[2] == "see this picture"
    assert previews[3] == "x" * 80  # exactly 80: kept
    assert previews[4] == ("word " * 16)[:77] + "..." and len(previews[4]) == 80
    assert previews[5] == "first line"
    assert got[-1]["timestamp"] == db.get_messages("s")[0]["timestamp"]
    assert [g["id"] for g in db.list_recent_user_messages("s", limit=2)] == [ids[6], ids[5]]
    assert db.list_recent_user_messages("s", 0) == []
    db.rewind_to_message("s", ids[3])
    assert [g["id"] for g in db.list_recent_user_messages("s")] == [ids[2], ids[0]]
    assert len(db.list_recent_user_messages("s", include_inactive=True)) == 6
    assert db.list_recent_user_messages("nope") == [] and db.list_recent_user_messages(None) == []


def test_set_latest_user_api_content(db: Any) -> None:
    db.create_session("s", "cli")
    first = db.append_message("s", "user", "hello")
    db.append_message("s", "assistant", "hi")
    parts = [{"type": "text", "text": "look"}]
    second = db.append_message("s", "user", parts)
    assert db.set_latest_user_api_content("s", "hello", "raw") == 0  # not the newest user row
    assert db.set_latest_user_api_content("s", parts, "raw \ud800 parts") == 1  # matched after encoding
    rows = {m["id"]: m for m in stored(db)}
    assert rows[second]["api_content"] == "raw \ufffd parts" and rows[first]["api_content"] is None
    db.rewind_to_message("s", second)  # the newest *live* user row is now the first
    assert db.set_latest_user_api_content("s", "hello", "raw hello") == 1
    assert {m["id"]: m["api_content"] for m in stored(db)}[first] == "raw hello"
    assert db.set_latest_user_api_content("s", "changed text", "x") == 0
    assert db.set_latest_user_api_content("nope", "hello", "x") == 0


# ----------------------------------------------------------------- replace_messages


def test_replace_messages_swaps_everything_and_sets_counters(db: Any) -> None:
    db.create_session("s", "cli")
    for i in range(4):
        db.append_message("s", "assistant", f"old{i}", tool_calls=CALLS)
    assert db.get_session("s")["tool_call_count"] == 8
    result = db.replace_messages("s", [
        {"role": "user", "content": "fresh start"},
        {"role": "assistant", "content": None, "tool_calls": json.dumps(CALLS)},
        {"role": "assistant", "content": "odd", "tool_calls": {"id": "one"}},
        {"role": "assistant", "content": "bad", "tool_calls": "{nope"},
    ])
    assert result is None
    msgs = db.get_messages("s")
    assert [m["content"] for m in msgs] == ["fresh start", None, "odd", "bad"]
    assert msgs[1]["tool_calls"] == CALLS and msgs[3]["tool_calls"] == []  # "{nope" kept as text, read as []
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (4, 3)
    assert len(stored(db)) == 4  # the old rows are gone


def test_replace_messages_active_only_keeps_inactive_history(db: Any) -> None:
    ids = _five_with_two_rewound(db)
    db.replace_messages("s", [{"role": "user", "content": "new"}], active_only=True)
    every = stored(db)
    assert [m["id"] for m in every[:3]] == ids[2:]  # rewound rows kept
    assert [m["content"] for m in every] == ["m2", "m3", "m4", "new"]
    assert db.get_session("s")["message_count"] == 1  # inserted count only
    db.replace_messages("s", [{"role": "user", "content": "newer"}])  # default: everything goes
    assert [m["content"] for m in stored(db)] == ["newer"]


def test_replace_messages_per_message_keys(db: Any) -> None:
    db.create_session("s", "cli")
    db.replace_messages("s", [
        {"content": "no role"},
        {"role": "user", "content": "u", "message_id": "tg-5", "observed": True, "api_content": "raw",
         "effect_disposition": "sent", "reasoning": "dropped for users", "token_count": 12,
         "id": 999_999, "active": 0, "session_id": "elsewhere", "display_kind": "note"},
        {"role": "user", "content": "both ids", "platform_message_id": "p-1", "message_id": "m-1"},
        {"role": "assistant", "content": "a", "finish_reason": "stop", "reasoning": "why",
         "reasoning_content": "", "reasoning_details": [{"k": 1}], "codex_reasoning_items": [{"r": 1}],
         "codex_message_items": [{"m": 1}], "tool_call_id": "tc", "tool_name": "tn"},
        {"role": "tool", "content": "t", "tool_call_id": "c1", "tool_name": "web_search",
         "reasoning_details": [{"dropped": True}], "finish_reason": "kept on any role"},
    ])
    no_role, user, both, asst, tool = stored(db)
    assert no_role["role"] == "unknown"
    assert (user["platform_message_id"], user["observed"], user["api_content"], user["effect_disposition"],
            user["token_count"]) == ("tg-5", 1, "raw", "sent", 12)
    assert user["reasoning"] is None and user["id"] != 999_999 and user["active"] == 1
    assert user["session_id"] == "s" and user["display_kind"] == "note"  # v26: display fields honoured
    assert both["platform_message_id"] == "p-1"
    assert (asst["finish_reason"], asst["reasoning"], asst["reasoning_content"]) == ("stop", "why", "")
    assert json.loads(asst["reasoning_details"]) == [{"k": 1}]
    assert (json.loads(asst["codex_reasoning_items"]), json.loads(asst["codex_message_items"])) == (
        [{"r": 1}], [{"m": 1}])
    assert (tool["tool_call_id"], tool["tool_name"], tool["reasoning_details"]) == ("c1", "web_search", None)
    assert tool["finish_reason"] == "kept on any role"
    assert no_role["observed"] == 0


def test_replace_messages_fallback_clock(db: Any, clock: Clock) -> None:
    db.create_session("s", "cli")
    clock.t = 5000.0
    db.replace_messages("s", [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c", "timestamp": 9000.0},  # explicit: kept
        {"role": "assistant", "content": "d"},  # after the explicit one
        {"role": "user", "content": "e", "timestamp": 100.0},  # explicit in the past: kept
        {"role": "assistant", "content": "f"},  # the clock never goes back
        {"role": "user", "content": "g", "timestamp": "garbage"},  # unconvertible: the clock
    ])
    ts = [m["timestamp"] for m in stored(db)]
    assert ts[0] == 5000.0
    assert ts[1] == pytest.approx(5000.0 + 1e-6, abs=1e-9)
    assert ts[2] == 9000.0
    assert ts[3] == pytest.approx(9000.0 + 1e-6, abs=1e-9)
    assert ts[4] == 100.0
    # the clock advances after every row, explicit ones included: 9000+2e-6 after "d",
    # then max(that + 1e-6, 100 + 1e-6) after "e"
    assert ts[5] == pytest.approx(9000.0 + 3e-6, abs=1e-9)
    assert ts[6] == pytest.approx(9000.0 + 4e-6, abs=1e-9)
    assert ts == sorted(ts[:4]) + ts[4:]


def test_replace_round_trips_a_conversation(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "q", platform_message_id="tg-1", observed=True, api_content="raw q")
    db.append_message("s", "assistant", "a", tool_calls=CALLS, reasoning_details=[{"x": 1}], finish_reason="stop")
    db.append_message("s", "tool", "r", tool_call_id="c1", tool_name="web_search", effect_disposition="ok")
    before = db.get_messages_as_conversation("s")
    db.replace_messages("s", before)
    assert all("_row_id" in m for m in before)  # the shared inserter names each new row (v26)
    assert db.get_messages_as_conversation("s", include_row_ids=True) == before
    assert db.get_session("s")["tool_call_count"] == 2


def test_replace_messages_unknown_session(db: Any) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        db.replace_messages("missing", [{"role": "user", "content": "x"}])
    assert db.message_count() == 0
    db.replace_messages("missing", [])  # nothing to insert: no error, nothing happens
    db.replace_messages("missing", [], active_only=True)
    assert db.get_session("missing") is None


def test_replace_messages_refuses_bad_items_before_deleting(db: Any) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "keep me")
    for bad in ([{"role": "user", "content": "ok"}, "not a dict"], None, "text"):
        with pytest.raises(HermesStoreError):
            db.replace_messages("s", bad)  # type: ignore[arg-type]
    assert [m["content"] for m in db.get_messages("s")] == ["keep me"]


# ----------------------------------------------------------------- windows, count, clear (ignore active)


def _transcript(db: Any, n: int = 12) -> list[int]:
    db.create_session("s", "cli")
    roles = ["user", "assistant", "tool"]
    return [db.append_message("s", roles[i % 3], f"msg{i}") for i in range(n)]


def test_messages_around_counts_are_the_returned_rows(db: Any) -> None:
    ids = _transcript(db)
    for anchor, window, expect_ids in [
        (5, 2, ids[3:8]), (0, 3, ids[0:4]), (11, 3, ids[8:12]), (1, 4, ids[0:6]), (5, 0, [ids[5]]),
        (6, 20, ids),
    ]:
        out = db.get_messages_around("s", ids[anchor], window=window)
        got = [m["id"] for m in out["window"]]
        assert got == expect_ids
        assert out["messages_before"] == got.index(ids[anchor])
        assert out["messages_after"] == len(got) - got.index(ids[anchor]) - 1
        assert out["messages_before"] == min(window, anchor)
        assert out["messages_after"] == min(window, len(ids) - 1 - anchor)


def test_messages_around_ignores_active(db: Any) -> None:
    ids = _transcript(db)
    db.rewind_to_message("s", ids[6])  # ids[6:] rewound
    out = db.get_messages_around("s", ids[7], window=2)
    assert [m["id"] for m in out["window"]] == ids[5:10]
    assert [m["active"] for m in out["window"]] == [1, 0, 0, 0, 0]
    assert (out["messages_before"], out["messages_after"]) == (2, 2)
    assert db.get_messages_around("s", 10**9) == {"window": [], "messages_before": 0, "messages_after": 0}


def test_anchored_view_counts_are_the_returned_rows(db: Any) -> None:
    ids = _transcript(db, 15)  # user, assistant, tool, ...
    view = db.get_anchored_view("s", ids[7], window=2, bookend=1)  # anchor: an assistant row
    kept = [i for k, i in enumerate(ids) if k % 3 != 2]
    at = kept.index(ids[7])
    assert [m["id"] for m in view["window"]] == kept[at - 2: at + 3]
    assert (view["messages_before"], view["messages_after"]) == (2, 2)
    edge = db.get_anchored_view("s", ids[0], window=3)
    assert (edge["messages_before"], edge["messages_after"]) == (0, 3)
    last = db.get_anchored_view("s", ids[13], window=3)
    assert (last["messages_before"], last["messages_after"]) == (3, 0)
    db.rewind_to_message("s", ids[3])  # rewound rows still count in a view
    again = db.get_anchored_view("s", ids[7], window=2, bookend=1)
    assert [m["id"] for m in again["window"]] == [m["id"] for m in view["window"]]


def test_message_count_and_clear_ignore_active(db: Any) -> None:
    ids = _five_with_two_rewound(db)
    assert db.message_count("s") == 5 and db.message_count() == 5
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    assert db.message_count("s") == 6
    assert len(ids) == 5
    db.clear_messages("s")
    assert db.message_count("s") == 0 and stored(db) == []
    assert db.has_archived_messages("s") is False
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (0, 0)


# ----------------------------------------------------------------- bulk append (ours) still works


def test_bulk_append_messages_still_works(db: Any) -> None:
    db.create_session("s", "cli")
    assert db.append_messages([{"session_id": "s", "role": "user", "content": f"m{i}"} for i in range(3)]
                              + [{"session_id": "s", "role": "assistant", "content": None,
                                  "tool_calls": CALLS}]) == 4
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (4, 2)
    with pytest.raises(sqlite3.IntegrityError):
        db.append_messages([{"session_id": "ghost", "role": "user", "content": "x"}])
    assert db.message_count() == 4


def test_clock_fixture_is_what_append_uses(db: Any, clock: Clock) -> None:
    db.create_session("s", "cli")
    clock.t = 42.0
    db.append_message("s", "user", "x")
    assert stored(db)[0]["timestamp"] == 42.0
