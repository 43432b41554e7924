"""Listing, counting and searching sessions and messages."""

from __future__ import annotations

from typing import Any, Iterable

from ..repositories import SearchRepository, SessionRepository
from ..search.query import contains_cjk, sanitize_fts5_query
from ._host import Host


class ListingMixin(Host):
    _sanitize_fts5_query = staticmethod(sanitize_fts5_query)
    _contains_cjk = staticmethod(contains_cjk)

    def list_sessions_rich(
        self,
        source: str | Iterable[str] | None = None,
        exclude_sources: Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        project_compression_tips: bool = True,
        order_by_last_active: bool = False,
    ) -> list[dict[str, Any]]:
        return self._read(  # type: ignore[return-value]
            lambda c: SessionRepository(c).list_rich(
                source, exclude_sources, limit, offset, include_children, project_compression_tips, order_by_last_active
            )
        )

    def search_sessions(self, source: str | None = None, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        return self._read(lambda c: SessionRepository(c).search(source, limit, offset))  # type: ignore[return-value]

    def session_count(self, source: str | None = None) -> int:
        return self._read(lambda c: SessionRepository(c).count(source))

    def search_messages(
        self,
        query: str,
        source_filter: Iterable[str] | None = None,
        exclude_sources: Iterable[str] | None = None,
        role_filter: Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        sort: str | None = None,
    ) -> list[dict[str, Any]]:
        return self._read(  # type: ignore[return-value]
            lambda c: SearchRepository(c).search_messages(
                query, source_filter, exclude_sources, role_filter, limit, offset, sort
            )
        )
