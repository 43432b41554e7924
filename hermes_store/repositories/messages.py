"""Messages: append (single and bulk), read back, replace, windows, conversation replay."""

from __future__ import annotations

import math
import operator
import sqlite3
from typing import Any, Collection, Iterable, Mapping, Sequence

from sqlalchemy import column, insert, table, text

from .. import errors
from ..codec import (
    check_key,
    clean_text,
    count_tool_calls,
    decode_content,
    decode_json,
    encode_content,
    encode_json,
    strip_memory_context,
    text_from_bytes,
)
from ..engine import translate_driver_error
from .base import MESSAGES, Repository, UnknownFieldError, driver_errors, driver_insert, missing_sessions, now
from .records import MessageRecord, MessageWindow

#: JSON-ish columns: stored as JSON text (falsy → NULL), decoded on read.
JSON_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items", "codex_message_items")
#: Binary columns: bytes are stored as they are (v30's display identity digest).
BLOB_COLUMNS = frozenset({"display_identity"})
MESSAGE_FIELDS = (
    "tool_name", "tool_calls", "tool_call_id", "token_count", "finish_reason", "reasoning",
    "reasoning_content", "reasoning_details", "codex_reasoning_items", "codex_message_items",
)
ASSISTANT_EXTRAS = ("finish_reason",)
DECODED_EXTRAS = ("reasoning_details", "codex_reasoning_items", "codex_message_items")
#: Batches at least this large go through a staging table (see _insert_staged).
BULK_STAGE_MIN = 64
STAGE = "hermes_store_bulk_stage"
_BYTES = (bytes, bytearray, memoryview)
_Runs = list[tuple[tuple[str, ...], list[tuple[Any, ...]]]]


def _text(value: Any, key: str) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, _BYTES):
        return text_from_bytes(value, key)
    return value


def _timestamp(value: Any) -> float:
    if value is None:
        return now()
    try:
        ts = float(value)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInputError(f"timestamp must be a number of seconds, not {value!r}") from exc
    if not math.isfinite(ts):
        raise errors.InvalidInputError(f"timestamp must be finite, not {value!r}")
    return ts


def _target(table_name: str, names: Sequence[str]) -> Any:
    """The model's table when it has every column, else a lightweight table of ``names``."""
    if table_name == "messages" and all(n in MESSAGES.c for n in names):
        return MESSAGES
    return table(table_name, *(column(n) for n in names))


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
    fields: dict[str, Any], known: Collection[str] | None, index: int | None,
) -> dict[str, Any]:
    """:func:`encode_row` without repacking keyword arguments (the hot paths call this)."""
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
            "timestamp": _timestamp(timestamp),
        }
        for key, value in fields.items():
            if key in JSON_COLUMNS:
                row[key] = encode_json(value)
            elif key in BLOB_COLUMNS and isinstance(value, _BYTES):
                row[key] = bytes(value)
            else:
                row[key] = _text(value, key)
    except errors.InvalidInputError as exc:
        if index is None:
            raise
        # Same class, the item named, the underlying cause (driver/codec error) kept.
        raise type(exc)(f"{_label(index)}: {exc}") from (exc.__cause__ or exc)
    return row


def encode_message(
    item: Any, known: Collection[str], *, index: int | None = None, keep_id: bool = False
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
    row = _encode(sid, role, content, ts, fields, known, index)
    if keep_id and mid is not None:
        try:
            row = {"id": operator.index(mid), **row}
        except TypeError as exc:
            raise errors.InvalidInputError(f"{_label(index)}: id must be an integer, not {mid!r}") from exc
    return row


#: Counter update of one append / one session of a bulk append (portable SQL).
_BUMP = text(
    "UPDATE sessions SET message_count = COALESCE(message_count, 0) + :n, "
    "tool_call_count = COALESCE(tool_call_count, 0) + :calls WHERE id = :sid"
)


def decode_row(row: dict[str, Any]) -> MessageRecord:
    """Content and tool_calls decoded, as Hermes' get_messages returns them."""
    row.pop("search_vector", None)  # PostgreSQL's generated search column is not message data
    row["content"] = decode_content(row.get("content"))
    if row.get("tool_calls") is not None:
        row["tool_calls"] = decode_json(row["tool_calls"])
    return row  # type: ignore[return-value]


class MessageRepository(Repository):
    """Rows of ``messages``; keeps the session's counters in step in the same transaction."""

    def _known(self) -> frozenset[str]:
        return self.columns_of("messages")

    def append(self, session_id: str, role: str, content: Any = None, **fields: Any) -> int:
        """Insert one message and bump message_count / tool_call_count; returns its id."""
        fields = {k: v for k, v in fields.items() if v is not None}
        timestamp = fields.pop("timestamp", None)
        row = _encode(session_id, role, content, timestamp, fields, self._known(), None)
        if self.conn.dialect.name != "sqlite":
            return self._append_portable(session_id, row, count_tool_calls(fields.get("tool_calls")))
        sql, order = driver_insert(self.conn, "messages", tuple(row))
        # The hot path of every agent turn: two plain statements on the DB-API
        # connection, inside the caller's transaction.
        raw = self.conn.connection.driver_connection
        try:
            new_id = raw.execute(sql, tuple([row[k] for k in order])).lastrowid
            raw.execute(
                "UPDATE sessions SET message_count = COALESCE(message_count, 0) + 1, "
                "tool_call_count = COALESCE(tool_call_count, 0) + ? WHERE id = ?",
                (count_tool_calls(fields.get("tool_calls")), session_id),
            )
        except sqlite3.IntegrityError as exc:
            if "FOREIGN KEY" in str(exc) and not self.session_exists(session_id):
                raise errors.NotFoundError(f"unknown session {session_id!r}") from exc
            raise
        except (sqlite3.Error, OverflowError) as exc:
            typed = translate_driver_error(exc)
            if typed is None:
                raise
            raise typed from exc
        return int(new_id)

    def _append_portable(self, session_id: str, row: dict[str, Any], calls: int) -> int:
        """Append through SQLAlchemy Core (servers): INSERT … RETURNING id, then the
        counters bumped in SQL, so concurrent appends to one session never lose a count."""
        if not self.session_exists(session_id):
            raise errors.NotFoundError(f"unknown session {session_id!r}")
        new_id = self.conn.execute(insert(_target("messages", tuple(row))).returning(MESSAGES.c.id), row).scalar_one()
        self.conn.execute(_BUMP, {"n": 1, "calls": calls, "sid": session_id})
        return int(new_id)

    def bulk_append(self, messages: Iterable[Mapping[str, Any]], *, update_counters: bool = True) -> int:
        """Insert many messages with one executemany per column set; counters once per session.

        Each item is a dict with at least ``session_id`` and ``role``; other keys are
        message columns (``content`` may be a list/dict, JSON columns may be objects).
        Every item is encoded and checked, and every session must exist, before the
        first row is written: a bad item (named by its index) or an unknown session
        raises InvalidInputError / NotFoundError with nothing inserted.
        """
        known = self._known()
        rows: list[dict[str, Any]] = []
        per_session: dict[str, list[int]] = {}
        for index, item in enumerate(messages):
            row = encode_message(item, known, index=index)
            rows.append(row)
            c = per_session.setdefault(row["session_id"], [0, 0])
            c[0] += 1
            c[1] += count_tool_calls(item.get("tool_calls"))
        missing = missing_sessions(self.conn, per_session)
        if missing:
            first = next(i for i, r in enumerate(rows) if r["session_id"] == missing[0])
            raise errors.NotFoundError(
                f"unknown session {missing[0]!r} (message #{first})"
                + (f" and {len(missing) - 1} more unknown sessions" if len(missing) > 1 else "")
            )
        self.insert_rows(rows)
        if update_counters and per_session and self.conn.dialect.name != "sqlite":
            self.conn.execute(_BUMP, [{"n": n, "calls": c, "sid": sid} for sid, (n, c) in per_session.items()])
        elif update_counters and per_session:
            with driver_errors():
                self.conn.connection.driver_connection.executemany(
                    "UPDATE sessions SET message_count = COALESCE(message_count, 0) + ?, "
                    "tool_call_count = COALESCE(tool_call_count, 0) + ? WHERE id = ?",
                    [(n, calls, sid) for sid, (n, calls) in per_session.items()],
                )
        return len(rows)

    def insert_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        """Write rows made by :func:`encode_row` in input order; no counters are touched.

        Consecutive rows with the same columns share one executemany; a change of
        columns starts a new run, so ids always follow the input order.
        """
        runs: _Runs = []
        for row in rows:
            names = tuple(row)
            if not runs or runs[-1][0] != names:
                runs.append((names, []))
            runs[-1][1].append(tuple(row.values()))  # in ``names`` order; see _insert_run
        if not runs:
            return
        if self.conn.dialect.name != "sqlite":
            # Servers: Core executemany per column set (psycopg batches it), input order kept.
            for names, values in runs:
                self.conn.execute(insert(_target("messages", names)), [dict(zip(names, v)) for v in values])
            return
        with driver_errors():
            cursor = self.conn.connection.driver_connection.cursor()
            try:
                if len(rows) >= BULK_STAGE_MIN:
                    self._insert_staged(cursor, runs)
                else:
                    for names, values in runs:
                        self._insert_run(cursor, "messages", None, names, values)
            finally:
                cursor.close()

    def _insert_staged(self, cursor: Any, runs: _Runs) -> None:
        """Stage rows in a TEMP table, then move them with one INSERT … SELECT.

        FTS5 keeps its pending index changes across the rows of one statement but
        flushes them between statements, so one statement for the batch indexes 2–3×
        faster than executemany. Columns a row leaves out get the column's default.
        """
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {STAGE} AS SELECT * FROM main.messages WHERE 0")
        staged = {r[1] for r in cursor.execute(f"PRAGMA temp.table_info({STAGE})")}
        columns: list[str] = []
        for names, _rows in runs:
            columns += [n for n in names if n not in columns]
        if not set(columns) <= staged:  # the schema grew since this connection staged
            cursor.execute(f"DROP TABLE temp.{STAGE}")
            cursor.execute(f"CREATE TEMP TABLE {STAGE} AS SELECT * FROM main.messages WHERE 0")
        for names, rows in runs:
            self._insert_run(cursor, STAGE, "temp", names, rows)
        defaults = self.column_defaults("messages")
        exprs = [f"COALESCE({c}, {defaults[c]})" if defaults.get(c) is not None else c for c in columns]
        cursor.execute(
            f"INSERT INTO main.messages ({', '.join(columns)}) SELECT {', '.join(exprs)} "
            f"FROM temp.{STAGE} ORDER BY rowid"
        )
        cursor.execute(f"DELETE FROM temp.{STAGE}")

    def _insert_run(self, cursor: Any, table: str, schema: str | None, names: tuple[str, ...],
                    values: list[tuple[Any, ...]]) -> None:
        """One executemany of rows sharing ``names`` (values in ``names`` order)."""
        sql, order = driver_insert(self.conn, table, names, schema=schema)
        if order != names:
            pos = [names.index(k) for k in order]
            values = [tuple([v[i] for i in pos]) for v in values]
        cursor.executemany(sql, values)

    def get_messages(self, session_id: str) -> list[MessageRecord]:
        return [decode_row(r) for r in self._all("SELECT * FROM messages WHERE session_id = :s ORDER BY id", {"s": session_id})]

    def count(self, session_id: str | None = None) -> int:
        if session_id is None:
            return int(self._scalar("SELECT count(*) FROM messages"))
        return int(self._scalar("SELECT count(*) FROM messages WHERE session_id = :s", {"s": session_id}))

    def clear(self, session_id: str) -> int:
        deleted = self._exec("DELETE FROM messages WHERE session_id = :s", {"s": session_id})
        self._exec("UPDATE sessions SET message_count = 0, tool_call_count = 0 WHERE id = :s", {"s": session_id})
        return deleted

    def replace(self, session_id: str, messages: Sequence[Mapping[str, Any]]) -> int:
        """Swap the whole transcript; counters are recomputed from what was written.

        Every new message is encoded and checked before the old ones are deleted, so a
        bad item or an unknown session leaves the transcript as it was.
        """
        check_key(session_id, "session id")
        known = self._known()
        rows, calls = [], 0
        for index, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise errors.InvalidInputError(f"message #{index}: expected a dict, got {type(m).__name__}")
            item = {k: v for k, v in m.items() if k in known and k not in ("id", "session_id")}
            item["session_id"] = session_id
            item.setdefault("role", m.get("role", "user"))
            rows.append(encode_message(item, known, index=index))
            calls += count_tool_calls(item.get("tool_calls"))
        if rows and not self.session_exists(session_id):  # an empty replace of nothing stays a no-op
            raise errors.NotFoundError(f"unknown session {session_id!r}")
        self._exec("DELETE FROM messages WHERE session_id = :s", {"s": session_id})
        self.insert_rows(rows)
        self._exec(
            "UPDATE sessions SET message_count = :n, tool_call_count = :c WHERE id = :s",
            {"n": len(rows), "c": calls, "s": session_id},
        )
        return len(rows)

    # ------------------------------------------------------------------ windows

    def around(self, session_id: str, anchor_id: int, window: int = 5) -> MessageWindow:
        """Up to ``window`` messages on each side of the anchor, with counts outside."""
        window = max(int(window or 0), 0)
        rows = self._all(
            "WITH a AS (SELECT id FROM messages WHERE id = :a AND session_id = :s) "
            "SELECT * FROM (SELECT m.* FROM messages m, a WHERE m.session_id = :s AND m.id < a.id ORDER BY m.id DESC LIMIT :w) b "
            "UNION ALL SELECT m.* FROM messages m, a WHERE m.id = a.id "
            "UNION ALL SELECT * FROM (SELECT m.* FROM messages m, a WHERE m.session_id = :s AND m.id > a.id ORDER BY m.id LIMIT :w) f",
            {"a": anchor_id, "s": session_id, "w": window},
        )
        if not rows:
            return MessageWindow([], 0, 0)
        rows.sort(key=lambda r: r["id"])
        first, last = rows[0]["id"], rows[-1]["id"]
        before = self._scalar("SELECT count(*) FROM messages WHERE session_id = :s AND id < :i", {"s": session_id, "i": first})
        after = self._scalar("SELECT count(*) FROM messages WHERE session_id = :s AND id > :i", {"s": session_id, "i": last})
        return MessageWindow([decode_row(r) for r in rows], int(before), int(after))

    def anchored_view(
        self,
        session_id: str,
        anchor_id: int,
        window: int = 5,
        bookend: int = 3,
        keep_roles: Sequence[str] | None = ("user", "assistant"),
    ) -> MessageWindow:
        """A window over the kept roles (the anchor is always kept) plus first/last bookends."""
        window, bookend = max(int(window or 0), 0), max(int(bookend or 0), 0)
        rows = self._all("SELECT * FROM messages WHERE session_id = :s ORDER BY id", {"s": session_id})
        idx = next((i for i, r in enumerate(rows) if r["id"] == anchor_id), None)
        if idx is None:
            return MessageWindow([], 0, 0, [], [])
        keep = set(keep_roles) if keep_roles else None
        kept = [r for r in rows if keep is None or r["role"] in keep or r["id"] == anchor_id]
        k = next(i for i, r in enumerate(kept) if r["id"] == anchor_id)
        lo, hi = max(k - window, 0), min(k + window + 1, len(kept))
        win = kept[lo:hi]

        def non_empty(r: dict[str, Any]) -> bool:
            c = r.get("content")
            return c is not None and (not isinstance(c, str) or c.strip() != "")

        start = [r for r in kept[:lo] if non_empty(r)][:bookend]
        end = [r for r in kept[hi:] if non_empty(r)][-bookend:] if bookend else []
        return MessageWindow(
            [decode_row(r) for r in win], lo, len(kept) - hi,
            [decode_row(r) for r in start], [decode_row(r) for r in end],
        )

    # ------------------------------------------------------------------ replay

    def conversation(self, session_ids: Sequence[str]) -> list[dict[str, Any]]:
        """OpenAI chat-format replay of the given sessions, in order (one query)."""
        if not session_ids:
            return []
        names = {f"s{i}": sid for i, sid in enumerate(session_ids)}
        order = " ".join(f"WHEN :s{i} THEN {i}" for i in range(len(session_ids)))
        rows = self.conn.execute(
            text(
                "SELECT role, content, tool_call_id, tool_name, tool_calls, finish_reason, reasoning, "
                "reasoning_content, reasoning_details, codex_reasoning_items, codex_message_items "
                f"FROM messages WHERE session_id IN ({', '.join(':' + n for n in names)}) "
                f"ORDER BY CASE session_id {order} END, id"
            ),
            names,
        ).fetchall()
        out: list[dict[str, Any]] = []
        pending_users: set[str] = set()
        dedupe = len(session_ids) > 1
        for (role, content, tool_call_id, tool_name, tool_calls, finish_reason, reasoning,
             reasoning_content, reasoning_details, codex_reasoning_items, codex_message_items) in rows:
            value = decode_content(content)
            if role in ("user", "assistant") and isinstance(value, str):
                value = strip_memory_context(value)
            if dedupe and role == "user":
                key = value if isinstance(value, str) else repr(value)
                if key in pending_users:
                    continue  # replayed again after a compression boundary, no reply between
                pending_users.add(key)
            elif role == "assistant":
                pending_users.clear()
            msg: dict[str, Any] = {"role": role, "content": value}
            if tool_call_id:
                msg["tool_call_id"] = tool_call_id
            if tool_name:
                msg["tool_name"] = tool_name
            if tool_calls:
                msg["tool_calls"] = decode_json(tool_calls)
            if role == "assistant":
                if finish_reason:
                    msg["finish_reason"] = finish_reason
                if reasoning:
                    msg["reasoning"] = reasoning
                if reasoning_content is not None:
                    msg["reasoning_content"] = reasoning_content
                for key, raw in (("reasoning_details", reasoning_details),
                                 ("codex_reasoning_items", codex_reasoning_items),
                                 ("codex_message_items", codex_message_items)):
                    if raw:
                        msg[key] = decode_json(raw)
            out.append(msg)
        return out
