"""Short-CJK search index (revision hs0001): adjacent CJK pairs per block of 64 messages.

The pure half (pairs, statement text, the high-water mark's reading); what reads and
keeps the index is :mod:`hermes_store.dialects.cjk_bigram`.

A CJK term of two characters has no trigram, so without help it needs a LIKE scan of
every message. Here each message's content, tool name and tool calls are cut into
pairs of adjacent CJK characters and stored as ``(gram, block)`` with
``block = id // 64``. A search for a term takes the blocks that hold *all* of the
term's pairs, and verifies the messages of those blocks with the same LIKE as a plain
scan, so stale entries cost time but never correctness.

Coverage: the index holds messages up to ``state_meta[HIGH_WATER_KEY]``.
Newer rows (for example written by Hermes itself) are scanned directly; older rows
that changed are listed by triggers in ``messages_cjk_bigram_dirty`` and scanned until
a catch-up re-indexes their blocks.
"""

from __future__ import annotations

import re
from typing import Any
from collections.abc import Sequence

from ..keys import BIGRAM_HIGH_WATER_KEY
from .query import CJK_CLASS

BLOCK = 64
HIGH_WATER_KEY = BIGRAM_HIGH_WATER_KEY
TABLE = "messages_cjk_bigram"
DIRTY_TABLE = "messages_cjk_bigram_dirty"

_RUN = re.compile(f"[{CJK_CLASS}]{{2,}}")
#: A high-water value that reads as a number (the PostgreSQL trigger of hs0003 reads
#: the same ones); anything else means -1, nothing indexed.
_MARK = re.compile(r"[ \t\n\r]*[-+]?[0-9]{1,18}[ \t\n\r]*")


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


def pair_counts_sql(n: int) -> str:
    """Rows ``(1, gram, block count, NULL)`` of the pairs bound as ``:pc0`` … ``:pc{n-1}``,
    to be read in the same statement as the high-water mark. A template, as above."""
    names = ", ".join(f":pc{i}" for i in range(n))
    return f"SELECT 1, gram, count(*), NULL FROM {{{TABLE}}} WHERE gram IN ({names}) GROUP BY gram"
