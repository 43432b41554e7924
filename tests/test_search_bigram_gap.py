"""Rows appended since the short-CJK index last caught up are found at once, cheaply.

The bigram index covers ids up to its high-water mark; rows above it (written by us
or by Hermes since the last catch-up, which runs as upkeep, never on a search) must
still be found by a 2-character CJK search, with exactly what a LIKE scan gives, in
the same order and page. And a term the index holds nowhere must be looked for in
that tail alone (its primary-key range), not by walking every message.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import text

from hermes_store import SessionDB
from hermes_store.dialects import cjk_bigram
from hermes_store.repositories import search as search_mod

pytestmark = pytest.mark.both_backends


def _high_water(db: SessionDB) -> int:
    with db.engine.connect() as conn:
        return cjk_bigram.high_water(conn)


def _like_scan(db: SessionDB, term: str) -> list[int]:
    """What a plain LIKE scan gives: every row holding ``term`` in content, tool name or
    tool calls, newest first (timestamp, then id)."""
    with db.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT id FROM messages WHERE content LIKE :p OR tool_name LIKE :p OR tool_calls LIKE :p"
            " ORDER BY timestamp DESC, id DESC"), {"p": f"%{term}%"}).scalars().all()
    return list(rows)


def _append_behind_our_back(db: SessionDB, backend: str, rows: list[tuple[str, str, float]]) -> list[int]:
    """Hermes appending with its own SQL (no catch-up of ours can follow); returns the ids."""
    if backend == "sqlite":
        assert db.db_path is not None
        engine = sa_create_engine(f"sqlite:///{db.db_path}")
    else:
        engine = sa_create_engine(db.engine.url)
    ids = []
    try:
        with engine.begin() as conn:
            for sid, content, ts in rows:
                conn.execute(text("INSERT INTO messages (session_id, role, content, timestamp)"
                                  " VALUES (:s, 'user', :c, :t)"), {"s": sid, "c": content, "t": ts})
                ids.append(int(conn.execute(text("SELECT max(id) FROM messages")).scalar_one()))
    finally:
        engine.dispose()
    return ids


@pytest.fixture
def routes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each substring SELECT built was the newest-first walk (True) or the
    candidate blocks plus the tail's id range (False)."""
    seen: list[bool] = []
    real = search_mod.SearchRepository._substring_select

    def spy(self: Any, *args: Any, **kw: Any) -> tuple[str, bool]:
        sql, is_flat = real(self, *args, **kw)
        seen.append(is_flat)
        return sql, is_flat

    monkeypatch.setattr(search_mod.SearchRepository, "_substring_select", spy)
    return seen


def test_rows_above_the_high_water_mark_are_found_before_any_catch_up(
        db: SessionDB, backend: str, routes: list[bool]) -> None:
    db.create_session("s", "cli")
    db.create_session("t", "cli")
    db.append_messages([{"session_id": "s", "role": "user", "content": f"常见 filler {i}", "timestamp": 1000.0 + i}
                        for i in range(2000)])
    db.index_search()
    mark = _high_water(db)
    assert mark == 2000
    # Appended since the last catch-up: by Hermes' own SQL, and through the store.
    gap = _append_behind_our_back(db, backend, [("t", "鲸鱼 in the tail", 5000.0), ("s", "常见 tail", 5001.0),
                                                ("t", "old 鲸鱼 常见", 10.0)])
    # A tail long enough that counting it as hits (as the estimate once did) sends a
    # rare term on a walk of every message.
    _append_behind_our_back(db, backend, [("s", f"filler tail {i}", 4000.0 + i) for i in range(300)])
    gap.append(db.append_message("t", "assistant", "鲸鱼 常见 from the store"))
    assert _high_water(db) == mark < min(gap)  # nothing caught up: every one is in the gap

    # A term the index holds nowhere: found in the tail, every hit, in LIKE's order...
    rare = [h["id"] for h in db.search_messages("鲸鱼")]
    assert rare == _like_scan(db, "鲸鱼") and set(rare) == {gap[0], gap[2], gap[3]}
    # ... by the tail's id range and the (empty) candidate blocks, not a walk of all rows.
    assert routes == [False]

    # A common term: index hits and tail rows merged, in order, paged like the scan.
    expected = _like_scan(db, "常见")
    assert {gap[1], gap[2], gap[3]} <= set(expected)
    assert [h["id"] for h in db.search_messages("常见", limit=100000)] == expected
    assert [h["id"] for h in db.search_messages("常见", limit=5)] == expected[:5]
    assert [h["id"] for h in db.search_messages("常见", limit=7, offset=1995)] == expected[1995:2002]
    oldest = [h["id"] for h in db.search_messages("常见", limit=3, sort="oldest")]
    assert oldest == list(reversed(expected))[:3] and oldest[0] == gap[2]

    # Searching caught nothing up (that is upkeep's, off the caller's path); once it has,
    # the same answers.
    assert _high_water(db) == mark
    db.index_search()
    assert _high_water(db) == max(gap)
    assert [h["id"] for h in db.search_messages("鲸鱼")] == rare
    assert [h["id"] for h in db.search_messages("常见", limit=100000)] == expected


@pytest.mark.parametrize(("candidates", "high_water", "total", "walk"), [
    (0, 9000, 10000, False),  # held nowhere under the mark: read the 1,000-row tail only
    (0, 9999, 10000, False),
    (3000, 9000, 10000, True),  # common: the walk fills the page after a few dozen rows
    (64, 10000, 10000, False),  # rare and fully indexed: one block
    (0, -1, 10000, True),  # nothing indexed yet: no density to go by, walk as a LIKE scan does
    (0, 0, 0, True),
])
def test_walk_or_blocks(candidates: int, high_water: int, total: int, walk: bool) -> None:
    assert search_mod._walk_is_cheaper(candidates, high_water, total, 20) is walk
