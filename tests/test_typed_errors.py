"""Every failure a caller can cause or meet is a HermesStoreError with the driver error
chained: bad ids and bulk items, unknown sessions in bulk, a full disk, a read-only file,
a file that cannot be opened. Faults are real: a capped page count makes SQLite report a
full disk, a read-only open makes it refuse writes. "Locked" stays untranslated, since
the facade's retry loop handles it."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from hermes_store import SessionDB, UnitOfWork, errors
from hermes_store.engine import create_engine, translate_driver_error
from hermes_store.dialects import for_connection
from hermes_store.repositories.base import UnknownFieldError

BAD_ID = "sess\ud800ion"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _integrity_ok(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        for table in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
    finally:
        conn.close()


# ---------------------------------------------------------------- the translation table


def _real_error(sql: str, conn: sqlite3.Connection) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as info:
        conn.execute(sql)
    return info.value


def test_translate_driver_error_on_real_driver_errors(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    # read-only
    conn.execute("PRAGMA query_only = 1")
    ro = _real_error("INSERT INTO t VALUES (1)", conn)
    conn.execute("PRAGMA query_only = 0")
    assert type(translate_driver_error(ro)) is errors.ReadOnlyDatabaseError
    # full
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    full = _real_error("INSERT INTO t SELECT zeroblob(100000)", conn)
    assert type(translate_driver_error(full)) is errors.DiskFullError
    # cannot open (a folder is not a database file)
    with pytest.raises(sqlite3.OperationalError) as cant:
        sqlite3.connect(tmp_path / "missing" / "x.db")
    assert type(translate_driver_error(cant.value)) is errors.DatabaseUnavailableError
    # bad text
    with pytest.raises(UnicodeEncodeError) as bad:
        conn.execute("SELECT ?", (BAD_ID,))
    assert isinstance(translate_driver_error(bad.value), errors.InvalidInputError)
    # left alone: plain SQL errors, and locks (the facade retries those)
    assert translate_driver_error(_real_error("SELECT nope FROM t", conn)) is None
    other = sqlite3.connect(tmp_path / "t.db", isolation_level=None, timeout=0)
    conn.execute("BEGIN IMMEDIATE")
    locked = _real_error("BEGIN IMMEDIATE", other)
    conn.execute("ROLLBACK")
    assert "locked" in str(locked)
    assert translate_driver_error(locked) is None
    assert translate_driver_error(ValueError("not a driver error")) is None
    other.close()
    conn.close()


def test_a_lock_met_through_the_engine_is_typed(head_db: Path) -> None:
    """Issue 29: no caller meets a raw driver error. A host's unit of work behind another
    process's writer gets DatabaseLockedError (the driver's error chained), which our
    retry loops accept as a lock."""
    holder = sqlite3.connect(head_db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    engine = create_engine(head_db, busy_timeout_ms=0)
    try:
        with pytest.raises(errors.DatabaseLockedError) as info:
            with UnitOfWork(engine) as uow:
                uow.sessions.create("s", "cli")
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert "locked" in str(info.value)
        assert for_connection(engine).is_retryable(info.value)
        with engine.connect() as conn:  # a plain SQLAlchemy write on our engine: typed too
            with pytest.raises(errors.DatabaseLockedError):
                conn.exec_driver_sql("INSERT INTO state_meta (key, value) VALUES ('k', 'v')")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        engine.dispose()


def test_unable_to_open_is_database_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-folder.db").mkdir()  # a missing folder is created now; a folder is no database
    engine = create_engine(tmp_path / "a-folder.db")
    with pytest.raises(errors.DatabaseUnavailableError) as info:
        with engine.connect():
            pass
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert not (tmp_path / "no-such-dir").exists()
    engine.dispose()


# ---------------------------------------------------------------- full disk


def _cap_pages(conn: sqlite3.Connection, spare: int = 2) -> None:
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + spare}")


def test_disk_full_through_the_facade_keeps_earlier_rows(db: SessionDB) -> None:
    db.create_session("s", "cli")
    early = [db.append_message("s", "user", f"early row {i}") for i in range(5)]
    db.set_meta("k", "before")
    db._execute_write(_cap_pages)  # the write connection is reused for the next writes
    big = "x" * 20_000
    with pytest.raises(errors.DiskFullError) as single:
        for _ in range(50):
            db.append_message("s", "user", big)
    with pytest.raises(errors.DiskFullError) as bulk:
        db.append_messages([{"session_id": "s", "role": "user", "content": big}] * 80)
    with pytest.raises(errors.DiskFullError) as meta:
        db.set_meta("k", big * 5)
    for info in (single, bulk, meta):
        assert isinstance(info.value, errors.DatabaseUnavailableError)
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert "full" in str(info.value.__cause__)
    stored = db.get_messages("s")
    assert [m["id"] for m in stored][:5] == early
    assert all(m["content"] != big * 5 for m in stored)
    assert db.get_session("s")["message_count"] == len(stored)  # counters rolled back with the rows
    assert db.get_meta("k") == "before"
    path = db.db_path
    db.close()
    _integrity_ok(path)


def test_disk_full_through_a_unit_of_work(head_db: Path) -> None:
    engine = create_engine(head_db)
    with UnitOfWork(engine) as uow:
        uow.sessions.create("s", "cli")
        uow.messages.append("s", "user", "kept")
    event.listen(engine, "connect", lambda c, _r: _cap_pages(c, 1))
    engine.dispose()  # new connections get the cap
    with pytest.raises(errors.DiskFullError):
        with UnitOfWork(engine) as uow:
            uow.messages.bulk_append([{"session_id": "s", "role": "user", "content": "y" * 50_000}] * 3)
    with UnitOfWork(engine, write=False) as uow:
        assert [m["content"] for m in uow.messages.get_messages("s")] == ["kept"]
        assert uow.sessions.get("s")["message_count"] == 1
    engine.dispose()
    _integrity_ok(head_db)


# ---------------------------------------------------------------- read-only file


def _read_only_engine(path: Path):
    """An engine on a 0400 file. Root ignores file modes, so as root the file is also
    opened read-only by URI: SQLite then refuses writes exactly as for a 0400 file."""
    os.chmod(path, stat.S_IRUSR)
    if os.geteuid() == 0:
        return create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    return create_engine(path)


def test_write_to_read_only_file_is_typed_and_changes_nothing(head_db: Path) -> None:
    engine = create_engine(head_db)
    with UnitOfWork(engine) as uow:
        uow.sessions.create("s", "cli")
        uow.messages.append("s", "user", "already here")
    engine.dispose()
    before = _sha(head_db)
    ro = _read_only_engine(head_db)
    try:
        attempts = [
            lambda u: u.sessions.create("t", "cli"),
            lambda u: u.messages.append("s", "user", "new"),  # raw DB-API fast path
            lambda u: u.messages.bulk_append([{"session_id": "s", "role": "user", "content": "n"}]),
            lambda u: u.maintenance.set_meta("k", "v"),
        ]
        for attempt in attempts:
            with pytest.raises(errors.ReadOnlyDatabaseError) as info:
                with UnitOfWork(ro) as uow:
                    attempt(uow)
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert "readonly" in str(info.value.__cause__)
        with UnitOfWork(ro, write=False) as uow:  # reading still works
            assert uow.messages.count("s") == 1
    finally:
        ro.dispose()
        os.chmod(head_db, stat.S_IRUSR | stat.S_IWUSR)
    assert _sha(head_db) == before


def test_query_only_connection_is_read_only_too(head_db: Path) -> None:
    engine = create_engine(head_db)
    event.listen(engine, "connect", lambda c, _r: c.execute("PRAGMA query_only = 1"))
    try:
        with pytest.raises(errors.ReadOnlyDatabaseError):
            with UnitOfWork(engine) as uow:
                uow.sessions.create("s", "cli")
    finally:
        engine.dispose()


# ---------------------------------------------------------------- bad ids


def test_lone_surrogate_in_ids_is_refused_not_altered(db: SessionDB) -> None:
    db.create_session("ok", "cli")
    calls = [
        lambda: db.create_session(BAD_ID, "cli"),
        lambda: db.ensure_session(BAD_ID),
        lambda: db.append_message(BAD_ID, "user", "hi"),
        lambda: db.append_message("ok", "us\udc80er", "hi"),  # role is a key too
        lambda: db.append_messages([{"session_id": BAD_ID, "role": "user", "content": "hi"}]),
        lambda: db.replace_messages(BAD_ID, [{"role": "user", "content": "hi"}]),
        lambda: db.get_session(BAD_ID),
        lambda: db.get_messages(BAD_ID),
        lambda: db.set_session_title(BAD_ID, "t"),
        lambda: db.set_meta("key\ud800", "v"),
        lambda: db.delete_session(BAD_ID),
    ]
    for call in calls:
        with pytest.raises(errors.InvalidInputError) as info:
            call()
        assert isinstance(info.value.__cause__, UnicodeEncodeError)
    assert db.session_count() == 1 and db.message_count() == 0
    assert db.get_meta("key\ufffd") is None
    # Content is different: a broken character must not cost the message.
    db.append_message("ok", "user", "text \ud800 kept")
    assert db.get_messages("ok")[0]["content"] == "text \ufffd kept"


def test_import_with_bad_session_id_is_refused(db: SessionDB) -> None:
    with pytest.raises(errors.InvalidInputError):
        db.import_records([{"id": BAD_ID, "source": "cli", "started_at": 1.0, "messages": []}])
    with pytest.raises(errors.InvalidInputError, match="no 'id'"):
        db.import_records([{"source": "cli", "started_at": 1.0}])
    with pytest.raises(errors.InvalidInputError, match="must be a dict"):
        db.import_records(["not a record"])
    assert db.session_count() == 0


# ---------------------------------------------------------------- bulk append


@pytest.mark.parametrize("size", [3, 100])  # plain executemany, and the staged path
def test_bulk_append_to_unknown_session_is_not_found_and_inserts_nothing(db: SessionDB, size: int) -> None:
    db.create_session("known", "cli")
    items = [{"session_id": "known", "role": "user", "content": f"m{i}"} for i in range(size)]
    items.insert(size // 2, {"session_id": "ghost", "role": "user", "content": "lost?"})
    with pytest.raises(errors.NotFoundError, match="ghost") as info:
        db.append_messages(items)
    assert f"#{size // 2}" in str(info.value)
    assert db.message_count() == 0
    assert db.get_session("known")["message_count"] == 0
    with pytest.raises(errors.NotFoundError):  # single append says the same
        db.append_message("ghost", "user", "x")


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"session_id": "s", "content": "no role"}, "no 'role'"),
        ({"role": "user", "content": "no session"}, "no 'session_id'"),
        ({"session_id": "s", "role": None, "content": "none role"}, "no 'role'"),
        ({"session_id": "s", "role": 7, "content": "int role"}, "role must be str"),
        (["session_id", "s"], "expected a dict"),
        ("user: hi", "expected a dict"),
        ({"session_id": "s", "role": "user", "content": b"\xff\xfe"}, "not valid UTF-8"),
        ({"session_id": "s", "role": "user", "timestamp": "yesterday"}, "timestamp"),
        ({"session_id": "s", "role": "user", "timestamp": float("nan")}, "finite"),
    ],
)
def test_bad_bulk_item_names_its_index_and_inserts_nothing(db: SessionDB, bad, needle: str) -> None:
    db.create_session("s", "cli")
    items = [{"session_id": "s", "role": "user", "content": "fine"}] * 4 + [bad]
    with pytest.raises(errors.InvalidInputError, match=needle) as info:
        db.append_messages(items)
    assert "message #4" in str(info.value)
    assert db.message_count() == 0 and db.get_session("s")["message_count"] == 0


def test_unknown_field_is_typed_and_still_a_type_error(db: SessionDB) -> None:
    db.create_session("s", "cli")
    with pytest.raises(TypeError, match="bogus"):  # v23's exact signature: Python refuses it
        db.append_message("s", "user", "x", bogus=1)
    for call in (
        lambda: db.append_messages([{"session_id": "s", "role": "user", "bogus": 1}]),
        lambda: db.create_session("t", "cli", bogus=1),
        lambda: db.update_session("s", bogus=1),
    ):
        with pytest.raises(UnknownFieldError, match="bogus") as info:
            call()
        assert isinstance(info.value, errors.InvalidInputError) and isinstance(info.value, TypeError)
    assert db.message_count() == 0 and db.session_count() == 1


def test_unbindable_values_are_invalid_input(db: SessionDB) -> None:
    db.create_session("s", "cli")
    with pytest.raises(errors.InvalidInputError) as too_big:
        db.append_message("s", "user", "x", token_count=2**80)
    assert isinstance(too_big.value.__cause__, OverflowError)
    with pytest.raises(errors.InvalidInputError) as odd:
        db.append_message("s", "user", "x", token_count=object())
    assert isinstance(odd.value.__cause__, sqlite3.ProgrammingError)
    with pytest.raises(errors.InvalidInputError):
        db.append_messages([{"session_id": "s", "role": "user", "token_count": 2**80}])
    assert db.message_count() == 0 and db.get_session("s")["message_count"] == 0


def test_errors_from_sqlalchemy_paths_are_typed(engine) -> None:
    """handle_error: statements through SQLAlchemy get the same table as raw ones."""
    with engine.connect() as conn:
        with pytest.raises(errors.InvalidInputError) as info:
            conn.execute(text("SELECT * FROM sessions WHERE id = :i"), {"i": BAD_ID})
        assert isinstance(info.value.__cause__, UnicodeEncodeError)
        conn.rollback()
        # An ordinary SQL error is not ours to rename.
        with pytest.raises(OperationalError):
            conn.execute(text("SELECT no_such_column FROM sessions"))


def test_hooks_do_not_trust_the_id_keyed_event_registry(head_db: Path, monkeypatch) -> None:
    """A new engine is hooked even if SQLAlchemy's registry claims it already is.

    The registry keys listeners by ``id()`` of the dialect or connection, so a new one
    at a dead one's address can look hooked (CI once passed a raw UnicodeEncodeError to
    a caller). Simulate that stale entry: every ``event.contains`` answers yes.
    """
    monkeypatch.setattr(event, "contains", lambda *a, **k: True)
    eng = create_engine(head_db)
    try:
        with eng.connect() as conn:
            with pytest.raises(errors.InvalidInputError):
                conn.execute(text("SELECT * FROM sessions WHERE id = :i"), {"i": BAD_ID})
            conn.rollback()
            # The BEGIN hook too: a write inside begin() must be a real transaction
            # the driver can roll back.
            with pytest.raises(RuntimeError):
                with conn.begin():
                    conn.execute(text("INSERT INTO state_meta (key, value) VALUES ('probe', '1')"))
                    assert conn.connection.driver_connection.in_transaction
                    raise RuntimeError("abort")
            assert conn.execute(text("SELECT count(*) FROM state_meta WHERE key = 'probe'")).scalar() == 0
    finally:
        eng.dispose()
