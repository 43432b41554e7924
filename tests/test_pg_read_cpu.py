"""The PostgreSQL reads' cheaper paths give what the plain ones give (both backends).

Replays build each turn from the row tuple and apply deduplication, the background-review
harness and the stale-marker rule in one pass; listings of many rows walk plain
compression chains to their tip in SQL (``STRAIGHT_WALK_FROM``); the lineage chain reads
one row per step of the parent walk. Each is checked here against the way it was done
before (the three passes over mapping rows, the short page's graph walk), and against
the answers spelled out.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from hermes_store import SessionDB, UnitOfWork
from hermes_store.codec import strip_stale_tool_call_markers
from hermes_store.repositories import listing
from hermes_store.repositories.messages import _CONVERSATION_COLUMNS, conversation_turn
from hermes_store.review_turns import _strip_background_review_harness

from .factories import insert_sessions, set_times

pytestmark = pytest.mark.both_backends

HARNESS = "Review the conversation above and note what to remember."


def _plain_replay(db: SessionDB, session_ids: list[str], *, dedupe: bool) -> list[dict[str, Any]]:
    """The replay as it was built before: mapping rows, one turn each, then deduplication,
    the harness and the stale markers as three passes."""
    m = _CONVERSATION_COLUMNS[0].table.c
    with UnitOfWork(db.engine, write=False) as uow:
        rows = []
        for sid in session_ids:
            q = select(*_CONVERSATION_COLUMNS).where(m.session_id == sid, m.active == 1).order_by(m.id)
            rows += [dict(r) for r in uow.messages.conn.execute(q).mappings()]
    out: list[dict[str, Any]] = []
    pending: set[str] = set()
    for row in rows:
        msg = conversation_turn(row)
        if dedupe and msg["role"] == "user":
            key = msg["content"] if isinstance(msg["content"], str) else repr(msg["content"])
            if key in pending:
                continue
            pending.add(key)
        elif msg["role"] == "assistant":
            pending.clear()
        out.append(msg)
    return strip_stale_tool_call_markers(_strip_background_review_harness(out))


def _talk(db: SessionDB, sid: str) -> None:
    db.append_message(sid, "system", "  be brief  ")
    db.append_message(sid, "user", "<memory-context>recalled fact</memory-context>\n\n  what is up?  ")
    db.append_message(sid, "assistant", "[web_search]", tool_calls=[{"id": "c1", "type": "function",
                                                                       "function": {"name": "web_search"}}],
                      finish_reason="tool_calls", reasoning="look it up", reasoning_content="",
                      reasoning_details=[{"type": "summary", "text": "why"}])
    db.append_message(sid, "tool", '{"hits": 3}', tool_call_id="c1", tool_name="web_search")
    db.append_message(sid, "user", HARNESS)
    db.append_message(sid, "assistant", "noted")
    db.append_message(sid, "user", [{"type": "text", "text": "a picture"}, {"type": "image_url", "image_url": "x"}])
    db.append_message(sid, "assistant", "  plain <b>answer</b>  ", display_kind="card",
                      display_metadata={"title": "t"}, codex_reasoning_items="not json")


def test_replay_of_one_session_matches_the_plain_way_and_the_rules(db: SessionDB) -> None:
    db.create_session("r1", "cli")
    _talk(db, "r1")
    got = db.get_messages_as_conversation("r1")
    assert got == _plain_replay(db, ["r1"], dedupe=False)
    assert [m["role"] for m in got] == ["system", "user", "assistant", "tool", "user", "assistant"]
    assert got[0]["content"] == "  be brief  "  # a system turn is not stripped
    assert got[1]["content"] == "what is up?"  # recalled memory removed, stripped
    assert got[2]["content"] == "" and got[2]["tool_calls"][0]["id"] == "c1"  # a stale marker blanked
    assert got[2]["reasoning_content"] == "" and got[2]["reasoning_details"] == [{"type": "summary", "text": "why"}]
    assert got[4]["content"][0] == {"type": "text", "text": "a picture"}  # JSON content decoded
    assert got[5]["content"] == "plain <b>answer</b>"  # '<' without a memory block: only stripped
    assert got[5]["display_kind"] == "card" and got[5]["display_metadata"] == {"title": "t"}
    assert got[5]["codex_reasoning_items"] == "not json"  # stored as a JSON string, read back as one
    assert all(HARNESS not in str(m["content"]) and m["content"] != "noted" for m in got)  # harness and reply gone
    with_ids = db.get_messages_as_conversation("r1", include_row_ids=True)
    assert [{k: v for k, v in m.items() if k != "_row_id"} for m in with_ids] == got
    assert all(isinstance(m["_row_id"], int) for m in with_ids)


def test_replay_with_ancestors_deduplicates_as_the_plain_way(db: SessionDB) -> None:
    db.create_session("p", "cli")
    db.append_message("p", "user", "first question")
    db.append_message("p", "assistant", "first answer")
    db.append_message("p", "user", "carried over")
    set_times(db, "p", started_at=1.0, ended_at=2.0, end_reason="compression")
    db.create_session("c", "cli", parent_session_id="p")
    db.append_message("c", "user", "carried over")  # the compression's replayed copy
    db.append_message("c", "user", HARNESS)
    db.append_message("c", "assistant", "review reply")
    db.append_message("c", "assistant", "real answer")
    got = db.get_messages_as_conversation("c", include_ancestors=True)
    assert got == _plain_replay(db, ["p", "c"], dedupe=True)
    assert [m["content"] for m in got] == ["first question", "first answer", "carried over", "real answer"]
    model, display = db.get_resume_conversations("c")
    assert [m["content"] for m in display] == ["first question", "first answer", "carried over", "real answer"]
    assert [m["content"] for m in model] == ["carried over", "real answer"]


def _chains(db: SessionDB) -> None:
    """Roots with: a plain chain, a fork (two continuations), a child whose config has the
    marker's words but not the marker, a tool run beside the continuation, a child that
    is a real branch, and a root that compressed into nothing."""
    rows: list[dict[str, Any]] = []
    ends: dict[str, tuple[float, str]] = {}

    def add(sid: str, at: float, parent: str | None = None, end: str | None = None, **kw: Any) -> None:
        rows.append({"id": sid, "source": kw.get("source", "cli"), "started_at": at, "parent_session_id": parent,
                     "title": kw.get("title"), "model_config": kw.get("model_config")})
        if end:
            ends[sid] = (at, end)

    add("plain0", 10.0, end="compression")
    add("plain1", 11.0, "plain0", end="compression")
    add("plain2", 12.0, "plain1", title="plain tip")
    add("fork0", 20.0, end="compression")
    add("fork_a", 21.0, "fork0", end="user_exit")
    add("fork_b", 22.0, "fork0", title="live continuation")  # live beats ended
    add("words0", 30.0, end="compression")
    add("words1", 31.0, "words0", model_config='{"note": "_branched_from is only words"}', title="words tip")
    add("tool0", 40.0, end="compression")
    add("tool_run", 41.0, "tool0", source="tool")
    add("tool1", 42.0, "tool0", title="after the tool run")
    add("branch0", 50.0, end="compression")
    add("branch1", 51.0, "branch0", model_config='{"_branched_from": "branch0"}')
    add("alone", 60.0, end="compression")
    insert_sessions(db, rows)
    for sid in ("plain0", "plain2", "fork_a", "fork_b", "words1", "tool1", "branch0", "alone"):
        db.append_message(sid, "user", f"hello from {sid}")
    for sid, (at, end) in ends.items():  # ended after their messages (a compressed session refuses appends)
        set_times(db, sid, started_at=at, ended_at=at + 1, end_reason=end)


def test_long_listing_walks_plain_chains_in_sql_to_the_tips_a_short_one_finds(db: SessionDB) -> None:
    _chains(db)
    assert 20 <= listing.STRAIGHT_WALK_FROM < 500  # the two pages below take the two statement shapes
    short = db.list_sessions_rich(limit=20)
    long = db.list_sessions_rich(limit=500)
    assert long == short
    shown = {r.get("_lineage_root_id", r["id"]): r["id"] for r in long}
    assert shown == {
        "plain0": "plain2", "fork0": "fork_b", "words0": "words1", "tool0": "tool1",
        "branch0": "branch0", "branch1": "branch1", "alone": "alone",
    }
    by_root = {r.get("_lineage_root_id", r["id"]): r for r in long}
    assert by_root["plain0"]["title"] == "plain tip" and by_root["plain0"]["preview"] == "hello from plain2"
    assert by_root["tool0"]["title"] == "after the tool run"
    assert db.list_sessions_rich(limit=500, order_by_last_active=True) == \
        db.list_sessions_rich(limit=20, order_by_last_active=True)


def test_lineage_chain_lists_each_id_once_nearest_last(db: SessionDB) -> None:
    _chains(db)
    assert db.get_session_lineage("plain2") == ["plain0", "plain1", "plain2"]
    assert db.get_session_lineage("plain0") == ["plain0", "plain1", "plain2"]
    assert db.get_session_lineage("fork_a") == ["fork0", "fork_a"]
    assert db.get_session_lineage("fork0") == ["fork0", "fork_b"]
    assert db.get_session_lineage("nobody") == []
    insert_sessions(db, [{"id": sid, "source": "cli", "started_at": 1.0} for sid in ("x", "y", "z")],
                    parents={"x": "z", "y": "x", "z": "y"})
    assert db.get_session_lineage("x") == ["y", "z", "x"]  # a corrupt cycle: each id once, farthest first


def test_lineage_chain_with_ids_holding_the_separators(db: SessionDB) -> None:
    """The walk's ids travel joined in one value; an id holding the separator (or a comma)
    is read again a row per step, with the same answer."""
    ids = ["odd\x1fone", "with,comma", "plain", "tail\x1f"]
    insert_sessions(db, [{"id": sid, "source": "cli", "started_at": float(i),
                          "parent_session_id": ids[i - 1] if i else None} for i, sid in enumerate(ids)])
    assert db.get_session_lineage(ids[-1]) == ids
    assert db.get_session_lineage("plain") == ids[:3]
    assert db.get_session_lineage("with,comma") == ids[:2]
    with UnitOfWork(db.engine, write=False) as uow:
        assert uow.lineage.chain(ids[-1]) == uow.lineage.ancestors(ids[-1]) == ids
