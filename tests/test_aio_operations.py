"""``aio.operations``: the multi-transaction workflows awaited over an AsyncEngine give
what the sync operations give, and their waits on a locked file yield to the loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from hermes_store import aio, errors, migrations
from hermes_store.engine import create_engine
from hermes_store.operations import UnitOfWorkSteps, import_records

from .test_aio_concurrency import BlockingCalls
from .test_operations import dump, record


def _records() -> list[dict]:
    out = [record("child", 2.0, 3, parent="root"), record("root", 1.0, 2)]
    return out + [record(f"s{i}", 10.0 + i, 2) for i in range(5)]


def test_import_records_equals_the_sync_operation(tmp_path: Path) -> None:
    sync_db, async_db = tmp_path / "sync.db", tmp_path / "async.db"
    migrations.upgrade(sync_db)
    engine = create_engine(sync_db)
    try:
        expected = import_records(UnitOfWorkSteps(engine), _records(), batch=3)
    finally:
        engine.dispose()

    async def run() -> tuple:
        aengine = aio.create_async_engine(async_db)
        await aio.upgrade(aengine)
        try:
            first = await aio.operations.import_records(aengine, _records(), batch=3)
            again = await aio.operations.import_records(aengine, _records())
            indexed = await aio.operations.catch_up_search_index(aengine)
            return first, again, indexed
        finally:
            await aengine.dispose()

    first, again, indexed = asyncio.run(run())
    assert first == expected == (7, 0) and again == (0, 7) and indexed >= 0
    assert dump(async_db) == dump(sync_db)


def test_a_locked_file_is_waited_for_without_blocking_the_loop(tmp_path: Path) -> None:
    """The import meets another writer's lock, waits it out and commits; meanwhile no
    sleep ran on the loop's thread (outcomes only: no time is measured)."""
    db = tmp_path / "locked.db"
    migrations.upgrade(db)
    held, released = threading.Event(), threading.Event()

    def hold_the_write_lock(seconds: float) -> None:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        released.set()
        conn.execute("ROLLBACK")
        conn.close()

    async def run() -> tuple:
        engine = aio.create_async_engine(db, busy_timeout_ms=50)
        await aio.upgrade(engine)
        blocker = threading.Thread(target=hold_the_write_lock, args=(1.0,))
        blocker.start()
        held.wait(5)
        loop_thread = threading.get_ident()
        try:
            with BlockingCalls() as recorder:
                result = await aio.operations.import_records(engine, _records())
            waited = released.is_set()  # it could only commit once the lock was let go
        finally:
            blocker.join()
            await engine.dispose()
        return result, waited, recorder.on(loop_thread)

    result, waited, on_loop = asyncio.run(run())
    assert result == (7, 0)
    assert waited, "the import committed while another writer held the lock"
    assert "time.sleep" not in on_loop, "a wait for the lock slept on the event loop's thread"


def test_operations_refuse_a_sync_engine(tmp_path: Path) -> None:
    engine = create_engine(tmp_path / "s.db")
    try:
        with pytest.raises(errors.InvalidInputError, match="aio"):
            asyncio.run(aio.operations.import_records(engine, []))
    finally:
        engine.dispose()
