"""Migrations behind a transaction pooler (PgBouncer, transaction mode) and directly.

Through a pooler a client's consecutive transactions run on different server
connections, so a migration must live in ONE transaction: its advisory lock, the
tenant's schema, the transaction-local search path, the revisions and the version table.

Shown here, each through the test PgBouncer (2 server connections per database) and
directly against the server: three processes opening one new tenant at once (exactly
one runs the revisions, the others wait and open, no error, no lock left behind); a
process killed while it holds the migration lock mid-revision (the next opener carries
on within seconds, and nothing the killed one did is left); a second open of a migrated
store sends no lock, DDL or setting; a database whose default search_path names no
schema migrates and opens its tenants; a caught failure of a reflection statement
inside a transaction does not abort the rest of it (SAVEPOINT).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import make_url

from hermes_store import SessionDB, migrations, paths
from hermes_store.alembic_support import VERSION_TABLE, other_version_tables
from hermes_store.engine import create_engine

from .helpers import hostile_search_path

HEAD = migrations.head()
REVISIONS = len(paths.revision_order())
ROOT = Path(__file__).resolve().parents[1]

ROUTES = [pytest.param("pooler", id="through-pgbouncer"), pytest.param("direct", id="direct")]


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, pooled_database: tuple[str, str]) -> tuple[str, str]:
    """``(URL the test uses, direct URL for looking at the server)``, per route."""
    direct, pooled = pooled_database
    return (pooled if request.param == "pooler" else direct), direct


def tenant(url: str, schema: str) -> str:
    return make_url(url).update_query_dict({"schema": schema}).render_as_string(hide_password=False)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def advisory_locks(direct: str) -> int:
    """Advisory locks held anywhere on the server (ours are the only ones in the tests' databases)."""
    engine = sa_create_engine(direct)
    try:
        with engine.connect() as conn:
            db = make_url(direct).database
            return int(conn.execute(text(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND d.datname = :d"), {"d": db}).scalar())
    finally:
        engine.dispose()


# ---------------------------------------------------------------------- three first opens at once

OPENER = r"""
import json, logging, os, sys, time
from pathlib import Path
from hermes_store import migrations

url, schema, go = json.loads(sys.argv[1])
# Alembic logs "Running upgrade A -> B" for each revision it runs: the count of who migrated.
handler = logging.StreamHandler(sys.stdout)
logging.getLogger("alembic.runtime.migration").addHandler(handler)
logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
while not Path(go).exists():  # all three start together, imports done
    time.sleep(0.005)
print("AT", migrations.upgrade(url, schema=schema), flush=True)
"""


def test_three_processes_opening_a_new_tenant_at_once(route: tuple[str, str], tmp_path: Path) -> None:
    url, direct = route
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, json.dumps([url, "team_new", str(go)])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
             for _ in range(3)]
    time.sleep(1.5)  # let every process finish importing
    go.write_text("go")
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-3000:] for _out, err in outs]
    assert all(f"AT {HEAD}" in out for out, _err in outs), outs
    ran = [out.count("Running upgrade") for out, _err in outs]
    # Exactly one ran the revisions (all of them, once); the others found the tenant at head.
    assert sorted(ran) == [0, 0, REVISIONS], ran
    assert migrations.current(direct, schema="team_new") == HEAD
    assert migrations.current(direct) is None  # the default schema was not touched
    assert advisory_locks(direct) == 0  # nothing of ours outlived its transaction


# ---------------------------------------------------------------------- killed holding the lock

HOLDER = r"""
import json, sys, time
from sqlalchemy import Engine, event
from hermes_store import migrations

url, schema = json.loads(sys.argv[1])

# Test-only: stop inside the first revision's DDL, the migration lock held, then wait to be killed.
def stop(conn, cursor, statement, *_):
    if statement.lstrip().upper().startswith("CREATE TABLE"):
        print("MIGRATING", flush=True)
        time.sleep(600)

event.listen(Engine, "after_cursor_execute", stop)
migrations.upgrade(url, schema=schema)
print("finished without being killed", flush=True)
"""


def test_a_migration_killed_holding_the_lock_blocks_nobody(route: tuple[str, str]) -> None:
    url, direct = route
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps([url, "team_kill"])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        line = holder.stdout.readline()  # type: ignore[union-attr]
        assert line.strip() == "MIGRATING", (line, holder.stderr.read() if holder.poll() is not None else "")  # type: ignore[union-attr]
        assert advisory_locks(direct) >= 1  # it really holds the migration lock, mid-revision
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)
    assert holder.returncode == -signal.SIGKILL
    started = time.monotonic()
    assert migrations.upgrade(url, schema="team_kill") == HEAD
    assert time.monotonic() - started < 10
    assert migrations.current(direct, schema="team_kill") == HEAD
    assert advisory_locks(direct) == 0


def test_a_raw_holder_of_the_migration_lock_is_waited_for_then_released_by_its_death(
        route: tuple[str, str]) -> None:
    """The lock ``pg_tenants.migration_lock`` takes is the one an upgrade waits for: held
    by another process, the upgrade waits; that process killed, it goes on at once."""
    url, direct = route
    script = r"""
import json, sys, time
from hermes_store.dialects import pg_tenants
from hermes_store.engine import create_engine
url, schema = json.loads(sys.argv[1])
engine = create_engine(url)
with engine.connect() as conn:
    conn.begin()
    pg_tenants.migration_lock(conn, schema)
    print("HELD", flush=True)
    time.sleep(600)
"""
    holder = subprocess.Popen([sys.executable, "-c", script, json.dumps([url, "team_raw"])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        assert holder.stdout.readline().strip() == "HELD"  # type: ignore[union-attr]
        waiter = subprocess.Popen([sys.executable, "-c", OPENER, json.dumps([url, "team_raw", str(ROOT)])],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=4)  # waits at the lock (it would have finished by now)
        killed = time.monotonic()
        holder.send_signal(signal.SIGKILL)
        out, err = waiter.communicate(timeout=60)
        assert time.monotonic() - killed < 10
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)
    assert waiter.returncode == 0 and f"AT {HEAD}" in out, err[-3000:]
    assert out.count("Running upgrade") == REVISIONS
    assert advisory_locks(direct) == 0


# ---------------------------------------------------------------------- a migrated store's open


@pytest.fixture
def recorded() -> Iterator[list[str]]:
    """Every statement any engine sends while the fixture is active."""
    seen: list[str] = []

    # Hook: record each statement as the driver gets it (every engine of the process).
    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def writes_or_settings(statements: list[str]) -> list[str]:
    bad = re.compile(r"pg_advisory|set_config|^\s*(CREATE|ALTER|DROP|SET|INSERT|UPDATE|DELETE)\b", re.I)
    return [s for s in statements if bad.search(s)]


@pytest.mark.parametrize("schema", [None, "team_a"])
def test_opening_a_store_at_head_only_reads_its_version(route: tuple[str, str], schema: str | None,
                                                        recorded: list[str]) -> None:
    url, _direct = route
    assert migrations.upgrade(url, schema=schema) == HEAD
    recorded.clear()
    engine = create_engine(url, schema=schema)
    try:
        assert migrations.upgrade(engine) == HEAD  # what SessionDB does on open
    finally:
        engine.dispose()
    assert writes_or_settings(recorded) == []
    ours = [s for s in recorded if "hermes_store_version" in s]
    assert ours and all(s.lstrip().upper().startswith("SELECT") for s in ours), recorded
    if schema is not None:  # the version is read in the tenant by name, never along the search path
        assert all('"team_a"' in s for s in ours), ours


def test_a_second_open_of_a_sessiondb_sends_no_lock_ddl_or_setting(route: tuple[str, str],
                                                                   recorded: list[str]) -> None:
    url, _direct = route
    with SessionDB(url) as db:
        db.create_session("s1", "cli")
    recorded.clear()
    with SessionDB(url) as db:
        assert db.get_session("s1") is not None
    assert recorded and writes_or_settings(recorded) == []


def test_a_database_whose_search_path_names_nothing_still_migrates_and_opens_tenants(
        route: tuple[str, str]) -> None:
    url, direct = route
    hostile_search_path(direct)
    assert migrations.upgrade(url, schema="team_a") == HEAD  # first time: the revisions
    assert migrations.upgrade(url, schema="team_a") == HEAD  # then the read-only check
    assert migrations.current(url, schema="team_a") == HEAD
    engine = create_engine(url, schema="team_a")
    try:
        assert migrations.upgrade(engine) == HEAD
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW search_path").scalar() == "nowhere"  # never changed
            assert conn.exec_driver_sql("SELECT count(*) FROM team_a.sessions").scalar() == 0
    finally:
        engine.dispose()


def test_a_migration_in_the_callers_transaction_leaves_nothing_after_it(route: tuple[str, str]) -> None:
    url, direct = route
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.begin()
            before = conn.exec_driver_sql("SHOW search_path").scalar()
            assert migrations.upgrade(conn, schema="team_host") == HEAD
            assert conn.exec_driver_sql("SHOW search_path").scalar() == before  # put back, locally
            held = conn.exec_driver_sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                        "AND pid = pg_backend_pid()").scalar()
            assert held >= 1  # the lock belongs to the caller's transaction ...
            conn.commit()
    finally:
        engine.dispose()
    assert advisory_locks(direct) == 0  # ... and ended with it
    assert migrations.current(direct, schema="team_host") == HEAD


# ---------------------------------------------------------------------- a caught failure


def test_a_caught_reflection_failure_does_not_abort_the_transaction(pooled_database: tuple[str, str]) -> None:
    """other_version_tables skips a table it cannot reflect. On PostgreSQL the failed
    statement runs in a SAVEPOINT, so the caller's transaction carries on."""
    direct, _pooled = pooled_database
    engine = create_engine(direct)
    try:
        with engine.connect() as conn:
            conn.begin()
            conn.exec_driver_sql("CREATE TABLE host_version (version_num varchar(32) NOT NULL)")
            conn.exec_driver_sql("CREATE TABLE unreadable (id int)")
            failed: list[str] = []

            # Hook (test-only): the server fails the column reflection of "unreadable".
            def fail(_c: Any, _cur: Any, statement: str, parameters: Any, *_: Any) -> tuple[str, Any]:
                if "pg_attribute" in statement and "unreadable" in repr(parameters) and not failed:
                    failed.append(statement)
                    return "SELECT 1/0", None
                return statement, parameters

            event.listen(conn, "before_cursor_execute", fail, retval=True)
            found = other_version_tables(conn, VERSION_TABLE)
            event.remove(conn, "before_cursor_execute", fail)
            assert failed  # the failure really happened on the server
            assert "host_version" in found and "unreadable" not in found
            assert conn.exec_driver_sql("SELECT count(*) FROM unreadable").scalar() == 0  # still usable
            conn.commit()
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT to_regclass('host_version') IS NOT NULL").scalar()
    finally:
        engine.dispose()


def test_no_session_setting_or_session_lock_in_the_migration_code() -> None:
    """The pieces that talk to the server during a migration or a copy never set anything
    for the session: behind a pooler it would reach another client."""
    files = [ROOT / "alembic" / "env.py", ROOT / "hermes_store" / "dialects" / "pg_tenants.py",
             ROOT / "hermes_store" / "migrations.py", ROOT / "hermes_store" / "copying" / "destination.py"]
    session_level = re.compile(r"pg_(try_)?advisory_lock|set_config\([^)]*false|SET\s+(SESSION\s+)?search_path", re.I)
    assert {f.name: session_level.findall(f.read_text()) for f in files} == {f.name: [] for f in files}
