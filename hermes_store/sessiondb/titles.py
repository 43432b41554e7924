"""Session titles: setting (with Hermes' conflict, transfer and provenance rules), lookup and numbering."""

from __future__ import annotations

from typing import Any, Optional

from ..errors import InvalidInputError
from ..repositories import SessionRepository
from ..titles import AUTO_TITLE_SOURCES, TITLE_SOURCE_LLM, TITLE_SOURCE_USER, TITLE_SOURCES, sanitize_title
from ._host import Host, as_dict


class TitlesMixin(Host):
    sanitize_title = staticmethod(sanitize_title)

    def set_session_title(self, session_id: str, title: str, *, title_source: str = TITLE_SOURCE_USER) -> bool:
        """Set (or, with a title that cleans to nothing, clear) the title; False for an unknown id.

        A person's title: it always lands, recorded with source 'user' (v25). A title
        held by another session raises TitleConflictError (a ValueError, "Title '<t>'
        is already in use by session <id>"), unless the holder is a compression
        ancestor of this session: the title then moves here (v23).
        ``title_source`` (ours): an automatic source ('llm', 'derived') follows
        set_auto_title's rank rule instead.
        """
        return self._write(lambda c: SessionRepository(c).set_title(session_id, title, title_source))

    def set_auto_title(self, session_id: str, title: str, *, source: str) -> bool:
        """An automatic title ('derived' or 'llm', else ValueError): lands only on an
        untitled row or over a strictly lower-ranked title (a title of unknown source
        ranks as a person's). Same cleaning, conflict and transfer rules as
        set_session_title; a title that cleans to nothing writes nothing (True only
        for an untitled row)."""
        if source not in AUTO_TITLE_SOURCES:
            raise InvalidInputError(f"invalid automatic title source: {source!r}")
        return self._write(lambda c: SessionRepository(c).set_title(session_id, title, source))

    def set_auto_title_if_empty(self, session_id: str, title: str, *, title_source: str = TITLE_SOURCE_LLM) -> bool:
        """``set_auto_title(..., source="llm")`` (v25: it also replaces a derived title).
        ``title_source`` (ours) names another automatic source."""
        return self.set_auto_title(session_id, title, source=title_source)

    def get_session_title_source(self, session_id: str) -> Optional[str]:
        return self._read(lambda c: SessionRepository(c).get_title_source(session_id))

    def set_session_title_source(self, session_id: str, source: str) -> bool:
        """Re-label who set the title (one of TITLE_SOURCES, else ValueError); titled rows only."""
        if source not in TITLE_SOURCES:
            raise InvalidInputError(f"invalid title source: {source!r} (one of {', '.join(TITLE_SOURCES)})")
        return self._write(lambda c: SessionRepository(c).set_title_source(session_id, source))

    def get_session_title(self, session_id: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).get_title(session_id))

    def get_session_by_title(self, title: str) -> dict[str, Any] | None:
        return as_dict(self._read(lambda c: SessionRepository(c).get_by_title(title)))

    def resolve_session_by_title(self, title: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).resolve_by_title(title))

    def get_next_title_in_lineage(self, base_title: str) -> str:
        return self._read(lambda c: SessionRepository(c).next_title_in_lineage(base_title))
