"""Hermes v26's module-level names (reference §3): constants, error classes, the
persistence-error classifiers, zeroed-file quarantine, the writability preflight,
read-only statistics, holders, and the live-system test guard."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import pytest

pytestmark = pytest.mark.sqlite_only


def test_constants(hermes_state) -> None:
    assert hermes_state.FTS_STALE_KEY == "fts_stale"
    assert hermes_state.MAX_SAFE_RESUME_MESSAGES == hermes_state.MAX_SAFE_EXPORT_MESSAGES == 20000
    assert hermes_state.PERSISTENCE_ERROR_CAUSES == (
        "locked", "compression", "compression_closed", "turn_lease", "corrupt", "disk", "unknown")
    assert hermes_state._WAL_INCOMPAT_MARKERS == ("locking protocol", "not authorized", "disk i/o error")
    assert hermes_state._WAL_SIZE_LIMIT_BYTES == 64 * 1024 * 1024
    assert (hermes_state._READ_POOL_MAX, hermes_state._READ_OPEN_RETRY_SECONDS) == (8, 60)
    assert hermes_state._REPAIR_LOCK_TIMEOUT_SECONDS == 120
    assert hermes_state._MAX_PERSISTENT_REPAIR_ATTEMPTS == hermes_state._MAX_MALFORMED_BACKUPS == 3
    assert (hermes_state._WRITE_PATIENCE_S, hermes_state._TRANSCRIPT_WRITE_PATIENCE_S,
            hermes_state._ACTIVITY_WRITE_PATIENCE_S, hermes_state._COMPRESSION_BUSY_WAIT_S) == (20.0, 60.0, 0.5, 5.0)
    assert hermes_state._STATE_DB_GUARD_BYPASS_ENV == "HERMES_STATE_DB_GUARD_BYPASS"
    assert hermes_state._STATE_DB_GUARD_BYPASS is False and hermes_state._STATE_DB_GUARD_EXTRA_DENY_ROOTS == []
    try:
        import psutil
    except ImportError:
        assert hermes_state.psutil is None
    else:
        assert hermes_state.psutil is psutil


def test_error_classes_keep_hermes_bases_and_messages(hermes_state) -> None:
    assert issubclass(hermes_state.WalUnsupportedError, sqlite3.OperationalError)
    closed = hermes_state.CompressionSessionClosedError("s1")
    assert isinstance(closed, RuntimeError) and closed.session_id == "s1"
    assert str(closed) == ("Session 's1' is closed by compression; adopt its live continuation before "
                           "appending messages")
    assert issubclass(hermes_state.CompressionSessionBusyError, RuntimeError)
    assert issubclass(hermes_state.SessionCompressionInProgressError, hermes_state.CompressionSessionBusyError)
    assert issubclass(hermes_state.SessionTurnLeaseLostError, RuntimeError)
    resume = hermes_state.SessionResumeTooLargeError(25000)
    assert isinstance(resume, ValueError) and "25000" in str(resume) and "20000" in str(resume)
    export = hermes_state.SessionExportTooLargeError("s2", 30000, 100)
    assert isinstance(export, ValueError) and "s2" in str(export) and "30000" in str(export)


@pytest.mark.parametrize("value, full", [
    (OSError(errno.ENOSPC, "nope"), True),
    ("No space left on device", True),
    (sqlite3.OperationalError("database or disk is full"), True),
    ("Not enough space on the disk", True),
    ("ENOSPC while writing", True),
    ("full disk", True),
    (OSError(errno.EACCES, "denied"), False),
    ("database is locked", False),
    (None, False),
])
def test_is_disk_full_error(hermes_state, value, full: bool) -> None:
    assert hermes_state.is_disk_full_error(value) is full


def test_classify_persistence_error_by_type_then_text(hermes_state) -> None:
    classify = hermes_state.classify_persistence_error
    assert classify(hermes_state.SessionTurnLeaseLostError("gone")) == "turn_lease"
    assert classify(hermes_state.CompressionSessionClosedError("s")) == "compression_closed"
    assert classify(hermes_state.SessionCompressionInProgressError("x")) == "compression"
    assert classify(hermes_state.CompressionSessionBusyError("x")) == "compression"
    assert classify("turn lease lost for s") == "turn_lease"
    assert classify(RuntimeError("Session 'a' is closed by compression")) == "compression_closed"
    assert classify("session is being compressed") == "compression"
    assert classify("compression lease expired") == "compression"
    assert classify(sqlite3.DatabaseError("database disk image is malformed")) == "corrupt"
    assert classify("file is not a database") == "corrupt"
    assert classify(sqlite3.OperationalError("database is locked")) == "locked"
    assert classify("database is busy") == "locked"
    assert classify("database or disk is full") == "disk"
    assert classify("attempt to write a readonly database") == "disk"
    assert classify(ValueError("something else")) == "unknown"
    assert classify(None) == "unknown"
    for cause in ("turn lease", "being compressed", "malformed", "locked", "disk", "else"):
        assert classify(cause) in hermes_state.PERSISTENCE_ERROR_CAUSES


def _zeroed(path: Path, size: int = 4096) -> Path:
    path.write_bytes(b"\0" * size)
    return path


def test_is_zeroed_state_db(hermes_state, tmp_path: Path) -> None:
    assert hermes_state.is_zeroed_state_db(_zeroed(tmp_path / "z.db"))
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert not hermes_state.is_zeroed_state_db(empty)
    assert not hermes_state.is_zeroed_state_db(tmp_path / "missing.db")
    partly = tmp_path / "partly.db"
    partly.write_bytes(b"\0" * 15 + b"x" + b"\0" * 200)
    assert not hermes_state.is_zeroed_state_db(partly, probe_bytes=1)  # at least 16 bytes are read
    assert hermes_state.is_zeroed_state_db(_zeroed(tmp_path / "short.db", 20), probe_bytes=100)
    with hermes_state.SessionDB(tmp_path / "real.db") as db:
        assert not hermes_state.is_zeroed_state_db(db.db_path, force=True)  # a real SQLite header


def test_a_live_connection_hides_a_zeroed_file_unless_forced(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path):
        data = path.read_bytes()
        path.write_bytes(b"\0" * len(data))  # as a lost write would leave it, under a live store
        assert not hermes_state.is_zeroed_state_db(path)
        assert hermes_state.is_zeroed_state_db(path, force=True)
        assert hermes_state.quarantine_zeroed_state_db(path) is None  # never moved while open
        assert path.exists()


def test_quarantine_moves_the_file_and_its_sidecars(hermes_state, tmp_path: Path) -> None:
    path = _zeroed(tmp_path / "state.db")
    Path(f"{path}-wal").write_bytes(b"wal bytes")
    moved = hermes_state.quarantine_zeroed_state_db(path)
    assert moved is not None and not path.exists()
    assert moved.name.startswith("state.db.zeroed-") and moved.name.endswith(f"-{os.getpid()}.bak")
    assert moved.read_bytes() == b"\0" * 4096
    assert Path(f"{moved}-wal").read_bytes() == b"wal bytes" and not Path(f"{path}-wal").exists()
    again = hermes_state.quarantine_zeroed_state_db(_zeroed(path))  # same second: a -n suffix
    assert again is not None and again != moved and again.name.endswith("-2.bak")
    healthy = tmp_path / "healthy.db"
    sqlite3.connect(healthy).execute("CREATE TABLE t (x)").connection.close()
    assert hermes_state.quarantine_zeroed_state_db(healthy) is None and healthy.exists()


def test_opening_a_zeroed_file_quarantines_it_and_starts_fresh(hermes_state, tmp_path: Path) -> None:
    path = _zeroed(tmp_path / "state.db")
    try:
        with hermes_state.SessionDB(path) as db:
            db.create_session("s1", "cli")
            assert db.get_session("s1") is not None
        assert "state.db looks ZEROED" in (hermes_state.get_last_init_error() or "")
    finally:
        hermes_state._set_last_init_error(None)
    kept = list(tmp_path.glob("state.db.zeroed-*.bak"))
    assert len(kept) == 1 and kept[0].read_bytes() == b"\0" * 4096


def test_preflight_refuses_a_read_only_folder_outside_hermes_home(hermes_state, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "state.db"
    sqlite3.connect(db).close()
    hermes_state.preflight_db_writability(db)  # writable: nothing to say
    os.chmod(folder, 0o555)
    try:
        with pytest.raises(sqlite3.OperationalError, match="is not writable") as info:
            hermes_state.preflight_db_writability(db, db_label="my.db")
        assert "my.db" in str(info.value) and "chmod u+rwx" in str(info.value)
        assert oct(os.stat(folder).st_mode & 0o777) == oct(0o555)  # outside HERMES_HOME: left alone
    finally:
        os.chmod(folder, 0o755)


def test_preflight_names_the_wal_file_and_warns_not_to_delete_it(hermes_state, tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    sqlite3.connect(db).close()
    wal = Path(f"{db}-wal")
    wal.write_bytes(b"")
    os.chmod(wal, 0o444)
    with pytest.raises(sqlite3.OperationalError) as info:
        hermes_state.preflight_db_writability(db)
    assert f"chmod u+rw {wal}" in str(info.value) and "Do NOT delete the -wal file" in str(info.value)


def test_preflight_heals_modes_inside_hermes_home(hermes_state, tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    db = home / "state.db"
    sqlite3.connect(db).close()
    os.chmod(db, 0o400)
    hermes_state.preflight_db_writability(db)
    assert os.stat(db).st_mode & 0o600 == 0o600


def test_preflight_skips_memory_and_uris(hermes_state) -> None:
    hermes_state.preflight_db_writability(":memory:")
    hermes_state.preflight_db_writability("file:/nowhere/at/all.db?mode=ro")


def test_session_db_refuses_a_read_only_wal_file(hermes_state, tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    hermes_state.SessionDB(db).close()
    wal = Path(f"{db}-wal")
    wal.write_bytes(b"")
    os.chmod(wal, 0o444)
    with pytest.raises(sqlite3.OperationalError, match="is not writable"):
        hermes_state.SessionDB(db)


def test_collect_state_db_stats(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "hello there")
        db.append_message("s1", "assistant", "hi")
        stats = hermes_state.collect_state_db_stats(path)
    assert set(stats) == {
        "page_count", "page_size", "freelist_count", "logical_size_bytes", "wal_size_bytes", "journal_mode",
        "messages", "sessions", "fts_tables", "fts_storage_version", "fts_rebuild_pending",
        "fts_rebuild_high_water", "fts_rebuild_progress",
    }
    assert stats["messages"] == 2 and stats["sessions"] == 1
    assert stats["logical_size_bytes"] == stats["page_count"] * stats["page_size"] > 0
    assert stats["journal_mode"] in ("wal", "delete")
    assert "messages_fts" in stats["fts_tables"]
    assert stats["fts_rebuild_pending"] is False
    broken = hermes_state.collect_state_db_stats(tmp_path / "missing.db")
    assert set(broken) == set(stats) and all(v is None for v in broken.values())


def test_count_db_holders_sees_this_process(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    assert hermes_state.count_db_holders(path) == 0
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    try:
        assert hermes_state.count_db_holders(path) == 1  # several fds, one process
    finally:
        conn.close()
    assert hermes_state.count_db_holders(path) == 0


# ----------------------------------------------------------------------------- the test-isolation guard

class _Proc:
    def __init__(self, cmdline) -> None:
        self._cmdline = cmdline

    def cmdline(self):
        if isinstance(self._cmdline, Exception):
            raise self._cmdline
        return self._cmdline


def test_guard_helpers(hermes_state, monkeypatch) -> None:
    root = hermes_state._real_platform_state_root()
    assert root == Path(os.path.realpath(os.path.expanduser("~"))) / ".hermes"
    assert hermes_state._running_under_pytest()  # PYTEST_CURRENT_TEST is set right now
    for name in ("PYTEST_CURRENT_TEST", "PYTEST_VERSION", "HERMES_TEST_ISOLATION"):
        monkeypatch.delenv(name, raising=False)
    assert not hermes_state._running_under_pytest()
    monkeypatch.setenv("HERMES_TEST_ISOLATION", "1")
    assert hermes_state._running_under_pytest() and hermes_state._in_test_context()
    assert hermes_state._process_looks_like_pytest(_Proc(["/usr/bin/python", "/venv/bin/pytest", "-q"]))
    assert hermes_state._process_looks_like_pytest(_Proc(["py.test"]))
    assert not hermes_state._process_looks_like_pytest(_Proc(["python", "app.py", "pytest-notes.txt"]))
    assert not hermes_state._process_looks_like_pytest(_Proc(PermissionError("denied")))


def test_guard_refuses_the_real_state_root_only(hermes_state, tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "user"
    monkeypatch.setenv("HOME", str(home))
    real = home / ".hermes"
    with pytest.raises(RuntimeError, match="live-system guard"):
        hermes_state.SessionDB(real / "state.db")
    with pytest.raises(RuntimeError, match="live-system guard"):
        hermes_state.SessionDB(real / "profiles" / "work" / "state.db", read_only=True)
    assert not real.exists()  # refused before anything was touched
    hermes_state._ensure_test_isolation(real / "sub" / "deeper" / "state.db")  # not directly in it
    hermes_state._ensure_test_isolation(tmp_path / "elsewhere.db")
    monkeypatch.setattr(hermes_state, "_STATE_DB_GUARD_EXTRA_DENY_ROOTS", [tmp_path / "deny"])
    with pytest.raises(RuntimeError, match="live-system guard"):
        hermes_state._ensure_test_isolation(tmp_path / "deny" / "x.db")
    monkeypatch.setenv("HERMES_STATE_DB_GUARD_BYPASS", "1")
    hermes_state._ensure_test_isolation(real / "state.db")
    monkeypatch.delenv("HERMES_STATE_DB_GUARD_BYPASS")
    monkeypatch.setattr(hermes_state, "_STATE_DB_GUARD_BYPASS", True)
    hermes_state._ensure_test_isolation(real / "state.db")


def test_guard_is_quiet_outside_tests(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("PYTEST_CURRENT_TEST", "PYTEST_VERSION", "HERMES_TEST_ISOLATION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("hermes_store.isolation._ancestry_is_pytest", False)
    hermes_state._ensure_test_isolation(tmp_path / ".hermes" / "state.db")


def test_default_db_path_follows_hermes_home_unless_repointed(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "h1"))
    assert hermes_state._default_db_path() == tmp_path / "h1" / "state.db"
    assert hermes_state.DEFAULT_DB_PATH == hermes_state._IMPORT_DEFAULT_DB_PATH
    monkeypatch.setattr(hermes_state, "DEFAULT_DB_PATH", tmp_path / "elsewhere.db")
    assert hermes_state._default_db_path() == tmp_path / "elsewhere.db"
