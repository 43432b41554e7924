"""Hermes v23 session lifecycle through the swapped ``hermes_state`` (reference §1.A).

create_session / ensure_session upserts and parent inheritance, session resets, cwd and
git metadata, model / billing route updates and the per-cwd summary.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from .helpers import other_store

pytestmark = pytest.mark.both_backends

ROUTING = ("user_id", "session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json")





def row(db, sid: str) -> dict[str, Any]:
    found = db.get_session(sid)
    assert found is not None, sid
    return found


# ---------------------------------------------------------------------- create / ensure


def test_create_returns_the_id_and_stores_every_accepted_keyword(db, clock) -> None:
    db.create_session("p", "cli")
    kwargs = dict(
        model="m", model_config={"temperature": 0.2}, system_prompt="be brief", user_id="u1",
        session_key="agent:main:telegram:dm:1", chat_id="c1", chat_type="dm", thread_id="t1",
        parent_session_id="p", cwd="/repo", profile_name="work", git_repo_root="/repo",
    )
    assert db.create_session("s", "telegram", **kwargs) == "s"
    got = row(db, "s")
    assert json.loads(got.pop("model_config")) == {"temperature": 0.2}
    for key, value in kwargs.items():
        if key != "model_config":
            assert got[key] == value, key
    assert got["source"] == "telegram" and got["started_at"] == clock.now
    assert got["ended_at"] is None and got["message_count"] == 0


def test_create_stores_an_empty_model_config_as_null(db) -> None:
    db.create_session("s", "cli", model_config={})
    assert row(db, "s")["model_config"] is None


@pytest.mark.parametrize("bad", ["git_branch", "title", "title_source", "archived", "no_such_column"])
def test_create_refuses_other_keywords_with_a_type_error(db, bad: str) -> None:
    with pytest.raises(TypeError, match=bad):
        db.create_session("s", "cli", **{bad: "x"})
    with pytest.raises(TypeError, match=bad):
        db.ensure_session("s", **{bad: "x"})
    assert db.get_session("s") is None


def test_create_is_idempotent(db) -> None:
    assert db.create_session("s", "cli", model="m") == "s"
    first = row(db, "s")
    assert db.create_session("s", "cli", model="m") == "s"
    assert row(db, "s") == first
    assert db.session_count() == 1


def test_existing_row_fills_only_nulls_and_never_changes_source_user_or_start(db, clock) -> None:
    db.create_session("s", "cli", model="m1", cwd="/a")
    started = row(db, "s")["started_at"]
    clock.now += 100
    db.create_session(
        "s", "telegram", model="m2", cwd="/b", user_id="intruder", system_prompt="sp",
        model_config={"k": 1}, session_key="key", chat_id="c", chat_type="group", thread_id="th",
        profile_name="prof", git_repo_root="/b",
    )
    got = row(db, "s")
    assert (got["source"], got["started_at"], got["user_id"]) == ("cli", started, None)
    assert (got["model"], got["cwd"]) == ("m1", "/a")  # set before: kept
    assert got["system_prompt"] == "sp" and json.loads(got["model_config"]) == {"k": 1}
    assert (got["session_key"], got["chat_id"], got["chat_type"], got["thread_id"]) == ("key", "c", "group", "th")
    assert (got["profile_name"], got["git_repo_root"]) == ("prof", "/b")


def test_existing_user_id_is_kept(db) -> None:
    db.create_session("s", "telegram", user_id="alice")
    db.ensure_session("s", "telegram", user_id="bob")
    assert row(db, "s")["user_id"] == "alice"


def test_existing_parent_is_kept(db) -> None:
    for sid in ("p1", "p2"):
        db.create_session(sid, "cli")
    db.create_session("c", "cli", parent_session_id="p1")
    db.create_session("c", "cli", parent_session_id="p2")
    assert row(db, "c")["parent_session_id"] == "p1"


def test_ensure_session_defaults_and_upsert(db) -> None:
    assert db.ensure_session("e") == "e"
    got = row(db, "e")
    assert (got["source"], got["model"]) == ("unknown", None)
    assert db.ensure_session("e", "cli", model="m", cwd="/w") == "e"
    got = row(db, "e")
    assert (got["source"], got["model"], got["cwd"]) == ("unknown", "m", "/w")
    db.ensure_session("e", "cli", model="other")
    assert row(db, "e")["model"] == "m"


def test_child_inherits_workspace_columns_from_a_live_parent_but_not_routing(db) -> None:
    db.create_session("p", "telegram", cwd="/repo/sub", git_repo_root="/repo", user_id="u", session_key="k",
                      chat_id="c", chat_type="dm", thread_id="t")
    db.update_session_cwd("p", "/repo/sub", git_branch="main")
    db.update_session("p", display_name="Alice", origin_json='{"platform": "telegram"}')
    db.create_session("delegate", "tool", parent_session_id="p")
    got = row(db, "delegate")
    assert (got["cwd"], got["git_repo_root"], got["git_branch"]) == ("/repo/sub", "/repo", "main")
    for col in ROUTING:
        assert got[col] is None, col


def test_continuation_of_a_compressed_parent_inherits_routing(db) -> None:
    db.create_session("p", "telegram", cwd="/w", user_id="u", session_key="k", chat_id="c", chat_type="dm",
                      thread_id="t")
    db.update_session("p", display_name="Alice", origin_json='{"chat": "c"}')
    db.end_session("p", "compression")
    db.create_session("c", "telegram", parent_session_id="p")
    got = row(db, "c")
    assert got["cwd"] == "/w"
    assert [got[c] for c in ROUTING] == ["u", "k", "c", "dm", "t", "Alice", '{"chat": "c"}']


def test_inheritance_fills_only_the_childs_nulls(db) -> None:
    db.create_session("p", "telegram", cwd="/parent", git_repo_root="/parent", user_id="u", chat_id="pc")
    db.end_session("p", "compression")
    db.create_session("c", "telegram", parent_session_id="p", cwd="/child", chat_id="cc")
    got = row(db, "c")
    assert (got["cwd"], got["git_repo_root"]) == ("/child", "/parent")
    assert (got["chat_id"], got["user_id"]) == ("cc", "u")


def test_ensure_with_a_parent_inherits_too(db) -> None:
    db.create_session("p", "cli", cwd="/w")
    db.end_session("p", "compression")
    db.update_session("p", user_id="u")
    db.ensure_session("c", "cli", parent_session_id="p")
    assert (row(db, "c")["cwd"], row(db, "c")["user_id"]) == ("/w", "u")


def test_parent_ended_otherwise_passes_no_routing(db) -> None:
    db.create_session("p", "telegram", user_id="u", cwd="/w")
    db.end_session("p", "branched")
    db.create_session("b", "telegram", parent_session_id="p")
    assert (row(db, "b")["cwd"], row(db, "b")["user_id"]) == ("/w", None)


def test_racing_creates_of_one_id_both_succeed(hermes_state, db) -> None:
    second = other_store(hermes_state, db)
    try:
        for n in range(8):
            sid = f"race{n}"
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []

            def create(store, model: str, sid=sid, barrier=barrier, errors=errors) -> None:
                barrier.wait()
                try:
                    assert store.create_session(sid, "cli", model=model) == sid
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=create, args=(db, "a")),
                       threading.Thread(target=create, args=(second, "b"))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            assert row(db, sid)["model"] in {"a", "b"}
        assert db.session_count() == 8
    finally:
        second.close()


# ---------------------------------------------------------------------- promote_to_session_reset


def test_promote_ends_an_open_session(db, clock) -> None:
    db.create_session("s", "cli")
    clock.now += 50
    assert db.promote_to_session_reset("s") is True
    got = row(db, "s")
    assert (got["ended_at"], got["end_reason"]) == (clock.now, "session_reset")


@pytest.mark.parametrize("soft", ["agent_close", "ws_orphan_reap"])
def test_promote_replaces_soft_end_reasons(db, clock, soft: str) -> None:
    db.create_session("s", "cli")
    db.end_session("s", soft)
    clock.now += 50
    assert db.promote_to_session_reset("s", reason="idle") is True
    assert (row(db, "s")["ended_at"], row(db, "s")["end_reason"]) == (clock.now, "idle")


@pytest.mark.parametrize("explicit", ["user_exit", "compression", "session_reset", "branched"])
def test_promote_keeps_explicit_end_reasons(db, clock, explicit: str) -> None:
    db.create_session("s", "cli")
    db.end_session("s", explicit)
    before = row(db, "s")
    clock.now += 50
    assert db.promote_to_session_reset("s") is False
    assert row(db, "s") == before


@pytest.mark.parametrize("sid", ["", None, "unknown"])
def test_promote_of_a_falsy_or_unknown_id_is_false(db, sid) -> None:
    assert db.promote_to_session_reset(sid) is False
    assert db.session_count() == 0


def test_promote_swallows_failures(db) -> None:
    db.create_session("s", "cli")
    db.close()
    assert db.promote_to_session_reset("s") is False


def test_two_racing_promotions_change_the_row_once(hermes_state, db) -> None:
    second = other_store(hermes_state, db)
    try:
        for n in range(6):
            sid = f"r{n}"
            db.create_session(sid, "cli")
            barrier = threading.Barrier(2)
            results: list[bool] = []

            def promote(store, sid=sid, barrier=barrier, results=results) -> None:
                barrier.wait()
                results.append(store.promote_to_session_reset(sid))

            threads = [threading.Thread(target=promote, args=(s,)) for s in (db, second)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results) == [False, True]
            assert row(db, sid)["end_reason"] == "session_reset"
    finally:
        second.close()


# ---------------------------------------------------------------------- cwd and git metadata


def test_update_session_cwd_sets_cwd_and_stripped_git_fields(db) -> None:
    db.create_session("s", "cli")
    assert db.update_session_cwd("s", " /w/x ", git_branch="  feat/a\n", git_repo_root=" /w ") == 1
    got = row(db, "s")
    assert (got["cwd"], got["git_branch"], got["git_repo_root"]) == (" /w/x ", "feat/a", "/w")


def test_update_session_cwd_in_the_same_cwd_never_clears_git_fields_with_blanks(db) -> None:
    """v26: blanks keep the stored fields only while the cwd stays (see test_v26_sessions)."""
    db.create_session("s", "cli")
    db.update_session_cwd("s", "/a", git_branch="main", git_repo_root="/a")
    db.update_session_cwd("s", "/a", git_branch="   ", git_repo_root="")
    db.update_session_cwd("s", "/a")
    got = row(db, "s")
    assert (got["cwd"], got["git_branch"], got["git_repo_root"]) == ("/a", "main", "/a")


@pytest.mark.parametrize(("sid", "cwd"), [("", "/w"), (None, "/w"), ("s", ""), ("s", None)])
def test_update_session_cwd_with_a_falsy_id_or_cwd_is_a_no_op(db, sid, cwd) -> None:
    db.create_session("s", "cli", cwd="/kept")
    db.update_session_cwd(sid, cwd, git_branch="b")
    got = row(db, "s")
    assert (got["cwd"], got["git_branch"]) == ("/kept", None)


def test_update_session_cwd_of_an_unknown_id_is_silent(db) -> None:
    db.update_session_cwd("ghost", "/w")
    assert db.get_session("ghost") is None


def test_update_session_cwd_advances_the_git_metadata_generation(db) -> None:
    db.create_session("s", "cli")
    assert row(db, "s")["git_metadata_generation"] == 0
    db.update_session_cwd("s", "/a")
    db.update_session_cwd("s", "/a", git_branch="main")
    assert row(db, "s")["git_metadata_generation"] == 2


def test_backfill_repo_roots_fills_missing_roots_of_exact_cwds(db) -> None:
    db.create_session("null_root", "cli", cwd="/w")
    db.create_session("blank_root", "cli", cwd="/w")
    db.update_session("blank_root", git_repo_root="")
    db.create_session("has_root", "cli", cwd="/w", git_repo_root="/elsewhere")
    db.create_session("below", "cli", cwd="/w/sub")
    db.create_session("no_cwd", "cli")
    assert db.backfill_repo_roots({"/w": "/w", "": "/x", "/w/sub/": "/w"}) is None
    roots = {sid: row(db, sid)["git_repo_root"] for sid in ("null_root", "blank_root", "has_root", "below", "no_cwd")}
    assert roots == {"null_root": "/w", "blank_root": "/w", "has_root": "/elsewhere", "below": None, "no_cwd": None}


def test_backfill_repo_roots_ignores_unusable_pairs(db) -> None:
    db.create_session("s", "cli", cwd="/w")
    db.backfill_repo_roots({})
    db.backfill_repo_roots({"/w": ""})
    db.backfill_repo_roots({"/w": None})
    assert row(db, "s")["git_repo_root"] is None


# ---------------------------------------------------------------------- model, meta, billing route


def test_update_session_meta_stores_the_text_verbatim(db) -> None:
    db.create_session("s", "cli", model="m1", model_config={"a": 1})
    text = '{ "b" :2,  "_delegate_from": "p" }'
    db.update_session_meta("s", text)
    got = row(db, "s")
    assert (got["model_config"], got["model"]) == (text, "m1")
    db.update_session_meta("s", "not json at all", model="m2")
    got = row(db, "s")
    assert (got["model_config"], got["model"]) == ("not json at all", "m2")


def test_update_session_meta_of_an_unknown_id_writes_nothing(db) -> None:
    db.update_session_meta("ghost", "{}", model="m")
    assert db.get_session("ghost") is None


def test_update_session_model_is_unconditional_and_clears_the_prompt(db) -> None:
    """v25: the prompt names the model, so a switch clears it (and its hash)."""
    db.create_session("s", "cli", model="m1", system_prompt="prompt")
    db.update_session_model("s", "m2")
    got = row(db, "s")
    assert (got["model"], got["system_prompt"], got["system_prompt_hash"]) == ("m2", None, None)
    db.update_session_model("s", None)
    assert row(db, "s")["model"] is None


def test_update_session_billing_route_sets_route_and_clears_the_prompt(db) -> None:
    db.create_session("s", "cli", system_prompt="old prompt")
    db.update_token_counts("s", input_tokens=1, billing_provider="p0", billing_base_url="u0", billing_mode="chat")
    db.update_session_billing_route("s", provider="p1", base_url="u1")
    got = row(db, "s")
    assert (got["billing_provider"], got["billing_base_url"], got["billing_mode"]) == ("p1", "u1", "chat")
    assert got["system_prompt"] is None
    db.update_session_billing_route("s", provider=None, base_url=None, billing_mode="responses")
    got = row(db, "s")
    assert (got["billing_provider"], got["billing_base_url"], got["billing_mode"]) == (None, None, "responses")


def test_update_session_billing_route_is_keyword_only(db) -> None:
    db.create_session("s", "cli")
    with pytest.raises(TypeError):
        db.update_session_billing_route("s", "p", "u")  # type: ignore[misc]


def test_a_cleared_prompt_can_be_set_again(db) -> None:
    db.create_session("s", "cli", system_prompt="first")
    db.update_session_billing_route("s", provider="p", base_url="u")
    db.update_system_prompt("s", "rebuilt")
    assert row(db, "s")["system_prompt"] == "rebuilt"


# ---------------------------------------------------------------------- distinct_session_cwds


def _by_cwd(entries: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    for e in entries:
        assert set(e) == {"cwd", "sessions", "last_active"}
        assert isinstance(e["sessions"], int) and isinstance(e["last_active"], float)
    return {e["cwd"]: (e["sessions"], e["last_active"]) for e in entries}


def test_distinct_session_cwds_groups_exact_cwds(db, clock) -> None:
    clock.now = 1000.0
    db.create_session("a1", "cli", cwd="/a")
    clock.now = 2000.0
    db.create_session("a2", "cli", cwd="/a")
    clock.now = 5000.0
    db.end_session("a1", "user_exit")  # ended after a2 started: its end counts
    clock.now = 3000.0
    db.create_session("child", "tool", cwd="/a/", parent_session_id="a1")
    db.create_session("blank", "cli", cwd="   ")
    db.create_session("empty", "cli")
    db.update_session("empty", cwd="")
    db.create_session("none", "cli")
    assert _by_cwd(db.distinct_session_cwds()) == {"/a": (2, 5000.0), "/a/": (1, 3000.0)}


def test_distinct_session_cwds_counts_children(db, clock) -> None:
    db.create_session("p", "cli", cwd="/w")
    db.create_session("c", "cli", parent_session_id="p")  # inherits /w
    assert _by_cwd(db.distinct_session_cwds()) == {"/w": (2, clock.now)}


def test_distinct_session_cwds_leaves_archived_out_unless_asked(db, clock) -> None:
    db.create_session("live", "cli", cwd="/w")
    clock.now += 10
    db.create_session("old", "cli", cwd="/w")
    db.create_session("gone", "cli", cwd="/archived-only")
    db.update_session("old", archived=1)
    db.update_session("gone", archived=1)
    assert _by_cwd(db.distinct_session_cwds()) == {"/w": (1, clock.now - 10)}
    assert _by_cwd(db.distinct_session_cwds(include_archived=True)) == {
        "/w": (2, clock.now), "/archived-only": (1, clock.now),
    }


def test_distinct_session_cwds_of_an_empty_store(db) -> None:
    assert db.distinct_session_cwds() == []
