"""Export/import, deletion, pruning, auto-prune, state_meta and FTS upkeep."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from hermes_store import SessionDB, UnitOfWork
from hermes_store.errors import HermesStoreError, InvalidInputError
from hermes_store.repositories.base import UnknownFieldError

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
    assert [s["id"] for s in everything] == ["solo", "kid", "root"]  # v23: most recently active first
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
        assert other.import_records(reversed(exported)) == (3, 0)  # children before parents
        assert _snapshot(other) == _snapshot(db)
        assert other.get_session("kid")["parent_session_id"] == "root"
        assert other.search_messages("flamingo")[0]["session_id"] == "kid"
        assert other.import_records(exported) == (0, 3)
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


# ---------------------------------------------------------------- import: batches and ids


def _record(sid: str, started: float, n: int, *, parent: str | None = None, first_id: int | None = None) -> dict:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{sid} says {i}", "timestamp": started + i}
            for i in range(n)]
    if first_id is not None:
        for i, m in enumerate(msgs):
            m["id"] = first_id + i
    return {"id": sid, "source": "cli", "started_at": started, "parent_session_id": parent,
            "message_count": n, "messages": msgs}


def test_import_over_several_batches_keeps_everything(db: SessionDB) -> None:
    """450 sessions go in three transactions of at most 200 (import_records' batch)."""
    records = [_record("p0", 1.0, 3)]
    records += [_record(f"s{i:03d}", 10.0 + i, 2, parent="p0" if i == 300 else None) for i in range(449)]
    assert db.import_records(records) == (450, 0)
    assert db.session_count() == 450 and db.message_count() == 3 + 449 * 2
    assert db.get_session("s300")["parent_session_id"] == "p0"  # parent came two batches earlier
    assert [m["content"] for m in db.get_messages("s448")] == ["s448 says 0", "s448 says 1"]
    assert db.import_records(records) == (0, 450)  # idempotent across batches too
    assert db.message_count() == 3 + 449 * 2
    assert db.search_messages("s123")[0]["session_id"] == "s123"
    assert db.check_fts() == {"messages_fts": None, "messages_fts_trigram": None}


def test_import_keeps_free_ids_and_renumbers_colliding_sessions_in_order(db: SessionDB) -> None:
    # Free ids are kept exactly (anchors and lineage survive a round trip).
    assert db.import_records([_record("a", 1.0, 3, first_id=100)]) == (1, 0)
    assert [m["id"] for m in db.get_messages("a")] == [100, 101, 102]
    # Another file's export with overlapping ids: all of that session's messages get new
    # ids, in their original order (keeping only the free id 103 would misorder them).
    assert db.import_records([_record("b", 2.0, 4, first_id=101)]) == (1, 0)
    b = db.get_messages("b")
    assert [m["content"] for m in b] == [f"b says {i}" for i in range(4)]
    assert len({m["id"] for m in b} | {100, 101, 102}) == 7
    # Duplicates inside one record and ids out of order are renumbered too.
    dup = _record("c", 3.0, 3, first_id=500)
    dup["messages"][2]["id"] = 500
    rev = _record("d", 4.0, 3)
    for m, i in zip(rev["messages"], (900, 800, 700)):
        m["id"] = i
    assert db.import_records([dup, rev]) == (2, 0)
    assert [m["content"] for m in db.get_messages("c")] == [f"c says {i}" for i in range(3)]
    assert [m["content"] for m in db.get_messages("d")] == [f"d says {i}" for i in range(3)]
    assert db.message_count() == 13
    # A staged-size session (>= 64 messages) with explicit free ids keeps them too.
    assert db.import_records([_record("e", 5.0, 70, first_id=10_000)]) == (1, 0)
    assert [m["id"] for m in db.get_messages("e")] == list(range(10_000, 10_070))


def test_import_children_before_parents_across_transactions(db: SessionDB) -> None:
    """A child whose parent arrives in a later batch (transaction) gets its link back
    when the batches share one pending-parents list."""
    from hermes_store.repositories.maintenance import MaintenanceRepository

    pending: list[tuple[str, str]] = []
    batches = [[_record("child", 1000.0, 1, parent="parent"), _record("x", 2.0, 1)], [_record("parent", 1.0, 1)]]
    for batch in batches:
        with UnitOfWork(db.engine) as uow:
            uow.conn.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
            repo = MaintenanceRepository(uow.conn, pending_parents=pending)
            assert all(repo.import_session(r) for r in batch)
        if batch is batches[0]:
            assert pending == [("child", "parent")]
            assert db.get_session("child")["parent_session_id"] is None  # no dangling link meanwhile
    assert pending == []
    assert db.get_session("child")["parent_session_id"] == "parent"


# ---------------------------------------------------------------- one encoder for every write path


def test_append_bulk_replace_and_import_store_identical_rows(db: SessionDB) -> None:
    """The same message, written four ways, is stored byte-for-byte the same."""
    message = {
        "role": "assistant",
        "content": "nul\x00inside, half \ud800 pair, joined \ud83d\ude00",
        "tool_name": "tool\udfff",
        "tool_calls": [],               # falsy JSON → NULL
        "reasoning_details": {},        # falsy JSON → NULL
        "codex_reasoning_items": "",    # falsy JSON → NULL
        "codex_message_items": [{"k": "v\ud800"}],
        "reasoning": "think \ud800",
        "finish_reason": "stop",
        "token_count": 7,
        "timestamp": 1_700_000_000.5,
    }
    variants = [
        message,
        {**message, "content": [{"type": "text", "text": "list \ud800 content"}]},
        {**message, "content": "bytes caf\u00e9".encode(), "tool_name": b"bytes-tool"},
        {**message, "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
    ]
    for sid in ("appended", "bulk", "replaced"):
        db.create_session(sid, "cli")
    for v in variants:
        db.append_message("appended", **v)
    db.append_messages([{"session_id": "bulk", **v} for v in variants])
    db.replace_messages("replaced", variants)
    db.import_records([{"id": "imported", "source": "cli", "started_at": 1.0, "messages": variants}])

    def stored(sid: str) -> list[tuple]:
        """Every column but those derived from where the row landed (its id)."""
        conn = sqlite3.connect(db.db_path)
        try:
            cur = conn.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (sid,))
            cols = [d[0] for d in cur.description]
            rows = [dict(zip(cols, row)) for row in cur]
        finally:
            conn.close()
        # Hermes' v30 insert trigger gives each new row its id as on-screen order.
        assert [r["display_order"] for r in rows] == [r["id"] for r in rows]
        assert {r["display_identity"] for r in rows} == {None}
        return [tuple(v for c, v in r.items() if c not in ("id", "session_id", "display_order")) for r in rows]

    reference = stored("appended")
    assert len(reference) == 4
    assert reference[0][cols_index(db, "content")] == "nul\x00inside, half \ufffd pair, joined \U0001f600"
    assert reference[2][cols_index(db, "content")] == "bytes caf\u00e9"
    for sid in ("bulk", "replaced", "imported"):
        assert stored(sid) == reference, sid


def cols_index(db: SessionDB, name: str) -> int:
    conn = sqlite3.connect(db.db_path)
    try:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(messages)")
                if r[1] not in ("id", "session_id", "display_order")]
    finally:
        conn.close()
    return cols.index(name)


# ---------------------------------------------------------------- update_session


def test_update_session_without_fields_is_a_no_op(db: SessionDB) -> None:
    db.create_session("s", "cli", model="m")
    before = db.get_session("s")
    assert db.update_session("s") is True
    assert db.update_session("missing") is False
    assert db.get_session("s") == before
    assert db.get_session("missing") is None


def test_update_session_with_unknown_field_is_refused_before_writing(db: SessionDB) -> None:
    db.create_session("s", "cli")
    before = db.get_session("s")
    with pytest.raises(UnknownFieldError, match="no_such_column") as info:
        db.update_session("s", cwd="/tmp/x", no_such_column=1)
    assert isinstance(info.value, InvalidInputError)
    assert db.get_session("s") == before  # cwd was not set either
    assert db.update_session("s", cwd="/tmp/x", archived=1) is True
    assert (db.get_session("s")["cwd"], db.get_session("s")["archived"]) == ("/tmp/x", 1)


# ---------------------------------------------------------------- UnitOfWork.commit


def _visible(db: SessionDB, sid: str) -> bool:
    conn = sqlite3.connect(db.db_path)
    try:
        return conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None
    finally:
        conn.close()


def test_unit_of_work_commit_persists_and_later_errors_roll_back_only_the_rest(db: SessionDB) -> None:
    with pytest.raises(RuntimeError):
        with UnitOfWork(db.engine) as uow:
            uow.sessions.create("first", "cli")
            uow.messages.append("first", "user", "kept")
            assert not _visible(db, "first")  # not yet committed
            uow.commit()
            assert _visible(db, "first")      # durable for other connections now
            uow.sessions.create("second", "cli")
            raise RuntimeError("after commit")
    assert db.get_session("first")["message_count"] == 1
    assert db.get_session("second") is None


def test_unit_of_work_clean_exit_commits_and_error_rolls_back(db: SessionDB) -> None:
    with UnitOfWork(db.engine) as uow:
        uow.sessions.create("clean", "cli")
    assert _visible(db, "clean")
    with pytest.raises(InvalidInputError):
        with UnitOfWork(db.engine) as uow:
            uow.sessions.create("doomed", "cli")
            uow.messages.append("doomed", "user", b"\xff")  # a typed error inside the block
    assert not _visible(db, "doomed")
    uow = UnitOfWork(db.engine)
    with pytest.raises(HermesStoreError, match="outside"):
        uow.commit()
