"""The command line on a PostgreSQL server (``--url postgresql+psycopg://…``), and a
history moved from a server to a SQLite file through export/import."""

from __future__ import annotations

import json
from pathlib import Path

from hermes_store import SessionDB, migrations

from .test_cli import run as run_main


def run(*args: str) -> tuple[int, str]:
    """Exit code and stdout, as the console script runs; its one stderr line when it failed."""
    res = run_main(*args)
    return res.code, res.stdout if res.code == 0 else res.stderr


def test_cli_commands_on_a_server(pg_database: str, tmp_path: Path) -> None:
    url = pg_database
    code, out = run("--url", url, "--json", "upgrade")
    assert code == 0, out
    assert json.loads(out)["revision"] == migrations.head()
    code, out = run("--url", url, "--json", "current")
    assert code == 0 and json.loads(out)["up_to_date"] is True
    assert run("--url", url, "demo")[0] == 0
    code, out = run("--url", url, "--json", "sessions", "--all")
    listed = json.loads(out)["sessions"]
    assert code == 0 and len(listed) == 6
    code, out = run("--url", url, "--json", "search", "kubernetes")
    assert code == 0 and json.loads(out)["count"] == 1
    code, out = run("--url", url, "--json", "search", "一致性")
    assert code == 0 and json.loads(out)["count"] >= 1
    some_id = listed[0]["id"]
    assert run("--url", url, "show", some_id)[0] == 0
    assert run("--url", url, "lineage", some_id)[0] == 0
    assert run("--url", url, "stats")[0] == 0
    assert run("--url", url, "fts", "check")[0] == 0
    # A history moves from the server to a file through export/import, whole.
    dump = tmp_path / "dump.jsonl"
    assert run("--url", url, "export", "--out", str(dump))[0] == 0
    target = tmp_path / "state.db"
    code, out = run("--db", str(target), "import", str(dump))
    assert code == 0, out
    with SessionDB(url) as server, SessionDB(target) as local:
        assert local.session_count() == server.session_count()
        assert local.message_count() == server.message_count()
        assert [h["id"] for h in local.search_messages("kubernetes")] == [h["id"] for h in server.search_messages("kubernetes")]
    # Adoption is for Hermes' files; on a server it is one clear refusal.
    code, out = run("--url", url, "adopt")
    assert code == 1 and "state.db file" in out and "Traceback" not in out


def test_other_servers_are_a_bad_argument() -> None:
    code, out = run("--url", "mysql+pymysql://u:p@h/db", "sessions")
    assert code == 2 and "postgresql://" in out
