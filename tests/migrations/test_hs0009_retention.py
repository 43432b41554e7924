"""hs0009: the retention policies table, on SQLite and in a PostgreSQL tenant schema.

Upgrade makes it (empty: a store without a policy keeps everything), a policy is kept
across an upgrade of the rest, downgrade really drops it and leaves every other row, and
upgrading again gives an empty table. ``alembic check`` staying quiet is
``test_migrations.py::test_models_match_head_ddl``'s; the schema-only-adds rule is
``test_migrations.py::test_upgrade_gives_exact_hermes_schema``'s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import inspect, text

from hermes_store import SessionDB, UnitOfWork
from hermes_store import migrations
from hermes_store.repositories.retention import RetentionRepository
from hermes_store.keys import RETENTION_TABLE

pytestmark = pytest.mark.both_backends


def _tables(url: str, schema: str | None) -> set[str]:
    eng = sa_create_engine(url)
    try:
        return set(inspect(eng).get_table_names(schema=schema))
    finally:
        eng.dispose()


@pytest.fixture
def place(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """(URL, tenant schema): a SQLite file, or the tenant ``team_r`` of a fresh database."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}", None
    return str(request.getfixturevalue("pg_database")), "team_r"


def test_hs0009_adds_the_table_and_its_downgrade_drops_it(place: tuple[str, str | None]) -> None:
    url, schema = place
    migrations.upgrade(url, "hs0008", schema=schema)
    assert RETENTION_TABLE not in _tables(url, schema)
    migrations.upgrade(url, "hs0009", schema=schema)
    assert RETENTION_TABLE in _tables(url, schema)
    with SessionDB(url, schema=schema) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "kept across the downgrade")
        with UnitOfWork(db.engine) as uow:
            assert RetentionRepository(uow.conn).policies() == []
            RetentionRepository(uow.conn).set_policy("cli", delete_after_days=30)
    migrations.downgrade(url, "hs0008", schema=schema)
    assert RETENTION_TABLE not in _tables(url, schema)
    eng = sa_create_engine(url)
    try:
        with eng.connect() as conn:
            prefix = f"{schema}." if schema else ""
            assert conn.execute(text(f"SELECT count(*) FROM {prefix}messages")).scalar() == 1
    finally:
        eng.dispose()
    migrations.upgrade(url, "hs0009", schema=schema)
    with SessionDB(url, schema=schema) as db, UnitOfWork(db.engine) as uow:
        assert RetentionRepository(uow.conn).policies() == []  # the policies went with the table
