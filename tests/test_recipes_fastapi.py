"""README's FastAPI app, run as written: the block is read from README.md, saved as
``app.py`` in a fresh folder and served by FastAPI's test client (httpx) in a process of
its own, so README and this test cannot drift.

What the README promises of it: the startup (``lifespan``) migrates our schema and creates
the host's ``tickets`` table; a POST to a session id nobody created yet succeeds (the
handler creates the session; ``create`` on a known id is an upsert that keeps it); the
host's row and ours commit together; the answer is the search hits. On SQLite, the URL as
written (``state.db`` in the working folder), and on PostgreSQL with asyncpg, the URL the
README's comment names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import text

from .aio_support import async_url_for

REPO = Path(__file__).resolve().parent.parent
#: The URL written in the block, and the one its comment offers instead.
SQLITE_URL = '"sqlite+aiosqlite:///state.db"'

DRIVE = r'''
import json
from fastapi.testclient import TestClient

import app as module

out = []
with TestClient(module.app) as client:          # runs the lifespan: upgrade, create_all
    for sid, words in [("s1", "kubernetes rollout is stuck"), ("s1", "kubernetes"),
                       ("s2", "数据库迁移已经完成")]:
        r = client.post(f"/chat/{sid}", params={"text": words})
        out.append({"status": r.status_code, "body": r.json()})
print(json.dumps(out))
'''


def readme_app() -> str:
    readme = (REPO / "README.md").read_text()
    m = re.search(r"<!-- host-example: fastapi/app\.py -->\s*```python\n(.*?)```", readme, re.S)
    assert m, "README.md has no FastAPI block (<!-- host-example: fastapi/app.py -->)"
    return m.group(1)


@pytest.mark.parametrize("driver", ["aiosqlite", "asyncpg"])
def test_the_readme_fastapi_app_runs(driver: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    body = readme_app()
    assert "lifespan=lifespan" in body and "@app.on_event" not in body
    assert SQLITE_URL in body and "postgresql+asyncpg://" in body
    if driver == "aiosqlite":
        sync_url = f"sqlite:///{tmp_path / 'state.db'}"
    else:
        sync_url = request.getfixturevalue("pg_database")
        body = body.replace(SQLITE_URL, repr(async_url_for(driver, pg_url=sync_url)))
    (tmp_path / "app.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_STORE_URL", "PYTEST_"))}
    env.update(PYTHONPATH=str(tmp_path), HERMES_HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-c", DRIVE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])

    assert [a["status"] for a in answers] == [200, 200, 200], answers
    first, second, cjk = (a["body"] for a in answers)
    assert [h["session_id"] for h in first] == ["s1"] and "kubernetes" in first[0]["snippet"].lower()
    assert sorted(h["session_id"] for h in second) == ["s1", "s1"]  # both of s1's messages
    assert [h["session_id"] for h in cjk] == ["s2"]

    engine = sa_create_engine(sync_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT session_ref FROM tickets ORDER BY id")).scalars().all() == ["s1", "s1", "s2"]
            rows = conn.execute(text("SELECT id, source, message_count FROM sessions ORDER BY id")).all()
            assert [tuple(r) for r in rows] == [("s1", "api", 2), ("s2", "api", 1)]
    finally:
        engine.dispose()
    from hermes_store import migrations

    assert migrations.current(sync_url) == migrations.head()
