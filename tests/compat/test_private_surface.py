"""The internals Hermes' own code uses: ``_conn``, ``_lock``, ``_execute_write``, patched
``sqlite3.connect`` / ``time`` / ``DEFAULT_DB_PATH``, ``read_only`` and the self-repair."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
import types
from pathlib import Path

import pytest

from hermes_store import errors
from .helpers import break_schema


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def sdb(hermes_state, tmp_path: Path):
    store = hermes_state.SessionDB(tmp_path / "state.db")
    yield store
    store.close()


# ----------------------------------------------------------------------------- _conn

def test_conn_is_a_sqlite3_connection_with_rows_by_name(sdb) -> None:
    sdb.create_session("s1", "cli", model="m")
    sdb.append_message("s1", "user", "hello")
    conn = sdb._conn
    assert isinstance(conn, sqlite3.Connection) and sdb._conn is conn
    row = conn.execute("SELECT id, role, content FROM messages WHERE session_id = ?", ("s1",)).fetchone()
    assert isinstance(row, sqlite3.Row) and row["role"] == "user" and dict(row)["content"] == "hello"
    cur = conn.cursor()
    cur.executemany("UPDATE sessions SET title = ? WHERE id = ?", [("t1", "s1")])
    conn.commit()  # autocommit: a no-op, as on Hermes' connection
    assert sdb.get_session("s1")["title"] == "t1"  # our reads see the raw write at once


def test_conn_raises_sqlite3_exception_types(sdb) -> None:
    with pytest.raises(sqlite3.OperationalError):
        sdb._conn.execute("SELECT nope FROM sessions")
    with pytest.raises(sqlite3.IntegrityError):  # foreign keys are on, as on Hermes' connection
        sdb._conn.execute("INSERT INTO messages (session_id, role, timestamp) VALUES ('ghost', 'user', 0)")
    assert sdb.message_count() == 0


def test_a_raw_transaction_held_by_another_thread_delays_our_write_but_never_fails_it(sdb) -> None:
    sdb.create_session("s1", "cli")
    holding = threading.Event()

    def hold() -> None:
        sdb._conn.execute("BEGIN IMMEDIATE")
        sdb._conn.execute("UPDATE sessions SET title = 'raw' WHERE id = 's1'")
        holding.set()
        time.sleep(0.6)
        sdb._conn.execute("COMMIT")

    t = threading.Thread(target=hold)
    t.start()
    assert holding.wait(5)
    started = time.monotonic()
    mid = sdb.append_message("s1", "user", "after the raw writer")  # waits, retries, succeeds
    waited = time.monotonic() - started
    t.join()
    assert mid > 0 and sdb.get_session("s1")["title"] == "raw"
    assert waited > 0.1  # it really was blocked (a floor, not a timing target)
    assert sdb.message_count("s1") == 1


def test_our_open_write_transaction_makes_a_raw_write_wait_not_fail(sdb) -> None:
    sdb.create_session("s1", "cli")
    inside = threading.Event()
    result: dict = {}

    def slow(conn):
        conn.execute("UPDATE sessions SET model = 'ours' WHERE id = 's1'")
        inside.set()
        time.sleep(0.5)
        return "done"

    t = threading.Thread(target=lambda: result.setdefault("r", sdb._execute_write(slow)))
    t.start()
    assert inside.wait(5)
    sdb._conn.execute("UPDATE sessions SET title = 'raw' WHERE id = 's1'")  # busy timeout waits for us
    t.join()
    row = sdb.get_session("s1")
    assert result["r"] == "done" and row["model"] == "ours" and row["title"] == "raw"


def test_conn_is_closed_with_the_store(hermes_state, tmp_path: Path) -> None:
    store = hermes_state.SessionDB(tmp_path / "state.db")
    conn = store._conn
    store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")


def test_conn_on_a_server_is_absent_for_getattr_probes(hermes_state, pg_database: str) -> None:
    store = hermes_state.SessionDB(pg_database)
    try:
        assert getattr(store, "_conn", None) is None  # Hermes' session_search_tool probe
        with pytest.raises(errors.UnsupportedDatabaseError):
            _ = store._conn
        store.create_session("s1", "cli")
        assert store._execute_write(lambda conn: ("kept", 1)) == ("kept", 1)
    finally:
        store.close()


# ----------------------------------------------------------------------------- _lock

def test_lock_is_a_reentrant_context_manager(sdb) -> None:
    sdb.create_session("s1", "cli")
    done = threading.Event()

    def use() -> None:
        with sdb._lock:
            sdb._conn.execute("SELECT 1").fetchone()
            sdb.get_session("s1")  # our own methods inside Hermes' lock must not deadlock
            sdb.append_message("s1", "user", "x")
        done.set()

    t = threading.Thread(target=use, daemon=True)
    t.start()
    assert done.wait(20), "deadlock under db._lock"
    assert sdb.message_count("s1") == 1


# ----------------------------------------------------------------------------- _execute_write

def test_execute_write_returns_the_result_unchanged_with_rows_by_name(sdb) -> None:
    sdb.create_session("s1", "cli")
    marker = object()

    def fn(conn):
        assert isinstance(conn, sqlite3.Connection) and conn.in_transaction  # inside BEGIN IMMEDIATE
        row = conn.execute("SELECT * FROM sessions WHERE id = ?", ("s1",)).fetchone()
        conn.execute("UPDATE sessions SET title = ? WHERE id = ?", ("T", row["id"]))
        return (marker, dict(row)["source"])

    result = sdb._execute_write(fn)
    assert result[0] is marker and result[1] == "cli"
    assert sdb.get_session_title("s1") == "T"
    assert sdb.get_session("s1")["title"] == "T"


def test_execute_write_rolls_everything_back_and_reraises(sdb) -> None:
    sdb.create_session("s1", "cli")

    class Boom(Exception):
        pass

    def fn(conn):
        conn.execute("UPDATE sessions SET title = 'half' WHERE id = 's1'")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s2', 'x', 0)")
        raise Boom("stop")

    with pytest.raises(Boom):
        sdb._execute_write(fn)
    assert sdb.get_session("s1")["title"] is None and sdb.get_session("s2") is None


def test_execute_write_retries_while_another_process_holds_the_lock(sdb, tmp_path: Path) -> None:
    sdb.create_session("s1", "cli")
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    calls = []
    timer = threading.Timer(0.5, lambda: other.execute("COMMIT"))
    timer.start()
    try:
        out = sdb._execute_write(lambda conn: calls.append(1) or conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])
    finally:
        timer.join()
        other.close()
    assert out == 1 and len(calls) >= 1


# ----------------------------------------------------------------------------- patched names

def test_connections_open_through_the_patched_sqlite3_connect(hermes_state, tmp_path: Path, monkeypatch) -> None:
    real = sqlite3.connect
    seen: list[str] = []

    def tracing(*args, **kwargs):
        seen.append(str(args[0]) if args else str(kwargs.get("database")))
        return real(*args, **kwargs)

    monkeypatch.setattr("hermes_state.sqlite3.connect", tracing)
    store = hermes_state.SessionDB(tmp_path / "state.db")
    try:
        store.create_session("s1", "cli")
        assert store._conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
    finally:
        store.close()
    assert seen and all("state.db" in s for s in seen)
    assert len(seen) >= 2  # our engine's connection(s) and the raw _conn


def test_timestamps_follow_a_patched_clock(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state.time, "time", lambda: 1_000_000.25)
    store = hermes_state.SessionDB(tmp_path / "a.db")
    try:
        store.create_session("s1", "cli")
        store.append_message("s1", "user", "x")
        store.end_session("s1", "done")
        row = store.get_session("s1")
        assert row["started_at"] == 1_000_000.25 and row["ended_at"] == 1_000_000.25
        assert store.get_messages("s1")[0]["timestamp"] == 1_000_000.25
    finally:
        store.close()


def test_timestamps_follow_a_replaced_time_module(hermes_state, tmp_path: Path, monkeypatch) -> None:
    fake = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    fake.time = lambda: 42.5
    store = hermes_state.SessionDB(tmp_path / "b.db")
    try:
        monkeypatch.setattr(hermes_state, "time", fake)
        store.create_session("s1", "cli")
        assert store.get_session("s1")["started_at"] == 42.5
    finally:
        monkeypatch.undo()
        store.close()


def test_default_db_path_patch_is_honoured(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HERMES_STORE_URL", raising=False)
    target = tmp_path / "patched" / "state.db"
    monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", target)
    with hermes_state.SessionDB() as store:
        assert store.db_path == target and target.is_file()


def test_unpatched_default_follows_hermes_home_at_call_time(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HERMES_STORE_URL", raising=False)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    with hermes_state.SessionDB() as store:
        assert store.db_path == tmp_path / "home" / "state.db"


def test_hermes_store_url_overrides_the_default(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HERMES_STORE_URL", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    with hermes_state.SessionDB() as store:
        assert store.db_path == tmp_path / "elsewhere.db"
    assert not (tmp_path / "home" / "state.db").exists()


def test_hermes_store_url_can_name_a_server(hermes_state, pg_database: str, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_STORE_URL", pg_database)
    with hermes_state.SessionDB() as store:
        assert store.db_path is None and store.url.get_backend_name() == "postgresql"
        store.create_session("s1", "cli")
        assert store.get_session("s1")["source"] == "cli"


# ----------------------------------------------------------------------------- read_only

def test_read_only_open_reads_and_never_writes(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path) as rw:
        rw.create_session("s1", "cli")
        rw.append_message("s1", "user", "hello there")
    before = _sha(path)
    ro = hermes_state.SessionDB(path, read_only=True)
    try:
        assert ro.read_only is True and ro.get_session("s1")["source"] == "cli"
        assert [m["content"] for m in ro.get_messages("s1")] == ["hello there"]
        with pytest.raises(sqlite3.OperationalError) as info:  # what Hermes' callers catch
            ro.create_session("s2", "cli")
        assert isinstance(info.value, errors.ReadOnlyDatabaseError)
        with pytest.raises(sqlite3.OperationalError):
            ro._conn.execute("DELETE FROM sessions")
        assert ro._conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
    finally:
        ro.close()
    assert _sha(path) == before
    # Only SQLite's own WAL sidecars may appear (a WAL file needs its -shm to be read).
    assert {p.name for p in tmp_path.iterdir()} <= {"state.db", "state.db-wal", "state.db-shm"}


def test_read_only_open_of_a_missing_file_creates_nothing(hermes_state, tmp_path: Path) -> None:
    with pytest.raises(errors.HermesStoreError):
        hermes_state.SessionDB(tmp_path / "nope" / "state.db", read_only=True)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- self-repair

def test_a_malformed_schema_is_repaired_once_and_the_rows_kept(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path) as store:
        store.create_session("s1", "cli")
        store.append_message("s1", "user", "keep me")
    break_schema(path)
    with pytest.raises(sqlite3.DatabaseError) as info:
        sqlite3.connect(path).execute("SELECT COUNT(*) FROM sessions").fetchone()
    assert hermes_state.is_malformed_db_error(info.value)
    assert hermes_state._db_opens_cleanly(path) is not None

    with hermes_state.SessionDB(path) as store:
        assert [m["content"] for m in store.get_messages("s1")] == ["keep me"]
        assert store.search_messages("keep")[0]["session_id"] == "s1"
    backups = list(tmp_path.glob("state.db.malformed-backup-*"))
    assert len([b for b in backups if not b.name.endswith(("-wal", "-shm"))]) == 1
    assert hermes_state._db_opens_cleanly(path) is None


def test_repair_reports_a_missing_file_and_a_healthy_one(hermes_state, tmp_path: Path) -> None:
    missing = hermes_state.repair_state_db_schema(tmp_path / "none.db")
    assert missing["repaired"] is False and "does not exist" in missing["error"]
    with hermes_state.SessionDB(tmp_path / "ok.db"):
        pass
    before = _sha(tmp_path / "ok.db")
    healthy = hermes_state.repair_state_db_schema(tmp_path / "ok.db")
    assert healthy == {"repaired": True, "strategy": "already_healthy", "backup_path": None, "error": None}
    assert _sha(tmp_path / "ok.db") == before
