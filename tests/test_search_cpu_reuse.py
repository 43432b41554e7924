"""What a word search computes once instead of on every call or every hit (issue 32,
client CPU of PostgreSQL reads) gives exactly what was computed each time before.

* A snippet copies the text between its marks in whole slices and folds the words
  after the first hit only when they can hold one: it must equal a cut written the
  plain way here, word by word, every word after the first hit folded.
* A query's plan and its PostgreSQL ``WordQuery`` are kept for recent queries: the
  kept answer is the one a fresh build gives, and another query gets its own.
* A search statement run before goes with its result columns named: the rows of a
  second run are the first run's, on both backends, and a statement's own columns are
  kept (never another statement's).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hermes_store import SessionDB
from hermes_store.repositories import SearchRepository
from hermes_store.repositories import search as search_repo
from hermes_store.search import postgresql as pg_search
from hermes_store.search import word_hits
from hermes_store.search.fts import SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_OPEN, SNIPPET_TOKENS
from hermes_store.search.query import plan_search

pytestmark = pytest.mark.both_backends  # the tests taking ``db`` run on each backend

#: Words as unicode61 cuts them (letters, digits, combining marks; not ``_``).
WORDS = re.compile(r"(?:[^\W_]|[\u0300-\u036f])+")

PIECES = ["kubernetes", "Kubernetes", "KUBE", "kubectl", "deploy", "Deployment", "Déploiement", "cafe", "Café",
          "cafe\u0301", "naïve", "数据库", "İstanbul", "straße", "ﬁle", "ΣΊΣΥΦΟΣ", "🚀", "—", "_", "snake_case",
          "a", "1", " ", "\n", ", ", "x" * 300]
QUERIES = [
    word_hits.WordQuery("q", frozenset({"kubernetes"}), frozenset()),
    word_hits.WordQuery("q", frozenset({"kubernetes", "cafe"}), frozenset({"deplo"})),
    word_hits.WordQuery("q", frozenset({"数据库", "naive"}), frozenset({"kube"})),
    word_hits.WordQuery("q", frozenset({"istanbul", "straße"}), frozenset()),
    word_hits.WordQuery("q", frozenset(), frozenset({""})),  # not word-shaped: every word marks
]

texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=5)), max_size=60).map(" ".join)


def plain_snippet(value: str, query: word_hits.WordQuery) -> str | None:
    """FTS5's snippet of one column, the plain way: every word folded in turn, then ten
    words from two before the first hit, each one a hit marked, gaps kept as they are."""
    spans = [m.span() for m in WORDS.finditer(value)]

    def hit(a: int, b: int) -> bool:
        folded = word_hits._fold(value[a:b])
        return folded in query.words or any(folded.startswith(p) for p in query.prefixes)

    first = next((i for i, (a, b) in enumerate(spans) if hit(a, b)), None)
    if first is None:
        return None
    lo = max(0, min(first - 2, len(spans) - SNIPPET_TOKENS))
    hi = min(len(spans), lo + SNIPPET_TOKENS)
    out = [value[:spans[lo][0]] if lo == 0 else SNIPPET_ELLIPSIS]
    for i in range(lo, hi):
        a, b = spans[i]
        marked = i == first or (i > first and hit(a, b))
        out.append(f"{SNIPPET_OPEN}{value[a:b]}{SNIPPET_CLOSE}" if marked else value[a:b])
        if i + 1 < hi:
            out.append(value[b:spans[i + 1][0]])
    out.append(value[spans[hi - 1][1]:] if hi == len(spans) else SNIPPET_ELLIPSIS)
    return "".join(out)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=texts, query=st.sampled_from(QUERIES))
@example(value="kubernetes and kubernetes then Kubernetes", query=QUERIES[0])
@example(value="cafe Café cafe\u0301 deployment kubernetes", query=QUERIES[1])
@example(value="kubernetes a b c d e f g h i", query=QUERIES[0])
@example(value="x y kubernetes a b c d e f g h i j k", query=QUERIES[0])
@example(value="KUBE kubectl naïve 数据库", query=QUERIES[2])
def test_a_snippet_is_the_plain_word_by_word_cut(value: str, query: word_hits.WordQuery) -> None:
    assert word_hits._marked(value, query) == plain_snippet(value, query)
    assert word_hits._marked_full(value, query) == plain_snippet(value, query)


def test_a_second_hit_after_the_first_is_marked_in_ascii_and_beyond() -> None:
    query = word_hits.WordQuery("q", frozenset({"cafe"}), frozenset({"kube"}))
    assert word_hits.snippet(["a cafe b KUBECTL c"], query) == (
        f"a {SNIPPET_OPEN}cafe{SNIPPET_CLOSE} b {SNIPPET_OPEN}KUBECTL{SNIPPET_CLOSE} c")
    # Only a word outside ASCII folds to the second hit here: it is still marked.
    assert word_hits.snippet(["cafe b Café"], query) == (
        f"{SNIPPET_OPEN}cafe{SNIPPET_CLOSE} b {SNIPPET_OPEN}Café{SNIPPET_CLOSE}")
    # A query word inside a longer word is no hit of its own.
    assert word_hits.snippet(["cafe b xcafe"], query) == f"{SNIPPET_OPEN}cafe{SNIPPET_CLOSE} b xcafe"


def test_what_a_query_derives_once_follows_its_words() -> None:
    query = word_hits.WordQuery("q", frozenset({"cafe", "数据库"}), frozenset({"kube"}))
    assert query.word_shaped and set(query.ascii_needles) == {"cafe", "kube"}
    assert query.prefix_tuple == ("kube",)
    assert not word_hits.WordQuery("q", frozenset({"a-b"}), frozenset()).word_shaped
    assert not word_hits.WordQuery("q", frozenset(), frozenset({""})).word_shaped
    # Derived fields are no part of a query's identity.
    assert query == word_hits.WordQuery("q", frozenset({"cafe", "数据库"}), frozenset({"kube"}))


@pytest.mark.parametrize("text", ["deploy* OR kubernetes", '"rate limit"', "数据", "数据库 测试", "a NOT b", "   "])
def test_a_kept_plan_is_the_plan_built_afresh(text: str) -> None:
    kept = plan_search(text)
    assert plan_search(text) is kept  # kept: nothing parsed again
    assert plan_search.__wrapped__(text) == kept  # type: ignore[attr-defined]  # lru_cache's original


def test_another_query_gets_its_own_plan() -> None:
    assert plan_search("otter").match != plan_search("beaver").match


def test_a_kept_word_query_is_the_one_built_afresh() -> None:
    match = "deploy* OR NEAR(rate limit, 3)"
    words = pg_search.fold_ascii(pg_search.term_texts(match))[0]
    kept = pg_search.word_query(match, words)
    assert pg_search.word_query(match, dict(words)) is kept
    fresh = pg_search._word_query(match, words)
    assert (kept.tsquery, kept.words, kept.prefixes, kept.near) == (fresh.tsquery, fresh.words, fresh.prefixes,
                                                                       fresh.near)
    # The same text with other folded words (another schema's function) is another query.
    other = pg_search.word_query(match, {**words, "deploy": ["deploi"]})
    assert other is not kept and other.prefixes == frozenset({"deploi"})


def test_term_texts_hands_out_a_list_of_its_own() -> None:
    first = pg_search.term_texts("otter beaver")
    first.append("mutated")
    assert pg_search.term_texts("otter beaver") == ["otter", "beaver"]


def test_a_statement_run_again_reads_the_same_rows(db: SessionDB) -> None:
    db.create_session("a", "cli")
    for i in range(4):
        db.append_message("a", "user", f"deploy the otter {i} 数据 today")
    db.append_message("a", "assistant", "nothing to see")
    queries = ["otter", "deploy*", "数据", "otter NOT 2"]
    first = {q: db.search_messages(q) for q in queries}
    assert all(first.values())
    with db.engine.connect() as conn:
        repo = SearchRepository(conn)
        sql = "SELECT id, role AS who FROM {messages} ORDER BY id"
        before = repo._all(sql)
        assert (repo._sql(sql), type(repo.dialect)) in search_repo._COLUMNED
        assert repo._all(sql) == before and list(before[0]) == ["id", "who"]
        # Another statement keeps its own columns.
        assert list(repo._all("SELECT content, id FROM {messages} ORDER BY id")[0]) == ["content", "id"]
    assert {q: db.search_messages(q) for q in queries} == first
