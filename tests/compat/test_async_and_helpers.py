"""``AsyncSessionDB`` and the module-level helpers of ``hermes_state`` (reference §5)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.both_backends


# ----------------------------------------------------------------------------- AsyncSessionDB

def test_async_wrapper_runs_every_call_in_a_worker_thread(hermes_state, db) -> None:
    wrapped = hermes_state.AsyncSessionDB(db)
    assert wrapped._db is db
    seen: list[int] = []
    real = db.get_session

    def spy(session_id):
        seen.append(threading.get_ident())
        return real(session_id)

    db.get_session = spy  # an instance attribute, as Hermes' tests patch db methods

    async def main():
        await wrapped.create_session("s1", "telegram")
        coro = wrapped.get_session("s1")
        assert asyncio.iscoroutine(coro)
        return await coro

    row = asyncio.run(main())
    assert row["source"] == "telegram"
    assert seen and seen[0] != threading.get_ident()


def test_async_wrapper_passes_values_through_and_raises_what_the_store_raises(hermes_state, db) -> None:
    wrapped = hermes_state.AsyncSessionDB(db)
    assert wrapped.db_path == db.db_path  # non-callables are returned as they are

    async def main():
        await wrapped.create_session("s1", "cli")
        await wrapped.set_session_title("s1", "taken")
        await wrapped.create_session("s2", "cli")
        await wrapped.set_session_title("s2", "taken")

    with pytest.raises(ValueError, match="already in use"):
        asyncio.run(main())
    with pytest.raises(AttributeError):
        _ = wrapped.no_such_method


def test_async_wrapper_gathers_concurrent_appends_without_losing_any(hermes_state, db) -> None:
    wrapped = hermes_state.AsyncSessionDB(db)

    async def main():
        await wrapped.create_session("s1", "cli")
        await asyncio.gather(*(wrapped.append_message("s1", "user", f"m{i}") for i in range(40)))
        return await wrapped.get_session("s1")

    row = asyncio.run(main())
    assert row["message_count"] == 40
    assert sorted(m["content"] for m in db.get_messages("s1")) == sorted(f"m{i}" for i in range(40))


# ----------------------------------------------------------------------------- helpers

def test_workspace_key(hermes_state) -> None:
    wk = hermes_state.workspace_key
    assert wk({"git_repo_root": " /r ", "cwd": "/r/sub"}) == "/r"
    assert wk({"git_repo_root": "  ", "cwd": " /r/sub "}) == "/r/sub"
    assert wk({"git_repo_root": None, "cwd": None}) is None
    assert wk({}) is None


def test_is_malformed_db_error(hermes_state) -> None:
    assert hermes_state.is_malformed_db_error(sqlite3.DatabaseError("database disk image is malformed"))
    assert hermes_state.is_malformed_db_error(sqlite3.DatabaseError("malformed database schema (x)"))
    assert not hermes_state.is_malformed_db_error(sqlite3.OperationalError("database is locked"))
    assert not hermes_state.is_malformed_db_error(ValueError("database disk image is malformed"))


def test_init_error_text_and_the_nfs_hint(hermes_state) -> None:
    try:
        hermes_state._set_last_init_error(None)
        assert hermes_state.get_last_init_error() is None
        assert hermes_state.format_session_db_unavailable() == "Session database not available."
        hermes_state._set_last_init_error("OperationalError: locking protocol")
        text = hermes_state.format_session_db_unavailable("No DB")
        assert text.startswith("No DB: OperationalError: locking protocol") and "NFS" in text and text.endswith(".")
        hermes_state._set_last_init_error("OperationalError: disk I/O error")  # v26 made it a marker again
        assert "NFS" in hermes_state.format_session_db_unavailable()
        hermes_state._set_last_init_error("OperationalError: no such table: x")
        assert "NFS" not in hermes_state.format_session_db_unavailable()
    finally:
        hermes_state._set_last_init_error(None)


def test_a_failed_open_records_its_error(hermes_state, tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(Exception) as info:
        hermes_state.SessionDB(tmp_path / "dir.db")
    try:
        assert hermes_state.get_last_init_error() == f"{type(info.value).__name__}: {info.value}"
    finally:
        hermes_state._set_last_init_error(None)


class _Conn:
    """A stand-in DB-API connection answering the journal PRAGMAs (for the NFS branches)."""

    def __init__(self, on_disk: str, error: str | None) -> None:
        self.on_disk, self.error, self.sql = on_disk, error, []

    def execute(self, sql: str):
        self.sql.append(sql)
        if sql == "PRAGMA journal_mode=WAL" and self.error:
            raise sqlite3.OperationalError(self.error)
        value = "delete" if sql == "PRAGMA journal_mode=DELETE" else ("wal" if sql.endswith("=WAL") else self.on_disk)
        return type("C", (), {"fetchone": lambda _s: (value,)})()


@pytest.mark.sqlite_only
def test_apply_wal_with_fallback_v26_rules_on_a_fixed_sqlite(hermes_state, caplog, monkeypatch) -> None:
    monkeypatch.setattr("hermes_state.sys.platform", "linux")
    monkeypatch.setattr(hermes_state, "is_sqlite_wal_reset_vulnerable", lambda *a: False)
    hermes_state._wal_fallback_warned_paths.discard("nfs-label")
    already = _Conn("wal", None)
    assert hermes_state.apply_wal_with_fallback(already) == "wal"
    assert "PRAGMA journal_mode=WAL" not in already.sql  # not switched again
    nfs = _Conn("delete", "locking protocol")
    with caplog.at_level(logging.WARNING):
        assert hermes_state.apply_wal_with_fallback(nfs, db_label="nfs-label") == "delete"
        assert hermes_state.apply_wal_with_fallback(_Conn("delete", "not authorized"), db_label="nfs-label") == "delete"
    assert sum("nfs-label" in r.getMessage() for r in caplog.records) == 1  # once per label
    assert "nfs-label" in hermes_state._wal_fallback_warned_paths
    eio = _Conn("delete", "disk I/O error")
    assert hermes_state.apply_wal_with_fallback(eio) == "delete"  # a marker again in v26, after 3 tries
    assert eio.sql.count("PRAGMA journal_mode=WAL") == 3
    with pytest.raises(sqlite3.OperationalError):
        hermes_state.apply_wal_with_fallback(_Conn("delete", "something else"))
    with pytest.raises(hermes_state.WalUnsupportedError):
        hermes_state.apply_wal_with_fallback(_Conn("delete", "locking protocol"), require_wal=True)


@pytest.mark.sqlite_only
def test_apply_wal_on_macos_adds_the_barrier_and_full_sync(hermes_state, monkeypatch) -> None:
    monkeypatch.setattr("hermes_state.sys.platform", "darwin")
    conn = _Conn("wal", None)
    assert hermes_state.apply_wal_with_fallback(conn) == "wal"
    assert "PRAGMA checkpoint_fullfsync=1" in conn.sql and "PRAGMA synchronous=FULL" in conn.sql


def test_background_review_harness_is_stripped_with_its_reply(hermes_state) -> None:
    msgs = [
        {"role": "user", "content": "real question"},
        {"role": "assistant", "content": "real answer"},
        {"role": "user", "content": "  Review the conversation above and decide"},
        {"role": "assistant", "content": "harness reply"},
        {"role": "user", "content": "next"},
    ]
    assert hermes_state._is_background_review_harness_message(msgs[2])
    assert not hermes_state._is_background_review_harness_message(msgs[0])
    assert [m["content"] for m in hermes_state._strip_background_review_harness(msgs)] == [
        "real question", "real answer", "next"]


def test_scrub_surrogates(hermes_state) -> None:
    assert hermes_state._scrub_surrogates("a\ud800b") == "a\ufffdb"
    assert hermes_state._scrub_surrogates("plain") == "plain"
    assert hermes_state._scrub_surrogates(5) == 5


def test_cjk_tokenizer_settings(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_FTS5_CJK_SO", str(tmp_path / "x.so"))
    assert hermes_state.fts5_cjk_so_path() == tmp_path / "x.so"
    monkeypatch.setenv("HERMES_CJK_FTS", "off")
    assert hermes_state._cjk_fts_config_enabled() is False
    monkeypatch.setenv("HERMES_CJK_FTS", "1")
    assert hermes_state._cjk_fts_config_enabled() is True
    conn = sqlite3.connect(":memory:")
    assert hermes_state.load_fts5_cjk_extension(conn) is False  # missing library: False, never raises


@pytest.mark.sqlite_only
def test_ddl_strings_build_a_working_schema(hermes_state) -> None:
    conn = sqlite3.connect(":memory:")
    conn.executescript(hermes_state.SCHEMA_SQL + hermes_state.DEFERRED_INDEX_SQL
                       + hermes_state.FTS_SQL + hermes_state.FTS_TRIGRAM_SQL)
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 0)")
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'hello world', 0)")
    assert conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'hello'").fetchall() == [(1,)]
    version = conn.execute("SELECT version FROM schema_version").fetchall()
    assert version == [] or version == [(hermes_state.SCHEMA_VERSION,)]


@pytest.mark.sqlite_only
def test_schema_version_constant_matches_a_fresh_file(hermes_state, db) -> None:
    assert db._conn.execute("SELECT version FROM schema_version").fetchone()[0] == hermes_state.SCHEMA_VERSION


@pytest.mark.sqlite_only
def test_delegate_helpers_on_a_raw_connection(hermes_state, db) -> None:
    db.create_session("p", "cli")
    db.create_session("c1", "cli", parent_session_id="p", model_config={"_delegate_from": "p"})
    db.create_session("c2", "cli", parent_session_id="c1", model_config={"_delegate_from": "c1"})
    db.create_session("b", "cli", parent_session_id="p", model_config={"_branched_from": "p"})
    conn = db._conn
    assert sorted(hermes_state._collect_delegate_child_ids(conn, ["p"])) == ["c1", "c2"]
    assert hermes_state._collect_delegate_child_ids(conn, []) == []
    clause, params = hermes_state._cwd_prefix_clause("/work_1/")
    assert params[0] == "/work_1"
    db.update_session("b", cwd="/work_1/x")
    db.update_session("p", cwd="/workX1/x")  # '_' must not match any character
    assert [r[0] for r in conn.execute(f"SELECT id FROM sessions WHERE {clause}", params)] == ["b"]
