"""Hermes v26's malformed-file repair across processes (v26 reference §5.7): the
``<name>.repair.lock`` surgery lock, the ``<name>.repair-attempts.json`` ledger that
stops repairing a file no strategy can fix, and the schema-cookie bump after an edit
of ``sqlite_master``. Each guard is shown by the fault it is there for: a second
process holding the lock, a file that fails every strategy, a changed file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_store import errors
from hermes_store.repair import _existing_malformed_backups

from .helpers import break_schema


def _unfixable(path: Path) -> bytes:
    """A file SQLite calls a database but cannot read: every strategy fails on it."""
    path.write_bytes(b"SQLite format 3\0" + b"\x01" * 4000)
    return path.read_bytes()


def _backups(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.glob(f"{path.name}.malformed-backup-*") if not p.name.endswith(("-wal", "-shm")))


def _ledger(path: Path) -> Path:
    return path.with_name(f"{path.name}.repair-attempts.json")


def _healthy(hermes_state, path: Path) -> None:
    with hermes_state.SessionDB(path) as store:
        store.create_session("s1", "cli")
        store.append_message("s1", "user", "keep me")


def test_failed_repairs_of_an_unchanged_file_stop_at_the_limit(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    before = _unfixable(path)
    for attempt in range(1, hermes_state._MAX_PERSISTENT_REPAIR_ATTEMPTS + 1):
        outcome = hermes_state.repair_state_db_schema(path)
        assert outcome["repaired"] is False and outcome["backup_path"] is not None
        entry = json.loads(_ledger(path).read_text())
        assert entry["failures"] == attempt
        assert entry["fingerprint"] == f"{path.stat().st_size}:{path.stat().st_mtime_ns}"
    assert oct(_ledger(path).stat().st_mode & 0o777) == "0o600"
    made = _backups(path)
    stamp = path.stat().st_mtime_ns
    refused = hermes_state.repair_state_db_schema(path)
    assert refused["repaired"] is False and refused["backup_path"] is None
    assert refused["error"].startswith("repair refused: 3 earlier repairs of this file failed")
    assert path.read_bytes() == before and path.stat().st_mtime_ns == stamp  # not touched
    assert _backups(path) == made  # and no new backup
    assert json.loads(_ledger(path).read_text())["failures"] == 3


def test_a_changed_file_gets_a_fresh_count(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _unfixable(path)
    for _ in range(3):
        hermes_state.repair_state_db_schema(path)
    assert hermes_state.repair_state_db_schema(path)["error"].startswith("repair refused")
    _unfixable(path)  # rewritten (restored by hand, say): other mtime
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    again = hermes_state.repair_state_db_schema(path)
    assert not again["error"].startswith("repair refused")
    assert json.loads(_ledger(path).read_text())["failures"] == 1


def test_the_limit_is_read_where_hermes_tests_patch_it(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "_MAX_PERSISTENT_REPAIR_ATTEMPTS", 1)
    path = tmp_path / "state.db"
    _unfixable(path)
    assert hermes_state.repair_state_db_schema(path)["backup_path"] is not None
    assert hermes_state.repair_state_db_schema(path)["error"].startswith("repair refused: 1 earlier")


def test_a_successful_repair_clears_the_ledger_and_bumps_the_schema_cookie(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    break_schema(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA writable_schema=ON")  # reads the cookie past the damaged schema
    cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.close()
    size, mtime = path.stat().st_size, path.stat().st_mtime_ns
    _ledger(path).write_text(json.dumps({"fingerprint": f"{size}:{mtime}", "failures": 2}))
    outcome = hermes_state.repair_state_db_schema(path)
    assert outcome["repaired"] is True and outcome["strategy"] == "dedup_schema"
    assert not _ledger(path).exists()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA schema_version").fetchone()[0] > cookie
        assert conn.execute("SELECT content FROM messages").fetchall() == [("keep me",)]
    finally:
        conn.close()


# ----------------------------------------------------------------------------- a second process

_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path.with_name(f"{path.name}.repair.lock")),
                              str(seconds)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def _repair_while_held(hermes_state, path: Path, seconds: float, *, kill: bool) -> tuple[dict, float]:
    """Repair ``path`` while another process holds its repair lock for ``seconds``
    (killed afterwards, or waited for): the outcome and how long the repair took."""
    child = _hold_lock(path, seconds)
    try:
        started = time.monotonic()
        outcome = hermes_state.repair_state_db_schema(path)
        return outcome, time.monotonic() - started
    finally:
        if kill:
            child.kill()
        child.wait()


def test_a_held_lock_on_a_file_that_now_opens_is_repaired_by_the_other_process(
        hermes_state, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    monkeypatch.setattr(hermes_state, "_REPAIR_LOCK_TIMEOUT_SECONDS", 0.3)
    outcome, waited = _repair_while_held(hermes_state, path, 30, kill=True)
    assert outcome == {"repaired": True, "strategy": "repaired_by_other_process", "backup_path": None, "error": None}
    assert 0.3 <= waited < 10


def test_a_held_lock_on_a_broken_file_touches_nothing(hermes_state, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "state.db"
    before = _unfixable(path)
    monkeypatch.setattr(hermes_state, "_REPAIR_LOCK_TIMEOUT_SECONDS", 0.2)
    outcome, _waited = _repair_while_held(hermes_state, path, 30, kill=True)
    assert outcome["repaired"] is False and "another process is repairing" in outcome["error"]
    assert path.read_bytes() == before and _backups(path) == [] and not _ledger(path).exists()


def test_a_repair_waits_for_the_other_process_then_runs(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    break_schema(path)
    outcome, waited = _repair_while_held(hermes_state, path, 0.8, kill=False)
    assert outcome["repaired"] is True and outcome["strategy"] == "dedup_schema"
    assert waited >= 0.5
    assert not path.with_name("state.db.repair.lock").exists()  # the holder removes it


def test_a_killed_holder_never_blocks_the_next_repair(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    break_schema(path)
    child = _hold_lock(path, 60)
    child.kill()  # SIGKILL: the kernel drops its flock, its lock file stays behind
    child.wait()
    assert path.with_name("state.db.repair.lock").exists()
    started = time.monotonic()
    outcome = hermes_state.repair_state_db_schema(path)
    assert outcome["repaired"] is True and time.monotonic() - started < 10


@pytest.mark.parametrize("kind", ["lock", "ledger"])
def test_the_constructor_goes_through_the_guards(hermes_state, tmp_path: Path, kind: str, monkeypatch) -> None:
    """SessionDB's open-time repair is the same function: a file past the limit is not
    operated on again at every open; the open fails with the file as it was."""
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    break_schema(path)
    before = path.read_bytes()
    if kind == "ledger":
        _ledger(path).write_text(json.dumps({"fingerprint": f"{path.stat().st_size}:{path.stat().st_mtime_ns}",
                                             "failures": 3}))
        child = None
    else:
        monkeypatch.setattr(hermes_state, "_REPAIR_LOCK_TIMEOUT_SECONDS", 0.2)
        child = _hold_lock(path, 30)
    try:
        with pytest.raises(errors.NotADatabaseError, match="malformed database schema"):
            hermes_state.SessionDB(path)
    finally:
        if child is not None:
            child.kill()
            child.wait()
    assert path.read_bytes() == before and _backups(path) == []


# ----------------------------------------------------------------------------- faults repaired in place


def _bump(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute(f"PRAGMA schema_version = {version + 1}")


def _stale_index(path: Path) -> str:
    """A b-tree index that misses rows: its schema entry is taken out, rows are written
    (the index b-tree is not told), and the entry is put back on the same root page."""
    conn = sqlite3.connect(path, isolation_level=None)
    name, table, root, sql = conn.execute(
        "SELECT name, tbl_name, rootpage, sql FROM sqlite_master"
        " WHERE type = 'index' AND tbl_name = 'sessions' AND sql IS NOT NULL ORDER BY name LIMIT 1"
    ).fetchone()
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("DELETE FROM sqlite_master WHERE name = ?", (name,))
    _bump(conn)
    conn.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executemany("INSERT INTO sessions (id, source, started_at) VALUES (?, 'cli', 1)",
                     [(f"unindexed{i}",) for i in range(20)])
    conn.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) VALUES ('index', ?, ?, ?, ?)",
                 (name, table, root, sql))
    _bump(conn)
    conn.close()
    return name


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def _messages(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT content FROM messages ORDER BY id")]
    finally:
        conn.close()


def _with_words(hermes_state, path: Path, n: int = 30) -> None:
    with hermes_state.SessionDB(path) as store:
        store.create_session("s1", "cli")
        for i in range(n):
            store.append_message("s1", "user", f"hello world number {i}")


def _corrupt_fts(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(sql)
    finally:
        conn.close()


#: FTS read corruption: the index's leaf pages overwritten (a MATCH fails, writes too).
_FTS_READ_FAULT = "UPDATE messages_fts_data SET block = x'0000ffff00ff' WHERE id > 10"
#: FTS write corruption: the averages record gone (reads still answer; every insert fails).
_FTS_WRITE_FAULT = "DELETE FROM messages_fts_data WHERE id = 1"


def test_a_stale_btree_index_is_reindexed_in_place(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    _stale_index(path)
    assert _integrity(path) != "ok"
    assert hermes_state._db_opens_cleanly(path).startswith("integrity_check:")
    outcome = hermes_state.repair_state_db_schema(path)
    assert outcome["repaired"] is True and outcome["strategy"] == "reindex_btree", outcome
    assert outcome["backup_path"] is not None and Path(outcome["backup_path"]).exists()
    assert _integrity(path) == "ok" and _messages(path) == ["keep me"]


def test_fts_read_corruption_is_found_and_rebuilt_in_place(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _with_words(hermes_state, path)
    _corrupt_fts(path, _FTS_READ_FAULT)
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):
        conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'hello'").fetchall()
    conn.close()
    assert "malformed" in hermes_state._db_opens_cleanly(path)
    outcome = hermes_state.repair_state_db_schema(path)
    assert outcome["repaired"] is True and outcome["strategy"] == "rebuild_fts", outcome
    assert len(_messages(path)) == 30
    with hermes_state.SessionDB(path) as store:
        assert len(store.search_messages("hello", limit=50)) == 30


def test_fts_write_corruption_is_found_and_rebuilt_in_place(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _with_words(hermes_state, path)
    _corrupt_fts(path, _FTS_WRITE_FAULT)
    reason = hermes_state._db_opens_cleanly(path)
    assert reason is not None and "malformed" in reason  # the real cause, not a failed ROLLBACK
    outcome = hermes_state.repair_state_db_schema(path)
    assert outcome["repaired"] is True and outcome["strategy"] == "rebuild_fts", outcome
    with hermes_state.SessionDB(path) as store:
        store.append_message("s1", "user", "hello after the repair")
        assert len(store.search_messages("hello", limit=50)) == 31


@pytest.mark.parametrize("fault", [_FTS_READ_FAULT, _FTS_WRITE_FAULT])
def test_a_store_meeting_fts_corruption_rebuilds_it_in_place(hermes_state, tmp_path: Path, fault: str) -> None:
    """Through SessionDB: a search (read) or an append (write) that meets a damaged index
    rebuilds it once and goes on; no message is lost."""
    path = tmp_path / "state.db"
    _with_words(hermes_state, path)
    _corrupt_fts(path, fault)
    with hermes_state.SessionDB(path) as store:
        assert len(store.search_messages("hello", limit=50)) == 30
    _corrupt_fts(path, fault)
    with hermes_state.SessionDB(path) as store:
        store.append_message("s1", "user", "hello once more")
        assert len(store.search_messages("hello", limit=50)) == 31
    assert hermes_state._db_opens_cleanly(path) is None


def test_open_time_repair_is_tried_once_per_process_per_path(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "_repair_attempted_paths", set())
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    break_schema(path)
    with hermes_state.SessionDB(path) as store:  # repaired on open
        assert [m["content"] for m in store.get_messages("s1")] == ["keep me"]
    assert os.path.realpath(path) in hermes_state._repair_attempted_paths
    break_schema(path)
    before = path.read_bytes()
    with pytest.raises(errors.NotADatabaseError, match="malformed database schema"):
        hermes_state.SessionDB(path)  # this process already tried this path
    assert path.read_bytes() == before
    hermes_state._repair_attempted_paths.clear()
    with hermes_state.SessionDB(path) as store:
        assert [m["content"] for m in store.get_messages("s1")] == ["keep me"]


def test_a_patched_health_probe_is_used(hermes_state, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    calls: list[Path] = []

    def probe(p: Path):
        calls.append(Path(p))
        return None

    monkeypatch.setattr(hermes_state, "_db_opens_cleanly", probe)
    assert hermes_state.repair_state_db_schema(path)["strategy"] == "already_healthy"
    assert calls == [path]


def test_existing_malformed_backups_newest_first_and_capped(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    assert _existing_malformed_backups(path) == []
    made = []
    for i in range(hermes_state._MAX_MALFORMED_BACKUPS + 2):
        with hermes_state.SessionDB(path) as store:
            store.append_message("s1", "user", f"change {i}")  # other bytes: a new backup each time
        saved, refusal = hermes_state._backup_db_file(path)
        assert refusal is None and saved is not None
        made.append(saved)
    found = _existing_malformed_backups(path)
    assert found == list(reversed(made))[:hermes_state._MAX_MALFORMED_BACKUPS]
    assert all(p.exists() for p in found) and not made[0].exists()
    assert _existing_malformed_backups(tmp_path / "missing" / "state.db") == []


def test_the_backup_cap_is_read_where_hermes_tests_patch_it(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "_MAX_MALFORMED_BACKUPS", 1)
    path = tmp_path / "state.db"
    _healthy(hermes_state, path)
    for i in range(3):
        with hermes_state.SessionDB(path) as store:
            store.append_message("s1", "user", f"change {i}")
        last, _ = hermes_state._backup_db_file(path)
    assert _existing_malformed_backups(path) == [last]
