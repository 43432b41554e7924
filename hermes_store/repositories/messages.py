"""Messages: append (single and bulk), read back, replace, compact, rewind, windows, replay.

Hermes v23 semantics (the contract is the v23 SessionDB reference):

* rows are *live* while ``active = 1``; a rewind sets ``active = 0``, compaction sets
  ``active = 0, compacted = 1``. Readers return live rows unless asked for all; the
  windows (:meth:`MessageRepository.around`, :meth:`MessageRepository.anchored_view`),
  :meth:`MessageRepository.count` and :meth:`MessageRepository.clear` ignore ``active``;
* a message for a session that does not exist raises :class:`UnknownSessionError`,
  which is also ``sqlite3.IntegrityError`` (what Hermes' callers catch), on every backend;
* ``sessions.message_count`` / ``tool_call_count`` move in the same transaction.

Hermes v26 additions: typed display fields (``display_kind``, ``display_metadata``,
decoded by every reader), the transcript guards (turn lease, closed by compression; see
:mod:`.turn_leases`) inside the write's transaction, one shared row inserter for batch
appends, replacements and compactions (:meth:`MessageRepository.insert_message_rows`),
watermark compaction and the stale tool-call marker filter on replays.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from typing import Any
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from sqlalchemy import String, bindparam, case, delete, func, literal, or_, select, update
from sqlalchemy.sql import FromClause, Select

from .. import errors
from ..errors import MessageNotFoundError, UnknownSessionError
from ..codec import (
    JSON_PREFIX,
    check_key,
    clean_text,
    coerce_timestamp,
    count_tool_calls,
    decode_content,
    decode_display_metadata,
    decode_json,
    decode_json_or,
    dump_json,
    encode_content,
    encode_display_metadata,
    encode_json,
    encode_json_text,
    is_stale_tool_call_marker_message,
    parse_tool_calls,
    repair_message_sequence,
    sanitize_turn_text,
    text_from_bytes,
    tool_call_increment,
)
from ..review_turns import _is_background_review_harness_message
from ..models import Base
from .base import (
    ID_CHUNK, MESSAGES, SESSIONS, Clock, Repository, UnknownFieldError, fetch_tuples, missing_sessions, wall_clock,
)
from .display import TEXT_ROLES
from .lineage import BRANCH_MARKER, LineageRepository, _marker
from .records import MessageRecord, MessageWindow, RewindResult
from .turn_leases import guard_transcript_write, raise_if_closed_by_compression

#: The compression leases ``archive_and_compact(lock_holder=...)`` checks.
LOCKS = Base.metadata.tables["compression_locks"]
#: What writes rows for a transcript write: ``(session_id, messages) -> (rows, tool calls)``
#: (SessionDB passes its own ``_insert_message_rows``, which Hermes' code reaches through self).
Inserter = Callable[[str, list[Any]], tuple[int, int]]


#: JSON-ish columns: stored as JSON text (falsy → NULL), decoded on read.
JSON_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items", "codex_message_items")
#: Binary columns: bytes are stored as they are (v30's display identity digest).
BLOB_COLUMNS = frozenset({"display_identity"})
_BYTES = (bytes, bytearray, memoryview)
_Runs = list[tuple[tuple[str, ...], list[tuple[Any, ...]]]]
#: A declared default that is a constant: NULL, a number, a quoted string.
_CONSTANT = re.compile(r"\(*\s*(?:(NULL)|([-+]?[0-9]+)|([-+]?[0-9]*\.[0-9]+(?:[eE][-+]?[0-9]+)?)|'((?:[^']|'')*)'"
                       r"(?:::[a-z ]+)?)\s*\)*", re.I)


def _constant_fills(columns: Sequence[str], defaults: Mapping[str, str | None]) -> dict[str, Any]:
    """For each column (but ``id``) whose declared default is a constant, the value a row
    that leaves it out gets (None where there is no default)."""
    fills: dict[str, Any] = {}
    for name in columns:
        if name == "id" or name not in defaults:
            continue
        declared = defaults[name]
        if declared is None:
            fills[name] = None
            continue
        m = _CONSTANT.fullmatch(declared.strip())
        if m is None:
            continue  # an expression (a clock, a sequence): only the database can give it
        null, integer, real, quoted = m.groups()
        fills[name] = None if null else int(integer) if integer else float(real) if real else quoted.replace("''", "'")
    return fills


def _text(value: Any, key: str) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, _BYTES):
        return text_from_bytes(value, key)
    return value


def _timestamp(value: Any, clock: Clock) -> float:
    if value is None:
        return clock()
    try:
        ts = float(value.timestamp() if callable(getattr(value, "timestamp", None)) else value)
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        raise errors.InvalidInputError(f"timestamp must be a number of seconds, not {value!r}") from exc
    if not math.isfinite(ts):
        raise errors.InvalidInputError(f"timestamp must be finite, not {value!r}")
    return ts


def _label(index: int | None) -> str:
    return "message" if index is None else f"message #{index}"


def encode_row(
    session_id: str,
    role: str,
    content: Any = None,
    timestamp: float | None = None,
    *,
    known: Collection[str] | None = None,
    index: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """THE encoder: one message in Hermes' on-disk format, for every write path.

    Append, bulk append, replace and import all end here, so the same message is stored
    identically whichever way it arrives: ids and roles checked (never altered), content
    and JSON columns encoded, other text cleaned of lone surrogates, bytes decoded as
    strict UTF-8. ``fields`` must not hold None values (callers drop them so column
    defaults apply). Raises InvalidInputError / UnknownFieldError before anything is
    written; ``index`` names the item of a bulk input in those errors.
    """
    return _encode(session_id, role, content, timestamp, fields, known, index)


def _encode(
    session_id: Any, role: Any, content: Any, timestamp: Any,
    fields: dict[str, Any], known: Collection[str] | None, index: int | None, clock: Clock = wall_clock,
) -> dict[str, Any]:
    """:func:`encode_row` without repacking keyword arguments (the hot paths call this).
    A None ``timestamp`` is stamped by ``clock`` (callers with a repository pass its own)."""
    try:
        check_key(session_id, "session id")
        check_key(role, "role")
        if known is not None:
            unknown = fields.keys() - known
            if unknown:
                raise UnknownFieldError(f"unknown message fields: {sorted(map(str, unknown))}")
        row: dict[str, Any] = {
            "session_id": session_id,
            "role": role,
            "content": encode_content(content),
            "timestamp": _timestamp(timestamp, clock),
        }
        for key, value in fields.items():
            if key in JSON_COLUMNS:
                row[key] = encode_json(value)
            elif key in BLOB_COLUMNS and isinstance(value, _BYTES):
                row[key] = bytes(value)
            elif key == "display_metadata" and isinstance(value, dict):
                row[key] = encode_display_metadata(value)  # a decoded row read back (export → import)
            else:
                row[key] = _text(value, key)
    except errors.InvalidInputError as exc:
        if index is None:
            raise
        # Same class, the item named, the underlying cause (driver/codec error) kept.
        raise type(exc)(f"{_label(index)}: {exc}") from (exc.__cause__ or exc)
    return row


def encode_message(
    item: Any, known: Collection[str], *, index: int | None = None, keep_id: bool = False,
    clock: Clock,
) -> dict[str, Any]:
    """A message dict (``session_id``, ``role``, columns...) → its row, via :func:`encode_row`.

    ``index`` names the item in errors (bulk input); ``keep_id`` keeps an ``id`` key
    (import keeps ids so anchors survive a round trip; appends let SQLite number rows).
    """
    if not isinstance(item, (dict, Mapping)):
        raise errors.InvalidInputError(f"{_label(index)}: expected a dict, got {type(item).__name__}")
    fields = {k: v for k, v in item.items() if v is not None}
    sid = fields.pop("session_id", None)
    role = fields.pop("role", None)
    if sid is None or role is None:
        raise errors.InvalidInputError(f"{_label(index)}: no {'session_id' if sid is None else 'role'!r}")
    content, ts = fields.pop("content", None), fields.pop("timestamp", None)
    mid = fields.pop("id", None)
    row = _encode(sid, role, content, ts, fields, known, index, clock)
    if keep_id and mid is not None:
        try:
            row = {"id": operator.index(mid), **row}
        except TypeError as exc:
            raise errors.InvalidInputError(f"{_label(index)}: id must be an integer, not {mid!r}") from exc
    return row


# ------------------------------------------------------------------ Hermes v23 rows

#: Keys a ``replace_messages`` / ``archive_and_compact`` message honours (Hermes v23),
#: besides role, content, timestamp, tool_calls and platform_message_id/message_id.
REPLACE_KEYS = ("tool_call_id", "tool_name", "effect_disposition", "token_count", "finish_reason",
                "api_content", "observed")
#: Honoured only on ``role == 'assistant'`` messages.
ASSISTANT_KEYS = ("reasoning", "reasoning_content", "reasoning_details", "codex_reasoning_items",
                  "codex_message_items")
#: Each row the fallback clock hands out is at least this much later than the previous one.
CLOCK_STEP = 1e-6


def _as_text(value: Any) -> Any:
    """A number given for a text column, as the text SQLite's TEXT affinity stores it
    (so PostgreSQL, which refuses a number there, stores the same value)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def hermes_row(
    session_id: Any,
    role: Any,
    content: Any,
    timestamp: float,
    *,
    tool_calls: Any = None,
    observed: Any = False,
    api_content: Any = None,
    platform_message_id: Any = None,
    effect_disposition: Any = None,
    reasoning_details: Any = None,
    codex_reasoning_items: Any = None,
    codex_message_items: Any = None,
    known: Collection[str] | None = None,
    index: int | None = None,
    **fields: Any,
) -> tuple[dict[str, Any], int]:
    """One message as Hermes v23 writes it, and what it adds to ``tool_call_count``.

    ``tool_calls`` may be JSON text (parsed first; unparsable text is kept as given and
    counts 0 — Hermes stores NULL there, a deliberate difference); ``observed`` is stored
    0/1; ``api_content`` only when it is a str; reasoning and codex items as JSON (see
    :func:`encode_json_text`). The rest goes through :func:`encode_row` (ids checked,
    content encoded, lone surrogates scrubbed).
    """
    try:
        parsed = parse_tool_calls(tool_calls)
        stored_calls = dump_json(parsed)
        if isinstance(tool_calls, str) and tool_calls.strip() and parsed == [] and stored_calls is None \
                and tool_calls.strip() != "[]":
            # Unparsable JSON text: Hermes v23 stores NULL and loses it; we keep the text
            # as given (counting 0 calls, as Hermes), so nothing the caller sent is lost.
            stored_calls = tool_calls
        values = {
            "tool_calls": stored_calls,
            "observed": 1 if observed else 0,
            "api_content": api_content if isinstance(api_content, str) else None,
            "platform_message_id": _as_text(platform_message_id),
            "effect_disposition": _as_text(effect_disposition),
            "reasoning_details": encode_json_text(reasoning_details),
            "codex_reasoning_items": encode_json_text(codex_reasoning_items),
            "codex_message_items": encode_json_text(codex_message_items),
        }
    except errors.InvalidInputError as exc:
        if index is None:
            raise
        raise type(exc)(f"{_label(index)}: {exc}") from exc
    values.update(fields)
    values = {k: v for k, v in values.items() if v is not None}
    return _encode(session_id, role, content, timestamp, values, known, index), tool_call_increment(parsed)


def display_fields(display_kind: Any, display_metadata: Any) -> dict[str, Any]:
    """The typed display columns as Hermes v24+ writes them: the kind only if it is a
    str, the metadata by :func:`encode_display_metadata`."""
    return {"display_kind": display_kind if isinstance(display_kind, str) else None,
            "display_metadata": encode_display_metadata(display_metadata)}


def replacement_rows(
    session_id: str, messages: Any, start: float | None = None, known: Collection[str] | None = None, *,
    wall: Clock,
) -> tuple[list[dict[str, Any]], int]:
    """Rows of a whole new transcript (``replace_messages``, ``archive_and_compact``,
    and imports), with the total ``tool_call_count`` they add.

    Per Hermes v23: ``role`` defaults to ``"unknown"``; ``platform_message_id`` falls
    back to the key ``message_id`` (what conversations carry); reasoning fields are
    kept for assistant messages only; the display fields as appends write them (v26);
    other keys are ignored. An explicit timestamp is kept; otherwise a clock starting
    at ``start`` (else ``wall()``, the repository's clock) hands out stamps that advance
    past both the previous stamp and the previous row's own timestamp.
    """
    if messages is None or isinstance(messages, (str, bytes, Mapping)):
        raise errors.InvalidInputError(f"messages must be a list of dicts, not {type(messages).__name__}")
    clock = wall() if start is None else float(start)
    rows: list[dict[str, Any]] = []
    calls = 0
    for index, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise errors.InvalidInputError(f"{_label(index)}: expected a dict, got {type(m).__name__}")
        role = m.get("role")
        ts = coerce_timestamp(m.get("timestamp"))
        if ts is None:
            ts = clock
        pid = m.get("platform_message_id")
        extra = {k: m.get(k) for k in REPLACE_KEYS}
        if role == "assistant":
            extra.update({k: m.get(k) for k in ASSISTANT_KEYS})
        extra.update(display_fields(m.get("display_kind"), m.get("display_metadata")))
        row, n = hermes_row(
            session_id, "unknown" if role is None else role, m.get("content"), ts,
            tool_calls=m.get("tool_calls"), platform_message_id=m.get("message_id") if pid is None else pid,
            known=known, index=index, **extra,
        )
        rows.append(row)
        calls += n
        clock = max(clock + CLOCK_STEP, ts + CLOCK_STEP)
    return rows, calls


#: Counters set to what a replace / compaction inserted.
_SET_COUNTS = (
    update(SESSIONS)
    .where(SESSIONS.c.id == bindparam("sid"))
    .values(message_count=bindparam("n"), tool_call_count=bindparam("calls"))
)
M = MESSAGES.c
#: Rows a conversation replay reads (Hermes v23 keys), in replay order per session.
_CONVERSATION_COLUMNS = (
    M.id, M.session_id, M.role, M.content, M.tool_call_id, M.tool_name, M.tool_calls, M.finish_reason,
    M.reasoning, M.reasoning_content, M.reasoning_details, M.codex_reasoning_items,
    M.codex_message_items, M.api_content, M.timestamp, M.effect_disposition,
    M.platform_message_id, M.observed, M.display_kind, M.display_metadata,
)
#: The key a replayed turn carries its row id under (Hermes v26, when asked).
ROW_ID_KEY = "_row_id"
#: What ``get_messages(include_compacted=True)`` takes as the same message (an archived
#: row and its clone after a watermark compaction): the live, newest copy is kept.
_SAME_MESSAGE = (M.role, M.content, M.timestamp, M.tool_call_id, M.tool_calls, M.tool_name)
ASSISTANT_JSON = ("reasoning_details", "codex_reasoning_items", "codex_message_items")


def decode_row(row: dict[str, Any]) -> MessageRecord:
    """Content decoded, tool_calls parsed (invalid JSON → ``[]``) and display_metadata
    decoded (:func:`decode_display_metadata`), as Hermes' get_messages returns them;
    other JSON columns stay text."""
    row.pop("search_vector", None)  # PostgreSQL's generated search column is not message data
    row["content"] = decode_content(row.get("content"))
    if row.get("tool_calls") is not None:
        row["tool_calls"] = decode_json_or(row["tool_calls"], [])
    if "display_metadata" in row:
        row["display_metadata"] = decode_display_metadata(row["display_metadata"])
    return row  # type: ignore[return-value]


def conversation_turn(row: Mapping[str, Any], *, row_id: bool = False) -> dict[str, Any]:
    """One stored message as an OpenAI-style dict (Hermes v23 keys).

    Always ``role`` and ``content`` (user/assistant text without recalled memory,
    stripped); then, when set: ``api_content``, ``timestamp``, ``effect_disposition``,
    ``message_id`` (the platform's id), ``observed: True``, ``tool_call_id``,
    ``tool_name``, ``tool_calls`` (invalid JSON → ``[]``); on assistant turns also
    ``finish_reason``, ``reasoning``, ``reasoning_content`` (even empty) and the
    reasoning/codex items (invalid JSON → None). Hermes v26: ``display_kind`` and
    ``display_metadata`` (decoded) when set, and ``_row_id`` when ``row_id`` is asked.
    """
    return _turn(tuple(row[name] for name in _CONVERSATION_NAMES), row_id)


#: The keys of :data:`_CONVERSATION_COLUMNS`, in order (a replay reads its rows as tuples).
_CONVERSATION_NAMES = tuple(c.name for c in _CONVERSATION_COLUMNS)
_HARNESS_ROLES = ("user", "system")
_NO_METADATA = (None, "")


def _turn(row: Sequence[Any], row_id: bool) -> dict[str, Any]:
    """:func:`conversation_turn` of a row tuple in :data:`_CONVERSATION_COLUMNS` order
    (the replay's loop: names unpacked once, no mapping lookups)."""
    (rid, _sid, role, content, tool_call_id, tool_name, tool_calls, finish_reason, reasoning, reasoning_content,
     reasoning_details, codex_reasoning_items, codex_message_items, api_content, timestamp, effect_disposition,
     platform_message_id, observed, display_kind, display_metadata) = row
    if content.__class__ is str and content.startswith(JSON_PREFIX):
        content = decode_content(content)
    if role in TEXT_ROLES:
        content = sanitize_turn_text(content)
    msg: dict[str, Any] = {"role": role, "content": content}
    if row_id:
        msg[ROW_ID_KEY] = rid
    if display_kind:
        msg["display_kind"] = display_kind
    if display_metadata not in _NO_METADATA:
        metadata = decode_display_metadata(display_metadata)
        if metadata:
            msg["display_metadata"] = metadata
    if api_content is not None:
        msg["api_content"] = api_content
    if timestamp is not None:
        msg["timestamp"] = timestamp
    if effect_disposition:
        msg["effect_disposition"] = effect_disposition
    if platform_message_id:
        msg["message_id"] = platform_message_id
    if observed:
        msg["observed"] = True
    if tool_call_id:
        msg["tool_call_id"] = tool_call_id
    if tool_name:
        msg["tool_name"] = tool_name
    if tool_calls:
        msg["tool_calls"] = decode_json_or(tool_calls, [])
    if role == "assistant":
        if finish_reason:
            msg["finish_reason"] = finish_reason
        if reasoning:
            msg["reasoning"] = reasoning
        if reasoning_content is not None:
            msg["reasoning_content"] = reasoning_content
        if reasoning_details:
            msg["reasoning_details"] = decode_json_or(reasoning_details, None)
        if codex_reasoning_items:
            msg["codex_reasoning_items"] = decode_json_or(codex_reasoning_items, None)
        if codex_message_items:
            msg["codex_message_items"] = decode_json_or(codex_message_items, None)
    return msg


def build_conversation(rows: Iterable[Sequence[Any] | Mapping[str, Any]], *, dedupe: bool, repair: bool = False,
                       row_ids: bool = False) -> list[dict[str, Any]]:
    """Stored rows (replay order; tuples in :data:`_CONVERSATION_COLUMNS` order, or
    mappings) → a conversation.

    ``dedupe`` (ancestor mode): a user turn whose text was already sent since the last
    assistant reply is the copy a compression replays into the continuation, and is
    skipped. Background-review harness turns ("Review the conversation above and …")
    and the assistant reply right after each are always removed, and stale tool-call
    markers blanked (:func:`strip_stale_tool_call_markers`). ``repair`` runs
    :func:`repair_message_sequence` on the result; ``row_ids`` adds ``_row_id``.

    One pass: the three rules are applied in their order (deduplication, then the
    harness on what it kept, then the markers on what that kept) as each turn is made.
    """
    out: list[dict[str, Any]] = []
    pending_users: set[str] = set()
    skip_reply = False
    for row in rows:
        msg = _turn(row, row_ids) if row.__class__ is tuple else conversation_turn(row, row_id=row_ids)  # type: ignore[arg-type]
        role, content = msg["role"], msg["content"]
        if dedupe:
            if role == "user":
                key = content if isinstance(content, str) else repr(content)
                if key in pending_users:
                    continue  # replayed again after a compression boundary, no reply between
                pending_users.add(key)
            elif role == "assistant":
                pending_users.clear()
        if role in _HARNESS_ROLES and isinstance(content, str) and _is_background_review_harness_message(msg):
            skip_reply = True  # a background-review turn, and the assistant reply after it
            continue
        if skip_reply:
            skip_reply = False
            if role == "assistant":
                continue
        if role == "assistant" and is_stale_tool_call_marker_message(msg):
            msg["content"] = ""
        out.append(msg)
    return repair_message_sequence(out) if repair else out


@functools.cache
def _one_session_rows(include_inactive: bool) -> Select[Any]:
    """One session's replay rows (live ones unless ``include_inactive``), by id: ``:sid``."""
    q = select(*_CONVERSATION_COLUMNS).where(M.session_id == bindparam("sid", type_=String))
    if not include_inactive:
        q = q.where(M.active == 1)
    return q.order_by(M.id)


def _page(limit: Any, offset: Any) -> tuple[int | None, int]:
    """(limit, offset) as SQLite reads them: None or negative limit = no limit, negative
    offset = 0. Non-integers are refused (typed) rather than guessed."""
    try:
        lim = None if limit is None else operator.index(limit)
        off = 0 if offset is None else operator.index(offset)
    except TypeError as exc:
        raise errors.InvalidInputError(f"limit and offset must be integers, not {limit!r}, {offset!r}") from exc
    return (None if lim is not None and lim < 0 else lim), max(off, 0)


def _message_list(messages: Any) -> list[Any]:
    """A transcript write's messages as a list (a single dict or text is refused)."""
    if messages is None or isinstance(messages, (str, bytes, Mapping)):
        raise errors.InvalidInputError(f"messages must be a list of dicts, not {type(messages).__name__}")
    return list(messages)


def _watermark(value: Any) -> int:
    """A row id a compaction or a read counts from (an integer; True/False refused)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise errors.InvalidInputError(f"a message id must be an integer, not {value!r}")


def _message_id(value: Any) -> int | None:
    """A message id as SQLite would match it against ``messages.id`` (an int, or the text
    of one); None when it cannot match any row."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        try:
            return int(value)
        except ValueError:
            return None
    try:
        return operator.index(value)
    except TypeError:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return None


class MessageRepository(Repository):
    """Rows of ``messages``; keeps the session's counters in step in the same transaction."""

    def _known(self) -> frozenset[str]:
        known = self.columns_of("messages")
        if not known:
            # No messages table here (a tenant not migrated yet): say so, instead of
            # refusing every field as unknown.
            raise errors.NotMigratedError(
                "the database has no messages table: it is not migrated yet; run "
                "hermes_store.migrations.upgrade(<path, URL or Engine>) or `hermes-store upgrade` first"
            )
        return known

    def _require_session(self, session_id: Any) -> None:
        if session_id is None or not self.session_exists(session_id):
            raise UnknownSessionError(f"unknown session {session_id!r}: no such session (FOREIGN KEY)")

    def _lock_session(self, session_id: Any) -> bool:
        """Whether the session exists, its row locked until the transaction ends.

        Rewrites that read, then change a transcript (replace, compact, rewind,
        restore, the api_content check-and-set) run one at a time per session: on
        PostgreSQL this row lock orders them (appends wait on it too, through the
        counter update); SQLite's BEGIN IMMEDIATE already serialises every writer.
        """
        if session_id is None:
            return False
        q = select(SESSIONS.c.id).where(SESSIONS.c.id == session_id).with_for_update()
        return self.conn.execute(q).first() is not None

    def _locked_state(self, session_id: str) -> tuple[bool, Any]:
        """``(exists, end_reason)`` with the row locked as :meth:`_lock_session` does."""
        q = select(SESSIONS.c.end_reason).where(SESSIONS.c.id == session_id).with_for_update()
        row = self.conn.execute(q).first()
        return (False, None) if row is None else (True, row[0])

    def _is_branch(self, session_id: str) -> bool:
        """Whether the session is an explicit branch (``_branched_from`` in its config):
        its replay never includes the ancestors' rows (Hermes v26)."""
        config = self.conn.execute(select(SESSIONS.c.model_config).where(SESSIONS.c.id == session_id)).scalar()
        return _marker(config, BRANCH_MARKER)

    # ------------------------------------------------------------------ append

    def append(self, session_id: str, role: str, content: Any = None, *, timestamp: Any = None,
               turn_lease: tuple[str, float] | None = None, **fields: Any) -> int:
        """Insert one live message (Hermes ``append_message``) and bump the counters.

        ``fields`` are append_message's keywords (see :func:`hermes_row`) plus any other
        ``messages`` column. An unconvertible ``timestamp`` is ignored (the clock is
        used). ``turn_lease`` ``(holder, ttl_seconds)`` runs the transcript guards first
        (:func:`guard_transcript_write`). Returns the new id; an unknown session raises
        :class:`UnknownSessionError`.
        """
        if session_id is None:
            raise UnknownSessionError("no session id (messages.session_id is NOT NULL)")
        ts = coerce_timestamp(timestamp)
        row, calls = hermes_row(session_id, role, content, self.now() if ts is None else ts,
                                known=self._known(), **fields)
        if turn_lease is not None:
            guard_transcript_write(self.conn, session_id, holder=turn_lease[0], ttl_seconds=turn_lease[1],
                                   now=self.now())
        # The hot path of every agent turn: on SQLite two plain statements on the
        # DB-API connection, inside the caller's transaction (see the dialects).
        return self.dialect.append_message(self.conn, row, calls)

    @staticmethod
    def encode_append(session_id: Any, role: Any, content: Any = None, *, timestamp: Any = None,
                      known: Collection[str], **fields: Any) -> tuple[dict[str, Any], int, bool]:
        """:meth:`append`'s row before any connection: ``(row, tool calls it adds, whether
        the write stamps its timestamp)``. The caller encodes while another writes, and
        only :meth:`append_encoded` runs in the write turn; ``known``: the columns of
        ``messages`` (:func:`~hermes_store.repositories.base.cached_columns`)."""
        if session_id is None:
            raise UnknownSessionError("no session id (messages.session_id is NOT NULL)")
        ts = coerce_timestamp(timestamp)
        row, calls = hermes_row(session_id, role, content, 0.0 if ts is None else ts, known=known, **fields)
        return row, calls, ts is None

    def append_encoded(self, row: dict[str, Any], calls: int, *, stamp: bool) -> int:
        """Write a row of :meth:`encode_append`: stamped now by this repository's clock
        when ``stamp`` (so ids and timestamps advance together), counters bumped."""
        if stamp:
            row["timestamp"] = self.now()
        return self.dialect.append_message(self.conn, row, calls)

    def insert_message_rows(self, session_id: str, messages: Any) -> tuple[int, int]:
        """THE row inserter of batch appends, replacements and compactions (Hermes v26's
        ``_insert_message_rows``): ``messages`` as live rows (:func:`replacement_rows`),
        each input dict given its new id as ``msg["_row_id"]``. Counters are the
        caller's; returns ``(rows inserted, tool calls they add)``.

        The session row is locked first, so no other writer adds rows to the session
        until the transaction ends (on PostgreSQL a row insert waits on that lock
        through its foreign key): the session's newest ids are then exactly these rows.
        """
        items = _message_list(messages)
        rows, calls = replacement_rows(session_id, items, known=self._known(), wall=self.now)
        if not rows:
            return 0, 0
        if not self._lock_session(session_id):
            raise UnknownSessionError(f"unknown session {session_id!r}: no such session (FOREIGN KEY)")
        self.insert_rows(rows)
        newest = select(M.id).where(M.session_id == session_id).order_by(M.id.desc()).limit(len(rows))
        ids = [int(r[0]) for r in self.conn.execute(newest).fetchall()][::-1]
        for msg, row_id in zip(items, ids, strict=False):  # as many ids as rows written
            if isinstance(msg, dict):
                msg[ROW_ID_KEY] = row_id
        return len(rows), calls

    def append_batch(self, session_id: str, messages: Any, *, turn_lease: tuple[str, float] | None = None,
                     insert: Inserter | None = None) -> int:
        """Hermes v26 ``append_messages_batch`` for one transaction: the transcript guards
        once, every row through the shared inserter, one counter update. Returns the
        rows inserted; any failure leaves nothing (the caller's transaction)."""
        check_key(session_id, "session id")
        items = _message_list(messages)
        if not items:
            return 0
        holder, ttl = turn_lease if turn_lease is not None else (None, 0.0)
        guard_transcript_write(self.conn, session_id, holder=holder, ttl_seconds=ttl, now=self.now())
        n, calls = (insert or self.insert_message_rows)(session_id, items)
        if n:
            self.dialect.bump_message_counts(self.conn, [(session_id, n, calls)])
        return n

    def bulk_append(self, messages: Iterable[Mapping[str, Any]], *, update_counters: bool = True) -> int:
        """Insert many messages with one executemany per column set; counters once per session.

        Each item is a dict with at least ``session_id`` and ``role``; other keys are
        message columns (``content`` may be a list/dict, JSON columns may be objects;
        ``active`` is kept as given, so an import can carry rewound rows). Every item
        is encoded and checked, and every session must exist, before the first row is
        written: a bad item (named by its index) or an unknown session raises
        InvalidInputError / UnknownSessionError with nothing inserted.
        """
        known = self._known()
        rows: list[dict[str, Any]] = []
        per_session: dict[str, list[int]] = {}
        for index, item in enumerate(messages):
            row = encode_message(item, known, index=index, clock=self.now)
            rows.append(row)
            c = per_session.setdefault(row["session_id"], [0, 0])
            c[0] += 1
            c[1] += count_tool_calls(item.get("tool_calls"))
        missing = missing_sessions(self.conn, per_session)
        if missing:
            first = next(i for i, r in enumerate(rows) if r["session_id"] == missing[0])
            raise UnknownSessionError(
                f"unknown session {missing[0]!r} (message #{first})"
                + (f" and {len(missing) - 1} more unknown sessions" if len(missing) > 1 else "")
            )
        self.insert_rows(rows)
        if update_counters and per_session:
            self.dialect.bump_message_counts(self.conn, [(sid, n, c) for sid, (n, c) in per_session.items()])
        return len(rows)

    def insert_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        """Write rows made by :func:`encode_row` in input order; no counters are touched.

        A conversation's rows carry different columns (a tool call, a tool result, a
        plain turn), so each row is widened to every column of the batch, a missing one
        given the value its constant default would give (NULL, 0, 1…): the batch is then
        one executemany, not one per change of shape. A row that lacks a column whose
        default is not a constant (or an id, which the database numbers) keeps its own
        shape. Consecutive rows of one shape share a run, so ids follow the input order.
        """
        columns = list(dict.fromkeys(name for row in rows for name in row))
        fills = _constant_fills(columns, self.column_defaults("messages")) if len(columns) > 1 else {}
        runs: _Runs = []
        for row in rows:
            if all(c in row or c in fills for c in columns):
                names = tuple(columns)
                values = tuple(row[c] if c in row else fills[c] for c in columns)
            else:
                names = tuple(row)
                values = tuple(row.values())  # in ``names`` order
            if not runs or runs[-1][0] != names:
                runs.append((names, []))
            runs[-1][1].append(values)
        self.dialect.insert_messages(self.conn, runs, lambda: self.column_defaults("messages"))

    # ------------------------------------------------------------------ reads

    def get_messages(
        self, session_id: str, include_inactive: bool = False, limit: Any = None, offset: Any = 0, *,
        include_compacted: bool = False, latest: bool = False, after_id: Any = None,
    ) -> list[MessageRecord]:
        """Message rows by id (insertion order): live ones unless ``include_inactive``.

        ``limit`` caps (None or negative: no cap), ``offset`` skips (alone it pages too).
        Hermes v25: ``include_compacted`` adds the compaction-archived rows, one row per
        same message (:data:`_SAME_MESSAGE`; the live, newest copy), before paging
        (``include_inactive`` wins); ``latest`` pages back from the newest row (still
        returned oldest first); ``after_id`` keeps rows with a greater id and goes with
        neither ``latest``, an offset nor ``include_compacted`` (ValueError).
        """
        if after_id is not None:
            for flag, name in ((latest, "latest"), (offset, "offset"), (include_compacted, "include_compacted")):
                if flag:
                    raise errors.InvalidInputError(f"after_id cannot be combined with {name}")
            after = _watermark(after_id)
        lim, off = _page(limit, offset)
        if session_id is None or lim == 0:
            return []
        where = [M.session_id == session_id]
        if after_id is not None:
            where.append(M.id > after)
        source: FromClause
        if include_inactive:
            source = MESSAGES
        elif include_compacted:
            rank = func.row_number().over(partition_by=_SAME_MESSAGE, order_by=(M.active.desc(), M.id.desc()))
            ranked = select(MESSAGES, rank.label("same_message_rank")).where(
                *where, or_(M.active == 1, M.compacted == 1)
            ).subquery("ranked")
            source, where = ranked, [ranked.c.same_message_rank == 1]
        else:
            source = MESSAGES
            where.append(M.active == 1)
        ident = source.c.id
        q = select(*(source.c[c.name] for c in MESSAGES.c)).where(*where)
        q = q.order_by(ident.desc() if latest else ident)
        if lim is not None:
            q = q.limit(lim)
        if off:
            q = q.offset(off)
        result = self.conn.execute(q)
        keys = list(result.keys())
        rows = [decode_row(dict(zip(keys, r, strict=True))) for r in result.fetchall()]
        return rows[::-1] if latest else rows

    def count(self, session_id: str | None = None) -> int:
        """Stored rows (live or not) of one session, or of all sessions."""
        q = select(func.count()).select_from(MESSAGES)
        if session_id is not None:
            q = q.where(M.session_id == session_id)
        return int(self.conn.execute(q).scalar_one())

    def has_archived(self, session_id: str) -> bool:
        """Whether the session keeps any row that is not live (rewound or compacted)."""
        q = select(literal(1)).where(M.session_id == session_id, M.active == 0).limit(1)
        return self.conn.execute(q).first() is not None

    def has_platform_message_id(self, session_id: str, platform_message_id: Any) -> bool:
        """Whether a row (live or not) carries this platform message id."""
        if session_id is None or platform_message_id is None:
            return False
        q = (select(literal(1))
             .where(M.session_id == session_id, M.platform_message_id == _as_text(platform_message_id))
             .limit(1))
        return self.conn.execute(q).first() is not None

    # ------------------------------------------------------------------ whole-transcript writes

    def clear(self, session_id: str) -> int:
        """Delete every row of the session (live or not); counters to zero."""
        deleted = self.conn.execute(delete(MESSAGES).where(M.session_id == session_id)).rowcount
        self.conn.execute(_SET_COUNTS, {"n": 0, "calls": 0, "sid": session_id})
        return deleted

    def replace(self, session_id: str, messages: Any, active_only: bool = False, archive_dropped: bool = False,
                *, insert: Inserter | None = None, refuse_closed: bool = False) -> int:
        """Swap the transcript (Hermes ``replace_messages``); returns the rows written.

        ``refuse_closed`` (Hermes' own call, not an import): a session ended by
        compression refuses (:class:`CompressionSessionClosedError`).
        Deletes the session's rows (only the live ones with ``active_only``, so rewound
        and compacted history stays; ``archive_dropped`` keeps them as ``active = 0``
        instead), inserts ``messages`` as live rows through the shared inserter and sets
        the counters to what was inserted, all in the caller's one transaction (a bad
        message rolls the deletion back too). An unknown session raises
        :class:`UnknownSessionError` unless there is nothing to insert.
        """
        check_key(session_id, "session id")
        items = _message_list(messages)
        exists, end_reason = self._locked_state(session_id)
        if refuse_closed:
            raise_if_closed_by_compression(session_id, end_reason)
        if not exists:
            if items:
                raise UnknownSessionError(f"unknown session {session_id!r}: no such session (FOREIGN KEY)")
            return 0
        live = M.session_id == session_id
        if active_only or archive_dropped:
            live = live & (M.active == 1)
        if archive_dropped:
            self.conn.execute(update(MESSAGES).where(live).values(active=0))
        else:
            self.conn.execute(delete(MESSAGES).where(live))
        n, calls = (insert or self.insert_message_rows)(session_id, items)
        self.conn.execute(_SET_COUNTS, {"n": n, "calls": calls, "sid": session_id})
        return n

    def archive_and_compact(self, session_id: str, compacted_messages: Any, *,
                            model_config_patch: Mapping[str, Any] | None = None, watermark: Any = None,
                            lock_holder: str | None = None, insert: Inserter | None = None) -> int:
        """Archive the live transcript and start over from ``compacted_messages``.

        ``lock_holder``: the caller's compression lease must still be held (else
        :class:`SessionCompressionInProgressError`, nothing written). Every live row
        becomes ``active = 0, compacted = 1`` (kept, still searchable); the new messages
        are inserted live through the shared inserter. ``model_config_patch`` is merged
        into ``model_config`` (None deletes a key). With ``watermark``, the live rows
        above it (appended while the summary was written) are cloned after the
        compacted set as new live rows. Counters and the return value: compacted +
        cloned rows.
        """
        check_key(session_id, "session id")
        items = _message_list(compacted_messages)
        mark = None if watermark is None else _watermark(watermark)
        if lock_holder is not None:
            held = self.conn.execute(
                select(LOCKS.c.holder).where(LOCKS.c.session_id == session_id, LOCKS.c.expires_at >= self.now())
            ).scalar()
            if held != lock_holder:
                raise errors.SessionCompressionInProgressError(
                    f"Session '{session_id}' is being compressed: compression lease not held by {lock_holder!r}"
                )
        exists, _end = self._locked_state(session_id)
        if model_config_patch:
            if not exists:
                raise errors.InvalidInputError(f"Session not found: {session_id}")
            self._patch_model_config(session_id, model_config_patch)
        if not exists and items:
            raise UnknownSessionError(f"unknown session {session_id!r}: no such session (FOREIGN KEY)")
        tail = [] if mark is None else self.conn.execute(
            select(M.id, M.tool_calls).where(M.session_id == session_id, M.active == 1, M.id > mark).order_by(M.id)
        ).fetchall()
        self.conn.execute(
            update(MESSAGES).where(M.session_id == session_id, M.active == 1).values(active=0, compacted=1)
        )
        n, calls = (insert or self.insert_message_rows)(session_id, items)
        self._clone_rows([int(r[0]) for r in tail])
        n += len(tail)
        calls += sum(tool_call_increment(parse_tool_calls(r[1])) for r in tail if r[1] is not None)
        self.conn.execute(_SET_COUNTS, {"n": n, "calls": calls, "sid": session_id})
        return n

    def _clone_rows(self, ids: Sequence[int]) -> None:
        """New live copies of these rows (every column but id/active/compacted), in id order."""
        if not ids:
            return
        present = self.columns_of("messages")
        copied = [c for c in MESSAGES.c if c.name not in ("id", "active", "compacted") and c.name in present]
        for start in range(0, len(ids), ID_CHUNK):
            chunk = ids[start:start + ID_CHUNK]
            source = select(*copied, literal(1).label("active")).where(M.id.in_(chunk)).order_by(M.id)
            self.conn.execute(MESSAGES.insert().from_select([*(c.name for c in copied), "active"], source))

    def _patch_model_config(self, session_id: str, patch: Mapping[str, Any]) -> None:
        """Merge ``patch`` into the session's ``model_config`` (None deletes a key; an
        empty result is NULL). The row is already locked by the caller."""
        stored = decode_json(self.conn.execute(
            select(SESSIONS.c.model_config).where(SESSIONS.c.id == session_id)
        ).scalar())
        config = dict(stored) if isinstance(stored, dict) else {}
        for key, value in patch.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        self.conn.execute(
            update(SESSIONS).where(SESSIONS.c.id == session_id).values(model_config=dump_json(config))
        )

    def active_watermark(self, session_id: str) -> int:
        """The newest live row's id (0 when there is none): what a compaction may later
        pass as ``watermark``."""
        found = self.conn.execute(
            select(func.max(M.id)).where(M.session_id == session_id, M.active == 1)
        ).scalar()
        return 0 if found is None else int(found)

    def set_latest_user_api_content(self, session_id: str, content: Any, api_content: Any) -> int:
        """Attach ``api_content`` to the newest live user row if it still holds ``content``.

        The check and the write happen in the caller's one transaction, so a turn that
        arrived in between is never given another turn's API text. Returns 0 or 1.
        """
        if api_content is not None and not isinstance(api_content, str):
            raise errors.InvalidInputError(f"api_content must be str or None, not {type(api_content).__name__}")
        if not self._lock_session(session_id):
            return 0
        expected = encode_content(content)
        row = self.conn.execute(
            select(M.id, M.content)
            .where(M.session_id == session_id, M.role == "user", M.active == 1)
            .order_by(M.id.desc())
            .limit(1)
        ).first()
        if row is None or row[1] != expected:
            return 0
        value = None if api_content is None else clean_text(api_content)
        return self.conn.execute(update(MESSAGES).where(M.id == row[0]).values(api_content=value)).rowcount

    # ------------------------------------------------------------------ rewind

    def rewind(self, session_id: str, target_message_id: Any) -> RewindResult:
        """Hide the target user message and everything after it (Hermes v23 ``rewind_to_message``).

        The target is checked and the rows hidden in the caller's one transaction, so a
        concurrent writer cannot slip between the check and the rewind. ``rewind_count``
        grows by one even when nothing was live past the target; ``message_count`` stays.
        """
        mid = _message_id(target_message_id)
        found = None
        if mid is not None and self._lock_session(session_id):
            result = self.conn.execute(select(MESSAGES).where(M.id == mid, M.session_id == session_id))
            first = result.first()
            if first is not None:
                found = dict(zip(result.keys(), first, strict=True))
        if found is None:
            raise MessageNotFoundError(f"message {target_message_id} not found in session {session_id}")
        if found["role"] != "user":
            raise errors.InvalidInputError(
                f"rewind target must be a 'user' message (got role={found['role']!r}, id={target_message_id})"
            )
        rewound = self.conn.execute(
            update(MESSAGES).where(M.session_id == session_id, M.active == 1, M.id >= mid).values(active=0)
        ).rowcount
        self.conn.execute(
            update(SESSIONS).where(SESSIONS.c.id == session_id)
            .values(rewind_count=func.coalesce(SESSIONS.c.rewind_count, 0) + 1)
        )
        head = self.conn.execute(
            select(func.max(M.id)).where(M.session_id == session_id, M.active == 1)
        ).scalar()
        return {
            "rewound_count": int(rewound),
            "target_message": decode_row(found),
            "new_head_id": None if head is None else int(head),
        }

    def restore_rewound(self, session_id: str, since_message_id: Any) -> int:
        """Make every non-live row with ``id >= since`` live again; returns how many.

        As in Hermes, compaction-archived rows in range come back too; counters and
        ``rewind_count`` are left as they are.
        """
        since = _message_id(since_message_id)
        if since is None or not self._lock_session(session_id):
            return 0
        return int(self.conn.execute(
            update(MESSAGES).where(M.session_id == session_id, M.active == 0, M.id >= since).values(active=1)
        ).rowcount)

    # ------------------------------------------------------------------ windows

    def around(self, session_id: str, anchor_id: int, window: int = 5) -> MessageWindow:
        """The anchor with up to ``window`` rows on each side (live or not).

        ``messages_before`` / ``messages_after`` count the returned rows on each side.
        """
        window = max(int(window or 0), 0)
        anchor = _message_id(anchor_id)
        if anchor is None or session_id is None:
            return MessageWindow([], 0, 0)
        found = self.conn.execute(
            select(literal(1)).where(M.id == anchor, M.session_id == session_id)
        ).first()
        if found is None:
            return MessageWindow([], 0, 0)
        before = (select(MESSAGES).where(M.session_id == session_id, M.id < anchor)
                  .order_by(M.id.desc()).limit(window))
        after = (select(MESSAGES).where(M.session_id == session_id, M.id >= anchor)
                 .order_by(M.id).limit(window + 1))
        rows = []
        for q in (before, after):
            result = self.conn.execute(q)
            keys = list(result.keys())
            rows += [dict(zip(keys, r, strict=True)) for r in result.fetchall()]
        rows.sort(key=lambda r: r["id"])
        n_before = sum(1 for r in rows if r["id"] < anchor)
        return MessageWindow([decode_row(r) for r in rows], n_before, len(rows) - n_before - 1)

    def anchored_view(
        self,
        session_id: str,
        anchor_id: int,
        window: int = 5,
        bookend: int = 3,
        keep_roles: Sequence[str] | None = ("user", "assistant"),
    ) -> MessageWindow:
        """A window over the kept roles (the anchor is always kept) plus first/last bookends.

        Rows live or not; ``messages_before`` / ``messages_after`` count the window's
        rows on each side of the anchor.
        """
        window, bookend = max(int(window or 0), 0), max(int(bookend or 0), 0)
        anchor = _message_id(anchor_id)
        if anchor is None or session_id is None:
            return MessageWindow([], 0, 0, [], [])
        result = self.conn.execute(select(MESSAGES).where(M.session_id == session_id).order_by(M.id))
        keys = list(result.keys())
        rows = [dict(zip(keys, r, strict=True)) for r in result.fetchall()]
        idx = next((i for i, r in enumerate(rows) if r["id"] == anchor), None)
        if idx is None:
            return MessageWindow([], 0, 0, [], [])
        keep = set(keep_roles) if keep_roles else None
        kept = [r for r in rows if keep is None or r["role"] in keep or r["id"] == anchor]
        k = next(i for i, r in enumerate(kept) if r["id"] == anchor)
        lo, hi = max(k - window, 0), min(k + window + 1, len(kept))
        win = kept[lo:hi]

        def non_empty(r: dict[str, Any]) -> bool:
            c = r.get("content")
            return c is not None and (not isinstance(c, str) or c.strip() != "")

        start = [r for r in kept[:lo] if non_empty(r)][:bookend]
        end = [r for r in kept[hi:] if non_empty(r)][-bookend:] if bookend else []
        return MessageWindow(
            [decode_row(r) for r in win], k - lo, hi - k - 1,
            [decode_row(r) for r in start], [decode_row(r) for r in end],
        )

    # ------------------------------------------------------------------ replay

    def _conversation_rows(self, session_ids: Sequence[str], include_inactive: bool) -> list[Any]:
        """Rows of the given sessions in replay order (that session order, then id), as
        tuples in :data:`_CONVERSATION_COLUMNS` order; one query."""
        ids = [s for s in dict.fromkeys(session_ids) if s is not None]
        if not ids:
            return []
        if len(ids) == 1:
            # The common replay: a statement built once, its rows the driver's tuples
            # (no column needs SQLAlchemy's processing; a Row per message cost more than
            # the fetch itself).
            return fetch_tuples(self.conn.execute(_one_session_rows(include_inactive), {"sid": ids[0]}))
        q = select(*_CONVERSATION_COLUMNS).where(M.session_id.in_(ids))
        if not include_inactive:
            q = q.where(M.active == 1)
        q = q.order_by(case({sid: i for i, sid in enumerate(ids)}, value=M.session_id), M.id)
        return fetch_tuples(self.conn.execute(q))

    def conversation(
        self, session_ids: Sequence[str], *, include_inactive: bool = False, repair: bool = False,
        row_ids: bool = False,
    ) -> list[dict[str, Any]]:
        """OpenAI chat-format replay of the given sessions, in order (one query).

        More than one session is ancestor mode (replayed user turns deduplicated).
        """
        rows = self._conversation_rows(session_ids, include_inactive)
        return build_conversation(rows, dedupe=len(session_ids) > 1, repair=repair, row_ids=row_ids)

    def lineage_conversation(
        self, session_id: str, *, include_ancestors: bool = False, include_inactive: bool = False,
        repair: bool = False, row_ids: bool = False,
    ) -> list[dict[str, Any]]:
        """Hermes' ``get_messages_as_conversation``: the session, or its whole parent chain
        root-first (every ``parent_session_id`` link, cycle-safe). An explicit branch
        replays its own rows only (Hermes v26)."""
        if session_id is None:
            return []
        ids = self._lineage(session_id) if include_ancestors else [session_id]
        return self.conversation(ids, include_inactive=include_inactive, repair=repair, row_ids=row_ids)

    def _lineage(self, session_id: str) -> list[str]:
        """The replayed sessions of a lineage read: root first, the session last; only the
        session for an explicit branch."""
        if self._is_branch(session_id):
            return [session_id]
        return self._peer(LineageRepository).ancestors(session_id) or [session_id]

    def resume_conversations(self, session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``(model_history, display_history)`` from one read of the lineage's live rows:
        the session's own turns repaired for a model, and the root-first display (the
        own rows only for a branch); both carry ``_row_id``."""
        if session_id is None:
            return [], []
        ids = self._lineage(session_id)
        rows = self._conversation_rows(ids, include_inactive=False)
        own = [r for r in rows if r[1] == session_id]
        return (build_conversation(own, dedupe=False, repair=True, row_ids=True),
                build_conversation(rows, dedupe=len(ids) > 1, row_ids=True))

    def ancestor_display_prefix(self, session_id: str) -> list[dict[str, Any]]:
        """The display conversation of the ancestors' live rows (not the session's own;
        none for a branch)."""
        if session_id is None:
            return []
        ids = [i for i in self._lineage(session_id) if i != session_id]
        if not ids:
            return []
        return build_conversation(self._conversation_rows(ids, include_inactive=False), dedupe=True)
