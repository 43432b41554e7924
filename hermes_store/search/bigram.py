"""Old import path of the short-CJK index's pure half (:mod:`hermes_store.search.cjk_pairs`).

Kept only while ``repositories/maintenance.py`` reads ``bigram.TABLE`` from here; it goes
once that module imports :mod:`.cjk_pairs`. The database half is
:mod:`hermes_store.dialects.cjk_bigram`, which this package does not import (search sits
below the dialects).
"""

from __future__ import annotations

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
    "BLOCK", "DIRTY_TABLE", "HIGH_WATER_KEY", "TABLE", "bigrams", "candidate_blocks_sql", "pair_counts_sql",
    "parse_high_water", "term_bigrams",
]
