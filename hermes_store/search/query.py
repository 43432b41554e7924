"""Turning a user's search string into something SQLite FTS5 accepts (pure functions).

Search boxes receive anything: half-typed quotes, pasted code, e-mail addresses, CJK
text, emoji. FTS5 answers a malformed MATCH with an OperationalError, so every query is
rebuilt here from tokens into a string that is always valid FTS5 syntax (or empty),
while keeping what the user meant: implicit AND, OR/NOT, "phrases" and prefix*.

CJK text has no spaces between words, so the word index cannot find a term inside a
sentence; such queries go to the trigram index, or — for terms shorter than three
characters, which trigrams cannot express — to a LIKE substring scan. plan_search()
makes that routing decision.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from ..codec import clean_text

__all__ = [
    "SearchPlan",
    "contains_cjk",
    "escape_like",
    "plan_search",
    "sanitize_fts5_query",
]

_CJK_CLASS = (
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\u3400-\u4dbf"  # extension A
    "\U00020000-\U0002a6df"  # extension B
    "\u3000-\u303f"  # CJK symbols and punctuation
    "\u3040-\u309f"  # hiragana
    "\u30a0-\u30ff"  # katakana
    "\uac00-\ud7af"  # hangul syllables
)
_CJK_RE = re.compile(f"[{_CJK_CLASS}]")
#: The character class above, for other modules (e.g. the bigram index) to share.
CJK_CLASS = _CJK_CLASS

_OPERATORS = frozenset({"AND", "OR", "NOT"})  # FTS5 operators are case-sensitive
_PHRASE_RE = re.compile(r'"([^"]*)"')
# Outside phrases these are FTS5 syntax (+ concatenation, {} column sets, () grouping,
# ^ initial token, : column filter) or an unbalanced quote: they become spaces.
_SPECIAL_RE = re.compile(r'[+{}()"^:]')
_STARS_RE = re.compile(r"\*+")
_MIN_TRIGRAM_CJK = 3


def contains_cjk(text: str) -> bool:
    """True when ``text`` holds a CJK ideograph, CJK punctuation, kana or hangul syllable."""
    return bool(text) and _CJK_RE.search(text) is not None


def _cjk_count(text: str) -> int:
    return len(_CJK_RE.findall(text))


@lru_cache(maxsize=4096)
def _is_word_char(ch: str) -> bool:
    """Whether ``ch`` may stand unquoted in an FTS5 term and carries meaning.

    ASCII: letters and digits only (``_`` joins words, the rest is FTS5 syntax or
    punctuation). Non-ASCII is always legal in an FTS5 bareword; we only treat
    punctuation, separators and invisible controls as non-word, so 「数据库」 or
    "smart quotes" around a term are trimmed while emoji and symbols stay searchable.
    """
    if ch < "\x80":
        return ch.isalnum()
    category = unicodedata.category(ch)
    return category[0] not in "PZ" and category not in ("Cc", "Cf", "Cs")


@dataclass(frozen=True, slots=True)
class _Term:
    text: str
    quoted: bool
    prefix: bool

    def render(self) -> str:
        body = f'"{self.text}"' if self.quoted else self.text
        return body + "*" if self.prefix else body


_Item = _Term | str  # a str item is an operator


def _terms_of_chunk(chunk: str) -> list[_Term]:
    """Split one whitespace-free chunk (outside phrases) into FTS5 terms.

    A ``*`` right after a word character marks a prefix query; any other ``*`` is
    dropped. Leading/trailing punctuation is trimmed ("hello!" → hello); a term that
    still contains non-word characters (chat-send, P2.2, sp_new, user@example.com,
    100%) is quoted as a phrase so the tokenizer matches its parts in order.
    """
    terms: list[_Term] = []
    pieces = _STARS_RE.sub("*", chunk).split("*")
    last = len(pieces) - 1
    for i, piece in enumerate(pieces):
        prefix = i < last and piece != "" and _is_word_char(piece[-1])
        start, end = 0, len(piece)
        while start < end and not _is_word_char(piece[start]):
            start += 1
        while end > start and not _is_word_char(piece[end - 1]):
            end -= 1
        text = piece[start:end]
        if not text:
            continue
        quoted = text in _OPERATORS or not all(_is_word_char(c) for c in text)
        terms.append(_Term(text, quoted, prefix))
    return terms


def _parse(query: str) -> list[_Item]:
    """Tokenize a user query into terms and operators, in a valid FTS5 order."""
    text = clean_text(query).replace("\x00", " ")  # FTS5 cannot hold NUL, even quoted
    raw: list[_Item] = []

    def outside(span: str, after_phrase: _Term | None) -> None:
        if span.startswith("*") and after_phrase is not None:
            # "exact phrase"* : prefix query on the phrase's last token.
            raw[-1] = _Term(after_phrase.text, True, True)
        for chunk in _SPECIAL_RE.sub(" ", span).split():
            if chunk in _OPERATORS:
                raw.append(chunk)
            else:
                raw.extend(_terms_of_chunk(chunk))

    pos = 0
    previous: _Term | None = None
    for m in _PHRASE_RE.finditer(text):
        outside(text[pos : m.start()], previous)
        previous = None
        if m.group(1).strip():
            previous = _Term(m.group(1), True, False)
            raw.append(previous)
        pos = m.end()
    outside(text[pos:], previous)

    # Binary operators need an operand on both sides: drop them at either end and keep
    # only the last of a run ("a AND NOT b" → "a NOT b", which is what was meant).
    items: list[_Item] = []
    pending: str | None = None
    for item in raw:
        if isinstance(item, str):
            if items:
                pending = item
            continue
        if pending is not None:
            items.append(pending)
            pending = None
        items.append(item)
    return items


def _render(items: list[_Item]) -> str:
    return " ".join(item if isinstance(item, str) else item.render() for item in items)


def sanitize_fts5_query(query: str) -> str:
    """Rewrite any user string as valid FTS5 MATCH syntax (possibly empty).

    Keeps balanced "phrases", implicit AND, uppercase AND/OR/NOT and prefix*; turns FTS5
    syntax characters into spaces; trims punctuation around terms and quotes terms
    joined by punctuation (``chat-send`` → ``"chat-send"``). Lowercase and/or/not are
    ordinary words, as in FTS5 itself.
    """
    if not query:
        return ""
    return _render(_parse(query))


@dataclass(frozen=True, slots=True)
class SearchPlan:
    """How to run a search.

    kind: ``empty`` (return nothing), ``word`` (word FTS index, ``match``), ``trigram``
    (trigram FTS index, ``match``) or ``substring`` (LIKE scan OR-ing ``terms``; escape
    them with escape_like). ``match`` is always ``sanitize_fts5_query(query)``;
    ``terms`` are the query's distinct non-operator terms without quotes or ``*``, in
    order, for every non-empty plan.
    """

    kind: Literal["empty", "word", "trigram", "substring"]
    match: str
    terms: tuple[str, ...]


_EMPTY_PLAN = SearchPlan("empty", "", ())


def plan_search(query: str) -> SearchPlan:
    """Choose the index for a query.

    Trigrams need three characters, so a CJK query uses the trigram index only when it
    holds at least 3 CJK characters and every CJK-bearing term has at least 3; otherwise
    a substring scan is the only way to find short CJK words inside unspaced text.
    """
    if not query or not query.strip():
        return _EMPTY_PLAN
    items = _parse(query)
    terms = [item.text for item in items if isinstance(item, _Term)]
    if not terms:
        return _EMPTY_PLAN
    unique_terms = tuple(dict.fromkeys(terms))
    cjk_counts = [_cjk_count(t) for t in terms]
    if not any(cjk_counts):
        return SearchPlan("word", _render(items), unique_terms)
    if sum(cjk_counts) >= _MIN_TRIGRAM_CJK and all(
        n >= _MIN_TRIGRAM_CJK for n in cjk_counts if n
    ):
        return SearchPlan("trigram", _render(items), unique_terms)
    return SearchPlan("substring", _render(items), unique_terms)


def escape_like(term: str, escape: str = "\\") -> str:
    """Escape ``%``, ``_`` and the escape character so LIKE matches ``term`` literally.

    Use with ``LIKE ? ESCAPE '\\'`` (or the chosen ``escape``); titles and search terms
    such as ``100%`` or ``sp_new`` must never act as wildcards.
    """
    if len(escape) != 1:
        raise ValueError("escape must be a single character")
    out = term.replace(escape, escape + escape)
    for wildcard in ("%", "_"):
        if wildcard != escape:
            out = out.replace(wildcard, escape + wildcard)
    return out


def split_on(items: list[str], operator: str) -> list[list[str]]:
    """Split a sanitized query's items at a bare boolean ``operator`` (empty parts dropped).

    FTS5's precedence is read by splitting at OR, then AND, then NOT; the SQLite
    substring route and the PostgreSQL tsquery builder both do it this way.
    """
    parts: list[list[str]] = [[]]
    for item in items:
        if item == operator:
            parts.append([])
        else:
            parts[-1].append(item)
    return [p for p in parts if p]
