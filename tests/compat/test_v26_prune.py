"""Hermes v26 §2.G: delete targets and expected ids, prune by inactivity (v25), open
matches, stale-session archive and its throttled startup run, auto-prune's vacuum rule;
through the swapped ``hermes_state`` module, on both backends."""

from __future__ import annotations

import inspect
import time

import pytest
from sqlalchemy import text

pytestmark = pytest.mark.both_backends

DAY = 86_400.0
E = inspect.Parameter.empty


def add(db, sid: str, *, age_days: float = 100.0, ended: bool = True, end_reason: str = "done",
        parent: str | None = None, model_config: dict | None = None, **fields) -> str:
    kwargs = {}
    if parent is not None:
        kwargs["parent_session_id"] = parent
    if model_config is not None:
        kwargs["model_config"] = model_config
    db.create_session(sid, "cli", **kwargs)
    started = time.time() - age_days * DAY
    db.update_session(sid, started_at=started, ended_at=started + 60 if ended else None,
                      end_reason=end_reason if ended else None, **fields)
    return sid


def message_at(db, sid: str, days_ago: float, content: str = "hi") -> None:
    db.append_message(sid, "user", content)
    db._write(lambda c: c.execute(text("UPDATE messages SET timestamp = :t WHERE session_id = :s"),
                                  {"t": time.time() - days_ago * DAY, "s": sid}))


def ids(rows) -> list[str]:
    return [r["id"] for r in rows]


def test_signatures_are_hermes_v26(hermes_state) -> None:
    S = hermes_state.SessionDB
    sig = {name: [(p.name, p.kind.name, p.default) for p in inspect.signature(getattr(S, name)).parameters.values()]
           for name in ("get_session_delete_targets", "count_open_prune_matches", "archive_stale_sessions",
                        "maybe_auto_archive", "maybe_auto_prune_and_vacuum")}
    pk, kw, var = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY", "VAR_KEYWORD"
    assert sig["get_session_delete_targets"] == [("self", pk, E), ("session_id", pk, E)]
    assert sig["count_open_prune_matches"] == [("self", pk, E), ("older_than_days", pk, None), ("source", pk, None),
                                               ("filters", var, E)]
    assert sig["archive_stale_sessions"] == [("self", pk, E), ("idle_days", pk, E), ("exclude_pinned", kw, True)]
    assert sig["maybe_auto_archive"] == [("self", pk, E), ("idle_days", pk, 3), ("min_interval_hours", pk, 24),
                                         ("exclude_pinned", pk, True)]
    assert sig["maybe_auto_prune_and_vacuum"] == [
        ("self", pk, E), ("retention_days", pk, 90), ("min_interval_hours", pk, 24), ("vacuum", pk, True),
        ("sessions_dir", pk, None), ("min_vacuum_interval_days", pk, 30)]


# ---------------------------------------------------------------------------- delete targets


def test_delete_targets_are_the_id_then_sorted_delegates(db) -> None:
    add(db, "root")
    add(db, "z-deleg", parent="root", model_config={"_delegate_from": "root"})
    add(db, "a-deleg", parent="root", model_config={"_delegate_from": "root"})
    add(db, "kid", parent="root")
    assert db.get_session_delete_targets("root") == ["root", "a-deleg", "z-deleg"]
    assert db.get_session_delete_targets("kid") == ["kid"]
    assert db.get_session_delete_targets("ghost") == []
    assert db.get_session_delete_targets("") == []


def test_delete_with_expected_ids_refuses_when_the_cascade_changed(db) -> None:
    add(db, "root")
    add(db, "d1", parent="root", model_config={"_delegate_from": "root"})
    seen = db.get_session_delete_targets("root")
    add(db, "d2", parent="root", model_config={"_delegate_from": "root"})  # a delegate appeared since
    assert db.delete_session("root", expected_delete_ids=seen) is False
    assert db.get_session("root") is not None and db.get_session("d1") is not None
    assert db.delete_session("root", expected_delete_ids=list(reversed(db.get_session_delete_targets("root")))) is True
    assert [db.get_session(s) for s in ("root", "d1", "d2")] == [None, None, None]


def test_delete_without_expected_ids_is_unchanged(db) -> None:
    add(db, "s")
    assert db.delete_session("s") is True and db.get_session("s") is None
    assert db.delete_session("s", expected_delete_ids=["s"]) is False  # gone: nothing to match


# ---------------------------------------------------------------------------- prune by inactivity


def test_older_than_days_means_inactivity(db) -> None:
    add(db, "quiet", age_days=200)
    message_at(db, "quiet", 120)
    add(db, "busy", age_days=200)
    message_at(db, "busy", 1)
    add(db, "empty_old", age_days=100)
    rows = db.list_prune_candidates(older_than_days=90)
    assert ids(rows) == ["quiet", "empty_old"]
    quiet = rows[0]
    assert quiet["last_active"] == pytest.approx(time.time() - 120 * DAY, abs=5)
    assert rows[1]["last_active"] == rows[1]["started_at"]
    # started_before replaces the inactivity bound; last_active_before/after filter directly
    assert ids(db.list_prune_candidates(older_than_days=90, started_before=time.time())) == [
        "quiet", "busy", "empty_old"]
    assert ids(db.list_prune_candidates(last_active_after=time.time() - 2 * DAY)) == ["busy"]
    assert ids(db.list_prune_candidates(last_active_before=time.time() - 110 * DAY)) == ["quiet"]
    assert db.prune_sessions(90) == 2
    assert db.get_session("busy") is not None


def test_like_needles_are_literal(db) -> None:
    add(db, "a", title="100% done")
    add(db, "b", title="1000 done")
    assert ids(db.list_prune_candidates(title_like="100%")) == ["a"]


def test_pinned_sessions_are_never_pruned(db) -> None:
    add(db, "pinned")
    add(db, "plain")
    db.set_session_pinned("pinned", True)
    assert ids(db.list_prune_candidates(90)) == ["plain"]
    assert db.prune_sessions(90) == 1
    assert db.get_session("pinned") is not None
    db.update_session("pinned", started_at=time.time() - 400 * DAY)
    assert db.maybe_auto_prune_and_vacuum(retention_days=90, vacuum=False)["pruned"] == 0
    assert db.get_session("pinned") is not None


def test_count_open_prune_matches_inverts_the_ended_guard(db) -> None:
    add(db, "open_old", ended=False)
    add(db, "open_new", ended=False, age_days=1)
    add(db, "ended_old")
    assert db.count_open_prune_matches(90) == 1
    assert db.count_open_prune_matches() == 2
    assert db.count_open_prune_matches(90, "telegram") == 0
    assert db.count_open_prune_matches(None, title_like="x") == 0


# ---------------------------------------------------------------------------- archive stale


def test_archive_stale_sessions(db) -> None:
    add(db, "idle_ended", age_days=10)
    add(db, "idle_open", age_days=10, ended=False)
    add(db, "fresh", age_days=1)
    add(db, "compressed", age_days=10, end_reason="compression")
    add(db, "pinned", age_days=10)
    db.set_session_pinned("pinned", True)
    add(db, "recently_active", age_days=10)
    message_at(db, "recently_active", 0.5)
    assert db.archive_stale_sessions(None) == 0 and db.archive_stale_sessions(-1) == 0
    assert db.archive_stale_sessions(3) == 2
    flags = {s: db.get_session(s)["archived"] for s in ("idle_ended", "idle_open", "fresh", "compressed", "pinned",
                                                         "recently_active")}
    assert flags == {"idle_ended": 1, "idle_open": 1, "fresh": 0, "compressed": 0, "pinned": 0,
                     "recently_active": 0}
    assert db.archive_stale_sessions(3, exclude_pinned=False) == 1
    assert db.get_session("pinned")["archived"] == 1


def test_maybe_auto_archive_is_throttled_and_leaves_running_sessions(db) -> None:
    add(db, "idle_ended", age_days=10)
    add(db, "idle_open", age_days=10, ended=False)
    first = db.maybe_auto_archive()
    assert first == {"skipped": False, "archived": 1}
    assert db.get_session("idle_ended")["archived"] == 1 and db.get_session("idle_open")["archived"] == 0
    assert db.get_meta("last_auto_archive") is not None
    add(db, "later", age_days=10)
    assert db.maybe_auto_archive() == {"skipped": True, "archived": 0}
    assert db.maybe_auto_archive(min_interval_hours=0) == {"skipped": False, "archived": 1}


# ---------------------------------------------------------------------------- auto-prune and vacuum


def test_auto_prune_vacuums_only_when_last_vacuum_is_old(db) -> None:
    vacuums: list[int] = []
    db.vacuum = lambda: vacuums.append(1) or 0
    add(db, "old1")
    first = db.maybe_auto_prune_and_vacuum()
    assert first == {"skipped": False, "pruned": 1, "vacuumed": True} and len(vacuums) == 1
    stamp = float(db.get_meta("last_vacuum"))
    assert stamp == pytest.approx(time.time(), abs=5)
    add(db, "old2")
    second = db.maybe_auto_prune_and_vacuum(min_interval_hours=0)
    assert second == {"skipped": False, "pruned": 1, "vacuumed": False} and len(vacuums) == 1
    db.set_meta("last_vacuum", str(time.time() - 31 * DAY))
    add(db, "old3")
    third = db.maybe_auto_prune_and_vacuum(min_interval_hours=0)
    assert third["vacuumed"] is True and len(vacuums) == 2
    assert db.maybe_auto_prune_and_vacuum(min_interval_hours=0, min_vacuum_interval_days=0)["vacuumed"] is False


def test_a_failed_vacuum_leaves_no_last_vacuum(db) -> None:
    def boom() -> int:
        raise RuntimeError("disk gone")

    db.vacuum = boom
    add(db, "old")
    out = db.maybe_auto_prune_and_vacuum()
    assert out["pruned"] == 1 and out["vacuumed"] is False and out["error"] == "RuntimeError: disk gone"
    assert db.get_meta("last_vacuum") is None
