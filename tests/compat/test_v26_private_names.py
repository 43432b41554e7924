"""Hermes v26's private module and class names its own tests reach through the swapped
``hermes_state`` (issue 35, item 2a): the WAL-reset warning set, the tracked-connection
door, the turn-lease key, the lease-lost text, the schema helpers that take Hermes'
cursor, ``_FTS_TRIGGERS``, the read probes, the FTS trigger narrowing, an idempotent
``SCHEMA_SQL`` and the WAL size limit. Names tests patch are read at call time."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes_store import state_files

from ..layouts import routing_keyed_by_session_key

pytestmark = pytest.mark.both_backends

_64_MIB = 64 * 1024 * 1024


def _memory_schema(hermes_state: Any) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(hermes_state.SCHEMA_SQL)
    return conn


# ----------------------------------------------------------------------------- 1. WAL-reset warning set

def _reset_warnings(hermes_state: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> int:
    """Open a DELETE-mode file as Hermes does on a vulnerable SQLite; how many reset warnings."""
    caplog.clear()
    conn = sqlite3.connect(tmp_path / "plain.db")
    try:
        with caplog.at_level(logging.WARNING):
            assert hermes_state.apply_wal_with_fallback(conn, db_label="plain.db") == "delete"
    finally:
        conn.close()
    return sum("WAL-reset bug" in r.getMessage() for r in caplog.records)


def test_clearing_the_wal_reset_set_rearms_the_warning(hermes_state, tmp_path, caplog, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "is_sqlite_wal_reset_vulnerable", lambda *a: True)
    hermes_state._wal_reset_bug_warned_paths.clear()
    assert _reset_warnings(hermes_state, tmp_path, caplog) == 1
    assert "plain.db" in hermes_state._wal_reset_bug_warned_paths
    assert _reset_warnings(hermes_state, tmp_path, caplog) == 0  # once per label
    hermes_state._wal_reset_bug_warned_paths.clear()
    assert _reset_warnings(hermes_state, tmp_path, caplog) == 1


def test_a_replaced_wal_reset_set_is_the_one_used(hermes_state, tmp_path, caplog, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "is_sqlite_wal_reset_vulnerable", lambda *a: True)
    original = hermes_state._wal_reset_bug_warned_paths
    original.add("plain.db")  # the old set says "already warned": a fresh set must not care
    fresh: set[str] = set()
    monkeypatch.setattr(hermes_state, "_wal_reset_bug_warned_paths", fresh)
    try:
        assert _reset_warnings(hermes_state, tmp_path, caplog) == 1
        assert fresh == {"plain.db"}
    finally:
        original.discard("plain.db")


# ----------------------------------------------------------------------------- 2. _connect_tracked_db

def test_connect_tracked_db_counts_until_close(hermes_state, tmp_path) -> None:
    path = tmp_path / "tracked.db"
    assert not state_files.has_live_connection(path)
    conn = hermes_state._connect_tracked_db(str(path), timeout=1.0)
    other = hermes_state._connect_tracked_db(f"file:{path}?mode=ro", uri=True)
    assert state_files.has_live_connection(path)
    conn.close()
    assert state_files.has_live_connection(path)  # the second one is still open
    other.close()
    other.close()  # idempotent: never counted down twice
    assert not state_files.has_live_connection(path)


def test_a_failed_tracked_open_leaves_the_registry_unchanged(hermes_state, tmp_path) -> None:
    path = tmp_path / "no-such-folder" / "state.db"
    with pytest.raises(sqlite3.OperationalError):
        hermes_state._connect_tracked_db(str(path))
    assert not state_files.has_live_connection(path)


@pytest.mark.sqlite_only
def test_raw_connections_open_through_the_patched_door(hermes_state, db, monkeypatch) -> None:
    real = hermes_state._connect_tracked_db
    opened: list[str] = []

    def spy(path: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(str(path))
        return real(path, **kwargs)

    monkeypatch.setattr(hermes_state, "_connect_tracked_db", spy)
    db._conn = None
    assert db._conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
    assert opened == [str(db.db_path)]
    pooled = db._checkout_read_conn()  # our files are in WAL: the read pool opens one too
    assert pooled is not None and opened[-1] == f"file:{db.db_path}?mode=ro"
    db._close_read_conn(pooled)


@pytest.mark.sqlite_only
def test_a_patched_failing_door_fails_the_open_and_tracks_nothing(hermes_state, db, monkeypatch) -> None:
    def refuse(path: Any, **kwargs: Any) -> sqlite3.Connection:
        raise sqlite3.OperationalError("unable to open database file")

    db._conn = None
    key = state_files._key(db.db_path)
    before = state_files._live[key]
    monkeypatch.setattr(hermes_state, "_connect_tracked_db", refuse)
    with pytest.raises(sqlite3.OperationalError, match="unable to open"):
        db._conn.execute("SELECT 1")
    assert state_files._live[key] == before and db._raw_conn is None
    monkeypatch.undo()
    db._conn.execute("SELECT 1")
    assert state_files._live[key] == before + 1  # the raw connection counts until close()
    db._conn.close()
    assert state_files._live[key] == before


# ----------------------------------------------------------------------------- 3. turn-lease key

def _compressed_chain(db: Any) -> None:
    db.create_session("root", "cli")
    db.end_session("root", "compression")
    db.create_session("mid", "cli", parent_session_id="root")
    db.end_session("mid", "compression")
    db.create_session("tip", "cli", parent_session_id="mid")
    db.create_session("branch", "cli", parent_session_id="tip")  # tip did not end 'compression'


def test_session_turn_lease_key(db) -> None:
    _compressed_chain(db)
    assert db._session_turn_lease_key("tip") == "root"
    assert db._session_turn_lease_key("mid") == "root"
    assert db._session_turn_lease_key("root") == "root"
    assert db._session_turn_lease_key("branch") == "branch"
    assert db._session_turn_lease_key("unknown") == "unknown"


def test_session_turn_lease_key_on_conn_inside_a_write(db) -> None:
    _compressed_chain(db)
    found = db._execute_write(lambda conn: [db._session_turn_lease_key_on_conn(conn, s)
                                            for s in ("tip", "branch", "unknown")])
    assert found == ["root", "branch", "unknown"]
    assert db._read(lambda c: db._session_turn_lease_key_on_conn(c, "tip")) == "root"
    assert db.try_acquire_session_turn_lease("tip", "holder-a")
    assert not db.try_acquire_session_turn_lease("root", "holder-b")  # stored under the same key


@pytest.mark.sqlite_only
def test_session_turn_lease_key_on_the_raw_conn(db) -> None:
    _compressed_chain(db)
    assert db._session_turn_lease_key_on_conn(db._conn, "tip") == "root"
    db._conn.execute("UPDATE sessions SET parent_session_id = 'mid' WHERE id = 'root'")  # a corrupt cycle
    assert db._session_turn_lease_key_on_conn(db._conn, "tip") in {"root", "mid"}  # it stops


# ----------------------------------------------------------------------------- 4. lease-lost text

def test_turn_lease_lost_text(hermes_state, db) -> None:
    db.create_session("s", "cli")
    with pytest.raises(hermes_state.SessionTurnLeaseLostError) as caught:
        db.append_message("s", "user", "hi", turn_lease_holder="nobody")
    assert "turn lease lost" in str(caught.value).lower()
    assert hermes_state.classify_persistence_error(str(caught.value)) == "turn_lease"
    assert db.get_messages("s") == []
    assert "turn lease lost" in str(hermes_state.SessionTurnLeaseLostError("gone")).lower()
    assert str(hermes_state.SessionTurnLeaseLostError("turn lease lost for s")) == "turn lease lost for s"


# ----------------------------------------------------------------------------- 5./6./7. helpers

@pytest.mark.sqlite_only
def test_has_fts_trash_takes_hermes_cursor(db) -> None:
    cur = db._conn.cursor()
    assert db._has_fts_trash(cur) is False and db._has_fts_trash() is False
    db._conn.execute('CREATE TABLE "ftsXv22Ytrash_q" (x)')  # LIKE wildcards must not match
    assert db._has_fts_trash(cur) is False
    db._conn.execute('CREATE TABLE "fts_v22_trash_messages_fts_data" (id INTEGER PRIMARY KEY, block BLOB)')
    assert db._has_fts_trash(cur) is True and db._has_fts_trash(db._conn) is True
    assert db._has_fts_trash() is True


def test_is_not_a_database_error_module_and_method(hermes_state, tmp_path, monkeypatch) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    conn = sqlite3.connect(junk)
    with pytest.raises(sqlite3.DatabaseError) as caught:
        conn.execute("SELECT * FROM sqlite_master").fetchall()
    conn.close()
    assert hermes_state._is_not_a_database_error(caught.value) is True
    assert hermes_state.SessionDB._is_not_a_database_error(caught.value) is True
    assert hermes_state._is_not_a_database_error(sqlite3.DatabaseError("database disk image is malformed")) is False
    assert hermes_state._is_not_a_database_error(ValueError("file is not a database")) is False
    monkeypatch.setattr(hermes_state, "_is_not_a_database_error", lambda exc: True)
    assert hermes_state.SessionDB._is_not_a_database_error(ValueError("x")) is True  # read at call time


@pytest.mark.sqlite_only
def test_fts_triggers_names_and_drop(hermes_state, db) -> None:
    expected = {f"messages_fts{i}_{e}" for i in ("", "_trigram", "_cjk") for e in ("insert", "delete", "update")}
    assert isinstance(hermes_state._FTS_TRIGGERS, tuple) and set(hermes_state._FTS_TRIGGERS) == expected
    names = {r[0] for r in db._conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    present = names & expected
    assert len(present) == 6  # word and trigram; no CJK tokenizer here
    assert db._drop_fts_triggers(db._conn.cursor()) == 6
    left = {r[0] for r in db._conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert not left & expected and left == names - present  # our other triggers are kept
    assert db._drop_fts_triggers(db._conn.cursor()) == 0


# ----------------------------------------------------------------------------- 8. read probes

def test_schema_read_probe_statements_cover_schema_sql(hermes_state) -> None:
    import hermes_state_schema

    probes = hermes_state_schema.schema_read_probe_statements()
    assert probes is hermes_state_schema.schema_read_probe_statements() is hermes_state.schema_read_probe_statements()
    conn = _memory_schema(hermes_state)
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'")]
    assert {"sessions", "messages", "gateway_routing", "session_turn_leases"} <= set(tables)
    text = "\n".join(probes)
    for table in tables:
        for col in (r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')):
            assert f'"{table}"."{col}"' in text, (table, col)
    for sql in probes:
        assert conn.execute(sql).fetchall() == []
    conn.execute("ALTER TABLE sessions DROP COLUMN title")
    with pytest.raises(sqlite3.OperationalError, match="no such column"):
        for sql in probes:
            conn.execute(sql).fetchall()
    conn.close()


# ----------------------------------------------------------------------------- 9. FTS UPDATE narrowing

def test_broad_fts_update_triggers_are_narrowed_and_cjk_dropped(hermes_state) -> None:
    conn = _memory_schema(hermes_state)
    conn.execute("CREATE TABLE log (what TEXT)")
    for name in ("messages_fts_update", "messages_fts_trigram_update", "messages_fts_cjk_update"):
        conn.execute(f"CREATE TRIGGER {name}\n  AFTER   UPDATE ON messages BEGIN INSERT INTO log VALUES ('{name}'); END")
    mixin = hermes_state.SessionDB.__new__(hermes_state.SessionDB)
    broad = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts_update'").fetchone()[0]
    assert hermes_state.SessionSchemaMixin._fts_update_trigger_needs_narrowing(broad) is True
    assert mixin._migrate_broad_fts_update_triggers(conn.cursor()) == 3
    triggers = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall())
    assert "messages_fts_cjk_update" not in triggers
    for name in ("messages_fts_update", "messages_fts_trigram_update"):
        assert "AFTER UPDATE OF" in " ".join(triggers[name].split()).upper()
        assert not hermes_state.SessionSchemaMixin._fts_update_trigger_needs_narrowing(triggers[name])
    assert conn.execute("SELECT value FROM state_meta WHERE key = 'fts_cjk_stale'").fetchone()[0] == "1"
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1)")
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'a', 1)")
    conn.execute("UPDATE messages SET active = 0")  # not an indexed column: nothing fires
    assert conn.execute("SELECT count(*) FROM log").fetchone()[0] == 0
    conn.execute("UPDATE messages SET content = 'b'")
    assert sorted(r[0] for r in conn.execute("SELECT what FROM log")) == [
        "messages_fts_trigram_update", "messages_fts_update"]
    assert mixin._migrate_broad_fts_update_triggers(conn.cursor()) == 0  # narrowed once
    conn.close()


# ----------------------------------------------------------------------------- 10. gateway_routing once

def test_schema_sql_is_idempotent(hermes_state) -> None:
    conn = _memory_schema(hermes_state)
    conn.executescript(hermes_state.SCHEMA_SQL + hermes_state.DEFERRED_INDEX_SQL)
    conn.executescript(hermes_state.SCHEMA_SQL + hermes_state.DEFERRED_INDEX_SQL)  # no "already exists"
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'gateway_routing'").fetchone()[0] == 1
    conn.close()


def test_old_routing_key_heals_once_after_schema_sql(hermes_state, tmp_path) -> None:
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path) as store:
        store.create_session("compat_000", "telegram")
        store.create_session("compat_001", "telegram")
    conn = sqlite3.connect(path, isolation_level=None)
    routing_keyed_by_session_key(conn)
    before = sorted(conn.execute("SELECT scope, session_key, entry_json, updated_at FROM gateway_routing"))
    conn.executescript(hermes_state.SCHEMA_SQL)  # Hermes' _init_schema first step: no second CREATE
    mixin = hermes_state.SessionDB.__new__(hermes_state.SessionDB)
    cur = conn.cursor()
    assert mixin._heal_gateway_routing_pk(cur) is True
    assert mixin._heal_gateway_routing_pk(cur) is False  # healthy now: a no-op
    pk = [r[1] for r in sorted((r for r in conn.execute("PRAGMA table_info(gateway_routing)") if r[5]),
                               key=lambda r: r[5])]
    assert pk == ["scope", "session_key"]
    assert sorted(conn.execute("SELECT scope, session_key, entry_json, updated_at FROM gateway_routing")) == before
    conn.close()


# ----------------------------------------------------------------------------- 11. WAL size limit

@pytest.mark.sqlite_only
def test_wal_connections_carry_the_size_limit(hermes_state, db) -> None:
    assert hermes_state._WAL_SIZE_LIMIT_BYTES == _64_MIB
    assert db._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db._conn.execute("PRAGMA journal_size_limit").fetchone()[0] == _64_MIB
    assert db._execute_write(lambda c: c.execute("PRAGMA journal_size_limit").fetchone()[0]) == _64_MIB
    pooled = db._checkout_read_conn()
    assert pooled is not None and pooled.execute("PRAGMA journal_size_limit").fetchone()[0] == _64_MIB
    db._close_read_conn(pooled)


def test_raw_connection_to_a_rollback_journal_file_keeps_its_limit(hermes_state, tmp_path) -> None:
    path = tmp_path / "delete.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    conn = hermes_state.open_raw_connection(hermes_state._connect_tracked_db, path, read_only=False,
                                            busy_timeout_s=1.0)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == -1  # SQLite's default: untouched
    finally:
        conn.close()
