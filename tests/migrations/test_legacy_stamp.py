"""A file written while our bigram revision was called "0024" is restamped hs0001."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from hermes_store import SessionDB, adopt, migrations

from ..helpers import DATA



def _copy(tmp_path: Path) -> Path:
    db = tmp_path / "state.db"
    shutil.copy(DATA / "hermes_store_0024_bigram.db", db)
    return db


def _rows(db: Path) -> tuple[list, list]:
    with sqlite3.connect(db) as conn:
        return (conn.execute("SELECT id, source, title FROM sessions ORDER BY id").fetchall(),
                conn.execute("SELECT id, session_id, content FROM messages ORDER BY id").fetchall())


def test_the_fixture_is_what_old_code_wrote() -> None:
    with sqlite3.connect(DATA / "hermes_store_0024_bigram.db") as conn:
        assert conn.execute("SELECT version_num FROM hermes_store_version").fetchall() == [("0024",)]
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(23,)]
        cols = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    assert "last_activity_at" not in cols


def test_upgrade_restamps_then_reaches_head_keeping_rows(tmp_path: Path) -> None:
    db = _copy(tmp_path)
    before = _rows(db)
    assert not adopt.needs_adoption(db)
    assert migrations.upgrade(db) == migrations.head()
    assert _rows(db) == before
    with SessionDB(db) as sdb:
        assert sdb.get_session_title("legacy_1") == "legacy title"
        assert {h["session_id"] for h in sdb.search_messages("迁移")} >= {"legacy_1"}
        assert [h["session_id"] for h in sdb.search_messages("kubernetes")] == ["legacy_1"]


def test_sessiondb_opens_it_directly(tmp_path: Path) -> None:
    db = _copy(tmp_path)
    with SessionDB(db) as sdb:
        assert len(sdb.get_messages("legacy_1")) == 2
    assert migrations.current(db) == migrations.head()


def test_only_to_hs0001_is_a_real_restamp(tmp_path: Path) -> None:
    """Stopping at hs0001 proves the old 0024 meant our index, not Hermes v24."""
    db = _copy(tmp_path)
    assert migrations.upgrade(db, "hs0001") == "hs0001"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone() == (23,)


def test_a_real_v24_stamp_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "v24.db"
    migrations.upgrade(db, "0024")
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('x', 'cli', 1)")
    assert migrations.upgrade(db) == migrations.head()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (1,)
