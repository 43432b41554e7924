"""Issue 30, the command line's rows: each recipe does what it says, in one line.

* Row 3: a store whose revisions a host application's Alembic runs (README "Way 2"),
  after ``alembic downgrade hermes_store@-1``: every reading command points to
  ``alembic upgrade heads`` in that project at once (``code: managed_by_host``), as
  ``upgrade`` does, never to ``hermes-store upgrade``, which refuses it.
* Row 10: a slow-search warning of the library is one line like the others: JSON with
  ``--json``, nothing with ``-q``; a library user still gets it through ``logging``.
* Row 11: ``--json`` error codes are the class names in snake case, word by word
  (``not_a_database``), for every HermesStoreError.
* Row 12: ^C during ``import`` or ``search`` writes exactly one line (no empty one first).
* Row 15: ``import`` while another process holds the write lock says it waits: the bar
  (or a log line, once) says "waiting for the database lock (N s)"; ``-q``: nothing.
* Row 17: a reading command leaves a file as it found it, bytes and time stamp, also when
  its WAL holds another program's committed pages (nothing checkpoints them on close).

The command line runs as a real process (``python -c 'from hermes_store.cli import main'``,
with this test's ``hermes_store`` on its path); where a test must know that the process
reached a given point (inside a search, at a lock wait) a small prelude patches that
point to say so on a pipe of its own and carry on, so nothing depends on timing.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import select
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.progress import Progress

import hermes_store
from hermes_store import SessionDB, errors
from hermes_store.cli import _common
from hermes_store.cli import _base
from hermes_store.cli._base import error_code

from .test_cli import run
from .helpers import interruptible
from .test_host_embedding import branch_host

pytestmark = pytest.mark.both_backends

#: Where this test's hermes_store lives, for the processes it starts.
PACKAGE_ROOT = str(Path(hermes_store.__file__).resolve().parent.parent)
#: Safety net only (a hung process fails the test instead of hanging the suite); no
#: assertion is about how long anything took.
HANG = 300


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for key in ("HERMES_SEARCH_SLOW_MS", "HERMES_STORE_PROGRESS_EVERY", "HERMES_STORE_DEBUG"):
        env.pop(key, None)
    env.update(extra)
    return env


def cli_argv(*args: Any, prelude: str = "") -> list[str]:
    """The command line in a process of its own; ``prelude`` runs first (test hooks)."""
    code = textwrap.dedent(prelude) + "\nimport sys\nfrom hermes_store.cli import main\nsys.exit(main())\n"
    return [sys.executable, "-c", code, *(str(a) for a in args)]


def cli(*args: Any, env: dict[str, str] | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_argv(*args), env=env or cli_env(), capture_output=True, text=True, input=input,
                          timeout=HANG)


def stderr_lines(text: str) -> list[str]:
    return text.splitlines()


@pytest.fixture
def demo_db(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    assert run("--db", path, "demo").code == 0
    return path


#: Tells the test (on the pipe whose descriptor is in $MARK_FD) that the process got somewhere.
MARK = """
import os
def mark(what):
    os.write(int(os.environ["MARK_FD"]), (what + "\\n").encode())
"""


class Marks:
    """The read end of the pipe a prelude's ``mark()`` writes to."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.buffer = b""

    def env(self, **extra: str) -> dict[str, str]:
        return cli_env(MARK_FD=str(self.write_fd), **extra)

    def started(self) -> None:
        os.close(self.write_fd)  # the child holds its own copy

    def wait_for(self, what: str) -> None:
        while (what + "\n").encode() not in self.buffer:
            ready, _, _ = select.select([self.read_fd], [], [], HANG)
            assert ready, f"the process never said {what!r}"
            chunk = os.read(self.read_fd, 4096)
            assert chunk, f"the process ended without saying {what!r}"
            self.buffer += chunk

    def close(self) -> None:
        os.close(self.read_fd)


# ---------------------------------------------------------------------------- row 3


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The host's database (test_host_embedding's): a new file, or a new server database."""
    if backend == "postgresql":
        return request.getfixturevalue("pg_database")
    return f"sqlite:///{tmp_path / 'host' / 'app.db'}"


@pytest.mark.slow
@pytest.mark.pg_direct
def test_a_host_downgrade_points_every_reader_to_alembic_upgrade_heads(tmp_path: Path, database: str) -> None:
    host, _rev = branch_host(tmp_path, database)
    host.alembic("downgrade", "hermes_store@-1")
    env = cli_env()
    for command in (["sessions"], ["search", "pod"], ["show", "x"], ["lineage", "x"], ["stats"], ["export"],
                    ["prune", "--older-than-days", "1", "--dry-run"], ["fts", "check"]):
        result = cli("--json", "--url", database, *command, env=env)
        assert result.returncode == 1, (command, result.stderr)
        [line] = stderr_lines(result.stderr)
        doc = json.loads(line)
        assert doc["code"] == "managed_by_host", (command, doc)
        assert "run `alembic upgrade heads` in that project" in doc["error"], doc
        assert "upgrade'" not in doc["error"] and "hermes-store" not in doc["error"], doc
    current = cli("--url", database, "current", env=env)
    assert "run `alembic upgrade heads` in that project" in current.stdout, current.stdout
    assert "hermes-store upgrade" not in current.stdout
    doctor = cli("--json", "--url", database, "doctor", env=env)
    assert any("alembic upgrade heads" in p for p in json.loads(doctor.stdout)["problems"]), doctor.stdout
    # What the readers say is what upgrade says: the two agree.
    upgrade = cli("--json", "--url", database, "upgrade", env=env)
    assert upgrade.returncode == 1 and json.loads(upgrade.stderr)["code"] == "managed_by_host"
    assert "alembic upgrade heads" in json.loads(upgrade.stderr)["error"]
    # And it is the right advice: after it, the readers read.
    host.alembic("upgrade", "heads")
    assert cli("--url", database, "sessions", env=env).returncode == 0


# ---------------------------------------------------------------------------- row 10


def test_a_slow_search_warning_is_one_line_json_or_nothing(demo_db: Path) -> None:
    env = cli_env(HERMES_SEARCH_SLOW_MS="0")  # every search is "slow": the warning always comes
    quiet = cli("--json", "-q", "--db", demo_db, "search", "pod", "--limit", "1000000", env=env)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert json.loads(quiet.stdout)["query"] == "pod"
    assert cli("-q", "--db", demo_db, "search", "pod", env=env).stderr == ""

    as_json = cli("--json", "--db", demo_db, "search", "pod", env=env)
    [line] = stderr_lines(as_json.stderr)
    doc = json.loads(line)
    assert doc["level"] == "warning" and doc["message"].startswith("search_messages took "), doc
    assert doc["logger"] == "hermes_state"

    text = cli("--db", demo_db, "search", "pod", env=env)
    [line] = stderr_lines(text.stderr)
    assert re.fullmatch(r"hermes-store: warning: search_messages took [0-9.]+ ms \(path=\w+, query='pod', results=\d+\)", line)


def test_the_library_still_logs_the_slow_search(demo_db: Path, caplog: pytest.LogCaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the command line routes our loggers; a library user's logging sees the record,
    also after a command ran in the same process (its handlers are put back)."""
    monkeypatch.setenv("HERMES_SEARCH_SLOW_MS", "0")
    loggers = [logging.getLogger(name) for name in ("hermes_store", "hermes_state")]
    before = [(lg.handlers[:], lg.propagate, lg.level) for lg in loggers]
    assert run("--db", demo_db, "-q", "search", "pod").code == 0
    assert [(lg.handlers[:], lg.propagate, lg.level) for lg in loggers] == before
    db = SessionDB(demo_db)
    try:
        with caplog.at_level(logging.WARNING, logger="hermes_state"):
            db.search_messages("pod")
    finally:
        db.close()
    assert any(r.name == "hermes_state" and "search_messages took" in r.getMessage() for r in caplog.records)


def test_a_logged_record_is_one_line_without_its_traceback() -> None:
    record = logging.LogRecord("hermes_store.upkeep", logging.WARNING, __file__, 1, "upkeep %s\nfailed", ("x",), None)
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record.exc_info = sys.exc_info()
    LogLines = _base.LogLines
    with CliRunner().isolation() as (_out, err, _):
        LogLines(as_json=False, quiet=False).emit(record)
        LogLines(as_json=True, quiet=False).emit(record)
        LogLines(as_json=True, quiet=True).emit(record)  # -q: no warning
        LogLines(as_json=False, quiet=True).emit(record)
        sys.stderr.flush()
    assert err.getvalue().decode().splitlines() == [
        "hermes-store: warning: upkeep x failed (ValueError: bad thing)",
        json.dumps({"level": "warning", "message": "upkeep x failed (ValueError: bad thing)",
                    "logger": "hermes_store.upkeep"}, ensure_ascii=False),
    ]


# ---------------------------------------------------------------------------- row 11


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _words(name: str) -> list[str]:
    """A class name cut into words another way: runs of capitals (an acronym), or a
    capital and the small letters after it."""
    return re.findall(r"[A-Z]+(?=[A-Z][a-z]|[0-9]|$)|[A-Z][a-z0-9]*|[a-z0-9]+", name)


def test_every_error_code_is_its_class_name_word_by_word() -> None:
    classes = sorted(set(_subclasses(errors.HermesStoreError)), key=lambda c: c.__name__)
    assert errors.NotADatabaseError in classes and errors.NotAHermesDatabaseError in classes
    for cls in classes:
        code = error_code(Exception.__new__(cls))  # what --json reports for one raised
        name = cls.__name__.removesuffix("Error")
        assert code == "_".join(w.lower() for w in _words(name)), (cls, code)
        assert re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", code), cls
    assert error_code(errors.NotADatabaseError("x")) == "not_a_database"
    assert error_code(errors.NotAHermesDatabaseError("x")) == "not_a_hermes_database"
    assert error_code(errors.DatabaseLockedError("x")) == "database_locked"
    assert error_code(type("FTSDamagedError", (Exception,), {})()) == "fts_damaged"


def test_json_codes_for_a_text_file_and_a_foreign_database(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    result = cli("--json", "--db", text, "sessions")
    assert result.returncode == 1 and json.loads(result.stderr)["code"] == "not_a_database", result.stderr
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE sessions (a)")
    result = cli("--json", "--db", foreign, "upgrade")
    assert result.returncode == 1 and json.loads(result.stderr)["code"] == "not_a_hermes_database", result.stderr


# ---------------------------------------------------------------------------- row 12

#: Stops inside a search, after saying so: the ^C lands inside the command.
STOP_IN_SEARCH = MARK + """
import time
from hermes_store import facade
def search_messages(self, *args, **kwargs):
    mark("searching")
    time.sleep(3600)
facade.SessionDB.search_messages = search_messages
"""

#: Says so once the import has its first record; then reads on (from stdin, kept open).
MARK_IN_IMPORT = MARK + """
from hermes_store import facade
original = facade.SessionDB.import_records
def import_records(self, records, *args, **kwargs):
    def said():
        for n, record in enumerate(records):
            yield record
            if n == 0:
                mark("importing")
    return original(self, said(), *args, **kwargs)
facade.SessionDB.import_records = import_records
"""


@pytest.mark.parametrize("options", [[], ["-q"], ["--json"], ["--json", "-q"]], ids=["text", "q", "json", "json-q"])
@pytest.mark.parametrize("command", ["search", "import"])
def test_an_interrupt_is_exactly_one_line(demo_db: Path, tmp_path: Path, options: list[str], command: str) -> None:
    marks = Marks()
    if command == "search":
        argv = cli_argv(*options, "--db", demo_db, "search", "pod", prelude=STOP_IN_SEARCH)
    else:
        argv = cli_argv(*options, "--db", tmp_path / "new.db", "import", "-", prelude=MARK_IN_IMPORT)
    env = marks.env(HERMES_STORE_PROGRESS_EVERY="3600")  # no progress line in between
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(marks.write_fd,), preexec_fn=interruptible)
    marks.started()
    try:
        if command == "import":
            record = {"id": "s1", "source": "cli", "started_at": 1.0, "messages": [{"role": "user", "content": "hi"}]}
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(record) + "\n").encode())
            proc.stdin.flush()
        marks.wait_for("searching" if command == "search" else "importing")
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
        marks.close()
    assert proc.returncode == 130
    lines = err.decode().splitlines()
    assert len(lines) == 1, lines
    if "--json" in options:
        assert json.loads(lines[0]) == {"error": "interrupted", "code": "interrupted", "exit_code": 130}
    else:
        assert lines == ["hermes-store: interrupted"]


# ---------------------------------------------------------------------------- row 15

#: Holds the write lock (BEGIN IMMEDIATE) until its stdin closes.
LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
conn.execute("COMMIT")
"""


class LockHolder:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "held\n"

    def release(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=HANG)


def export_file(folder: Path, count: int) -> Path:
    path = folder / "export.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for n in range(count):
            fh.write(json.dumps({"id": f"s{n:04d}", "source": "cli", "started_at": 1000.0 + n,
                                 "messages": [{"role": "user", "content": f"message {n}"}]}) + "\n")
    return path


def read_until(proc: subprocess.Popen[str], pattern: str, seen: list[str]) -> str | None:
    """stderr lines of ``proc`` (kept in ``seen``) until one holds ``pattern``; None at its end."""
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line.rstrip("\n"))
        if pattern in line:
            return seen[-1]
    return None


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_import_says_once_that_it_waits_for_the_lock(tmp_path: Path, as_json: bool) -> None:
    store = tmp_path / "state.db"
    assert run("--db", store, "upgrade").code == 0
    dump = export_file(tmp_path, 20)
    holder = LockHolder(store)
    options = ["--json"] if as_json else []
    # No periodic progress line: what stderr gets is the one line about the wait, and the last.
    proc = subprocess.Popen(cli_argv(*options, "--db", store, "import", dump),
                            env=cli_env(HERMES_STORE_PROGRESS_EVERY="3600"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        found = read_until(proc, "waiting_for_lock_seconds" if as_json else "waiting for the database lock", seen)
    finally:
        holder.release()
    out, rest = proc.communicate(timeout=HANG)
    seen += rest.splitlines()
    assert found is not None, (proc.returncode, seen)
    assert proc.returncode == 0, seen
    if as_json:
        docs = [json.loads(line) for line in seen]
        waiting = [d for d in docs if d["waiting_for_lock_seconds"] is not None]
        assert len(waiting) == 1 and waiting[0]["progress"] == "Importing" and waiting[0]["done"] == 0, docs
        assert docs[-1]["finished"] is True and docs[-1]["waiting_for_lock_seconds"] is None
        assert json.loads(out)["imported"] == 20
    else:
        waiting = [line for line in seen if "waiting for the database lock" in line]
        assert len(waiting) == 1, seen
        assert re.fullmatch(r"hermes-store: Importing: 0/20 \(0%\) · waiting for the database lock \(\d+ s\)",
                            waiting[0]), waiting
        assert seen[-1].startswith("hermes-store: Importing: 20/20 (100%) · done in "), seen
        assert "Imported 20 session(s)" in out


def test_import_stuck_mid_way_says_why(tmp_path: Path) -> None:
    """The issue's run: the first batch of 200 waits for another writer at "199 done"."""
    store = tmp_path / "state.db"
    assert run("--db", store, "upgrade").code == 0
    dump = export_file(tmp_path, 250).read_text().splitlines(keepends=True)
    proc = subprocess.Popen(cli_argv("--db", store, "import", "-"), env=cli_env(HERMES_STORE_PROGRESS_EVERY="0"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    seen: list[str] = []
    holder = None
    try:
        proc.stdin.write(dump[0])
        proc.stdin.flush()
        assert read_until(proc, "Importing: 1 done", seen), seen  # the store is open, nothing locked yet
        holder = LockHolder(store)
        proc.stdin.writelines(dump[1:])
        proc.stdin.close()
        found = read_until(proc, "waiting for the database lock", seen)
    finally:
        if holder is not None:
            holder.release()
    assert proc.stdout is not None and proc.stderr is not None
    rest = proc.stderr.read()
    out = proc.stdout.read()
    proc.wait(timeout=HANG)
    assert found is not None, (proc.returncode, seen[-5:], rest[-500:])
    assert re.fullmatch(r"hermes-store: Importing: 199 done( · [^·]+)? · waiting for the database lock \(\d+ s\)",
                        found), found
    assert proc.returncode == 0 and "Imported 250 session(s)" in out, rest


#: Says so at the first pause between two tries of a locked write (opening included).
MARK_AT_WAIT = MARK + """
from hermes_store import facade
original = facade.SessionDB._sleep
def _sleep(self, seconds):
    mark("waiting")
    facade.SessionDB._sleep = original
    original(self, seconds)
facade.SessionDB._sleep = _sleep
"""


def test_import_quiet_says_nothing_while_it_waits(tmp_path: Path) -> None:
    store = tmp_path / "state.db"
    assert run("--db", store, "upgrade").code == 0
    dump = export_file(tmp_path, 20)
    holder = LockHolder(store)
    marks = Marks()
    proc = subprocess.Popen(cli_argv("-q", "--db", store, "import", dump, prelude=MARK_AT_WAIT),
                            env=marks.env(HERMES_STORE_PROGRESS_EVERY="0"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, pass_fds=(marks.write_fd,))
    marks.started()
    try:
        marks.wait_for("waiting")
    finally:
        holder.release()
        marks.close()
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0 and err == "" and "Imported 20 session(s)" in out


def test_the_bar_and_the_log_say_waiting_and_stop_when_it_moves() -> None:
    bar = Progress(console=Console(file=io.StringIO()), auto_refresh=False)
    task = bar.add_task("Importing", total=10)
    now = [100.0]
    waits = _common.LockWaits(bar, task, "Importing", clock=lambda: now[0])
    waits()
    now[0] = 112.4
    waits()
    assert bar.tasks[0].description == "Importing · waiting for the database lock (12 s)"
    waits.advance()
    assert bar.tasks[0].description == "Importing" and bar.tasks[0].completed == 1

    lines: list[str] = []
    log = _common.ProgressLog("count", False, every=3600.0, clock=lambda: now[0], write=lines.append)
    task = log.add_task("Importing", total=10)
    waits = _common.LockWaits(log, task, "Importing", clock=lambda: now[0])
    waits()  # a wait shorter than LOCK_NOTICE_S goes by without a word
    assert lines == []
    now[0] += _common.LOCK_NOTICE_S
    waits()
    assert lines == ["Importing: 0/10 (0%) · waiting for the database lock (1 s)"]
    now[0] += 30
    waits()
    waits.advance()
    waits()
    now[0] += 30
    waits()
    assert len(lines) == 1  # once a run


# ---------------------------------------------------------------------------- row 17

#: Writes to the store as another program would, and leaves its pages in the WAL: no
#: checkpoint, and the connection either kept open ("live") or never closed ("gone").
OTHER_PROGRAM = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint=0")
conn.execute("CREATE TABLE IF NOT EXISTS other_program (x)")
conn.execute("INSERT INTO other_program VALUES (1)")
if sys.argv[2] == "gone":
    os._exit(0)
print("written", flush=True)
sys.stdin.read()
"""

READERS = [
    ["current"], ["sessions"], ["sessions", "--all", "--archived"], ["search", "pod"], ["show", "{sid}"],
    ["lineage", "{sid}"], ["stats"], ["export"], ["export", "--out", "{out}"], ["doctor"],
    ["prune", "--older-than-days", "0", "--dry-run"],
]


def fingerprint(path: Path) -> tuple[bytes, int, bytes | None]:
    wal = Path(f"{path}-wal")
    return path.read_bytes(), path.stat().st_mtime_ns, wal.read_bytes() if wal.exists() else None


@pytest.mark.parametrize("other", ["live", "gone", "none"])
def test_reading_commands_write_nothing(demo_db: Path, tmp_path: Path, other: str) -> None:
    sid = json.loads(cli("--json", "--db", demo_db, "sessions").stdout)["sessions"][0]["id"]
    holder = None
    if other == "live":
        holder = subprocess.Popen([sys.executable, "-c", OTHER_PROGRAM, str(demo_db), "live"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline() == "written\n"
    elif other == "gone":
        subprocess.run([sys.executable, "-c", OTHER_PROGRAM, str(demo_db), "gone"], check=True)
    try:
        if other != "none":
            assert Path(f"{demo_db}-wal").stat().st_size > 0  # the other program's pages, not checkpointed
        (tmp_path / "out").mkdir()
        before = fingerprint(demo_db)
        beside = sorted(p.name for p in demo_db.parent.iterdir())
        for command in READERS:
            argv = [a.format(sid=sid, out=tmp_path / "out" / "export.jsonl") for a in command]
            result = cli("--db", demo_db, *argv)
            assert result.returncode == 0, (argv, result.stderr)
            assert fingerprint(demo_db) == before, f"{argv} wrote to the store or its WAL"
            assert sorted(p.name for p in demo_db.parent.iterdir()) == beside, argv  # nothing new, nothing gone
    finally:
        if holder is not None:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=HANG)


# ---------------------------------------------------------------------- row 14: the query note


@pytest.mark.parametrize("query", ['"unclosed', "a AND", "NOT kubernetes", "(kubernetes"])
def test_a_query_not_understood_as_written_says_how_it_was_read(query: str, tmp_path: Path) -> None:
    """Row 14: before, a malformed query printed only "No messages match" (rc 0); now one
    line says what was not understood, and ``--json`` carries it as ``query_note``."""
    db = tmp_path / "state.db"
    assert run("--db", db, "demo").code == 0
    text = run("--db", db, "search", query)
    assert text.code == 0, text.stderr
    notes = [line for line in text.stdout.splitlines() if line.startswith("Note: ")]
    assert len(notes) == 1 and text.stderr == "", (text.stdout, text.stderr)
    doc = run("--db", db, "--json", "search", query)
    assert doc.code == 0 and doc.stderr == ""
    parsed = json.loads(doc.stdout)
    assert parsed["query_note"] and "\n" not in parsed["query_note"]
    assert notes[0] == f"Note: {parsed['query_note']}"


def test_a_query_used_as_written_has_no_note(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    assert run("--db", db, "demo").code == 0
    text = run("--db", db, "search", "kubernetes")
    assert text.code == 0 and "Note:" not in text.stdout
    parsed = json.loads(run("--db", db, "--json", "search", "kubernetes").stdout)
    assert parsed["query_note"] is None and parsed["count"] >= 1


def test_progress_threads_leave_interrupts_to_the_main_thread() -> None:
    """The kernel hands a process signal to any thread that does not block it; one handed
    to a progress thread would leave the main thread asleep in read(stdin), and the ^C
    would be lost. Threads the CLI starts block SIGINT and SIGTERM; the main thread does not."""
    import signal as signals

    def blocked(native_id: int) -> set[int]:
        status = Path(f"/proc/self/task/{native_id}/status").read_text()
        mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
        return {sig for sig in (signals.SIGINT, signals.SIGTERM) if mask & (1 << (sig - 1))}

    log = _common.ProgressLog("count", False, every=60.0, write=lambda _line: None)
    with log:
        assert log._ticker is not None and log._ticker.native_id is not None
        assert blocked(log._ticker.native_id) == {signals.SIGINT, signals.SIGTERM}
    assert blocked(threading.main_thread().native_id) == set()
