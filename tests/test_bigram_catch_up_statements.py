"""The periodic short-CJK catch-up in few statements, with the same index.

It runs after every 50 writes, so its fixed cost counts: shown here on both backends,

* a run reads the dirty blocks, both notes and the newest id in one statement, asks
  for the index table only until it has seen it, and writes both notes in one upsert;
  the rows it indexes are then found through the index;
* a run with nothing behind writes nothing (the notes stay as they were);
* a block made dirty behind our back is re-indexed from that one read;
* a table dropped after it was seen (a downgrade) fails one run, quietly for the
  writer, and the next run asks the database again instead of trusting the memory.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import pytest
from sqlalchemy import text

from hermes_store import SessionDB
from hermes_store.dialects import cjk_bigram as bigram

from .test_bigram import statements as all_statements

pytestmark = pytest.mark.both_backends


def statements(db: SessionDB) -> AbstractContextManager[list[str]]:
    """The statements this thread sends on the store's engine meanwhile."""
    return all_statements(db, this_thread=True)


def _rows(db: SessionDB, sql: str) -> list[tuple[Any, ...]]:
    with db.engine.connect() as c:
        return [tuple(r) for r in c.execute(text(sql))]


def _notes(db: SessionDB) -> list[tuple[Any, ...]]:
    return sorted(_rows(db, "SELECT key, value FROM state_meta WHERE key LIKE 'hermes_store.cjk_bigram%'"))


def _table_checks(seen: list[str]) -> int:
    return sum(1 for s in seen if "pg_class" in s or "sqlite_master" in s)


@pytest.fixture
def filled(db: SessionDB) -> tuple[SessionDB, list[int]]:
    """A store whose index is current, then 30 rows behind it (one write: no upkeep due)."""
    db.create_session("s", "cli")
    db.append_message("s", "user", "数据 first")
    assert db.wait_for_upkeep(30)
    db._catch_up_search_index()
    before = {r[0] for r in _rows(db, "SELECT id FROM messages")}
    db.append_messages([{"session_id": "s", "role": "user", "content": f"数据 {i} 完成"} for i in range(30)])
    ids = sorted({r[0] for r in _rows(db, "SELECT id FROM messages")} - before)
    assert len(ids) == 30
    return db, ids


def test_a_run_indexes_the_new_rows_in_few_statements(filled: tuple[SessionDB, list[int]], backend: str) -> None:
    db, ids = filled
    assert db.wait_for_upkeep(30)
    with statements(db) as seen:
        assert db._catch_up_search_index() == 30
    with db.engine.connect() as c:
        assert bigram.high_water(c) == ids[-1]
        assert bigram.pending(c) == 0
    assert _table_checks(seen) == 0  # seen once, at open: not asked again
    meta_reads = [s for s in seen if s.lstrip().upper().startswith("SELECT") and "state_meta" in s]
    meta_writes = [s for s in seen if s.lstrip().upper().startswith("INSERT INTO STATE_META")]
    # SQLite: the turn-sparing look first (one statement), then the catch-up's own read.
    assert len(meta_reads) == (2 if backend == "sqlite" else 1), seen
    assert len(meta_writes) == 1, seen
    if backend == "postgresql":
        # BEGIN, the upkeep lock, the first read, the writers, the tail, the pairs, the notes.
        assert len(seen) <= 7, seen
    hits = {h["id"] for h in db.search_messages("完成", limit=100)}
    assert hits == set(ids)


def test_nothing_behind_writes_nothing(filled: tuple[SessionDB, list[int]]) -> None:
    db, _ = filled
    assert db.wait_for_upkeep(30)
    db._catch_up_search_index()
    notes = _notes(db)
    with statements(db) as seen:
        assert db._catch_up_search_index() == 0
    assert _notes(db) == notes
    assert not [s for s in seen if s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))], seen


def test_a_dirty_block_is_indexed_again_from_the_first_read(filled: tuple[SessionDB, list[int]]) -> None:
    db, ids = filled
    assert db.wait_for_upkeep(30)
    db._catch_up_search_index()
    with db.engine.begin() as c:  # behind the library's back: the trigger marks the block
        c.execute(text("UPDATE messages SET content = '通信 changed' WHERE id = :i"), {"i": ids[3]})
    assert _rows(db, "SELECT count(*) FROM messages_cjk_bigram_dirty")[0][0] == 1
    assert db._catch_up_search_index() > 0
    assert _rows(db, "SELECT count(*) FROM messages_cjk_bigram_dirty")[0][0] == 0
    grams = {r[0] for r in _rows(db, f"SELECT gram FROM messages_cjk_bigram WHERE block = {ids[3] // bigram.BLOCK}")}
    assert "通信" in grams
    assert [h["id"] for h in db.search_messages("通信")] == [ids[3]]
    assert ids[3] not in {h["id"] for h in db.search_messages("完成", limit=100)}


def test_a_dropped_table_is_asked_for_again(filled: tuple[SessionDB, list[int]]) -> None:
    db, _ = filled
    assert db.wait_for_upkeep(30)
    with db.engine.connect() as c:
        assert bigram.seen_installed(c)
    with db.engine.begin() as c:  # a downgrade, behind the store's back
        c.execute(text("DROP TABLE messages_cjk_bigram"))
    assert db._catch_up_search_index() == 0  # fails (logged), never raises
    with statements(db) as seen:
        assert db._catch_up_search_index() == 0
    assert _table_checks(seen) == 1  # asked again, and no write was tried
    assert not [s for s in seen if "messages_cjk_bigram (" in s], seen
    mid = db.append_message("s", "user", "数据 after the drop")  # writes go on
    assert mid in {h["id"] for h in db.search_messages("数据", limit=100)}
