"""Hermes v24-v26 display readers through the swapped ``hermes_state`` (v26 reference §2.B, §3, §5.4).

Resume/export caps and their config, the message picker's v25 rules, display-kind
stamping, reactions, the small row-id readers and the pull-request finder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hermes_store.skills import describe_skill_invocation, skill_preview, skill_preview_source

pytestmark = pytest.mark.both_backends

SKILL = (
    '[IMPORTANT: The user has invoked the "deploy" skill, indicating they want you to follow its '
    "instructions. The full skill content is loaded below.]\n\n{body}\n\n"
    "The user has provided the following instruction alongside the skill invocation: {instruction}"
)


def write_config(text: str) -> None:
    (Path(os.environ["HERMES_HOME"]) / "config.yaml").write_text(text, encoding="utf-8")


def session_with(db, sid: str, turns: list[tuple[str, str]], **kw) -> list[int]:
    db.create_session(sid, "cli", **kw)
    return [db.append_message(sid, role, content) for role, content in turns]


# ---------------------------------------------------------------------- caps


def test_module_names_and_defaults(hermes_state) -> None:
    assert hermes_state.MAX_SAFE_RESUME_MESSAGES == 20000 == hermes_state.MAX_SAFE_EXPORT_MESSAGES
    assert hermes_state.REACTIONS_METADATA_KEY == "reactions"
    assert hermes_state.resolved_max_resume_messages() == 20000
    assert hermes_state.resolved_max_export_messages() == 20000


@pytest.mark.parametrize(("value", "expected"), [("5", 5), ("0", 0), ("-3", 20000), ("lots", 20000),
                                                 ("true", 20000), ("[1]", 20000), ("'7'", 7)])
def test_caps_come_from_the_sessions_section(hermes_state, value: str, expected: int) -> None:
    write_config(f"sessions:\n  max_resume_messages: {value}\n  max_export_messages: {value}\n")
    assert hermes_state.resolved_max_resume_messages() == expected
    assert hermes_state.resolved_max_export_messages() == expected


def test_a_bad_sessions_section_gives_the_default(hermes_state) -> None:
    write_config("sessions: 12\n")
    assert hermes_state.resolved_max_resume_messages() == 20000


def test_resume_count_walks_the_parent_chain_and_counts_live_rows(db) -> None:
    session_with(db, "root", [("user", "a"), ("assistant", "b")])
    db.end_session("root", "compression")
    ids = session_with(db, "child", [("user", "c"), ("assistant", "d"), ("user", "e")],
                       parent_session_id="root")
    db.rewind_to_message("child", ids[2])  # "e" is rewound: not live
    assert db.get_resume_message_count("child") == 4
    assert db.get_resume_message_count("root") == 2
    assert db.get_resume_message_count("nope") == 0
    assert db.assert_export_safe("child") == 2


def test_resume_and_export_caps_raise_typed_errors(hermes_state, db) -> None:
    session_with(db, "s", [("user", "a"), ("assistant", "b"), ("user", "c")])
    assert db.assert_resume_safe("s", max_messages=3) == 3
    with pytest.raises(hermes_state.SessionResumeTooLargeError) as raised:
        db.assert_resume_safe("s", max_messages=2)
    assert (raised.value.message_count, raised.value.limit) == (3, 2)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(hermes_state.SessionExportTooLargeError) as too_big:
        db.assert_export_safe("s", max_messages=1)
    assert (too_big.value.session_id, too_big.value.message_count, too_big.value.limit) == ("s", 3, 1)
    assert db.assert_resume_safe("s", max_messages=0) == 0  # 0 disables: nothing counted
    with pytest.raises(ValueError, match="max_messages must be non-negative"):
        db.assert_export_safe("s", max_messages=-1)


def test_caps_follow_config_and_patched_resolvers(hermes_state, db, monkeypatch) -> None:
    session_with(db, "s", [("user", "a"), ("assistant", "b")])
    write_config("sessions:\n  max_resume_messages: 1\n  max_export_messages: 0\n")
    with pytest.raises(hermes_state.SessionResumeTooLargeError):
        db.assert_resume_safe("s")
    assert db.assert_export_safe("s") == 0
    monkeypatch.setattr(hermes_state, "resolved_max_resume_messages", lambda: 5)
    assert db.assert_resume_safe("s") == 2


# ---------------------------------------------------------------------- picker


def test_recent_user_messages_skip_display_events_and_handoffs(db) -> None:
    db.create_session("s", "cli")
    first = db.append_message("s", "user", "hello there")
    db.append_message("s", "user", "/model switched", display_kind="command")
    db.append_message("s", "user", "[CONTEXT COMPACTION] Earlier turns were compacted into this summary")
    db.append_message("s", "user", SKILL.format(body="x" * 3000, instruction="fix the title leak"))
    last = db.append_message("s", "user", "  many\n\nspaces  ")
    got = db.list_recent_user_messages("s")
    assert [g["preview"] for g in got] == ["many spaces", "/deploy — fix the title leak", "hello there"]
    assert got[0]["id"] == last and got[-1]["id"] == first
    assert [g["preview"] for g in db.list_recent_user_messages("s", limit=1)] == ["many spaces"]


def test_describe_skill_invocation() -> None:
    long_turn = SKILL.format(body="y" * 5000, instruction="ship it\nnow")
    assert describe_skill_invocation(long_turn) == "/deploy — ship it now"
    assert describe_skill_invocation(skill_preview_source(long_turn)) == "/deploy — ship it now"
    assert len(skill_preview_source(long_turn)) == 801 and "\x1e" in skill_preview_source(long_turn)
    bare = SKILL.format(body="z", instruction="").rsplit("The user has", 1)[0]
    assert describe_skill_invocation(bare) == "/deploy"
    assert describe_skill_invocation("plain text") is None
    assert skill_preview(SKILL.format(body="b", instruction="w" * 80)) == "/deploy — " + "w" * 50 + "..."


# ---------------------------------------------------------------------- display kinds


def test_stamp_the_newest_matching_live_row(db) -> None:
    ids = session_with(db, "s", [("user", "same"), ("assistant", "same"), ("user", "same")])
    assert db.set_latest_matching_message_display_kind(
        "s", role="user", content="same", display_kind="note", display_metadata={"k": 1}) is True
    rows = {m["id"]: m for m in db.get_messages("s")}
    assert rows[ids[2]]["display_kind"] == "note"
    assert rows[ids[0]]["display_kind"] is None and rows[ids[1]]["display_kind"] is None
    assert db.set_latest_matching_message_display_kind(
        "s", role="user", content="other", display_kind="note") is False


# ---------------------------------------------------------------------- reactions


def test_reactions_one_per_author_toggle_and_clear(db, clock) -> None:
    ids = session_with(db, "s", [("user", "hi"), ("assistant", "hello")])
    row = ids[1]
    got = db.set_message_reaction("s", row, "👍")
    assert got == [{"emoji": "👍", "author": "user", "at": clock.now}]
    db.set_message_reaction("s", row, "🎉", author="bot")
    changed = db.set_message_reaction("s", row, "❤️")  # replaces the user's 👍
    assert sorted((r["author"], r["emoji"]) for r in changed) == [("bot", "🎉"), ("user", "❤️")]
    assert db.get_message_reactions("s", row) == changed
    assert db.set_message_reaction("s", row, "❤️") == [r for r in changed if r["author"] == "bot"]  # toggled off
    assert db.set_message_reaction("s", row, None, author="bot") == []
    assert db.get_message_reactions("s", row) == []
    assert db.set_message_reaction("other", row, "👍") is None
    assert db.get_message_reactions("other", row) == []


def test_reactions_keep_other_display_metadata(db) -> None:
    db.create_session("s", "cli")
    row = db.append_message("s", "assistant", "x", display_kind="card", display_metadata={"title": "T"})
    db.set_message_reaction("s", row, "👍")
    db.set_message_reaction("s", row, None)
    stored = next(m for m in db.get_messages("s") if m["id"] == row)["display_metadata"]
    assert (json.loads(stored) if isinstance(stored, str) else stored) == {"title": "T"}


def test_unseen_reactions_are_taken_once(db) -> None:
    ids = session_with(db, "s", [("user", "question"), ("assistant", "answer")])
    db.set_message_reaction("s", ids[1], "👍")
    db.set_message_reaction("s", ids[0], "👀", author="bot")
    assert db.take_unseen_reactions("s") == [{"row_id": ids[1], "role": "assistant", "emoji": "👍", "text": "answer"}]
    assert db.take_unseen_reactions("s") == []
    assert db.get_message_reactions("s", ids[1])[0]["seen"] is True
    assert [r["emoji"] for r in db.take_unseen_reactions("s", author="bot")] == ["👀"]


# ---------------------------------------------------------------------- row ids and roles


def test_latest_row_ids_skip_blank_and_rewound_rows(db) -> None:
    ids = session_with(db, "s", [("user", "one"), ("assistant", "a"), ("user", "two"), ("user", "   "),
                                 ("assistant", "b"), ("user", "three")])
    db.rewind_to_message("s", ids[5])  # "three" rewound
    assert db.latest_user_message_row_id("s") == ids[2]
    assert db.latest_message_row_id("s", offset=1) == ids[0]
    assert db.latest_message_row_id("s", offset=2) is None
    assert db.latest_message_row_id("s", require_text=False) == ids[3]
    assert db.latest_message_row_id("s", role="assistant") == ids[4]
    assert db.latest_message_row_id("s", role="tool") is None
    assert db.get_message_role("s", ids[1]) == "assistant"
    assert db.get_message_role("other", ids[1]) is None


def test_find_pr_url_messages(db) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    db.create_session("c", "cli")
    db.append_message("a", "tool", "opened https://example.test/o/r/pull/7", tool_call_id="t1")
    db.append_message("a", "assistant", "see https://example.test/o/r/pull/7")
    db.append_message("b", "tool", "no link here", tool_call_id="t2")
    db.append_message("c", "tool", "https://example.test/o/r/pull/9", tool_call_id="t3")
    assert db.find_pr_url_messages(["a", "b"]) == [
        {"session_id": "a", "content": "opened https://example.test/o/r/pull/7"}]
    assert db.find_pr_url_messages([]) == []
