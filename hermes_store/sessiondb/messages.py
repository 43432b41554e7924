"""Transcript rows: append, read (whole, paged, around an anchor, as a conversation),
replace, compact, rewind and restore (Hermes v23).

Live rows are ``active = 1``. Readers return live rows unless asked otherwise;
``get_messages_around``, ``get_anchored_view``, ``message_count`` and
``clear_messages`` ignore ``active``, as Hermes' do.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..codec import encode_json
from ..repositories import MessageRepository
from ._host import TRANSCRIPT_BUDGET_S, Host


class MessagesMixin(Host):
    def append_message(
        self,
        session_id: str,
        role: str,
        content: Any = None,
        tool_name: str | None = None,
        tool_calls: Any = None,
        tool_call_id: str | None = None,
        token_count: int | None = None,
        finish_reason: str | None = None,
        reasoning: str | None = None,
        reasoning_content: str | None = None,
        reasoning_details: Any = None,
        codex_reasoning_items: Any = None,
        codex_message_items: Any = None,
        platform_message_id: str | None = None,
        observed: bool = False,
        effect_disposition: str | None = None,
        timestamp: Any = None,
        api_content: str | None = None,
        *,
        display_kind: str | None = None,
        display_metadata: Any = None,
    ) -> int:
        """Insert one live message; returns its id.

        ``display_kind`` / ``display_metadata`` (ours, keyword-only) fill Hermes' v24
        typed-display columns (metadata: text as given, other values as JSON). An
        unknown session raises UnknownSessionError, also ``sqlite3.IntegrityError``.
        """
        fields = {
            "tool_name": tool_name, "tool_calls": tool_calls, "tool_call_id": tool_call_id,
            "token_count": token_count, "finish_reason": finish_reason, "reasoning": reasoning,
            "reasoning_content": reasoning_content, "reasoning_details": reasoning_details,
            "codex_reasoning_items": codex_reasoning_items, "codex_message_items": codex_message_items,
            "platform_message_id": platform_message_id, "observed": observed,
            "effect_disposition": effect_disposition, "api_content": api_content,
            "display_kind": display_kind, "display_metadata": encode_json(display_metadata),
        }
        return self._write(
            lambda c: MessageRepository(c).append(session_id, role, content, timestamp=timestamp, **fields),
            budget=TRANSCRIPT_BUDGET_S, one_statement=True,
        )

    def append_messages(self, messages: Iterable[dict[str, Any]]) -> int:
        """Bulk append for imports and replays (dicts with session_id, role, ...)."""
        items = list(messages)
        # The short-CJK index is not extended here: it would halve bulk throughput,
        # and rows above its high-water mark are found by a direct scan until the next
        # maintenance interval (or index_search()) covers them.
        return self._write(lambda c: MessageRepository(c).bulk_append(items), budget=TRANSCRIPT_BUDGET_S)

    def replace_messages(self, session_id: str, messages: list[dict[str, Any]], active_only: bool = False) -> None:
        self._write(
            lambda c: MessageRepository(c).replace(session_id, messages, active_only=bool(active_only)),
            budget=TRANSCRIPT_BUDGET_S,
        )

    def archive_and_compact(self, session_id: str, compacted_messages: list[dict[str, Any]]) -> int:
        return self._write(
            lambda c: MessageRepository(c).archive_and_compact(session_id, compacted_messages),
            budget=TRANSCRIPT_BUDGET_S,
        )

    def has_archived_messages(self, session_id: str) -> bool:
        return self._read(lambda c: MessageRepository(c).has_archived(session_id))

    def set_latest_user_api_content(self, session_id: str, content: Any, api_content: str) -> int:
        return self._write(lambda c: MessageRepository(c).set_latest_user_api_content(session_id, content, api_content))

    def clear_messages(self, session_id: str) -> None:
        self._write(lambda c: MessageRepository(c).clear(session_id), budget=TRANSCRIPT_BUDGET_S)

    def message_count(self, session_id: str | None = None) -> int:
        return self._read(lambda c: MessageRepository(c).count(session_id))

    def get_messages(
        self, session_id: str, include_inactive: bool = False, limit: int | None = None, offset: int = 0
    ) -> list[dict[str, Any]]:
        return self._read(
            lambda c: MessageRepository(c).get_messages(session_id, bool(include_inactive), limit, offset)
        )  # type: ignore[return-value]

    def get_messages_as_conversation(
        self,
        session_id: str,
        include_ancestors: bool = False,
        include_inactive: bool = False,
        repair_alternation: bool = False,
    ) -> list[dict[str, Any]]:
        """OpenAI-style turns; ``repair_alternation`` repairs the returned copy only
        (see :func:`hermes_store.codec.repair_message_sequence`)."""
        return self._read(
            lambda c: MessageRepository(c).lineage_conversation(
                session_id,
                include_ancestors=bool(include_ancestors),
                include_inactive=bool(include_inactive),
                repair=bool(repair_alternation),
            )
        )

    def get_resume_conversations(self, session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self._read(lambda c: MessageRepository(c).resume_conversations(session_id))

    def get_ancestor_display_prefix(self, session_id: str) -> list[dict[str, Any]]:
        return self._read(lambda c: MessageRepository(c).ancestor_display_prefix(session_id))

    def has_platform_message_id(self, session_id: str, platform_message_id: str) -> bool:
        return self._read(lambda c: MessageRepository(c).has_platform_message_id(session_id, platform_message_id))

    def rewind_to_message(self, session_id: str, target_message_id: int) -> dict[str, Any]:
        return self._write(lambda c: MessageRepository(c).rewind(session_id, target_message_id))  # type: ignore[return-value]

    def restore_rewound(self, session_id: str, since_message_id: int) -> int:
        return self._write(lambda c: MessageRepository(c).restore_rewound(session_id, since_message_id))

    def list_recent_user_messages(
        self, session_id: str, limit: int = 20, include_inactive: bool = False
    ) -> list[dict[str, Any]]:
        return self._read(
            lambda c: MessageRepository(c).recent_user_messages(session_id, limit, bool(include_inactive))
        )  # type: ignore[return-value]

    def get_messages_around(self, session_id: str, around_message_id: int, window: int = 5) -> dict[str, Any]:
        return self._read(lambda c: MessageRepository(c).around(session_id, around_message_id, window).as_dict())

    def get_anchored_view(
        self,
        session_id: str,
        around_message_id: int,
        window: int = 5,
        bookend: int = 3,
        keep_roles: Iterable[str] | None = ("user", "assistant"),
    ) -> dict[str, Any]:
        roles = tuple(keep_roles) if keep_roles is not None else None
        return self._read(
            lambda c: MessageRepository(c)
            .anchored_view(session_id, around_message_id, window, bookend, roles)
            .as_dict(bookends=True)
        )
