"""Hermes v26 behaviours its own tests exercise through the swapped ``hermes_state``:
legacy reset children in the listing (§5.2), ``find_session_by_origin``'s rules (v23
contract, §6.1), the slow-search log and its path attribution (§2.F, §4), auto-maintenance
retry and bookkeeping around a VACUUM (§2.G), and the checkpoints around VACUUM traced
on ``db._conn`` as Hermes' tests do (§2.G)."""

from __future__ import annotations

import logging
import sqlite3
import time

import pytest

from hermes_store import errors

pytestmark = pytest.mark.both_backends

DAY = 86_400.0


# ---------------------------------------------------------------------------- §5.2 reset children


def _legacy_reset_pair(db, reason: str = "session_reset") -> None:
    """A parent ended for a reset and its child keyed like it, without the ``_reset_from``
    marker (what Hermes before v26 wrote)."""
    db.create_session("parent", "telegram", session_key="agent:main:telegram:dm:1")
    db.append_message("parent", "user", "before the reset")
    db.end_session("parent", reason)
    db.create_session("child", "telegram", session_key="agent:main:telegram:dm:1", parent_session_id="parent")
    db.append_message("child", "user", "after the reset")
    assert "_reset_from" not in (db.get_session("child").get("model_config") or "")


@pytest.mark.parametrize("reason", ["session_reset", "idle", "daily", "resume_pending_expired"])
def test_a_legacy_reset_child_is_listed_and_counted(db, reason: str) -> None:
    _legacy_reset_pair(db, reason)
    for kwargs in ({}, {"order_by_last_active": True}, {"project_compression_tips": False},
                   {"compact_rows": True}, {"source": "telegram"}):
        assert {r["id"] for r in db.list_sessions_rich(**kwargs)} == {"parent", "child"}, kwargs
    assert db.session_count(exclude_children=True) == 2
    assert db.session_count_by_source(exclude_children=True) == {"telegram": 2}


def test_a_legacy_reset_child_is_never_a_resume_walk_target(db) -> None:
    _legacy_reset_pair(db)
    assert db.resolve_resume_session_id("parent") == "parent"  # the live child is not the parent's continuation
    assert db.resolve_resume_session_id("child") == "child"


def test_a_child_of_a_reset_parent_with_another_key_stays_a_hidden_child(db) -> None:
    _legacy_reset_pair(db)
    db.create_session("other", "telegram", session_key="agent:main:telegram:dm:2", parent_session_id="parent")
    db.create_session("unkeyed", "telegram", parent_session_id="parent")
    assert {r["id"] for r in db.list_sessions_rich()} == {"parent", "child"}
    assert {r["id"] for r in db.list_sessions_rich(include_children=True)} == {"parent", "child", "other", "unkeyed"}


def test_a_child_of_a_parent_ended_for_another_reason_is_not_a_reset_child(db) -> None:
    _legacy_reset_pair(db, "user_exit")
    assert {r["id"] for r in db.list_sessions_rich()} == {"parent"}
    assert db.session_count(exclude_children=True) == 1


# ---------------------------------------------------------------------------- find_session_by_origin
#
# The rules (v23 contract, v26 §6.1, our safe difference):
# 1. no platform, or chat_id None/"" -> None;
# 2. candidates: unended, unarchived rows with a session_key, source = platform (any
#    case), chat_id = str(chat_id), and with thread_id given COALESCE(thread_id,'') =
#    str(thread_id); branch/delegate children are never candidates (compression
#    continuations are); newest started_at first;
# 3. with user_id: that user's newest candidate; else a lone candidate with no user;
#    else None (Hermes would hand a lone candidate of another user over: we do not);
# 4. without user_id: None when the candidates span more than one non-empty user,
#    else the newest. The id comes back as str.


def _chat(db, sid: str, started: float, *, user: str | None = "u1", **kwargs) -> str:
    db.create_session(sid, "telegram", started_at=started, **kwargs)
    db.record_gateway_session_peer(sid, source="telegram", user_id=user, session_key="k", chat_id="c1",
                                   chat_type="dm")
    return sid


def _origin(db, **kwargs):
    return db.find_session_by_origin(platform="telegram", chat_id="c1", **kwargs)


def test_origin_leaves_out_ended_and_archived_sessions(db) -> None:
    _chat(db, "live", 100)
    _chat(db, "ended", 200)
    db.end_session("ended", "user_exit")
    _chat(db, "archived", 300)
    db.set_session_archived("archived", True)
    assert _origin(db) == "live"
    assert _origin(db, user_id="u1") == "live"
    db.set_session_archived("archived", False)
    assert _origin(db) == "archived"


def test_origin_leaves_out_forks_but_follows_a_compression_continuation(db) -> None:
    _chat(db, "root", 100)
    _chat(db, "branch", 200, parent_session_id="root", model_config={"_branched_from": "root"})
    _chat(db, "delegate", 300, parent_session_id="root", model_config={"_delegate_from": "root"})
    assert _origin(db) == "root"
    db.end_session("root", "compression")
    _chat(db, "tip", 400, parent_session_id="root")
    assert _origin(db) == "tip" and _origin(db, user_id="u1") == "tip"


def test_origin_with_a_user_takes_a_lone_session_without_a_user(db) -> None:
    _chat(db, "anon", 100, user=None)
    assert _origin(db, user_id="u1") == "anon"  # as Hermes: nobody else's
    _chat(db, "bob", 200, user="bob")
    assert _origin(db, user_id="u1") is None  # two candidates, none of u1
    assert _origin(db, user_id="bob") == "bob"


def test_origin_with_a_user_never_takes_another_users_lone_session(db) -> None:
    _chat(db, "bob", 100, user="bob")
    assert _origin(db, user_id="alice") is None
    assert _origin(db) == "bob"


def test_origin_matches_platform_any_case_and_returns_str(db) -> None:
    _chat(db, "s", 100)
    got = db.find_session_by_origin(platform="TELEGRAM", chat_id="c1", thread_id="")
    assert got == "s" and type(got) is str
    assert db.find_session_by_origin(platform="telegram", chat_id="c2") is None


# ---------------------------------------------------------------------------- slow-search log


@pytest.fixture
def searchable(db):
    db.create_session("s", "cli")
    db.append_message("s", "user", "the deployment pipeline failed 数据库连接失败")
    return db


def _slow_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hermes_state" and "search_messages took" in
            r.getMessage()]


def test_slow_ms_zero_logs_every_search_with_its_path(searchable, caplog, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_SEARCH_SLOW_MS", "0")
    with caplog.at_level(logging.DEBUG, logger="hermes_state"):
        assert len(searchable.search_messages("deployment")) == 1
        assert len(searchable.search_messages("数据库")) == 1
        searchable.search_messages("数据")
        searchable.search_messages("")
    lines = _slow_lines(caplog)
    assert len(lines) == 4
    assert "(path=fts5," in lines[0]
    assert "(path=trigram," in lines[1]  # three CJK characters: the trigram index
    assert "(path=like_scan," in lines[2]  # two: a scan (no CJK tokenizer loaded)
    assert "(path=empty," in lines[3]


def test_the_default_threshold_logs_nothing_for_a_fast_search(searchable, caplog, monkeypatch) -> None:
    monkeypatch.delenv("HERMES_SEARCH_SLOW_MS", raising=False)
    with caplog.at_level(logging.DEBUG, logger="hermes_state"):
        searchable.search_messages("deployment")
    assert _slow_lines(caplog) == []  # a one-row search is far below 1000 ms
    monkeypatch.setenv("HERMES_SEARCH_SLOW_MS", "not a number")  # bad value: the default
    with caplog.at_level(logging.DEBUG, logger="hermes_state"):
        searchable.search_messages("deployment")
    assert _slow_lines(caplog) == []


def test_the_log_reads_the_path_through_the_instance(searchable, caplog, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_SEARCH_SLOW_MS", "0")
    searchable._describe_search_path = lambda q: "patched_path"
    with caplog.at_level(logging.DEBUG, logger="hermes_state"):
        searchable.search_messages("deployment")

    def broken(q):
        raise RuntimeError("no")

    searchable._describe_search_path = broken
    with caplog.at_level(logging.DEBUG, logger="hermes_state"):
        assert len(searchable.search_messages("deployment")) == 1  # a failed attribution fails nothing
    lines = _slow_lines(caplog)
    assert "(path=patched_path," in lines[0] and "(path=unknown," in lines[1]


@pytest.mark.parametrize("query, flags, expected", [
    ("hello", {}, "fts5"),
    ("", {}, "empty"),
    ("!!", {}, "empty"),
    ("数据库", {}, "trigram"),
    ("数据", {}, "like_scan"),
    ("数据库", {"_trigram_available": False}, "like_scan"),
    ("数据", {"_fts_cjk_available": True}, "fts_cjk"),
    ("数据库", {"_fts_cjk_available": True}, "fts_cjk"),
    ("数", {"_fts_cjk_available": True}, "like_scan"),  # an isolated single CJK character
    ("hello", {"_fts_stale": True}, "like_scan_fts_stale"),
    ("hello", {"_fts_enabled": False}, "like_scan"),
])
def test_describe_search_path(db, query: str, flags: dict, expected: str) -> None:
    for name, value in flags.items():
        setattr(db, name, value)
    assert db._describe_search_path(query) == expected


# ---------------------------------------------------------------------------- auto-maintenance


def _old(db, sid: str) -> None:
    db.create_session(sid, "cli")
    started = time.time() - 200 * DAY
    db.update_session(sid, started_at=started, ended_at=started + 60, end_reason="done")


class _FlakyVacuum:
    """Stands in for ``db.vacuum``: fails the first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("database is locked")
        return 0


def test_a_failed_vacuum_is_retried_on_the_next_call_and_recorded_only_then(db) -> None:
    _old(db, "old")
    flaky = _FlakyVacuum(1)
    db.vacuum = flaky
    first = db.maybe_auto_prune_and_vacuum()
    assert first == {"skipped": False, "pruned": 1, "vacuumed": False, "error": "RuntimeError: database is locked"}
    assert db.get_meta("last_vacuum") is None
    assert db.get_meta("last_auto_prune") is not None  # the prune committed and keeps its stamp
    second = db.maybe_auto_prune_and_vacuum()  # inside the prune interval, nothing new to prune
    assert second == {"skipped": False, "pruned": 0, "vacuumed": True} and flaky.calls == 2
    assert float(db.get_meta("last_vacuum")) == pytest.approx(time.time(), abs=60)
    third = db.maybe_auto_prune_and_vacuum()  # nothing owed any more: the interval holds again
    assert third == {"skipped": True, "pruned": 0, "vacuumed": False} and flaky.calls == 2


def test_an_owed_vacuum_still_waits_for_the_vacuum_interval(db) -> None:
    db.set_meta("last_vacuum", str(time.time() - DAY))
    _old(db, "old")
    flaky = _FlakyVacuum(0)
    db.vacuum = flaky
    out = db.maybe_auto_prune_and_vacuum()
    assert out == {"skipped": False, "pruned": 1, "vacuumed": False} and flaky.calls == 0  # 1 day < 30


def test_vacuum_only_when_something_was_pruned(db) -> None:
    flaky = _FlakyVacuum(0)
    db.vacuum = flaky
    assert db.maybe_auto_prune_and_vacuum() == {"skipped": False, "pruned": 0, "vacuumed": False}
    assert flaky.calls == 0 and db.get_meta("last_vacuum") is None
    assert float(db.get_meta("last_auto_prune")) == pytest.approx(time.time(), abs=60)
    assert db.maybe_auto_prune_and_vacuum()["skipped"] is True
    _old(db, "old")
    out = db.maybe_auto_prune_and_vacuum(min_interval_hours=0, vacuum=False)
    assert out == {"skipped": False, "pruned": 1, "vacuumed": False} and flaky.calls == 0


def test_vacuum_false_never_retries_an_owed_vacuum(db) -> None:
    _old(db, "old")
    flaky = _FlakyVacuum(5)
    db.vacuum = flaky
    assert db.maybe_auto_prune_and_vacuum()["error"] == "RuntimeError: database is locked"
    assert db.maybe_auto_prune_and_vacuum(vacuum=False) == {"skipped": True, "pruned": 0, "vacuumed": False}
    assert flaky.calls == 1


# ---------------------------------------------------------------------------- checkpoints on _conn


def _traced(db) -> list[str]:
    seen: list[str] = []
    db._conn.set_trace_callback(seen.append)
    return seen


def _upkeep(seen: list[str]) -> list[str]:
    return [s.strip() for s in seen if "wal_checkpoint" in s or s.strip().upper().startswith("VACUUM")]


@pytest.mark.sqlite_only
def test_vacuum_on_conn_is_passive_vacuum_truncate(db) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    seen = _traced(db)
    db.vacuum()
    assert _upkeep(seen) == ["PRAGMA wal_checkpoint(PASSIVE)", "VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"]
    assert [m["content"] for m in db.get_messages("s")] == ["hello"]


@pytest.mark.sqlite_only
def test_optimize_storage_vacuum_is_followed_by_one_passive_checkpoint(db) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    seen = _traced(db)
    assert db.optimize_fts_storage() == {"ok": True, "vacuumed": True}
    assert _upkeep(seen) == ["VACUUM", "PRAGMA wal_checkpoint(PASSIVE)"]


@pytest.mark.sqlite_only
def test_a_vacuum_error_on_conn_propagates_typed(db) -> None:
    class Refusing:
        def __init__(self, real) -> None:
            self.real, self.seen = real, []

        def execute(self, sql, *args):
            self.seen.append(sql)
            if sql == "VACUUM":
                raise sqlite3.OperationalError("disk I/O error")
            return self.real.execute(sql, *args)

    wrapper = Refusing(db._conn)
    db._conn = wrapper
    try:
        with pytest.raises((sqlite3.Error, errors.HermesStoreError)):
            db.vacuum()
    finally:
        db._conn = wrapper.real
    # optimize_fts() first (on _conn too, as Hermes), then the checkpoint and the VACUUM that failed.
    optimizes = [sql for sql in wrapper.seen if "'optimize'" in sql]
    assert len(optimizes) == 2 and wrapper.seen[:2] == optimizes
    assert wrapper.seen[2:] == ["PRAGMA wal_checkpoint(PASSIVE)", "VACUUM"]


def test_vacuum_keeps_data_on_every_backend(db) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "kept")
    assert isinstance(db.vacuum(), int)
    assert [m["content"] for m in db.get_messages("s")] == ["kept"]
