"""Hermes' ``hermes_state_search``: ``SessionSearchMixin``, the search helpers SessionDB inherits.

The searches themselves are :class:`hermes_store.sessiondb.listing.ListingMixin`'s;
this mixin carries Hermes' helpers its tests call on the class.
"""

from __future__ import annotations

import sqlite3
from typing import Optional

from ..hermes_names import MAX_FTS5_QUERY_CHARS
from ..search.query import contains_cjk, plan_search, sanitize_fts5_query
from ..sessiondb._host import Host

#: Merge commands per FTS table after the one ``usermerge``.
_MERGES_PER_TABLE = 4


def merge_fts_incrementally(conn: sqlite3.Connection, *, max_pages: int, max_commands: Optional[int] = None) -> int:
    """Bounded FTS5 segment merging on every FTS5 table: ``('usermerge', 2)`` once, then up
    to four ``('merge', max_pages)`` while each still changes something; commands run."""
    if isinstance(max_pages, bool) or not isinstance(max_pages, int):
        raise TypeError("max_pages must be an int")
    if max_commands is not None and (isinstance(max_commands, bool) or not isinstance(max_commands, int)):
        raise TypeError("max_commands must be an int or None")
    if max_pages <= 0 or (max_commands is not None and max_commands <= 0):
        raise ValueError("max_pages and max_commands must be positive")
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%fts5%' ORDER BY name"
    ).fetchall()]
    run = 0

    def room() -> bool:
        return max_commands is None or run < max_commands

    for table in tables:
        if not room():
            break
        conn.execute(f'INSERT INTO "{table}"("{table}", rank) VALUES (\'usermerge\', 2)')
        run += 1
        for _ in range(_MERGES_PER_TABLE):
            if not room():
                break
            before = conn.total_changes
            conn.execute(f'INSERT INTO "{table}"("{table}", rank) VALUES (\'merge\', ?)', (max_pages,))
            run += 1
            if conn.total_changes - before < 2:
                break
    return run


class SessionSearchMixin(Host):
    """Hermes' search helpers: query sanitizing and the route a query takes."""

    #: Hermes' flags (assignable); the FTS mixin's own, where it has them, come first.
    _fts_stale = False
    _fts_cjk_available = False
    _fts_cjk_loaded = False

    def _merge_fts_incrementally(self, *, max_pages: int, max_commands: Optional[int] = None) -> int:
        """Hermes v26's bounded merge (its periodic upkeep), on ``_conn``."""
        with self._lock:
            return merge_fts_incrementally(self._conn, max_pages=max_pages, max_commands=max_commands)

    @staticmethod
    def _sanitize_fts5_query(query: str) -> str:
        """Any user string as valid FTS5 MATCH syntax (possibly empty), cut to 2048 characters first."""
        return sanitize_fts5_query((query or "")[:MAX_FTS5_QUERY_CHARS])

    _contains_cjk = staticmethod(contains_cjk)

    def _describe_search_path(self, query: str) -> str:
        """Which route ``search_messages(query)`` takes, as Hermes names them (the
        slow-search log's attribution): a stale index is scanned; CJK text goes to the
        CJK index when it is loaded (not for an isolated single CJK character), else to
        the trigram index when every CJK term has 3+ characters, else a LIKE scan."""
        try:
            if getattr(self, "_fts_stale", False):
                return "like_scan_fts_stale"
            plan = plan_search(query or "")
            if plan.kind == "empty":
                return "empty"
            if not getattr(self, "_fts_enabled", False):
                return "like_scan"
            if not contains_cjk(query):
                return "fts5" if plan.kind == "word" else "like_scan"
            if getattr(self, "_fts_cjk_available", False) and not any(
                    len(term) == 1 and contains_cjk(term) for term in query.split()):
                return "fts_cjk"
            if plan.kind == "trigram" and getattr(self, "_trigram_available", False):
                return "trigram"
            return "like_scan"
        except Exception:  # a description must never fail a search
            return "unknown"


__all__ = ["SessionSearchMixin", "merge_fts_incrementally"]
