"""Hermes v26's open-time primary-key healers (v26 reference §4, §5.6), as its code and
tests call them: ``_heal_gateway_routing_pk(cursor)`` and
``_heal_session_model_usage_pk(cursor)`` on a raw cursor of an older layout rebuild the
table to the current key with every row (orphans included), and are no-ops once healthy."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ..layouts import ledger_without_task_in_key, routing_keyed_by_session_key


def _old_layout(hermes_state: Any, tmp_path: Path, deviate: Any) -> sqlite3.Connection:
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path) as store:
        for sid in ("compat_000", "compat_001"):
            store.create_session(sid, "telegram")
    conn = sqlite3.connect(path, isolation_level=None)
    deviate(conn)
    conn.execute("PRAGMA foreign_keys = ON")  # as Hermes' connection has it
    return conn


def _rows(conn: sqlite3.Connection, table: str) -> list[tuple]:
    """Every row as (column, value) pairs by column name: the column order may change."""
    cols = sorted(r[1] for r in conn.execute(f'PRAGMA table_info("{table}")'))
    found = conn.execute(f'SELECT {", ".join(cols)} FROM "{table}"').fetchall()
    return sorted((tuple(zip(cols, row, strict=True)) for row in found), key=repr)


def _pk(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in sorted((r for r in conn.execute(f'PRAGMA table_info("{table}")') if r[5]),
                                 key=lambda r: r[5])]


def _healer(hermes_state: Any) -> Any:
    return hermes_state.SessionDB.__new__(hermes_state.SessionDB)  # as Hermes' tests build one


@pytest.mark.parametrize(("table", "deviate", "heal", "key"), [
    ("session_model_usage", ledger_without_task_in_key, "_heal_session_model_usage_pk",
     ["session_id", "model", "billing_provider", "billing_base_url", "billing_mode", "task"]),
    ("gateway_routing", routing_keyed_by_session_key, "_heal_gateway_routing_pk", ["scope", "session_key"]),
])
def test_an_older_key_is_rebuilt_with_every_row(hermes_state, tmp_path: Path, table: str, deviate: Any,
                                                heal: str, key: list[str]) -> None:
    conn = _old_layout(hermes_state, tmp_path, deviate)
    before = _rows(conn, table)
    assert len(before) == 3 and _pk(conn, table) != key
    assert getattr(_healer(hermes_state), heal)(conn.cursor()) is True
    assert _pk(conn, table) == key
    assert _rows(conn, table) == before  # every row, the orphan ledger row too
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1  # switched back on
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    head_indexes = {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", (table,))}
    assert getattr(_healer(hermes_state), heal)(conn.cursor()) is False  # healthy now: a no-op
    conn.close()
    with hermes_state.SessionDB(tmp_path / "state.db") as store:  # and our store opens it as its own
        if table == "gateway_routing":
            assert store.load_gateway_routing_entries(scope="profile-b") == {
                "agent:main:discord:group:2": '{"session_id": "compat_001", "note": "é✓"}'}
        else:
            assert "compression" in {row.key[0] for row in store.usage(by="task")}
    if table == "session_model_usage":
        assert {"idx_session_model_usage_session"} <= head_indexes


def test_a_rebuild_that_cannot_keep_the_rows_leaves_the_table_as_it_was(hermes_state, tmp_path: Path,
                                                                       caplog) -> None:
    """A row the current shape cannot hold (a NULL where it needs a value): everything
    is put back, the failure logged, False returned."""
    conn = _old_layout(hermes_state, tmp_path, routing_keyed_by_session_key)
    conn.execute("DROP TABLE gateway_routing")
    conn.execute("CREATE TABLE gateway_routing (session_key TEXT PRIMARY KEY, entry_json TEXT, updated_at REAL)")
    conn.execute("INSERT INTO gateway_routing VALUES ('k', NULL, 1.0)")
    schema_before = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'gateway_routing'").fetchone()
    assert _healer(hermes_state)._heal_gateway_routing_pk(conn.cursor()) is False
    assert conn.execute("SELECT sql FROM sqlite_master WHERE name = 'gateway_routing'").fetchone() == schema_before
    assert conn.execute("SELECT * FROM gateway_routing").fetchall() == [("k", None, 1.0)]
    assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name LIKE '%hermes_store_rebuild%'").fetchall()
    assert "could not rebuild gateway_routing" in caplog.text
    conn.close()
