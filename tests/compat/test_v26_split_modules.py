"""Hermes v26's companion modules (reference §0): importable by their bare names after the
swap, and from a fresh interpreter that puts ``dirname(hermes_state.__file__)`` first on
``sys.path`` (Hermes' child-process tests), without hiding any standard module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sqlite_only

COMPANIONS = ("hermes_state_common", "hermes_state_schema", "hermes_state_search", "hermes_state_portability",
              "hermes_state_provider")
ROOT = Path(__file__).resolve().parents[2]


def test_companions_import_after_the_swap(hermes_state) -> None:
    import hermes_state_common
    import hermes_state_portability
    import hermes_state_schema
    import hermes_state_search

    import hermes_store.hermes_state_search as by_package

    assert hermes_state_search is by_package  # one module object under both names
    assert hermes_state_search.SessionSearchMixin in hermes_state.SessionDB.__mro__
    assert hermes_state_schema.SessionSchemaMixin in hermes_state.SessionDB.__mro__
    assert hermes_state_portability.SessionPortabilityMixin in hermes_state.SessionDB.__mro__
    assert callable(hermes_state_schema.schema_read_probe_statements)
    assert hermes_state_common.escape_like("50%_off\\") == "50\\%\\_off\\\\"
    assert hermes_state_common.FTS_STALE_KEY == "fts_stale" == hermes_state.FTS_STALE_KEY
    assert hermes_state_common.SCHEMA_VERSION == hermes_state.SCHEMA_VERSION
    assert hermes_state_common.SCHEMA_SQL == hermes_state.SCHEMA_SQL and "CREATE TABLE" in hermes_state.SCHEMA_SQL
    assert "parent_session_id" in hermes_state_common._ephemeral_child_sql("s")
    for name in hermes_state_common.__all__:  # hermes_state re-exports the common names
        assert getattr(hermes_state, name) is getattr(hermes_state_common, name)


_CHILD = r"""
import importlib, json, os, sys
folder = sys.argv[1]
sys.path.insert(0, folder)
order = sys.argv[2].split(",")
mods = {name: importlib.import_module(name) for name in order}
import copy, json as json_mod, logging, types, typing, dataclasses, tempfile
hs = sys.modules["hermes_state"]
report = {
    "stdlib": {m.__name__: m.__file__ for m in (copy, json_mod, logging, types, typing, dataclasses, tempfile)},
    "mixins": [mods["hermes_state_search"].SessionSearchMixin in hs.SessionDB.__mro__,
               mods["hermes_state_schema"].SessionSchemaMixin in hs.SessionDB.__mro__,
               mods["hermes_state_portability"].SessionPortabilityMixin in hs.SessionDB.__mro__,
               issubclass(hs.SessionDB, mods["hermes_state_provider"].SessionDBProvider)],
    "same": mods["hermes_state_common"].FTS_STALE_KEY == hs.FTS_STALE_KEY,
    "file": hs.__file__,
}
db = hs.SessionDB(os.path.join(sys.argv[3], "state.db"))
db.create_session("c1", "cli")
report["found"] = db.get_session("c1")["id"]
db.close()
print(json.dumps(report))
"""


@pytest.mark.parametrize("order", [
    ["hermes_state", *COMPANIONS],
    [*reversed(COMPANIONS), "hermes_state"],
])
def test_a_child_process_with_the_package_folder_first(hermes_state, tmp_path: Path, order: list[str]) -> None:
    folder = os.path.dirname(hermes_state.__file__)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", _CHILD, folder, ",".join(order), str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["mixins"] == [True, True, True, True] and report["same"] is True
    assert report["found"] == "c1"
    for name, path in report["stdlib"].items():
        assert not os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep), (name, path)
    assert os.path.dirname(report["file"]) == folder


def test_the_package_folder_hides_no_standard_module(hermes_state) -> None:
    folder = Path(hermes_state.__file__).parent
    ours = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    assert not ours & set(sys.stdlib_module_names)
