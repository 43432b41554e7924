"""Lineage: one recursive statement per question, cycle-safe."""

from __future__ import annotations

import pytest

import sqlite3

from sqlalchemy import event

from hermes_store import SessionDB, UnitOfWork

from .conftest import set_times


def _chain(db: SessionDB, n: int, reason: str = "compression") -> list[str]:
    ids = [f"c{i:04d}" for i in range(n)]

    def build(conn):
        for i, sid in enumerate(ids):
            conn.execute(
                "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, parent_session_id) "
                "VALUES (?, 'cli', ?, ?, ?, ?)",
                (sid, 1000.0 + i, 1000.5 + i if i < n - 1 else None, reason if i < n - 1 else None,
                 ids[i - 1] if i else None),
            )

    db._execute_write(build)
    return ids


def count_statements(engine):
    statements: list[str] = []

    def _count(conn, cursor, statement, *a):  # noqa: ANN001
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", _count)
    return statements, lambda: event.remove(engine, "before_cursor_execute", _count)


@pytest.mark.sqlite_only
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
    stop()


@pytest.mark.sqlite_only
def test_tip_and_resume_target(db: SessionDB) -> None:
    ids = _chain(db, 4)
    assert db.get_compression_tip(ids[1]) == ids[3]
    assert db.resolve_resume_session_id(ids[0]) == ids[0]  # nobody holds messages
    db.append_message(ids[2], "user", "in the middle")
    assert db.resolve_resume_session_id(ids[0]) == ids[2]
    db.append_message(ids[3], "user", "at the tip")
    assert db.resolve_resume_session_id(ids[0]) == ids[3]
    assert db.resolve_resume_session_id("") == ""
    assert db.get_compression_tip("") == ""
    assert db.get_compression_tip("unknown") is None


def test_non_compression_children_are_not_continuations(db: SessionDB) -> None:
    db.create_session("p", "cli")
    set_times(db, "p", started_at=1.0, ended_at=2.0, end_reason="compression")
    db.create_session("early", "cli", parent_session_id="p")
    set_times(db, "early", started_at=1.5)  # started before the parent ended
    assert db.get_compression_tip("p") == "p"
    db.create_session("q", "cli")
    set_times(db, "q", started_at=1.0, ended_at=2.0, end_reason="branched")
    db.create_session("b", "cli", parent_session_id="q")
    assert db.get_compression_tip("q") == "q"


@pytest.mark.sqlite_only
def test_cycles_terminate(db: SessionDB) -> None:
    def build(conn):
        conn.execute("PRAGMA defer_foreign_keys = ON")  # the cycle is complete at COMMIT
        for sid, parent in (("x", "z"), ("y", "x"), ("z", "y")):
            conn.execute(
                "INSERT INTO sessions (id, source, started_at, ended_at, end_reason, parent_session_id) "
                "VALUES (?, 'cli', 1, 1, 'compression', ?)", (sid, parent),
            )

    db._execute_write(build)
    with UnitOfWork(db.engine, write=False) as uow:
        assert set(uow.lineage.ancestors("x")) == {"x", "y", "z"}
        assert set(uow.lineage.descendants("x")) == {"y", "z"}
        assert uow.lineage.compression_tip("x") in {"x", "y", "z"}


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


@pytest.mark.sqlite_only
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


@pytest.mark.sqlite_only
def test_get_session_ancestors_in_a_cycle_lists_each_once(db: SessionDB) -> None:
    def build(conn):
        conn.execute("PRAGMA defer_foreign_keys = ON")
        for sid, parent in (("x", "z"), ("y", "x"), ("z", "y")):
            conn.execute("INSERT INTO sessions (id, source, started_at, parent_session_id) VALUES (?, 'cli', 1, ?)",
                         (sid, parent))

    db._execute_write(build)
    assert db.get_session_ancestors("x") == ["y", "z", "x"]  # nearest last, each id once
    assert db.get_session_ancestors("y") == ["z", "x", "y"]
