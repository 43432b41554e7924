"""Behind a transaction pooler: nothing of ours outlives a transaction.

PgBouncer in transaction mode lends a server connection for one transaction, then to
any client. These cases run against a real PgBouncer: the one ``scripts/pg-test-server``
starts (2 server connections per database), and private ones started here with ONE
server connection per database, so every client's transactions share it with the
others'. Whatever a client left on it (a session ``SET``, a session advisory lock, a
prepared statement) the next client would meet.

Shown here: two tenants × two writer processes through a one-connection pool (no row in
the wrong schema, no foreign row read, no error); a server connection we used carries
no search_path, lock_timeout, advisory lock or prepared statement of ours afterwards;
prepared statements are off by default and can be turned on; a pooler's query timeout
is a typed "waited too long" error.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import make_url

from hermes_store import SessionDB, UnitOfWork, errors
from hermes_store.engine import create_engine

from .helpers import server_database, via_pooler
from .test_pg_tenants import two_tenants_two_writers


def _pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
    if found is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(cmd: list[str]) -> list[str]:
    """PgBouncer refuses to run as root, like the server."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture
def private_pooler(pg_url: str) -> Iterator[Callable[..., str]]:
    """Start PgBouncers of our own in transaction mode: ``start(**settings)`` returns a
    URL (database ``postgres``) through one with a pool of ONE server connection per
    database unless ``settings`` say otherwise; each is stopped afterwards."""
    binary = _pgbouncer_binary()
    server = make_url(pg_url)
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(**settings: Any) -> str:
        folder = Path(tempfile.mkdtemp(prefix="hs-pooler-"))
        port = _free_port()
        conf = {
            "listen_addr": "127.0.0.1", "listen_port": port, "unix_socket_dir": "", "auth_type": "trust",
            "auth_file": folder / "users", "pool_mode": "transaction", "default_pool_size": 1,
            "min_pool_size": 0, "reserve_pool_size": 0, "max_client_conn": 200, "server_reset_query": "",
            "ignore_startup_parameters": "extra_float_digits,options", "logfile": folder / "log",
            **settings,
        }
        (folder / "users").write_text('"postgres" ""\n')
        (folder / "ini").write_text(
            f"[databases]\n* = host={server.host} port={server.port}\n[pgbouncer]\n"
            + "".join(f"{k} = {v}\n" for k, v in conf.items())
        )
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres")
            for f in folder.iterdir():
                shutil.chown(f, "postgres")
        proc = subprocess.Popen(_as_postgres([binary, str(folder / "ini")]),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        started.append((proc, folder))
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "pgbouncer exited"
            assert time.monotonic() < deadline, "pgbouncer did not start"
            time.sleep(0.05)
        return server.set(port=port).render_as_string(hide_password=False)

    yield start
    for proc, folder in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def one_connection(pg_url: str, private_pooler: Callable[..., str]) -> Iterator[tuple[str, str]]:
    """A fresh database: ``(direct URL, URL through a pooler with one server connection)``."""
    pooler = private_pooler()
    with server_database(pg_url) as url:
        yield url, via_pooler(url, pooler)


def _psycopg(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.mark.parametrize("pool", ["one server connection", "the CI pooler"])
def test_two_tenants_two_writers_through_a_pooler(pool: str, request: pytest.FixtureRequest) -> None:
    """The sharing proof of test_pg_tenants through a pooler, with every process on one
    server connection, and on the pooler every other family uses (2): each process opens
    (and first-migrates) its tenant at once, appends, titles, reads and searches. No row
    lands in the other schema, no read returns a foreign row, no call fails."""
    direct, pooled = request.getfixturevalue("one_connection" if pool.startswith("one") else "pooled_database")
    plain = sa_create_engine(direct)
    try:
        two_tenants_two_writers(pooled, plain, per=60)
    finally:
        plain.dispose()


def _server_connection_state(pooled: str) -> dict[str, Any]:
    """What the (one) server connection behind ``pooled`` carries, asked by a foreign client."""
    with psycopg.connect(_psycopg(pooled), prepare_threshold=None, autocommit=True) as raw:
        row = raw.execute(
            "SELECT current_setting('search_path'), current_setting('lock_timeout'),"
            " (SELECT count(*) FROM pg_prepared_statements),"
            # Advisory locks in this test's own database (others run in parallel on the server).
            " (SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            "  WHERE l.locktype = 'advisory' AND d.datname = current_database()), pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return dict(zip(("search_path", "lock_timeout", "prepared", "advisory", "pid"), row, strict=True))


def test_a_server_connection_keeps_nothing_of_ours(one_connection: tuple[str, str]) -> None:
    """A tenant store opened (first migration included), written, searched, maintained and
    closed through a one-connection pool leaves that server connection exactly as a
    foreign client found it: default search_path and lock_timeout, no prepared
    statement, no advisory lock held in the database."""
    direct, pooled = one_connection
    before = _server_connection_state(pooled)
    with SessionDB(pooled, schema="team_a") as db:
        db.create_session("s1", "cli")
        for i in range(12):  # past psycopg's default prepare threshold (5)
            db.append_message("s1", "user", f"hello pooled world {i} 数据库", tool_calls=[{"id": i}])
        db.set_session_title("s1", "pooled")
        db.update_token_counts("s1", input_tokens=3, model="m")
        for _ in range(6):
            assert db.search_messages("pooled")
            assert db.search_messages("数据")
            assert db.get_session("s1")["message_count"] == 12
        db.optimize_fts()
        during = _server_connection_state(pooled)
    with SessionDB(pooled, schema="team_a") as db:  # the open at head: a read-only check
        assert db.message_count("s1") == 12
    after = _server_connection_state(pooled)
    assert before["pid"] == during["pid"] == after["pid"]  # one server connection all along
    for state in (during, after):
        assert {k: state[k] for k in ("search_path", "lock_timeout", "prepared", "advisory")} == {
            k: before[k] for k in ("search_path", "lock_timeout", "prepared", "advisory")}
    assert after["prepared"] == 0 and after["advisory"] == 0
    # And the rows are where they belong: in team_a, nothing in public.
    with psycopg.connect(_psycopg(direct)) as raw:
        assert raw.execute("SELECT count(*) FROM team_a.messages").fetchone() == (12,)
        assert raw.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def _prepared_after_repeats(engine: Engine, times: int = 8) -> int:
    with engine.connect() as conn:
        for _ in range(times):
            conn.execute(text("SELECT count(*) FROM pg_class WHERE relname = :n"), {"n": "pg_type"}).scalar()
        return int(conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar() or 0)


def test_prepared_statements_are_off_by_default_and_can_be_turned_on(pg_database: str) -> None:
    """psycopg prepares a statement on the server after 5 executions; a pooler that does
    not track that hands the prepared statement to another client. Off by default; on
    with ``prepared_statements=True`` or ``?prepare_threshold=N``."""
    default = create_engine(pg_database)
    on = create_engine(pg_database, prepared_statements=True)
    by_url = create_engine(make_url(pg_database).update_query_dict({"prepare_threshold": "1"}))
    explicit = create_engine(pg_database, connect_args={"prepare_threshold": 0})
    try:
        assert _prepared_after_repeats(default) == 0
        assert _prepared_after_repeats(on) >= 1
        assert _prepared_after_repeats(by_url) >= 1
        assert _prepared_after_repeats(explicit) >= 1
    finally:
        for engine in (default, on, by_url, explicit):
            engine.dispose()


def test_a_pooler_query_timeout_is_a_typed_wait_error(pg_url: str, private_pooler: Callable[..., str]) -> None:
    """PgBouncer cuts off a statement after ``query_timeout`` and reports it as a protocol
    error (08P01); that is "waited too long" (DatabaseLockedError), not "server down"."""
    pooled = private_pooler(query_timeout=1)
    with server_database(pg_url) as url:
        engine = create_engine(via_pooler(url, pooled))
        try:
            started = time.monotonic()
            with pytest.raises(errors.DatabaseLockedError, match="waiting too long"):
                with engine.connect() as conn:
                    conn.exec_driver_sql("SELECT pg_sleep(5)")
            assert time.monotonic() - started < 4.5
            with engine.connect() as conn:  # the pool recovers: the next statement works
                assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        finally:
            engine.dispose()


def test_a_unit_of_work_in_a_tenant_leaves_a_hosts_connection_as_it_was(pooled_database: tuple[str, str]) -> None:
    """A host's engine (not bound to a tenant) running our unit of work in ``team_a``:
    its connection's search_path is never changed, during or after."""
    _direct, pooled = pooled_database
    with SessionDB(pooled, schema="team_a") as db:
        db.create_session("h1", "cli")
    host = sa_create_engine(pooled, connect_args={"prepare_threshold": None})
    try:
        with host.connect() as conn:
            before = conn.exec_driver_sql("SELECT current_setting('search_path')").scalar()
        with UnitOfWork(host, schema="team_a") as uow:
            assert uow.sessions.get("h1") is not None
            assert uow.conn.exec_driver_sql("SELECT current_setting('search_path')").scalar() == before
            uow.messages.append("h1", "user", "from the host")
        with host.connect() as conn:
            assert conn.exec_driver_sql("SELECT current_setting('search_path')").scalar() == before
            assert conn.exec_driver_sql("SELECT count(*) FROM team_a.messages").scalar() == 1
    finally:
        host.dispose()


def test_column_caches_are_per_tenant_and_never_keep_a_missing_table(pooled_database: tuple[str, str]) -> None:
    """One host engine, three tenants: ``team_a`` has a column ``team_b`` lacks, and
    ``team_c`` is not migrated yet. What one tenant's columns are is never answered
    from another's (a write naming the extra column lands in team_a and is refused in
    team_b, in either order), and "no such table" is not remembered: once team_c is
    migrated, the same engine writes there."""
    direct, pooled = pooled_database
    for tenant in ("team_a", "team_b"):
        with SessionDB(pooled, schema=tenant) as db:
            db.create_session("s", "cli")
    with psycopg.connect(_psycopg(direct), autocommit=True) as raw:
        raw.execute("ALTER TABLE team_a.messages ADD COLUMN extra_note TEXT")
    host = create_engine(pooled)
    try:
        for order in (("team_a", "team_b"), ("team_b", "team_a")):
            for tenant in order:
                with UnitOfWork(host, schema=tenant) as uow:
                    if tenant == "team_a":
                        uow.messages.append("s", "user", "noted", extra_note="kept")
                    else:
                        with pytest.raises(errors.UnknownFieldError, match="extra_note"):
                            uow.messages.append("s", "user", "noted", extra_note="refused")
        with pytest.raises(errors.NotMigratedError):
            with UnitOfWork(host, schema="team_c") as uow:
                uow.messages.append("s", "user", "too early")
        with SessionDB(pooled, schema="team_c") as db:
            db.create_session("s", "cli")
        with UnitOfWork(host, schema="team_c") as uow:
            uow.messages.append("s", "user", "now it exists")
    finally:
        host.dispose()
    with psycopg.connect(_psycopg(direct)) as raw:
        assert raw.execute("SELECT count(*), count(extra_note) FROM team_a.messages").fetchone() == (2, 2)
        assert raw.execute("SELECT count(*) FROM team_b.messages").fetchone() == (0,)
        assert raw.execute("SELECT content FROM team_c.messages").fetchall() == [("now it exists",)]
