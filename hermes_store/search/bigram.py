"""Old import path of the short-CJK index, kept only for modules that still use it.

The pure half is :mod:`hermes_store.search.cjk_pairs`, the database half
:mod:`hermes_store.dialects.cjk_bigram`. This module re-exports both and goes once
``cli/doctor.py``, ``copying/copier.py`` and ``copying/plan.py`` import from those: it is
the one edge left from ``search`` up to ``dialects``.
"""

from __future__ import annotations

from ..dialects.cjk_bigram import estimate_blocks, high_water, installed, missing_pairs
from .cjk_pairs import (
    BLOCK,
    DIRTY_TABLE,
    HIGH_WATER_KEY,
    TABLE,
    bigrams,
    candidate_blocks_sql,
    pair_counts_sql,
    parse_high_water,
    term_bigrams,
)

__all__ = [
    "BLOCK", "DIRTY_TABLE", "HIGH_WATER_KEY", "TABLE", "bigrams", "candidate_blocks_sql", "estimate_blocks",
    "high_water", "installed", "missing_pairs", "pair_counts_sql", "parse_high_water", "term_bigrams",
]
