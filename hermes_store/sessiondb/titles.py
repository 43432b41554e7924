"""Session titles: setting (with Hermes' conflict and transfer rules), lookup and numbering."""

from __future__ import annotations

from typing import Any

from ..repositories import SessionRepository
from ..titles import sanitize_title
from ._host import Host


class TitlesMixin(Host):
    sanitize_title = staticmethod(sanitize_title)

    def set_session_title(self, session_id: str, title: str, *, title_source: str = "user") -> bool:
        """Set (or, with a title that cleans to nothing, clear) the title; False for an unknown id.

        A title held by another session raises TitleConflictError (a ValueError,
        "Title '<t>' is already in use by session <id>"), unless the holder is a
        compression ancestor of this session: the title then moves here (v23).
        v25: recorded as set by ``title_source`` ('user' by default); an automatic
        source ('llm', 'derived') never replaces a higher-ranked title (False).
        """
        return self._write(lambda c: SessionRepository(c).set_title(session_id, title, title_source))

    def set_auto_title_if_empty(self, session_id: str, title: str, *, title_source: str = "llm") -> bool:
        """Title an untitled session (check and write in one transaction).

        False for a missing or already titled session; True, with nothing written, for
        a title that cleans to nothing. Same validation, conflict and transfer rules as
        set_session_title. Recorded as ``title_source`` ('llm' by default: the
        automatic titles Hermes generates).
        """
        return self._write(
            lambda c: SessionRepository(c).set_title(session_id, title, title_source, only_if_empty=True)
        )

    def get_session_title(self, session_id: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).get_title(session_id))

    def get_session_by_title(self, title: str) -> dict[str, Any] | None:
        return self._read(lambda c: SessionRepository(c).get_by_title(title))  # type: ignore[return-value]

    def resolve_session_by_title(self, title: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).resolve_by_title(title))

    def get_next_title_in_lineage(self, base_title: str) -> str:
        return self._read(lambda c: SessionRepository(c).next_title_in_lineage(base_title))
