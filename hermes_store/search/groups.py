"""A sanitized MATCH string read as the substring routes read it (pure, no database).

FTS5 answers word and trigram queries itself; every route that matches by substring
(LIKE: short CJK terms, tool rows beside the trigram index, a stale index, a rebuild
window, PostgreSQL's CJK queries) reads the query here, as OR-ed groups of terms that
must all be present and units that must not be.
"""

from __future__ import annotations

from .query import TRIGRAM_CHARS, item_terms, match_items, split_on

#: A boolean query as FTS5 reads it: an OR of groups; a group needs all its positive
#: terms and none of its NOT-ed units (each unit: terms that must all be present).
Groups = list[tuple[list[str], list[list[str]]]]

#: Characters a term needs to be a trigram term: FTS5's trigram tokenizer gives a
#: shorter one no token at all.
MIN_TRIGRAM_CHARS = TRIGRAM_CHARS


def boolean_groups(match: str) -> Groups:
    """Read a sanitized MATCH string with FTS5's precedence, for LIKE to mirror it.

    FTS5's grammar binds space-joined terms tightest, then NOT, then AND, then OR:
    ``a b NOT c d OR e`` is ``((a AND b) AND NOT (c AND d)) OR e``. A ``NEAR(a b, N)``
    group is read as its two terms (a substring test cannot count words): only the
    stale-index scan meets one, CJK plans have it read so already.
    """
    items = match_items(match)  # operators are bare; a quoted "AND" is a term
    groups: Groups = []
    for group in split_on(items, "OR"):
        positives: list[str] = []
        negatives: list[list[str]] = []
        for factor in split_on(group, "AND"):
            first, *negated = split_on(factor, "NOT")
            positives += [term_text(t) for i in first for t in item_terms(i)]
            negatives += [[term_text(t) for i in unit for t in item_terms(i)] for unit in negated]
        groups.append((positives, negatives))
    return groups


def substring_groups(match: str) -> Groups:
    """The short-CJK substring route's reading of a sanitized MATCH string: any one
    positive term matches (Hermes' LIKE scan ORs its terms), with the exclusions of its
    own OR branch (``数据 NOT 迁移``, ``数据 -迁移``)."""
    groups: Groups = []
    for positives, negatives in boolean_groups(match):
        for term in positives:
            if ([term], negatives) not in groups:
                groups.append(([term], negatives))
    return groups


def trigram_groups(match: str) -> Groups:
    """:func:`boolean_groups` as FTS5's trigram index reads them, for LIKE to mirror it.

    A term of fewer than three characters has no trigram, and FTS5 then leaves it out:
    next to other terms it asks nothing (``C++ 数据库`` is ``数据库``), a group of only
    such terms matches nothing, and NOT-ing only such terms excludes nothing.
    """
    groups: Groups = []
    for positives, negatives in boolean_groups(match):
        kept = [t for t in positives if len(t) >= MIN_TRIGRAM_CHARS]
        if kept:
            units = ([t for t in unit if len(t) >= MIN_TRIGRAM_CHARS] for unit in negatives)
            groups.append((kept, [u for u in units if u]))
    return groups


def term_text(item: str) -> str:
    """A rendered term without its prefix star and phrase quotes."""
    item = item[:-1] if item.endswith("*") else item
    return item[1:-1] if len(item) >= 2 and item[0] == item[-1] == '"' else item
