"""Hermes opens, reads and writes a file hermes_store made at head.

No runnable Hermes is available here, so this replays what Hermes' open does, step by
step as HERMES_v24_v30.md describes it (``executescript(SCHEMA_SQL)`` with IF NOT
EXISTS, column reconciliation, deferred indexes, the ``active`` heal, the version
stamp), using the DDL of the Hermes-written reference file of that version. Then it
writes and reads rows with exactly that version's columns, and checks that our own
tools see Hermes' writes (search included) and Hermes' reads see ours.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from hermes_store import SessionDB, migrations

DBS = Path(__file__).parent / "data" / "hermes-dbs"


def hermes_schema_sql(version: str) -> list[str]:
    """Hermes' own DDL of ``hermes_v<version>.db``, as IF NOT EXISTS statements."""
    with sqlite3.connect(DBS / f"hermes_v{version}.db") as ref:
        rows = ref.execute(
            "SELECT type, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
            " AND name NOT GLOB 'messages_fts*_data' AND name NOT GLOB 'messages_fts*_idx'"
            " AND name NOT GLOB 'messages_fts*_docsize' AND name NOT GLOB 'messages_fts*_config'"
            " AND name NOT GLOB 'messages_fts*_content'"
            " ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'view' THEN 1 WHEN 'index' THEN 2 ELSE 3 END"
        ).fetchall()
    out = []
    for _type, sql in rows:
        out.append(re.sub(r"^CREATE (UNIQUE INDEX|INDEX|TABLE|VIRTUAL TABLE|TRIGGER|VIEW)\s+(?!IF NOT EXISTS)",
                          r"CREATE \1 IF NOT EXISTS ", sql.strip(), flags=re.I))
    return out


def hermes_columns(version: str) -> dict[str, list[str]]:
    with sqlite3.connect(DBS / f"hermes_v{version}.db") as ref:
        tables = [r[0] for r in ref.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND sql NOT LIKE 'CREATE VIRTUAL%'"
            " AND name NOT LIKE 'sqlite_%' AND name NOT GLOB 'messages_fts*'")]
        return {t: [r[1] for r in ref.execute(f'PRAGMA table_info("{t}")')] for t in tables}


def hermes_open(db: Path, version: str) -> sqlite3.Connection:
    """What Hermes v<version>'s SessionDB does when it opens an existing file."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("BEGIN")
    for sql in hermes_schema_sql(version):  # executescript(SCHEMA_SQL): all IF NOT EXISTS
        conn.execute(sql)
    for table, cols in hermes_columns(version).items():  # _reconcile_columns(): nothing may be missing
        have = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
        assert set(cols) <= have, f"Hermes v{version} would have to add {set(cols) - have} to {table}"
    conn.execute("UPDATE messages SET active = 1 WHERE active IS NULL")
    current = conn.execute("SELECT version FROM schema_version").fetchone()[0]
    assert current >= int(version.split("_")[0])  # so no version-gated data migration of Hermes runs
    conn.execute("UPDATE schema_version SET version = ?", (int(version.split("_")[0]),))
    conn.execute("COMMIT")
    return conn


@pytest.mark.parametrize("version", ["11", "16", "20", "23", "23_late", "24", "25", "26", "27", "28", "29", "30"])
def test_hermes_opens_reads_and_writes_a_head_file(tmp_path: Path, version: str) -> None:
    db = tmp_path / "state.db"
    with SessionDB(db) as ours:
        ours.create_session("ours_1", "cli", model="m", system_prompt="be brief")
        ours.append_message("ours_1", "user", "written by hermes_store about kubernetes")
        ours.set_session_title("ours_1", "ours")
    assert migrations.current(db) == migrations.head()

    conn = hermes_open(db, version)
    cols = hermes_columns(version)
    # Hermes reads our rows by its own column lists.
    row = conn.execute(f"SELECT {', '.join(cols['sessions'])} FROM sessions WHERE id = 'ours_1'").fetchone()
    assert row["title"] == "ours" and row["source"] == "cli"
    msgs = conn.execute(f"SELECT {', '.join(cols['messages'])} FROM messages WHERE session_id = 'ours_1'").fetchall()
    assert [m["content"] for m in msgs] == ["written by hermes_store about kubernetes"]
    # Hermes writes with its own statements; our triggers keep every index in step.
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO sessions (id, source, started_at, model) VALUES ('hermes_1', 'telegram', 1700000000.0, 'x')")
    conn.execute(
        "INSERT INTO messages (session_id, role, content, tool_name, tool_calls, timestamp) VALUES (?, ?, ?, ?, ?, ?)",
        ("hermes_1", "assistant", "written by hermes about 数据库迁移 zeppelin", None,
         '[{"function": {"name": "terminal", "arguments": "{\\"cmd\\": \\"uptime\\"}"}}]', 1700000001.0),
    )
    conn.execute("UPDATE sessions SET message_count = message_count + 1 WHERE id = 'hermes_1'")
    conn.execute("COMMIT")
    assert conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'zeppelin'").fetchall()
    assert conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'kubernetes'").fetchall()
    assert conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')") is not None
    conn.close()

    # Our tools open it again (schema_version now says Hermes' version) and see Hermes' writes.
    with SessionDB(db) as ours:
        assert [h["session_id"] for h in ours.search_messages("zeppelin")] == ["hermes_1"]
        assert [h["session_id"] for h in ours.search_messages("数据库迁移")] == ["hermes_1"]
        assert [h["session_id"] for h in ours.search_messages("uptime")] == ["hermes_1"]
        assert ours.get_session("ours_1")["system_prompt"] == "be brief"
        ours.append_message("hermes_1", "user", "and back to hermes_store")
    assert migrations.current(db) == migrations.head()
