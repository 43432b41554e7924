"""Hermes v26's open-lock patience (v26 reference §1.5): a writable open that meets
another process's lock (a Hermes writer mid-transaction, in DELETE or WAL mode) closes
what it opened and tries again until ``_WRITE_PATIENCE_S``; any other error propagates
at once. Shown with a real second process holding the lock, on Hermes-written files
(which the open adopts) and on our own."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_store import errors

DATA = Path(__file__).resolve().parents[1] / "data" / "hermes-dbs"

_WRITER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA cache_size = 1")  # a big transaction then spills pages into the file
c.execute("BEGIN " + sys.argv[2])
c.execute("INSERT INTO state_meta (key, value) VALUES ('written by the other process', 'kept')")
for i in range(int(sys.argv[4]) if len(sys.argv) > 4 else 0):
    c.execute("INSERT INTO state_meta (key, value) VALUES (?, ?)", (f"bulk {i}", "x" * 500))
print("held", flush=True)
time.sleep(float(sys.argv[3]))
c.execute("COMMIT")
"""


def _writer(path: Path, kind: str, seconds: float) -> subprocess.Popen:
    """A Hermes-style writer holding ``BEGIN <kind>`` on ``path`` for ``seconds``, then committing."""
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), kind, str(seconds)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hermes_file(tmp_path: Path, version: str = "v26") -> Path:
    path = tmp_path / "state.db"
    shutil.copyfile(DATA / f"hermes_{version}.db", path)
    return path


def _meta(hermes_state, path: Path) -> str | None:
    with hermes_state.SessionDB(path) as store:
        return store.get_meta("written by the other process")


@pytest.mark.parametrize("kind", ["IMMEDIATE", "EXCLUSIVE"])
def test_an_open_waits_for_a_hermes_writer_then_adopts_with_its_row(hermes_state, tmp_path: Path, kind: str) -> None:
    path = _hermes_file(tmp_path)  # DELETE mode: the writer's -journal sits next to it
    child = _writer(path, kind, 1.5)
    try:
        started = time.monotonic()
        store = hermes_state.SessionDB(path)
        waited = time.monotonic() - started
    finally:
        child.wait()
    try:
        assert waited >= 1.0  # it did wait for the commit
        assert store.get_meta("written by the other process") == "kept"
        assert len(store.list_sessions_rich(limit=100, include_children=True)) > 0
        store.create_session("after", "cli")
    finally:
        store.close()
    assert hermes_state.get_last_init_error() is None or "locked" not in hermes_state.get_last_init_error()


def test_an_open_of_our_own_file_waits_for_an_exclusive_writer(hermes_state, tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path) as store:
        store.create_session("s", "cli")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")  # an exclusive writer then shuts readers out
    conn.close()
    child = _writer(path, "EXCLUSIVE", 1.0)
    try:
        started = time.monotonic()
        with hermes_state.SessionDB(path) as store:
            waited = time.monotonic() - started
            assert store.get_session("s") is not None
            assert store.get_meta("written by the other process") == "kept"
    finally:
        child.wait()
    assert waited >= 0.7


def test_patience_runs_out_with_a_locked_error_and_the_file_as_it_was(hermes_state, tmp_path: Path,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(hermes_state, "_WRITE_PATIENCE_S", 0.6)
    path = _hermes_file(tmp_path)
    before = _sha(path)
    child = _writer(path, "EXCLUSIVE", 30)
    try:
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError) as info:
            hermes_state.SessionDB(path)
        waited = time.monotonic() - started
    finally:
        child.kill()
        child.wait()
    assert isinstance(info.value, errors.DatabaseLockedError)
    assert str(info.value).startswith("database is locked (another process held")
    assert 0.6 <= waited < 10
    assert "locked" in (hermes_state.get_last_init_error() or "")
    Path(f"{path}-journal").unlink(missing_ok=True)  # the killed writer's: its change was never committed
    assert _sha(path) == before
    assert _meta(hermes_state, path) is None  # and opens fine now


@pytest.mark.parametrize("rows", [0, 3000])  # a journal without its header yet; a hot one (pages spilled)
def test_a_crashed_writers_journal_is_rolled_back_at_once_not_waited_for(hermes_state, tmp_path: Path,
                                                                        rows: int) -> None:
    """A crashed writer's journal is no lock: no patience; SQLite rolls it back as
    Hermes' next open would, and the file is adopted with every committed row."""
    path = _hermes_file(tmp_path)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as ro:
        committed = ro.execute("SELECT count(*) FROM messages").fetchone()[0]
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "IMMEDIATE", "60", str(rows)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    child.kill()  # mid-transaction: its -journal stays behind, hot
    child.wait()
    assert Path(f"{path}-journal").stat().st_size > 0
    started = time.monotonic()
    with hermes_state.SessionDB(path) as store:
        assert time.monotonic() - started < 5  # the 20 s patience was not spent on it
        assert store.message_count() == committed
        assert store.get_meta("written by the other process") is None  # never committed
        assert store.get_meta("bulk 0") is None


def test_other_open_errors_propagate_at_once(hermes_state, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(errors.HermesStoreError):
        hermes_state.SessionDB(tmp_path)  # a folder
    garbage = tmp_path / "text.db"
    garbage.write_text("not a database\n" * 20)
    with pytest.raises(errors.NotADatabaseError):
        hermes_state.SessionDB(garbage)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(("knob", "call"), [
    ("_TRANSCRIPT_WRITE_PATIENCE_S", lambda db: db.append_message("s", "user", "waits")),
    ("_TRANSCRIPT_WRITE_PATIENCE_S", lambda db: db.append_messages_batch("s", [{"role": "user", "content": "x"}])),
    ("_TRANSCRIPT_WRITE_PATIENCE_S", lambda db: db.create_session("new", "cli")),
    ("_WRITE_PATIENCE_S", lambda db: db.set_session_title("s", "a title")),
])
def test_write_patience_is_read_where_hermes_sets_it(hermes_state, tmp_path: Path, monkeypatch, knob: str,
                                                     call) -> None:
    """Hermes' three write budgets, patched on the module as its tests do: a write behind
    another process's lock gives up after that long (not after the 20/60 s default)."""
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path) as store:
        store.create_session("s", "cli")
        monkeypatch.setattr(hermes_state, knob, 0.5)
        child = _writer(path, "IMMEDIATE", 30)
        try:
            started = time.monotonic()
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                call(store)
            waited = time.monotonic() - started
        finally:
            child.kill()
            child.wait()
        assert 0.4 <= waited < 5
        assert store.get_session("new") is None and store.get_session("s")["title"] is None
