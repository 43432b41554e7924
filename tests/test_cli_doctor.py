"""``hermes-store doctor`` (issue 29, point 5): a read-only health report.

A healthy store exits 0; a damaged search index or a store that needs upgrading exits 1
with the report printed and one line on stderr; bad arguments exit 2. Whatever it
finds, the file's bytes and time stamp stay as they were and nothing is left beside it
(also with a -wal and -shm a killed writer left; the -shm, SQLite's shared-memory
index that every reader writes its read marks to, is the one file a read changes). It says which SQLite is linked and
whether it has the WAL-reset bug (3.7.0 to 3.51.2; 3.40.1 here) and what the store does
about it. On PostgreSQL (a tenant schema too) the applicable part, writing nothing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hermes_store import journal, migrations

from .test_cli import one_line_error, run
from .test_cli_outputs import folder_state, leave_a_live_wal
from .test_cli_readonly import catalog

TOP_KEYS = {"backend", "database", "versions", "revision", "fts", "sizes", "upkeep", "problems", "warnings", "ok"}
FILE_KEYS = TOP_KEYS | {"file", "wal_reset_bug", "journal_mode", "files", "integrity"}


def demo_store(folder: Path) -> Path:
    db = folder / "state.db"
    assert run("--db", db, "demo").code == 0
    return db


def doctor(*args: object, code: int = 0) -> dict:
    result = run(*args, "--json", "doctor")
    assert result.code == code, (result.code, result.stderr)
    if code:
        assert len(result.stderr.splitlines()) == 1 and '"code": "unhealthy"' in result.stderr, result.stderr
    return result.json()


def test_a_healthy_store(tmp_path: Path) -> None:
    db = demo_store(tmp_path)
    doc = doctor("--db", db)
    assert set(doc) == FILE_KEYS and doc["ok"] is True and doc["problems"] == []
    assert doc["backend"] == "sqlite" and doc["revision"] == {
        "current": migrations.head(), "head": migrations.head(), "at_head": True}
    assert set(doc["versions"]) == {"hermes_store", "sqlalchemy", "alembic", "driver", "sqlite"}
    assert doc["versions"]["sqlite"] == sqlite3.sqlite_version and doc["versions"]["driver"]["name"] == "sqlite3"
    assert doc["integrity"] == {"check": "integrity_check", "ok": True, "result": ["ok"]}
    assert doc["fts"] == {"messages_fts": "ok", "messages_fts_trigram": "ok"}
    assert doc["journal_mode"] in ("wal", "delete")
    assert [(Path(f["path"]).name, f["mode"], f["private"]) for f in doc["files"]] == [("state.db", "0600", True)]
    sizes = doc["sizes"]
    assert sizes["available"] is True and sizes["total_bytes"] == db.stat().st_size
    names = {o["name"]: o for o in sizes["objects"]}
    assert names["messages"]["kind"] == "table" and names["idx_messages_session"]["table"] == "messages"
    assert sum(o["bytes"] for o in sizes["objects"]) == db.stat().st_size
    upkeep = doc["upkeep"]
    assert set(upkeep) == {"fts_rebuild_windows", "cjk_bigram_rows_behind", "last_auto_prune", "wal_size_bytes",
                           "freelist_pages"}
    assert upkeep["fts_rebuild_windows"] == {} and upkeep["wal_size_bytes"] == 0
    human = run("--db", db, "doctor")
    assert human.code == 0 and "integrity_check" in human.stdout and "Healthy" in human.stdout
    assert "Size by table and index" in human.stdout


def test_the_wal_reset_bug_line(tmp_path: Path) -> None:
    """3.40.1 is affected; the answer comes from the one version check Hermes' rule uses."""
    db = demo_store(tmp_path)
    doc = doctor("--db", db)
    wal = doc["wal_reset_bug"]
    assert wal["affected"] is journal.is_sqlite_wal_reset_vulnerable()
    assert wal["sqlite_version"] == sqlite3.sqlite_version and wal["fixed_in"] == "3.51.3"
    if sqlite3.sqlite_version_info == (3, 40, 1):
        assert wal["affected"] is True
    if wal["affected"]:
        assert "never downgraded" in wal["rule"] and "no WAL for a new file" in wal["rule"]
        if doc["journal_mode"] == "wal":
            assert "stays in WAL" in wal["this_store"] and any("WAL-reset bug" in w for w in doc["warnings"])
        human = run("--db", db, "doctor").stdout
        assert "WAL-reset bug" in human and "affected" in human and "what the store does" in human
    # A file in the rollback journal: Hermes v26 keeps WAL off it; our stores say they do not.
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    doc = doctor("--db", db)
    assert doc["journal_mode"] == "delete"
    if doc["wal_reset_bug"]["affected"]:
        assert "Hermes v26 does not turn WAL on" in doc["wal_reset_bug"]["this_store"]
        assert "hermes_store's own stores do" in doc["wal_reset_bug"]["this_store"]


def test_a_damaged_search_index_is_a_problem(tmp_path: Path) -> None:
    db = demo_store(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM messages_fts_docsize WHERE id = (SELECT min(id) FROM messages_fts_docsize)")
    conn.close()
    before = folder_state(tmp_path)
    doc = doctor("--db", db, code=1)
    assert doc["ok"] is False and doc["fts"]["messages_fts"] != "ok" and doc["fts"]["messages_fts_trigram"] == "ok"
    assert any("messages_fts" in p and "fts rebuild" in p for p in doc["problems"])
    line = one_line_error(run("--db", db, "doctor"), 1)
    assert "damaged search index: messages_fts" in line
    assert folder_state(tmp_path) == before  # found, not repaired: doctor writes nothing


def test_an_older_store_is_reported_not_migrated(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    migrations.upgrade(db, "0020")
    before = folder_state(tmp_path)
    doc = doctor("--db", db, code=1)
    assert doc["revision"]["current"] == "0020" and any("run 'hermes-store upgrade'" in p for p in doc["problems"])
    assert folder_state(tmp_path) == before and migrations.current(db) == "0020"


@pytest.mark.parametrize("mode", ["wal", "delete", "live-wal"])
def test_doctor_writes_nothing(mode: str, tmp_path: Path) -> None:
    """Bytes, time stamps and the list of files: the same after doctor, in both forms."""
    db = demo_store(tmp_path)
    if mode == "delete":
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
    if mode == "live-wal":
        leave_a_live_wal(db)
    before = folder_state(tmp_path)
    assert run("--db", db, "doctor").code == 0
    doc = doctor("--db", db)
    after = folder_state(tmp_path)
    if mode == "live-wal":
        # The -shm is SQLite's shared-memory index, not data: every reader, Hermes' too,
        # writes its read marks there. The database and the -wal are what must not change.
        assert after.pop("state.db-shm")[1] == before.pop("state.db-shm")[1]
    assert after == before
    if mode == "live-wal":
        assert doc["upkeep"]["wal_size_bytes"] > 0
        assert sorted(Path(f["path"]).name for f in doc["files"]) == ["state.db", "state.db-shm", "state.db-wal"]


def test_quick_check_and_bad_arguments(tmp_path: Path) -> None:
    db = demo_store(tmp_path)
    doc = run("--db", db, "--json", "doctor", "--quick").json()
    assert doc["integrity"] == {"check": "quick_check", "ok": True, "result": ["ok"]}
    one_line_error(run("--db", db, "doctor", "--deep"), 2)
    one_line_error(run("--db", db, "--schema", "t1", "doctor"), 2)
    missing = tmp_path / "none" / "state.db"
    assert "no database at" in one_line_error(run("--db", missing, "doctor"), 1)
    assert not missing.parent.exists()


def test_a_world_readable_file_is_a_warning(tmp_path: Path) -> None:
    db = demo_store(tmp_path)
    db.chmod(0o644)
    doc = doctor("--db", db)
    assert doc["files"][0]["mode"] == "0644" and doc["files"][0]["private"] is False
    assert any("chmod 600" in w for w in doc["warnings"])


# ------------------------------------------------------------------ PostgreSQL


def test_postgresql_store(pg_database: str) -> None:
    empty = catalog(pg_database)
    doc = doctor("--url", pg_database, code=1)
    assert doc["revision"]["current"] is None and any("upgrade" in p for p in doc["problems"])
    assert catalog(pg_database) == empty  # nothing created
    assert run("--url", pg_database, "demo").code == 0
    before = catalog(pg_database)
    doc = doctor("--url", pg_database)
    assert set(doc) == TOP_KEYS and doc["ok"] is True and doc["backend"] == "postgresql"
    assert doc["versions"]["driver"]["name"] == "psycopg" and doc["versions"]["server"].split(".")[0].isdigit()
    assert doc["revision"]["at_head"] is True
    assert doc["fts"] == {"idx_messages_search_vector": "ok", "idx_messages_trgm": "ok"}
    objects = {o["name"]: o for o in doc["sizes"]["objects"]}
    assert objects["messages"]["kind"] == "table" and objects["messages"]["bytes"] > 0
    assert objects["idx_messages_trgm"] == {**objects["idx_messages_trgm"], "kind": "index", "table": "messages"}
    assert doc["sizes"]["total_bytes"] == sum(o["bytes"] for o in objects.values() if o["kind"] == "table")
    assert set(doc["upkeep"]) == {"fts_rebuild_windows", "cjk_bigram_rows_behind", "last_auto_prune"}
    human = run("--url", pg_database, "doctor")
    assert human.code == 0 and "PostgreSQL server" in human.stdout and "password" not in human.stdout
    assert catalog(pg_database) == before


def test_postgresql_tenant_schema(pg_database: str) -> None:
    assert run("--url", pg_database, "--schema", "tenant_a", "upgrade").code == 0
    doc = doctor("--url", pg_database, "--schema", "tenant_a")
    assert doc["revision"]["at_head"] is True and "schema=tenant_a" in doc["database"]
    assert {o["name"] for o in doc["sizes"]["objects"]} >= {"sessions", "messages"}
    # Another tenant that was never made: reported, and not created.
    before = catalog(pg_database)
    doc = doctor("--url", pg_database, "--schema", "tenant_b", code=1)
    assert doc["revision"]["current"] is None and doc["sizes"]["objects"] == []
    assert catalog(pg_database) == before
