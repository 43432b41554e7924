"""Lineage: one recursive statement per question, cycle-safe (Hermes v23 compression rules)."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import event

from hermes_store import SessionDB, UnitOfWork

from .factories import insert_sessions, set_times

pytestmark = [pytest.mark.both_backends, pytest.mark.on_citus]


def _chain(db: SessionDB, n: int, reason: str = "compression") -> list[str]:
    ids = [f"c{i:04d}" for i in range(n)]
    rows = [
        {"id": sid, "source": "cli", "started_at": 1000.0 + i, "ended_at": 1000.5 + i if i < n - 1 else None,
         "end_reason": reason if i < n - 1 else None, "parent_session_id": ids[i - 1] if i else None}
        for i, sid in enumerate(ids)
    ]
    insert_sessions(db, rows)
    return ids


def _cycle(db: SessionDB, end_reason: str | None = "compression") -> None:
    """x → z, y → x, z → y: a corrupt parent cycle (rows first, links afterwards)."""
    insert_sessions(
        db,
        [{"id": sid, "source": "cli", "started_at": 1.0, "ended_at": 1.0 if end_reason else None,
          "end_reason": end_reason} for sid in ("x", "y", "z")],
        parents={"x": "z", "y": "x", "z": "y"},
    )


def count_statements(engine):
    statements: list[str] = []

    def _count(conn, cursor, statement, *a):
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", _count)
    return statements, lambda: event.remove(engine, "before_cursor_execute", _count)


def test_thousand_deep_lineage_in_one_statement(db: SessionDB) -> None:
    ids = _chain(db, 1000)
    statements, stop = count_statements(db.engine)
    with UnitOfWork(db.engine, write=False) as uow:
        statements.clear()
        assert uow.lineage.ancestors(ids[-1]) == ids
        assert len(statements) == 1
        statements.clear()
        assert uow.lineage.descendants(ids[0]) == ids[1:]
        assert len(statements) == 1
        statements.clear()
        assert uow.lineage.compression_tip(ids[0]) == ids[-1]
        assert len(statements) == 1
        statements.clear()
        assert uow.lineage.chain(ids[500]) == ids
        assert len(statements) == 1
        statements.clear()
        assert uow.lineage.compression_lineage(ids[500]) == ids
        assert len(statements) == 1
        statements.clear()
        assert uow.lineage.resume_target(ids[0]) == ids[-1]
        assert len(statements) == 1
        statements.clear()
        assert uow.lineage.conversation_root(ids[-1]) == ids[0]
        assert len(statements) == 1
    stop()


def test_tip_and_resume_target(db: SessionDB) -> None:
    ids = _chain(db, 4)
    assert db.get_compression_tip(ids[1]) == ids[3]
    # v23: a resume jumps to the tip first, then looks below it for messages.
    assert db.resolve_resume_session_id(ids[0]) == ids[3]  # nobody holds messages
    # An import's row: no append lands in a session closed by compression (v26).
    db.append_messages([{"session_id": ids[2], "role": "user", "content": "in the middle"}])
    assert db.resolve_resume_session_id(ids[0]) == ids[3]  # the middle is above the tip
    db.create_session("below", "cli", parent_session_id=ids[3])
    db.append_message("below", "user", "after the tip")
    assert db.resolve_resume_session_id(ids[0]) == "below"
    assert db.resolve_resume_session_id("") == ""
    assert db.get_compression_tip("") == ""
    assert db.get_compression_tip("unknown") == "unknown"  # v23: unknown ids come back as given


def test_compression_children_need_no_timestamp_but_other_children_never_continue(db: SessionDB) -> None:
    db.create_session("p", "cli")
    set_times(db, "p", started_at=1.0, ended_at=2.0, end_reason="compression")
    db.create_session("early", "cli", parent_session_id="p")
    set_times(db, "early", started_at=1.5)  # started before the parent ended: still a continuation (v23)
    assert db.get_compression_tip("p") == "early"
    db.create_session("q", "cli")
    set_times(db, "q", started_at=1.0, ended_at=2.0, end_reason="branched")
    db.create_session("b", "cli", parent_session_id="q")
    assert db.get_compression_tip("q") == "q"


def test_cycles_terminate(db: SessionDB) -> None:
    _cycle(db)
    with UnitOfWork(db.engine, write=False) as uow:
        assert set(uow.lineage.ancestors("x")) == {"x", "y", "z"}
        assert set(uow.lineage.descendants("x")) == {"y", "z"}
        assert uow.lineage.compression_tip("x") == "z"  # x → y → z, then x again: stop
        assert uow.lineage.chain("x") == ["y", "z", "x"]  # each id once
        assert uow.lineage.conversation_root("x") == "y"
        assert sorted(uow.lineage.compression_lineage("x")) == ["x", "y", "z"]
        assert set(uow.lineage.compression_tips(["x", "y", "z"])) <= {"x", "y", "z"}  # terminates


# ---------------------------------------------------------------- ancestors through SessionDB


def test_get_session_ancestors_root_first_ending_with_itself(db: SessionDB) -> None:
    db.create_session("root", "cli")
    db.create_session("mid", "cli", parent_session_id="root")
    db.create_session("tip", "cli", parent_session_id="mid")
    db.create_session("sibling", "cli", parent_session_id="root")
    assert db.get_session_ancestors("tip") == ["root", "mid", "tip"]
    assert db.get_session_ancestors("mid") == ["root", "mid"]  # never walks down
    assert db.get_session_ancestors("sibling") == ["root", "sibling"]  # only its own branch
    assert db.get_session_ancestors("root") == ["root"]
    assert db.get_session_ancestors("unknown") == []
    with UnitOfWork(db.engine, write=False) as uow:
        assert uow.lineage.ancestors("tip", include_self=False) == ["root", "mid"]
        assert uow.lineage.ancestors("root", include_self=False) == []


def test_get_session_ancestors_of_a_deep_chain(db: SessionDB) -> None:
    ids = _chain(db, 1000, reason="branched")  # any parent link counts, not only compression
    assert db.get_session_ancestors(ids[-1]) == ids
    assert db.get_session_ancestors(ids[10]) == ids[:11]


@pytest.mark.sqlite_only
def test_get_session_ancestors_stops_at_a_missing_parent(db: SessionDB) -> None:
    """Hermes files may hold a parent id whose row was deleted (foreign keys off there)."""
    raw = sqlite3.connect(db.db_path, isolation_level=None)
    raw.execute("PRAGMA foreign_keys = OFF")
    raw.execute("INSERT INTO sessions (id, source, started_at, parent_session_id) VALUES ('orphan', 'cli', 1, 'gone')")
    raw.close()
    assert db.get_session_ancestors("orphan") == ["orphan"]


def test_get_session_ancestors_in_a_cycle_lists_each_once(db: SessionDB) -> None:
    _cycle(db, end_reason=None)
    assert db.get_session_ancestors("x") == ["y", "z", "x"]  # nearest last, each id once
    assert db.get_session_ancestors("y") == ["z", "x", "y"]
