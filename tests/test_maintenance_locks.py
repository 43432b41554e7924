"""Maintenance never escapes as a raw driver error (issue 29, point 3).

The fault is real: another PROCESS holds the write lock of the file (a plain sqlite3
connection in ``BEGIN IMMEDIATE`` / ``BEGIN EXCLUSIVE``), or keeps appending in long
transactions; on PostgreSQL another connection holds ``LOCK TABLE ... ACCESS EXCLUSIVE``
in an open transaction. ``vacuum()``, FTS upkeep and auto-prune then wait the lock out
within the write budget and, past it, raise (or report) ``DatabaseLockedError`` chained
from the driver's error, never the raw ``sqlite3.OperationalError``. Outcomes only:
no assertion is about how long anything took.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from hermes_store import SessionDB, errors, facade
from hermes_store.dialects.sqlite import DIALECT as SQLITE
from hermes_store.engine import create_engine, translate_driver_error
from hermes_store.operations import steps as steps_module

#: Holds the file's write lock until told to let go (a line on stdin) or for ``hold`` s.
HOLDER = r"""
import sqlite3, sys, time
path, mode, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
conn = sqlite3.connect(path, isolation_level=None, timeout=30)
conn.execute(f"BEGIN {mode}")
print("held", flush=True)
if hold < 0:
    sys.stdin.readline()
else:
    time.sleep(hold)
conn.execute("COMMIT")
conn.close()
print("released", flush=True)
"""

#: Appends in long write transactions with short gaps, printing each committed id.
APPENDER = r"""
import sqlite3, sys, time
path, rounds = sys.argv[1], int(sys.argv[2])
conn = sqlite3.connect(path, isolation_level=None, timeout=30)
for i in range(rounds):
    conn.execute("BEGIN IMMEDIATE")
    cur = conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) VALUES ('busy', 'user', ?, ?)",
        (f"appended word{i}x", time.time()))
    new_id = cur.lastrowid
    conn.execute("UPDATE sessions SET message_count = message_count + 1 WHERE id = 'busy'")
    time.sleep(0.3)
    conn.execute("COMMIT")
    print(new_id, flush=True)
    time.sleep(0.03)
conn.close()
"""


@contextmanager
def held_lock(path: Path, mode: str = "IMMEDIATE", hold: float = -1) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``path``'s write lock; ``hold`` < 0: until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode, str(hold)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.write("\n")
                proc.stdin.flush()
            except BrokenPipeError:
                pass
        proc.wait(timeout=60)


@pytest.fixture
def short_budget(monkeypatch: pytest.MonkeyPatch) -> float:
    """Every maintenance budget cut to half a second (read at call time)."""
    for name in ("WRITE_BUDGET_S", "TRANSCRIPT_BUDGET_S"):
        monkeypatch.setattr(facade, name, 0.5)
    monkeypatch.setattr(steps_module, "WRITE_BUDGET_S", 0.5)
    monkeypatch.setattr(steps_module, "LONG_BUDGET_S", 0.5)
    return 0.5


def _seed(db: SessionDB, sessions: int = 3, messages: int = 4) -> None:
    for s in range(sessions):
        db.create_session(f"s{s}", "cli")
        for m in range(messages):
            db.append_message(f"s{s}", "user", f"row {m} of s{s} uniqueword{s}x{m}")


def _contents(path: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        sessions = conn.execute("SELECT id, message_count FROM sessions ORDER BY id").fetchall()
        rows = conn.execute("SELECT id, session_id, content FROM messages ORDER BY id").fetchall()
        return sessions, rows
    finally:
        conn.close()


def _driver_cause(exc: BaseException) -> BaseException | None:
    seen: BaseException | None = exc.__cause__
    while seen is not None:
        if isinstance(seen, sqlite3.OperationalError) and not isinstance(seen, errors.HermesStoreError):
            return seen
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def _assert_typed_lock(exc: BaseException) -> None:
    assert type(exc) is errors.DatabaseLockedError, f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    assert isinstance(exc, errors.HermesStoreError)
    cause = _driver_cause(exc)
    assert cause is not None and "locked" in str(cause).lower()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionDB]:
    db = SessionDB(tmp_path / "state.db")
    _seed(db)
    yield db
    db.close()


# ---------------------------------------------------------------- the error table


def test_the_table_types_busy_and_locked_outside_a_transaction(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as busy:
        other.execute("VACUUM")
    conn.execute("ROLLBACK")
    other.close()
    conn.close()
    assert busy.value.sqlite_errorcode & 0xFF == 5  # SQLITE_BUSY
    typed = translate_driver_error(busy.value, locks=True)
    assert type(typed) is errors.DatabaseLockedError
    assert translate_driver_error(busy.value) is None  # inside a write's retry loop: kept as it is
    # By message, for an error that carries no result code.
    assert type(SQLITE.translate_error(sqlite3.OperationalError("database table is locked"), locks=True)) \
        is errors.DatabaseLockedError
    # Every retry loop still retries the typed lock.
    assert SQLITE.is_retryable(typed)


# ---------------------------------------------------------------- vacuum()


@pytest.mark.parametrize("mode", ["IMMEDIATE", "EXCLUSIVE"])
def test_vacuum_behind_a_held_lock_is_a_typed_error_and_loses_nothing(
    store: SessionDB, short_budget: float, mode: str
) -> None:
    path = store.db_path
    assert path is not None
    before = _contents(path)
    with held_lock(path, mode):
        with pytest.raises(Exception) as info:
            store.vacuum()
        _assert_typed_lock(info.value)
    assert _contents(path) == before
    assert store.vacuum() == 2  # the lock gone, the same store vacuums (both indexes optimized)
    assert store.search_messages("uniqueword1x2")


def _lock_after_optimize(store: SessionDB, monkeypatch: pytest.MonkeyPatch, hold: float = -1) -> list[Any]:
    """vacuum() optimizes first (a write, which waits locks out by itself); Hermes' tests
    patch that step on the instance, and so do these: the other process takes the lock
    right after it, so it meets the VACUUM. Returns the holders to let go."""
    holders: list[Any] = []

    def optimize_then_lock() -> int:
        holders.append(held_lock(store.db_path, hold=hold))  # type: ignore[arg-type]
        holders[-1].__enter__()
        return 0

    monkeypatch.setattr(store, "optimize_fts", optimize_then_lock)
    return holders


def _let_go(holders: list[Any]) -> None:
    for holder in holders:
        holder.__exit__(None, None, None)


def test_vacuum_waits_for_a_lock_released_within_the_budget(
    store: SessionDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.db_path
    assert path is not None
    before = _contents(path)
    holders = _lock_after_optimize(store, monkeypatch, hold=0.3)
    try:
        store.vacuum()  # the default budget: the VACUUM waits, retries and succeeds
    finally:
        _let_go(holders)
    assert len(holders) == 1
    assert _contents(path) == before


def test_vacuum_beside_a_process_appending_in_long_transactions(
    store: SessionDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The field's case: another process appends, each transaction holding the lock
    ~0.3 s. Every vacuum() succeeds or says DatabaseLockedError; every row the appender
    saw committed is there. (The optimize step is left out: its own retries would make
    the VACUUM start right after a commit of ours.)"""
    path = store.db_path
    assert path is not None
    monkeypatch.setattr(store, "optimize_fts", lambda: 0)
    store.create_session("busy", "cli")
    proc = subprocess.Popen([sys.executable, "-c", APPENDER, str(path), "12"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acknowledged = [int(proc.stdout.readline())]
    outcomes: list[str] = []
    for _ in range(4):
        time.sleep(0.1)  # pacing, not a bound: the call lands inside one of the appender's transactions
        try:
            store.vacuum()
            outcomes.append("ok")
        except errors.DatabaseLockedError:
            outcomes.append("locked")
    acknowledged += [int(line) for line in proc.stdout]
    assert proc.wait(timeout=60) == 0
    assert outcomes and set(outcomes) <= {"ok", "locked"}
    _sessions, rows = _contents(path)
    ids = {r[0] for r in rows}
    assert set(acknowledged) <= ids
    assert store.get_session("busy")["message_count"] == len(acknowledged)


def test_operations_vacuum_on_an_engine_is_typed(head_db: Path, short_budget: float) -> None:
    """The operations layer's runner (UnitOfWorkSteps), as the CLI and aio use it."""
    from hermes_store import operations

    engine = create_engine(head_db)
    try:
        with held_lock(head_db):
            with pytest.raises(Exception) as info:
                operations.vacuum(operations.UnitOfWorkSteps(engine), optimize=lambda: 0)
            _assert_typed_lock(info.value)
        operations.vacuum(operations.UnitOfWorkSteps(engine), optimize=lambda: 0)
    finally:
        engine.dispose()


# ---------------------------------------------------------------- auto-prune


def _prunable(db: SessionDB, n: int = 2) -> list[str]:
    ids = [f"old{i}" for i in range(n)]
    for sid in ids:
        db.create_session(sid, "cli")
        db.append_message(sid, "user", f"old message of {sid}")
        db.end_session(sid, "done")
    assert db.db_path is not None
    conn = sqlite3.connect(db.db_path)
    with conn:
        conn.execute("UPDATE sessions SET started_at = 1000, ended_at = 1001 WHERE id LIKE 'old%'")
        conn.execute("UPDATE messages SET timestamp = 1000 WHERE session_id LIKE 'old%'")
    conn.close()
    return ids


def test_auto_prune_behind_a_held_lock_reports_the_typed_error(store: SessionDB, short_budget: float) -> None:
    _prunable(store)
    assert store.db_path is not None
    before = _contents(store.db_path)
    with held_lock(store.db_path):
        result = store.maybe_auto_prune_and_vacuum(retention_days=1)
    assert result["error"].startswith("DatabaseLockedError: ")
    assert result["pruned"] == 0 and result["vacuumed"] is False
    assert _contents(store.db_path) == before  # nothing pruned, nothing lost
    assert store.get_meta("last_auto_prune") is None  # the failed step left no stamp: the next start tries again
    again = store.maybe_auto_prune_and_vacuum(retention_days=1)
    assert "error" not in again and again["pruned"] == 2 and again["vacuumed"] is True


def test_auto_prune_whose_vacuum_meets_the_lock_reports_the_typed_error(
    store: SessionDB, short_budget: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prune commits; another process takes the lock before the VACUUM (the field's
    1 call in 10). The report names DatabaseLockedError, the prune keeps its stamp,
    ``last_vacuum`` is not stamped, and the rows kept are all there."""
    old = _prunable(store)
    assert store.db_path is not None
    kept_sessions, kept_rows = _contents(store.db_path)
    holders = _lock_after_optimize(store, monkeypatch)
    try:
        result = store.maybe_auto_prune_and_vacuum(retention_days=1)
    finally:
        _let_go(holders)
    assert result["pruned"] == 2 and result["vacuumed"] is False
    assert result["error"].startswith("DatabaseLockedError: "), result["error"]
    assert store.get_meta("last_auto_prune") is not None
    assert store.get_meta("last_vacuum") is None
    sessions, rows = _contents(store.db_path)
    assert sessions == [s for s in kept_sessions if s[0] not in old]
    assert rows == [r for r in kept_rows if r[1] not in old]


# ---------------------------------------------------------------- FTS upkeep


@pytest.mark.parametrize("call", ["check_fts", "rebuild_fts", "rebuild_search_indexes", "optimize_search_indexes"])
def test_fts_upkeep_behind_a_held_lock_is_typed(store: SessionDB, short_budget: float, call: str) -> None:
    """An integrity check is an INSERT (it needs the write lock): a busy file must not
    read as a damaged index, nor a rebuild or optimize end in a driver error."""
    assert store.db_path is not None
    before = _contents(store.db_path)
    with held_lock(store.db_path):
        with pytest.raises(Exception) as info:
            getattr(store, call)()
        _assert_typed_lock(info.value)
    assert _contents(store.db_path) == before
    assert store.check_fts() == {"messages_fts": None, "messages_fts_trigram": None}
    assert getattr(store, call)() is not None


# ---------------------------------------------------------------- asyncio


def test_aio_vacuum_behind_a_held_lock_is_typed(tmp_path: Path, short_budget: float) -> None:
    from hermes_store import aio

    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        _seed(db)
    before = _contents(path)

    async def main() -> tuple[BaseException, BaseException]:
        async with aio.AsyncSessionDB(path) as adb:
            with held_lock(path):
                with pytest.raises(Exception) as facade_call:
                    await adb.vacuum()
                engine = aio.create_async_engine(path)
                try:
                    with pytest.raises(Exception) as workflow:
                        await aio.operations.vacuum(engine, optimize=lambda: 0)
                finally:
                    await engine.dispose()
            assert await adb.vacuum() == 2
            return facade_call.value, workflow.value

    for exc in asyncio.run(main()):
        _assert_typed_lock(exc)
    assert _contents(path) == before


# ---------------------------------------------------------------- PostgreSQL


@contextmanager
def _pg_table_locked(url: str, release_after: float = 20.0) -> Iterator[None]:
    """Another connection holds ``LOCK TABLE messages IN ACCESS EXCLUSIVE MODE`` in an
    open transaction; let go when the block ends (or after ``release_after`` seconds,
    so code that waits without end finishes instead of hanging the run)."""
    engine = create_engine(url)
    conn = engine.connect()
    tx = conn.begin()
    conn.execute(text("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE"))
    done = threading.Lock()

    def release() -> None:
        with done:
            if tx.is_active:
                tx.rollback()

    timer = threading.Timer(release_after, release)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        release()
        conn.close()
        engine.dispose()


@pytest.mark.parametrize("call", ["vacuum", "rebuild_fts"])
def test_postgresql_maintenance_behind_a_locked_table_is_typed(
    pg_database: str, short_budget: float, call: str
) -> None:
    db = SessionDB(pg_database)
    try:
        _seed(db)
        before = db.message_count()
        with _pg_table_locked(pg_database):
            with pytest.raises(Exception) as info:
                getattr(db, call)()
        exc = info.value
        assert type(exc) is errors.DatabaseLockedError, f"{type(exc).__name__}: {exc}"
        chain = []
        seen: BaseException | None = exc
        while seen is not None:
            chain.append(seen)
            seen = getattr(seen, "orig", None) or seen.__cause__
        assert any(getattr(e, "sqlstate", None) == "55P03" for e in chain), chain
        assert db.message_count() == before
        getattr(db, call)()  # the lock gone, it runs
    finally:
        db.close()
