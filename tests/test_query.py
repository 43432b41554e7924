"""FTS5 query sanitizing, CJK detection, index routing and LIKE escaping."""

from __future__ import annotations

import re
import sqlite3
import unicodedata
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_store.search import (
    SearchPlan,
    contains_cjk,
    escape_like,
    plan_search,
    sanitize_fts5_query,
)

DOCS = [
    "fix the chat-send handler",  # 1
    "release P2.2 is out",  # 2
    "renamed sp_new to sp_old",  # 3
    "edit my-app.config.ts please",  # 4
    "it's 100% done",  # 5
    "mail user@example.com today",  # 6
    "deploying to production",  # 7
    "hello world",  # 8
    "goodbye world",  # 9
    "C compiler notes",  # 10
    "我们讨论了数据库迁移的方案",  # 11
    "Agent通信协议",  # 12
    "任务100%完成了",  # 13
    "任务100x完成了",  # 14
    "and or not as plain words",  # 15
]


@pytest.fixture(scope="module")
def fts() -> Iterator[sqlite3.Connection]:
    """A word index and a trigram index over DOCS (rowid = position + 1)."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE w USING fts5(content)")
    conn.execute("CREATE VIRTUAL TABLE g USING fts5(content, tokenize='trigram')")
    conn.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, content TEXT)")
    for i, doc in enumerate(DOCS, start=1):
        for table in ("w", "g"):
            conn.execute(f"INSERT INTO {table}(rowid, content) VALUES (?, ?)", (i, doc))
        conn.execute("INSERT INTO m (id, content) VALUES (?, ?)", (i, doc))
    yield conn
    conn.close()


def hits(conn: sqlite3.Connection, table: str, match: str) -> set[int]:
    rows = conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ?", (match,))
    return {r[0] for r in rows}


# ---------------------------------------------------------------- sanitizer examples


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # the examples of the contract
        ("C++", "C"),
        ('"unterminated', "unterminated"),
        ("hello AND", "hello"),
        ("OR world", "world"),
        ("***", ""),
        ("deploy*", "deploy*"),
        ("chat-send", '"chat-send"'),
        ("P2.2", '"P2.2"'),
        ("my-app.config.ts", '"my-app.config.ts"'),
        ("sp_new", '"sp_new"'),
        ('"exact phrase"', '"exact phrase"'),
        # special characters become spaces outside phrases
        ("a+b", "a b"),
        ("{col}: term", "col term"),
        ("(hello OR world)", "hello OR world"),
        ("^start", "start"),
        ("content:secret", "content secret"),
        ('say "hi', "say hi"),
        # stars
        ("deploy***", "deploy*"),
        ("*deploy", "deploy"),
        ("* deploy", "deploy"),
        ("a * b", "a b"),
        ("chat-send*", '"chat-send"*'),
        ('"exact phrase"*', '"exact phrase"*'),
        ('"exact phrase" *', '"exact phrase"'),
        ("foo*bar", "foo* bar"),
        # operators
        ("hello OR world", "hello OR world"),
        ("hello NOT world", "hello NOT world"),
        ("hello world", "hello world"),
        ("a AND NOT b", "a NOT b"),
        ("AND OR NOT", ""),
        ("NOT hello", ""),  # a leading NOT excludes: nothing left to look for
        ("hello AND OR", "hello"),
        ("hello and", "hello and"),  # lowercase is an ordinary word
        ("or world", "or world"),
        ("AND*", '"AND"*'),
        ("NEAR(a b)", "NEAR(a b, 10)"),  # the operator grammar (tests/test_search_operators.py)
        # punctuation around a term is trimmed, inside a term it makes a phrase
        ("hello!", "hello"),
        ("end.", "end"),
        ("'quoted'", "quoted"),
        ("it's", '"it\'s"'),
        ("user@example.com", '"user@example.com"'),
        ("100%", "100"),
        ("a/b", '"a/b"'),
        ("#tag", "tag"),
        ("-foo", ""),  # -term excludes
        ("--foo", "foo"),
        ("foo,bar", '"foo,bar"'),
        ("「数据库」", "数据库"),
        ("数据库。", "数据库"),
        # whitespace, NUL and control characters
        ("  hello \t\n world  ", "hello world"),
        ("a\x00b", "a b"),
        ('"a\x00b"', '"a b"'),
        ("a\x01b", '"a\x01b"'),
        ("\x07", ""),
        ('""', ""),
        ('"   "', ""),
        # non-ASCII is legal unquoted
        ("🚀 launch", "🚀 launch"),
        ("数据库迁移", "数据库迁移"),
        ("", ""),
        ("   ", ""),
    ],
)
def test_sanitize_examples(query: str, expected: str) -> None:
    assert sanitize_fts5_query(query) == expected


def test_sanitize_replaces_lone_surrogates() -> None:
    out = sanitize_fts5_query("bad\ud800text")
    assert out == "bad\ufffdtext"
    out.encode("utf-8")  # storable / bindable


@pytest.mark.parametrize(
    ("query", "expected_rows"),
    [
        ("chat-send", {1}),
        ("P2.2", {2}),
        ("sp_new", {3}),
        ("my-app.config.ts", {4}),
        ("it's", {5}),
        ("100%", {5}),
        ("user@example.com", {6}),
        ("deploy*", {7}),
        ("hello OR goodbye", {8, 9}),
        ("world NOT hello", {9}),
        ('"hello world"', {8}),
        ("hello!", {8}),
        ("C++", {10}),
        ("hello AND", {8}),
        ("and or not", {15}),
    ],
)
def test_sanitized_query_finds_what_the_user_means(
    fts: sqlite3.Connection, query: str, expected_rows: set[int]
) -> None:
    assert hits(fts, "w", sanitize_fts5_query(query)) == expected_rows


def test_raw_queries_would_fail_without_sanitizing(fts: sqlite3.Connection) -> None:
    """The examples are real failures of FTS5, not hypothetical ones."""
    for raw in ["C++", '"unterminated', "hello AND", "***", "P2.2", "a:b", "end.", "'x'"]:
        with pytest.raises(sqlite3.OperationalError):
            hits(fts, "w", raw)
        clean = sanitize_fts5_query(raw)
        if raw == "***":
            assert clean == ""  # nothing left to search: plan_search says "empty"
        else:
            hits(fts, "w", clean)  # the sanitized form does not fail


# ---------------------------------------------------------------- FTS5 validity fuzz

SPECIALS = [
    '"', "'", "*", "**", ":", "(", ")", "{", "}", "+", "-", "^", ".", ",", "/", "\\",
    "@", "#", "$", "%", "&", ";", "<", "=", ">", "?", "[", "]", "`", "|", "~", "!",
    "_", "\x00", "\x01", "\x1a", "\x7f", "\t", "\n", " ", "\u3000", "\u00a0", "\u200b",
    "AND", "OR", "NOT", "NEAR", "and", "or", "not", "NEAR(", "chat-send", "P2.2",
    "sp_new", "数据库", "数据", "迁移", "。", "「", "🚀", "\ud800", "\udfff",
    "\ud83d\ude00", "\ufffd", "é", "x", "42", "content", "rank",
    # words of DOCS, so that fuzzed queries also find rows whose content gets checked
    "hello", "world", "deploy", "done", "notes", "讨论了数据", "通信协", "100%完成",
]

fuzz_text = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.one_of(st.sampled_from(SPECIALS), st.text(max_size=4)), max_size=25
    ).map("".join),
    st.lists(st.sampled_from(SPECIALS), max_size=15).map(" ".join),
    # any code point, lone surrogates included
    st.text(st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=30),
)


def _fold(text: str) -> str:
    """Case- and accent-insensitive, at least as coarse as FTS5's own folding."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzz_text)
def test_sanitized_output_is_always_valid_fts5(query: str) -> None:
    """Valid syntax, and every row it finds holds one of the query's terms.

    Word index: one of the terms' words; trigram index: one term as a substring. A
    sanitizer that emitted valid but wrong syntax (say, a term turned into a column
    filter or an operator) would find rows without them.
    """
    conn = _fuzz_conn()
    out = sanitize_fts5_query(query)
    assert "\x00" not in out
    assert not out.startswith("*")
    assert out == out.strip()
    out.encode("utf-8")
    if not out:  # an empty MATCH is the caller's job (plan kind "empty")
        assert plan_search(query).kind == "empty"
        return
    terms = plan_search(query).terms
    words = [w for t in terms for w in re.findall(r"[^\W_]+", _fold(t))]
    for rowid in conn.execute("SELECT rowid FROM w WHERE w MATCH ?", (out,)).fetchall():
        doc = _fold(DOCS[rowid[0] - 1])
        assert any(w in doc for w in words), (query, out, DOCS[rowid[0] - 1])
    for rowid in conn.execute("SELECT rowid FROM g WHERE g MATCH ?", (out,)).fetchall():
        doc = _fold(DOCS[rowid[0] - 1])
        assert any(_fold(t) in doc for t in terms), (query, out, DOCS[rowid[0] - 1])


@settings(max_examples=300, deadline=None)
@given(fuzz_text)
def test_sanitizer_is_idempotent(query: str) -> None:
    once = sanitize_fts5_query(query)
    assert sanitize_fts5_query(once) == once


@settings(max_examples=200, deadline=None)
@given(st.lists(st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True), min_size=1, max_size=6))
def test_plain_words_pass_through_unchanged(words: list[str]) -> None:
    query = " ".join(words)
    assert sanitize_fts5_query(query) == query
    assert plan_search(query).terms == tuple(dict.fromkeys(words))


_CONN: sqlite3.Connection | None = None


def _fuzz_conn() -> sqlite3.Connection:
    """One shared in-memory pair of indexes with a little data, for the fuzz test."""
    global _CONN
    if _CONN is None:
        _CONN = sqlite3.connect(":memory:")
        _CONN.execute("CREATE VIRTUAL TABLE w USING fts5(content)")
        _CONN.execute("CREATE VIRTUAL TABLE g USING fts5(content, tokenize='trigram')")
        for doc in DOCS:
            _CONN.execute("INSERT INTO w(content) VALUES (?)", (doc,))
            _CONN.execute("INSERT INTO g(content) VALUES (?)", (doc,))
    return _CONN


# ---------------------------------------------------------------- CJK detection


@pytest.mark.parametrize(
    "ch",
    [
        "\u4e00", "\u9fff", "\u3400", "\u4dbf", "\U00020000", "\U0002a6df",
        "\u3000", "\u303f", "\u3040", "\u309f", "\u30a0", "\u30ff", "\uac00", "\ud7af",
        "数", "あ", "カ", "한", "。",
    ],
)
def test_contains_cjk_inside_each_range(ch: str) -> None:
    assert contains_cjk(ch)
    assert contains_cjk(f"abc {ch} def")


@pytest.mark.parametrize(
    "ch",
    [
        "\u4dc0",  # Yijing hexagrams, between ext A and the main block
        "\u2fff", "\u3100",  # just outside punctuation / katakana
        "\u33ff", "\ua000", "\uabff", "\ud7b0",
        "\U0001ffff", "\U0002a6e0", "\U0002a700",  # ext C is not in the list
        "\uff21",  # fullwidth A
        "a", "é", "🚀", "",
    ],
)
def test_contains_cjk_outside_the_ranges(ch: str) -> None:
    assert not contains_cjk(ch)


# ---------------------------------------------------------------- routing


@pytest.mark.parametrize(
    ("query", "kind", "terms"),
    [
        ("数据库迁移", "trigram", ("数据库迁移",)),
        ("数据", "substring", ("数据",)),
        ("Agent通信", "substring", ("Agent通信",)),
        ("100%完成", "substring", ("100%完成",)),
        ("数据库 迁移", "substring", ("数据库", "迁移")),
        ("数据库迁移 OR 测试数据", "trigram", ("数据库迁移", "测试数据")),
        ("数据库 hello", "trigram", ("数据库", "hello")),
        ('"数据 库"', "trigram", ("数据 库",)),
        ("数据 AND", "substring", ("数据",)),
        ("カタカナ", "trigram", ("カタカナ",)),
        ("한국어", "trigram", ("한국어",)),
        ("数", "substring", ("数",)),
        ("hello world", "word", ("hello", "world")),
        ("chat-send", "word", ("chat-send",)),
        ("hello。", "word", ("hello",)),  # CJK punctuation trimmed: nothing CJK is left
        ("", "empty", ()),
        ("   ", "empty", ()),
        ("***", "empty", ()),
        ("AND OR", "empty", ()),
        ("「」", "empty", ()),
    ],
)
def test_plan_routing(query: str, kind: str, terms: tuple[str, ...]) -> None:
    plan = plan_search(query)
    assert plan.kind == kind
    assert plan.terms == terms
    assert plan.match == sanitize_fts5_query(query)


def test_plan_is_frozen() -> None:
    plan = plan_search("hello")
    assert plan == SearchPlan("word", "hello", ("hello",))
    with pytest.raises(AttributeError):
        plan.kind = "empty"  # type: ignore[misc]


def test_trigram_plan_finds_cjk_inside_a_sentence(fts: sqlite3.Connection) -> None:
    plan = plan_search("数据库迁移")
    assert plan.kind == "trigram"
    assert hits(fts, "g", plan.match) == {11}
    assert hits(fts, "w", plan.match) == set()  # why the word index is not enough


def _substring_hits(conn: sqlite3.Connection, plan: SearchPlan) -> set[int]:
    where = " OR ".join("content LIKE ? ESCAPE '\\'" for _ in plan.terms)
    params = [f"%{escape_like(t)}%" for t in plan.terms]
    return {r[0] for r in conn.execute(f"SELECT id FROM m WHERE {where}", params)}


@pytest.mark.parametrize(
    ("query", "expected_rows"),
    [
        ("数据", {11}),
        ("Agent通信", {12}),
        ("100%完成", {13}),  # % is literal: 100x完成 must not match
        ("迁移 通信", {11, 12}),  # OR-joined
    ],
)
def test_substring_plan_finds_short_cjk_terms(
    fts: sqlite3.Connection, query: str, expected_rows: set[int]
) -> None:
    plan = plan_search(query)
    assert plan.kind == "substring"
    assert _substring_hits(fts, plan) == expected_rows


@settings(max_examples=300, deadline=None)
@given(fuzz_text)
def test_plan_is_consistent(query: str) -> None:
    plan = plan_search(query)
    assert plan.match == sanitize_fts5_query(query)
    assert (plan.kind == "empty") == (plan.match == "")
    assert all(t and '"' not in t and "\x00" not in t for t in plan.terms)
    if plan.kind == "word":
        assert not any(contains_cjk(t) for t in plan.terms)
    elif plan.kind in ("trigram", "substring"):
        assert any(contains_cjk(t) for t in plan.terms)


# ---------------------------------------------------------------- LIKE escaping


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("plain", "plain"),
        ("100%", "100\\%"),
        ("sp_new", "sp\\_new"),
        ("a\\b", "a\\\\b"),
        ("%_\\", "\\%\\_\\\\"),
        ("", ""),
    ],
)
def test_escape_like(term: str, expected: str) -> None:
    assert escape_like(term) == expected


def test_escape_like_custom_escape_char() -> None:
    assert escape_like("a!b%c_", "!") == "a!!b!%c!_"
    with pytest.raises(ValueError):
        escape_like("x", "ab")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab%_\\!x数"), max_size=8),
       st.text(alphabet=st.sampled_from("ab%_\\!x数"), max_size=12),
       st.sampled_from(["\\", "!"]))
def test_escape_like_is_literal_on_sqlite(term: str, haystack: str, esc: str) -> None:
    conn = sqlite3.connect(":memory:")
    row = conn.execute(
        "SELECT ? LIKE ? ESCAPE ?", (haystack, f"%{escape_like(term, esc)}%", esc)
    ).fetchone()
    conn.close()
    # SQLite's LIKE folds ASCII case only; our alphabet has no upper case.
    assert bool(row[0]) == (term in haystack)
