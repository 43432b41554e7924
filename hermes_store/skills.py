"""How a skill-invocation turn reads in a preview (Hermes v26 §5.4), as pure text rules.

When a user runs ``/deploy fix the title leak``, Hermes stores a user turn that starts
with an activation note naming the skill, holds the skill's whole text, and ends with
the user's instruction. Listings and message pickers would otherwise show the start of
that note; they show ``/deploy — fix the title leak`` instead. Only the head (the
skill's name) and the tail (the instruction) matter, so readers keep at most
:data:`SKILL_PREVIEW_HEAD` + :data:`SKILL_PREVIEW_TAIL` characters of such a turn.
"""

from __future__ import annotations

import re
from typing import Any

#: How a skill-invocation turn starts (Hermes' activation note).
SKILL_INVOCATION_PREFIX = '[IMPORTANT: The user has invoked the "'
#: The line before the user's own words, near the end of the turn.
SKILL_INSTRUCTION_MARKER = "The user has provided the following instruction alongside the skill invocation:"
#: Characters of a long turn kept from each end, joined by :data:`SKILL_PREVIEW_JOIN`.
SKILL_PREVIEW_HEAD = 400
SKILL_PREVIEW_TAIL = 400
SKILL_PREVIEW_JOIN = "\x1e"
#: The session-list preview's width (Hermes: 60 characters, then "...").
PREVIEW_CHARS = 60
#: How context-compaction handoff turns start (Hermes' summary prefixes, current and legacy).
CONTEXT_SUMMARY_PREFIXES = ("[CONTEXT COMPACTION", "[CONTEXT SUMMARY]")

_SPACES = re.compile(r"\s+")


def is_skill_invocation(content: Any) -> bool:
    return isinstance(content, str) and content.startswith(SKILL_INVOCATION_PREFIX)


def skill_preview_source(content: str) -> str:
    """What a preview reads of a skill turn: all of it up to 800 characters, else the
    first 400, ``\\x1e`` and the last 400 (the skill's text in between never shows)."""
    if len(content) <= SKILL_PREVIEW_HEAD + SKILL_PREVIEW_TAIL:
        return content
    return content[:SKILL_PREVIEW_HEAD] + SKILL_PREVIEW_JOIN + content[-SKILL_PREVIEW_TAIL:]


def describe_skill_invocation(content: Any) -> str | None:
    """``/<skill> — <instruction>`` for a skill-invocation turn (the bare ``/<skill>``
    without an instruction); None for any other content. Whitespace is folded to
    single spaces. Takes the whole turn or its :func:`skill_preview_source`."""
    if not is_skill_invocation(content):
        return None
    head = content[len(SKILL_INVOCATION_PREFIX):]
    end = head.find('"')
    name = _SPACES.sub("-", head[:end if end >= 0 else len(head)].split(SKILL_PREVIEW_JOIN)[0].strip())
    if not name:
        return None
    command = "/" + name.lower()
    at = content.rfind(SKILL_INSTRUCTION_MARKER)
    instruction = ""
    if at >= 0:
        instruction = _SPACES.sub(" ", content[at + len(SKILL_INSTRUCTION_MARKER):].replace(SKILL_PREVIEW_JOIN, " "))
        instruction = instruction.strip()
    return f"{command} — {instruction}" if instruction else command


def skill_preview(content: Any, width: int = PREVIEW_CHARS) -> str | None:
    """A listing preview of a skill turn: the description cut at ``width`` plus "...";
    None for other content."""
    described = describe_skill_invocation(skill_preview_source(content) if is_skill_invocation(content) else content)
    if described is None:
        return None
    return described[:width] + "..." if len(described) > width else described


def is_context_summary(content: Any) -> bool:
    """Whether a turn is a context-compaction handoff (Hermes'
    ``ContextCompressor._is_context_summary_content``): pickers of the user's own
    turns skip it."""
    return isinstance(content, str) and content.lstrip().startswith(CONTEXT_SUMMARY_PREFIXES)


__all__ = [
    "CONTEXT_SUMMARY_PREFIXES",
    "PREVIEW_CHARS",
    "SKILL_INSTRUCTION_MARKER",
    "SKILL_INVOCATION_PREFIX",
    "SKILL_PREVIEW_HEAD",
    "SKILL_PREVIEW_JOIN",
    "SKILL_PREVIEW_TAIL",
    "describe_skill_invocation",
    "is_context_summary",
    "is_skill_invocation",
    "skill_preview",
    "skill_preview_source",
]
