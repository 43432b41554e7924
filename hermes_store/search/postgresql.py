"""Full-text statements for PostgreSQL: the sanitized FTS5 syntax read as a tsquery.

The word index is ``messages.search_vector`` (revision hs0002): one ``simple``
tsvector per column, so like FTS5's unicode61 tokenizer nothing is stemmed and a
phrase never spans two columns. The repository binds ``:q`` to
:func:`tsquery_text` of the sanitized MATCH string (``to_tsquery('simple', :q)``
then normalizes each lexeme exactly as the vector was built).

FTS5 precedence is kept: space-joined terms bind tightest, then NOT, AND, OR. A term
becomes the phrase of its unicode61 tokens (``chat-send`` → ``chat <-> send``), ORed
with the term as PostgreSQL's own parser reads it, so a compound token the parser
keeps whole (an e-mail address, a host name, ``3.14``) is still found when the text
holds the same compound. Known differences from FTS5, by design of the parser: a
word *inside* such a compound (``example`` in ``user@example.com``) is not found,
and diacritics are not folded.

CJK queries never come here: they are answered by substring (ILIKE, served by the
``pg_trgm`` index) and the bigram block index, as the repository arranges.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .fts import SNIPPET_CLOSE, SNIPPET_OPEN, WORD_INDEX
from .query import split_on

__all__ = ["NO_MATCH", "delegated_sessions", "match_sql", "top_sql", "tsquery_text"]

#: A tsquery no document satisfies (a lexeme and its negation).
NO_MATCH = "'x' & !'x'"
#: PostgreSQL refuses lexemes of 2 KiB or more; such a word is never in a vector.
_MAX_LEXEME_BYTES = 2046
_ITEM = re.compile(r'"[^"]*"\*?|\S+')
_TOKEN = re.compile(r"[^\W_]+")
_HEADLINE = (
    f"'StartSel=\"{SNIPPET_OPEN}\", StopSel=\"{SNIPPET_CLOSE}\", MaxWords=15, MinWords=5, ShortWord=0, "
    "MaxFragments=1, FragmentDelimiter=\"...\"'"
)


def _lexeme(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def _term(item: str) -> str | None:
    """One FTS5 term as tsquery text; '' when it has no token (FTS5 ignores it); None
    when it can never match (a word too long for a PostgreSQL lexeme)."""
    prefix = item.endswith("*")
    body = item[:-1] if prefix else item
    if len(body) >= 2 and body[0] == body[-1] == '"':
        body = body[1:-1]
    tokens = [t.lower() for t in _TOKEN.findall(body)]
    if not tokens:
        return ""
    if any(len(t.encode("utf-8")) > _MAX_LEXEME_BYTES for t in tokens):
        return None
    words = [_lexeme(t) for t in tokens]
    if prefix:
        words[-1] += ":*"
    phrase = " <-> ".join(words)
    raw = body.lower()
    if not prefix and raw != tokens[0] and not any(c.isspace() for c in raw) \
            and len(raw.encode("utf-8")) <= _MAX_LEXEME_BYTES:
        return f"({phrase} | {_lexeme(raw)})"
    return f"({phrase})" if len(words) > 1 else phrase


def _all_of(items: list[str]) -> str | None:
    terms = [_term(i) for i in items]
    if any(t is None for t in terms):
        return None
    kept = [t for t in terms if t]
    return " & ".join(kept) if kept else None  # type: ignore[arg-type]


def tsquery_text(match: str) -> str:
    """``to_tsquery('simple', …)`` input with the meaning FTS5 gives ``match``.

    ``match`` is a sanitized MATCH string (:func:`~hermes_store.search.query.
    sanitize_fts5_query`). Returns :data:`NO_MATCH` when nothing can match.
    """
    groups = []
    for group in split_on(_ITEM.findall(match), "OR"):
        conds = []
        possible = True
        for factor in split_on(group, "AND"):
            first, *negated = split_on(factor, "NOT")
            positive = _all_of(first)
            if positive is None:
                possible = False
                break
            conds.append(f"({positive})")
            for unit in negated:
                excluded = _all_of(unit)
                if excluded is not None:  # a unit that never matches excludes nothing
                    conds.append(f"!({excluded})")
        if possible and conds:
            groups.append("(" + " & ".join(conds) + ")")
    return " | ".join(groups) if groups else NO_MATCH


def _check(index: str) -> None:
    if index != WORD_INDEX:
        raise ValueError(f"PostgreSQL has no full-text index {index!r}: CJK search goes by substring")


_QUERY = "to_tsquery('simple', :q)"


def _snippet(alias: str) -> str:
    """ts_headline of the first column that matches (FTS5's snippet picks a best column)."""
    parts = []
    for col, cut in (("content", 65536), ("tool_name", 4096), ("tool_calls", 32768)):
        value = f"left(COALESCE({alias}.{col}, ''), {cut})"
        parts.append(
            f"WHEN to_tsvector('simple', {value}) @@ {_QUERY} "
            f"THEN ts_headline('simple', {value}, {_QUERY}, {_HEADLINE})"
        )
    return f"(CASE {' '.join(parts)} ELSE left(COALESCE({alias}.content, ''), 80) END)"


def match_sql(index: str) -> str:
    """Hits of ``:q`` (tsquery text) with a snippet and a rank (lower is better, as bm25)."""
    _check(index)
    return (
        f"SELECT mx.id AS id, {_snippet('mx')} AS snippet, -ts_rank_cd(mx.search_vector, {_QUERY}) AS rank "
        f"FROM messages mx WHERE mx.search_vector @@ {_QUERY}"
    )


def top_sql(index: str) -> str:
    """The ``:window`` best-ranked hits of ``:q`` as (id, rank, snippet); snippets for those only."""
    _check(index)
    return (
        f"SELECT t.id, t.rank, {_snippet('mx')} FROM ("
        f"SELECT id, -ts_rank_cd(search_vector, {_QUERY}) AS rank, timestamp FROM messages "
        f"WHERE search_vector @@ {_QUERY} ORDER BY rank, timestamp DESC, id DESC LIMIT :window"
        f") t JOIN messages mx ON mx.id = t.id ORDER BY t.rank, t.timestamp DESC, t.id DESC"
    )


def delegated_sessions(conn: Any) -> list[str]:
    """Sessions whose ``model_config`` names a ``_delegate_from`` (sub-agent transcripts).

    SQLite decides this with ``json_extract`` over valid JSON only; PostgreSQL 15 has
    no safe JSON cast for text that may be malformed, so the few candidate rows (the
    marker as a substring) are parsed here with the same rule.
    """
    from sqlalchemy import text

    rows = conn.execute(text(
        "SELECT id, model_config FROM sessions WHERE model_config LIKE '%\\_delegate\\_from%' ESCAPE '\\'"
    )).fetchall()
    out = []
    for sid, config in rows:
        try:
            value = json.loads(config)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict) and value.get("_delegate_from") is not None:
            out.append(sid)
    return out
