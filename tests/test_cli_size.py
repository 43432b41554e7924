"""``hermes-store size`` (issue 34, point 3): where a store's bytes are, read-only.

Real figures, both backends: after N messages of known size the search indexes have a
share and the messages table holds at least their text; on a file with ``dbstat`` every
b-tree plus the free pages is the file, byte for byte; after deleting many rows the free
list grows, the VACUUM estimate says so, and ``--exact`` (measured on a private copy)
matches what a real VACUUM and a real ``fts optimize`` then give back on the file. The
file's bytes and time stamp stay as they were (``--exact`` too); a server's catalog too.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes_store import SessionDB
from hermes_store.dialects.sqlite import SQLiteDialect

from .test_cli import SEARCH_INDEXES, Target, empty_target, file_target, one_line_error, run
from .test_cli_outputs import folder_state, leave_a_live_wal
from .test_cli_readonly import catalog

pytestmark = pytest.mark.both_backends

#: Messages written, in this many transactions (each leaves FTS5 a segment to merge).
MESSAGES, BATCHES = 600, 30
#: Characters of text per message: the messages table holds at least this many bytes each.
TEXT_CHARS = 1_000
WORDS = [f"{a}{b}" for a in ("lor", "ips", "dol", "sit", "amet", "cons", "adip", "elit", "sed", "tem")
         for b in ("um", "ra", "tor", "vex", "quin", "dal", "mor", "pex", "lun", "sar")]


def text_of(rng: random.Random) -> str:
    out = ""
    while len(out) < TEXT_CHARS:
        out += rng.choice(WORDS) + " "
    return out[:TEXT_CHARS]


def fill(t: Target) -> list[str]:
    """MESSAGES messages of TEXT_CHARS characters in BATCHES sessions (one write each)."""
    rng = random.Random(34)
    store = SessionDB(t.location)
    ids = []
    try:
        for b in range(BATCHES):
            sid = f"size-{b:03d}"
            store.create_session(sid, source="cli")
            store.append_messages([{"session_id": sid, "role": "user", "content": text_of(rng)}
                                   for _ in range(MESSAGES // BATCHES)])
            ids.append(sid)
    finally:
        store.close()
    return ids


def size(t: Target, *args: str) -> dict[str, Any]:
    result = t.run("--json", "size", *args)
    assert result.code == 0, (result.code, result.stderr)
    return result.json()


def state_of(t: Target) -> Any:
    return folder_state(Path(t.location).parent) if t.backend == "sqlite" else catalog(str(t.location))


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Target:
    return empty_target(backend, tmp_path, request)


@pytest.fixture
def filled(target: Target) -> Target:
    target.ok("upgrade")
    fill(target)
    return target


def test_the_bytes_are_where_the_rows_are(filled: Target) -> None:
    before = state_of(filled)
    doc = size(filled)
    assert state_of(filled) == before  # read-only: bytes, time stamps (a server: its catalog) unchanged
    assert doc["backend"] == filled.backend and doc["exact"] is True
    search = {i["name"]: i for i in doc["search_indexes"]}
    assert set(search) >= SEARCH_INDEXES[filled.backend] | {"messages_cjk_bigram"}
    for name in SEARCH_INDEXES[filled.backend]:
        assert search[name]["bytes"] > 0 and 0 < search[name]["share"] < 1, search[name]
    tables = {t["name"]: t for t in doc["tables"]}
    assert tables["messages"]["table_bytes"] >= MESSAGES * TEXT_CHARS
    assert tables["messages"]["index_bytes"] > 0 and tables["messages"]["share"] > 0
    assert {i["name"] for i in tables["messages"]["indexes"]} >= {"idx_messages_session"}
    # Every object is counted once: in a table or in a search index.
    parts = sum(t["bytes"] for t in doc["tables"]) + sum(i["bytes"] for i in doc["search_indexes"])
    assert parts == sum(o["bytes"] for o in doc["objects"]) == doc["used_bytes"]
    shares = sum(t["share"] for t in doc["tables"]) + sum(i["share"] for i in doc["search_indexes"])
    doctor = filled.ok("--json", "doctor").json()["sizes"]
    if filled.backend == "sqlite":
        db = Path(filled.location)
        # dbstat: every b-tree's pages plus the free pages are the file.
        assert doc["total_bytes"] == db.stat().st_size == doc["used_bytes"] + doc["free_bytes"]
        assert doc["page_count"] * doc["page_size"] == db.stat().st_size
        fts = search["messages_fts"]
        assert {p["name"] for p in fts["parts"]} >= {"messages_fts_data", "messages_fts_idx", "messages_fts_docsize",
                                                     "messages_fts_config"}
        assert fts["segments"] >= 1 and doc["wal_bytes"] == 0 and doc["method"] == "dbstat"
        assert shares == pytest.approx(1 - doc["free_bytes"] / doc["total_bytes"], abs=0.01)
    else:
        # A table's bytes on a server count its indexes: size splits them, the totals agree.
        assert doc["total_bytes"] == doctor["total_bytes"] == doc["used_bytes"]
        assert search["idx_messages_trgm"]["parts"] == [
            {"name": "idx_messages_trgm", "kind": "index", "bytes": search["idx_messages_trgm"]["bytes"]}]
        assert shares == pytest.approx(1, abs=0.01)
        assert doc["rows"]["messages"]["live"] >= 0 and doc["reclaim"]["vacuum"]["bytes"] >= 0
        assert any("tsvector" in n for n in doc["notes"])
    human = filled.ok("size").stdout
    assert "Search indexes" in human and "Tables" in human and "vacuum would reclaim" in human
    assert all(len(line) <= 80 for line in human.splitlines())
    assert state_of(filled) == before


def test_deleted_rows_are_free_pages_vacuum_gives_back(tmp_path: Path) -> None:
    t = file_target(tmp_path / "state.db")
    t.ok("upgrade")
    ids = fill(t)
    store = SessionDB(t.location)
    try:
        store.delete_sessions(ids[: BATCHES * 2 // 3])
    finally:
        store.close()
    db = Path(t.location)
    before = folder_state(tmp_path)
    doc = size(t)
    assert folder_state(tmp_path) == before
    vacuum = doc["reclaim"]["vacuum"]
    assert doc["free_pages"] > 0 and vacuum["bytes"] == doc["free_bytes"] == doc["free_pages"] * doc["page_size"]
    assert vacuum["bytes"] > MESSAGES // 2 * TEXT_CHARS and vacuum["at_most"] >= vacuum["bytes"]
    assert vacuum["how"].startswith("estimate")
    # Several segments now hold deleted rows' entries: not guessed, measured with --exact.
    fts = {i["name"]: i for i in doc["search_indexes"]}["messages_fts"]
    assert fts["segments"] > 1 and fts["optimize_reclaim_bytes"] is None
    assert fts["optimize_reclaim_how"].startswith("not estimated")
    measured = size(t, "--exact")
    assert folder_state(tmp_path) == before  # the copy is private, and gone
    exact_vacuum = measured["reclaim"]["vacuum"]
    assert exact_vacuum["how"].startswith("exact") and vacuum["bytes"] <= exact_vacuum["bytes"] <= vacuum["at_most"]
    exact_optimize = measured["reclaim"]["fts_optimize"]
    assert exact_optimize["how"].startswith("exact") and exact_optimize["bytes"] > 0
    per_index = {i["name"]: i for i in measured["search_indexes"]}
    assert per_index["messages_fts"]["optimize_reclaim_bytes"] > 0
    assert per_index["messages_fts"]["optimize_reclaim_how"].startswith("exact")
    # The real thing on the file: what VACUUM gives back is what was measured on the copy.
    size_before = db.stat().st_size
    with sqlite3.connect(db) as conn:
        conn.execute("VACUUM")
    conn.close()
    assert size_before - db.stat().st_size == pytest.approx(exact_vacuum["bytes"], abs=2 * doc["page_size"])
    after_vacuum = size(t)
    assert after_vacuum["free_pages"] == 0 and after_vacuum["reclaim"]["vacuum"]["bytes"] == 0
    # And a real optimize frees what the copy's did (its pages go to the free list).
    t.ok("fts", "optimize")
    optimized = size(t)
    freed = after_vacuum["used_bytes"] - optimized["used_bytes"]
    assert freed == pytest.approx(exact_optimize["bytes"], abs=4 * doc["page_size"])
    for name in SEARCH_INDEXES["sqlite"]:
        entry = {i["name"]: i for i in optimized["search_indexes"]}[name]
        assert entry["segments"] == 1 and entry["optimize_reclaim_bytes"] == 0
        assert entry["optimize_reclaim_how"].startswith("exact")
    assert optimized["reclaim"]["fts_optimize"] == {"bytes": 0,
                                                    "how": "exact: every search index is one segment already"}


def test_without_dbstat_the_totals_stay_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = file_target(tmp_path / "state.db")
    t.ok("upgrade")
    fill(t)
    monkeypatch.setattr(SQLiteDialect, "object_sizes", lambda *a, **k: None)
    doc = size(t)
    db = Path(t.location)
    assert doc["exact"] is False and doc["method"] == "page counts" and doc["tables"] == []
    assert doc["total_bytes"] == db.stat().st_size and doc["used_bytes"] == doc["total_bytes"] - doc["free_bytes"]
    search = {i["name"]: i for i in doc["search_indexes"]}
    assert set(search) == SEARCH_INDEXES["sqlite"]
    for entry in search.values():
        assert entry["bytes"] > 0 and entry["bytes_how"].startswith("estimate") and entry["share"] > 0
    assert any("no dbstat" in n for n in doc["notes"])
    human = t.ok("size").stdout
    assert "page counts" in human


def test_a_live_wal_is_reported_and_left_alone(tmp_path: Path) -> None:
    t = file_target(tmp_path / "state.db")
    t.ok("demo")
    leave_a_live_wal(Path(t.location))
    wal = Path(f"{t.location}-wal").stat().st_size
    before = folder_state(tmp_path)
    doc = size(t)
    assert doc["wal_bytes"] == wal > 0
    size(t, "--exact")
    t.ok("size")
    after = folder_state(tmp_path)
    # The -shm is SQLite's shared-memory index, not data: every reader writes its read
    # marks there (as for doctor). The database and the -wal are what must not change.
    assert after.pop("state.db-shm")[1] == before.pop("state.db-shm")[1]
    assert after == before


def test_a_tenant_schema_counts_its_own_tables(pg_database: str) -> None:
    a = Target("postgresql", ("--url", pg_database, "--schema", "tenant_a"), f"{pg_database}")
    assert run("--url", pg_database, "--schema", "tenant_a", "upgrade").code == 0
    assert run("--url", pg_database, "--schema", "tenant_b", "upgrade").code == 0
    store = SessionDB(pg_database, schema="tenant_a")
    try:
        store.create_session("a-1", source="cli")
        store.append_messages([{"session_id": "a-1", "role": "user", "content": "x" * 5_000} for _ in range(200)])
    finally:
        store.close()
    before = catalog(pg_database)
    one = size(a)
    other = run("--json", "--url", pg_database, "--schema", "tenant_b", "size").json()
    assert catalog(pg_database) == before
    assert "schema=tenant_a" in one["database"]
    messages = {t["name"]: t for t in one["tables"]}["messages"]["bytes"]
    empty = {t["name"]: t for t in other["tables"]}["messages"]["bytes"]
    assert messages > empty and one["total_bytes"] > other["total_bytes"]


def test_exact_is_for_a_file(target: Target) -> None:
    target.ok("demo")
    if target.backend == "postgresql":
        assert "private copy of a file" in one_line_error(target.run("size", "--exact"), 2)
    else:
        assert target.run("size", "--exact").code == 0
    missing = target.location if target.backend == "postgresql" else Path(target.location).with_name("none.db")
    if target.backend == "sqlite":
        assert "no database at" in one_line_error(run("--db", missing, "size"), 1)
        assert not Path(missing).exists()
