"""The search operators (issue 30, row 14): one grammar, both backends, and a note when a
query is not taken as written (:func:`hermes_store.search.query_note`).

The grammar is written down in :mod:`hermes_store.search.query`; these tests pin each
rule: on the sanitized MATCH string, on the rows SQLite and PostgreSQL return for it,
and on what ``query_note`` says about it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_store import SessionDB
from hermes_store.hermes_names import MAX_FTS5_QUERY_CHARS
from hermes_store.search import plan_search, query_note, sanitize_fts5_query
from hermes_store.search import postgresql as pg_search
from hermes_store.search.query import NEAR_MAX, QUERY_CHARS, match_items, near_parts

from .helpers import module_store

pytestmark = pytest.mark.both_backends

# ------------------------------------------------------------------ the grammar, as MATCH strings


@pytest.mark.parametrize(("query", "match"), [
    # -term excludes; - inside a word joins it; two dashes are punctuation
    ("kubernetes -deploy", "kubernetes NOT deploy"),
    ("-deploy kubernetes", "kubernetes NOT deploy"),
    ("kubernetes -deploy -helm", "kubernetes NOT deploy NOT helm"),
    ("kubernetes AND -deploy", "kubernetes NOT deploy"),
    ("-deploy AND kubernetes", "kubernetes NOT deploy"),
    ('kubernetes -"deploy now"', 'kubernetes NOT "deploy now"'),
    ("chat-send", '"chat-send"'),
    ("chat-send -deploy", '"chat-send" NOT deploy'),
    ("--verbose", "verbose"),
    ('"a b"-c', '"a b" c'),  # glued to a phrase, not at a word start: no exclusion
    # an exclusion belongs to its OR branch
    ("alpha -beta OR gamma", "alpha NOT beta OR gamma"),
    ("alpha OR gamma -beta", "alpha OR gamma NOT beta"),
    # a NOT that starts a query or a branch excludes the one operand after it
    ("NOT kubernetes deploy", "deploy NOT kubernetes"),
    ("alpha OR NOT beta gamma", "alpha OR gamma NOT beta"),
    ("NOT a NOT b c", "c NOT a NOT b"),
    # a query (or branch) of only exclusions looks for nothing
    ("NOT kubernetes", ""),
    ("-kubernetes", ""),
    ("-kubernetes -deploy", ""),
    ("alpha OR -beta", "alpha"),
    # infix NOT keeps FTS5's meaning (space-joined terms bind tighter)
    ("kubernetes NOT deploy", "kubernetes NOT deploy"),
    ("a NOT b c", "a NOT b c"),
    ("a AND NOT b", "a NOT b"),
    ("a NOT -b", "a NOT b"),
    # NEAR(a b[, N]): two terms, N (default 10) tokens at most between them, capped
    ("NEAR(kubernetes deploy)", "NEAR(kubernetes deploy, 10)"),
    ("NEAR(kubernetes deploy, 3)", "NEAR(kubernetes deploy, 3)"),
    ("NEAR(kubernetes deploy,3)", "NEAR(kubernetes deploy, 3)"),
    ("NEAR (kubernetes deploy)", "NEAR(kubernetes deploy, 10)"),
    ('NEAR("chat-send" deplo*, 0)', 'NEAR("chat-send" deplo*, 0)'),
    ('NEAR("deploy now" kube)', 'NEAR("deploy now" kube, 10)'),
    ("NEAR(a b, 999)", f"NEAR(a b, {NEAR_MAX})"),
    ("x NOT NEAR(a b)", "x NOT NEAR(a b, 10)"),
    ("x -NEAR(a b)", "x NOT NEAR(a b, 10)"),
    ("NEAR(a b) OR c", "NEAR(a b, 10) OR c"),
    ("NEAR(a b c)", "a b c"),  # more than two terms: all of them, anywhere
    ("NEAR(a)", "a"),
    ("NEAR()", ""),
    ("NEAR(a b", "a b"),
    ("NEAR(a OR b)", "NEAR(a b, 10)"),
    ("near(a b)", "near a b"),  # lowercase: a word, as in FTS5
    ("NEARBY(a b)", "NEARBY a b"),
    # NEAR is not measured in CJK text: its terms, anywhere
    ("NEAR(数据库 迁移计划)", "数据库 迁移计划"),
    ("NEAR(数据 kubectl)", "数据 kubectl"),
    # malformed: dropped
    ('"unclosed', "unclosed"),
    ("a AND", "a"),
    ("OR a", "a"),
    ("a OR OR b", "a OR b"),
    ("(a OR b) c", "a OR b c"),
])
def test_grammar(query: str, match: str) -> None:
    assert sanitize_fts5_query(query) == match
    assert plan_search(query).match == match
    assert sanitize_fts5_query(match) == match  # the reading reads the same again


@pytest.mark.parametrize("query", [
    "kubernetes -deploy", "NOT kubernetes deploy", "NEAR(kubernetes deploy)", 'NEAR("chat-send" deplo*, 0)',
    "alpha -beta OR gamma", "x -NEAR(a b)", "a NOT b c", "NEAR(数据库 迁移计划)", "数据 -迁移",
])
def test_readings_are_valid_fts5(query: str) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE w USING fts5(content)")
    conn.execute("CREATE VIRTUAL TABLE g USING fts5(content, tokenize='trigram')")
    match = sanitize_fts5_query(query)
    conn.execute("SELECT * FROM w WHERE w MATCH ?", (match,)).fetchall()
    conn.execute("SELECT * FROM g WHERE g MATCH ?", (match,)).fetchall()


def test_match_items_keep_a_near_group_whole() -> None:
    items = match_items('a NEAR("x y" z*, 3) NOT b')
    assert items == ["a", 'NEAR("x y" z*, 3)', "NOT", "b"]
    assert near_parts(items[1]) == (['"x y"', "z*"], 3) and near_parts("a") is None
    assert match_items('"NEAR(a b, 3)"') == ['"NEAR(a b, 3)"']  # a phrase is never a group


def test_near_tsquery_is_either_order_within_the_window() -> None:
    words = {"a": ["a"], "b": ["b"], "chat-send": ["chat", "send"]}
    assert pg_search.tsquery_text("NEAR(a b, 1)", words) == (
        "((('a' <0> 'b' | 'b' <0> 'a' | 'a' <1> 'b' | 'b' <1> 'a' | 'a' <2> 'b' | 'b' <2> 'a')))")
    assert "('chat' <-> 'send') <3> 'b'" in pg_search.tsquery_text('NEAR("chat-send" b, 2)', words)
    assert pg_search.tsquery_text("NEAR(a zz, 1)", {"a": ["a"], "zz": []}) == "(('a'))"  # a wordless term drops out
    # what the index is asked (the rest is near_recheck's): NEAR as its terms, a NOT-ed NEAR left out
    assert pg_search.relax_near("x NEAR(a b, 3) NOT c NOT NEAR(d e, 1) OR f") == "x a b NOT c OR f"


# ------------------------------------------------------------------ query_note


@pytest.mark.parametrize("query", [
    "kubernetes", "kubernetes -deploy", "kubernetes NOT deploy", "NOT kubernetes deploy", "NEAR(kubernetes deploy)",
    "NEAR(kubernetes deploy, 3)", '"exact phrase"', "deplo*", "chat-send", "a OR b", "a AND NOT b",
    "C++", "hello!", "user@example.com", "数据库迁移", "", "   ", "and or not", "--verbose",
])
def test_no_note_when_the_query_is_used_as_written(query: str) -> None:
    assert query_note(query) is None


@pytest.mark.parametrize(("query", "note"), [
    ('"unclosed', "An unclosed quote was ignored; searched for: unclosed."),
    ("a AND", '"AND" with nothing after it was ignored; searched for: a.'),
    ("OR a", '"OR" with nothing before it was ignored; searched for: a.'),
    ("NOT kubernetes", "The query only excludes terms, so there is nothing to look for; nothing was searched."),
    ("alpha OR -beta", "An OR branch with only exclusions matches nothing and was dropped; searched for: alpha."),
    ("a AND OR b", '"AND" with nothing after it was ignored; searched for: a OR b.'),
    ("a NOT AND b", '"NOT AND" was read as "AND"; searched for: a AND b.'),
    ("(a OR b) c", "Parentheses group nothing (only NEAR(...) uses them) and were ignored; searched for: a OR b c."),
    ("NEAR(a b c)", "NEAR(...) takes two terms; these were searched anywhere; searched for: a b c."),
    ("NEAR(a b", "NEAR( without its ) was read as plain terms; searched for: a b."),
    ("NEAR(a b, 999)", f"A NEAR distance over {NEAR_MAX} was read as {NEAR_MAX}; searched for: NEAR(a b, {NEAR_MAX})."),
    ("*deploy", "A * that does not end a word was ignored; searched for: deploy."),
    ("***", "A * that does not end a word was ignored; nothing was searched."),
    ("!!!", "Nothing in it can be searched for; nothing was searched."),
    ("NEAR(数据库 迁移计划)", "NEAR counts words, which CJK text does not separate: its terms were searched anywhere;"
                            " searched for: 数据库 迁移计划."),
    ("数据 迁移", "Terms shorter than 3 CJK characters match any one of them; searched for: 数据 迁移."),
])
def test_note_says_what_was_not_understood_and_how_it_was_read(query: str, note: str) -> None:
    assert query_note(query) == note


def test_note_for_a_query_cut_to_its_length() -> None:
    assert QUERY_CHARS == MAX_FTS5_QUERY_CHARS  # the cut search_messages makes
    note = query_note("deploy " * 400)
    assert note is not None and note.startswith(f"Only the first {QUERY_CHARS:,} characters were used;")


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(["AND", "OR", "NOT", "NEAR(", "NEAR", ")", "(", ",", ", 3", "-", "--", '"', "*", "a",
                              "b-c", "数据", "数据库迁移", " ", "-a", '-"', "\x00", "\ud800", "99999999999999999999"]),
             max_size=12).map("".join),
))
def test_note_never_raises_and_is_one_line(query: str) -> None:
    note = query_note(query)
    assert note is None or (note and "\n" not in note and note.endswith("."))
    reading = sanitize_fts5_query(query)
    if plan_search(query).kind != "substring":
        assert query_note(reading) is None, (query, reading)  # the reading is taken as written


# ------------------------------------------------------------------ both backends, end to end

ROWS = [
    ("user", "kubernetes deploy went fine", None),  # 0: adjacent
    ("assistant", "kubernetes rollout only", None),  # 1
    ("user", "deploy without the orchestrator", None),  # 2
    ("assistant", "kubernetes cluster upgraded then we deploy again", None),  # 3: 4 tokens between
    ("user", "deploy " + "x " * 12 + "kubernetes", None),  # 4: 12 tokens between, reversed
    ("tool", "the job ended with kubernetes", "deploy"),  # 5: the two words in two columns
    ("user", "数据库迁移 已经完成", None),  # 6
    ("user", "数据 迁移 计划", None),  # 7
    ("user", "数据 only", None),  # 8
    ("user", "chat-send deploy", None),  # 9
]


def fill(db: SessionDB) -> SessionDB:
    db.create_session("s", "cli")
    for i, (role, content, tool_name) in enumerate(ROWS):
        extra = {"tool_name": tool_name, "tool_call_id": f"c{i}"} if role == "tool" else {}
        db.append_message("s", role, content, timestamp=1000.0 + i, **extra)
    return db


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionDB]:
    with module_store(request, tmp_path_factory, fill) as db:
        yield db


def found(db: SessionDB, query: str) -> list[int]:
    """Row numbers of ROWS that the query finds, oldest first."""
    return [int(h["timestamp"] - 1000) for h in db.search_messages(query, sort="oldest", limit=100)]


@pytest.mark.parametrize(("query", "rows"), [
    # row 14 of issue 30, as written there
    ("NOT kubernetes", []),
    ("kubernetes -deploy", [1]),
    ("kubernetes NOT deploy", [1]),
    ("NEAR(kubernetes deploy)", [0, 3]),
    ('"unclosed', []),
    ("a AND", []),
    # and around it
    ("-deploy kubernetes", [1]),
    ("NOT deploy kubernetes", [1]),
    ("kubernetes AND -deploy", [1]),
    ("kubernetes -rollout -cluster", [0, 4, 5]),
    ("kubernetes -rollout OR orchestrator", [0, 2, 3, 4, 5]),
    ('deploy -"went fine"', [2, 3, 4, 5, 9]),
    ("chat-send", [9]),
    ("deploy -chat-send", [0, 2, 3, 4, 5]),
    ("NEAR(kubernetes deploy, 0)", [0]),
    ("NEAR(deploy kubernetes, 3)", [0]),
    ("NEAR(kubernetes deploy, 4)", [0, 3]),
    ("NEAR(kubernetes deploy, 12)", [0, 3, 4]),
    ("NEAR(kub* depl*, 0)", [0]),
    ('NEAR("chat-send" deploy, 0)', [9]),
    ("NEAR(kubernetes deploy, 50)", [0, 3, 4]),  # never across columns (row 5)
    ("kubernetes deploy", [0, 3, 4, 5]),  # while plain AND does
    ("kubernetes -NEAR(kubernetes deploy)", [1, 4, 5]),
    ("NEAR(kubernetes deploy) OR orchestrator", [0, 2, 3]),
    ("NEAR(kubernetes deploy) -cluster", [0]),
    # CJK: the trigram route and the short-term substring route honour exclusions too
    ("数据库迁移 -完成", []),
    ("数据库迁移 NOT 完成", []),
    ("数据 -迁移", [8]),
    ("数据 NOT 迁移", [8]),
    ("NEAR(数据 计划)", [6, 7, 8]),  # short CJK terms: any one of them (Hermes' LIKE scan)
    ("-数据", []),
])
def test_operators_on_both_backends(store: SessionDB, query: str, rows: list[int]) -> None:
    assert found(store, query) == rows


def test_rows_an_interrupted_backfill_skipped_keep_the_exclusions(tmp_path) -> None:
    """The rebuild-gap supplement (SQLite: rows no index holds yet) ANDs the query's terms,
    as Hermes does, but an excluded term stays excluded there too."""
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "seed")
        db.set_meta("fts_rebuild_high_water", "1000")
        db.set_meta("fts_rebuild_progress", "0")
        g1 = db.append_message("s", "user", "gapword alpha", timestamp=2000.0)
        g2 = db.append_message("s", "user", "gapword beta", timestamp=2001.0)
        assert [h["id"] for h in db.search_messages("gapword")] == [g2, g1]
        assert [h["id"] for h in db.search_messages("gapword -beta")] == [g1]
        assert [h["id"] for h in db.search_messages("NOT beta gapword")] == [g1]
        assert [h["id"] for h in db.search_messages("gapword NOT alpha")] == [g2]
