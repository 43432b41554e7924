"""Statements per call of the lineage and listing reads, pinned on both backends.

A lineage walk is one recursive statement; a listing page (its rows, the compression
tips it projects, their previews and prompts) is one statement too, and so is a count.
Counted at the repository (statements sent through SQLAlchemy, so the facade's own
transaction handling never moves the figure) and through SessionDB relative to a
one-statement read (whatever BEGIN/ROLLBACK the facade adds, it adds to both).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import pytest

from hermes_store import SessionDB, UnitOfWork

from .factories import set_times
from .statements import meter, steady

pytestmark = pytest.mark.both_backends

PROMPT = "You are a careful assistant. " * 20


def _session(db: SessionDB, sid: str, started: float, *, parent: str | None = None, said: str | None = None,
             end: str | None = None, **create: Any) -> str:
    if parent is not None:
        create["parent_session_id"] = parent
    db.create_session(sid, "cli", system_prompt=PROMPT, **create)
    if said is not None:
        db.append_message(sid, "user", said)
    set_times(db, sid, started_at=started, ended_at=started + 5 if end else None, end_reason=end)
    return sid


@pytest.fixture
def corpus(db: SessionDB) -> dict[str, str]:
    """Two compression chains (one with a branch and a delegate off it), a plain root,
    a forked chain (two continuations), all with stored prompts and messages."""
    _session(db, "a0", 100.0, said="first chain", end="compression")
    _session(db, "a1", 110.0, parent="a0", said="a1 talk", end="compression")
    _session(db, "a2", 120.0, parent="a1", said="a2 talk")
    _session(db, "a_branch", 115.0, parent="a1", said="branched", model_config={"_branched_from": "a1"})
    _session(db, "a_delegate", 116.0, parent="a1", said="delegated", model_config={"_delegate_from": "a1"})
    _session(db, "b0", 200.0, said="second chain", end="compression")
    _session(db, "b1", 210.0, parent="b0", said="b1 talk", end="compression")
    _session(db, "b2", 220.0, parent="b1", said="b2 talk")
    _session(db, "b2x", 221.0, parent="b1")
    _session(db, "plain", 300.0, said="no chain")
    return {"root": "a0", "tip": "a2", "middle": "a1"}


def repo_statements(db: SessionDB, fn: Callable[[UnitOfWork], Any]) -> tuple[int, Any]:
    """``(statements sent through SQLAlchemy, result)`` of one warm ``fn(uow)`` in a read unit of work."""
    with UnitOfWork(db.engine, write=False) as uow:
        fn(uow)  # warm: the schema lookups are cached per engine
        m = meter.EngineMeter(db.engine)
        m.start()
        try:
            result = fn(uow)
        finally:
            m.stop()
    return m.sa, result


# --------------------------------------------------------------------------- lineage


@pytest.mark.parametrize("walk, expected", [
    (lambda u: u.lineage.ancestors("a2"), ["a0", "a1", "a2"]),
    (lambda u: u.lineage.conversation_root("a2"), "a0"),
    (lambda u: u.lineage.descendants("a1"), ["a_branch", "a_delegate", "a2"]),
    (lambda u: u.lineage.compression_tip("a0"), "a2"),
    (lambda u: u.lineage.resume_target("a0"), "a2"),
    (lambda u: u.lineage.compression_lineage("a1"), ["a0", "a1", "a2"]),  # v26: a delegate of its own parent is a fork, skipped
    (lambda u: u.lineage.chain("a1"), ["a0", "a1", "a2"]),
    (lambda u: u.lineage.compression_tips(["a0", "a2", "b2", "plain"]), {"a2": "a0", "b2": "b0"}),
], ids=["ancestors", "conversation_root", "descendants", "compression_tip", "resume_target",
        "compression_lineage", "chain", "compression_tips"])
def test_each_lineage_walk_is_one_statement(db: SessionDB, corpus: dict[str, str], walk: Any,
                                            expected: Any) -> None:
    sent, result = repo_statements(db, walk)
    assert result == expected
    assert sent == 1


def test_sessiondb_lineage_reads_cost_what_a_one_statement_read_costs(db: SessionDB, corpus: dict[str, str]) -> None:
    one = steady(db, lambda: db.get_session_ancestors("a2"))
    assert steady(db, lambda: db.get_compression_tip("a0")) == one
    assert steady(db, lambda: db.resolve_resume_session_id("a0")) == one
    assert steady(db, lambda: db.get_conversation_root("a2")) == one
    assert steady(db, lambda: db.get_compression_lineage("a1")) == one


# --------------------------------------------------------------------------- listing


def _listed(rows: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(r["id"], r.get("_lineage_root_id")) for r in rows]


@pytest.mark.parametrize("kwargs, expected", [
    ({}, [("plain", None), ("b2", "b0"), ("a_branch", None), ("a2", "a0")]),
    ({"order_by_last_active": True}, None),
    ({"order_by_last_active": True, "id_query": "b0"}, [("b2", "b0")]),
    ({"order_by_last_active": True, "search_query": "a"}, None),
    ({"compact_rows": True}, [("plain", None), ("b2", "b0"), ("a_branch", None), ("a2", "a0")]),
    ({"include_children": True}, None),
    ({"source": ["cli"], "exclude_sources": ["tool"], "min_message_count": 1, "cwd_prefix": "/"}, []),
    ({"limit": 2, "offset": 1}, [("b2", "b0"), ("a_branch", None)]),
], ids=["page", "by_activity", "id_query", "search_query", "compact", "children", "filters", "offset"])
def test_a_listing_page_is_one_statement(db: SessionDB, corpus: dict[str, str], kwargs: dict[str, Any],
                                         expected: Any) -> None:
    sent, rows = repo_statements(db, lambda u: u.listing.list_rich(**kwargs))
    if expected is not None:
        assert _listed(rows) == expected
    assert (rows and all("preview" in r and "last_active" in r for r in rows)) or expected == []
    if not kwargs.get("compact_rows"):
        assert all(r["system_prompt"] == PROMPT for r in rows)  # the stored prompt, resolved in the statement
    assert sent == 1


def test_a_tip_row_comes_with_the_page(db: SessionDB, corpus: dict[str, str]) -> None:
    sent, rows = repo_statements(db, lambda u: u.listing.list_rich())
    tip = next(r for r in rows if r["id"] == "a2")
    assert (tip["_lineage_root_id"], tip["preview"], tip["system_prompt"]) == ("a0", "a2 talk", PROMPT)
    assert sent == 1


def test_a_false_marker_costs_one_more_statement(db: SessionDB, corpus: dict[str, str]) -> None:
    """A child whose model_config mentions the branch marker without carrying it: the
    statement runs again naming it, and the child stays hidden."""
    _session(db, "fake", 400.0, parent="plain")
    db.update_session_meta("fake", '{"note": "_branched_from is a word here"')  # malformed: no marker
    sent, rows = repo_statements(db, lambda u: u.listing.list_rich())
    assert "fake" not in [r["id"] for r in rows]
    assert sent == 2


@pytest.mark.parametrize("kwargs, expected", [
    ({}, 10), ({"exclude_children": True}, 4), ({"exclude_children": True, "source": "cli"}, 4),
    ({"min_message_count": 1, "cwd_prefix": "/nowhere"}, 0),
], ids=["all", "roots", "roots_of_source", "filters"])
def test_session_count_is_one_statement(db: SessionDB, corpus: dict[str, str], kwargs: dict[str, Any],
                                        expected: int) -> None:
    sent, n = repo_statements(db, lambda u: u.listing.count(**kwargs))
    assert n == expected
    assert sent == 1


def test_sessiondb_listing_costs_what_a_one_statement_read_costs(db: SessionDB, corpus: dict[str, str]) -> None:
    one = steady(db, lambda: db.get_session_ancestors("a2"))
    assert steady(db, lambda: db.list_sessions_rich()) == one
    assert steady(db, lambda: db.list_sessions_rich(order_by_last_active=True)) == one
    assert steady(db, lambda: db.session_count(exclude_children=True)) == one
