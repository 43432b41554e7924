"""A Latin or digit term written inside a CJK run is found (issue 21, point 7).

``search A2A`` did not find "今天讨论A2A通信协议": FTS5's unicode61 tokenizer (and our
PostgreSQL word function) keeps the CJK run and the Latin letters in one token. Word
queries now also look their terms of 3+ ASCII letters or digits up inside CJK runs,
through the trigram index (SQLite) and the pg_trgm index (PostgreSQL), with the
meaning :mod:`hermes_store.search.latin_in_cjk` gives. Every test runs on both
backends; the plan tests read the statement the search really sent.
"""

from __future__ import annotations

import json
import re
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import event, text

from hermes_store import SessionDB
from hermes_store.engine import create_engine
from hermes_store.repositories import SearchRepository
from hermes_store.search import latin_in_cjk, plan_search

from .helpers import module_store
from .statements import meter

pytestmark = pytest.mark.both_backends

#: (key, session, role, content, extra): the rows, by a name the tests use.
SESSIONS = [
    ("cli", "cli", None), ("tg", "telegram", None), ("cron", "cron", None), ("sub", "subagent", None),
    ("deleg", "cli", json.dumps({"_delegate_from": "cli", "model": "m"})),
    ("badcfg", "cli", '{"_delegate_from": broken'), ("nullcfg", "discord", json.dumps({"_delegate_from": None})),
]
ROWS = [
    ("both_sides", "cli", "user", "今天讨论A2A通信协议", {}),
    ("starts_run", "cli", "user", "A2A通信 starts the line", {}),
    ("before_stop", "cli", "assistant", "会议记录：讨论A2A。", {}),
    ("plain", "cli", "user", "A2A as a plain word", {}),
    ("longer", "cli", "user", "讨论A2Ab不算", {}),  # A2Ab is another word; A2A* finds it
    ("latin_before", "cli", "user", "xA2A通信不算", {}),
    ("digits", "tg", "user", "用GPT4模型测试2024年版本", {}),
    ("tool_row", "cli", "tool", "工具输出A2A结果", {"tool_name": "terminal", "tool_call_id": "c1"}),
    ("tool_call", "cli", "assistant", None, {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"q": "讨论A2A通信"}'}}]}),
    ("tool_name", "cli", "assistant", "calling it", {"tool_name": "终端A2A工具"}),
    ("cron", "cron", "user", "今天讨论A2A通信协议", {}),
    ("sub", "sub", "user", "今天讨论A2A通信协议", {}),
    ("deleg", "deleg", "user", "今天讨论A2A通信协议", {}),
    ("badcfg", "badcfg", "user", "讨论A2A通信 in a session whose marker is malformed", {}),
    ("nullcfg", "nullcfg", "user", "讨论A2A通信 in a session whose marker is null", {}),
    ("with_word", "tg", "user", "讨论A2A通信 then kubectl deploy", {}),
    ("kubectl_run", "cli", "user", "部署kubectl命令", {}),
    ("kubectl_word", "cli", "user", "kubectl apply", {}),
    ("two_chars", "cli", "user", "讨论AI通信", {}),
    ("kana", "tg", "assistant", "テストA2Aです", {}),
    ("hidden", "cli", "user", "讨论A2A通信 rewound away", {}),
    ("mixed_case", "tg", "user", "我们的a2A方案", {}),
]


def fill(db: SessionDB) -> SessionDB:
    for sid, source, _config in SESSIONS:
        db.create_session(sid, source)
    ids = {}
    for key, sid, role, content, extra in ROWS:
        ids[key] = db.append_message(sid, role, content, **extra)

    with db.engine.begin() as conn:
        conn.execute(text("UPDATE messages SET timestamp = 1000 + id"))
        conn.execute(text("UPDATE messages SET active = 0 WHERE id = :i"), {"i": ids["hidden"]})
        # model_config exactly as written (a malformed one cannot go through the API)
        for sid, _source, config in SESSIONS:
            conn.execute(text("UPDATE sessions SET model_config = :c WHERE id = :s"), {"c": config, "s": sid})
        conn.execute(text("UPDATE sessions SET started_at = 500"))
    db.ids = ids  # type: ignore[attr-defined]
    return db


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionDB]:
    with module_store(request, tmp_path_factory, fill) as db:
        yield db


def found(store: SessionDB, query: str, **kw: Any) -> list[str]:
    """The hits as row names, oldest first unless ``sort`` says otherwise."""
    names = {v: k for k, v in store.ids.items()}  # type: ignore[attr-defined]
    kw.setdefault("sort", "oldest")
    kw.setdefault("limit", 100)
    return [names[h["id"]] for h in store.search_messages(query, **kw)]


#: The rows a plain ``A2A`` finds inside CJK runs (content or tool name, CJK sessions,
#: visible rows), oldest first.
A2A_IN_RUNS = ["both_sides", "starts_run", "before_stop", "tool_name", "badcfg", "nullcfg", "with_word", "kana",
               "mixed_case"]


def test_a_term_inside_a_cjk_run_is_found(store: SessionDB) -> None:
    assert found(store, "A2A") == sorted([*A2A_IN_RUNS, "plain"], key=store.ids.get)  # type: ignore[attr-defined]
    assert found(store, "a2a") == found(store, "A2A") == found(store, '"A2A"')
    assert found(store, "GPT4") == found(store, "2024") == ["digits"]


def test_only_runs_count_not_other_words(store: SessionDB) -> None:
    """``A2Ab`` and ``xA2A`` are other words: the term touches an ASCII letter there."""
    hits = set(found(store, "A2A"))
    assert not hits & {"longer", "latin_before"}
    assert "longer" in found(store, "A2A*") and "latin_before" not in found(store, "A2A*")


def test_the_lookup_covers_what_the_trigram_index_holds(store: SessionDB) -> None:
    """Content and tool name of rows that are no tool results, in the sessions every CJK
    route searches; a malformed or null sub-agent marker is no marker."""
    hits = set(found(store, "A2A"))
    assert not hits & {"tool_row", "tool_call", "cron", "sub", "deleg", "hidden"}
    assert {"tool_name", "badcfg", "nullcfg"} <= hits
    assert "hidden" in found(store, "A2A", include_inactive=True)


def test_word_hits_are_kept_and_come_first_by_rank(store: SessionDB) -> None:
    ranked = found(store, "A2A", sort=None)
    assert ranked[0] == "plain"  # the one word hit, then the runs newest first
    assert ranked[1:] == sorted(A2A_IN_RUNS, key=store.ids.get, reverse=True)  # type: ignore[attr-defined]
    assert found(store, "kubectl") == ["with_word", "kubectl_run", "kubectl_word"]
    assert set(found(store, "kubectl", sort=None)[:2]) == {"with_word", "kubectl_word"}  # the word hits


def test_boolean_operators_keep_their_meaning(store: SessionDB) -> None:
    """A positive term may sit in a run; NOT keeps its word meaning."""
    assert found(store, "A2A kubectl") == ["with_word"]
    assert found(store, "A2A deploy") == ["with_word"]
    assert "with_word" not in found(store, "A2A NOT kubectl")
    assert found(store, "A2A NOT kubectl") == [n for n in found(store, "A2A") if n != "with_word"]
    assert found(store, "GPT4 OR plain") == ["plain", "digits"]
    assert found(store, "GPT4 AND absentword") == []
    assert found(store, "GPT4 kubectl") == []
    # A group whose words only the tokenizer could tell is left to the word index.
    assert found(store, "GPT4 🎉") == []


@pytest.mark.parametrize("query", ["AI", "ai", "A2", "4"])
def test_terms_under_three_characters_are_not_looked_up(store: SessionDB, query: str) -> None:
    """Neither index can look up fewer than 3 characters: finding ``AI`` in ``讨论AI通信``
    would read every message, so such terms keep their word meaning only."""
    assert latin_in_cjk.parse(plan_search(query).match) is None
    assert "two_chars" not in found(store, query)


def test_filters_and_pages(store: SessionDB) -> None:
    everything = found(store, "A2A", sort="newest")
    pages = [n for o in range(0, len(everything), 3) for n in found(store, "A2A", sort="newest", limit=3, offset=o)]
    assert pages == everything
    ranked = found(store, "A2A", sort=None)
    assert [n for o in range(0, len(ranked), 4) for n in found(store, "A2A", sort=None, limit=4, offset=o)] == ranked
    assert found(store, "A2A", source_filter="telegram") == ["with_word", "kana", "mixed_case"]
    assert found(store, "A2A", exclude_sources=["cli", "telegram"]) == ["nullcfg"]
    assert found(store, "A2A", role_filter="assistant") == ["before_stop", "tool_name", "kana"]
    assert found(store, "A2A", role_filter="assistant", sort=None) == ["kana", "tool_name", "before_stop"]


def test_snippets_mark_the_term_inside_the_run(store: SessionDB) -> None:
    hits = {h["id"]: h for h in store.search_messages("a2a", limit=100)}
    ids = store.ids  # type: ignore[attr-defined]
    assert hits[ids["both_sides"]]["snippet"] == "今天讨论>>>A2A<<<通信协议"
    assert hits[ids["mixed_case"]]["snippet"] == "我们的>>>a2A<<<方案"
    assert hits[ids["tool_name"]]["snippet"] == "终端>>>A2A<<<工具"
    assert ">>>A2A<<<" in hits[ids["plain"]]["snippet"]
    context = hits[ids["before_stop"]]["context"]
    assert [c["content"] for c in context][1] == "会议记录：讨论A2A。"


def test_the_rule_itself() -> None:
    """What counts as inside a run, on text (the SQL of both dialects says the same)."""
    a2a, prefix = latin_in_cjk.Term("A2A", False), latin_in_cjk.Term("A2A", True)
    inside = ["今天讨论A2A通信", "A2A通信", "讨论A2A", "讨论A2A。", "讨论a2a!", "「A2A」通信"[1:], "時々A2A", "𠀀A2A"]
    outside = ["A2A", "讨论A2Ab", "讨论xA2A", "xA2A通信", "A2Ax通信", "讨论 A2A x", "讨论A2A1"]
    assert [bool(latin_in_cjk.first_run(v, [a2a])) for v in inside] == [True] * len(inside)
    assert [bool(latin_in_cjk.first_run(v, [a2a])) for v in outside] == [False] * len(outside)
    assert latin_in_cjk.first_run("讨论A2Abc", [prefix]) == (2, 5)
    assert latin_in_cjk.first_run("A2Abc通信", [prefix]) is None  # the word index's own prefix hit
    for value in inside + outside:
        assert bool(re.search(latin_in_cjk.regex(a2a), value)) == bool(latin_in_cjk.first_run(value, [a2a])), value
        if latin_in_cjk.first_run(value, [a2a]):  # what PostgreSQL's index is asked first holds too
            assert re.search(latin_in_cjk.regex_beside_non_ascii(a2a), value), value
    assert not re.search(latin_in_cjk.regex_beside_non_ascii(a2a), "A2A and a2a only")


def test_queries_the_lookup_leaves_alone() -> None:
    for query in ("ab", "chat-send", "P2.2", '"deploy now"', "🎉", "数据库 A2A", "数据 A2A"):
        plan = plan_search(query)
        assert plan.kind != "word" or latin_in_cjk.parse(plan.match) is None, query
    parsed = latin_in_cjk.parse(plan_search("A2A* kubectl NOT deploy OR ab OR café x2x").match)
    assert parsed is not None
    assert parsed.terms == (latin_in_cjk.Term("A2A", True), latin_in_cjk.Term("kubectl", False),
                            latin_in_cjk.Term("x2x", False))
    assert [g.negatives for g in parsed.groups] == [("deploy",), ()]


# ------------------------------------------------------------------ plans: no full scan


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def plan_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionDB]:
    """The rows above among 4,000 others in 60 more sessions, statistics up to date (and
    on PostgreSQL the GIN pending lists merged, as autovacuum keeps them): a planner
    that could scan ``messages`` would choose to here if the statement let it."""
    def fill_big(db: SessionDB) -> SessionDB:
        fill(db)
        for i in range(60):
            db.create_session(f"f{i}", ("cli", "telegram", "discord")[i % 3])
        db.append_messages([
            {"session_id": f"f{i % 60}", "role": "user" if i % 2 else "assistant",
             "content": f"routine message {i} about deploy and kubectl 数据库迁移 number {i % 97}"}
            for i in range(4000)])
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE" if db.engine.dialect.name == "postgresql" else "ANALYZE")
            conn.commit()
        return db

    with module_store(request, tmp_path_factory, fill_big) as db:
        yield db


def sent(engine: Any, query: str, **kw: Any) -> tuple[list[tuple[str, Any]], list[int]]:
    """The statements one search sends (with their parameters), and its hits."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        seen.append((statement, parameters))

    with engine.connect() as conn:
        SearchRepository(conn).search_messages(query, **kw)  # warm the caches
        event.listen(engine, "before_cursor_execute", record)
        try:
            hits = SearchRepository(conn).search_messages(query, **kw)
        finally:
            event.remove(engine, "before_cursor_execute", record)
    return seen, [h["id"] for h in hits]


def plan_of(engine: Any, statement: str, parameters: Any) -> str:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
            return "\n".join(str(r[-1]) for r in rows)
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).fetchall()
        return "\n".join(r[0] for r in rows)


def lookup_statements(seen: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The statements that read the rows inside CJK runs (those name the run tests:
    GLOB on SQLite, ``~`` on PostgreSQL)."""
    found = [(s, p) for s, p in seen if "GLOB" in s or " ~ " in s]
    assert found, [s[:120] for s, _p in seen]
    return found


def lookup_part(engine: Any, plan: str) -> str:
    """The lines of a plan that read the lookup's rows: on PostgreSQL the subtree of
    ``CTE rx``; on SQLite the part after the word hits (the whole plan when alone)."""
    lines = plan.splitlines()
    if engine.dialect.name == "sqlite":
        at = next((i for i, line in enumerate(lines) if "messages_fts_trigram" in line), None)
        assert at is not None, plan
        return "\n".join(lines[at:])
    at = next(i for i, line in enumerate(lines) if line.strip() == "CTE rx")
    depth = len(lines[at]) - len(lines[at].lstrip())
    part = [lines[at]]
    for line in lines[at + 1:]:
        if len(line) - len(line.lstrip()) <= depth:
            break
        part.append(line)
    return "\n".join(part)


def assert_no_full_scan(engine: Any, plan: str, *, whole: bool = True) -> None:
    """The lookup reads the trigram index (FTS5's, or pg_trgm's GIN index), and no
    ``messages`` row it does not find there; with ``whole``, nothing in the plan
    scans ``messages``."""
    part = lookup_part(engine, plan)
    if engine.dialect.name == "sqlite":
        assert re.search(r"SCAN messages_fts_trigram VIRTUAL TABLE INDEX \d+:M", part), plan
        scans = re.compile(r"\s*SCAN (m|messages|s|sessions)\b")
        assert not [line for line in (plan if whole else part).splitlines() if scans.match(line)], plan
    else:
        assert "Bitmap Index Scan on idx_messages_trgm" in part, plan
        assert "Seq Scan on messages" not in (plan if whole else part), plan
        assert "Index Cond: (session_id" not in part, plan  # not every message of a session either


@pytest.mark.parametrize("kw", [{}, {"sort": "newest"}, {"sort": "oldest", "offset": 2},
                                {"source_filter": "telegram"}, {"role_filter": "user", "sort": "newest"},
                                {"exclude_sources": ["telegram"]}])
def test_the_lookup_reads_the_trigram_index_not_every_message(plan_store: SessionDB, kw: dict) -> None:
    seen, hits = sent(plan_store.engine, "A2A", **kw)
    runs = {plan_store.ids[n] for n in A2A_IN_RUNS}  # type: ignore[attr-defined]
    assert set(hits) & runs  # the lookup found its rows
    for statement, parameters in lookup_statements(seen):
        assert_no_full_scan(plan_store.engine, plan_of(plan_store.engine, statement, parameters))


def test_with_a_common_word_the_lookup_reads_the_trigram_index_too(plan_store: SessionDB) -> None:
    """``kubectl`` is in every filler row: by time the lookup still runs, through the
    index (the word part of the statement is the planner's own affair: here it may read
    every row, as every row is a hit)."""
    seen, hits = sent(plan_store.engine, "kubectl", sort="newest", limit=5)
    assert len(hits) == 5 and plan_store.ids["kubectl_run"] not in hits  # type: ignore[attr-defined]
    for statement, parameters in lookup_statements(seen):
        assert_no_full_scan(plan_store.engine, plan_of(plan_store.engine, statement, parameters), whole=False)


# ------------------------------------------------------------------ statements


def statements(engine: Any, query: str, **kw: Any) -> tuple[int, list[Any]]:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        repo = SearchRepository(conn)
        repo.search_messages(query, **kw)
        m = meter.EngineMeter(engine, lambda: [conn])
        m.start()
        try:
            hits = repo.search_messages(query, **kw)
        finally:
            m.stop()
    return m.count, hits


@pytest.fixture
def engine(store: SessionDB) -> Iterator[Any]:
    eng = create_engine(store.engine.url)
    yield eng
    eng.dispose()


def test_statements(engine: Any, store: SessionDB) -> None:
    """PostgreSQL reads the lookup with the word page (1 statement) and once more only
    when a held-back session turns out to be no sub-agent (a malformed marker here);
    SQLite as a short word page: the ranked hits, then page, lookup and context, then
    the backfill markers."""
    backend = engine.dialect.name
    count, hits = statements(engine, "GPT4")
    assert len(hits) == 1 and count == {"postgresql": 1, "sqlite": 3}[backend]
    count, hits = statements(engine, "A2A", source_filter="telegram")
    assert len(hits) == 3 and count == {"postgresql": 1, "sqlite": 2}[backend]
    count, hits = statements(engine, "A2A")
    assert len(hits) == len(A2A_IN_RUNS) + 1
    assert count == {"postgresql": 2, "sqlite": 3}[backend]  # PostgreSQL: "badcfg" is held back, then kept
