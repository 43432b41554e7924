"""``hermes-store copy`` into a server behind a transaction pooler (PgBouncer), and directly.

The destination lock is a transaction-level advisory lock on a connection whose
transaction stays open for the run: through the pooler that transaction keeps its server
connection, and when it ends nothing of ours stays on the connection.

Shown here, through the test PgBouncer and directly: a copy killed with SIGKILL mid-copy
(into the default schema and into a tenant) leaves the destination free within seconds
and resumes to the exact result; while one copy holds a destination a second one is
refused, and once it is done no advisory lock is left anywhere on the server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import make_url

from hermes_store import SessionDB
from hermes_store.copying import CopyInProgressError, copy_history
from hermes_store.copying.destination import destination_lock
from hermes_store.copying.endpoints import endpoint

from .test_copy import contents, fill, hits, kill_copy

ROUTES = [pytest.param("pooler", id="through-pgbouncer"), pytest.param("direct", id="direct")]
SCHEMAS = [pytest.param(None, id="default-schema"), pytest.param("team_a", id="tenant")]


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, pooled_database: tuple[str, str]) -> tuple[str, str]:
    """``(URL the copy writes to, direct URL for looking at the server)``."""
    direct, pooled = pooled_database
    return (pooled if request.param == "pooler" else direct), direct


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A SQLite history with everything a copy must keep: (file, its contents, its search hits)."""
    path = tmp_path / "src.db"
    with SessionDB(path) as db:
        fill(db)
        return path, contents(db), hits(db)


def in_schema(url: str, schema: str | None) -> str:
    if schema is None:
        return url
    return make_url(url).update_query_dict({"schema": schema}).render_as_string(hide_password=False)


def advisory_locks(direct: str) -> int:
    engine = sa_create_engine(direct)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND d.datname = :d"), {"d": make_url(direct).database}).scalar())
    finally:
        engine.dispose()


def free_within(dst: str, seconds: float) -> float:
    """How long until the destination lock can be taken (fails after ``seconds``)."""
    started = time.monotonic()
    while True:
        try:
            with destination_lock(endpoint(dst, "destination")):
                return time.monotonic() - started
        except CopyInProgressError:
            if time.monotonic() - started > seconds:
                raise
            time.sleep(0.1)


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("point", [pytest.param(("progress", "sessions", 3), id="mid-sessions"),
                                   pytest.param(("insert", None, 4), id="inside-a-message-insert")])
def test_a_copy_killed_mid_copy_resumes_exactly(route: tuple[str, str], schema: str | None, point: tuple[Any, ...],
                                                source: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    src, want, want_hits = source
    url, direct = route
    dst = in_schema(url, schema)
    kill_copy(src, dst, 2, point)
    assert free_within(dst, 10) < 10  # the killed copy's lock died with it
    report = copy_history(src, dst, batch=2)
    assert report.ok and report.mismatched_sessions == [] and report.mismatched_rows == {}
    assert report.resumed and not report.already_complete
    with SessionDB(dst) as db:
        assert contents(db) == want
        assert hits(db) == want_hits
    assert copy_history(src, dst, batch=2).already_complete
    assert advisory_locks(direct) == 0


@pytest.mark.parametrize("schema", SCHEMAS)
def test_a_held_destination_is_refused_and_nothing_is_left_afterwards(
        route: tuple[str, str], schema: str | None, source: tuple[Path, dict[str, Any], dict[str, Any]]) -> None:
    src, want, _hits = source
    url, direct = route
    dst = in_schema(url, schema)
    with destination_lock(endpoint(dst, "destination")):
        assert advisory_locks(direct) == 1
        with pytest.raises(CopyInProgressError, match="another hermes-store copy"):
            copy_history(src, dst)
    # Ended with the holder's transaction: not left on any (pooled) server connection.
    assert advisory_locks(direct) == 0
    assert copy_history(src, dst).ok
    assert advisory_locks(direct) == 0
    with SessionDB(dst) as db:
        assert contents(db) == want
