"""Hermes' background-review turns, recognized as pure text rules (no database access).

Hermes' background review injects a "review the conversation" user turn and gets an
assistant reply; neither belongs to the conversation a caller reads back, so reading a
transcript drops both. Kept below the repositories, which apply it, and re-exported by
the Hermes layer under Hermes' names.
"""

from __future__ import annotations

from typing import Any

#: Prefixes of the two "review the conversation" prompts Hermes' background review injects.
_HARNESS_PREFIXES = (
    "Review the conversation above and",
)


def _is_background_review_harness_message(msg: dict[str, Any]) -> bool:
    """A user/system turn injected by Hermes' background review ("Review the conversation above and …")."""
    if not isinstance(msg, dict) or msg.get("role") not in ("user", "system"):
        return False
    content = msg.get("content")
    return isinstance(content, str) and content.lstrip().startswith(_HARNESS_PREFIXES)


def _strip_background_review_harness(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop each harness turn and the assistant reply right after it."""
    kept: list[dict[str, Any]] = []
    skip_reply = False
    for msg in messages:
        if _is_background_review_harness_message(msg):
            skip_reply = True
            continue
        if skip_reply and isinstance(msg, dict) and msg.get("role") == "assistant":
            skip_reply = False
            continue
        skip_reply = False
        kept.append(msg)
    return kept
