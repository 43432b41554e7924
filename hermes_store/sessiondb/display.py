"""Display fields, reactions, resume/export caps and small transcript readers (Hermes v24-v26)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from .. import errors
from ..errors import (
    MAX_SAFE_EXPORT_MESSAGES,
    MAX_SAFE_RESUME_MESSAGES,
    SessionExportTooLargeError,
    SessionResumeTooLargeError,
)
from ..hermes_config import config_section
from ..repositories.display import REACTIONS_METADATA_KEY, DisplayRepository
from ._host import Host
from ..patch_points import facade_value

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__: list[str] = [
    "MAX_SAFE_EXPORT_MESSAGES",
    "MAX_SAFE_RESUME_MESSAGES",
    "REACTIONS_METADATA_KEY",
    "SessionExportTooLargeError",
    "SessionResumeTooLargeError",
    "resolved_max_export_messages",
    "resolved_max_resume_messages",
]


def _configured_cap(key: str, default: int) -> int:
    """``sessions.<key>`` of Hermes' config.yaml: a non-negative integer (0 = no cap);
    missing or bad values give the default."""
    section = config_section("sessions") or {}
    value = section.get(key)
    if value is None or isinstance(value, bool):
        return default
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if number >= 0 else default


def resolved_max_resume_messages() -> int:
    """The resume cap in force (config ``sessions.max_resume_messages``, else 20000)."""
    return _configured_cap("max_resume_messages", MAX_SAFE_RESUME_MESSAGES)


def resolved_max_export_messages() -> int:
    """The export cap in force (config ``sessions.max_export_messages``, else 20000)."""
    return _configured_cap("max_export_messages", MAX_SAFE_EXPORT_MESSAGES)


def _resolver(name: str, fallback: Callable[[], int]) -> Callable[[], int]:
    """The facade's ``name`` at call time: code written for Hermes patches
    ``hermes_state.resolved_max_*`` to move the caps."""
    return facade_value(name, fallback)


def _limit(max_messages: Optional[int], resolve: Callable[[], int]) -> int:
    if max_messages is None:
        return int(resolve())
    if isinstance(max_messages, bool):
        raise errors.InvalidInputError("max_messages must be an integer")
    try:
        limit = int(max_messages)
    except (TypeError, ValueError, OverflowError) as exc:
        raise errors.InvalidInputError(f"max_messages must be an integer, not {max_messages!r}") from exc
    if limit < 0:
        raise errors.InvalidInputError("max_messages must be non-negative")
    return limit


class DisplayMixin(Host):
    # ------------------------------------------------------------------ resume / export caps

    def get_resume_message_count(self, session_id: str) -> int:
        """Live messages a resume of this session loads (its whole parent chain)."""
        return self._read(lambda c: DisplayRepository(c).resume_message_count(session_id))

    def assert_resume_safe(self, session_id: str, max_messages: Optional[int] = None) -> int:
        """The resume's message count, or :class:`SessionResumeTooLargeError` over the cap
        (None: the configured cap; 0: no cap, nothing counted, 0 returned)."""
        limit = _limit(max_messages, _resolver("resolved_max_resume_messages", resolved_max_resume_messages))
        if limit == 0:
            return 0
        count = self.get_resume_message_count(session_id)
        if count > limit:
            raise SessionResumeTooLargeError(count, limit)
        return count

    def assert_export_safe(self, session_id: str, max_messages: Optional[int] = None) -> int:
        """The session's live message count, or :class:`SessionExportTooLargeError` over the cap."""
        limit = _limit(max_messages, _resolver("resolved_max_export_messages", resolved_max_export_messages))
        if limit == 0:
            return 0
        count = self._read(lambda c: DisplayRepository(c).export_message_count(session_id))
        if count > limit:
            raise SessionExportTooLargeError(session_id, count, limit)
        return count

    # ------------------------------------------------------------------ pickers

    def list_recent_user_messages(
        self, session_id: str, limit: int = 20, include_inactive: bool = False
    ) -> List[Dict[str, Any]]:
        """The user's own recent turns for a picker (display events and compaction
        handoffs left out), newest first."""
        try:
            n = int(limit) if limit is not None else 20
        except (TypeError, ValueError, OverflowError) as exc:
            raise errors.InvalidInputError(f"limit must be an integer, not {limit!r}") from exc
        return self._read(
            lambda c: DisplayRepository(c).recent_user_messages(session_id, min(n, 2**31), bool(include_inactive))
        )

    def latest_message_row_id(
        self, session_id: str, *, role: str = "user", offset: int = 0, require_text: bool = True
    ) -> Optional[int]:
        """Row id of the ``offset``-th newest live user/assistant turn (blank ones skipped)."""
        n = int(offset or 0)
        return self._read(lambda c: DisplayRepository(c).latest_row_id(session_id, role, n, bool(require_text)))

    def latest_user_message_row_id(self, session_id: str) -> Optional[int]:
        return self.latest_message_row_id(session_id, role="user")

    def get_message_role(self, session_id: str, row_id: int) -> Optional[str]:
        return self._read(lambda c: DisplayRepository(c).message_role(session_id, row_id))

    def find_pr_url_messages(self, session_ids: List[str]) -> List[Dict[str, Any]]:
        """Tool results of these sessions that mention a pull request (``/pull/``)."""
        ids = list(session_ids or [])
        return self._read(lambda c: DisplayRepository(c).pr_url_messages(ids))

    # ------------------------------------------------------------------ display kinds and reactions

    def set_latest_matching_message_display_kind(
        self,
        session_id: str,
        *,
        role: str,
        content: str,
        display_kind: str,
        display_metadata: Optional[Dict[str, Any]] = None,
    ) -> bool:
        """Mark the newest live row with this role and content as a display event."""
        if not session_id or not isinstance(content, str) or not isinstance(display_kind, str):
            return False
        return self._write(lambda c: DisplayRepository(c).stamp_latest_matching(
            session_id, role, content, display_kind, display_metadata))

    def set_message_reaction(
        self, session_id: str, message_row_id: int, emoji: Optional[str], *, author: str = "user"
    ) -> Optional[List[Dict[str, Any]]]:
        """Set (or, with the same emoji or None, clear) ``author``'s reaction on a row of
        this session; the row's reactions after the change, None if the row is not there."""
        if not session_id:
            return None
        return self._write(lambda c: DisplayRepository(c).set_reaction(session_id, message_row_id, emoji, author))

    def get_message_reactions(self, session_id: str, message_row_id: int) -> List[Dict[str, Any]]:
        return self._read(lambda c: DisplayRepository(c).reactions(session_id, message_row_id))

    def take_unseen_reactions(self, session_id: str, *, author: str = "user") -> List[Dict[str, Any]]:
        """``{row_id, role, emoji, text}`` of the author's reactions not taken before."""
        if not session_id:
            return []
        return self._write(lambda c: DisplayRepository(c).take_unseen(session_id, author))
