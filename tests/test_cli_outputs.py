"""No command writes over a store (issue 29, point 4).

``export --out``, ``import FILE`` and ``copy --to`` refuse a path that is the store
itself or one of its files, however it is named: the same path, a relative path, a
symbolic link, a hard link, its ``-wal``/``-shm``/``-journal``, or the default database
of ``$HERMES_HOME``. A refusal exits 1 with one line and touches nothing (every file of
the folder byte for byte, time stamps too), and the store still opens with every row.
Outputs are written to a temporary file, fsynced and renamed: an export killed
mid-write leaves the older output whole, and the next run removes its leftover.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_store import SessionDB

from .test_cli import Run, one_line_error, run

SESSIONS, MESSAGES = 6, 26  # what demo writes

#: How the store is named on the command line: (name, sidecar files left by a killed writer).
WAYS = ["same", "relative", "symlink", "hardlink", "wal", "shm", "journal", "default", "live-wal", "live-shm"]
COMMANDS = ["export", "import", "copy"]


def folder_state(folder: Path) -> dict[str, Any]:
    """Every entry of ``folder``: its content hash (a link: its target), size and mtime.
    Read only while this process holds no connection to any of them."""
    found: dict[str, Any] = {}
    for entry in sorted(folder.iterdir()):
        st = entry.lstat()
        if entry.is_symlink():
            found[entry.name] = ("link", os.readlink(entry), st.st_mtime_ns)
        elif entry.is_dir():
            found[entry.name] = ("folder", sorted(p.name for p in entry.iterdir()), st.st_mtime_ns)
        else:
            found[entry.name] = (hashlib.sha256(entry.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns)
    return found


def demo_store(folder: Path) -> Path:
    db = folder / "state.db"
    assert run("--db", db, "demo").code == 0
    return db


def leave_a_live_wal(db: Path) -> None:
    """A writer killed with committed pages still in the WAL: -wal and -shm stay behind."""
    code = ("import os, sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0')\n"
            "c.execute(\"INSERT INTO state_meta (key, value) VALUES ('test.live_wal', '1')\")\n"
            "os.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True)
    assert done.returncode == -signal.SIGKILL
    assert Path(f"{db}-wal").stat().st_size > 0 and Path(f"{db}-shm").exists()


def name_the_store(way: str, db: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], str, dict[str, str] | None]:
    """(global options, the path naming the store, environment) for one way of naming it."""
    folder = db.parent
    args = ["--db", str(db)]
    if way == "same":
        return args, str(db), None
    if way == "relative":
        monkeypatch.chdir(folder / "sub")
        return args, os.path.join("..", "sub", "..", db.name), None
    if way == "symlink":
        (folder / "link.db").symlink_to(db.name)
        return args, str(folder / "link.db"), None
    if way == "hardlink":
        os.link(db, folder / "hard.db")
        return args, str(folder / "hard.db"), None
    if way in ("wal", "shm", "journal"):
        return args, f"{db}-{way}", None
    if way.startswith("live-"):
        leave_a_live_wal(db)
        return args, f"{db}-{way[5:]}", None
    assert way == "default"
    return [], str(db), {"HERMES_HOME": str(folder)}


def command(cmd: str, path: str) -> list[str]:
    return {"export": ["export", "--out", path], "import": ["import", path], "copy": ["copy", "--to", path]}[cmd]


def still_whole(db: Path) -> None:
    store = SessionDB(db)
    try:
        assert (store.session_count(), store.message_count()) == (SESSIONS, MESSAGES)
    finally:
        store.close()


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("cmd", COMMANDS)
def test_a_command_never_writes_over_the_store(cmd: str, way: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    db = demo_store(tmp_path)
    args, path, env = name_the_store(way, db, monkeypatch)
    before = folder_state(tmp_path)
    line = one_line_error(run(*args, *command(cmd, path), env=env), 1)
    assert "database" in line, line
    assert folder_state(tmp_path) == before  # nothing written, created or even touched
    still_whole(db)


@pytest.mark.parametrize("cmd", ["export", "import"])
def test_the_json_refusal_names_its_code(cmd: str, tmp_path: Path) -> None:
    db = demo_store(tmp_path)
    before = folder_state(tmp_path)
    result = run("--db", db, "--json", *command(cmd, f"{db}-wal"))
    assert result.code == 1 and result.stdout == ""
    assert '"code": "output_is_store"' in result.stderr and len(result.stderr.splitlines()) == 1
    assert folder_state(tmp_path) == before


# ------------------------------------------------------------------ the happy paths


def test_export_replaces_an_older_output_whole_and_import_reads_it(tmp_path: Path) -> None:
    db = demo_store(tmp_path)
    out = tmp_path / "out.jsonl"
    out.write_text("older\n")
    out.chmod(0o644)
    assert run("--db", db, "export", "--out", out).code == 0
    lines = out.read_text().splitlines()
    assert len(lines) == SESSIONS and all(line.startswith("{") for line in lines)
    assert out.stat().st_mode & 0o777 == 0o600  # it holds the conversations
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "state.db"]  # no temporary file left
    other = tmp_path / "other.db"
    result = run("--db", other, "--json", "import", out)
    assert result.code == 0 and result.json()["imported"] == SESSIONS
    assert run("--db", db, "copy", "--to", tmp_path / "copy.db").code == 0
    assert run("--db", db, "import", "-", input=out.read_bytes()).code == 0  # stdin is no store file


def test_a_missing_import_file_is_still_a_bad_argument(tmp_path: Path) -> None:
    db = demo_store(tmp_path)
    assert "does not exist" in one_line_error(run("--db", db, "import", tmp_path / "nope.jsonl"), 2)


# ------------------------------------------------------------------ a kill mid-write

#: Runs the command line with export stopped for good before its 5th session (so the
#: temporary file holds four sessions' lines, most of them flushed), after saying so.
KILLED_EXPORT = """
import sys, threading
from pathlib import Path
from hermes_store.cli import main, transfer

ready, argv = Path(sys.argv[1]), sys.argv[2:]
line, seen = transfer.jsonl_line, []

def stopping(record):
    seen.append(record)
    if len(seen) == 5:
        ready.write_text("writing")
        threading.Event().wait()  # until SIGKILL
    return line(record)

transfer.jsonl_line = stopping
sys.exit(main(argv))
"""


def test_a_killed_export_leaves_the_older_output_whole(tmp_path: Path) -> None:
    db = demo_store(tmp_path)
    out = tmp_path / "out.jsonl"
    assert run("--db", db, "export", "--out", out).code == 0
    older = out.read_bytes()
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_EXPORT, str(ready), "--db", str(db), "export", "--out",
                             str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not ready.exists():  # not a timing assertion: waits for the export to say it is writing
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.01)
        leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out.jsonl.") and p.name.endswith(".tmp")]
        assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # it was writing
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert out.read_bytes() == older  # the older output, whole
    assert leftovers[0].exists()
    # The next run to the same output removes the dead run's leftover and writes its own.
    ready.unlink()
    assert run("--db", db, "export", "--out", out).code == 0
    assert out.read_bytes() == older
    # The -wal/-shm files the killed reader's SQLite made may stay: the next reader opens the
    # store read-only, and leaves sidecars it did not create to SQLite (issue 30, row 17).
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("state.db-wal", "state.db-shm")) == \
        ["out.jsonl", "state.db"]
    still_whole(db)


def test_a_running_exports_temporary_file_is_left_alone(tmp_path: Path) -> None:
    """Only a dead run's leftover goes: one of a live process (this one's parent) stays."""
    db = demo_store(tmp_path)
    live = tmp_path / f".out.jsonl.{os.getppid()}.abc.tmp"
    live.write_text("another export, still running\n")
    result: Run = run("--db", db, "export", "--out", tmp_path / "out.jsonl")
    assert result.code == 0 and live.read_text() == "another export, still running\n"
