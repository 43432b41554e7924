"""SessionDB, UnitOfWork and the repositories (not search) on a real PostgreSQL server.

Needs ``HERMES_STORE_TEST_PG_URL`` (``eval "$(scripts/pg-test-server start)"``); without
it every case skips with that reason, and under CI=true fails (see conftest.pg_url).
test_sessions, test_messages, test_titles and test_lineage run on both backends as well
(``pytestmark = pytest.mark.both_backends``).
"""

from __future__ import annotations

import json

import os
import subprocess
import sys
import threading
from pathlib import Path
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event, text

from hermes_store import SessionDB, UnitOfWork, errors
from hermes_store.engine import create_engine

from .factories import set_times

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pg(pg_database: str) -> Iterator[SessionDB]:
    store = SessionDB(pg_database)
    yield store
    store.close()


def statements(engine):  # type: ignore[no-untyped-def]
    """A list that collects every SQL statement the engine sends while it is attached."""
    seen: list[str] = []

    def hook(conn, cursor, statement, params, context, executemany):  # type: ignore[no-untyped-def]
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", hook)
    return seen, lambda: event.remove(engine, "before_cursor_execute", hook)


# ---------------------------------------------------------------------- opening


def test_open_by_url_engine_and_unit_of_work(pg_database: str) -> None:
    with SessionDB(url=pg_database) as store:
        assert store.db_path is None and store.url.get_backend_name() == "postgresql"
        store.create_session("s1", "cli")
    host_engine = sa_create_engine(pg_database)
    try:
        with SessionDB(engine=host_engine) as store:  # our own engine on the same database
            assert store.get_session("s1")["source"] == "cli"
            assert store.engine is not host_engine and store.engine.pool._pre_ping
        with host_engine.connect() as conn:  # the host's engine is still usable
            assert conn.execute(text("SELECT count(*) FROM sessions")).scalar() == 1
    finally:
        host_engine.dispose()
    engine = create_engine(pg_database)
    try:
        with UnitOfWork(engine) as uow:
            uow.sessions.create("s2", "api")
            mid = uow.messages.append("s2", "user", "hello")
        with UnitOfWork(engine, write=False) as uow:
            assert [m["id"] for m in uow.messages.get_messages("s2")] == [mid]
            assert uow.sessions.get("s2")["message_count"] == 1
    finally:
        engine.dispose()


def test_other_dialects_get_one_clear_error(tmp_path: Path) -> None:
    for url in ("mysql+pymysql://u@localhost/db", "mssql+pyodbc://u@dsn"):
        with pytest.raises(errors.UnsupportedDatabaseError, match="not supported"):
            SessionDB(url)
    assert list(tmp_path.iterdir()) == []


def test_reopen_does_not_migrate_twice_and_issues_no_pragma(pg_database: str) -> None:
    SessionDB(pg_database).close()
    engine = create_engine(pg_database)
    seen, stop = statements(engine)
    try:
        from hermes_store import migrations

        migrations.upgrade(engine)
    finally:
        stop()
        engine.dispose()
    assert not any("PRAGMA" in s.upper() or "BEGIN IMMEDIATE" in s.upper() for s in seen)


# ---------------------------------------------------------------------- sessions


def test_sessions_lifecycle(pg: SessionDB) -> None:
    pg.create_session("a", "cli", model="m1", system_prompt="be brief")
    pg.create_session("a", "tui", model="m2", user_id="u")  # existing id: NULLs filled, never user_id (v23)
    row = pg.get_session("a")
    assert (row["source"], row["model"], row["user_id"], row["system_prompt"]) == ("cli", "m1", None, "be brief")
    assert pg.ensure_session("b") == "b" and pg.get_session("b")["source"] == "unknown"
    assert pg.get_session("nope") is None
    pg.end_session("a", "done")
    first = pg.get_session("a")["ended_at"]
    pg.end_session("a", "again")
    assert (pg.get_session("a")["ended_at"], pg.get_session("a")["end_reason"]) == (first, "done")
    pg.reopen_session("a")
    assert pg.get_session("a")["ended_at"] is None
    assert pg.session_count() == 2 and pg.session_count("cli") == 1
    assert pg.resolve_session_id("a") == "a" and pg.resolve_session_id("%") is None


def test_titles_and_conflict(pg: SessionDB) -> None:
    pg.create_session("a", "cli")
    pg.create_session("b", "cli")
    assert pg.set_session_title("a", "  My   title ")
    assert pg.get_session_title("a") == "My title"
    with pytest.raises(errors.TitleConflictError):
        pg.set_session_title("b", "My title")
    assert pg.get_session_title("b") is None
    pg.set_session_title("b", "My title #2")
    assert pg.resolve_session_by_title("My title") == "b"
    assert pg.get_next_title_in_lineage("My title") == "My title #3"
    assert pg.get_session_by_title("My title")["id"] == "a"


@pytest.mark.pg_direct
def test_concurrent_title_clash_is_a_title_conflict(pg: SessionDB, pg_database: str) -> None:
    """Both writers pass the check; the second waits on the unique index, then loses."""
    pg.create_session("a", "cli")
    pg.create_session("b", "cli")
    engine = create_engine(pg_database)
    outcome: dict[str, BaseException | bool] = {}
    try:
        first = UnitOfWork(engine).__enter__()
        first.sessions.set_title("a", "shared")  # not committed yet

        def second() -> None:
            try:
                with UnitOfWork(engine) as uow:
                    outcome["result"] = uow.sessions.set_title("b", "shared")
            except BaseException as exc:
                outcome["error"] = exc

        t = threading.Thread(target=second)
        t.start()
        with engine.connect() as probe:  # wait until the second writer blocks on the index
            while not probe.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )).scalar():
                probe.rollback()
                threading.Event().wait(0.01)
        first.__exit__(None, None, None)
        t.join()
    finally:
        engine.dispose()
    assert isinstance(outcome.get("error"), errors.TitleConflictError), outcome
    assert pg.get_session_title("a") == "shared" and pg.get_session_title("b") is None


def test_token_counts_and_usage_ledger(pg: SessionDB) -> None:
    pg.create_session("s", "cli", model="main")
    pg.update_token_counts("s", input_tokens=10, output_tokens=2, estimated_cost_usd=0.5,
                           billing_provider="openrouter", api_call_count=1)
    pg.update_token_counts("s", input_tokens=5, actual_cost_usd=0.25)
    pg.update_token_counts("s", input_tokens=7, model="vision", task="vision")
    row = pg.get_session("s")
    assert (row["input_tokens"], row["output_tokens"], row["api_call_count"]) == (15, 2, 1)
    assert (row["estimated_cost_usd"], row["actual_cost_usd"]) == (0.5, 0.25)
    pg.update_token_counts("s", input_tokens=3, absolute=True)
    assert pg.get_session("s")["input_tokens"] == 3
    by_model = {u.key[0]: u.input_tokens for u in pg.usage(by="model")}
    assert by_model == {"main": 15, "vision": 7}  # v23: absolute calls never write per-model rows
    assert {u.key[0]: u.input_tokens for u in pg.usage(by="task")} == {"": 15, "vision": 7}
    pg.update_token_counts("ghost", input_tokens=4)  # Hermes creates the row on the fly
    assert pg.get_session("ghost")["input_tokens"] == 4
    big = 2**40  # bigint counters
    pg.update_token_counts("s", input_tokens=big)
    assert pg.get_session("s")["input_tokens"] == big + 3


# ---------------------------------------------------------------------- messages


def test_messages_append_bulk_replace_clear_windows(pg: SessionDB) -> None:
    pg.create_session("s", "cli")
    first = pg.append_message("s", "user", "hello")
    second = pg.append_message("s", "assistant", [{"type": "text", "text": "hi"}],
                               tool_calls=[{"id": "c1"}, {"id": "c2"}], finish_reason="stop")
    assert second > first
    got = pg.get_messages("s")
    assert [m["content"] for m in got] == ["hello", [{"type": "text", "text": "hi"}]]
    assert got[1]["tool_calls"] == [{"id": "c1"}, {"id": "c2"}] and "search_vector" not in got[1]
    assert (pg.get_session("s")["message_count"], pg.get_session("s")["tool_call_count"]) == (2, 2)
    n = pg.append_messages([{"session_id": "s", "role": "user", "content": f"m{i}"} for i in range(100)])
    assert n == 100 and pg.message_count("s") == 102 == pg.get_session("s")["message_count"]
    ids = [m["id"] for m in pg.get_messages("s")]
    assert ids == sorted(ids) and [m["content"] for m in pg.get_messages("s")[2:]] == [f"m{i}" for i in range(100)]
    with pytest.raises(errors.NotFoundError):
        pg.append_message("missing", "user", "x")
    with pytest.raises(errors.NotFoundError):
        pg.append_messages([{"session_id": "s", "role": "user"}, {"session_id": "missing", "role": "user"}])
    assert pg.message_count("s") == 102
    window = pg.get_messages_around("s", ids[50], window=2)
    assert [m["id"] for m in window["window"]] == ids[48:53]
    # Issue 13: the counts are the rows returned on each side of the anchor.
    assert (window["messages_before"], window["messages_after"]) == (2, 2)
    view = pg.get_anchored_view("s", ids[50], window=1, bookend=1)
    assert [m["id"] for m in view["window"]] == ids[49:52]
    assert [m["id"] for m in view["bookend_start"]] == [ids[0]]
    assert [m["id"] for m in view["bookend_end"]] == [ids[-1]]
    conv = pg.get_messages_as_conversation("s")
    assert (conv[0]["role"], conv[0]["content"]) == ("user", "hello") and len(conv) == 102
    pg.replace_messages("s", [{"role": "user", "content": "only"}])
    assert [m["content"] for m in pg.get_messages("s")] == ["only"]
    assert pg.get_session("s")["message_count"] == 1
    pg.clear_messages("s")
    assert pg.get_messages("s") == [] and pg.get_session("s")["message_count"] == 0


def test_nul_surrogates_and_10mb_round_trip(pg: SessionDB, pg_database: str) -> None:
    pg.create_session("s", "cli")
    nul = "before\x00after \ue000 \ue001 \ue000\ue001 end\x00"
    mid = pg.append_message("s", "tool", nul, tool_calls=[{"arg": "x\x00y"}], tool_name="t\x00n",
                            reasoning_details="raw\x00text, kept verbatim")
    big = "word " * (2 * 1024 * 1024)  # 10 MB
    pg.append_message("s", "user", big)
    pg.append_message("s", "user", "lone \ud800 surrogate")
    got = pg.get_messages("s")
    assert got[0]["id"] == mid and got[0]["content"] == nul and got[0]["tool_name"] == "t\x00n"
    assert got[0]["tool_calls"] == [{"arg": "x\x00y"}]
    # Non-JSON text is stored JSON-encoded, as Hermes v23 does; it reads back as the same string.
    assert pg.export_session("s")["messages"][0]["reasoning_details"] == '"raw\\u0000text, kept verbatim"'
    assert json.loads(got[0]["reasoning_details"]) == "raw\x00text, kept verbatim"
    assert got[1]["content"] == big
    assert got[2]["content"] == "lone \ufffd surrogate"  # as on SQLite
    with pytest.raises(errors.InvalidInputError):
        pg.create_session("bad\ud800", "cli")
    # The stored text holds no NUL and keeps the words around it searchable.
    raw = sa_create_engine(pg_database)
    try:
        with raw.connect() as conn:
            stored = conn.execute(text("SELECT content FROM messages WHERE id = :i"), {"i": mid}).scalar()
            assert "\x00" not in stored and "before" in stored and "after" in stored
            words = conn.execute(text("SELECT search_vector::text FROM messages WHERE id = :i"), {"i": mid}).scalar()
            assert "'before'" in words and "'after'" in words
    finally:
        raw.dispose()
    # Other text columns round-trip too (the mapping covers every text parameter).
    pg.create_session("n", "cli", model="m\x00x", user_id="\ue000\x00")
    assert (pg.get_session("n")["model"], pg.get_session("n")["user_id"]) == ("m\x00x", "\ue000\x00")


# ---------------------------------------------------------------------- lineage and listing


def _compression_chain(pg: SessionDB) -> None:
    pg.create_session("root", "cli")
    pg.create_session("c1", "cli", parent_session_id="root")
    pg.create_session("c2", "cli", parent_session_id="c1")
    pg.create_session("side", "cli", parent_session_id="root")
    pg.append_message("c1", "user", "in c1")  # before compression closes c1 (v26 refuses after)
    set_times(pg, "root", started_at=100.0, ended_at=200.0, end_reason="compression")
    set_times(pg, "c1", started_at=200.0, ended_at=300.0, end_reason="compression")
    set_times(pg, "c2", started_at=300.0)
    set_times(pg, "side", started_at=150.0)


def test_lineage_one_query_each(pg: SessionDB) -> None:
    _compression_chain(pg)
    seen, stop = statements(pg.engine)
    try:
        checks = [
            (lambda: pg.get_session_ancestors("c2"), ["root", "c1", "c2"]),
            (lambda: pg.get_session_descendants("root"), ["side", "c1", "c2"]),
            (lambda: pg.get_compression_tip("root"), "c2"),
            # v23: to the tip first, then down; c1 (with messages) is above the tip, so the tip
            (lambda: pg.resolve_resume_session_id("root"), "c2"),
            (lambda: pg.get_session_lineage("c1"), ["root", "c1", "c2"]),
        ]
        for call, expected in checks:
            seen.clear()
            assert call() == expected
            assert len([s for s in seen if s.strip().upper().startswith("WITH")]) == 1, seen
    finally:
        stop()


def test_list_sessions_rich_projects_compression_tip(pg: SessionDB) -> None:
    _compression_chain(pg)
    pg.create_session("other", "tui")
    set_times(pg, "other", started_at=50.0)
    pg.append_message("other", "user", "first line\nsecond")
    rows = pg.list_sessions_rich()
    assert [r["id"] for r in rows] == ["c2", "other"]
    assert rows[0]["_lineage_root_id"] == "root"
    assert rows[1]["preview"] == "first line second"
    assert [r["id"] for r in pg.list_sessions_rich(project_compression_tips=False)] == ["root", "other"]
    assert {r["id"] for r in pg.list_sessions_rich(include_children=True)} == {"root", "c1", "c2", "side", "other"}
    assert [r["id"] for r in pg.list_sessions_rich(source="tui")] == ["other"]
    assert next(r["id"] for r in pg.list_sessions_rich(order_by_last_active=True)) in {"c2", "other"}
    assert [r["id"] for r in pg.search_sessions(limit=2)] and pg.session_count() == 5


# ---------------------------------------------------------------------- export / import / delete


def test_export_import_round_trip_and_identity(pg: SessionDB) -> None:
    pg.create_session("p", "cli", system_prompt="sys")
    pg.create_session("k", "cli", parent_session_id="p")
    pg.append_message("p", "user", "q\x00")
    pg.append_message("k", "assistant", "a", tool_calls=[{"id": 1}])
    pg.update_token_counts("p", input_tokens=3, model="m")
    exported = pg.export_all()
    assert [e["id"] for e in exported] == ["k", "p"]  # v23: most recently active first
    # Deleted, then imported back children first: ids kept, and new appends continue after them.
    pg.delete_session("k")
    pg.delete_session("p")
    assert pg.session_count() == 0
    imported, skipped = pg.import_records(list(reversed(exported)))
    assert (imported, skipped) == (2, 0)
    assert pg.import_records(exported) == (0, 2)
    again = pg.export_all()
    for before, after in zip(exported, again, strict=True):
        assert before["messages"] == after["messages"]
        assert before["system_prompt"] == after["system_prompt"]
        assert before["parent_session_id"] == after["parent_session_id"]
    max_id = max(m["id"] for e in again for m in e["messages"])
    assert pg.append_message("p", "user", "next") > max_id


def test_delete_and_prune(pg: SessionDB, tmp_path: Path) -> None:
    import time

    for sid in ("old", "older", "kept", "child"):
        pg.create_session(sid, "cli", parent_session_id="old" if sid == "child" else None)
        pg.append_message(sid, "user", sid)
    past = time.time() - 200 * 86_400
    set_times(pg, "old", started_at=past, ended_at=past + 1, end_reason="done", messages_at=past)
    set_times(pg, "older", started_at=past - 1, ended_at=past, end_reason="done", messages_at=past - 1)
    (tmp_path / "older.json").write_text("{}")
    assert [c["id"] for c in pg.prune_candidates(90)] == ["older", "old"]
    assert pg.prune_sessions(90, sessions_dir=tmp_path) == 2
    assert not (tmp_path / "older.json").exists()
    assert pg.get_session("child")["parent_session_id"] is None
    assert pg.message_count() == 2
    assert pg.delete_session("kept") and not pg.delete_session("kept")
    assert pg.message_count() == 1 and pg.session_count() == 1
    pg.set_meta("k", 1)
    assert pg.get_meta("k") == "1"
    pg.vacuum()  # VACUUM ANALYZE, outside a transaction
    result = pg.maybe_auto_prune_and_vacuum()
    assert "error" not in result


# ---------------------------------------------------------------------- concurrency


def _raise_sqlstate(conn, state: str) -> None:  # type: ignore[no-untyped-def]
    conn.execute(text(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{state}'; END $$"))


@pytest.mark.parametrize("state", ["40001", "40P01"])
def test_serialization_failures_and_deadlocks_are_retried(pg: SessionDB, state: str) -> None:
    pg.create_session("s", "cli")
    attempts = []

    def work(conn):  # type: ignore[no-untyped-def]
        attempts.append(1)
        conn.execute(text("UPDATE sessions SET message_count = message_count + 1 WHERE id = 's'"))
        if len(attempts) < 3:
            _raise_sqlstate(conn, state)  # a real server error with this SQLSTATE
        return "done"

    assert pg._write(work) == "done"
    assert len(attempts) == 3
    assert pg.get_session("s")["message_count"] == 1  # the failed attempts rolled back


def test_other_server_errors_are_not_retried(pg: SessionDB) -> None:
    attempts = []

    def work(conn):  # type: ignore[no-untyped-def]
        attempts.append(1)
        _raise_sqlstate(conn, "22012")

    with pytest.raises(Exception, match="injected"):
        pg._write(work)
    assert len(attempts) == 1


def test_retry_budget_ends_with_database_locked(pg: SessionDB) -> None:
    def work(conn):  # type: ignore[no-untyped-def]
        _raise_sqlstate(conn, "40001")

    with pytest.raises(errors.DatabaseLockedError) as info:
        pg._write(work, budget=0.3)
    assert "injected" in str(info.value.__cause__) and "stayed locked" in str(info.value)


WRITER = """
import sys
from hermes_store import SessionDB
url, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
db = SessionDB(url)
db.ensure_session("own-" + me, "cli")
for i in range(n):
    db.append_message("shared", "user", f"{me}-{i}", tool_calls=[{"id": i}] if i % 3 == 0 else None)
    db.append_message("own-" + me, "user", f"{i}")
    if i % 50 == 0:
        db.update_token_counts("shared", input_tokens=1)
db.close()
"""


def test_eight_processes_append_to_one_database(pg: SessionDB, pg_database: str) -> None:
    procs, per = 8, 300
    pg.create_session("shared", "cli")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    running = [
        subprocess.Popen([sys.executable, "-c", WRITER, pg_database, str(k), str(per)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in range(procs)
    ]
    for p in running:
        _out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err  # no error reached a caller
    shared = pg.get_session("shared")
    assert pg.message_count("shared") == procs * per == shared["message_count"]
    assert shared["tool_call_count"] == procs * len(range(0, per, 3))
    assert shared["input_tokens"] == procs * len(range(0, per, 50))
    contents = {m["content"] for m in pg.get_messages("shared")}
    assert contents == {f"{k}-{i}" for k in range(procs) for i in range(per)}
    for k in range(procs):
        assert pg.get_session(f"own-{k}")["message_count"] == per == pg.message_count(f"own-{k}")
