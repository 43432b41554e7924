"""Full-text search over messages: word index, trigram index, substring fallback.

The routing (which index a query can use) lives in :mod:`hermes_store.search.query`;
FTS5 syntax in :mod:`hermes_store.search.fts`. This module filters, sorts, pages and
adds one message of context on each side of every hit.

What each route covers follows Hermes' indexes (v30):

* word queries: ``messages_fts`` over every session, tool calls included; a tool
  result is indexed by its first 8192 characters only (``messages_fts_src``), so a
  word further into a tool result is not found this way (the row itself is intact).
  Their terms of 3+ ASCII letters or digits are also looked up inside CJK runs, which
  the word index keeps in one token with the run (``A2A`` in ``讨论A2A通信``), through
  the trigram index and in what it holds (:mod:`hermes_store.search.latin_in_cjk`);
* CJK queries (trigram, or substring for terms under 3 characters, helped by our
  bigram index): only sessions the trigram index keeps (not cron, not sub-agents), on
  every route; tool rows and rows with tool calls, which that index does not hold,
  are matched by substring over all their text.

PostgreSQL gives the same answers (tests/test_pg_search_parity.py): words are cut and
folded as unicode61 does (revision hs0003, :mod:`hermes_store.search.postgresql`),
snippets of word hits are cut in Python, and every CJK query goes by substring (ILIKE
on the pg_trgm index, or the bigram blocks), tool rows included.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import weakref
from functools import lru_cache
from typing import Any
from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import bindparam
from sqlalchemy.exc import OperationalError

from .. import errors
from ..codec import clean_text, decode_content
from ..keys import FTS_STALE_KEY, MAX_FTS5_QUERY_CHARS, MAX_ROWS
from ..search import bigram
from ..search import latin_in_cjk
from ..search import postgresql as pg_search
from ..search.fts import (
    SNIPPET_CLOSE,
    SNIPPET_ELLIPSIS,
    SNIPPET_OPEN,
    TRIGRAM_INDEX,
    WORD_INDEX,
)
from ..search.query import escape_like, item_terms, match_items, plan_search, split_on
from ..tenancy import SchemaSQL
from .base import Repository, in_filter
from .base import source_filter as source_clauses
from .records import SearchHit

CONTEXT_CHARS = 200
HIT_COLUMNS = (
    "m.id AS id, m.session_id AS session_id, m.role AS role, {snippet} AS snippet, m.timestamp AS timestamp, "
    "m.tool_name AS tool_name, s.source AS source, s.model AS model, s.started_at AS session_started, {rank} AS rank"
)
SNIPPET_RADIUS = 40
SORTS = (None, "rank", "newest", "oldest")

log = logging.getLogger(__name__)

#: What SQLite (3.40-3.46) says when FTS5 cannot parse a MATCH string. Only these mean
#: "the query, not the database, is wrong"; anything else (locks, I/O, a corrupt or
#: missing shadow table) must reach the caller. ``no such column`` is a column filter
#: (``name:term``), so it is accepted only for an unqualified name.
_QUERY_SYNTAX_ERROR = re.compile(
    r"fts5: syntax error near |unterminated string$|unknown special query: |no such column: [^.\s]+$"
    r"|expected integer, got |fts5: parser stack overflow$|fts5: expression tree is too large"
)


def is_query_syntax_error(exc: BaseException) -> bool:
    """Whether ``exc`` is FTS5 refusing a MATCH string, as opposed to a database failure."""
    orig = getattr(exc, "orig", exc)  # SQLAlchemy wraps the driver's error
    return type(orig) is sqlite3.OperationalError and _QUERY_SYNTAX_ERROR.match(str(orig)) is not None


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    """Filter values as a list; text made bindable (a lone surrogate must not raise)."""
    if value is None:
        return []
    values = [value] if isinstance(value, str) else [v for v in value if v is not None]
    return [clean_text(v) if isinstance(v, str) else v for v in values]


def _count(value: Any, name: str) -> int:
    """A non-negative row count; huge values clamp to MAX_ROWS instead of overflowing SQLite."""
    if value is None:
        return 0
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise errors.InvalidInputError(f"search {name} must be an integer, got {value!r}") from exc
    return min(max(number, 0), MAX_ROWS)


#: A boolean query as FTS5 reads it: an OR of groups; a group needs all its positive
#: terms and none of its NOT-ed units (each unit: terms that must all be present).
Groups = list[tuple[list[str], list[list[str]]]]

def boolean_groups(match: str) -> Groups:
    """Read a sanitized MATCH string with FTS5's precedence, for LIKE to mirror it.

    FTS5's grammar binds space-joined terms tightest, then NOT, then AND, then OR:
    ``a b NOT c d OR e`` is ``((a AND b) AND NOT (c AND d)) OR e``. A ``NEAR(a b, N)``
    group is read as its two terms (a substring test cannot count words): only the
    stale-index scan meets one, CJK plans have it read so already.
    """
    items = match_items(match)  # operators are bare; a quoted "AND" is a term
    groups: Groups = []
    for group in split_on(items, "OR"):
        positives: list[str] = []
        negatives: list[list[str]] = []
        for factor in split_on(group, "AND"):
            first, *negated = split_on(factor, "NOT")
            positives += [_term_text(t) for i in first for t in item_terms(i)]
            negatives += [[_term_text(t) for i in unit for t in item_terms(i)] for unit in negated]
        groups.append((positives, negatives))
    return groups


def substring_groups(match: str) -> Groups:
    """The short-CJK substring route's reading of a sanitized MATCH string: any one
    positive term matches (Hermes' LIKE scan ORs its terms), with the exclusions of its
    own OR branch (``数据 NOT 迁移``, ``数据 -迁移``)."""
    groups: Groups = []
    for positives, negatives in boolean_groups(match):
        for term in positives:
            if ([term], negatives) not in groups:
                groups.append(([term], negatives))
    return groups


#: Characters a term needs to be a trigram term: FTS5's trigram tokenizer gives a
#: shorter one no token at all.
MIN_TRIGRAM_CHARS = 3


def trigram_groups(match: str) -> Groups:
    """:func:`boolean_groups` as FTS5's trigram index reads them, for LIKE to mirror it.

    A term of fewer than three characters has no trigram, and FTS5 then leaves it out:
    next to other terms it asks nothing (``C++ 数据库`` is ``数据库``), a group of only
    such terms matches nothing, and NOT-ing only such terms excludes nothing.
    """
    groups: Groups = []
    for positives, negatives in boolean_groups(match):
        kept = [t for t in positives if len(t) >= MIN_TRIGRAM_CHARS]
        if kept:
            units = ([t for t in unit if len(t) >= MIN_TRIGRAM_CHARS] for unit in negatives)
            groups.append((kept, [u for u in units if u]))
    return groups


def _term_text(item: str) -> str:
    """A rendered term without its prefix star and phrase quotes."""
    item = item[:-1] if item.endswith("*") else item
    return item[1:-1] if len(item) >= 2 and item[0] == item[-1] == '"' else item


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
        *,
        include_inactive: bool = False,
        fields: Collection[str] | None = None,
        stale: bool = False,
    ) -> list[SearchHit]:
        """Search; never raises on user input (bad syntax, odd characters → [] or hits).

        Database failures are not user input: a lock, an I/O error or a damaged index
        propagates (the driver's error, or a typed one from the engine's error hook)
        instead of looking like "no results".

        Hermes v23: the query is cut to MAX_FTS5_QUERY_CHARS before sanitizing, and
        unless ``include_inactive`` every route keeps only visible rows (``active = 1
        OR compacted = 1``: rewound rows hidden, rows archived by compaction found).

        Statements: a word search on PostgreSQL is one (page, sessions, snippet texts
        and context); a substring route is one more, :meth:`_marks`, which the choice
        of plan needs. SQLite's FTS5 routes rank inside the index first.

        Hermes v26: ``fields`` keeps only those of the ten hit keys (context is read only
        when asked for). While the FTS5 index is stale (``stale``: the store's own flag,
        or the ``fts_stale`` key seen in ``state_meta``) every query is a LIKE scan.
        """
        wanted = hit_fields(fields)
        self._context_wanted = wanted is None or "context" in wanted
        if not isinstance(query, str):
            return []
        plan = plan_search(clean_text(query[:MAX_FTS5_QUERY_CHARS]))
        if plan.kind == "empty":
            return []
        if sort not in SORTS:
            sort = None
        params: dict[str, Any] = {"limit": _count(limit, "limit"), "offset": _count(offset, "offset")}
        words: pg_search.WordQuery | None = None
        where = source_clauses("s", _as_list(source_filter), _as_list(exclude_sources), params,
                              prefixes=("src", "xsrc"))
        by_source = bool(where)
        roles = _as_list(role_filter)
        if roles:
            where.append(in_filter("m.role", roles, "role", params))
        filters = "".join(f" AND {w}" for w in where)
        order = {"newest": "m.timestamp DESC, m.id DESC", "oldest": "m.timestamp ASC, m.id ASC"}
        window = min(params["limit"] + params["offset"], MAX_ROWS)
        dialect = self.dialect
        visible = "" if include_inactive or "compacted" not in self.columns_of("messages") else VISIBLE
        by_substring = plan.kind == "substring" or (plan.kind == "trigram" and dialect.cjk_by_substring)
        groups: Groups = []
        marks: Marks | None = None
        runs: latin_in_cjk.RunsSQL | None = None
        run_terms: Sequence[latin_in_cjk.Term] = ()
        if by_substring:
            # PostgreSQL answers every CJK query by substring (LIKE/ILIKE over the pg_trgm
            # index), with the query's own AND/OR/NOT meaning; the substring route ORs its
            # positive terms, each without its OR branch's exclusions.
            groups = trigram_groups(plan.match) if plan.kind == "trigram" else substring_groups(plan.match)
            marks = self._marks(groups, delegated=dialect.cjk_by_substring, gap=dialect.fts5 is not None)
        # CJK queries are answered from the trigram index or by substring; every one
        # of those routes leaves out the sessions that index leaves out (v29: cron,
        # v30: cron and sub-agents), so a query's answer does not depend on its length.
        if dialect.fts5 is not None and (stale or self._stale_seen()):
            return _project(self._stale_scan(plan.match, filters + visible, params), wanted)
        cjk_filter = "" if plan.kind == "word" else self._cjk_sessions(params, marks)
        # Every route below applies cjk_filter to the rows it returns: the visibility rule too.
        cjk_filter += visible
        if by_substring:
            # SQLite's LIKE folds ASCII letters only; so does the 2-char route on PostgreSQL.
            sql, flat = self._substring_select(groups, filters + cjk_filter, params, window, flat=True,
                                               ascii_case=plan.kind == "substring", marks=marks)
            ordering = order.get(sort or "", order["newest"])
            page = f"{sql} ORDER BY {ordering}" if flat else f"SELECT * FROM ({sql}) m ORDER BY {ordering}"
            rows = self._all(self._with_context(page + " LIMIT :limit OFFSET :offset", ordering), params)
        else:
            index = WORD_INDEX if plan.kind == "word" else TRIGRAM_INDEX
            # From v30 the trigram index holds no tool_calls: a row with tool calls is
            # matched by substring over all its columns instead (see _with_tool_rows).
            calls_by_like = plan.kind == "trigram" and "tool_calls" not in self.object_sql(TRIGRAM_INDEX)
            # Where the index does not cut snippets, ``words`` is what cuts them here.
            params["q"], words = dialect.word_match(self.conn, plan.match)
            if words is not None and words.near:
                params["qn"] = words.near  # NEAR's exact tsquery (search.postgresql.near_recheck)
            params["window"] = window
            exclude = cjk_filter + (" AND m.tool_calls IS NULL" if calls_by_like else "")
            # A word query's terms written inside CJK runs: one token with the run in the
            # word index, found through the trigram index instead (search.latin_in_cjk).
            in_runs = latin_in_cjk.parse(plan.match) if plan.kind == "word" else None
            if in_runs is not None:
                runs = dialect.latin_in_cjk(self.conn, in_runs, words, params, self.object_sql)
                run_terms = in_runs.terms if runs is not None else ()
            try:
                if words is not None:
                    rows = self._word_page(by_source, filters + exclude,
                                           params, order.get(sort or "", pg_search.RANK_ORDER),
                                           runs=runs, ranked=sort not in ("newest", "oldest"),
                                           near=bool(words.near))
                else:
                    ranked = self._index_hits(index, filters, params, sort, order, exclude=exclude,
                                              context=plan.kind == "word", runs=runs)
            except (OperationalError, sqlite3.OperationalError) as exc:
                if not is_query_syntax_error(exc):
                    raise
                # Defence in depth: the sanitizer should make this unreachable, and
                # the tests fail if it is reached; say so rather than stay silent.
                log.warning("search: FTS5 refused sanitized query %r: %s", plan.match, getattr(exc, "orig", exc))
                return []
            if words is not None:
                pass  # the page is cut already
            elif plan.kind == "word":
                rows = ranked[params["offset"]:window]
            else:
                rows = self._with_tool_rows(ranked, plan, filters + cjk_filter, params, window, sort, calls_by_like)
        if len(rows) < params["limit"] and dialect.fts5 is not None:
            # Only FTS5 tables have a rebuild window; PostgreSQL's indexes never skip a row.
            # The same read says whether the index went stale since this engine last looked.
            values = marks.gap if marks is not None else dict(self.conn.execute(_GAP_SQL.on(self.conn)).fetchall())
            if _is_stale(values.get(FTS_STALE_KEY)):
                _FRESH.get(self.conn.engine, set()).discard(self.schema)
                return _project(self._stale_scan(plan.match, filters + visible, params), wanted)
            rows += self._rebuild_gap(plan.match, filters + visible, params, rows, values)
        return _project(self._finish(rows, plan.terms, words, run_terms), wanted)

    def _stale_seen(self) -> bool:
        """Whether ``state_meta`` says the FTS5 index is stale; a fresh answer is kept per
        engine (no statement on later searches), a stale one is asked again next time."""
        fresh = _FRESH.setdefault(self.conn.engine, set())
        if self.schema in fresh:
            return False
        if self.has_table("state_meta") and _is_stale(self.conn.execute(_STALE_SQL.on(self.conn)).scalar()):
            return True
        fresh.add(self.schema)
        return False

    def _stale_scan(self, match: str, filters: str, params: dict[str, Any]) -> list[SearchHit]:
        """Hermes v26's search while the index is stale: LIKE over content, tool name and
        tool calls with the query's OR groups and NOT, newest first, a 120-character
        snippet from 40 characters before the first term."""
        groups = boolean_groups(match)
        sql, _flat = self._substring_select(groups, filters, params, MAX_ROWS, flat=True)
        ordering = "m.timestamp DESC, m.id DESC"
        rows = self._all(self._with_context(f"{sql} ORDER BY {ordering} LIMIT :limit OFFSET :offset", ordering),
                         params)
        first = next((t for positives, _neg in groups for t in positives), "")
        for row in rows:
            row["snippet"] = _stale_snippet(row["content"], first)
        return self._finish(rows, [first] if first else [])

    def _with_context(self, page: str, ordering: str | None = None) -> str:
        """``page`` with each row's neighbours (:func:`_with_context`) when the caller wants
        context; else ``page`` in its order."""
        if getattr(self, "_context_wanted", True):
            return _with_context(page, ordering)
        return f"SELECT * FROM ({page}) h ORDER BY {ordering.replace('m.', 'h.')}" if ordering else page

    def _marks(self, groups: Groups, *, delegated: bool, gap: bool) -> Marks | None:
        """What a substring route reads before it can choose its plan, in one statement.

        The newest id and the bigram index's high-water mark (the plan's cost and the
        indexed range), the counts of the query's pairs not cached for the mark last
        seen (:func:`bigram.missing_pairs`), the FTS5 backfill markers (for
        :meth:`_rebuild_gap`) and, with ``delegated``, the sessions that may be
        sub-agent transcripts (decided in Python: PostgreSQL 15 has no safe JSON test).
        None when there is nothing to read.
        """
        grams = [sorted({g for t in positives for g in bigram.term_bigrams(t)}) for positives, _neg in groups]
        indexed = bool(groups) and all(grams) and self.has_table(bigram.TABLE)
        if not (indexed or delegated or gap):
            return None
        missing = bigram.missing_pairs(self.conn, grams) if indexed else []
        key = (indexed, len(missing), delegated, gap)
        found = self.conn.execute(self._sql(_marks_sql(*key)), {
            "bg_k": bigram.HIGH_WATER_KEY, "hw": GAP_HIGH_WATER, "pr": GAP_PROGRESS, "st": FTS_STALE_KEY,
            **{f"pc{i}": g for i, g in enumerate(missing)},
        }).fetchall()
        marks = Marks(grams if indexed else None)
        for kind, name, number, value in found:
            if kind == 0:
                marks.total, marks.high_water = int(number or 0), bigram.parse_high_water(value)
            elif kind == 1:
                marks.counts[name] = int(number)
            elif kind == 2:
                marks.delegated.append((name, value))
            else:
                marks.gap[name] = value
        if indexed:
            marks.counts.update({g: 0 for g in missing if g not in marks.counts})
        return marks

    def _cjk_sessions(self, params: dict[str, Any], marks: Marks | None) -> str:
        """The dialect's CJK session condition; sub-agent candidates already read by
        :meth:`_marks` are handed over, so the dialect reads none itself."""
        candidates = marks.delegated if marks is not None and self.dialect.cjk_by_substring else None
        return self.dialect.cjk_sessions(self.conn, params, self.object_sql, candidates)

    def _word_page(self, join_sessions: bool, where: str, params: dict[str, Any], ordering: str,
                   runs: latin_in_cjk.RunsSQL | None = None, ranked: bool = True,
                   near: bool = False) -> list[dict[str, Any]]:
        """PostgreSQL's word route in one statement: the ranked page (the index cuts no
        snippets, so nothing is gained by ranking first), its sessions, the texts a
        snippet is cut from, and each hit's context.

        With ``runs`` (terms inside CJK runs) the same statement adds the lookup's rows;
        by rank (``ranked``) only when the word hits do not fill the page. Rows in
        sessions that may be sub-agent transcripts are held back and those sessions
        returned with the page; only when one of them turns out not to be one (its JSON
        read here, as for the CJK routes) is the page read once more, knowing which are.
        """
        def page(inner: str) -> str:
            return (
                f"SELECT {PAGE_COLUMNS.format(snippet='NULL', rank='h.rank')} FROM ({inner}) h "
                "JOIN {messages} m ON m.id = h.id JOIN {sessions} s ON s.id = m.session_id"
            )

        if runs is None:
            return self._all(self._with_context(page(pg_search.page_sql(join_sessions, where, ordering, near)), ordering),
                             params)
        guard = pg_search.rank_guard(join_sessions, where) if ranked else ""
        inner = page(pg_search.runs_page_sql(join_sessions, where, ordering))
        exact = False
        while True:
            sql = (
                f"{pg_search.runs_cte(runs, where, guard, exact=exact)}SELECT x.*, pr.rx_probe AS rx_probe"
                f" FROM ({pg_search.RUNS_PROBE}) pr LEFT JOIN ({self._with_context(inner, ordering)}) x ON TRUE"
                f" ORDER BY {ordering.replace('m.', 'x.')}"
            )
            found = self._all(sql, params)  # at least the probe's row, even for an empty page
            probe = [(sid, config) for sid, config in found[0]["rx_probe"] or []] if found else []
            for row in found:
                del row["rx_probe"]
            rows = [r for r in found if r["id"] is not None]
            if exact or not probe:
                return rows
            delegated = pg_search.delegated_sessions(self.conn, probe)
            if len(delegated) == len(probe):
                return rows  # every session held back is one: the page stands
            params["rx_dlg"] = delegated
            exact = True

    def _rebuild_gap(self, match: str, filters: str, params: dict[str, Any],
                     found: list[dict[str, Any]], values: dict[str, Any]) -> list[dict[str, Any]]:
        """Rows an interrupted FTS backfill has not indexed yet (Hermes v23's supplement).

        While ``fts_rebuild_high_water`` is set (> 0), messages with ids in
        ``(fts_rebuild_progress, high_water]`` are in no index (the triggers skip them
        until the backfill reaches them). A short page is topped up from them by
        substring, every positive term required and no excluded one present (NOT x, -x),
        newest first, without repeating a hit.
        ``values``: the markers (read by :meth:`_marks`, or with ``_GAP_SQL``).
        """
        try:
            high = int(values.get(GAP_HIGH_WATER) or 0)
            low = int(values.get(GAP_PROGRESS) or 0)
        except (TypeError, ValueError):
            return []
        if high <= 0 or low >= high:
            return []
        gap: dict[str, Any] = {**params, "gap_lo": low, "gap_hi": high, "gap_n": params["limit"] - len(found)}
        groups = boolean_groups(match)
        # Hermes ANDs the query's terms here; an excluded term (NOT x, -x) stays excluded.
        terms = list(dict.fromkeys(t for positives, _neg in groups for t in positives))
        negatives = [unit for _pos, units in groups for unit in units]
        like = self._like_clause([(terms, negatives)], gap, self.dialect.caseless_like)
        rows = self._all(
            f"SELECT {PAGE_COLUMNS.format(snippet='NULL', rank='0.0')} FROM {{messages}} m "
            f"JOIN {{sessions}} s ON s.id = m.session_id WHERE m.id > :gap_lo AND m.id <= :gap_hi AND ({like}){filters} "
            f"ORDER BY m.timestamp DESC, m.id DESC LIMIT :gap_n",
            gap,
        )
        seen = {r["id"] for r in found}
        return [r for r in rows if r["id"] not in seen]

    def _index_hits(
        self, index: str, filters: str, params: dict[str, Any], sort: str | None, order: dict[str, str],
        exclude: str = "", context: bool = True, runs: latin_in_cjk.RunsSQL | None = None,
    ) -> list[dict[str, Any]]:
        """The first ``offset + limit`` hits of an FTS5 index, in the requested order.

        Unfiltered, rank-ordered searches let FTS5 rank, cut and snippet the page
        first and join only that; otherwise every hit is joined for the filters and
        sorted by SQLite. ``exclude`` (conditions on ``m``/``s``) drops rows the
        caller answers another way; the ranked page is then widened until it holds
        ``window`` kept rows or the index has no more hits. With ``context`` the first
        ranked page comes with each row's context (the trigram route, which often
        widens and merges, asks for it once its page is known).

        ``runs`` (word queries: terms inside CJK runs) adds the rows of that lookup, in
        the same statement: by time among the hits; by rank after them, so only when
        the hits do not fill the window (the ranked page read first says so).
        """
        run_rows = "" if runs is None else (
            f"SELECT {PAGE_COLUMNS.format(snippet='NULL', rank=latin_in_cjk.RUN_RANK_SQL)} FROM {runs.source} "
            f"WHERE {runs.where}{filters}{exclude}{runs.sessions}"
        )
        newest = "m.timestamp DESC, m.id DESC"
        if filters or sort is not None:
            ordering = order.get(sort or "", "h.rank, m.timestamp DESC, m.id DESC")
            hits = (
                f"SELECT {PAGE_COLUMNS.format(snippet='h.snippet', rank='h.rank')} "
                f"FROM ({self.dialect.match_sql(index)}) h JOIN {{messages}} m ON m.id = h.id "
                f"JOIN {{sessions}} s ON s.id = m.session_id WHERE 1=1{filters}{exclude}"
            )
            if not run_rows:
                return self._all(self._with_context(f"{hits} ORDER BY {ordering} LIMIT :window", ordering), params)
            by_time = sort in ("newest", "oldest")
            # By rank the lookup's rows follow every hit: wanted only when the hits fall short.
            guard = "" if by_time else f" AND (SELECT count(*) FROM ({hits} LIMIT :window)) < :window"
            # Each side cut to the window first: FTS5 then cuts snippets for the page only.
            sql = (
                f"SELECT * FROM (SELECT * FROM ({hits} ORDER BY {ordering} LIMIT :window) UNION ALL SELECT * FROM"
                f" ({run_rows}{guard} ORDER BY {ordering if by_time else newest} LIMIT :window)) u"
                f" ORDER BY {ordering.replace('h.', 'u.').replace('m.', 'u.')} LIMIT :window"
            )
            return self._all(self._with_context(sql, ordering.replace("h.rank", "m.rank")), params)
        window = params["window"]
        fetch = window
        while True:
            top = self.conn.execute(self._sql(self.dialect.top_sql(index)), {**params, "window": fetch}).fetchall()
            if not top:
                if not run_rows:
                    return []
                page = f"SELECT * FROM ({run_rows}) u ORDER BY {newest.replace('m.', 'u.')} LIMIT :window"
                return self._all(self._with_context(page, newest) if context else page, params)
            ranks = {mid: rank for mid, rank, _snippet in top}
            snippets = {mid: snippet for mid, _rank, snippet in top}
            rows: list[dict[str, Any]] = []
            for start in range(0, len(top), 500):
                chunk = top[start:start + 500]
                ids: dict[str, Any] = {f"h{i}": mid for i, (mid, _r, _s) in enumerate(chunk)}
                sql = (
                    f"SELECT {PAGE_COLUMNS.format(snippet='NULL', rank='0.0')} FROM {{messages}} m "
                    f"JOIN {{sessions}} s ON s.id = m.session_id WHERE m.id IN ({', '.join(':' + k for k in ids)}){exclude}"
                )
                if run_rows and len(top) < fetch and start + 500 >= len(top):
                    # Every hit is read and the window is not full: the lookup's rows
                    # (newest first) come with the last of them.
                    sql += f" UNION ALL SELECT * FROM ({run_rows} ORDER BY {newest} LIMIT :window)"
                    ids = {**params, **ids}
                # Context with the first page only: a widened one holds rows no page shows
                # (the few shown get theirs in _finish).
                rows += self._all(self._with_context(sql) if context and fetch == window else sql, ids)
            if len(rows) >= window or len(top) < fetch or fetch >= MAX_ROWS:
                break
            fetch = min(fetch * 4, MAX_ROWS)
        for row in rows:
            if row["id"] in ranks:  # else a lookup row: its rank and no snippet yet
                row["rank"], row["snippet"] = ranks[row["id"]], snippets.get(row["id"], "")
        rows.sort(key=lambda r: (r["rank"], -r["timestamp"], -r["id"]))
        return rows[:window]

    def _with_tool_rows(
        self, ranked: list[dict[str, Any]], plan: Any, filters: str, params: dict[str, Any], window: int,
        sort: str | None, calls_by_like: bool = False,
    ) -> list[dict[str, Any]]:
        """Trigram hits plus the rows the trigram index cannot answer for.

        Those are tool rows (never in the trigram index) and, from v30
        (``calls_by_like``), rows with tool calls: the index no longer holds
        ``tool_calls``, so only a substring test over all three columns gives such a
        row the meaning the query has for every other row. Both sides are fetched
        only up to ``offset + limit`` rows (each query can stop early), then merged:
        by rank, these rows after the ranked hits; or by time. They are matched by
        substring with the query's own AND/OR/NOT meaning.
        """
        if sort is None and len(ranked) >= window:
            return ranked[params["offset"]:window]
        rows_kind = " AND (m.role = 'tool' OR m.tool_calls IS NOT NULL)" if calls_by_like else " AND m.role = 'tool'"
        groups = trigram_groups(plan.match)
        tool_sql, flat = self._substring_select(groups, rows_kind + filters, params, window, flat=True,
                                                marks=self._marks(groups, delegated=False, gap=False))
        direction = "ASC" if sort == "oldest" else "DESC"
        ordering = f"m.timestamp {direction}, m.id {direction}"
        tool_sql = f"{tool_sql} ORDER BY {ordering}" if flat else f"SELECT * FROM ({tool_sql}) m ORDER BY {ordering}"
        tools = self._all(self._with_context(tool_sql + " LIMIT :window", ordering), params)
        if sort is None:
            merged = ranked + tools
        else:
            merged = sorted(ranked + tools, key=lambda r: (r["timestamp"], r["id"]), reverse=sort != "oldest")
        return merged[params["offset"]:window]

    @staticmethod
    def _like_clause(groups: Groups, params: dict[str, Any], like: str = "LIKE", ascii_case: bool = False) -> str:
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

    def _substring_select(
        self, groups: Groups, filters: str, params: dict[str, Any], window: int, *, flat: bool,
        ascii_case: bool = False, marks: Marks | None = None,
    ) -> tuple[str, bool]:
        """A SELECT of substring hits; uses the CJK bigram index when it beats a scan.

        Returns (sql, is_flat). A flat query is a single scan that SQLite can walk in
        timestamp order and stop early (good for common terms); the indexed form reads
        candidate blocks plus the rows the index does not cover yet (good for rare ones).
        ``marks`` (:meth:`_marks`) says whether the index applies, and its state.
        """
        dialect = self.dialect
        like = self._like_clause(groups, params, dialect.caseless_like,
                                 ascii_case=ascii_case and dialect.caseless_like_folds_non_ascii)
        # NOT INDEXED keeps SQLite on the rowid range (see below); PostgreSQL plans it itself.
        not_indexed = dialect.rowid_walk_hint
        columns = PAGE_COLUMNS.format(snippet="NULL", rank="0.0")
        scan = (
            f"SELECT {columns} FROM {{messages}} m JOIN {{sessions}} s ON s.id = m.session_id WHERE ({like}){filters}"
        )
        # A row of a group holds every positive term, so any of their pairs narrow it;
        # NOT-ed units narrow nothing. A group without pairs means a full scan.
        if marks is None or marks.grams is None:
            return scan, flat
        grams = marks.grams
        total, params["bg_hw"] = marks.total, marks.high_water
        params["bg_block"] = bigram.BLOCK
        cand = bigram.candidate_blocks_sql(grams, params)
        if flat:
            # Choose: candidates E rows vs. a newest-first walk of about window*N/E rows.
            # The rows above the high-water mark are scanned either way: count them in.
            blocks = bigram.estimate_blocks(self.conn, grams, mark=params["bg_hw"], counts=marks.counts)
            estimate = blocks * bigram.BLOCK + max(total - params["bg_hw"], 0)
            if estimate * estimate > max(window, 1) * total:
                # The walk keeps the blocks as a prefilter: a row the index covers is
                # tested with LIKE only when its block can hold the term.
                prefilter = f" AND (m.id > :bg_hw OR m.id / :bg_block IN ({cand}))"
                return scan + prefilter, True
        indexed = (
            f"SELECT {columns} FROM ({cand}) c JOIN {{messages}} AS m{not_indexed} "
            "ON m.id BETWEEN c.block * :bg_block AND c.block * :bg_block + :bg_block - 1 AND m.id <= :bg_hw "
            f"JOIN {{sessions}} s ON s.id = m.session_id WHERE ({like}){filters}"
        )
        # NOT INDEXED keeps SQLite on the rowid range: left to itself it may walk the
        # timestamp index for the outer ORDER BY and scan every message.
        tail = (
            f"SELECT {columns} FROM {{messages}} AS m{not_indexed} JOIN {{sessions}} s ON s.id = m.session_id "
            f"WHERE m.id > :bg_hw AND ({like}){filters}"
        )
        return f"{indexed} UNION ALL {tail}", False

    def _finish(
        self, rows: list[dict[str, Any]], terms: Sequence[str], words: pg_search.WordQuery | None = None,
        run_terms: Sequence[latin_in_cjk.Term] = (),
    ) -> list[SearchHit]:
        """Snippets the index did not give (substring hits; PostgreSQL word hits, marked
        by their folded ``words``; rows found with ``run_terms`` inside CJK runs) and
        each hit's context (read with the page, or here for the rows that came without it)."""
        if not rows:
            return []
        missing = [r["id"] for r in rows if CONTEXT_KEY not in r]
        context = self._context(missing) if missing and getattr(self, "_context_wanted", True) else {}
        hits: list[SearchHit] = []
        for r in rows:
            rank = r.pop("rank", None)
            content, tool_calls = r.pop("content"), r.pop("tool_calls")
            if r["snippet"] is None:
                found = (content, r["tool_name"], tool_calls)
                if run_terms and rank == latin_in_cjk.RUN_RANK:
                    r["snippet"] = latin_in_cjk.snippet(found, run_terms, SNIPPET_RADIUS)
                else:
                    r["snippet"] = pg_search.snippet(found, words) if words else _substring_snippet(found, terms)
            if CONTEXT_KEY in r:
                prev_id, prev_role, prev_content = r.pop("p_id"), r.pop("p_role"), r.pop("p_content")
                next_id, next_role, next_content = r.pop("n_id"), r.pop("n_role"), r.pop("n_content")
                ctx = [] if prev_id is None else [{"role": prev_role, "content": _cut(prev_content)}]
                ctx.append({"role": r["role"], "content": _cut(content)})
                if next_id is not None:
                    ctx.append({"role": next_role, "content": _cut(next_content)})
                r["context"] = ctx
            else:
                r["context"] = context.get(r["id"], [])
            hits.append(r)  # type: ignore[arg-type]
        return hits

    def _context(self, ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """Previous message, the hit, next message (same session, by timestamp then id),
        for hits that came without it (merged from two statements), in one statement."""
        rows = self.conn.execute(_CONTEXT_SQL.on(self.conn), {"ids": ids}).fetchall()
        out: dict[int, list[dict[str, Any]]] = {}
        for hid, _pos, role, content in rows:
            out.setdefault(hid, []).append({"role": role, "content": _cut(content)})
        return out


class Marks:
    """What :meth:`SearchRepository._marks` read (see there)."""

    __slots__ = ("counts", "delegated", "gap", "grams", "high_water", "total")

    def __init__(self, grams: list[list[str]] | None) -> None:
        #: The query's pairs per group, or None when the bigram index cannot help.
        self.grams = grams
        self.total = 0
        self.high_water = -1
        self.counts: dict[str, int] = {}
        self.delegated: list[tuple[str, Any]] = []
        self.gap: dict[str, Any] = {}


def _cased(term: str) -> bool:
    """Whether case folding can change what ``term`` matches (it has a cased letter)."""
    return any(ch.lower() != ch or ch.upper() != ch for ch in term)


#: Hermes v23's search visibility (conditions on ``m``): live rows and compaction archives.
VISIBLE = " AND (m.active = 1 OR m.compacted = 1)"
#: state_meta markers of an interrupted FTS backfill (Hermes v23 ``optimize_fts_storage``).
GAP_HIGH_WATER, GAP_PROGRESS = "fts_rebuild_high_water", "fts_rebuild_progress"
_GAP_SQL = SchemaSQL("SELECT key, value FROM {state_meta} WHERE key IN (:hw, :pr, :st)", hw=GAP_HIGH_WATER,
                     pr=GAP_PROGRESS, st=FTS_STALE_KEY)
_STALE_SQL = SchemaSQL("SELECT value FROM {state_meta} WHERE key = :st", st=FTS_STALE_KEY)
#: Per engine, then per tenant schema: the search index was seen not stale (Hermes v26
#: fail-open). Only that answer is kept; a stale one is asked again on every search.
_FRESH: weakref.WeakKeyDictionary[Any, set[str | None]] = weakref.WeakKeyDictionary()
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

#: A page row: the hit's columns plus the texts a snippet is cut from and the context shows.
PAGE_COLUMNS = HIT_COLUMNS + ", m.content AS content, m.tool_calls AS tool_calls"
#: The column that says a page row came with its context (:func:`_with_context`).
CONTEXT_KEY = "p_id"
#: The neighbours of a hit ``h0`` (same session, by timestamp then id). Each condition
#: repeats ``timestamp <=`` / ``>=`` on its own so both planners walk the
#: (session_id, timestamp) index from the hit: the OR alone made PostgreSQL walk the
#: timestamp index from the newest row of every session.
_PREVIOUS = (
    "SELECT q.id FROM {{messages}} q WHERE q.session_id = {h}.session_id AND q.timestamp <= {h}.timestamp"
    " AND (q.timestamp < {h}.timestamp OR q.id < {h}.id) ORDER BY q.timestamp DESC, q.id DESC LIMIT 1"
)
_NEXT = (
    "SELECT q.id FROM {{messages}} q WHERE q.session_id = {h}.session_id AND q.timestamp >= {h}.timestamp"
    " AND (q.timestamp > {h}.timestamp OR q.id > {h}.id) ORDER BY q.timestamp, q.id LIMIT 1"
)


def _with_context(page: str, ordering: str | None = None) -> str:
    """``page`` (a SELECT of PAGE_COLUMNS, in order) with each row's previous and next
    message joined, as the floor does it: one statement for page and context. Each
    neighbour is looked up once per row of the (already cut) page, by key.
    ``ordering`` (on ``m``) keeps the page's order."""
    outer = f" ORDER BY {ordering.replace('m.', 'h.')}" if ordering else ""
    return (
        "SELECT h.*, p.id AS p_id, p.role AS p_role, p.content AS p_content, n.id AS n_id, n.role AS n_role,"
        f" n.content AS n_content FROM ({page}) h LEFT JOIN {{messages}} p ON p.id = ({_PREVIOUS.format(h='h')})"
        f" LEFT JOIN {{messages}} n ON n.id = ({_NEXT.format(h='h')}){outer}"
    )


#: Portable statement (named, expanding binds) for context of hits read without it.
_CONTEXT_SQL = SchemaSQL(
    "WITH hit AS (SELECT id, session_id, timestamp FROM {messages} WHERE id IN :ids) "
    "SELECT hit.id, x.pos, x.role, x.content FROM hit "
    "JOIN (SELECT hit.id AS hid, -1 AS pos, p.role, p.content FROM hit JOIN {messages} p ON p.id = ("
    + _PREVIOUS.format(h="hit").replace("{{", "{").replace("}}", "}") + ")"
    " UNION ALL SELECT hit.id, 0, m.role, m.content FROM hit JOIN {messages} m ON m.id = hit.id"
    " UNION ALL SELECT hit.id, 1, n.role, n.content FROM hit JOIN {messages} n ON n.id = ("
    + _NEXT.format(h="hit").replace("{{", "{").replace("}}", "}") + ")"
    ") x ON x.hid = hit.id ORDER BY hit.id, x.pos",
    bindparam("ids", expanding=True),
)


@lru_cache(maxsize=64)
def _marks_sql(indexed: bool, pairs: int, delegated: bool, gap: bool) -> str:
    """The statement of :meth:`SearchRepository._marks`, per shape: rows of
    (kind, name, number, text); kind 0 the newest id and high-water mark, 1 a pair's
    block count, 2 a possibly delegated session, 3 a backfill marker."""
    parts = []
    if indexed:
        parts.append("SELECT 0 AS kind, NULL AS name, (SELECT max(id) FROM {messages}) AS number,"
                     " (SELECT value FROM {state_meta} WHERE key = :bg_k) AS value")
    if pairs:
        parts.append(bigram.pair_counts_sql(pairs))
    if delegated:
        parts.append(f"SELECT 2, id, NULL, model_config FROM {{sessions}} WHERE {pg_search.DELEGATED_CANDIDATE}")
    if gap:
        parts.append("SELECT 3, key, NULL, value FROM {state_meta} WHERE key IN (:hw, :pr, :st)")
    return " UNION ALL ".join(parts)


#: The ten keys of a hit, in Hermes' order (what ``fields`` may name).
HIT_FIELDS = ("id", "session_id", "role", "snippet", "timestamp", "tool_name", "source", "model",
              "session_started", "context")
#: Hermes' stale-index snippet: 120 characters from 40 before the first term.
STALE_SNIPPET_CHARS, STALE_SNIPPET_LEAD = 120, 40


def hit_fields(fields: Collection[str] | None) -> tuple[str, ...] | None:
    """``fields`` checked: None (every key), or the named keys in Hermes' order.
    A lone string is refused (TypeError: it would read as its letters), an unknown name
    too (ValueError)."""
    if fields is None:
        return None
    if isinstance(fields, (str, bytes)):
        raise errors.UnknownFieldError("search fields must be a collection of field names, not a string")
    try:
        names = set(fields)
    except TypeError as exc:
        raise errors.UnknownFieldError(f"search fields must be a collection of field names, not {fields!r}") from exc
    unknown = sorted(str(n) for n in names if n not in HIT_FIELDS)
    if unknown:
        raise errors.InvalidInputError(f"unknown search fields: {', '.join(unknown)} (known: {', '.join(HIT_FIELDS)})")
    return tuple(n for n in HIT_FIELDS if n in names)


def _project(hits: list[SearchHit], wanted: tuple[str, ...] | None) -> list[SearchHit]:
    if wanted is None:
        return hits
    return [{k: h[k] for k in wanted if k in h} for h in hits]  # type: ignore[misc]


def _is_stale(value: Any) -> bool:
    return value is not None and str(value).strip() not in ("", "0")


def _stale_snippet(content: Any, term: str) -> str:
    """``substr(content, max(1, instr(content, term) - 40), 120)``, as Hermes' stale scan cuts it."""
    if not isinstance(content, str):
        return ""
    at = content.find(term) if term else -1
    start = max(at - STALE_SNIPPET_LEAD, 0) if at >= 0 else 0
    return content[start:start + STALE_SNIPPET_CHARS]


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
