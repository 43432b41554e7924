"""Latin letters or digits written inside a CJK run: the word hits a word index misses.

FTS5's ``unicode61`` tokenizer (and the PostgreSQL word function that mirrors it,
revision hs0003) keeps a run of CJK characters and the Latin letters or digits written
against it in one token: ``今天讨论A2A通信协议`` is the one word ``今天讨论a2a通信协议``,
so the word query ``A2A`` cannot find it (issue 21, point 7). A word query therefore
also looks its qualifying terms up by substring, through the trigram index on SQLite
and the ``pg_trgm`` index on PostgreSQL, never by reading every message. This module
says what qualifies and what counts as "inside a CJK run"; the dialects write it as
SQL (``latin_in_cjk``), the same meaning on both.

* A term qualifies when it is three or more ASCII letters or digits (``A2A``, ``GPT4``,
  ``2024``), plain, quoted or as a prefix (``A2A*``). Shorter terms do not: neither
  index can look up fewer than three characters, so finding ``AI`` in ``讨论AI通信``
  would take a scan of every message.
* An occurrence of the term (ASCII case folded, as the word index folds it) is inside a
  CJK run when no ASCII letter or digit touches it on either side and a CJK character
  (:data:`~hermes_store.search.query.CJK_CLASS`) touches it on at least one side:
  ``讨论A2A通信``, ``A2A通信``, ``讨论A2A。`` but not ``讨论A2Ab`` nor ``xA2A通信``. A
  prefix term needs a CJK character right before it (a run that starts with the term is
  the word index's own prefix hit already).
* Only what the trigram index holds is looked at, on both backends: the content and
  tool name of rows that are not tool results, in the sessions the CJK routes search
  (not cron, not sub-agents). Tool results, tool calls and those sessions are still
  searched by word, as before.
* Boolean meaning: a positive term matches a row by word or, when it qualifies, inside
  a CJK run; ``NOT`` keeps its word meaning, so a row the word query finds is still
  found and nothing it left out for a ``NOT`` comes back. A group (the terms between two
  ``OR``) is looked up this way only when each positive term's words can be told
  without the tokenizer: it holds an ASCII letter or digit, or is ASCII only (then with
  no letter or digit it has no word, and FTS5 leaves it out).
* A query holding ``NEAR(...)`` is not looked up this way: a CJK run has no word
  positions to measure the distance in (the word index alone answers it).
* The added rows are the word query's misses only: rows the word index matches are
  never repeated. By rank they follow the ranked hits, newest first, as the trigram
  route's tool rows do; by time they interleave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from collections.abc import Callable, Sequence

from .fts import SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_OPEN
from .query import CJK_CLASS, TRIGRAM_CHARS, match_items, near_parts, split_on

__all__ = [
    "MIN_CHARS",
    "RUN_RANK",
    "OrGroup",
    "Query",
    "RunsSQL",
    "Term",
    "condition",
    "glob_patterns",
    "parse",
    "regex",
    "regex_beside_non_ascii",
    "snippet",
]

#: Characters a term needs: what a trigram index can look up.
MIN_CHARS = TRIGRAM_CHARS
#: The rank of a row found inside a CJK run: after every ranked word hit (bm25 and
#: ``-ts_rank_cd`` are at most 0), exact in a double.
RUN_RANK = float(2**60)
#: SQL text of :data:`RUN_RANK`.
RUN_RANK_SQL = "1152921504606846976.0"

_QUALIFIES = re.compile(rf"[A-Za-z0-9]{{{MIN_CHARS},}}")
_ASCII_ALNUM = re.compile(r"[A-Za-z0-9]")
_OPERATORS = ("AND", "OR", "NOT")
#: What may not touch an occurrence (and what the ASCII side of a CJK run is not).
_NOT_ALNUM = "[^A-Za-z0-9]"
_CJK = f"[{CJK_CLASS}]"


@dataclass(frozen=True, slots=True)
class Term:
    """A qualifying term: its text (ASCII letters and digits) and whether it is a prefix."""

    text: str
    prefix: bool


@dataclass(frozen=True, slots=True)
class OrGroup:
    """One OR-group of a word query, as this lookup reads it.

    ``positives``: each positive term as its MATCH item (for the word test) with its
    :class:`Term` when it qualifies; ``negatives``: each NOT unit as a MATCH string.
    """

    positives: tuple[tuple[str, Term | None], ...]
    negatives: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """The groups looked up inside CJK runs, and their distinct qualifying terms."""

    groups: tuple[OrGroup, ...]
    terms: tuple[Term, ...]


@dataclass(frozen=True, slots=True)
class RunsSQL:
    """A dialect's lookup of a :class:`Query`, to be read with the word route's page.

    ``source``: the FROM clause of candidate rows (``messages m`` and ``sessions s``,
    reached through the index that serves the lookup); ``where``: the conditions on
    them (no leading AND), word hits left out; ``sessions``: conditions (``" AND ..."``)
    keeping the sessions the trigram index holds; ``maybe_delegated``: where those are
    decided in Python, the condition on ``s`` of the sessions that may be sub-agent
    transcripts (left out here, and asked about when a lookup row is in one).
    """

    source: str
    where: str
    sessions: str
    maybe_delegated: str | None = None


def term_body(item: str) -> tuple[str, bool]:
    """A rendered term's text without phrase quotes and prefix star, and whether it had the star."""
    prefix = item.endswith("*")
    body = item[:-1] if prefix else item
    if len(body) >= 2 and body[0] == body[-1] == '"':
        body = body[1:-1]
    return body, prefix


@lru_cache(maxsize=256)
def parse(match: str) -> Query | None:
    """The lookup for a word query's sanitized MATCH string; None when no group has a
    qualifying term (the query is answered by the word index alone). Kept for recent
    queries, as the patterns below: pure functions of immutable values."""
    items = match_items(match)
    if any(near_parts(item) is not None for item in items):
        return None  # NEAR measures words: a query holding one is the word index's alone
    groups: list[OrGroup] = []
    terms: dict[Term, None] = {}
    for group in split_on(items, "OR"):
        positives: list[tuple[str, Term | None]] = []
        negatives: list[str] = []
        decidable = True
        for factor in split_on(group, "AND"):
            first, *negated = split_on(factor, "NOT")
            for item in first:
                text, prefix = term_body(item)
                if _QUALIFIES.fullmatch(text):
                    positives.append((item, Term(text, prefix)))
                elif _ASCII_ALNUM.search(text):
                    positives.append((item, None))
                elif not text.isascii():
                    decidable = False  # whether FTS5 gives it a word is the tokenizer's call
                # else: ASCII without a letter or digit: no word, FTS5 leaves it out
            negatives += [" ".join(unit) for unit in negated]
        found = [t for _item, t in positives if t is not None]
        if decidable and found:
            groups.append(OrGroup(tuple(positives), tuple(negatives)))
            terms.update(dict.fromkeys(found))
    return Query(tuple(groups), tuple(terms)) if groups else None


def _cased(text: str, cls: Callable[[str], str]) -> str:
    """``text`` as a pattern of explicit classes: each letter in both cases (GLOB and
    ``~`` are case-sensitive; the word index folds ASCII case)."""
    return "".join(cls(ch) if ch.isalpha() else ch for ch in text)


def glob_patterns(term: Term) -> list[str]:
    """SQLite GLOB patterns of which one matches a column holding ``term`` inside a CJK run."""
    body = _cased(term.text, lambda ch: f"[{ch.lower()}{ch.upper()}]")
    if term.prefix:
        return [f"*{_CJK}{body}*"]
    return [f"*{_CJK}{body}{_NOT_ALNUM}*", f"*{_CJK}{body}", f"*{_NOT_ALNUM}{body}{_CJK}*", f"{body}{_CJK}*"]


def _escaped(cls: str) -> str:
    """A regex class written in ASCII: PostgreSQL's ``\\uXXXX``/``\\UXXXXXXXX`` for each
    other character. The pattern is a bind value, sent in the connection's encoding,
    and a LATIN1 database's connection cannot carry CJK characters."""
    return "".join(ch if ord(ch) < 0x80 else (f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
                   for ch in cls)


#: :data:`_CJK` for PostgreSQL bind values (see :func:`_escaped`).
_CJK_ASCII = _escaped(_CJK)


@lru_cache(maxsize=256)
def regex(term: Term) -> str:
    """The same test as one PostgreSQL regular expression (ASCII only, see :func:`_escaped`)."""
    body = _cased(term.text, lambda ch: f"[{ch.lower()}{ch.upper()}]")
    if term.prefix:
        return f"{_CJK_ASCII}{body}"
    return f"{_CJK_ASCII}{body}({_NOT_ALNUM}|$)|(^|{_NOT_ALNUM}){body}{_CJK_ASCII}"


@lru_cache(maxsize=256)
def regex_beside_non_ascii(term: Term) -> str:
    """A PostgreSQL regular expression every text matching :func:`regex` matches too: the
    term with a character outside ASCII on one side (before it, for a prefix). Simple
    enough for an index to serve and a planner to read cheaply."""
    body = _cased(term.text, lambda ch: f"[{ch.lower()}{ch.upper()}]")
    other = "[^\\x01-\\x7f]"
    return f"{other}{body}" if term.prefix else f"{other}{body}|{body}{other}"


def condition(query: Query, in_run: Callable[[Term], str], has_words: Callable[[str], str]) -> str:
    """SQL true for a row the word query matches once its qualifying terms may also sit
    inside CJK runs (module docstring). ``in_run`` writes the run test of a term,
    ``has_words`` the word test of a MATCH string; both bind their own values."""
    parts = []
    for group in query.groups:
        conds = [f"({has_words(item)} OR {in_run(term)})" if term is not None else has_words(item)
                 for item, term in group.positives]
        conds += [f"NOT {has_words(unit)}" for unit in group.negatives]
        parts.append("(" + " AND ".join(conds) + ")")
    return "(" + " OR ".join(parts) + ")"


def any_in_run(query: Query, in_run: Callable[[Term], str]) -> str:
    """SQL true for a row holding some qualifying term inside a CJK run (the lookup's
    index-served part)."""
    return "(" + " OR ".join(in_run(t) for t in query.terms) + ")"


def first_run(value: str, terms: Sequence[Term]) -> tuple[int, int] | None:
    """(start, end) of the first occurrence of any of ``terms`` inside a CJK run."""
    spans = [found.span() for term in terms if (found := _lookaround(term).search(value)) is not None]
    return min(spans) if spans else None


@lru_cache(maxsize=256)
def _lookaround(term: Term) -> re.Pattern[str]:
    """:func:`regex` with the neighbours as look-arounds: the match is the term itself."""
    body = _cased(term.text, lambda ch: f"[{ch.lower()}{ch.upper()}]")
    if term.prefix:
        return re.compile(f"(?<={_CJK}){body}")
    return re.compile(f"(?<={_CJK}){body}(?![A-Za-z0-9])|(?<![A-Za-z0-9]){body}(?={_CJK})")


def snippet(texts: Sequence[Any], terms: Sequence[Term], radius: int = 40) -> str:
    """A snippet of a row found inside a CJK run: the first such occurrence marked."""
    for value in texts[:2]:  # content, tool name: what the lookup reads
        if not isinstance(value, str) or not value:
            continue
        span = first_run(value, terms)
        if span is None:
            continue
        at, end = span
        start, stop = max(at - radius, 0), min(end + radius, len(value))
        return ((SNIPPET_ELLIPSIS if start else "") + value[start:at] + SNIPPET_OPEN + value[at:end]
                + SNIPPET_CLOSE + value[end:stop] + (SNIPPET_ELLIPSIS if stop < len(value) else ""))
    first = texts[0] if texts and isinstance(texts[0], str) else ""
    return first[: 2 * radius]
