"""Statements per call of SessionDB's hot writes and one-statement reads, both backends.

Counted by the bench's own meter (``tests/statements.py``): statements on SQLite,
round trips on PostgreSQL (the BEGIN and COMMIT the driver sends included). What the
figures say:

* an append is BEGIN IMMEDIATE, INSERT, UPDATE, COMMIT on SQLite, and on PostgreSQL
  three round trips where plain psycopg needs four: BEGIN with the lock budget, one
  statement that bumps the counters and inserts the row, COMMIT;
* a one-statement read is that statement alone on PostgreSQL (autocommit: no BEGIN or
  ROLLBACK), and BEGIN, SELECT, ROLLBACK on SQLite (one WAL snapshot per call);
* the periodic upkeep adds nothing to the due write's own count on PostgreSQL (it
  runs on the store's upkeep thread).
"""

from __future__ import annotations

import pytest

from hermes_store import SessionDB, facade

from .statements import count, steady

pytestmark = pytest.mark.both_backends

#: (SQLite statements, PostgreSQL round trips) per call.
APPEND = {"sqlite": 4, "postgresql": 1}
ONE_STATEMENT_READ = {"sqlite": 3, "postgresql": 1}
SMALL_WRITE = {"sqlite": 3, "postgresql": 3}
#: Hermes' usage update: make sure the session exists, bump it, read its billing route,
#: upsert the per-model ledger row (plus BEGIN and COMMIT).
USAGE = {"sqlite": 6, "postgresql": 6}


@pytest.fixture
def store(db: SessionDB) -> SessionDB:
    db.create_session("s", "cli")
    for i in range(3):
        db.append_message("s", "user", f"warm {i} 数据")
    return db


def test_an_append(store: SessionDB, backend: str) -> None:
    assert steady(store, lambda: store.append_message("s", "assistant", "hello 数据", token_count=3)) == APPEND[backend]
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert steady(store, lambda: store.append_message("s", "assistant", None, tool_calls=calls)) == APPEND[backend]
    assert store.get_session("s")["tool_call_count"] == 3


@pytest.mark.parametrize("read", ["get_session", "get_messages", "get_messages_as_conversation", "message_count"])
def test_a_one_statement_read(store: SessionDB, backend: str, read: str) -> None:
    assert steady(store, lambda: getattr(store, read)("s")) == ONE_STATEMENT_READ[backend]


@pytest.mark.parametrize("write", ["set_meta", "end_session"])
def test_a_small_write(store: SessionDB, backend: str, write: str) -> None:
    calls = {
        "set_meta": lambda: store.set_meta("k", "v"),
        "end_session": lambda: store.end_session("s", "user_exit"),
    }
    assert steady(store, calls[write]) == SMALL_WRITE[backend]


def test_a_usage_update(store: SessionDB, backend: str) -> None:
    assert steady(store, lambda: store.update_token_counts("s", input_tokens=1, output_tokens=2)) == USAGE[backend]


def test_the_due_append_does_not_pay_for_upkeep(store: SessionDB, backend: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The append that makes upkeep due sends only its own statements: the catch-up (and
    on SQLite the WAL checkpoint) goes to the store's upkeep thread (issue 32: on a file
    too, where it waits in the writers' line like any other write)."""
    steady(store, lambda: store.append_message("s", "user", "warm"))
    handed: list[str] = []
    monkeypatch.setattr(store._upkeep, "submit", lambda name, job: handed.append(name))
    store._writes = facade.CHECKPOINT_EVERY - 1
    n, _ = count(store, lambda: store.append_message("s", "user", "数据 due"))
    assert n == APPEND[backend]
    assert handed == ["WAL checkpoint", "short-CJK index catch-up"]  # a server's checkpoint sends nothing


def _conversation(n: int) -> list[dict]:
    """Rows of several shapes, as a conversation has them: turns, tool calls, tool results,
    one rewound row."""
    rows: list[dict] = []
    for i in range(n):
        row: dict = {"session_id": "s", "role": ("user", "assistant", "tool")[i % 3], "content": f"row {i}"}
        if i % 3 == 1:
            row.update(tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                       finish_reason="tool_calls")
        if i % 3 == 2:
            row.update(tool_call_id=f"c{i - 1}", tool_name="f")
        if i == 4:
            row["active"] = 0
        rows.append(row)
    return rows


#: A bulk append: BEGIN (with the budget), the sessions check, then on PostgreSQL one
#: executemany whatever the shapes (SQLite's trace shows each of its rows), the counter
#: bump, COMMIT.
BULK = {"sqlite": lambda n: n + 4, "postgresql": lambda n: 5}


@pytest.mark.parametrize("n", [10, 60])
def test_a_bulk_append_of_mixed_rows_is_one_batch(store: SessionDB, backend: str, n: int) -> None:
    before = store.message_count("s")
    assert steady(store, lambda: store.append_messages(_conversation(n)), warm=1) == BULK[backend](n)
    rows = store.get_messages("s", include_inactive=True)[before:]
    assert len(rows) == 2 * n
    want = _conversation(n)
    for got, given in zip(rows, want + want, strict=True):
        assert (got["role"], got["content"], got["tool_name"]) == (given["role"], given["content"], given.get("tool_name"))
        assert (got["active"], got["observed"], got["compacted"]) == (given.get("active", 1), 0, 0)
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
