"""Statements per search, pinned per route on both backends (issue 19, item 2).

Counted at the repository, on a connection of its own in autocommit, so the figure is
what the search itself sends, whatever transaction wrapper a caller puts around it
(the facade's BEGIN/ROLLBACK, or none): the bench's own meter (``tests/statements.py``)
counts it. Every count is for a warm engine (column lists, view text, pair counts
cached), as a long-running process sees it; a regression shows as a failure here.

What each route needs (PostgreSQL / SQLite):

* word search: 1 / 2. PostgreSQL cuts page, sessions, snippet texts and context in one
  statement; SQLite's FTS5 ranks and snippets inside the index first, then one
  statement joins the page, its sessions and context;
* word search with a source filter: 1 / 1 (FTS5 joins every hit for the filter);
* a short page (fewer hits than the limit): SQLite reads FTS5's backfill markers once
  more (+1, Hermes v23's supplement); PostgreSQL's index has no backfill window (+0);
* CJK 2-char (both backends) and CJK 3+ on PostgreSQL, by substring: 1 / 2. SQLite's
  first reads what the plan choice needs (newest id, bigram high-water mark, pair counts
  not cached, backfill markers); the second is page and context. PostgreSQL reads those
  marks (and the sessions that may be sub-agents', whose rows the page holds back) with
  the page, its plan chosen from the marks its last search saw;
* CJK 3+ on SQLite's trigram index with a full page: 3 (ranked page, its sessions, then
  context: this route often widens its page and merges tool rows, so context waits
  until the page is known);
* a word term found inside a CJK run only (``A2A`` in "讨论A2A通信", issue 21 point 7):
  no statement of its own. PostgreSQL reads the lookup with the word page (1); SQLite
  as any short word page (3: ranked hits, then page and lookup with context, then the
  backfill markers), or 2 with a source filter (the one filtered statement holds the
  lookup, then the markers).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Iterator

import pytest

from hermes_store import SessionDB
from hermes_store.engine import create_engine
from hermes_store.repositories import SearchRepository

from .statements import meter

pytestmark = pytest.mark.both_backends


@pytest.fixture
def store(db: SessionDB) -> SessionDB:
    """A corpus with full pages for every route and a caught-up bigram index."""
    db.create_session("a", "cli")
    db.create_session("b", "tui")
    rows: list[dict[str, Any]] = []
    for i in range(60):
        sid = "a" if i % 2 else "b"
        rows.append({"session_id": sid, "role": "user", "content": f"please deploy build {i} 数据库迁移 now"})
        rows.append({"session_id": sid, "role": "assistant", "content": f"deploying {i}: 数据 ok"})
    rows.append({"session_id": "a", "role": "user", "content": "a rare zebracorn appears"})
    rows.append({"session_id": "b", "role": "user", "content": "今天讨论A2A通信协议"})
    db.append_messages(rows)
    db.index_search()
    return db


@pytest.fixture
def engine(store: SessionDB) -> Iterator[Any]:
    eng = create_engine(store.engine.url)
    yield eng
    eng.dispose()


def statements(engine: Any, query: str, **kw: Any) -> tuple[int, list[Any]]:
    """(statements, hits) of one warm search on an autocommit connection."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        repo = SearchRepository(conn)
        repo.search_messages(query, **kw)  # warm: schema caches, pair counts
        m = meter.EngineMeter(engine, lambda: [conn])  # SQLite: trace the connection held here
        m.start()
        try:
            hits = repo.search_messages(query, **kw)
        finally:
            m.stop()
    return m.count, hits


def test_word_search(engine: Any, backend: str) -> None:
    count, hits = statements(engine, "deploy")
    assert len(hits) == 20 and all(len(h["context"]) >= 2 for h in hits)
    assert count == {"postgresql": 1, "sqlite": 2}[backend]


def test_word_search_short_page(engine: Any, backend: str) -> None:
    count, hits = statements(engine, "zebracorn")
    assert len(hits) == 1 and ">>>zebracorn<<<" in hits[0]["snippet"]
    assert count == {"postgresql": 1, "sqlite": 3}[backend]


def test_word_search_with_source_filter(engine: Any, backend: str) -> None:
    count, hits = statements(engine, "deploy", source_filter=["cli"])
    assert len(hits) == 20 and {h["source"] for h in hits} == {"cli"}
    assert count == {"postgresql": 1, "sqlite": 1}[backend]


def test_cjk_two_characters(engine: Any, backend: str) -> None:
    count, hits = statements(engine, "数据")
    assert len(hits) == 20 and all("数据" in h["snippet"] for h in hits)
    assert count == {"postgresql": 1, "sqlite": 2}[backend]


def test_cjk_two_characters_with_source_filter(engine: Any, backend: str) -> None:
    count, hits = statements(engine, "迁移", exclude_sources=["cli"])
    assert len(hits) == 20 and {h["source"] for h in hits} == {"tui"}
    assert count == {"postgresql": 1, "sqlite": 2}[backend]


def test_cjk_three_characters(engine: Any, backend: str) -> None:
    count, hits = statements(engine, "数据库")
    assert len(hits) == 20
    assert count == {"postgresql": 1, "sqlite": 3}[backend]


def test_word_term_inside_a_cjk_run(engine: Any, backend: str) -> None:
    count, hits = statements(engine, "A2A")
    assert len(hits) == 1 and hits[0]["snippet"] == "今天讨论>>>A2A<<<通信协议"
    assert count == {"postgresql": 1, "sqlite": 3}[backend]
    count, hits = statements(engine, "A2A", source_filter=["tui"])
    assert len(hits) == 1
    assert count == {"postgresql": 1, "sqlite": 2}[backend]


def test_counts_do_not_depend_on_the_page(engine: Any, backend: str) -> None:
    """Later pages and other orders are the same statements (bound values only)."""
    for kw in ({"offset": 10}, {"sort": "newest"}, {"sort": "oldest", "limit": 5}):
        assert statements(engine, "数据", **kw)[0] == {"postgresql": 1, "sqlite": 2}[backend]
        assert statements(engine, "deploy", source_filter=["tui"], **kw)[0] == 1
