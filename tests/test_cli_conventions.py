"""Command-line conventions (issue 21, point 5).

- The global options (``--db``, ``--url``, ``--schema``, ``--json``, ``-q``) go before
  or after the command name.
- With ``--json`` an error is one JSON object on stderr: ``{"error", "code", "exit_code"}``.
- ``prune`` asks on a terminal and needs ``--yes`` elsewhere.
- Long commands write progress lines (count, rate, ETA) to a stderr that is not a
  terminal.
- ``postgres://`` and ``postgresql://`` URLs mean psycopg 3.
- ``--help`` and ``--version`` load none of the commands' modules (bench/cli_startup.py
  has the timings).
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from hermes_store import SessionDB, cli, errors, migrations
from hermes_store.cli import _base, _common, browse, crypto, doctor, maintain, retention, schema, size, tenants, transfer
from hermes_store.engine import create_engine, to_url

from . import test_layout
from .test_cli import HERMES_V11, Run, Target, empty_target, new_target, ok, one_line_error, run

__all__ = ["new_target"]  # a fixture of test_cli.py, used here too

pytestmark = pytest.mark.both_backends

EXE = Path(sys.executable).with_name("hermes-store")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Target:
    return empty_target(backend, tmp_path, request)


@pytest.fixture
def demo(target: Target) -> Target:
    target.ok("demo")
    return target


def json_error(result: Run, exit_code: int) -> dict[str, Any]:
    """The run exited ``exit_code`` and its stderr is one JSON object saying so."""
    assert result.code == exit_code, (result.code, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    doc = json.loads(lines[0])
    assert set(doc) == {"error", "code", "exit_code"} and doc["exit_code"] == exit_code, doc
    assert "\n" not in doc["error"] and not doc["error"].startswith("hermes-store"), doc
    return doc


# ------------------------------------------------------------------ global options anywhere


def test_global_options_after_the_command_name(demo: Target, tmp_path: Path) -> None:
    before = demo.ok("--json", "sessions", "--all").json()
    assert before["count"] == 6
    assert ok("sessions", *demo.args, "--json", "--all").json() == before
    assert ok("sessions", "--all", "--json", *demo.args).json() == before
    assert ok("--json", "stats", *demo.args).json() == demo.ok("--json", "stats").json()
    # A nested group: on the group or on its command.
    assert ok("fts", *demo.args, "--json", "check").json()["ok"] is True
    assert ok("fts", "check", *demo.args, "--json").json()["ok"] is True
    out = tmp_path / "after.jsonl"
    assert ok("export", "--out", out, *demo.args, "-q", "--json").json()["sessions"] == 6
    # Given on both sides, the one after the command name wins (as a repeated option does);
    # the other is never opened.
    elsewhere = tmp_path / "elsewhere.db"
    first = ("--db", elsewhere) if demo.backend == "sqlite" else ("--url", "postgresql+psycopg://u@127.0.0.1:1/none")
    assert ok(*first, "--json", "sessions", "--all", *demo.args).json()["count"] == 6
    assert not elsewhere.exists()
    # Combinations are checked whichever side they are on: before anything is opened.
    line = one_line_error(run("--db", elsewhere, "sessions", "--url", f"sqlite:///{elsewhere}"), 2)
    assert "either --db or --url" in line and "hermes-store sessions --help" in line
    line = one_line_error(run("sessions", "--schema", "team_a", "--db", elsewhere), 2)
    assert "--schema needs a PostgreSQL --url" in line
    assert not elsewhere.exists()
    assert "--db PATH" in ok("sessions", "--help").stdout and "--json" in ok("fts", "rebuild", "--help").stdout


def test_adopt_takes_db_after_the_command_name(tmp_path: Path) -> None:
    """The README's quick start: `hermes-store adopt --db PATH` used to be 'No such option'."""
    path = tmp_path / "state.db"
    shutil.copy(HERMES_V11, path)
    assert "Detected: Hermes schema_version 11" in ok("adopt", "--check", "--db", path).stdout
    doc = ok("adopt", "--db", path, "--json").json()
    assert doc["adopted"] is True and doc["revision"] == migrations.head()
    assert ok("current", "--db", path).stdout.strip() == f"{migrations.head()} (head)"


def test_schema_after_the_command_name(pg_database: str) -> None:
    ok("upgrade", "--url", pg_database, "--schema", "team_a")
    with SessionDB(pg_database, schema="team_a") as db:
        db.create_session("in-a", "cli")
    docs = ok("sessions", "--schema", "team_a", "--json", "--url", pg_database).json()["sessions"]
    assert [d["id"] for d in docs] == ["in-a"]
    assert migrations.current(pg_database) is None  # public untouched


# ------------------------------------------------------------------ --json errors


def test_json_errors_are_one_object_on_stderr(demo: Target) -> None:
    cases: list[tuple[list[str], int, str, str]] = [
        (["--json", "sessions", "--limit", "x"], 2, "usage", "'x' is not a whole number"),
        (["sessions", "--limit", "x", "--json"], 2, "usage", "'x' is not a whole number"),  # --json after the failure
        (["--json", "frobnicate"], 2, "usage", "No such command 'frobnicate'"),
        (["--json", "show", "nope"], 1, "not_found", "no session matches 'nope'"),
        (["lineage", "nope", "--json"], 1, "not_found", "no session matches 'nope'"),
        (["--json", "show", "\udcff"], 2, "usage", "is not UTF-8 text"),
        (["--json", "prune", "--older-than-days", "1"], 2, "usage", "add --yes"),
    ]
    for argv, exit_code, code, fragment in cases:
        result = demo.run(*argv)
        doc = json_error(result, exit_code)
        assert doc["code"] == code and fragment in doc["error"], (argv, doc)
        assert result.stdout == "", argv
    # Without --json, the same failure is the usual line.
    assert one_line_error(demo.run("show", "nope"), 1) == "hermes-store: no session matches 'nope'"
    # "--json" after "--" is an argument (here the query), not the flag.
    assert "No messages match '--json'" in demo.ok("search", "--", "--json").stdout


def test_json_errors_before_any_database(tmp_path: Path) -> None:
    assert json_error(run("--json"), 2)["code"] == "usage"  # no command: not the help text
    doc = json_error(run("--json", "--url", "mysql://h/db", "sessions"), 2)
    assert doc["code"] == "usage" and "only sqlite" in doc["error"]
    doc = json_error(run("--json", "--url", "postgresql+psycopg://u:secret@127.0.0.1:1/db", "sessions"), 1)
    assert "Connection refused" in doc["error"] and "secret" not in doc["error"]
    doc = json_error(run("--db", tmp_path / "none.db", "sessions", "--json"), 1)
    assert doc["code"] == "no_database" and "upgrade" in doc["error"]
    assert not (tmp_path / "none.db").exists()


def test_json_errors_from_inside_a_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.db"
    ok("--db", path, "demo")

    def raiser(exc: BaseException) -> Any:
        def boom(*_a: Any, **_k: Any) -> Any:
            raise exc
        return boom

    for exc, exit_code, code in [
        (OperationalError("SELECT", {}, Exception("disk I/O error")), 1, "database_error"),
        (KeyboardInterrupt(), 130, "interrupted"),
        (RuntimeError("boom"), 1, "unexpected"),
        (OSError(28, "No space left on device"), 1, "os_error"),
    ]:
        monkeypatch.setattr(SessionDB, "search_messages", raiser(exc))
        assert json_error(run("--db", path, "--json", "search", "pod"), exit_code)["code"] == code, exc
    assert _base.error_code(errors.DatabaseLockedError("x")) == "database_locked"
    assert _base.error_code(errors.NotFoundError("x")) == "not_found"


# ------------------------------------------------------------------ prune asks


def _old_session(t: Target) -> None:
    with t.open() as db:
        db.create_session("old", "cron", started_at=time.time() - 200 * 86_400)
        db.append_message("old", "user", "report", timestamp=time.time() - 200 * 86_400)  # prune reads inactivity
        db.update_session("old", ended_at=time.time() - 199 * 86_400, end_reason="cron_complete")
        db.create_session("new", "cli")


def _ids(t: Target) -> set[str]:
    with t.open() as db:
        return {r["id"] for r in db.search_sessions(limit=100)}


def test_prune_needs_yes_without_a_terminal(target: Target, tmp_path: Path) -> None:
    # Refused before anything is opened: a bad argument even where no database is.
    missing = tmp_path / "missing.db"
    assert "add --yes" in one_line_error(run("--db", missing, "prune", "--older-than-days", "0"), 2)
    assert not missing.exists()
    target.ok("upgrade")
    _old_session(target)
    line = one_line_error(target.run("prune", "--older-than-days", "90"), 2)
    assert "add --yes to confirm" in line and "--dry-run" in line
    assert _ids(target) == {"old", "new"}
    assert target.ok("--json", "prune", "--older-than-days", "90", "--dry-run").json()["would_delete"] == 1
    assert target.ok("--json", "prune", "--older-than-days", "90", "-y").json()["deleted"] == 1
    assert _ids(target) == {"new"}


def test_prune_asks_on_a_terminal(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    target.ok("upgrade")
    _old_session(target)
    monkeypatch.setattr(maintain, "stdin_is_terminal", lambda: True)
    declined = target.run("prune", "--older-than-days", "90", input="n\n")
    assert declined.code == 1 and "Delete 1 session(s) with 1 message(s)" in declined.stderr
    assert "nothing was deleted (not confirmed)" in declined.stderr
    assert _ids(target) == {"old", "new"}
    assert target.run("prune", "--older-than-days", "90", input="").code == 130  # ^D: nothing deleted
    assert _ids(target) == {"old", "new"}
    agreed = target.run("prune", "--older-than-days", "90", input="y\n")
    assert agreed.code == 0 and "Deleted 1 session(s)" in agreed.stdout, agreed.stderr
    assert _ids(target) == {"new"}
    # Nothing left to delete: nothing to ask.
    again = target.run("prune", "--older-than-days", "90", input="")
    assert again.code == 0 and "Delete" not in again.stderr and "Deleted 0 session(s)" in again.stdout


def _pty_prune(db: Path, answer: bytes) -> subprocess.CompletedProcess[bytes]:
    """The installed script with stdin on a real terminal (a pty) answering ``answer``."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([EXE, "--db", db, "prune", "--older-than-days", "90"], stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        os.close(slave)
    try:
        os.write(master, answer)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_prune_asks_on_a_real_terminal(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    ok("--db", path, "upgrade")
    _old_session(Target("sqlite", ("--db", str(path)), path))
    no = _pty_prune(path, b"n\n")
    assert no.returncode == 1 and b"[y/N]" in no.stderr and b"not confirmed" in no.stderr, no.stderr
    with SessionDB(path) as db:
        assert db.get_session("old") is not None
    yes = _pty_prune(path, b"y\n")
    assert yes.returncode == 0 and b"Deleted 1 session(s)" in yes.stdout, yes.stderr
    with SessionDB(path) as db:
        assert db.get_session("old") is None and db.get_session("new") is not None


# ------------------------------------------------------------------ progress lines


EVERY_STEP = {"HERMES_STORE_PROGRESS_EVERY": "0"}


def progress_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_import_and_export_write_progress_lines_to_a_log(demo: Target, new_target: Any, tmp_path: Path) -> None:
    dump = tmp_path / "d.jsonl"
    exported = demo.run("export", "--out", dump, env=EVERY_STEP)
    assert exported.code == 0
    lines = progress_lines(exported.stderr)
    assert lines[0].startswith("hermes-store: Exporting: 1/6 (16.7%) · ") and " · ETA " in lines[0], lines
    assert lines[-1].startswith("hermes-store: Exporting: 6/6 (100%) · done in ") and "/s" in lines[-1], lines
    assert len(lines) >= 6
    to_stdout = demo.run("export", env=EVERY_STEP)
    assert len(to_stdout.stdout.splitlines()) == 6 and "Exporting: 6/6 (100%)" in to_stdout.stderr
    assert "Exporting" not in to_stdout.stdout

    other = new_target("imported")
    imported = other.run("import", dump, env=EVERY_STEP)
    assert imported.code == 0 and "Imported 6 session(s)" in imported.stdout
    lines = progress_lines(imported.stderr)
    assert lines[-1].startswith("hermes-store: Importing: 6/6 (100%) · done in "), lines
    assert any(" · ETA " in line for line in lines), lines
    # --json: each line a JSON object; -q: none; the default interval: none for a quick run.
    again = other.run("--json", "import", dump, env=EVERY_STEP)
    docs = [json.loads(line) for line in progress_lines(again.stderr)]
    assert docs and all(d["progress"] == "Importing" and d["total"] == 6 for d in docs)
    assert docs[-1]["finished"] is True and docs[-1]["done"] == 6 and docs[-1]["percent"] == 100
    assert json.loads(again.stdout)["skipped"] == 6
    assert other.run("-q", "import", dump, env=EVERY_STEP).stderr == ""
    assert other.run("import", dump).stderr == ""


def test_copy_writes_progress_lines_to_a_log(demo: Target, tmp_path: Path) -> None:
    result = demo.run("copy", "--to", tmp_path / "copy.db", env=EVERY_STEP)
    assert result.code == 0, result.stderr
    lines = progress_lines(result.stderr)
    assert any(line.startswith("hermes-store: Copying sessions: ") for line in lines), lines
    assert any(line.startswith("hermes-store: Verifying: ") for line in lines), lines
    assert all(line.startswith("hermes-store: ") for line in lines)


def test_adopt_writes_progress_lines_to_a_log(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copy(HERMES_V11, path)
    result = run("--db", path, "adopt", env=EVERY_STEP)
    assert result.code == 0, result.stderr
    lines = progress_lines(result.stderr)
    assert any(line.startswith("hermes-store: Copying: ") and "%" in line for line in lines), lines
    assert any(line.startswith("hermes-store: Upgrading: ") for line in lines), lines


def test_progress_lines_count_rate_and_time_left() -> None:
    now = [0.0]
    lines: list[str] = []
    log = _common.ProgressLog("count", False, every=5.0, clock=lambda: now[0], write=lines.append)
    task = log.add_task("Copying sessions", total=40_000)
    now[0] = 1.0
    log.update(task, completed=4_000)  # a resumed copy: 4,000 were there before this run
    assert lines == []  # not due: the first line comes 5 s in
    now[0] = 6.0
    log.update(task, completed=24_000)
    assert lines == ["Copying sessions: 24,000/40,000 (60%) · 4,000/s · ETA 4s"]
    now[0] = 7.0
    log.update(task, completed=28_000)
    assert len(lines) == 1  # the next one is due 5 s after the last
    now[0] = 9.0
    log.update(task, completed=40_000)
    assert lines[-1] == "Copying sessions: 40,000/40,000 (100%) · done in 9s · 4,500/s"
    quick = log.add_task("Verifying", total=10)
    log.update(quick, completed=10)
    assert len(lines) == 2  # finished before its first line was due: no line at all
    percent = _common.ProgressLog("percent", False, every=0.0, clock=lambda: now[0], write=lines.append)
    stage = percent.add_task("Copying", total=100)
    now[0] = 12.0
    percent.update(stage, completed=25)
    assert lines[-1] == "Copying: 25% · ETA 9s"
    unknown = percent.add_task("Importing")
    now[0] = 13.0
    percent.advance(unknown, 7)
    assert lines[-1] == "Importing: 7 done"


def test_a_long_statement_gets_lines_while_it_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    """fts rebuild is one statement with nothing to count: a background thread writes
    the elapsed time while it runs."""
    with _common.ProgressLog("spinner", False, every=0.0) as log:
        log.add_task("Rebuilding search indexes", total=None)
        time.sleep(0.7)
    lines = progress_lines(capsys.readouterr().err)
    assert lines and all(line.startswith("hermes-store: Rebuilding search indexes: ") and "so far" in line
                         for line in lines), lines
    assert not [t for t in threading.enumerate() if t.name == "hermes-store-progress"]


# ------------------------------------------------------------------ postgres:// URLs


def test_postgres_urls_mean_psycopg() -> None:
    for given in ("postgres://u@h/d", "postgresql://u@h/d", "postgres+psycopg://u@h/d"):
        engine = create_engine(given)
        try:
            assert (engine.dialect.name, engine.dialect.driver) == ("postgresql", "psycopg"), given
        finally:
            engine.dispose()
    assert to_url("postgres://u:pw@h:5433/d?schema=team_a").render_as_string(hide_password=False) == \
        "postgresql://u:pw@h:5433/d?schema=team_a"
    assert to_url(make_url("postgres+asyncpg://u@h/d")).drivername == "postgresql+asyncpg"
    assert to_url("sqlite:///x.db").drivername == "sqlite"
    from hermes_store import aio

    assert aio.async_url("postgres://u@h/d").drivername == "postgresql+asyncpg"  # as postgresql:// is


def test_the_command_line_takes_postgres_urls(pg_database: str) -> None:
    url = make_url(pg_database)
    for scheme in ("postgres", "postgresql"):
        given = url.set(drivername=scheme).render_as_string(hide_password=False)
        assert given.startswith(f"{scheme}://")
        if scheme == "postgres":
            assert ok("--url", given, "--json", "upgrade").json()["revision"] == migrations.head()
            ok("demo", "--url", given)
        assert ok("--url", given, "--json", "sessions", "--all").json()["count"] == 6
    with SessionDB(url.set(drivername="postgres").render_as_string(hide_password=False)) as db:
        assert db.session_count() == 6


# ------------------------------------------------------------------ lazy loading


def test_the_lazy_table_matches_the_commands() -> None:
    modules = {"schema": schema, "browse": browse, "transfer": transfer, "maintain": maintain, "doctor": doctor,
               "tenants": tenants, "size": size,
               "retention": retention, "crypto": crypto}
    defined = {c.name: c for m in modules.values() for c in m.COMMANDS}
    assert set(cli.COMMANDS) == set(defined)
    ctx = click.Context(cli.cli)
    for name, spec in cli.COMMANDS.items():
        command = cli.cli.get_command(ctx, name)
        assert command is defined[name] and getattr(modules[spec.module], spec.attr) is command, name
        assert command.get_short_help_str(1000) == spec.short_help, name
    help_text = CliRunner().invoke(cli.cli, ["--help"], terminal_width=200).output
    for name, spec in cli.COMMANDS.items():
        assert f"{name} " in help_text and spec.short_help in help_text, name


def _loaded_after(*argv: str) -> list[str]:
    code = (f"import json, sys\nfrom hermes_store.cli import main\nrc = main({list(argv)!r})\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('hermes_store.cli'))))\n"
            "sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_help_and_version_load_no_command() -> None:
    assert _loaded_after("--version") == ["hermes_store.cli", "hermes_store.cli._base"]
    assert _loaded_after("--help") == ["hermes_store.cli", "hermes_store.cli._base"]
    # The check sees a command load when one is named.
    assert set(_loaded_after("sessions", "--help")) >= {"hermes_store.cli._common", "hermes_store.cli.browse"}


def test_command_modules_never_import_the_cli_package() -> None:
    """The group imports command modules by name (importlib), an edge test_layout's graph
    cannot see; it stays acyclic as long as no command module imports the package back."""
    modules = test_layout._package_modules()
    for name, path in modules.items():
        if name.startswith("hermes_store.cli."):
            imported = {t for t, _line, _inner in test_layout._imports(path, modules)}
            assert "hermes_store.cli" not in imported, name
    assert "hermes_store.cli._common" not in {t for t, _l, _i in test_layout._imports(
        modules["hermes_store.cli"], modules)}
    assert "hermes_store.cli._common" not in {t for t, _l, _i in test_layout._imports(
        modules["hermes_store.cli._base"], modules)}
