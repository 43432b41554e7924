"""Hermes v26's lifecycle rules through the swapped module: the context manager, the
close checkpoint, the write interval's checkpoint and the class-level write patience."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from hermes_store import errors


class Boom(Exception):
    pass


def test_with_returns_the_same_handle_and_closes_it(hermes_state, tmp_path: Path) -> None:
    store = hermes_state.SessionDB(tmp_path / "state.db")
    with store as entered:
        assert entered is store
        entered.create_session("s", "cli")
    assert store.is_available() is False
    with pytest.raises(errors.StoreClosedError):
        store.get_session("s")


def test_exit_closes_even_when_the_block_raises(hermes_state, tmp_path: Path) -> None:
    store = hermes_state.SessionDB(tmp_path / "state.db")
    with pytest.raises(Boom):  # the block's exception is not swallowed (__exit__ returns False)
        with store:
            store.create_session("s", "cli")
            raise Boom()
    assert store.is_available() is False
    assert store.__exit__(None, None, None) is False
    with hermes_state.SessionDB(tmp_path / "state.db") as again:
        assert again.get_session("s")["id"] == "s"  # the write before the exception is kept


def test_closing_inside_the_block_leaves_exit_clean(hermes_state, tmp_path: Path) -> None:
    with hermes_state.SessionDB(tmp_path / "state.db") as store:
        store.create_session("s", "cli")
        store.close()
        assert store.is_available() is False
    assert store.is_available() is False


def _traced(conn: sqlite3.Connection) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    return seen


def test_close_runs_exactly_one_passive_checkpoint_on_conn(hermes_state, tmp_path: Path) -> None:
    store = hermes_state.SessionDB(tmp_path / "state.db")
    store.create_session("s", "cli")
    seen = _traced(store._conn)
    store.close()
    checkpoints = [s for s in seen if "wal_checkpoint" in s.lower()]
    assert checkpoints == ["PRAGMA wal_checkpoint(PASSIVE)"]
    assert store._raw_conn is None  # _conn closed and cleared, as Hermes' close leaves it


def test_a_failed_close_checkpoint_is_logged_at_debug(hermes_state, tmp_path: Path, caplog) -> None:
    store = hermes_state.SessionDB(tmp_path / "state.db")
    closed: list[bool] = []

    class Failing:
        def execute(self, sql: str, *args):
            raise sqlite3.OperationalError(f"cannot run {sql}")

        def close(self) -> None:
            closed.append(True)

    store._conn = Failing()
    with caplog.at_level(logging.DEBUG, logger="hermes_state"):
        store.close()
    debug = [r for r in caplog.records if "WAL checkpoint (PASSIVE) at close failed" in r.getMessage()]
    assert len(debug) == 1 and debug[0].levelno == logging.DEBUG
    assert closed == [True]
    assert store.is_available() is False


def test_a_read_only_store_closes_without_a_checkpoint(hermes_state, tmp_path: Path) -> None:
    hermes_state.SessionDB(tmp_path / "state.db").close()
    ro = hermes_state.SessionDB(tmp_path / "state.db", read_only=True)
    seen = _traced(ro._conn)
    ro.close()
    assert not [s for s in seen if "checkpoint" in s.lower()]


def test_the_write_interval_checkpoints_through_try_wal_checkpoint(hermes_state, tmp_path: Path) -> None:
    store = hermes_state.SessionDB(tmp_path / "state.db")
    try:
        store.create_session("s", "cli")
        calls: list[int] = []
        store._CHECKPOINT_EVERY_N_WRITES = 3
        store._try_wal_checkpoint = lambda: calls.append(1) or True
        for i in range(9):
            store.append_message("s", "user", f"m{i}")
            assert store.wait_for_upkeep(30)  # a checkpoint still pending would absorb the next one
        assert len(calls) == 3  # writes 3, 6 and 9 (create_session was the first)
    finally:
        del store._try_wal_checkpoint
        store.close()


def test_try_wal_checkpoint_uses_conn_when_it_is_open(hermes_state, tmp_path: Path) -> None:
    store = hermes_state.SessionDB(tmp_path / "state.db")
    try:
        assert store._try_wal_checkpoint() is True  # no _conn yet: one of our connections
        assert store._raw_conn is None
        seen = _traced(store._conn)
        assert store._try_wal_checkpoint() is True
        assert seen == ["PRAGMA wal_checkpoint(PASSIVE)"]
    finally:
        store.close()


def test_the_class_write_patience_bounds_a_locked_write(hermes_state, tmp_path: Path, monkeypatch) -> None:
    """Hermes' tests lower ``SessionDB._WRITE_PATIENCE_S`` on the class; a write behind a
    lock another connection holds then gives up within that patience."""
    path = tmp_path / "state.db"
    store = hermes_state.SessionDB(path)
    store.create_session("s", "cli")
    monkeypatch.setattr(hermes_state.SessionDB, "_WRITE_PATIENCE_S", 0.3)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as info:
            store.set_session_title("s", "blocked")
        assert isinstance(info.value, errors.DatabaseLockedError)
        assert "0.3s" in str(info.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.set_session_title("s", "lands now") is True
    store.close()


def test_optimize_fts_runs_on_conn_when_it_is_open(hermes_state, tmp_path: Path) -> None:
    """Hermes' tests count optimize_fts()'s literal 'optimize' statements traced on _conn."""
    store = hermes_state.SessionDB(tmp_path / "state.db")
    try:
        store.create_session("s", "cli")
        store.append_message("s", "user", "something to index")
        assert store.optimize_fts() == 2  # no _conn yet: on our own connections
        assert store._raw_conn is None
        seen = _traced(store._conn)
        assert store.optimize_fts() == 2
        optimizes = [s for s in seen if "'optimize'" in s]
        assert optimizes == [
            "INSERT INTO messages_fts(messages_fts) VALUES('optimize')",
            "INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('optimize')",
        ]
        assert [h["session_id"] for h in store.search_messages("something")] == ["s"]
    finally:
        store.close()
