"""Transcript rows: appending, reading (whole, paged, around an anchor) and replacing."""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy import Connection

from ..repositories import LineageRepository, MessageRepository
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
        **extra: Any,
    ) -> int:
        fields = {
            "tool_name": tool_name, "tool_calls": tool_calls, "tool_call_id": tool_call_id,
            "token_count": token_count, "finish_reason": finish_reason, "reasoning": reasoning,
            "reasoning_content": reasoning_content, "reasoning_details": reasoning_details,
            "codex_reasoning_items": codex_reasoning_items, "codex_message_items": codex_message_items,
            **extra,
        }
        return self._write(
            lambda c: MessageRepository(c).append(session_id, role, content, **fields), budget=TRANSCRIPT_BUDGET_S
        )

    def append_messages(self, messages: Iterable[dict[str, Any]]) -> int:
        """Bulk append for imports and replays (dicts with session_id, role, ...)."""
        items = list(messages)
        # The short-CJK index is not extended here: it would halve bulk throughput,
        # and rows above its high-water mark are found by a direct scan until the next
        # maintenance interval (or index_search()) covers them.
        return self._write(lambda c: MessageRepository(c).bulk_append(items), budget=TRANSCRIPT_BUDGET_S)

    def message_count(self, session_id: str | None = None) -> int:
        return self._read(lambda c: MessageRepository(c).count(session_id))

    def get_messages(self, session_id: str) -> list[dict[str, Any]]:
        return self._read(lambda c: MessageRepository(c).get_messages(session_id))  # type: ignore[return-value]

    def get_messages_as_conversation(self, session_id: str, include_ancestors: bool = False) -> list[dict[str, Any]]:
        def run(c: Connection) -> list[dict[str, Any]]:
            ids = LineageRepository(c).ancestors(session_id) if include_ancestors else [session_id]
            return MessageRepository(c).conversation(ids or [session_id])

        return self._read(run)

    def replace_messages(self, session_id: str, messages: list[dict[str, Any]]) -> None:
        self._write(lambda c: MessageRepository(c).replace(session_id, messages), budget=TRANSCRIPT_BUDGET_S)

    def clear_messages(self, session_id: str) -> None:
        self._write(lambda c: MessageRepository(c).clear(session_id), budget=TRANSCRIPT_BUDGET_S)

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
