"""Hermes v26 usage through the swapped ``hermes_state`` (v26 reference §2.A, §2.E).

record_auxiliary_usage's call count, usage_totals, get_dominant_session_model_route,
and the queued token writer (queue_token_counts / flush_token_counts).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import types
from typing import Any

import pytest
from sqlalchemy import text

from hermes_store.sessiondb import usage as usage_module

pytestmark = pytest.mark.both_backends

TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
          "api_call_count")


def row(db, sid: str) -> dict[str, Any]:
    found = db.get_session(sid)
    assert found is not None, sid
    return found


def ledger(db) -> list[dict[str, Any]]:
    sql = text("SELECT * FROM session_model_usage ORDER BY session_id, task, model, billing_provider")
    return db._read(lambda c: [dict(r) for r in c.execute(sql).mappings()])


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "session-db-token-writer"]


def own_writer(db) -> threading.Thread | None:
    """This store's writer thread, if one runs (other tests' stores may have theirs)."""
    return db._token_writer()._thread


@pytest.fixture
def exit_hooks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the writer registers with atexit, recorded instead of registered."""
    hooks: list[Any] = []
    monkeypatch.setattr(usage_module, "atexit", types.SimpleNamespace(register=hooks.append,
                                                                     unregister=hooks.remove))
    return hooks


# ---------------------------------------------------------------------- record_auxiliary_usage (v26)


def test_auxiliary_usage_takes_a_call_count(hermes_state, db) -> None:
    param = inspect.signature(hermes_state.SessionDB.record_auxiliary_usage).parameters["api_call_count"]
    assert (param.kind, param.default) == (inspect.Parameter.KEYWORD_ONLY, 1)
    db.record_auxiliary_usage("s", "vision", input_tokens=3, api_call_count=4)
    db.record_auxiliary_usage("s", "vision", api_call_count=None)  # None counts one call
    db.record_auxiliary_usage("s", "vision")
    [r] = ledger(db)
    assert (r["task"], r["input_tokens"], r["api_call_count"]) == ("vision", 3, 6)
    assert row(db, "s")["api_call_count"] == 0


def test_auxiliary_call_count_must_be_a_number(db) -> None:
    with pytest.raises(ValueError):
        db.record_auxiliary_usage("s", "vision", api_call_count="many")
    assert ledger(db) == []


# ---------------------------------------------------------------------- usage_totals (v25)


def _session(db, sid: str, messages: int, parent: str | None = None, **usage: Any) -> None:
    db.create_session(sid, "cli", parent_session_id=parent)
    for n in range(messages):
        db.append_message(sid, "user", f"m{n}")
    if usage:
        db.update_token_counts(sid, **usage)


def test_usage_totals_add_up_root_sessions(db) -> None:
    _session(db, "a", 2, input_tokens=100, output_tokens=20, cache_read_tokens=5, cache_write_tokens=1,
             reasoning_tokens=7, estimated_cost_usd=0.5, actual_cost_usd=0.25)
    _session(db, "b", 1, input_tokens=10, output_tokens=1, estimated_cost_usd=0.125)
    _session(db, "quiet", 0, input_tokens=1000, estimated_cost_usd=9.0)
    _session(db, "child", 3, parent="a", input_tokens=500, estimated_cost_usd=5.0)
    got = db.usage_totals()
    # a: 126 tokens (reasoning is part of the output), actual cost; b: 11, estimate.
    assert got == {"tokens": 137, "cost_usd": pytest.approx(0.375)}
    assert isinstance(got["tokens"], int) and isinstance(got["cost_usd"], float)
    assert db.usage_totals(min_message_count=2) == {"tokens": 126, "cost_usd": pytest.approx(0.25)}
    assert db.usage_totals(min_message_count=0) == {"tokens": 1137, "cost_usd": pytest.approx(9.375)}


def test_usage_totals_leave_archived_sessions_out_unless_asked(db) -> None:
    _session(db, "live", 1, input_tokens=10, estimated_cost_usd=1.0)
    _session(db, "old", 1, input_tokens=5, estimated_cost_usd=2.0)
    db.set_session_archived("old", True)
    assert db.usage_totals() == {"tokens": 10, "cost_usd": pytest.approx(1.0)}
    assert db.usage_totals(include_archived=True) == {"tokens": 15, "cost_usd": pytest.approx(3.0)}
    with pytest.raises(TypeError):
        db.usage_totals(1)  # type: ignore[misc]


def test_usage_totals_of_an_empty_store(db) -> None:
    assert db.usage_totals() == {"tokens": 0, "cost_usd": 0.0}


# ---------------------------------------------------------------------- dominant route (v26)


def test_dominant_route_is_the_main_loops_most_called(db, clock) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=10, model="a", billing_provider="pa", billing_base_url="ua",
                           billing_mode="chat", api_call_count=3)
    db.update_token_counts("s", input_tokens=900, model="b", billing_provider="pb", api_call_count=2)
    db.update_token_counts("s", input_tokens=9999, model="unknown", billing_provider="px", api_call_count=50)
    db.update_token_counts("s", input_tokens=9999, model="c", billing_provider="", api_call_count=50)
    db.record_auxiliary_usage("s", "compression", model="d", billing_provider="pd", api_call_count=80)
    assert db.get_dominant_session_model_route("s") == {
        "model": "a", "billing_provider": "pa", "billing_base_url": "ua", "billing_mode": "chat",
        "api_call_count": 3,
    }


def test_dominant_route_ties_go_to_tokens_then_recency(db, clock) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=5, model="few", billing_provider="p", api_call_count=1)
    db.update_token_counts("s", input_tokens=50, model="many", billing_provider="p", api_call_count=1)
    assert db.get_dominant_session_model_route("s")["model"] == "many"
    clock.now += 10
    db.update_token_counts("s", input_tokens=45, cache_read_tokens=5, model="recent", billing_provider="p",
                           api_call_count=1)
    assert db.get_dominant_session_model_route("s")["model"] == "recent"


def test_dominant_route_without_a_known_route(db) -> None:
    assert db.get_dominant_session_model_route("ghost") is None
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=5, api_call_count=1)  # model 'unknown', provider ''
    db.record_auxiliary_usage("s", "vision", model="v", billing_provider="pv")
    assert db.get_dominant_session_model_route("s") is None


# ---------------------------------------------------------------------- queued token counts (v23-late)


class Recorder:
    """Stands in for the store's update_token_counts: records the calls, can hold the writer."""

    def __init__(self, db) -> None:
        self.real = db.update_token_counts
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail: set[int] = set()

    def __call__(self, session_id: str, **kwargs: Any) -> None:
        self.calls.append((session_id, kwargs))
        if not self.release.is_set():
            self.holding.set()
            self.release.wait(10)
        if len(self.calls) in self.fail:
            raise RuntimeError("boom")
        self.real(session_id, **kwargs)


@pytest.fixture
def recorder(db):
    rec = Recorder(db)
    db.update_token_counts = rec
    yield rec
    rec.release.set()


def test_queued_deltas_are_applied_on_the_named_thread(db, recorder) -> None:
    db.create_session("s", "cli")
    for _ in range(20):
        db.queue_token_counts("s", input_tokens=2, output_tokens=1, api_call_count=1, model="m",
                              billing_provider="p", estimated_cost_usd=0.25)
    thread = own_writer(db)
    assert thread is not None and thread in writer_threads() and thread.daemon
    assert db.flush_token_counts() is True
    got = row(db, "s")
    assert (got["input_tokens"], got["output_tokens"], got["api_call_count"]) == (40, 20, 20)
    assert got["estimated_cost_usd"] == pytest.approx(5.0)
    [r] = ledger(db)
    assert (r["model"], r["billing_provider"], r["api_call_count"]) == ("m", "p", 20)


def test_adjacent_deltas_of_one_route_merge(db, recorder) -> None:
    db.create_session("s", "cli")
    db.create_session("t", "cli")
    recorder.release.clear()
    db.queue_token_counts("s", input_tokens=1, api_call_count=1, model="m")  # taken by the writer, held
    assert recorder.holding.wait(10)
    db.queue_token_counts("s", input_tokens=2, api_call_count=1, model="m", estimated_cost_usd=0.5)
    db.queue_token_counts("s", input_tokens=3, api_call_count=1, model="m")
    db.queue_token_counts("s", input_tokens=4, model="other")  # another route: apart
    db.queue_token_counts("t", input_tokens=5, model="other")  # another session: apart
    db.queue_token_counts("t", input_tokens=6, model="other", actual_cost_usd=1.0)
    db.queue_token_counts("t", input_tokens=70, absolute=True)  # a resync never merges
    db.queue_token_counts("t", input_tokens=1, model="other")
    recorder.release.set()
    assert db.flush_token_counts() is True
    summary = [(sid, kw.get("input_tokens"), kw.get("api_call_count"), kw.get("model"), kw.get("absolute"))
               for sid, kw in recorder.calls]
    assert summary == [("s", 1, 1, "m", None), ("s", 5, 2, "m", None), ("s", 4, None, "other", None),
                       ("t", 11, 0, "other", None), ("t", 70, None, None, True), ("t", 1, None, "other", None)]
    assert recorder.calls[1][1]["estimated_cost_usd"] == 0.5 and recorder.calls[1][1]["actual_cost_usd"] is None
    assert recorder.calls[3][1]["actual_cost_usd"] == 1.0
    assert (row(db, "s")["input_tokens"], row(db, "t")["input_tokens"]) == (10, 71)


def test_flush_times_out_while_the_writer_is_held(db, recorder) -> None:
    db.create_session("s", "cli")
    recorder.release.clear()
    db.queue_token_counts("s", input_tokens=1)
    assert recorder.holding.wait(10)
    started = time.monotonic()
    assert db.flush_token_counts(timeout=0.2) is False
    assert time.monotonic() - started < 5
    recorder.release.set()
    assert db.flush_token_counts(timeout=10) is True
    assert row(db, "s")["input_tokens"] == 1


def test_flush_never_raises(db) -> None:
    assert db.flush_token_counts() is True  # nothing queued
    assert db.flush_token_counts(timeout="soon") is False  # type: ignore[arg-type]


def test_failures_are_logged_and_later_deltas_still_applied(db, recorder, caplog) -> None:
    db.create_session("s", "cli")
    recorder.fail = {1}
    with caplog.at_level(logging.WARNING):
        db.queue_token_counts("s", input_tokens=1)
        assert db.flush_token_counts() is True
        db.queue_token_counts("s", input_tokens=2)
        assert db.flush_token_counts() is True
    assert row(db, "s")["input_tokens"] == 2 and len(recorder.calls) == 2
    [failed] = [r for r in caplog.records if "not recorded" in r.getMessage()]
    assert failed.exc_info is not None and "boom" in str(failed.exc_info[1])


def test_a_failed_delta_is_logged(db, caplog) -> None:
    db.create_session("s", "cli")
    with caplog.at_level(logging.WARNING):
        db.queue_token_counts("s", input_tokens="many")
        assert db.flush_token_counts() is True
    assert any("token counts for 's' not recorded" in r.getMessage() for r in caplog.records)
    assert row(db, "s")["input_tokens"] == 0


def test_unknown_keywords_are_refused_at_once(db) -> None:
    with pytest.raises(TypeError, match="no_such_field"):
        db.queue_token_counts("s", no_such_field=1)
    assert db.flush_token_counts() is True
    assert db.get_session("s") is None


def test_an_idle_writer_ends_and_the_next_delta_starts_another(db, monkeypatch) -> None:
    monkeypatch.setattr(usage_module, "TOKEN_WRITER_IDLE_S", 0.05)
    db.create_session("s", "cli")
    db.queue_token_counts("s", input_tokens=1)
    assert db.flush_token_counts() is True
    first = own_writer(db)
    assert first is not None
    first.join(10)
    assert not first.is_alive() and own_writer(db) is None
    db.queue_token_counts("s", input_tokens=1)
    assert own_writer(db) not in (None, first)
    assert db.flush_token_counts() is True
    assert row(db, "s")["input_tokens"] == 2


def test_closing_the_writer_drains_it_then_applies_at_once(db, exit_hooks) -> None:
    db.create_session("s", "cli")
    for _ in range(50):
        db.queue_token_counts("s", input_tokens=1, api_call_count=1)
    thread = own_writer(db)
    assert len(exit_hooks) == 1  # the exit hook is registered with the first thread
    db._close_token_writer()
    assert exit_hooks == []
    assert row(db, "s")["input_tokens"] == 50
    assert not thread.is_alive() and own_writer(db) is None
    db.queue_token_counts("s", input_tokens=1)  # synchronous now: no flush needed
    assert row(db, "s")["input_tokens"] == 51
    assert own_writer(db) is None
    db._close_token_writer()  # idempotent


def test_the_exit_hook_drains_what_is_queued(db, recorder, exit_hooks) -> None:
    db.create_session("s", "cli")
    recorder.release.clear()
    db.queue_token_counts("s", input_tokens=1)
    assert recorder.holding.wait(10)
    db.queue_token_counts("s", input_tokens=2, model="m")
    [hook] = exit_hooks
    threading.Timer(0.1, recorder.release.set).start()
    hook()  # what the interpreter runs at exit
    assert row(db, "s")["input_tokens"] == 3
    assert exit_hooks == [] and own_writer(db) is None


def test_a_closed_store_applies_deltas_at_once(db, recorder, caplog) -> None:
    db.create_session("s", "cli")
    db.queue_token_counts("s", input_tokens=4)
    assert db.flush_token_counts() is True
    thread = own_writer(db)
    db.queue_token_counts("s", input_tokens=3)
    db.close()  # drains the queue and stops the thread
    assert thread is not None and not thread.is_alive() and own_writer(db) is None
    assert recorder.calls[-1] == ("s", {"input_tokens": 3})
    with caplog.at_level(logging.WARNING):
        db.queue_token_counts("s", input_tokens=1)  # nowhere to write: logged, not raised
    assert recorder.calls[-1] == ("s", {"input_tokens": 1})  # applied in the caller, not queued
    assert any("not recorded" in r.getMessage() for r in caplog.records)
