"""Typed results of the repositories.

Sessions and messages come back as TypedDicts: typed for the caller, and already the
dict shape Hermes' API returns, so the facade adds no copying on hot paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict


class SessionRecord(TypedDict, total=False):
    id: str
    source: str
    user_id: str | None
    model: str | None
    model_config: str | None
    system_prompt: str | None
    parent_session_id: str | None
    started_at: float
    ended_at: float | None
    end_reason: str | None
    message_count: int | None
    tool_call_count: int | None
    input_tokens: int | None
    output_tokens: int | None
    title: str | None
    estimated_cost_usd: float | None
    actual_cost_usd: float | None
    api_call_count: int | None
    # v24: a sign of life without a message (see SessionRepository.record_activity)
    last_activity_at: float | None
    last_activity_description: str | None
    last_activity_provenance: str | None
    pinned: int
    # v25: ``system_prompt`` is always the full text; this is where it is stored
    system_prompt_hash: str | None
    title_source: str | None
    hidden: int
    last_read_at: float | None
    # listing extras
    preview: str
    last_active: float
    _lineage_root_id: str


class MessageRecord(TypedDict, total=False):
    id: int
    session_id: str
    role: str
    content: Any
    tool_call_id: str | None
    tool_calls: Any
    tool_name: str | None
    timestamp: float
    token_count: int | None
    finish_reason: str | None
    reasoning: str | None
    reasoning_content: str | None
    reasoning_details: Any
    codex_reasoning_items: Any
    codex_message_items: Any
    # v12-v22: gateway ids, observed turns, rewind/compaction visibility, raw API text
    platform_message_id: str | None
    observed: int | None
    active: int
    compacted: int
    effect_disposition: str | None
    api_content: str | None
    # v24-v30 (late): typed display events, summary marker, stable on-screen order
    display_kind: str | None
    display_metadata: str | None
    _compressed_summary: int
    display_identity: bytes | None
    display_order: int | None


class RewindResult(TypedDict):
    """What ``rewind_to_message`` reports (Hermes v23 shape)."""

    rewound_count: int
    target_message: MessageRecord
    new_head_id: int | None


class RecentUserMessage(TypedDict):
    """One entry of ``list_recent_user_messages``."""

    id: int
    timestamp: float
    preview: str


class SearchHit(TypedDict):
    id: int
    session_id: str
    role: str
    snippet: str
    timestamp: float
    tool_name: str | None
    source: str
    model: str | None
    session_started: float
    context: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class MessageWindow:
    """Messages around an anchor; ``messages_before`` / ``messages_after`` count the
    window's own rows before / after the anchor (``window`` each, unless the start or
    end of the session cuts the window short)."""

    window: list[MessageRecord]
    messages_before: int
    messages_after: int
    bookend_start: list[MessageRecord] = field(default_factory=list)
    bookend_end: list[MessageRecord] = field(default_factory=list)

    def as_dict(self, bookends: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "window": self.window,
            "messages_before": self.messages_before,
            "messages_after": self.messages_after,
        }
        if bookends:
            out["bookend_start"] = self.bookend_start
            out["bookend_end"] = self.bookend_end
        return out


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One line of a usage report (by model, task or billing route)."""

    key: tuple[str, ...]
    sessions: int
    api_call_count: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    estimated_cost_usd: float
    actual_cost_usd: float
