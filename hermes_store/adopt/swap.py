"""One adopter at a time, and a swap with no half-done moment.

**Lock.** ``state.db.adopt-lock`` next to the database, held with ``flock`` from before
the fingerprint to after the swap (and during recovery). Not SQLite's own lock on the
original: a SQLite lock lives on the inode that the swap replaces, so it protects
nothing across the rename; taking it needs a read-write open (which a read-only file
refuses and which may create sidecars); and POSIX record locks vanish when any other
descriptor of the same file in the process is closed. ``flock`` is released by the
kernel when the holder dies, so a killed adopter never blocks the next one. The lock
file is created 0600 and removed by its holder; a waiter that locked a file which was
removed meanwhile notices (inode check) and locks the new one. Waiting is bounded
(:data:`LOCK_WAIT_S`), then :class:`~hermes_store.errors.AdoptionError`.

**Seal.** Before the swap, :func:`seal` takes SQLite's write lock on the original and
checks that nothing was written since the copy was taken (else the caller copies
again: a Hermes write in that window is kept, never lost). It then folds the
original's WAL into it and removes ``-wal``/``-shm`` (``journal_mode=DELETE``, which
SQLite only allows while no other connection has the file open, so no process is
left writing to the old inode or sharing its WAL), and holds SQLite's exclusive lock
until the rename is done. A writer that opens the old file meanwhile waits for that
lock, and afterwards SQLite refuses its write (the file was moved), so it cannot
write into a file nobody will read again. No committed row lives in a sidecar, and no
stale ``-wal`` stays beside the new file for the next reader to apply.

**Swap.** ``state.db`` is replaced by ONE rename:

1. the backup is a private (0600) copy of the sealed original, written and fsynced
   under a temp name (``state.db`` is untouched);
2. a marker ``state.db.adopt-swap`` (fsynced, renamed into place) names the files;
3. the verified, fsynced copy is renamed onto ``state.db`` and the folder fsynced —
   **the commit point**: before it ``state.db`` is the complete original, after it
   the complete adopted file;
4. the backup is renamed to ``state.db.pre-adopt.bak`` and the marker removed.

Every open through hermes_store (adopt, ``migrations.upgrade``, ``SessionDB``) first
calls :func:`finish_interrupted`: before the commit point it removes the copy and
the temp backup (the original is in place, with whatever was written to it since),
after it it finishes step 4. Neither side ever needs a repair by hand.

**Leftovers.** Temp files of killed runs (``.state.db.adopting-*``: the copy, its
journal/WAL, a temp backup) are removed by the next holder of the lock, after the
marker was dealt with, and never while another adopter holds it.

**Fault hook.** :data:`fault_hook`, when set, is called with the name of each step
(``locked``, ``copied``, ``repairing``, ``verified``, ``fsync_work``, ``changed``,
``fold_wal``, ``sealed``, ``fsync_backup``, ``fsync_marker``, ``marker``,
``rename_db``, ``fsync_dir``, ``rename_backup``, ``fsync_backup_dir``, ``cleanup``,
``lock_wait``). Tests set it in a subprocess to ``os._exit`` or pause at a step;
unset it costs one global read.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from .. import encryption, errors, held_files
from ..locks import PRIVATE, holding, try_flock
from ..paths import SIDECARS, fsync_dir, fsync_file, is_read_only

#: Suffix of the backup kept next to the adopted file.
BACKUP_SUFFIX = ".pre-adopt.bak"
LOCK_SUFFIX = ".adopt-lock"
MARKER_SUFFIX = ".adopt-swap"
#: How long a second adopter waits for the first one (seconds).
LOCK_WAIT_S = 600.0
#: How long sealing the original waits for a writer of it to finish (SQLite busy timeout, seconds).
SEAL_WAIT_S = 10.0
#: Mode of every file adoption creates, backups included: ``locks.PRIVATE``, imported above.

#: Test hook: ``fault_hook(step_name)`` at each named step (see the module docstring).
fault_hook: Callable[[str], None] | None = None


def step(name: str) -> None:
    """Announce a step to :data:`fault_hook` (a no-op unless a test set it)."""
    hook = fault_hook
    if hook is not None:
        hook(name)


# ------------------------------------------------------------------ names


def lock_path(p: Path) -> Path:
    return p.with_name(p.name + LOCK_SUFFIX)


def marker_path(p: Path) -> Path:
    return p.with_name(p.name + MARKER_SUFFIX)


def _work_prefix(p: Path) -> str:
    return f".{p.name}.adopting-"


def new_work_file(p: Path) -> Path:
    """The private (0600) copy's file, next to the original so the swap is a rename."""
    fd, name = tempfile.mkstemp(prefix=_work_prefix(p), suffix=".tmp", dir=p.parent)
    os.close(fd)
    return Path(name)


def free_backup_path(p: Path) -> Path:
    """``state.db.pre-adopt.bak``; never overwrite an earlier backup (``.1.bak``, …)."""
    candidate = p.with_name(p.name + BACKUP_SUFFIX)
    n = 1
    while os.path.lexists(candidate) or os.path.lexists(f"{candidate}-wal"):
        candidate = p.with_name(f"{p.name}.pre-adopt.{n}.bak")
        n += 1
    return candidate


def remove_db_files(p: Path) -> None:
    for f in (p, *(Path(f"{p}{s}") for s in SIDECARS)):
        with suppress(FileNotFoundError):
            f.unlink()


def _stat(p: Path) -> os.stat_result | None:
    try:
        return os.stat(p, follow_symlinks=False)
    except FileNotFoundError:
        return None


def fingerprint(p: Path) -> list[list[int] | None]:
    """Identity of the original and its WAL (inode, size, mtime), to notice a writer."""
    out: list[list[int] | None] = []
    for f in (p, Path(f"{p}-wal")):
        st = _stat(f)
        out.append(None if st is None else [st.st_ino, st.st_size, st.st_mtime_ns])
    return out


def _leftovers(p: Path) -> list[Path]:
    """Temp files of killed adoptions of ``p`` (ours only: our prefix and names)."""
    prefix, marker_tmp = _work_prefix(p), marker_path(p).name + ".tmp"
    try:
        names = os.listdir(p.parent)
    except OSError:
        return []
    return [p.parent / n for n in names if n.startswith(prefix) or n == marker_tmp]


# ------------------------------------------------------------------ lock


def _try_lock(path: Path) -> int | None:
    """A descriptor holding ``flock`` on the current lock file, or None when busy."""
    return try_flock(path, error=errors.AdoptionError)


@contextmanager
def adoption_lock(p: Path, *, wait: float | None = None) -> Iterator[bool]:
    """Hold the adoption lock of ``p``; yields False only when ``wait == 0`` and busy.

    Waits up to ``wait`` seconds (default :data:`LOCK_WAIT_S`), then raises
    :class:`~hermes_store.errors.AdoptionError`.
    """
    path = lock_path(p)
    limit = LOCK_WAIT_S if wait is None else wait
    deadline = time.monotonic() + limit
    announced = False
    fd = _try_lock(path)
    while fd is None:
        if limit == 0:
            yield False
            return
        if time.monotonic() >= deadline:
            raise errors.AdoptionError(
                f"another process has been adopting {p} for over {limit:.0f} s (it holds {path.name}); "
                "left unchanged, try again when it is done"
            )
        if not announced:
            announced = True
            step("lock_wait")
        time.sleep(0.05)
        fd = _try_lock(path)
    with holding(path, fd):
        yield True


# ------------------------------------------------------------------ seal


def _unchanged_since(p: Path, before: list[list[int] | None]) -> bool:
    """The original and its WAL are as ``before`` found them; a WAL our own open just
    created (empty) is no change."""
    now = fingerprint(p)
    if now[0] != before[0]:
        return False
    return now[1] == before[1] or (before[1] is None and now[1] is not None and now[1][1] == 0)


def _busy(p: Path, exc: BaseException) -> errors.AdoptionError:
    return errors.AdoptionError(
        f"{p} is in use by another process (is Hermes running?): {exc}. Stop it and adopt again; "
        "nothing was adopted and no row was changed"
    )


def _seal_errors() -> tuple[type[BaseException], ...]:
    return (sqlite3.Error, *encryption.driver_errors())


def _plain_connect(p: Path, timeout: float) -> Any:
    return sqlite3.connect(p, isolation_level=None, timeout=timeout)


def seal(p: Path, before: list[list[int] | None],
         connect: Callable[[Path, float], Any] = _plain_connect) -> Any | None:
    """Lock the original for the swap; None when it was written to since ``before``.

    The returned connection holds SQLite's exclusive lock on the original, whose WAL
    has been folded into it (no ``-wal``/``-shm`` left); closing it releases the lock.
    A writer still at work is waited for (:data:`SEAL_WAIT_S`); another connection
    holding the file open is refused with :class:`~hermes_store.errors.AdoptionError`.
    ``connect(path, timeout)`` opens it (an encrypted file's: with its key, autocommit).
    """
    conn = connect(p, SEAL_WAIT_S)
    try:
        conn.execute("BEGIN IMMEDIATE")  # writers wait from here on
        unchanged = _unchanged_since(p, before)
        seen = conn.execute("PRAGMA data_version").fetchone()[0]
        conn.execute("COMMIT")
        if unchanged and conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
            if mode != "delete":
                raise sqlite3.OperationalError(f"its WAL could not be folded in (journal mode stays {mode})")
            step("fold_wal")
        if unchanged:
            conn.execute("BEGIN EXCLUSIVE")
            # Another connection committing between the two locks shows here.
            unchanged = conn.execute("PRAGMA data_version").fetchone()[0] == seen
    except _seal_errors() as exc:
        conn.close()
        raise _busy(p, exc) from exc
    except BaseException:
        conn.close()
        raise
    if not unchanged:
        conn.close()
        step("changed")
        return None
    step("sealed")
    return conn


# ------------------------------------------------------------------ swap


def _private_copy(src: Path, dst: Path) -> None:
    """``dst`` as a 0600 copy of ``src``, fsynced.

    ``src`` is the sealed original, whose exclusive lock a connection of ours holds
    until the rename: it is read through the process's kept descriptor
    (:mod:`hermes_store.held_files`), since closing a descriptor of our own would
    drop that lock and let a writer in before the swap."""
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE)
    try:
        held_files.copy_into(src, fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_marker(p: Path, plan: dict[str, Any]) -> None:
    """Write the marker whole or not at all: a temp file, fsync, rename, fsync the folder."""
    marker = marker_path(p)
    tmp = marker.with_name(marker.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE)
    try:
        with open(fd, "w", encoding="utf-8") as fh:
            json.dump(plan, fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with suppress(OSError):
            tmp.unlink()
        raise
    step("fsync_marker")
    os.replace(tmp, marker)
    fsync_dir(p.parent)
    step("marker")


def _read_marker(p: Path) -> dict[str, Any]:
    marker = marker_path(p)
    try:
        plan = json.loads(marker.read_text(encoding="utf-8"))
        missing = {"work", "work_ino"} - set(plan)
        if missing:
            raise KeyError(", ".join(sorted(missing)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise errors.AdoptionError(
            f"{marker} (left by an interrupted adoption) cannot be read ({exc}); nothing was changed. "
            f"Check that {p} opens with all its rows, then delete {marker.name}"
        ) from exc
    if plan.get("wal_to"):
        # Written by an older hermes_store, whose swap moved the WAL aside.
        raise errors.AdoptionError(
            f"{marker} was left by an older hermes_store whose swap moved {p.name}-wal to {plan['wal_to']}; "
            f"nothing was changed. Stop every program using {p}, finish it with that version, or put "
            f"{plan['wal_to']} back as {p.name}-wal and delete {marker.name}"
        )
    return plan


def swap_in(p: Path, work: Path, sealed: Any, *, backup: bool) -> Path | None:
    """Put the verified, fsynced ``work`` in place of the sealed ``p`` with one rename.

    The caller holds the adoption lock; ``sealed`` (from :func:`seal`) is closed here,
    once ``state.db`` is the new file. Returns the backup's path. On any failure the
    same recovery as after a kill runs: before the commit point the original stays.
    """
    folder = p.parent
    bak = free_backup_path(p) if backup else None
    plan: dict[str, Any] = {
        "db": p.name,
        "work": work.name,
        "work_ino": os.stat(work).st_ino,
        "backup": bak.name if bak else None,
        "backup_tmp": f"{work.name}.bak" if bak else None,
    }
    try:
        try:
            if bak is not None:
                _private_copy(p, folder / plan["backup_tmp"])
                step("fsync_backup")
            _write_marker(p, plan)
            os.replace(work, p)
            step("rename_db")
            fsync_dir(folder)
            step("fsync_dir")
        finally:
            sealed.close()
    except BaseException as exc:
        try:
            _recover(p, plan)
        except Exception as undo:
            raise errors.AdoptionError(
                f"adopting {p} failed ({exc}) and could not be tidied up ({undo}); the next adopt, upgrade "
                f"or SessionDB open of it finishes from {marker_path(p).name}"
            ) from exc
        raise
    _finish(p, plan)
    return bak


def _finish(p: Path, plan: dict[str, Any]) -> None:
    """After the commit point: the backup under its name, the marker gone."""
    folder = p.parent
    if plan.get("backup_tmp") and os.path.lexists(folder / plan["backup_tmp"]):
        os.replace(folder / plan["backup_tmp"], folder / plan["backup"])
        step("rename_backup")
        fsync_dir(folder)
        step("fsync_backup_dir")
    with suppress(FileNotFoundError):
        marker_path(p).unlink()
    fsync_dir(folder)
    step("cleanup")


def _recover(p: Path, plan: dict[str, Any]) -> str:
    """Finish (past the commit point) or roll back the swap ``plan`` describes."""
    folder = p.parent
    st = _stat(p)
    if st is not None and st.st_ino == plan["work_ino"]:
        _finish(p, plan)
        return f"finished an interrupted adoption of {p}"
    # The copy never took the original's place: the original (and whatever was
    # written to it since) stays; the copy and the temp backup go.
    remove_db_files(folder / plan["work"])
    if plan.get("backup_tmp"):
        with suppress(FileNotFoundError):
            (folder / plan["backup_tmp"]).unlink()
    with suppress(FileNotFoundError):
        marker_path(p).unlink()
    fsync_dir(folder)
    return f"rolled back an interrupted adoption of {p}; the original was left in place"


# ------------------------------------------------------------------ recovery


def recover_locked(p: Path) -> str | None:
    """With the lock held: deal with a marker, then remove leftovers of killed runs."""
    message = None
    if os.path.lexists(marker_path(p)):
        message = _recover(p, _read_marker(p))
    for f in _leftovers(p):
        with suppress(FileNotFoundError):
            f.unlink()
    return message


def finish_interrupted(p: Path) -> str | None:
    """Before any open of ``p``: finish or roll back an interrupted adoption and
    remove the temp files of killed ones. Returns what it did, None if nothing.

    Cheap when nothing is pending (a ``stat`` and one folder listing). A pending swap
    waits for the lock; mere leftovers are only cleaned when no adopter holds it.
    """
    folder = p.parent
    if not folder.is_dir():
        return None
    has_marker = os.path.lexists(marker_path(p))
    if not has_marker and not os.path.lexists(lock_path(p)) and not _leftovers(p):
        return None
    if is_read_only(folder):
        if has_marker:
            raise errors.ReadOnlyDatabaseError(
                f"an adoption of {p} was interrupted ({marker_path(p).name}) and its folder is now read-only; "
                "make the folder writable so it can be finished"
            )
        return None
    with adoption_lock(p, wait=None if has_marker else 0) as held:
        if not held:
            return None
        return recover_locked(p)


def restore_mode(work: Path, p: Path) -> None:
    """The adopted file keeps the original's permission bits."""
    with suppress(OSError):
        os.chmod(work, stat.S_IMODE(p.stat().st_mode))
    fsync_file(work)
