"""MessageRepository through SessionDB: append, counters, windows, replay."""

from __future__ import annotations

import json

import pytest

from hermes_store import NotFoundError, SessionDB, UnitOfWork
from hermes_store.codec import (
    JSON_PREFIX,
    coerce_timestamp,
    message_preview,
    parse_tool_calls,
    repair_message_sequence,
    tool_call_increment,
)

pytestmark = pytest.mark.both_backends

CALLS = [
    {"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": "{\"q\": \"otters\"}"}},
    {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
]


def test_append_updates_counters_and_decodes(db: SessionDB) -> None:
    db.create_session("s", "cli")
    a = db.append_message("s", "user", "hello")
    b = db.append_message("s", "assistant", None, tool_calls=CALLS, finish_reason="tool_calls")
    c = db.append_message("s", "tool", "result text", tool_name="web_search", tool_call_id="c1")
    assert a < b < c
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (3, 2)
    msgs = db.get_messages("s")
    assert [m["id"] for m in msgs] == [a, b, c]
    assert msgs[1]["tool_calls"] == CALLS
    assert msgs[2]["tool_name"] == "web_search" and msgs[2]["tool_call_id"] == "c1"
    assert db.message_count("s") == 3 and db.message_count() == 3


@pytest.mark.sqlite_only
def test_multimodal_content_uses_hermes_encoding(db: SessionDB) -> None:
    db.create_session("s", "cli")
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:..."}}]
    mid = db.append_message("s", "user", parts)
    raw = db._execute_write(lambda c: c.execute("SELECT content FROM messages WHERE id = ?", (mid,)).fetchone()[0])
    assert raw == JSON_PREFIX + json.dumps(parts, ensure_ascii=False)
    assert db.get_messages("s")[0]["content"] == parts
    db.append_message("s", "user", "plain string")
    raw2 = db._execute_write(lambda c: c.execute("SELECT content FROM messages ORDER BY id DESC").fetchone()[0])
    assert raw2 == "plain string"


@pytest.mark.sqlite_only
def test_falsy_json_stored_as_null(db: SessionDB) -> None:
    db.create_session("s", "cli")
    mid = db.append_message("s", "assistant", "x", tool_calls=[], reasoning_details={}, codex_message_items=None)
    raw = db._execute_write(
        lambda c: tuple(c.execute("SELECT tool_calls, reasoning_details, codex_message_items FROM messages WHERE id=?", (mid,)).fetchone())
    )
    assert raw == (None, None, None)
    assert db.get_session("s")["tool_call_count"] == 0


def test_append_to_unknown_session_is_a_clear_error(db: SessionDB) -> None:
    with pytest.raises(NotFoundError):
        db.append_message("missing", "user", "hi")
    assert db.message_count() == 0


def test_bulk_append_counts(db: SessionDB) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    n = db.append_messages(
        [{"session_id": "a", "role": "user", "content": f"m{i}"} for i in range(5)]
        + [{"session_id": "b", "role": "assistant", "content": None, "tool_calls": CALLS}]
    )
    assert n == 6
    assert db.get_session("a")["message_count"] == 5
    assert (db.get_session("b")["message_count"], db.get_session("b")["tool_call_count"]) == (1, 2)
    assert [m["content"] for m in db.get_messages("a")] == [f"m{i}" for i in range(5)]
    assert db.search_messages("m3")[0]["session_id"] == "a"


def test_replace_and_clear_recompute_counters(db: SessionDB) -> None:
    db.create_session("s", "cli")
    for i in range(4):
        db.append_message("s", "user", f"old{i}")
    db.replace_messages("s", [
        {"role": "user", "content": "fresh start"},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
    ])
    assert [m["content"] for m in db.get_messages("s")] == ["fresh start", None]
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (2, 2)
    assert db.search_messages("old1") == []
    assert db.search_messages("fresh")[0]["session_id"] == "s"
    db.clear_messages("s")
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (0, 0)
    assert db.get_messages("s") == []


def _transcript(db: SessionDB, n: int = 12) -> list[int]:
    db.create_session("s", "cli")
    roles = ["user", "assistant", "tool"]
    return [db.append_message("s", roles[i % 3], f"msg{i}" if i != 4 else "") for i in range(n)]


def test_messages_around(db: SessionDB) -> None:
    ids = _transcript(db)
    out = db.get_messages_around("s", ids[5], window=2)
    assert [m["id"] for m in out["window"]] == ids[3:8]
    # issue 13: the counts are the window's own rows on each side of the anchor
    assert (out["messages_before"], out["messages_after"]) == (2, 2)
    edge = db.get_messages_around("s", ids[0], window=3)
    assert [m["id"] for m in edge["window"]] == ids[0:4]
    assert (edge["messages_before"], edge["messages_after"]) == (0, 3)
    tail = db.get_messages_around("s", ids[-2], window=3)
    assert [m["id"] for m in tail["window"]] == ids[-5:]
    assert (tail["messages_before"], tail["messages_after"]) == (3, 1)
    zero = db.get_messages_around("s", ids[5], window=-4)
    assert [m["id"] for m in zero["window"]] == [ids[5]]
    assert (zero["messages_before"], zero["messages_after"]) == (0, 0)
    db.create_session("other", "cli")
    foreign = db.append_message("other", "user", "elsewhere")
    assert db.get_messages_around("s", foreign) == {"window": [], "messages_before": 0, "messages_after": 0}
    assert db.get_messages_around("s", 999999)["window"] == []


def test_anchored_view_roles_and_bookends(db: SessionDB) -> None:
    ids = _transcript(db, 15)  # roles cycle user, assistant, tool
    anchor = ids[8]  # a tool row: kept although tool is not in keep_roles
    view = db.get_anchored_view("s", anchor, window=1, bookend=2)
    assert set(view) == {"window", "messages_before", "messages_after", "bookend_start", "bookend_end"}
    assert [m["id"] for m in view["window"]] == [ids[7], ids[8], ids[9]]
    assert all(m["role"] in ("user", "assistant") for m in view["bookend_start"] + view["bookend_end"])
    # msg4 is empty and skipped; bookends never overlap the window
    assert [m["id"] for m in view["bookend_start"]] == [ids[0], ids[1]]
    assert [m["id"] for m in view["bookend_end"]] == [ids[12], ids[13]]
    assert (view["messages_before"], view["messages_after"]) == (1, 1)
    window_ids = {m["id"] for m in view["window"]}
    assert not window_ids & {m["id"] for m in view["bookend_start"] + view["bookend_end"]}
    assert db.get_anchored_view("s", 424242)["window"] == []


# The v23 replay dict of every kind of turn: tests/compat/test_messages.py::test_conversation_keys.


def test_conversation_with_ancestors_dedupes_replayed_user(db: SessionDB) -> None:
    db.create_session("p", "cli")
    db.append_message("p", "user", "question one")
    db.append_message("p", "assistant", "answer one")
    db.append_message("p", "user", "question two")
    db.end_session("p", "compression")
    db.create_session("c", "cli", parent_session_id="p")
    db.append_message("c", "user", "question two")  # replayed into the continuation
    db.append_message("c", "assistant", "answer two")
    db.append_message("c", "user", "question one")  # asked again after a reply: kept
    conv = db.get_messages_as_conversation("c", include_ancestors=True)
    assert [(m["role"], m["content"]) for m in conv] == [
        ("user", "question one"), ("assistant", "answer one"), ("user", "question two"),
        ("assistant", "answer two"), ("user", "question one"),
    ]
    assert len(db.get_messages_as_conversation("c")) == 3


def test_unit_of_work_rolls_back_on_error(db: SessionDB) -> None:
    with pytest.raises(RuntimeError):
        with UnitOfWork(db.engine) as uow:
            uow.sessions.create("u1", "cli")
            uow.messages.append("u1", "user", "doomed")
            raise RuntimeError("boom")
    assert db.get_session("u1") is None and db.message_count() == 0
    with UnitOfWork(db.engine) as uow:
        uow.sessions.create("u2", "cli")
        uow.messages.append("u2", "user", "kept")
    assert db.get_session("u2")["message_count"] == 1


def test_bulk_append_keeps_input_order_across_column_sets(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_messages([
        {"session_id": "s", "role": "user", "content": "q"},
        {"session_id": "s", "role": "assistant", "content": None, "tool_calls": CALLS},
        {"session_id": "s", "role": "tool", "content": "r", "tool_name": "web_search", "tool_call_id": "c1"},
        {"session_id": "s", "role": "assistant", "content": "a"},
    ])
    msgs = db.get_messages("s")
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert [m["id"] for m in msgs] == sorted(m["id"] for m in msgs)


@pytest.mark.sqlite_only
def test_large_bulk_append_goes_through_staging_with_defaults_and_order(db: SessionDB) -> None:
    """Batches big enough to be staged keep order, defaults, NUL bytes and the indexes."""
    db.create_session("s", "cli")
    items = []
    for i in range(300):
        item = {"session_id": "s", "role": ["user", "assistant", "tool"][i % 3], "content": f"row{i} \x00 tail"}
        if i % 3 == 1:
            item["tool_calls"] = CALLS
        if i % 7 == 0:
            item["active"] = 0
        items.append(item)
    assert db.append_messages(items) == 300
    msgs = db.get_messages("s", include_inactive=True)  # v23: rewound rows only on request
    assert [m["content"] for m in msgs] == [f"row{i} \x00 tail" for i in range(300)]
    assert len(db.get_messages("s")) == 300 - len(range(0, 300, 7))
    assert [m["active"] for m in msgs] == [0 if i % 7 == 0 else 1 for i in range(300)]  # default kept
    assert all(m["compacted"] == 0 and m["observed"] == 0 for m in msgs)
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"]) == (300, 200)
    assert db.check_fts() == {"messages_fts": None, "messages_fts_trigram": None}
    assert [h["id"] for h in db.search_messages("row123")] == [msgs[123]["id"]]


# ---------------------------------------------------------------- v23 helpers (pure)


def test_repair_merges_same_role_turns_and_keeps_the_input() -> None:
    msgs = [
        {"role": "system", "content": "a"}, {"role": "system", "content": "b"},
        {"role": "user", "content": "text"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "one", "finish_reason": "length", "reasoning": "r1"},
        {"role": "assistant", "content": None, "tool_calls": CALLS[:1], "finish_reason": "tool_calls",
         "reasoning": "r2"},
    ]
    snapshot = json.dumps(msgs)
    out = repair_message_sequence(msgs)
    assert json.dumps(msgs) == snapshot  # input untouched
    assert out[0] == {"role": "system", "content": "a\n\nb"}
    assert out[1] == {"role": "user", "content": [{"type": "text", "text": "text"},
                                                  {"type": "image_url", "image_url": {"url": "x"}}]}
    assert out[2] == {"role": "assistant", "content": "one", "finish_reason": "tool_calls", "reasoning": "r1",
                      "tool_calls": CALLS[:1]}
    assert len(out) == 3


def test_repair_drops_stray_tool_results() -> None:
    msgs = [
        {"role": "tool", "content": "before any call", "tool_call_id": "c1"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "content": "r2", "tool_call_id": "c2"},
        {"role": "tool", "content": "unknown id", "tool_call_id": "zz"},
        {"role": "tool", "content": "r1", "tool_call_id": "c1"},
        {"role": "tool", "content": "no id"},  # the turn made calls: kept
        {"role": "user", "content": "next"},
        {"role": "tool", "content": "after a user turn", "tool_call_id": "c1"},
        "not a dict",
        {"role": "user", "content": "merged with next"},
    ]
    out = repair_message_sequence(msgs)  # type: ignore[arg-type]
    assert [(m["role"], m["content"]) for m in out] == [
        ("user", "q"), ("assistant", None), ("tool", "r2"), ("tool", "r1"), ("tool", "no id"),
        ("user", "next\n\nmerged with next")]
    bare = repair_message_sequence([{"role": "assistant", "content": None, "tool_calls": [{"type": "x"}]},
                                    {"role": "tool", "content": "has id", "tool_call_id": "a"},
                                    {"role": "tool", "content": "no id"}])
    assert [m["content"] for m in bare] == [None, "no id"]


@pytest.mark.parametrize(
    ("value", "parsed", "increment"),
    [(None, None, 0), ("[1, 2]", [1, 2], 2), ("{bad", [], 0), ("", [], 0), ({"a": 1}, {"a": 1}, 1),
     ((1, 2, 3), (1, 2, 3), 3), ('"text"', "text", 1), (b"[1]", [1], 1)],
)
def test_tool_call_rules(value, parsed, increment) -> None:  # type: ignore[no-untyped-def]
    assert parse_tool_calls(value) == parsed
    assert tool_call_increment(parse_tool_calls(value)) == increment


def test_coerce_timestamp_and_preview() -> None:
    import datetime as dt

    assert coerce_timestamp(5) == 5.0 and coerce_timestamp("7.5") == 7.5
    assert coerce_timestamp(dt.datetime(1970, 1, 2, tzinfo=dt.UTC)) == 86400.0
    assert [coerce_timestamp(v) for v in (None, True, "x", float("nan"), float("-inf"), object())] == [None] * 6
    assert message_preview({"type": "text", "text": " a \n b "}) == "a b"
    assert message_preview({"type": "image_url"}) == "[multimodal content]"
    assert message_preview(12) == "12"
