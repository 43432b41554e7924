"""SessionRepository through SessionDB: lifecycle, accounting, titles, listing."""

from __future__ import annotations

import json

import pytest

from hermes_store import InvalidTitleError, SessionDB, TitleConflictError
from hermes_store.repositories import MaintenanceRepository

from .factories import set_times

pytestmark = pytest.mark.both_backends


def test_create_is_idempotent_and_fills_only_nulls(db: SessionDB) -> None:
    assert db.create_session("s1", "cli", model="gpt-x") == "s1"
    db.create_session("s1", "telegram", model="other", system_prompt="be brief", model_config={"t": 1})
    row = db.get_session("s1")
    assert row["source"] == "cli"  # kept
    assert row["model"] == "gpt-x"  # kept
    assert row["system_prompt"] == "be brief"  # was NULL, filled
    assert json.loads(row["model_config"]) == {"t": 1}
    assert db.session_count() == 1


def test_started_at_is_our_create_session_extra(db: SessionDB) -> None:
    """Beyond Hermes' keyword list, create_session takes ``started_at`` (imports, demos);
    like the start Hermes stamps itself, a later create of the same id keeps it."""
    db.create_session("s", "cli", started_at=1234.5)
    db.create_session("s", "cli", started_at=9999.0)
    db.ensure_session("e", started_at=42.0)
    assert (db.get_session("s")["started_at"], db.get_session("e")["started_at"]) == (1234.5, 42.0)
    with pytest.raises(TypeError, match="git_branch"):
        db.create_session("t", "cli", git_branch="main")


def test_ensure_and_get_unknown(db: SessionDB) -> None:
    assert db.get_session("nope") is None
    db.ensure_session("e1")
    assert db.get_session("e1")["source"] == "unknown"
    db.ensure_session("e1", "cli", model="m1")
    assert db.get_session("e1")["model"] == "m1"


def test_first_end_wins_and_reopen(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.end_session("s", "user_exit")
    first = db.get_session("s")
    db.end_session("s", "compression")
    again = db.get_session("s")
    assert (again["ended_at"], again["end_reason"]) == (first["ended_at"], "user_exit")
    db.reopen_session("s")
    row = db.get_session("s")
    assert row["ended_at"] is None and row["end_reason"] is None
    db.update_system_prompt("s", "new prompt")
    assert db.get_session("s")["system_prompt"] == "new prompt"


def test_token_counts_incremental(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=10, output_tokens=5, model="m1", estimated_cost_usd=0.5,
                           billing_provider="openrouter", cost_status="estimated", api_call_count=1)
    db.update_token_counts("s", input_tokens=1, output_tokens=2, cache_read_tokens=3, cache_write_tokens=4,
                           reasoning_tokens=5, model="m2", estimated_cost_usd=0.25, actual_cost_usd=0.1,
                           billing_provider="other", cost_status="final", api_call_count=2)
    db.update_token_counts("s", input_tokens=1)  # no costs given: costs unchanged
    row = db.get_session("s")
    assert (row["input_tokens"], row["output_tokens"]) == (12, 7)
    assert (row["cache_read_tokens"], row["cache_write_tokens"], row["reasoning_tokens"]) == (3, 4, 5)
    assert row["estimated_cost_usd"] == pytest.approx(0.75)
    assert row["actual_cost_usd"] == pytest.approx(0.1)
    assert row["api_call_count"] == 3
    assert row["model"] == "m1"  # back-filled only while NULL
    assert row["billing_provider"] == "openrouter"
    assert row["cost_status"] == "final"  # takes the new value


def test_token_counts_absolute_and_missing_session(db: SessionDB) -> None:
    db.update_token_counts("ghost", input_tokens=4, output_tokens=4, estimated_cost_usd=1.0)
    row = db.get_session("ghost")
    assert row["source"] == "unknown" and row["input_tokens"] == 4
    db.update_token_counts("ghost", input_tokens=100, output_tokens=50, estimated_cost_usd=2.0, absolute=True)
    row = db.get_session("ghost")
    assert (row["input_tokens"], row["output_tokens"], row["estimated_cost_usd"]) == (100, 50, 2.0)


def test_ledger_rows_per_model_route_and_task(db: SessionDB) -> None:
    db.create_session("s", "cli", model="main-model")
    db.update_token_counts("s", input_tokens=10, billing_provider="openrouter", billing_mode="chat")
    db.update_token_counts("s", input_tokens=5)  # main loop inherits the session's route
    db.update_token_counts("s", input_tokens=7, model="vision-model", task="vision")
    db.update_token_counts("s", input_tokens=3, model="vision-model", task="title_generation")

    def rows(conn):
        return conn.execute(
            "SELECT model, billing_provider, billing_mode, task, input_tokens FROM session_model_usage ORDER BY task"
        ).fetchall()

    got = [tuple(r) for r in db._execute_write(rows)]
    assert got == [
        ("main-model", "openrouter", "chat", "", 15),
        ("vision-model", "", "", "title_generation", 3),
        ("vision-model", "", "", "vision", 7),
    ]
    # side tasks do not move the session's own totals
    assert db.get_session("s")["input_tokens"] == 15
    by_task = {u.key[0]: u.input_tokens for u in db.usage(by="task")}
    assert by_task == {"": 15, "vision": 7, "title_generation": 3}
    by_model = {u.key[0]: u.input_tokens for u in db.usage(by="model")}
    assert by_model == {"main-model": 15, "vision-model": 10}


# ---------------------------------------------------------------------- titles


def test_title_sanitized_and_unique(db: SessionDB) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    assert db.set_session_title("a", "  My\u200b  Project\x07\n plan \ufeff") is True
    assert db.get_session_title("a") == "My Project plan"
    assert db.set_session_title("a", "My Project plan") is True  # own title again: fine
    with pytest.raises(TitleConflictError, match="already in use"):
        db.set_session_title("b", "My  Project plan")
    with pytest.raises(ValueError):
        db.set_session_title("b", "My Project plan")
    assert db.get_session_title("b") is None
    assert db.set_session_title("b", "   \u200b ") is True  # empty after cleaning → NULL
    assert db.get_session_title("b") is None
    db.set_session_title("a", None)
    db.set_session_title("b", None)  # NULL never conflicts
    with pytest.raises(InvalidTitleError):
        db.set_session_title("a", "x" * 101)
    assert db.set_session_title("a", "x" * 100) is True
    assert db.set_session_title("missing", "t") is False


def test_get_and_resolve_by_title_with_numbering(db: SessionDB) -> None:
    for i, sid in enumerate(["base", "n2", "n3", "other"]):
        db.create_session(sid, "cli")
        set_times(db, sid, started_at=1000.0 + i)
    db.set_session_title("base", "refactor")
    assert db.get_session_by_title("refactor")["id"] == "base"
    assert db.resolve_session_by_title("refactor") == "base"
    assert db.get_next_title_in_lineage("refactor") == "refactor #2"
    db.set_session_title("n2", "refactor #2")
    db.set_session_title("n3", "refactor #3")
    assert db.resolve_session_by_title("refactor") == "n3"
    assert db.get_next_title_in_lineage("refactor") == "refactor #4"
    assert db.get_next_title_in_lineage("refactor #2") == "refactor #4"
    assert db.get_next_title_in_lineage("fresh") == "fresh"
    assert db.resolve_session_by_title("unknown") is None
    # LIKE wildcards are literal
    db.set_session_title("other", "100% done_x")
    assert db.resolve_session_by_title("100% done_x") == "other"
    assert db.resolve_session_by_title("100_ done%x") is None
    assert db.get_next_title_in_lineage("1%") == "1%"


def test_resolve_session_id_prefix(db: SessionDB) -> None:
    for sid in ["abc_123", "abd456", "abc%999"]:
        db.create_session(sid, "cli")
    assert db.resolve_session_id("abc_123") == "abc_123"
    assert db.resolve_session_id("abd") == "abd456"
    assert db.resolve_session_id("ab") is None  # ambiguous
    assert db.resolve_session_id("abc_") == "abc_123"  # '_' literal, not any-char
    assert db.resolve_session_id("abc%") == "abc%999"
    assert db.resolve_session_id("zzz") is None
    assert db.resolve_session_id("") is None


# ---------------------------------------------------------------------- listing


def _session(db: SessionDB, sid: str, started: float, source: str = "cli", parent: str | None = None,
             first_user: str | None = None) -> None:
    db.create_session(sid, source, parent_session_id=parent)
    set_times(db, sid, started_at=started)
    if first_user is not None:
        db.append_message(sid, "assistant", "hi there")
        db.append_message(sid, "user", first_user)


def test_listing_preview_and_last_active(db: SessionDB) -> None:
    _session(db, "s1", 1000.0, first_user="line one\nline two " + "x" * 80)
    _session(db, "s2", 2000.0)
    rows = db.list_sessions_rich()
    assert [r["id"] for r in rows] == ["s2", "s1"]
    s1 = rows[1]
    assert s1["preview"] == ("line one line two " + "x" * 80)[:60] + "..."
    assert s1["last_active"] > 1000.0
    assert rows[0]["preview"] == "" and rows[0]["last_active"] == 2000.0
    short = db.list_sessions_rich(limit=1, offset=1)
    assert [r["id"] for r in short] == ["s1"]


def test_listing_hides_children_but_shows_branches(db: SessionDB) -> None:
    _session(db, "root", 1000.0)
    set_times(db, "root", ended_at=1500.0, end_reason="branched")
    _session(db, "branch", 1600.0, parent="root")
    _session(db, "early_child", 1200.0, parent="root")  # started before the branch point
    _session(db, "delegate_parent", 3000.0)
    _session(db, "delegate", 3100.0, parent="delegate_parent")
    ids = [r["id"] for r in db.list_sessions_rich()]
    assert ids == ["delegate_parent", "branch", "root"]
    all_ids = {r["id"] for r in db.list_sessions_rich(include_children=True, limit=100)}
    assert all_ids == {"root", "branch", "early_child", "delegate_parent", "delegate"}


def test_listing_projects_compression_tip(db: SessionDB) -> None:
    _session(db, "c0", 1000.0, first_user="first question")
    set_times(db, "c0", ended_at=1100.0, end_reason="compression")
    _session(db, "c1", 1100.0, parent="c0")
    set_times(db, "c1", ended_at=1200.0, end_reason="compression")
    _session(db, "c2", 1200.0, parent="c1", first_user="continued")
    _session(db, "mid", 1050.0)
    rows = db.list_sessions_rich()
    assert [r["id"] for r in rows] == ["mid", "c2"]  # tip, sorted by the root's start
    tip = rows[1]
    assert tip["_lineage_root_id"] == "c0"
    assert "_lineage_root_id" not in rows[0]
    plain = db.list_sessions_rich(project_compression_tips=False)
    assert [r["id"] for r in plain] == ["mid", "c0"]
    # chain-wide activity ordering: the chain was active most recently
    by_activity = db.list_sessions_rich(order_by_last_active=True)
    assert [r["id"] for r in by_activity] == ["c2", "mid"]


def test_listing_source_filters(db: SessionDB) -> None:
    _session(db, "a", 1.0, source="cli")
    _session(db, "b", 2.0, source="telegram")
    _session(db, "c", 3.0, source="tui")
    assert [r["id"] for r in db.list_sessions_rich(source="cli")] == ["a"]
    assert [r["id"] for r in db.list_sessions_rich(exclude_sources=["tui", "cli"])] == ["b"]
    assert db.session_count() == 3 and db.session_count("tui") == 1


def test_search_sessions_orders_by_last_activity(db: SessionDB) -> None:
    _session(db, "old_but_active", 1000.0)
    _session(db, "new_idle", 2000.0)
    db.append_message("old_but_active", "user", "ping")
    rows = db.search_sessions()
    assert [r["id"] for r in rows] == ["old_but_active", "new_idle"]
    assert rows[0]["last_active"] > rows[1]["last_active"]
    assert [r["id"] for r in db.search_sessions(limit=1, offset=1)] == ["new_idle"]


def test_usage_by_route_and_hermes_stats_query(db: SessionDB) -> None:
    db.create_session("a", "cli", model="m1")
    db.create_session("b", "telegram", model="m2")
    db.update_token_counts("a", input_tokens=10, output_tokens=1, billing_provider="openrouter",
                           billing_base_url="https://or", billing_mode="chat", estimated_cost_usd=0.5, api_call_count=1)
    db.update_token_counts("b", input_tokens=20, output_tokens=2, billing_provider="anthropic", estimated_cost_usd=0.25)
    db.update_token_counts("b", input_tokens=5, model="m3", task="compression", billing_provider="openrouter",
                           billing_base_url="https://or", billing_mode="chat")
    routes = {u.key: (u.sessions, u.input_tokens) for u in db.usage(by="route")}
    assert routes == {("openrouter", "https://or", "chat"): (2, 15), ("anthropic", "", ""): (1, 20)}
    assert {u.key for u in db.usage(by="model_task")} == {("m1", ""), ("m2", ""), ("m3", "compression")}
    stats = {u.key[0]: (u.sessions, u.input_tokens, u.estimated_cost_usd) for u in
             db._read(lambda c: MaintenanceRepository(c).stats_by_model())}
    assert stats == {"m1": (1, 10, 0.5), "m2": (1, 20, 0.25)}  # session totals: side tasks excluded
    assert [u.key for u in db.usage(by="model", source="telegram")] == [("m2",), ("m3",)]


def test_head_columns_are_exposed(db: SessionDB) -> None:
    db.create_session("s", "cli", cwd="/work")
    db.update_session_cwd("s", "/work", git_branch="main")  # v23: not a create_session keyword
    db.update_session("s", archived=1, display_name="Shown")
    row = db.get_session("s")
    assert (row["cwd"], row["git_branch"], row["archived"], row["display_name"]) == ("/work", "main", 1, "Shown")
    assert row["rewind_count"] == 0 and row["compression_fallback_streak"] == 0
    mid = db.append_message("s", "user", "hi", platform_message_id="tg-42", api_content="raw")
    db.rewind_to_message("s", mid)  # v23: the row stays stored, inactive
    assert db.get_messages("s") == []  # v23: readers return live rows unless asked
    msg = db.get_messages("s", include_inactive=True)[0]
    assert msg["id"] == mid
    assert (msg["platform_message_id"], msg["api_content"], msg["active"], msg["compacted"]) == ("tg-42", "raw", 0, 0)
    assert msg["observed"] == 0
