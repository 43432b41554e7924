"""Export/import, deletion, pruning, auto-prune, VACUUM, state_meta and search-index upkeep.

Every test that takes ``db`` or ``backend`` runs on a SQLite file and on a PostgreSQL
database (``both_backends``). Only the damaged-FTS5 check reaches into SQLite itself;
its PostgreSQL twin damages a server index instead.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import select, text

from hermes_store import SessionDB, UnitOfWork
from hermes_store.errors import HermesStoreError, InvalidInputError
from hermes_store.models import Base
from hermes_store.repositories.base import UnknownFieldError

from .factories import set_times
from .helpers import server_database

pytestmark = pytest.mark.both_backends

DAY = 86400.0
#: The full-text indexes each backend keeps (FTS5 tables; GIN indexes on the server).
FTS = {"sqlite": ["messages_fts", "messages_fts_trigram"], "postgresql": ["idx_messages_search_vector", "idx_messages_trgm"]}
MESSAGES = Base.metadata.tables["messages"]


# ---------------------------------------------------------------------- helpers


def extra_pg_database(pg_url: str):
    """One more fresh database on the test server (the conftest fixture gives one per test)."""
    return server_database(pg_url)


@pytest.fixture
def empty_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SessionDB]:
    """A second, empty store on the same backend as ``db`` (where an export goes)."""
    if backend == "postgresql":
        with extra_pg_database(request.getfixturevalue("pg_url")) as url:
            store = SessionDB(url)
            try:
                yield store
            finally:
                store.close()
    else:
        with SessionDB(tmp_path / "other.db") as store:
            yield store


def stored(store: SessionDB, table: str, where: Any = None) -> list[dict[str, Any]]:
    """The rows as stored (raw text, no JSON decoding), in primary-key order."""
    t = Base.metadata.tables[table]
    query = select(t).order_by(*t.primary_key.columns)
    if where is not None:
        query = query.where(where)
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def all_stored(store: SessionDB) -> dict[str, list[dict[str, Any]]]:
    return {t: stored(store, t) for t in ("sessions", "messages", "session_model_usage", "system_prompts")}


def healthy(backend: str) -> dict[str, None]:
    """check_fts() of a store whose every full-text index is sound."""
    return {name: None for name in FTS[backend]}


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


def _fill_exacting(db: SessionDB) -> None:
    """Values a lossy round trip would change: NULs, JSON text with odd spacing or
    invalid JSON, doubles that need all 17 digits, big counters, a hashed prompt."""
    _fill(db)
    db.create_session("exact", "cli", model="m\x00odel", system_prompt="be exact\x00ly",
                      model_config='{"temperature":0.7,  "nul": "a\\u0000b"}')
    db.append_message("exact", "tool", "nul\x00inside \ue000 \ue001", tool_name="t\x00n",
                      tool_calls=[{"x": 1.0000000000000002}], reasoning_details="not json {\x00",
                      codex_message_items='[ 1,2 ]')
    db.append_message("exact", "assistant", "日本語のテキスト and emoji \U0001f600", token_count=2**40)
    db.update_token_counts("exact", input_tokens=2**40, estimated_cost_usd=0.1 + 0.2, actual_cost_usd=1e-300,
                           billing_provider="p\x00")
    db.update_token_counts("exact", input_tokens=5, model="vision-model", task="vision", estimated_cost_usd=1 / 3)
    set_times(db, "exact", started_at=1_700_000_000.1234567, ended_at=1_700_000_001.000001, end_reason="done")


def _snapshot(db: SessionDB) -> list:
    return [dict(s) for s in db.export_all()]


# ---------------------------------------------------------------------- export / import


def test_export_session_shape(db: SessionDB) -> None:
    _fill(db)
    out = db.export_session("root")
    assert out["id"] == "root" and out["model"] == "m1"
    assert [m["role"] for m in out["messages"]] == ["user", "assistant"]
    assert out["messages"][1]["tool_calls"][0]["function"]["name"] == "x"
    assert "search_vector" not in out["messages"][0]  # PostgreSQL's search column is not message data
    assert db.export_session("nope") is None
    everything = db.export_all()
    assert [s["id"] for s in everything] == ["solo", "kid", "root"]  # v23: most recently active first
    assert [s["id"] for s in db.export_all(source="telegram")] == ["solo"]
    assert [s["id"] for s in db.iter_export()] == ["root", "kid", "solo"]  # streamed, same order


def test_export_import_round_trip_is_exact_and_idempotent(db: SessionDB, empty_store: SessionDB,
                                                          backend: str) -> None:
    _fill_exacting(db)
    exported = db.export_all()
    other = empty_store
    assert other.import_records(reversed(exported)) == (4, 0)  # children before parents
    assert _snapshot(other) == _snapshot(db)
    # Stored byte for byte: ids, raw JSON text, NULs, doubles, the prompt table, the ledger.
    assert all_stored(other) == all_stored(db)
    exact = other.get_session("exact")
    assert exact["started_at"] == 1_700_000_000.1234567 and exact["estimated_cost_usd"] == 0.1 + 0.2
    assert exact["actual_cost_usd"] == 1e-300 and exact["input_tokens"] == 2**40
    assert exact["model_config"] == '{"temperature":0.7,  "nul": "a\\u0000b"}'
    msgs = other.get_messages("exact")
    assert msgs[0]["content"] == "nul\x00inside \ue000 \ue001" and msgs[0]["tool_name"] == "t\x00n"
    assert msgs[0]["tool_calls"] == [{"x": 1.0000000000000002}]
    assert msgs[0]["reasoning_details"] == json.dumps("not json {\x00")  # v23 JSON-encodes text
    assert other.get_session("kid")["parent_session_id"] == "root"
    assert other.search_messages("flamingo")[0]["session_id"] == "kid"
    assert other.import_records(exported) == (0, 4)
    assert _snapshot(other) == _snapshot(db)
    assert other.check_fts() == healthy(backend)
    # New rows continue after the imported ids.
    assert other.append_message("kid", "user", "next") > max(m["id"] for s in exported for m in s["messages"])


def test_history_moves_between_backends_exactly(tmp_path: Path, pg_database: str) -> None:
    """SQLite file → PostgreSQL → another SQLite file: every stored value survives."""
    with SessionDB(tmp_path / "a.db") as a, SessionDB(pg_database) as server, SessionDB(tmp_path / "b.db") as b:
        _fill_exacting(a)
        assert server.import_records(a.iter_export()) == (4, 0)
        assert all_stored(server) == all_stored(a)
        assert b.import_records(server.iter_export()) == (4, 0)
        assert all_stored(b) == all_stored(a)
        assert _snapshot(b) == _snapshot(server) == _snapshot(a)


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
    # The ledger goes with its session; the orphaned child keeps its own.
    assert [r["session_id"] for r in stored(db, "session_model_usage")] == ["kid"]
    assert db.delete_session("kid") is True
    assert stored(db, "session_model_usage") == [] and db.usage() == []


def test_prune_only_ended_old_sessions(db: SessionDB, tmp_path: Path) -> None:
    old = time.time() - 100 * DAY
    for sid, source, ended in (("old_ended", "cli", True), ("old_open", "cli", False),
                               ("old_tg", "telegram", True), ("new_ended", "cli", True)):
        db.create_session(sid, source)
        db.append_message(sid, "user", f"text {sid}")
        set_times(db, sid, started_at=old if sid.startswith("old") else time.time(),
                  ended_at=time.time() if ended else None, end_reason="done" if ended else None,
                  messages_at=old if sid.startswith("old") else None)
    db.create_session("child", "cli", parent_session_id="old_ended")
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "old_ended.jsonl").write_text("x")
    assert [c["id"] for c in db.prune_candidates(90, source="cli")] == ["old_ended"]
    assert db.prune_sessions(older_than_days=90, source="cli", sessions_dir=folder) == 1
    assert not (folder / "old_ended.jsonl").exists()
    assert db.get_session("child")["parent_session_id"] is None
    assert {s["id"] for s in db.export_all()} == {"old_open", "old_tg", "new_ended", "child"}
    assert db.search_messages("old_ended") == []
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


# ---------------------------------------------------------------------- auto-prune and VACUUM


def vacuum_marks(db: SessionDB, backend: str) -> Any:
    """What a VACUUM leaves behind: SQLite's free pages (none after it), or the server's
    per-table record of the last VACUUM and ANALYZE."""
    with db.engine.connect() as conn:
        if backend == "sqlite":
            return conn.exec_driver_sql("PRAGMA freelist_count").scalar()
        return {r[0]: (r[1] is not None, r[2] is not None) for r in conn.execute(text(
            "SELECT relname, last_vacuum, last_analyze FROM pg_stat_user_tables"
            " WHERE relname IN ('sessions', 'messages') ORDER BY relname"))}


def test_vacuum_gives_space_back(db: SessionDB, backend: str) -> None:
    db.create_session("big", "cli")
    db.append_messages([{"session_id": "big", "role": "user", "content": f"{i} " + "x" * 2000} for i in range(300)])
    db.delete_session("big")
    if backend == "sqlite":
        assert vacuum_marks(db, backend) > 0  # the deleted rows' pages are free, not returned
    else:
        assert vacuum_marks(db, backend) == {"messages": (False, False), "sessions": (False, False)}
    db.vacuum()  # outside any transaction (VACUUM; VACUUM ANALYZE on the server)
    if backend == "sqlite":
        assert vacuum_marks(db, backend) == 0
    else:
        assert vacuum_marks(db, backend) == {"messages": (True, True), "sessions": (True, True)}
    db.create_session("after", "cli")  # the store works on
    assert db.session_count() == 1


def test_auto_prune_runs_once_per_interval(db: SessionDB, backend: str, tmp_path: Path) -> None:
    db.create_session("old", "cli")
    db.append_message("old", "user", "aged out")
    set_times(db, "old", started_at=time.time() - 200 * DAY, ended_at=time.time() - 199 * DAY, end_reason="x",
              messages_at=time.time() - 200 * DAY)
    db.create_session("young", "cli")
    (tmp_path / "old.json").write_text("{}")
    first = db.maybe_auto_prune_and_vacuum(retention_days=90, sessions_dir=tmp_path)
    assert first == {"skipped": False, "pruned": 1, "vacuumed": True}
    assert not (tmp_path / "old.json").exists()
    assert db.get_session("old") is None and db.get_session("young") is not None
    if backend == "postgresql":
        assert vacuum_marks(db, backend) == {"messages": (True, True), "sessions": (True, True)}
    assert float(db.get_meta("last_auto_prune")) == pytest.approx(time.time(), abs=60)
    assert db.maybe_auto_prune_and_vacuum()["skipped"] is True
    assert db.maybe_auto_prune_and_vacuum(min_interval_hours=0)["skipped"] is False
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
    assert db.get_meta("last_auto_prune") is None  # the failed run is not recorded as done


# ---------------------------------------------------------------------- meta and search upkeep


def test_meta(db: SessionDB) -> None:
    assert db.get_meta("k") is None
    db.set_meta("k", "v1")
    db.set_meta("k", "v2")  # an upsert, not a second row
    assert db.get_meta("k") == "v2"
    db.set_meta("n", 1.5)
    db.set_meta("nul", "a\x00b")
    db.set_meta("none", None)
    assert (db.get_meta("n"), db.get_meta("nul"), db.get_meta("none")) == ("1.5", "a\x00b", None)
    mine = [r["key"] for r in stored(db, "state_meta") if not r["key"].startswith("hermes_store.")]
    assert mine == ["k", "n", "none", "nul"]


def test_search_index_upkeep(db: SessionDB, backend: str) -> None:
    _fill(db)
    db.append_message("solo", "user", "短い")  # a short CJK term: the bigram index
    assert db.rebuild_search_indexes() == FTS[backend] + ["messages_cjk_bigram"]
    assert db.optimize_search_indexes() == FTS[backend]
    assert db.check_fts() == healthy(backend)
    assert db.search_messages("pelicans")[0]["session_id"] == "root"
    assert db.search_messages("flamingo")[0]["session_id"] == "kid"
    assert db.search_messages("短い")[0]["session_id"] == "solo"


def damage_word_index(db: SessionDB, backend: str) -> str:
    """Break a search index behind the store's back; returns the index's name."""
    if backend == "sqlite":
        # A row in the word index that no message has: FTS5's check must notice.
        db._execute_write(lambda c: c.execute(
            "INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) VALUES (999, 'bogus', NULL, NULL)"))
        return "messages_fts"
    # What an interrupted CREATE/REINDEX ... CONCURRENTLY leaves: an index marked invalid.
    db._write(lambda c: c.exec_driver_sql(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'idx_messages_search_vector'::regclass"))
    return "idx_messages_search_vector"


def test_check_fts_notices_a_damaged_index_and_rebuild_repairs_it(db: SessionDB, backend: str) -> None:
    _fill(db)
    damaged = damage_word_index(db, backend)
    report = db.check_fts()
    assert report[damaged] is not None
    assert [name for name, problem in report.items() if problem is None] == [i for i in FTS[backend] if i != damaged]
    assert damaged in db.rebuild_search_indexes()
    assert db.check_fts() == healthy(backend)
    assert db.search_messages("pelicans")[0]["session_id"] == "root"


# ---------------------------------------------------------------- import: batches and ids


def _record(sid: str, started: float, n: int, *, parent: str | None = None, first_id: int | None = None) -> dict:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{sid} says {i}", "timestamp": started + i}
            for i in range(n)]
    if first_id is not None:
        for i, m in enumerate(msgs):
            m["id"] = first_id + i
    return {"id": sid, "source": "cli", "started_at": started, "parent_session_id": parent,
            "message_count": n, "messages": msgs}


def test_import_over_several_batches_keeps_everything(db: SessionDB, backend: str) -> None:
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
    assert db.check_fts() == healthy(backend)


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
    assert min(m["id"] for m in b) > 102  # new ids come after the kept ones, never into them
    # Duplicates inside one record and ids out of order are renumbered too.
    dup = _record("c", 3.0, 3, first_id=500)
    dup["messages"][2]["id"] = 500
    rev = _record("d", 4.0, 3)
    for m, i in zip(rev["messages"], (900, 800, 700), strict=True):
        m["id"] = i
    assert db.import_records([dup, rev]) == (2, 0)
    assert [m["content"] for m in db.get_messages("c")] == [f"c says {i}" for i in range(3)]
    assert [m["content"] for m in db.get_messages("d")] == [f"d says {i}" for i in range(3)]
    assert db.message_count() == 13
    # A staged-size session (>= 64 messages) with explicit free ids keeps them too.
    assert db.import_records([_record("e", 5.0, 70, first_id=10_000)]) == (1, 0)
    assert [m["id"] for m in db.get_messages("e")] == list(range(10_000, 10_070))
    # Appends continue after the largest id (SQLite's rowid; the server's identity is moved on).
    assert db.append_message("a", "user", "later") == 10_070
    assert db.import_records([_record("f", 6.0, 2)]) == (1, 0)
    assert [m["id"] for m in db.get_messages("f")] == [10_071, 10_072]


def test_import_children_before_parents_across_transactions(db: SessionDB) -> None:
    """A child whose parent arrives in a later batch (transaction) gets its link back
    when the batches share one pending-parents list."""
    from hermes_store.repositories.maintenance import MaintenanceRepository

    pending: list[tuple[str, str]] = []
    batches = [[_record("child", 1000.0, 1, parent="parent"), _record("x", 2.0, 1)], [_record("parent", 1.0, 1)]]
    for batch in batches:
        with UnitOfWork(db.engine) as uow:
            repo = MaintenanceRepository(uow.conn, pending_parents=pending)
            repo.defer_foreign_keys()
            assert all(repo.import_session(r) for r in batch)
        if batch is batches[0]:
            assert pending == [("child", "parent")]
            assert db.get_session("child")["parent_session_id"] is None  # no dangling link meanwhile
    assert pending == []
    assert db.get_session("child")["parent_session_id"] == "parent"


def test_import_refuses_bad_records_before_writing(db: SessionDB) -> None:
    good = _record("good", 1.0, 2)
    for bad in ("not a dict", {"source": "cli"}, {**_record("b1", 1.0, 1), "messages": "nope"},
                {**_record("b2", 1.0, 1), "messages": [1]}, {**_record("b3", 1.0, 1), "model_usage": ["x"]}):
        with pytest.raises(InvalidInputError):
            db.import_records([good, bad])
        assert db.session_count() == 0 and db.message_count() == 0  # the whole batch rolled back
    assert db.import_records([good]) == (1, 0)


# ---------------------------------------------------------------- one encoder for every write path


def test_append_bulk_replace_and_import_store_identical_rows(db: SessionDB, backend: str) -> None:
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
    derived = ("id", "session_id", "display_order")  # where the row landed, not what was written

    def rows_of(sid: str) -> list[dict[str, Any]]:
        rows = stored(db, "messages", MESSAGES.c.session_id == sid)
        if backend == "sqlite":
            # Hermes' v30 insert trigger gives each new row its id as on-screen order.
            assert [r["display_order"] for r in rows] == [r["id"] for r in rows]
        assert {r["display_identity"] for r in rows} == {None}
        return [{k: v for k, v in r.items() if k not in derived} for r in rows]

    reference = rows_of("appended")
    assert len(reference) == 4
    assert reference[0]["content"] == "nul\x00inside, half \ufffd pair, joined \U0001f600"
    assert reference[0]["tool_name"] == "tool\ufffd" and reference[0]["tool_calls"] is None
    assert reference[2]["content"] == "bytes caf\u00e9" and reference[2]["tool_name"] == "bytes-tool"
    for sid in ("bulk", "replaced", "imported"):
        assert rows_of(sid) == reference, sid


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
    """Seen from another connection than the unit of work's (the store's own reader)."""
    return db.get_session(sid) is not None


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
    with UnitOfWork(db.engine, write=False) as reader:
        assert reader.sessions.get("clean")["source"] == "cli"


def test_unit_of_work_delete_removes_files_only_after_commit(db: SessionDB, tmp_path: Path) -> None:
    _fill(db)
    (tmp_path / "solo.json").write_text("{}")
    with pytest.raises(RuntimeError):
        with UnitOfWork(db.engine) as uow:
            assert uow.maintenance.delete_session("solo", tmp_path) is True
            raise RuntimeError("changed my mind")
    assert (tmp_path / "solo.json").exists() and db.get_session("solo") is not None
    with UnitOfWork(db.engine) as uow:
        assert uow.maintenance.delete_session("solo", tmp_path) is True
        assert (tmp_path / "solo.json").exists()  # not before the commit
    assert not (tmp_path / "solo.json").exists() and db.get_session("solo") is None
