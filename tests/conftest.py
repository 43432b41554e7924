"""Shared fixtures. Databases are always built by running the migrations, never create_all."""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session as OrmSession

from hermes_store import migrations, paths
from hermes_store.engine import create_engine

DATA = Path(__file__).parent / "data"
SCHEMA_DIR = DATA / "schema"
HERMES_DBS = DATA / "hermes-dbs"


def reference_schema(name: str | int) -> dict:
    """The normalized Hermes schema ``hermes_v<name>.json`` carried in tests/data."""
    return json.loads((SCHEMA_DIR / f"hermes_v{name}.json").read_text())


def rev(n: int) -> str:
    return f"{n:04d}"


def snap(path: Path) -> dict:
    """Normalized schema snapshot of a database file."""
    from hermes_store import introspect

    conn = sqlite3.connect(path)
    try:
        return introspect.snapshot(conn)
    finally:
        conn.close()


def sha(path: Path) -> str:
    """Content hash, to prove a refused file was left byte-for-byte unchanged."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def integrity_check(conn: sqlite3.Connection) -> None:
    """FTS5's own check of every FTS table: the index matches its content (raises if not)."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%'")]
    for table in tables:
        conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")


@pytest.fixture(autouse=True)
def _not_the_developers_shell(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never depend on the shell they run in: ``$HERMES_STORE_URL`` is unset and
    ``$HERMES_HOME`` is a fresh empty folder for every test (and the processes it starts),
    unless the test sets them itself."""
    monkeypatch.delenv("HERMES_STORE_URL", raising=False)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path_factory.mktemp("hermes-home")))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def migrate(db_path: Path) -> Callable[[str], Path]:
    """Bring the test file to a revision (``"head"``, ``"0007"``, ``"base"``...)."""

    def _migrate(revision: str = "head") -> Path:
        cur = migrations.current(db_path) if db_path.exists() else None
        order = paths.revision_order()  # ids are not all numbers (hs0001): compare places
        if revision == "base" or (cur is not None and revision != "head" and order.index(revision) < order.index(cur)):
            migrations.downgrade(db_path, revision)
        else:
            migrations.upgrade(db_path, revision)
        return db_path

    return _migrate


@pytest.fixture
def head_db(migrate: Callable[[str], Path]) -> Path:
    return migrate("head")


@pytest.fixture
def raw(db_path: Path) -> Iterator[Callable[[], sqlite3.Connection]]:
    """Plain sqlite3 connections to the test file (autocommit), closed afterwards."""
    opened: list[sqlite3.Connection] = []

    def _open() -> sqlite3.Connection:
        conn = sqlite3.connect(db_path, isolation_level=None)
        opened.append(conn)
        return conn

    yield _open
    for conn in opened:
        conn.close()


@pytest.fixture
def engine(head_db: Path) -> Iterator[Engine]:
    eng = create_engine(head_db)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[OrmSession]:
    """An ORM session inside an outer transaction that is rolled back afterwards.

    Our engine emits its own BEGIN, so the SAVEPOINTs the session uses are real and
    nothing the test writes leaks into the file (the Python 3.11 sqlite3 trap).
    """
    with engine.connect() as conn:
        outer = conn.begin()
        orm = OrmSession(bind=conn, join_transaction_mode="create_savepoint")
        try:
            yield orm
        finally:
            orm.close()
            outer.rollback()


#: Test modules whose ``db`` runs on both backends (SQLite file, PostgreSQL database).
#: A module can also say so itself with ``pytestmark = pytest.mark.both_backends``.
BOTH_BACKENDS = frozenset({"test_sessions", "test_messages", "test_titles", "test_lineage"})


def runs_on_both(metafunc: pytest.Metafunc) -> bool:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    marks = getattr(metafunc.module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return module in BOTH_BACKENDS or any(m.name == "both_backends" for m in marks)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run both-backend modules once per backend (``[sqlite]``, ``[postgresql]``).

    Any test of such a module that asks for ``db`` or ``backend`` is parametrized; a
    fixture of the module can branch on ``backend`` to build its own store.
    """
    if runs_on_both(metafunc) and ({"db", "backend"} & set(metafunc.fixturenames)):
        # A test that reaches under the API into SQLite itself (raw ``?`` SQL through
        # _execute_write, the TEMP staging table, a hand-made cycle) says so with
        # @pytest.mark.sqlite_only; its PostgreSQL twin lives in test_pg_backend.py.
        only_sqlite = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize("backend", ["sqlite"] if only_sqlite else ["sqlite", "postgresql"])


@pytest.fixture
def backend() -> str:
    """The backend of ``db`` (SQLite unless a test or module asks for both)."""
    return "sqlite"


@pytest.fixture
def db(tmp_path: Path, backend: str, request: pytest.FixtureRequest):
    """A SessionDB on a fresh SQLite file, or on a fresh PostgreSQL database, closed afterwards."""
    from hermes_store import SessionDB

    if backend == "postgresql":
        store = SessionDB(request.getfixturevalue("pg_database"))
    else:
        store = SessionDB(tmp_path / "home" / "state.db")
    yield store
    store.close()


def set_times(store, session_id: str, *, started_at: float | None = None, ended_at: float | None = None,
              end_reason: str | None = None) -> None:
    """Test helper: place a session in time (Hermes stamps times itself)."""
    from sqlalchemy import text

    def run(conn):
        conn.execute(
            text(
                "UPDATE sessions SET started_at = COALESCE(CAST(:s AS DOUBLE PRECISION), started_at),"
                " ended_at = :e, end_reason = :r WHERE id = :id"
            ),
            {"s": started_at, "e": ended_at, "r": end_reason, "id": session_id},
        )

    store._write(run)


# --------------------------------------------------------------------- PostgreSQL

PG_URL_ENV = "HERMES_STORE_TEST_PG_URL"


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The test server's URL (``scripts/pg-test-server start`` exports it).

    Without it the PostgreSQL cases skip with a visible reason; under CI=true a
    skipped PostgreSQL case would hide a missing server, so it fails instead.
    """
    return required_env(PG_URL_ENV, "PostgreSQL tests", "start a server with")


def required_env(name: str, what: str, how: str) -> str:
    """``$name``; without it skip, saying why, or under CI=true fail (a skip would hide it)."""
    import os

    value = os.environ.get(name)
    if not value:
        reason = f"{name} is not set: {how} `eval \"$(scripts/pg-test-server start)\"`"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} must run under CI: {reason}")
        pytest.skip(reason)
    return value


def hostile_search_path(direct_url: str, search_path: str = "'nowhere'") -> None:
    """Give new connections to the database at ``direct_url`` a ``search_path`` that
    names nothing (or another tenant): a statement that does not name its schema then
    fails, or lands in the wrong tenant, where a test sees it."""
    from sqlalchemy import create_engine as sa_create_engine
    from sqlalchemy.engine import make_url

    admin = sa_create_engine(direct_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{make_url(direct_url).database}" SET search_path = {search_path}')
    finally:
        admin.dispose()


PGBOUNCER_URL_ENV = "HERMES_STORE_TEST_PGBOUNCER_URL"
#: Test modules whose PostgreSQL cases talk to the server directly; every other family
#: goes through the transaction pooler (when one runs), so both paths stay covered. A
#: single test says ``@pytest.mark.pg_direct`` when it needs more server connections at
#: once than the pooler's 2 (a deadlock between two writers and a third reader), or
#: counts the server's own connections.
DIRECT_MODULES = frozenset({"test_pg_migrations", "test_copy", "test_pg_tenants"})


@pytest.fixture(scope="session")
def pgbouncer_url(pg_url: str) -> str:
    """The URL of the PgBouncer (transaction mode, 2 server connections per database) in
    front of the test server; ``scripts/pg-test-server start`` exports it. Required under
    CI=true, like the server itself."""
    return required_env(PGBOUNCER_URL_ENV, "pooler tests", "it is started by")


def via_pooler(direct_url: str, pooler_url: str) -> str:
    """The same database as ``direct_url`` (a test database), reached through the pooler."""
    from sqlalchemy.engine import make_url

    direct = make_url(direct_url)
    return make_url(pooler_url).set(database=direct.database, query=direct.query).render_as_string(
        hide_password=False
    )


@pytest.fixture
def pooled_database(pg_url: str, pgbouncer_url: str) -> Iterator[tuple[str, str]]:
    """A fresh database of its own: ``(direct URL, URL through the pooler)``."""
    with server_database(pg_url) as url:
        yield url, via_pooler(url, pgbouncer_url)


@pytest.fixture
def pg_database(pg_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty database on the test server for this test alone (URL string), dropped afterwards.

    A database per test (not a schema) so extensions, functions and the version table
    of one test can never be seen by another running in parallel. Reached through the
    transaction pooler when one runs, except from :data:`DIRECT_MODULES`.
    """
    import os

    module = request.module.__name__.rsplit(".", 1)[-1]
    direct = module in DIRECT_MODULES or request.node.get_closest_marker("pg_direct") is not None
    pooler = None
    if not direct and (os.environ.get(PGBOUNCER_URL_ENV) or os.environ.get("CI") == "true"):
        pooler = request.getfixturevalue("pgbouncer_url")  # under CI=true: required, never skipped
    with server_database(pg_url) as url:
        yield via_pooler(url, pooler) if pooler else url


@contextmanager
def server_database(pg_url: str, options: str = "", prefix: str = "hs_test_") -> Iterator[str]:
    """A fresh database of its own on the test server (its URL), dropped afterwards;
    ``options`` go to CREATE DATABASE. Every test database is made here."""
    import uuid

    from sqlalchemy import create_engine as sa_create_engine
    from sqlalchemy.engine import make_url

    name = f"{prefix}{uuid.uuid4().hex[:16]}"
    admin = sa_create_engine(pg_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"{options}')
        try:
            yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@contextmanager
def module_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 fill: Callable[[Any], Any]) -> Iterator[Any]:
    """A SessionDB filled once by ``fill`` for a module-scoped fixture whose param is the
    backend ("sqlite": a file; "postgresql": a database of its own), closed afterwards."""
    from hermes_store import SessionDB

    with ExitStack() as stack:
        if request.param == "sqlite":
            target: Any = tmp_path_factory.mktemp("store") / "state.db"
        else:
            target = stack.enter_context(server_database(request.getfixturevalue("pg_url"), prefix="hs_mod_"))
        yield fill(stack.enter_context(SessionDB(target)))
