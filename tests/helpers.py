"""Helpers shared by the test modules (fixtures and hooks live in conftest.py, which
imports what it needs from here; tests import these names from here, never from conftest)."""

from __future__ import annotations

import hashlib
import json
import importlib
import os
import sqlite3
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import text
from sqlalchemy.engine import make_url

from hermes_store import SessionDB, introspect

#: The repository root, and the test data every module reads (never /work/shared).
REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
#: The normalized Hermes schemas: the package's own copy, the one adoption checks against.
SCHEMA_DIR = Path(introspect.__file__).resolve().parent / "reference_schemas"
HERMES_DBS = DATA / "hermes-dbs"

PG_URL_ENV = "HERMES_STORE_TEST_PG_URL"
PGBOUNCER_URL_ENV = "HERMES_STORE_TEST_PGBOUNCER_URL"
#: The coordinator of the Citus test cluster (``scripts/citus-test-cluster start``).
CITUS_URL_ENV = "HERMES_STORE_TEST_CITUS_URL"


def reference_schema(name: str | int) -> dict:
    """The normalized Hermes schema ``hermes_v<name>.json`` the package ships."""
    return json.loads((SCHEMA_DIR / f"hermes_v{name}.json").read_text())


def rev(n: int) -> str:
    return f"{n:04d}"


def snap(path: Path) -> dict:
    """Normalized schema snapshot of a database file."""
    conn = sqlite3.connect(path)
    try:
        return introspect.snapshot(conn)
    finally:
        conn.close()


def sha(path: Path) -> str:
    """Content hash, to prove a refused file was left byte-for-byte unchanged."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def integrity_check(conn: sqlite3.Connection) -> None:
    """FTS5's own check of every FTS table: the index matches its content (raises if not)."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%'")]
    for table in tables:
        conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")


# --------------------------------------------------------------------- PostgreSQL


def required_env(name: str, what: str, how: str, script: str = "pg-test-server") -> str:
    """``$name``; without it skip, saying why, or under CI=true fail (a skip would hide it)."""
    value = os.environ.get(name)
    if not value:
        reason = f"{name} is not set: {how} `eval \"$(scripts/{script} start)\"`"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} must run under CI: {reason}")
        pytest.skip(reason)
    return value


def required_module(name: str, what: str) -> None:
    """Import ``name`` (an optional extra's module); without it skip the module or test,
    saying why, or under CI=true fail (``.ci/run`` installs every extra: a skip would hide
    a missing one)."""
    try:
        importlib.import_module(name)
    except ImportError:
        reason = f"{what} need {name}: install the extra (pip install '.[test]' brings it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason, allow_module_level=True)


def hostile_search_path(direct_url: str, search_path: str = "'nowhere'") -> None:
    """Give new connections to the database at ``direct_url`` a ``search_path`` that
    names nothing (or another tenant): a statement that does not name its schema then
    fails, or lands in the wrong tenant, where a test sees it."""
    admin = sa_create_engine(direct_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{make_url(direct_url).database}" SET search_path = {search_path}')
    finally:
        admin.dispose()


def via_pooler(direct_url: str, pooler_url: str) -> str:
    """The same database as ``direct_url`` (a test database), reached through the pooler."""
    direct = make_url(direct_url)
    return make_url(pooler_url).set(database=direct.database, query=direct.query).render_as_string(
        hide_password=False
    )


@contextmanager
def server_database(pg_url: str, options: str = "", prefix: str = "hs_test_") -> Iterator[str]:
    """A fresh database of its own on the test server (its URL), dropped afterwards;
    ``options`` go to CREATE DATABASE. Every test database is made here."""
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


def in_schema(url: str, schema: str) -> str:
    """``url`` (a server URL string) naming the tenant ``schema`` with ``?schema=``."""
    return make_url(url).update_query_dict({"schema": schema}).render_as_string(hide_password=False)


# --------------------------------------------------------------------- Citus

#: The worker holding a distributed schema: its tables are single-shard tables of one
#: co-location group, so all their shards are on one node.
_TENANT_TABLES = ("SELECT t.citus_table_type, t.colocation_id, s.nodename || ':' || s.nodeport FROM citus_tables t"
                  " JOIN citus_shards s ON s.table_name = t.table_name"
                  " WHERE t.table_name::text LIKE :prefix")


@contextmanager
def distributed_schema(citus_url: str, *, placement: int | None = None, prefix: str = "t_") -> Iterator[str]:
    """A fresh distributed schema (Citus schema-based sharding) on the cluster at
    ``citus_url``, not migrated (its name); dropped afterwards with all it holds.

    ``placement`` (0 or 1): the worker it is to land on, by the rule Citus places a new
    schema's first table with (``colocation id mod workers``, create_shards.c
    ``EmptySingleShardTableColocationDecideNodeId``): a schema drawn with the other
    parity is dropped and another made. Schema-based sharding is turned on in the
    fixture's own admin session: a host turns it on, not us.
    """
    admin = sa_create_engine(citus_url, isolation_level="AUTOCOMMIT")
    made: list[str] = []
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql("SET citus.enable_schema_based_sharding TO on")
            workers = int(conn.exec_driver_sql(
                "SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'"
                " AND shouldhaveshards AND isactive").scalar() or 0)
            assert workers == 2, f"the test cluster has {workers} workers, not 2"
            for _attempt in range(20):  # the other test process draws ids too
                schema = f"{prefix}{uuid.uuid4().hex[:12]}"
                conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
                made.append(schema)
                colocation = conn.execute(text(
                    "SELECT colocationid FROM pg_dist_schema WHERE schemaid = CAST(:s AS regnamespace)"),
                    {"s": schema}).scalar()
                assert colocation is not None, f"{schema} was made, but not as a distributed schema"
                if placement is None or colocation % workers == placement:
                    break
                conn.exec_driver_sql(f'DROP SCHEMA "{made.pop()}"')
            else:
                raise AssertionError(f"no new schema drew placement {placement} in 20 attempts")
        yield schema
    finally:
        with admin.connect() as conn:
            for name in made:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        admin.dispose()


class TenantPlacements:
    """Where the distributed tenants of this test process landed, by placement: each one
    whole on one worker, alternate placements on the two different workers."""

    def __init__(self) -> None:
        self.worker_of: dict[int, str] = {}

    def check(self, citus_url: str, schema: str, placement: int) -> str | None:
        """Assert that ``schema`` is distributed and whole on the worker of ``placement``;
        that worker (None while the schema holds no table: nothing is placed yet)."""
        admin = sa_create_engine(citus_url)
        try:
            with admin.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM pg_dist_schema WHERE schemaid = CAST(:s AS regnamespace)"),
                                    {"s": schema}).scalar() == 1, f"{schema} is not a distributed schema"
                rows = conn.execute(text(_TENANT_TABLES), {"prefix": f"{schema}.%"}).all()
                workers = {str(r[0]) for r in conn.exec_driver_sql(
                    "SELECT nodename || ':' || nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'")}
        finally:
            admin.dispose()
        if not rows:
            return None
        assert {r[0] for r in rows} == {"schema"} and len({r[1] for r in rows}) == 1, (schema, rows)
        nodes = {str(r[2]) for r in rows}
        assert len(nodes) == 1 and nodes <= workers, (schema, nodes, workers)
        node = nodes.pop()
        expected = self.worker_of.setdefault(placement, node)
        assert node == expected, f"{schema} (placement {placement}) is on {node}, its placement's tenants on {expected}"
        assert node not in {w for p, w in self.worker_of.items() if p != placement}, (
            f"tenants of both placements landed on {node}: {self.worker_of}")
        return node


@contextmanager
def module_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 fill: Callable[[Any], Any]) -> Iterator[Any]:
    """A SessionDB filled once by ``fill`` for a module-scoped fixture whose param is the
    backend ("sqlite": a file; "postgresql": a database of its own), closed afterwards."""
    with ExitStack() as stack:
        if request.param == "sqlite":
            target: Any = tmp_path_factory.mktemp("store") / "state.db"
        else:
            target = stack.enter_context(server_database(request.getfixturevalue("pg_url"), prefix="hs_mod_"))
        yield fill(stack.enter_context(SessionDB(target)))


def interruptible() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT: the default disposition.

    A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored
    across exec; Python then installs no KeyboardInterrupt handler, and the ^C the test
    sends is lost (``.ci/run`` started in the background failed that way)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
