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
word hits are cut here, in Python (:func:`snippet`), from the hit's own text.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from itertools import islice
from typing import Any
from collections.abc import Mapping, Sequence

from .latin_in_cjk import RUN_RANK_SQL, RunsSQL, term_body
from .fts import SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_OPEN, SNIPPET_TOKENS, WORD_INDEX
from .query import NEAR_MAX, item_terms, match_items, near_parts, split_on

__all__ = [
    "NO_MATCH",
    "WordQuery",
    "delegated_of",
    "fold_ascii",
    "match_sql",
    "page_sql",
    "snippet",
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
#: Sessions that may be sub-agent transcripts: the marker as a substring (the JSON
#: itself is read in Python, :func:`delegated_sessions`).
DELEGATED_CANDIDATE = "model_config LIKE '%\\_delegate\\_from%' ESCAPE '\\'"
#: The candidates themselves, ``(id, model_config)`` (a template).
DELEGATED_SQL = f"SELECT id, model_config FROM {{sessions}} WHERE {DELEGATED_CANDIDATE}"



def term_texts(match: str) -> list[str]:
    """The distinct term texts of a sanitized MATCH string (operators left out)."""
    out = dict.fromkeys(term_body(t)[0] for i in match_items(match) if i not in ("AND", "OR", "NOT")
                        for t in item_terms(i))
    return list(out)


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
    """
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


@dataclass(frozen=True, slots=True)
class WordQuery:
    """A word search ready to run: the tsquery text and the words a snippet marks."""

    tsquery: str
    #: Folded words of the query's positive terms (a hit holds some of them).
    words: frozenset[str]
    #: Words that end a prefix term (``deplo*``): a hit's word starting with one counts.
    prefixes: frozenset[str]
    #: Each term text's folded words, for tsqueries of parts of the query.
    folded: Mapping[str, Sequence[str]] = field(default_factory=dict, compare=False)
    #: With NEAR in the query, its exact tsquery (bound as ``:qn``): ``tsquery`` is then
    #: :func:`relax_near`'s, which the index answers, and a hit is checked again with
    #: this one and its columns kept apart (:func:`near_recheck`). '' without NEAR.
    near: str = ""


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


def word_query(match: str, words: Mapping[str, Sequence[str]]) -> WordQuery:
    """``match``'s tsquery, from each of its term texts' folded ``words`` (:func:`term_texts`)."""
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
    (:func:`hermes_store.tenancy.render`)."""
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


def runs_cte(runs: RunsSQL, where: str, guard: str, *, exact: bool) -> str:
    """``WITH rx``: the rows a word query finds inside CJK runs (a dialect's
    :class:`~hermes_store.search.latin_in_cjk.RunsSQL`, with the page's filters
    ``where``), each marked ``maybe`` when its session may be a sub-agent transcript
    (those are held back until Python has read their JSON; ``exact``: it has, and
    :data:`RUNS_DELEGATED` names them). ``guard`` is :func:`rank_guard` or ''. A template."""
    maybe = "FALSE" if exact or runs.maybe_delegated is None else f"COALESCE({runs.maybe_delegated}, FALSE)"
    sessions = runs.sessions + (RUNS_DELEGATED if exact else "")
    return (
        "WITH rx AS MATERIALIZED (SELECT m.id AS id, m.timestamp AS timestamp, s.id AS sid, s.model_config AS cfg,"
        f" {maybe} AS maybe FROM {runs.source} WHERE {runs.where}{where}{sessions}{guard}) "
    )


def rank_guard(join_sessions: bool, where: str) -> str:
    """A one-time condition: the word hits do not fill ``:window`` (by rank the lookup's
    rows come after them all, so only then are they needed). A template."""
    join = " JOIN {sessions} s ON s.id = m.session_id" if join_sessions else ""
    return (f" AND (SELECT count(*) FROM (SELECT 1 FROM {{messages}} m{join} WHERE m.search_vector @@ {_QUERY}{where}"
            " LIMIT :window) g) < :window")


def runs_page_sql(join_sessions: bool, where: str, ordering: str) -> str:
    """:func:`page_sql` with the rows of :func:`runs_cte` (not held back) among the hits,
    ranked after them. A template."""
    join = " JOIN {sessions} s ON s.id = m.session_id" if join_sessions else ""
    return (
        f"SELECT * FROM (SELECT m.id AS id, -ts_rank_cd(m.search_vector, {_QUERY}) AS rank, m.timestamp AS timestamp "
        f"FROM {{messages}} m{join} WHERE m.search_vector @@ {_QUERY}{where} "
        f"UNION ALL SELECT id, CAST({RUN_RANK_SQL} AS double precision), timestamp FROM rx WHERE NOT maybe) m "
        f"ORDER BY {ordering} LIMIT :limit OFFSET :offset"
    )


def top_sql(index: str) -> str:
    """The ``:window`` best-ranked hits of ``:q`` as (id, rank, snippet); snippet NULL as
    above. A template, as :func:`match_sql`."""
    _check(index)
    return (
        f"SELECT id, -ts_rank_cd(search_vector, {_QUERY}) AS rank, CAST(NULL AS text) FROM {{messages}} "
        f"WHERE search_vector @@ {_QUERY} ORDER BY rank, timestamp DESC, id DESC LIMIT :window"
    )


# ------------------------------------------------------------------ snippets

#: A word of the text, as near to unicode61's as Python's character classes get: letters,
#: digits and combining marks (folded away below). Run over the text with ``_`` (the one
#: ``\w`` that is neither) replaced by a space, which keeps every position and is about
#: three times faster than spelling the class out.
_WORD = re.compile(r"[\w\u0300-\u036f]+")
#: Characters outside ASCII, where folding may change a word.
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_FOLD = str.maketrans("µſςϐϑϕϖϰϱϵẛι", "μsσβθφπκρεsι")
_MARKS = re.compile(r"[\u0300-\u036f]")
_ONE_MARK = re.compile(r"([a-z])[\u0300-\u036f](?![\u0300-\u036f])")
#: Characters cut into words before a hit and after it (more only when needed): enough
#: for the two words before it and the eight after it that a snippet shows.
_REACH_BEFORE = 40
_REACH = 160


def _words(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """(start, end) of each word of ``text`` (``text`` with ``_`` already spaced out)."""
    return [m.span() for m in _WORD.finditer(text, start, len(text) if end is None else end)]


def _fold(word: str) -> str:
    """A word folded about as ``hermes_store_search_words`` folds it (for marking only)."""
    if word.isascii():
        return word.lower()
    low = word.lower().translate(_FOLD)
    bare = _ONE_MARK.sub(r"\1", unicodedata.normalize("NFD", low))  # é -> e, ế stays
    return _MARKS.sub("", unicodedata.normalize("NFC", bare))


def _is_hit(word: str, query: WordQuery) -> bool:
    folded = _fold(word)
    return folded in query.words or any(folded.startswith(p) for p in query.prefixes)


def _cut(value: str, spans: list[tuple[int, int]], first: int, *, before: bool, after: bool,
         query: WordQuery) -> str:
    """The snippet text: about ten of ``spans`` around word ``first``, hits marked.

    ``spans`` may be a stretch of the words only: ``before``/``after`` say whether the
    text has words beyond its ends (then it holds enough of them on that side).
    """
    lo = max(0, min(first - 2, len(spans) - SNIPPET_TOKENS))
    hi = min(len(spans), lo + SNIPPET_TOKENS)
    at_start, at_end = lo == 0 and not before, hi == len(spans) and not after
    out = ["" if at_start else SNIPPET_ELLIPSIS, value[:spans[lo][0]] if at_start else ""]
    for i in range(lo, hi):
        start, end = spans[i]
        word = value[start:end]
        # Words before the first hit are not hits; the few after it are folded here.
        hit = i == first or (i > first and _is_hit(word, query))
        out.append(f"{SNIPPET_OPEN}{word}{SNIPPET_CLOSE}" if hit else word)
        if i + 1 < hi:
            out.append(value[end:spans[i + 1][0]])
    out.append(value[spans[hi - 1][1]:] if at_end else SNIPPET_ELLIPSIS)
    return "".join(out)


def _marked_full(value: str, query: WordQuery) -> str | None:
    """:func:`_marked` the plain way: every word of the column folded in turn."""
    spans = _words(value.replace("_", " "))
    first = next((i for i, (a, b) in enumerate(spans) if _is_hit(value[a:b], query)), None)
    if first is None:
        return None
    return _cut(value, spans, first, before=False, after=False, query=query)


def _first_hit(value: str, spaced: str, query: WordQuery) -> tuple[int, int] | None:
    """(start, end) of the first word of ``value`` the query marks, without folding each word.

    A word folds to an ASCII query word only if it is that word in some case (found by
    substring search in ``value.lower()``) or holds a character outside ASCII (found by
    a regex): those candidates, earliest first, are the only words folded. ``spaced``
    is ``value`` with ``_`` spaced out.
    """
    low = value.lower()
    if len(low) != len(value):  # a character whose lower case is longer: no shared positions
        return _scan(value, spaced, query)
    # The next candidate of each kind, searched again only once passed: each of these
    # searches reads the text once in all.
    ahead = {w: low.find(w) for w in (*query.words, *query.prefixes) if w and w.isascii()}
    ascii_only = spaced.isascii()  # then no candidate of the second kind, and no regex scan for one
    other = -1 if ascii_only else _next_non_ascii(spaced, 0)
    while True:
        candidates = [at for at in (*ahead.values(), other) if at >= 0]
        if not candidates:
            return None
        at = min(candidates)
        start, end = at, _WORD.match(spaced, at).end()  # type: ignore[union-attr]  # a word char is there
        while start > 0 and _WORD.match(spaced, start - 1, start):
            start -= 1
        if _is_hit(value[start:end], query):
            return start, end
        for w, seen in ahead.items():
            if 0 <= seen < end:
                ahead[w] = low.find(w, end)
        if 0 <= other < end:
            other = _next_non_ascii(spaced, end)


def _next_non_ascii(spaced: str, pos: int) -> int:
    """Where the next word character outside ASCII is at or after ``pos`` (-1: none)."""
    while True:
        found = _NON_ASCII.search(spaced, pos)
        if found is None:
            return -1
        if _WORD.match(spaced, found.start(), found.end()):
            return found.start()
        pos = found.end()  # punctuation, a symbol, an emoji: not part of any word


def _scan(value: str, spaced: str, query: WordQuery) -> tuple[int, int] | None:
    """The first marked word found by folding every word (text whose case changes length)."""
    return next(((a, b) for a, b in _words(spaced) if _is_hit(value[a:b], query)), None)


def _marked(value: str, query: WordQuery) -> str | None:
    """FTS5-style snippet of one column: about ten words around the first match.

    The first hit is found by :func:`_first_hit`, and only the few words a snippet
    shows are cut around it: up to :data:`_REACH_BEFORE` characters before it and the
    next :data:`SNIPPET_TOKENS` words from it (a wider stretch only when that holds too
    few), so a long column costs little more than a short one; the result is
    :func:`_marked_full`'s.
    """
    if any(not w or not _WORD.fullmatch(w) for w in (*query.words, *query.prefixes)):
        return _marked_full(value, query)  # not words as the fold makes them: no shortcut
    spaced = value.replace("_", " ")
    hit = _first_hit(value, spaced, query)
    if hit is None:
        return None
    back, reach = _REACH_BEFORE, _REACH
    while True:
        lo, hi = max(0, hit[0] - back), min(len(value), hit[1] + reach)
        spans = _words(spaced, lo, hit[0])  # no word spans the hit's start
        if lo > 0 and spans and _WORD.match(spaced, lo - 1, lo) and spans[0][0] == lo:
            spans.pop(0)  # a word cut by the stretch's start
        first = len(spans)
        ahead = [m.span() for m in islice(_WORD.finditer(spaced, hit[0], hi), SNIPPET_TOKENS + 1)]
        if len(ahead) > SNIPPET_TOKENS:
            hi = ahead[-1][1]  # enough words: the stretch ends with the last one
        elif hi < len(value) and _WORD.match(spaced, hi, hi + 1) and ahead[-1][1] == hi:
            ahead.pop()  # a word cut by the stretch's end
        spans += ahead
        before, after = lo > 0, hi < len(value)
        # The snippet's words, as _cut picks them: the stretch answers as the whole text
        # would when they start after its first word (or at the text's start) and end
        # before its last word (or at the text's end); else read a wider stretch.
        start = max(0, min(first - 2, len(spans) - SNIPPET_TOKENS))
        if (not before or start >= 1) and (not after or start + SNIPPET_TOKENS < len(spans)):
            return _cut(value, spans, first, before=before, after=after, query=query)
        back, reach = back * 4, reach * 4


def snippet(texts: Sequence[Any], query: WordQuery) -> str:
    """The snippet of a word hit from its (content, tool name, tool calls): the first
    column holding a query word, its match marked as FTS5 marks it."""
    for value in texts:
        if isinstance(value, str) and value:
            found = _marked(value, query)
            if found is not None:
                return found
    first = texts[0] if texts and isinstance(texts[0], str) else ""
    return first[:80]


# ------------------------------------------------------------------ sessions left out of CJK routes


def delegated_of(candidates: Sequence[tuple[str, Any]]) -> list[str]:
    """Sessions whose ``model_config`` names a ``_delegate_from`` (sub-agent transcripts).

    SQLite decides this with ``json_extract`` over valid JSON only; PostgreSQL 15 has
    no safe JSON cast for text that may be malformed, so the few candidate rows (the
    marker as a substring: ``(id, model_config)`` rows of :data:`DELEGATED_CANDIDATE`
    sessions) are parsed here with the same rule.
    """
    out = []
    for sid, config in candidates:
        try:
            value = json.loads(config)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict) and value.get("_delegate_from") is not None:
            out.append(sid)
    return out

