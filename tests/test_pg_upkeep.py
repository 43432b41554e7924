"""Index upkeep off the caller's path, by one owner at a time, never ahead of a writer.

On a server many processes append side by side. Shown here, with the faults injected:

* the append that makes upkeep due returns while the catch-up is still blocked (it runs
  on the store's upkeep thread), and the catch-up then happens;
* while another process holds the upkeep lock, a store's catch-up skips at once (no
  wait, nothing indexed twice) and the appends go on;
* a row whose transaction commits after a later row was indexed (a delayed second
  writer) is still found, and the high-water mark never passes it while it is open;
* SQLite keeps doing its catch-up after the write, as before (one writer at a time);
* an append is one statement carrying its own lock budget, which ends with it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import text

from hermes_store import SessionDB, errors, facade
from hermes_store.upkeep import Upkeep
from hermes_store.dialects.pg_tenants import try_transaction_lock
from hermes_store.repositories.messages import MessageRepository
from hermes_store.dialects import cjk_bigram as bigram
from hermes_store.dialects import cjk_bigram as bigram_upkeep


@pytest.fixture
def pg(pg_database: str) -> Iterator[SessionDB]:
    with SessionDB(pg_database) as db:
        db.create_session("s", "cli")
        db.create_session("t", "cli")
        yield db


def _high_water(db: SessionDB) -> int:
    with db.engine.connect() as c:
        return bigram.high_water(c)


def _due(db: SessionDB) -> None:
    """Make the next write the one that makes upkeep due."""
    db._writes = facade.CHECKPOINT_EVERY - 1


def test_the_due_append_returns_before_its_catch_up_runs(pg: SessionDB, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()
    real = bigram_upkeep.catch_up

    def slow(conn, limit=None):  # type: ignore[no-untyped-def]
        entered.set()
        assert release.wait(30)
        return real(conn, limit)

    monkeypatch.setattr(bigram_upkeep, "catch_up", slow)
    _due(pg)
    start = time.monotonic()
    mid = pg.append_message("s", "user", "数据 one")
    assert entered.wait(10)  # the catch-up started, on another thread ...
    assert time.monotonic() - start < 10 and threading.current_thread().name == "MainThread"
    assert [h["id"] for h in pg.search_messages("数据")] == [mid]  # ... and nobody waits for it
    assert _high_water(pg) < mid
    release.set()
    assert pg.wait_for_upkeep(30)
    assert _high_water(pg) == mid


def test_a_held_upkeep_lock_is_skipped_not_waited_for(pg: SessionDB, pg_database: str) -> None:
    """Another process is catching up (holds the lock): ours skips in one round trip."""
    other = sa_create_engine(pg_database)
    try:
        with other.connect() as holder:
            holder.begin()
            assert try_transaction_lock(holder, "cjk-bigram", "")
            ids = []
            start = time.monotonic()
            for i in range(3 * facade.CHECKPOINT_EVERY):
                ids.append(pg.append_message("s", "user", f"数据 {i}"))
            assert pg.wait_for_upkeep(30)
            assert time.monotonic() - start < 20
            assert _high_water(pg) < ids[0]  # every catch-up skipped
            assert pg._catch_up_search_index() == 0
            found = {h["id"] for h in pg.search_messages("数据", limit=1000)}
            assert found == set(ids)  # the unindexed tail is scanned
            holder.rollback()
        assert pg._catch_up_search_index() == len(ids)  # the lock is free again
        assert _high_water(pg) == ids[-1]
    finally:
        other.dispose()


def test_a_delayed_writer_below_the_mark_is_never_lost(pg: SessionDB) -> None:
    """Writer A draws id X and commits late; B's X+1 commits first and is caught up."""
    with pg.engine.connect() as a:
        a.begin()
        late = MessageRepository(a).append("t", "user", "鲸鱼 came late")
        early = pg.append_message("s", "user", "数据 early")
        assert early > late
        pg.index_search()  # catch up while A is still open
        hw = _high_water(pg)
        assert hw < late  # never past an id whose row may still appear
        a.commit()
    assert [h["id"] for h in pg.search_messages("鲸鱼")] == [late]
    pg.index_search()  # A has ended: its note settles, the mark moves past both rows
    assert _high_water(pg) == early
    with pg.engine.connect() as c:
        assert bigram_upkeep.pending(c) == 0
        blocks = set(c.execute(text("SELECT block FROM messages_cjk_bigram WHERE gram = '鲸鱼'")).scalars())
    assert blocks == {late // bigram.BLOCK}
    assert [h["id"] for h in pg.search_messages("鲸鱼")] == [late]


def test_the_note_survives_junk() -> None:
    assert bigram_upkeep._read_note("garbage") == (-1, None, [])
    assert bigram_upkeep._read_note("12 :") == (12, None, [])
    assert bigram_upkeep._read_note("12 40:3/7,4/9") == (12, 40, ["3/7", "4/9"])
    assert bigram_upkeep._read_note(None) == (-1, None, [])


def test_sqlite_catches_up_off_the_callers_path_too(tmp_path: Path) -> None:
    """Issue 32: on a file too the catch-up runs on the store's upkeep thread (waiting
    for its turn among the file's writers), not inside the append that made it due."""
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        _due(db)
        mid = db.append_message("s", "user", "数据")
        assert db._upkeep._thread is not None  # handed to the upkeep thread
        assert db.wait_for_upkeep(60)
        assert _high_water(db) == mid


def test_a_one_statement_append_keeps_its_lock_budget(pg: SessionDB, pg_database: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The append is one round trip, its lock budget inside the statement: behind a row
    lock held elsewhere it gives up at the budget, and the setting ends with it."""
    monkeypatch.setattr(facade, "_TRANSCRIPT_WRITE_PATIENCE_S", 1.0)
    pg.append_message("s", "user", "warm")
    other = sa_create_engine(pg_database)
    try:
        with other.connect() as holder:
            holder.begin()
            holder.execute(text("SELECT 1 FROM sessions WHERE id = 's' FOR UPDATE"))
            start = time.monotonic()
            with pytest.raises(errors.DatabaseLockedError):
                pg.append_message("s", "user", "behind a lock")
            assert 0.9 < time.monotonic() - start < 8
            holder.rollback()
    finally:
        other.dispose()
    assert pg.append_message("s", "user", "free again") > 0
    assert [m["content"] for m in pg.get_messages("s")] == ["warm", "free again"]
    assert pg.get_session("s")["message_count"] == 2
    conn = pg._idle[True][-1]  # the kept writer: the statement's setting did not outlive it
    assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "0"
    conn.rollback()


def test_a_forked_child_runs_its_own_upkeep() -> None:
    """After a fork the parent's worker thread is gone; the child's first job starts one."""
    upkeep = Upkeep("fork test")
    ran = threading.Event()
    upkeep.submit("first", ran.set)
    assert ran.wait(10) and upkeep.wait_idle(10)
    pid = os.fork()
    if pid == 0:  # the child: its job must run, or it exits 1
        done = threading.Event()
        upkeep.submit("in the child", done.set)
        os._exit(0 if done.wait(10) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    upkeep.close()
