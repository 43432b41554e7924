"""Hermes v23 §1.G (FTS maintenance, VACUUM), §0's write-path extras and ``set_meta``
(§1.J), through the swapped ``hermes_state`` module, on both backends.

On SQLite the rebuild windows are exercised the way a Hermes-written file carries
them: rows inside ``(fts_rebuild_progress, fts_rebuild_high_water]`` are missing from
the FTS5 indexes and the triggers leave them alone; the backfill must index exactly
those, once. Whether an FTS5 table holds a row is read from its ``_docsize`` shadow
table, and FTS5's own ``integrity-check`` (rank 1: index against content) proves the
indexes are consistent. On PostgreSQL the same calls run against GIN indexes, where
no window, legacy layout or trash ever exists.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time as real_time
from typing import Any

import pytest
from sqlalchemy import text

from hermes_store import errors

pytestmark = pytest.mark.both_backends

INDEXES = {"sqlite": ["messages_fts", "messages_fts_trigram"],
           "postgresql": ["idx_messages_search_vector", "idx_messages_trgm"]}
LEGACY_TEXT = "COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"


class FakeTime:
    """Stands in for ``hermes_state.time``: records sleeps instead of sleeping."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(real_time, name)


@pytest.fixture
def clock(hermes_state, monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(hermes_state, "time", fake)
    return fake


def fill(db, n: int, sid: str = "s1", source: str = "cli") -> list[int]:
    """``n`` messages, every fourth a tool result; each holds the unique words ``w<i>x`` and ``片<i>段``."""
    db.create_session(sid, source)
    db.append_messages([
        {"session_id": sid, "role": "tool" if i % 4 == 3 else ("user" if i % 2 == 0 else "assistant"),
         "content": f"{sid} message w{i}x 片{i}段", "tool_name": "shell" if i % 4 == 3 else None}
        for i in range(n)
    ])
    return [m["id"] for m in db.get_messages(sid)]


def raw(db) -> sqlite3.Connection:
    return sqlite3.connect(str(db.db_path), isolation_level=None)


def docsize(db, index: str) -> list[int]:
    """Rowids FTS5 table ``index`` has indexed (duplicates would show twice)."""
    conn = raw(db)
    try:
        return [r[0] for r in conn.execute(f"SELECT id FROM {index}_docsize ORDER BY id")]
    finally:
        conn.close()


def source_ids(db, view: str) -> list[int]:
    conn = raw(db)
    try:
        return [r[0] for r in conn.execute(f"SELECT id FROM {view} ORDER BY id")]
    finally:
        conn.close()


def consistent(db, *indexes: str) -> bool:
    """FTS5's integrity-check with rank 1: the index matches its content, row for row."""
    conn = raw(db)
    try:
        for index in indexes or ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {index}({index}, rank) VALUES('integrity-check', 1)")
        return True
    except sqlite3.DatabaseError:
        return False
    finally:
        conn.close()


def matches(db, index: str, term: str) -> list[int]:
    conn = raw(db)
    try:
        return [r[0] for r in conn.execute(f"SELECT rowid FROM {index} WHERE {index} MATCH ? ORDER BY rowid", (term,))]
    finally:
        conn.close()


def open_window(db, progress: int, high_water: int, *, remove: bool = True) -> None:
    """What Hermes leaves mid-optimize: rows ``(progress, high_water]`` not indexed, the markers set."""
    def run(conn: sqlite3.Connection) -> None:
        if remove:
            conn.execute(
                "INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls) "
                "SELECT 'delete', id, content, tool_name, tool_calls FROM messages_fts_src WHERE id > ? AND id <= ?",
                (progress, high_water))
            conn.execute(
                "INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name) "
                "SELECT 'delete', id, content, tool_name FROM messages_fts_trigram_src WHERE id > ? AND id <= ?",
                (progress, high_water))
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('fts_rebuild_high_water', ?), "
                     "('fts_rebuild_progress', ?)", (str(high_water), str(progress)))
    db._execute_write(run)


def markers(db) -> dict[str, str | None]:
    keys = ("fts_rebuild_high_water", "fts_rebuild_progress", "fts_cjk_rebuild_high_water", "fts_cjk_rebuild_progress")
    return {k: db.get_meta(k) for k in keys if db.get_meta(k) is not None}


def make_legacy(db) -> None:
    """Give the file Hermes' v11-v22 layout: inline one-column indexes, filled, no views."""
    conn = raw(db)
    try:
        for kind, name in conn.execute(
            "SELECT type, name FROM sqlite_master WHERE name LIKE 'messages_fts%' AND type IN ('trigger', 'view')"
        ).fetchall():
            conn.execute(f"DROP {kind} {name}")
        conn.execute("DROP TABLE messages_fts")
        conn.execute("DROP TABLE messages_fts_trigram")
        import hermes_state

        conn.executescript(hermes_state.LEGACY_FTS_SQL + hermes_state.LEGACY_FTS_TRIGRAM_SQL)
        conn.execute(f"INSERT INTO messages_fts(rowid, content) SELECT id, {LEGACY_TEXT} FROM messages")
        conn.execute(f"INSERT INTO messages_fts_trigram(rowid, content) SELECT id, {LEGACY_TEXT} FROM messages")
    finally:
        conn.close()


def trash_tables(db) -> list[str]:
    conn = raw(db)
    try:
        return [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'fts\\_v22\\_trash\\_%' ESCAPE '\\'")]
    finally:
        conn.close()


def schema_version(db) -> int:
    return db._read(lambda c: c.execute(text("SELECT version FROM schema_version")).scalar())


# ---------------------------------------------------------------------- constants and private names


def test_constants_are_hermes_v23s(db) -> None:
    cls = type(db)
    assert (cls._FTS_REBUILD_CHUNK_ROWS, cls._FTS_REBUILD_DUTY_FACTOR, cls._FTS_REBUILD_MIN_PAUSE,
            cls._OPTIMIZE_EVERY_N_WRITES) == (500, 4.0, 0.2, 1000)
    assert cls._FTS_TABLES == ("messages_fts", "messages_fts_trigram", "messages_fts_cjk")
    assert cls._FTS_TRASH_PREFIX == "fts_v22_trash_"


def test_error_classifiers(hermes_state) -> None:
    from sqlalchemy.exc import OperationalError as SAOperationalError

    cls = hermes_state.SessionDB
    assert cls._is_fts5_unavailable_error(sqlite3.OperationalError("no such module: fts5"))
    assert cls._is_fts5_unavailable_error(SAOperationalError("CREATE", {}, sqlite3.OperationalError("no such module: fts5")))
    assert not cls._is_fts5_unavailable_error(sqlite3.OperationalError("no such table: messages_fts"))
    assert not cls._is_fts5_unavailable_error(ValueError("no such module: fts5"))
    assert cls._is_trigram_unavailable_error(sqlite3.OperationalError("no such tokenizer: trigram"))
    assert not cls._is_trigram_unavailable_error(sqlite3.OperationalError("no such module: fts5"))
    assert not cls._is_trigram_unavailable_error(sqlite3.OperationalError("no such tokenizer: cjk_unicode61"))
    assert cls._is_fts_corruption_error(sqlite3.DatabaseError("database disk image is malformed"))
    assert cls._is_fts_corruption_error(sqlite3.DatabaseError("fts5: corrupt structure record"))
    assert not cls._is_fts_corruption_error(sqlite3.OperationalError("database is locked"))
    assert not cls._is_fts_corruption_error(sqlite3.IntegrityError("constraint failed"))
    assert not cls._is_fts_corruption_error(RuntimeError("database disk image is malformed"))


def test_private_flags_and_table_probe(db, backend: str) -> None:
    assert db._fts_enabled is True
    if backend == "sqlite":
        assert db._trigram_available is True
        assert db._fts_table_exists("messages_fts") and db._fts_table_exists("messages_fts_trigram")
        assert db._fts_table_exists("messages_fts_data")  # a shadow table is a table too
    else:
        assert db._trigram_available is True  # the pg_trgm index serves substring search
        assert not db._fts_table_exists("messages_fts")  # no FTS5 on a server
    assert not db._fts_table_exists("messages_fts_cjk")  # Hermes' CJK tokenizer is not ours
    assert not db._fts_table_exists("fts_v22_trash_messages_fts_data")
    db._fts_enabled = False  # Hermes' tests switch FTS off this way
    assert db._fts_enabled is False
    assert db.fts_rebuild_step() is False
    assert db.fts_optimize_available() is False
    assert db.optimize_fts_storage() == {"ok": False, "reason": "fts5_unavailable"}
    db._trigram_available = False
    assert db._trigram_available is False


def test_trigram_flag_follows_the_index(db, backend: str) -> None:
    if backend == "sqlite":
        db._execute_write(lambda c: c.execute("DROP TABLE messages_fts_trigram"))
    else:
        db._write(lambda c: c.exec_driver_sql("DROP INDEX idx_messages_trgm"))
    assert db._trigram_available is False
    assert db._fts_enabled is True


# ---------------------------------------------------------------------- optimize / rebuild


def test_optimize_fts_returns_how_many_indexes(db, backend: str) -> None:
    fill(db, 40)
    assert db.optimize_fts() == 2
    assert db.optimize_search_indexes() == INDEXES[backend]  # the names, for the CLI
    assert [h["id"] for h in db.search_messages("w7x")] == [db.get_messages("s1")[7]["id"]]
    if backend == "sqlite":
        assert consistent(db)


def test_optimize_and_rebuild_skip_a_missing_index(db, backend: str) -> None:
    fill(db, 10)
    if backend == "sqlite":
        db._execute_write(lambda c: c.execute("DROP TABLE messages_fts_trigram"))
    else:
        db._write(lambda c: c.exec_driver_sql("DROP INDEX idx_messages_trgm"))
    assert db.optimize_fts() == 1
    assert db.rebuild_fts() == 1
    assert db.rebuild_search_indexes() == [INDEXES[backend][0], "messages_cjk_bigram"]


def test_rebuild_fts_repairs_a_damaged_index(db, backend: str) -> None:
    ids = fill(db, 30)
    if backend == "sqlite":
        # A second copy of a row: FTS5 accepts it and the index no longer matches its content.
        db._execute_write(lambda c: c.execute(
            "INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) VALUES (?, 'dup', NULL, NULL)", (ids[0],)))
        assert not consistent(db, "messages_fts")
    else:
        db._write(lambda c: c.exec_driver_sql(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'idx_messages_search_vector'::regclass"))
        assert db.check_fts()["idx_messages_search_vector"] is not None
    assert db.rebuild_fts() == 2
    assert all(problem is None for problem in db.check_fts().values())
    if backend == "sqlite":
        assert consistent(db) and docsize(db, "messages_fts") == ids
    assert [h["id"] for h in db.search_messages("w12x")] == [ids[12]]


@pytest.mark.sqlite_only
def test_rebuild_fts_closes_an_open_window(db) -> None:
    ids = fill(db, 60)
    open_window(db, ids[9], ids[49])
    assert matches(db, "messages_fts", "w30x") == []
    assert db.rebuild_fts() == 2
    assert markers(db) == {}  # the rebuild indexed the window: a later backfill would double it
    assert docsize(db, "messages_fts") == ids
    assert matches(db, "messages_fts", "w30x") == [ids[30]]
    assert consistent(db)
    assert db.fts_rebuild_step() is False


def test_rebuild_search_indexes_names_the_short_cjk_index_too(db, backend: str) -> None:
    fill(db, 5)
    assert db.rebuild_search_indexes() == INDEXES[backend] + ["messages_cjk_bigram"]


# ---------------------------------------------------------------------- vacuum


def test_vacuum_optimizes_first_and_returns_the_count(db, backend: str) -> None:
    fill(db, 200)
    db.clear_messages("s1")
    calls: list[str] = []
    real = db.optimize_fts

    def spy() -> int:
        calls.append("optimize")
        return real()

    db.optimize_fts = spy  # Hermes' tests patch the instance the same way
    assert db.vacuum() == 2
    assert calls == ["optimize"]
    if backend == "sqlite":
        conn = raw(db)
        try:
            assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0  # pages given back
        finally:
            conn.close()
    else:
        seen = db._read(lambda c: c.exec_driver_sql(
            "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'messages'").scalar())
        assert seen is True


def test_vacuum_counts_a_failed_optimize_as_zero(db) -> None:
    def broken() -> int:
        raise sqlite3.OperationalError("optimize blew up")

    db.optimize_fts = broken
    assert db.vacuum() == 0  # logged, and the VACUUM still ran


def test_vacuum_errors_propagate(db, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(engine) -> None:
        raise sqlite3.OperationalError("cannot VACUUM - SQL statements in progress")

    monkeypatch.setattr(db._dialect, "vacuum", refuse)
    with pytest.raises(sqlite3.OperationalError, match="cannot VACUUM"):
        db.vacuum()


def test_vacuum_on_a_closed_store_says_so(db) -> None:
    db.close()
    with pytest.raises(errors.DatabaseUnavailableError, match="closed"):
        db.vacuum()


# ---------------------------------------------------------------------- set_meta


def test_set_meta_upserts_text(db) -> None:
    assert db.set_meta("k", "v1") is None
    db.set_meta("k", "v2")
    db.set_meta("n", 7)
    assert (db.get_meta("k"), db.get_meta("n"), db.get_meta("absent")) == ("v2", "7", None)


def test_set_meta_with_a_cursor_runs_inside_the_callers_transaction(db, backend: str) -> None:
    conn = db.engine.raw_connection()
    try:
        cur = conn.cursor()
        if backend == "sqlite":
            cur.execute("BEGIN")  # our engine's DB-API connections are in autocommit mode
        db.set_meta("inline", "1", cursor=cur)
        db.set_meta("inline", "2", cursor=cur)  # an upsert there too
        assert db.get_meta("inline") is None  # not committed: no transaction of ours
        conn.rollback()
        assert db.get_meta("inline") is None
        if backend == "sqlite":
            cur.execute("BEGIN")
        db.set_meta("inline", "3", cursor=cur)
        conn.commit()
        assert db.get_meta("inline") == "3"
    finally:
        conn.close()


@pytest.mark.sqlite_only
def test_set_meta_with_hermes_conn_cursor(db) -> None:
    db.set_meta("via_conn", "yes", cursor=db._conn.cursor())  # autocommit: visible at once
    assert db.get_meta("via_conn") == "yes"


# ---------------------------------------------------------------------- rebuild status


@pytest.mark.parametrize("kind", ["", "cjk_"])
def test_rebuild_status_reads_the_markers(db, kind: str) -> None:
    status = getattr(db, f"fts_{kind}rebuild_status")
    assert status() is None
    db.set_meta(f"fts_{kind}rebuild_high_water", "0")
    assert status() is None  # only a positive high-water mark is a pending window
    db.set_meta(f"fts_{kind}rebuild_high_water", "1200")
    assert status() == {"pending": True, "total": 1200, "indexed": 0, "percent": 0}
    db.set_meta(f"fts_{kind}rebuild_progress", "300")
    assert status() == {"pending": True, "total": 1200, "indexed": 300, "percent": 25}
    db.set_meta(f"fts_{kind}rebuild_progress", "1199")
    assert status()["percent"] == 99  # truncated, never rounded up to "done"
    db.set_meta(f"fts_{kind}rebuild_progress", "5000")
    assert status()["percent"] == 100  # capped
    db.set_meta(f"fts_{kind}rebuild_high_water", "garbage")
    assert status() is None


def test_no_window_no_step(db) -> None:
    fill(db, 5)
    assert db.fts_rebuild_step() is False
    assert db.fts_cjk_rebuild_step() is False
    assert markers(db) == {}


def test_cjk_step_needs_the_tokenizer(db) -> None:
    fill(db, 5)
    db.set_meta("fts_cjk_rebuild_high_water", "5")
    db.set_meta("fts_cjk_rebuild_progress", "0")
    assert db.fts_cjk_rebuild_step() is False  # cjk_unicode61 is not loaded here
    assert db.fts_cjk_rebuild_status()["total"] == 5  # left for a host that has it
    assert db.fts_optimize_available() is False  # nothing this host could do about it


# ---------------------------------------------------------------------- rebuild steps


@pytest.mark.sqlite_only
def test_steps_backfill_the_window_a_chunk_at_a_time(db) -> None:
    ids = fill(db, 1234)
    assert ids == list(range(1, 1235))  # a fresh file numbers from 1
    open_window(db, 0, 1234)
    assert docsize(db, "messages_fts") == []  # (a check against content would flag the gap: by design)
    assert db.fts_optimize_available() is True
    seen = []
    while True:
        more = db.fts_rebuild_step()
        seen.append((more, db.fts_rebuild_status()))
        if not more:
            break
    assert seen == [
        (True, {"pending": True, "total": 1234, "indexed": 500, "percent": 40}),
        (True, {"pending": True, "total": 1234, "indexed": 1000, "percent": 81}),
        (False, None),
    ]
    assert markers(db) == {}
    assert docsize(db, "messages_fts") == ids
    assert docsize(db, "messages_fts_trigram") == source_ids(db, "messages_fts_trigram_src")
    assert len(docsize(db, "messages_fts_trigram")) == 1234 - 1234 // 4  # tool rows stay out
    assert consistent(db)
    assert matches(db, "messages_fts", "w777x") == [ids[777]]
    assert matches(db, "messages_fts_trigram", "片777段") == [ids[777]]
    assert db.fts_rebuild_step() is False
    assert db.fts_optimize_available() is False


@pytest.mark.sqlite_only
def test_writes_during_the_window_end_up_consistent(db) -> None:
    ids = fill(db, 700)
    hw = ids[-1]
    open_window(db, ids[99], hw)
    assert db.fts_rebuild_step() is True  # rows 100..599 done
    # Inside the indexed part: the triggers handle it. Inside the rest: the backfill will.
    db._execute_write(lambda c: c.execute("UPDATE messages SET content = 'rewritten alpha' WHERE id = ?", (ids[150],)))
    db._execute_write(lambda c: c.execute("UPDATE messages SET content = 'rewritten omega' WHERE id = ?", (ids[650],)))
    db._execute_write(lambda c: c.execute("DELETE FROM messages WHERE id = ?", (ids[660],)))
    db._execute_write(lambda c: c.execute("DELETE FROM messages WHERE id = ?", (ids[120],)))
    newest = db.append_message("s1", "user", "fresh w99999x")  # above the mark: the triggers index it
    assert matches(db, "messages_fts", "w99999x") == [newest]
    assert matches(db, "messages_fts", "omega") == []  # not yet
    while db.fts_rebuild_step():
        pass
    assert markers(db) == {}
    assert consistent(db)
    live = [m["id"] for m in db.get_messages("s1")]
    assert docsize(db, "messages_fts") == live
    assert matches(db, "messages_fts", "alpha") == [ids[150]]
    assert matches(db, "messages_fts", "omega") == [ids[650]]
    assert matches(db, "messages_fts", "w660x") == [] and matches(db, "messages_fts", "w120x") == []
    assert [h["id"] for h in db.search_messages("omega")] == [ids[650]]


@pytest.mark.sqlite_only
def test_a_window_over_rows_already_indexed_never_indexes_them_twice(db) -> None:
    ids = fill(db, 300)
    open_window(db, 0, ids[-1], remove=False)  # markers only: every row is still in the index
    while db.fts_rebuild_step():
        pass
    assert docsize(db, "messages_fts") == ids  # no duplicates
    assert consistent(db)


@pytest.mark.sqlite_only
def test_the_boundary_sweep_indexes_rows_near_the_mark_the_triggers_missed(db) -> None:
    ids = fill(db, 120)
    hw = ids[59]

    def drop_row_above_mark(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls) "
            "SELECT 'delete', id, content, tool_name, tool_calls FROM messages_fts_src WHERE id = ?", (ids[100],))
    db._execute_write(drop_row_above_mark)
    open_window(db, ids[9], hw)
    assert ids[100] not in docsize(db, "messages_fts")
    while db.fts_rebuild_step():
        pass
    assert docsize(db, "messages_fts") == ids
    assert consistent(db)


@pytest.mark.sqlite_only
def test_bad_marker_values(db) -> None:
    ids = fill(db, 80)
    open_window(db, 0, ids[-1])
    db.set_meta("fts_rebuild_progress", "not a number")  # read as 0: start over, safely
    assert db.fts_rebuild_step() is False
    assert docsize(db, "messages_fts") == ids and consistent(db)
    open_window(db, 0, ids[-1])
    db.set_meta("fts_rebuild_high_water", "junk")  # no window can be told: rebuild whole
    assert db.fts_rebuild_status() is None
    assert db.fts_rebuild_step() is False
    assert markers(db) == {}
    assert docsize(db, "messages_fts") == ids and consistent(db)


def test_a_window_left_in_state_meta_is_closed_by_the_step(db) -> None:
    """On SQLite the rows are indexed already (and are not indexed twice); on PostgreSQL
    the GIN indexes hold every row, so there is nothing to backfill and the window closes."""
    ids = fill(db, 10)
    db.set_meta("fts_rebuild_high_water", str(ids[-1]))
    db.set_meta("fts_rebuild_progress", "0")
    assert db.fts_optimize_available() is True  # an interrupted optimize, as far as it can tell
    assert db.fts_rebuild_step() is False  # ten ids: one step, and the window is closed
    assert markers(db) == {} and db.fts_rebuild_status() is None
    assert db.fts_optimize_available() is False
    assert [h["id"] for h in db.search_messages("w4x")] == [ids[4]]


@pytest.mark.sqlite_only
def test_concurrent_steppers_and_writers_never_double_index(hermes_state, db) -> None:
    ids = fill(db, 2600)
    open_window(db, 0, ids[-1])
    others = [hermes_state.SessionDB(db.db_path) for _ in range(2)]
    failures: list[BaseException] = []

    def stepper(store) -> None:
        try:
            while store.fts_rebuild_step():
                pass
        except BaseException as exc:
            failures.append(exc)

    def writer() -> None:
        try:
            for i in range(40):
                store = others[i % 2]
                store.append_message("s1", "user", f"concurrent c{i}z")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=stepper, args=(s,)) for s in [db, *others]] + [threading.Thread(target=writer)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures
        assert markers(db) == {}
        live = [m["id"] for m in db.get_messages("s1")]
        assert len(live) == 2640
        assert docsize(db, "messages_fts") == live  # each row exactly once
        assert docsize(db, "messages_fts_trigram") == source_ids(db, "messages_fts_trigram_src")
        assert consistent(db)
        assert len(matches(db, "messages_fts", "concurrent")) == 40
    finally:
        for s in others:
            s.close()


@pytest.mark.sqlite_only
def test_a_cjk_window_is_backfilled_when_its_index_answers_here(db) -> None:
    """Stand-in for Hermes' CJK index (same DDL, FTS5's default tokenizer, which needs no
    extension): when the table can be read here, its window is filled by the same code."""
    ids = fill(db, 30)
    conn = raw(db)
    try:
        conn.execute("CREATE VIEW messages_fts_cjk_src AS "
                     "SELECT id, role, content, tool_name, tool_calls FROM messages WHERE role <> 'tool'")
        conn.execute("CREATE VIRTUAL TABLE messages_fts_cjk USING fts5(content, tool_name, tool_calls, "
                     "content='messages_fts_cjk_src', content_rowid='id')")
        conn.execute("INSERT INTO state_meta VALUES ('fts_cjk_rebuild_high_water', ?), "
                     "('fts_cjk_rebuild_progress', '0')", (str(ids[-1]),))
    finally:
        conn.close()
    assert db._fts_table_exists("messages_fts_cjk")
    assert db.fts_optimize_available() is True
    while db.fts_cjk_rebuild_step():
        pass
    assert db.fts_cjk_rebuild_status() is None
    assert docsize(db, "messages_fts_cjk") == source_ids(db, "messages_fts_cjk_src")
    assert consistent(db, "messages_fts_cjk")
    assert db.optimize_fts() == 3 and db.rebuild_fts() == 3  # every queryable table of _FTS_TABLES


# ---------------------------------------------------------------------- optimize-storage


def test_optimize_storage_on_a_current_file(db, backend: str) -> None:
    fill(db, 20)
    assert db.fts_optimize_available() is False
    db.set_meta("fts_optimize_available", "1")  # Hermes' hint: goes once the work is done
    events: list[dict] = []
    assert db.optimize_fts_storage(progress_cb=events.append) == {"ok": True, "vacuumed": True}
    assert [e["phase"] for e in events] == ["vacuum", "done"]
    assert all(set(e) == {"phase", "percent", "indexed", "total"} for e in events)
    assert events[-1]["percent"] == 100
    assert db.get_meta("fts_storage_version") == "3"  # our layout is Hermes v30's layout 3
    assert db.get_meta("fts_optimize_available") is None
    assert schema_version(db) == 30  # never lowered to 23
    events.clear()
    assert db.optimize_fts_storage(progress_cb=events.append, vacuum=False) == {"ok": True, "vacuumed": None}
    assert [e["phase"] for e in events] == ["done"]
    db.set_meta("fts_storage_version", "4")  # a newer Hermes' stamp is kept
    db.optimize_fts_storage(vacuum=False)
    assert db.get_meta("fts_storage_version") == "4"
    assert [h["id"] for h in db.search_messages("w3x")] == [db.get_messages("s1")[3]["id"]]


def test_optimize_storage_raises_an_old_schema_version_to_23(db) -> None:
    db._write(lambda c: c.execute(text("UPDATE schema_version SET version = 21")))
    db.optimize_fts_storage(vacuum=False)
    assert schema_version(db) == 23


def test_a_failed_vacuum_is_not_fatal(db, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(engine) -> None:
        raise sqlite3.OperationalError("cannot VACUUM")

    monkeypatch.setattr(db._dialect, "vacuum", refuse)
    assert db.optimize_fts_storage() == {"ok": True, "vacuumed": False}
    assert db.get_meta("fts_storage_version") == "3"


@pytest.mark.sqlite_only
def test_optimize_storage_moves_a_legacy_layout_to_ours(db, clock: FakeTime) -> None:
    ids = fill(db, 1100)
    make_legacy(db)
    assert db.fts_optimize_available() is True
    events: list[dict] = []
    assert db.optimize_fts_storage(progress_cb=events.append) == {"ok": True, "vacuumed": True}
    phases = [e["phase"] for e in events]
    backfill = [e for e in events if e["phase"] == "backfill"]
    assert [e["indexed"] for e in backfill] == [500, 1000, 1100] and backfill[-1]["percent"] == 100
    assert [e["percent"] for e in backfill] == sorted(e["percent"] for e in backfill)
    assert "teardown" in phases and phases[-2:] == ["vacuum", "done"]
    assert phases.index("teardown") > phases.index("backfill")
    teardown = [e for e in events if e["phase"] == "teardown"]
    assert teardown[-1]["percent"] == 100 and teardown[-1]["indexed"] == teardown[-1]["total"] > 0
    assert clock.sleeps and min(clock.sleeps) >= 0.2  # paused between chunks, never less than the floor
    # The head layout, filled; nothing of the old one left.
    conn = raw(db)
    try:
        word_sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts'").fetchone()[0]
        views = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'")}
    finally:
        conn.close()
    assert "tool_name" in word_sql and "messages_fts_src" in word_sql
    assert {"messages_fts_src", "messages_fts_trigram_src"} <= views
    assert trash_tables(db) == [] and markers(db) == {}
    assert docsize(db, "messages_fts") == ids
    assert docsize(db, "messages_fts_trigram") == source_ids(db, "messages_fts_trigram_src")
    assert consistent(db)
    assert db.fts_optimize_available() is False
    assert [h["id"] for h in db.search_messages("w1050x")] == [ids[1050]]
    later = db.append_message("s1", "user", "after the move w5555x")
    assert matches(db, "messages_fts", "w5555x") == [later]
    assert db.check_fts() == {"messages_fts": None, "messages_fts_trigram": None}


@pytest.mark.sqlite_only
def test_an_interrupted_optimize_resumes_in_another_process(hermes_state, db, clock: FakeTime) -> None:
    ids = fill(db, 1300)
    make_legacy(db)
    assert db._demote_legacy_fts_to_trash() is True
    assert db._demote_legacy_fts_to_trash() is False  # a window is open: resume, never demote again
    assert db.fts_rebuild_status() == {"pending": True, "total": ids[-1], "indexed": 0, "percent": 0}
    assert trash_tables(db)  # the old pages wait for the chunked teardown
    assert db.fts_rebuild_step() is True
    db.close()  # "crash" half-way

    again = hermes_state.SessionDB(db.db_path)
    try:
        assert again.fts_optimize_available() is True
        assert again.fts_rebuild_status()["indexed"] == 500
        events: list[dict] = []
        assert again.optimize_fts_storage(progress_cb=events.append, vacuum=False) == {"ok": True, "vacuumed": None}
        assert [e["indexed"] for e in events if e["phase"] == "backfill"] == [1000, 1300]
        assert trash_tables(again) == [] and markers(again) == {}
        assert docsize(again, "messages_fts") == ids and consistent(again)
        assert again.fts_optimize_available() is False
    finally:
        again.close()


@pytest.mark.sqlite_only
def test_trash_alone_is_torn_down(db, clock: FakeTime) -> None:
    fill(db, 10)
    conn = raw(db)
    try:
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE fts_v22_trash_messages_fts_data(id INTEGER PRIMARY KEY, block BLOB)")
        conn.executemany("INSERT INTO fts_v22_trash_messages_fts_data VALUES (?, x'00')", [(i,) for i in range(1200)])
        conn.execute("CREATE TABLE fts_v22_trash_messages_fts_idx(segid, term, pgno, PRIMARY KEY(segid, term)) WITHOUT ROWID")
        conn.executemany("INSERT INTO fts_v22_trash_messages_fts_idx VALUES (1, ?, 1)", [(f"t{i}",) for i in range(700)])
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert db.fts_optimize_available() is True
    events: list[dict] = []
    db.optimize_fts_storage(progress_cb=events.append, vacuum=False)
    teardown = [e for e in events if e["phase"] == "teardown"]
    assert teardown[-1] == {"phase": "teardown", "percent": 100, "indexed": 1900, "total": 1900}
    assert max(e["indexed"] - p["indexed"] for p, e in itertools.pairwise(teardown)) <= 500  # chunked
    assert trash_tables(db) == []
    assert db.fts_optimize_available() is False


@pytest.mark.sqlite_only
def test_read_only_instance(hermes_state, db) -> None:
    fill(db, 10)
    db.set_meta("fts_rebuild_high_water", "10")
    ro = hermes_state.SessionDB(db.db_path, read_only=True)
    try:
        assert ro._fts_enabled is False  # as Hermes: no FTS on a read-only instance
        assert ro.optimize_fts() == 0 and ro.rebuild_fts() == 0
        assert ro.fts_rebuild_step() is False and ro.fts_cjk_rebuild_step() is False
        assert ro.fts_optimize_available() is False
        assert ro.optimize_fts_storage() == {"ok": False, "reason": "read_only"}
        assert ro.fts_rebuild_status()["total"] == 10  # reading is fine
        with pytest.raises(sqlite3.OperationalError):  # ReadOnlyDatabaseError is one
            ro.vacuum()
        with pytest.raises(errors.ReadOnlyDatabaseError):
            ro.set_meta("k", "v")
    finally:
        ro.close()


# ---------------------------------------------------------------------- write-path hooks


def test_after_write_optimizes_every_n_writes(db) -> None:
    calls: list[int] = []
    db.optimize_fts = lambda: calls.append(1) or 2
    db._OPTIMIZE_EVERY_N_WRITES = 3
    for n in range(1, 8):
        db._after_write(n)
        assert db.wait_for_upkeep(30)  # on a server it runs on the store's upkeep thread
    assert len(calls) == 2  # after writes 3 and 6
    db._OPTIMIZE_EVERY_N_WRITES = 0  # off
    db._after_write(6)
    assert len(calls) == 2

    def broken() -> int:
        raise sqlite3.OperationalError("busy elsewhere")

    db._OPTIMIZE_EVERY_N_WRITES = 1
    db.optimize_fts = broken
    db._after_write(1)  # best effort: never raises


def test_the_periodic_optimize_is_bounded_and_an_explicit_one_is_full(db, backend: str) -> None:
    """Hermes' periodic optimize_fts() (every N writes) rewrites the whole index inside a
    writer's transaction: 2.6 s at 200k messages. Called from the write path it does
    FTS5's bounded 'merge' here; called by anyone else it is still the full 'optimize'
    (on PostgreSQL both are the GIN pending-list merge)."""
    from sqlalchemy import event

    db.create_session("s", "cli")
    seen: list[str] = []

    def spy(_conn, _cur, statement, *_a) -> None:
        if "VALUES('merge'" in statement or "VALUES('optimize')" in statement or "gin_clean_pending_list" in statement:
            seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", spy)
    try:
        db._OPTIMIZE_EVERY_N_WRITES = 3
        for i in range(3):
            db.append_message("s", "user", f"words {i}")  # the third write runs the upkeep
        assert db.wait_for_upkeep(30)  # (on a server, on the store's upkeep thread)
        periodic, seen[:] = list(seen), []
        assert db.optimize_fts() == len(periodic) > 0
        explicit = list(seen)
    finally:
        event.remove(db.engine, "before_cursor_execute", spy)
    if backend == "sqlite":
        assert periodic and all("VALUES('merge', 500)" in s for s in periodic)
        assert explicit and all("VALUES('optimize')" in s for s in explicit)
    else:
        assert all("gin_clean_pending_list" in s for s in periodic + explicit)
    assert len(db.search_messages("words")) == 3  # the index still answers for every row


def test_the_write_path_optimizes_every_n_writes(db) -> None:
    calls: list[int] = []
    db.optimize_fts = lambda: calls.append(1) or 2
    db._OPTIMIZE_EVERY_N_WRITES = 3
    for i in range(6):
        db.set_meta("k", str(i))
        assert db.wait_for_upkeep(30)  # on a server it runs on the store's upkeep thread
    assert len(calls) == 2

    def broken() -> int:
        raise sqlite3.OperationalError("busy elsewhere")

    db.optimize_fts = broken
    for _ in range(3):
        db.set_meta("k", "after")  # a failing optimize never fails the write
    assert db.wait_for_upkeep(30)
    assert db.get_meta("k") == "after"


def test_on_write_error_rebuilds_once_per_instance(db) -> None:
    rebuilt: list[int] = []
    db.rebuild_fts = lambda: rebuilt.append(1) or 2
    assert db._on_write_error(sqlite3.OperationalError("database is locked")) is False
    assert db._on_write_error(ValueError("bad")) is False
    assert rebuilt == []
    corrupt = sqlite3.DatabaseError("database disk image is malformed")
    assert db._on_write_error(corrupt) is True  # rebuilt: retry the write
    assert db._on_write_error(corrupt) is False  # once per instance
    assert rebuilt == [1]


def test_on_write_error_does_not_retry_when_nothing_was_rebuilt(db) -> None:
    db.rebuild_fts = lambda: 0
    assert db._on_write_error(sqlite3.DatabaseError("database disk image is malformed")) is False


def _break_word_index(db) -> None:
    """Delete the word index's structure record: every later write into it fails "malformed"."""
    conn = raw(db)
    try:
        conn.execute("DELETE FROM messages_fts_data WHERE id = 10")
    finally:
        conn.close()


@pytest.mark.sqlite_only
def test_a_write_into_a_corrupt_index_is_rebuilt_and_retried(db) -> None:
    ids = fill(db, 20)
    _break_word_index(db)
    new = db.append_message("s1", "user", "written after the damage w4242x")  # rebuilt, then retried
    assert matches(db, "messages_fts", "w4242x") == [new]
    assert docsize(db, "messages_fts") == [*ids, new] and consistent(db)
    _break_word_index(db)
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):  # only once per instance
        db.append_message("s1", "user", "second damage")
    assert len(db.get_messages("s1")) == 21  # the failed write left nothing behind
