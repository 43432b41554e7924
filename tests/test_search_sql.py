"""``SearchRepository.search_sql``: the page statement of a search, built by the
dialect's route builders and handed back unrun (issue 31 point 2), and the builders'
orders placed on an alias without rewriting SQL."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.sql.elements import TextClause

from hermes_store import SessionDB
from hermes_store.dialects import search_fts5, search_pg
from hermes_store.dialects.search_base import NEWEST, OLDEST, statement, with_context
from hermes_store.repositories import SearchRepository

pytestmark = pytest.mark.both_backends


@pytest.fixture
def store(db: SessionDB) -> SessionDB:
    db.create_session("a", "cli")
    db.create_session("b", "telegram")
    for i in range(6):
        db.append_message("a" if i % 2 else "b", "user", f"deploy the otter {i} 数据 今天讨论数据库")
    db.append_message("a", "assistant", "nothing to see")
    return db


def _run(db: SessionDB, **kw: Any) -> tuple[TextClause | None, list[Any], list[int]]:
    """(statement, its row ids when run, search_messages' hit ids) on one connection."""
    with db.engine.connect() as conn:
        repo = SearchRepository(conn)
        stmt = repo.search_sql(**kw)
        rows = [] if stmt is None else [r._mapping["id"] for r in conn.execute(stmt)]
        hits = [h["id"] for h in repo.search_messages(**kw)]
    return stmt, rows, hits


@pytest.mark.parametrize("kw", [
    {"query": "数据"},  # short CJK: substring, one page statement on both backends
    {"query": "数据", "sort": "oldest", "limit": 2, "offset": 1},
    {"query": "otter", "source_filter": "cli"},  # word route with a filter: one statement on both
    {"query": "otter", "sort": "newest", "fields": ["id", "snippet"]},
])
def test_search_sql_is_the_page_search_messages_reads(store: SessionDB, kw: dict[str, Any]) -> None:
    stmt, rows, hits = _run(store, **kw)
    assert isinstance(stmt, TextClause)
    assert hits and rows == hits  # the same rows, in the same order


def test_search_sql_without_a_query_is_none(store: SessionDB) -> None:
    with store.engine.connect() as conn:
        repo = SearchRepository(conn)
        assert repo.search_sql("   ") is None
        assert repo.search_sql('"" NOT') is None
        assert repo.search_sql(123) is None  # type: ignore[arg-type]


def test_context_follows_fields_explicitly(store: SessionDB) -> None:
    """No state kept between calls: a search without context leaves the next one's alone."""
    with store.engine.connect() as conn:
        repo = SearchRepository(conn)
        bare = repo.search_messages("otter", fields=["id"])
        full = repo.search_messages("otter")
        assert bare and all(set(h) == {"id"} for h in bare)
        assert all(h["context"] for h in full)
        assert "p_id" not in str(repo.search_sql("数据", fields=["id"]))
        assert "p_id" in str(repo.search_sql("数据"))


def test_orders_are_placed_on_an_alias_not_rewritten() -> None:
    assert search_fts5.RANK.on("m", "h") == "h.rank, m.timestamp DESC, m.id DESC"
    assert search_fts5.RANK.on("u") == "u.rank, u.timestamp DESC, u.id DESC"
    assert search_pg.RANK.on("x") == "rank, x.timestamp DESC, x.id DESC"  # the page's output column stays bare
    assert OLDEST.on("h") == "h.timestamp ASC, h.id ASC"
    page = "SELECT 1"
    wrapped = with_context(page, NEWEST, context=False)
    assert wrapped == "SELECT * FROM (SELECT 1) h ORDER BY h.timestamp DESC, h.id DESC"
    assert with_context(page, None, context=False) == page
    assert " ORDER BY h.timestamp DESC, h.id DESC" in with_context(page, NEWEST, context=True)


def test_statement_binds_only_the_values_it_names() -> None:
    clause = statement("SELECT id FROM {messages} WHERE id > :lo", None, {"lo": 3, "unused": 1})
    assert set(clause._bindparams) == {"lo"}
    assert clause._bindparams["lo"].value == 3
