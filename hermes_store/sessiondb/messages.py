"""Transcript rows: append (single and batch), read (whole, paged, around an anchor, as
a conversation), replace, compact, rewind and restore (Hermes v23, v26 signatures).

Live rows are ``active = 1``. Readers return live rows unless asked otherwise;
``get_messages_around``, ``get_anchored_view``, ``message_count`` and
``clear_messages`` ignore ``active``, as Hermes' do.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional

from sqlalchemy import Connection

from ..codec import is_stale_tool_call_marker_message, strip_stale_tool_call_markers
from ..repositories import MessageRepository
from ..repositories.base import cached_columns
from ..repositories.messages import display_fields
from ._host import Host, as_dict, as_dicts, transcript_budget

#: Hermes v25's transcript filter, under the names Hermes' code imports from hermes_state.
_is_stale_tool_call_marker_message = is_stale_tool_call_marker_message
_strip_stale_tool_call_markers = strip_stale_tool_call_markers

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__ = ["_is_stale_tool_call_marker_message", "_strip_stale_tool_call_markers"]


class MessagesMixin(Host):
    def append_message(
        self,
        session_id: str,
        role: str,
        content: Optional[str] = None,
        tool_name: Optional[str] = None,
        tool_calls: Any = None,
        tool_call_id: Optional[str] = None,
        token_count: Optional[int] = None,
        finish_reason: Optional[str] = None,
        reasoning: Optional[str] = None,
        reasoning_content: Optional[str] = None,
        reasoning_details: Any = None,
        codex_reasoning_items: Any = None,
        codex_message_items: Any = None,
        platform_message_id: Optional[str] = None,
        observed: bool = False,
        effect_disposition: Optional[str] = None,
        timestamp: Any = None,
        api_content: Optional[str] = None,
        display_kind: Optional[str] = None,
        display_metadata: Optional[Dict[str, Any]] = None,
        compression_lock_holder: Optional[str] = None,
        turn_lease_holder: Optional[str] = None,
        turn_lease_ttl_seconds: float = 300.0,
    ) -> int:
        """Insert one live message; returns its id.

        ``turn_lease_holder``: the write runs the transcript guards first (the holder's
        turn lease, renewed if it expired; a target closed by compression refuses).
        ``compression_lock_holder`` is accepted and ignored, as in Hermes v26. An
        unknown session raises UnknownSessionError, also ``sqlite3.IntegrityError``.
        """
        fields = {
            "tool_name": tool_name, "tool_calls": tool_calls, "tool_call_id": tool_call_id,
            "token_count": token_count, "finish_reason": finish_reason, "reasoning": reasoning,
            "reasoning_content": reasoning_content, "reasoning_details": reasoning_details,
            "codex_reasoning_items": codex_reasoning_items, "codex_message_items": codex_message_items,
            "platform_message_id": platform_message_id, "observed": observed,
            "effect_disposition": effect_disposition, "api_content": api_content,
            **display_fields(display_kind, display_metadata),
        }
        if turn_lease_holder is None and not self.read_only:
            known = cached_columns(self._open_engine(), "messages")
            if known is not None:
                # Encoded here, in the caller's thread, while another caller may be
                # writing: only the two statements wait for the write turn.
                row, calls, stamp = MessageRepository.encode_append(session_id, role, content, timestamp=timestamp,
                                                                    known=known, **fields)
                return self._write(lambda c: MessageRepository(c).append_encoded(row, calls, stamp=stamp),
                                   budget=transcript_budget(), one_statement=True, combine=True)
        lease = None if turn_lease_holder is None else (turn_lease_holder, float(turn_lease_ttl_seconds))
        return self._write(
            lambda c: MessageRepository(c).append(session_id, role, content, timestamp=timestamp,
                                                  turn_lease=lease, **fields),
            budget=transcript_budget(), one_statement=lease is None, combine=lease is None,
        )

    def append_messages(self, messages: Iterable[dict[str, Any]]) -> int:
        """Bulk append for imports and replays (dicts with session_id, role, ...)."""
        items = list(messages)
        # The short-CJK index is not extended here: it would halve bulk throughput,
        # and rows above its high-water mark are found by a direct scan until the next
        # maintenance interval (or index_search()) covers them.
        return self._write(lambda c: MessageRepository(c).bulk_append(items), budget=transcript_budget())

    def append_messages_batch(
        self,
        session_id: str,
        messages: List[Dict[str, Any]],
        compression_lock_holder: Optional[str] = None,
        turn_lease_holder: Optional[str] = None,
        chunk_rows: Optional[int] = None,
        turn_lease_ttl_seconds: float = 300.0,
    ) -> int:
        """Append ``messages`` (replace_messages' keys plus the display fields) in one
        transaction, all or nothing, the transcript guards checked once; returns the
        rows inserted. ``chunk_rows`` below the count: one transaction per chunk.
        Each input dict gets its new id as ``msg["_row_id"]``."""
        items = list(messages or [])
        if not items:
            return 0
        size = len(items) if not chunk_rows or chunk_rows < 1 or chunk_rows >= len(items) else int(chunk_rows)
        lease = None if turn_lease_holder is None else (turn_lease_holder, float(turn_lease_ttl_seconds))
        total = 0
        for start in range(0, len(items), size):
            chunk = items[start:start + size]
            total += self._write(_batch_write(self, session_id, chunk, lease), budget=transcript_budget())
        return total

    def _insert_message_rows(self, conn: Connection, session_id: str, messages: List[Dict[str, Any]]
                             ) -> tuple[int, int]:
        """Hermes' shared row inserter, reached through ``self`` (code may wrap it): the
        rows of a batch append, replacement or compaction, written on ``conn`` inside
        its transaction; sets ``msg["_row_id"]``; returns (rows, tool calls added)."""
        return MessageRepository(conn).insert_message_rows(session_id, messages)

    def replace_messages(self, session_id: str, messages: List[Dict[str, Any]], active_only: bool = False,
                         archive_dropped: bool = False) -> None:
        self._write(
            lambda c: MessageRepository(c).replace(
                session_id, messages, active_only=bool(active_only), archive_dropped=bool(archive_dropped),
                insert=lambda sid, msgs: self._insert_message_rows(c, sid, msgs), refuse_closed=True,
            ),
            budget=transcript_budget(),
        )

    def archive_and_compact(
        self,
        session_id: str,
        compacted_messages: List[Dict[str, Any]],
        model_config_patch: Optional[Dict[str, Any]] = None,
        watermark: Optional[int] = None,
        lock_holder: Optional[str] = None,
    ) -> int:
        return self._write(
            lambda c: MessageRepository(c).archive_and_compact(
                session_id, compacted_messages, model_config_patch=model_config_patch, watermark=watermark,
                lock_holder=lock_holder, insert=lambda sid, msgs: self._insert_message_rows(c, sid, msgs),
            ),
            budget=transcript_budget(),
        )

    def get_active_message_watermark(self, session_id: str) -> int:
        return self._read(lambda c: MessageRepository(c).active_watermark(session_id))

    def has_archived_messages(self, session_id: str) -> bool:
        return self._read(lambda c: MessageRepository(c).has_archived(session_id))

    def set_latest_user_api_content(self, session_id: str, content: Any, api_content: str) -> int:
        return self._write(lambda c: MessageRepository(c).set_latest_user_api_content(session_id, content, api_content))

    def clear_messages(self, session_id: str) -> None:
        self._write(lambda c: MessageRepository(c).clear(session_id), budget=transcript_budget())

    def message_count(self, session_id: Optional[str] = None) -> int:
        return self._read(lambda c: MessageRepository(c).count(session_id))

    def get_messages(
        self,
        session_id: str,
        include_inactive: bool = False,
        include_compacted: bool = False,
        limit: Optional[int] = None,
        offset: int = 0,
        latest: bool = False,
        after_id: Optional[int] = None,
    ) -> List[Dict[str, Any]]:
        return as_dicts(self._read(
            lambda c: MessageRepository(c).get_messages(
                session_id, bool(include_inactive), limit, offset,
                include_compacted=bool(include_compacted), latest=bool(latest), after_id=after_id,
            )
        ))

    def get_messages_as_conversation(
        self,
        session_id: str,
        include_ancestors: bool = False,
        include_inactive: bool = False,
        repair_alternation: bool = False,
        include_row_ids: bool = False,
    ) -> List[Dict[str, Any]]:
        """OpenAI-style turns; ``repair_alternation`` repairs the returned copy only
        (see :func:`hermes_store.codec.repair_message_sequence`); ``include_row_ids``
        adds ``_row_id``; an explicit branch ignores ``include_ancestors``."""
        return self._read(
            lambda c: MessageRepository(c).lineage_conversation(
                session_id,
                include_ancestors=bool(include_ancestors),
                include_inactive=bool(include_inactive),
                repair=bool(repair_alternation),
                row_ids=bool(include_row_ids),
            )
        )

    def get_resume_conversations(self, session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self._read(lambda c: MessageRepository(c).resume_conversations(session_id))

    def get_ancestor_display_prefix(self, session_id: str) -> list[dict[str, Any]]:
        return self._read(lambda c: MessageRepository(c).ancestor_display_prefix(session_id))

    def has_platform_message_id(self, session_id: str, platform_message_id: str) -> bool:
        return self._read(lambda c: MessageRepository(c).has_platform_message_id(session_id, platform_message_id))

    def rewind_to_message(self, session_id: str, target_message_id: int) -> dict[str, Any]:
        return as_dict(self._write(lambda c: MessageRepository(c).rewind(session_id, target_message_id)))

    def restore_rewound(self, session_id: str, since_message_id: int) -> int:
        return self._write(lambda c: MessageRepository(c).restore_rewound(session_id, since_message_id))

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


def _batch_write(
    store: MessagesMixin, session_id: str, rows: List[Dict[str, Any]], lease: Optional[tuple[str, float]]
) -> Callable[[Connection], int]:
    """One chunk's transaction of :meth:`MessagesMixin.append_messages_batch`, its rows bound
    here (a lambda in the loop would see the loop's current chunk, not its own, if run late);
    the rows go through ``store._insert_message_rows``, which code may wrap."""
    return lambda c: MessageRepository(c).append_batch(
        session_id, rows, turn_lease=lease, insert=lambda sid, msgs: store._insert_message_rows(c, sid, msgs),
    )
