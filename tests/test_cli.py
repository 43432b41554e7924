"""The ``hermes-store`` command line: every subcommand, its --json output, and its errors.

Runs go through :func:`hermes_store.cli.main` inside click's CliRunner isolation, so
the exit codes and one-line error messages tested are exactly what a shell sees; one
test runs the installed console script in a subprocess.
"""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.cells import cell_len
from rich.console import Console

from hermes_store import SessionDB, cli
from hermes_store.cli import main

HERMES_V11 = Path(__file__).parent / "data" / "hermes-dbs" / "hermes_v11.db"


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


@pytest.fixture
def demo_db(tmp_path: Path) -> Path:
    path = tmp_path / "demo.db"
    ok("--db", path, "demo")
    return path


def ids_by_suffix(db: Path) -> dict[str, str]:
    """Demo session ids carry a date prefix; their hex tails are fixed."""
    docs = ok("--db", db, "--json", "sessions", "--all").json()["sessions"]
    return {d["id"].rsplit("_", 1)[1]: d["id"] for d in docs}


# ------------------------------------------------------------------ demo, upgrade, current


def test_demo_writes_sessions_once_and_refuses_other_databases(tmp_path: Path) -> None:
    path = tmp_path / "demo.db"
    doc = ok("--db", path, "--json", "demo").json()
    assert doc["sessions"] == 6 and doc["messages"] == 26 and len(doc["session_ids"]) == 6 and doc["created"]
    again = ok("--db", path, "--json", "demo").json()  # the README command run twice: a no-op
    assert again["created"] is False and again["sessions"] == 6 and again["messages"] == 26
    assert "already in" in ok("--db", path, "demo").stdout
    other = tmp_path / "other.db"
    db = SessionDB(other)
    db.create_session("mine", "cli")
    db.close()
    refused = run("--db", other, "demo")
    assert "already holds 1 session(s)" in one_line_error(refused, 1)
    assert SessionDB(other).session_count() == 1


def test_upgrade_creates_a_private_file_at_head_and_lists_tables(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    doc = ok("--db", path, "--json", "upgrade").json()
    assert doc["created"] is True and doc["revision"] == doc["head"]
    assert {"sessions", "messages", "session_model_usage", "hermes_store_version"} <= set(doc["tables"])
    assert doc["tables"]["sessions"] == 0 and "messages_fts" in doc["fts_indexes"]
    assert path.stat().st_mode & 0o077 == 0
    human = ok("--db", path, "upgrade").stdout
    assert f"already at revision {doc['head']}" in human and "sessions" in human


def test_upgrade_to_a_revision_then_head_and_current(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    assert ok("--db", path, "--json", "upgrade", "--revision", "0005").json()["revision"] == "0005"
    cur = ok("--db", path, "--json", "current").json()
    assert cur["revision"] == "0005" and cur["up_to_date"] is False and cur["needs_adoption"] is False
    doc = ok("--db", path, "--json", "upgrade").json()
    assert doc["previous"] == "0005" and doc["revision"] == doc["head"]
    assert ok("--db", path, "current").stdout.strip() == f"{doc['head']} (head)"
    # Going back is not an upgrade; an unknown revision is a bad argument.
    assert "cannot go back" in one_line_error(run("--db", path, "upgrade", "--revision", "0003"), 1)
    assert "unknown revision" in one_line_error(run("--db", path, "upgrade", "--revision", "9999"), 2)


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
    assert "database error" in one_line_error(run("--url", "postgresql+psycopg://u@127.0.0.1:1/db", "current"), 1)
    assert "either --db or --url" in one_line_error(run("--db", path, "--url", f"sqlite:///{path}", "current"), 2)
    assert "database file" in one_line_error(run("--url", "sqlite://", "current"), 2)


# ------------------------------------------------------------------ sessions, show, lineage


def test_sessions_lists_chains_once_and_filters(demo_db: Path) -> None:
    ids = ids_by_suffix(demo_db)
    docs = ok("--db", demo_db, "--json", "sessions").json()["sessions"]
    listed = [d["id"] for d in docs]
    # The compression chain shows as its tip (marked with the root); the delegate is hidden.
    assert ids["a41c9f"] in listed and ids["a41c9e"] not in listed and ids["b7d210"] not in listed
    tip = next(d for d in docs if d["id"] == ids["a41c9f"])
    assert tip["lineage_root_id"] == ids["a41c9e"] and tip["title"] == "Debugging a CrashLoopBackOff #2"
    assert listed[0] == ids["d90a44"]  # newest first
    cjk = next(d for d in docs if d["id"] == ids["c3e5f1"])
    assert cjk["preview"].startswith("帮我总结一下") and cjk["message_count"] == 6 and cjk["source"] == "telegram"

    assert len(ok("--db", demo_db, "--json", "sessions", "--all").json()["sessions"]) == 6
    only = ok("--db", demo_db, "--json", "sessions", "--source", "telegram").json()["sessions"]
    assert [d["id"] for d in only] == [ids["c3e5f1"]]
    both = ok("--db", demo_db, "--json", "sessions", "--source", "telegram", "--source", "cron").json()["sessions"]
    assert {d["source"] for d in both} == {"telegram", "cron"}
    rest = ok("--db", demo_db, "--json", "sessions", "--exclude-source", "cli", "--exclude-source", "cron").json()
    assert [d["source"] for d in rest["sessions"]] == ["telegram"]
    page = ok("--db", demo_db, "--json", "sessions", "--limit", "1", "--offset", "1").json()
    assert page["count"] == 1 and page["sessions"][0]["id"] == listed[1]
    by_activity = ok("--db", demo_db, "--json", "sessions", "--by-activity").json()["sessions"]
    assert by_activity[0]["id"] == ids["d90a44"]


def test_sessions_table_fits_80_columns(demo_db: Path) -> None:
    out = ok("--db", demo_db, "sessions", "--all").stdout
    assert "Debugging a" in out and "分布式系统" in out
    assert all(cell_len(line) <= 80 for line in out.splitlines()), out


def test_show_accepts_a_prefix_and_prints_messages(demo_db: Path) -> None:
    ids = ids_by_suffix(demo_db)
    root = ids["a41c9e"]
    doc = ok("--db", demo_db, "--json", "show", root[:-2]).json()
    assert doc["session"]["id"] == root and doc["session"]["title"] == "Debugging a CrashLoopBackOff"
    assert doc["session"]["end_reason"] == "compression" and doc["session"]["input_tokens"] == 48_210
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "tool", "assistant", "user", "assistant", "tool"]
    assert doc["messages"][1]["tool_calls"][0]["function"]["name"] == "terminal"
    assert doc["lineage"] == [root, ids["a41c9f"]]
    human = ok("--db", demo_db, "show", root).stdout
    assert "CrashLoopBackOff" in human and "→ terminal(" in human and "ECONNREFUSED" in human
    assert "(compression)" in human


def test_show_options_cut_or_skip_messages(tmp_path: Path) -> None:
    path = tmp_path / "long.db"
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "word " * 400)
    assert "more characters; --full" in ok("--db", path, "show", "s1").stdout
    assert "more characters" not in ok("--db", path, "show", "s1", "--full").stdout
    assert ok("--db", path, "--json", "show", "s1", "--no-messages").json()["messages"] == []
    assert "word" not in ok("--db", path, "show", "s1", "--no-messages").stdout


def test_show_prints_content_literally(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "[bold red]not markup[/bold red] and [link=x]y[/link]")
    out = ok("--db", path, "show", "s1").stdout
    assert "[bold red]not markup[/bold red] and [link=x]y[/link]" in out


def test_show_unknown_or_ambiguous_session_exits_1(demo_db: Path) -> None:
    assert one_line_error(run("--db", demo_db, "show", "nope"), 1) == "hermes-store: no session matches 'nope'"
    ids = ids_by_suffix(demo_db)
    common = ids["a41c9e"][:2]  # every demo id starts with the century (a shared date breaks near midnight)
    assert "ambiguous" in one_line_error(run("--db", demo_db, "show", common), 1)
    assert "no session" in one_line_error(run("--db", demo_db, "lineage", "nope"), 1)


def test_lineage_shows_chain_and_descendants(demo_db: Path) -> None:
    ids = ids_by_suffix(demo_db)
    doc = ok("--db", demo_db, "--json", "lineage", ids["a41c9e"]).json()
    assert doc["root"] == ids["a41c9e"] and doc["tip"] == ids["a41c9f"]
    assert [(c["id"], c["end_reason"]) for c in doc["chain"]] == [(ids["a41c9e"], "compression"), (ids["a41c9f"], "user_exit")]
    assert [(d["id"], d["relation"], d["parent_session_id"]) for d in doc["descendants"]] == [
        (ids["b7d210"], "delegate", ids["a41c9f"])
    ]
    # From the tip, the chain is the same; from the delegate, it is its own chain.
    assert ok("--db", demo_db, "--json", "lineage", ids["a41c9f"]).json()["root"] == ids["a41c9e"]
    human = ok("--db", demo_db, "lineage", ids["a41c9e"]).stdout
    assert "compression" in human and "delegate" in human and "▶" in human
    assert all(cell_len(line) <= 80 for line in human.splitlines())


# ------------------------------------------------------------------ search and stats


def test_search_finds_words_cjk_and_tool_arguments(demo_db: Path) -> None:
    ids = ids_by_suffix(demo_db)
    doc = ok("--db", demo_db, "--json", "search", "kubernetes").json()
    assert doc["count"] == 1
    hit = doc["results"][0]
    assert hit["session_id"] == ids["a41c9e"] and hit["role"] == "user" and ">>>Kubernetes<<<" in hit["snippet"]
    assert hit["source"] == "cli" and len(hit["context"]) == 2

    cjk = ok("--db", demo_db, "--json", "search", "一致性").json()["results"]
    assert {h["session_id"] for h in cjk} == {ids["c3e5f1"]} and len(cjk) == 2
    assert any(">>>一致性<<<" in h["snippet"] for h in cjk)

    args = ok("--db", demo_db, "--json", "search", "rollout").json()["results"]
    assert [h["role"] for h in args] == ["assistant"]  # only in a tool call's arguments

    roles = ok("--db", demo_db, "--json", "search", "pod", "--role", "assistant").json()["results"]
    assert roles and {h["role"] for h in roles} == {"assistant"}
    tools = ok("--db", demo_db, "--json", "search", "pod", "--role", "user", "--role", "tool").json()["results"]
    assert tools and {h["role"] for h in tools} <= {"user", "tool"}
    assert ok("--db", demo_db, "--json", "search", "pod", "--exclude-source", "cli").json()["results"] == []
    assert ok("--db", demo_db, "--json", "search", "Raft", "--source", "telegram").json()["count"] >= 1
    newest = [h["timestamp"] for h in ok("--db", demo_db, "--json", "search", "pod", "--sort", "newest").json()["results"]]
    oldest = [h["timestamp"] for h in ok("--db", demo_db, "--json", "search", "pod", "--sort", "oldest").json()["results"]]
    assert newest == sorted(newest, reverse=True) and oldest == sorted(oldest) and len(newest) >= 3
    paged = ok("--db", demo_db, "--json", "search", "pod", "--sort", "oldest", "--limit", "1", "--offset", "1").json()
    assert [h["timestamp"] for h in paged["results"]] == oldest[1:2]


def test_search_human_output_keeps_markers_without_colour(demo_db: Path) -> None:
    out = ok("--db", demo_db, "search", "kubernetes", "-C").stdout
    assert ">>>Kubernetes<<<" in out and "· user ·" in out and "1 result(s)" in out
    assert "No messages match" in ok("--db", demo_db, "search", "zzzqqq").stdout
    # Hostile queries are not errors.
    for query in ['"unbalanced', "AND", "*", "(((", "a:b", "🙂"]:
        assert run("--db", demo_db, "--json", "search", query).code == 0


def test_highlight_snippet_styles_matches() -> None:
    text = cli.highlight_snippet("say >>>hello<<< world", styled=True)
    assert text.plain == "say hello world" and text.spans[0].style == "bold reverse"
    assert cli.highlight_snippet("say >>>hello<<<", styled=False).plain == "say >>>hello<<<"


def test_stats_by_model_task_and_route(demo_db: Path) -> None:
    doc = ok("--db", demo_db, "--json", "stats").json()
    by_model = {r["model"]: r for r in doc["rows"]}
    assert by_model["anthropic/claude-sonnet-4"]["input_tokens"] == 48_210 + 9_870 + 820
    assert by_model["anthropic/claude-sonnet-4"]["sessions"] == 3
    assert by_model["google/gemini-2.5-flash"]["input_tokens"] == 1_210 + 52_880  # side tasks
    totals = doc["totals"]
    assert totals["sessions"] == 6 and totals["messages"] == 26
    assert totals["input_tokens"] == sum(r["input_tokens"] for r in doc["rows"])
    assert totals["estimated_cost_usd"] == pytest.approx(sum(r["estimated_cost_usd"] for r in doc["rows"]))

    tasks = {r["task"]: r for r in ok("--db", demo_db, "--json", "stats", "--by", "task").json()["rows"]}
    assert set(tasks) == {"", "title_generation", "compression"}
    assert tasks["title_generation"]["input_tokens"] == 1_210 and tasks["compression"]["output_tokens"] == 1_650

    routes = ok("--db", demo_db, "--json", "stats", "--by", "route").json()["rows"]
    providers = {r["billing_provider"]: r for r in routes}
    assert set(providers) == {"openrouter", "openai", ""}
    assert providers["openrouter"]["billing_mode"] == "chat_completions"

    telegram = ok("--db", demo_db, "--json", "stats", "--source", "telegram").json()
    assert [r["model"] for r in telegram["rows"]] == ["openai/gpt-4.1"] and telegram["totals"]["messages"] == 6

    human = ok("--db", demo_db, "stats").stdout
    assert "anthropic/claude-sonnet-4" in human and "Total" in human
    assert all(cell_len(line) <= 80 for line in human.splitlines()), human
    assert "title_generation" in ok("--db", demo_db, "stats", "--by", "task").stdout


# ------------------------------------------------------------------ export and import


def _snapshot(path: Path) -> dict[str, Any]:
    """Sessions (all columns), messages and lineage as plain data, for comparing files."""
    with SessionDB(path) as db:
        sessions = {}
        for record in db.iter_export():
            sessions[record["id"]] = record
        return sessions


def test_export_import_round_trip_is_exact_and_idempotent(demo_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "export.jsonl"
    doc = ok("--db", demo_db, "--json", "export", "--out", out).json()
    assert doc == {"out": str(out), "sessions": 6, "messages": 26, "source": None}
    assert out.stat().st_mode & 0o077 == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6 and all(json.loads(line)["messages"] for line in lines)
    assert "帮我总结一下" in out.read_text(encoding="utf-8")  # UTF-8, not \\u escapes

    # stdout gets the same stream
    assert ok("--db", demo_db, "export").stdout.splitlines() == lines

    target = tmp_path / "copy.db"
    first = ok("--db", target, "--json", "import", out).json()
    assert first == {"file": str(out), "read": 6, "imported": 6, "skipped": 0, "messages_read": 26}
    original, copy = _snapshot(demo_db), _snapshot(target)
    assert copy == original  # every column, every message, parent links, counters

    second = ok("--db", target, "--json", "import", out).json()
    assert (second["imported"], second["skipped"]) == (0, 6)
    assert _snapshot(target) == original
    assert "skipped 6" in ok("--db", target, "import", out).stdout


def test_stats_survive_export_import(demo_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "e.jsonl"
    ok("--db", demo_db, "export", "--out", out)
    ok("--db", tmp_path / "c.db", "import", out)
    assert ok("--db", tmp_path / "c.db", "--json", "stats").json() == ok("--db", demo_db, "--json", "stats").json()


def test_export_by_source_and_import_from_stdin(demo_db: Path, tmp_path: Path) -> None:
    data = ok("--db", demo_db, "export", "--source", "telegram").stdout
    assert [json.loads(line)["source"] for line in data.splitlines()] == ["telegram"]
    doc = ok("--db", tmp_path / "t.db", "--json", "import", "-", input=data).json()
    assert doc["imported"] == 1 and doc["messages_read"] == 6
    hits = ok("--db", tmp_path / "t.db", "--json", "search", "一致性").json()["results"]
    assert len(hits) == 2


def test_import_rejects_bad_lines_with_their_number(tmp_path: Path) -> None:
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
        assert message in one_line_error(run("--db", tmp_path / "i.db", "import", bad), 1)
    bad.write_bytes(b'{"id": "\xff"}\n')
    assert "not UTF-8" in one_line_error(run("--db", tmp_path / "i.db", "import", bad), 1)
    assert "does not exist" in one_line_error(run("--db", tmp_path / "i.db", "import", tmp_path / "missing"), 2)


def test_export_to_a_missing_folder_is_one_line(demo_db: Path, tmp_path: Path) -> None:
    result = run("--db", demo_db, "export", "--out", tmp_path / "no" / "x.jsonl")
    assert "folder" in one_line_error(result, 1)
    assert not list(tmp_path.glob("**/*.tmp"))


def test_progress_bar_goes_to_stderr_on_a_terminal(demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(cli._common, "stderr_console", lambda: Console(file=buffer, force_terminal=True, force_interactive=True, width=80))
    result = ok("--db", demo_db, "export", "--out", tmp_path / "p.jsonl")
    assert "Exporting" in buffer.getvalue() and "Exporting" not in result.stdout
    buffer.truncate(0)
    ok("--db", demo_db, "--quiet", "export", "--out", tmp_path / "q.jsonl")
    assert "Exporting" not in buffer.getvalue()


# ------------------------------------------------------------------ prune and fts


def test_prune_dry_run_deletes_nothing_then_prune_deletes(demo_db: Path, tmp_path: Path) -> None:
    ids = ids_by_suffix(demo_db)
    old = ids["e1f2a3"]
    folder = tmp_path / "transcripts"
    folder.mkdir()
    (folder / f"{old}.jsonl").write_text("{}")
    (folder / f"request_dump_{old}_1.json").write_text("{}")
    before = _snapshot(demo_db)

    doc = ok("--db", demo_db, "--json", "prune", "--older-than-days", "90", "--sessions-dir", folder, "--dry-run").json()
    assert doc["dry_run"] is True and doc["would_delete"] == 1
    assert [s["id"] for s in doc["sessions"]] == [old] and doc["sessions"][0]["end_reason"] == "cron_complete"
    assert sorted(Path(p).name for p in doc["transcript_files"]) == [f"{old}.jsonl", f"request_dump_{old}_1.json"]
    assert _snapshot(demo_db) == before and (folder / f"{old}.jsonl").exists()
    human = ok("--db", demo_db, "prune", "--older-than-days", "90", "--dry-run").stdout
    assert old in human and "nothing was changed" in human

    # A chain root with a child: the child would be orphaned, not deleted.
    orphan = ok("--db", demo_db, "--json", "prune", "--older-than-days", "0", "--source", "cli", "--dry-run").json()
    assert ids["a41c9e"] in {s["id"] for s in orphan["sessions"]} and orphan["would_orphan"] == []
    assert _snapshot(demo_db) == before

    done = ok("--db", demo_db, "--json", "prune", "--older-than-days", "90", "--sessions-dir", folder).json()
    assert done["deleted"] == 1
    remaining = ok("--db", demo_db, "--json", "sessions", "--all").json()["sessions"]
    assert old not in {d["id"] for d in remaining} and len(remaining) == 5
    assert not list(folder.iterdir())
    assert "Nothing to prune" in ok("--db", demo_db, "prune", "--older-than-days", "90", "--dry-run").stdout


def test_prune_dry_run_reports_children_left_without_parent(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    with SessionDB(path) as db:
        db.create_session("parent", "cli", started_at=1_000.0)
        db.update_session("parent", ended_at=1_100.0, end_reason="compression")
        db.create_session("child", "cli", parent_session_id="parent", started_at=1_200.0)
    doc = ok("--db", path, "--json", "prune", "--older-than-days", "1", "--dry-run").json()
    assert [s["id"] for s in doc["sessions"]] == ["parent"] and doc["would_orphan"] == ["child"]
    ok("--db", path, "prune", "--older-than-days", "1")
    with SessionDB(path) as db:
        assert db.get_session("parent") is None and db.get_session("child")["parent_session_id"] is None


def test_fts_rebuild_check_optimize(demo_db: Path) -> None:
    rebuilt = ok("--db", demo_db, "--json", "fts", "rebuild").json()
    assert {"messages_fts", "messages_fts_trigram"} <= set(rebuilt["rebuilt"]) and rebuilt["messages"] == 26
    check = ok("--db", demo_db, "--json", "fts", "check").json()
    assert check["ok"] is True and check["indexes"]["messages_fts"] == "ok"
    assert "messages_fts: ok" in ok("--db", demo_db, "fts", "check").stdout
    assert "messages_fts" in ok("--db", demo_db, "--json", "fts", "optimize").json()["optimized"]
    assert ok("--db", demo_db, "--json", "search", "kubernetes").json()["count"] == 1
    assert "No such command" in one_line_error(run("--db", demo_db, "fts", "vacuum"), 2)


# ------------------------------------------------------------------ adopt


def test_adopt_a_hermes_v11_file_then_search_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copy(HERMES_V11, path)
    original = path.read_bytes()

    # Read commands refuse to rewrite a Hermes file behind the user's back.
    assert "adopt" in one_line_error(run("--db", path, "sessions"), 1)
    cur = ok("--db", path, "--json", "current").json()
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
def test_bad_arguments_exit_2_with_one_line(demo_db: Path, argv: list[str], fragment: str) -> None:
    result = run("--db", demo_db, *argv)
    line = one_line_error(result, 2)
    assert line.startswith("hermes-store: error: ") and fragment in line, line
    assert result.stdout == ""


def test_no_arguments_prints_help_and_version_works() -> None:
    result = run()
    assert result.code == 2 and "Commands:" in result.stderr
    assert ok("--version").stdout.strip().endswith("0.1.0")
    assert "sessions" in ok("--help").stdout
    # click's own runner sees the same group
    assert "Usage:" in CliRunner().invoke(cli.cli, ["search", "--help"]).output


def test_installed_console_script(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("hermes-store")
    assert exe.exists(), exe
    db = tmp_path / "demo.db"
    created = subprocess.run([exe, "--db", db, "--json", "demo"], capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr
    found = subprocess.run([exe, "--db", db, "--json", "search", "kubernetes"], capture_output=True, text=True, timeout=120)
    assert found.returncode == 0 and json.loads(found.stdout)["count"] == 1
    bad = subprocess.run([exe, "--db", db, "sessions", "--limit", "-1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr
    missing = subprocess.run([exe, "--db", db, "show", "nope"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and missing.stderr.strip() == "hermes-store: no session matches 'nope'"
