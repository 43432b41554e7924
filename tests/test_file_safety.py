"""Nothing is written when the answer is an error, and every file we create is 0600.

Each odd path (a dangling or looping symlink, a folder, a FIFO, a read-only file or
folder, a path below a regular file) goes through the three doors that can write:
``SessionDB()``, ``migrations.upgrade()`` and ``adopt()``. Each must raise the typed
error of the table and leave the folder exactly as it was: same names, same bytes,
same mtimes, same modes. Read-only means what the owner asked for: these tests also
run as root (CI does), who could write a 0400 file anyway.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest

from hermes_store import SessionDB, errors, migrations
from hermes_store import adopt as adopt_mod
from hermes_store.adopt import swap as swap_mod

from .helpers import HERMES_DBS

HERMES = HERMES_DBS / "hermes_v23.db"


def tree_state(root: Path) -> dict[str, Any]:
    """Every entry below ``root``: kind, mode, mtime and content hash (links not followed)."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            entry: tuple[Any, ...] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            if stat.S_ISREG(st.st_mode):
                entry += (hashlib.sha256(p.read_bytes()).hexdigest(),)
            elif stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(p),)
            out[str(p.relative_to(root))] = entry
    return out


def _hermes_file(p: Path, mode: int = 0o644) -> None:
    shutil.copyfile(HERMES, p)
    os.chmod(p, mode)


# Each case builds its situation in ``home`` and returns the path handed to the door.


def dangling_symlink(home: Path) -> Path:
    (home / "state.db").symlink_to(home / "gone" / "real.db")
    return home / "state.db"


def dangling_symlink_same_folder(home: Path) -> Path:
    (home / "state.db").symlink_to("real.db")  # would be created right here if followed
    return home / "state.db"


def symlink_loop(home: Path) -> Path:
    (home / "state.db").symlink_to("state.db")
    return home / "state.db"


def directory(home: Path) -> Path:
    (home / "state.db").mkdir()
    (home / "state.db" / "keep.txt").write_text("mine")
    return home / "state.db"


def fifo(home: Path) -> Path:
    os.mkfifo(home / "state.db")
    return home / "state.db"


def read_only_file(home: Path) -> Path:
    _hermes_file(home / "state.db", 0o400)
    return home / "state.db"


def read_only_wal_file(home: Path) -> Path:
    """A Hermes file in WAL mode (as Hermes leaves it), read-only."""
    _hermes_file(home / "state.db")
    conn = sqlite3.connect(home / "state.db")
    conn.execute("PRAGMA journal_mode=wal")
    conn.close()
    os.chmod(home / "state.db", 0o444)
    return home / "state.db"


def read_only_adopted_file(home: Path) -> Path:
    p = home / "state.db"
    migrations.upgrade(p)
    os.chmod(p, 0o400)
    return p


def symlink_to_read_only_file(home: Path) -> Path:
    (home / "data").mkdir()
    _hermes_file(home / "data" / "real.db", 0o400)
    (home / "state.db").symlink_to(home / "data" / "real.db")
    return home / "state.db"


def read_only_folder(home: Path) -> Path:
    (home / "ro").mkdir()
    _hermes_file(home / "ro" / "state.db", 0o644)
    os.chmod(home / "ro", 0o555)
    return home / "ro" / "state.db"


def read_only_folder_new_file(home: Path) -> Path:
    (home / "ro").mkdir()
    os.chmod(home / "ro", 0o555)
    return home / "ro" / "state.db"


def under_regular_file(home: Path) -> Path:
    (home / "notes.txt").write_text("a file, not a folder")
    return home / "notes.txt" / "state.db"


def deep_under_regular_file(home: Path) -> Path:
    (home / "notes.txt").write_text("a file, not a folder")
    return home / "notes.txt" / "sub" / "state.db"


Case = Callable[[Path], Path]

#: case -> expected error for (SessionDB, migrations.upgrade, adopt)
CASES: dict[str, tuple[Case, type[Exception], type[Exception], type[Exception]]] = {
    "dangling_symlink": (dangling_symlink, *[errors.DatabaseUnavailableError] * 3),
    "dangling_symlink_same_folder": (dangling_symlink_same_folder, *[errors.DatabaseUnavailableError] * 3),
    "symlink_loop": (symlink_loop, *[errors.DatabaseUnavailableError] * 3),
    "directory": (directory, *[errors.NotADatabaseError] * 3),
    "fifo": (fifo, *[errors.NotADatabaseError] * 3),
    "read_only_file": (read_only_file, *[errors.ReadOnlyDatabaseError] * 3),
    "read_only_wal_file": (read_only_wal_file, *[errors.ReadOnlyDatabaseError] * 3),
    "read_only_adopted_file": (read_only_adopted_file, *[errors.ReadOnlyDatabaseError] * 3),
    "symlink_to_read_only_file": (symlink_to_read_only_file, *[errors.ReadOnlyDatabaseError] * 3),
    "read_only_folder": (read_only_folder, *[errors.ReadOnlyDatabaseError] * 3),
    # adopt() has nothing to adopt at a missing path.
    "read_only_folder_new_file": (
        read_only_folder_new_file, errors.ReadOnlyDatabaseError, errors.ReadOnlyDatabaseError,
        errors.DatabaseUnavailableError,
    ),
    "under_regular_file": (under_regular_file, *[errors.DatabaseUnavailableError] * 3),
    "deep_under_regular_file": (deep_under_regular_file, *[errors.DatabaseUnavailableError] * 3),
}


def _session_db(p: Path) -> None:
    SessionDB(p).close()


DOORS: dict[str, Callable[[Path], Any]] = {
    "SessionDB": _session_db,
    "upgrade": migrations.upgrade,
    "adopt": adopt_mod.adopt,
}


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("case", list(CASES))
def test_odd_paths_get_a_typed_error_and_nothing_changes(case: str, door: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    make, *expected = CASES[case]
    target = make(home)
    before = tree_state(tmp_path)
    try:
        with pytest.raises(expected[list(DOORS).index(door)]) as info:
            DOORS[door](target)
        assert tree_state(tmp_path) == before
    finally:
        for dirpath, dirnames, _files in os.walk(tmp_path):
            for d in dirnames:
                if not os.path.islink(os.path.join(dirpath, d)):
                    os.chmod(os.path.join(dirpath, d), 0o755)
    # One clear sentence naming the path, typed, never a bare driver/OS error.
    assert isinstance(info.value, errors.HermesStoreError)
    assert str(target.parent.name) in str(info.value) or str(target.name) in str(info.value)


def test_a_symlink_to_a_real_database_is_followed_and_kept(tmp_path: Path) -> None:
    """Documented choice: the link is followed; adoption swaps the target in its own
    folder, so the link keeps pointing at the adopted file."""
    (tmp_path / "data").mkdir()
    real = tmp_path / "data" / "real.db"
    _hermes_file(real, 0o640)
    link = tmp_path / "state.db"
    link.symlink_to(real)
    db = SessionDB(link)
    try:
        db.create_session("through-link", "cli")
    finally:
        db.close()
    assert link.is_symlink() and link.resolve() == real
    assert migrations.current(real) == migrations.head()
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # the original's mode is kept
    assert sorted(os.listdir(tmp_path / "data")) == ["real.db", "real.db.pre-adopt.bak"]
    assert sorted(os.listdir(tmp_path)) == ["data", "state.db"]


def test_read_only_adopted_file_still_reads(tmp_path: Path) -> None:
    """Refused for writing, but asking for its revision works and changes nothing."""
    p = read_only_adopted_file(tmp_path)
    before = tree_state(tmp_path)
    assert migrations.current(p) == migrations.head()
    assert not adopt_mod.needs_adoption(p)
    assert tree_state(tmp_path) == before


# ------------------------------------------------------------------ file modes


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def open_umask() -> Any:
    """A permissive umask, so a 0600 result proves the code asked for it."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_upgrade_creates_a_private_file(tmp_path: Path, open_umask: None) -> None:
    p = tmp_path / "new.db"
    assert migrations.upgrade(p) == migrations.head()
    assert _mode(p) == 0o600


def test_stamp_and_downgrade_create_private_files(tmp_path: Path, open_umask: None) -> None:
    stamped, down = tmp_path / "stamped.db", tmp_path / "down.db"
    migrations.stamp(stamped, "base")
    migrations.downgrade(down, "base")
    assert _mode(stamped) == 0o600 and _mode(down) == 0o600


def test_session_db_creates_a_private_file(tmp_path: Path, open_umask: None) -> None:
    p = tmp_path / "deep" / "er" / "state.db"
    SessionDB(p).close()
    assert _mode(p) == 0o600


@pytest.mark.parametrize("original_mode", [0o644, 0o640, 0o600], ids=lambda m: f"{m:04o}")
def test_adoption_modes(original_mode: int, tmp_path: Path, open_umask: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The adopted file keeps the original's mode; backups, the lock, the marker and
    the copy are 0600 (looked at while adoption runs, through the fault hook)."""
    p = tmp_path / "state.db"
    _hermes_file(p, original_mode)
    conn = sqlite3.connect(p)  # give the original WAL-only rows, to back up with it
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('walrow', 'cli', 1)")
    conn.commit()
    # Keep the WAL: copy the pair aside while the connection is open, then put it back.
    shutil.copyfile(p, tmp_path / "pair.db")
    shutil.copyfile(f"{p}-wal", tmp_path / "pair.db-wal")
    conn.close()
    os.replace(tmp_path / "pair.db", p)
    os.replace(tmp_path / "pair.db-wal", f"{p}-wal")
    os.chmod(p, original_mode)
    os.chmod(f"{p}-wal", original_mode)

    seen: dict[str, dict[str, int]] = {}

    def look(step: str) -> None:
        seen[step] = {f.name: _mode(f) for f in tmp_path.iterdir() if not f.name.startswith("state.db-")}

    monkeypatch.setattr(swap_mod, "fault_hook", look)
    report = adopt_mod.adopt(p)

    assert _mode(p) == original_mode
    assert report.backup_path is not None and report.backup_wal_path is None
    assert _mode(report.backup_path) == 0o600
    assert seen["locked"]["state.db.adopt-lock"] == 0o600
    work = [n for n in seen["copied"] if n.startswith(".state.db.adopting-")]
    assert len(work) == 1 and seen["copied"][work[0]] == 0o600
    assert seen["marker"]["state.db.adopt-swap"] == 0o600
    with sqlite3.connect(p) as check:
        assert check.execute("SELECT count(*) FROM sessions WHERE id = 'walrow'").fetchone()[0] == 1
    check.close()
    assert sorted(os.listdir(tmp_path)) == ["state.db", "state.db.pre-adopt.bak"]


def test_backup_is_a_private_copy_where_hard_links_fail(
    tmp_path: Path, open_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some filesystems have no hard links: the backup is then a 0600 copy, same bytes."""
    p = tmp_path / "state.db"
    _hermes_file(p, 0o644)
    original = p.read_bytes()

    def no_links(*_a: Any, **_k: Any) -> None:
        raise OSError("hard links not supported here")

    monkeypatch.setattr(swap_mod.os, "link", no_links)
    report = adopt_mod.adopt(p)
    assert report.backup_path is not None
    assert report.backup_path.read_bytes() == original
    assert _mode(report.backup_path) == 0o600 and _mode(p) == 0o644
    assert report.backup_path.stat().st_ino != p.stat().st_ino
