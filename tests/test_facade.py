"""SessionDB's open path, write contention handling and Hermes helper surface."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

import hermes_store.facade as facade
from hermes_store import (
    DatabaseLockedError,
    NotADatabaseError,
    SessionDB,
    apply_wal_with_fallback,
    format_session_db_unavailable,
    get_last_init_error,
)


def test_default_path_under_hermes_home_created_0600(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hh"))
    db = SessionDB()
    try:
        path = tmp_path / "hh" / "state.db"
        assert db.db_path == path and path.is_file()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert db.journal_mode == "wal"
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 30  # Hermes v30 (head)
        conn.close()
        with db.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert 0 < c.exec_driver_sql("PRAGMA busy_timeout").scalar() <= 1000
    finally:
        db.close()


def test_default_path_without_hermes_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HERMES_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with SessionDB() as db:
        assert db.db_path == tmp_path / ".hermes" / "state.db"


class FakeConn:
    def __init__(self, error: str | None, mode: str = "wal") -> None:
        self.error, self.mode, self.executed = error, mode, []

    def execute(self, sql: str):
        self.executed.append(sql)
        if "WAL" in sql and self.error:
            raise sqlite3.OperationalError(self.error)
        mode = self.mode if "WAL" in sql else "delete"
        return type("R", (), {"fetchone": lambda _self: (mode,)})()


@pytest.mark.parametrize("cause", ["locking protocol", "not authorized", "disk I/O error"])
def test_wal_fallback_warns_once_per_label(cause: str, caplog) -> None:
    facade._wal_warned.clear()
    with caplog.at_level(logging.WARNING, logger="hermes_store.facade"):
        assert apply_wal_with_fallback(FakeConn(cause), db_label="nfs.db") == "delete"
        assert apply_wal_with_fallback(FakeConn(cause), db_label="nfs.db") == "delete"
        assert apply_wal_with_fallback(FakeConn(cause), db_label="other.db") == "delete"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "nfs.db" in warnings[0].getMessage()


def test_wal_other_errors_raise_and_success_returns_wal() -> None:
    with pytest.raises(sqlite3.OperationalError, match="unrelated"):
        apply_wal_with_fallback(FakeConn("something unrelated"))
    assert apply_wal_with_fallback(FakeConn(None)) == "wal"


def test_init_error_is_remembered_and_formatted(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.db"
    bad.write_text("not sqlite at all " * 100)
    before = bad.read_bytes()
    with pytest.raises(NotADatabaseError):
        SessionDB(bad)
    assert bad.read_bytes() == before
    err = get_last_init_error()
    assert err is not None and err.startswith("NotADatabaseError: ")
    assert format_session_db_unavailable().startswith("Session database not available: NotADatabaseError")
    with SessionDB(tmp_path / "fine.db"):
        pass
    assert get_last_init_error() == err  # not cleared by a later success
    facade._last_init_error = "OperationalError: locking protocol"
    msg = format_session_db_unavailable("DB down")
    assert msg.startswith("DB down") and "NFS/SMB" in msg and "WAL" in msg


def test_helpers_exposed_like_hermes(db: SessionDB) -> None:
    assert SessionDB._sanitize_fts5_query("hello AND") == "hello"
    assert SessionDB._contains_cjk("abc数") is True and SessionDB._contains_cjk("abc") is False
    assert SessionDB.sanitize_title("  a\u200bb  ") == "ab"

    def inside(conn: sqlite3.Connection) -> bool:
        assert isinstance(conn, sqlite3.Connection)
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('raw', 'yes')")
        return conn.in_transaction

    assert db._execute_write(inside) is True
    assert db.get_meta("raw") == "yes"


def test_write_waits_for_lock_then_succeeds(db: SessionDB, monkeypatch) -> None:
    """The write meets the lock, backs off, and lands once the other writer commits.

    The blocker is released from inside the retry's sleep, so the order is certain
    without measuring time (how long the wait takes is bench/ territory).
    """
    db.create_session("s", "cli")
    blocker = sqlite3.connect(db.db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    blocker.execute("INSERT INTO state_meta (key, value) VALUES ('blocker', 'first')")
    sleeps: list[float] = []

    def release_on_first_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if blocker.in_transaction:
            assert db.message_count("s") == 0  # nothing written while locked out
            blocker.execute("COMMIT")

    monkeypatch.setattr(facade.time, "sleep", release_on_first_sleep)
    try:
        db.append_message("s", "user", "patient")
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
    assert len(sleeps) == 1 and 0 < sleeps[0] <= facade.EARLY_JITTER_S[1]  # one back-off, then success
    assert db.message_count("s") == 1
    assert db.get_meta("blocker") == "first"  # the other writer's commit is kept too


def test_locked_past_budget_raises_typed_error_and_loses_nothing(db: SessionDB, monkeypatch) -> None:
    db.create_session("s", "cli")
    sleeps: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(facade, "WRITE_BUDGET_S", 0.8)
    monkeypatch.setattr(facade.time, "sleep", lambda s: (sleeps.append(s), real_sleep(s)))
    blocker = sqlite3.connect(db.db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(DatabaseLockedError, match="locked") as info:
            db._write(lambda c: c.exec_driver_sql("UPDATE sessions SET title = 'x'"), budget=facade.WRITE_BUDGET_S)
        assert "locked" in str(info.value.__cause__).lower()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert sleeps and all(0.0 <= s <= 0.150 for s in sleeps)  # early phase: 20-150 ms jitter
    assert len({round(s, 6) for s in sleeps}) > 1 or len(sleeps) == 1  # random, not lockstep
    assert db.get_session("s")["title"] is None


def test_jitter_switches_to_long_window_after_early_phase(db: SessionDB, monkeypatch) -> None:
    assert facade.EARLY_JITTER_S == (0.020, 0.150) and facade.LATE_JITTER_S == (0.250, 1.0)
    assert facade.WRITE_BUDGET_S == 20.0 and facade.TRANSCRIPT_BUDGET_S == 60.0
    windows: list[tuple[float, float]] = []
    monkeypatch.setattr(facade, "EARLY_PHASE_S", 0.15)
    monkeypatch.setattr(facade.random, "uniform", lambda a, b: (windows.append((a, b)), a)[1])
    blocker = sqlite3.connect(db.db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(DatabaseLockedError):
            db._write(lambda c: c.exec_driver_sql("SELECT 1"), budget=0.9)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert windows[0] == facade.EARLY_JITTER_S
    assert facade.LATE_JITTER_S in windows
    assert windows.index(facade.LATE_JITTER_S) > 0


def test_passive_checkpoint_every_50_writes(db: SessionDB, monkeypatch) -> None:
    from hermes_store.dialects import sqlite as sqlite_dialect

    seen: list[str] = []
    real = sqlite_dialect._outside_transaction
    monkeypatch.setattr(sqlite_dialect, "_outside_transaction", lambda engine, sql: (seen.append(sql), real(engine, sql)))
    db.create_session("s", "cli")
    for i in range(99):
        db.append_message("s", "user", f"m{i}")
    assert seen == ["PRAGMA wal_checkpoint(PASSIVE)"] * 2
    db.close()
    assert seen == ["PRAGMA wal_checkpoint(PASSIVE)"] * 3


def _writer(path: str, worker: int, n: int, errors_out) -> None:  # runs in a child process
    try:
        store = SessionDB(path)
        own = f"worker{worker}"
        store.create_session(own, "cli")
        store.create_session("shared", "cli")
        for i in range(n):
            target = own if i % 2 == 0 else "shared"
            store.append_message(target, "user", f"w{worker} message {i} zebra")
            if i % 50 == 0:
                store.update_token_counts(own, input_tokens=1, api_call_count=1)
        store.close()
    except Exception as exc:  # reported to the parent, which fails the test
        errors_out.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.slow
def test_eight_processes_append_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    SessionDB(path).close()
    ctx = multiprocessing.get_context("spawn")
    errors_q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(path), w, 300, errors_q)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert all(p.exitcode == 0 for p in procs)
    assert errors_q.empty(), errors_q.get()
    with SessionDB(path) as db:
        assert db.message_count() == 2400
        for w in range(8):
            row = db.get_session(f"worker{w}")
            assert row["message_count"] == 150 == db.message_count(f"worker{w}")
            assert row["input_tokens"] == 6
        assert db.get_session("shared")["message_count"] == 1200 == db.message_count("shared")
        assert db.check_fts() == {"messages_fts": None, "messages_fts_trigram": None}
        assert len(db.search_messages("zebra", limit=5000)) == 2400


def test_many_threads_share_one_sessiondb(tmp_path: Path) -> None:
    """More threads than the pool's default size; kept connections are shared safely."""
    db = SessionDB(tmp_path / "threads.db")
    db.create_session("s", "cli")
    failures: list[str] = []

    def work(i: int) -> None:
        try:
            for j in range(25):
                db.append_message("s", "user", f"thread{i} message{j}")
                assert db.get_session("s") is not None
        except Exception as exc:  # reported below; a thread's exception would be lost
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failures == []
    assert db.message_count("s") == 500 == db.get_session("s")["message_count"]
    db.close()
    fds = [os.path.realpath(f"/proc/self/fd/{f}") for f in os.listdir("/proc/self/fd")]
    assert not [f for f in fds if f.startswith(str(tmp_path / "threads.db"))]  # nothing left open
