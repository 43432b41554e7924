"""Session titles: setting (with Hermes' conflict rules), lookup and numbering."""

from __future__ import annotations

from typing import Any

from ..repositories import SessionRepository
from ..titles import sanitize_title
from ._host import Host


class TitlesMixin(Host):
    sanitize_title = staticmethod(sanitize_title)

    def set_session_title(self, session_id: str, title: str | None, *, title_source: str = "user") -> bool:
        """Set the title (v25: recorded as set by ``title_source``, 'user' by default).

        An automatic source ('llm', 'derived') never replaces a higher-ranked title;
        that call returns False.
        """
        return self._write(lambda c: SessionRepository(c).set_title(session_id, title, title_source))

    def get_session_title(self, session_id: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).get_title(session_id))

    def get_session_by_title(self, title: str) -> dict[str, Any] | None:
        return self._read(lambda c: SessionRepository(c).get_by_title(title))  # type: ignore[return-value]

    def resolve_session_by_title(self, title: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).resolve_by_title(title))

    def get_next_title_in_lineage(self, base_title: str) -> str:
        return self._read(lambda c: SessionRepository(c).next_title_in_lineage(base_title))
