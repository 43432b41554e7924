"""Lineage: compression tips, resume targets, ancestors and descendants."""

from __future__ import annotations

from ..repositories import LineageRepository
from ._host import Host


class LineageMixin(Host):
    def get_compression_tip(self, session_id: str) -> str | None:
        if not session_id:
            return session_id
        return self._read(lambda c: LineageRepository(c).compression_tip(session_id))

    def resolve_resume_session_id(self, session_id: str) -> str:
        if not session_id:
            return session_id
        return self._read(lambda c: LineageRepository(c).resume_target(session_id))

    def get_session_lineage(self, session_id: str) -> list[str]:
        """Root → … → tip ids of the session's chain."""
        return self._read(lambda c: LineageRepository(c).chain(session_id))

    def get_session_ancestors(self, session_id: str) -> list[str]:
        """Root first, ending with the session itself."""
        return self._read(lambda c: LineageRepository(c).ancestors(session_id))

    def get_session_descendants(self, session_id: str) -> list[str]:
        """Every session below this one, nearest first."""
        return self._read(lambda c: LineageRepository(c).descendants(session_id))
