"""Hermes v26 §2.G maintenance: vacuum's checkpoints, logical size, state_meta prefixes,
the kanban retag, the stale tool-call marker purge; through the swapped ``hermes_state``
module, on both backends (the file-only parts take ``sqlite_only``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import event, text

pytestmark = pytest.mark.both_backends

CALL = [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}]


def contents(db, sid: str) -> list[str]:
    return [m["content"] for m in db.get_messages(sid)]


def markers(db) -> list[int]:
    db.create_session("s", "cli")
    return [
        db.append_message("s", "assistant", "[terminal]", tool_calls=CALL),
        db.append_message("s", "assistant", "  [web.search-v2]  ", tool_calls=CALL),
        db.append_message("s", "assistant", "[terminal] and more", tool_calls=CALL),  # not only a marker
        db.append_message("s", "assistant", "[terminal]"),  # no tool calls
        db.append_message("s", "user", "[terminal]"),
        db.append_message("s", "assistant", "[9lives]", tool_calls=CALL),  # not an identifier
    ]


# ---------------------------------------------------------------------------- purge markers


def test_purge_dry_run_lists_and_writes_nothing(db) -> None:
    ids = markers(db)
    before = contents(db, "s")
    out = db.purge_stale_tool_call_markers(dry_run=True)
    assert out == {"dry_run": True, "rows_affected": 2, "row_ids": ids[:2], "backup_path": None}
    assert contents(db, "s") == before


def test_purge_blanks_markers_after_a_backup(db, backend: str) -> None:
    ids = markers(db)
    out = db.purge_stale_tool_call_markers()
    assert out["dry_run"] is False and out["rows_affected"] == 2 and out["row_ids"] == ids[:2]
    assert contents(db, "s") == ["", "", "[terminal] and more", "[terminal]", "[terminal]", "[9lives]"]
    assert out["backup_path"]
    if backend == "sqlite":
        backup = Path(out["backup_path"])
        assert backup.name.startswith("state.db.pre-clean-markers-backup-")
        with sqlite3.connect(backup) as copy:
            kept = [r[0] for r in copy.execute("SELECT content FROM messages WHERE id IN (?, ?) ORDER BY id", ids[:2])]
        assert kept == ["[terminal]", "  [web.search-v2]  "]
    else:
        key = out["backup_path"].removeprefix("state_meta:")
        assert json.loads(db.get_meta(key)) == {str(ids[0]): "[terminal]", str(ids[1]): "  [web.search-v2]  "}
    again = db.purge_stale_tool_call_markers()
    assert again == {"dry_run": False, "rows_affected": 0, "row_ids": [], "backup_path": None}


def test_purge_without_backup_takes_none(db, tmp_path: Path) -> None:
    markers(db)
    out = db.purge_stale_tool_call_markers(backup=False)
    assert out["rows_affected"] == 2 and out["backup_path"] is None
    assert not list(tmp_path.glob("*pre-clean-markers*"))
    assert db.list_meta_prefix("pre-clean-markers-backup-") == []


# ---------------------------------------------------------------------------- meta, size, retag


def test_list_meta_prefix_is_literal(db) -> None:
    db.set_meta("a_b:1", "x")
    db.set_meta("a_b:2", "y")
    db.set_meta("axb:3", "z")
    db.set_meta("A_b:4", "w")
    assert db.list_meta_prefix("a_b:") == [("a_b:1", "x"), ("a_b:2", "y")]
    assert db.list_meta_prefix("a%") == []
    assert ("axb:3", "z") in db.list_meta_prefix("")


def test_logical_size_grows_with_data(db) -> None:
    first = db.logical_size_bytes()
    assert isinstance(first, int) and first > 0
    db.create_session("s", "cli")
    for i in range(300):
        db.append_message("s", "user", f"{i} " + "x" * 2000)
    assert db.logical_size_bytes() > first


@pytest.mark.sqlite_only
def test_logical_size_is_pages_times_page_size(db) -> None:
    with sqlite3.connect(db.db_path) as raw:
        pages = raw.execute("PRAGMA page_count").fetchone()[0]
        size = raw.execute("PRAGMA page_size").fetchone()[0]
    assert db.logical_size_bytes() == pages * size


def test_retag_kanban_worker_sessions_once_per_root(db) -> None:
    for sid, source, cwd in (("in", "cli", "/ws/task-1"), ("root", "cli", "/ws"), ("near", "cli", "/wsx/a"),
                             ("tg", "telegram", "/ws/t"), ("none", "cli", None)):
        db.create_session(sid, source)
        db.update_session(sid, cwd=cwd)
    assert db.retag_kanban_worker_sessions("/ws/") == 2
    assert {s: db.get_session(s)["source"] for s in ("in", "root", "near", "tg", "none")} == {
        "in": "kanban", "root": "kanban", "near": "cli", "tg": "telegram", "none": "cli"}
    db.create_session("late", "cli")
    db.update_session("late", cwd="/ws/task-2")
    assert db.retag_kanban_worker_sessions("/ws") == 0  # this root was done
    assert db.get_session("late")["source"] == "cli"
    assert db.retag_kanban_worker_sessions("") == 0


# ---------------------------------------------------------------------------- vacuum


@pytest.mark.sqlite_only
def test_vacuum_checkpoints_passive_then_vacuums_then_truncates(db) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    seen: list[str] = []
    engine = db._open_engine()

    @event.listens_for(engine, "connect")
    def _trace(dbapi_conn, _record) -> None:  # new connections
        dbapi_conn.set_trace_callback(seen.append)

    engine.dispose()
    try:
        db.vacuum()
    finally:
        event.remove(engine, "connect", _trace)
    upkeep = [s.strip() for s in seen if "wal_checkpoint" in s or s.strip().startswith("VACUUM")]
    assert upkeep == ["PRAGMA wal_checkpoint(PASSIVE)", "VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"]


def test_vacuum_returns_the_optimize_count_and_keeps_data(db) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "kept through vacuum")
    db.optimize_fts = lambda: 7
    assert db.vacuum() == 7
    assert contents(db, "s") == ["kept through vacuum"]
    assert db._read(lambda c: c.execute(text("SELECT count(*) FROM messages")).scalar()) == 1


# ---------------------------------------------------------------------------- optimize-storage (v25)


def _empty_the_indexes(db) -> None:
    for index in ("messages_fts", "messages_fts_trigram"):
        db._write(lambda c, i=index: c.exec_driver_sql(f"INSERT INTO {i}({i}) VALUES('delete-all')"))


@pytest.mark.sqlite_only
def test_an_empty_index_beside_messages_is_work_and_is_healed(db) -> None:
    db.create_session("s", "cli")
    for i in range(5):
        db.append_message("s", "user", f"needle number {i}")
    assert db.fts_optimize_available() is False
    _empty_the_indexes(db)
    assert db.search_messages("needle") == []
    assert db.fts_optimize_available() is True
    phases: list[str] = []
    out = db.optimize_fts_storage(progress_cb=lambda e: phases.append(e["phase"]))
    assert out == {"ok": True, "vacuumed": True}
    assert phases[-2:] == ["vacuum", "done"]
    assert len(db.search_messages("needle")) == 5
    assert db.fts_optimize_available() is False and db.get_meta("fts_rebuild_high_water") is None


@pytest.mark.sqlite_only
def test_a_high_water_mark_without_progress_restarts_from_an_emptied_index(db) -> None:
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", f"needle {i}") for i in range(4)]
    db.set_meta("fts_rebuild_high_water", str(ids[-1]))
    out = db.optimize_fts_storage(vacuum=False)
    assert out == {"ok": True, "vacuumed": None}
    assert len(db.search_messages("needle")) == 4  # every row once, none twice
    assert db.check_fts() == {name: None for name in db.check_fts()}


@pytest.mark.sqlite_only
def test_optimize_refuses_to_settle_while_trash_remains(db, monkeypatch) -> None:
    from hermes_store.operations import fts as fts_ops

    db._write(lambda c: c.exec_driver_sql("CREATE TABLE fts_v22_trash_messages_fts_data (id INTEGER PRIMARY KEY)"))
    db._write(lambda c: c.exec_driver_sql("INSERT INTO fts_v22_trash_messages_fts_data VALUES (1)"))
    monkeypatch.setattr(fts_ops, "teardown_trash", lambda *a, **k: 0)  # a teardown that cannot finish here
    before = db.get_meta("fts_storage_version")
    assert db.optimize_fts_storage() == {"ok": False, "reason": "teardown_incomplete", "vacuumed": None}
    assert db.get_meta("fts_storage_version") == before
    monkeypatch.undo()
    assert db.optimize_fts_storage(vacuum=False) == {"ok": True, "vacuumed": None}


def test_optimize_settles_on_a_healthy_store(db) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "healthy")
    assert db.fts_optimize_available() is False
    assert db.optimize_fts_storage(vacuum=False) == {"ok": True, "vacuumed": None}
    assert db.get_meta("fts_storage_version") is not None
