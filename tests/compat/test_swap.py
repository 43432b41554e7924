"""The one-line swap: Hermes-style code importing ``hermes_state`` runs on hermes_store.

A fresh interpreter gets ``tests/data/hermes_app`` on its path, which holds only the
one-line ``hermes_state.py`` and a caller written the way Hermes' application is
(``_conn`` with ``?`` SQL and Row access, ``_execute_write``, ``AsyncSessionDB``
unwrapping, ``type(x) is SessionDB``). The caller never imports hermes_store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "data" / "hermes_app"

SCRIPT = r"""
import json, sys, time
import hermes_state
import hermes_store.facade
assert hermes_state is hermes_store.facade, "the swap must hand out our module object"

import insights_like as app
from hermes_state import SessionDB

db = SessionDB()           # resolved from HERMES_HOME, as Hermes does
now = time.time()
db.create_session("s1", "cli", model="gpt-x")
db.append_message("s1", "user", "hi")
db.append_message("s1", "tool", "ok", tool_name="terminal")
db.append_message("s1", "tool", "ok", tool_name="terminal")
db.append_message("s1", "tool", "ok", tool_name="read_file")
db.update_token_counts("s1", input_tokens=10, output_tokens=5, model="gpt-x", billing_provider="p")
db.end_session("s1", "user_exit")

out = {}
engine = app.InsightsEngine(db)
out["tools"] = engine.tool_usage(now - 60)
out["models"] = engine.model_usage()
out["daily"] = sum(engine.daily().values())
app.reopen_like_the_cli(db, "s1")
out["reopened"] = db.get_session("s1")["ended_at"] is None
out["created"] = app.create_with_title_like_the_api_server(db, "s2", "  My   title ")[0]
out["clash"] = app.create_with_title_like_the_api_server(db, "s3", "My title")
out["s3_gone"] = db.get_session("s3") is None
out["title"] = db.get_session_title("s2")
out["gateway"] = app.gateway_roundtrip(db, "s1")
out["db_path"] = str(db.db_path)
db.close()
print(json.dumps(out))
"""


def test_hermes_style_caller_runs_through_the_one_line_swap(tmp_path: Path) -> None:
    home = tmp_path / "hermes-home"
    env = {**os.environ, "HERMES_HOME": str(home), "PYTHONPATH": os.pathsep.join(
        [str(APP), os.environ.get("PYTHONPATH", ""), str(Path(__file__).resolve().parents[2])]
    )}
    env.pop("HERMES_STORE_URL", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tools"] == [{"tool_name": "terminal", "count": 2}, {"tool_name": "read_file", "count": 1}]
    assert out["models"] == [["gpt-x", 10]]
    assert out["daily"] == 1
    assert out["reopened"] is True
    assert out["created"] == "created"
    assert out["clash"] == ["conflict", "s2"] and out["s3_gone"] is True
    assert out["title"] == "My title"
    assert out["gateway"] == [True, 5]
    assert out["db_path"] == str(home / "state.db")


def test_the_swap_file_is_one_line() -> None:
    lines = [ln for ln in (APP / "hermes_state.py").read_text().splitlines() if ln.strip()]
    assert len(lines) == 1


def test_install_makes_import_hermes_state_return_our_module(hermes_state) -> None:
    import hermes_store.facade as facade

    assert sys.modules["hermes_state"] is facade and hermes_state is facade
    assert hermes_state.SessionDB is facade.SessionDB


@pytest.mark.parametrize("name", ["SessionDB", "AsyncSessionDB", "format_session_db_unavailable"])
def test_names_are_the_same_objects_not_copies(hermes_state, name: str) -> None:
    import hermes_store

    assert getattr(hermes_state, name) is getattr(sys.modules["hermes_store.facade"], name)
    if hasattr(hermes_store, name):
        assert getattr(hermes_store, name) is getattr(hermes_state, name)
