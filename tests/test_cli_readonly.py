"""Read-only means read-only (issue 21, point 4).

Only ``upgrade``, ``adopt``, ``demo``, ``import`` and ``copy`` create or migrate a store.
Every other command (``current``, ``sessions``, ``search``, ``show``, ``stats``,
``lineage``, ``export``, and ``prune``/``fts`` too) opens a store that is there and at
head, or refuses, saying what to run, with exit code 1. Checked on a SQLite file and
on a PostgreSQL database (also one tenant schema with ``--schema``): afterwards the file
is the same byte for byte with nothing beside it, and the server has no new table,
index, function, extension or schema. ``current`` only reports: on an empty database
its answer is "no revision yet" with exit code 1, still creating nothing.

The decision for a store at an older revision: refused with a pointer to ``upgrade``
(``code: needs_upgrade``), never migrated; the commands read what head has.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import text

from hermes_store import migrations

from .test_cli import HERMES_V11, Run, run

#: The commands that must never create or migrate anything, with arguments that would
#: reach the database. ``{dir}`` is the test's folder (export --out must not write there).
READERS: list[list[str]] = [
    ["sessions"],
    ["sessions", "--all", "--archived"],
    ["search", "pod"],
    ["show", "s1"],
    ["lineage", "s1"],
    ["stats"],
    ["stats", "--by", "task"],
    ["export"],
    ["export", "--out", "{dir}/out.jsonl"],
    ["prune", "--older-than-days", "0", "--dry-run"],
    ["prune", "--older-than-days", "0", "--yes"],
    ["fts", "check"],
    ["fts", "rebuild"],
    ["fts", "optimize"],
]


def files_in(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` byte for byte (folders too), for before/after comparisons."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(folder.rglob("*"))}


def catalog(url: str) -> set[tuple[str, ...]]:
    """Everything a PostgreSQL database holds outside the system schemas: schemas,
    extensions, relations (tables, indexes, sequences, views), functions, triggers and
    the rows of any ``alembic_version`` table (a host's own revision)."""
    engine = sa_create_engine(url)
    try:
        with engine.connect() as conn:
            system = "('pg_catalog', 'information_schema')"
            found: set[tuple[str, ...]] = set()
            found |= {("schema", r[0]) for r in conn.execute(text(
                f"SELECT nspname FROM pg_namespace WHERE nspname NOT IN {system} AND nspname NOT LIKE 'pg_toast%'"))}
            found |= {("extension", r[0]) for r in conn.execute(text("SELECT extname FROM pg_extension"))}
            found |= {("relation", r[0], r[1], r[2]) for r in conn.execute(text(
                "SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                f"WHERE n.nspname NOT IN {system} AND n.nspname NOT LIKE 'pg_toast%'"))}
            found |= {("function", r[0], r[1]) for r in conn.execute(text(
                "SELECT n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                f"WHERE n.nspname NOT IN {system}"))}
            found |= {("trigger", r[0]) for r in conn.execute(text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"))}
            for (schema,) in conn.execute(text(
                    "SELECT table_schema FROM information_schema.tables WHERE table_name = 'alembic_version'")).all():
                found |= {("alembic_version", schema, r[0]) for r in conn.execute(
                    text(f'SELECT version_num FROM "{schema}".alembic_version'))}
            conn.rollback()
            return found
    finally:
        engine.dispose()


def execute(url: str, *statements: str) -> None:
    engine = sa_create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def json_error(result: Run) -> dict[str, Any]:
    """The one JSON object a --json run that failed wrote to stderr."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    doc = json.loads(lines[0])
    assert set(doc) == {"error", "code", "exit_code"} and doc["exit_code"] == result.code, doc
    return doc


def refused_everywhere(args: tuple[str, ...], folder: Path, code: str, fragment: str,
                       unchanged: Callable[[], Any]) -> None:
    """Every reader, in human and --json form, exits 1 with ``fragment`` in its one
    line (``code`` in --json), and ``unchanged()`` reads the same after each."""
    before = unchanged()
    for argv in READERS:
        argv = [a.replace("{dir}", str(folder)) for a in argv]
        human = run(*args, *argv)
        assert human.code == 1, (argv, human.code, human.stderr)
        lines = human.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("hermes-store: ") and fragment in lines[0], (argv, human.stderr)
        assert human.stdout == "", (argv, human.stdout)
        doc = json_error(run(*args, "--json", *argv))
        assert (doc["code"], doc["exit_code"]) == (code, 1) and fragment in doc["error"], (argv, doc)
        assert unchanged() == before, argv
    assert not (folder / "out.jsonl").exists()


# ---------------------------------------------------------------------------------- SQLite


def test_sqlite_a_missing_file_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "state.db"
    refused_everywhere(("--db", str(path)), tmp_path, "no_database", "no database at", lambda: files_in(tmp_path))
    assert list(tmp_path.iterdir()) == []  # not even the folder
    assert "no database at" in run("--db", path, "current").stderr


def test_sqlite_an_empty_file_stays_empty(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.touch()
    refused_everywhere(("--db", str(path)), tmp_path, "no_store", "create one with 'hermes-store --db", lambda: files_in(tmp_path))
    assert path.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]
    reply = run("--db", path, "--json", "current")
    assert reply.code == 1 and reply.json()["revision"] is None and reply.json()["up_to_date"] is False
    assert json_error(reply)["code"] == "no_store" and path.stat().st_size == 0
    # The positive control: upgrade is the command that creates.
    assert run("--db", path, "upgrade").code == 0 and migrations.current(path) == migrations.head()
    assert run("--db", path, "--json", "sessions").json()["sessions"] == []


def test_sqlite_a_file_of_another_application_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('f1d89e38c30b')")
    conn.close()
    refused_everywhere(("--db", str(path)), tmp_path, "no_store", "holds no hermes_store database",
                       lambda: files_in(tmp_path))
    reply = run("--db", path, "--json", "current")
    assert (reply.code, reply.json()["revision"], json_error(reply)["code"]) == (1, None, "no_store")
    with sqlite3.connect(path) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master ORDER BY name")] == [
            "alembic_version", "orders", "sqlite_autoindex_alembic_version_1"]
    conn.close()


def test_sqlite_an_older_store_is_refused_not_migrated(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    assert migrations.upgrade(path, "0020") == "0020"
    refused_everywhere(("--db", str(path)), tmp_path, "needs_upgrade",
                       f"is at revision 0020 and head is {migrations.head()}", lambda: files_in(tmp_path))
    assert migrations.current(path) == "0020"
    line = run("--db", path, "sessions").stderr
    assert f"run 'hermes-store --db {path} upgrade' first" in line
    cur = run("--db", path, "--json", "current").json()
    assert (cur["revision"], cur["up_to_date"]) == ("0020", False) and migrations.current(path) == "0020"


def test_sqlite_a_store_from_a_newer_hermes_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    migrations.upgrade(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE hermes_store_version SET version_num = 'hs9999'")
    conn.close()
    refused_everywhere(("--db", str(path)), tmp_path, "schema_too_new", "does not know", lambda: files_in(tmp_path))


def test_sqlite_a_hermes_file_is_refused_until_adopted(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copy(HERMES_V11, path)
    refused_everywhere(("--db", str(path)), tmp_path, "needs_adoption", "adopt' first", lambda: files_in(tmp_path))


# ---------------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def host_database(pg_database: str) -> str:
    """A server database holding only a host application's tables (and its own revision)."""
    execute(pg_database,
            "CREATE TABLE orders (id integer PRIMARY KEY, total numeric)",
            "CREATE INDEX orders_total ON orders (total)",
            "CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)",
            "INSERT INTO alembic_version VALUES ('f1d89e38c30b')")
    return pg_database


def test_postgresql_an_empty_database_gets_nothing(pg_database: str, tmp_path: Path) -> None:
    refused_everywhere(("--url", pg_database), tmp_path, "no_store", "holds no hermes_store database",
                       lambda: catalog(pg_database))
    line = run("--url", pg_database, "stats").stderr
    assert "create one with 'hermes-store --url URL upgrade'" in line
    before = catalog(pg_database)
    reply = run("--url", pg_database, "--json", "current")
    assert (reply.code, reply.json()["revision"]) == (1, None) and catalog(pg_database) == before
    # The positive control: the catalog check sees what upgrade creates.
    assert run("--url", pg_database, "upgrade").code == 0
    after = catalog(pg_database)
    assert ("relation", "public", "sessions", "r") in after and ("extension", "pg_trgm") in after
    assert len(after - before) > 17


def test_postgresql_a_host_database_gets_nothing(host_database: str, tmp_path: Path) -> None:
    """The issue's case: `stats` on a database holding only a host's tables made 17
    tables and the pg_trgm extension."""
    before = catalog(host_database)
    assert ("alembic_version", "public", "f1d89e38c30b") in before
    refused_everywhere(("--url", host_database), tmp_path, "no_store", "holds no hermes_store database",
                       lambda: catalog(host_database))
    assert catalog(host_database) == before


def test_postgresql_a_schema_that_does_not_exist_is_not_created(host_database: str, tmp_path: Path) -> None:
    args = ("--url", host_database, "--schema", "team_x")
    refused_everywhere(args, tmp_path, "no_store", "create one with 'hermes-store --url URL --schema team_x upgrade'",
                       lambda: catalog(host_database))
    assert ("schema", "team_x") not in catalog(host_database)
    # The same with the schema given after the command name, and in the URL.
    assert run("--url", host_database, "sessions", "--schema", "team_x").code == 1
    assert run(f"--url={host_database}?schema=team_x", "sessions").code == 1
    assert ("schema", "team_x") not in catalog(host_database)
    assert run(*args, "--json", "current").json()["revision"] is None
    assert ("schema", "team_x") not in catalog(host_database)


def test_postgresql_an_empty_schema_stays_empty(host_database: str, tmp_path: Path) -> None:
    execute(host_database, "CREATE SCHEMA team_y")
    refused_everywhere(("--url", host_database, "--schema", "team_y"), tmp_path, "no_store",
                       "holds no hermes_store database", lambda: catalog(host_database))


def test_postgresql_a_store_in_public_does_not_stand_in_for_a_tenant(pg_database: str, tmp_path: Path) -> None:
    assert run("--url", pg_database, "demo").code == 0
    refused_everywhere(("--url", pg_database, "--schema", "team_z"), tmp_path, "no_store",
                       "holds no hermes_store database", lambda: catalog(pg_database))
    assert ("schema", "team_z") not in catalog(pg_database)


def test_postgresql_an_older_store_is_refused_not_migrated(pg_database: str, tmp_path: Path) -> None:
    assert run("--url", pg_database, "upgrade", "--revision", "hs0003").code == 0
    refused_everywhere(("--url", pg_database), tmp_path, "needs_upgrade",
                       f"is at revision hs0003 and head is {migrations.head()}", lambda: catalog(pg_database))
    assert migrations.current(pg_database) == "hs0003"


def test_postgresql_an_older_tenant_is_refused_not_migrated(pg_database: str, tmp_path: Path) -> None:
    args = ("--url", pg_database, "--schema", "team_a")
    assert run(*args, "upgrade", "--revision", "hs0004").code == 0
    refused_everywhere(args, tmp_path, "needs_upgrade", "is at revision hs0004", lambda: catalog(pg_database))
    assert migrations.current(pg_database, schema="team_a") == "hs0004"
    assert run(*args, "upgrade").code == 0
    assert run(*args, "--json", "sessions").json()["sessions"] == []


# ---------------------------------------------------------------------------------- at head


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_store_at_head_is_read(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    args = ("--db", str(tmp_path / "s.db")) if backend == "sqlite" else ("--url", request.getfixturevalue("pg_database"))
    assert run(*args, "upgrade").code == 0
    for argv in READERS:
        argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
        result = run(*args, *argv)
        expected = 1 if argv[0] in ("show", "lineage") else 0  # no session s1: a refusal of its own
        assert result.code == expected, (argv, result.stderr)
        if expected:
            assert "no session matches 's1'" in result.stderr
