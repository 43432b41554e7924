"""A word query's hits as FTS5 shows them: the query (:class:`WordQuery`) and its snippet.

Where the database has no FTS5 (PostgreSQL), a word hit's snippet is cut here, in Python,
from the hit's own text: about ten words around the first word the query holds, marked
as FTS5's ``snippet()`` marks it. Words are folded about as ``hermes_store_search_words``
folds them (revision hs0003). The query itself is built by
:func:`hermes_store.search.postgresql.word_query`; the repository shapes rows with it
on every backend, so this module holds no SQL and imports no dialect.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from itertools import islice
from typing import Any
from collections.abc import Mapping, Sequence

from .fts import SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_OPEN, SNIPPET_TOKENS

__all__ = ["WordQuery", "snippet"]


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
    #: :func:`~hermes_store.search.postgresql.relax_near`'s, which the index answers, and a hit is checked again with
    #: this one and its columns kept apart (:func:`~hermes_store.search.postgresql.near_recheck`). '' without NEAR.
    near: str = ""
    #: Derived once per query, not per hit (:meth:`__post_init__`): ``prefixes`` as a
    #: tuple for ``str.startswith``; whether every word and prefix is a word as the fold
    #: makes them (else no shortcut, see :func:`_marked`); the ASCII ones, searched for
    #: by substring.
    prefix_tuple: tuple[str, ...] = field(init=False, repr=False, compare=False)
    word_shaped: bool = field(init=False, repr=False, compare=False)
    ascii_needles: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        every = (*self.words, *self.prefixes)
        object.__setattr__(self, "prefix_tuple", tuple(self.prefixes))
        object.__setattr__(self, "word_shaped", all(w and _WORD.fullmatch(w) for w in every))
        object.__setattr__(self, "ascii_needles", tuple(w for w in every if w and w.isascii()))


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
    folded = word.lower() if word.isascii() else _fold(word)
    return folded in query.words or folded.startswith(query.prefix_tuple)


def _cut(value: str, spans: list[tuple[int, int]], first: int, *, before: bool, after: bool,
         query: WordQuery) -> str:
    """The snippet text: about ten of ``spans`` around word ``first``, hits marked.

    ``spans`` may be a stretch of the words only: ``before``/``after`` say whether the
    text has words beyond its ends (then it holds enough of them on that side).
    """
    lo = max(0, min(first - 2, len(spans) - SNIPPET_TOKENS))
    hi = min(len(spans), lo + SNIPPET_TOKENS)
    at_start, at_end = lo == 0 and not before, hi == len(spans) and not after
    # The text between the marks is copied in whole slices: only the hits are cut out.
    # Words before the first hit are not hits; the few after it are folded here.
    out = ["" if at_start else SNIPPET_ELLIPSIS]
    pos = 0 if at_start else spans[lo][0]
    start, end = spans[first]
    out += (value[pos:start], SNIPPET_OPEN, value[start:end], SNIPPET_CLOSE)
    pos = end
    rest = hi if _may_hold_hits(value[end:spans[hi - 1][1]], query) else first + 1
    for i in range(first + 1, rest):
        start, end = spans[i]
        if _is_hit(value[start:end], query):
            out += (value[pos:start], SNIPPET_OPEN, value[start:end], SNIPPET_CLOSE)
            pos = end
    if at_end:
        out.append(value[pos:])
    else:
        out += (value[pos:spans[hi - 1][1]], SNIPPET_ELLIPSIS)
    return "".join(out)


def _may_hold_hits(text: str, query: WordQuery) -> bool:
    """False when no word of ``text`` can be one the query marks: ASCII text whose
    lower case holds none of the query's words or prefixes (each of them a word, so
    a word folding to one holds it). Then its words are not folded one by one."""
    if not query.word_shaped or not text.isascii():
        return True
    low = text.lower()
    return any(w in low for w in query.ascii_needles)


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
    ahead = {w: low.find(w) for w in query.ascii_needles}
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
    if not query.word_shaped:
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
