"""Helpers shared by the test modules (fixtures and hooks live in conftest.py, which
imports what it needs from here; tests import these names from here, never from conftest)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine as sa_create_engine
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
