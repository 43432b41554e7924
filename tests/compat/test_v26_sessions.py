"""Hermes v26 sessions and metadata through the swapped ``hermes_state`` (v26 reference §2.A).

create/ensure with the gateway columns, profile inheritance and the ``_reset_from``-only
config rule; reopen's legacy reset stamp (§5.2); git metadata generations; model and
model_config edits; title provenance.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

import pytest

from .helpers import other_store

pytestmark = pytest.mark.both_backends


def row(db, sid: str) -> dict[str, Any]:
    found = db.get_session(sid)
    assert found is not None, sid
    return found


def config(db, sid: str) -> dict[str, Any] | None:
    text = row(db, sid)["model_config"]
    return None if text is None else json.loads(text)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------- create / ensure


def test_display_name_and_origin_json_are_stored_and_only_fill_nulls(db) -> None:
    db.create_session("s", "telegram", display_name="Alice", origin_json='{"chat": 1}')
    assert (row(db, "s")["display_name"], row(db, "s")["origin_json"]) == ("Alice", '{"chat": 1}')
    db.ensure_session("s", "telegram", display_name="Mallory", origin_json='{"chat": 2}')
    assert (row(db, "s")["display_name"], row(db, "s")["origin_json"]) == ("Alice", '{"chat": 1}')
    db.ensure_session("t", display_name=None)
    db.create_session("t", "cli", display_name="Bob", origin_json="{}")
    assert (row(db, "t")["display_name"], row(db, "t")["origin_json"]) == ("Bob", "{}")


def test_children_inherit_a_missing_profile_name(db) -> None:
    db.create_session("p", "cli", profile_name="work")
    db.create_session("inherits", "tool", parent_session_id="p")
    db.create_session("own", "tool", parent_session_id="p", profile_name="home")
    assert row(db, "inherits")["profile_name"] == "work"
    assert row(db, "own")["profile_name"] == "home"
    db.create_session("bare", "cli")
    db.create_session("kid", "cli", parent_session_id="bare")
    assert row(db, "kid")["profile_name"] is None


def test_a_reset_only_config_takes_the_incoming_one_and_keeps_the_marker(db) -> None:
    db.create_session("old", "telegram")
    db.create_session("s", "telegram", model_config={"_reset_from": "old"})
    db.create_session("s", "telegram", model_config={"model": "m", "provider": "p", "_reset_from": "other"})
    assert config(db, "s") == {"model": "m", "provider": "p", "_reset_from": "old"}
    # Once the config holds more than the marker, it is kept as v23 keeps any value.
    db.create_session("s", "telegram", model_config={"model": "later"})
    assert config(db, "s") == {"model": "m", "provider": "p", "_reset_from": "old"}


def test_other_stored_configs_are_never_replaced(db) -> None:
    db.create_session("a", "cli", model_config={"_branched_from": "x"})
    db.create_session("a", "cli", model_config={"model": "m"})
    assert config(db, "a") == {"_branched_from": "x"}
    db.create_session("b", "cli", model_config={"_reset_from": "x"})
    db.ensure_session("b", "cli", model="m")  # no incoming config: the marker alone stays
    assert config(db, "b") == {"_reset_from": "x"}


# ---------------------------------------------------------------------- reopen_session (§5.2)


def _legacy_reset(db, end_reason: str = "session_reset") -> None:
    db.create_session("p", "telegram", session_key="agent:main:telegram:dm:1")
    db.end_session("p", end_reason)
    db.create_session("child", "telegram", parent_session_id="p", session_key="agent:main:telegram:dm:1",
                      model_config={"model": "m"})


@pytest.mark.parametrize("reason", ["session_reset", "session_switch", "idle", "daily", "suspended",
                                    "resume_pending_expired"])
def test_reopen_stamps_legacy_reset_children_first(db, reason: str) -> None:
    _legacy_reset(db, reason)
    db.reopen_session("p")
    assert config(db, "child") == {"model": "m", "_reset_from": "p"}
    assert (row(db, "p")["ended_at"], row(db, "p")["end_reason"]) == (None, None)


def test_reopen_leaves_other_children_alone(db) -> None:
    _legacy_reset(db)
    db.create_session("marked", "telegram", parent_session_id="p", session_key="agent:main:telegram:dm:1",
                      model_config={"_reset_from": "elsewhere"})
    db.create_session("other_key", "telegram", parent_session_id="p", session_key="agent:main:telegram:dm:2")
    db.create_session("no_key", "telegram", parent_session_id="p")
    db.reopen_session("p")
    assert config(db, "marked") == {"_reset_from": "elsewhere"}
    assert config(db, "other_key") is None and config(db, "no_key") is None


def test_reopen_after_a_non_reset_end_stamps_nothing(db) -> None:
    _legacy_reset(db, "user_exit")
    db.reopen_session("p")
    assert config(db, "child") == {"model": "m"}


# ---------------------------------------------------------------------- git metadata (v26)


def test_update_session_cwd_returns_the_generation_it_claims(db) -> None:
    db.create_session("s", "cli")
    assert [db.update_session_cwd("s", "/a") for _ in range(3)] == [1, 2, 3]
    assert row(db, "s")["git_metadata_generation"] == 3
    assert db.update_session_cwd("ghost", "/a") is None
    assert db.update_session_cwd("s", "") is None and db.update_session_cwd("", "/a") is None
    assert row(db, "s")["git_metadata_generation"] == 3


def test_a_new_cwd_replaces_both_git_fields(db) -> None:
    db.create_session("s", "cli")
    db.update_session_cwd("s", "/a", git_branch="main", git_repo_root="/a")
    db.update_session_cwd("s", "/b", git_branch=" dev ")
    got = row(db, "s")
    assert (got["cwd"], got["git_branch"], got["git_repo_root"]) == ("/b", "dev", None)
    db.update_session_cwd("s", "/c", git_branch="  ", git_repo_root="")
    got = row(db, "s")
    assert (got["git_branch"], got["git_repo_root"]) == (None, None)


def test_the_same_cwd_writes_only_given_fields_unless_replacing(db) -> None:
    db.create_session("s", "cli")
    db.update_session_cwd("s", "/a", git_branch="main", git_repo_root="/a")
    db.update_session_cwd("s", "/a", git_repo_root=" /a/root ")
    assert (row(db, "s")["git_branch"], row(db, "s")["git_repo_root"]) == ("main", "/a/root")
    db.update_session_cwd("s", "/a", git_branch="feat", replace_git_meta=True)
    assert (row(db, "s")["git_branch"], row(db, "s")["git_repo_root"]) == ("feat", None)


def test_publish_lands_only_for_the_current_claim(db) -> None:
    db.create_session("s", "cli")
    gen = db.update_session_cwd("s", "/a")
    assert db.publish_session_git_metadata("s", "/a", gen, git_branch=" main ", git_repo_root="") is True
    assert (row(db, "s")["git_branch"], row(db, "s")["git_repo_root"]) == ("main", None)
    assert db.publish_session_git_metadata("s", "/a", gen, git_repo_root="/a") is True  # blanks never clear
    assert (row(db, "s")["git_branch"], row(db, "s")["git_repo_root"]) == ("main", "/a")
    # A -> B -> A: the probe of the first claim is stale even though the cwd is back.
    db.update_session_cwd("s", "/b")
    newest = db.update_session_cwd("s", "/a")
    assert db.publish_session_git_metadata("s", "/a", gen, git_branch="stale") is False
    assert db.publish_session_git_metadata("s", "/b", newest, git_branch="wrong cwd") is False
    assert db.publish_session_git_metadata("s", "/a", newest, git_branch="fresh") is True
    assert row(db, "s")["git_branch"] == "fresh"


@pytest.mark.parametrize("generation", [0, -1, True, 1.0, "1", None])
def test_publish_refuses_generations_that_cannot_be_claims(db, generation) -> None:
    db.create_session("s", "cli")
    db.update_session_cwd("s", "/a")
    assert db.publish_session_git_metadata("s", "/a", generation, git_branch="x") is False
    assert row(db, "s")["git_branch"] is None


def test_publish_refuses_empty_input(db) -> None:
    db.create_session("s", "cli")
    gen = db.update_session_cwd("s", "/a")
    assert db.publish_session_git_metadata("s", "/a", gen) is False
    assert db.publish_session_git_metadata("s", "/a", gen, git_branch=" ", git_repo_root="") is False
    assert db.publish_session_git_metadata("", "/a", gen, git_branch="x") is False
    assert db.publish_session_git_metadata("s", "", gen, git_branch="x") is False
    assert db.publish_session_git_metadata("ghost", "/a", gen, git_branch="x") is False


def test_a_claim_by_another_process_invalidates_an_older_probe(hermes_state, db) -> None:
    second = other_store(hermes_state, db)
    try:
        db.create_session("s", "cli")
        mine = db.update_session_cwd("s", "/w")
        theirs = second.update_session_cwd("s", "/w")
        assert theirs == mine + 1
        assert db.publish_session_git_metadata("s", "/w", mine, git_branch="late") is False
        assert second.publish_session_git_metadata("s", "/w", theirs, git_branch="current") is True
        assert row(db, "s")["git_branch"] == "current"
    finally:
        second.close()


def test_racing_claims_get_distinct_generations(hermes_state, db) -> None:
    second = other_store(hermes_state, db)
    try:
        db.create_session("s", "cli")
        got: list[int] = []
        barrier = threading.Barrier(2)

        def claim(store) -> None:
            barrier.wait()
            for _ in range(10):
                got.append(store.update_session_cwd("s", "/w"))

        threads = [threading.Thread(target=claim, args=(s,)) for s in (db, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got) == list(range(1, 21))
    finally:
        second.close()


# ---------------------------------------------------------------------- prompts and models (v25)


def test_update_system_prompt_stores_by_hash(db) -> None:
    db.create_session("s", "cli")
    db.update_system_prompt("s", "new prompt")
    got = row(db, "s")
    assert (got["system_prompt"], got["system_prompt_hash"]) == ("new prompt", sha("new prompt"))
    db.update_system_prompt("s", None)
    assert (row(db, "s")["system_prompt"], row(db, "s")["system_prompt_hash"]) == (None, None)


def test_update_session_model_edits_model_config(db) -> None:
    db.create_session("s", "cli", model="m1", system_prompt="prompt", model_config={
        "_branched_from": "root", "browser_model_lock": {"model": "locked"}, "temperature": 0.2, "provider": "p0"})
    db.update_session_model("s", "m2")
    assert config(db, "s") == {"_branched_from": "root", "temperature": 0.2, "provider": "p0", "model": "m2"}
    got = row(db, "s")
    assert (got["model"], got["system_prompt"], got["system_prompt_hash"]) == ("m2", None, None)
    db.update_session_model("s", "", provider="p1")  # falsy model: the config keeps its own
    assert config(db, "s")["model"] == "m2" and config(db, "s")["provider"] == "p1"
    assert row(db, "s")["model"] == ""
    db.update_session_model("ghost", "m")
    assert db.get_session("ghost") is None


def test_update_session_model_on_an_empty_config(db) -> None:
    db.create_session("s", "cli")
    db.update_session_model("s", "m", provider="p")
    assert config(db, "s") == {"model": "m", "provider": "p"}


def test_billing_route_switch_clears_the_prompt_hash(db) -> None:
    db.create_session("s", "cli", system_prompt="prompt")
    assert row(db, "s")["system_prompt_hash"] == sha("prompt")
    db.update_session_billing_route("s", provider="p", base_url="u")
    assert (row(db, "s")["system_prompt"], row(db, "s")["system_prompt_hash"]) == (None, None)


def test_patch_session_model_config_merges_and_deletes(db) -> None:
    db.create_session("s", "cli", model_config={"a": 1, "b": 2})
    assert db.patch_session_model_config("s", {"b": None, "c": {"x": 1}}) is None
    assert config(db, "s") == {"a": 1, "c": {"x": 1}}
    assert db.get_session_model_config_value("s", "c") == {"x": 1}
    assert db.get_session_model_config_value("s", "b", default="d") == "d"
    db.patch_session_model_config("s", {"a": None, "c": None})
    assert row(db, "s")["model_config"] is None  # empty is stored as NULL
    db.patch_session_model_config("ghost", {"a": 1})
    assert db.get_session("ghost") is None
    assert db.get_session_model_config_value("ghost", "a", 7) == 7


def test_concurrent_patches_lose_nothing(hermes_state, db) -> None:
    second = other_store(hermes_state, db)
    try:
        db.create_session("s", "cli")
        barrier = threading.Barrier(2)

        def patch(store, prefix: str) -> None:
            barrier.wait()
            for n in range(10):
                store.patch_session_model_config("s", {f"{prefix}{n}": n})

        threads = [threading.Thread(target=patch, args=(s, p)) for s, p in ((db, "a"), (second, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert config(db, "s") == {f"{p}{n}": n for p in "ab" for n in range(10)}
    finally:
        second.close()


def test_runtime_lock_is_merged_with_defaults(db, clock) -> None:
    db.create_session("s", "cli", model="m0", system_prompt="prompt", model_config={"keep": True})
    db.update_session_runtime_lock("s", provider="openrouter")
    assert config(db, "s") == {"keep": True, "browser_model_lock": {
        "provider": "openrouter", "model": "", "model_options": {}, "route_source": "", "confirmed": False,
        "updated_at": clock.now}}
    got = row(db, "s")
    assert (got["model"], got["system_prompt"], got["system_prompt_hash"]) == ("m0", None, None)
    clock.now += 5
    db.update_session_runtime_lock("s", model="m1", provider="p", model_options={"effort": "high"},
                                   route_source="picker", confirmed=True)
    assert config(db, "s")["browser_model_lock"] == {
        "provider": "p", "model": "m1", "model_options": {"effort": "high"}, "route_source": "picker",
        "confirmed": True, "updated_at": clock.now}
    assert row(db, "s")["model"] == "m1"
    db.update_session_model("s", "m2")
    assert "browser_model_lock" not in config(db, "s")


def test_runtime_lock_is_keyword_only(db) -> None:
    db.create_session("s", "cli")
    with pytest.raises(TypeError):
        db.update_session_runtime_lock("s", "m")  # type: ignore[misc]


def test_yolo_flag_round_trip(hermes_state, db) -> None:
    db.create_session("s", "cli", model_config={"model": "m"})
    assert hermes_state.SessionDB.session_yolo_enabled(row(db, "s")) is False
    db.set_session_yolo("s", True)
    assert config(db, "s") == {"model": "m", "yolo_mode": True}
    assert db.session_yolo_enabled(row(db, "s")) is True
    db.set_session_yolo("s", False)
    assert hermes_state.SessionDB.session_yolo_enabled(row(db, "s")) is False
    assert hermes_state.SessionDB.session_yolo_enabled(None) is False
    assert hermes_state.SessionDB.session_yolo_enabled({"model_config": "not json"}) is False


@pytest.mark.parametrize(("meta", "expected"), [
    ({"model_config": json.dumps({"gateway_runtime": {"provider": "p", "base_url": None, "api_mode": "chat"},
                                  "provider": "top"})}, {"provider": "p", "api_mode": "chat"}),
    ({"model_config": json.dumps({"gateway_runtime": {"base_url": "u"}, "provider": "top", "base_url": "",
                                  "api_mode": "responses"}), "billing_provider": "bp"},
     {"provider": "top", "api_mode": "responses"}),
    ({"model_config": json.dumps({"base_url": "https://x"})}, {"base_url": "https://x"}),
    ({"model_config": None, "billing_provider": "anthropic"}, {"provider": "anthropic"}),
    ({"model_config": "{broken", "billing_provider": "auto"}, {}),
    ({"billing_provider": "custom"}, {}),
    ({"billing_provider": ""}, {}),
    (None, {}),
])
def test_session_gateway_runtime(hermes_state, meta, expected) -> None:
    assert hermes_state.SessionDB.session_gateway_runtime(meta) == expected


def test_session_gateway_runtime_reads_a_stored_row(db) -> None:
    db.create_session("s", "telegram", model_config={"gateway_runtime": {"provider": "p", "base_url": "u"}})
    assert db.session_gateway_runtime(row(db, "s")) == {"provider": "p", "base_url": "u"}


# ---------------------------------------------------------------------- title provenance (v25)


def test_title_source_constants(hermes_state) -> None:
    assert (hermes_state.TITLE_SOURCE_DERIVED, hermes_state.TITLE_SOURCE_LLM, hermes_state.TITLE_SOURCE_USER) == \
        ("derived", "llm", "user")


def test_a_user_title_always_lands(db) -> None:
    db.create_session("s", "cli")
    db.set_auto_title("s", "generated", source="llm")
    assert db.set_session_title("s", "mine") is True
    assert (db.get_session_title("s"), db.get_session_title_source("s")) == ("mine", "user")
    assert db.set_session_title("s", "mine again") is True
    assert db.set_session_title("s", "") is True
    assert (db.get_session_title("s"), db.get_session_title_source("s")) == (None, None)


def test_automatic_titles_follow_the_ranks(db) -> None:
    db.create_session("s", "cli")
    assert db.set_auto_title("s", "from the first message", source="derived") is True
    assert db.get_session_title_source("s") == "derived"
    assert db.set_auto_title("s", "another derived", source="derived") is False  # same rank
    assert db.set_auto_title_if_empty("s", "generated") is True  # v25: llm replaces derived
    assert (db.get_session_title("s"), db.get_session_title_source("s")) == ("generated", "llm")
    assert db.set_auto_title("s", "regenerated", source="llm") is False
    assert db.set_auto_title("s", "worse", source="derived") is False
    db.set_session_title("s", "typed")
    assert db.set_auto_title("s", "auto", source="llm") is False
    assert db.get_session_title("s") == "typed"


def test_a_title_without_a_source_ranks_as_a_users(db) -> None:
    db.create_session("s", "cli")
    db.set_session_title("s", "old title")
    db._execute_write(lambda c: c.execute("UPDATE sessions SET title_source = NULL WHERE id = 's'"))
    assert db.set_auto_title("s", "auto", source="llm") is False
    assert db.get_session_title("s") == "old title"


def test_set_auto_title_validates_its_source(db) -> None:
    db.create_session("s", "cli")
    for bad in ("user", "robot", None):
        with pytest.raises(ValueError, match="invalid automatic title source"):
            db.set_auto_title("s", "t", source=bad)
    with pytest.raises(TypeError):
        db.set_auto_title("s", "t", "llm")  # type: ignore[misc]
    assert db.get_session_title("s") is None


def test_automatic_titles_keep_the_v23_rules(db) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    db.set_session_title("a", "taken")
    with pytest.raises(ValueError, match="already in use by session a"):
        db.set_auto_title("b", "taken", source="derived")
    assert db.set_auto_title("b", "  Two\tspaces  ", source="derived") is True
    assert db.get_session_title("b") == "Two spaces"
    assert db.set_auto_title("b", " \u200b ", source="llm") is False  # nothing to write over a title
    assert db.set_auto_title("ghost", "t", source="llm") is False
    db.end_session("a", "compression")
    db.create_session("a2", "cli", parent_session_id="a")
    assert db.set_auto_title("a2", "taken", source="llm") is True  # a user title moves down the chain...
    assert (db.get_session_title("a"), db.get_session_title("a2"), db.get_session_title_source("a2")) == \
        (None, "taken", "llm")  # ...recorded as the source that wrote it


def test_set_session_title_source(db) -> None:
    db.create_session("s", "cli")
    assert db.set_session_title_source("s", "llm") is False  # untitled
    db.set_auto_title("s", "t", source="derived")
    assert db.set_session_title_source("s", "user") is True
    assert db.get_session_title_source("s") == "user"
    assert db.set_auto_title("s", "other", source="llm") is False
    with pytest.raises(ValueError, match="invalid title source"):
        db.set_session_title_source("s", "branch")
    assert db.set_session_title_source("ghost", "llm") is False
    assert db.get_session_title_source("ghost") is None


def test_racing_automatic_titles_never_demote(hermes_state, db) -> None:
    """A derived and an llm title racing for one untitled row: the llm one is what stays."""
    second = other_store(hermes_state, db)
    try:
        for n in range(6):
            sid = f"s{n}"
            db.create_session(sid, "cli")
            barrier = threading.Barrier(2)

            def write(store, source: str, sid=sid, n=n, barrier=barrier) -> None:
                barrier.wait()
                store.set_auto_title(sid, f"{source} {n}", source=source)

            threads = [threading.Thread(target=write, args=(db, "derived")),
                       threading.Thread(target=write, args=(second, "llm"))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert (db.get_session_title(sid), db.get_session_title_source(sid)) == (f"llm {n}", "llm")
    finally:
        second.close()
