"""Search statements of PostgreSQL: ``PostgreSQLDialect.search``, and the reads its
word route needs (terms folded by the index's own function, sub-agent sessions).

The word route is one statement (:meth:`PgSearchRoutes.word_page`): the index cuts no
snippets, so nothing is gained by ranking first; page, sessions, snippet texts and
context come together (each hit's neighbours joined LATERAL, as the plain-driver floor
joins them: :func:`.search_base.with_lateral_context`). CJK queries go by substring (the shared routes of
:mod:`.search_base`, with ILIKE over the pg_trgm index). The tsquery is
:mod:`hermes_store.search.postgresql`, the snippets :mod:`hermes_store.search.word_hits`
(both pure).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from collections.abc import Sequence

from ..search import latin_in_cjk
from ..search import postgresql as pg_search
from ..search.delegated import DELEGATED_CANDIDATE, DELEGATED_SQL, delegated_of
from ..search.word_hits import WordQuery
from ..tenant_schema import SchemaSQL
from .search_base import PAGE_COLUMNS, Order, SearchRoutes, with_lateral_context

#: The word route's order (lower rank is better): ``rank`` is the page's output column.
RANK = Order(((None, "rank", ""), ("row", "timestamp", "DESC"), ("row", "id", "DESC")))
_FOLD = SchemaSQL(pg_search.FOLD_SQL)
_DELEGATED = SchemaSQL(DELEGATED_SQL)


def fold_terms(conn: Any, terms: Sequence[str]) -> dict[str, list[str]]:
    """Each term's words, as the word index holds them: ASCII ones cut in Python, the
    others by ``hermes_store_search_words`` itself, in one round trip (at most)."""
    words, ask = pg_search.fold_ascii(terms)
    if ask:
        for term, folded in conn.execute(_FOLD.on(conn), {"terms": ask}):
            words[term] = folded.split() if folded else []
    return words


def word_query(conn: Any, match: str) -> WordQuery:
    """Fold ``match``'s terms (:func:`fold_terms`) and build its tsquery."""
    return pg_search.word_query(match, fold_terms(conn, pg_search.term_texts(match)))


def delegated_sessions(conn: Any, candidates: Sequence[tuple[str, Any]] | None = None) -> list[str]:
    """Sessions that are sub-agent transcripts (:func:`hermes_store.search.delegated.
    delegated_of`), from ``candidates`` when the search's first statement read them,
    else read here."""
    rows = candidates if candidates is not None else conn.execute(_DELEGATED.on(conn)).fetchall()
    return delegated_of(rows)


#: A CJK route's page holds back the rows of every session that may be a sub-agent
#: transcript (:data:`DELEGATED_CANDIDATE`): the page read with its marks
#: (:func:`with_marks`) stands when each such session is one, as it usually is.
HOLD_BACK = f" AND NOT COALESCE(s.{DELEGATED_CANDIDATE}, FALSE)"
#: What :meth:`PgSearchRoutes.with_marks` reads beside the page: the newest id and the
#: bigram index's high-water mark (NULL when the query's plan uses no bigram index),
#: and the ``[id, model_config]`` of the sessions :data:`HOLD_BACK` leaves out.
_MARKS_PROBE = (
    "SELECT {total} AS mk_total, {high_water} AS mk_hw,"
    f" ARRAY(SELECT ARRAY[id, model_config] FROM {{{{sessions}}}} WHERE {DELEGATED_CANDIDATE}) AS mk_dlg"
)


@lru_cache(maxsize=64)
def with_marks(page: str, order: Order, indexed: bool) -> str:
    """A CJK page (built with :data:`HOLD_BACK` and the high-water mark last seen bound as
    ``:bg_hw``) and, in the same statement, what the plan choice read before it
    (``SearchRepository._marks``): at least one row, the page's columns NULL when it is
    empty. The marks come back live, so the caller can tell whether the page stands
    (the mark has not gone down, every session held back is a sub-agent's) and keep them
    for its next search. ``indexed``: the high-water mark is wanted (``:bg_k``)."""
    probe = _MARKS_PROBE.format(
        total="(SELECT max(id) FROM {messages})" if indexed else "NULL",
        high_water="(SELECT value FROM {state_meta} WHERE key = :bg_k)" if indexed else "NULL",
    )
    return f"SELECT x.*, mk.* FROM ({probe}) mk LEFT JOIN ({page}) x ON TRUE ORDER BY {order.on('x')}"


class PgSearchRoutes(SearchRoutes):
    """The word route over ``messages.search_vector``; substring routes with ILIKE."""

    caseless_like = "ILIKE"
    folds_non_ascii = True
    rowid_walk_hint = ""
    rank_order = RANK
    context = staticmethod(with_lateral_context)
    #: The CJK routes' page reads its marks (:func:`with_marks`, :data:`HOLD_BACK`).
    hold_back = HOLD_BACK
    with_marks = staticmethod(with_marks)

    def match(self, index: str) -> str:
        return pg_search.match_sql(index)

    def top(self, index: str) -> str:
        return pg_search.top_sql(index)

    def word_page(self, join_sessions: bool, where: str, order: Order, *, near: bool, context: bool) -> str:
        """One page of word hits (``:limit`` from ``:offset``) with its sessions and
        texts, and context when wanted: the filters (``where``) are applied before the
        page is cut. ``near``: the query holds NEAR (its exact test on the rows found)."""
        return _word_page(join_sessions, where, order, near, context)

    def word_page_with_runs(self, runs: latin_in_cjk.RunsSQL, join_sessions: bool, where: str, order: Order, *,
                            ranked: bool, exact: bool, context: bool) -> str:
        """:meth:`word_page` with the rows of the lookup inside CJK runs in the same
        statement (by rank, only when the word hits do not fill the page: ``ranked``),
        and first a probe row: the sessions of lookup rows held back because they may
        be sub-agent transcripts (``exact``: those known, bound as ``:rx_dlg``)."""
        return _word_page_with_runs(runs, join_sessions, where, order, ranked, exact, context)


def _page(inner: str) -> str:
    """A page of hits (``inner``: id, rank) with their sessions and texts."""
    return (
        f"SELECT {PAGE_COLUMNS.format(snippet='NULL', rank='h.rank')} FROM ({inner}) h "
        "JOIN {messages} m ON m.id = h.id JOIN {sessions} s ON s.id = m.session_id"
    )


# The two statements below are pure functions of their (immutable) arguments: kept for
# the recent shapes, a repeated search builds no SQL text again.
@lru_cache(maxsize=128)
def _word_page(join_sessions: bool, where: str, order: Order, near: bool, context: bool) -> str:
    inner = pg_search.page_sql(join_sessions, where, order.on("m"), near)
    return with_lateral_context(_page(inner), order, context=context)


@lru_cache(maxsize=128)
def _word_page_with_runs(runs: latin_in_cjk.RunsSQL, join_sessions: bool, where: str, order: Order, ranked: bool,
                         exact: bool, context: bool) -> str:
    guard = pg_search.RANK_GUARD if ranked else ""
    inner = _page(pg_search.runs_page_sql(order.on("m")))
    return (
        f"{pg_search.hits_cte(join_sessions, where)}{pg_search.runs_cte(runs, where, guard, exact=exact)}"
        f"SELECT x.*, pr.rx_probe AS rx_probe FROM ({pg_search.RUNS_PROBE}) pr"
        f" LEFT JOIN ({with_lateral_context(inner, order, context=context)}) x ON TRUE ORDER BY {order.on('x')}"
    )


ROUTES = PgSearchRoutes()
