"""The short-CJK bigram index must give exactly what a plain substring scan gives.

Random CJK text from a small alphabet (so 2-character terms collide often), written
by us and behind our back by "Hermes" (plain sqlite3: inserts, updates, deletes, an
explicit old id), checked against a brute-force scan, with both search strategies.
"""

from __future__ import annotations

import random
import sqlite3

import pytest

from hermes_store import SessionDB
from hermes_store.repositories import search as search_mod
from hermes_store.search import bigram

ALPHABET = "数据库迁移测试完成通信我们한글テスト"


def rand_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.7:
            parts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6))))
        else:
            parts.append(rng.choice(["deploy", "Agent", "100%", "x_y", "ok"]))
    return rng.choice(["", " "]).join(parts)


def brute(conn: sqlite3.Connection, term: str) -> set[int]:
    low = term.lower()
    out = set()
    for mid, *texts in conn.execute("SELECT id, content, tool_name, tool_calls FROM messages"):
        if any(t is not None and low in t.lower() for t in texts):
            out.add(mid)
    return out


@pytest.fixture(params=["blocks", "scan", "auto"])
def strategy(request, monkeypatch):
    if request.param == "blocks":
        monkeypatch.setattr(bigram, "estimate_blocks", lambda conn, grams: 0)
    elif request.param == "scan":
        monkeypatch.setattr(bigram, "estimate_blocks", lambda conn, grams: 10**9)
    return request.param


def test_index_matches_substring_scan(db: SessionDB, strategy: str) -> None:
    rng = random.Random(7)
    for s in range(6):
        db.create_session(f"s{s}", "cli")
    for i in range(300):
        db.append_message(f"s{i % 6}", rng.choice(["user", "assistant", "tool"]), rand_text(rng),
                          tool_name=rng.choice([None, "终端", "web"]))
    db.append_messages([{"session_id": "s1", "role": "user", "content": rand_text(rng)} for _ in range(200)])
    db.index_search()
    raw = sqlite3.connect(db.db_path, isolation_level=None)
    with db.engine.connect() as c:
        hw = bigram.high_water(c)
    assert hw == raw.execute("SELECT max(id) FROM messages").fetchone()[0]
    # Hermes writes behind our back: new rows, edits and deletes of indexed rows,
    # and one row re-inserted with an explicit id below the high-water mark.
    raw.execute("BEGIN")
    for _ in range(40):
        raw.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s2', 'user', ?, 1.0)",
                    (rand_text(rng),))
    for mid in rng.sample(range(1, hw), 40):
        raw.execute("UPDATE messages SET content = ? WHERE id = ?", (rand_text(rng), mid))
    gone = rng.sample(range(1, hw), 30)
    for mid in gone:
        raw.execute("DELETE FROM messages WHERE id = ?", (mid,))
    raw.execute("INSERT INTO messages (id, session_id, role, content, timestamp) VALUES (?, 's3', 'tool', ?, 2.0)",
                (gone[0], "迁移测试 revived 骆驼"))
    # pairs that exist nowhere else, so only the dirty-block bookkeeping can find them
    raw.execute("UPDATE messages SET content = '鲸鱼 edited' WHERE id = ?", (hw // 2,))
    raw.execute("UPDATE messages SET tool_name = '海豚' WHERE id = ?", (hw // 3,))
    raw.execute("COMMIT")
    assert raw.execute("SELECT count(*) FROM messages_cjk_bigram_dirty").fetchone()[0] > 0
    terms = ["数据", "迁移", "测试", "完成", "通信", "한글", "テス", "数", "据库迁", "Agent通信", "100%完成",
             "库数", "我们我们", "移测", "终端", "骆驼", "鲸鱼", "海豚"]
    terms += ["".join(rng.choice(ALPHABET) for _ in range(2)) for _ in range(25)]

    def check() -> None:
        for term in terms:
            got = {h["id"] for h in db.search_messages(term, limit=100000)}
            assert got == brute(raw, term), term

    check()  # dirty blocks and the unindexed tail are scanned
    assert db.index_search() > 0
    check()  # after catching up
    with db.engine.connect() as c:
        assert bigram.pending(c) == 0
    db.rebuild_fts()
    check()
    raw.close()


def test_bigram_extraction() -> None:
    assert bigram.bigrams("数据库 ab 迁移") == {"数据", "据库", "迁移"}
    assert bigram.bigrams("a数b") == set()
    assert bigram.term_bigrams("Agent通信") == ["通信"]
    assert bigram.term_bigrams("数") == []
    assert bigram.bigrams(None) == set()


def test_unreadable_high_water_means_scan_everything(db: SessionDB) -> None:
    db.create_session("s", "cli")
    mid = db.append_message("s", "user", "数据中心")
    db.index_search()
    db.set_meta(bigram.HIGH_WATER_KEY, "garbage")
    assert [h["id"] for h in db.search_messages("数据")] == [mid]


def test_strategy_choice_uses_estimate(db: SessionDB, monkeypatch) -> None:
    """Rare terms take the index, common ones the early-stopping scan."""
    seen: list[bool] = []
    real = search_mod.SearchRepository._substring_select

    def spy(self, groups, filters, params, window, *, flat):
        sql, is_flat = real(self, groups, filters, params, window, flat=flat)
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
