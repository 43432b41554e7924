"""Listing, counting and searching sessions and messages (Hermes v23 §1.J).

The queries are in :mod:`hermes_store.repositories.listing` (sessions) and
:mod:`hermes_store.repositories.search` (messages).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Collection, Dict, List, Optional, cast

from ..repositories import SearchRepository
from ..repositories.listing import ListingRepository
from ..search.query import contains_cjk, sanitize_fts5_query
from ._host import Host, as_dict, as_dicts
from .fts import FtsMixin

#: Hermes' slow-search threshold (milliseconds) and where it is read from.
SLOW_SEARCH_ENV = "HERMES_SEARCH_SLOW_MS"
DEFAULT_SLOW_SEARCH_MS = 1000.0

#: Hermes' mixins log as ``hermes_state``.
log = logging.getLogger("hermes_state")


class ListingMixin(Host):
    _sanitize_fts5_query = staticmethod(sanitize_fts5_query)
    _contains_cjk = staticmethod(contains_cjk)

    def list_sessions_rich(
        self,
        source: Optional[str] = None,
        sources: Optional[List[str]] = None,
        exclude_sources: Optional[List[str]] = None,
        cwd_prefix: Optional[str] = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        min_message_count: int = 0,
        project_compression_tips: bool = True,
        order_by_last_active: bool = False,
        include_archived: bool = False,
        archived_only: bool = False,
        id_query: Optional[str] = None,
        search_query: Optional[str] = None,
        compact_rows: bool = False,
        include_pinned: bool = False,
        session_key: Optional[str] = None,
        include_hidden: bool = False,
    ) -> List[Dict[str, Any]]:
        """Sessions with ``preview``, ``last_active`` and ``unread``, lineage-aware (Hermes v26).

        Children are hidden unless ``include_children`` (branches and reset children stay
        listed, delegates never); archived sessions unless ``include_archived`` or
        ``archived_only``; hidden ones unless ``include_hidden``. A compression chain is
        listed once, as its tip, marked with ``_lineage_root_id``. ``id_query`` /
        ``search_query`` apply only with ``order_by_last_active=True``.
        ``include_pinned`` appends the pinned sessions the page lacks (same filters).
        ``source`` else ``sources`` filter by source (``source`` may be a list too: ours).
        """
        return as_dicts(self._read(
            lambda c: ListingRepository(c).list_rich(
                source, sources, exclude_sources, cwd_prefix, limit, offset, include_children, min_message_count,
                project_compression_tips, order_by_last_active, include_archived, archived_only,
                id_query, search_query, compact_rows, bool(include_pinned), session_key, bool(include_hidden),
            )
        ))

    def session_count(
        self,
        source: Optional[str] = None,
        sources: Optional[List[str]] = None,
        cwd_prefix: Optional[str] = None,
        min_message_count: int = 0,
        include_archived: bool = False,
        archived_only: bool = False,
        exclude_children: bool = False,
        exclude_sources: Optional[List[str]] = None,
    ) -> int:
        """How many sessions match the listing's filters (archived ones left out by
        default; hidden ones counted, as in Hermes)."""
        return self._read(
            lambda c: ListingRepository(c).count(
                source, sources, cwd_prefix, min_message_count, include_archived, archived_only, exclude_children,
                exclude_sources,
            )
        )

    def session_count_ge(self, n: int = 1) -> bool:
        """Whether at least ``n`` sessions of any kind exist (cheaper than counting them all)."""
        return self._read(lambda c: ListingRepository(c).count_at_least(n))

    def session_count_by_source(
        self, *, include_archived: bool = False, archived_only: bool = False, exclude_children: bool = False
    ) -> Dict[str, int]:
        """``{source: count}`` under the listing's filters; no source counts as 'cli'."""
        return self._read(
            lambda c: ListingRepository(c).count_by_source(
                bool(include_archived), bool(archived_only), bool(exclude_children))
        )

    def list_cron_job_runs(self, job_id: str, limit: int = 20, offset: int = 0) -> List[Dict[str, Any]]:
        """The runs of one cron job (sessions ``cron_<job_id>_…``), newest first."""
        return as_dicts(self._read(
            lambda c: ListingRepository(c).cron_job_runs(job_id, limit, offset)
        ))

    def search_sessions_by_id(
        self,
        query: str,
        limit: int = 20,
        include_archived: bool = True,
        source: Optional[str] = None,
        sources: Optional[List[str]] = None,
        exclude_sources: Optional[List[str]] = None,
    ) -> List[Dict[str, Any]]:
        """Sessions (chains) whose ids contain ``query``: exact, then prefix, then substring matches."""
        return as_dicts(self._read(
            lambda c: ListingRepository(c).search_by_id(query, limit, include_archived, source, sources,
                                                        exclude_sources)
        ))

    def search_sessions(
        self, source: Optional[str] = None, limit: int = 20, offset: int = 0, workspace_key: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        """Every session (children and archived included), most recent activity first;
        ``workspace_key`` keeps one repository's (its root, else its cwd at or below the key)."""
        return as_dicts(self._read(
            lambda c: ListingRepository(c).search(source, limit, offset, workspace_key)
        ))

    def get_session_rich_row(self, session_id: str, compact_rows: bool = False) -> Optional[Dict[str, Any]]:
        """One session row plus ``preview`` and ``last_active`` (what a listing shows); None if unknown."""
        return as_dict(self._read(lambda c: ListingRepository(c).rich_row(session_id, bool(compact_rows))))

    def _get_session_rich_row(self, session_id: str, compact_rows: bool = False) -> Optional[Dict[str, Any]]:
        return self.get_session_rich_row(session_id, compact_rows)

    def _get_session_rich_rows_batch(
        self, session_ids: List[str], compact_rows: bool = False
    ) -> Dict[str, Dict[str, Any]]:
        """Hermes v26's batch of :meth:`get_session_rich_row`: ``{id: row}`` for the known
        ids, read in one statement (a listing's tip rows)."""
        rows = self._read(lambda c: ListingRepository(c).rich_rows(session_ids or (), bool(compact_rows)))
        # Records are dicts at run time; Hermes names them so (see _host.as_dict).
        return cast("Dict[str, Dict[str, Any]]", rows)

    def list_skill_scaffolded_sessions(self, limit: int = 200) -> List[Dict[str, Any]]:
        """Titled sessions whose first user turn invoked a skill: ``{id, title, content}``."""
        return self._read(lambda c: ListingRepository(c).skill_scaffolded(limit))

    def get_first_assistant_text(self, session_id: str) -> str:
        """The first assistant reply's text ('' when there is none)."""
        return self._read(lambda c: ListingRepository(c).first_assistant_text(session_id))

    def search_messages(
        self,
        query: str,
        source_filter: Optional[List[str]] = None,
        exclude_sources: Optional[List[str]] = None,
        role_filter: Optional[List[str]] = None,
        limit: int = 20,
        offset: int = 0,
        sort: Optional[str] = None,
        include_inactive: bool = False,
        fields: Optional[Collection[str]] = None,
    ) -> List[Dict[str, Any]]:
        """Full-text search. Rewound messages are left out unless ``include_inactive``;
        messages archived by compaction are found. A read-only store searches too.
        ``fields`` keeps only those hit keys (context is read only if named). While the
        search index is stale (Hermes v26 fail-open) the search is a LIKE scan. A call
        taking ``HERMES_SEARCH_SLOW_MS`` (default 1000; 0: every call) or longer is logged."""
        stale = bool(getattr(self, "_fts_stale", False))
        started = time.perf_counter()
        def search(c: Any) -> Any:
            return SearchRepository(c).search_messages(
                query, source_filter, exclude_sources, role_filter, limit, offset, sort,
                include_inactive=include_inactive, fields=fields, stale=stale,
            )

        try:
            hits = self._read(search)
        except Exception as exc:
            if not self._rebuild_after_read_corruption(exc):
                raise
            hits = self._read(search)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        if elapsed_ms >= _slow_ms():
            # Attributed to its route (Hermes v26), read through self: code may patch it.
            describe = getattr(self, "_describe_search_path", None)
            try:
                path = describe(query) if describe is not None else "unknown"
            except Exception:
                path = "unknown"
            log.warning("search_messages took %.1f ms (path=%s, query=%r, results=%d)", elapsed_ms, path,
                        query[:200] if isinstance(query, str) else query, len(hits))
        return as_dicts(hits)

    def _rebuild_after_read_corruption(self, exc: BaseException) -> bool:
        """A search that met a damaged search index (Hermes v23: FTS read corruption)
        rebuilds the indexes once per instance, in place; True: search again. Anything
        else, a second corruption or a rebuild that did nothing: False (re-raised)."""
        if self.read_only:
            return False
        return cast(FtsMixin, self)._rebuild_once_after(exc, "_fts_read_corruption_rebuilt", "searching again")


def _slow_ms() -> float:
    """``HERMES_SEARCH_SLOW_MS`` read now: a non-negative number, else 1000."""
    raw = os.environ.get(SLOW_SEARCH_ENV)
    try:
        value = float(raw) if raw is not None else DEFAULT_SLOW_SEARCH_MS
    except ValueError:
        return DEFAULT_SLOW_SEARCH_MS
    return value if value >= 0 else DEFAULT_SLOW_SEARCH_MS
