"""The async store on SQLite goes to aiosqlite's thread once per call (issue 32).

A trip to the driver's thread and back (a "hop") costs two thread wake-ups, about what a
short statement costs, so a call's work on its connection runs there whole
(``OneHopConnection.run_whole``): these tests count the hops and check that moving the
work changed nothing a caller can see (results, errors, cancellation, the write turn).
No timing is measured.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hermes_store import aio, errors
from hermes_store.aio import sessiondb

from .test_aio_engine import _count_hops


async def _warm(db: aio.AsyncSessionDB) -> None:
    await db.create_session("s", "cli")
    await db.append_message("s", "user", "warm-up about kubernetes 数据库")
    await db.wait_for_upkeep()


def test_an_append_runs_on_the_loop_and_each_read_is_one_hop(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An append nobody else's lock stands in the way of is written on the loop's own
    thread (no hop: run_whole's ``here``); a read goes to the driver's thread once."""
    async def run() -> None:
        async with aio.AsyncSessionDB(tmp_path / "one.db") as db:
            await _warm(db)
            hops = _count_hops(monkeypatch)
            new_id = await db.append_message("s", "assistant", "kubernetes answer 数据")
            assert hops == [], hops
            reads = {
                "messages": lambda: db.get_messages("s"),
                "search": lambda: db.search_messages("kubernetes"),
                "short CJK search": lambda: db.search_messages("数据"),
                "listing": lambda: db.list_sessions_rich(limit=20),
                "conversation": lambda: db.get_messages_as_conversation("s"),
            }
            for name, read in reads.items():
                await read()  # the first read may open the reader's connection (set up in hops of its own)
                hops.clear()
                result = await read()
                assert len(hops) == 1, (name, hops)
                assert result, name
            assert [m["id"] for m in await db.get_messages("s")][-1] == new_id
            assert (await db.get_session("s"))["message_count"] == 2

    asyncio.run(run())


def test_a_write_of_several_statements_is_one_hop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its statements and its COMMIT in one hop; a failing one is rolled back whole."""
    async def run() -> None:
        async with aio.AsyncSessionDB(tmp_path / "two.db") as db:
            await _warm(db)
            hops = _count_hops(monkeypatch)
            await db.set_session_title("s", "a title")
            assert len(hops) == 1, hops
            hops.clear()
            await db.create_session("child", "cli", parent_session_id="s")
            assert len(hops) == 1, hops
            assert await db.get_session_title("s") == "a title"
            assert (await db.get_session("child"))["parent_session_id"] == "s"
            with pytest.raises(errors.HermesStoreError):
                await db.set_session_title("child", "a title")  # titles are unique: nothing of it is written
            assert await db.get_session_title("child") is None
            await db.set_session_title("child", "its own title")  # the write turn was given back
            assert await db.get_session_title("child") == "its own title"

    asyncio.run(run())


@pytest.mark.parametrize("here", [False, True], ids=["on the driver's thread", "on the loop"])
def test_concurrent_appends_go_in_batches_of_one_hop_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          here: bool) -> None:
    """8 tasks appending at once. Where appends hop, each batch (its jobs and COMMIT) is
    one hop, so there are fewer hops than appends. Where they run on the loop's thread,
    none hops, and a batch holds what waited while its transaction began. Every row
    and counter is exact either way."""
    from hermes_store.aio import engine

    monkeypatch.setattr(engine, "RUN_SHORT_WRITES_HERE", here)
    tasks, per_task = 8, 25

    async def run() -> None:
        async with aio.AsyncSessionDB(tmp_path / "batch.db") as db:
            for i in range(tasks):
                await db.create_session(f"t{i}", "cli")
            await db.wait_for_upkeep()
            hops = _count_hops(monkeypatch)
            batches: list[int] = []
            write_jobs = sessiondb._write_jobs

            def counted(conn: Any, transaction: Any, pending: list[Any]) -> Any:
                batches.append(len(pending))
                return write_jobs(conn, transaction, pending)

            monkeypatch.setattr(sessiondb, "_write_jobs", counted)

            async def writer(i: int) -> list[int]:
                return [await db.append_message(f"t{i}", "user", f"task {i} message {n}") for n in range(per_task)]

            ids = await asyncio.gather(*(writer(i) for i in range(tasks)))
            appends = [h for h in hops if h == "whole_call"]
            assert sum(batches) == tasks * per_task
            if here:
                assert appends == [], appends
            else:
                assert len(appends) == len(batches) < tasks * per_task, (len(appends), batches)
            assert len({i for batch in ids for i in batch}) == tasks * per_task
            for i in range(tasks):
                rows = await db.get_messages(f"t{i}")
                assert [r["id"] for r in rows] == ids[i]
                assert [r["content"] for r in rows] == [f"task {i} message {n}" for n in range(per_task)]
                assert (await db.get_session(f"t{i}"))["message_count"] == per_task

    asyncio.run(run())


def test_an_append_behind_another_connections_write_lock_waits_off_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer outside this store (another process's, here a plain sqlite3 connection)
    holds the file's write lock: the append does not sleep on the loop's thread. It goes
    to the driver's thread, where SQLite's busy handler waits; meanwhile the loop runs
    other tasks, and the row is written, exact, once the lock is let go."""
    import sqlite3
    import threading

    path = tmp_path / "held.db"

    async def run() -> None:
        async with aio.AsyncSessionDB(path) as db:
            await _warm(db)
            hops = _count_hops(monkeypatch)
            other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            other.execute("BEGIN IMMEDIATE")
            let_go = threading.Event()
            releaser = threading.Thread(target=lambda: (let_go.wait(30), other.execute("COMMIT")))
            releaser.start()
            ticks = 0
            append = asyncio.ensure_future(db.append_message("s", "user", "after the other writer"))
            try:
                while not append.done() and ticks < 5:
                    await asyncio.sleep(0.01)
                    ticks += 1
                assert not append.done()  # waiting for the lock, and the loop still turns
            finally:
                let_go.set()
            new_id = await append
            releaser.join()
            other.close()
            assert ticks == 5
            assert "whole_call" in hops  # it went to the driver's thread
            rows = await db.get_messages("s")
            assert [r["content"] for r in rows][-1] == "after the other writer" and rows[-1]["id"] == new_id
            assert (await db.get_session("s"))["message_count"] == len(rows)
            hops.clear()
            await db.append_message("s", "user", "free again")  # and back on the loop
            assert hops == [], hops

    asyncio.run(run())


def test_a_failing_append_in_a_batch_fails_alone(tmp_path: Path) -> None:
    """An append to an unknown session, batched with others: its caller gets the typed
    error, the others' rows are written."""
    async def run() -> None:
        async with aio.AsyncSessionDB(tmp_path / "fail.db") as db:
            for i in range(4):
                await db.create_session(f"t{i}", "cli")
            calls = [db.append_message(f"t{i}", "user", f"m{i}") for i in range(4)]
            calls.insert(2, db.append_message("nobody", "user", "lost"))
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert isinstance(outcomes[2], errors.UnknownSessionError), outcomes
            assert all(isinstance(o, int) for k, o in enumerate(outcomes) if k != 2), outcomes
            for i in range(4):
                assert [m["content"] for m in await db.get_messages(f"t{i}")] == [f"m{i}"]
            assert await db.get_session("nobody") is None

    asyncio.run(run())


def test_a_caller_cancelled_during_its_hop_is_cancelled_and_nothing_is_half_done(tmp_path: Path) -> None:
    """The cancellation reaches the caller once the work on the driver's thread has
    ended (the loop never touches the connection while that thread drives it): the
    append is whole or absent, counters agree, and the write turn is free again."""
    async def run() -> None:
        async with aio.AsyncSessionDB(tmp_path / "cancel.db") as db:
            await _warm(db)
            cancelled = 0
            for turns in range(12):
                task = asyncio.ensure_future(db.append_message("s", "user", f"cancel after {turns} turns"))
                for _ in range(turns % 4):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
            assert cancelled > 0
            session = await db.get_session("s")
            assert session["message_count"] == len(await db.get_messages("s"))
            await asyncio.wait_for(db.set_session_title("s", "after"), timeout=30)
            assert await db.get_session_title("s") == "after"
            # a cancelled read ends its snapshot too: the next write is not blocked by it
            task = asyncio.ensure_future(db.search_messages("kubernetes"))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await db.append_message("s", "user", "after the cancelled read") > 0
            assert db.engine is not None and db.engine.sync_engine.pool.checkedout() <= 8

    asyncio.run(run())


def test_a_write_turn_held_elsewhere_still_ends_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The BEGIN is made on the loop (where waiting for the file's turn can await): a turn
    held by another writer of this process past the budget is a DatabaseLockedError."""
    from hermes_store import facade, write_queue

    async def run() -> None:
        async with aio.AsyncSessionDB(tmp_path / "turn.db") as db:
            await _warm(db)
            queue = write_queue.for_file(tmp_path / "turn.db")
            holder = object()
            assert queue.take(holder, 1.0)
            try:
                monkeypatch.setattr(facade, "TRANSCRIPT_BUDGET_S", 0.3)
                with pytest.raises(errors.DatabaseLockedError):
                    await db.append_message("s", "user", "blocked")
                # a leader waiting for the turn, and followers waiting for it on their
                # signals: each gives up typed when its budget ends
                outcomes = await asyncio.gather(*(db.append_message("s", "user", f"blocked {i}") for i in range(3)),
                                                return_exceptions=True)
                assert all(isinstance(o, errors.DatabaseLockedError) for o in outcomes), outcomes
            finally:
                queue.release(holder)
            assert await db.append_message("s", "user", "free again") > 0
            assert [m["content"] for m in await db.get_messages("s")][-2:] == [
                "warm-up about kubernetes 数据库", "free again"]

    asyncio.run(run())


def test_run_sync_reuses_its_greenlets_and_keeps_greenlet_spawn_semantics() -> None:
    """aio.run_sync runs calls on greenlets it keeps (not a new one per call, as SQLAlchemy's
    greenlet_spawn): what a caller sees stays the same: results, errors, the task's
    context variables, cancellation thrown into the call, nesting, calls side by side."""
    import contextvars

    import greenlet
    from sqlalchemy.util import await_only

    who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")

    def here() -> Any:
        return greenlet.getcurrent()

    def fails() -> None:
        raise errors.InvalidInputError("from inside")

    def waits_then_reads(seconds: float) -> str:
        await_only(asyncio.sleep(seconds))
        return who.get()

    async def inner() -> str:
        return await aio.run_sync(lambda: "nested " + who.get())

    def nests() -> str:
        return await_only(inner())

    seen: list[str] = []

    def cancelled_inside() -> None:
        try:
            await_only(asyncio.sleep(30))
        except asyncio.CancelledError:
            seen.append("cancelled inside")
            raise

    async def as_task(name: str) -> tuple[str, Any]:
        who.set(name)
        value = await aio.run_sync(waits_then_reads, 0.01)
        return value, await aio.run_sync(here)

    async def run() -> None:
        first = await aio.run_sync(here)
        assert await aio.run_sync(here) is first  # the same greenlet, reused
        assert first is not greenlet.getcurrent()
        with pytest.raises(errors.InvalidInputError, match="from inside"):
            await aio.run_sync(fails)
        assert await aio.run_sync(here) is first  # an error does not cost the greenlet
        assert await aio.run_sync(lambda a, *, b: a + b, 1, b=2) == 3

        who.set("loop")
        assert await aio.run_sync(nests) == "nested loop"

        outcomes = await asyncio.gather(as_task("a"), as_task("b"), as_task("c"))
        assert [value for value, _g in outcomes] == ["a", "b", "c"]  # each task's own context

        side_by_side: list[Any] = []

        def holds() -> None:
            side_by_side.append(greenlet.getcurrent())
            await_only(asyncio.sleep(0.01))

        await asyncio.gather(*(aio.run_sync(holds) for _ in range(3)))
        assert len({id(g) for g in side_by_side}) == 3  # calls in flight at once never share one

        task = asyncio.ensure_future(aio.run_sync(cancelled_inside))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled inside"]
        assert await aio.run_sync(lambda: who.get()) == "loop"

    asyncio.run(run())
