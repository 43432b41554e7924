"""Importing and using the SQLite store loads no PostgreSQL or asyncio module (issue 31,
point 5): the dialect registry imports a dialect's module on first use, and the async
type checks look SQLAlchemy's asyncio layer up instead of importing it. Each case runs in
a fresh interpreter, whose ``sys.modules`` is what it reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from hermes_store import dialects

#: What a SQLite store must never load: our PostgreSQL and async modules, the PostgreSQL
#: and asyncio drivers, and SQLAlchemy's asyncio layer.
FORBIDDEN = re.compile(
    r"^(hermes_store\.(aio|dialects\.(postgresql|pg_\w+)|search\.postgresql)"
    r"|psycopg\w*|asyncpg|aiosqlite|sqlalchemy\.ext\.asyncio)(\.|$)"
)

#: Still loaded on the SQLite path by an eager import in a module this change does not own,
#: with the edit that ends it (reported on issue 31). Remove an entry when its import goes:
#: the test then keeps it away for good.
PENDING = {
    # migrations.py: ``from .dialects import pg_tenants`` for two PostgreSQL-only reads
    "hermes_store.dialects.pg_tenants",
}

STORE = """
import json, sys
from hermes_store import SessionDB

with SessionDB(sys.argv[1]) as db:
    db.create_session("s1", "cli")
    db.append_message("s1", "user", "hello weightless world")
    hits = db.search_messages("weightless")
print(json.dumps({"hits": len(hits), "modules": sorted(sys.modules)}))
"""


def _run(source: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HERMES_STORE_URL"}
    done = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _forbidden(modules: list[str]) -> list[str]:
    return [m for m in modules if FORBIDDEN.match(m)]


def test_a_sqlite_store_loads_no_postgresql_or_async_module(tmp_path: Path) -> None:
    seen = _run(STORE, str(tmp_path / "state.db"))
    assert seen["hits"] == 1  # the store really opened, wrote and searched
    assert "hermes_store.dialects.sqlite" in seen["modules"]
    assert sorted(set(_forbidden(seen["modules"])) - PENDING) == []


def test_a_postgresql_store_still_loads_what_it_needs(pg_database: str) -> None:
    """The same program on a server: the modules refused above are loaded on demand."""
    seen = _run(STORE, pg_database)
    assert seen["hits"] == 1
    loaded = set(_forbidden(seen["modules"]))
    assert {"hermes_store.dialects.postgresql", "psycopg"} <= loaded, sorted(loaded)
    assert "hermes_store.aio" not in loaded and "sqlalchemy.ext.asyncio" not in loaded


def test_the_async_api_loads_the_asyncio_layer() -> None:
    seen = _run("import json, sys\nimport hermes_store.aio\nprint(json.dumps({'modules': sorted(sys.modules)}))")
    assert {"hermes_store.aio", "sqlalchemy.ext.asyncio"} <= set(_forbidden(seen["modules"]))


def test_the_registry_imports_each_module_on_demand() -> None:
    """Every name in the table resolves to a module whose DIALECT bears that name; a
    driver with its own module (asyncpg) gets it, other drivers the database's."""
    for name, module in dialects._MODULES.items():
        assert dialects.for_dialect(name).name == name
        assert dialects.for_dialect(name) is sys.modules[module].DIALECT
    for (name, driver), module in dialects._DRIVER_MODULES.items():
        found = dialects.for_url(make_url(f"{name}+{driver}://u@h/d"))
        assert found is sys.modules[module].DIALECT and found.name == name
    assert dialects.for_url(make_url("postgresql+psycopg://u@h/d")) is dialects.for_dialect("postgresql")
    assert set(dialects.loaded_dialects()) == set(dialects.all_dialects())  # all loaded by now
    assert dialects.find("oracle") is None


def test_loaded_dialects_names_only_what_was_imported() -> None:
    seen = _run(
        "import json, sys\nfrom hermes_store import dialects\nfrom sqlalchemy.engine import make_url\n"
        "before = [d.name for d in dialects.loaded_dialects()]\n"
        "dialects.for_url(make_url('sqlite:///x.db'))\n"
        "after = [d.name for d in dialects.loaded_dialects()]\n"
        "print(json.dumps({'before': before, 'after': after, 'modules': sorted(sys.modules)}))"
    )
    assert "sqlite" in seen["after"] and "postgresql" not in seen["after"]
    assert seen["before"] == [] and sorted(set(_forbidden(seen["modules"])) - PENDING) == []


@pytest.mark.parametrize("name", ["hermes_store.dialects.pg_asyncpg", "psycopg.pq", "asyncpg", "aiosqlite",
                                  "sqlalchemy.ext.asyncio.engine", "hermes_store.aio.sessiondb",
                                  "hermes_store.search.postgresql"])
def test_the_check_sees_what_it_refuses(name: str) -> None:
    assert _forbidden([name, "hermes_store.dialects.sqlite", "sqlalchemy.dialects.sqlite", "asyncio"]) == [name]
