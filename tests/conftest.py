"""Shared fixtures and hooks (helpers that are not fixtures live in helpers.py). Databases
are always built by running the migrations, never create_all."""

from __future__ import annotations

import itertools
import os
import sqlite3
from contextlib import ExitStack
from pathlib import Path
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session as OrmSession

from hermes_store import SessionDB, encryption, migrations, paths
from hermes_store.engine import create_engine

from .helpers import (
    CITUS_URL_ENV,
    PG_URL_ENV,
    PGBOUNCER_URL_ENV,
    TenantPlacements,
    distributed_schema,
    in_schema,
    required_env,
    server_database,
    via_pooler,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "on_citus: the module's backend/server cases also run on the Citus test cluster, each store in a"
        " distributed schema of its own (conftest.pytest_generate_tests)")


@pytest.fixture(autouse=True, scope="session")
def _no_key_of_the_developers_shell() -> Iterator[None]:
    """An encrypted store's key in the shell (``$HERMES_STORE_KEY``, ``$HERMES_STORE_KEY_FILE``)
    is unset before any fixture runs: a module's store built from a path would otherwise
    be opened (and created) with it, long before a test's own fixture could unset it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(encryption.KEY_ENV, raising=False)
        patch.delenv(encryption.KEY_FILE_ENV, raising=False)
        yield


@pytest.fixture(autouse=True)
def _not_the_developers_shell(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never depend on the shell they run in: ``$HERMES_STORE_URL`` and an
    encrypted store's key (``$HERMES_STORE_KEY``, ``$HERMES_STORE_KEY_FILE``) are unset
    and ``$HERMES_HOME`` is a fresh empty folder for every test (and the processes it
    starts), unless the test sets them itself."""
    monkeypatch.delenv("HERMES_STORE_URL", raising=False)
    monkeypatch.delenv(encryption.KEY_ENV, raising=False)
    monkeypatch.delenv(encryption.KEY_FILE_ENV, raising=False)
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


def module_marked(metafunc: pytest.Metafunc, name: str) -> bool:
    """The module says ``pytestmark = pytest.mark.<name>`` (alone or in a list)."""
    marks = getattr(metafunc.module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return any(m.name == name for m in marks)


def runs_on_both(metafunc: pytest.Metafunc) -> bool:
    """The module says ``pytestmark = pytest.mark.both_backends`` (alone or in a list)."""
    return module_marked(metafunc, "both_backends")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run both-backend modules once per backend (``[sqlite]``, ``[postgresql]``).

    Any test of such a module that asks for ``db`` or ``backend`` is parametrized; a
    fixture of the module can branch on ``backend`` to build its own store.

    A module also marked ``on_citus`` runs them on the Citus test cluster as well
    (``[citus]``: the store in a distributed schema of its own, :func:`citus_store`), and
    its tests that ask for ``server`` (a server-only store: :func:`pg_store`) run once per
    server, ``[postgresql]`` and ``[citus]``.
    """
    citus = ["citus"] if module_marked(metafunc, "on_citus") else []
    if citus and "server" in metafunc.fixturenames:
        metafunc.parametrize("server", ["postgresql", *citus])
    elif runs_on_both(metafunc) and ({"db", "backend"} & set(metafunc.fixturenames)):
        # A test that reaches under the API into SQLite itself (raw ``?`` SQL through
        # _execute_write, the TEMP staging table, a hand-made cycle) says so with
        # @pytest.mark.sqlite_only; its PostgreSQL twin lives in test_pg_backend.py.
        only_sqlite = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize("backend", ["sqlite"] if only_sqlite else ["sqlite", "postgresql", *citus])


@pytest.fixture
def backend() -> str:
    """The backend of ``db`` (SQLite unless a test or module asks for both)."""
    return "sqlite"


@pytest.fixture
def db(tmp_path: Path, backend: str, request: pytest.FixtureRequest):
    """A SessionDB on a fresh SQLite file, on a fresh PostgreSQL database, or in a fresh
    distributed schema on the Citus cluster; closed afterwards."""
    if backend == "postgresql":
        store = SessionDB(request.getfixturevalue("pg_database"))
    elif backend == "citus":
        store = SessionDB(request.getfixturevalue("citus_store"))
    else:
        store = SessionDB(tmp_path / "home" / "state.db")
    yield store
    store.close()


@pytest.fixture
def server() -> str:
    """The server of :func:`pg_store` (PostgreSQL unless an ``on_citus`` module asks for both)."""
    return "postgresql"


@pytest.fixture
def pg_store(server: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty place for one store on a server, as a URL string: a database of its
    own (``[postgresql]``, :func:`pg_database`), or a distributed schema of its own on the
    Citus cluster (``[citus]``, :func:`citus_store`: the URL names it with ``?schema=``)."""
    return str(request.getfixturevalue("citus_store" if server == "citus" else "pg_database"))


# --------------------------------------------------------------------- PostgreSQL

@pytest.fixture(scope="session")
def pg_url() -> str:
    """The test server's URL (``scripts/pg-test-server start`` exports it).

    Without it the PostgreSQL cases skip with a visible reason; under CI=true a
    skipped PostgreSQL case would hide a missing server, so it fails instead.
    """
    return required_env(PG_URL_ENV, "PostgreSQL tests", "start a server with")


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
    module = request.module.__name__.rsplit(".", 1)[-1]
    direct = module in DIRECT_MODULES or request.node.get_closest_marker("pg_direct") is not None
    pooler = None
    if not direct and (os.environ.get(PGBOUNCER_URL_ENV) or os.environ.get("CI") == "true"):
        pooler = request.getfixturevalue("pgbouncer_url")  # under CI=true: required, never skipped
    with server_database(pg_url) as url:
        yield via_pooler(url, pooler) if pooler else url


# --------------------------------------------------------------------- Citus

@pytest.fixture(scope="session")
def citus_url() -> str:
    """The Citus test cluster's coordinator (``scripts/citus-test-cluster start`` exports
    it). Without it the Citus cases skip with a visible reason (a clone without
    ``../shared/vendor`` has no Citus to build); under CI=true they fail instead."""
    return required_env(CITUS_URL_ENV, "Citus tests", "start a cluster with", script="citus-test-cluster")


@pytest.fixture
def citus_tenant(citus_url: str) -> Iterator[tuple[str, str]]:
    """A fresh distributed schema (Citus schema-based sharding) of this test alone on the
    cluster, not migrated yet: ``(coordinator URL, schema)``; dropped afterwards. The
    tests share the coordinator's database, each in schemas of its own."""
    with distributed_schema(citus_url) as schema:
        yield citus_url, schema


#: Tenants of the Citus cases of this process, counted: each new one goes to the other worker.
_CITUS_TENANTS = itertools.count()
#: Which worker the tenants of each placement landed on (this process): the check that
#: alternating placements did land on both workers (:class:`helpers.TenantPlacements`).
_CITUS_PLACED = TenantPlacements()


@pytest.fixture
def citus_schemas(citus_url: str) -> Iterator[Callable[[], str]]:
    """``new()``: one more fresh distributed schema on the cluster for this test (its
    name), dropped afterwards. Consecutive tenants of a process are placed on alternate
    workers, so a family's tenants land on both; at the end each one (once it holds
    tables) is checked to be a distributed schema whole on the worker its placement
    says, and the two placements on two different workers."""
    with ExitStack() as stack:
        made: list[tuple[str, int]] = []

        def new() -> str:
            placement = next(_CITUS_TENANTS) % 2
            made.append((stack.enter_context(distributed_schema(citus_url, placement=placement)), placement))
            return made[-1][0]

        yield new
        for schema, placement in made:  # before the schemas are dropped (the stack unwinds after)
            _CITUS_PLACED.check(citus_url, schema, placement)


@pytest.fixture
def citus_store(citus_schemas: Callable[[], str], citus_url: str) -> str:
    """A SessionDB URL (``<coordinator>?schema=t_…``) for a fresh distributed schema of this
    test alone, not migrated yet (opening it migrates it); dropped afterwards."""
    return in_schema(citus_url, citus_schemas())
