"""Hermes v23 §1.F: archive, prune (with the filter table), delete with the delegate
cascade, empty sessions; through the swapped ``hermes_state`` module, on both backends."""

from __future__ import annotations

import inspect
import threading
import time
from pathlib import Path
import pytest
from sqlalchemy import func, select

from hermes_store import errors
from hermes_store.models import Base
from hermes_store.repositories.housekeeping import HousekeepingRepository

pytestmark = pytest.mark.both_backends

DAY = 86_400.0
USAGE = Base.metadata.tables["session_model_usage"]
MESSAGES = Base.metadata.tables["messages"]


def add(db, sid: str, *, age_days: float = 100.0, ended: bool = True, end_reason: str = "done",
        source: str = "cli", parent: str | None = None, model_config: dict | None = None, **fields) -> str:
    """A session started ``age_days`` ago, ended a minute later unless ``ended=False``."""
    kwargs = {}
    if parent is not None:
        kwargs["parent_session_id"] = parent
    if model_config is not None:
        kwargs["model_config"] = model_config
    db.create_session(sid, source, **kwargs)
    started = time.time() - age_days * DAY
    db.update_session(sid, started_at=started, ended_at=started + 60 if ended else None,
                      end_reason=end_reason if ended else None, **fields)
    return sid


def archived(db, *ids: str) -> dict[str, int]:
    return {sid: db.get_session(sid)["archived"] for sid in ids}


def usage_rows(db, sid: str) -> int:
    return db._read(lambda c: c.execute(select(func.count()).select_from(USAGE).where(USAGE.c.session_id == sid)).scalar())


def message_rows(db, sid: str) -> int:
    return db._read(lambda c: c.execute(
        select(func.count()).select_from(MESSAGES).where(MESSAGES.c.session_id == sid)).scalar())


def files_for(folder: Path, *ids: str) -> list[Path]:
    out = []
    for sid in ids:
        for name in (f"{sid}.json", f"{sid}.jsonl", f"request_dump_{sid}_001.json"):
            path = folder / name
            path.write_text("{}")
            out.append(path)
    return out


# ---------------------------------------------------------------------------- signatures


def _params(fn) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty


def test_signatures_are_hermes_v26(hermes_state) -> None:
    S = hermes_state.SessionDB
    pk, var = "POSITIONAL_OR_KEYWORD", "VAR_KEYWORD"
    expected = {
        "set_session_archived": [("self", pk, E), ("session_id", pk, E), ("archived", pk, E)],
        "list_prune_candidates": [("self", pk, E), ("older_than_days", pk, None), ("source", pk, None),
                                  ("filters", var, E)],
        "archive_sessions": [("self", pk, E), ("older_than_days", pk, None), ("source", pk, None), ("filters", var, E)],
        "prune_sessions": [("self", pk, E), ("older_than_days", pk, 90), ("source", pk, None),
                           ("sessions_dir", pk, None), ("filters", var, E)],
        "delete_session": [("self", pk, E), ("session_id", pk, E), ("sessions_dir", pk, None),
                           ("expected_delete_ids", pk, None)],  # v26
        "delete_sessions": [("self", pk, E), ("session_ids", pk, E), ("sessions_dir", pk, None)],
        "delete_session_if_empty": [("self", pk, E), ("session_id", pk, E), ("sessions_dir", pk, None)],
        "count_empty_sessions": [("self", pk, E)],
        "delete_empty_sessions": [("self", pk, E), ("sessions_dir", pk, None)],
    }
    for name, params in expected.items():
        assert _params(getattr(S, name)) == params, name
    assert inspect.signature(S.prune_sessions).parameters["older_than_days"].annotation == "Optional[float]"


# ---------------------------------------------------------------------------- set_session_archived


def _lineage(db) -> None:
    """root ─compression→ mid ─compression→ tip (open); root has a delegate child;
    tip has a branch child; 'other' is unrelated; 'bp' ended 'branched' with child 'bc'."""
    add(db, "root", end_reason="compression", age_days=10)
    add(db, "mid", parent="root", end_reason="compression", age_days=9)
    add(db, "tip", parent="mid", ended=False, age_days=8)
    add(db, "deleg", parent="root", model_config={"_delegate_from": "root"}, age_days=9)
    add(db, "branch", parent="tip", model_config={"_branched_from": "tip"}, age_days=7)
    add(db, "other", age_days=10)
    add(db, "bp", end_reason="branched", age_days=10)
    add(db, "bc", parent="bp", age_days=9)


@pytest.mark.parametrize("start", ["root", "mid", "tip"])
def test_archive_flags_the_whole_compression_lineage(db, start: str) -> None:
    _lineage(db)
    assert db.set_session_archived(start, True) is True
    assert archived(db, "root", "mid", "tip", "deleg") == {"root": 1, "mid": 1, "tip": 1, "deleg": 1}
    # tip did not end 'compression': its branch child is not part of the lineage
    assert archived(db, "branch", "other", "bp", "bc") == {"branch": 0, "other": 0, "bp": 0, "bc": 0}
    assert db.set_session_archived(start, False) is True
    assert set(archived(db, "root", "mid", "tip", "deleg").values()) == {0}


def test_archive_climbs_only_through_compression_parents(db) -> None:
    _lineage(db)
    assert db.set_session_archived("bc", True) is True
    assert archived(db, "bc", "bp") == {"bc": 1, "bp": 0}
    assert db.set_session_archived("branch", True) is True  # its parent tip never ended 'compression'
    assert archived(db, "branch", "tip", "mid") == {"branch": 1, "tip": 0, "mid": 0}


def test_archive_return_values(db) -> None:
    add(db, "s")
    assert db.set_session_archived("s", True) is True
    assert db.set_session_archived("s", True) is True  # an existing row counts even if unchanged
    assert db.set_session_archived("ghost", True) is False
    assert db.set_session_archived("", True) is False
    assert db.set_session_archived(None, True) is False
    assert db.set_session_archived("s", 0) is True and archived(db, "s") == {"s": 0}


def test_archive_survives_a_parent_cycle(db) -> None:
    add(db, "a", end_reason="compression")
    add(db, "b", parent="a", end_reason="compression")
    db.update_session("a", parent_session_id="b")  # corrupt: a ↔ b
    assert db.set_session_archived("a", True) is True
    assert archived(db, "a", "b") == {"a": 1, "b": 1}


# ---------------------------------------------------------------------------- list_prune_candidates


def test_candidates_shape_order_and_age(db) -> None:
    add(db, "old2", age_days=200)
    add(db, "old1", age_days=300, title="t1", model="m")
    add(db, "young", age_days=1)
    add(db, "open_old", age_days=300, ended=False)
    rows = db.list_prune_candidates(older_than_days=90)
    assert [r["id"] for r in rows] == ["old1", "old2"]
    assert list(rows[0]) == ["id", "source", "title", "model", "started_at", "ended_at", "message_count", "archived",
                             "last_active"]  # v25
    assert rows[0]["last_active"] == rows[0]["started_at"]  # no messages: the start
    assert (rows[0]["title"], rows[0]["model"], rows[0]["archived"], rows[0]["message_count"]) == ("t1", "m", 0, 0)
    # no age bound by default or with None; a running session is never a candidate
    assert [r["id"] for r in db.list_prune_candidates()] == ["old1", "old2", "young"]
    assert [r["id"] for r in db.list_prune_candidates(None)] == ["old1", "old2", "young"]
    # started_before wins over older_than_days; started_after is inclusive
    cut = db.get_session("old2")["started_at"]
    assert [r["id"] for r in db.list_prune_candidates(older_than_days=0, started_before=cut)] == ["old1"]
    assert [r["id"] for r in db.list_prune_candidates(started_after=cut)] == ["old2", "young"]
    # read-only
    assert db.get_session("old1") is not None


def test_candidates_exact_filters(db) -> None:
    add(db, "a", source="telegram", end_reason="idle", user_id="u1", chat_id="c1", chat_type="dm")
    add(db, "b", source="cli", end_reason="done", user_id="u2", chat_id="c2", chat_type="group")
    add(db, "c", source="Telegram", end_reason="Idle", user_id="U1", chat_id="C1", chat_type="DM")

    def ids(**kw) -> list[str]:
        return [r["id"] for r in db.list_prune_candidates(**kw)]

    assert ids(source="telegram") == ["a"]
    assert [r["id"] for r in db.list_prune_candidates(None, "cli")] == ["b"]
    assert ids(end_reason="idle") == ["a"]
    assert ids(user_id="u1") == ["a"]
    assert ids(chat_id="c2") == ["b"]
    assert ids(chat_type="DM") == ["c"]
    assert ids(source="telegram", user_id="u2") == []  # AND-ed
    assert ids(source="") == []  # an empty string is a value, not "no filter"


def test_candidates_provider_and_substring_filters(db) -> None:
    add(db, "a", billing_provider="OpenRouter", title="Fix the Parser", model="anthropic/Claude-X", git_branch="feat/Login")
    add(db, "b", billing_provider="openrouter-eu", title="a_b plan", model="gpt", git_branch="main")
    add(db, "c", billing_provider=None, title="axb plan 100%", model=None, git_branch=None)

    def ids(**kw) -> list[str]:
        return [r["id"] for r in db.list_prune_candidates(**kw)]

    assert ids(provider="openrouter") == ["a"]  # case-insensitive, exact
    assert ids(provider="OPENROUTER-EU") == ["b"]
    assert ids(title_like="parser") == ["a"]
    assert ids(model_like="claude") == ["a"]
    assert ids(branch_like="LOGIN") == ["a"]
    assert ids(title_like="plan") == ["b", "c"]
    # deliberate difference: LIKE wildcards in the needle are literal characters
    assert ids(title_like="_") == ["b"]
    assert ids(title_like="a_b") == ["b"]
    assert ids(title_like="%") == ["c"]
    assert ids(model_like="%") == []


def test_candidates_cwd_prefix(db) -> None:
    add(db, "exact", cwd="/work/proj")
    add(db, "below", cwd="/work/proj/sub/dir")
    add(db, "win", cwd="/work/proj\\sub")
    add(db, "sibling", cwd="/work/project")
    add(db, "upper", cwd="/Work/proj/x")
    add(db, "wild", cwd="/work/pxoj/y")
    add(db, "none")

    def ids(prefix: str) -> list[str]:
        return sorted(r["id"] for r in db.list_prune_candidates(cwd_prefix=prefix))

    assert ids("/work/proj") == ["below", "exact", "win"]
    assert ids("/work/proj/") == ["below", "exact", "win"]  # trailing separator ignored
    assert ids("/work/proj\\") == ["below", "exact", "win"]
    assert ids("/work/p_oj") == []  # '_' is not a wildcard
    assert ids("/work/proj/sub") == ["below"]


def test_candidates_numeric_bounds(db) -> None:
    add(db, "small", message_count=1, tool_call_count=0, input_tokens=10, output_tokens=5,
        estimated_cost_usd=0.5, actual_cost_usd=None)
    add(db, "big", message_count=50, tool_call_count=9, input_tokens=1000, output_tokens=500,
        estimated_cost_usd=9.0, actual_cost_usd=2.0)
    add(db, "nulls", message_count=5, tool_call_count=3, input_tokens=None, output_tokens=None,
        estimated_cost_usd=None, actual_cost_usd=None)

    def ids(**kw) -> list[str]:
        return sorted(r["id"] for r in db.list_prune_candidates(**kw))

    assert ids(min_messages=5) == ["big", "nulls"]
    assert ids(max_messages=5) == ["nulls", "small"]
    assert ids(min_messages=2, max_messages=10) == ["nulls"]
    assert ids(max_tokens=0) == ["nulls"]  # NULL tokens count as 0
    assert ids(min_tokens=15, max_tokens=15) == ["small"]
    assert ids(min_tokens=1500) == ["big"]
    assert ids(max_cost=0) == ["nulls"]
    assert ids(min_cost=1.0) == ["big"]  # actual cost (2.0) wins over the estimate (9.0)
    assert ids(max_cost=2.0) == ["big", "nulls", "small"]
    assert ids(min_tool_calls=3) == ["big", "nulls"]
    assert ids(max_tool_calls=0) == ["small"]


def test_candidates_archived_filter(db) -> None:
    add(db, "live")
    add(db, "arch", archived=1)
    assert sorted(r["id"] for r in db.list_prune_candidates()) == ["arch", "live"]
    assert [r["id"] for r in db.list_prune_candidates(archived=True)] == ["arch"]
    assert [r["id"] for r in db.list_prune_candidates(archived=False)] == ["live"]


def test_unknown_filter_is_a_type_error_and_bad_values_are_typed(db) -> None:
    add(db, "s")
    for call in (db.list_prune_candidates, db.archive_sessions, db.prune_sessions):
        with pytest.raises(TypeError, match="titel_like"):
            call(titel_like="x")
    with pytest.raises(errors.InvalidInputError):
        db.prune_sessions(min_messages="many")
    with pytest.raises(errors.InvalidInputError):
        db.prune_sessions(older_than_days="ninety")
    with pytest.raises(errors.InvalidInputError):
        db.list_prune_candidates(title_like=5)
    with pytest.raises(errors.InvalidInputError):
        db.list_prune_candidates(archived="yes")
    assert db.get_session("s") is not None and archived(db, "s") == {"s": 0}


# ---------------------------------------------------------------------------- archive_sessions


def test_archive_sessions_counts_candidates_and_archives_lineages(db) -> None:
    add(db, "old", age_days=100, end_reason="compression")
    add(db, "cont", parent="old", ended=False, age_days=100)  # open: not a candidate itself
    add(db, "old2", age_days=100)
    add(db, "young", age_days=1)
    assert db.archive_sessions(older_than_days=30) == 2
    assert archived(db, "old", "cont", "old2", "young") == {"old": 1, "cont": 1, "old2": 1, "young": 0}
    assert db.archive_sessions(older_than_days=30) == 0  # only unarchived ones by default
    assert db.archive_sessions(older_than_days=30, archived=None) == 2  # matched again, nothing changes
    assert db.archive_sessions(source="nope") == 0
    assert db.archive_sessions(title_like="x") == 0
    assert db.archive_sessions() == 1 and archived(db, "young") == {"young": 1}


# ---------------------------------------------------------------------------- prune_sessions


def test_prune_defaults_match_v11(db, tmp_path: Path) -> None:
    add(db, "old")
    add(db, "old_open", ended=False)
    add(db, "young", age_days=10)
    db.append_message("old", "user", "bye")
    db.update_token_counts("old", input_tokens=5, model="m")
    assert usage_rows(db, "old") == 1
    assert db.prune_sessions() == 0  # v25: 90 days of inactivity, and 'old' just got a message
    db._write(lambda c: c.execute(MESSAGES.update().where(MESSAGES.c.session_id == "old")
                                  .values(timestamp=time.time() - 95 * DAY)))
    assert db.prune_sessions() == 1
    assert db.get_session("old") is None and message_rows(db, "old") == 0 and usage_rows(db, "old") == 0
    assert db.get_session("old_open") is not None and db.get_session("young") is not None
    assert db.prune_sessions() == 0


def test_prune_with_filters_and_no_age_bound(db) -> None:
    add(db, "a_b", age_days=1, title="keep a_b")
    add(db, "axb", age_days=1, title="keep axb")
    add(db, "arch", age_days=1, archived=1)
    assert db.prune_sessions(title_like="a_b") == 0  # still within 90 days
    assert db.prune_sessions(None, title_like="a_b") == 1
    assert db.get_session("axb") is not None  # '_' matched only itself
    assert db.prune_sessions(older_than_days=None, archived=True) == 1
    assert db.get_session("arch") is None
    started = db.get_session("axb")["started_at"]
    assert db.prune_sessions(older_than_days=3650, started_before=started + 1) == 1  # started_before wins


def test_prune_orphans_children_without_delegate_cascade(db, tmp_path: Path) -> None:
    add(db, "old")
    add(db, "kid", parent="old", age_days=1)
    add(db, "deleg", parent="old", model_config={"_delegate_from": "old"}, age_days=1)
    folder = tmp_path / "sessions"
    folder.mkdir()
    doomed = files_for(folder, "old")
    kept = files_for(folder, "kid", "deleg")
    assert db.prune_sessions(90, sessions_dir=folder) == 1
    assert db.get_session("kid")["parent_session_id"] is None
    assert db.get_session("deleg")["parent_session_id"] is None
    assert not any(p.exists() for p in doomed) and all(p.exists() for p in kept)


# ---------------------------------------------------------------------------- delete_session


def _family(db) -> None:
    """p has: delegate d1 (which has delegate d2 and an untagged child u), a marker-only
    child m (marker value names someone else), a delegate found by marker alone (x, no
    parent link), a compression child c, a branch child b, a child with malformed
    model_config j; 'q' is unrelated."""
    add(db, "p", end_reason="compression", age_days=1)
    add(db, "d1", parent="p", model_config={"_delegate_from": "p"}, age_days=1)
    add(db, "d2", parent="d1", model_config={"_delegate_from": "d1"}, age_days=1)
    add(db, "u", parent="d1", age_days=1)
    add(db, "m", parent="p", model_config={"_delegate_from": "__orphaned__"}, age_days=1)
    add(db, "x", model_config={"_delegate_from": "p"}, age_days=1)
    add(db, "c", parent="p", age_days=1)
    add(db, "b", parent="p", model_config={"_branched_from": "p"}, age_days=1)
    add(db, "j", parent="p", age_days=1)
    db.update_session("j", model_config="{not json _delegate_from")
    add(db, "q", age_days=1)
    # Imported rows: p is closed by compression already, and no live append lands there (v26).
    db.append_messages([{"session_id": sid, "role": "user", "content": f"hello from {sid}"}
                        for sid in ("p", "d1", "d2", "x")])
    db.update_token_counts("d2", input_tokens=3, model="m")


def test_delete_session_cascades_delegates_and_orphans_the_rest(db, tmp_path: Path) -> None:
    _family(db)
    folder = tmp_path / "sessions"
    folder.mkdir()
    doomed = files_for(folder, "p", "d1", "d2", "m", "x")
    kept = files_for(folder, "u", "c", "b", "j", "q")
    assert db.delete_session("p", sessions_dir=folder) is True
    for sid in ("p", "d1", "d2", "m", "x"):
        assert db.get_session(sid) is None, sid
        assert message_rows(db, sid) == 0
    assert usage_rows(db, "d2") == 0
    for sid in ("u", "c", "b", "j"):
        assert db.get_session(sid)["parent_session_id"] is None, sid
    assert db.get_session("q") is not None
    assert not any(p.exists() for p in doomed) and all(p.exists() for p in kept)


def test_delete_session_return_values(db) -> None:
    add(db, "s")
    assert db.delete_session("ghost") is False
    assert db.delete_session("") is False
    assert db.delete_session(None) is False
    assert db.delete_session("s") is True
    assert db.delete_session("s") is False


def test_deleting_a_delegate_child_keeps_its_parent(db) -> None:
    _family(db)
    assert db.delete_session("d1") is True
    assert db.get_session("p") is not None and db.get_session("d2") is None
    assert db.get_session("u")["parent_session_id"] is None


def test_delegate_marker_cycle_terminates(db) -> None:
    add(db, "a", model_config={"_delegate_from": "b"})
    add(db, "b", model_config={"_delegate_from": "a"})
    assert db.delete_session("a") is True
    assert db.get_session("b") is None


# ---------------------------------------------------------------------------- delete_sessions


def test_delete_sessions_counts_listed_ids_that_existed(db, tmp_path: Path) -> None:
    _family(db)
    folder = tmp_path / "sessions"
    folder.mkdir()
    doomed = files_for(folder, "p", "d1", "d2", "q")
    assert db.delete_sessions(["p", "p", "ghost", "", None, 7, "q", "d1"], sessions_dir=folder) == 3
    for sid in ("p", "d1", "d2", "m", "x", "q"):
        assert db.get_session(sid) is None, sid
    assert db.get_session("c")["parent_session_id"] is None
    assert not any(p.exists() for p in doomed)
    assert db.delete_sessions([]) == 0
    assert db.delete_sessions(["ghost", ""]) == 0
    with pytest.raises(errors.InvalidInputError):
        db.delete_sessions("c")  # one id is not a list of ids


def test_delete_sessions_is_one_transaction(db, monkeypatch, tmp_path: Path) -> None:
    add(db, "a")
    add(db, "b")
    folder = tmp_path / "sessions"
    folder.mkdir()
    paths = files_for(folder, "a", "b")
    original = HousekeepingRepository.delete_rows
    calls = []

    def fail_after(self, ids):
        original(self, ids)
        calls.append(list(ids))
        raise RuntimeError("power cut")

    monkeypatch.setattr(HousekeepingRepository, "delete_rows", fail_after)
    with pytest.raises(RuntimeError):
        db.delete_sessions(["a", "b"], sessions_dir=folder)
    monkeypatch.undo()
    assert calls and db.get_session("a") is not None and db.get_session("b") is not None
    assert all(p.exists() for p in paths)


# ---------------------------------------------------------------------------- files only after commit


@pytest.mark.parametrize("how", ["delete_session", "delete_sessions", "prune_sessions", "delete_empty_sessions",
                                 "delete_session_if_empty"])
def test_transcript_files_stay_when_the_delete_rolls_back(db, monkeypatch, tmp_path: Path, how: str) -> None:
    add(db, "s")
    folder = tmp_path / "sessions"
    folder.mkdir()
    paths = files_for(folder, "s")
    original = HousekeepingRepository.queue_files

    def queue_then_fail(self, ids, sessions_dir):
        original(self, ids, sessions_dir)
        raise RuntimeError("late failure")

    monkeypatch.setattr(HousekeepingRepository, "queue_files", queue_then_fail)
    call = {
        "delete_session": lambda: db.delete_session("s", folder),
        "delete_sessions": lambda: db.delete_sessions(["s"], folder),
        "prune_sessions": lambda: db.prune_sessions(90, None, folder),
        "delete_empty_sessions": lambda: db.delete_empty_sessions(folder),
        "delete_session_if_empty": lambda: db.delete_session_if_empty("s", folder),
    }[how]
    with pytest.raises(RuntimeError):
        call()
    assert db.get_session("s") is not None and all(p.exists() for p in paths)
    monkeypatch.undo()
    assert call() in (True, 1)
    assert db.get_session("s") is None and not any(p.exists() for p in paths)


# ---------------------------------------------------------------------------- empty sessions


def test_delete_session_if_empty_rules(db, tmp_path: Path) -> None:
    add(db, "empty", ended=False)  # ended_at is not checked
    add(db, "titled", title="named")
    add(db, "has_msg")
    db.append_message("has_msg", "user", "hi")
    add(db, "parent")
    add(db, "child", parent="parent")
    folder = tmp_path / "sessions"
    folder.mkdir()
    paths = files_for(folder, "empty", "titled")
    assert db.delete_session_if_empty("empty", sessions_dir=folder) is True
    assert db.get_session("empty") is None
    assert db.delete_session_if_empty("titled", sessions_dir=folder) is False
    assert db.delete_session_if_empty("has_msg") is False
    assert db.delete_session_if_empty("parent") is False
    assert db.delete_session_if_empty("child") is True  # a child may go; its parent stays
    assert db.get_session("parent") is not None
    assert db.delete_session_if_empty("ghost") is False
    assert db.delete_session_if_empty("") is False
    assert db.delete_session_if_empty(None) is False
    assert [p.exists() for p in paths] == [False, False, False, True, True, True]


def test_delete_session_if_empty_counts_inactive_rows(db) -> None:
    add(db, "s")
    mid = db.append_message("s", "user", "rewound soon")
    db.rewind_to_message("s", mid)
    assert db.get_messages("s") == []  # nothing live ...
    assert db.delete_session_if_empty("s") is False  # ... but a stored row still counts
    assert db.get_session("s") is not None


def test_delete_session_if_empty_is_a_guard_under_concurrency(db) -> None:
    """Appends race the guarded delete: a session is either gone with no message, or
    kept with every appended message; never a deleted session that had messages."""
    ids = [f"race{i}" for i in range(12)]
    for sid in ids:
        add(db, sid)
    other = type(db)(db.db_path) if db.db_path is not None else type(db)(db.url.render_as_string(hide_password=False))
    appended: dict[str, bool] = {}
    deleted: dict[str, bool] = {}
    try:
        for sid in ids:
            barrier = threading.Barrier(2)

            def append(sid=sid, barrier=barrier):
                barrier.wait()
                try:
                    other.append_message(sid, "user", "just in time")
                    appended[sid] = True
                except Exception:
                    appended[sid] = False

            def guard(sid=sid, barrier=barrier):
                barrier.wait()
                deleted[sid] = db.delete_session_if_empty(sid)

            threads = [threading.Thread(target=append), threading.Thread(target=guard)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        other.close()
    for sid in ids:
        row = db.get_session(sid)
        assert appended[sid] != deleted[sid], sid  # exactly one of them won
        if deleted[sid]:
            assert row is None and message_rows(db, sid) == 0
        else:
            assert row is not None and row["message_count"] == 1 and message_rows(db, sid) == 1


def test_count_and_delete_empty_sessions(db, tmp_path: Path) -> None:
    add(db, "e1")
    add(db, "e2")
    add(db, "open", ended=False)
    add(db, "arch", archived=1)
    add(db, "full")
    db.append_message("full", "user", "hi")
    add(db, "stray")  # counter says 0 but a row exists: the row goes too
    db.append_message("stray", "user", "lost")
    db.update_session("stray", message_count=0)
    add(db, "kid", parent="e1", ended=False)
    assert db.count_empty_sessions() == 3
    folder = tmp_path / "sessions"
    folder.mkdir()
    paths = files_for(folder, "e1", "stray")
    assert db.delete_empty_sessions(sessions_dir=folder) == 3
    for sid in ("e1", "e2", "stray"):
        assert db.get_session(sid) is None
    assert message_rows(db, "stray") == 0
    assert db.get_session("kid")["parent_session_id"] is None
    for sid in ("open", "arch", "full"):
        assert db.get_session(sid) is not None
    assert not any(p.exists() for p in paths)
    assert db.count_empty_sessions() == 0 and db.delete_empty_sessions() == 0
