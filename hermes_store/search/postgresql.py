"""Full-text statements for PostgreSQL: the sanitized FTS5 syntax read as a tsquery.

The word index is ``messages.search_vector`` (revision hs0003): the words of content,
tool name and tool calls as FTS5's ``unicode61`` tokenizer cuts and folds them
(``user@example.com`` is ``user``, ``example``, ``com``; ``Café`` is ``cafe``), made by
the database function ``hermes_store_search_words``, with their positions; no phrase
spans two columns. A query's terms are folded by the same function
(:func:`fold_ascii`, the rest by the dialect), so both sides agree whatever the server's locale; the tsquery
text built here from those words is cast, not parsed again. Nothing is stemmed.

FTS5 precedence is kept: space-joined terms bind tightest, then NOT, AND, OR. A term is
the phrase of its words (``chat-send`` → ``chat <-> send``); a term without words is
ignored, as FTS5 ignores it.

CJK queries never come here: they are answered by substring (ILIKE, served by the
``pg_trgm`` index) and the bigram block index, as the repository arranges. A word
query's terms written inside CJK runs are read with its page (:func:`runs_cte`). Snippets of
word hits are cut in Python, from the hit's own text, by :mod:`.word_hits`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from collections.abc import Mapping, Sequence

from .latin_in_cjk import RUN_RANK_SQL, RunsSQL, term_body
from .fts import WORD_INDEX
from .query import NEAR_MAX, item_terms, match_items, near_parts, split_on
from .word_hits import WordQuery

__all__ = [
    "NO_MATCH",
    "WordQuery",
    "fold_ascii",
    "match_sql",
    "page_sql",
    "top_sql",
    "tsquery_text",
    "word_query",
]

#: A tsquery no document satisfies (a lexeme and its negation).
NO_MATCH = "'x' & !'x'"
#: The longest word a tsvector holds (bytes); a longer one is never in the index.
MAX_WORD_BYTES = 2046
#: Words of ASCII text: there every character but a letter or digit separates words.
_ASCII_WORD = re.compile(r"[a-z0-9]+")
#: Folds the terms bound as ``:terms`` with our word function, which lives in the
#: tenant's schema: named there, never looked up. A template (``{...}`` names).
FOLD_SQL = "SELECT t.term, {hermes_store_search_words}(t.term) FROM unnest(CAST(:terms AS text[])) AS t(term)"



def term_texts(match: str) -> list[str]:
    """The distinct term texts of a sanitized MATCH string (operators left out)."""
    return list(_term_texts(match))


@lru_cache(maxsize=256)
def _term_texts(match: str) -> tuple[str, ...]:
    """:func:`term_texts`, kept for recent queries (a pure function of the text)."""
    return tuple(dict.fromkeys(term_body(t)[0] for i in match_items(match) if i not in ("AND", "OR", "NOT")
                               for t in item_terms(i)))


def fold_ascii(terms: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Each ASCII term's words, as the word index holds them (a letter or digit run,
    lower case: exactly what the database function gives for ASCII), and the other
    terms, which only ``hermes_store_search_words`` itself folds as the index did
    (:data:`FOLD_SQL`, one round trip: the dialect's)."""
    words: dict[str, list[str]] = {}
    ask = []
    for term in terms:
        if term.isascii():
            words[term] = _ASCII_WORD.findall(term.lower())
        else:
            ask.append(term)
    return words, ask


def _lexeme(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"


def _near(terms: Sequence[str], distance: int, words: Mapping[str, Sequence[str]]) -> str | None:
    """``NEAR(a b, N)`` as tsquery text: one term followed by the other, either way round,
    with at most N words between them (``a <k> b``: b starts k positions after a ends;
    k = 0 lets the two share a word, as FTS5 lets them). A term without words drops
    out, as FTS5 drops it. Columns are kept apart by :func:`near_recheck`."""
    parts = [_term(t, words) for t in terms]
    if any(p is None for p in parts):
        return None
    kept = [p for p in parts if p]
    if len(kept) < 2:
        return kept[0] if kept else ""
    a, b = kept
    ways = [f"{x} <{k}> {y}" for k in range(distance + 2) for x, y in ((a, b), (b, a))]
    return "(" + " | ".join(dict.fromkeys(ways)) + ")"


def _term(item: str, words: Mapping[str, Sequence[str]]) -> str | None:
    """One FTS5 term (or NEAR group) as tsquery text; '' when it has no word (FTS5
    ignores it); None when it can never match (a word too long for the index)."""
    near = near_parts(item)
    if near is not None:
        return _near(near[0], near[1], words)
    body, prefix = term_body(item)
    found = list(words.get(body, ()))
    if not found:
        return ""
    if any(len(w.encode("utf-8")) > MAX_WORD_BYTES for w in found):
        return None
    lexemes = [_lexeme(w) for w in found]
    if prefix:
        lexemes[-1] += ":*"
    return f"({' <-> '.join(lexemes)})" if len(lexemes) > 1 else lexemes[0]


def _all_of(items: list[str], words: Mapping[str, Sequence[str]]) -> str | None:
    terms = [_term(i, words) for i in items]
    if any(t is None for t in terms):
        return None
    kept = [t for t in terms if t]
    return " & ".join(kept) if kept else None


def tsquery_text(match: str, words: Mapping[str, Sequence[str]]) -> str:
    """tsquery text (for a cast) with the meaning FTS5 gives ``match``.

    ``match`` is a sanitized MATCH string (:func:`~hermes_store.search.query.
    sanitize_fts5_query`); ``words`` maps each of its term texts to its folded words
    (:func:`fold_ascii` and the dialect). Returns :data:`NO_MATCH` when nothing can match.
    Kept for recent queries (a pure function of both): the Latin-in-CJK lookup asks
    for the same parts on every search.
    """
    return _tsquery_text(match, tuple((term, tuple(found)) for term, found in words.items()))


@lru_cache(maxsize=512)
def _tsquery_text(match: str, folded: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    words = dict(folded)
    groups = []
    for group in split_on(match_items(match), "OR"):
        conds = []
        possible = True
        for factor in split_on(group, "AND"):
            first, *negated = split_on(factor, "NOT")
            positive = _all_of(first, words)
            if positive is None:
                possible = False
                break
            conds.append(f"({positive})")
            for unit in negated:
                excluded = _all_of(unit, words)
                if excluded is not None:  # a unit that never matches excludes nothing
                    conds.append(f"!({excluded})")
        if possible and conds:
            groups.append("(" + " & ".join(conds) + ")")
    return " | ".join(groups) if groups else NO_MATCH


def relax_near(match: str) -> str:
    """``match`` with every NEAR group read as its two terms anywhere and every NOT unit
    holding a NEAR group left out: a MATCH string every hit of ``match`` satisfies on
    ``search_vector`` too, whose columns are too close together for NEAR (and a NOT
    of a NEAR found across two columns would wrongly exclude). The index's part of a
    NEAR query; :func:`near_recheck` does the rest."""
    out = []
    for group in split_on(match_items(match), "OR"):
        factors = []
        for factor in split_on(group, "AND"):
            first, *negated = split_on(factor, "NOT")
            text = " ".join(t for i in first for t in item_terms(i))
            for unit in negated:
                if all(near_parts(i) is None for i in unit):
                    text += " NOT " + " ".join(unit)
            factors.append(text)
        out.append(" AND ".join(factors))
    return " OR ".join(out)


#: Recent :func:`word_query` answers, by MATCH string and folded words (a pure function
#: of both, and a WordQuery is immutable): a repeated search builds no tsquery again.
_WORD_QUERIES: dict[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], WordQuery] = {}
_MAX_WORD_QUERIES = 128


def word_query(match: str, words: Mapping[str, Sequence[str]]) -> WordQuery:
    """``match``'s tsquery, from each of its term texts' folded ``words`` (:func:`term_texts`)."""
    key = (match, tuple((term, tuple(found)) for term, found in words.items()))
    built = _WORD_QUERIES.get(key)
    if built is None:
        if len(_WORD_QUERIES) >= _MAX_WORD_QUERIES:
            _WORD_QUERIES.clear()
        built = _WORD_QUERIES[key] = _word_query(match, words)
    return built


def _word_query(match: str, words: Mapping[str, Sequence[str]]) -> WordQuery:
    plain: set[str] = set()
    prefixes: set[str] = set()
    items = match_items(match)
    for group in split_on(items, "OR"):
        for factor in split_on(group, "AND"):
            for item in (t for i in split_on(factor, "NOT")[0] for t in item_terms(i)):
                body, prefix = term_body(item)
                found = words.get(body, [])
                plain.update(found[:-1] if prefix else found)
                if prefix and found:
                    prefixes.add(found[-1])
    exact = tsquery_text(match, words)
    if all(near_parts(i) is None for i in items):
        return WordQuery(exact, frozenset(plain), frozenset(prefixes), words)
    return WordQuery(tsquery_text(relax_near(match), words), frozenset(plain), frozenset(prefixes), words, exact)


def _check(index: str) -> None:
    if index != WORD_INDEX:
        raise ValueError(f"PostgreSQL has no full-text index {index!r}: CJK search goes by substring")


_QUERY = "CAST(:q AS tsquery)"


def match_sql(index: str) -> str:
    """Hits of ``:q`` (tsquery text) with a rank (lower is better, as bm25); the
    snippet is NULL: :func:`snippet` cuts it from the rows that are returned.

    A template: ``{messages}`` is rendered in the connection's schema by the caller
    (:func:`hermes_store.tenant_schema.render`)."""
    _check(index)
    return (
        f"SELECT mx.id AS id, CAST(NULL AS text) AS snippet, -ts_rank_cd(mx.search_vector, {_QUERY}) AS rank "
        f"FROM {{messages}} mx WHERE mx.search_vector @@ {_QUERY}"
    )


#: The word route's order (lower rank is better), on the page's ``m``.
RANK_ORDER = "rank, m.timestamp DESC, m.id DESC"


#: Positions between two columns in :func:`near_recheck`'s vector: more than the widest
#: NEAR reaches (``<NEAR_MAX + 1>``), so no NEAR spans two columns. The lexeme ' ' is no
#: word; ``\:`` keeps the colon from reading as a bind parameter.
_COLUMN_GAP = "CAST(''' ''\\:" + str(NEAR_MAX + 14) + "' AS tsvector)"


def near_recheck(alias: str = "m") -> str:
    """`` AND`` the exact tsquery of a query holding NEAR (``:qn``,
    :attr:`WordQuery.near`) on a vector of the row's words whose columns lie
    :data:`_COLUMN_GAP` apart: ``search_vector`` keeps them one position apart (enough
    for phrases, not for NEAR), and FTS5 never lets NEAR span two columns. Built with
    the function and cuts of ``search_vector`` (revision hs0003), and read only for the
    rows the index found for :func:`relax_near`'s query (``:q``). A template."""
    vec = "{hermes_store_search_vector}"
    return (
        f" AND ({vec}(left({alias}.content, CASE WHEN {alias}.role = 'tool' THEN 8192 ELSE 65536 END))"
        f" || {_COLUMN_GAP} || {vec}(left({alias}.tool_name, 4096)) || {_COLUMN_GAP}"
        f" || {vec}(left({alias}.tool_calls, 32768))) @@ CAST(:qn AS tsquery)"
    )


def page_sql(join_sessions: bool, where: str, ordering: str, near: bool = False) -> str:
    """One page of word hits (``:limit`` from ``:offset``) as (id, rank, timestamp):
    the filters (``where``: conditions on ``m`` and, with ``join_sessions``, ``s``) are
    applied before the page is cut, so nothing is fetched twice or widened. ``near``:
    the query holds NEAR (:func:`near_recheck`). A template, as :func:`match_sql`."""
    join = " JOIN {sessions} s ON s.id = m.session_id" if join_sessions else ""
    recheck = near_recheck("m") if near else ""
    return (
        f"SELECT m.id AS id, -ts_rank_cd(m.search_vector, {_QUERY}) AS rank, m.timestamp AS timestamp "
        f"FROM {{messages}} m{join} WHERE m.search_vector @@ {_QUERY}{recheck}{where} "
        f"ORDER BY {ordering} LIMIT :limit OFFSET :offset"
    )


# ------------------------------------------------------------------ terms inside CJK runs

#: The sessions a lookup row of :func:`runs_cte` is in that may be sub-agent transcripts
#: (distinct ``[id, model_config]`` pairs), read with the page.
RUNS_PROBE = (
    "SELECT ARRAY(SELECT ARRAY[d.sid, d.cfg] FROM (SELECT DISTINCT sid, cfg FROM rx WHERE maybe) d) AS rx_probe"
)
#: Added to the lookup's session conditions once the sub-agent sessions among those are
#: known (bound as ``:rx_dlg``).
RUNS_DELEGATED = " AND s.id <> ALL(CAST(:rx_dlg AS text[]))"


def hits_cte(join_sessions: bool, where: str) -> str:
    """``WITH w``: every word hit of ``:q`` (the page's filters ``where`` applied) with
    its rank, read once by the index: the page sorts it, and :func:`rank_guard` counts it
    (materialized, so it is planned without a LIMIT: by the index, never by a sequential
    scan that stops at ``:window``, which for a rare or absent word read every message).
    A template."""
    join = " JOIN {sessions} s ON s.id = m.session_id" if join_sessions else ""
    return (f"WITH w AS MATERIALIZED (SELECT m.id AS id, -ts_rank_cd(m.search_vector, {_QUERY}) AS rank,"
            f" m.timestamp AS timestamp FROM {{messages}} m{join} WHERE m.search_vector @@ {_QUERY}{where}), ")


def runs_cte(runs: RunsSQL, where: str, guard: str, *, exact: bool) -> str:
    """``rx``: the rows a word query finds inside CJK runs (a dialect's
    :class:`~hermes_store.search.latin_in_cjk.RunsSQL`, with the page's filters
    ``where``), each marked ``maybe`` when its session may be a sub-agent transcript
    (those are held back until Python has read their JSON; ``exact``: it has, and
    :data:`RUNS_DELEGATED` names them). ``guard`` is :data:`RANK_GUARD` or ''. Follows
    :func:`hits_cte`. A template."""
    maybe = "FALSE" if exact or runs.maybe_delegated is None else f"COALESCE({runs.maybe_delegated}, FALSE)"
    sessions = runs.sessions + (RUNS_DELEGATED if exact else "")
    return (
        "rx AS MATERIALIZED (SELECT m.id AS id, m.timestamp AS timestamp, s.id AS sid, s.model_config AS cfg,"
        f" {maybe} AS maybe FROM {runs.source} WHERE {runs.where}{where}{sessions}{guard}) "
    )


#: A one-time condition of :func:`runs_cte`: the word hits (:func:`hits_cte`) do not
#: fill ``:window`` (by rank the lookup's rows come after them all, so only then are
#: they needed).
RANK_GUARD = " AND (SELECT count(*) FROM (SELECT 1 FROM w LIMIT :window) g) < :window"


def runs_page_sql(ordering: str) -> str:
    """One page (``:limit`` from ``:offset``) of the word hits (:func:`hits_cte`) and the
    rows of :func:`runs_cte` not held back, ranked after them. A template."""
    return (
        f"SELECT * FROM (SELECT id, rank, timestamp FROM w UNION ALL SELECT id,"
        f" CAST({RUN_RANK_SQL} AS double precision), timestamp FROM rx WHERE NOT maybe) m"
        f" ORDER BY {ordering} LIMIT :limit OFFSET :offset"
    )


def top_sql(index: str) -> str:
    """The ``:window`` best-ranked hits of ``:q`` as (id, rank, snippet); snippet NULL as
    above. A template, as :func:`match_sql`."""
    _check(index)
    return (
        f"SELECT id, -ts_rank_cd(search_vector, {_QUERY}) AS rank, CAST(NULL AS text) FROM {{messages}} "
        f"WHERE search_vector @@ {_QUERY} ORDER BY rank, timestamp DESC, id DESC LIMIT :window"
    )
