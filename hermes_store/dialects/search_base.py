"""Search statements, one builder per route: what every dialect shares.

Each builder is a pure function of what it is given (filters, terms, orders, the bind
values it adds to ``params``) and returns a statement template: tables written
``{messages}``, ``{sessions}``… for the caller's schema (:func:`statement`), values
bound by name. Nothing here runs a statement; the repository
(:class:`hermes_store.repositories.search.SearchRepository`) runs what the builders
give it and shapes the rows. What differs per dialect is a subclass of
:class:`SearchRoutes` the dialect hands out as ``Dialect.search``
(:mod:`.search_fts5`, :mod:`.search_pg`).

An ORDER BY is written once, as an :class:`Order`, and placed on whichever alias a
statement reads (``m``, the page ``h``, a union ``u``): no SQL is rewritten by string
replacement.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.sql.elements import TextClause

from ..keys import FTS_STALE_KEY
from ..search import cjk_pairs
from ..search.groups import Groups
from ..search.delegated import DELEGATED_CANDIDATE
from ..search.query import escape_like
from ..tenant_schema import SchemaSQL, render

#: The columns of a hit, ``{snippet}`` and ``{rank}`` given per route.
HIT_COLUMNS = (
    "m.id AS id, m.session_id AS session_id, m.role AS role, {snippet} AS snippet, m.timestamp AS timestamp, "
    "m.tool_name AS tool_name, s.source AS source, s.model AS model, s.started_at AS session_started, {rank} AS rank"
)
#: A page row: the hit's columns plus the texts a snippet is cut from and the context shows.
PAGE_COLUMNS = HIT_COLUMNS + ", m.content AS content, m.tool_calls AS tool_calls"
#: The column that says a page row came with its context (:func:`with_context`).
CONTEXT_KEY = "p_id"
#: Hermes v23's search visibility (conditions on ``m``): live rows and compaction archives.
VISIBLE = " AND (m.active = 1 OR m.compacted = 1)"
#: state_meta markers of an interrupted FTS backfill (Hermes v23 ``optimize_fts_storage``).
GAP_HIGH_WATER, GAP_PROGRESS = "fts_rebuild_high_water", "fts_rebuild_progress"
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def statement(template: str, schema: str | None, params: dict[str, Any] | None = None) -> TextClause:
    """A builder's template as a ``text()`` for ``schema``, with the values of ``params``
    it names bound (the others, shared by other statements of the search, left out)."""
    clause = text(render(template, schema))
    if params:
        clause = clause.bindparams(**{k: v for k, v in params.items() if k in clause._bindparams})
    return clause


# ------------------------------------------------------------------ orders


@dataclass(frozen=True, slots=True)
class Order:
    """An ORDER BY written once: ``(source, column, direction)`` keys, where source is
    ``"row"`` (the message), ``"hit"`` (an index's hit, which carries the rank) or None
    (an output column, named bare)."""

    keys: tuple[tuple[str | None, str, str], ...]

    def on(self, row: str, hit: str | None = None) -> str:
        """The ORDER BY list with the message columns on alias ``row`` and the hit's on
        ``hit`` (``row`` when not given: a page or union holds both)."""
        aliases = {"row": row, "hit": hit or row}
        return ", ".join(
            (f"{aliases[source]}." if source else "") + column + (f" {direction}" if direction else "")
            for source, column, direction in self.keys
        )


NEWEST = Order((("row", "timestamp", "DESC"), ("row", "id", "DESC")))
OLDEST = Order((("row", "timestamp", "ASC"), ("row", "id", "ASC")))
#: The orders a caller names (``sort``); None is each route's own (by rank).
BY_TIME = {"newest": NEWEST, "oldest": OLDEST}


def time_order(sort: str | None, default: Order = NEWEST) -> Order:
    """``sort``'s order by time, or ``default``."""
    return BY_TIME.get(sort or "", default)


# ------------------------------------------------------------------ context


def previous_id(h: str) -> str:
    """The id of the message before ``h`` (same session, by timestamp then id). Each
    condition repeats ``timestamp <=`` on its own so both planners walk the
    (session_id, timestamp) index from the hit: the OR alone made PostgreSQL walk the
    timestamp index from the newest row of every session."""
    return (
        f"SELECT q.id FROM {{messages}} q WHERE q.session_id = {h}.session_id AND q.timestamp <= {h}.timestamp"
        f" AND (q.timestamp < {h}.timestamp OR q.id < {h}.id) ORDER BY q.timestamp DESC, q.id DESC LIMIT 1"
    )


def next_id(h: str) -> str:
    """The id of the message after ``h`` (see :func:`previous_id`)."""
    return (
        f"SELECT q.id FROM {{messages}} q WHERE q.session_id = {h}.session_id AND q.timestamp >= {h}.timestamp"
        f" AND (q.timestamp > {h}.timestamp OR q.id > {h}.id) ORDER BY q.timestamp, q.id LIMIT 1"
    )


def with_context(page: str, order: Order | None, *, context: bool) -> str:
    """``page`` (a SELECT of PAGE_COLUMNS, in order) with each row's previous and next
    message joined when ``context`` is wanted, as the floor does it: one statement for
    page and context, each neighbour looked up once per row of the (already cut) page,
    by key. Without ``context``: the page alone. ``order`` keeps the page's order."""
    if not context:
        return f"SELECT * FROM ({page}) h ORDER BY {order.on('h')}" if order else page
    outer = f" ORDER BY {order.on('h')}" if order else ""
    return (
        "SELECT h.*, p.id AS p_id, p.role AS p_role, p.content AS p_content, n.id AS n_id, n.role AS n_role,"
        f" n.content AS n_content FROM ({page}) h LEFT JOIN {{messages}} p ON p.id = ({previous_id('h')})"
        f" LEFT JOIN {{messages}} n ON n.id = ({next_id('h')}){outer}"
    )


def _neighbour(h: str, before: bool) -> str:
    """The message before (``before``) or after ``h`` in its session, by (timestamp, id)
    as one row comparison: PostgreSQL reads the (session_id, timestamp) index from the
    hit and sorts only the rows of its timestamp (an incremental sort), where the OR of
    :func:`previous_id` made it sort every earlier row of the session."""
    op, way = ("<", " DESC") if before else (">", "")
    return (
        f"SELECT q.id, q.role, q.content FROM {{messages}} q WHERE q.session_id = {h}.session_id"
        f" AND (q.timestamp, q.id) {op} ({h}.timestamp, {h}.id) ORDER BY q.timestamp{way}, q.id{way} LIMIT 1"
    )


def with_lateral_context(page: str, order: Order | None, *, context: bool) -> str:
    """:func:`with_context` for a dialect with LATERAL joins and row comparisons
    (PostgreSQL), as the plain-driver floor writes it: each neighbour's columns read by
    one lookup from the hit (no second fetch by id). Same columns, same rows."""
    if not context:
        return with_context(page, order, context=False)
    outer = f" ORDER BY {order.on('h')}" if order else ""
    return (
        "SELECT h.*, p.id AS p_id, p.role AS p_role, p.content AS p_content, n.id AS n_id, n.role AS n_role,"
        f" n.content AS n_content FROM ({page}) h LEFT JOIN LATERAL ({_neighbour('h', True)}) p ON TRUE"
        f" LEFT JOIN LATERAL ({_neighbour('h', False)}) n ON TRUE{outer}"
    )


#: Context of hits read without it (merged from two statements), in one statement:
#: rows of (hit id, position -1/0/1, role, content). Portable (named, expanding binds).
CONTEXT_SQL = SchemaSQL(
    "WITH hit AS (SELECT id, session_id, timestamp FROM {messages} WHERE id IN :ids) "
    "SELECT hit.id, x.pos, x.role, x.content FROM hit "
    "JOIN (SELECT hit.id AS hid, -1 AS pos, p.role, p.content FROM hit JOIN {messages} p ON p.id = ("
    + previous_id("hit") + ")"
    " UNION ALL SELECT hit.id, 0, m.role, m.content FROM hit JOIN {messages} m ON m.id = hit.id"
    " UNION ALL SELECT hit.id, 1, n.role, n.content FROM hit JOIN {messages} n ON n.id = ("
    + next_id("hit") + ")"
    ") x ON x.hid = hit.id ORDER BY hit.id, x.pos",
    bindparam("ids", expanding=True),
)
#: The FTS backfill markers and the stale flag (Hermes v23, v26).
GAP_SQL = SchemaSQL("SELECT key, value FROM {state_meta} WHERE key IN (:hw, :pr, :st)", hw=GAP_HIGH_WATER,
                    pr=GAP_PROGRESS, st=FTS_STALE_KEY)
STALE_SQL = SchemaSQL("SELECT value FROM {state_meta} WHERE key = :st", st=FTS_STALE_KEY)
#: The bind values of :func:`marks_sql`'s statement besides the pair names.
MARKS_PARAMS = {"bg_k": cjk_pairs.HIGH_WATER_KEY, "hw": GAP_HIGH_WATER, "pr": GAP_PROGRESS, "st": FTS_STALE_KEY}


@lru_cache(maxsize=64)
def marks_sql(indexed: bool, pairs: int, delegated: bool, gap: bool) -> str:
    """What a substring route reads before it can choose its plan, per shape: rows of
    (kind, name, number, text); kind 0 the newest id and high-water mark, 1 a pair's
    block count (``pairs`` bound ``:pc0``…), 2 a possibly delegated session, 3 a backfill
    marker."""
    parts = []
    if indexed:
        parts.append("SELECT 0 AS kind, NULL AS name, (SELECT max(id) FROM {messages}) AS number,"
                     " (SELECT value FROM {state_meta} WHERE key = :bg_k) AS value")
    if pairs:
        parts.append(cjk_pairs.pair_counts_sql(pairs))
    if delegated:
        parts.append(f"SELECT 2, id, NULL, model_config FROM {{sessions}} WHERE {DELEGATED_CANDIDATE}")
    if gap:
        parts.append("SELECT 3, key, NULL, value FROM {state_meta} WHERE key IN (:hw, :pr, :st)")
    return " UNION ALL ".join(parts)


# ------------------------------------------------------------------ substring


def _cased(term: str) -> bool:
    """Whether case folding can change what ``term`` matches (it has a cased letter)."""
    return any(ch.lower() != ch or ch.upper() != ch for ch in term)


def like_clause(groups: Groups, params: dict[str, Any], like: str = "LIKE", ascii_case: bool = False) -> str:
    """Terms matched as literal substrings of content, tool name or tool calls.

    ``like`` is ILIKE on PostgreSQL, whose LIKE is case-sensitive (SQLite's folds ASCII).
    ILIKE folds every letter the locale knows; ``ascii_case`` narrows it to SQLite's
    LIKE, which folds ASCII letters only (ILIKE stays first, for the pg_trgm index).
    A term without a cased letter (CJK, digits) needs no folding: plain LIKE, which
    spares pg_trgm's recheck the case folding and keeps the newest-first walk.
    """
    names: dict[str, str] = {}

    def has(term: str) -> str:
        if term not in names:
            names[term] = f"lk{len(names)}"
            params[names[term]] = f"%{escape_like(term)}%"
            if ascii_case:
                params[names[term] + "a"] = params[names[term]].translate(_ASCII_LOWER)
        n = names[term]
        if not _cased(term):
            return (f"(m.content LIKE :{n} ESCAPE '\\' OR m.tool_name LIKE :{n} ESCAPE '\\' "
                    f"OR m.tool_calls LIKE :{n} ESCAPE '\\')")
        if ascii_case:
            each = " OR ".join(
                f"({col} {like} :{n} ESCAPE '\\' AND lower({col} COLLATE \"C\") LIKE :{n}a ESCAPE '\\')"
                for col in ("m.content", "m.tool_name", "m.tool_calls")
            )
            return f"({each})"
        return (f"(m.content {like} :{n} ESCAPE '\\' OR m.tool_name {like} :{n} ESCAPE '\\' "
                f"OR m.tool_calls {like} :{n} ESCAPE '\\')")

    parts = []
    for positives, negatives in groups:
        # A NULL column makes LIKE NULL: count it as "not there" before negating.
        conds = [has(t) for t in positives]
        conds += [f"NOT COALESCE({' AND '.join(has(t) for t in unit)}, FALSE)" for unit in negatives]
        if conds:
            parts.append(f"({' AND '.join(conds)})")
    return " OR ".join(parts) or "1=0"


class SearchRoutes:
    """The statement of each search route, as a dialect writes it (see the module
    docstring). This base holds the substring routes every dialect shares, written
    with the dialect's caseless LIKE and planner hint."""

    #: The operator of a substring test that ignores case (``Dialect.caseless_like``).
    caseless_like = "LIKE"
    #: Whether it folds letters beyond ASCII (``Dialect.caseless_like_folds_non_ascii``).
    folds_non_ascii = False
    #: Written after ``messages AS m`` in a block-range read (``Dialect.rowid_walk_hint``).
    rowid_walk_hint = ""

    @staticmethod
    def context(page: str, order: Order | None, *, context: bool) -> str:
        """``page`` with each row's previous and next message (:func:`with_context`),
        as this dialect reads them best."""
        return with_context(page, order, context=context)

    def like(self, groups: Groups, params: dict[str, Any], *, ascii_case: bool = False) -> str:
        """:func:`like_clause` with this dialect's operator; ``ascii_case`` narrows it
        to ASCII folding where it folds more (SQLite's LIKE must be matched)."""
        return like_clause(groups, params, self.caseless_like, ascii_case=ascii_case and self.folds_non_ascii)

    def substring_scan(self, like: str, filters: str) -> str:
        """Short CJK / LIKE fallback, the plain form: one scan that the planner can walk
        in timestamp order and stop early (good for common terms)."""
        columns = PAGE_COLUMNS.format(snippet="NULL", rank="0.0")
        return (f"SELECT {columns} FROM {{messages}} m JOIN {{sessions}} s ON s.id = m.session_id"
                f" WHERE ({like}){filters}")

    def substring_blocks(self, like: str, filters: str, candidates: str) -> str:
        """Short CJK, through the bigram index: the rows of the ``candidates`` blocks up to
        the high-water mark (``:bg_hw``, blocks of ``:bg_block``) plus the rows above it,
        which the index does not cover yet (good for rare terms). The hint keeps SQLite on
        the rowid range: left to itself it may walk the timestamp index for the outer
        ORDER BY and scan every message."""
        columns = PAGE_COLUMNS.format(snippet="NULL", rank="0.0")
        hint = self.rowid_walk_hint
        indexed = (
            f"SELECT {columns} FROM ({candidates}) c JOIN {{messages}} AS m{hint} "
            "ON m.id BETWEEN c.block * :bg_block AND c.block * :bg_block + :bg_block - 1 AND m.id <= :bg_hw "
            f"JOIN {{sessions}} s ON s.id = m.session_id WHERE ({like}){filters}"
        )
        tail = (
            f"SELECT {columns} FROM {{messages}} AS m{hint} JOIN {{sessions}} s ON s.id = m.session_id "
            f"WHERE m.id > :bg_hw AND ({like}){filters}"
        )
        return f"{indexed} UNION ALL {tail}"

    @staticmethod
    def block_prefilter(candidates: str) -> str:
        """The walk's use of the bigram index: a row it covers is tested with LIKE only
        when its block can hold the term (a condition on ``m``)."""
        return f" AND (m.id > :bg_hw OR m.id / :bg_block IN ({candidates}))"

    def substring_page(self, select: str, flat: bool, order: Order, *, context: bool, limit: str = ":limit",
                       offset: bool = True) -> str:
        """One page of a substring SELECT (:meth:`substring_scan` is ``flat``; the block
        form is wrapped), in ``order``, with context when wanted."""
        ordering = order.on("m")
        page = f"{select} ORDER BY {ordering}" if flat else f"SELECT * FROM ({select}) m ORDER BY {ordering}"
        page += f" LIMIT {limit}" + (" OFFSET :offset" if offset else "")
        return self.context(page, order, context=context)

    def rebuild_gap(self, like: str, filters: str) -> str:
        """Rows an interrupted FTS backfill has not indexed yet (ids in ``(:gap_lo,
        :gap_hi]``), newest first, ``:gap_n`` at most (Hermes v23's supplement)."""
        return (
            f"SELECT {PAGE_COLUMNS.format(snippet='NULL', rank='0.0')} FROM {{messages}} m "
            "JOIN {sessions} s ON s.id = m.session_id WHERE m.id > :gap_lo AND m.id <= :gap_hi"
            f" AND ({like}){filters} "
            f"ORDER BY m.timestamp DESC, m.id DESC LIMIT :gap_n"
        )

    @staticmethod
    def tool_rows_kind(calls_by_like: bool) -> str:
        """The rows the trigram index cannot answer for: tool rows, and from v30
        (``calls_by_like``) rows with tool calls."""
        return " AND (m.role = 'tool' OR m.tool_calls IS NOT NULL)" if calls_by_like else " AND m.role = 'tool'"
