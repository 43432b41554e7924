"""Short-CJK search index (revision hs0001): adjacent CJK pairs per block of 64 messages.

A CJK term of two characters has no trigram, so without help it needs a LIKE scan of
every message. Here each message's content, tool name and tool calls are cut into
pairs of adjacent CJK characters and stored as ``(gram, block)`` with
``block = id // 64``. A search for a term takes the blocks that hold *all* of the
term's pairs, and verifies the messages of those blocks with the same LIKE as a plain
scan, so stale entries cost time but never correctness.

Coverage: the index holds messages up to ``state_meta[HIGH_WATER_KEY]``.
Newer rows (for example written by Hermes itself) are scanned directly; older rows
that changed are listed by triggers in ``messages_cjk_bigram_dirty`` and scanned until
a catch-up re-indexes their blocks. Keeping the index current (catch-up, rebuild, and
when the mark may move) is :mod:`.bigram_upkeep`; this module is the search side.
"""

from __future__ import annotations

import re
import weakref
from typing import Any
from collections.abc import Sequence

from sqlalchemy import text

from ..dialects import for_connection
from ..keys import BIGRAM_HIGH_WATER_KEY
from ..tenancy import SchemaSQL, render, schema_of_connection
from .query import CJK_CLASS

BLOCK = 64
HIGH_WATER_KEY = BIGRAM_HIGH_WATER_KEY
TABLE = "messages_cjk_bigram"
DIRTY_TABLE = "messages_cjk_bigram_dirty"

_RUN = re.compile(f"[{CJK_CLASS}]{{2,}}")
#: A high-water value that reads as a number (the PostgreSQL trigger of hs0003 reads
#: the same ones); anything else means -1, nothing indexed.
_MARK = re.compile(r"[ \t\n\r]*[-+]?[0-9]{1,18}[ \t\n\r]*")
#: Per engine and tenant schema: the high-water mark the cached pair counts were read
#: at, and the counts (tenants sharing an engine each have their own index).
_COUNTS: weakref.WeakKeyDictionary[Any, dict[str | None, tuple[int, dict[str, int]]]] = weakref.WeakKeyDictionary()
_MAX_CACHED = 4096

# Every statement names its tables in the connection's tenant schema (bare on SQLite).
_HIGH_WATER = SchemaSQL("SELECT value FROM {state_meta} WHERE key = :k")


def bigrams(text: str | None) -> set[str]:
    """Every pair of adjacent CJK characters in ``text``."""
    if not text:
        return set()
    out: set[str] = set()
    for run in _RUN.findall(text):
        out.update(run[i:i + 2] for i in range(len(run) - 1))
    return out


def term_bigrams(term: str) -> list[str]:
    """The pairs a message must hold to contain ``term`` ([] when the index can't help)."""
    return sorted(bigrams(term))


def parse_high_water(value: Any) -> int:
    """A stored high-water value as a message id; -1 (nothing indexed, everything is
    scanned) when there is none or it does not read as a number."""
    if isinstance(value, str) and _MARK.fullmatch(value):
        return int(value)
    return -1


def high_water(conn: Any) -> int:
    row = conn.execute(_HIGH_WATER.on(conn), {"k": HIGH_WATER_KEY}).first()
    return parse_high_water(row[0] if row else None)


def installed(conn: Any) -> bool:
    """Whether the connection's schema has the bigram index table."""
    return for_connection(conn).has_table(conn, TABLE)


def candidate_blocks_sql(term_grams: Sequence[Sequence[str]], params: dict[str, Any]) -> str:
    """SQL selecting candidate blocks: blocks holding all pairs of any term, plus dirty ones.

    Fills ``params`` with the bind values it uses. A template: tables are written
    ``{messages_cjk_bigram}``, for the caller to render in the connection's schema.
    """
    parts = []
    for t, grams in enumerate(term_grams):
        names = []
        for g, gram in enumerate(grams):
            params[f"bg{t}_{g}"] = gram
            names.append(f":bg{t}_{g}")
        parts.append(
            f"SELECT block FROM {{{TABLE}}} WHERE gram IN ({', '.join(names)}) GROUP BY block"
            f" HAVING count(*) = {len(grams)}"
        )
    parts.append(f"SELECT block FROM {{{DIRTY_TABLE}}}")
    return " UNION ".join(parts)


def _cached(conn: Any) -> tuple[dict[str | None, tuple[int, dict[str, int]]], str | None]:
    """The pair counts kept for ``conn``'s engine (per schema), and its schema."""
    engine = getattr(conn, "engine", None)
    per_schema = _COUNTS.setdefault(engine, {}) if engine is not None else {}
    return per_schema, schema_of_connection(conn)


def missing_pairs(conn: Any, term_grams: Sequence[Sequence[str]]) -> list[str]:
    """The pairs whose counts are not kept for the mark last seen: what a caller that
    reads the high-water mark anyway reads with it (:func:`pair_counts_sql`)."""
    per_schema, schema = _cached(conn)
    cached = per_schema.get(schema)
    known = cached[1] if cached is not None else {}
    return sorted({g for grams in term_grams for g in grams} - known.keys())


def pair_counts_sql(n: int) -> str:
    """Rows ``(1, gram, block count, NULL)`` of the pairs bound as ``:pc0`` … ``:pc{n-1}``,
    to be read in the same statement as the high-water mark. A template, as above."""
    names = ", ".join(f":pc{i}" for i in range(n))
    return f"SELECT 1, gram, count(*), NULL FROM {{{TABLE}}} WHERE gram IN ({names}) GROUP BY gram"


def estimate_blocks(conn: Any, term_grams: Sequence[Sequence[str]], *, mark: int | None = None,
                    counts: dict[str, int] | None = None) -> int:
    """Upper bound of candidate blocks: per term, the rarest pair's block count.

    Pair counts only change when the index catches up, which moves the high-water mark,
    so they are kept per engine for the mark they were read at: a search reads only the
    pairs it has not seen yet, all in one query. A count that went stale otherwise (a
    dirty block re-indexed) only steers the choice between two correct plans. A caller
    that read the high-water mark already passes it as ``mark``, and the ``counts`` it
    read with it (:func:`missing_pairs`), saving the round trips.
    """
    if mark is None:
        mark = high_water(conn)
    per_schema, schema = _cached(conn)
    cached = per_schema.get(schema)
    known = cached[1] if cached is not None and cached[0] == mark else {}
    if counts:
        known.update(counts)
    missing = sorted({g for grams in term_grams for g in grams} - known.keys())
    if missing:
        if len(known) + len(missing) > _MAX_CACHED:
            known = {g: n for g, n in known.items() if any(g in grams for grams in term_grams)}
        names = {f"g{i}": g for i, g in enumerate(missing)}
        found = dict(conn.execute(text(render(
            f"SELECT gram, count(*) FROM {{{TABLE}}} WHERE gram IN ({', '.join(':' + n for n in names)}) GROUP BY gram",
            schema,
        )), names).all())
        known.update({g: int(found.get(g, 0)) for g in missing})
    if len(known) > _MAX_CACHED:
        known = {g: known[g] for grams in term_grams for g in grams}
    per_schema[schema] = (mark, known)
    return sum(min(known[g] for g in grams) for grams in term_grams if grams)
