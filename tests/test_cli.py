"""The ``hermes-store`` command line: every subcommand, its --json output, and its errors.

Runs go through :func:`hermes_store.cli.main` inside click's CliRunner isolation, so
the exit codes and one-line error messages tested are exactly what a shell sees; one
test runs the installed console script in a subprocess.

Every command that works on a server runs on both backends through one fixture,
``target``: ``--db PATH`` (a SQLite file) or ``--url postgresql+psycopg://...`` (a fresh
database on the test server). Adoption and the file-only behaviour (paths, file modes,
``$HERMES_HOME``) stay SQLite-only; moving a history between the two is in
test_cli_postgresql.py.
"""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner
from rich.cells import cell_len
from rich.console import Console

from hermes_store import SessionDB, cli, migrations
from hermes_store.cli import main

pytestmark = pytest.mark.both_backends

HERMES_V11 = Path(__file__).parent / "data" / "hermes-dbs" / "hermes_v11.db"
#: The full-text indexes each backend searches: FTS5 tables, or GIN indexes on ``messages``.
SEARCH_INDEXES = {
    "sqlite": {"messages_fts", "messages_fts_trigram"},
    "postgresql": {"idx_messages_search_vector", "idx_messages_trgm"},
}


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run(*args: str, input: str | bytes | None = None, env: dict[str, str] | None = None) -> Run:
    """Call main() as the console script does, with stdout/stderr captured separately."""
    with CliRunner().isolation(input=input, env=env) as (out, err, _):
        code = main([str(a) for a in args])
        sys.stdout.flush()
        sys.stderr.flush()
    return Run(code, out.getvalue().decode("utf-8"), err.getvalue().decode("utf-8"))


def ok(*args: str, **kw: Any) -> Run:
    result = run(*args, **kw)
    assert result.code == 0, (result.code, result.stderr)
    return result


def one_line_error(result: Run, code: int) -> str:
    assert result.code == code, (result.code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@dataclass
class Target:
    """Where a run points: ``--db PATH`` or ``--url URL``, and the same place for SessionDB."""

    backend: str
    args: tuple[str, ...]
    location: Path | str  # what SessionDB and migrations take

    def run(self, *args: Any, **kw: Any) -> Run:
        return run(*self.args, *args, **kw)

    def ok(self, *args: Any, **kw: Any) -> Run:
        return ok(*self.args, *args, **kw)

    def open(self) -> SessionDB:
        return SessionDB(self.location)


def file_target(path: Path) -> Target:
    return Target("sqlite", ("--db", str(path)), path)


def server_target(url: str) -> Target:
    return Target("postgresql", ("--url", url), url)


def empty_target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Target:
    """A database that does not hold anything yet: a file path (not created) or a fresh server database."""
    if backend == "postgresql":
        return server_target(request.getfixturevalue("pg_database"))
    return file_target(tmp_path / "state.db")


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Target:
    return empty_target(backend, tmp_path, request)


@pytest.fixture
def new_target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[str], Target]]:
    """More empty databases of the test's backend (an import needs somewhere else to go).

    On the server each is a database of its own, dropped afterwards, as ``pg_database``.
    """
    created: list[str] = []
    admin = None
    if backend == "postgresql":
        from sqlalchemy import create_engine as sa_create_engine

        admin = sa_create_engine(request.getfixturevalue("pg_url"), isolation_level="AUTOCOMMIT")

    def make(name: str) -> Target:
        if admin is None:
            return file_target(tmp_path / f"{name}.db")
        db_name = f"hs_test_{uuid.uuid4().hex[:16]}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{db_name}"')
        created.append(db_name)
        return server_target(admin.url.set(database=db_name).render_as_string(hide_password=False))

    yield make
    if admin is not None:
        with admin.connect() as conn:
            for db_name in created:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def demo(target: Target) -> Target:
    target.ok("demo")
    return target


def ids_by_suffix(t: Target) -> dict[str, str]:
    """Demo session ids carry a date prefix; their hex tails are fixed."""
    docs = t.ok("--json", "sessions", "--all").json()["sessions"]
    return {d["id"].rsplit("_", 1)[1]: d["id"] for d in docs}


# ------------------------------------------------------------------ demo, upgrade, current


def test_demo_writes_sessions_once(target: Target) -> None:
    doc = target.ok("--json", "demo").json()
    assert doc["sessions"] == 6 and doc["messages"] == 26 and len(doc["session_ids"]) == 6 and doc["created"]
    again = target.ok("--json", "demo").json()  # the README command run twice: a no-op
    assert again["created"] is False and again["sessions"] == 6 and again["messages"] == 26
    assert sorted(again["session_ids"]) == sorted(doc["session_ids"])
    assert "already in" in target.ok("demo").stdout


def test_demo_refuses_a_database_holding_other_sessions(target: Target) -> None:
    with target.open() as db:
        db.create_session("mine", "cli")
    refused = target.run("demo")
    assert "already holds 1 session(s)" in one_line_error(refused, 1)
    with target.open() as db:
        assert db.session_count() == 1 and db.get_session("mine") is not None


def test_upgrade_creates_the_schema_at_head_and_lists_tables(target: Target) -> None:
    doc = target.ok("--json", "upgrade").json()
    assert doc["created"] is True and doc["previous"] is None
    assert doc["revision"] == doc["head"] == migrations.head()
    assert {"sessions", "messages", "session_model_usage", "hermes_store_version"} <= set(doc["tables"])
    assert doc["tables"]["sessions"] == 0 and set(doc["fts_indexes"]) == SEARCH_INDEXES[target.backend]
    assert migrations.current(target.location) == doc["head"]
    target.ok("demo")
    again = target.ok("--json", "upgrade").json()
    assert again["created"] is False and again["previous"] == again["revision"] == doc["head"]
    assert (again["tables"]["sessions"], again["tables"]["messages"]) == (6, 26)
    human = target.ok("upgrade").stdout
    assert f"already at revision {doc['head']}" in human and "sessions" in human and "26" in human


def test_upgrade_creates_a_private_file(tmp_path: Path) -> None:
    """A file of its own (SQLite only): readable by its owner alone."""
    path = tmp_path / "new.db"
    assert ok("--db", path, "--json", "upgrade").json()["created"] is True
    assert path.stat().st_mode & 0o077 == 0
    assert f"Created {tmp_path / 'other.db'} at revision" in ok("--db", tmp_path / "other.db", "upgrade").stdout


def test_upgrade_to_a_revision_then_head_and_current(target: Target) -> None:
    head = migrations.head()
    assert target.ok("--json", "upgrade", "--revision", "0005").json()["revision"] == "0005"
    cur = target.ok("--json", "current").json()
    assert cur["revision"] == "0005" and cur["up_to_date"] is False and cur["needs_adoption"] is False
    assert target.ok("current").stdout.strip() == f"0005 (head is {head}; run 'hermes-store upgrade')"
    step = target.ok("--json", "upgrade", "--revision", "0007").json()
    assert (step["previous"], step["revision"], step["created"]) == ("0005", "0007", False)
    assert f"0007 → {head}" in target.ok("upgrade").stdout
    assert target.ok("current").stdout.strip() == f"{head} (head)"
    assert target.ok("--json", "current").json()["up_to_date"] is True
    # Going back is not an upgrade; an unknown revision is a bad argument. Neither changes anything.
    assert "cannot go back" in one_line_error(target.run("upgrade", "--revision", "0003"), 1)
    assert "unknown revision" in one_line_error(target.run("upgrade", "--revision", "9999"), 2)
    assert migrations.current(target.location) == head


def test_current_on_a_database_without_our_tables(target: Target) -> None:
    """An empty database (a 0-byte file, a new server database) has no revision yet:
    ``current`` says how to create one and exits 1, like every read-only command; with
    --json the report still goes to stdout and the error to stderr."""
    if target.backend == "sqlite":
        Path(target.location).touch()
    as_json = target.run("--json", "current")
    doc = as_json.json()
    assert as_json.code == 1 and json.loads(as_json.stderr)["code"] == "no_store"
    assert doc["revision"] is None and doc["up_to_date"] is False and doc["head"] == migrations.head()
    line = one_line_error(target.run("current"), 1)
    assert "no hermes_store revision yet" in line and "upgrade'" in line
    assert migrations.current(target.location) is None  # asking changed nothing
    target.ok("upgrade")
    assert target.ok("current").stdout.strip() == f"{migrations.head()} (head)"


def test_default_path_comes_from_hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    doc = ok("--json", "upgrade").json()
    assert doc["db"] == str(tmp_path / "home" / "state.db")
    assert (tmp_path / "home" / "state.db").is_file()
    assert ok("--json", "sessions").json()["sessions"] == []


def test_url_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "u.db"
    ok("--url", f"sqlite:///{path}", "upgrade")
    assert ok("--db", path, "--json", "current").json()["up_to_date"] is True
    assert "only sqlite" in one_line_error(run("--url", "mysql://h/db", "current"), 2)
    # A server that is not there: one line, exit 1 (a refusal, not a bad argument).
    for command in ("current", "upgrade", "sessions"):
        line = one_line_error(run("--url", "postgresql+psycopg://u:secret@127.0.0.1:1/db", command), 1)
        assert "Connection refused" in line and "secret" not in line, line
    assert "either --db or --url" in one_line_error(run("--db", path, "--url", f"sqlite:///{path}", "current"), 2)
    assert "database file" in one_line_error(run("--url", "sqlite://", "current"), 2)


# ------------------------------------------------------------------ sessions, show, lineage


def test_sessions_lists_chains_once_and_filters(demo: Target) -> None:
    ids = ids_by_suffix(demo)
    docs = demo.ok("--json", "sessions").json()["sessions"]
    listed = [d["id"] for d in docs]
    # The compression chain shows as its tip (marked with the root); the delegate is hidden.
    assert ids["a41c9f"] in listed and ids["a41c9e"] not in listed and ids["b7d210"] not in listed
    tip = next(d for d in docs if d["id"] == ids["a41c9f"])
    assert tip["lineage_root_id"] == ids["a41c9e"] and tip["title"] == "Debugging a CrashLoopBackOff #2"
    assert listed[0] == ids["d90a44"]  # newest first
    cjk = next(d for d in docs if d["id"] == ids["c3e5f1"])
    assert cjk["preview"].startswith("帮我总结一下") and cjk["message_count"] == 6 and cjk["source"] == "telegram"

    assert len(demo.ok("--json", "sessions", "--all").json()["sessions"]) == 6
    only = demo.ok("--json", "sessions", "--source", "telegram").json()["sessions"]
    assert [d["id"] for d in only] == [ids["c3e5f1"]]
    both = demo.ok("--json", "sessions", "--source", "telegram", "--source", "cron").json()["sessions"]
    assert {d["source"] for d in both} == {"telegram", "cron"}
    rest = demo.ok("--json", "sessions", "--exclude-source", "cli", "--exclude-source", "cron").json()
    assert [d["source"] for d in rest["sessions"]] == ["telegram"]
    page = demo.ok("--json", "sessions", "--limit", "1", "--offset", "1").json()
    assert page["count"] == 1 and page["sessions"][0]["id"] == listed[1]
    by_activity = demo.ok("--json", "sessions", "--by-activity").json()["sessions"]
    assert by_activity[0]["id"] == ids["d90a44"]


def test_sessions_hides_archived_ones_unless_asked(demo: Target) -> None:
    ids = ids_by_suffix(demo)
    cjk = ids["c3e5f1"]
    with demo.open() as db:
        assert db.set_session_archived(cjk, True)
    listed = [d["id"] for d in demo.ok("--json", "sessions").json()["sessions"]]
    assert cjk not in listed and listed
    docs = demo.ok("--json", "sessions", "--archived").json()["sessions"]
    assert [d["id"] for d in docs if d["archived"]] == [cjk] and len(docs) == len(listed) + 1
    only = demo.ok("--json", "sessions", "--only-archived").json()["sessions"]
    assert [d["id"] for d in only] == [cjk]
    human = demo.ok("sessions", "--only-archived").stdout
    assert "⌂" in human and "archived" in human
    # The two are one choice: the last one given wins, as with any click flag pair.
    assert [d["id"] for d in demo.ok("--json", "sessions", "--archived", "--only-archived").json()["sessions"]] == [cjk]


def test_sessions_table_fits_80_columns(demo: Target) -> None:
    out = demo.ok("sessions", "--all").stdout
    assert "Debugging a" in out and "分布式系统" in out
    assert all(cell_len(line) <= 80 for line in out.splitlines()), out


def test_show_accepts_a_prefix_and_prints_messages(demo: Target) -> None:
    ids = ids_by_suffix(demo)
    root = ids["a41c9e"]
    doc = demo.ok("--json", "show", root[:-2]).json()
    assert doc["session"]["id"] == root and doc["session"]["title"] == "Debugging a CrashLoopBackOff"
    assert doc["session"]["end_reason"] == "compression" and doc["session"]["input_tokens"] == 48_210
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "tool", "assistant", "user", "assistant", "tool"]
    assert doc["messages"][1]["tool_calls"][0]["function"]["name"] == "terminal"
    assert doc["lineage"] == [root, ids["a41c9f"]]
    human = demo.ok("show", root).stdout
    assert "CrashLoopBackOff" in human and "→ terminal(" in human and "ECONNREFUSED" in human
    assert "(compression)" in human


def test_show_options_cut_or_skip_messages(target: Target) -> None:
    with target.open() as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "word " * 400)
    assert "more characters; --full" in target.ok("show", "s1").stdout
    assert "more characters" not in target.ok("show", "s1", "--full").stdout
    assert target.ok("--json", "show", "s1", "--no-messages").json()["messages"] == []
    assert "word" not in target.ok("show", "s1", "--no-messages").stdout


def test_show_prints_content_literally(target: Target) -> None:
    with target.open() as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "[bold red]not markup[/bold red] and [link=x]y[/link]")
    out = target.ok("show", "s1").stdout
    assert "[bold red]not markup[/bold red] and [link=x]y[/link]" in out


def test_show_unknown_or_ambiguous_session_exits_1(demo: Target) -> None:
    assert one_line_error(demo.run("show", "nope"), 1) == "hermes-store: no session matches 'nope'"
    ids = ids_by_suffix(demo)
    common = ids["a41c9e"][:2]  # every demo id starts with the century (a shared date breaks near midnight)
    assert "ambiguous" in one_line_error(demo.run("show", common), 1)
    assert "no session" in one_line_error(demo.run("lineage", "nope"), 1)


def test_lineage_shows_chain_and_descendants(demo: Target) -> None:
    ids = ids_by_suffix(demo)
    doc = demo.ok("--json", "lineage", ids["a41c9e"]).json()
    assert doc["root"] == ids["a41c9e"] and doc["tip"] == ids["a41c9f"]
    assert [(c["id"], c["end_reason"]) for c in doc["chain"]] == [(ids["a41c9e"], "compression"), (ids["a41c9f"], "user_exit")]
    assert [(d["id"], d["relation"], d["parent_session_id"]) for d in doc["descendants"]] == [
        (ids["b7d210"], "delegate", ids["a41c9f"])
    ]
    # From the tip, the chain is the same; from the delegate, it is its own chain.
    assert demo.ok("--json", "lineage", ids["a41c9f"]).json()["root"] == ids["a41c9e"]
    human = demo.ok("lineage", ids["a41c9e"]).stdout
    assert "compression" in human and "delegate" in human and "▶" in human
    assert all(cell_len(line) <= 80 for line in human.splitlines())


# ------------------------------------------------------------------ search and stats


def test_search_finds_words_cjk_and_tool_arguments(demo: Target) -> None:
    ids = ids_by_suffix(demo)
    doc = demo.ok("--json", "search", "kubernetes").json()
    assert doc["count"] == 1
    hit = doc["results"][0]
    assert hit["session_id"] == ids["a41c9e"] and hit["role"] == "user" and ">>>Kubernetes<<<" in hit["snippet"]
    assert hit["source"] == "cli" and len(hit["context"]) == 2

    cjk = demo.ok("--json", "search", "一致性").json()["results"]
    assert {h["session_id"] for h in cjk} == {ids["c3e5f1"]} and len(cjk) == 2
    assert any(">>>一致性<<<" in h["snippet"] for h in cjk)

    args = demo.ok("--json", "search", "rollout").json()["results"]
    assert [h["role"] for h in args] == ["assistant"]  # only in a tool call's arguments

    roles = demo.ok("--json", "search", "pod", "--role", "assistant").json()["results"]
    assert roles and {h["role"] for h in roles} == {"assistant"}
    tools = demo.ok("--json", "search", "pod", "--role", "user", "--role", "tool").json()["results"]
    assert tools and {h["role"] for h in tools} <= {"user", "tool"}
    assert demo.ok("--json", "search", "pod", "--exclude-source", "cli").json()["results"] == []
    assert demo.ok("--json", "search", "Raft", "--source", "telegram").json()["count"] >= 1
    newest = [h["timestamp"] for h in demo.ok("--json", "search", "pod", "--sort", "newest").json()["results"]]
    oldest = [h["timestamp"] for h in demo.ok("--json", "search", "pod", "--sort", "oldest").json()["results"]]
    assert newest == sorted(newest, reverse=True) and oldest == sorted(oldest) and len(newest) >= 3
    paged = demo.ok("--json", "search", "pod", "--sort", "oldest", "--limit", "1", "--offset", "1").json()
    assert [h["timestamp"] for h in paged["results"]] == oldest[1:2]


def test_search_human_output_keeps_markers_without_colour(demo: Target) -> None:
    out = demo.ok("search", "kubernetes", "-C").stdout
    assert ">>>Kubernetes<<<" in out and "· user ·" in out and "1 result(s)" in out
    assert "No messages match" in demo.ok("search", "zzzqqq").stdout
    # Hostile queries are not errors.
    for query in ['"unbalanced', "AND", "*", "(((", "a:b", "🙂"]:
        assert demo.run("--json", "search", query).code == 0, query


def test_highlight_snippet_styles_matches() -> None:
    text = cli.highlight_snippet("say >>>hello<<< world", styled=True)
    assert text.plain == "say hello world" and text.spans[0].style == "bold reverse"
    assert cli.highlight_snippet("say >>>hello<<<", styled=False).plain == "say >>>hello<<<"


def test_stats_by_model_task_and_route(demo: Target) -> None:
    doc = demo.ok("--json", "stats").json()
    by_model = {r["model"]: r for r in doc["rows"]}
    assert by_model["anthropic/claude-sonnet-4"]["input_tokens"] == 48_210 + 9_870 + 820
    assert by_model["anthropic/claude-sonnet-4"]["sessions"] == 3
    assert by_model["google/gemini-2.5-flash"]["input_tokens"] == 1_210 + 52_880  # side tasks
    totals = doc["totals"]
    assert totals["sessions"] == 6 and totals["messages"] == 26
    assert totals["input_tokens"] == sum(r["input_tokens"] for r in doc["rows"])
    assert totals["estimated_cost_usd"] == pytest.approx(sum(r["estimated_cost_usd"] for r in doc["rows"]))

    tasks = {r["task"]: r for r in demo.ok("--json", "stats", "--by", "task").json()["rows"]}
    assert set(tasks) == {"", "title_generation", "compression"}
    assert tasks["title_generation"]["input_tokens"] == 1_210 and tasks["compression"]["output_tokens"] == 1_650

    routes = demo.ok("--json", "stats", "--by", "route").json()["rows"]
    providers = {r["billing_provider"]: r for r in routes}
    assert set(providers) == {"openrouter", "openai", ""}
    assert providers["openrouter"]["billing_mode"] == "chat_completions"

    telegram = demo.ok("--json", "stats", "--source", "telegram").json()
    assert [r["model"] for r in telegram["rows"]] == ["openai/gpt-4.1"] and telegram["totals"]["messages"] == 6

    human = demo.ok("stats").stdout
    assert "anthropic/claude-sonnet-4" in human and "Total" in human
    assert all(cell_len(line) <= 80 for line in human.splitlines()), human
    assert "title_generation" in demo.ok("stats", "--by", "task").stdout


# ------------------------------------------------------------------ export and import


def snapshot(t: Target) -> dict[str, Any]:
    """Sessions (all columns), messages and lineage as plain data, for comparing databases."""
    with t.open() as db:
        return {record["id"]: record for record in db.iter_export()}


def test_export_import_round_trip_is_exact_and_idempotent(demo: Target, new_target, tmp_path: Path) -> None:
    out = tmp_path / "export.jsonl"
    doc = demo.ok("--json", "export", "--out", out).json()
    assert doc == {"out": str(out), "sessions": 6, "messages": 26, "source": None}
    assert out.stat().st_mode & 0o077 == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6 and all(json.loads(line)["messages"] for line in lines)
    assert "帮我总结一下" in out.read_text(encoding="utf-8")  # UTF-8, not \\u escapes

    # stdout gets the same stream
    assert demo.ok("export").stdout.splitlines() == lines

    copy = new_target("copy")
    first = copy.ok("--json", "import", out).json()
    assert first == {"file": str(out), "read": 6, "imported": 6, "skipped": 0, "messages_read": 26}
    original = snapshot(demo)
    assert snapshot(copy) == original  # every column, every message, parent links, counters

    second = copy.ok("--json", "import", out).json()
    assert (second["imported"], second["skipped"]) == (0, 6)
    assert snapshot(copy) == original
    assert "skipped 6" in copy.ok("import", out).stdout
    assert copy.ok("--json", "search", "kubernetes").json()["count"] == 1


def test_stats_survive_export_import(demo: Target, new_target, tmp_path: Path) -> None:
    out = tmp_path / "e.jsonl"
    demo.ok("export", "--out", out)
    copy = new_target("c")
    copy.ok("import", out)
    assert copy.ok("--json", "stats").json() == demo.ok("--json", "stats").json()


def test_export_by_source_and_import_from_stdin(demo: Target, new_target) -> None:
    data = demo.ok("export", "--source", "telegram").stdout
    assert [json.loads(line)["source"] for line in data.splitlines()] == ["telegram"]
    copy = new_target("t")
    doc = copy.ok("--json", "import", "-", input=data).json()
    assert doc["imported"] == 1 and doc["messages_read"] == 6
    hits = copy.ok("--json", "search", "一致性").json()["results"]
    assert len(hits) == 2


def test_import_rejects_bad_lines_with_their_number(target: Target, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"id": "s1", "source": "cli", "started_at": 1.0, "messages": [{"role": "user", "content": "hi"}]})
    cases = {
        "not json": "line 2: not valid JSON",
        "[1, 2]": "line 2: expected a JSON object",
        '{"source": "cli", "started_at": 1}': "line 2: the session has no 'id'",
        '{"id": "x", "source": "cli"}': "lacks 'source' or a numeric 'started_at'",
        '{"id": "x", "source": "cli", "started_at": 1, "messages": [1]}': "malformed 'messages'",
    }
    for line, message in cases.items():
        bad.write_text(good + "\n" + line + "\n", encoding="utf-8")
        assert message in one_line_error(target.run("import", bad), 1)
    bad.write_bytes(b'{"id": "\xff"}\n')
    assert "not UTF-8" in one_line_error(target.run("import", bad), 1)
    assert "does not exist" in one_line_error(target.run("import", tmp_path / "missing"), 2)
    # A bad line refuses the whole file: not even the good line before it is kept.
    with target.open() as db:
        assert db.session_count() == 0


def test_export_to_a_missing_folder_is_one_line(demo: Target, tmp_path: Path) -> None:
    result = demo.run("export", "--out", tmp_path / "no" / "x.jsonl")
    assert "folder" in one_line_error(result, 1)
    assert not list(tmp_path.glob("**/*.tmp"))


def test_progress_bar_goes_to_stderr_on_a_terminal(demo: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(cli._common, "stderr_console", lambda: Console(file=buffer, force_terminal=True, force_interactive=True, width=80))
    result = demo.ok("export", "--out", tmp_path / "p.jsonl")
    assert "Exporting" in buffer.getvalue() and "Exporting" not in result.stdout
    buffer.truncate(0)
    demo.ok("--quiet", "export", "--out", tmp_path / "q.jsonl")
    assert "Exporting" not in buffer.getvalue()


# ------------------------------------------------------------------ prune and fts


def test_prune_dry_run_deletes_nothing_then_prune_deletes(demo: Target, tmp_path: Path) -> None:
    ids = ids_by_suffix(demo)
    old = ids["e1f2a3"]
    folder = tmp_path / "transcripts"
    folder.mkdir()
    (folder / f"{old}.jsonl").write_text("{}")
    (folder / f"request_dump_{old}_1.json").write_text("{}")
    before = snapshot(demo)

    doc = demo.ok("--json", "prune", "--older-than-days", "90", "--sessions-dir", folder, "--dry-run").json()
    assert doc["dry_run"] is True and doc["would_delete"] == 1
    assert [s["id"] for s in doc["sessions"]] == [old] and doc["sessions"][0]["end_reason"] == "cron_complete"
    assert sorted(Path(p).name for p in doc["transcript_files"]) == [f"{old}.jsonl", f"request_dump_{old}_1.json"]
    assert snapshot(demo) == before and (folder / f"{old}.jsonl").exists()
    human = demo.ok("prune", "--older-than-days", "90", "--dry-run").stdout
    assert old in human and "nothing was changed" in human

    # A chain root with a child: the child would be orphaned, not deleted.
    orphan = demo.ok("--json", "prune", "--older-than-days", "0", "--source", "cli", "--dry-run").json()
    assert ids["a41c9e"] in {s["id"] for s in orphan["sessions"]} and orphan["would_orphan"] == []
    assert snapshot(demo) == before

    done = demo.ok("--json", "prune", "--older-than-days", "90", "--sessions-dir", folder, "--yes").json()
    assert done["deleted"] == 1
    remaining = demo.ok("--json", "sessions", "--all").json()["sessions"]
    assert old not in {d["id"] for d in remaining} and len(remaining) == 5
    assert not list(folder.iterdir())
    assert "Nothing to prune" in demo.ok("prune", "--older-than-days", "90", "--dry-run").stdout


def test_prune_dry_run_reports_children_left_without_parent(target: Target) -> None:
    with target.open() as db:
        db.create_session("parent", "cli", started_at=1_000.0)
        db.update_session("parent", ended_at=1_100.0, end_reason="compression")
        db.create_session("child", "cli", parent_session_id="parent", started_at=1_200.0)
    doc = target.ok("--json", "prune", "--older-than-days", "1", "--dry-run").json()
    assert [s["id"] for s in doc["sessions"]] == ["parent"] and doc["would_orphan"] == ["child"]
    target.ok("prune", "--older-than-days", "1", "--yes")
    with target.open() as db:
        assert db.get_session("parent") is None and db.get_session("child")["parent_session_id"] is None


def test_fts_rebuild_check_optimize(demo: Target) -> None:
    indexes = SEARCH_INDEXES[demo.backend]
    rebuilt = demo.ok("--json", "fts", "rebuild").json()
    assert indexes <= set(rebuilt["rebuilt"]) and rebuilt["messages"] == 26
    check = demo.ok("--json", "fts", "check").json()
    assert check == {"ok": True, "indexes": {name: "ok" for name in indexes}}
    human = demo.ok("fts", "check").stdout
    assert all(f"{name}: ok" in human for name in indexes), human
    assert set(demo.ok("--json", "fts", "optimize").json()["optimized"]) == indexes
    assert demo.ok("--json", "search", "kubernetes").json()["count"] == 1
    assert demo.ok("--json", "search", "一致性").json()["count"] == 2
    assert "No such command" in one_line_error(demo.run("fts", "vacuum"), 2)


# ------------------------------------------------------------------ adopt


def test_adopt_a_hermes_v11_file_then_search_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copy(HERMES_V11, path)
    original = path.read_bytes()

    # Read commands refuse to rewrite a Hermes file behind the user's back.
    assert "adopt" in one_line_error(run("--db", path, "sessions"), 1)
    reply = run("--db", path, "--json", "current")  # reports, and exits 1: there is no store yet
    cur = reply.json()
    assert reply.code == 1 and json.loads(reply.stderr)["code"] == "needs_adoption"
    assert cur["needs_adoption"] is True and cur["hermes_schema_version"] == 11
    check = ok("--db", path, "--json", "adopt", "--check").json()
    assert check["detected"]["schema_version"] == 11 and check["adopted"] is False
    assert "Detected: Hermes schema_version 11" in ok("--db", path, "adopt", "--check").stdout
    assert path.read_bytes() == original

    doc = ok("--db", path, "--json", "adopt").json()
    assert doc["adopted"] is True and doc["detected"]["stamp"] == "0011"
    assert doc["revision"] == ok("--db", path, "--json", "current").json()["head"]
    assert Path(doc["backup"]).read_bytes() == original
    assert doc["row_counts"]["sessions"] == 5 and doc["row_counts"]["messages"] == 60

    # Head's trigram index (Hermes v30) leaves out cron, subagent and delegated sessions;
    # revision 0016 tagged this v11 file's orphaned delegates. Expected from the rows.
    conn = sqlite3.connect(path)
    try:
        having = {sid: (source, mc) for sid, source, mc in conn.execute(
            "SELECT s.id, s.source, s.model_config FROM sessions s JOIN messages m ON m.session_id = s.id "
            "WHERE m.role <> 'tool' AND instr(m.content, '记忆断裂') > 0"
        )}
    finally:
        conn.close()

    def delegated(mc: str | None) -> bool:
        try:
            value = json.loads(mc or "{}")
        except ValueError:
            return False
        return isinstance(value, dict) and value.get("_delegate_from") is not None

    searchable = {sid for sid, (source, mc) in having.items() if source not in ("cron", "subagent") and not delegated(mc)}
    assert searchable and searchable != set(having)  # both kinds are in this file
    hits = ok("--db", path, "--json", "search", "记忆断裂").json()["results"]
    assert {h["session_id"] for h in hits} == searchable
    assert ">>>" in hits[0]["snippet"]
    assert ok("--db", path, "--json", "search", "UNIQUEARG", "--limit", "100").json()["count"] == 15
    assert ok("--db", path, "--json", "lineage", "compat_001").json()["root"] == "compat_000"
    again = ok("--db", path, "--json", "adopt").json()
    assert again["already_adopted"] is True and again["adopted"] is False


def test_upgrade_adopts_a_hermes_file_too(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copy(HERMES_V11, path)
    doc = ok("--db", path, "--json", "upgrade").json()
    assert doc["adopted"] is True and doc["hermes_schema_version"] == 11 and doc["backup"]
    assert doc["tables"]["messages"] == 60


def test_adopt_refusals_are_one_line(tmp_path: Path) -> None:
    text = tmp_path / "notes.db"
    text.write_text("not a database\n" * 50)
    assert "not a SQLite database" in one_line_error(run("--db", text, "adopt"), 1)
    assert "not a SQLite database" in one_line_error(run("--db", text, "sessions"), 1)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE things (x)")
    assert "not a Hermes" in one_line_error(run("--db", foreign, "adopt"), 1)
    assert "no database" in one_line_error(run("--db", tmp_path / "absent.db", "adopt"), 1)
    assert "no database" in one_line_error(run("--db", tmp_path / "absent.db", "sessions"), 1)
    assert not (tmp_path / "absent.db").exists()


# ------------------------------------------------------------------ argument errors


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["sessions", "--limit", "x"], "'x' is not a whole number"),
        (["sessions", "--limit", "-1"], "-1 is negative"),
        (["sessions", "--offset", "-5"], "-5 is negative"),
        (["search"], "Missing argument 'QUERY'"),
        (["search", "x", "--sort", "best"], "'best' is not one of"),
        (["search", "x", "--limit"], "requires an argument"),
        (["stats", "--by", "colour"], "'colour' is not one of"),
        (["sessions", "--bogus"], "No such option"),
        (["--bogus", "sessions"], "No such option"),
        (["frobnicate"], "No such command 'frobnicate'"),
        (["show"], "Missing argument 'ID'"),
        (["prune"], "Missing option '--older-than-days'"),
        (["prune", "--older-than-days", "ten"], "not a whole number"),
        (["fts"], "Missing command"),
        (["export", "--out"], "requires an argument"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(target: Target, argv: list[str], fragment: str) -> None:
    result = target.run(*argv)
    line = one_line_error(result, 2)
    assert line.startswith("hermes-store: error: ") and fragment in line, line
    assert result.stdout == ""
    # Refused before anything was opened: no file, no tables on the server.
    assert migrations.current(target.location) is None
    assert target.backend != "sqlite" or not Path(target.location).exists()


def test_no_arguments_prints_help_and_version_works() -> None:
    result = run()
    assert result.code == 2 and "Commands:" in result.stderr
    assert ok("--version").stdout.strip().endswith("0.1.0")
    assert "sessions" in ok("--help").stdout
    # click's own runner sees the same group
    assert "Usage:" in CliRunner().invoke(cli.cli, ["search", "--help"]).output


def test_installed_console_script(target: Target) -> None:
    exe = Path(sys.executable).with_name("hermes-store")
    assert exe.exists(), exe

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *target.args, *args], capture_output=True, text=True, timeout=120)

    created = script("--json", "demo")
    assert created.returncode == 0, created.stderr
    found = script("--json", "search", "kubernetes")
    assert found.returncode == 0 and json.loads(found.stdout)["count"] == 1
    bad = script("sessions", "--limit", "-1")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr
    missing = script("show", "nope")
    assert missing.returncode == 1 and missing.stderr.strip() == "hermes-store: no session matches 'nope'"
