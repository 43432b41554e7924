"""Hermes v26's journal-mode rules (reference §3, §5.5) on real files and stand-in connections.

``apply_wal_with_fallback`` reads ``is_sqlite_wal_reset_vulnerable`` and
``resolve_journal_mode`` from ``hermes_state`` at call time, so each test chooses
the SQLite it pretends to be. Our own SessionDB connections keep WAL (see
``test_session_db_keeps_wal``): that choice is ours, not this function's.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

pytestmark = pytest.mark.sqlite_only


@pytest.mark.parametrize("version, vulnerable", [
    ((3, 6, 23), False), ((3, 7, 0), True), ((3, 40, 1), True), ((3, 44, 5), True), ((3, 44, 6), False),
    ((3, 44, 9), False), ((3, 45, 0), True), ((3, 50, 6), True), ((3, 50, 7), False), ((3, 50, 99), False),
    ((3, 51, 0), True), ((3, 51, 2), True), ((3, 51, 3), False), ((3, 52, 0), False), ((4, 0, 0), False),
    ((3, 51), True), ((3,), False), ((3, 44, 6, 1), False),
])
def test_is_sqlite_wal_reset_vulnerable_table(hermes_state, version: tuple, vulnerable: bool) -> None:
    assert hermes_state.is_sqlite_wal_reset_vulnerable(version) is vulnerable


def test_vulnerability_defaults_to_the_linked_sqlite(hermes_state) -> None:
    assert hermes_state.is_sqlite_wal_reset_vulnerable() is hermes_state.is_sqlite_wal_reset_vulnerable(
        sqlite3.sqlite_version_info)


def test_sqlite_source_id_is_empty_on_error(hermes_state, monkeypatch) -> None:
    def refuse(*_a, **_k):
        raise sqlite3.OperationalError("no")

    assert len(hermes_state.sqlite_source_id()) > 20  # "<date> <time> <hash>"
    monkeypatch.setattr("hermes_store.journal.sqlite3.connect", refuse)
    assert hermes_state.sqlite_source_id() == ""


def _config(home: Path, text: str) -> None:
    (home / "config.yaml").write_text(text, encoding="utf-8")


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    folder = tmp_path / "hermes-home"
    folder.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(folder))
    return folder


@pytest.mark.parametrize("text, mode", [
    ("", "wal"),
    ("database:\n  journal_mode: delete\n", "delete"),
    ("database:\n  journal_mode: '  DELETE '\n", "delete"),
    ("database:\n  journal_mode: WAL\n", "wal"),
    ("database:\n  journal_mode: truncate\n", "wal"),
    ("database:\n  journal_mode: 3\n", "wal"),
    ("database: just a string\n", "wal"),
    ("database: [1, 2]\n", "wal"),
    ("{not yaml: [", "wal"),
])
def test_resolve_journal_mode_from_config(hermes_state, home: Path, text: str, mode: str) -> None:
    _config(home, text)
    assert hermes_state.resolve_journal_mode() == mode


def test_resolve_journal_mode_has_no_env_override(hermes_state, home: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERMES_JOURNAL_MODE", "delete")
    monkeypatch.setenv("HERMES_DATABASE_JOURNAL_MODE", "delete")
    assert hermes_state.resolve_journal_mode() == "wal"


def _mode(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


def _file(path: Path, mode: str | None = None) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
    if mode:
        conn.execute(f"PRAGMA journal_mode={mode}")
    return conn


@pytest.fixture
def vulnerable(hermes_state, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "is_sqlite_wal_reset_vulnerable", lambda *a: True)


@pytest.fixture
def fixed(hermes_state, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "is_sqlite_wal_reset_vulnerable", lambda *a: False)


def test_vulnerable_sqlite_keeps_a_fresh_file_in_delete_with_one_warning(
        hermes_state, tmp_path: Path, vulnerable, caplog) -> None:
    label = f"fresh-{tmp_path.name}"
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            conn = _file(tmp_path / "fresh.db")
            assert hermes_state.apply_wal_with_fallback(conn, db_label=label) == "delete"
            conn.close()
    assert _mode(tmp_path / "fresh.db") == "delete"
    warned = [r for r in caplog.records if label in r.getMessage()]
    assert len(warned) == 1 and "instead of enabling WAL" in warned[0].getMessage()


def test_vulnerable_sqlite_switches_truncate_to_delete(hermes_state, tmp_path: Path, vulnerable) -> None:
    conn = _file(tmp_path / "t.db", "truncate")
    assert hermes_state.apply_wal_with_fallback(conn) == "delete"
    conn.close()
    assert _mode(tmp_path / "t.db") == "delete"


def test_vulnerable_sqlite_never_downgrades_a_wal_file(hermes_state, tmp_path: Path, vulnerable, home, caplog) -> None:
    _config(home, "database:\n  journal_mode: delete\n")
    conn = _file(tmp_path / "wal.db", "wal")
    label = f"wal-{tmp_path.name}"
    with caplog.at_level(logging.WARNING):
        assert hermes_state.apply_wal_with_fallback(conn, db_label=label) == "wal"
        assert hermes_state.apply_wal_with_fallback(conn, db_label=label) == "wal"
    conn.close()
    assert _mode(tmp_path / "wal.db") == "wal"
    assert sum(label in r.getMessage() for r in caplog.records) == 1


def test_vulnerable_sqlite_leaves_a_locked_file_as_it_is(hermes_state, tmp_path: Path, vulnerable) -> None:
    path = tmp_path / "locked.db"
    _file(path, "truncate").close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=0.2)
        assert hermes_state.apply_wal_with_fallback(conn) in ("delete", "wal")  # never raises
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 200  # restored
        conn.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


class _Conn:
    """A stand-in connection: ``PRAGMA journal_mode`` answers ``on_disk`` (or raises ``read_error``)."""

    def __init__(self, on_disk: str | None, *, wal_error: str | None = None, wal_answer: str = "wal",
                 read_error: str | None = None, delete_sticks: bool = True) -> None:
        self.on_disk, self.wal_error, self.wal_answer = on_disk, wal_error, wal_answer
        self.read_error, self.delete_sticks, self.sql = read_error, delete_sticks, []

    def execute(self, sql: str):
        self.sql.append(sql)
        value: object = None
        if sql == "PRAGMA journal_mode":
            if self.read_error:
                raise sqlite3.OperationalError(self.read_error)
            value = self.on_disk
        elif sql == "PRAGMA journal_mode=WAL":
            if self.wal_error:
                raise sqlite3.OperationalError(self.wal_error)
            value = self.on_disk = self.wal_answer
        elif sql == "PRAGMA journal_mode=DELETE":
            if self.delete_sticks:
                self.on_disk = "delete"
            value = self.on_disk
        elif sql == "PRAGMA busy_timeout":
            value = 100
        return type("C", (), {"fetchone": lambda _s: (value,), "fetchall": lambda _s: [(value,)]})()


def test_vulnerable_unreadable_mode(hermes_state, vulnerable, home, monkeypatch) -> None:
    monkeypatch.setattr("hermes_store.journal.time.sleep", lambda s: None)
    conn = _Conn(None, read_error="disk I/O error")
    assert hermes_state.apply_wal_with_fallback(conn) == "wal"  # left as it is
    assert conn.sql.count("PRAGMA journal_mode") == 4  # EIO: read four times
    assert "PRAGMA journal_mode=DELETE" not in conn.sql
    _config(home, "database:\n  journal_mode: delete\n")
    with pytest.raises(sqlite3.OperationalError):
        hermes_state.apply_wal_with_fallback(_Conn(None, read_error="other"))


def test_vulnerable_configured_delete_must_stick(hermes_state, vulnerable, home) -> None:
    _config(home, "database:\n  journal_mode: delete\n")
    assert hermes_state.apply_wal_with_fallback(_Conn("truncate")) == "delete"
    with pytest.raises(sqlite3.OperationalError, match="stayed in truncate"):
        hermes_state.apply_wal_with_fallback(_Conn("truncate", delete_sticks=False))


def test_fixed_sqlite_enables_wal_with_the_size_limit(hermes_state, tmp_path: Path, fixed) -> None:
    conn = _file(tmp_path / "f.db")
    assert hermes_state.apply_wal_with_fallback(conn) == "wal"
    assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == hermes_state._WAL_SIZE_LIMIT_BYTES
    conn.close()
    assert _mode(tmp_path / "f.db") == "wal"


def test_fixed_sqlite_configured_delete_switches_a_delete_file_but_not_a_wal_one(
        hermes_state, tmp_path: Path, fixed, home) -> None:
    _config(home, "database:\n  journal_mode: delete\n")
    conn = _file(tmp_path / "d.db", "truncate")
    assert hermes_state.apply_wal_with_fallback(conn) == "delete"
    conn.close()
    assert _mode(tmp_path / "d.db") == "delete"
    wal = _file(tmp_path / "w.db", "wal")
    assert hermes_state.apply_wal_with_fallback(wal) == "wal"  # never downgraded
    wal.close()
    assert _mode(tmp_path / "w.db") == "wal"
    with pytest.raises(sqlite3.OperationalError):
        hermes_state.apply_wal_with_fallback(_Conn("truncate", delete_sticks=False))


def test_fixed_sqlite_silent_refusal(hermes_state, fixed, caplog, tmp_path: Path) -> None:
    label = f"refused-{tmp_path.name}"
    with caplog.at_level(logging.ERROR):
        assert hermes_state.apply_wal_with_fallback(_Conn("memory", wal_answer="memory"), db_label=label) == "memory"
        assert hermes_state.apply_wal_with_fallback(_Conn("memory", wal_answer="memory"), db_label=label) == "memory"
    assert sum(label in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records) == 1
    with pytest.raises(hermes_state.WalUnsupportedError):
        hermes_state.apply_wal_with_fallback(_Conn("memory", wal_answer="memory"), require_wal=True)


def test_fixed_sqlite_marker_errors(hermes_state, fixed) -> None:
    nfs = _Conn("delete", wal_error="locking protocol")
    assert hermes_state.apply_wal_with_fallback(nfs) == "delete"
    eio = _Conn("delete", wal_error="disk I/O error")
    assert hermes_state.apply_wal_with_fallback(eio) == "delete"
    assert eio.sql.count("PRAGMA journal_mode=WAL") == 3  # retried twice
    with pytest.raises(hermes_state.WalUnsupportedError) as info:
        hermes_state.apply_wal_with_fallback(_Conn("delete", wal_error="not authorized"), require_wal=True)
    assert isinstance(info.value, sqlite3.OperationalError)
    with pytest.raises(sqlite3.OperationalError, match="unrelated"):
        hermes_state.apply_wal_with_fallback(_Conn("delete", wal_error="unrelated"))


def test_fixed_sqlite_marker_error_on_an_unreadable_mode_is_raised(hermes_state, fixed) -> None:
    class Flaky(_Conn):
        def execute(self, sql: str):
            if sql == "PRAGMA journal_mode":
                raise sqlite3.OperationalError("cannot read")
            return super().execute(sql)

    with pytest.raises(sqlite3.OperationalError, match="locking protocol"):
        hermes_state.apply_wal_with_fallback(Flaky("delete", wal_error="locking protocol"))


def test_apply_database_pragmas(hermes_state, tmp_path: Path, home, caplog) -> None:
    _config(home, "database:\n  cache_size: -4000\n  temp_store: 2\n  mmap_size: '1048576'\n"
                  "  wal_autocheckpoint: lots\n  journal_size_limit: null\n")
    conn = sqlite3.connect(tmp_path / "p.db")
    with caplog.at_level(logging.WARNING):
        hermes_state.apply_database_pragmas(conn, db_label="p.db")
    assert conn.execute("PRAGMA cache_size").fetchone()[0] == -4000
    assert conn.execute("PRAGMA temp_store").fetchone()[0] == 2
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000  # untouched default
    assert any("ignoring non-integer database.wal_autocheckpoint" in r.getMessage() for r in caplog.records)
    conn.close()


def test_apply_database_pragmas_ignores_pragma_errors_and_bad_config(hermes_state, home) -> None:
    class Refusing:
        def execute(self, sql: str):
            raise sqlite3.OperationalError("no")

    _config(home, "database:\n  cache_size: 10\n")
    hermes_state.apply_database_pragmas(Refusing())
    _config(home, "database: nope\n")
    hermes_state.apply_database_pragmas(Refusing())


def test_session_db_applies_the_configured_pragmas(hermes_state, tmp_path: Path, home) -> None:
    _config(home, "database:\n  cache_size: -1234\n")
    with hermes_state.SessionDB(tmp_path / "state.db") as db:
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA cache_size").scalar() == -1234


def test_session_db_keeps_wal(hermes_state, tmp_path: Path) -> None:
    """Our own connections stay in WAL on this SQLite too (readers beside writers across
    processes); Hermes v26 processes opening the file keep WAL too (never downgraded)."""
    with hermes_state.SessionDB(tmp_path / "state.db") as db:
        assert db.journal_mode == "wal" and db._wal_active is True
    assert _mode(tmp_path / "state.db") == "wal"
    conn = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    assert hermes_state.apply_wal_with_fallback(conn) == "wal"
    conn.close()


def test_wal_reset_repair_hint(hermes_state, monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "is_sqlite_wal_reset_vulnerable", lambda *a: False)
    assert hermes_state._wal_reset_repair_hint() == ""
    monkeypatch.setattr(hermes_state, "is_sqlite_wal_reset_vulnerable", lambda *a: True)
    hint = hermes_state._wal_reset_repair_hint("x.db")
    assert "x.db" in hint and "3.51.3" in hint and "journal_mode: delete" in hint


def test_on_disk_journal_mode(hermes_state, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("hermes_store.journal.time.sleep", lambda s: None)
    conn = _file(tmp_path / "m.db", "wal")
    assert hermes_state._on_disk_journal_mode(conn) == "wal"
    conn.close()
    assert hermes_state._on_disk_journal_mode(_Conn(None, read_error="database is locked")) is None

    class OnceEio(_Conn):
        tries = 0

        def execute(self, sql: str):
            OnceEio.tries += 1
            if OnceEio.tries == 1:
                raise sqlite3.OperationalError("disk I/O error")
            return super().execute(sql)

    assert hermes_state._on_disk_journal_mode(OnceEio("DELETE")) == "delete"
