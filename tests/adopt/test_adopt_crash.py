"""Adoption survives a kill at every step, and two adopters never both swap.

The original is a Hermes v23 file whose newest rows live only in its ``-wal`` (as a
running Hermes leaves it). A subprocess adopts it with ``swap.fault_hook`` set to
``os._exit`` at one named step. After the kill, what a plain ``sqlite3`` open would
see is read from a copy of ``state.db`` (+ ``-wal``), so the look itself changes
nothing: it shows every row, whatever the step (the swap is one rename of a whole
file, see test_adopt_swap_kill.py for writers in the window). Then the next open
(``adopt``, ``migrations.upgrade`` or ``SessionDB``) must leave the file adopted with
every row, the backup intact and no temp file behind.
"""

from __future__ import annotations

import fcntl
import os
import queue
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest

from hermes_store import SessionDB, errors, migrations
from hermes_store import adopt as adopt_mod
from hermes_store.adopt import swap as swap_mod

from ..helpers import HERMES_DBS, REPO

KILLED = 77
WAL_MESSAGES = 40
ADOPTED_LISTING = ["state.db", "state.db.pre-adopt.bak"]

# Run in a subprocess: adopt argv[1] (argv[3]: "adopt", "adopt-no-backup" or "upgrade")
# and os._exit at step argv[2].
KILL_SCRIPT = r"""
import os, sys
from hermes_store.adopt import swap
step_name, how = sys.argv[2], sys.argv[3]
def hook(step):
    if step == step_name:
        os._exit(77)
swap.fault_hook = hook
if how in ("adopt", "adopt-no-backup"):
    from hermes_store import adopt
    adopt.adopt(sys.argv[1], backup=how == "adopt")
else:
    from hermes_store import migrations
    migrations.upgrade(sys.argv[1])
sys.exit(3)  # the step was never reached
"""

# Run in a subprocess: adopt (argv[2] == "adopt") or open with SessionDB and append 100
# rows ("session"); pause at step argv[3] until a line arrives on stdin; say when
# waiting for the adoption lock.
RACE_SCRIPT = r"""
import sys
from hermes_store.adopt import swap
path, role, pause = sys.argv[1], sys.argv[2], sys.argv[3]
def hook(step):
    if step == pause:
        print("paused", flush=True)
        sys.stdin.readline()
    elif step == "lock_wait":
        print("waiting", flush=True)
swap.fault_hook = hook
if role == "adopt":
    from hermes_store import adopt
    print("adopted" if adopt.adopt(path).adopted else "noop", flush=True)
else:
    from hermes_store import SessionDB
    db = SessionDB(path)
    db.create_session("from_a", "cli")
    for i in range(100):
        db.append_message("from_a", "user", f"row {i} written by A")
    db.close()
    print("done", flush=True)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# --------------------------------------------------------------------- the original


def visible(p: Path) -> tuple[frozenset[str], frozenset[tuple[Any, ...]]] | None:
    """The sessions and messages a plain sqlite3 open of ``p`` would see right now.

    Read from a copy of the file and its WAL, so looking changes nothing (a real open
    of a half-swapped pair is exactly what must not be needed).
    """
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "look.db"
        if not p.exists():
            return None
        shutil.copyfile(p, copy)
        if Path(f"{p}-wal").exists():
            shutil.copyfile(f"{p}-wal", f"{copy}-wal")
        conn = sqlite3.connect(copy)
        try:
            sessions = frozenset(r[0] for r in conn.execute("SELECT id FROM sessions"))
            messages = frozenset(conn.execute("SELECT id, session_id, role, content FROM messages"))
        finally:
            conn.close()
    return sessions, messages


@pytest.fixture(scope="module")
def wal_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[frozenset[str], frozenset[tuple[Any, ...]]]]:
    """A Hermes v23 state.db with WAL-only rows, and every row it holds."""
    live_dir = tmp_path_factory.mktemp("live")
    live = live_dir / "state.db"
    shutil.copyfile(HERMES_DBS / "hermes_v23.db", live)
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA journal_mode=wal")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO sessions (id, source, started_at) VALUES ('wal_only', 'cli', 2e9)")
    for i in range(WAL_MESSAGES):
        writer.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES ('wal_only', 'user', ?, 2e9)",
            (f"only in the WAL {i}",),
        )
    writer.commit()
    template = tmp_path_factory.mktemp("template")
    shutil.copyfile(live, template / "state.db")
    shutil.copyfile(f"{live}-wal", template / "state.db-wal")
    writer.close()
    rows = visible(template / "state.db")
    assert rows is not None
    main_only = sqlite3.connect(f"file:{template / 'state.db'}?mode=ro&immutable=1", uri=True)
    try:  # the WAL really holds rows the main file lacks
        assert main_only.execute("SELECT count(*) FROM sessions WHERE id = 'wal_only'").fetchone()[0] == 0
    finally:
        main_only.close()
    return template / "state.db", rows


def place_pair(template: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, folder / "state.db")
    shutil.copyfile(f"{template}-wal", folder / "state.db-wal")
    return folder / "state.db"


def kill_at(p: Path, step: str, how: str = "adopt") -> None:
    out = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(p), step, how],
        env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == KILLED, f"step {step} not reached (rc {out.returncode}):\n{out.stderr}"


def _open_session_db(p: Path) -> None:
    SessionDB(p).close()


OPENERS: dict[str, Callable[[Path], Any]] = {
    "adopt": adopt_mod.adopt,
    "upgrade": migrations.upgrade,
    "SessionDB": _open_session_db,
}

STEPS = [
    "locked", "copied", "repairing", "verified", "fsync_work", "fold_wal", "sealed", "fsync_backup",
    "fsync_marker", "marker", "rename_db", "fsync_dir", "rename_backup", "fsync_backup_dir", "cleanup",
]
#: Around the rename every opener is tried; elsewhere one each, in turn.
CRITICAL = {"sealed", "marker", "rename_db"}
#: Steps after the commit point (state.db is the adopted file).
COMMITTED = STEPS[STEPS.index("rename_db"):]
KILL_CASES = [
    (step, opener)
    for i, step in enumerate(STEPS)
    for opener in (OPENERS if step in CRITICAL else [list(OPENERS)[i % len(OPENERS)]])
]


def assert_adopted_with_every_row(p: Path, rows: Any) -> None:
    assert sorted(os.listdir(p.parent)) == ADOPTED_LISTING
    assert visible(p) == rows
    assert migrations.current(p) == migrations.head()
    # The backup alone opens as the original, WAL rows included (its WAL folded in).
    restored = p.parent.parent / "restored"
    restored.mkdir()
    shutil.copyfile(p.with_name("state.db.pre-adopt.bak"), restored / "state.db")
    assert visible(restored / "state.db") == rows
    conn = sqlite3.connect(restored / "state.db")
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 23
    finally:
        conn.close()


@pytest.mark.parametrize("step, opener", KILL_CASES, ids=[f"{s}-{o}" for s, o in KILL_CASES])
def test_kill_at_each_step_loses_nothing(step: str, opener: str, tmp_path: Path, wal_pair: Any) -> None:
    template, rows = wal_pair
    p = place_pair(template, tmp_path / "home")
    kill_at(p, step)

    assert visible(p) == rows, f"after a kill at {step}, state.db hides rows"
    if step in COMMITTED:
        assert migrations.current(p) == migrations.head()  # past the commit point
    else:
        assert adopt_mod.needs_adoption(p)  # the whole original

    OPENERS[opener](p)
    assert_adopted_with_every_row(p, rows)


@pytest.mark.parametrize(
    "first, second",
    [("marker", "rename_db"), ("rename_db", "rename_backup"), ("rename_db", "cleanup")],
)
def test_a_kill_during_recovery_is_recovered_too(first: str, second: str, tmp_path: Path, wal_pair: Any) -> None:
    template, rows = wal_pair
    p = place_pair(template, tmp_path / "home")
    kill_at(p, first)
    kill_at(p, second, how="upgrade")
    assert migrations.upgrade(p) == migrations.head()
    assert_adopted_with_every_row(p, rows)


@pytest.mark.parametrize("step", ["sealed", "marker", "rename_db", "cleanup"])
def test_kill_without_a_backup_loses_nothing(step: str, tmp_path: Path, wal_pair: Any) -> None:
    """Without a backup only the copy moves; before the commit point it goes away, after
    it only the marker is left to remove."""
    template, rows = wal_pair
    p = place_pair(template, tmp_path / "home")
    kill_at(p, step, how="adopt-no-backup")
    assert not [n for n in os.listdir(p.parent) if n.endswith(".bak")]
    assert visible(p) == rows
    adopt_mod.adopt(p, backup=False)
    assert sorted(os.listdir(p.parent)) == ["state.db"]
    assert visible(p) == rows
    assert migrations.current(p) == migrations.head()


@pytest.mark.parametrize("step", ["marker", "rename_db"])
def test_a_write_in_the_window_is_kept_by_every_open(step: str, tmp_path: Path, wal_pair: Any) -> None:
    """Hermes starting in the window writes to whichever whole file state.db is; the
    next open keeps that row, with no repair by hand."""
    template, (sessions, messages) = wal_pair
    p = place_pair(template, tmp_path / "home")
    kill_at(p, step)
    intruder = sqlite3.connect(p)
    intruder.execute("INSERT INTO sessions (id, source, started_at) VALUES ('intruder', 'cli', 3e9)")
    intruder.commit()
    intruder.close()
    assert migrations.upgrade(p) == migrations.head()
    seen = visible(p)
    assert seen is not None and seen[0] == sessions | {"intruder"} and seen[1] == messages
    assert sorted(os.listdir(p.parent)) == ADOPTED_LISTING


def test_an_unreadable_marker_stops_every_open(tmp_path: Path) -> None:
    """A marker that cannot be read is not guessed around: typed error, nothing moves."""
    p = tmp_path / "state.db"
    shutil.copyfile(HERMES_DBS / "hermes_v23.db", p)
    p.with_name("state.db.adopt-swap").write_text('{"work": ')
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    for open_ in OPENERS.values():
        with pytest.raises(errors.AdoptionError, match="cannot be read"):
            open_(p)
        assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before


# ------------------------------------------------------------------ lock and leftovers


def test_leftovers_of_killed_runs_are_cleaned_once_the_lock_is_free(tmp_path: Path) -> None:
    p = tmp_path / "state.db"
    migrations.upgrade(p)
    stray = [tmp_path / ".state.db.adopting-k1ll3d.tmp", tmp_path / ".state.db.adopting-k1ll3d.tmp-journal",
             tmp_path / "state.db.adopt-lock", tmp_path / "state.db.adopt-swap.tmp"]
    for f in stray:
        f.write_bytes(b"left by a killed run")
    other = tmp_path / ".other.db.adopting-x.tmp"  # not ours to remove
    other.write_bytes(b"another database's")

    # While another adopter holds the lock, nothing of it is touched.
    fd = os.open(tmp_path / "state.db.adopt-lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        SessionDB(p).close()
        assert all(f.exists() for f in stray)
    finally:
        os.close(fd)

    SessionDB(p).close()
    assert sorted(os.listdir(tmp_path)) == [".other.db.adopting-x.tmp", "state.db"]


def test_a_held_lock_makes_a_second_adopter_wait_then_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "state.db"
    shutil.copyfile(HERMES_DBS / "hermes_v12.db", p)
    lock = tmp_path / "state.db.adopt-lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    waited: list[str] = []
    monkeypatch.setattr(swap_mod, "LOCK_WAIT_S", 0.3)
    monkeypatch.setattr(swap_mod, "fault_hook", waited.append)
    before = p.read_bytes()
    try:
        with pytest.raises(errors.AdoptionError, match="another process has been adopting"):
            adopt_mod.adopt(p)
    finally:
        os.close(fd)
    assert waited == ["lock_wait"]
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["state.db", "state.db.adopt-lock"]


# ------------------------------------------------------------------ two processes


class Proc:
    """A RACE_SCRIPT subprocess whose output lines are read on a thread (no blocking
    read can hang the test; each wait has a generous safety limit)."""

    def __init__(self, p: Path, role: str, pause: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RACE_SCRIPT, str(p), role, pause],
            env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("<eof>")

    def expect(self, word: str) -> None:
        got = self.lines.get(timeout=300)
        if got != word:
            self.proc.kill()
            raise AssertionError(f"expected {word!r}, got {got!r}; stderr:\n{self.proc.stderr.read()}")  # type: ignore[union-attr]

    def resume(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, word: str) -> None:
        self.expect(word)
        assert self.proc.wait(timeout=300) == 0, self.proc.stderr.read()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "first_role, pause",
    [("adopt", "fsync_work"), ("adopt", "marker"), ("session", "verified")],
)
def test_two_processes_adopt_exactly_once_and_keep_every_write(
    first_role: str, pause: str, tmp_path: Path, wal_pair: Any
) -> None:
    """The first process adopts and is held at ``pause`` (before the swap, or in its
    middle); the second arrives, waits for the lock, and must then find the file
    adopted: one adoption, one backup, and all 100 rows of process A kept."""
    template, (sessions, messages) = wal_pair
    p = place_pair(template, tmp_path / "home")
    second_role = "session" if first_role == "adopt" else "adopt"
    first = Proc(p, first_role, pause)
    first.expect("paused")
    second = Proc(p, second_role, "-")
    second.expect("waiting")
    first.resume()
    first.finish("adopted" if first_role == "adopt" else "done")
    second.finish("noop" if second_role == "adopt" else "done")

    # Adopted exactly once: one backup pair, no temp file. (The adopted file's own
    # -wal/-shm may remain when a reader closed last; they hold committed rows.)
    listing = sorted(n for n in os.listdir(p.parent) if n not in ("state.db-wal", "state.db-shm"))
    assert listing == ADOPTED_LISTING
    seen = visible(p)
    assert seen is not None
    assert seen[0] == sessions | {"from_a"}
    assert messages <= seen[1]
    from_a = sorted(content for _id, sid, _role, content in seen[1] if sid == "from_a")
    assert from_a == sorted(f"row {i} written by A" for i in range(100))
    assert migrations.current(p) == migrations.head()
