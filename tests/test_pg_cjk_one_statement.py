"""PostgreSQL's CJK routes in one statement (issue 32): the page reads the marks its plan
was chosen with (newest id, bigram high-water mark) and the sessions that may be
sub-agent transcripts, whose rows it holds back. These cases make the page not stand
and check that the answer is still the one a cold engine (marks read first, two
statements) gives: a session that only looks like a sub-agent's (malformed marker),
and a high-water mark that went down (the index rebuilt under a warm engine).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from hermes_store import SessionDB
from hermes_store.engine import create_engine
from hermes_store.repositories import SearchRepository
from hermes_store.search import cjk_pairs

from .statements import meter


@pytest.fixture
def store(pg_database: str) -> Iterator[SessionDB]:
    db = SessionDB(pg_database)
    db.create_session("a", "cli")
    db.create_session("b", "tui")
    db.create_session("deleg", "cli", model_config={"_delegate_from": "a"})
    rows: list[dict[str, Any]] = []
    for i in range(40):
        rows.append({"session_id": "a" if i % 2 else "b", "role": "user", "content": f"第{i}次 数据库迁移"})
    rows.append({"session_id": "deleg", "role": "user", "content": "sub-agent 数据库 rows"})
    db.append_messages(rows)
    db.index_search()
    yield db
    db.close()


def search(engine: Any, query: str, **kw: Any) -> tuple[int, list[tuple[int, str]]]:
    """(statements, (id, session) of the hits) of one search on an autocommit connection."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        m = meter.EngineMeter(engine, lambda: [conn])
        m.start()
        try:
            hits = SearchRepository(conn).search_messages(query, **kw)
        finally:
            m.stop()
    return m.count, [(h["id"], h["session_id"]) for h in hits]


def cold(store: SessionDB, query: str, **kw: Any) -> list[tuple[int, str]]:
    """The hits of an engine that has seen no marks yet (they are read first)."""
    engine = create_engine(store.engine.url)
    try:
        count, hits = search(engine, query, **kw)
    finally:
        engine.dispose()
    assert count >= 2  # marks first (and the schema caches of a new engine)
    return hits


@pytest.mark.parametrize("query", ["数据", "数据库"])
def test_warm_search_is_one_statement_with_the_cold_answer(store: SessionDB, query: str) -> None:
    engine = create_engine(store.engine.url)
    try:
        search(engine, query, limit=50)  # warm: marks and pair counts seen
        count, hits = search(engine, query, limit=50)
        assert count == 1
        assert hits == cold(store, query, limit=50)
        assert len(hits) == 40 and "deleg" not in {sid for _id, sid in hits}
        # A pair never counted is read with the marks first; from then on, one statement.
        assert search(engine, "冰箱") == (2, [])
        assert search(engine, "冰箱") == (1, [])
    finally:
        engine.dispose()


def test_session_that_only_looks_delegated_is_searched(store: SessionDB) -> None:
    engine = create_engine(store.engine.url)
    try:
        search(engine, "数据")
        store.create_session("bad", "cli", model_config={"note": "x"})
        with store.engine.begin() as conn:  # a marker as a substring, not as JSON
            conn.execute(text("UPDATE sessions SET model_config = :c WHERE id = 'bad'"),
                         {"c": '{"_delegate_from": broken'})
        store.append_messages([{"session_id": "bad", "role": "user", "content": "最新的 数据 行"}])
        count, hits = search(engine, "数据")
        assert count == 2  # the page held the session back: read again, knowing it is none
        assert hits[0][1] == "bad" and hits == cold(store, "数据")
        assert json.loads(store.get_session("deleg")["model_config"])["_delegate_from"] == "a"
        assert "deleg" not in {sid for _id, sid in hits}
    finally:
        engine.dispose()


def test_high_water_mark_gone_down(store: SessionDB) -> None:
    engine = create_engine(store.engine.url)
    try:
        search(engine, "数据库", limit=50)
        with store.engine.begin() as conn:  # the index emptied, as a rebuild starts
            conn.execute(text(f"DELETE FROM {cjk_pairs.TABLE}"))
            conn.execute(text("UPDATE state_meta SET value = '-1' WHERE key = :k"), {"k": cjk_pairs.HIGH_WATER_KEY})
        count, hits = search(engine, "数据库", limit=50)
        assert count >= 2  # the page built for the old mark does not stand
        assert len(hits) == 40 and hits == cold(store, "数据库", limit=50)
    finally:
        engine.dispose()
