"""Full-text search over messages: word index, trigram index, substring fallback.

The routing (which index a query can use) lives in :mod:`hermes_store.search.query`;
FTS5 syntax in :mod:`hermes_store.search.fts`. The statement of each route is built by
the dialect (``Dialect.search``: :mod:`hermes_store.dialects.search_base` and one
module per dialect), from what this module passes it; this module runs the statements,
filters, pages, and shapes the rows (snippets cut in Python, one message of context on
each side of every hit).

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
from dataclasses import dataclass, field
from typing import Any, cast
from collections.abc import Collection, Iterable, Mapping, Sequence

from sqlalchemy import column
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.selectable import TextualSelect

from .. import errors
from ..codec import clean_text, decode_content
from ..dialects import cjk_bigram
from ..dialects.search_base import (
    CONTEXT_KEY,
    CONTEXT_SQL,
    GAP_HIGH_WATER,
    GAP_PROGRESS,
    GAP_SQL,
    MARKS_PARAMS,
    NEWEST,
    OLDEST,
    STALE_SQL,
    VISIBLE,
    Order,
    marks_sql,
    statement,
    time_order,
)
from ..keys import FTS_STALE_KEY, MAX_FTS5_QUERY_CHARS, MAX_ROWS
from ..search import cjk_pairs, latin_in_cjk
from ..search import word_hits
from ..search.fts import (
    SNIPPET_CLOSE,
    SNIPPET_ELLIPSIS,
    SNIPPET_OPEN,
    TRIGRAM_INDEX,
    WORD_INDEX,
)
from ..search.groups import (  # noqa: F401 - importable from here (tests, older callers)
    MIN_TRIGRAM_CHARS,
    Groups,
    boolean_groups,
    substring_groups,
    trigram_groups,
)
from ..search.query import SearchPlan, plan_search
from .base import Repository, in_filter
from .base import source_filter as source_clauses
from .records import SearchHit

CONTEXT_CHARS = 200
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


@dataclass(slots=True)
class _Search:
    """One search's reading of its arguments, handed from step to step explicitly."""

    plan: SearchPlan
    sort: str | None
    params: dict[str, Any]
    #: Caller filters (``" AND ..."`` on ``m`` and ``s``), and whether they name sessions.
    filters: str
    by_source: bool
    #: The visibility rule (Hermes v23), '' with ``include_inactive``.
    visible: str
    #: ``offset + limit``, capped.
    window: int
    #: Whether the hits' context is wanted (``fields``).
    context: bool
    #: Whether the query is answered by substring (short CJK; every CJK query where the
    #: dialect has no trigram full-text index), with its reading as ``groups``.
    by_substring: bool = False
    groups: Groups = field(default_factory=list)
    #: What the substring route read first (:meth:`SearchRepository._marks`).
    marks: Marks | None = None


@dataclass(frozen=True, slots=True)
class _IndexRoute:
    """A word or trigram query's part of the index route (:meth:`SearchRepository._index_setup`)."""

    index: str
    #: The CJK routes' session and visibility conditions.
    cjk_filter: str
    #: Rows with tool calls are matched by substring (the v30 trigram index lacks them).
    calls_by_like: bool
    #: What cuts word hits' snippets in Python (PostgreSQL), None where the index does.
    words: word_hits.WordQuery | None
    #: Conditions dropping the rows another route answers.
    exclude: str
    #: The lookup of word terms inside CJK runs, and its terms.
    runs: latin_in_cjk.RunsSQL | None
    run_terms: Sequence[latin_in_cjk.Term]


#: Each search statement with its result columns named, learned from its first run: as a
#: ``TextualSelect`` its result metadata is kept with the compiled statement, where a bare
#: text's is rebuilt from ``cursor.description`` name by name on every call. Keyed by the
#: rendered statement (one per text and schema, :func:`~.base.schema_text`) and database
#: kind; bounded (a TextualSelect holds its text: entries are dropped here, not by weak
#: references).
_COLUMNED: dict[tuple[TextClause, type], tuple[TextualSelect, list[str]]] = {}
_MAX_COLUMNED = 512


class SearchRepository(Repository):
    def _all(self, sql: str | TextClause, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows as dicts, as :meth:`Repository._all` reads them; a statement run before
        goes with its result columns named (:data:`_COLUMNED`)."""
        statement_ = self._sql(sql) if isinstance(sql, str) else sql
        key = (statement_, type(self.dialect))  # the names a database gives unnamed columns differ
        known = _COLUMNED.get(key)
        if known is not None:
            named, keys = known
            return [dict(zip(keys, row, strict=True)) for row in self.conn.execute(named, params or {}).fetchall()]
        result = self.conn.execute(statement_, params or {})
        keys = list(result.keys())
        if len(set(keys)) == len(keys):  # names kept positionally only when they are distinct
            if len(_COLUMNED) >= _MAX_COLUMNED:
                _COLUMNED.clear()
            _COLUMNED[key] = (statement_.columns(*(column(k) for k in keys)), keys)
        return [dict(zip(keys, row, strict=True)) for row in result.fetchall()]

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
        if not isinstance(query, str):
            return []
        plan = plan_search(clean_text(query[:MAX_FTS5_QUERY_CHARS]))
        if plan.kind == "empty":
            return []
        search = self._read(plan, source_filter, exclude_sources, role_filter, limit, offset, sort,
                            include_inactive=include_inactive, wanted=wanted)
        return _project(self._hits(search, stale=stale), wanted)

    def search_sql(
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
    ) -> TextClause | None:
        """The page statement :meth:`search_messages` sends for these arguments, with its
        values bound, without running it (as sqlite-utils pairs ``search_sql()`` with
        ``search()``); None when nothing is searched.

        The reads that choose the statement still run (column lists, the bigram index's
        marks, terms folded by the index's function); a route that widens its page or
        merges rows from a second statement (FTS5's ranked page, tool rows beside the
        trigram index) gives its first. A stale index or a rebuild window is not looked
        at: this is the statement of the index's route.
        """
        wanted = hit_fields(fields)
        if not isinstance(query, str):
            return None
        plan = plan_search(clean_text(query[:MAX_FTS5_QUERY_CHARS]))
        if plan.kind == "empty":
            return None
        search = self._read(plan, source_filter, exclude_sources, role_filter, limit, offset, sort,
                            include_inactive=include_inactive, wanted=wanted, with_page=False)
        sql = self._first_statement(search)
        return statement(sql, self.schema, search.params)

    # ------------------------------------------------------------------ reading the arguments

    def _read(
        self, plan: SearchPlan, source_filter: str | Iterable[str] | None, exclude_sources: str | Iterable[str] | None,
        role_filter: str | Iterable[str] | None, limit: int, offset: int, sort: str | None, *,
        include_inactive: bool, wanted: tuple[str, ...] | None, with_page: bool = True,
    ) -> _Search:
        """The arguments as one :class:`_Search`; a substring route's marks read too, or,
        ``with_page`` where the dialect can read them with the page (PostgreSQL) and the
        plan choice has what it needs from the last search, left to the page
        (:meth:`_marks_seen`)."""
        if sort not in SORTS:
            sort = None
        params: dict[str, Any] = {"limit": _count(limit, "limit"), "offset": _count(offset, "offset")}
        where = source_clauses("s", _as_list(source_filter), _as_list(exclude_sources), params,
                               prefixes=("src", "xsrc"))
        by_source = bool(where)
        roles = _as_list(role_filter)
        if roles:
            where.append(in_filter("m.role", roles, "role", params))
        dialect = self.dialect
        search = _Search(
            plan=plan, sort=sort, params=params, filters="".join(f" AND {w}" for w in where), by_source=by_source,
            visible="" if include_inactive or "compacted" not in self.columns_of("messages") else VISIBLE,
            window=min(params["limit"] + params["offset"], MAX_ROWS),
            context=wanted is None or "context" in wanted,
        )
        search.by_substring = plan.kind == "substring" or (plan.kind == "trigram" and dialect.cjk_by_substring)
        if search.by_substring:
            # PostgreSQL answers every CJK query by substring (LIKE/ILIKE over the pg_trgm
            # index), with the query's own AND/OR/NOT meaning; the substring route ORs its
            # positive terms, each without its OR branch's exclusions.
            search.groups = trigram_groups(plan.match) if plan.kind == "trigram" else substring_groups(plan.match)
            seen = self._marks_seen(search.groups) if with_page and dialect.cjk_by_substring else None
            search.marks = seen or self._marks(search.groups, delegated=dialect.cjk_by_substring,
                                               gap=dialect.search_index_can_lag)
        return search

    # ------------------------------------------------------------------ routes

    def _hits(self, search: _Search, *, stale: bool) -> list[SearchHit]:
        """Run the route ``search`` takes; rows shaped into hits."""
        plan, params, marks = search.plan, search.params, search.marks
        lags = self.dialect.search_index_can_lag
        # CJK queries are answered from the trigram index or by substring; every one
        # of those routes leaves out the sessions that index leaves out (v29: cron,
        # v30: cron and sub-agents), so a query's answer does not depend on its length.
        if lags and (stale or self._stale_seen()):
            return self._stale_scan(plan.match, search.filters + search.visible, params, context=search.context)
        words: word_hits.WordQuery | None = None
        run_terms: Sequence[latin_in_cjk.Term] = ()
        if search.by_substring:
            rows = self._substring_rows(search)
        else:
            found = self._index_route(search)
            if found is None:
                return []
            rows, words, run_terms = found
        if len(rows) < params["limit"] and lags:
            # Only FTS5 tables have a rebuild window; PostgreSQL's indexes never skip a row.
            # The same read says whether the index went stale since this engine last looked.
            values = marks.gap if marks is not None else dict(self.conn.execute(GAP_SQL.on(self.conn)).fetchall())
            if _is_stale(values.get(FTS_STALE_KEY)):
                _FRESH.get(self.conn.engine, set()).discard(self.schema)
                return self._stale_scan(plan.match, search.filters + search.visible, params, context=search.context)
            rows += self._rebuild_gap(plan.match, search.filters + search.visible, params, rows, values)
        return self._finish(rows, plan.terms, words, run_terms, context=search.context)

    def _cjk_filter(self, search: _Search) -> str:
        """Conditions every CJK route applies to the rows it returns (the sessions the
        trigram index keeps), with the visibility rule; for a word query only the latter."""
        cjk = "" if search.plan.kind == "word" else self._cjk_sessions(search.params, search.marks)
        return cjk + search.visible

    def _substring_page(self, search: _Search) -> str:
        """Short CJK (and every CJK query on a dialect without a trigram index): one page
        with context. SQLite's LIKE folds ASCII letters only; so does the 2-char route on
        PostgreSQL. Marks left to the page (:attr:`Marks.held`): the page with them."""
        sql, flat = self._substring_select(search.groups, search.filters + self._cjk_filter(search), search.params,
                                           search.window, flat=True, ascii_case=search.plan.kind == "substring",
                                           marks=search.marks)
        routes = self.dialect.search
        order = time_order(search.sort)
        page: str = routes.substring_page(sql, flat, order, context=search.context)
        marks = search.marks
        if marks is not None and marks.held:
            indexed = marks.grams is not None
            if indexed:
                search.params["bg_k"] = cjk_pairs.HIGH_WATER_KEY
            page = routes.with_marks(page, order, indexed)
        return page

    def _substring_rows(self, search: _Search) -> list[dict[str, Any]]:
        """The substring route's page rows. With its marks left to the page
        (:meth:`_marks_seen`), one statement: the page stands when the bigram index's
        high-water mark has not gone below the one the plan was built with (rows above
        it are scanned, so a mark that moved on costs time, never rows) and every
        session held back is a sub-agent transcript; otherwise the page is read again
        with the marks it brought back (a rebuilt index, a session that only looks like
        a sub-agent's)."""
        params, marks = search.params, search.marks
        found = self._all(self._substring_page(search), params)
        if marks is None or not marks.held:
            return found
        first = found[0]  # the marks' row is there even for an empty page
        live = Marks(marks.grams)
        live.delegated = [(sid, config) for sid, config in first["mk_dlg"] or []]
        if marks.grams is not None:
            live.total, live.high_water = int(first["mk_total"] or 0), cjk_pairs.parse_high_water(first["mk_hw"])
            self._keep_marks(live)
        for row in found:
            del row["mk_total"], row["mk_hw"], row["mk_dlg"]
        rows = [r for r in found if r["id"] is not None]
        delegated = self.dialect.delegated_sessions(self.conn, live.delegated) if live.delegated else []
        if live.high_water >= marks.high_water and len(delegated) == len(live.delegated):
            if live.grams is not None and live.high_water != marks.high_water:
                # The index moved on: the pairs' counts for its new mark are read now
                # (as a search that reads its marks first does), for the next plan.
                cjk_bigram.estimate_blocks(self.conn, live.grams, mark=live.high_water)
            return rows
        search.marks = live
        return self._all(self._substring_page(search), params)

    def _index_route(
        self, search: _Search,
    ) -> tuple[list[dict[str, Any]], word_hits.WordQuery | None, Sequence[latin_in_cjk.Term]] | None:
        """Word and trigram queries through the full-text index: the page rows, what
        cuts their snippets in Python (PostgreSQL's word hits) and the terms found
        inside CJK runs. None when FTS5 refused the (sanitized) query."""
        plan, params, sort = search.plan, search.params, search.sort
        route = self._index_setup(search)
        words, exclude, runs = route.words, route.exclude, route.runs
        try:
            if words is not None:
                order = time_order(sort, self.dialect.search.rank_order)
                rows = self._word_page(search.by_source, search.filters + exclude, params, order,
                                       runs=runs, ranked=sort not in ("newest", "oldest"), near=bool(words.near),
                                       context=search.context)
                return rows, words, route.run_terms
            ranked = self._index_hits(route.index, search.filters, params, sort, exclude=exclude,
                                      context=plan.kind == "word", runs=runs, wanted=search.context)
        except (OperationalError, sqlite3.OperationalError) as exc:
            if not is_query_syntax_error(exc):
                raise
            # Defence in depth: the sanitizer should make this unreachable, and
            # the tests fail if it is reached; say so rather than stay silent.
            log.warning("search: FTS5 refused sanitized query %r: %s", plan.match, getattr(exc, "orig", exc))
            return None
        if plan.kind == "word":
            return ranked[params["offset"]:search.window], None, route.run_terms
        rows = self._with_tool_rows(ranked, plan, search.filters + route.cjk_filter, params, search.window, sort,
                                    route.calls_by_like, context=search.context)
        return rows, None, route.run_terms

    def _index_setup(self, search: _Search) -> _IndexRoute:
        """What a word or trigram query asks of the dialect before its page (binding
        ``:q``, ``:window`` and the lookup's values into ``search.params``)."""
        plan, params = search.plan, search.params
        dialect = self.dialect
        cjk_filter = self._cjk_filter(search)
        # From v30 the trigram index holds no tool_calls: a row with tool calls is
        # matched by substring over all its columns instead (see _with_tool_rows).
        calls_by_like = plan.kind == "trigram" and "tool_calls" not in self.object_sql(TRIGRAM_INDEX)
        # Where the index does not cut snippets, ``words`` is what cuts them here.
        params["q"], words = dialect.word_match(self.conn, plan.match)
        if words is not None and words.near:
            params["qn"] = words.near  # NEAR's exact tsquery (search.postgresql.near_recheck)
        params["window"] = search.window
        # A word query's terms written inside CJK runs: one token with the run in the
        # word index, found through the trigram index instead (search.latin_in_cjk).
        in_runs = latin_in_cjk.parse(plan.match) if plan.kind == "word" else None
        runs = None if in_runs is None else dialect.latin_in_cjk(self.conn, in_runs, words, params, self.object_sql)
        return _IndexRoute(
            index=WORD_INDEX if plan.kind == "word" else TRIGRAM_INDEX, cjk_filter=cjk_filter,
            calls_by_like=calls_by_like, words=words,
            exclude=cjk_filter + (" AND m.tool_calls IS NULL" if calls_by_like else ""), runs=runs,
            run_terms=in_runs.terms if in_runs is not None and runs is not None else (),
        )

    def _first_statement(self, search: _Search) -> str:
        """The first page statement of ``search``'s route (see :meth:`search_sql`)."""
        if search.by_substring:
            return self._substring_page(search)
        sort, routes = search.sort, self.dialect.search
        route = self._index_setup(search)
        where = search.filters + route.exclude
        order = time_order(sort, routes.rank_order)
        # ``Dialect.search`` is typed Any (the index routes live on each dialect's builders).
        first: str
        if route.words is not None:
            near = bool(route.words.near)
            if route.runs is None:
                first = routes.word_page(search.by_source, where, order, near=near, context=search.context)
            else:
                first = routes.word_page_with_runs(route.runs, search.by_source, where, order,
                                                   ranked=sort not in ("newest", "oldest"), exact=False,
                                                   context=search.context)
        elif search.filters or sort is not None:
            first = routes.ranked(route.index, search.filters, route.exclude, order,
                                  routes.run_rows(route.runs, search.filters, route.exclude),
                                  by_time=sort in ("newest", "oldest"), context=search.context)
        else:
            first = routes.top(route.index)
        return first

    def _stale_seen(self) -> bool:
        """Whether ``state_meta`` says the FTS5 index is stale; a fresh answer is kept per
        engine (no statement on later searches), a stale one is asked again next time."""
        fresh = _FRESH.setdefault(self.conn.engine, set())
        if self.schema in fresh:
            return False
        if self.has_table("state_meta") and _is_stale(self.conn.execute(STALE_SQL.on(self.conn)).scalar()):
            return True
        fresh.add(self.schema)
        return False

    def _stale_scan(self, match: str, filters: str, params: dict[str, Any], *, context: bool) -> list[SearchHit]:
        """Hermes v26's search while the index is stale: LIKE over content, tool name and
        tool calls with the query's OR groups and NOT, newest first, a 120-character
        snippet from 40 characters before the first term."""
        groups = boolean_groups(match)
        sql, _flat = self._substring_select(groups, filters, params, MAX_ROWS, flat=True)
        rows = self._all(self.dialect.search.substring_page(sql, True, NEWEST, context=context), params)
        first = next((t for positives, _neg in groups for t in positives), "")
        for row in rows:
            row["snippet"] = _stale_snippet(row["content"], first)
        return self._finish(rows, [first] if first else [], context=context)

    def _marks(self, groups: Groups, *, delegated: bool, gap: bool) -> Marks | None:
        """What a substring route reads before it can choose its plan, in one statement.

        The newest id and the bigram index's high-water mark (the plan's cost and the
        indexed range), the counts of the query's pairs not cached for the mark last
        seen (:func:`cjk_bigram.missing_pairs`), the FTS5 backfill markers (for
        :meth:`_rebuild_gap`) and, with ``delegated``, the sessions that may be
        sub-agent transcripts (decided in Python: PostgreSQL 15 has no safe JSON test).
        None when there is nothing to read.
        """
        grams = [sorted({g for t in positives for g in cjk_pairs.term_bigrams(t)}) for positives, _neg in groups]
        indexed = bool(groups) and all(grams) and self.has_table(cjk_pairs.TABLE)
        if not (indexed or delegated or gap):
            return None
        missing = cjk_bigram.missing_pairs(self.conn, grams) if indexed else []
        found = self.conn.execute(self._sql(marks_sql(indexed, len(missing), delegated, gap)), {
            **MARKS_PARAMS, **{f"pc{i}": g for i, g in enumerate(missing)},
        }).fetchall()
        marks = Marks(grams if indexed else None)
        for kind, name, number, value in found:
            if kind == 0:
                marks.total, marks.high_water = int(number or 0), cjk_pairs.parse_high_water(value)
            elif kind == 1:
                marks.counts[name] = int(number)
            elif kind == 2:
                marks.delegated.append((name, value))
            else:
                marks.gap[name] = value
        if indexed:
            marks.counts.update({g: 0 for g in missing if g not in marks.counts})
            self._keep_marks(marks)
        return marks

    def _marks_seen(self, groups: Groups) -> Marks | None:
        """Marks for a plan whose page reads them itself (:attr:`Marks.held`): the newest id
        and high-water mark this engine last saw, when every pair count the plan choice
        needs is cached too; None when they must be read first (:meth:`_marks`)."""
        grams = [sorted({g for t in positives for g in cjk_pairs.term_bigrams(t)}) for positives, _neg in groups]
        indexed = bool(groups) and all(grams) and self.has_table(cjk_pairs.TABLE)
        marks = Marks(grams if indexed else None)
        marks.held = True
        if indexed:
            seen = _MARKS_SEEN.get(self.conn.engine, {}).get(self.schema)
            if seen is None or cjk_bigram.missing_pairs(self.conn, grams):
                return None
            marks.total, marks.high_water = seen
        return marks

    def _keep_marks(self, marks: Marks) -> None:
        """Remember the newest id and high-water mark read, for :meth:`_marks_seen`."""
        _MARKS_SEEN.setdefault(self.conn.engine, {})[self.schema] = (marks.total, marks.high_water)

    def _cjk_sessions(self, params: dict[str, Any], marks: Marks | None) -> str:
        """The dialect's CJK session condition; sub-agent candidates already read by
        :meth:`_marks` are handed over, so the dialect reads none itself."""
        if marks is not None and marks.held:
            # Rows of sessions that may be sub-agents' are held back (the page reads those sessions).
            hold_back: str = self.dialect.search.hold_back
            return self.dialect.cjk_sessions(self.conn, params, self.object_sql, ()) + hold_back
        candidates = marks.delegated if marks is not None and self.dialect.cjk_by_substring else None
        return self.dialect.cjk_sessions(self.conn, params, self.object_sql, candidates)

    def _word_page(self, join_sessions: bool, where: str, params: dict[str, Any], order: Order,
                   runs: latin_in_cjk.RunsSQL | None = None, ranked: bool = True,
                   near: bool = False, *, context: bool = True) -> list[dict[str, Any]]:
        """The word route of a dialect whose index cuts no snippets, in one statement:
        the ranked page, its sessions, the texts a snippet is cut from, and each hit's
        context (:meth:`~hermes_store.dialects.search_pg.PgSearchRoutes.word_page`).

        With ``runs`` (terms inside CJK runs) the same statement adds the lookup's rows;
        by rank (``ranked``) only when the word hits do not fill the page. Rows in
        sessions that may be sub-agent transcripts are held back and those sessions
        returned with the page; only when one of them turns out not to be one (its JSON
        read here, as for the CJK routes) is the page read once more, knowing which are.
        """
        routes = self.dialect.search
        if runs is None:
            return self._all(routes.word_page(join_sessions, where, order, near=near, context=context), params)
        exact = False
        while True:
            sql = routes.word_page_with_runs(runs, join_sessions, where, order, ranked=ranked, exact=exact,
                                             context=context)
            found = self._all(sql, params)  # at least the probe's row, even for an empty page
            probe = [(sid, config) for sid, config in found[0]["rx_probe"] or []] if found else []
            for row in found:
                del row["rx_probe"]
            rows = [r for r in found if r["id"] is not None]
            if exact or not probe:
                return rows
            delegated = self.dialect.delegated_sessions(self.conn, probe)
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
        ``values``: the markers (read by :meth:`_marks`, or with ``GAP_SQL``).
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
        routes = self.dialect.search
        rows = self._all(routes.rebuild_gap(routes.like([(terms, negatives)], gap), filters), gap)
        seen = {r["id"] for r in found}
        return [r for r in rows if r["id"] not in seen]

    def _index_hits(
        self, index: str, filters: str, params: dict[str, Any], sort: str | None,
        exclude: str = "", context: bool = True, runs: latin_in_cjk.RunsSQL | None = None, *, wanted: bool = True,
    ) -> list[dict[str, Any]]:
        """The first ``offset + limit`` hits of an FTS5 index, in the requested order.

        Unfiltered, rank-ordered searches let FTS5 rank, cut and snippet the page
        first and join only that; otherwise every hit is joined for the filters and
        sorted by SQLite. ``exclude`` (conditions on ``m``/``s``) drops rows the
        caller answers another way; the ranked page is then widened until it holds
        ``window`` kept rows or the index has no more hits. With ``context`` the first
        ranked page comes with each row's context (the trigram route, which often
        widens and merges, asks for it once its page is known); ``wanted``: the caller
        wants context at all (``fields``).

        ``runs`` (word queries: terms inside CJK runs) adds the rows of that lookup, in
        the same statement: by time among the hits; by rank after them, so only when
        the hits do not fill the window (the ranked page read first says so).
        """
        routes = self.dialect.search
        run_rows = routes.run_rows(runs, filters, exclude)
        if filters or sort is not None:
            order = time_order(sort, routes.rank_order)
            return self._all(routes.ranked(index, filters, exclude, order, run_rows,
                                           by_time=sort in ("newest", "oldest"), context=wanted), params)
        window = params["window"]
        fetch = window
        while True:
            top = self.conn.execute(self._sql(routes.top(index)), {**params, "window": fetch}).fetchall()
            if not top:
                if not run_rows:
                    return []
                return self._all(routes.runs_only(run_rows, context=context and wanted, keep_order=context), params)
            ranks = {mid: rank for mid, rank, _snippet in top}
            snippets = {mid: snippet for mid, _rank, snippet in top}
            rows: list[dict[str, Any]] = []
            for start in range(0, len(top), 500):
                chunk = top[start:start + 500]
                ids: dict[str, Any] = {f"h{i}": mid for i, (mid, _r, _s) in enumerate(chunk)}
                # Every hit is read and the window is not full: the lookup's rows
                # (newest first) come with the last of them.
                last = bool(run_rows) and len(top) < fetch and start + 500 >= len(top)
                # Context with the first page only: a widened one holds rows no page shows
                # (the few shown get theirs in _finish).
                sql = routes.chunk(ids, exclude, run_rows if last else "",
                                   context=context and wanted and fetch == window)
                rows += self._all(sql, {**params, **ids} if last else ids)
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
        sort: str | None, calls_by_like: bool = False, *, context: bool = True,
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
        routes = self.dialect.search
        groups = trigram_groups(plan.match)
        tool_sql, flat = self._substring_select(groups, routes.tool_rows_kind(calls_by_like) + filters, params, window,
                                                flat=True, marks=self._marks(groups, delegated=False, gap=False))
        order = OLDEST if sort == "oldest" else NEWEST
        tools = self._all(routes.substring_page(tool_sql, flat, order, context=context, limit=":window",
                                                offset=False), params)
        if sort is None:
            merged = ranked + tools
        else:
            merged = sorted(ranked + tools, key=lambda r: (r["timestamp"], r["id"]), reverse=sort != "oldest")
        return merged[params["offset"]:window]

    def _substring_select(
        self, groups: Groups, filters: str, params: dict[str, Any], window: int, *, flat: bool,
        ascii_case: bool = False, marks: Marks | None = None,
    ) -> tuple[str, bool]:
        """A SELECT of substring hits; uses the CJK bigram index when it beats a scan.

        Returns (sql, is_flat). A flat query is a single scan that SQLite can walk in
        timestamp order and stop early (good for common terms); the indexed form reads
        candidate blocks plus the rows the index does not cover yet (good for rare ones).
        ``marks`` (:meth:`_marks`) says whether the index applies, and its state. The
        statements are the dialect's (``Dialect.search``); the choice, which reads the
        pairs' block counts, is made here.
        """
        routes = self.dialect.search
        like = routes.like(groups, params, ascii_case=ascii_case)
        scan = routes.substring_scan(like, filters)
        # A row of a group holds every positive term, so any of their pairs narrow it;
        # NOT-ed units narrow nothing. A group without pairs means a full scan.
        if marks is None or marks.grams is None:
            return scan, flat
        grams = marks.grams
        total, params["bg_hw"] = marks.total, marks.high_water
        params["bg_block"] = cjk_pairs.BLOCK
        cand = cjk_pairs.candidate_blocks_sql(grams, params)
        if flat:
            blocks = cjk_bigram.estimate_blocks(self.conn, grams, mark=params["bg_hw"], counts=marks.counts)
            if _walk_is_cheaper(blocks * cjk_pairs.BLOCK, params["bg_hw"], total, window):
                # The walk keeps the blocks as a prefilter: a row the index covers is
                # tested with LIKE only when its block can hold the term.
                return scan + routes.block_prefilter(cand), True
        return routes.substring_blocks(like, filters, cand), False

    def _finish(
        self, rows: list[dict[str, Any]], terms: Sequence[str], words: word_hits.WordQuery | None = None,
        run_terms: Sequence[latin_in_cjk.Term] = (), *, context: bool = True,
    ) -> list[SearchHit]:
        """Snippets the index did not give (substring hits; PostgreSQL word hits, marked
        by their folded ``words``; rows found with ``run_terms`` inside CJK runs) and
        each hit's context (read with the page, or here for the rows that came without
        it, when ``context`` is wanted)."""
        if not rows:
            return []
        missing = [r["id"] for r in rows if CONTEXT_KEY not in r]
        found_context = self._context(missing) if missing and context else {}
        hits: list[SearchHit] = []
        for r in rows:
            rank = r.pop("rank", None)
            content, tool_calls = r.pop("content"), r.pop("tool_calls")
            if r["snippet"] is None:
                found = (content, r["tool_name"], tool_calls)
                if run_terms and rank == latin_in_cjk.RUN_RANK:
                    r["snippet"] = latin_in_cjk.snippet(found, run_terms, SNIPPET_RADIUS)
                else:
                    r["snippet"] = word_hits.snippet(found, words) if words else _substring_snippet(found, terms)
            if CONTEXT_KEY in r:
                prev_id, prev_role, prev_content = r.pop("p_id"), r.pop("p_role"), r.pop("p_content")
                next_id, next_role, next_content = r.pop("n_id"), r.pop("n_role"), r.pop("n_content")
                ctx = [] if prev_id is None else [{"role": prev_role, "content": _cut(prev_content)}]
                ctx.append({"role": r["role"], "content": _cut(content)})
                if next_id is not None:
                    ctx.append({"role": next_role, "content": _cut(next_content)})
                r["context"] = ctx
            else:
                r["context"] = found_context.get(r["id"], [])
            hits.append(r)  # type: ignore[arg-type]
        return hits

    def _context(self, ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """Previous message, the hit, next message (same session, by timestamp then id),
        for hits that came without it (merged from two statements), in one statement."""
        rows = self.conn.execute(CONTEXT_SQL.on(self.conn), {"ids": ids}).fetchall()
        out: dict[int, list[dict[str, Any]]] = {}
        for hid, _pos, role, content in rows:
            out.setdefault(hid, []).append({"role": role, "content": _cut(content)})
        return out


class Marks:
    """What :meth:`SearchRepository._marks` read (see there)."""

    __slots__ = ("counts", "delegated", "gap", "grams", "held", "high_water", "total")

    def __init__(self, grams: list[list[str]] | None) -> None:
        #: The query's pairs per group, or None when the bigram index cannot help.
        self.grams = grams
        self.total = 0
        self.high_water = -1
        self.counts: dict[str, int] = {}
        self.delegated: list[tuple[str, Any]] = []
        self.gap: dict[str, Any] = {}
        #: Read by the page itself (:meth:`SearchRepository._marks_seen`): ``total`` and
        #: ``high_water`` are the ones last seen, the sub-agent candidates held back.
        self.held = False


#: Per engine, then per tenant schema: the search index was seen not stale (Hermes v26
#: fail-open). Only that answer is kept; a stale one is asked again on every search.
_FRESH: weakref.WeakKeyDictionary[Any, set[str | None]] = weakref.WeakKeyDictionary()


#: Per engine, then per tenant schema: the newest id and bigram high-water mark last read
#: (``(total, high_water)``), which choose the next substring plan
#: (:meth:`SearchRepository._marks_seen`); the page reads them again.
_MARKS_SEEN: weakref.WeakKeyDictionary[Any, dict[str | None, tuple[int, int]]] = weakref.WeakKeyDictionary()


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
    # A projection keeps the fields asked for, in ``wanted``'s order: typed as the record
    # it is cut from (the caller named the keys it will read), not as every key present.
    rows: list[Mapping[str, object]] = list(hits)
    return [cast(SearchHit, {k: h[k] for k in wanted if k in h}) for h in rows]


def _walk_is_cheaper(candidates: int, high_water: int, total: int, window: int) -> bool:
    """Whether a newest-first walk of every row (stopping once ``window`` hits are found)
    reads fewer rows than the candidate blocks plus the tail above the high-water mark.

    ``candidates``: rows of the blocks that may hold the terms, up to ``high_water``; the
    tail (``total - high_water`` rows, appended since the last catch-up) is read by its
    primary-key range. The walk expects hits at the candidates' density over the whole
    table: a term the index covers nowhere is not expected in the tail either, so the
    tail alone is read, never every message (counting the tail as hits made a rare term
    walk the whole table). With nothing indexed there is no density to go by: walk.
    """
    covered = max(high_water, 0)
    tail = max(total - covered, 0)
    if covered == 0:
        return True
    hits = candidates * total / covered
    walked = max(window, 1) * total / hits if hits else float("inf")
    return walked < candidates + tail


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
