"""The command line where PostgreSQL differs from a file: a history moved between a
server and a SQLite file through export/import (both ways, exactly), adoption refused
on a server, and a server URL's password never shown.

Every other command runs on both backends in test_cli.py (its ``target`` fixture).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url

from hermes_store import migrations

from .test_cli import Target, file_target, one_line_error, server_target, snapshot


def hits(t: Target, query: str) -> list[tuple[str, int, str, bool]]:
    """What a search found, backend-neutral: each engine ranks and cuts snippets its own
    way, so hits come newest first and a snippet only has to mark the match."""
    return [(h["session_id"], h["id"], h["role"], ">>>" in h["snippet"])
            for h in t.ok("--json", "search", query, "--sort", "newest").json()["results"]]


def test_a_history_moves_from_a_server_to_a_file(pg_database: str, tmp_path: Path) -> None:
    server = server_target(pg_database)
    server.ok("demo")
    dump = tmp_path / "dump.jsonl"
    assert server.ok("--json", "export", "--out", dump).json()["sessions"] == 6
    local = file_target(tmp_path / "state.db")
    doc = local.ok("--json", "import", dump).json()
    assert (doc["imported"], doc["messages_read"]) == (6, 26)
    # Every column of every session and message, display_order included (hs0004 keeps
    # it on the server as Hermes' v30 triggers keep it in the file).
    assert snapshot(local) == snapshot(server)
    for query in ("kubernetes", "一致性", "rollout"):
        found = [hits(t, query) for t in (local, server)]
        assert found[0] == found[1] and found[0], query
    assert local.ok("--json", "stats").json() == server.ok("--json", "stats").json()


def test_a_history_moves_from_a_file_to_a_server(pg_database: str, tmp_path: Path) -> None:
    """What the adopt refusal below tells a user to do."""
    local = file_target(tmp_path / "state.db")
    local.ok("demo")
    dump = tmp_path / "dump.jsonl"
    local.ok("export", "--out", dump)
    server = server_target(pg_database)
    assert server.ok("--json", "import", dump).json()["imported"] == 6
    assert snapshot(server) == snapshot(local)
    ids = [d["id"] for d in local.ok("--json", "sessions", "--all").json()["sessions"]]
    assert [d["id"] for d in server.ok("--json", "sessions", "--all").json()["sessions"]] == ids
    assert server.ok("--json", "lineage", ids[-1]).json() == local.ok("--json", "lineage", ids[-1]).json()
    for query in ("kubernetes", "一致性", "rollout"):
        found = [hits(t, query) for t in (local, server)]
        assert found[0] == found[1] and found[0], query


def test_adopt_on_a_server_is_one_refusal(pg_database: str) -> None:
    """Adoption is for Hermes' files; on a server it is one clear refusal that writes nothing."""
    server = server_target(pg_database)
    for argv in (["adopt"], ["adopt", "--check"], ["--json", "adopt"]):
        line = one_line_error(server.run(*argv), 1)
        assert "state.db file" in line and "copy --from PATH --to URL" in line, line
    assert migrations.current(pg_database) is None


def test_a_server_password_is_never_shown(pg_database: str) -> None:
    """The test server trusts local logins, so a made-up password still connects."""
    url = make_url(pg_database).set(password="hunter2-secret").render_as_string(hide_password=False)
    server = server_target(url)
    outputs = [
        server.ok("--json", "upgrade").json()["db"],
        server.ok("upgrade").stdout,
        server.ok("--json", "current").json()["db"],
    ]
    with server.open() as db:
        db.create_session("mine", "cli")
    refused = one_line_error(server.run("demo"), 1)  # the refusal names the database
    assert "already holds 1 session(s)" in refused
    outputs.append(refused)
    assert all("hunter2" not in out for out in outputs), outputs
    assert all(":***@" in out for out in outputs), outputs
