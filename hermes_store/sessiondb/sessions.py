"""Creating, reading and updating session rows (Hermes' session lifecycle methods)."""

from __future__ import annotations

from typing import Any

from ..repositories import SessionRepository
from ._host import Host


class SessionsMixin(Host):
    def create_session(self, session_id: str, source: str, **kwargs: Any) -> str:
        return self._write(lambda c: SessionRepository(c).create(session_id, source, **kwargs))

    def ensure_session(self, session_id: str, source: str = "unknown", model: str | None = None, **kwargs: Any) -> str:
        return self._write(lambda c: SessionRepository(c).ensure(session_id, source, model, **kwargs))

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        return self._read(lambda c: SessionRepository(c).get(session_id))  # type: ignore[return-value]

    def end_session(self, session_id: str, end_reason: str | None) -> None:
        self._write(lambda c: SessionRepository(c).end(session_id, end_reason))

    def reopen_session(self, session_id: str) -> None:
        self._write(lambda c: SessionRepository(c).reopen(session_id))

    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> None:
        self._write(lambda c: SessionRepository(c).update_system_prompt(session_id, system_prompt))

    def update_session(self, session_id: str, **fields: Any) -> bool:
        """Set other known session columns (cwd, archived, git_branch, hidden, pinned,
        title_source, last_read_at, ...). False for an unknown id."""
        return self._write(lambda c: SessionRepository(c).update_fields(session_id, **fields))

    def record_session_activity(
        self,
        session_id: str,
        description: str | None = None,
        provenance: str | None = "unknown",
        at: float | None = None,
    ) -> bool:
        """Stamp a sign of life without a message (v24 ``last_activity_*``).

        What Hermes' activity watchdog records during long tool calls or compression;
        listings then order the session by it. False for an unknown id.
        """
        return self._write(lambda c: SessionRepository(c).record_activity(session_id, description, provenance, at))

    def resolve_session_id(self, session_id_or_prefix: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).resolve_id(session_id_or_prefix))
