"""SessionDB's open path, write contention handling and Hermes helper surface.

Tests that take ``db`` or ``backend`` run on a SQLite file and on a PostgreSQL
database (``both_backends``). What is about the SQLite file itself (the default path
under HERMES_HOME, file modes, WAL and its fallback, PRAGMAs, the multi-process
file test) stays SQLite-only; its PostgreSQL counterparts are the ``test_pg_*``
tests below (they take ``pg_database``/``pg_url`` and skip without a server).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sqlite3
import stat
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

import hermes_store.facade as facade
from hermes_store import (
    DatabaseLockedError,
    DatabaseUnavailableError,
    InvalidInputError,
    NotADatabaseError,
    SessionDB,
    apply_wal_with_fallback,
    format_session_db_unavailable,
    get_last_init_error,
)

pytestmark = pytest.mark.both_backends

#: How long a test waits for another thread or the server to reach a state (not a
#: timing assertion: only a guard so a broken case fails instead of hanging).
PATIENCE_S = 60.0


# ---------------------------------------------------------------------- helpers


class WriteLock:
    """Another client holding every write out, as a second process would.

    SQLite: a ``BEGIN IMMEDIATE`` on the file. PostgreSQL: a transaction holding
    ``EXCLUSIVE`` locks on the tables writes touch (reads still pass, as in WAL).
    """

    def __init__(self, db: SessionDB, backend: str) -> None:
        self.db, self.backend = db, backend
        if backend == "sqlite":
            self.conn: Any = sqlite3.connect(db.db_path, isolation_level=None)
            self.engine = None
        else:
            self.engine = sa_create_engine(db.url)
            self.conn = self.engine.connect()
        self.held = False

    def hold(self) -> WriteLock:
        if self.backend == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            self.conn.begin()
            # Should the write under test hang (a regression), the server ends this
            # holder after a while: the test then fails instead of blocking forever.
            self.conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = '{int(PATIENCE_S)}s'")
            self.conn.exec_driver_sql("LOCK TABLE sessions, messages, state_meta IN EXCLUSIVE MODE")
        self.held = True
        return self

    def write_meta(self, key: str, value: str) -> None:
        sql = f"INSERT INTO state_meta (key, value) VALUES ('{key}', '{value}')"
        (self.conn.execute if self.backend == "sqlite" else self.conn.exec_driver_sql)(sql)

    def release(self, commit: bool = True) -> None:
        if not self.held:
            return
        self.held = False
        if self.backend == "sqlite":
            self.conn.execute("COMMIT" if commit else "ROLLBACK")
        else:
            (self.conn.commit if commit else self.conn.rollback)()

    def close(self) -> None:
        self.release(commit=False)
        self.conn.close()
        if self.engine is not None:
            self.engine.dispose()


@contextmanager
def write_lock(db: SessionDB, backend: str) -> Iterator[WriteLock]:
    lock = WriteLock(db, backend).hold()
    try:
        yield lock
    finally:
        lock.close()


def wait_for_lock_wait(url: Any) -> None:
    """Until some backend of this PostgreSQL database waits for a lock."""
    probe = sa_create_engine(url)
    try:
        with probe.connect() as conn:
            deadline = time.monotonic() + PATIENCE_S
            while not conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )).scalar():
                conn.rollback()  # a fresh snapshot of pg_stat_activity each time
                assert time.monotonic() < deadline, "the write never waited for the lock"
                threading.Event().wait(0.01)
    finally:
        probe.dispose()


def pg_backends(url: Any) -> int:
    """Connections other than the probe's own open on this PostgreSQL database."""
    probe = sa_create_engine(url)
    try:
        with probe.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )).scalar())
    finally:
        probe.dispose()


def raise_sqlstate(conn: Any, state: str) -> None:
    """A real server error with this SQLSTATE (serialization failure, deadlock...)."""
    conn.execute(text(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{state}'; END $$"))


# ---------------------------------------------------------------------- opening (SQLite file)


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
    # ~/.hermes is the real Hermes state: under pytest the live-system guard refuses it ...
    with pytest.raises(RuntimeError, match="live-system guard"):
        SessionDB()
    assert not (tmp_path / ".hermes" / "state.db").exists()
    # ... unless the test says it means it.
    monkeypatch.setenv("HERMES_STATE_DB_GUARD_BYPASS", "1")
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


@pytest.fixture
def fixed_sqlite(monkeypatch) -> None:
    """Hermes v26's rules for a SQLite without the WAL-reset bug (tests/compat/test_v26_journal.py
    covers the vulnerable branch, which this machine's 3.40.1 takes by default)."""
    monkeypatch.setattr(facade, "is_sqlite_wal_reset_vulnerable", lambda *a: False)


@pytest.mark.parametrize("cause", ["locking protocol", "not authorized", "disk I/O error"])  # v26: disk I/O is back
def test_wal_fallback_warns_once_per_label(cause: str, caplog, fixed_sqlite) -> None:
    facade._wal_warned.clear()
    with caplog.at_level(logging.WARNING, logger="hermes_store.facade"):
        assert apply_wal_with_fallback(FakeConn(cause), db_label="nfs.db") == "delete"
        assert apply_wal_with_fallback(FakeConn(cause), db_label="nfs.db") == "delete"
        assert apply_wal_with_fallback(FakeConn(cause), db_label="other.db") == "delete"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "nfs.db" in warnings[0].getMessage()


def test_wal_other_errors_raise_and_success_returns_wal(fixed_sqlite) -> None:
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


# ---------------------------------------------------------------------- opening (server)


def test_pg_unreachable_database_is_a_typed_init_error(pg_url: str, tmp_path: Path) -> None:
    """No such database, no such role: one typed error, remembered, password never shown."""
    base = make_url(pg_url).set(password="s3cret-pw")
    for url in (base.set(database="hs_no_such_database"), base.set(username="hs_no_such_role")):
        with pytest.raises(DatabaseUnavailableError) as info:
            SessionDB(url)
        assert info.value.__cause__ is not None  # the driver's error stays attached
        err = get_last_init_error()
        assert err is not None and err.startswith("DatabaseUnavailableError: ")
        assert "s3cret-pw" not in err and "s3cret-pw" not in str(info.value)
        assert format_session_db_unavailable().startswith("Session database not available: DatabaseUnavailableError")
    assert list(tmp_path.iterdir()) == []  # a server URL never becomes a file or folder


@pytest.mark.pg_direct
def test_pg_dropped_connections_are_replaced_not_reported(pg_database: str) -> None:
    """A server restart or idle timeout ends the kept connections: the next calls
    reconnect instead of failing (a write that never reached the server is sent again)."""
    with SessionDB(pg_database) as db:
        db.create_session("s", "cli")
        assert db.get_session("s")["source"] == "cli"  # one kept reader, one kept writer
        admin = sa_create_engine(pg_database)
        try:
            with admin.connect() as conn:
                killed = conn.execute(text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )).scalar()
        finally:
            admin.dispose()
        assert killed >= 2
        assert db.get_session("s")["message_count"] == 0
        assert db.append_message("s", "user", "after the restart") > 0
        assert [m["content"] for m in db.get_messages("s")] == ["after the restart"]
        assert db.get_session("s")["message_count"] == 1  # written once, not twice


# ---------------------------------------------------------------------- Hermes' surface


def test_helpers_exposed_like_hermes(db: SessionDB, backend: str) -> None:
    assert SessionDB._sanitize_fts5_query("hello AND") == "hello"
    assert SessionDB._contains_cjk("abc数") is True and SessionDB._contains_cjk("abc") is False
    assert SessionDB.sanitize_title("  a\u200bb  ") == "ab"

    def in_transaction(conn: Any) -> bool:
        if backend == "sqlite":
            assert isinstance(conn, sqlite3.Connection)
            return conn.in_transaction
        import psycopg

        assert isinstance(conn, psycopg.Connection)
        return conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS

    def inside(conn: Any) -> bool:
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('raw', 'yes')")
        return in_transaction(conn)

    assert db._execute_write(inside) is True
    assert db.get_meta("raw") == "yes"

    def fails_half_way(conn: Any) -> None:
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('half', 'way')")
        raise RuntimeError("caller's own failure")

    with pytest.raises(RuntimeError, match="own failure"):
        db._execute_write(fails_half_way)
    assert db.get_meta("half") is None  # the whole transaction rolled back
    db.set_meta("after", "fine")  # and the store is still usable
    assert db.get_meta("after") == "fine"


def test_close_is_idempotent_and_a_closed_store_says_so(db: SessionDB, backend: str) -> None:
    with SessionDB(db.url) as same:  # a second store on the same database, as a context manager
        same.create_session("s", "cli")
        assert db.get_session("s")["source"] == "cli"
    for call in (lambda: same.get_session("s"), lambda: same.create_session("t", "cli"),
                 lambda: same.export_all(), lambda: same.vacuum()):
        with pytest.raises(DatabaseUnavailableError, match="closed"):
            call()
    same.close()  # again: nothing happens
    assert same.engine is None
    assert db.session_count() == 1  # the other store is untouched


def test_sessiondb_on_a_host_engine(db: SessionDB, backend: str) -> None:
    """Given an Engine, SessionDB opens the same database with its own engine and never
    disposes the host's."""
    db.create_session("from_db", "cli")
    host = sa_create_engine(db.url)
    try:
        for store in (SessionDB(engine=host), SessionDB(host)):
            with store:
                assert store.engine is not host
                assert store.url.get_backend_name() == backend
                assert store.get_session("from_db")["source"] == "cli"
                store.create_session(f"via_{id(store)}", "api")
        with host.connect() as conn:  # still usable after both stores closed
            assert conn.execute(text("SELECT count(*) FROM sessions")).scalar() == 3
        assert db.session_count("api") == 2
        with pytest.raises(InvalidInputError, match="one of"):
            SessionDB(engine=host, url=db.url)
    finally:
        host.dispose()


# ---------------------------------------------------------------------- write contention


@pytest.mark.pg_direct
def test_write_waits_for_the_lock_then_lands(db: SessionDB, backend: str, monkeypatch) -> None:
    """A write meets another writer's lock, waits, and lands once that writer commits.

    SQLite: BEGIN IMMEDIATE fails fast and the facade backs off with jitter.
    PostgreSQL: the server queues the write behind the lock (no back-off needed).
    The lock is released only once the write is seen waiting, so the order is certain.
    """
    db.create_session("s", "cli")
    backed_off = threading.Event()
    sleeps: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        backed_off.set()
        real_sleep(seconds)

    monkeypatch.setattr(facade.time, "sleep", sleep)
    outcome: list[Any] = []
    with write_lock(db, backend) as lock:
        lock.write_meta("blocker", "first")
        worker = threading.Thread(target=lambda: outcome.append(db.append_message("s", "user", "patient")))
        worker.start()
        if backend == "sqlite":
            assert backed_off.wait(PATIENCE_S)
        else:
            wait_for_lock_wait(db.url)
        assert db.message_count("s") == 0  # nothing written while locked out
        lock.release()
        worker.join(PATIENCE_S)
    assert len(outcome) == 1 and isinstance(outcome[0], int)
    assert db.message_count("s") == 1 == db.get_session("s")["message_count"]
    assert db.get_meta("blocker") == "first"  # the other writer's commit is kept too
    if backend == "sqlite":
        assert sleeps and facade.EARLY_JITTER_S[0] <= sleeps[0] <= facade.EARLY_JITTER_S[1]  # a short back-off
    else:
        assert sleeps == []  # the server queued the write; no back-off


def test_locked_past_budget_raises_typed_error_and_loses_nothing(db: SessionDB, backend: str, monkeypatch) -> None:
    db.create_session("s", "cli")
    sleeps: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(facade, "WRITE_BUDGET_S", 0.8)  # read at call time
    monkeypatch.setattr(facade.time, "sleep", lambda s: (sleeps.append(s), real_sleep(s)))
    with write_lock(db, backend):
        with pytest.raises(DatabaseLockedError, match="locked") as info:
            db.set_session_title("s", "x")
        assert db.get_session_title("s") is None  # reads still pass
    cause = info.value.__cause__
    if backend == "sqlite":
        assert "locked" in str(cause).lower()
        assert sleeps and all(0.0 <= s <= 0.150 for s in sleeps)  # early phase: 20-150 ms jitter
        assert len({round(s, 6) for s in sleeps}) > 1 or len(sleeps) == 1  # random, not lockstep
    else:
        # The server's lock wait itself was bounded by the budget (lock_not_available).
        assert getattr(getattr(cause, "orig", cause), "sqlstate", None) == "55P03"
    assert db.get_session("s")["title"] is None
    assert db.set_session_title("s", "x") is True  # free again once the other writer is gone


class VirtualClock:
    """Stands in for the facade's ``time`` module: a sleep moves a virtual clock at once.

    The retry schedule then depends only on the sleeps chosen, never on how long a
    busy machine took for each attempt.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_jitter_switches_to_long_window_after_early_phase(db: SessionDB, backend: str, monkeypatch) -> None:
    """A lock (SQLite) or a serialization failure (PostgreSQL) on every attempt."""
    assert facade.EARLY_JITTER_S == (0.020, 0.150) and facade.LATE_JITTER_S == (0.250, 1.0)
    assert facade.WRITE_BUDGET_S == 20.0 and facade.TRANSCRIPT_BUDGET_S == 60.0
    windows: list[tuple[float, float]] = []
    attempts: list[int] = []
    clock = VirtualClock()
    monkeypatch.setattr(facade, "time", clock)
    monkeypatch.setattr(facade, "EARLY_PHASE_S", 0.15)
    monkeypatch.setattr(facade.random, "uniform", lambda a, b: (windows.append((a, b)), a)[1])

    def work(conn: Any) -> None:
        attempts.append(1)
        if backend == "sqlite":
            conn.exec_driver_sql("SELECT 1")  # never reached: BEGIN IMMEDIATE is refused
        else:
            raise_sqlstate(conn, "40001")

    with write_lock(db, backend) if backend == "sqlite" else nullcontext():
        with pytest.raises(DatabaseLockedError):
            db._write(work, budget=0.9)
    # Shortest sleeps (the low end of each window): 0.02 s until 0.15 s have passed,
    # then 0.25 s, the last one cut to what is left of the budget.
    early, late = facade.EARLY_JITTER_S, facade.LATE_JITTER_S
    assert windows == [early] * 8 + [late] * 3
    assert clock.sleeps[:8] == [0.02] * 8 and clock.sleeps[8:10] == [0.25, 0.25]
    assert sum(clock.sleeps) == pytest.approx(0.9)
    assert len(attempts) == (0 if backend == "sqlite" else len(windows) + 1)


@pytest.mark.pg_direct
def test_pg_real_deadlock_is_retried_and_both_writes_land(pg_database: str) -> None:
    """Two transactions lock two rows in opposite order; the server aborts one (40P01).
    When that is the facade's, it retries and lands after the other commits."""
    attempts: list[int] = []
    outcome: list[Any] = []
    with SessionDB(pg_database) as db:
        db.create_session("a", "cli")
        db.create_session("b", "cli")
        other = sa_create_engine(pg_database)
        try:
            with other.connect() as blocker:
                blocker.begin()
                try:  # make the facade, which waits first, the one the server picks
                    blocker.exec_driver_sql("SET LOCAL deadlock_timeout = '60s'")
                except Exception:  # not a superuser: the default order picks it anyway
                    blocker.rollback()
                    blocker.begin()
                blocker.execute(text("UPDATE sessions SET title = 'blocker' WHERE id = 'a'"))

                def work(conn: Any) -> int:
                    attempts.append(1)
                    conn.execute(text("UPDATE sessions SET api_call_count = api_call_count + 1 WHERE id = 'b'"))
                    conn.execute(text("UPDATE sessions SET input_tokens = input_tokens + 1 WHERE id = 'a'"))
                    return len(attempts)

                worker = threading.Thread(target=lambda: outcome.append(db._write(work)))
                worker.start()
                wait_for_lock_wait(pg_database)
                # Closes the cycle; returns once the server has aborted the facade's attempt.
                blocker.execute(text("UPDATE sessions SET title_source = 'blocker' WHERE id = 'b'"))
                blocker.commit()
            worker.join(PATIENCE_S)
        finally:
            other.dispose()
        # At least one retry; another is possible if the retry takes row b again before
        # the other transaction, woken by the abort, got it (a second deadlock, same fix).
        assert len(attempts) >= 2 and outcome == [len(attempts)]
        a, b = db.get_session("a"), db.get_session("b")
        assert (a["title"], a["input_tokens"]) == ("blocker", 1)
        assert (b["title_source"], b["api_call_count"]) == ("blocker", 1)


def test_checkpoint_every_50_writes_and_on_close(db: SessionDB, backend: str, monkeypatch) -> None:
    """The dialect's checkpoint runs every 50 writes and on close: a PASSIVE WAL
    checkpoint on SQLite; on a server (which checkpoints itself) nothing is sent."""
    from hermes_store.dialects import sqlite as sqlite_dialect

    calls: list[str] = []
    dialect_cls = type(db._dialect)
    real_checkpoint = dialect_cls.checkpoint
    monkeypatch.setattr(dialect_cls, "checkpoint", lambda self, engine: (calls.append("cp"), real_checkpoint(self, engine))[1])
    sent: list[str] = []
    real_outside = sqlite_dialect._outside_transaction
    monkeypatch.setattr(sqlite_dialect, "_outside_transaction", lambda engine, sql: (sent.append(sql), real_outside(engine, sql))[1])
    statements: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    db.create_session("s", "cli")
    for i in range(99):
        db.append_message("s", "user", f"m{i}")
        if i == 48:  # the 50th write: its checkpoint runs on the upkeep thread, off the caller's path
            assert db.wait_for_upkeep(30)
            assert calls == ["cp"]
    assert db.wait_for_upkeep(30)
    assert calls == ["cp"] * 2
    db.close()
    assert calls == ["cp"] * 3
    if backend == "sqlite":
        assert sent == ["PRAGMA wal_checkpoint(PASSIVE)"] * 3
    else:
        assert sent == []
        assert statements and not any("PRAGMA" in s.upper() or "CHECKPOINT" in s.upper() for s in statements)


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
    """One SQLite file, eight processes (PostgreSQL: test_pg_backend's eight-process test)."""
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


@pytest.mark.pg_direct
def test_many_threads_share_one_sessiondb(db: SessionDB, backend: str) -> None:
    """More threads than the pool's default size; kept connections are shared safely,
    and close() leaves nothing open (file handles, or server connections)."""
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
    contents = {m["content"] for m in db.get_messages("s")}
    assert contents == {f"thread{i} message{j}" for i in range(20) for j in range(25)}
    db.close()
    if backend == "sqlite":
        fds = [os.path.realpath(f"/proc/self/fd/{f}") for f in os.listdir("/proc/self/fd")]
        assert not [f for f in fds if f.startswith(str(db.db_path))]  # nothing left open
    else:
        deadline = time.monotonic() + PATIENCE_S  # a backend exits just after its client leaves
        while pg_backends(db.url):
            assert time.monotonic() < deadline, "server connections left open after close()"
            threading.Event().wait(0.05)
