"""The short-CJK bigram index must give exactly what a plain substring scan gives.

Random CJK text from a small alphabet (so 2-character terms collide often), written
by us and behind our back by "Hermes" (plain SQL outside the library: inserts,
updates, deletes, an explicit old id), checked against a brute-force scan, with both
search strategies, on both backends (the dirty-block triggers are SQLite's own on one,
a PL/pgSQL function on the other).
"""

from __future__ import annotations

import random
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event, text

from hermes_store import SessionDB
from hermes_store.repositories import search as search_mod
from hermes_store.dialects import cjk_bigram as bigram
from hermes_store.dialects import cjk_bigram as bigram_upkeep

pytestmark = pytest.mark.both_backends

ALPHABET = "数据库迁移测试完成通信我们한글テスト"


def rand_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.7:
            parts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6))))
        else:
            parts.append(rng.choice(["deploy", "Agent", "100%", "x_y", "ok"]))
    return rng.choice(["", " "]).join(parts)


def brute(db: SessionDB, term: str) -> set[int]:
    low = term.lower()
    out = set()
    with db.engine.connect() as conn:
        for mid, *texts in conn.execute(text("SELECT id, content, tool_name, tool_calls FROM messages")):
            if any(t is not None and low in t.lower() for t in texts):
                out.add(mid)
    return out


def scalar(db: SessionDB, sql: str) -> Any:
    with db.engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


@contextmanager
def behind_our_back(db: SessionDB, backend: str) -> Iterator[Any]:
    """One transaction of "Hermes" writing without the library: plain sqlite3 on the
    file, or a plain SQLAlchemy engine of its own on the server. Yields
    ``run(sql, **params)`` (``:name`` parameters on both)."""
    if backend == "sqlite":
        raw = sqlite3.connect(db.db_path, isolation_level=None)
        try:
            raw.execute("BEGIN")
            yield lambda sql, **params: raw.execute(sql, params)
            raw.execute("COMMIT")
        finally:
            raw.close()
        return
    engine = sa_create_engine(db.engine.url)
    try:
        with engine.begin() as conn:
            yield lambda sql, **params: conn.execute(text(sql), params)
    finally:
        engine.dispose()


@pytest.fixture(params=["blocks", "scan", "auto"])
def strategy(request, monkeypatch):
    if request.param == "blocks":
        monkeypatch.setattr(bigram, "estimate_blocks", lambda conn, grams, **_: 0)
    elif request.param == "scan":
        monkeypatch.setattr(bigram, "estimate_blocks", lambda conn, grams, **_: 10**9)
    return request.param


def test_index_matches_substring_scan(db: SessionDB, backend: str, strategy: str) -> None:
    rng = random.Random(7)
    for s in range(6):
        db.create_session(f"s{s}", "cli")
    rows = [{"session_id": f"s{i % 6}", "role": rng.choice(["user", "assistant", "tool"]), "content": rand_text(rng),
             "tool_name": rng.choice([None, "终端", "web"])} for i in range(300)]
    for row in rows[:60]:  # one by one (each append extends the index) ...
        db.append_message(row["session_id"], row["role"], row["content"], tool_name=row["tool_name"])
    db.append_messages(rows[60:])  # ... and in bulk (it does not)
    db.append_messages([{"session_id": "s1", "role": "user", "content": rand_text(rng)} for _ in range(200)])
    db.index_search()
    assert db.wait_for_upkeep(60)  # the catch-up the appends made due has run: nothing moves below
    with db.engine.connect() as c:
        hw = bigram.high_water(c)
    assert hw == scalar(db, "SELECT max(id) FROM messages")
    # Hermes writes behind our back: new rows, edits and deletes of indexed rows,
    # and one row re-inserted with an explicit id below the high-water mark.
    with behind_our_back(db, backend) as run:
        for _ in range(40):
            run("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s2', 'user', :c, 1.0)",
                c=rand_text(rng))
        for mid in rng.sample(range(1, hw), 40):
            run("UPDATE messages SET content = :c WHERE id = :id", c=rand_text(rng), id=mid)
        gone = rng.sample(range(1, hw), 30)
        for mid in gone:
            run("DELETE FROM messages WHERE id = :id", id=mid)
        run("INSERT INTO messages (id, session_id, role, content, timestamp) VALUES (:id, 's3', 'tool', :c, 2.0)",
            id=gone[0], c="迁移测试 revived 骆驼")
        # pairs that exist nowhere else, so only the dirty-block bookkeeping can find them
        run("UPDATE messages SET content = '鲸鱼 edited' WHERE id = :id", id=hw // 2)
        run("UPDATE messages SET tool_name = '海豚' WHERE id = :id", id=hw // 3)
    assert scalar(db, "SELECT count(*) FROM messages_cjk_bigram_dirty") > 0
    terms = ["数据", "迁移", "测试", "完成", "通信", "한글", "テス", "数", "据库迁", "Agent通信", "100%完成",
             "库数", "我们我们", "移测", "终端", "骆驼", "鲸鱼", "海豚"]
    terms += ["".join(rng.choice(ALPHABET) for _ in range(2)) for _ in range(25)]

    def check() -> None:
        for term in terms:
            got = {h["id"] for h in db.search_messages(term, limit=100000)}
            assert got == brute(db, term), term

    check()  # dirty blocks and the unindexed tail are scanned
    assert db.index_search() > 0
    check()  # after catching up
    with db.engine.connect() as c:
        assert bigram_upkeep.pending(c) == 0
    db.rebuild_fts()
    check()


def test_bigram_extraction() -> None:
    assert bigram.bigrams("数据库 ab 迁移") == {"数据", "据库", "迁移"}
    assert bigram.bigrams("a数b") == set()
    assert bigram.term_bigrams("Agent通信") == ["通信"]
    assert bigram.term_bigrams("数") == []
    assert bigram.bigrams(None) == set()


@pytest.mark.parametrize("mark", ["garbage", "", "12abc", "1_000", "١٢", "99999999999999999999"])
def test_unreadable_high_water_means_scan_everything(db: SessionDB, mark: str) -> None:
    """A mark that does not read as a number counts as -1 (everything is scanned), and
    writes go on: on PostgreSQL the dirty-block trigger once failed every insert on it."""
    db.create_session("s", "cli")
    mid = db.append_message("s", "user", "数据中心")
    db.index_search()
    db.set_meta(bigram.HIGH_WATER_KEY, mark)
    with db.engine.connect() as c:
        assert bigram.high_water(c) == -1
    assert [h["id"] for h in db.search_messages("数据")] == [mid]
    later = db.append_message("s", "user", "数据库")
    assert [h["id"] for h in db.search_messages("数据")] == [later, mid]


def test_high_water_reads_plain_numbers_only() -> None:
    assert [bigram.parse_high_water(v) for v in ("12", " 12\n", "-1", "+7", None, 12, "1e3", "0x10")] == [
        12, 12, -1, 7, -1, -1, -1, -1]


@contextmanager
def statements(db: SessionDB, *, this_thread: bool = False) -> Iterator[list[str]]:
    """Every SQL statement the store sends meanwhile (``this_thread``: only the calling
    thread's, not its upkeep thread's)."""
    seen: list[str] = []
    me = threading.current_thread()

    def listen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not this_thread or threading.current_thread() is me:
            seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", listen)


def test_pair_counts_are_read_once_per_index_state(db: SessionDB) -> None:
    """The short-CJK cost estimate reads a pair's count once: later searches reuse it
    until the index moves on, and then read it again."""
    db.create_session("s", "cli")
    db.append_messages([{"session_id": "s", "role": "user", "content": f"常见 {i} 罕见" if i % 50 == 0 else f"常见 {i}"}
                        for i in range(400)])
    db.index_search()

    def counts_read(term: str) -> int:
        with statements(db) as seen:
            assert db.search_messages(term, limit=5)
        return sum(1 for sql in seen if "GROUP BY gram" in sql and bigram.TABLE in sql)  # the pair counts

    assert counts_read("罕见") == 1
    assert counts_read("罕见") == 0  # the same index: the estimate is reused
    assert counts_read("常见 OR 罕见") == 1  # only the pair not seen yet ...
    db.append_message("s", "user", "罕见 again")
    db.index_search()
    assert counts_read("罕见") == 1  # ... and again once the index moved on


def test_delegated_sessions_are_read_once_per_search(db: SessionDB, backend: str) -> None:
    """v30 leaves sessions delegated from others out of the CJK routes. SQLite decides
    it inside the query; PostgreSQL reads those sessions once per search, whatever the
    route (substring scan, candidate blocks plus unindexed tail, tool rows)."""
    db.create_session("parent", "cli")
    db.create_session("child", "cli", model_config={"_delegate_from": "parent"})
    db.append_messages([{"session_id": sid, "role": "user", "content": f"数据库 {sid} {i}"}
                        for i in range(100) for sid in ("parent", "child")])
    db.index_search()
    db.append_message("parent", "user", "数据 tail")
    for query in ("数据库", "数据", "据库 OR 数据"):
        with statements(db) as seen:
            hits = db.search_messages(query, limit=500)
        assert hits and {h["session_id"] for h in hits} == {"parent"}
        reads = sum(1 for sql in seen if "_delegate" in sql and "model_config LIKE" in sql)
        assert reads == (1 if backend == "postgresql" else 0), (query, seen)


def test_strategy_choice_uses_estimate(db: SessionDB, monkeypatch) -> None:
    """Rare terms take the index, common ones the early-stopping scan."""
    seen: list[bool] = []
    real = search_mod.SearchRepository._substring_select

    def spy(self, groups, filters, params, window, **kw):
        sql, is_flat = real(self, groups, filters, params, window, **kw)
        seen.append(is_flat)
        return sql, is_flat

    monkeypatch.setattr(search_mod.SearchRepository, "_substring_select", spy)
    db.create_session("s", "cli")
    db.append_messages([{"session_id": "s", "role": "user", "content": f"常见 filler {i}"} for i in range(3000)]
                       + [{"session_id": "s", "role": "user", "content": "罕见 once"}])
    assert len(db.search_messages("常见")) == 20  # not indexed yet: the early-stopping scan
    assert seen == [True]
    db.index_search()
    seen.clear()
    assert len(db.search_messages("罕见")) == 1
    assert len(db.search_messages("常见")) == 20
    assert seen == [False, True]
