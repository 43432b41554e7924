"""Sessions left out of the CJK routes: sub-agent transcripts (pure, no database).

A session is a sub-agent's transcript when its ``model_config`` JSON names a
``_delegate_from``. Both dialects' statements narrow to the candidates by substring
(:data:`DELEGATED_CANDIDATE`); where the JSON cannot be read safely in SQL (PostgreSQL),
:func:`delegated_of` reads it from those few rows.
"""

from __future__ import annotations

import json
from typing import Any
from collections.abc import Sequence

__all__ = ["DELEGATED_CANDIDATE", "DELEGATED_SQL", "delegated_of"]

#: Sessions that may be sub-agent transcripts: the marker as a substring (the JSON
#: itself is read in Python, :func:`hermes_store.dialects.search_pg.delegated_sessions`).
DELEGATED_CANDIDATE = "model_config LIKE '%\\_delegate\\_from%' ESCAPE '\\'"
#: The candidates themselves, ``(id, model_config)`` (a template).
DELEGATED_SQL = f"SELECT id, model_config FROM {{sessions}} WHERE {DELEGATED_CANDIDATE}"


def delegated_of(candidates: Sequence[tuple[str, Any]]) -> list[str]:
    """Sessions whose ``model_config`` names a ``_delegate_from`` (sub-agent transcripts).

    SQLite decides this with ``json_extract`` over valid JSON only; PostgreSQL 15 has
    no safe JSON cast for text that may be malformed, so the few candidate rows (the
    marker as a substring: ``(id, model_config)`` rows of :data:`DELEGATED_CANDIDATE`
    sessions) are parsed here with the same rule.
    """
    out = []
    for sid, config in candidates:
        try:
            value = json.loads(config)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict) and value.get("_delegate_from") is not None:
            out.append(sid)
    return out
