"""Hermes v26 listing (reference §2.F, §3, §5.2, §5.4) through the swapped ``hermes_state``.

``list_sessions_rich``'s new filters and fields (sources, session_key, hidden, pinned,
unread, skill previews, compact rows, reset children), ``get_session_rich_row``, the
new counts, ``search_sessions(workspace_key)``, ``search_sessions_by_id`` with source
filters, skill-scaffolded sessions, the first assistant text and ``escape_like``.
"""

from __future__ import annotations

from typing import Any

import pytest

from .test_listing import add, ids

pytestmark = pytest.mark.both_backends

SKILL = (
    '[IMPORTANT: The user has invoked the "deploy" skill, indicating they want you to follow its '
    "instructions. The full skill content is loaded below.]\n\n" + "body " * 400 + "\n\n"
    "The user has provided the following instruction alongside the skill invocation: fix the title leak"
)


def flag(db, sid: str, **values: Any) -> None:
    assert db.update_session(sid, **values) is True


# ---------------------------------------------------------------------- list_sessions_rich


def test_source_then_sources(db) -> None:
    add(db, "a", 100.0, source="cli")
    add(db, "b", 200.0, source="tui")
    add(db, "c", 300.0, source="telegram")
    assert ids(db.list_sessions_rich(sources=["cli", "telegram"])) == ["c", "a"]
    assert ids(db.list_sessions_rich(source="tui", sources=["cli"])) == ["b"]  # source wins
    assert ids(db.list_sessions_rich(None, ["tui"])) == ["b"]  # sources is 2nd
    assert db.session_count(sources=["cli", "tui"]) == 2


def test_session_key_filters_before_the_limit(db) -> None:
    for i in range(5):
        add(db, f"s{i}", 100.0 + i, session_key="agent:main:telegram:dm:1" if i < 2 else f"other{i}")
    assert ids(db.list_sessions_rich(session_key="agent:main:telegram:dm:1", limit=1)) == ["s1"]
    assert ids(db.list_sessions_rich(session_key="agent:main:telegram:dm:1")) == ["s1", "s0"]
    assert db.list_sessions_rich(session_key="nobody") == []


def test_hidden_rows_are_left_out_unless_asked_and_still_counted(db) -> None:
    add(db, "seen", 100.0)
    add(db, "hid", 200.0)
    flag(db, "hid", hidden=1)
    assert ids(db.list_sessions_rich()) == ["seen"]
    assert ids(db.list_sessions_rich(include_hidden=True)) == ["hid", "seen"]
    assert db.session_count() == 2


def test_include_pinned_appends_pinned_rows_off_the_page(db) -> None:
    for i in range(4):
        add(db, f"s{i}", 100.0 + i)
    flag(db, "s0", pinned=1)
    flag(db, "s3", pinned=1)
    add(db, "pinned_tui", 50.0, source="tui")
    flag(db, "pinned_tui", pinned=1)
    assert ids(db.list_sessions_rich(limit=2, source="cli")) == ["s3", "s2"]
    assert ids(db.list_sessions_rich(limit=2, source="cli", include_pinned=True)) == ["s3", "s2", "s0"]
    assert ids(db.list_sessions_rich(limit=2, include_pinned=True)) == ["s3", "s2", "s0", "pinned_tui"]


def test_every_row_says_whether_it_is_unread(db) -> None:
    add(db, "never", 100.0, user="hi", said_at=150.0)
    add(db, "read", 100.0, user="hi", said_at=150.0)
    add(db, "moved", 100.0, user="hi", said_at=150.0)
    flag(db, "read", last_read_at=160.0)
    flag(db, "moved", last_read_at=140.0)
    rows = {r["id"]: r for r in db.list_sessions_rich()}
    assert {k: r["unread"] for k, r in rows.items()} == {"never": False, "read": False, "moved": True}
    assert all(r["unread"] is False for r in db.list_sessions_rich(compact_rows=True) if r["id"] != "moved")


def test_skill_invocations_preview_as_the_slash_command(db) -> None:
    add(db, "skill", 100.0, user=SKILL)
    add(db, "plain", 200.0, user="just a question")
    rows = {r["id"]: r["preview"] for r in db.list_sessions_rich()}
    assert rows == {"skill": "/deploy — fix the title leak", "plain": "just a question"}
    assert db.get_session_rich_row("skill")["preview"] == "/deploy — fix the title leak"


def test_reset_children_are_listed_and_counted(db) -> None:
    add(db, "old", 100.0, session_key="k1", end_reason="session_reset", ended=110.0)
    add(db, "marked", 120.0, parent="old", config={"_reset_from": "old"})
    add(db, "p2", 130.0, session_key="k2", end_reason="idle", ended=140.0)
    add(db, "legacy", 150.0, parent="p2", session_key="k2")
    add(db, "p3", 160.0, session_key="k3", end_reason="user_exit", ended=170.0)
    add(db, "plain_child", 180.0, parent="p3", session_key="k3")
    assert ids(db.list_sessions_rich(limit=50)) == ["p3", "legacy", "p2", "marked", "old"]
    assert db.session_count(exclude_children=True) == 5


def test_get_session_rich_row_and_compact_rows(db) -> None:
    add(db, "s", 100.0, user="hello", system_prompt="be brief")
    full = db.get_session_rich_row("s")
    assert full["system_prompt"] == "be brief" and full["preview"] == "hello" and full["last_active"] == 101.0
    compact = db.get_session_rich_row("s", compact_rows=True)
    assert not {"system_prompt", "system_prompt_hash", "git_metadata_generation"} & set(compact)
    assert compact["preview"] == "hello"
    assert db._get_session_rich_row("s") == full
    assert db.get_session_rich_row("missing") is None


# ---------------------------------------------------------------------- counts


def test_session_count_ge(db) -> None:
    assert db.session_count_ge() is False
    assert db.session_count_ge(0) is True
    add(db, "a", 100.0)
    add(db, "b", 200.0, parent="a")
    flag(db, "b", archived=1)
    assert db.session_count_ge(2) is True and db.session_count_ge(3) is False


def test_session_count_by_source(db) -> None:
    add(db, "a", 100.0, source="cli")
    add(db, "b", 110.0, source="")
    add(db, "c", 120.0, source="tui")
    add(db, "d", 130.0, source="tui", parent="c")
    add(db, "e", 140.0, source="tui")
    flag(db, "e", archived=1)
    assert db.session_count_by_source() == {"cli": 2, "tui": 2}
    assert db.session_count_by_source(exclude_children=True) == {"cli": 2, "tui": 1}
    assert db.session_count_by_source(include_archived=True) == {"cli": 2, "tui": 3}
    assert db.session_count_by_source(archived_only=True) == {"tui": 1}


# ---------------------------------------------------------------------- search_sessions / by id


def test_search_sessions_by_workspace(db) -> None:
    add(db, "root_match", 100.0, git_repo_root="/w/app", cwd="/elsewhere")
    add(db, "cwd_under", 200.0, cwd="/w/app/src")
    add(db, "cwd_same", 300.0, cwd="/w/app")
    add(db, "sibling", 400.0, cwd="/w/apple")
    add(db, "other_root", 500.0, git_repo_root="/w/other", cwd="/w/app")
    found = db.search_sessions(workspace_key="/w/app")
    assert ids(found) == ["cwd_same", "cwd_under", "root_match"]
    assert len(db.search_sessions()) == 5


def test_search_sessions_orders_by_activity_then_start_then_id(db) -> None:
    add(db, "a", 100.0, user="x", said_at=500.0)
    add(db, "b", 300.0)
    add(db, "c", 200.0, user="y", said_at=300.0)  # last_active 300 = b's start; c started earlier
    assert ids(db.search_sessions()) == ["a", "b", "c"]


def test_search_sessions_by_id_with_source_filters(db) -> None:
    add(db, "abc_cli", 100.0, source="cli")
    add(db, "abc_tui", 200.0, source="tui")
    assert ids(db.search_sessions_by_id("abc", source="tui")) == ["abc_tui"]
    assert ids(db.search_sessions_by_id("abc", sources=["cli"])) == ["abc_cli"]
    assert ids(db.search_sessions_by_id("abc", exclude_sources=["cli"])) == ["abc_tui"]
    assert ids(db.search_sessions_by_id("abc")) == ["abc_tui", "abc_cli"]


# ---------------------------------------------------------------------- skills and first reply


def test_skill_scaffolded_sessions(db) -> None:
    add(db, "titled_skill", 100.0, user=SKILL)
    db.set_session_title("titled_skill", "Deploy")
    add(db, "untitled_skill", 200.0, user=SKILL)
    add(db, "titled_plain", 300.0, user="hello")
    db.set_session_title("titled_plain", "Plain")
    add(db, "later_skill", 400.0, user="hello first")
    db.append_message("later_skill", "user", SKILL, timestamp=402.0)
    db.set_session_title("later_skill", "Later")
    assert db.list_skill_scaffolded_sessions() == [{"id": "titled_skill", "title": "Deploy", "content": SKILL}]
    assert db.list_skill_scaffolded_sessions(limit=0) == []


def test_get_first_assistant_text(db) -> None:
    add(db, "s", 100.0, user="q")
    db.append_message("s", "assistant", "", timestamp=102.0, tool_calls=[{"id": "1", "function": {"name": "f"}}])
    db.append_message("s", "assistant", "the answer", timestamp=103.0)
    db.append_message("s", "assistant", "later", timestamp=104.0)
    assert db.get_first_assistant_text("s") == "the answer"
    assert db.get_first_assistant_text("missing") == ""


def test_escape_like_is_what_the_listing_filters_use(hermes_state, db) -> None:
    assert hermes_state.escape_like("100%_a\\b") == "100\\%\\_a\\\\b"
    add(db, "a_1", 100.0)
    add(db, "ab1", 200.0)
    add(db, "a%1", 300.0)
    assert ids(db.search_sessions_by_id("a_1")) == ["a_1"]  # '_' is no wildcard
    assert ids(db.search_sessions_by_id("a%")) == ["a%1"]


def test_listing_honours_the_flag_setters(db, clock) -> None:
    clock.now = 1000.0
    add(db, "a", 100.0, user="hi", said_at=150.0)
    add(db, "b", 200.0, user="hi", said_at=250.0)
    add(db, "c", 300.0)
    assert db.set_session_hidden("c", True) and db.set_session_pinned("a", True) and db.set_session_read("b")
    rows = db.list_sessions_rich(limit=1, include_pinned=True)
    assert [(r["id"], r["unread"]) for r in rows] == [("b", False), ("a", False)]
    db.append_message("b", "user", "again", timestamp=2000.0)
    assert db.list_sessions_rich(limit=1)[0]["unread"] is True
    assert db.set_session_read("b", False)
    assert db.list_sessions_rich(limit=1)[0]["unread"] is True  # last_read_at 0.0: everything is newer


def test_a_long_skill_turn_is_read_by_its_head_and_tail(db) -> None:
    huge = SKILL.replace("body " * 400, "body " * 40000)
    add(db, "big", 100.0, user=huge)
    add(db, "short_skill", 200.0, user=SKILL.replace("body " * 400, "b"))
    add(db, "long_plain", 300.0, user="word " * 500)
    rows = {r["id"]: r["preview"] for r in db.list_sessions_rich(compact_rows=True)}
    assert rows == {"big": "/deploy — fix the title leak", "short_skill": "/deploy — fix the title leak",
                    "long_plain": "word " * 12 + "..."}


def test_rich_rows_batch_is_the_single_row_reader_in_one_read(db) -> None:
    add(db, "a", 100.0, user="alpha first", system_prompt="be brief")
    add(db, "b", 200.0, source="telegram", user="bravo first")
    batch = db._get_session_rich_rows_batch(["b", "a", "missing", "a"])
    assert set(batch) == {"a", "b"}
    for sid in ("a", "b"):
        assert batch[sid] == db._get_session_rich_row(sid)
    assert batch["a"]["preview"].startswith("alpha")
    compact = db._get_session_rich_rows_batch(["a"], compact_rows=True)["a"]
    assert "system_prompt" not in compact and compact["preview"] == batch["a"]["preview"]
    assert db._get_session_rich_rows_batch([]) == {}


def test_a_closed_store_raises_a_runtime_error(db) -> None:
    db.close()
    with pytest.raises(RuntimeError, match="closed"):
        db.session_count_by_source()
