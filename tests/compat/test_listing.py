"""Hermes v23 §1.J listing and counting, through the swapped ``hermes_state`` module:
``list_sessions_rich``, ``session_count``, ``list_cron_job_runs``, ``search_sessions_by_id``
(and ``search_sessions`` / ``_get_session_rich_row``), on SQLite and PostgreSQL."""

from __future__ import annotations

import inspect
import json
import threading
from typing import Any

import pytest

from hermes_store import errors

pytestmark = pytest.mark.both_backends

E = inspect.Parameter.empty
PK, KW = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
#: What a projected tip brings to its chain's row (Hermes v23 list).
TIP_KEYS = ("id", "ended_at", "end_reason", "message_count", "tool_call_count", "title", "last_active", "preview",
            "model", "system_prompt", "cwd", "git_branch", "git_repo_root")


def add(db, sid: str, started: float, *, source: str = "cli", parent: str | None = None, config: Any = None,
        user: str | None = None, said_at: float | None = None, ended: float | None = None,
        end_reason: str | None = None, **create: Any) -> str:
    """A session started at ``started``; optionally one user message, an end, a raw model_config."""
    kwargs = dict(create)
    if parent is not None:
        kwargs["parent_session_id"] = parent
    if isinstance(config, dict):
        kwargs["model_config"] = config
    db.create_session(sid, source, **kwargs)
    if isinstance(config, str):
        db.update_session_meta(sid, config)
    db.update_session(sid, started_at=started)
    if user is not None:
        db.append_message(sid, "user", user, timestamp=said_at if said_at is not None else started + 1)
    if end_reason is not None:
        db.update_session(sid, ended_at=ended if ended is not None else started + 5, end_reason=end_reason)
    return sid


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in rows]


def pairs(rows: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(r["id"], r.get("_lineage_root_id")) for r in rows]


# ---------------------------------------------------------------------------- signatures


def _params(fn) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_are_hermes_v26(hermes_state) -> None:
    S = hermes_state.SessionDB
    assert _params(S.list_sessions_rich) == [
        ("self", PK, E), ("source", PK, None), ("sources", PK, None), ("exclude_sources", PK, None),
        ("cwd_prefix", PK, None), ("limit", PK, 20), ("offset", PK, 0), ("include_children", PK, False),
        ("min_message_count", PK, 0), ("project_compression_tips", PK, True), ("order_by_last_active", PK, False),
        ("include_archived", PK, False), ("archived_only", PK, False), ("id_query", PK, None),
        ("search_query", PK, None), ("compact_rows", PK, False), ("include_pinned", PK, False),
        ("session_key", PK, None), ("include_hidden", PK, False),
    ]
    assert _params(S.session_count) == [
        ("self", PK, E), ("source", PK, None), ("sources", PK, None), ("cwd_prefix", PK, None),
        ("min_message_count", PK, 0), ("include_archived", PK, False), ("archived_only", PK, False),
        ("exclude_children", PK, False), ("exclude_sources", PK, None),
    ]
    assert _params(S.list_cron_job_runs) == [("self", PK, E), ("job_id", PK, E), ("limit", PK, 20), ("offset", PK, 0)]
    assert _params(S.search_sessions_by_id) == [
        ("self", PK, E), ("query", PK, E), ("limit", PK, 20), ("include_archived", PK, True), ("source", PK, None),
        ("sources", PK, None), ("exclude_sources", PK, None)]
    assert _params(S.search_sessions) == [("self", PK, E), ("source", PK, None), ("limit", PK, 20), ("offset", PK, 0),
                                          ("workspace_key", PK, None)]


def test_positional_calls_follow_the_v26_order(db) -> None:
    """v26 put ``sources`` 2nd: cwd_prefix is 4th and min_message_count 8th (session_count: 4th)."""
    add(db, "in_proj", 100.0, cwd="/proj", user="hi")
    db.append_message("in_proj", "assistant", "hello", timestamp=102.0)
    add(db, "in_proj_quiet", 200.0, cwd="/proj", user="one")
    add(db, "elsewhere", 300.0, cwd="/other", user="hi")
    assert ids(db.list_sessions_rich(None, None, None, "/proj")) == ["in_proj_quiet", "in_proj"]
    assert ids(db.list_sessions_rich(None, None, None, "/proj", 20, 0, False, 2)) == ["in_proj"]
    assert ids(db.list_sessions_rich(None, None, None, None, 1, 1)) == ["in_proj_quiet"]
    assert db.session_count(None, None, "/proj", 2) == 1
    assert db.session_count("cli") == 3  # source is still first


# ---------------------------------------------------------------------------- basics


def test_rows_are_session_rows_with_preview_and_last_active_newest_start_first(db) -> None:
    add(db, "a", 100.0, user="line one\nline two " + "x" * 80, said_at=150.0)
    add(db, "b", 200.0)
    add(db, "c", 200.0)  # same start as b: id breaks the tie, highest first
    rows = db.list_sessions_rich()
    assert ids(rows) == ["c", "b", "a"]
    a = rows[2]
    assert a["preview"] == ("line one line two " + "x" * 80)[:60] + "..."
    assert a["last_active"] == 150.0 and a["started_at"] == 100.0 and a["source"] == "cli"
    assert rows[0]["preview"] == "" and rows[0]["last_active"] == 200.0
    assert set(db.get_session("a")) <= set(a)
    assert ids(db.list_sessions_rich(limit=2, offset=1)) == ["b", "a"]
    assert db.list_sessions_rich(limit=0) == [] and db.list_sessions_rich(offset=10) == []


def test_preview_is_the_first_user_message_and_multimodal_text_is_joined(db) -> None:
    add(db, "s", 100.0)
    db.append_message("s", "assistant", "not me", timestamp=101.0)
    db.append_message("s", "user", [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {}},
                                    {"type": "text", "text": "here"}], timestamp=102.0)
    db.append_message("s", "user", "later", timestamp=103.0)
    assert db.list_sessions_rich()[0]["preview"] == "look here"


def test_source_filters(db) -> None:
    add(db, "a", 1.0, source="cli")
    add(db, "b", 2.0, source="telegram")
    add(db, "c", 3.0, source="tui")
    assert ids(db.list_sessions_rich(source="cli")) == ["a"]
    assert ids(db.list_sessions_rich(exclude_sources=["tui", "cli"])) == ["b"]
    assert ids(db.list_sessions_rich(source=["cli", "tui"])) == ["c", "a"]  # ours: several sources
    assert ids(db.list_sessions_rich(source="")) == ["c", "b", "a"]  # falsy: no filter
    assert db.session_count(exclude_sources=["cli"]) == 2 and db.session_count(source="tui") == 1


def test_bad_counts_get_a_typed_error(db) -> None:
    with pytest.raises(errors.InvalidInputError):
        db.list_sessions_rich(limit="many")
    with pytest.raises(errors.InvalidInputError):
        db.session_count(min_message_count="x")
    with pytest.raises(errors.InvalidInputError):
        db.list_sessions_rich(cwd_prefix=42)


# ---------------------------------------------------------------------------- children


def test_child_filter_keeps_roots_and_branches_and_drops_delegates(db) -> None:
    add(db, "root", 100.0)
    add(db, "early", 140.0, parent="root")  # started before the branch point
    db.update_session("root", ended_at=150.0, end_reason="branched")
    add(db, "legacy_branch", 160.0, parent="root")  # legacy rule: parent 'branched', started after its end
    add(db, "live", 200.0)
    add(db, "marked_branch", 210.0, parent="live", config={"_branched_from": "live"})  # marker: any time
    add(db, "plain_child", 220.0, parent="live")
    add(db, "delegate", 230.0, parent="live", config={"_delegate_from": "live"})
    add(db, "delegate_of_branched", 240.0, parent="root", config={"_delegate_from": "root"})
    add(db, "orphan_delegate", 250.0, config={"_delegate_from": "__orphaned__"})  # v16 backfill marker
    add(db, "branch_and_delegate", 260.0, parent="live", config={"_branched_from": "live", "_delegate_from": "live"})
    assert ids(db.list_sessions_rich(limit=100)) == ["marked_branch", "live", "legacy_branch", "root"]
    everything = ids(db.list_sessions_rich(include_children=True, limit=100))
    assert sorted(everything) == sorted(
        ["root", "early", "legacy_branch", "live", "marked_branch", "plain_child", "delegate",
         "delegate_of_branched", "orphan_delegate", "branch_and_delegate"])
    assert db.session_count(exclude_children=True) == 4
    assert db.session_count() == 10


@pytest.mark.parametrize("config", [
    '{"_delegate_from": "x" ',                       # malformed JSON mentioning the key
    '{"_delegate_from": null}',                      # JSON null is no marker
    '{"nested": {"_delegate_from": "x"}}',           # not a top-level key
    '{"note": "copied _delegate_from somewhere"}',   # inside a string value
    '{"_DELEGATE_FROM": "x"}',                       # another key (SQLite's LIKE would fold case)
    '["_delegate_from"]',                            # not an object
])
def test_text_that_only_looks_like_a_delegate_marker_is_not_one(db, config: str) -> None:
    add(db, "root_lookalike", 100.0, config=config)
    add(db, "parent", 200.0)
    db.update_session("parent", ended_at=210.0, end_reason="branched")
    add(db, "branch_lookalike", 220.0, parent="parent", config=config)
    add(db, "real", 300.0, config={"_delegate_from": "__orphaned__"})
    assert ids(db.list_sessions_rich()) == ["branch_lookalike", "parent", "root_lookalike"]
    assert db.session_count(exclude_children=True) == 3


@pytest.mark.parametrize("config", ['{"_branched_from": "p" ', '{"_branched_from": null}',
                                    '{"x": {"_branched_from": "p"}}'])
def test_text_that_only_looks_like_a_branch_marker_does_not_list_a_child(db, config: str) -> None:
    add(db, "p", 100.0)
    add(db, "child", 200.0, parent="p", config=config)
    add(db, "real_branch", 300.0, parent="p", config={"_branched_from": "p"})
    assert ids(db.list_sessions_rich()) == ["real_branch", "p"]


def test_a_child_whose_parent_row_is_gone_is_listed(db, backend) -> None:
    """Ours: a dangling parent link (only possible with foreign keys off) hides nothing."""
    add(db, "p", 100.0)
    add(db, "child", 200.0, parent="p")
    assert ids(db.list_sessions_rich()) == ["p"]

    if backend == "sqlite":
        # foreign_keys cannot change inside a transaction: Hermes' raw autocommit connection.
        db._conn.execute("PRAGMA foreign_keys=OFF")
        db._conn.execute("DELETE FROM sessions WHERE id = 'p'")
    else:
        def cut(conn) -> None:  # foreign-key triggers off for this statement only
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            conn.exec_driver_sql("DELETE FROM sessions WHERE id = 'p'")

        db._write(cut)
    assert ids(db.list_sessions_rich()) == ["child"]


# ---------------------------------------------------------------------------- cwd, messages, archive


def test_cwd_prefix_matches_the_folder_and_below_only(db) -> None:
    for i, cwd in enumerate(["/w/proj", "/w/proj/sub", "C:\\w\\proj", "C:\\w\\proj\\x", "/w/proj2", "/w/pro",
                             "/w/p_oj", "/W/PROJ"]):
        add(db, f"s{i}", float(i + 1), cwd=cwd)
    assert ids(db.list_sessions_rich(cwd_prefix="/w/proj", limit=50)) == ["s1", "s0"]
    assert ids(db.list_sessions_rich(cwd_prefix="/w/proj/", limit=50)) == ["s1", "s0"]  # trailing / ignored
    assert ids(db.list_sessions_rich(cwd_prefix="C:\\w\\proj\\", limit=50)) == ["s3", "s2"]
    assert ids(db.list_sessions_rich(cwd_prefix="/w/p_oj", limit=50)) == ["s6"]  # '_' is literal (ours)
    assert ids(db.list_sessions_rich(cwd_prefix="/w/pr%", limit=50)) == []  # '%' is literal (ours)
    assert len(db.list_sessions_rich(cwd_prefix=None, limit=50)) == 8
    assert len(db.list_sessions_rich(cwd_prefix="", limit=50)) == 8  # falsy: no filter
    assert db.session_count(cwd_prefix="/w/proj") == 2


def test_min_message_count(db) -> None:
    add(db, "none", 1.0)
    add(db, "one", 2.0, user="a")
    add(db, "two", 3.0, user="a")
    db.append_message("two", "assistant", "b")
    assert ids(db.list_sessions_rich(min_message_count=2)) == ["two"]
    assert ids(db.list_sessions_rich(min_message_count=1)) == ["two", "one"]
    assert ids(db.list_sessions_rich(min_message_count=0)) == ["two", "one", "none"]
    assert ids(db.list_sessions_rich(min_message_count=-3)) == ["two", "one", "none"]
    assert db.session_count(min_message_count=1) == 2


def test_archived_sessions_are_hidden_unless_asked(db) -> None:
    add(db, "kept", 1.0)
    add(db, "old", 2.0)
    assert db.set_session_archived("old", True) is True
    assert ids(db.list_sessions_rich()) == ["kept"]
    assert ids(db.list_sessions_rich(include_archived=True)) == ["old", "kept"]
    assert ids(db.list_sessions_rich(archived_only=True)) == ["old"]
    assert ids(db.list_sessions_rich(archived_only=True, include_archived=True)) == ["old"]  # archived_only wins
    assert (db.session_count(), db.session_count(include_archived=True), db.session_count(archived_only=True)) == \
        (1, 2, 1)


# ---------------------------------------------------------------------------- compression chains


def chain(db) -> None:
    """root (cli) → mid → tip, every child started *before* its parent's end (v23: no time test)."""
    add(db, "root", 100.0, user="first question", model="m-root", cwd="/r", system_prompt="root prompt")
    db.update_token_counts("root", input_tokens=7, output_tokens=3)
    db.set_session_title("root", "Root title")
    add(db, "mid", 110.0, parent="root", user="middle")
    add(db, "tip", 120.0, parent="mid", source="api", user="continued\nhere", said_at=500.0, model="m-tip",
        system_prompt="tip prompt")
    db.append_message("tip", "assistant", "answer", tool_calls=[{"id": "c", "type": "function",
                                                               "function": {"name": "f", "arguments": "{}"}}],
                      timestamp=501.0)
    db.update_session_cwd("tip", "/t", "feature", "/repo")
    db.update_session("mid", ended_at=300.0, end_reason="compression")
    db.update_session("root", ended_at=200.0, end_reason="compression")
    add(db, "other", 150.0, user="standalone", said_at=151.0)


def test_a_compression_chain_is_listed_once_as_its_tip(db) -> None:
    chain(db)
    rows = db.list_sessions_rich()
    assert pairs(rows) == [("other", None), ("tip", "root")]  # sorted by the root's start
    row, tip, root = rows[1], db._get_session_rich_row("tip"), db._get_session_rich_row("root")
    for key in TIP_KEYS:
        assert row[key] == tip[key], key
    assert (row["cwd"], row["git_branch"], row["git_repo_root"]) == ("/t", "feature", "/repo")
    assert row["preview"] == "continued here" and row["last_active"] == 501.0
    assert row["system_prompt"] == "tip prompt" and row["model"] == "m-tip" and row["tool_call_count"] == 1
    # Everything else stays the listed (root) session's.
    assert (row["source"], row["started_at"], row["input_tokens"], row["parent_session_id"]) == ("cli", 100.0, 7, None)
    assert root["title"] == "Root title" and row["title"] is None  # the tip's title, even when it has none
    assert pairs(db.list_sessions_rich(project_compression_tips=False)) == [("other", None), ("root", None)]
    assert sorted(pairs(db.list_sessions_rich(include_children=True))) == \
        [("mid", None), ("other", None), ("root", None), ("tip", None)]
    assert db.session_count(exclude_children=True) == 2 and db.session_count() == 4


def test_branch_delegate_and_tool_children_do_not_continue_a_chain(db) -> None:
    add(db, "root", 100.0)
    add(db, "branch", 110.0, parent="root", config={"_branched_from": "root"})
    add(db, "delegate", 120.0, parent="root", config={"_delegate_from": "root"})
    add(db, "tool_run", 130.0, parent="root", source="tool")
    db.update_session("root", ended_at=140.0, end_reason="compression")
    assert pairs(db.list_sessions_rich()) == [("branch", None), ("root", None)]
    # Nor are they part of the chain the activity ordering and id_query look through.
    by_id = {q: pairs(db.list_sessions_rich(order_by_last_active=True, id_query=q))
             for q in ("delegate", "tool_run", "branch")}
    assert by_id == {"delegate": [], "tool_run": [], "branch": [("branch", None)]}
    add(db, "lookalike", 150.0, parent="root", config='{"_delegate_from": broken')  # no real marker: continues
    assert pairs(db.list_sessions_rich()) == [("branch", None), ("lookalike", "root")]
    assert pairs(db.list_sessions_rich(order_by_last_active=True, id_query="lookalike")) == [("lookalike", "root")]


def test_the_tip_follows_hermes_preference_at_each_step(db) -> None:
    # compression-ended child first (and then its own continuation), over a newer live one
    add(db, "r1", 100.0, end_reason="compression", ended=150.0)
    add(db, "r1_compressed", 110.0, parent="r1", end_reason="compression", ended=160.0)
    add(db, "r1_next", 120.0, parent="r1_compressed")
    add(db, "r1_live", 130.0, parent="r1", user="newest", said_at=900.0)
    # live before ended-otherwise, even when the other is newer
    add(db, "r2", 200.0, end_reason="compression", ended=250.0)
    add(db, "r2_live", 210.0, parent="r2")
    add(db, "r2_done", 220.0, parent="r2", end_reason="user_exit", user="x", said_at=990.0)
    # two live children: the one with the latest message
    add(db, "r3", 300.0, end_reason="compression", ended=350.0)
    add(db, "r3_busy", 310.0, parent="r3", user="x", said_at=800.0)
    add(db, "r3_new", 320.0, parent="r3", user="x", said_at=700.0)
    rows = db.list_sessions_rich()
    assert pairs(rows) == [("r3_busy", "r3"), ("r2_live", "r2"), ("r1_next", "r1")]
    for tip, root in pairs(rows):
        assert db.get_compression_tip(root) == tip  # the same walk as get_compression_tip


def test_order_by_last_active_uses_the_whole_chain(db) -> None:
    chain(db)  # root started 100, its tip spoke at 501
    add(db, "newer", 400.0, user="x", said_at=450.0)
    add(db, "newest_start", 450.0)
    assert ids(db.list_sessions_rich()) == ["newest_start", "newer", "other", "tip"]
    rows = db.list_sessions_rich(order_by_last_active=True)
    assert pairs(rows) == [("tip", "root"), ("newest_start", None), ("newer", None), ("other", None)]
    assert rows[0]["last_active"] == 501.0
    # A member's activity stamp counts too (v24).
    db.record_session_activity("other", "busy", at=9_000.0)
    assert ids(db.list_sessions_rich(order_by_last_active=True))[0] == "other"
    # Without projection the chain still orders its root.
    assert ids(db.list_sessions_rich(order_by_last_active=True, project_compression_tips=False))[:2] == \
        ["other", "root"]


def test_equal_activity_falls_back_to_start_then_id(db) -> None:
    add(db, "a", 100.0, user="x", said_at=1000.0)
    add(db, "b", 200.0, user="x", said_at=1000.0)
    add(db, "c", 200.0, user="x", said_at=1000.0)
    assert ids(db.list_sessions_rich(order_by_last_active=True)) == ["c", "b", "a"]


COMPACT_DROPS = ("system_prompt", "system_prompt_hash", "git_metadata_generation")


def test_compact_rows_leave_out_the_system_prompt_everywhere(db) -> None:
    """v26: compact rows drop the prompt, its hash and the git probe counter."""
    chain(db)
    rows = db.list_sessions_rich(compact_rows=True)
    assert pairs(rows) == [("other", None), ("tip", "root")]
    for row in rows:
        assert not set(COMPACT_DROPS) & set(row)
        assert {"id", "model_config", "cwd", "archived", "title", "preview", "last_active", "unread"} <= set(row)
    assert rows[1]["cwd"] == "/t"
    full = db.list_sessions_rich()
    assert all(set(COMPACT_DROPS) <= set(r) for r in full)
    assert {k: v for k, v in full[1].items() if k not in COMPACT_DROPS} == rows[1]


def test_a_parent_link_cycle_ends_every_walk(db) -> None:
    add(db, "a", 100.0, end_reason="compression", ended=110.0)
    add(db, "b", 105.0, parent="a", end_reason="compression", ended=120.0, user="x", said_at=130.0)
    db.create_session("a", "cli", parent_session_id="b")  # fills a's NULL parent: a ⇄ b
    assert db.get_session("a")["parent_session_id"] == "b"
    assert db.list_sessions_rich() == []  # neither is a root
    assert sorted(ids(db.list_sessions_rich(include_children=True, order_by_last_active=True))) == ["a", "b"]
    assert ids(db.list_sessions_rich(include_children=True, order_by_last_active=True, id_query="b")) == ["b", "a"]
    assert db.session_count(exclude_children=True) == 0


# ---------------------------------------------------------------------------- id_query / search_query


def test_id_query_needs_order_by_last_active_and_searches_the_chain(db) -> None:
    chain(db)
    add(db, "a_b", 400.0)
    add(db, "axb", 410.0)
    everything = ids(db.list_sessions_rich(limit=50))
    assert ids(db.list_sessions_rich(id_query="nothing-like-this", limit=50)) == everything  # ignored
    assert pairs(db.list_sessions_rich(order_by_last_active=True, id_query="  TIP ")) == [("tip", "root")]
    assert pairs(db.list_sessions_rich(order_by_last_active=True, id_query="mid")) == [("tip", "root")]
    assert pairs(db.list_sessions_rich(order_by_last_active=True, id_query="root")) == [("tip", "root")]
    assert ids(db.list_sessions_rich(order_by_last_active=True, id_query="a_b")) == ["a_b"]  # '_' literal
    assert ids(db.list_sessions_rich(order_by_last_active=True, id_query="%")) == []
    assert len(db.list_sessions_rich(order_by_last_active=True, id_query="   ")) == len(everything)  # blank: off


def test_search_query_matches_titles_and_ids_of_the_chain(db) -> None:
    chain(db)  # the title lives on the root; the listed row shows the tip
    add(db, "s2", 400.0)
    db.set_session_title("s2", "My-App.v2 notes")
    add(db, "s3", 410.0)
    db.set_session_title("s3", "100% done_ok")
    add(db, "s4", 420.0)
    db.set_session_title("s4", "100 x done ok")
    assert ids(db.list_sessions_rich(search_query="my app")) == ["s4", "s3", "s2", "other", "tip"]  # ignored
    assert ids(db.list_sessions_rich(order_by_last_active=True, search_query="ROOT TITLE")) == ["tip"]
    assert ids(db.list_sessions_rich(order_by_last_active=True, search_query="my app")) == ["s2"]
    assert ids(db.list_sessions_rich(order_by_last_active=True, search_query="myappv2")) == ["s2"]
    assert ids(db.list_sessions_rich(order_by_last_active=True, search_query="app.v2")) == ["s2"]
    assert ids(db.list_sessions_rich(order_by_last_active=True, search_query="100%")) == ["s3"]  # literal %
    assert ids(db.list_sessions_rich(order_by_last_active=True, search_query="othe")) == ["other"]  # by id
    assert ids(db.list_sessions_rich(order_by_last_active=True, search_query="tip")) == ["tip"]
    both = db.list_sessions_rich(order_by_last_active=True, search_query="notes", id_query="s2")
    assert ids(both) == ["s2"]
    assert db.list_sessions_rich(order_by_last_active=True, search_query="notes", id_query="s3") == []


# ---------------------------------------------------------------------------- cron runs


def test_cron_job_runs_are_the_jobs_cron_sessions_newest_first(db) -> None:
    add(db, "cron_job1_a", 100.0, source="cron", user="run a", said_at=101.0)
    add(db, "cron_job1_b", 300.0, source="cron")
    add(db, "cron_job1_c", 300.0, source="cron")
    add(db, "cron_job10_x", 400.0, source="cron")     # another job
    add(db, "cron_job1_api", 500.0, source="api")      # not a cron run
    add(db, "cron_job1", 600.0, source="cron")         # no run suffix
    add(db, "CRON_job1_z", 700.0, source="cron")       # case matters
    add(db, "cron_job1_child", 350.0, source="cron", parent="cron_job1_a")  # no child filter
    db.set_session_archived("cron_job1_b", True)       # no archive filter
    rows = db.list_cron_job_runs("job1")
    assert ids(rows) == ["cron_job1_child", "cron_job1_c", "cron_job1_b", "cron_job1_a"]
    assert rows[3]["preview"] == "run a" and rows[3]["last_active"] == 101.0 and rows[3]["source"] == "cron"
    assert ids(db.list_cron_job_runs("job1", limit=2, offset=1)) == ["cron_job1_c", "cron_job1_b"]
    assert ids(db.list_cron_job_runs("job10")) == ["cron_job10_x"]
    assert db.list_cron_job_runs("job") == [] and db.list_cron_job_runs("nope") == []


def test_cron_job_ids_with_wildcards_are_literal(db) -> None:
    add(db, "cron_a_b_1", 1.0, source="cron")
    add(db, "cron_aXb_1", 2.0, source="cron")
    add(db, "cron_a%_1", 3.0, source="cron")
    assert ids(db.list_cron_job_runs("a_b")) == ["cron_a_b_1"]
    assert ids(db.list_cron_job_runs("a%")) == ["cron_a%_1"]


# ---------------------------------------------------------------------------- search_sessions_by_id


def test_search_by_id_ranks_exact_then_prefix_then_substring(db) -> None:
    add(db, "xabc", 100.0, user="x", said_at=900.0)    # substring, most active
    add(db, "abc-2", 200.0, user="x", said_at=800.0)   # prefix
    add(db, "abc", 300.0, user="x", said_at=100.0)     # exact, least active
    add(db, "abc-1", 400.0, user="x", said_at=700.0)   # prefix
    add(db, "zzz", 500.0)
    assert ids(db.search_sessions_by_id("ABC")) == ["abc", "abc-2", "abc-1", "xabc"]
    assert ids(db.search_sessions_by_id(" abc ", limit=2)) == ["abc", "abc-2"]
    assert db.search_sessions_by_id("") == [] and db.search_sessions_by_id("   ") == []
    assert db.search_sessions_by_id("abc", limit=0) == [] and db.search_sessions_by_id("abc", limit=-1) == []


def test_search_by_id_finds_a_chain_by_any_member_and_ranks_its_root_as_exact(db) -> None:
    chain(db)
    add(db, "rooted", 400.0, user="x", said_at=9_000.0)
    rows = db.search_sessions_by_id("root")
    assert pairs(rows) == [("tip", "root"), ("rooted", None)]  # exact via _lineage_root_id, then prefix
    assert pairs(db.search_sessions_by_id("mid")) == [("tip", "root")]


def test_search_by_id_includes_archived_by_default(db) -> None:
    add(db, "arch1", 100.0)
    add(db, "arch2", 200.0)
    db.set_session_archived("arch1", True)
    assert sorted(ids(db.search_sessions_by_id("arch"))) == ["arch1", "arch2"]
    assert ids(db.search_sessions_by_id("arch", include_archived=False)) == ["arch2"]


def test_search_by_id_looks_past_the_first_page_of_activity(db) -> None:
    """Candidates are 4 × limit rows by activity; the exact match is found among them."""
    for i in range(6):
        add(db, f"job-{i}", float(100 + i), user="x", said_at=float(1000 + i))
    add(db, "job", 50.0)  # least active of all
    assert ids(db.search_sessions_by_id("job", limit=2)) == ["job", "job-5"]


# ---------------------------------------------------------------------------- other readers


def test_search_sessions_lists_everything_by_activity(db) -> None:
    chain(db)
    db.set_session_archived("other", True)
    assert ids(db.search_sessions(limit=10)) == ["tip", "other", "mid", "root"]
    assert ids(db.search_sessions(source="api")) == ["tip"]
    assert ids(db.search_sessions(limit=1, offset=1)) == ["other"]
    assert "preview" not in db.search_sessions()[0] and db.search_sessions()[0]["last_active"] == 501.0


def test_rich_row_of_one_session(db) -> None:
    add(db, "s", 100.0, user="hello", said_at=120.0, system_prompt="sp")
    row = db._get_session_rich_row("s")
    assert (row["id"], row["preview"], row["last_active"], row["system_prompt"]) == ("s", "hello", 120.0, "sp")
    assert db._get_session_rich_row("nope") is None


def test_listing_reads_do_not_block_writers(db) -> None:
    """Listing while another thread appends: every call sees a consistent snapshot."""
    add(db, "busy", 100.0)
    errors_seen: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        try:
            for i in range(40):
                db.append_message("busy", "user", f"m{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors_seen.append(exc)
        finally:
            stop.set()

    t = threading.Thread(target=writer)
    t.start()
    counts = []
    while not stop.is_set():
        row = db.list_sessions_rich(order_by_last_active=True)[0]
        counts.append(row["message_count"])
    t.join()
    assert not errors_seen
    assert counts == sorted(counts)  # never goes backwards
    assert db.list_sessions_rich()[0]["message_count"] == 40


def test_model_config_stays_json_text(db) -> None:
    add(db, "s", 1.0, config={"_branched_from": None, "k": 1})
    assert json.loads(db.list_sessions_rich()[0]["model_config"]) == {"_branched_from": None, "k": 1}
