"""Full-text search over messages: word index, trigram index, substring fallback.

The routing (which index a query can use) lives in :mod:`hermes_store.search.query`;
FTS5 syntax in :mod:`hermes_store.search.fts`. This module filters, sorts, pages and
adds one message of context on each side of every hit.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, Iterable, Sequence

from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from ..codec import clean_text, decode_content
from ..search import bigram
from ..search.fts import SNIPPET_CLOSE, SNIPPET_ELLIPSIS, SNIPPET_OPEN, TRIGRAM_INDEX, WORD_INDEX, fts5
from ..search.query import escape_like, plan_search
from .base import Repository
from .records import SearchHit

CONTEXT_CHARS = 200
HIT_COLUMNS = (
    "m.id AS id, m.session_id AS session_id, m.role AS role, {snippet} AS snippet, m.timestamp AS timestamp, "
    "m.tool_name AS tool_name, s.source AS source, s.model AS model, s.started_at AS session_started, {rank} AS rank"
)
SNIPPET_RADIUS = 40
SORTS = (None, "rank", "newest", "oldest")


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [v for v in value if v is not None]


class SearchRepository(Repository):
    def search_messages(
        self,
        query: str,
        source_filter: str | Iterable[str] | None = None,
        exclude_sources: str | Iterable[str] | None = None,
        role_filter: str | Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        sort: str | None = None,
    ) -> list[SearchHit]:
        """Search; never raises on user input (bad syntax, odd characters → [] or hits)."""
        if not isinstance(query, str):
            return []
        plan = plan_search(clean_text(query))
        if plan.kind == "empty":
            return []
        if sort not in SORTS:
            sort = None
        where: list[str] = []
        params: dict[str, Any] = {"limit": max(int(limit or 0), 0), "offset": max(int(offset or 0), 0)}
        for prefix, values, op in (("src", _as_list(source_filter), "IN"),
                                   ("xsrc", _as_list(exclude_sources), "NOT IN"),
                                   ("role", _as_list(role_filter), "IN")):
            if values:
                names = [f"{prefix}{i}" for i in range(len(values))]
                column = "m.role" if prefix == "role" else "s.source"
                where.append(f"{column} {op} ({', '.join(':' + n for n in names)})")
                params.update(zip(names, values))
        filters = "".join(f" AND {w}" for w in where)
        order = {"newest": "m.timestamp DESC, m.id DESC", "oldest": "m.timestamp ASC, m.id ASC"}
        window = params["limit"] + params["offset"]
        try:
            if plan.kind in ("word", "trigram"):
                index = WORD_INDEX if plan.kind == "word" else TRIGRAM_INDEX
                params["q"] = plan.match
                params["window"] = window
                ranked = self._index_hits(index, filters, params, sort, order)
                if plan.kind == "word":
                    rows = ranked[params["offset"]:window]
                else:
                    rows = self._with_tool_rows(ranked, plan, filters, params, window, sort)
            else:
                sql, flat = self._substring_select(plan.terms, "OR", filters, params, window, flat=True)
                ordering = order.get(sort or "", order["newest"])
                sql = f"{sql} ORDER BY {ordering}" if flat else f"SELECT * FROM ({sql}) m ORDER BY {ordering}"
                rows = self._all(sql + " LIMIT :limit OFFSET :offset", params)
        except (OperationalError, sqlite3.OperationalError):
            # Defence in depth: the sanitizer should make this unreachable.
            return []
        return self._finish(rows, plan.terms)

    def _index_hits(
        self, index: str, filters: str, params: dict[str, Any], sort: str | None, order: dict[str, str]
    ) -> list[dict[str, Any]]:
        """The first ``offset + limit`` hits of an FTS index, in the requested order.

        Unfiltered, rank-ordered searches let FTS5 rank, cut and snippet the page
        first and join only that; otherwise every hit is joined for the filters and
        sorted by SQLite.
        """
        if filters or sort is not None:
            sql = (
                f"SELECT {HIT_COLUMNS.format(snippet='h.snippet', rank='h.rank')} "
                f"FROM ({fts5.match_sql(index)}) h JOIN messages m ON m.id = h.id "
                f"JOIN sessions s ON s.id = m.session_id WHERE 1{filters} "
                f"ORDER BY {order.get(sort or '', 'h.rank, m.timestamp DESC, m.id DESC')} LIMIT :window"
            )
            return self._all(sql, params)
        top = self.conn.execute(text(fts5.top_sql(index)), params).fetchall()
        if not top:
            return []
        ranks = {mid: rank for mid, rank, _snippet in top}
        snippets = {mid: snippet for mid, _rank, snippet in top}
        marks = ", ".join(f":h{i}" for i in range(len(top)))
        ids = {f"h{i}": mid for i, (mid, _r, _s) in enumerate(top)}
        rows = self._all(
            f"SELECT {HIT_COLUMNS.format(snippet='NULL', rank='0.0')} FROM messages m "
            f"JOIN sessions s ON s.id = m.session_id WHERE m.id IN ({marks})",
            ids,
        )
        for row in rows:
            row["rank"], row["snippet"] = ranks[row["id"]], snippets.get(row["id"], "")
        rows.sort(key=lambda r: (r["rank"], -r["timestamp"], -r["id"]))
        return rows

    def _with_tool_rows(
        self, ranked: list[dict[str, Any]], plan: Any, filters: str, params: dict[str, Any], window: int,
        sort: str | None,
    ) -> list[dict[str, Any]]:
        """Trigram hits plus tool rows, which the v23 trigram index leaves out.

        Both sides are fetched only up to ``offset + limit`` rows (each query can stop
        early), then merged: by rank, tool rows after the ranked hits; or by time.
        Tool rows are matched by substring with the query's AND semantics unless it
        uses OR/NOT.
        """
        if sort is None and len(ranked) >= window:
            return ranked[params["offset"]:window]
        joiner = "OR" if re.search(r"\b(OR|NOT)\b", plan.match) else "AND"
        tool_sql, flat = self._substring_select(plan.terms, joiner, " AND m.role = 'tool'" + filters,
                                                params, window, flat=True)
        direction = "ASC" if sort == "oldest" else "DESC"
        ordering = f"m.timestamp {direction}, m.id {direction}"
        tool_sql = f"{tool_sql} ORDER BY {ordering}" if flat else f"SELECT * FROM ({tool_sql}) m ORDER BY {ordering}"
        tools = self._all(tool_sql + " LIMIT :window", params)
        if sort is None:
            merged = ranked + tools
        else:
            merged = sorted(ranked + tools, key=lambda r: (r["timestamp"], r["id"]), reverse=sort != "oldest")
        return merged[params["offset"]:window]

    @staticmethod
    def _like_clause(terms: Sequence[str], joiner: str, params: dict[str, Any]) -> str:
        """Terms matched as literal substrings of content, tool name or tool calls."""
        parts = []
        for i, term in enumerate(terms):
            params[f"lk{i}"] = f"%{escape_like(term)}%"
            parts.append(
                f"(m.content LIKE :lk{i} ESCAPE '\\' OR m.tool_name LIKE :lk{i} ESCAPE '\\' "
                f"OR m.tool_calls LIKE :lk{i} ESCAPE '\\')"
            )
        return f" {joiner} ".join(parts) or "0"

    def _substring_select(
        self, terms: Sequence[str], joiner: str, filters: str, params: dict[str, Any], window: int, *, flat: bool
    ) -> tuple[str, bool]:
        """A SELECT of substring hits; uses the CJK bigram index when it beats a scan.

        Returns (sql, is_flat). A flat query is a single scan that SQLite can walk in
        timestamp order and stop early (good for common terms); the indexed form reads
        candidate blocks plus the rows the index does not cover yet (good for rare ones).
        """
        like = self._like_clause(terms, joiner, params)
        columns = HIT_COLUMNS.format(snippet="NULL", rank="0.0")
        scan = (
            f"SELECT {columns} FROM messages m JOIN sessions s ON s.id = m.session_id WHERE ({like}){filters}"
        )
        grams = [bigram.term_bigrams(t) for t in terms]
        if joiner == "AND":  # any one term's pairs narrow an AND; merge them all
            merged = sorted({g for gs in grams for g in gs})
            grams = [merged] if merged else [[]]
        if not all(grams) or not self.has_table(bigram.TABLE):
            return scan, flat
        if flat:
            # Choose: candidates E rows vs. a newest-first walk of about window*N/E rows.
            # The rows above the high-water mark are scanned either way: count them in.
            total = self._scalar("SELECT max(id) FROM messages") or 0
            params["bg_hw"] = bigram.high_water(self.conn)
            estimate = bigram.estimate_blocks(self.conn, grams) * bigram.BLOCK + max(total - params["bg_hw"], 0)
            if estimate * estimate > max(window, 1) * total:
                return scan, True
        params["bg_hw"] = bigram.high_water(self.conn)
        params["bg_block"] = bigram.BLOCK
        cand = bigram.candidate_blocks_sql(grams, params)
        indexed = (
            f"SELECT {columns} FROM ({cand}) c JOIN messages AS m NOT INDEXED "
            "ON m.id BETWEEN c.block * :bg_block AND c.block * :bg_block + :bg_block - 1 AND m.id <= :bg_hw "
            f"JOIN sessions s ON s.id = m.session_id WHERE ({like}){filters}"
        )
        # NOT INDEXED keeps SQLite on the rowid range: left to itself it may walk the
        # timestamp index for the outer ORDER BY and scan every message.
        tail = (
            f"SELECT {columns} FROM messages AS m NOT INDEXED JOIN sessions s ON s.id = m.session_id "
            f"WHERE m.id > :bg_hw AND ({like}){filters}"
        )
        return f"{indexed} UNION ALL {tail}", False

    def _finish(self, rows: list[dict[str, Any]], terms: Sequence[str]) -> list[SearchHit]:
        if not rows:
            return []
        context = self._context([r["id"] for r in rows])
        texts = self._texts([r["id"] for r in rows if r["snippet"] is None])
        hits: list[SearchHit] = []
        for r in rows:
            r.pop("rank", None)
            if r["snippet"] is None:
                r["snippet"] = _substring_snippet(texts.get(r["id"], ()), terms)
            r["context"] = context.get(r["id"], [])
            hits.append(r)  # type: ignore[arg-type]
        return hits

    def _context(self, ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """Previous message, the hit, next message (same session, by timestamp then id)."""
        marks = ", ".join("?" * len(ids))
        rows = self.conn.exec_driver_sql(
            "WITH hit AS (SELECT id, session_id, timestamp FROM messages WHERE id IN (" + marks + ")) "
            "SELECT hit.id, x.pos, x.role, x.content FROM hit "
            "JOIN (SELECT hit.id AS hid, -1 AS pos, p.role, p.content FROM hit JOIN messages p ON p.id = ("
            "   SELECT q.id FROM messages q WHERE q.session_id = hit.session_id AND "
            "   (q.timestamp < hit.timestamp OR (q.timestamp = hit.timestamp AND q.id < hit.id))"
            "   ORDER BY q.timestamp DESC, q.id DESC LIMIT 1)"
            " UNION ALL SELECT hit.id, 0, m.role, m.content FROM hit JOIN messages m ON m.id = hit.id"
            " UNION ALL SELECT hit.id, 1, n.role, n.content FROM hit JOIN messages n ON n.id = ("
            "   SELECT q.id FROM messages q WHERE q.session_id = hit.session_id AND "
            "   (q.timestamp > hit.timestamp OR (q.timestamp = hit.timestamp AND q.id > hit.id))"
            "   ORDER BY q.timestamp, q.id LIMIT 1)"
            ") x ON x.hid = hit.id ORDER BY hit.id, x.pos",
            tuple(ids),
        ).fetchall()
        out: dict[int, list[dict[str, Any]]] = {}
        for hid, _pos, role, content in rows:
            out.setdefault(hid, []).append({"role": role, "content": _cut(content)})
        return out

    def _texts(self, ids: list[int]) -> dict[int, tuple[Any, ...]]:
        if not ids:
            return {}
        rows = self.conn.exec_driver_sql(
            f"SELECT id, content, tool_name, tool_calls FROM messages WHERE id IN ({', '.join('?' * len(ids))})",
            tuple(ids),
        ).fetchall()
        return {r[0]: tuple(r[1:]) for r in rows}


def _substring_snippet(texts: Sequence[Any], terms: Sequence[str]) -> str:
    """A snippet like FTS5's for hits found by substring: first term occurrence marked."""
    for value in texts:
        if not isinstance(value, str) or not value:
            continue
        low = value.lower()
        for term in terms:
            at = low.find(term.lower())
            if at >= 0:
                start, end = max(at - SNIPPET_RADIUS, 0), min(at + len(term) + SNIPPET_RADIUS, len(value))
                return (
                    (SNIPPET_ELLIPSIS if start else "") + value[start:at] + SNIPPET_OPEN
                    + value[at:at + len(term)] + SNIPPET_CLOSE + value[at + len(term):end]
                    + (SNIPPET_ELLIPSIS if end < len(value) else "")
                )
    first = texts[0] if texts and isinstance(texts[0], str) else ""
    return first[: 2 * SNIPPET_RADIUS]


def _cut(content: Any) -> Any:
    value = decode_content(content)
    if isinstance(value, str):
        return value[:CONTEXT_CHARS]
    return str(value)[:CONTEXT_CHARS] if value is not None else None
