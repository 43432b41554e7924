"""The swap leaves no half-done moment (issue 22, point 5).

The original is a Hermes v23 file with 100 messages, 40 of which live only in its
``-wal`` (``wal_autocheckpoint`` off, as a killed Hermes leaves it). A subprocess
adopts it with ``swap.fault_hook`` set to ``os._exit`` after each step of the swap
(every rename and fsync). After each kill a plain ``sqlite3`` open of ``state.db``
itself must see every committed row (it is the complete original or the complete
adopted file, never a file whose rows sit in a moved WAL); a Hermes-style writer
(plain INSERTs) then appends, and the next open (``adopt`` or ``SessionDB``) must
succeed without any repair by hand and keep every row, the writer's included.
"""

from __future__ import annotations

import os
import queue
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest

from hermes_store import SessionDB, errors, migrations
from hermes_store import adopt as adopt_mod

from ..helpers import HERMES_DBS, REPO

KILLED = 77
WAL_ONLY = 40
Rows = frozenset[tuple[Any, ...]]

KILL_SCRIPT = r"""
import os, sys
from hermes_store.adopt import swap
swap.fault_hook = lambda step: os._exit(77) if step == sys.argv[2] else None
from hermes_store import adopt
adopt.adopt(sys.argv[1])
sys.exit(3)  # the step was never reached
"""

# Adopt argv[1]; print every step name the swap announces, and the first time at step
# argv[2] also "paused", then wait for a line on stdin; last "adopted", or the error
# and "refused".
PAUSE_SCRIPT = r"""
import sys
from hermes_store.adopt import swap
from hermes_store import adopt, errors
paused = []
def hook(step):
    print(step, flush=True)
    if step == sys.argv[2] and not paused:
        paused.append(step)
        print("paused", flush=True)
        sys.stdin.readline()
swap.fault_hook = hook
try:
    adopt.adopt(sys.argv[1])
    print("adopted", flush=True)
except errors.AdoptionError as exc:
    print(str(exc).replace("\n", " "), flush=True)
    print("refused", flush=True)
"""

#: Every rename and fsync of the swap, in order (swap.py's module docstring).
SWAP_STEPS = [
    "fsync_work", "fold_wal", "sealed", "fsync_backup", "fsync_marker", "marker",
    "rename_db", "fsync_dir", "rename_backup", "fsync_backup_dir", "cleanup",
]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def messages(p: Path) -> Rows:
    """What a plain sqlite3 open of ``p`` itself sees: every message."""
    conn = sqlite3.connect(p)
    try:
        return frozenset(conn.execute("SELECT id, session_id, role, content FROM messages"))
    finally:
        conn.close()


def _wal_only_source(folder: Path) -> Path:
    """state.db + -wal: 60 messages in the file, 40 more only in the WAL."""
    folder.mkdir(parents=True)
    live = folder / "live.db"
    shutil.copyfile(HERMES_DBS / "hermes_v23.db", live)
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA journal_mode=wal")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO sessions (id, source, started_at) VALUES ('wal_only', 'cli', 2e9)")
    for i in range(WAL_ONLY):
        writer.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('wal_only', 'user', ?, 2e9)",
                       (f"only in the WAL {i}",))
    writer.commit()
    shutil.copyfile(live, folder / "state.db")  # the pair as it is while the writer is open
    shutil.copyfile(f"{live}-wal", folder / "state.db-wal")
    writer.close()
    live.unlink()
    return folder / "state.db"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Rows]:
    p = _wal_only_source(tmp_path_factory.mktemp("src") / "home")
    immutable = sqlite3.connect(f"file:{p}?mode=ro&immutable=1", uri=True)
    try:  # the main file alone really lacks the WAL's rows
        assert immutable.execute("SELECT count(*) FROM messages").fetchone()[0] == 100 - WAL_ONLY
    finally:
        immutable.close()
    look = p.parent.parent / "look"
    look.mkdir()
    shutil.copyfile(p, look / "state.db")
    shutil.copyfile(f"{p}-wal", look / "state.db-wal")
    rows = messages(look / "state.db")
    assert len(rows) == 100
    return p, rows


def place(src: Path, folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copyfile(src, folder / "state.db")
    shutil.copyfile(f"{src}-wal", folder / "state.db-wal")
    return folder / "state.db"


def hermes_writes(p: Path, tag: str, n: int = 10) -> Rows:
    """Plain sqlite3 INSERTs as Hermes makes them (WAL mode); returns what it wrote."""
    conn = sqlite3.connect(p)
    try:
        conn.execute("PRAGMA journal_mode=wal")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, 'cli', 3e9)", (tag,))
        for i in range(n):
            conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', ?, 3e9)",
                         (tag, f"{tag} row {i}"))
        conn.commit()
        return frozenset(conn.execute("SELECT id, session_id, role, content FROM messages WHERE session_id = ?", (tag,)))
    finally:
        conn.close()


def whole(p: Path) -> str:
    """Which complete file ``state.db`` is: the Hermes original or the adopted one."""
    if adopt_mod.needs_adoption(p):
        return "original"
    assert migrations.current(p) == migrations.head()
    return "adopted"


def _open_session_db(p: Path) -> None:
    SessionDB(p).close()


OPENERS: dict[str, Callable[[Path], Any]] = {"adopt": adopt_mod.adopt, "SessionDB": _open_session_db}


def assert_adopted_with(p: Path, want: Rows) -> None:
    assert migrations.current(p) == migrations.head()
    assert messages(p) == want
    listing = sorted(n for n in os.listdir(p.parent) if n not in ("state.db-wal", "state.db-shm"))
    assert listing == ["state.db", "state.db.pre-adopt.bak"]
    backup = p.with_name("state.db.pre-adopt.bak")
    assert os.stat(backup).st_mode & 0o777 == 0o600
    restored = p.parent.parent / "restored"
    restored.mkdir()
    shutil.copyfile(backup, restored / "state.db")  # one file: the backup needs no WAL
    assert not Path(f"{backup}-wal").exists()
    conn = sqlite3.connect(restored / "state.db")
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 23
    finally:
        conn.close()


# -------------------------------------------------------------------- kills


CASES = [(step, opener) for step in SWAP_STEPS for opener in OPENERS]


@pytest.mark.parametrize("step, opener", CASES, ids=[f"{s}-{o}" for s, o in CASES])
def test_a_kill_at_each_step_of_the_swap_leaves_a_whole_file(
    step: str, opener: str, tmp_path: Path, source: tuple[Path, Rows]
) -> None:
    src, rows = source
    p = place(src, tmp_path / "home")
    out = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(p), step], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == KILLED, f"step {step} not reached (rc {out.returncode}):\n{out.stderr}"

    # A plain reader of state.db itself: every committed row, the WAL-only ones too.
    assert messages(p) == rows
    kind = whole(p)
    assert kind == ("adopted" if SWAP_STEPS.index(step) >= SWAP_STEPS.index("rename_db") else "original")
    if SWAP_STEPS.index(step) >= SWAP_STEPS.index("fold_wal"):
        # The original's WAL was folded into it: no committed row in a sidecar.
        assert not Path(f"{p}-wal").exists() or kind == "adopted"

    # Hermes starts in the window and writes; the next open keeps its rows.
    written = hermes_writes(p, "hermes_after_kill")
    OPENERS[opener](p)
    assert_adopted_with(p, rows | written)


def test_a_kill_during_the_finishing_open_is_finished_by_the_next(tmp_path: Path, source: tuple[Path, Rows]) -> None:
    src, rows = source
    p = place(src, tmp_path / "home")
    for step in ("rename_db", "rename_backup"):  # the second run only finishes the first
        out = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(p), step], env=_env(),
                             capture_output=True, text=True, timeout=300)
        assert out.returncode in (KILLED, 0), out.stderr
        assert messages(p) == rows
    adopt_mod.adopt(p)
    assert_adopted_with(p, rows)


# ---------------------------------------------------------------- live writers


class Adopter:
    """A PAUSE_SCRIPT subprocess; its output lines are read on a thread (bounded waits)."""

    def __init__(self, p: Path, pause: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PAUSE_SCRIPT, str(p), pause], env=_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("<eof>")

    def until(self, word: str) -> None:
        while True:
            got = self.lines.get(timeout=300)
            self.seen.append(got)
            if got == word:
                return
            if got == "<eof>":
                raise AssertionError(f"never saw {word!r}: {self.seen}\n{self.proc.stderr.read()}")  # type: ignore[union-attr]

    def resume(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> str:
        self.until("<eof>")
        assert self.proc.wait(timeout=300) == 0, self.proc.stderr.read()  # type: ignore[union-attr]
        return self.seen[-2]


def test_a_write_after_the_copy_is_kept_by_copying_again(tmp_path: Path, source: tuple[Path, Rows]) -> None:
    """Hermes appends between our copy and the swap: the seal notices it under SQLite's
    write lock and adoption copies again, so the rows are in the adopted file."""
    src, rows = source
    p = place(src, tmp_path / "home")
    adopter = Adopter(p, "verified")
    adopter.until("paused")
    written = hermes_writes(p, "hermes_meanwhile")
    adopter.resume()
    assert adopter.finish() == "adopted"
    assert adopter.seen.count("changed") == 1 and adopter.seen.count("copied") == 2
    assert_adopted_with(p, rows | written)


def test_a_connection_held_open_at_the_swap_is_refused_and_nothing_moves(tmp_path: Path, source: tuple[Path, Rows]) -> None:
    """A process with the file open would keep using the old inode and its WAL after
    the rename: adoption refuses, every row stays where it was, and succeeds later."""
    src, rows = source
    p = place(src, tmp_path / "home")
    adopter = Adopter(p, "verified")
    adopter.until("paused")
    hermes = sqlite3.connect(p)
    try:
        hermes.execute("SELECT count(*) FROM sessions").fetchone()  # open, idle
        adopter.resume()
        assert adopter.finish() == "refused"
        assert "in use by another process" in adopter.seen[-3]
        assert whole(p) == "original"
        assert frozenset(hermes.execute("SELECT id, session_id, role, content FROM messages")) == rows
    finally:
        hermes.close()
    assert sorted(n for n in os.listdir(p.parent) if not n.startswith("state.db-")) == ["state.db"]
    adopt_mod.adopt(p)
    assert_adopted_with(p, rows)


def test_a_writer_that_opened_the_old_file_during_the_swap_cannot_lose_its_row(
    tmp_path: Path, source: tuple[Path, Rows]
) -> None:
    """Opened while the original is sealed, it waits for the lock; once the adopted file
    is in place SQLite refuses its write to the replaced file, so nothing is lost unseen."""
    src, rows = source
    p = place(src, tmp_path / "home")
    adopter = Adopter(p, "sealed")
    adopter.until("paused")
    late = sqlite3.connect(p, timeout=60)
    try:
        adopter.resume()
        assert adopter.finish() == "adopted"
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            late.execute("INSERT INTO sessions (id, source, started_at) VALUES ('late', 'cli', 4e9)")
            late.commit()
    finally:
        late.close()
    assert_adopted_with(p, rows)
    written = hermes_writes(p, "hermes_reopened")  # a fresh open writes to the adopted file
    assert messages(p) == rows | written


def test_the_swap_needs_no_hand_repair_after_a_failed_rename(
    tmp_path: Path, source: tuple[Path, Rows], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error at the one rename (in process) leaves the original in place with every
    row, no copy and no marker; the next adopt succeeds."""
    src, rows = source
    p = place(src, tmp_path / "home")
    real = os.replace

    def refuse_db_rename(a: Any, b: Any) -> None:
        if Path(b) == p:
            raise OSError("rename refused")
        real(a, b)

    monkeypatch.setattr(os, "replace", refuse_db_rename)
    with pytest.raises(errors.AdoptionError, match="rename refused"):
        adopt_mod.adopt(p)
    monkeypatch.undo()
    assert whole(p) == "original" and messages(p) == rows
    assert sorted(os.listdir(p.parent)) == ["state.db"]
    adopt_mod.adopt(p)
    assert_adopted_with(p, rows)
