"""Issue 32, point 1: writers of one SQLite file in one process take turns in a FIFO
(:mod:`hermes_store.write_queue`) instead of meeting SQLite's busy lock and sleeping.

What is shown, never timed:
- the queue itself: turns handed over in arrival order, a waiter past its budget leaves
  the line, a cancelled async waiter passes a turn it was just handed to the next;
- 8 threads on one file (one shared ``SessionDB``, a ``SessionDB`` each, units of work)
  write every row exactly, and not one of them waited in the facade's retry sleep or
  met SQLite's busy handler (their busy timeout is 0 here: a meeting would fail);
- 2 processes x 4 threads on one file: every row exact (processes still meet at
  SQLite's lock, and its retry budget);
- a writer in line behind a held turn gives up with ``DatabaseLockedError`` when its
  budget runs out, writes nothing, and leaves the line; the next writer goes through;
- a turn ends with its transaction however it ends (commit, rollback, an exception, a
  closed connection), and two spellings of one file share one queue;
- an async store waits in line as a task: its loop keeps running while a thread holds
  the turn.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from hermes_store import SessionDB, UnitOfWork, aio, errors, facade, write_queue
from hermes_store.dialects.sqlite import BEGIN_MODE
from hermes_store.engine import create_engine

THREADS = 8
APPENDS = 40


# ------------------------------------------------------------------ the queue itself


def test_turns_are_handed_over_in_arrival_order() -> None:
    queue = write_queue.WriterQueue("/nowhere/fifo.db")
    first = object()
    assert queue.take(first, 1.0)
    order: list[int] = []
    owners = [object() for _ in range(5)]
    threads = []
    for i, owner in enumerate(owners):
        def body(i: int = i, owner: object = owner) -> None:
            assert queue.take(owner, 60.0)
            order.append(i)
            queue.release(owner)
        t = threading.Thread(target=body)
        t.start()
        threads.append(t)
        while queue.waiting() != i + 1:  # each joins the line before the next starts
            threading.Event().wait(0.001)
    queue.release(first)
    for t in threads:
        t.join(60)
    assert order == [0, 1, 2, 3, 4]
    assert not queue.holds(first) and queue.waiting() == 0
    fresh = object()
    assert queue.take(fresh, 0.0)  # free again: taken at once, even with no time to wait


def test_a_waiter_past_its_budget_leaves_the_line() -> None:
    queue = write_queue.WriterQueue("/nowhere/budget.db")
    holder, late = object(), object()
    assert queue.take(holder, 1.0)
    assert not queue.take(late, 0.05)
    assert queue.waiting() == 0 and queue.holds(holder)
    queue.release(late)  # not its turn: nothing happens
    assert queue.holds(holder)
    queue.release(holder)
    assert queue.take(late, 0.0)


def test_a_cancelled_async_waiter_passes_its_turn_on() -> None:
    queue = write_queue.WriterQueue("/nowhere/cancel.db")
    holder, cancelled, next_ = object(), object(), object()

    async def main() -> bool:
        assert queue.take(holder, 1.0)
        waiting = asyncio.ensure_future(queue.take_async(cancelled, 60.0))
        await asyncio.sleep(0)
        assert queue.waiting() == 1
        queue.release(holder)  # handed to the task, which is cancelled before it runs
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not queue.holds(cancelled)
        return await queue.take_async(next_, 0.0)

    assert asyncio.run(main())
    assert queue.holds(next_)


def test_two_spellings_of_one_file_share_a_queue(tmp_path: Path) -> None:
    real = tmp_path / "real" / "state.db"
    real.parent.mkdir()
    (tmp_path / "link").symlink_to(real.parent)
    assert write_queue.for_file(real) is write_queue.for_file(tmp_path / "link" / "state.db")
    assert write_queue.for_file(real) is write_queue.for_file(str(real.parent / ".." / "real" / "state.db"))
    assert write_queue.for_file(real) is not write_queue.for_file(tmp_path / "other.db")


def test_writes_posted_meanwhile_go_in_one_batch_and_fail_alone() -> None:
    """Group commit: jobs posted while a batch is being written form the next batch,
    written by one of their own callers; a job that fails fails only its caller."""
    batcher = write_queue.Batcher()
    batches: list[list[str]] = []
    first_in, release_first = threading.Event(), threading.Event()

    def write(jobs: list[write_queue.Job]) -> None:
        names = []
        for job in jobs:
            try:
                job.result, job.error = job.run(None), None
            except Exception as exc:
                job.result, job.error = None, exc
            names.append(str(job.result))
        batches.append(names)
        if len(batches) == 1:
            first_in.set()
            assert release_first.wait(60)

    def timed_out() -> BaseException:
        return errors.DatabaseLockedError("timed out")

    def boom(_: object) -> str:
        raise ValueError("this job only")

    outcomes: dict[str, object] = {}

    def caller(name: str, run) -> None:
        try:
            outcomes[name] = batcher.submit(run, write, 60.0, timed_out)
        except Exception as exc:
            outcomes[name] = exc

    first = threading.Thread(target=caller, args=("a", lambda _: "a"))
    first.start()
    assert first_in.wait(60)  # "a" is being written; the next three queue up meanwhile
    later = [threading.Thread(target=caller, args=(n, r)) for n, r in
             (("b", lambda _: "b"), ("c", boom), ("d", lambda _: "d"))]
    for t in later:
        t.start()
    while len(batcher._queued) < 3:
        threading.Event().wait(0.001)
    release_first.set()
    for t in [first, *later]:
        t.join(60)
    assert batches == [["a"], ["b", "None", "d"]]
    assert outcomes["a"] == "a" and outcomes["b"] == "b" and outcomes["d"] == "d"
    assert isinstance(outcomes["c"], ValueError)
    assert batcher._queued == [] and not batcher._leading


def test_a_queued_write_past_its_budget_is_withdrawn_unwritten() -> None:
    batcher = write_queue.Batcher()
    written: list[str] = []
    writing, finish = threading.Event(), threading.Event()

    def write(jobs: list[write_queue.Job]) -> None:
        for job in jobs:
            job.result, job.error = job.run(None), None
            written.append(job.result)
        writing.set()
        assert finish.wait(60)

    holder = threading.Thread(target=lambda: batcher.submit(lambda _: "held", write, 60.0, RuntimeError))
    holder.start()
    assert writing.wait(60)
    with pytest.raises(errors.DatabaseLockedError):
        batcher.submit(lambda _: "late", write, 0.05, lambda: errors.DatabaseLockedError("timed out"))
    finish.set()
    holder.join(60)
    assert written == ["held"] and batcher._queued == []


def test_a_failing_append_in_a_batch_rolls_back_only_its_own_work(tmp_path: Path) -> None:
    """Eight threads append to one store; one of them keeps appending rows that fail
    after their counter update ran (no role): its savepoint undoes the update, the
    others' rows and counters are exact."""
    path = tmp_path / "state.db"
    db = SessionDB(path)
    try:
        for t in range(THREADS):
            db.create_session(f"t{t}", "cli")
        barrier = threading.Barrier(THREADS)
        raised: list[BaseException] = []
        unexpected: list[BaseException] = []

        def writer(t: int) -> None:
            barrier.wait()
            for i in range(APPENDS):
                try:
                    db.append_message(f"t{t}", None if t == 0 else "user", f"{t} {i}")  # type: ignore[arg-type]
                except Exception as exc:
                    (raised if t == 0 else unexpected).append(exc)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert unexpected == []
        assert len(raised) == APPENDS
        assert _rows(path) == {"t0": (0, 0), **{f"t{t}": (APPENDS, APPENDS) for t in range(1, THREADS)}}
    finally:
        db.close()


# ------------------------------------------------------------------ threads of one process


def test_stores_of_one_file_share_a_batcher_and_async_stores_keep_their_own(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    first, second = SessionDB(tmp_path / "real" / "state.db"), SessionDB(tmp_path / "link" / "state.db")
    other = SessionDB(tmp_path / "other.db")
    try:
        assert first._batcher is second._batcher
        assert other._batcher is not first._batcher

        async def async_batchers() -> list[object]:
            found = []
            for _ in range(2):
                async with aio.AsyncSessionDB(tmp_path / "real" / "state.db") as adb:
                    await adb.message_count("none")  # opened
                    found.append(adb._db._batcher)  # type: ignore[union-attr]
            return found

        a, b = asyncio.run(async_batchers())
        assert a is not b and first._batcher not in (a, b)
    finally:
        for db in (first, second, other):
            db.close()


def _rows(path: Path) -> dict[str, tuple[int, int]]:
    """Per session: (message rows, message_count), read with plain sqlite3."""
    conn = sqlite3.connect(path)
    try:
        return {sid: (rows, count) for sid, rows, count in conn.execute(
            "SELECT s.id, (SELECT count(*) FROM messages m WHERE m.session_id = s.id), s.message_count FROM sessions s")}
    finally:
        conn.close()


@pytest.fixture
def never_busy(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Stores opened now meet SQLite's busy lock with no wait at all (busy timeout 0),
    and every sleep of the facade's retry loop is recorded: a writer that met another
    of this process at the lock would show up in one or the other."""
    monkeypatch.setattr(facade, "BUSY_TIMEOUT_MS", 0)
    slept: list[float] = []
    real = SessionDB._sleep

    def recording(self: SessionDB, seconds: float) -> None:
        slept.append(seconds)
        real(self, seconds)

    monkeypatch.setattr(SessionDB, "_sleep", recording)
    return slept


@pytest.mark.parametrize("shape", ["one shared store", "a store per thread"])
def test_eight_threads_take_turns_and_never_sleep(tmp_path: Path, never_busy: list[float], shape: str) -> None:
    path = tmp_path / "state.db"
    stores = [SessionDB(path)] if shape == "one shared store" else [SessionDB(path) for _ in range(THREADS)]
    try:
        for t in range(THREADS):
            stores[0].create_session(f"t{t}", "cli")
        barrier = threading.Barrier(THREADS)
        failures: list[BaseException] = []

        def writer(t: int) -> None:
            db = stores[t % len(stores)]
            barrier.wait()
            try:
                for i in range(APPENDS):
                    db.append_message(f"t{t}", "user", f"thread {t} message {i} 线程")
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert failures == []
        for db in stores:
            assert db.wait_for_upkeep(60)
        assert never_busy == []
        assert _rows(path) == {f"t{t}": (APPENDS, APPENDS) for t in range(THREADS)}
        assert len(stores[0].search_messages("线程", limit=THREADS * APPENDS + 1)) == THREADS * APPENDS
        # Rows are encoded before they queue, but stamped in the write: ids and
        # timestamps advance together, as from one writer.
        with sqlite3.connect(path) as conn:
            stamps = [r[0] for r in conn.execute("SELECT timestamp FROM messages ORDER BY id")]
        assert len(stamps) == THREADS * APPENDS and stamps == sorted(stamps)
    finally:
        for db in stores:
            db.close()
    assert write_queue.for_file(path).waiting() == 0


def test_idle_for_counts_from_the_last_turn() -> None:
    queue = write_queue.WriterQueue("/nowhere/idle.db")
    first, second = object(), object()
    assert queue.take(first, 1.0)
    assert queue.idle_for() == 0.0
    waiter = threading.Thread(target=lambda: queue.take(second, 60.0))
    waiter.start()
    while queue.waiting() != 1:
        threading.Event().wait(0.001)
    queue.release(first)  # handed to the waiter: still busy
    waiter.join()
    assert queue.holds(second) and queue.idle_for() == 0.0
    queue.release(second)
    once = queue.idle_for()
    assert once >= 0.0 and queue.idle_for() >= once


def test_upkeep_after_writes_goes_after_the_writers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catch-up after writes waits while this process's writers hold or wait for the
    file's turn, goes once they let go, still goes when its patience runs out under a
    steady stream of writes, and gives up when the store closes."""
    path = tmp_path / "upkeep.db"
    db = SessionDB(path)
    queue = write_queue.for_file(path)
    writer = object()
    try:
        monkeypatch.setattr(facade, "UPKEEP_PATIENCE_S", 600.0)
        assert queue.take(writer, 1.0)
        outcome: list[bool] = []
        waiting = threading.Thread(target=lambda: outcome.append(db._after_writers()))
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive() and outcome == []  # a writer holds the turn: upkeep waits
        queue.release(writer)
        waiting.join(60)
        assert outcome == [True]

        monkeypatch.setattr(facade, "UPKEEP_PATIENCE_S", 0.0)
        assert queue.take(writer, 1.0)
        assert db._after_writers() is True  # patience spent: it goes behind the writer anyway
        monkeypatch.setattr(facade, "UPKEEP_PATIENCE_S", 600.0)
        closing = threading.Thread(target=lambda: outcome.append(db._after_writers()))
        closing.start()
        db._upkeep.close()
        closing.join(60)
        assert outcome == [True, False]
    finally:
        queue.release(writer)
        db.close()


def test_units_of_work_and_stores_share_the_line(tmp_path: Path, never_busy: list[float]) -> None:
    path = tmp_path / "state.db"
    db = SessionDB(path)
    engine = create_engine(path)  # a unit of work waits for its turn as long as its busy timeout
    try:
        db.create_session("facade", "cli")
        db.create_session("uow", "cli")
        barrier = threading.Barrier(2)
        failures: list[BaseException] = []

        def through_units() -> None:
            barrier.wait()
            try:
                for i in range(APPENDS):
                    with UnitOfWork(engine) as uow:
                        uow.messages.append("uow", "user", f"unit {i}")
            except BaseException as exc:
                failures.append(exc)

        def through_store() -> None:
            barrier.wait()
            try:
                for i in range(APPENDS):
                    db.append_message("facade", "user", f"store {i}")
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=through_units), threading.Thread(target=through_store)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert failures == []
        assert never_busy == []
        assert _rows(path) == {"facade": (APPENDS, APPENDS), "uow": (APPENDS, APPENDS)}
    finally:
        db.close()
        engine.dispose()


def test_a_writer_in_line_gives_up_typed_when_its_budget_runs_out(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "state.db"
    db = SessionDB(path)
    engine = create_engine(path)
    try:
        db.create_session("s", "cli")
        # An append's budget: the shorter of the write and transcript budgets, as set now.
        monkeypatch.setattr(facade, "WRITE_BUDGET_S", 0.3)
        monkeypatch.setattr(facade, "TRANSCRIPT_BUDGET_S", 0.3, raising=False)
        holding = threading.Event()
        done = threading.Event()

        def hold() -> None:
            with UnitOfWork(engine) as uow:
                uow.messages.append("s", "user", "held")
                holding.set()
                done.wait(60)

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(60)
        with pytest.raises(errors.DatabaseLockedError) as caught:
            db.append_message("s", "user", "too late")
        assert "locked" in str(caught.value)
        queue = write_queue.for_file(path)
        assert queue.waiting() == 0  # it left the line
        done.set()
        holder.join(60)
        db.append_message("s", "user", "after")
        assert [m["content"] for m in db.get_messages("s")] == ["held", "after"]
    finally:
        db.close()
        engine.dispose()


@pytest.mark.parametrize("ending", ["commit", "rollback", "exception", "close"])
def test_a_turn_ends_with_its_transaction(tmp_path: Path, ending: str) -> None:
    path = tmp_path / "state.db"
    engine = create_engine(path, busy_timeout_ms=0)
    db = SessionDB(path)
    try:
        db.create_session("s", "cli")
        queue = write_queue.for_file(path)
        conn = engine.connect()
        conn.execution_options(**{BEGIN_MODE: "IMMEDIATE"})
        raw = conn.connection.dbapi_connection
        if ending == "exception":
            with pytest.raises(RuntimeError), conn.begin():
                assert queue.holds(raw)
                raise RuntimeError("boom")
        else:
            conn.begin()
            assert queue.holds(raw)
            if ending == "commit":
                conn.commit()
            elif ending == "rollback":
                conn.rollback()
            else:
                conn.close()  # back to the pool, which rolls the transaction back
        assert not queue.holds(raw) and queue.waiting() == 0
        # This engine waits 0 s for a turn (busy timeout 0): it goes through only if nobody holds it.
        with UnitOfWork(engine) as uow:
            uow.messages.append("s", "user", ending)
        assert [m["content"] for m in db.get_messages("s")] == [ending]
        conn.close()
    finally:
        db.close()
        engine.dispose()


# ------------------------------------------------------------------ processes


def _process_writer(path: str, tag: str, n: int, out: mp.Queue) -> None:
    try:
        db = SessionDB(path)
        barrier = threading.Barrier(4)
        failures: list[str] = []

        def writer(t: int) -> None:
            barrier.wait()
            for i in range(n):
                try:
                    db.append_message(f"{tag}-{t}", "user", f"{tag} {t} {i}")
                except errors.DatabaseLockedError as exc:  # another process held it past the budget
                    failures.append(repr(exc))

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        db.close()
        out.put((tag, failures))
    except BaseException as exc:
        out.put((tag, [repr(exc)]))


def test_two_processes_of_four_threads_write_every_row(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        for tag in ("a", "b"):
            for t in range(4):
                db.create_session(f"{tag}-{t}", "cli")
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_process_writer, args=(str(path), tag, APPENDS, out)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    assert results == {"a": [], "b": []}
    assert _rows(path) == {f"{tag}-{t}": (APPENDS, APPENDS) for tag in ("a", "b") for t in range(4)}


# ------------------------------------------------------------------ async


def test_an_async_writer_waits_in_line_as_a_task(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    engine = create_engine(path)
    with SessionDB(path) as db:
        db.create_session("s", "cli")
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with UnitOfWork(engine) as uow:
            uow.messages.append("s", "user", "thread")
            holding.set()
            done.wait(60)

    async def main() -> tuple[int, list[str]]:
        ticks = 0
        async with aio.AsyncSessionDB(path) as adb:
            await adb.append_message("s", "user", "warm")  # the store is open and warm
            holder = threading.Thread(target=hold)
            holder.start()
            assert await asyncio.to_thread(holding.wait, 60)
            writing = asyncio.ensure_future(adb.append_message("s", "user", "task"))
            # The loop keeps running while the task waits in line behind the thread.
            while write_queue.for_file(path).waiting() == 0:
                await asyncio.sleep(0.001)
            for _ in range(20):
                await asyncio.sleep(0.001)
                ticks += 1
            assert not writing.done()
            done.set()
            await writing
            await asyncio.to_thread(holder.join, 60)
            contents = [m["content"] for m in await adb.get_messages("s")]
        return ticks, contents

    try:
        ticks, contents = asyncio.run(main())
    finally:
        done.set()
        engine.dispose()
    assert ticks == 20
    assert contents == ["warm", "thread", "task"]


def test_a_forked_child_starts_with_free_queues(tmp_path: Path) -> None:
    queue = write_queue.for_file(tmp_path / "forked.db")
    owner = object()
    assert queue.take(owner, 1.0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the turn held by the parent's thread is not held here
        ok = queue.take(object(), 0.0)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    queue.release(owner)
    assert got == b"1"


def test_eight_tasks_on_one_async_store_are_written_together_and_exactly(tmp_path: Path) -> None:
    """The async face batches too: tasks of one loop appending to one store wait on the
    loop (not a thread) while one of them writes the batch; one task whose appends fail
    after their counter update (no role) loses only its own rows."""
    path = tmp_path / "state.db"
    sizes: list[int] = []

    async def main() -> tuple[dict[str, tuple[int, int]], int]:
        async with aio.AsyncSessionDB(path) as db:
            for t in range(THREADS):
                await db.create_session(f"t{t}", "cli")
            real = db._db._batcher._lead  # type: ignore[union-attr]

            def lead(write, pause):  # records the size of each batch written
                return real(lambda jobs: (sizes.append(len(jobs)), write(jobs))[1], pause)

            db._db._batcher._lead = lead  # type: ignore[union-attr]
            failed = 0

            async def writer(t: int) -> None:
                nonlocal failed
                for i in range(APPENDS):
                    try:
                        await db.append_message(f"t{t}", None if t == 0 else "user", f"{t} {i}")
                    except Exception:
                        if t != 0:
                            raise
                        failed += 1

            await asyncio.gather(*(writer(t) for t in range(THREADS)))
            return _rows(path), failed

    rows, failed = asyncio.run(main())
    assert failed == APPENDS
    assert rows == {"t0": (0, 0), **{f"t{t}": (APPENDS, APPENDS) for t in range(1, THREADS)}}
    assert sum(sizes) >= (THREADS - 1) * APPENDS  # every acknowledged append went through a batch
    assert max(sizes) > 1  # tasks waiting on the loop were written together


def test_a_forked_child_starts_with_a_fresh_batcher() -> None:
    """A store's batcher forked while a parent's thread led a batch: the child's writes do
    not wait for a leader that does not exist there."""
    batcher = write_queue.Batcher()
    batcher._leading = True  # as at a fork during a parent's batch

    def write(jobs: list[write_queue.Job]) -> None:
        for job in jobs:
            job.result, job.error = job.run(None), None

    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            got = batcher.submit(lambda _: "child", write, 0.5, lambda: errors.DatabaseLockedError("waited"))
            os.write(write_end, b"1" if got == "child" else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert batcher._leading  # the parent's own state is untouched
