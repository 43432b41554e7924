"""Export/import, deletion, pruning, auto-prune, state_meta and FTS upkeep."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hermes_store import SessionDB

from .conftest import set_times

DAY = 86400.0


def _fill(db: SessionDB) -> None:
    db.create_session("root", "cli", model="m1")
    db.append_message("root", "user", "root question about pelicans")
    db.append_message("root", "assistant", None, tool_calls=[{"id": "t", "function": {"name": "x", "arguments": "{}"}}])
    db.end_session("root", "compression")
    db.create_session("kid", "cli", parent_session_id="root")
    db.append_message("kid", "user", [{"type": "text", "text": "multimodal flamingo"}])
    db.update_token_counts("kid", input_tokens=9, output_tokens=3, model="m2", estimated_cost_usd=0.2)
    db.set_session_title("kid", "kid title")
    db.create_session("solo", "telegram")


def test_export_session_shape(db: SessionDB) -> None:
    _fill(db)
    out = db.export_session("root")
    assert out["id"] == "root" and out["model"] == "m1"
    assert [m["role"] for m in out["messages"]] == ["user", "assistant"]
    assert out["messages"][1]["tool_calls"][0]["function"]["name"] == "x"
    assert db.export_session("nope") is None
    everything = db.export_all()
    assert [s["id"] for s in everything] == ["root", "kid", "solo"]
    assert [s["id"] for s in db.export_all(source="telegram")] == ["solo"]


def _snapshot(db: SessionDB) -> list:
    out = []
    for s in db.export_all():
        s = dict(s)
        out.append(s)
    return out


def test_export_import_round_trip_is_exact_and_idempotent(db: SessionDB, tmp_path: Path) -> None:
    _fill(db)
    exported = db.export_all()
    other = SessionDB(tmp_path / "other.db")
    try:
        assert other.import_sessions(reversed(exported)) == (3, 0)  # children before parents
        assert _snapshot(other) == _snapshot(db)
        assert other.get_session("kid")["parent_session_id"] == "root"
        assert other.search_messages("flamingo")[0]["session_id"] == "kid"
        assert other.import_sessions(exported) == (0, 3)
        assert _snapshot(other) == _snapshot(db)
        assert other.check_fts() == {"messages_fts": None, "messages_fts_trigram": None}
    finally:
        other.close()


def test_delete_session_orphans_children_and_removes_files(db: SessionDB, tmp_path: Path) -> None:
    _fill(db)
    folder = tmp_path / "sessions"
    folder.mkdir()
    names = ["root.json", "root.jsonl", "request_dump_root_001.json", "kid.json", "rootx.json"]
    for n in names:
        (folder / n).write_text("{}")
    assert db.delete_session("root", sessions_dir=folder) is True
    assert db.get_session("root") is None
    assert db.get_session("kid")["parent_session_id"] is None
    assert db.message_count() == 1
    assert sorted(p.name for p in folder.iterdir()) == ["kid.json", "rootx.json"]
    assert db.search_messages("pelicans") == []
    assert db.delete_session("root") is False


def test_prune_only_ended_old_sessions(db: SessionDB, tmp_path: Path) -> None:
    old = time.time() - 100 * DAY
    for sid, source, ended in (("old_ended", "cli", True), ("old_open", "cli", False),
                               ("old_tg", "telegram", True), ("new_ended", "cli", True)):
        db.create_session(sid, source)
        db.append_message(sid, "user", f"text {sid}")
        set_times(db, sid, started_at=old if sid.startswith("old") else time.time(),
                  ended_at=time.time() if ended else None, end_reason="done" if ended else None)
    db.create_session("child", "cli", parent_session_id="old_ended")
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "old_ended.jsonl").write_text("x")
    assert db.prune_sessions(older_than_days=90, source="cli", sessions_dir=folder) == 1
    assert not (folder / "old_ended.jsonl").exists()
    assert db.get_session("child")["parent_session_id"] is None
    assert {s["id"] for s in db.export_all()} == {"old_open", "old_tg", "new_ended", "child"}
    assert db.prune_sessions(older_than_days=90) == 1  # old_tg
    assert db.prune_sessions(older_than_days=90) == 0


def test_prune_empty_ghosts(db: SessionDB) -> None:
    old = time.time() - 2 * DAY
    specs = {
        "ghost": ("tui", None, True, old, False),
        "titled": ("tui", "t", True, old, False),
        "open": ("tui", None, False, old, False),
        "recent": ("tui", None, True, time.time(), False),
        "has_msg": ("tui", None, True, old, True),
        "cli_ghost": ("cli", None, True, old, False),
    }
    for sid, (source, title, ended, started, msg) in specs.items():
        db.create_session(sid, source)
        if title:
            db.set_session_title(sid, title)
        if msg:
            db.append_message(sid, "user", "hi")
        set_times(db, sid, started_at=started, ended_at=time.time() if ended else None)
    assert db.prune_empty_ghost_sessions() == 1
    assert db.get_session("ghost") is None and db.session_count() == 5


def test_finalize_orphaned_compression(db: SessionDB) -> None:
    old = time.time() - 8 * DAY
    db.create_session("p", "cli")
    set_times(db, "p", started_at=old - 10, ended_at=old - 5, end_reason="compression")
    cases = {"qualifies": (True, 0, old), "no_msgs": (False, 0, old), "called": (True, 1, old),
             "recent": (True, 0, time.time())}
    for sid, (msg, calls, started) in cases.items():
        db.create_session(sid, "cli", parent_session_id="p")
        if msg:
            db.append_message(sid, "user", "carry on")
        if calls:
            db.update_token_counts(sid, api_call_count=calls)
        set_times(db, sid, started_at=started)
    assert db.finalize_orphaned_compression_sessions() == 1
    row = db.get_session("qualifies")
    assert row["end_reason"] == "orphaned_compression" and row["ended_at"] is not None
    assert db.message_count("qualifies") == 1
    assert db.get_session("recent")["ended_at"] is None


def test_auto_prune_runs_once_per_interval(db: SessionDB) -> None:
    db.create_session("old", "cli")
    set_times(db, "old", started_at=time.time() - 200 * DAY, ended_at=time.time() - 199 * DAY, end_reason="x")
    first = db.maybe_auto_prune_and_vacuum(retention_days=90)
    assert first == {"skipped": False, "pruned": 1, "vacuumed": True}
    assert float(db.get_meta("last_auto_prune")) == pytest.approx(time.time(), abs=60)
    assert db.maybe_auto_prune_and_vacuum()["skipped"] is True
    db.set_meta("last_auto_prune", "not-a-number")
    again = db.maybe_auto_prune_and_vacuum()
    assert again["skipped"] is False and again["pruned"] == 0 and again["vacuumed"] is False


def test_auto_prune_reports_errors(db: SessionDB, monkeypatch) -> None:
    from hermes_store.repositories import maintenance

    def broken(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(maintenance.MaintenanceRepository, "prune_sessions", broken)
    out = db.maybe_auto_prune_and_vacuum()
    assert out["error"] == "RuntimeError: disk on fire" and out["pruned"] == 0


def test_meta_and_fts_upkeep(db: SessionDB) -> None:
    assert db.get_meta("k") is None
    db.set_meta("k", "v1")
    db.set_meta("k", "v2")
    assert db.get_meta("k") == "v2"
    _fill(db)
    assert db.rebuild_fts() == ["messages_fts", "messages_fts_trigram", "messages_cjk_bigram"]
    assert db.optimize_fts() == ["messages_fts", "messages_fts_trigram"]
    assert db.check_fts() == {"messages_fts": None, "messages_fts_trigram": None}
    # corrupt the word index behind the triggers' back: the check must notice
    db._execute_write(lambda c: c.execute(
        "INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) VALUES (999, 'bogus', NULL, NULL)"))
    assert db.check_fts()["messages_fts"] is not None
    db.rebuild_fts()
    assert db.check_fts()["messages_fts"] is None
