"""The mechanism that runs the tenant, search-parity, lineage, copy/import and migration
families on the Citus test cluster (``pytest.mark.on_citus``, conftest ``citus_schemas``):
its tenants are distributed schemas, alternate ones land on the two workers, and its
check refuses a tenant that is not distributed."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import create_engine as sa_create_engine

from hermes_store import migrations

from .helpers import TenantPlacements, in_schema


def test_consecutive_family_tenants_land_on_both_workers(citus_url: str, citus_schemas: Callable[[], str]) -> None:
    first, second = citus_schemas(), citus_schemas()
    for schema in (first, second):
        migrations.upgrade(in_schema(citus_url, schema))
    placed = TenantPlacements()
    nodes = {placed.check(citus_url, schema, n) for n, schema in enumerate((first, second))}
    assert len(nodes) == 2 and None not in nodes, nodes


def test_the_check_refuses_a_schema_that_is_not_distributed(citus_url: str) -> None:
    schema = f"p_{uuid.uuid4().hex[:12]}"
    admin = sa_create_engine(citus_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:  # schema-based sharding off: a plain schema of the coordinator
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        migrations.upgrade(in_schema(citus_url, schema))
        with pytest.raises(AssertionError, match="not a distributed schema"):
            TenantPlacements().check(citus_url, schema, 0)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()
