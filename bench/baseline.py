"""The floor: the benchmarked operations written directly against ``sqlite3``.

No SQLAlchemy, no repositories, no retry loop: one DB-API connection with the PRAGMAs
``SessionDB`` uses (WAL, ``synchronous=NORMAL``, ``foreign_keys=ON``, a busy timeout),
the same file format (Hermes' on-disk encodings), and the same results, computed the
straightforward way a careful hand-written implementation would:

* writes are ``BEGIN IMMEDIATE`` … ``COMMIT`` with the INSERT and the counter UPDATE;
* word/trigram search lets FTS5 sort by ``rank`` under a ``LIMIT`` (so ``snippet()`` runs
  for the 20 returned rows only), then joins messages/sessions and fetches the
  previous/next message of each hit;
* short-CJK search is a LIKE scan over content/tool_name/tool_calls, newest first;
* lineage is one recursive CTE;
* listing pages roots, projects compression tips with one recursive CTE, and reads the
  preview and last activity with correlated subqueries;
* export streams sessions and their messages as JSON Lines.

Nothing here imports ``hermes_store``: it is the independent reference the library is
compared with.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any, TextIO
from collections.abc import Iterable, Iterator

JSON_PREFIX = "\x00json:"
PREVIEW_CHARS = 60
CONTEXT_CHARS = 200
MAX_DEPTH = 10_000

_MEMORY_RE = re.compile(
    r"\s*(?:^[ \t]*\[System note:[^\n]*?memory[^\n]*\n\s*)?<memory-context>.*?</memory-context>\s*",
    re.DOTALL | re.MULTILINE | re.IGNORECASE,
)

MESSAGE_COLUMNS = (
    "session_id", "role", "content", "tool_name", "tool_calls", "tool_call_id", "token_count",
    "finish_reason", "reasoning", "timestamp",
)
_INSERT = f"INSERT INTO messages ({', '.join(MESSAGE_COLUMNS)}) VALUES ({', '.join('?' * len(MESSAGE_COLUMNS))})"
_BUMP = (
    "UPDATE sessions SET message_count = COALESCE(message_count, 0) + ?, "
    "tool_call_count = COALESCE(tool_call_count, 0) + ? WHERE id = ?"
)


def _encode_content(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return JSON_PREFIX + json.dumps(value, ensure_ascii=False)
    return value


def _decode_content(text: Any) -> Any:
    if isinstance(text, str) and text.startswith(JSON_PREFIX):
        try:
            return json.loads(text[len(JSON_PREFIX):])
        except ValueError:
            return text
    return text


def _encode_json(value: Any) -> Any:
    if not value:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _decode_json(text: Any) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text

#: The columns :func:`replay_turn` reads, in its order (both floors select them).
REPLAY_COLUMNS = (
    "role, content, tool_call_id, tool_name, tool_calls, finish_reason, reasoning, reasoning_content,"
    " reasoning_details, codex_reasoning_items, codex_message_items, api_content, timestamp,"
    " effect_disposition, platform_message_id, observed"
)


def replay_turn(row: Any, value: Any) -> dict[str, Any]:
    """One stored message (:data:`REPLAY_COLUMNS`, content already decoded as ``value``)
    as Hermes v23's replay dict."""
    (role, _content, tcid, tname, tcalls, finish, reasoning, rcontent, rdetails, cri, cmi, api_content, ts,
     effect, platform_id, observed) = row
    if role in ("user", "assistant") and isinstance(value, str):
        value = (_MEMORY_RE.sub(" ", value) if "<memory-context>" in value else value).strip()
    msg: dict[str, Any] = {"role": role, "content": value}
    if api_content is not None:
        msg["api_content"] = api_content
    if ts is not None:
        msg["timestamp"] = ts
    if effect:
        msg["effect_disposition"] = effect
    if platform_id:
        msg["message_id"] = platform_id
    if observed:
        msg["observed"] = True
    if tcid:
        msg["tool_call_id"] = tcid
    if tname:
        msg["tool_name"] = tname
    if tcalls:
        msg["tool_calls"] = _decode_json(tcalls)
    if role == "assistant":
        if finish:
            msg["finish_reason"] = finish
        if reasoning:
            msg["reasoning"] = reasoning
        if rcontent is not None:
            msg["reasoning_content"] = rcontent
        for key, raw in (("reasoning_details", rdetails), ("codex_reasoning_items", cri), ("codex_message_items", cmi)):
            if raw:
                msg[key] = _decode_json(raw)
    return msg



def _n_calls(tool_calls: Any) -> int:
    if isinstance(tool_calls, str):
        tool_calls = _decode_json(tool_calls)
    return len(tool_calls) if isinstance(tool_calls, list) else 0


def _cut(content: Any) -> Any:
    value = _decode_content(content)
    if isinstance(value, str):
        return value[:CONTEXT_CHARS]
    return None if value is None else str(value)[:CONTEXT_CHARS]


def _preview(content: Any) -> str:
    value = _decode_content(content)
    if value is None:
        return ""
    if not isinstance(value, str):
        value = " ".join(p.get("text", "") for p in value if isinstance(p, dict)) if isinstance(value, list) else ""
    text = re.sub(r"[\r\n]+", " ", value).strip()
    return text[:PREVIEW_CHARS] + "..." if len(text) > PREVIEW_CHARS else text


def _escape_like(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# The floor's statements and the Python around them, as module names: bench/aio_bench.py
# awaits the same ones over aiosqlite (AioSqliteFloor), so the two floors cannot drift apart.

#: The message before / after a hit in its session (timestamp, then id): (sid, ts, ts, id).
_PREV = ("SELECT role, content FROM messages WHERE session_id = ? AND (timestamp < ? OR (timestamp = ? AND id < ?))"
         " ORDER BY timestamp DESC, id DESC LIMIT 1")
_NEXT = ("SELECT role, content FROM messages WHERE session_id = ? AND (timestamp > ? OR (timestamp = ? AND id > ?))"
         " ORDER BY timestamp, id LIMIT 1")
#: The keys of a row of :func:`_fts_sql`.
_FTS_KEYS = ("id", "session_id", "role", "snippet", "timestamp", "tool_name", "source", "model",
             "session_started", "_content")
#: One term of the substring scan (its pattern three times).
_LIKE_TERM = "(content LIKE ? ESCAPE '\\' OR tool_name LIKE ? ESCAPE '\\' OR tool_calls LIKE ? ESCAPE '\\')"
#: Listing: the page of visible roots (limit, offset), newest first.
_ROOTS = ("SELECT s.id FROM sessions s LEFT JOIN sessions p ON p.id = s.parent_session_id"
          " WHERE s.parent_session_id IS NULL OR p.id IS NULL"
          " OR (p.end_reason = 'branched' AND p.ended_at IS NOT NULL AND s.started_at >= p.ended_at)"
          " ORDER BY s.started_at DESC, s.id DESC LIMIT ? OFFSET ?")
#: Listing: (root, compression tip) of each root of the page (a JSON array of ids).
_TIPS = ("WITH RECURSIVE chain(root, id, depth) AS ("
         " SELECT value, value, 0 FROM json_each(?)"
         " UNION ALL SELECT chain.root, c.id, chain.depth + 1 FROM chain JOIN sessions p ON p.id = chain.id"
         " JOIN sessions c ON c.parent_session_id = p.id"
         " WHERE p.end_reason = 'compression' AND p.ended_at IS NOT NULL AND c.started_at >= p.ended_at"
         " AND chain.depth < 1000)"
         " SELECT root, id FROM (SELECT root, id, max(depth) FROM chain GROUP BY root)")
#: Listing: the tips' rows with preview and last activity (a JSON array of ids).
_ROWS = ("SELECT s.*, (SELECT m.content FROM messages m WHERE m.session_id = s.id AND m.role = 'user'"
         "  ORDER BY m.timestamp, m.id LIMIT 1) AS _preview,"
         " COALESCE((SELECT max(m.timestamp) FROM messages m WHERE m.session_id = s.id), s.started_at) AS last_active"
         " FROM sessions s WHERE s.id IN (SELECT value FROM json_each(?))")


def _fts_sql(index: str) -> str:
    """Word search on FTS5 table ``index`` (match, limit): FTS5 ranks under the LIMIT, so
    ``snippet()`` runs for the returned rows only; then the messages and sessions."""
    return (f"SELECT m.id, m.session_id, m.role, h.snippet, m.timestamp, m.tool_name, s.source, s.model,"
            f" s.started_at, m.content FROM ("
            f"  SELECT rowid AS id, snippet({index}, -1, '>>>', '<<<', '...', 10) AS snippet, rank"
            f"  FROM {index} WHERE {index} MATCH ? ORDER BY rank LIMIT ?) h"
            f" JOIN messages m ON m.id = h.id JOIN sessions s ON s.id = m.session_id ORDER BY h.rank")


def _substring_query(terms: list[str], limit: int) -> tuple[str, tuple[Any, ...]]:
    """The substring scan for ``terms`` (newest first) and its parameters."""
    where, args = [], []
    for t in terms:
        pat = f"%{_escape_like(t)}%"
        where.append(_LIKE_TERM)
        args += [pat, pat, pat]
    sql = ("SELECT m.id, m.session_id, m.role, m.timestamp, m.tool_name, s.source, s.model, s.started_at,"
           " m.content, m.tool_calls FROM (SELECT id FROM messages WHERE " + " OR ".join(where)
           + " ORDER BY timestamp DESC, id DESC LIMIT ?) h JOIN messages m ON m.id = h.id"
           " JOIN sessions s ON s.id = m.session_id ORDER BY m.timestamp DESC, m.id DESC")
    return sql, (*args, limit)


def _substring_hits(rows: Iterable[tuple[Any, ...]], terms: list[str]) -> list[dict[str, Any]]:
    """The rows of :func:`_substring_query` as hits, the snippet cut around the first term found."""
    hits = []
    for mid, sid, role, ts, tool_name, source, model, started, content, tool_calls in rows:
        snippet = ""
        for text in (content, tool_name, tool_calls):
            if isinstance(text, str):
                at = next((i for i in (text.find(t) for t in terms) if i >= 0), -1)
                if at >= 0:
                    a, b = max(at - 40, 0), at + 40
                    snippet = ("..." if a else "") + text[a:at] + ">>>" + text[at:at + len(terms[0])] + "<<<" \
                        + text[at + len(terms[0]):b] + ("..." if b < len(text) else "")
                    break
        hits.append({"id": mid, "session_id": sid, "role": role, "snippet": snippet, "timestamp": ts,
                     "tool_name": tool_name, "source": source, "model": model, "session_started": started,
                     "_content": content})
    return hits


def _context_args(hit: dict[str, Any]) -> tuple[Any, ...]:
    """The parameters of :data:`_PREV` / :data:`_NEXT` for ``hit``."""
    return hit["session_id"], hit["timestamp"], hit["timestamp"], hit["id"]


def _set_context(hit: dict[str, Any], prev: Any, nxt: Any) -> None:
    """``hit["context"]``: the previous message (a (role, content) row, or None), the hit, the next."""
    ctx = []
    if prev:
        ctx.append({"role": prev[0], "content": _cut(prev[1])})
    ctx.append({"role": hit["role"], "content": _cut(hit.pop("_content"))})
    if nxt:
        ctx.append({"role": nxt[0], "content": _cut(nxt[1])})
    hit["context"] = ctx


def listing_page(roots: list[str], tips: dict[str, str], rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The listing page of every floor (sqlite3, aiosqlite, psycopg, asyncpg): each root, in
    order, shown as its compression tip's row (``rows``: the tips, with ``_preview``)."""
    by_id = {}
    for row in rows:
        row["preview"] = _preview(row.pop("_preview"))
        by_id[row["id"]] = row
    out = []
    for root in roots:
        row = dict(by_id[tips[root]])
        if row["id"] != root:
            row["_lineage_root_id"] = root
        out.append(row)
    return out


class Baseline:
    """Plain-sqlite3 versions of the benchmarked ``SessionDB`` operations."""

    def __init__(self, path: str | Path, busy_timeout_ms: int = 100) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------ writes

    @staticmethod
    def _row(session_id: str, m: dict[str, Any], now: float) -> tuple[Any, ...]:
        return (
            session_id, m["role"], _encode_content(m.get("content")), m.get("tool_name"),
            _encode_json(m.get("tool_calls")), m.get("tool_call_id"), m.get("token_count"),
            m.get("finish_reason"), m.get("reasoning"), m.get("timestamp") or now,
        )

    def append_message(self, session_id: str, role: str, content: Any = None, **fields: Any) -> int:
        import time

        row = self._row(session_id, {"role": role, "content": content, **fields}, time.time())
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            new_id = c.execute(_INSERT, row).lastrowid
            c.execute(_BUMP, (1, _n_calls(fields.get("tool_calls")), session_id))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return int(new_id)

    def append_messages(self, messages: Iterable[dict[str, Any]]) -> int:
        import time

        now = time.time()
        rows, per_session = [], {}
        for m in messages:
            rows.append(self._row(m["session_id"], m, now))
            n = per_session.setdefault(m["session_id"], [0, 0])
            n[0] += 1
            n[1] += _n_calls(m.get("tool_calls"))
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            c.executemany(_INSERT, rows)
            c.executemany(_BUMP, [(n, k, sid) for sid, (n, k) in per_session.items()])
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return len(rows)

    # ------------------------------------------------------------------ search

    def _context(self, hits: list[dict[str, Any]]) -> None:
        c = self.conn
        for h in hits:
            args = _context_args(h)
            _set_context(h, c.execute(_PREV, args).fetchone(), c.execute(_NEXT, args).fetchone())

    def search_fts(self, match: str, limit: int = 20, index: str = "messages_fts") -> list[dict[str, Any]]:
        """``match`` is valid FTS5 syntax (the caller's job, as in Hermes)."""
        rows = self.conn.execute(_fts_sql(index), (match, limit)).fetchall()
        hits = [dict(zip(_FTS_KEYS, r, strict=True)) for r in rows]
        self._context(hits)
        return hits

    def search_substring(self, terms: list[str], limit: int = 20) -> list[dict[str, Any]]:
        """Short CJK terms: LIKE over content/tool_name/tool_calls, newest first."""
        hits = _substring_hits(self.conn.execute(*_substring_query(terms, limit)).fetchall(), terms)
        self._context(hits)
        return hits

    def count_matches(self, match: str, index: str = "messages_fts") -> int:
        return self.conn.execute(f"SELECT count(*) FROM {index} WHERE {index} MATCH ?", (match,)).fetchone()[0]

    def count_substring(self, terms: list[str]) -> int:
        where = " OR ".join(_LIKE_TERM for _ in terms)
        args = [p for t in terms for p in (f"%{_escape_like(t)}%",) * 3]
        return self.conn.execute(f"SELECT count(*) FROM messages WHERE {where}", args).fetchone()[0]

    # ------------------------------------------------------------------ lineage

    def ancestors(self, session_id: str) -> list[str]:
        """Root → … → session, one recursive CTE."""
        rows = self.conn.execute(
            "WITH RECURSIVE up(id, parent, depth) AS ("
            " SELECT id, parent_session_id, 0 FROM sessions WHERE id = ?"
            " UNION ALL SELECT s.id, s.parent_session_id, up.depth + 1 FROM sessions s JOIN up ON s.id = up.parent"
            " WHERE up.depth < ?) SELECT id FROM up ORDER BY depth DESC",
            (session_id, MAX_DEPTH),
        ).fetchall()
        return [r[0] for r in rows]

    def compression_tip(self, session_id: str) -> str | None:
        row = self.conn.execute(
            "WITH RECURSIVE chain(id, depth) AS (SELECT id, 0 FROM sessions WHERE id = ?"
            " UNION ALL SELECT c.id, chain.depth + 1 FROM chain JOIN sessions p ON p.id = chain.id"
            " JOIN sessions c ON c.parent_session_id = p.id"
            " WHERE p.end_reason = 'compression' AND p.ended_at IS NOT NULL AND c.started_at >= p.ended_at"
            " AND chain.depth < ?)"
            " SELECT chain.id FROM chain JOIN sessions s ON s.id = chain.id"
            " ORDER BY chain.depth DESC, s.started_at DESC LIMIT 1",
            (session_id, MAX_DEPTH),
        ).fetchone()
        return row[0] if row else None

    # ------------------------------------------------------------------ listing

    def list_sessions_rich(self, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        """Visible roots newest first, each shown as its compression tip with preview/last_active."""
        c = self.conn
        roots = [r[0] for r in c.execute(_ROOTS, (limit, offset)).fetchall()]
        if not roots:
            return []
        tips = dict(c.execute(_TIPS, (json.dumps(roots),)).fetchall())
        cur = c.execute(_ROWS, (json.dumps(list(tips.values())),))
        keys = [d[0] for d in cur.description]
        return listing_page(roots, tips, (dict(zip(keys, r, strict=True)) for r in cur.fetchall()))

    # ------------------------------------------------------------------ replay / export

    def conversation(self, session_id: str) -> list[dict[str, Any]]:
        """Hermes v23's replay of one session: live rows in id order, v23's keys."""
        rows = self.conn.execute(
            f"SELECT {REPLAY_COLUMNS} FROM messages WHERE session_id = ? AND active = 1 ORDER BY id", (session_id,)
        ).fetchall()
        return [replay_turn(row, _decode_content(row[1])) for row in rows]

    def iter_export(self) -> Iterator[dict[str, Any]]:
        """Every session (oldest first) with its decoded messages and usage rows, one at a time."""
        sessions = self.conn.cursor()
        msgs = self.conn.cursor()
        ledger = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'session_model_usage'").fetchone()
        sessions.execute("SELECT * FROM sessions ORDER BY started_at, id")
        skeys = [d[0] for d in sessions.description]
        mkeys: list[str] | None = None
        ukeys: list[str] | None = None
        for srow in sessions:
            row = dict(zip(skeys, srow, strict=True))
            msgs.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (row["id"],))
            if mkeys is None:
                mkeys = [d[0] for d in msgs.description]
            out = []
            for mrow in msgs:
                m = dict(zip(mkeys, mrow, strict=True))
                m["content"] = _decode_content(m["content"])
                if m["tool_calls"] is not None:
                    m["tool_calls"] = _decode_json(m["tool_calls"])
                out.append(m)
            row["messages"] = out
            if ledger:  # the per-model usage ledger travels with its session
                msgs.execute("SELECT * FROM session_model_usage WHERE session_id = ?"
                             " ORDER BY model, task, billing_provider", (row["id"],))
                if ukeys is None:
                    ukeys = [d[0] for d in msgs.description]
                row["model_usage"] = [dict(zip(ukeys, u, strict=True)) for u in msgs]
            yield row

    def export_jsonl(self, fh: TextIO) -> tuple[int, int]:
        sessions = messages = 0
        for row in self.iter_export():
            fh.write(json.dumps(row, ensure_ascii=False, default=str))
            fh.write("\n")
            sessions += 1
            messages += len(row["messages"])
        return sessions, messages
