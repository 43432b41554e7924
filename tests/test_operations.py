"""The operations layer: each multi-transaction workflow called directly over an Engine
(:class:`UnitOfWorkSteps`) gives what the SessionDB method gives on equal data, and
every step of it is a transaction of its own (a failure in step 2 leaves step 1
committed and raises the typed error)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Connection, Engine, text

from hermes_store import errors, facade, migrations
from hermes_store.engine import create_engine
from hermes_store.facade import SessionDB
from hermes_store.operations import (
    ImportLimits,
    Pacing,
    Steps,
    UnitOfWorkSteps,
    auto_prune_and_vacuum,
    catch_up_search_index,
    import_records,
    import_sessions,
    optimize_fts_storage,
    vacuum,
)
from hermes_store.operations import steps as steps_module
from hermes_store.repositories import MaintenanceRepository
from hermes_store.dialects import cjk_bigram as bigram_upkeep
from hermes_store.sessiondb._host import HostSteps

from .factories import set_times

DAY = 86_400.0
LEGACY_TEXT = "COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"


# ---------------------------------------------------------------------- helpers


class FakeClock:
    """A monotonic clock that only moves when something sleeps; sleeps are recorded."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


class Counting:
    """A Steps runner around another that counts the transactions it runs, and can make
    write number ``fail_at`` raise ``error`` instead of running (a failure "in step N")."""

    def __init__(self, inner: Steps, *, fail_at: int | None = None, error: Exception | None = None) -> None:
        self.inner = inner
        self.writes = 0
        self.reads = 0
        self.outside_calls = 0
        self.fail_at = fail_at
        self.error = error

    @property
    def engine(self) -> Engine:
        return self.inner.engine

    @property
    def schema(self) -> str | None:
        return self.inner.schema

    def write(self, fn: Callable[[Connection], Any], *, budget: float | None = None) -> Any:
        self.writes += 1
        if self.writes == self.fail_at:
            assert self.error is not None
            raise self.error
        return self.inner.write(fn, budget=budget)

    def read(self, fn: Callable[[Connection], Any]) -> Any:
        self.reads += 1
        return self.inner.read(fn)

    def outside(self, fn: Callable[[Engine], Any]) -> Any:
        self.outside_calls += 1
        return self.inner.outside(fn)

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def now(self) -> float:
        return self.inner.now()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def steps(engine: Engine, clock: FakeClock) -> UnitOfWorkSteps:
    return UnitOfWorkSteps(engine, sleep=clock.sleep, monotonic=clock.monotonic)


@pytest.fixture
def other(tmp_path: Path) -> Iterator[SessionDB]:
    """A second store, for the facade's side of an equal-data comparison."""
    with SessionDB(tmp_path / "facade.db") as store:
        yield store


@pytest.fixture
def facade_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The facade's ``time`` (hermes_state.time) with a recording sleep, as Hermes' tests do."""
    fake = FakeClock()

    class FakeTime:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        sleep = staticmethod(fake.sleep)

    monkeypatch.setattr(facade, "time", FakeTime())
    return fake


def dump(path: Path) -> list[dict[str, Any]]:
    """Every session and message row of a store, as its export streams them."""
    eng = create_engine(path)
    try:
        with eng.connect() as conn:
            return list(MaintenanceRepository(conn).iter_export())
    finally:
        eng.dispose()


def sql(path: Path, statement: str, *args: Any) -> list[tuple]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return conn.execute(statement, args).fetchall()
    finally:
        conn.close()


def record(sid: str, started: float, n: int, *, parent: str | None = None) -> dict[str, Any]:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{sid} says {i} 数据{i}",
             "timestamp": started + i} for i in range(n)]
    return {"id": sid, "source": "cli", "started_at": started, "parent_session_id": parent,
            "message_count": n, "messages": msgs}


def fill(db: SessionDB, n: int, sid: str = "s1") -> list[int]:
    db.create_session(sid, "cli")
    db.append_messages([
        {"session_id": sid, "role": "tool" if i % 4 == 3 else "user", "content": f"{sid} message w{i}x",
         "tool_name": "shell" if i % 4 == 3 else None}
        for i in range(n)
    ])
    return [m["id"] for m in db.get_messages(sid)]


def make_legacy(path: Path) -> None:
    """Give the file Hermes' v11-v22 layout: inline one-column indexes, filled, no views."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for kind, name in conn.execute(
            "SELECT type, name FROM sqlite_master WHERE name LIKE 'messages_fts%' AND type IN ('trigger', 'view')"
        ).fetchall():
            conn.execute(f"DROP {kind} {name}")
        conn.execute("DROP TABLE messages_fts")
        conn.execute("DROP TABLE messages_fts_trigram")
        conn.executescript(facade.LEGACY_FTS_SQL + facade.LEGACY_FTS_TRIGRAM_SQL)
        conn.execute(f"INSERT INTO messages_fts(rowid, content) SELECT id, {LEGACY_TEXT} FROM messages")
        conn.execute(f"INSERT INTO messages_fts_trigram(rowid, content) SELECT id, {LEGACY_TEXT} FROM messages")
    finally:
        conn.close()


def fts_state(path: Path) -> dict[str, Any]:
    """What optimize-storage leaves: indexed rows, trash tables, markers, stamps."""
    return {
        "word": [r[0] for r in sql(path, "SELECT id FROM messages_fts_docsize ORDER BY id")],
        "trigram": [r[0] for r in sql(path, "SELECT id FROM messages_fts_trigram_docsize ORDER BY id")],
        "trash": sql(path, "SELECT name FROM sqlite_master WHERE name LIKE 'fts\\_v22\\_trash\\_%' ESCAPE '\\'"),
        "meta": sql(path, "SELECT key, value FROM state_meta WHERE key LIKE 'fts%' ORDER BY key"),
        "word_sql": sql(path, "SELECT sql FROM sqlite_master WHERE name = 'messages_fts'"),
    }


def legacy_pair(engine_path: Path, other: SessionDB, n: int) -> None:
    """Equal data on both stores, both moved to the pre-v23 layout."""
    with SessionDB(engine_path) as mine:
        assert fill(mine, n) == fill(other, n)
    make_legacy(engine_path)
    make_legacy(other.db_path)


# ---------------------------------------------------------------------- the runners


def test_both_runners_are_steps(steps: UnitOfWorkSteps, other: SessionDB) -> None:
    assert isinstance(steps, Steps)
    assert isinstance(HostSteps(other), Steps)
    assert steps.schema is None and HostSteps(other).schema is None
    assert HostSteps(other).engine is other.engine


def test_a_schema_on_sqlite_is_refused_before_any_step(engine: Engine) -> None:
    with pytest.raises(errors.InvalidInputError, match="PostgreSQL only"):
        UnitOfWorkSteps(engine, schema="team_a")


def test_a_locked_write_is_retried_with_jitter_then_runs(head_db: Path, clock: FakeClock) -> None:
    eng = create_engine(head_db, busy_timeout_ms=20)
    holder = sqlite3.connect(head_db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    released: list[float] = []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 2:  # the other writer commits during our second wait
            holder.execute("COMMIT")
            released.append(seconds)

    try:
        runner = UnitOfWorkSteps(eng, sleep=sleep, monotonic=clock.monotonic)
        runner.write(lambda c: MaintenanceRepository(c).set_meta("k", "v"))
        assert len(clock.sleeps) == 2 and released
        low, high = steps_module.EARLY_JITTER_S
        assert all(low <= s <= high for s in clock.sleeps)  # the early jitter window
        assert runner.read(lambda c: MaintenanceRepository(c).get_meta("k")) == "v"
    finally:
        holder.close()
        eng.dispose()


def test_a_lock_held_past_the_budget_is_a_typed_error(head_db: Path, clock: FakeClock) -> None:
    eng = create_engine(head_db, busy_timeout_ms=20)
    holder = sqlite3.connect(head_db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        runner = UnitOfWorkSteps(eng, sleep=clock.sleep, monotonic=clock.monotonic)
        with pytest.raises(errors.DatabaseLockedError, match=r"stayed locked for 0\.5s"):
            runner.write(lambda c: MaintenanceRepository(c).set_meta("k", "v"), budget=0.5)
        assert clock.sleeps and sum(clock.sleeps) == pytest.approx(0.5)  # never slept past the budget
    finally:
        holder.close()
        eng.dispose()
    assert sql(head_db, "SELECT value FROM state_meta WHERE key = 'k'") == []


def test_a_failing_step_rolls_back_only_itself(steps: UnitOfWorkSteps) -> None:
    steps.write(lambda c: MaintenanceRepository(c).set_meta("first", "1"))

    def second(c: Connection) -> None:
        MaintenanceRepository(c).set_meta("second", "2")
        raise errors.InvalidInputError("step 2 refused")

    with pytest.raises(errors.InvalidInputError, match="step 2"):
        steps.write(second)
    assert steps.read(lambda c: MaintenanceRepository(c).get_meta("first")) == "1"
    assert steps.read(lambda c: MaintenanceRepository(c).get_meta("second")) is None


# ---------------------------------------------------------------------- imports


def test_import_records_matches_the_facade(steps: UnitOfWorkSteps, head_db: Path, other: SessionDB) -> None:
    records = [record("child", 2.0, 3, parent="root"), record("root", 1.0, 2)]  # child before its parent
    records += [record(f"s{i}", 10.0 + i, 2) for i in range(5)]
    assert import_records(steps, records, batch=3) == other.import_records(records, batch=3) == (7, 0)
    assert dump(head_db) == dump(other.db_path)
    child = next(r for r in dump(head_db) if r["id"] == "child")
    assert child["parent_session_id"] == "root"  # relinked across batches
    assert import_records(steps, records) == other.import_records(records) == (0, 7)  # idempotent


def test_import_records_writes_one_transaction_per_batch(steps: UnitOfWorkSteps, head_db: Path) -> None:
    counting = Counting(steps)
    records = [record(f"s{i:03d}", 1.0 + i, 1) for i in range(450)]
    assert import_records(counting, records) == (450, 0)
    assert counting.writes == 3 + 1  # 200 + 200 + 50, then the short-CJK index catch-up
    assert sql(head_db, "SELECT count(*) FROM sessions") == [(450,)]


def test_a_failed_batch_leaves_the_batches_before_it_committed(steps: UnitOfWorkSteps, head_db: Path) -> None:
    good = [record("a", 1.0, 2), record("b", 2.0, 2)]
    bad = {"source": "cli", "started_at": 3.0}  # no id: refused inside the second batch
    counting = Counting(steps)
    with pytest.raises(errors.InvalidInputError, match="no 'id'"):
        import_records(counting, [*good, bad, record("c", 4.0, 1)], batch=2)
    assert counting.writes == 2
    assert sql(head_db, "SELECT id FROM sessions ORDER BY id") == [("a",), ("b",)]


def test_import_sessions_matches_the_facade(steps: UnitOfWorkSteps, head_db: Path, other: SessionDB) -> None:
    entries = [{"id": "p", "source": "cli", "title": "Parent", "messages": [{"role": "user", "content": "数据 hi"}]},
               {"id": "c", "source": "cli", "parent_session_id": "p", "messages": []}]
    counting = Counting(steps)
    mine = import_sessions(counting, entries)
    theirs = other.import_sessions(entries)
    assert mine == theirs and mine["ok"] is True and mine["imported"] == 2
    assert counting.writes == 2  # the import, then the index catch-up: two transactions
    assert [(r["id"], r["parent_session_id"], r["title"]) for r in dump(head_db)] == \
        [(r["id"], r["parent_session_id"], r["title"]) for r in dump(other.db_path)]
    again = import_sessions(steps, entries)
    assert again == other.import_sessions(entries) and again["skipped"] == 2 and again["imported"] == 0


def test_import_sessions_validates_before_writing(steps: UnitOfWorkSteps, head_db: Path,
                                                  other: SessionDB, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [{"id": "a", "messages": [{"role": "user"}] * 3}, {"id": "a"}, "x", {"id": "b", "title": 5}]
    counting = Counting(steps)
    mine = import_sessions(counting, entries, limits=ImportLimits(max_messages_per_session=2))
    monkeypatch.setattr(other, "_IMPORT_MAX_MESSAGES_PER_SESSION", 2)
    assert mine == other.import_sessions(entries)
    assert [e["error"] for e in mine["errors"]] == [
        "messages exceeds the per-session import limit", "duplicate session id", "session must be an object",
        "title must be a string"]
    assert mine["ok"] is False
    assert counting.writes == 0
    assert sql(head_db, "SELECT count(*) FROM sessions") == [(0,)]
    with pytest.raises(errors.InvalidInputError, match="at most 1 entries"):
        import_sessions(steps, [{"id": "a"}, {"id": "b"}], limits=ImportLimits(max_sessions=1))


# ---------------------------------------------------------------------- auto-prune and vacuum


def aged(store: SessionDB, folder: Path) -> None:
    store.create_session("old", "cli")
    store.append_message("old", "user", "aged out")
    set_times(store, "old", started_at=time.time() - 200 * DAY, ended_at=time.time() - 199 * DAY, end_reason="x",
              messages_at=time.time() - 200 * DAY)
    store.create_session("young", "cli")
    (folder / "old.json").write_text("{}")


def test_auto_prune_and_vacuum_matches_the_facade(engine: Engine, head_db: Path, other: SessionDB,
                                                  tmp_path: Path) -> None:
    mine_dir, their_dir = tmp_path / "mine", tmp_path / "theirs"
    mine_dir.mkdir()
    their_dir.mkdir()
    with SessionDB(head_db) as store:
        aged(store, mine_dir)
    aged(other, their_dir)
    stamp = [1_800_000_000.0]
    runner = Counting(UnitOfWorkSteps(engine, now=lambda: stamp[0]))
    mine = auto_prune_and_vacuum(runner, retention_days=90, sessions_dir=mine_dir)
    theirs = other.maybe_auto_prune_and_vacuum(retention_days=90, sessions_dir=their_dir)
    assert mine == theirs == {"skipped": False, "pruned": 1, "vacuumed": True}
    # Read the stamp, prune and stamp in one write, optimize, then VACUUM outside a transaction.
    assert (runner.reads, runner.writes, runner.outside_calls) == (1, 2, 1)
    assert not (mine_dir / "old.json").exists() and not (their_dir / "old.json").exists()
    assert [r["id"] for r in dump(head_db)] == [r["id"] for r in dump(other.db_path)] == ["young"]
    assert sql(head_db, "SELECT value FROM state_meta WHERE key = 'last_auto_prune'") == [(repr(stamp[0]),)]
    stamp[0] += 3600
    assert auto_prune_and_vacuum(runner) == other.maybe_auto_prune_and_vacuum() == \
        {"skipped": True, "pruned": 0, "vacuumed": False}
    stamp[0] += 25 * 3600
    assert auto_prune_and_vacuum(runner) == {"skipped": False, "pruned": 0, "vacuumed": False}


def test_auto_prune_reports_a_failed_step_and_leaves_no_stamp(steps: UnitOfWorkSteps, head_db: Path,
                                                              other: SessionDB) -> None:
    runner = Counting(steps, fail_at=1, error=errors.DiskFullError("disk on fire"))
    out = auto_prune_and_vacuum(runner)
    assert out == {"skipped": False, "pruned": 0, "vacuumed": False, "error": "DiskFullError: disk on fire"}
    assert sql(head_db, "SELECT value FROM state_meta WHERE key = 'last_auto_prune'") == []


def test_vacuum_optimizes_then_vacuums_outside_a_transaction(steps: UnitOfWorkSteps, head_db: Path,
                                                             other: SessionDB) -> None:
    with SessionDB(head_db) as store:
        fill(store, 300)
        store.clear_messages("s1")
    fill(other, 300)
    other.clear_messages("s1")
    assert sql(head_db, "PRAGMA freelist_count")[0][0] > 0
    runner = Counting(steps)
    assert vacuum(runner) == other.vacuum() == 2
    assert (runner.writes, runner.outside_calls) == (1, 1)
    assert sql(head_db, "PRAGMA freelist_count") == [(0,)]
    calls: list[str] = []
    assert vacuum(steps, optimize=lambda: calls.append("mine") or 7) == 7 and calls == ["mine"]

    def broken() -> int:
        raise sqlite3.OperationalError("optimize blew up")

    assert vacuum(steps, optimize=broken) == 0  # logged, counts as 0; the VACUUM still ran


# ---------------------------------------------------------------------- optimize-storage


def test_optimize_storage_matches_the_facade(steps: UnitOfWorkSteps, clock: FakeClock, head_db: Path,
                                             other: SessionDB, facade_clock: FakeClock) -> None:
    legacy_pair(head_db, other, 1100)
    mine: list[dict] = []
    theirs: list[dict] = []
    demoted: list[list[str]] = []
    result = optimize_fts_storage(steps, progress_cb=mine.append, on_demoted=demoted.append)
    assert result == other.optimize_fts_storage(progress_cb=theirs.append) == {"ok": True, "vacuumed": True}
    assert mine == theirs
    assert [e["indexed"] for e in mine if e["phase"] == "backfill"] == [500, 1000, 1100]
    assert demoted == [["messages_fts", "messages_fts_trigram"]]
    assert fts_state(head_db) == fts_state(other.db_path)
    state = fts_state(head_db)
    assert state["trash"] == [] and len(state["word"]) == 1100
    assert "messages_fts_src" in state["word_sql"][0][0]  # the head layout
    assert ("fts_storage_version", "3") in state["meta"]
    # The pauses went to the runner's sleep (never a real one), with the facade's rule.
    assert clock.sleeps and min(clock.sleeps) >= 0.2
    assert len(clock.sleeps) == len(facade_clock.sleeps)
    assert optimize_fts_storage(steps, vacuum=False) == {"ok": True, "vacuumed": None}  # nothing left to do


def test_optimize_storage_runs_one_transaction_per_chunk(steps: UnitOfWorkSteps, head_db: Path) -> None:
    with SessionDB(head_db) as store:
        fill(store, 1234)
    make_legacy(head_db)
    counting = Counting(steps)
    teardown: list[dict] = []
    pacing = Pacing(chunk_rows=500)
    optimize_fts_storage(counting, vacuum=False, pacing=pacing,
                         progress_cb=lambda e: teardown.append(e) if e["phase"] == "teardown" else None)
    # demote + 3 backfill chunks + one per teardown chunk + the final stamp
    assert counting.writes == 1 + 3 + len(teardown) + 1
    assert len(teardown) >= 2 and teardown[-1]["percent"] == 100


def test_a_failure_in_the_second_chunk_leaves_the_first_committed(steps: UnitOfWorkSteps, head_db: Path) -> None:
    with SessionDB(head_db) as store:
        ids = fill(store, 1234)
    make_legacy(head_db)
    counting = Counting(steps, fail_at=3, error=errors.DiskFullError("disk full in chunk 2"))
    with pytest.raises(errors.DiskFullError, match="chunk 2"):
        optimize_fts_storage(counting, vacuum=False)  # write 1 demotes, write 2 is chunk 1
    meta = dict(sql(head_db, "SELECT key, value FROM state_meta WHERE key LIKE 'fts_rebuild%'"))
    assert meta == {"fts_rebuild_high_water": str(ids[-1]), "fts_rebuild_progress": "500"}
    assert len(fts_state(head_db)["word"]) == 500  # chunk 1's rows are indexed, and stay
    # Resumable: the next run carries on from the committed window.
    events: list[dict] = []
    assert optimize_fts_storage(steps, vacuum=False, progress_cb=events.append) == {"ok": True, "vacuumed": None}
    assert [e["indexed"] for e in events if e["phase"] == "backfill"] == [1000, 1234]
    assert fts_state(head_db)["word"] == ids


def test_optimize_storage_without_full_text_search(steps: UnitOfWorkSteps) -> None:
    counting = Counting(steps)
    assert optimize_fts_storage(counting, fts_enabled=False) == {"ok": False, "reason": "fts5_unavailable"}
    assert (counting.reads, counting.writes) == (0, 0)


# ---------------------------------------------------------------------- short-CJK catch-up


def behind(head_db: Path, n: int) -> None:
    """``n`` CJK rows written behind the short-CJK index's back (as Hermes' own code would)."""
    with SessionDB(head_db) as store:
        store.create_session("s", "cli")
    conn = sqlite3.connect(head_db, isolation_level=None)
    try:
        conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', ?, ?)",
                         [(f"数据 {i}", float(i)) for i in range(n)])
    finally:
        conn.close()


def test_the_catch_up_goes_in_bounded_steps(head_db: Path, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    behind(head_db, 25)
    monkeypatch.setattr(bigram_upkeep, "CHUNK", 5)  # rows read per statement: the step is exact
    counting = Counting(UnitOfWorkSteps(engine))
    assert catch_up_search_index(counting, limit=None, step=10) == 25
    assert counting.writes == 3  # 10 + 10 + 5, each its own transaction
    assert catch_up_search_index(counting, limit=None, step=10) == 0  # caught up: one read, no write
    assert counting.writes == 3
    with engine.connect() as c:
        assert MaintenanceRepository(c).search_index_behind() is False


def test_the_catch_up_stops_at_its_limit_or_when_asked(head_db: Path, engine: Engine,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    behind(head_db, 25)
    monkeypatch.setattr(bigram_upkeep, "CHUNK", 3)
    counting = Counting(UnitOfWorkSteps(engine))
    assert catch_up_search_index(counting, limit=12, step=6) == 12  # two steps, then the limit
    assert counting.writes == 2
    assert catch_up_search_index(counting, limit=None, step=6, should_stop=lambda: True) == 6
    assert counting.writes == 3
    locked = Counting(UnitOfWorkSteps(engine), fail_at=1, error=errors.DatabaseLockedError("busy"))
    assert catch_up_search_index(locked, limit=None, step=6) == 0  # someone else writes: later
    assert catch_up_search_index(counting, limit=None) == 7  # SQLite: the rest in one step
    assert counting.writes == 4


# ---------------------------------------------------------------------- on a server


@pytest.mark.parametrize("schema", [None, "team_a"])
def test_the_default_runner_on_a_server(pg_database: str, schema: str | None) -> None:
    """The same workflows over UnitOfWorkSteps on PostgreSQL, in a tenant schema too; a
    write waits for a row lock held elsewhere no longer than its budget (lock_timeout)."""
    eng = create_engine(pg_database)
    try:
        migrations.upgrade(eng, schema=schema)
        steps = UnitOfWorkSteps(eng, schema)
        assert steps.schema == schema
        records = [record("child", 2.0, 3, parent="root"), record("root", 1.0, 2), record("s", 3.0, 1)]
        counting = Counting(steps)
        assert import_records(counting, records, batch=2) == (3, 0)
        assert counting.writes == 2 + 1
        assert import_records(steps, records) == (0, 3)
        assert vacuum(steps) == 2  # the GIN indexes' pending lists merged, then VACUUM ANALYZE
        assert auto_prune_and_vacuum(steps, retention_days=36500)["skipped"] is False
        where = f'"{schema}".' if schema else ""
        steps.write(lambda c: MaintenanceRepository(c).set_meta("held", "0"))
        holder = eng.connect()
        try:
            holder.begin()
            holder.execute(text(f"SELECT * FROM {where}state_meta WHERE key = 'held' FOR UPDATE"))
            started = time.monotonic()
            with pytest.raises(errors.DatabaseLockedError, match="stayed locked"):
                steps.write(lambda c: MaintenanceRepository(c).set_meta("held", "1"), budget=0.5)
            assert time.monotonic() - started < 5  # ended by the budget, not by the holder
        finally:
            holder.close()
        steps.write(lambda c: MaintenanceRepository(c).set_meta("held", "2"))
        assert steps.read(lambda c: MaintenanceRepository(c).get_meta("held")) == "2"
        with eng.connect() as c:
            rows = c.execute(text(f"SELECT count(*) FROM {where}sessions")).scalar()
        assert rows == 3
    finally:
        eng.dispose()
