"""PostgreSQL word-hit snippets are cut in Python (hermes_store.search.word_hits).

The fast path finds the first hit by substring search and cuts only the words near it;
it must give exactly what the plain way gives (every word of the column folded in
turn), for any text and query: accents, combining marks, underscores, CJK, emoji,
characters whose lower case is longer, words longer than the stretch read around a
hit, query words hidden inside longer words, prefixes. No database is needed.
"""

from __future__ import annotations

import re
from unittest import mock

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hermes_store.search import word_hits as pg
from hermes_store.search.fts import SNIPPET_CLOSE, SNIPPET_OPEN

#: The word pattern spelled out (letters and digits, combining marks; not ``_``).
SPELLED_OUT = re.compile(r"(?:[^\W_]|[\u0300-\u036f])+")

PIECES = ["kubernetes", "Kubernetes", "KUBERNETES", "xkubernetes", "kubernetesx", "kube_rnetes", "deploy",
          "deployment", "Déploiement", "cafe", "Café", "cafe\u0301", "naïve", "数据库", "数据", "İstanbul",
          "ǅemal", "🚀", "—", "“quoted”", "_", "__init__", "snake_case", "a", "1", "x" * 700, " ", "\n",
          ", ", ".", "ﬁle", "straße", "ΣΊΣΥΦΟΣ"]
QUERIES = [
    pg.WordQuery("q", frozenset({"kubernetes"}), frozenset()),
    pg.WordQuery("q", frozenset({"cafe", "naive"}), frozenset()),
    pg.WordQuery("q", frozenset(), frozenset({"deplo"})),
    pg.WordQuery("q", frozenset({"数据库"}), frozenset({"kube"})),
    pg.WordQuery("q", frozenset({"istanbul", "straße"}), frozenset()),
    pg.WordQuery("q", frozenset({"x" * 700}), frozenset({"snake"})),
]

texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=120).map(" ".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=texts, query=st.sampled_from(QUERIES))
@example(value=" ".join(["filler"] * 300 + ["Kubernetes"] + ["tail"] * 300), query=QUERIES[0])
@example(value="xkubernetes " * 40 + "kubernetes", query=QUERIES[0])
@example(value="x" * 5000 + " kubernetes " + "y" * 5000, query=QUERIES[0])
@example(value="İ" * 3 + " Kubernetes", query=QUERIES[0])
# A first-word hit in exactly ten words, then more than the stretch of separators only.
@example(value="kubernetes a b c d e f g h i" + " " * 300, query=QUERIES[0])
@example(value="kubernetes a b c d e f g h i" + "_" * 300, query=QUERIES[0])
# Queries word_query never builds (an empty prefix, punctuation): the plain way answers.
@example(value="x - y kubernetes", query=pg.WordQuery("q", frozenset(), frozenset({""})))
@example(value="x - y kubernetes", query=pg.WordQuery("q", frozenset(), frozenset({"-"})))
def test_the_fast_snippet_is_the_plain_one(value: str, query: pg.WordQuery) -> None:
    assert pg._marked(value, query) == pg._marked_full(value, query)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=texts, query=st.sampled_from(QUERIES), reach=st.sampled_from([1, 4, 12, 40]))
@example(value="kubernetes a b c d e f g h i" + " " * 50, query=QUERIES[0], reach=40)
@example(value="x" * 30 + " kubernetes " + "y" * 30, query=QUERIES[0], reach=4)
def test_the_fast_snippet_is_the_plain_one_at_every_stretch_edge(value: str, query: pg.WordQuery, reach: int) -> None:
    """The same, with the stretch read around a hit shrunk to a few characters, so the
    hostile pieces land on its edges (a word cut in two, separators only beyond it)."""
    with mock.patch.object(pg, "_REACH", reach):
        assert pg._marked(value, query) == pg._marked_full(value, query)


@settings(max_examples=300, deadline=None)
@given(value=texts)
def test_words_are_the_spelled_out_pattern(value: str) -> None:
    assert pg._words(value.replace("_", " ")) == [m.span() for m in SPELLED_OUT.finditer(value)]


def test_a_hit_deep_in_a_long_message_is_marked_in_context() -> None:
    value = " ".join([f"word{i}" for i in range(5000)] + ["the", "Kubernetes", "rollout"] + ["end"] * 50)
    out = pg.snippet([value, None, None], QUERIES[0])
    assert f"{SNIPPET_OPEN}Kubernetes{SNIPPET_CLOSE}" in out
    assert out.startswith("...") and out.endswith("...") and "word4999" in out
