"""Hermes v25/v26 lifecycle (reference §1) and the private surface its tests and app code
touch (§4): checkpoint and retry helpers, the read pool, FTS merging, search routes,
the schema mixin, malformed-file backups and ``_sanitize_fts5_query`` (fuzzed against
a real FTS5 table)."""

from __future__ import annotations

import gc
import inspect
import logging
import os
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.both_backends


# ----------------------------------------------------------------------------- lifecycle

def test_context_manager_returns_self_and_never_swallows(db) -> None:
    assert db.__enter__() is db
    assert db.__exit__(None, None, None) is False
    assert db.__exit__(ValueError, ValueError("x"), None) is False  # closed again: idempotent


def test_exceptions_pass_through_the_with_block(hermes_state, db) -> None:
    with pytest.raises(ValueError, match="boom"):
        with db:
            raise ValueError("boom")
    with pytest.raises(hermes_state.errors.DatabaseUnavailableError):
        db.create_session("s", "cli")  # closed by __exit__


def test_close_is_idempotent_and_checkpoints_once(hermes_state, db, backend, monkeypatch) -> None:
    from hermes_store.dialects import sqlite as sqlite_dialect

    sent: list[str] = []
    real = sqlite_dialect._outside_transaction
    monkeypatch.setattr(sqlite_dialect, "_outside_transaction", lambda engine, sql: (sent.append(sql), real(engine, sql))[1])
    db.create_session("s", "cli")
    db.close()
    db.close()
    assert sent == (["PRAGMA wal_checkpoint(PASSIVE)"] if backend == "sqlite" else [])


def test_close_stops_a_token_writer_when_one_exists(db) -> None:
    stopped: list[int] = []
    db._close_token_writer = lambda: stopped.append(1)
    db.close()
    assert stopped == [1]


def test_del_closes_an_open_store(hermes_state, tmp_path: Path) -> None:
    store = hermes_state.SessionDB(tmp_path / "state.db")
    engine = store.engine
    closed: list[int] = []
    real_close = store.close
    store.close = lambda: (closed.append(1), real_close())[1]
    store.__del__()
    assert closed == [1] and store._engine is None
    store.__del__()  # already closed: nothing more
    assert closed == [1]
    assert engine.pool.checkedout() == 0


def test_an_unreferenced_store_releases_its_file(hermes_state, tmp_path: Path) -> None:
    from hermes_store.state_files import has_live_connection

    path = tmp_path / "state.db"
    hermes_state.SessionDB(path).create_session("s", "cli")
    gc.collect()
    assert not has_live_connection(path)
    assert hermes_state.count_db_holders(path) == 0


def test_sessiondb_has_hermes_mixins(hermes_state) -> None:
    import hermes_state_portability
    import hermes_state_schema
    import hermes_state_search

    cls = hermes_state.SessionDB
    assert issubclass(cls, hermes_state_search.SessionSearchMixin)
    assert issubclass(cls, hermes_state_schema.SessionSchemaMixin)
    assert issubclass(cls, hermes_state_portability.SessionPortabilityMixin)
    params = list(inspect.signature(cls.__exit__).parameters)
    assert params == ["self", "exc_type", "exc", "tb"]


# ----------------------------------------------------------------------------- flags

def test_flags_exist_and_are_assignable(db, backend) -> None:
    assert isinstance(db._fts_enabled, bool) and isinstance(db._trigram_available, bool)
    assert db._fts_stale is False and db._fts_cjk_available is False
    assert db._wal_active is (backend == "sqlite")
    db._wal_active = False
    db._fts_stale = True
    assert db._wal_active is False and db._fts_stale is True


# ----------------------------------------------------------------------------- write retries

def test_compression_in_progress_is_retried_for_a_few_seconds(hermes_state, db, monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(db, "_sleep", slept.append)
    tries: list[int] = []

    def flaky(conn):
        tries.append(1)
        if len(tries) < 3:
            raise hermes_state.SessionCompressionInProgressError("being compressed")
        return "done"

    assert db._write(flaky) == "done" and len(tries) == 3 and len(slept) == 2
    monkeypatch.setattr(hermes_state, "_COMPRESSION_BUSY_WAIT_S", 0.05)
    monkeypatch.setattr(db, "_sleep", time.sleep)

    def always(conn):
        raise hermes_state.SessionCompressionInProgressError("being compressed")

    started = time.monotonic()
    with pytest.raises(hermes_state.SessionCompressionInProgressError):
        db._write(always)
    assert time.monotonic() - started < 2.0


def test_busy_compression_is_not_retried(hermes_state, db) -> None:
    tries: list[int] = []

    def busy(conn):
        tries.append(1)
        raise hermes_state.CompressionSessionBusyError("lease lost")

    with pytest.raises(hermes_state.CompressionSessionBusyError):
        db._write(busy)
    assert tries == [1]


def test_sleep_before_write_retry(db, monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(db, "_sleep", slept.append)
    assert db._sleep_before_write_retry(time.monotonic() - 1, 20.0) is False and slept == []
    assert db._sleep_before_write_retry(time.monotonic() + 0.01, 20.0) is True
    assert len(slept) == 1 and 0 <= slept[0] <= 0.01
    assert db._sleep_before_write_retry(time.monotonic() + 19.5, 20.0) is True
    assert 0.020 <= slept[1] <= 0.150  # 0.5 s in: the early window
    assert db._sleep_before_write_retry(time.monotonic() + 10, 20.0) is True
    assert 0.250 <= slept[2] <= 1.0  # 10 s in: the late window


def test_is_not_a_database_error(db) -> None:
    assert db._is_not_a_database_error(sqlite3.DatabaseError("file is not a database"))
    assert not db._is_not_a_database_error(sqlite3.DatabaseError("database disk image is malformed"))
    assert not db._is_not_a_database_error(ValueError("file is not a database"))


# ----------------------------------------------------------------------------- SQLite-file internals

@pytest.fixture
def store(hermes_state, tmp_path: Path):
    s = hermes_state.SessionDB(tmp_path / "state.db")
    yield s
    s.close()


def test_try_wal_checkpoint(store, caplog) -> None:
    assert store._try_wal_checkpoint() is True

    class Broken:
        def execute(self, sql):
            raise sqlite3.OperationalError("database is locked")

        def close(self):
            pass

    store._raw_conn = Broken()
    with caplog.at_level(logging.WARNING):
        assert store._try_wal_checkpoint() is False
    assert any("WAL checkpoint (PASSIVE) failed" in r.getMessage() for r in caplog.records)


def test_reconnect_after_notadb_is_one_shot(store) -> None:
    store.create_session("s", "cli")
    assert store._reconnect_after_notadb() is True
    assert store.get_session("s") is not None  # reopened like the constructor
    assert store._reconnect_after_notadb() is False


def test_reconnect_failure_returns_false(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    s = hermes_state.SessionDB(path)
    try:
        s.close()
        path.unlink()
        path.mkdir()  # nothing openable there any more
        assert s._reconnect_after_notadb() is False
    finally:
        s.close()


def test_read_ctx_uses_a_pooled_read_only_connection_under_wal(store) -> None:
    store.create_session("s", "cli")
    with store._read_ctx() as conn:
        assert conn is not store._conn
        assert conn.execute("SELECT id FROM sessions").fetchone()["id"] == "s"
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM sessions")
    assert len(store._read_pool) == 1
    with store._read_ctx() as again:
        assert again is conn  # reused
    store.close()
    assert store._read_pool == []


def test_read_ctx_falls_back_to_conn_without_wal_or_when_read_only(hermes_state, store, tmp_path: Path) -> None:
    store._wal_active = False
    with store._read_ctx() as conn:
        assert conn is store._conn
    store._wal_active = True
    store.close()
    ro = hermes_state.SessionDB(tmp_path / "state.db", read_only=True)
    try:
        assert ro._checkout_read_conn() is None
        with ro._read_ctx() as conn:
            assert conn is ro._conn
    finally:
        ro.close()


def test_read_permits_cap_live_connections(hermes_state, store, monkeypatch) -> None:
    held = [store._checkout_read_conn() for _ in range(hermes_state._READ_POOL_MAX)]
    assert all(c is not None for c in held)
    assert store._checkout_read_conn() is None  # all 8 permits taken
    store._close_read_conn(held.pop())
    extra = store._checkout_read_conn()
    assert extra is not None
    for c in [*held, extra]:
        store._close_read_conn(c)


def test_a_failed_read_open_is_not_retried_for_a_while(hermes_state, store, monkeypatch) -> None:
    raw = store._conn  # opened before connect breaks
    real_connect = sqlite3.connect

    def refuse(target, *a, **k):
        if "mode=ro" in str(target):
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(target, *a, **k)

    monkeypatch.setattr(hermes_state.sqlite3, "connect", refuse)
    assert store._checkout_read_conn() is None
    monkeypatch.setattr(hermes_state.sqlite3, "connect", real_connect)
    assert store._checkout_read_conn() is None  # still within the 60 s
    with store._read_ctx() as conn:
        assert conn is raw
    monkeypatch.setattr(hermes_state, "_READ_OPEN_RETRY_SECONDS", 0)
    conn = store._checkout_read_conn()
    assert conn is not None
    store._close_read_conn(conn)


def test_merge_fts_incrementally(store) -> None:
    store.create_session("s", "cli")
    for i in range(30):
        store.append_message("s", "user", f"message number {i} about merging")
    with pytest.raises(TypeError):
        store._merge_fts_incrementally(max_pages="8")
    with pytest.raises(TypeError):
        store._merge_fts_incrementally(max_pages=True)
    with pytest.raises(ValueError):
        store._merge_fts_incrementally(max_pages=0)
    with pytest.raises(ValueError):
        store._merge_fts_incrementally(max_pages=8, max_commands=0)
    ran = store._merge_fts_incrementally(max_pages=8)
    tables = store._conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%fts5%'"
    ).fetchone()[0]
    assert tables >= 1 and 2 * tables <= ran <= 5 * tables
    assert store._merge_fts_incrementally(max_pages=8, max_commands=1) == 1
    assert store.search_messages("merging")  # the index still answers


def test_describe_search_path(store) -> None:
    assert store._describe_search_path("hello world") == "fts5"
    assert store._describe_search_path("") == "empty"
    assert store._describe_search_path("数据库") == "trigram"
    assert store._describe_search_path("数据") == "like_scan"
    store._fts_stale = True
    assert store._describe_search_path("hello") == "like_scan_fts_stale"


# ----------------------------------------------------------------------------- schema mixin

def test_fts_update_trigger_needs_narrowing(hermes_state) -> None:
    needs = hermes_state.SessionDB._fts_update_trigger_needs_narrowing
    assert needs("CREATE TRIGGER t AFTER UPDATE ON messages BEGIN SELECT 1; END")
    assert needs("create trigger t after  update\n on messages begin select 1; end")
    assert not needs("CREATE TRIGGER t AFTER UPDATE OF content ON messages BEGIN SELECT 1; END")
    assert not needs("CREATE TRIGGER t AFTER INSERT ON messages BEGIN SELECT 1; END")


def test_parse_schema_columns_is_cached(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    sql = ("CREATE TABLE IF NOT EXISTS a (id INTEGER PRIMARY KEY, name TEXT NOT NULL DEFAULT 'x',"
           " n REAL CHECK (n > 0), PRIMARY KEY (id));\nCREATE TABLE b (k TEXT, v NUMERIC(10, 2), UNIQUE (k))")
    parsed = hermes_state.SessionDB._parse_schema_columns(sql)
    assert parsed == {"a": {"id": "INTEGER PRIMARY KEY", "name": "TEXT NOT NULL DEFAULT 'x'",
                            "n": "REAL CHECK (n > 0)"}, "b": {"k": "TEXT", "v": "NUMERIC(10, 2)"}}
    assert (tmp_path / "cache" / "schema_columns.json").is_file()
    assert hermes_state.SessionDB._parse_schema_columns(sql) == parsed


def test_reconcile_columns_adds_what_is_missing(hermes_state, tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL)")
    mixin = hermes_state.SessionDB.__new__(hermes_state.SessionDB)
    mixin._reconcile_columns(conn.cursor())
    have = {r[1] for r in conn.execute('PRAGMA table_info("sessions")')}
    assert {"pinned", "title", "model_config", "message_count"} <= have
    mixin._reconcile_columns(conn.cursor())  # nothing left to add: no error
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'messages'").fetchone()[0] == 0
    conn.close()


def test_schema_healers_are_no_ops_on_our_schema(store) -> None:
    cur = store._conn.cursor()
    assert store._heal_gateway_routing_pk(cur) is False
    assert store._heal_session_model_usage_pk(cur) is False
    assert store._migrate_broad_fts_update_triggers(cur) == 0
    assert store._ensure_fts_cjk_schema(cur) is False
    assert store._has_fts_trash() is False
    assert store._fts_teardown_trash_step() is False
    assert store._repair_optimize_bookkeeping() is False


def test_repair_optimize_bookkeeping_seeds_a_lost_progress_key(store) -> None:
    """Hermes v25: a backfill high-water mark whose progress key was lost gets progress 0,
    its partial index emptied, so the next backfill indexes every row exactly once."""
    store.create_session("s", "cli")
    for i in range(3):
        store.append_message("s", "user", f"bookkeeping word{i}")
    store.set_meta("fts_rebuild_high_water", "3")
    assert store._repair_optimize_bookkeeping() is True
    assert store.get_meta("fts_rebuild_progress") == "0"
    assert store._conn.execute("SELECT count(*) FROM messages_fts_docsize").fetchone()[0] == 0  # emptied
    assert store._repair_optimize_bookkeeping() is False  # nothing left to heal
    store.rebuild_fts()
    assert len(store.search_messages("bookkeeping")) == 3


def test_broad_fts_triggers_are_narrowed_and_dropped(hermes_state) -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT, tool_name TEXT, tool_calls TEXT,"
                 " role TEXT, seen INTEGER)")
    conn.execute("CREATE TABLE log (n INTEGER)")
    conn.execute("CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN INSERT INTO log VALUES (1); END")
    conn.execute("INSERT INTO messages (id, content) VALUES (1, 'a')")
    mixin = hermes_state.SessionDB.__new__(hermes_state.SessionDB)
    assert mixin._migrate_broad_fts_update_triggers(conn.cursor()) == 1
    conn.execute("UPDATE messages SET seen = 1")
    assert conn.execute("SELECT count(*) FROM log").fetchone()[0] == 0  # not an indexed column
    conn.execute("UPDATE messages SET content = 'b'")
    assert conn.execute("SELECT count(*) FROM log").fetchone()[0] == 1
    assert mixin._drop_fts_triggers(conn.cursor()) == 1
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0] == 0


def test_schema_read_probe_statements_read_our_file(store) -> None:
    import hermes_state_schema

    statements = hermes_state_schema.schema_read_probe_statements()
    assert isinstance(statements, tuple) and len(statements) >= 8
    assert any('"sessions"."id"' in s for s in statements)
    for sql in statements:
        assert store._conn.execute(sql).fetchall() == []


# ----------------------------------------------------------------------------- backups

def test_backup_db_file_returns_path_and_reason(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    assert hermes_state._backup_db_file(path)[0] is None  # missing
    with hermes_state.SessionDB(path) as db:
        db.create_session("s", "cli")
        saved, reason = hermes_state._backup_db_file(path)
        assert saved is None and "live connection" in reason  # refused while open
    saved, reason = hermes_state._backup_db_file(path)
    assert reason is None and saved.read_bytes() == path.read_bytes()
    assert oct(os.stat(saved).st_mode & 0o777) == oct(0o600)
    again, _ = hermes_state._backup_db_file(path)
    assert again == saved  # identical: reused
    made = [saved]
    for i in range(4):
        conn = sqlite3.connect(path)
        conn.execute("INSERT INTO state_meta (key, value) VALUES (?, 'x')", (f"k{i}",))
        conn.commit()
        conn.close()
        newer, _ = hermes_state._backup_db_file(path)
        made.append(newer)
        time.sleep(0.01)
    left = {p for p in tmp_path.glob("state.db.malformed-backup-*") if not p.name.endswith(("-wal", "-shm"))}
    assert len(set(made)) == 5  # never a pruned name again
    assert left == set(made[-3:]) and len(left) == hermes_state._MAX_MALFORMED_BACKUPS
    assert made[-1].read_bytes() == path.read_bytes()


def test_repair_refuses_without_a_backup(hermes_state, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"SQLite format 3\0" + b"\x01" * 200)  # unreadable
    before = path.read_bytes()
    monkeypatch.setattr(hermes_state, "_backup_db_file", lambda p: (None, "not today"))
    outcome = hermes_state.repair_state_db_schema(path)
    assert outcome["repaired"] is False and outcome["error"].startswith("pre-repair backup refused; not today")
    assert path.read_bytes() == before
    assert isinstance(hermes_state._repair_attempted_paths, set)


# ----------------------------------------------------------------------------- _sanitize_fts5_query

_FTS = sqlite3.connect(":memory:", check_same_thread=False)
_FTS.execute("CREATE VIRTUAL TABLE f USING fts5(content)")
_FTS.execute("INSERT INTO f VALUES ('hello world chat-send P2.2 数据库 user@example.com')")
_SYNTAX = [*'+{}():"^@/#&|~[]<>,;!?$=\'%*-. ', "AND", "OR", "NOT", "NEAR", " ", "数据", "é"]


def _parsable(query: str) -> None:
    if query.strip():
        _FTS.execute("SELECT rowid FROM f WHERE f MATCH ?", (query,)).fetchall()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(_SYNTAX), st.text(max_size=6)), max_size=20).map("".join))
def test_sanitized_queries_always_parse(hermes_state, raw: str) -> None:
    out = hermes_state.SessionDB._sanitize_fts5_query(raw)
    assert out.count('"') % 2 == 0
    _parsable(out)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=40))
def test_sanitized_arbitrary_text_parses(hermes_state, raw: str) -> None:
    _parsable(hermes_state.SessionDB._sanitize_fts5_query(raw))


def test_sanitize_rules(hermes_state) -> None:
    sanitize = hermes_state.SessionDB._sanitize_fts5_query
    assert sanitize('"exact phrase" other') == '"exact phrase" other'
    assert sanitize("chat-send") == '"chat-send"'
    assert sanitize("hello!") == "hello"
    assert sanitize("AND hello OR") == "hello"
    assert sanitize('unbalanced "quote') == "unbalanced quote"
    assert sanitize("pre*") == "pre*"
    assert sanitize("") == "" and sanitize("+{}():^") == ""
    long = "word " * 1000
    assert sanitize(long) == sanitize(long[:2048]) == hermes_state.SessionSearchMixin._sanitize_fts5_query(long)
    _parsable(sanitize(long))


def test_conn_is_a_settable_attribute(hermes_state, store) -> None:
    real = store._conn
    wrapper = object()
    store._conn = wrapper
    assert store._conn is wrapper
    store._conn = None
    fresh = store._conn  # opened again on use
    assert fresh is not None and fresh is not real and fresh.execute("SELECT 1").fetchone()[0] == 1
    real.close()
    bare = hermes_state.SessionDB.__new__(hermes_state.SessionDB)
    bare._conn = fresh
    assert bare._conn is fresh
