"""The PostgreSQL floor: the benchmarked operations written directly in psycopg 3 SQL.

The counterpart of ``baseline.py`` for ``bench/run.py --backend postgresql``: no
SQLAlchemy, no repositories, no retry loop. One psycopg connection in autocommit mode
(a read is one statement, a write is ``BEGIN`` … ``COMMIT`` around its statements),
the same schema and indexes the library uses (revision hs0002), the same results,
written the way a careful hand-written implementation would:

* writes: ``INSERT … RETURNING id`` and the counter ``UPDATE`` in one transaction; bulk
  writes are two ``executemany`` calls (psycopg pipelines them);
* word search: ``search_vector @@ …::tsquery`` on the GIN index, ranked by
  ``ts_rank_cd`` under the ``LIMIT``, the previous and next message of each hit joined
  ``LATERAL`` in the same statement; snippets cut in Python from the 20 hits' text;
* CJK search (2 characters, and 3+ which PostgreSQL also answers by substring): a
  ``LIKE`` scan newest first, served by the ``pg_trgm`` index where it can be.
  ``ILIKE`` only for a term with cased letters: ``ILIKE`` lower-cases every row it
  tests, which buys nothing for CJK;
* lineage: one recursive CTE; listing pages roots, projects compression tips with one
  recursive CTE over ``unnest`` of the page, then reads previews and last activity;
* export streams sessions through a server-side cursor, and each session's messages.

The FTS5 query strings of the benchmark are translated to tsquery by
:func:`tsquery` (terms, "phrases", prefix*, AND/OR/NOT), the same reading the library
gives them.

Encodings: Hermes' ``"\\x00json:"`` content marker cannot be stored in PostgreSQL
text, so content goes through the same reversible U+0000 mapping as the library's
(U+0000 -> U+E001, U+E000/U+E001 escaped by U+E000). The floor maps message content
only, the one place Hermes' own encoding puts a NUL; the library maps every string
crossing the driver, and that cost is part of what the ratio shows.

Nothing here imports ``hermes_store``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, TextIO
from collections.abc import Iterable, Iterator

# Both floors share what does not depend on the driver: the replay dicts, JSON and
# preview helpers, the message columns (baseline.py imports nothing of ours either).
from baseline import (
    JSON_PREFIX, MAX_DEPTH, MESSAGE_COLUMNS, REPLAY_COLUMNS, _cut, _decode_json,
    _encode_json, _escape_like, _n_calls, listing_page, replay_turn,
)

SNIPPET_OPEN, SNIPPET_CLOSE = ">>>", "<<<"

_ESC, _NUL = "\ue000", "\ue001"
_DECODE = re.compile("\ue000(.)|\ue001", re.S)
_ITEM = re.compile(r'"[^"]*"\*?|\S+')
_TOKEN = re.compile(r"[^\W_]+")

_INSERT = (f"INSERT INTO messages ({', '.join(MESSAGE_COLUMNS)}) VALUES ({', '.join(['%s'] * len(MESSAGE_COLUMNS))})")
_BUMP = (
    "UPDATE sessions SET message_count = COALESCE(message_count, 0) + %s, "
    "tool_call_count = COALESCE(tool_call_count, 0) + %s WHERE id = %s"
)
#: The previous and the next message of hit ``m`` in its session (timestamp, then id).
_CONTEXT_JOINS = (
    " LEFT JOIN LATERAL (SELECT q.role, q.content FROM messages q WHERE q.session_id = m.session_id"
    "  AND (q.timestamp, q.id) < (m.timestamp, m.id) ORDER BY q.timestamp DESC, q.id DESC LIMIT 1) pv ON true"
    " LEFT JOIN LATERAL (SELECT q.role, q.content FROM messages q WHERE q.session_id = m.session_id"
    "  AND (q.timestamp, q.id) > (m.timestamp, m.id) ORDER BY q.timestamp, q.id LIMIT 1) nx ON true"
)
_HIT_COLUMNS = (
    "m.id, m.session_id, m.role, {snippet}, m.timestamp, m.tool_name, s.source, s.model, s.started_at,"
    " m.content, pv.role, pv.content, nx.role, nx.content"
)
# The statements below are psycopg's; bench/aio_bench.py's asyncpg floor sends the same
# ones with its $n placeholders (aio_bench._dollar), so the two floors cannot drift apart.

#: Word search (q: the tsquery text, limit): the ranked page under the LIMIT, its sessions
#: and each hit's previous/next message. The snippet column carries the tool calls: the
#: snippet is cut in Python (:func:`_fts_hits`).
_FTS = (
    f"SELECT {_HIT_COLUMNS.format(snippet='m.tool_calls')} FROM ("
    " SELECT id, ts_rank_cd(search_vector, %(q)s::tsquery) AS r, timestamp FROM messages"
    " WHERE search_vector @@ %(q)s::tsquery ORDER BY r DESC, timestamp DESC, id DESC LIMIT %(limit)s) h"
    f" JOIN messages m ON m.id = h.id JOIN sessions s ON s.id = m.session_id{_CONTEXT_JOINS}"
    " ORDER BY h.r DESC, h.timestamp DESC, h.id DESC"
)
#: Listing: the page of visible roots (limit, offset), newest first.
_ROOTS = (
    "SELECT s.id FROM sessions s LEFT JOIN sessions p ON p.id = s.parent_session_id"
    " WHERE s.parent_session_id IS NULL OR p.id IS NULL"
    " OR (p.end_reason = 'branched' AND p.ended_at IS NOT NULL AND s.started_at >= p.ended_at)"
    " ORDER BY s.started_at DESC, s.id DESC LIMIT %s OFFSET %s"
)
#: Listing: (root, compression tip) of each root of the page (a text array).
_TIPS = (
    "WITH RECURSIVE chain(root, id, depth) AS ("
    " SELECT r, r, 0 FROM unnest(%s::text[]) AS r"
    " UNION ALL SELECT chain.root, c.id, chain.depth + 1 FROM chain JOIN sessions p ON p.id = chain.id"
    " JOIN sessions c ON c.parent_session_id = p.id"
    " WHERE p.end_reason = 'compression' AND p.ended_at IS NOT NULL AND c.started_at >= p.ended_at"
    " AND chain.depth < 1000)"
    " SELECT DISTINCT ON (root) root, id FROM chain ORDER BY root, depth DESC"
)
#: Listing: the tips' rows with preview and last activity (a text array).
_ROWS = (
    "SELECT s.*, (SELECT m.content FROM messages m WHERE m.session_id = s.id AND m.role = 'user'"
    "  ORDER BY m.timestamp, m.id LIMIT 1) AS _preview,"
    " COALESCE((SELECT max(m.timestamp) FROM messages m WHERE m.session_id = s.id), s.started_at) AS last_active"
    " FROM sessions s WHERE s.id = ANY(%s)"
)


def _substring_sql(where: str, limit: str) -> str:
    """The substring scan over ``where`` (newest first), ``limit`` the LIMIT's placeholder."""
    return (f"SELECT {_HIT_COLUMNS.format(snippet='NULL')} FROM ("
            f" SELECT id FROM messages WHERE {where} ORDER BY timestamp DESC, id DESC LIMIT {limit}) h"
            f" JOIN messages m ON m.id = h.id JOIN sessions s ON s.id = m.session_id{_CONTEXT_JOINS}"
            " ORDER BY m.timestamp DESC, m.id DESC")


def _like_term(term: str, ph: str) -> str:
    """One term of the substring scan, ``ph`` its pattern's placeholder. ``ILIKE`` only for a
    term with cased letters: no cased letter, no case to fold."""
    op = "LIKE" if term.lower() == term.upper() else "ILIKE"
    return f"(content {op} {ph} OR tool_name {op} {ph} OR tool_calls {op} {ph})"


def _like_pattern(term: str) -> str:
    return encode_nul(f"%{_escape_like(term)}%")


# --------------------------------------------------------------------------- encodings

def encode_nul(s: str) -> str:
    if "\x00" not in s and _ESC not in s and _NUL not in s:
        return s
    return s.replace(_ESC, _ESC + _ESC).replace(_NUL, _ESC + _NUL).replace("\x00", _NUL)


def decode_nul(s: Any) -> Any:
    if not isinstance(s, str) or (_ESC not in s and _NUL not in s):
        return s
    return _DECODE.sub(lambda m: m.group(1) if m.group(1) is not None else "\x00", s)


def _encode_content(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        value = JSON_PREFIX + json.dumps(value, ensure_ascii=False)
    return encode_nul(value) if isinstance(value, str) else value


def _decode_content(text: Any) -> Any:
    text = decode_nul(text)
    if isinstance(text, str) and text.startswith(JSON_PREFIX):
        try:
            return json.loads(text[len(JSON_PREFIX):])
        except ValueError:
            return text
    return text


def _split(items: list[str], op: str) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for item in items:
        if item == op:
            out.append([])
        else:
            out[-1].append(item)
    return [part for part in out if part]


def _lexeme(token: str) -> str:
    return "'" + token.replace("\\", "\\\\").replace("'", "''") + "'"


def _term(item: str) -> str:
    prefix = item.endswith("*")
    body = item[:-1] if prefix else item
    if len(body) >= 2 and body[0] == body[-1] == '"':
        body = body[1:-1]
    words = [_lexeme(t.lower()) for t in _TOKEN.findall(body)]
    if not words:
        return ""
    if prefix:
        words[-1] += ":*"
    return "(" + " <-> ".join(words) + ")" if len(words) > 1 else words[0]


def tsquery(match: str) -> str:
    """FTS5 MATCH syntax (valid, as the benchmark's queries are) as ``tsquery`` text.

    Space-joined terms bind tightest, then NOT, AND, OR, as in FTS5; a term is the
    phrase of its unicode61 tokens (``sqlite_rate`` -> ``'sqlite' <-> 'rate'``),
    lower-cased here, so the text is cast (``::tsquery``) rather than parsed again.
    """
    groups = []
    for group in _split(_ITEM.findall(match), "OR"):
        conds = []
        for factor in _split(group, "AND"):
            first, *negated = _split(factor, "NOT")
            conds += [t for t in map(_term, first) if t]
            for unit in negated:
                terms = [t for t in map(_term, unit) if t]
                if terms:
                    conds.append("!(" + " & ".join(terms) + ")")
        if conds:
            groups.append("(" + " & ".join(conds) + ")")
    return " | ".join(groups) or "'x' & !'x'"


class PgBaseline:
    """Plain-psycopg versions of the benchmarked ``SessionDB`` operations."""

    def __init__(self, conninfo: str, *, prepared: bool = True) -> None:
        """``prepared``: psycopg's own default (a statement is prepared on the server after
        5 executions, so it is planned once); False plans every execution, as the library
        does by default (bench/run.py --floor-unprepared)."""
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True)
        if not prepared:
            self.conn.prepare_threshold = None
        self._message_columns: list[str] | None = None

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
        row = self._row(session_id, {"role": role, "content": content, **fields}, time.time())
        with self.conn.transaction(), self.conn.cursor() as cur:
            new_id = cur.execute(_INSERT + " RETURNING id", row).fetchone()[0]
            cur.execute(_BUMP, (1, _n_calls(fields.get("tool_calls")), session_id))
        return int(new_id)

    def append_messages(self, messages: Iterable[dict[str, Any]]) -> int:
        now = time.time()
        rows, per_session = [], {}
        for m in messages:
            rows.append(self._row(m["session_id"], m, now))
            n = per_session.setdefault(m["session_id"], [0, 0])
            n[0] += 1
            n[1] += _n_calls(m.get("tool_calls"))
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(_INSERT, rows)
            cur.executemany(_BUMP, [(n, k, sid) for sid, (n, k) in per_session.items()])
        return len(rows)

    # ------------------------------------------------------------------ search

    @staticmethod
    def _hits(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        hits = []
        for (mid, sid, role, snippet, ts, tool_name, source, model, started, content,
             p_role, p_content, n_role, n_content) in rows:
            ctx = []
            if p_role is not None:
                ctx.append({"role": p_role, "content": _cut(p_content)})
            ctx.append({"role": role, "content": _cut(content)})
            if n_role is not None:
                ctx.append({"role": n_role, "content": _cut(n_content)})
            hits.append({"id": mid, "session_id": sid, "role": role, "snippet": decode_nul(snippet),
                         "timestamp": ts, "tool_name": tool_name, "source": source, "model": model,
                         "session_started": started, "context": ctx})
        return hits

    def search_fts(self, match: str, limit: int = 20, index: str = "messages_fts") -> list[dict[str, Any]]:
        """Word search on ``search_vector``; ``match`` is FTS5 syntax (see :func:`tsquery`).

        One statement: the ranked page under the LIMIT, its sessions and each hit's
        previous/next message. The snippet is cut in Python from the hit's text (the
        first query word found, marked), as the library does on PostgreSQL.
        """
        return _fts_hits(self.conn.execute(_FTS, {"q": tsquery(match), "limit": limit}).fetchall(), match)

    @staticmethod
    def _like(terms: list[str]) -> tuple[str, list[str]]:
        where, args = [], []
        for t in terms:
            pat = _like_pattern(t)
            where.append(_like_term(t, "%s"))
            args += [pat, pat, pat]
        return " OR ".join(where), args

    def search_substring(self, terms: list[str], limit: int = 20) -> list[dict[str, Any]]:
        """CJK terms: substring match over content/tool_name/tool_calls, newest first."""
        where, args = self._like(terms)
        return _substring_hits(self.conn.execute(_substring_sql(where, "%s"), (*args, limit)).fetchall(), terms)

    def count_matches(self, match: str, index: str = "messages_fts") -> int:
        return self.conn.execute("SELECT count(*) FROM messages WHERE search_vector @@ %s::tsquery",
                                 (tsquery(match),)).fetchone()[0]

    def count_substring(self, terms: list[str]) -> int:
        where, args = self._like(terms)
        return self.conn.execute(f"SELECT count(*) FROM messages WHERE {where}", args).fetchone()[0]

    # ------------------------------------------------------------------ lineage

    def ancestors(self, session_id: str) -> list[str]:
        """Root → … → session, one recursive CTE."""
        rows = self.conn.execute(
            "WITH RECURSIVE up(id, parent, depth) AS ("
            " SELECT id, parent_session_id, 0 FROM sessions WHERE id = %s"
            " UNION ALL SELECT s.id, s.parent_session_id, up.depth + 1 FROM sessions s JOIN up ON s.id = up.parent"
            " WHERE up.depth < %s) SELECT id FROM up ORDER BY depth DESC",
            (session_id, MAX_DEPTH),
        ).fetchall()
        return [r[0] for r in rows]

    def compression_tip(self, session_id: str) -> str | None:
        row = self.conn.execute(
            "WITH RECURSIVE chain(id, depth) AS (SELECT id, 0 FROM sessions WHERE id = %s"
            " UNION ALL SELECT c.id, chain.depth + 1 FROM chain JOIN sessions p ON p.id = chain.id"
            " JOIN sessions c ON c.parent_session_id = p.id"
            " WHERE p.end_reason = 'compression' AND p.ended_at IS NOT NULL AND c.started_at >= p.ended_at"
            " AND chain.depth < %s)"
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
        # Never a prepared (generic) plan: it assumes a short array and turns a
        # 10,000-root walk into nested loops (0.5 s instead of 15 ms at 448 roots).
        tips = dict(c.execute(_TIPS, (roots,), prepare=False).fetchall())
        cur = c.execute(_ROWS, (list(tips.values()),))
        keys = [d.name for d in cur.description]
        return listing_page(roots, tips, (dict(zip(keys, r, strict=True)) for r in cur.fetchall()))

    # ------------------------------------------------------------------ replay / export

    def conversation(self, session_id: str) -> list[dict[str, Any]]:
        """Hermes v23's replay of one session: live rows in id order, v23's keys."""
        rows = self.conn.execute(
            f"SELECT {REPLAY_COLUMNS} FROM messages WHERE session_id = %s AND active = 1 ORDER BY id", (session_id,)
        ).fetchall()
        return [replay_turn(row, _decode_content(row[1])) for row in rows]

    def _stored_message_columns(self) -> list[str]:
        if self._message_columns is None:
            self._message_columns = [r[0] for r in self.conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'messages'::regclass AND attnum > 0"
                " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum").fetchall()]
        return self._message_columns

    def iter_export(self) -> Iterator[dict[str, Any]]:
        """Every session (oldest first) with its decoded messages and usage rows, one at a time."""
        cols = ", ".join(self._stored_message_columns())
        with self.conn.transaction():
            sessions = self.conn.cursor(name="hb_export_sessions")
            sessions.itersize = 500
            sessions.execute("SELECT * FROM sessions ORDER BY started_at, id")
            skeys: list[str] | None = None
            msgs = self.conn.cursor()
            for srow in sessions:
                if skeys is None:
                    skeys = [d.name for d in sessions.description]
                row = dict(zip(skeys, srow, strict=True))
                msgs.execute(f"SELECT {cols} FROM messages WHERE session_id = %s ORDER BY id", (row["id"],))
                mkeys = [d.name for d in msgs.description]
                out = []
                for mrow in msgs:
                    m = dict(zip(mkeys, mrow, strict=True))
                    m["content"] = _decode_content(m["content"])
                    if m["tool_calls"] is not None:
                        m["tool_calls"] = _decode_json(m["tool_calls"])
                    out.append(m)
                row["messages"] = out
                msgs.execute("SELECT * FROM session_model_usage WHERE session_id = %s"
                             " ORDER BY model, task, billing_provider", (row["id"],))
                ukeys = [d.name for d in msgs.description]
                row["model_usage"] = [dict(zip(ukeys, u, strict=True)) for u in msgs]
                yield row
            sessions.close()

    def export_jsonl(self, fh: TextIO) -> tuple[int, int]:
        sessions = messages = 0
        for row in self.iter_export():
            fh.write(json.dumps(row, ensure_ascii=False, default=str))
            fh.write("\n")
            sessions += 1
            messages += len(row["messages"])
        return sessions, messages


def _fts_hits(rows: list[Any], match: str) -> list[dict[str, Any]]:
    """The rows of :data:`_FTS` (psycopg's or asyncpg's) as hits, the snippet cut around the
    first query word found."""
    hits = PgBaseline._hits(rows)
    words = [w.lower() for w in _TOKEN.findall(match) if w not in ("AND", "OR", "NOT")]
    for hit, row in zip(hits, rows, strict=True):
        hit["snippet"] = _word_snippet([decode_nul(row[9]), row[5], decode_nul(row[3])], words)
    return hits


def _substring_hits(rows: list[Any], terms: list[str]) -> list[dict[str, Any]]:
    """The rows of :func:`_substring_sql` as hits, the snippet cut around the first term found."""
    hits = PgBaseline._hits(rows)
    for hit, row in zip(hits, rows, strict=True):
        hit["snippet"] = _snippet([_decode_content(row[9]), row[5]], terms)
    return hits


def _word_snippet(texts: list[Any], words: list[str]) -> str:
    """The first column holding a query word, cut around its first occurrence, marked."""
    for text in texts:
        if not isinstance(text, str) or not text:
            continue
        low = text.lower()
        for word in words:
            at = low.find(word)
            if at >= 0:
                a, b = max(at - 40, 0), min(at + len(word) + 40, len(text))
                return (("..." if a else "") + text[a:at] + SNIPPET_OPEN + text[at:at + len(word)] + SNIPPET_CLOSE
                        + text[at + len(word):b] + ("..." if b < len(text) else ""))
    return ""


def _snippet(texts: list[Any], terms: list[str]) -> str:
    for text in texts:
        if isinstance(text, str):
            at = next((i for i in (text.find(t) for t in terms) if i >= 0), -1)
            if at >= 0:
                a, b = max(at - 40, 0), at + 40
                return (("..." if a else "") + text[a:at] + SNIPPET_OPEN + text[at:at + len(terms[0])]
                        + SNIPPET_CLOSE + text[at + len(terms[0]):b] + ("..." if b < len(text) else ""))
    return ""
