"""The command line under hostile input and failing conditions (issue 9, item 6).

Every run must end with one line on stderr (none on success) and the documented exit
code: 1 for refusals, unknown ids and library or OS errors, 2 for bad arguments, 130
when interrupted, 141 (quietly) when stdout's reader goes away. No traceback, ever, and
nothing written when the answer is an error.

Most runs go through :func:`hermes_store.cli.main` in click's CliRunner isolation (what
a shell sees); the cases that depend on the real process (argv bytes, a closed pipe,
SIGINT) run the installed ``hermes-store`` script.

What reaches a database (hostile text that parses, the prune summary, the stats number
format, the compression marker) runs on both backends through test_cli.py's
``target`` fixture; argument parsing, odd paths and process behaviour are the same
whatever the backend and run once, on a SQLite file.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.cells import cell_len
from sqlalchemy.exc import OperationalError

from hermes_store import SessionDB, errors
from hermes_store.cli import main, schema

from .test_cli import Run, Target, empty_target, snapshot
from .helpers import interruptible

pytestmark = pytest.mark.both_backends


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Target:
    """An empty database of the test's backend (as in test_cli.py)."""
    return empty_target(backend, tmp_path, request)


@pytest.fixture
def demo(target: Target) -> Target:
    target.ok("demo")
    return target

EXE = Path(sys.executable).with_name("hermes-store")
DAY = 86_400.0


def run(*args: Any, env: dict[str, str] | None = None) -> Run:
    """Call main() as the console script does, stdout and stderr captured apart."""
    with CliRunner().isolation(env=env) as (out, err, _):
        code = main([str(a) for a in args])
        sys.stdout.flush()
        sys.stderr.flush()
    return Run(code, out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace"))


def error_line(result: Run, code: int) -> str:
    """The run failed with ``code``, printed no traceback, and its only stderr line is the error."""
    assert result.code == code, (result.code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hermes-store: "), lines[0]
    return lines[0]


def files_in(folder: Path) -> dict[str, bytes]:
    """Every file (and link target) under ``folder``, for byte-for-byte comparisons."""
    out: dict[str, bytes] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            out[key] = b"-> " + os.fsencode(os.readlink(p))
        elif p.is_file():
            out[key] = p.read_bytes()
        else:
            out[key] = b"<dir>"
    return out


# ------------------------------------------------------------------ the table of hostile arguments


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo database plus the odd paths the table points --db at."""
    folder = tmp_path_factory.mktemp("hostile")
    assert run("--db", folder / "demo.db", "demo").code == 0
    # The first open after writing catches the CJK search index up (a library write);
    # settle it here so the table compares files against a quiet database.
    assert run("--db", folder / "demo.db", "sessions").code == 0
    (folder / "notes.txt").write_text("not a database\n" * 40)
    (folder / "a_folder").mkdir()
    os.symlink(folder / "gone" / "state.db", folder / "dangling.db")
    return folder


SURROGATES = "\udcff\udcfe"  # what Python makes of the bytes ff fe in argv
WEIRD = "\u202eevil\u200b\ufeff🙂ẞ"  # right-to-left override, zero-width space, BOM, emoji

HOSTILE: list[tuple[list[str], int, str]] = [
    # huge, negative, fractional and foreign numbers
    (["sessions", "--limit", "9" * 30], 2, "is too large; use 1 to 1,000,000"),
    (["search", "x", "--limit", "100000000000000000000"], 2, "is too large"),
    (["search", "x", "--limit", "1e20"], 2, "'1e20' is not a whole number"),
    (["sessions", "--offset", "1e20"], 2, "not a whole number"),
    (["sessions", "--offset", str(2**62 + 1)], 2, "is too large"),
    (["search", "x", "--offset", "-" + "9" * 60], 2, "is negative"),
    (["sessions", "--limit", "0"], 2, "0 is too small; use 1 to"),
    (["sessions", "--limit", "-1"], 2, "-1 is negative"),
    (["sessions", "--limit", "2.5"], 2, "not a whole number"),
    (["sessions", "--limit", "١٢"], 2, "not a whole number"),
    (["sessions", "--limit", "1_000"], 2, "not a whole number"),
    (["sessions", "--limit", ""], 2, "not a whole number"),
    (["prune", "--older-than-days", "100001"], 2, "is too large; use 0 to 100,000"),
    (["prune", "--older-than-days", "-1"], 2, "is negative"),
    (["prune", "--older-than-days", "1e20"], 2, "not a whole number"),
    (["prune", "--older-than-days", "9" * 5000], 2, "is too large"),
    # empty and whitespace-only text where nothing could match it
    (["show", ""], 2, "'ID': must not be empty"),
    (["lineage", "  "], 2, "must not be empty"),
    (["search", ""], 2, "'QUERY': must not be empty"),
    # bytes that are not UTF-8 (surrogate-escaped by Python)
    (["show", SURROGATES], 2, r"'\xff\xfe' is not UTF-8 text"),
    (["lineage", "ab" + SURROGATES], 2, "is not UTF-8 text"),
    (["search", SURROGATES], 2, "is not UTF-8 text"),
    (["sessions", "--source", SURROGATES], 2, "'--source'"),
    (["search", "pod", "--role", "\udc80"], 2, "'--role'"),
    (["upgrade", "--revision", SURROGATES], 2, "is not UTF-8 text"),
    (["stats", "--source", SURROGATES], 2, "is not UTF-8 text"),
    (["prune", "--older-than-days", "1", "--source", SURROGATES], 2, "is not UTF-8 text"),
    (["--db", "{lab}/" + SURROGATES + ".db", "sessions"], 2, "not a UTF-8 file name"),
    (["--url", "sqlite:///" + SURROGATES, "sessions"], 2, "'--url'"),
    (["sessions", "--limit", SURROGATES], 2, "not a whole number"),
    # unknown options and commands, missing arguments
    (["sessions", "--bogus"], 2, "No such option"),
    (["--bogus", "sessions"], 2, "No such option"),
    (["frobnicate"], 2, "No such command"),
    ([SURROGATES], 2, "No such command"),
    (["show"], 2, "Missing argument 'ID'"),
    (["search"], 2, "Missing argument 'QUERY'"),
    (["prune"], 2, "Missing option '--older-than-days'"),
    (["sessions", "--limit"], 2, "requires an argument"),
    (["search", "x", "--sort", "best"], 2, "'best' is not one of"),
    (["prune", "--older-than-days", "1", "--all"], 2, "add --dry-run"),
    (["upgrade", "--revision", "9999"], 2, "unknown revision"),
    # odd databases and paths
    (["--db", "{lab}/no/such/folder/state.db", "sessions"], 1, "no database at"),
    (["--db", "{lab}/no/such/folder/state.db", "show", "x"], 1, "no database at"),
    (["--db", "{lab}/a_folder", "sessions"], 2, "is a directory"),
    (["--db", "{lab}/notes.txt", "sessions"], 1, "not a SQLite database"),
    (["--db", "{lab}/notes.txt", "upgrade"], 1, "not a SQLite database"),
    (["--db", "{lab}/dangling.db", "sessions"], 1, "is a symbolic link to"),
    (["--db", "{lab}/dangling.db", "upgrade"], 1, "which does not exist"),
    (["--db", "{lab}/dangling.db", "demo"], 1, "which does not exist"),
    (["--db", "{lab}/notes.txt/inner/state.db", "upgrade"], 1, "is a file, not a folder"),
    (["--db", "", "sessions"], 2, "the path is empty"),
    (["export", "--out", "{lab}/a_folder"], 2, "is a directory"),
    (["import", "{lab}/a_folder"], 2, "is a directory"),
    (["import", "{lab}/missing.jsonl"], 2, "does not exist"),
    (["prune", "--older-than-days", "1", "--sessions-dir", "{lab}/notes.txt"], 2, "is a file"),
    (["--url", "", "sessions"], 2, "must name a database file"),
    (["--url", "sqlite://", "sessions"], 2, "must name a database file"),
    (["--url", "sqlite:///:memory:", "sessions"], 2, "must name a database file"),
    (["--url", "mysql://host/db", "sessions"], 2, "only sqlite"),
    (["--url", "postgresql+psycopg://u@127.0.0.1:1/db", "sessions"], 1, "Connection refused"),
    (["--url", "mysql+pymysql://u:p@h/db", "sessions"], 2, "only sqlite"),
    (["--url", "sqlite:///{lab}/demo.db", "--db", "{lab}/demo.db", "sessions"], 2, "either --db or --url"),
]


@pytest.mark.parametrize("argv, code, fragment", HOSTILE, ids=[" ".join(a)[:60].encode("ascii", "backslashreplace").decode()
                                                              for a, _c, _f in HOSTILE])
def test_hostile_arguments_get_one_line_and_the_documented_code(lab: Path, argv: list[str], code: int,
                                                                 fragment: str) -> None:
    args = [a.replace("{lab}", str(lab)) for a in argv]
    if not any(a in ("--db", "--url") for a in args):
        args = ["--db", str(lab / "demo.db"), *args]
    before = files_in(lab)
    result = run(*args)
    if code == 0:
        assert result.code == 0 and result.stderr == "", result.stderr
    else:
        line = error_line(result, code)
        assert fragment in line, line
        if code == 2:
            assert line.startswith("hermes-store: error: ")
        assert result.stdout == ""
    # Nothing written, whatever the answer: every file byte-for-byte, no new file or folder.
    assert files_in(lab) == before


#: Text that parses and reaches the database: a normal answer (0) or "no such session" (1),
#: and nothing written either way.
REACHING: list[tuple[list[str], int, str]] = [
    # weird but valid unicode
    (["show", WEIRD], 1, "no session matches"),
    (["lineage", "ＡＢＣ"], 1, "no session matches"),
    (["search", WEIRD], 0, ""),
    (["search", "\u0301\u0301\u0301"], 0, ""),
    (["sessions", "--source", WEIRD], 0, ""),
    (["stats", "--source", WEIRD], 0, ""),
    (["export", "--source", WEIRD], 0, ""),
    # NUL characters (PostgreSQL text cannot hold U+0000 as such)
    (["show", "a\x00b"], 1, "no session matches"),
    (["lineage", "\x00"], 1, "no session matches"),
    (["search", "po\x00d"], 0, ""),
    (["sessions", "--source", "cli\x00"], 0, ""),
    (["prune", "--older-than-days", "0", "--source", "\x00", "--dry-run"], 0, ""),
    # the largest numbers the arguments accept (both engines' 64-bit integers)
    (["sessions", "--offset", str(2**62), "--limit", "1000000"], 0, ""),
    (["search", "pod", "--offset", str(2**62), "--limit", "1000000"], 0, ""),
    (["prune", "--older-than-days", "100000", "--dry-run"], 0, ""),
    # long text
    (["search", "一" * 5000], 0, ""),
    (["search", "a" * 100_000], 0, ""),
]


def fingerprint(t: Target, folder: Path) -> Any:
    """What must not change: a file byte for byte (and no new file beside it), or
    everything a server database holds, as export sees it, and its revision."""
    from hermes_store import migrations

    if t.backend == "sqlite":
        return files_in(folder)
    return snapshot(t), migrations.current(t.location)


@pytest.fixture
def settled(demo: Target) -> Target:
    """The demo database with its CJK search index caught up (the first open after
    writing is a library write), so a run that only reads leaves it as it is."""
    assert demo.run("sessions").code == 0
    return demo


@pytest.mark.parametrize("argv, code, fragment", REACHING, ids=[" ".join(a)[:60].encode("ascii", "backslashreplace").decode()
                                                                for a, _c, _f in REACHING])
def test_hostile_text_reaching_the_database_writes_nothing(settled: Target, tmp_path: Path, argv: list[str], code: int,
                                                           fragment: str) -> None:
    before = fingerprint(settled, tmp_path)
    result = run(*settled.args, *argv)
    if code == 0:
        assert result.code == 0 and result.stderr == "", result.stderr
    else:
        line = error_line(result, code)
        assert fragment in line, line
        assert result.stdout == ""
    assert fingerprint(settled, tmp_path) == before


def test_undecodable_bytes_from_a_real_shell_are_one_line(tmp_path: Path) -> None:
    """argv bytes ff fe reach Python as surrogate escapes; the line shows the bytes."""
    db = tmp_path / "demo.db"
    assert run("--db", db, "demo").code == 0
    shown = subprocess.run([EXE, "--db", db, "show", b"\xff\xfe"], capture_output=True, timeout=120)
    assert shown.returncode == 2 and shown.stdout == b""
    assert b"Traceback" not in shown.stderr
    assert shown.stderr.splitlines() == [
        b"hermes-store: error: Invalid value for 'ID': '\\xff\\xfe' is not UTF-8 text "
        b"(the shell passed undecodable bytes) (see 'hermes-store show --help')"
    ]
    named = subprocess.run([EXE, "--db", os.fsencode(tmp_path) + b"/\xff.db", "upgrade"], capture_output=True, timeout=120)
    assert named.returncode == 2 and len(named.stderr.splitlines()) == 1 and b"not a UTF-8 file name" in named.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.db"]


# ------------------------------------------------------------------ errors from inside a command


@pytest.fixture
def demo_db(tmp_path: Path) -> Path:
    path = tmp_path / "demo.db"
    assert run("--db", path, "demo").code == 0
    return path


def _raiser(exc: BaseException) -> Any:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise exc

    return boom


def test_driver_errors_are_one_line(demo_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapped = OperationalError("SELECT ...", {}, sqlite3.OperationalError("disk I/O error"))
    monkeypatch.setattr(SessionDB, "list_sessions_rich", _raiser(wrapped))
    assert error_line(run("--db", demo_db, "sessions"), 1) == "hermes-store: database error: disk I/O error"
    # The facade's raw DB-API paths (export) raise sqlite3 errors unwrapped.
    monkeypatch.setattr(SessionDB, "iter_export", _raiser(sqlite3.DatabaseError("database disk image is malformed")))
    result = run("--db", demo_db, "export")
    assert error_line(result, 1) == "hermes-store: database error: database disk image is malformed"


@pytest.mark.parametrize(
    "exc, expected",
    [
        (errors.ReadOnlyDatabaseError("state.db is read-only; nothing was changed"), "state.db is read-only; nothing was changed"),
        (errors.DiskFullError("the disk is full;\nearlier rows are intact"), "the disk is full; earlier rows are intact"),
        (errors.DatabaseLockedError("still locked after 30 s"), "still locked after 30 s"),
        (errors.InvalidInputError("bulk item 3 has no 'role'"), "bulk item 3 has no 'role'"),
    ],
)
def test_library_errors_are_one_line(demo_db: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception,
                                     expected: str) -> None:
    monkeypatch.setattr(SessionDB, "search_messages", _raiser(exc))
    assert error_line(run("--db", demo_db, "search", "pod"), 1) == f"hermes-store: {expected}"


def test_os_errors_are_one_line_and_create_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ro" / "state.db"
    # What a read-only folder gives a non-root user at create time.
    monkeypatch.setattr(schema, "create_private_file",
                        _raiser(PermissionError(13, "Permission denied", str(target))))
    assert error_line(run("--db", target, "upgrade"), 1) == f"hermes-store: {target}: Permission denied"
    assert not target.exists()
    monkeypatch.setattr(schema, "create_private_file", _raiser(OSError(28, "No space left on device")))
    assert error_line(run("--db", target, "upgrade"), 1) == "hermes-store: No space left on device"
    assert not target.exists()


def test_export_to_a_file_where_a_folder_should_be_is_one_line(demo_db: Path, tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    line = error_line(run("--db", demo_db, "export", "--out", tmp_path / "plain" / "out.jsonl"), 1)
    assert "cannot write" in line or "does not exist" in line, line
    assert (tmp_path / "plain").read_text() == "x"


def test_interrupt_exits_130_with_one_line(demo_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SessionDB, "search_messages", _raiser(KeyboardInterrupt()))
    result = run("--db", demo_db, "search", "pod")
    assert error_line(result, 130) == "hermes-store: interrupted"


def test_broken_pipe_inside_a_command_is_quiet(demo_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SessionDB, "list_sessions_rich", _raiser(BrokenPipeError(32, "Broken pipe")))
    result = run("--db", demo_db, "sessions")
    assert (result.code, result.stderr) == (141, "")


def test_unexpected_errors_are_one_line_unless_debugging(demo_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SessionDB, "get_session_lineage", _raiser(RuntimeError("boom\nsecond line")))
    line = error_line(run("--db", demo_db, "lineage", ids(demo_db)[0]), 1)
    assert line.startswith("hermes-store: unexpected error: RuntimeError: boom second line")
    assert "HERMES_STORE_DEBUG=1" in line
    monkeypatch.setenv("HERMES_STORE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["--db", str(demo_db), "lineage", ids(demo_db)[0]])


def _closed_pipe_run(*args: Any) -> subprocess.CompletedProcess[bytes]:
    """Run the script with stdout on a pipe whose reader is already gone: every write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([EXE, *map(str, args)], stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)


def test_a_closed_stdout_exits_141_quietly(demo_db: Path) -> None:
    for args in (["sessions"], ["--json", "sessions"], ["export"], ["search", "pod"], ["--help"]):
        done = _closed_pipe_run("--db", demo_db, *args)
        assert (done.returncode, done.stderr) == (141, b""), (args, done.stderr)


def _blocked_reading_a_pipe(pid: int) -> bool:
    """Linux: the kernel function the process sleeps in ('pipe_read' or 'anon_pipe_read')."""
    try:
        return "pipe_read" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def test_sigint_exits_130_with_one_line(tmp_path: Path) -> None:
    """A real ^C while import waits on stdin: 'interrupted', exit 130, the file intact."""
    db = tmp_path / "i.db"
    assert run("--db", db, "upgrade").code == 0
    proc = subprocess.Popen([EXE, "--db", db, "import", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=interruptible)
    try:
        # Wait until it sleeps in read(stdin), the only pipe it reads: the ^C lands there.
        deadline = time.monotonic() + 120
        while not _blocked_reading_a_pipe(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _blocked_reading_a_pipe(proc.pid), "import never waited on stdin"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    assert [line for line in err.decode().splitlines() if line.strip()] == ["hermes-store: interrupted"]
    assert out == b""
    with SessionDB(db) as opened:
        assert opened.session_count() == 0


# ------------------------------------------------------------------ prune --dry-run summary


def ids(path: Path) -> list[str]:
    return [d["id"] for d in run("--db", path, "--json", "sessions", "--all", "--limit", "1000").json()["sessions"]]


@pytest.fixture
def old_db(target: Target) -> tuple[Target, list[str], int]:
    """25 ended sessions from 200+ days ago (1 to 3 messages each) and one recent one."""
    now = time.time()
    made, messages = [], 0
    with target.open() as db:
        for i in range(25):
            sid = f"old_{i:02d}"
            start = now - (230 - i) * DAY
            db.create_session(sid, "cron", started_at=start)
            for k in range(i % 3 + 1):
                db.append_message(sid, "user", f"report {i}.{k}", timestamp=start + k)
                messages += 1
            db.update_session(sid, ended_at=start + 60, end_reason="cron_complete")
            made.append(sid)
        db.create_session("recent", "cli", started_at=now - DAY)
        db.update_session("recent", ended_at=now - DAY + 60, end_reason="user_exit")
    target.ok("sessions")  # settle the search index (see ``settled``)
    return target, made, messages


def test_prune_dry_run_summarizes_and_lists_the_first_20(old_db: tuple[Target, list[str], int], tmp_path: Path) -> None:
    t, made, messages = old_db
    before = fingerprint(t, tmp_path)
    human = t.run("prune", "--older-than-days", "90", "--dry-run")
    assert human.code == 0, human.stderr
    text = human.stdout
    assert f"Would delete 25 session(s) with {messages} message(s),\nstarted " in text
    shown = [sid for sid in made if sid in text]
    assert shown == made[:20]  # oldest first, cut at 20
    assert "recent" not in text
    assert "… and 5 more (--all lists every one)." in text and "nothing was changed" in text
    assert all(cell_len(line) <= 80 for line in text.splitlines()), text

    everything = t.run("prune", "--older-than-days", "90", "--dry-run", "--all").stdout
    assert [sid for sid in made if sid in everything] == made and "more (--all" not in everything

    doc = t.run("--json", "prune", "--older-than-days", "90", "--dry-run").json()
    assert doc["would_delete"] == 25 and doc["would_delete_messages"] == messages
    assert [s["id"] for s in doc["sessions"]] == made
    assert doc["oldest_started_at"] == doc["sessions"][0]["started_at"]
    assert doc["newest_started_at"] == doc["sessions"][-1]["started_at"]
    assert fingerprint(t, tmp_path) == before
    with t.open() as db:
        assert db.session_count() == 26 and db.message_count() == messages


def test_prune_all_without_dry_run_deletes_nothing(old_db: tuple[Target, list[str], int], tmp_path: Path) -> None:
    t, _made, messages = old_db
    before = fingerprint(t, tmp_path)
    error_line(t.run("prune", "--older-than-days", "90", "--all"), 2)
    assert fingerprint(t, tmp_path) == before
    with t.open() as db:
        assert db.session_count() == 26 and db.message_count() == messages


# ------------------------------------------------------------------ stats: one number format


COMPACT = re.compile(r"\b\d+(\.\d+)?[kMB]\b")


def test_stats_table_uses_thousands_separators_throughout(demo: Target) -> None:
    out = demo.ok("stats").stdout
    # The example: 58.9k next to 4,477 in the same table.
    assert "58,900" in out and "4,477" in out and "128,000" in out
    assert not COMPACT.search(out), out
    assert all(cell_len(line) <= 80 for line in out.splitlines()), out
    doc = demo.ok("--json", "stats").json()
    assert doc["totals"]["input_tokens"] == 128_000  # raw numbers for scripts


def test_stats_too_wide_for_exact_counts_is_compact_throughout(target: Target) -> None:
    with target.open() as db:
        db.create_session("s1", "cli")
        db.update_token_counts("s1", input_tokens=12_345_678_901, output_tokens=1_234_567_890,
                               cache_read_tokens=9_876_543_210, model="anthropic/claude-sonnet-4",
                               estimated_cost_usd=1.5, api_call_count=1_234_567)
        db.create_session("s2", "cli")
        db.update_token_counts("s2", input_tokens=58_900, output_tokens=4_477, model="m", api_call_count=3)
    out = target.ok("stats").stdout
    numbers = [line for line in out.splitlines() if line.startswith(("anthropic", "m ", "Total"))]
    assert len(numbers) == 3, out
    assert "12.3B" in out and "58.9k" in out and "4.5k" in out and "1.2M" in out
    assert not re.search(r"\d,\d{3}", "\n".join(numbers)), out  # no exact count left in the table
    assert "…" not in "\n".join(numbers[1:]), out  # counts are never cut
    assert all(cell_len(line) <= 80 for line in out.splitlines()), out
    assert target.ok("--json", "stats").json()["totals"]["input_tokens"] == 12_345_678_901 + 58_900


# ------------------------------------------------------------------ the ↺ marker


@pytest.fixture
def chain_db(target: Target) -> Target:
    """root → mid → tip by compression, a delegate of the tip, a branch, and a plain session."""
    t = time.time() - 3 * DAY
    with target.open() as db:
        db.create_session("root", "cli", started_at=t)
        db.append_message("root", "user", "first part")
        db.update_session("root", ended_at=t + 100, end_reason="compression")
        db.create_session("mid", "cli", parent_session_id="root", started_at=t + 100)
        db.append_message("mid", "user", "second part")
        db.update_session("mid", ended_at=t + 200, end_reason="compression")
        db.create_session("tip", "cli", parent_session_id="mid", started_at=t + 200)
        db.append_message("tip", "user", "third part")
        db.create_session("helper", "cli", parent_session_id="tip", started_at=t + 250,
                          model_config={"_delegate_from": "tip"})
        db.create_session("lonely", "cli", started_at=t + 300)  # compressed, never continued
        db.update_session("lonely", ended_at=t + 310, end_reason="compression")
        db.create_session("plain", "telegram", started_at=t + 400)
        db.append_message("plain", "user", "hello")
    return target


def marked(out: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^(\S+) ↺", out, flags=re.M)}


def test_marker_shows_compression_tips_in_both_lists(chain_db: Target) -> None:
    every = chain_db.ok("sessions", "--all").stdout
    listed = {line.split()[0] for line in every.splitlines()[2:-1] if line.strip()}
    assert listed == {"root", "mid", "tip", "helper", "lonely", "plain"}
    assert marked(every) == {"tip"}
    assert "↺ = newest step of a compression chain" in every

    collapsed = chain_db.ok("sessions").stdout
    assert marked(collapsed) == {"tip"} and "↺ = newest step" in collapsed
    assert "root" not in collapsed and "mid" not in collapsed

    docs = {d["id"]: d for d in chain_db.ok("--json", "sessions", "--all").json()["sessions"]}
    assert {k: d["lineage_root_id"] for k, d in docs.items()} == {
        "root": None, "mid": None, "tip": "root", "helper": None, "lonely": None, "plain": None,
    }
    # The legend only comes with a marker.
    alone = chain_db.ok("sessions", "--source", "telegram").stdout
    assert "plain" in alone and "↺" not in alone


def test_marker_follows_a_chain_across_pages(chain_db: Target) -> None:
    """The tip is found on its own page, away from the rest of its chain."""
    order = [d["id"] for d in chain_db.ok("--json", "sessions", "--all").json()["sessions"]]
    at = order.index("tip")
    page = chain_db.ok("--json", "sessions", "--all", "--limit", "1", "--offset", str(at)).json()
    assert [(d["id"], d["lineage_root_id"]) for d in page["sessions"]] == [("tip", "root")]
