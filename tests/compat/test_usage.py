"""Hermes v23 token/cost accounting through the swapped ``hermes_state`` (reference §1.D).

update_token_counts (route-fill gating, first accounted route, per-model ledger deltas)
and record_auxiliary_usage.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import text

pytestmark = pytest.mark.both_backends

ROUTE = ("model", "billing_provider", "billing_base_url", "billing_mode")




def row(db, sid: str) -> dict[str, Any]:
    found = db.get_session(sid)
    assert found is not None, sid
    return found


def route(db, sid: str) -> tuple:
    got = row(db, sid)
    return tuple(got[c] for c in ROUTE)


def ledger(db, sid: str | None = None) -> list[dict[str, Any]]:
    """Rows of session_model_usage, in key order."""
    where = "" if sid is None else " WHERE session_id = :sid"
    sql = text(
        "SELECT * FROM session_model_usage" + where
        + " ORDER BY session_id, task, model, billing_provider, billing_base_url, billing_mode"
    )
    return db._read(lambda c: [dict(r) for r in c.execute(sql, {"sid": sid}).mappings()])


def keys(rows: list[dict[str, Any]]) -> list[tuple]:
    return [(r["model"], r["billing_provider"], r["billing_base_url"], r["billing_mode"], r["task"]) for r in rows]


# ---------------------------------------------------------------------- ensuring the row


def test_an_unknown_session_is_created_with_source_unknown(db) -> None:
    db.update_token_counts("ghost", input_tokens=4, output_tokens=2, model="m")
    got = row(db, "ghost")
    assert (got["source"], got["input_tokens"], got["output_tokens"], got["model"]) == ("unknown", 4, 2, "m")


def test_a_zero_usage_call_fills_a_null_model_but_not_the_route(db) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", model="m", billing_provider="p", billing_base_url="u", billing_mode="chat")
    assert route(db, "s") == ("m", None, None, None)
    assert ledger(db) == []
    got = row(db, "s")
    assert (got["input_tokens"], got["api_call_count"], got["estimated_cost_usd"]) == (0, 0, None)


def test_a_zero_usage_call_keeps_an_existing_model(db) -> None:
    db.create_session("s", "cli", model="kept")
    db.update_token_counts("s", model="other")
    assert row(db, "s")["model"] == "kept"


# ---------------------------------------------------------------------- summary counters


def test_counters_add_up_and_costs_treat_null_as_zero(db) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=10, output_tokens=5, cache_read_tokens=3, cache_write_tokens=2,
                           reasoning_tokens=1, estimated_cost_usd=0.5, api_call_count=1, cost_status="estimated",
                           cost_source="table", pricing_version="v1")
    db.update_token_counts("s", input_tokens=1, output_tokens=1, estimated_cost_usd=0.25, actual_cost_usd=0.1,
                           api_call_count=2, cost_status="final")
    db.update_token_counts("s", input_tokens=1)  # no costs: costs unchanged
    got = row(db, "s")
    assert [got[c] for c in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                             "reasoning_tokens", "api_call_count")] == [12, 6, 3, 2, 1, 3]
    assert got["estimated_cost_usd"] == pytest.approx(0.75)
    assert got["actual_cost_usd"] == pytest.approx(0.1)
    assert (got["cost_status"], got["cost_source"], got["pricing_version"]) == ("final", "table", "v1")


def test_absolute_sets_counters_and_keeps_costs_not_given(db) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=10, output_tokens=10, estimated_cost_usd=1.0, actual_cost_usd=2.0,
                           api_call_count=3)
    db.update_token_counts("s", input_tokens=100, output_tokens=50, absolute=True)
    got = row(db, "s")
    assert (got["input_tokens"], got["output_tokens"], got["api_call_count"]) == (100, 50, 0)
    assert (got["estimated_cost_usd"], got["actual_cost_usd"]) == (1.0, 2.0)
    db.update_token_counts("s", input_tokens=7, estimated_cost_usd=0.5, actual_cost_usd=0.25, absolute=True)
    got = row(db, "s")
    assert (got["input_tokens"], got["estimated_cost_usd"], got["actual_cost_usd"]) == (7, 0.5, 0.25)


def test_absolute_calls_never_write_ledger_rows(db) -> None:
    db.create_session("s", "cli", model="m")
    db.update_token_counts("s", input_tokens=10, api_call_count=1)
    db.update_token_counts("s", input_tokens=500, output_tokens=9, estimated_cost_usd=3.0, absolute=True)
    rows = ledger(db)
    assert len(rows) == 1
    assert (rows[0]["input_tokens"], rows[0]["output_tokens"], rows[0]["estimated_cost_usd"]) == (10, 0, 0.0)


# ---------------------------------------------------------------------- route fill gating


@pytest.mark.parametrize("usage", [
    {"input_tokens": 1}, {"output_tokens": 1}, {"cache_read_tokens": 1}, {"cache_write_tokens": 1},
    {"reasoning_tokens": 1}, {"api_call_count": 1}, {"estimated_cost_usd": 0.01}, {"actual_cost_usd": 0.01},
])
def test_any_accounted_usage_fills_a_null_route(db, usage: dict[str, Any]) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", billing_provider="p", billing_base_url="u", billing_mode="chat", **usage)
    assert route(db, "s") == (None, "p", "u", "chat")


def test_zero_costs_are_not_usage(db) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", billing_provider="p", estimated_cost_usd=0.0, actual_cost_usd=0.0)
    assert route(db, "s") == (None, None, None, None)
    assert ledger(db) == []


def test_the_route_is_filled_only_where_null(db) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=1, billing_provider="p", api_call_count=1)
    db.update_token_counts("s", input_tokens=1, billing_provider="q", billing_base_url="u", billing_mode="m")
    assert route(db, "s") == (None, "p", "u", "m")


# ---------------------------------------------------------------------- first accounted route


def test_first_accounted_call_with_model_and_provider_replaces_the_route(db) -> None:
    db.create_session("s", "cli", model="configured")
    db.update_token_counts("s", model="configured")  # zero usage: nothing changes
    db.update_session_billing_route("s", provider="old", base_url="https://old", billing_mode="chat")
    db.update_token_counts("s", input_tokens=5, model="actual", billing_provider="new", api_call_count=1)
    # the whole route is replaced, including base_url and mode with None
    assert route(db, "s") == ("actual", "new", None, None)
    db.update_token_counts("s", input_tokens=5, model="later", billing_provider="other", billing_base_url="x",
                           api_call_count=1)
    assert route(db, "s") == ("actual", "new", "x", None)  # sticky; NULLs still filled


def test_first_route_needs_both_model_and_provider(db) -> None:
    db.create_session("s", "cli", model="configured")
    db.update_session_billing_route("s", provider="old", base_url="https://old")
    db.update_token_counts("s", input_tokens=1, model="actual")
    assert route(db, "s") == ("configured", "old", "https://old", None)
    db.update_token_counts("s", input_tokens=1, billing_provider="new")
    assert route(db, "s") == ("configured", "old", "https://old", None)


def test_first_route_with_the_stored_pair_changes_nothing(db) -> None:
    db.create_session("s", "cli", model="m")
    db.update_session_billing_route("s", provider="p", base_url="https://u", billing_mode="chat")
    db.update_token_counts("s", input_tokens=1, model="m", billing_provider="p", billing_base_url="https://v")
    assert route(db, "s") == ("m", "p", "https://u", "chat")


def test_first_route_needs_usage(db) -> None:
    db.create_session("s", "cli", model="m")
    db.update_session_billing_route("s", provider="p", base_url="https://u")
    db.update_token_counts("s", model="x", billing_provider="y")
    assert route(db, "s") == ("m", "p", "https://u", None)


def test_the_route_stays_open_while_no_call_was_counted(db) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=1, model="a", billing_provider="pa")  # api_call_count stays 0
    db.update_token_counts("s", input_tokens=1, model="b", billing_provider="pb", billing_mode="r")
    assert route(db, "s") == ("b", "pb", None, "r")


# ---------------------------------------------------------------------- per-model ledger


def test_ledger_delta_keyed_by_the_passed_route(db, clock) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=10, output_tokens=2, cache_read_tokens=3, cache_write_tokens=4,
                           reasoning_tokens=5, model="m", billing_provider="p", billing_base_url="u",
                           billing_mode="chat", estimated_cost_usd=0.5, actual_cost_usd=0.2, api_call_count=1,
                           cost_status="estimated")
    clock.now += 60
    db.update_token_counts("s", input_tokens=1, model="m", billing_provider="p", billing_base_url="u",
                           billing_mode="chat", api_call_count=1, cost_source="table")
    [r] = ledger(db)
    assert keys([r]) == [("m", "p", "u", "chat", "")]
    assert [r[c] for c in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                           "reasoning_tokens", "api_call_count")] == [11, 2, 3, 4, 5, 2]
    assert r["estimated_cost_usd"] == pytest.approx(0.5)
    assert r["actual_cost_usd"] == pytest.approx(0.2)
    assert (r["cost_status"], r["cost_source"]) == ("estimated", "table")
    assert (r["first_seen"], r["last_seen"]) == (clock.now - 60, clock.now)


def test_ledger_key_falls_back_to_the_session_route_then_defaults(db) -> None:
    db.create_session("routed", "cli", model="sm")
    db.update_session_billing_route("routed", provider="sp", base_url="su", billing_mode="sm")
    db.update_token_counts("routed", input_tokens=1)
    db.update_token_counts("routed", input_tokens=1, model="other")  # the session keeps its model
    db.update_token_counts("bare", input_tokens=1)
    assert keys(ledger(db, "routed")) == [("other", "sp", "su", "sm", ""), ("sm", "sp", "su", "sm", "")]
    assert keys(ledger(db, "bare")) == [("unknown", "", "", "", "")]


def test_ledger_is_written_for_tokens_calls_or_an_estimate_but_not_an_actual_cost_alone(db) -> None:
    db.create_session("s", "cli", model="m")
    db.update_token_counts("s", actual_cost_usd=1.5)
    assert ledger(db) == []
    assert row(db, "s")["actual_cost_usd"] == 1.5
    db.update_token_counts("s", estimated_cost_usd=0.25)
    db.update_token_counts("s", api_call_count=2, actual_cost_usd=0.5)  # with usage, the actual cost is added
    [r] = ledger(db)
    assert (r["input_tokens"], r["api_call_count"], r["estimated_cost_usd"]) == (0, 2, 0.25)
    assert r["actual_cost_usd"] == 0.5
    assert row(db, "s")["actual_cost_usd"] == 2.0


def test_ledger_rows_follow_the_model_of_each_call(db) -> None:
    db.create_session("s", "cli", model="main")
    db.update_token_counts("s", input_tokens=10, model="main", api_call_count=1)
    db.update_token_counts("s", input_tokens=3, model="fallback", api_call_count=1)
    by_model = {r["model"]: (r["input_tokens"], r["api_call_count"]) for r in ledger(db)}
    assert by_model == {"main": (10, 1), "fallback": (3, 1)}
    assert row(db, "s")["input_tokens"] == 13
    assert {r["task"] for r in ledger(db)} == {""}


def test_concurrent_deltas_are_all_counted(hermes_state, db) -> None:
    second = hermes_state.SessionDB(db.db_path if db.db_path is not None else db.url)
    try:
        db.create_session("s", "cli", model="m")
        rounds = 25

        def work(store) -> None:
            for _ in range(rounds):
                store.update_token_counts("s", input_tokens=2, output_tokens=1, api_call_count=1,
                                          estimated_cost_usd=0.5)

        threads = [threading.Thread(target=work, args=(s,)) for s in (db, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = row(db, "s")
        assert (got["input_tokens"], got["output_tokens"], got["api_call_count"]) == (100, 50, 50)
        assert got["estimated_cost_usd"] == pytest.approx(25.0)
        [r] = ledger(db)
        assert (r["input_tokens"], r["api_call_count"], r["estimated_cost_usd"]) == (100, 50, pytest.approx(25.0))
    finally:
        second.close()


def test_bad_counts_are_typed_errors_and_write_nothing(hermes_state, db) -> None:
    from hermes_store.errors import InvalidInputError

    with pytest.raises(InvalidInputError):
        db.update_token_counts("s", input_tokens="many")
    with pytest.raises(InvalidInputError):
        db.update_token_counts("s", input_tokens=1, estimated_cost_usd="cheap")
    assert db.get_session("s") is None


# ---------------------------------------------------------------------- record_auxiliary_usage


def test_auxiliary_usage_goes_to_its_own_task_row(db, clock) -> None:
    db.create_session("s", "cli", model="main")
    db.update_session_billing_route("s", provider="sp", base_url="su", billing_mode="chat")
    db.record_auxiliary_usage("s", "vision", input_tokens=7, output_tokens=1, cache_read_tokens=2,
                              cache_write_tokens=3, reasoning_tokens=4, estimated_cost_usd=0.01)
    clock.now += 5
    db.record_auxiliary_usage("s", "vision", input_tokens=3)
    [r] = ledger(db)
    # no borrowing from the session: model 'unknown', provider/base_url '', mode ''
    assert keys([r]) == [("unknown", "", "", "", "vision")]
    assert [r[c] for c in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                           "reasoning_tokens", "api_call_count")] == [10, 1, 2, 3, 4, 2]
    assert (r["estimated_cost_usd"], r["actual_cost_usd"]) == (pytest.approx(0.01), 0.0)
    assert (r["first_seen"], r["last_seen"]) == (clock.now - 5, clock.now)
    got = row(db, "s")
    assert (got["input_tokens"], got["api_call_count"], got["estimated_cost_usd"]) == (0, 0, None)
    assert (got["model"], got["billing_provider"]) == ("main", "sp")


def test_auxiliary_usage_with_its_own_route(db) -> None:
    db.record_auxiliary_usage("s", "compression", model="flash", billing_provider="or", billing_base_url="https://or",
                              input_tokens=100)
    db.record_auxiliary_usage("s", "title_generation", model="flash", input_tokens=5)
    assert keys(ledger(db)) == [("flash", "or", "https://or", "", "compression"),
                                ("flash", "", "", "", "title_generation")]
    got = row(db, "s")
    assert (got["source"], got["model"], got["input_tokens"]) == ("unknown", None, 0)


def test_auxiliary_usage_counts_a_call_even_without_tokens(db) -> None:
    db.record_auxiliary_usage("s", "vision")
    [r] = ledger(db)
    assert (r["api_call_count"], r["input_tokens"], r["estimated_cost_usd"]) == (1, 0, 0.0)


@pytest.mark.parametrize(("sid", "task"), [("", "vision"), (None, "vision"), ("s", ""), ("s", None)])
def test_auxiliary_usage_with_a_falsy_id_or_task_is_a_no_op(db, sid, task) -> None:
    db.record_auxiliary_usage(sid, task, input_tokens=5)
    assert ledger(db) == []
    assert db.get_session("s") is None


def test_auxiliary_usage_is_keyword_only_after_the_task(db) -> None:
    with pytest.raises(TypeError):
        db.record_auxiliary_usage("s", "vision", "model")  # type: ignore[misc]


def test_auxiliary_usage_errors_propagate(db) -> None:
    with pytest.raises(ValueError):
        db.record_auxiliary_usage("bad\ud800id", "vision", input_tokens=1)
    assert ledger(db) == []


def test_auxiliary_and_main_rows_stay_apart(db) -> None:
    db.create_session("s", "cli", model="m")
    db.update_token_counts("s", input_tokens=10, model="m", api_call_count=1)
    db.record_auxiliary_usage("s", "compression", model="m", input_tokens=4)
    assert keys(ledger(db)) == [("m", "", "", "", ""), ("m", "", "", "", "compression")]
    assert row(db, "s")["input_tokens"] == 10


# ---------------------------------------------------------------------- our task= extra


def test_task_extra_bills_a_side_task_without_moving_the_session(db) -> None:
    db.create_session("s", "cli", model="main")
    db.update_token_counts("s", input_tokens=7, model="vision-model", billing_mode="chat", api_call_count=2,
                           task="vision")
    assert keys(ledger(db)) == [("vision-model", "", "", "chat", "vision")]
    assert ledger(db)[0]["api_call_count"] == 2
    got = row(db, "s")
    assert (got["input_tokens"], got["model"]) == (0, "main")


def test_task_extra_is_keyword_only_and_refuses_absolute(db) -> None:
    from hermes_store.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="absolute"):
        db.update_token_counts("s", input_tokens=1, task="vision", absolute=True)
    with pytest.raises(TypeError):
        db.update_token_counts("s", 1, 0, None, 0, 0, 0, None, None, None, None, None, None, None, None, 0, False,
                               "vision")  # type: ignore[misc]
