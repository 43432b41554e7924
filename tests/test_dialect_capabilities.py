"""What differs per database kind, asked of the dialect: FTS5 storage as an optional
capability, the message write paths, the search-route differences."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import Engine, make_url

from hermes_store import errors
from hermes_store.dialects import Dialect, all_dialects, fts5, postgresql, sqlite
from hermes_store.repositories.messages import MessageRepository
from hermes_store.operations.fts import head_fts_objects

#: What only a SQLite file with FTS5 tables can do: on ``Dialect.fts5``, nowhere else.
FTS5_ONLY = ("fts_tables", "fts_table_exists", "fts_queryable", "fts_layout_is_legacy", "fts_backfill",
             "fts_rebuild_from_source", "fts_trash_tables", "fts_trash_rows", "fts_trash_delete",
             "fts_demote_legacy")


def test_fts5_storage_is_a_capability_of_sqlite_only() -> None:
    assert isinstance(sqlite.DIALECT.fts5, fts5.Fts5Storage)
    assert postgresql.DIALECT.fts5 is None
    for dialect in all_dialects():
        assert isinstance(dialect, Dialect)
        assert not [name for name in FTS5_ONLY if hasattr(dialect, name)], dialect.name
    assert not [name for name in FTS5_ONLY if hasattr(Dialect, name)]


def test_search_route_differences() -> None:
    lite, pg = sqlite.DIALECT, postgresql.DIALECT
    assert (lite.caseless_like, lite.caseless_like_folds_non_ascii, lite.cjk_by_substring) == ("LIKE", False, False)
    assert (pg.caseless_like, pg.caseless_like_folds_non_ascii, pg.cjk_by_substring) == ("ILIKE", True, True)
    assert lite.rowid_walk_hint.strip() == "NOT INDEXED" and pg.rowid_walk_hint == ""
    assert lite.word_match(None, '"otter"') == ('"otter"', None)  # FTS5 reads MATCH and cuts snippets


def test_capabilities_are_asked_by_name() -> None:
    """What used to be read off ``is_file`` / ``fts5 is None``: each a named question."""
    lite, pg = sqlite.DIALECT, postgresql.DIALECT
    assert lite.search_index_can_lag and not pg.search_index_can_lag
    assert lite.fts5_storage is lite.fts5 and isinstance(pg.fts5_storage, fts5.NoFts5Storage)
    assert (lite.driver_param_mark, pg.driver_param_mark) == ("?", "%s")
    assert lite.holders_on_this_machine and lite.one_writer_at_a_time
    assert not pg.holders_on_this_machine and not pg.one_writer_at_a_time
    assert lite.database_path(make_url("sqlite:////tmp/state.db")) == "/tmp/state.db"
    assert lite.database_path(make_url("sqlite://")) is None
    assert lite.database_path(make_url("sqlite:///:memory:")) is None
    assert pg.database_path(make_url("postgresql+psycopg://u@h/db")) is None
    assert pg.integrity_check(None, quick=True, max_lines=5) == []  # a server has no such check
    assert pg.export_reader(None) is None  # the repositories' own reads


def test_no_fts5_storage_sends_no_statement() -> None:
    """PostgreSQL's storage answers "no FTS5 table" without a connection to ask."""
    empty = postgresql.DIALECT.fts5_storage
    assert empty.tables(None) == {} and empty.trash_tables(None) == [] and empty.trash_rows(None) == 0
    assert not empty.queryable(None, "messages_fts") and not empty.layout_is_legacy(None)
    assert empty.backfill(None, "messages_fts", 0, 10) == 0 and empty.demote_legacy(None, ()) == []


def test_sqlite_file_facts_come_from_the_dialect(engine: Engine) -> None:
    with engine.connect() as conn:
        assert sqlite.DIALECT.integrity_check(conn, quick=True, max_lines=5) == ["ok"]
        assert (sqlite.DIALECT.logical_size_bytes(conn, None, ["messages"]) or 0) > 0
    _with_session(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'x', 1)")
        read = sqlite.DIALECT.export_reader(conn)
        assert read is not None
        assert [r["content"] for r in read("messages", "s", "id")] == ["x"]


def test_head_fts_objects_are_what_our_migrations_build() -> None:
    objects = head_fts_objects()
    kinds = [kind for kind, _name, _sql in objects]
    assert kinds == sorted(kinds, key=["view", "table", "trigger"].index)  # views, tables, triggers
    names = {name for _kind, name, _sql in objects}
    assert {"messages_fts", "messages_fts_trigram"} <= names
    assert not any(name.startswith(fts5.CJK_FTS) for name in names)
    assert all(sql.upper().startswith("CREATE") for _kind, _name, sql in objects)


def _with_session(engine: Engine, sid: str = "s") -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO sessions (id, source, started_at) VALUES (?, 'cli', 0)", (sid,))


def test_sqlite_append_is_two_statements_on_the_driver_connection(engine: Engine) -> None:
    _with_session(engine)
    with engine.begin() as conn:
        repo = MessageRepository(conn)
        repo.append("s", "user", "warm")  # the column list is read once per engine
        seen: list[str] = []
        raw = conn.connection.driver_connection
        raw.set_trace_callback(seen.append)
        try:
            new_id = repo.append("s", "assistant", "hi", tool_calls=[{"id": "c", "function": {"name": "f"}}])
        finally:
            raw.set_trace_callback(None)
    # SQLite reports each trigger step too: as the outer statement again, or as "-- ...".
    statements = list(dict.fromkeys(s for s in seen if not s.startswith("--")))
    # The guarded counter bump first: it is the existence and closed-target check.
    assert [s.split()[0] for s in statements] == ["UPDATE", "INSERT"]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT message_count, tool_call_count FROM sessions").one() == (2, 1)
        assert conn.exec_driver_sql("SELECT max(id) FROM messages").scalar() == new_id


def test_sqlite_append_to_an_unknown_session_is_typed_and_writes_nothing(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(errors.UnknownSessionError) as caught:
            MessageRepository(conn).append("nobody", "user", "hi")
        assert isinstance(caught.value, sqlite3.IntegrityError)  # what Hermes' callers catch
        assert conn.exec_driver_sql("SELECT count(*) FROM messages").scalar() == 0


def test_sqlite_append_to_a_session_closed_by_compression_writes_nothing(engine: Engine) -> None:
    """The repository refuses it too (a host's own unit of work), before any row exists."""
    _with_session(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE sessions SET end_reason = 'compression', ended_at = 1 WHERE id = 's'")
        with pytest.raises(errors.CompressionSessionClosedError):
            MessageRepository(conn).append("s", "user", "late")
        assert conn.exec_driver_sql("SELECT count(*) FROM messages").scalar() == 0
        assert conn.exec_driver_sql("SELECT message_count FROM sessions").scalar() in (0, None)


@pytest.mark.parametrize("rows", [3, 100])  # executemany, and the TEMP staging table
def test_sqlite_bulk_paths_keep_input_order_and_counters(engine: Engine, rows: int) -> None:
    _with_session(engine, "a")
    _with_session(engine, "b")
    items = [{"session_id": "ab"[i % 2], "role": "user", "content": f"m{i}", **({"tool_name": "t"} if i % 3 else {})}
             for i in range(rows)]
    with engine.begin() as conn:
        assert MessageRepository(conn).bulk_append(items) == rows
    with engine.connect() as conn:
        stored = [r[0] for r in conn.exec_driver_sql("SELECT content FROM messages ORDER BY id")]
        counts = dict(conn.exec_driver_sql("SELECT id, message_count FROM sessions").fetchall())
        active = conn.exec_driver_sql("SELECT count(*) FROM messages WHERE active = 1").scalar()
    assert stored == [f"m{i}" for i in range(rows)]
    assert counts == {"a": (rows + 1) // 2, "b": rows // 2}
    assert active == rows  # a column a row leaves out gets its default on every path


def test_sqlite_bulk_overflow_is_typed(engine: Engine) -> None:
    _with_session(engine)
    with engine.begin() as conn:
        with pytest.raises(errors.InvalidInputError, match="out of range"):
            MessageRepository(conn).bulk_append([{"session_id": "s", "role": "user", "token_count": 2**70}])
