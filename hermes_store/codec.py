"""Hermes' on-disk text formats, as pure functions (no database access).

Hermes and hermes_store must read each other's rows, so these functions reproduce
Hermes' encodings exactly:

* message ``content`` that is a list or dict (multimodal) is stored as
  ``"\\x00json:" + json.dumps(value)``; plain strings are stored as they are;
* JSON-ish columns (``tool_calls``, ``reasoning_details``, ``model_config``...) hold JSON
  text, and falsy values are stored as NULL.

Reading is forgiving on purpose: a row written by another program (or by an older bug)
with invalid JSON must still load, so the decoders return the raw text instead of
raising.

Writing is strict where guessing would lose or alter data:

* ``bytes`` (and ``bytearray``/``memoryview``) given as text are decoded as UTF-8 when
  they are valid UTF-8, which is lossless; invalid UTF-8 raises ``InvalidInputError``
  (nothing is written) rather than storing a ``b'...'`` repr or replacement characters;
* ids and keys (session ids, roles, meta keys) with a lone surrogate raise
  ``InvalidInputError``: an id must never be silently changed. Message *content* with
  lone surrogates is kept with U+FFFD in their place (see :func:`clean_text`), so a
  broken character never costs the whole message.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import InvalidInputError

__all__ = [
    "JSON_PREFIX",
    "check_key",
    "clean_text",
    "coerce_timestamp",
    "count_tool_calls",
    "decode_content",
    "decode_display_metadata",
    "decode_json",
    "decode_json_or",
    "dump_json",
    "encode_content",
    "encode_display_metadata",
    "encode_json",
    "encode_json_text",
    "is_stale_tool_call_marker_message",
    "jsonl_line",
    "message_preview",
    "parse_tool_calls",
    "repair_message_sequence",
    "sanitize_turn_text",
    "strip_memory_context",
    "strip_stale_tool_call_markers",
    "text_from_bytes",
    "tool_call_increment",
]

#: Marker Hermes puts in front of JSON-encoded (multimodal) message content.
JSON_PREFIX = "\x00json:"


# ----------------------------------------------------------------- NUL on PostgreSQL
#
# PostgreSQL ``text`` cannot hold U+0000, which SQLite stores fine (Hermes' own JSON
# content marker starts with it). On PostgreSQL only, every string crossing the driver
# is mapped reversibly (hermes_store.dialects.postgresql installs it on each psycopg
# connection): U+0000 becomes the private-use character U+E001, and the two
# private-use characters the mapping uses are escaped by U+E000 (U+E000 -> U+E000
# U+E000, U+E001 -> U+E000 U+E001). Decoding reverses it exactly, so every string
# round-trips, and the rest of the text is untouched: words next to a NUL stay
# separate words for full-text and trigram search. SQLite files never see it.
PG_ESC = "\ue000"
PG_NUL = "\ue001"
_PG_DECODE = re.compile("\ue000(.)|\ue001", re.S)


def pg_encode_nul(s: str) -> str:
    """``s`` as PostgreSQL text can hold it (see above); unchanged when it has no NUL/U+E000/U+E001."""
    if "\x00" not in s and PG_ESC not in s and PG_NUL not in s:
        return s
    return s.replace(PG_ESC, PG_ESC + PG_ESC).replace(PG_NUL, PG_ESC + PG_NUL).replace("\x00", PG_NUL)


def pg_decode_nul(s: Any) -> Any:
    """Reverse :func:`pg_encode_nul` (non-strings are returned as they are)."""
    if not isinstance(s, str) or (PG_ESC not in s and PG_NUL not in s):
        return s
    return _PG_DECODE.sub(lambda m: m.group(1) if m.group(1) is not None else "\x00", s)


def clean_text(s: str) -> str:
    """Make ``s`` encodable as UTF-8 so sqlite3 can bind it.

    Python strings may hold lone surrogates (U+D800–DFFF), e.g. from
    ``surrogateescape`` decoding or a broken JSON ``\\ud800`` escape; sqlite3 raises
    ``UnicodeEncodeError`` on them and the whole row would be lost. A surrogate *pair*
    written as two code points is joined into the real character, a lone one becomes
    U+FFFD. NUL characters are kept: SQLite stores them fine.
    """
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 round trip: pairs are re-joined, lone halves replaced by U+FFFD.
        return s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return s


def text_from_bytes(value: bytes | bytearray | memoryview, what: str = "content") -> str:
    """Decode bytes given where text is expected: valid UTF-8 only, so nothing is lost.

    Invalid UTF-8 is refused instead of being replaced, because a replacement would
    silently alter what the caller meant to store.
    """
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"{what}: bytes are not valid UTF-8 (byte {bytes(value)[exc.start:exc.start + 1]!r} at {exc.start}); "
            "decode them yourself or pass str"
        ) from exc


def check_key(value: Any, what: str = "session id") -> str:
    """Return ``value`` if it can be an id/key as given; else raise InvalidInputError.

    Keys must be str, and storable as UTF-8: a lone surrogate would otherwise be
    refused by the driver (or, if cleaned, silently become a different id).
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{what} {value!r} holds a lone surrogate at position {exc.start}; it cannot be stored as given"
        ) from exc
    return value


_BYTES = (bytes, bytearray, memoryview)


def _dumps(value: Any) -> str:
    """``json.dumps`` that never loses data and always yields storable text.

    ``ensure_ascii=False`` keeps the text readable (Hermes' format); when the value holds
    lone surrogates we fall back to ASCII escapes, which json.loads turns back into the
    exact same string. ``default=str`` keeps a row with an odd object (datetime, Path)
    instead of failing the whole write.
    """
    text = json.dumps(value, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, default=str)
    return text


def encode_content(value: Any) -> str | None:
    """Encode a message ``content`` value the way Hermes stores it.

    None stays NULL; list/dict (multimodal parts) get the JSON prefix; strings are stored
    as they are (lone surrogates replaced); bytes are decoded as strict UTF-8 first. A
    string that itself starts with the prefix is stored as a prefixed JSON *string*, so
    it reads back unchanged in both programs instead of being mistaken for encoded JSON.
    """
    if value is None:
        return None
    if isinstance(value, _BYTES):
        value = text_from_bytes(value)
    if isinstance(value, (list, dict)):
        return JSON_PREFIX + _dumps(value)
    if isinstance(value, str):
        if value.startswith(JSON_PREFIX):
            return JSON_PREFIX + _dumps(value)
        return clean_text(value)
    return clean_text(str(value))


def decode_content(text: str | None) -> Any:
    """Decode stored ``content``: prefixed JSON is parsed, everything else is returned as is.

    Invalid JSON after the prefix returns the stored text unchanged rather than raising,
    so one damaged row never breaks reading a conversation.
    """
    if not isinstance(text, str) or not text.startswith(JSON_PREFIX):
        return text
    try:
        return json.loads(text[len(JSON_PREFIX):])
    except ValueError:
        return text


def encode_json(value: Any) -> str | None:
    """Encode a JSON column value: falsy → NULL, str kept verbatim, anything else dumped.

    Hermes stores falsy values (None, "", [], {}, 0, False) as NULL and passes strings
    through untouched (callers often hand over JSON text they already serialized).
    Bytes are taken as such JSON text, in strict UTF-8.
    """
    if not value:
        return None
    if isinstance(value, _BYTES):
        value = text_from_bytes(value, "JSON column")
    if isinstance(value, str):
        return clean_text(value)
    return _dumps(value)


def decode_json(text: Any) -> Any:
    """Parse a JSON column; NULL → None, invalid JSON → the raw string (never raises)."""
    if text is None:
        return None
    if not isinstance(text, (str, bytes, bytearray)):
        return text  # already decoded (e.g. a value straight from the caller)
    try:
        return json.loads(text)
    except ValueError:
        return text


def count_tool_calls(tool_calls: Any) -> int:
    """Number of tool calls in a list (or JSON text of a list); 0 for anything else.

    Used to maintain ``sessions.tool_call_count`` without trusting the caller's shape.
    """
    if isinstance(tool_calls, (str, bytes, bytearray)):
        tool_calls = decode_json(tool_calls)
    if isinstance(tool_calls, (list, tuple)):
        return len(tool_calls)
    return 0


# A recalled-memory block plus the "[System note: ...memory...]" line that Hermes puts
# next to it (before, after, or inside the block), with the whitespace around them.
_NOTE = r"[ \t]*\[System note:[^\n]*?memory[^\n]*"
_MEMORY_BLOCK_RE = re.compile(
    r"(?P<lead>\s*)"
    r"(?:^" + _NOTE + r"\n\s*)?"
    r"<memory-context>.*?</memory-context>"
    r"(?:[ \t]*\n\s*?^" + _NOTE + r"$)?"
    r"(?P<trail>\s*)",
    re.DOTALL | re.MULTILINE | re.IGNORECASE,
)
_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n")
_STRAY_NOTE_RE = re.compile(r"^" + _NOTE + r"$\n?", re.MULTILINE | re.IGNORECASE)


def strip_memory_context(text: str) -> str:
    """Remove recalled-memory blocks so a replayed conversation does not re-inject them.

    Hermes prepends ``<memory-context>…</memory-context>`` (and a "[System note: …
    memory …]" line) to user turns; replaying those into a new prompt would duplicate
    memory. Text without a block is returned unchanged (same object); non-string
    content (multimodal lists, None) is returned unchanged too.
    """
    # "<" first: a scan in C that most turns fail, before a lowered copy of the text
    if not isinstance(text, str) or "<" not in text or "<memory-context>" not in text.lower():
        return text
    total = len(text)

    def _join(m: re.Match[str]) -> str:
        # At either end of the text, nothing is left behind; between two parts keep
        # the kind of separation the text had (a paragraph break, a line or a space).
        if m.start() == 0 or m.end() == total:
            return ""
        lead, trail = m.group("lead"), m.group("trail")
        if _BLANK_LINE_RE.search(lead) or _BLANK_LINE_RE.search(trail):
            return "\n\n"
        return "\n" if "\n" in lead + trail else " "

    stripped = _MEMORY_BLOCK_RE.sub(_join, text)
    if stripped == text:  # unclosed tag: nothing recognisable to remove
        return text
    stripped = _STRAY_NOTE_RE.sub("", stripped)
    return stripped.strip()


def sanitize_turn_text(text: Any) -> Any:
    """A user/assistant turn's text as a replayed conversation carries it: recalled
    memory removed, surrounding whitespace stripped (Hermes: ``sanitize_context(...).strip()``).
    Non-strings (multimodal lists, None) are returned unchanged."""
    if not isinstance(text, str):
        return text
    return strip_memory_context(text).strip()


# ----------------------------------------------------------------- v23 message fields


def coerce_timestamp(value: Any) -> float | None:
    """An explicit message timestamp as epoch seconds, or None when it cannot be one.

    Hermes (v23) takes a number, a numeric string, or anything with ``.timestamp()``
    (a datetime); an unconvertible value is ignored and the clock used instead. A
    non-finite number is treated as unconvertible too: NaN would be stored as NULL in
    a NOT NULL column and fail the whole write.
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        stamp = value.timestamp() if callable(getattr(value, "timestamp", None)) else value
        ts = float(stamp)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    return ts if math.isfinite(ts) else None


def parse_tool_calls(value: Any) -> Any:
    """``tool_calls`` as given to Hermes v23: JSON text is parsed first (unparsable → ``[]``),
    anything else is returned as it is."""
    if isinstance(value, _BYTES):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return []
    return value


def tool_call_increment(parsed: Any) -> int:
    """How much one message adds to ``sessions.tool_call_count`` (Hermes v23 rule).

    ``parsed`` is what :func:`parse_tool_calls` returned: a list counts its length, any
    other non-None value counts 1 (a ``role='tool'`` row without ``tool_calls`` adds
    nothing). Tuples count their length too, as the list they are stored as.
    """
    if parsed is None:
        return 0
    if isinstance(parsed, (list, tuple)):
        return len(parsed)
    return 1


def dump_json(value: Any) -> str | None:
    """Hermes v23's ``json.dumps(value) if value else None`` for an already-parsed value
    (a string is dumped as a JSON string, never stored bare)."""
    if not value:
        return None
    return _dumps(value)


def encode_json_text(value: Any) -> str | None:
    """A reasoning/codex JSON column as appends store it: falsy → NULL; text that already
    is JSON is kept verbatim (never double-encoded); other text is stored as a JSON
    string, so it reads back as the same string; anything else is dumped."""
    if not value:
        return None
    if isinstance(value, _BYTES):
        value = text_from_bytes(value, "JSON column")
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return _dumps(value)
        return clean_text(value)
    return _dumps(value)


def decode_json_or(text: Any, fallback: Any) -> Any:
    """Parse a JSON column for a replayed conversation: ``fallback`` for invalid JSON
    (Hermes: bad ``tool_calls`` → ``[]``, bad reasoning details → None)."""
    if not isinstance(text, (str, bytes, bytearray)):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return fallback


def encode_display_metadata(value: Any) -> str | None:
    """``messages.display_metadata`` as Hermes v24+ writes it: a dict as JSON, JSON text
    only when it holds an object (kept as given), anything else NULL."""
    if isinstance(value, dict):
        return _dumps(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return clean_text(value) if isinstance(parsed, dict) else None
    return None


def decode_display_metadata(text: Any) -> dict[str, Any] | None:
    """A stored ``display_metadata`` as every reader returns it: a JSON object as a dict
    (one extra layer of JSON string unwrapped: text stored twice encoded); NULL,
    invalid JSON, ``''``, arrays, scalars and strings → None."""
    if isinstance(text, dict):
        return text
    if not isinstance(text, str) or not text:
        return None
    try:
        value = json.loads(text)
        if isinstance(value, str):
            value = json.loads(value)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


#: An assistant reply that is only ``[tool_name]``: a placeholder an older Hermes stored
#: beside the real tool calls, which a model would otherwise read back as its own words.
_STALE_MARKER_RE = re.compile(r"\[[A-Za-z_][A-Za-z0-9_.\-]*\]")


def is_stale_tool_call_marker_message(msg: Any) -> bool:
    """Whether ``msg`` is an assistant dict with tool calls whose content (stripped) is
    nothing but a ``[identifier]`` marker (Hermes v25's transcript filter)."""
    if not isinstance(msg, dict) or msg.get("role") != "assistant" or not msg.get("tool_calls"):
        return False
    content = msg.get("content")
    return isinstance(content, str) and _STALE_MARKER_RE.fullmatch(content.strip()) is not None


def strip_stale_tool_call_markers(messages: Any) -> Any:
    """Blank (``''``) the content of every stale tool-call marker message, in place;
    returns the same list."""
    for msg in messages or ():
        if is_stale_tool_call_marker_message(msg):
            msg["content"] = ""
    return messages


_WS_RE = re.compile(r"\s+")
PREVIEW_CHARS = 80


def message_preview(content: Any) -> str:
    """One line for a message picker (Hermes' ``list_recent_user_messages``).

    Decoded text; multimodal content gives its text parts joined, or
    ``"[multimodal content]"`` when it has none; whitespace collapsed to single
    spaces; longer than 80 characters → the first 77 plus ``"..."``.
    """
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, (list, dict)):
        parts = content if isinstance(content, list) else [content]
        texts = [p if isinstance(p, str) else p["text"] for p in parts
                 if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text"
                                           and isinstance(p.get("text"), str))]
        text = " ".join(texts) if texts else "[multimodal content]"
    else:
        text = str(content)
    text = _WS_RE.sub(" ", text).strip()
    if len(text) > PREVIEW_CHARS:
        text = text[: PREVIEW_CHARS - 3] + "..."
    return text


# ----------------------------------------------------------------- alternation repair

#: Roles whose consecutive turns are merged (tool results answer distinct calls: never merged).
_MERGED_ROLES = frozenset({"system", "user", "assistant"})


def _as_parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    if content is None or content == "":
        return []
    if isinstance(content, dict):
        return [content]
    return [{"type": "text", "text": content if isinstance(content, str) else str(content)}]


def _merge_content(first: Any, second: Any) -> Any:
    """Two turns' content as one: strings joined by a blank line; with a multimodal side,
    the parts of both in order (text becoming a text part); empty sides dropped."""
    if first is None or first == "":
        return second
    if second is None or second == "":
        return first
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"
    return _as_parts(first) + _as_parts(second)


def _merge_turns(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    merged = dict(first)
    for key, value in second.items():
        if key == "content":
            merged["content"] = _merge_content(first.get("content"), value)
        elif key == "tool_calls":
            merged["tool_calls"] = list(first.get("tool_calls") or []) + list(value or [])
        elif key == "finish_reason":
            merged[key] = value  # the turn ends the way its last part ended
        else:
            merged.setdefault(key, value)
    return merged


def _call_ids(msg: dict[str, Any]) -> set[Any]:
    ids = set()
    for call in msg.get("tool_calls") or []:
        if isinstance(call, dict) and call.get("id") is not None:
            ids.add(call["id"])
    return ids


def repair_message_sequence(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A replayable copy of a conversation whose turns may not alternate (Hermes' agent
    repairs history the same way before sending it to a model; the DB is never touched).

    * A ``tool`` result is kept only when it answers a call of the assistant turn it
      follows (directly, or after other results of that turn) and that call was not
      answered yet; a result without a ``tool_call_id`` is kept when the preceding
      assistant turn made calls. Every other result is stray and dropped.
    * Consecutive ``system``, ``user`` or ``assistant`` turns (also those made adjacent by
      a dropped result) are merged into one: contents joined (strings by a blank line,
      multimodal parts concatenated), assistant ``tool_calls`` concatenated,
      ``finish_reason`` taken from the last part, every other key from the first part
      that has it.
    * Messages that are not dicts are dropped. The input list and its dicts are left
      unchanged.
    """
    out: list[dict[str, Any]] = []
    open_calls: set[Any] | None = None  # calls of the assistant turn the results follow
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if open_calls is None or (call_id is not None and call_id not in open_calls):
                continue  # stray: no assistant call (left) for it
            if call_id is not None:
                open_calls.discard(call_id)
            out.append(dict(msg))
            continue
        if out and role in _MERGED_ROLES and out[-1].get("role") == role:
            out[-1] = _merge_turns(out[-1], msg)
        else:
            out.append(dict(msg))
        # Results may follow only an assistant turn that made calls (calls without an
        # id leave an empty set: only results without an id can answer those).
        open_calls = _call_ids(out[-1]) if role == "assistant" and out[-1].get("tool_calls") else None
    return out


def jsonl_line(record: dict[str, Any]) -> str:
    """One export line: UTF-8 JSON when the text allows it, ASCII escapes when it holds
    lone surrogates (the format ``hermes-store export`` writes and ``import`` reads)."""
    line = json.dumps(record, ensure_ascii=False, default=str)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, default=str)
    return line
