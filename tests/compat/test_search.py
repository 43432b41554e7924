"""Hermes v23 ``search_messages`` (§1.J): the ``include_inactive`` visibility rule on every
route, the query cap, ``:`` handling, read-only instances and the rebuild-gap supplement;
through the swapped ``hermes_state`` module, on SQLite and PostgreSQL.

Routes: a Latin query uses the word index (FTS5 / tsvector): ranked (no filter, no sort)
or filtered/sorted; a CJK query of 3+ characters uses the trigram index on SQLite (tool
rows by substring) and substring on PostgreSQL; a 2-character CJK query goes by
substring, helped by the short-CJK block index once it covers the rows.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from sqlalchemy import event

pytestmark = pytest.mark.both_backends

E = inspect.Parameter.empty
HIT_KEYS = {"id", "session_id", "role", "snippet", "timestamp", "tool_name", "source", "model", "session_started",
            "context"}


def corpus(db) -> dict[str, int]:
    """Session 's': two rows archived by compaction, a live summary, two live rows, two rewound rows.

    Every transcript row says 'zebra', '数据库系统' (trigram) and '短词' (too short for trigrams).
    """
    db.create_session("s", "cli", model="m")
    ids: dict[str, int] = {}
    ts = 1_000.0

    def put(label: str, role: str, words: str) -> None:
        nonlocal ts
        ts += 1
        extra = {"tool_name": "shell", "tool_call_id": "c1"} if role == "tool" else {}
        ids[label] = db.append_message("s", role, f"zebra {words} 数据库系统 短词 {label}", timestamp=ts, **extra)

    put("c_user", "user", "compacted one")
    put("c_tool", "tool", "compacted tool")
    assert db.archive_and_compact("s", [{"role": "user", "content": "summary only", "timestamp": 1_050.0}]) == 1
    put("l_user", "user", "live one")
    put("l_tool", "tool", "live tool")
    put("r_user", "user", "rewound one")
    put("r_tool", "tool", "rewound tool")
    assert db.rewind_to_message("s", ids["r_user"])["rewound_count"] == 2
    return ids


def found(hits: list[dict[str, Any]], ids: dict[str, int]) -> set[str]:
    names = {v: k for k, v in ids.items()}
    return {names[h["id"]] for h in hits}


VISIBLE = {"c_user", "c_tool", "l_user", "l_tool"}
EVERYTHING = VISIBLE | {"r_user", "r_tool"}


def test_signature_is_hermes_v26(hermes_state) -> None:
    params = [(p.name, p.default) for p in inspect.signature(hermes_state.SessionDB.search_messages).parameters.values()]
    assert params == [("self", E), ("query", E), ("source_filter", None), ("exclude_sources", None),
                      ("role_filter", None), ("limit", 20), ("offset", 0), ("sort", None), ("include_inactive", False),
                      ("fields", None)]
    assert hermes_state.MAX_FTS5_QUERY_CHARS == 2048


@pytest.mark.parametrize("query", ["zebra", "数据库系统", "短词"], ids=["word", "trigram", "short-cjk"])
@pytest.mark.parametrize("shape", [{}, {"sort": "newest"}, {"sort": "oldest"}, {"source_filter": ["cli"]},
                                   {"exclude_sources": ["tui"]}], ids=["ranked", "newest", "oldest", "source", "exclude"])
def test_rewound_rows_are_hidden_and_compacted_rows_found_on_every_route(db, query: str, shape: dict) -> None:
    ids = corpus(db)
    hits = db.search_messages(query, **shape)
    assert found(hits, ids) == VISIBLE
    assert all(set(h) == HIT_KEYS for h in hits)
    assert found(db.search_messages(query, include_inactive=True, **shape), ids) == EVERYTHING
    if "sort" in shape:
        stamps = [h["timestamp"] for h in hits]
        assert stamps == sorted(stamps, reverse=shape["sort"] == "newest")


@pytest.mark.parametrize("query", ["zebra", "数据库系统", "短词"], ids=["word", "trigram", "short-cjk"])
def test_role_filters_keep_the_visibility_rule(db, query: str) -> None:
    ids = corpus(db)
    assert found(db.search_messages(query, role_filter=["tool"]), ids) == {"c_tool", "l_tool"}
    assert found(db.search_messages(query, role_filter=["tool"], include_inactive=True), ids) == \
        {"c_tool", "l_tool", "r_tool"}
    assert found(db.search_messages(query, role_filter=["user"]), ids) == {"c_user", "l_user"}


def test_paging_counts_only_visible_rows(db) -> None:
    ids = corpus(db)
    pages = [db.search_messages("zebra", sort="newest", limit=1, offset=i) for i in range(6)]
    assert [found(p, ids) for p in pages] == [{"l_tool"}, {"l_user"}, {"c_tool"}, {"c_user"}, set(), set()]


def test_restored_rows_are_found_again(db) -> None:
    ids = corpus(db)
    assert db.restore_rewound("s", ids["r_user"]) == 2
    assert found(db.search_messages("rewound"), ids) == {"r_user", "r_tool"}


def test_the_short_cjk_block_index_route_applies_the_rule(db) -> None:
    """With many messages and the block index current, a rare 2-character term is answered
    from candidate blocks (not a scan); rewound rows stay hidden there too."""
    db.create_session("filler", "cli")
    db.append_messages([{"session_id": "filler", "role": "user", "content": f"filler text {i}", "timestamp": float(i)}
                        for i in range(2000)])
    ids = corpus(db)
    db.index_search()
    seen: list[str] = []

    def spy(_conn, _cursor, statement, *_args) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", spy)
    try:
        hits = db.search_messages("短词")
        everything = db.search_messages("短词", include_inactive=True)
    finally:
        event.remove(db.engine, "before_cursor_execute", spy)
    assert found(hits, ids) == VISIBLE and found(everything, ids) == EVERYTHING
    assert any("messages_cjk_bigram" in s and "JOIN messages" in s for s in seen)


# ---------------------------------------------------------------------------- the query itself


def test_the_query_is_cut_to_2048_characters_before_sanitizing(db, hermes_state) -> None:
    ids = corpus(db)
    cap = hermes_state.MAX_FTS5_QUERY_CHARS
    assert len("zebra live") < cap
    # Everything past the cap is dropped: the absent word after it does not AND the query away.
    assert found(db.search_messages("zebra live" + " " * cap + "qqqqabsent"), ids) == {"l_user", "l_tool"}
    assert db.search_messages("zebra live qqqqabsent") == []
    # A term cut at the cap becomes a shorter one and simply finds nothing.
    assert db.search_messages("x" * (cap - 1) + "zebra") == []
    assert found(db.search_messages(" " * (cap - 5) + "zebra"), ids) == VISIBLE


def test_colons_never_reach_the_index_as_column_filters(db, hermes_state) -> None:
    ids = corpus(db)
    assert hermes_state.SessionDB._sanitize_fts5_query("zebra:live") == "zebra live"
    assert found(db.search_messages("zebra:live"), ids) == {"l_user", "l_tool"}
    assert found(db.search_messages("content:zebra compacted"), ids) == set()  # 'content' is just a word
    assert found(db.search_messages("zebra:"), ids) == VISIBLE


@pytest.mark.sqlite_only
def test_a_read_only_store_searches_too(hermes_state, tmp_path) -> None:
    """Hermes returns [] on a read-only instance; we search (deliberate difference)."""
    path = tmp_path / "state.db"
    store = hermes_state.SessionDB(path)
    ids = corpus(store)
    store.close()
    ro = hermes_state.SessionDB(path, read_only=True)
    try:
        assert found(ro.search_messages("zebra"), ids) == VISIBLE
        assert found(ro.search_messages("zebra", include_inactive=True), ids) == EVERYTHING
    finally:
        ro.close()


# ---------------------------------------------------------------------------- rebuild-gap supplement


def max_id(db) -> int:
    return max(m["id"] for m in db.get_messages("s", include_inactive=True))


def test_rows_an_interrupted_backfill_has_not_indexed_are_still_found(db, backend) -> None:
    corpus(db)
    high = max_id(db) + 100
    db.set_meta("fts_rebuild_high_water", str(high))
    db.set_meta("fts_rebuild_progress", "0")
    g1 = db.append_message("s", "user", "gapword alpha", timestamp=2_000.0)
    g2 = db.append_message("s", "user", "gapword beta", timestamp=2_001.0)
    assert g2 <= high  # inside (progress, high_water]: the index triggers skip them (SQLite)
    hits = db.search_messages("gapword")
    assert [h["id"] for h in hits] == [g2, g1]  # once each, newest first
    assert set(hits[0]) == HIT_KEYS and ">>>gapword<<<" in hits[0]["snippet"]
    assert hits[0]["context"][1]["content"] == "gapword beta"
    assert [h["id"] for h in db.search_messages("gapword", limit=1)] == [g2]
    assert [h["id"] for h in db.search_messages("gapword beta")] == [g2]  # every term required
    assert db.search_messages("gapword", source_filter=["tui"]) == []
    assert [h["id"] for h in db.search_messages("gapword", role_filter=["user"])] == [g2, g1]
    # The supplement keeps the visibility rule.
    db.rewind_to_message("s", g2)
    assert [h["id"] for h in db.search_messages("gapword")] == [g1]
    assert [h["id"] for h in db.search_messages("gapword", include_inactive=True)] == [g2, g1]
    # Backfill done (progress reached the mark): nothing is supplemented any more; on
    # SQLite those two rows are then in no index until a rebuild, as in Hermes.
    db.set_meta("fts_rebuild_progress", str(high))
    expected = [] if backend == "sqlite" else [g1]
    assert [h["id"] for h in db.search_messages("gapword")] == expected


@pytest.mark.parametrize("marks", [{"fts_rebuild_high_water": "junk"}, {"fts_rebuild_high_water": "0"},
                                   {"fts_rebuild_high_water": "-5"},
                                   {"fts_rebuild_high_water": "10", "fts_rebuild_progress": "x"}])
def test_unusable_backfill_markers_are_ignored(db, marks: dict[str, str]) -> None:
    ids = corpus(db)
    for key, value in marks.items():
        db.set_meta(key, value)
    assert found(db.search_messages("zebra"), ids) == VISIBLE
