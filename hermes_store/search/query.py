"""Turning a user's search string into something SQLite FTS5 accepts (pure functions).

Search boxes receive anything: half-typed quotes, pasted code, e-mail addresses, CJK
text, emoji. FTS5 answers a malformed MATCH with an OperationalError, so every query is
rebuilt here from tokens into a string that is always valid FTS5 syntax (or empty),
while keeping what the user meant. The same string drives every route and both
backends (PostgreSQL reads it as a tsquery, :mod:`hermes_store.search.postgresql`).

The grammar (issue 30; operators are upper case, as in FTS5: ``and``/``or``/``not``/
``near`` are ordinary words):

* ``a b`` — both (implicit AND). ``a AND b`` is the same.
* ``a OR b`` — either. Space-joined terms bind tightest, then NOT, AND, OR (FTS5's
  precedence): ``a b OR c`` is ``(a b) OR c``.
* ``a NOT b`` — a without b. Infix NOT keeps FTS5's meaning: ``a NOT b c`` excludes
  rows holding both b and c.
* ``-b`` — exclusion: ``a -b`` is ``a NOT b``. The ``-`` must start a word (after a
  space, or the query's start) and be a single dash: ``chat-send`` stays one term
  (a phrase of its parts), ``--verbose`` is the word ``verbose``, ``"a b"-c`` is two
  terms. ``-"a b"`` excludes a phrase, ``-NEAR(a b)`` a NEAR group. An exclusion
  belongs to its OR branch: ``a -b OR c`` is ``(a NOT b) OR c``.
* ``NOT b`` at the start of the query or of an OR branch excludes the one term after
  it, like ``-b``: ``NOT b a`` is ``a NOT b``.
* A query (or OR branch) of exclusions only looks for nothing: ``NOT kubernetes`` and
  ``-kubernetes`` return no rows (never "everything but"), and ``a OR -b`` is ``a``.
* ``"a b"`` — a phrase: the words in that order, adjacent, within one column.
* ``deplo*`` — prefix; ``"a b"*`` puts the prefix on the phrase's last word. Any other
  ``*`` is dropped (``*deploy`` is ``deploy``; runs collapse).
* ``NEAR(a b)`` / ``NEAR(a b, N)`` — a and b (words, phrases or prefixes) in one
  column, either order, at most N words between them (default :data:`NEAR_DEFAULT`,
  at most :data:`NEAR_MAX`: a larger N is read as that). FTS5's own NEAR on SQLite; on
  PostgreSQL ``a <k> b | b <k> a`` for k = 0..N+1, rechecked with the columns kept
  apart. NEAR takes exactly two terms: with more (or an unclosed ``NEAR(``) its terms
  are searched anywhere (implicit AND); with one, that term. In CJK queries NEAR is
  read as its terms anywhere (CJK text has no word positions to count).
* Parentheses group nothing: outside ``NEAR(...)`` they are spaces, as are
  ``+ { } ^ :`` (FTS5 column filters and the like are not offered). An unclosed quote
  is dropped; an operator with nothing on one side is dropped; of a run of operators
  the last is kept (``AND NOT`` is ``NOT``).
* Punctuation around a term is trimmed (``hello!``); a term joined by punctuation
  (``chat-send``, ``P2.2``, ``sp_new``, ``my-app.config.ts``) is quoted as a phrase.

Whatever was not taken as written (dropped quotes, dangling operators, exclusions only,
parentheses, a malformed NEAR, a cut query...) is told by :func:`query_note` in one
sentence, with the reading used; queries it says nothing about were read as written.

CJK text has no spaces between words, so the word index cannot find a term inside a
sentence; such queries go to the trigram index, or — for terms shorter than three
characters, which trigrams cannot express — to a LIKE substring scan, which matches
any one positive term (Hermes' scan ORs them) without the exclusions of its OR branch.
plan_search() makes that routing decision.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from ..codec import clean_text
from ..keys import MAX_FTS5_QUERY_CHARS

__all__ = [
    "NEAR_DEFAULT",
    "NEAR_MAX",
    "QUERY_CHARS",
    "TRIGRAM_CHARS",
    "SearchPlan",
    "contains_cjk",
    "escape_like",
    "item_terms",
    "match_items",
    "near_parts",
    "plan_search",
    "query_note",
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
#: NEAR's default and largest distance (tokens between its two terms).
NEAR_DEFAULT = 10
NEAR_MAX = 50
#: Characters of a query that are read (Hermes' MAX_FTS5_QUERY_CHARS; the repository cuts there).
QUERY_CHARS = MAX_FTS5_QUERY_CHARS
_STARS_RE = re.compile(r"\*+")
#: Characters in a trigram: a shorter term gives FTS5's trigram tokenizer (and a
#: pg_trgm index) nothing to look up.
TRIGRAM_CHARS = 3
_MIN_TRIGRAM_CJK = TRIGRAM_CHARS


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


@dataclass(frozen=True, slots=True)
class _Near:
    """``NEAR(a b, N)``: both terms in one column with at most N tokens between them."""

    terms: tuple[_Term, _Term]
    distance: int

    def render(self) -> str:
        return f"NEAR({self.terms[0].render()} {self.terms[1].render()}, {self.distance})"


_Operand = _Term | _Near


@dataclass(frozen=True, slots=True)
class _Neg:
    """An exclusion (``-term``, or a ``NOT`` that starts a query or an OR branch)."""

    unit: tuple[_Operand, ...]


_Item = _Term | _Near | _Neg | str  # a str item is an operator


class _Notes:
    """What a query held that the grammar did not take as written (an ordered set)."""

    def __init__(self) -> None:
        self.items: dict[str, None] = {}

    def add(self, note: str) -> None:
        self.items.setdefault(note, None)


def _terms_of_chunk(chunk: str, notes: _Notes | None = None) -> list[_Term]:
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
        if i < last and not prefix and notes is not None:
            notes.add("a * that does not end a word was ignored")
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


# ------------------------------------------------------------------ lexing

#: Outside phrases these characters are separators (FTS5 syntax we do not offer).
_SEPARATORS = "+{}()^:"
_CHUNK_RE = re.compile(r'[^\s"+{}()^:]+')
_NEAR_OPEN_RE = re.compile(r"(-?)NEAR[^\S\n]*\(")
_DIGITS_RE = re.compile(r"[0-9]+")


def _at_word_start(text: str, pos: int) -> bool:
    return pos == 0 or text[pos - 1].isspace() or text[pos - 1] in _SEPARATORS


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: Literal["phrase", "near", "close", "sep", "chunk"]
    text: str = ""
    #: phrase: a ``*`` follows; chunk: starts a word (may be an exclusion)
    flag: bool = False
    #: phrase or NEAR: an exclusion (a single ``-`` right before it, at a word start)
    neg: bool = False


def _lex(text: str, notes: _Notes) -> list[_Tok]:
    toks: list[_Tok] = []
    pos, n = 0, len(text)
    while pos < n:
        ch = text[pos]
        if ch.isspace():
            pos += 1
        elif ch == '"':
            end = text.find('"', pos + 1)
            if end < 0:
                notes.add("an unclosed quote was ignored")
                pos += 1
                continue
            neg = bool(toks) and toks[-1].kind == "chunk" and toks[-1].text == "-" and toks[-1].flag \
                and pos > 0 and text[pos - 1] == "-"
            if neg:
                toks.pop()
            star = text.startswith("*", end + 1)
            toks.append(_Tok("phrase", text[pos + 1:end], star, neg))
            pos = end + 1
            while star and pos < n and text[pos] == "*":  # "phrase"* : a prefix on its last token
                pos += 1
        elif (m := _NEAR_OPEN_RE.match(text, pos)) is not None and _at_word_start(text, pos):
            toks.append(_Tok("near", neg=bool(m.group(1))))
            pos = m.end()
        elif ch == ")":
            toks.append(_Tok("close", ch))
            pos += 1
        elif ch in _SEPARATORS:
            toks.append(_Tok("sep", ch))
            pos += 1
        else:
            m = _CHUNK_RE.match(text, pos)
            assert m is not None  # any other character starts a chunk
            toks.append(_Tok("chunk", m.group(), _at_word_start(text, pos)))
            pos = m.end()
    return toks


# ------------------------------------------------------------------ parsing


def _near(toks: list[_Tok], i: int, neg: bool, notes: _Notes) -> tuple[list[_Item], int]:
    """The NEAR group whose body starts at ``toks[i]``: its items and the next index."""
    bits: list[_Term | str] = []  # terms, "," and digit-only pieces as "#<digits>"
    closed = False
    while i < len(toks):
        tok = toks[i]
        i += 1
        if tok.kind == "close":
            closed = True
            break
        if tok.kind == "phrase":
            if tok.text.strip():
                bits.append(_Term(tok.text, True, tok.flag))
            if tok.neg:
                notes.add("a - inside NEAR(...) was ignored")
        elif tok.kind == "near":
            notes.add("a NEAR( inside NEAR(...) was ignored")
        elif tok.kind == "sep":
            if tok.text == "(":
                notes.add("parentheses group nothing (only NEAR(...) uses them) and were ignored")
        else:
            for k, piece in enumerate(tok.text.split(",")):
                if k:
                    bits.append(",")
                if piece in _OPERATORS:
                    notes.add(f'"{piece}" inside NEAR(...) was ignored')
                elif _DIGITS_RE.fullmatch(piece):
                    bits.append("#" + piece)
                else:
                    if piece.startswith("-") and piece[1:2] != "-" and len(piece) > 1:
                        notes.add("a - inside NEAR(...) was ignored")
                    bits.extend(_terms_of_chunk(piece, notes))
    distance = NEAR_DEFAULT
    if len(bits) >= 2 and bits[-2] == "," and isinstance(bits[-1], str) and bits[-1].startswith("#"):
        distance = int(bits[-1][1:])
        bits = bits[:-2]
        if distance > NEAR_MAX:
            notes.add(f"a NEAR distance over {NEAR_MAX} was read as {NEAR_MAX}")
            distance = NEAR_MAX
    if "," in bits:
        notes.add("a comma inside NEAR(...) that does not give its distance was ignored")
    terms = [b if isinstance(b, _Term) else _Term(b[1:], False, False) for b in bits if b != ","]
    if not closed:
        notes.add("NEAR( without its ) was read as plain terms")
        return list(terms), i
    if len(terms) != 2:
        if terms:
            notes.add("NEAR(...) takes two terms; these were searched anywhere")
        else:
            notes.add("an empty NEAR() was ignored")
        if neg and terms:
            return [_Neg(tuple(terms))], i
        return list(terms), i
    group = _Near((terms[0], terms[1]), distance)
    return [_Neg((group,)) if neg else group], i


def _items(text: str, notes: _Notes) -> list[_Item]:
    """The query as terms, NEAR groups, exclusions and operators, in the order written."""
    toks = _lex(text, notes)
    items: list[_Item] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        i += 1
        if tok.kind == "near":
            found, i = _near(toks, i, tok.neg, notes)
            items.extend(found)
        elif tok.kind == "phrase":
            if tok.text.strip():
                term = _Term(tok.text, True, tok.flag)
                items.append(_Neg((term,)) if tok.neg else term)
        elif tok.kind in ("close", "sep"):
            if tok.text in "()":
                notes.add("parentheses group nothing (only NEAR(...) uses them) and were ignored")
        elif tok.text in _OPERATORS:
            items.append(tok.text)
        else:
            chunk = tok.text
            neg = tok.flag and len(chunk) > 1 and chunk[0] == "-" and chunk[1] != "-"
            terms = _terms_of_chunk(chunk[1:] if neg else chunk, notes)
            if neg and terms:
                items.append(_Neg(tuple(terms)))
            else:
                items.extend(terms)
    return items


@dataclass(slots=True)
class _Parsed:
    #: OR branches: each its positive items (operands and AND/NOT between them) and exclusions
    branches: list[tuple[list[_Item], list[tuple[_Operand, ...]]]]
    notes: _Notes
    has_near: bool


def _branch(elements: list[_Item], notes: _Notes) -> tuple[list[_Item], list[tuple[_Operand, ...]]]:
    """One OR branch: exclusions taken out, leading NOT read as one, operators tidied."""
    rest: list[_Item] = []
    excluded: list[tuple[_Operand, ...]] = []
    skip_and = False
    j = 0
    while j < len(elements):
        e = elements[j]
        j += 1
        if skip_and and e == "AND":
            skip_and = False
            continue
        skip_and = False
        if isinstance(e, _Neg):
            if rest and rest[-1] == "NOT":
                notes.add('"NOT -term" was read as "NOT term"')
                rest.extend(e.unit)
                continue
            excluded.append(e.unit)
            if rest and rest[-1] == "AND":
                rest.pop()
            else:
                skip_and = True
            continue
        if e == "NOT" and not any(not isinstance(r, str) for r in rest):
            nxt = elements[j] if j < len(elements) else None
            if nxt is not None and not isinstance(nxt, str):
                # A NOT with nothing before it excludes the one operand after it, as -term does.
                excluded.append(nxt.unit if isinstance(nxt, _Neg) else (nxt,))
                j += 1
                if rest and rest[-1] == "AND":
                    rest.pop()
                else:
                    skip_and = True
                continue
        rest.append(e)
    # Binary operators need an operand on both sides.
    tidy: list[_Item] = []
    pending: str | None = None
    for e in rest:
        if isinstance(e, str):
            if not tidy:
                notes.add(f'"{e}" with nothing before it was ignored')
            elif pending is not None and not (pending == "AND" and e == "NOT"):
                notes.add(f'"{pending} {e}" was read as "{e}"')
            if tidy:
                pending = e
            continue
        if pending is not None:
            tidy.append(pending)
            pending = None
        tidy.append(e)
    if pending is not None:
        notes.add(f'"{pending}" with nothing after it was ignored')
    return tidy, excluded


def _parse(query: str) -> _Parsed:
    """Tokenize a user query and arrange it as FTS5 reads it (see the module docstring)."""
    notes = _Notes()
    text = clean_text(query).replace("\x00", " ")  # FTS5 cannot hold NUL, even quoted
    items = _items(text, notes)
    groups: list[list[_Item]] = [[]]
    for item in items:
        if item == "OR":
            groups.append([])
        else:
            groups[-1].append(item)
    branches = []
    excluded_any = False
    for k, group in enumerate(groups):
        if not group:
            if len(groups) > 1:
                where = "before" if k == 0 else "after" if k == len(groups) - 1 else "between"
                notes.add('"OR" with nothing before it was ignored' if where == "before" else
                          '"OR" with nothing after it was ignored' if where == "after" else
                          '"OR OR" was read as "OR"')
            continue
        positive, excluded = _branch(group, notes)
        excluded_any = excluded_any or bool(excluded)
        if any(not isinstance(e, str) for e in positive):
            branches.append((positive, excluded))
        elif excluded and len(groups) > 1:
            notes.add("an OR branch with only exclusions matches nothing and was dropped")
    if excluded_any and not branches:
        notes.add("the query only excludes terms, so there is nothing to look for")
    has_near = any(isinstance(e, _Near) for pos, exc in branches for e in (*pos, *(o for u in exc for o in u)))
    return _Parsed(branches, notes, has_near)


def _render_operand(op: _Operand, flat: bool) -> str:
    if isinstance(op, _Near) and flat:
        return " ".join(t.render() for t in op.terms)
    return op.render()


def _render(parsed: _Parsed, flat: bool = False) -> str:
    """The MATCH string; ``flat``: NEAR groups as their plain terms (CJK routes)."""
    out = []
    for positive, excluded in parsed.branches:
        text = " ".join(e if isinstance(e, str) else _render_operand(e, flat) for e in positive)  # type: ignore[arg-type]
        for unit in excluded:
            text += " NOT " + " ".join(_render_operand(op, flat) for op in unit)
        out.append(text)
    return " OR ".join(out)


def _terms(parsed: _Parsed) -> list[str]:
    found: list[str] = []
    for positive, excluded in parsed.branches:
        for op in (*positive, *(o for unit in excluded for o in unit)):
            if isinstance(op, _Term):
                found.append(op.text)
            elif isinstance(op, _Near):
                found.extend(t.text for t in op.terms)
    return found


def sanitize_fts5_query(query: str) -> str:
    """Rewrite any user string as valid FTS5 MATCH syntax (possibly empty).

    Keeps balanced "phrases", implicit AND, uppercase AND/OR/NOT, prefix* and
    ``NEAR(a b, N)``; reads ``-term`` and a leading NOT as exclusions; turns other FTS5
    syntax characters into spaces; trims punctuation around terms and quotes terms
    joined by punctuation (``chat-send`` → ``"chat-send"``). Lowercase and/or/not/near
    are ordinary words, as in FTS5 itself. The same string as ``plan_search(query).match``.
    """
    if not query:
        return ""
    return plan_search(query).match


@dataclass(frozen=True, slots=True)
class SearchPlan:
    """How to run a search.

    kind: ``empty`` (return nothing), ``word`` (word FTS index, ``match``), ``trigram``
    (trigram FTS index, ``match``) or ``substring`` (LIKE scan: any one positive term of
    ``match``, without its OR branch's exclusions; escape terms with escape_like).
    ``match`` is always ``sanitize_fts5_query(query)`` (NEAR groups read as their terms
    on the CJK routes); ``terms`` are the query's distinct terms (excluded ones and
    NEAR's included) without quotes or ``*``, in order, for every non-empty plan.
    """

    kind: Literal["empty", "word", "trigram", "substring"]
    match: str
    terms: tuple[str, ...]


_EMPTY_PLAN = SearchPlan("empty", "", ())


def _plan(query: str) -> tuple[SearchPlan, _Parsed | None]:
    if not query or not query.strip():
        return _EMPTY_PLAN, None
    parsed = _parse(query)
    terms = _terms(parsed)
    if not terms:
        return _EMPTY_PLAN, parsed
    unique_terms = tuple(dict.fromkeys(terms))
    cjk_counts = [_cjk_count(t) for t in terms]
    if not any(cjk_counts):
        return SearchPlan("word", _render(parsed), unique_terms), parsed
    # NEAR counts tokens, which CJK text does not have: its terms are searched anywhere.
    if sum(cjk_counts) >= _MIN_TRIGRAM_CJK and all(
        n >= _MIN_TRIGRAM_CJK for n in cjk_counts if n
    ):
        return SearchPlan("trigram", _render(parsed, flat=True), unique_terms), parsed
    return SearchPlan("substring", _render(parsed, flat=True), unique_terms), parsed


@lru_cache(maxsize=512)
def plan_search(query: str) -> SearchPlan:
    """Choose the index for a query.

    Trigrams need three characters, so a CJK query uses the trigram index only when it
    holds at least 3 CJK characters and every CJK-bearing term has at least 3; otherwise
    a substring scan is the only way to find short CJK words inside unspaced text.

    A plan is immutable and depends on the text alone: the plans of recent queries are
    kept, so a repeated search (a page after the first, a refresh) parses nothing.
    """
    return _plan(query)[0]


def query_note(query: str) -> str | None:
    """None when ``query`` is searched as written; else one short sentence saying what
    was not understood and how the query was read.

    The reading is the one :meth:`~hermes_store.repositories.search.SearchRepository.
    search_messages` uses (the query cut to :data:`QUERY_CHARS` characters first), e.g.
    ``query_note('"unclosed')`` is ``'An unclosed quote was ignored; searched for:
    unclosed.'``. Reported: unclosed quotes, operators with nothing to join, runs of
    operators, a query or OR branch of only exclusions, parentheses (they group
    nothing), misplaced ``*``, malformed ``NEAR(...)``, NEAR on CJK text, and short CJK
    terms, which are matched as any one of them. Never raises.
    """
    if not isinstance(query, str) or not query.strip():
        return None
    plan, parsed = _plan(query[:QUERY_CHARS])
    notes = list(parsed.notes.items) if parsed is not None else []
    if len(query) > QUERY_CHARS:
        notes.insert(0, f"only the first {QUERY_CHARS:,} characters were used")
    if parsed is not None and parsed.has_near and plan.kind in ("trigram", "substring"):
        notes.append("NEAR counts words, which CJK text does not separate: its terms were searched anywhere")
    if plan.kind == "substring" and any(
        sum(not isinstance(e, str) for e in positive) > 1 or len(parsed.branches) > 1  # type: ignore[union-attr]
        for positive, _excluded in parsed.branches  # type: ignore[union-attr]
    ):
        notes.append("terms shorter than 3 CJK characters match any one of them")
    if plan.kind == "empty" and not notes:
        notes.append("nothing in it can be searched for")
    if not notes:
        return None
    sentence = "; ".join(notes)
    sentence = sentence[0].upper() + sentence[1:]
    if plan.kind == "empty":
        return f"{sentence}; nothing was searched."
    return f"{sentence}; searched for: {plan.match}."


#: One item of a sanitized MATCH string: a NEAR group, a phrase (maybe a prefix) or a bare term/operator.
_NEAR_ITEM_RE = re.compile(r'NEAR\(((?:"[^"]*"\*?|[^\s"(),]+)(?: (?:"[^"]*"\*?|[^\s"(),]+))*), ([0-9]+)\)')
_NEAR_TERM_RE = re.compile(r'"[^"]*"\*?|[^\s"(),]+')
_MATCH_ITEM_RE = re.compile(_NEAR_ITEM_RE.pattern + r'|"[^"]*"\*?|\S+')


def match_items(match: str) -> list[str]:
    """The items of a sanitized MATCH string: terms, operators and whole NEAR groups."""
    return [m.group(0) for m in _MATCH_ITEM_RE.finditer(match)]


def near_parts(item: str) -> tuple[list[str], int] | None:
    """A NEAR item's two rendered terms and its distance; None for any other item."""
    m = _NEAR_ITEM_RE.fullmatch(item)
    if m is None:
        return None
    return _NEAR_TERM_RE.findall(m.group(1)), int(m.group(2))


def item_terms(item: str) -> list[str]:
    """The rendered terms of one item: a NEAR group's two, else the item itself."""
    near = near_parts(item)
    return near[0] if near is not None else [item]


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
