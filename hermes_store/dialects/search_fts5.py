"""Search statements of SQLite's FTS5 indexes (word and trigram): ``SQLiteDialect.search``.

FTS5 ranks, cuts and snippets inside the index: an unfiltered search by rank asks it
for the best ``:window`` hits first (:meth:`Fts5SearchRoutes.top`) and joins only those
(:meth:`~Fts5SearchRoutes.chunk`); a filtered or time-ordered one joins every hit for
the filters (:meth:`~Fts5SearchRoutes.ranked`). Pure builders, as every route's
(:mod:`.search_base`).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..search import latin_in_cjk
from ..search.fts import fts5 as fts5_statements
from .search_base import NEWEST, PAGE_COLUMNS, Order, SearchRoutes, with_context

#: FTS5's own order: its rank (bm25, lower is better) on the hit, then newest first.
RANK = Order((("hit", "rank", ""), ("row", "timestamp", "DESC"), ("row", "id", "DESC")))


class Fts5SearchRoutes(SearchRoutes):
    """The word and trigram routes through FTS5 virtual tables."""

    caseless_like = "LIKE"
    folds_non_ascii = False
    rowid_walk_hint = " NOT INDEXED"
    #: The order of a search by rank.
    rank_order = RANK

    def match(self, index: str) -> str:
        """Hits of ``:q`` in ``index`` with a best-column snippet and a bm25 rank."""
        return fts5_statements.match_sql(index)

    def top(self, index: str) -> str:
        """The ``:window`` best-ranked hits of ``:q`` as (rowid, rank, snippet)."""
        return fts5_statements.top_sql(index)

    @staticmethod
    def run_rows(runs: latin_in_cjk.RunsSQL | None, filters: str, exclude: str) -> str:
        """The rows of a word query's terms inside CJK runs (:mod:`hermes_store.search.
        latin_in_cjk`), ranked after every hit; '' without such a lookup."""
        if runs is None:
            return ""
        return (
            f"SELECT {PAGE_COLUMNS.format(snippet='NULL', rank=latin_in_cjk.RUN_RANK_SQL)} FROM {runs.source} "
            f"WHERE {runs.where}{filters}{exclude}{runs.sessions}"
        )

    def ranked(self, index: str, filters: str, exclude: str, order: Order, run_rows: str, *,
               by_time: bool, context: bool) -> str:
        """The first ``:window`` hits of ``index`` with every hit joined for the filters,
        in ``order``. With ``run_rows`` (:meth:`run_rows`) those rows are merged in the
        same statement: by time among the hits; by rank after them, so only when the
        hits do not fill the window (a guard counts them). Each side is cut to the
        window first: FTS5 then cuts snippets for the page only."""
        hits = (
            f"SELECT {PAGE_COLUMNS.format(snippet='h.snippet', rank='h.rank')} "
            f"FROM ({self.match(index)}) h JOIN {{messages}} m ON m.id = h.id "
            f"JOIN {{sessions}} s ON s.id = m.session_id WHERE 1=1{filters}{exclude}"
        )
        ordering = order.on("m", "h")
        if not run_rows:
            return with_context(f"{hits} ORDER BY {ordering} LIMIT :window", order, context=context)
        guard = "" if by_time else f" AND (SELECT count(*) FROM ({hits} LIMIT :window)) < :window"
        runs_order = order if by_time else NEWEST
        merged = (
            f"SELECT * FROM (SELECT * FROM ({hits} ORDER BY {ordering} LIMIT :window) UNION ALL SELECT * FROM"
            f" ({run_rows}{guard} ORDER BY {runs_order.on('m')} LIMIT :window)) u"
            f" ORDER BY {order.on('u')} LIMIT :window"
        )
        return with_context(merged, order, context=context)

    @staticmethod
    def runs_only(run_rows: str, *, context: bool, keep_order: bool) -> str:
        """The lookup's rows alone (the index found no hit), newest first. ``keep_order``
        without ``context``: the page wrapped in its order all the same."""
        page = f"SELECT * FROM ({run_rows}) u ORDER BY {NEWEST.on('u')} LIMIT :window"
        return with_context(page, NEWEST, context=context) if keep_order else page

    @staticmethod
    def chunk(names: Iterable[str], exclude: str, run_rows: str, *, context: bool) -> str:
        """The page rows of hits bound as ``names`` (ids :meth:`top` returned), with
        ``exclude`` applied; ``run_rows`` (newest first) follow when given: the last
        chunk, when every hit is read and the window is not full."""
        sql = (
            f"SELECT {PAGE_COLUMNS.format(snippet='NULL', rank='0.0')} FROM {{messages}} m "
            f"JOIN {{sessions}} s ON s.id = m.session_id WHERE m.id IN ({', '.join(':' + k for k in names)}){exclude}"
        )
        if run_rows:
            sql += f" UNION ALL SELECT * FROM ({run_rows} ORDER BY {NEWEST.on('m')} LIMIT :window)"
        return with_context(sql, None, context=context)


ROUTES = Fts5SearchRoutes()
