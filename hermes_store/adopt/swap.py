"""One adopter at a time, and a swap that survives a kill at any instruction.

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

**Swap.** ``state.db`` and ``state.db-wal`` are two names, and no single rename moves
both, so the swap is journaled: after the copy is verified and fsynced, a marker
``state.db.adopt-swap`` (fsynced, then renamed into place) names every step's files and
the original's identity (inode, size, mtime). Then:

1. the backup is made as a hard link to the original (a copy where links are not
   supported) — ``state.db`` is untouched;
2. ``state.db-shm`` (a cache of the WAL) is removed and ``state.db-wal`` is renamed to
   ``state.db.pre-adopt.bak-wal`` (to a temp name without a backup);
3. the copy is renamed onto ``state.db`` — **the commit point**;
4. the backups are made 0600 (the hard link is now the original's only name, so its
   mode no longer is the live file's) and the marker is removed.

Only between 2 and 3 does ``state.db`` lack its WAL; the marker says so, and every
open through hermes_store (adopt, ``migrations.upgrade``, ``SessionDB``) first calls
:func:`finish_interrupted`: before the commit point it rolls back (the WAL goes back,
the backup link and copy go away), after it it finishes step 4. A state the marker does
not explain (the original written to meanwhile, ``state.db`` replaced) is never
guessed at: :class:`~hermes_store.errors.AdoptionError` names the files and nothing
moves. An in-process failure uses the same recovery, so there is one code path.

**Leftovers.** Temp files of killed runs (``.state.db.adopting-*``: the copy, its
journal/WAL, a stashed WAL) are removed by the next holder of the lock, after the
marker was dealt with, and never while another adopter holds it.

**Fault hook.** :data:`fault_hook`, when set, is called with the name of each step
(``locked``, ``copied``, ``repairing``, ``verified``, ``fsync_work``,
``fsync_marker``, ``marker``, ``backup``, ``rename_wal``, ``rename_db``,
``fsync_dir``, ``after_swap``, ``cleanup``, ``lock_wait``, ``restore_wal``). Tests set
it in a subprocess to ``os._exit`` or pause at a step; unset it costs one global read.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import errors
from ..locks import holding, try_flock
from ..paths import SIDECARS, fsync_dir, fsync_file, is_read_only

#: Suffix of the backup kept next to the adopted file.
BACKUP_SUFFIX = ".pre-adopt.bak"
LOCK_SUFFIX = ".adopt-lock"
MARKER_SUFFIX = ".adopt-swap"
#: How long a second adopter waits for the first one (seconds).
LOCK_WAIT_S = 600.0
#: Mode of every file adoption creates, backups included.
PRIVATE = 0o600

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


# ------------------------------------------------------------------ swap


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard link (instant, same bytes); a private copy where links are not supported."""
    try:
        os.link(src, dst)
    except OSError:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE)
        with open(fd, "wb") as out, open(src, "rb") as inp:
            while chunk := inp.read(1 << 20):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())


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
        missing = {"work", "work_ino", "orig"} - set(plan)
        if missing:
            raise KeyError(", ".join(sorted(missing)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise errors.AdoptionError(
            f"{marker} (left by an interrupted adoption) cannot be read ({exc}); nothing was changed. "
            f"Check that {p} opens with all its rows, then delete {marker.name}"
        ) from exc
    return plan


def swap_in(p: Path, work: Path, before: list[list[int] | None], *, backup: bool) -> tuple[Path | None, Path | None]:
    """Put the verified, fsynced ``work`` in place of ``p`` (the caller holds the lock).

    Returns (backup, backup WAL) paths. On any failure the same recovery as after a
    kill runs: before the commit point the original comes back as it was.
    """
    folder = p.parent
    wal = Path(f"{p}-wal")
    bak = free_backup_path(p) if backup else None
    wal_to: Path | None = None
    if before[1] is not None:
        wal_to = Path(f"{bak}-wal") if bak else work.with_name(work.name + ".orig-wal")
    plan = {
        "db": p.name,
        "work": work.name,
        "work_ino": os.stat(work).st_ino,
        "backup": bak.name if bak else None,
        "wal_to": wal_to.name if wal_to else None,
        "orig": before[0],
        "orig_wal": before[1],
    }
    _write_marker(p, plan)
    try:
        if bak is not None:
            _link_or_copy(p, bak)
            fsync_dir(folder)
            step("backup")
        if fingerprint(p) != before:
            raise errors.AdoptionError(
                f"{p} was written to by another process during adoption (is Hermes running?); "
                "stop it and adopt again"
            )
        if wal_to is not None:
            with suppress(FileNotFoundError):
                Path(f"{p}-shm").unlink()
            os.replace(wal, wal_to)
            step("rename_wal")
        os.replace(work, p)
        step("rename_db")
        fsync_dir(folder)
        step("fsync_dir")
    except BaseException as exc:
        try:
            _recover(p, plan)
        except Exception as undo:
            raise errors.AdoptionError(
                f"adopting {p} failed ({exc}) and could not be undone ({undo}); the next adopt, upgrade "
                f"or SessionDB open of it finishes from {marker_path(p).name}"
            ) from exc
        raise
    _finish(p, plan)
    return bak, (wal_to if bak else None)


def _finish(p: Path, plan: dict[str, Any]) -> None:
    """After the commit point: backups private, the stashed WAL gone, the marker gone."""
    folder = p.parent
    if plan.get("backup"):
        for name in (plan["backup"], plan.get("wal_to")):
            if name:
                with suppress(FileNotFoundError):
                    os.chmod(folder / name, PRIVATE)
    elif plan.get("wal_to"):
        with suppress(FileNotFoundError):
            (folder / plan["wal_to"]).unlink()
    step("after_swap")
    with suppress(FileNotFoundError):
        marker_path(p).unlink()
    fsync_dir(folder)
    step("cleanup")


def _unexplained(p: Path, plan: dict[str, Any], what: str) -> errors.AdoptionError:
    folder = p.parent
    parts = [f"the adopted copy is {folder / plan['work']}"]
    if plan.get("backup"):
        parts.append(f"the original's backup is {folder / plan['backup']}")
    if plan.get("wal_to"):
        parts.append(f"the original's WAL is {folder / plan['wal_to']}")
    return errors.AdoptionError(
        f"an adoption of {p} was interrupted ({marker_path(p).name}), and {what}; nothing was changed, "
        f"so that no row is lost. {'; '.join(parts)}. Stop every program using it and put the right files "
        f"back by hand, then delete {marker_path(p).name}"
    )


def _recover(p: Path, plan: dict[str, Any]) -> str:
    """Finish (past the commit point) or roll back the swap ``plan`` describes."""
    folder = p.parent
    st = _stat(p)
    if st is not None and st.st_ino == plan["work_ino"]:
        _finish(p, plan)
        return f"finished an interrupted adoption of {p}"
    orig = plan["orig"]
    if st is None:
        raise _unexplained(p, plan, f"{p} is missing")
    if st.st_ino != orig[0]:
        raise _unexplained(p, plan, f"{p} has been replaced by another file")
    # The original is still state.db: roll back.
    wal = Path(f"{p}-wal")
    if plan.get("wal_to") and plan.get("orig_wal"):
        moved = _stat(folder / plan["wal_to"])
        if moved is not None and moved.st_ino == plan["orig_wal"][0]:
            if [st.st_ino, st.st_size, st.st_mtime_ns] != orig:
                raise _unexplained(p, plan, f"{p} was written to without its WAL")
            current = _stat(wal)
            if current is not None and current.st_size > 0:
                raise _unexplained(p, plan, f"{p} was written to without its WAL ({wal.name} is new)")
            # A reader may have created an empty WAL and its index meanwhile: both are
            # caches of nothing, and the original WAL replaces them.
            with suppress(FileNotFoundError):
                Path(f"{p}-shm").unlink()
            os.replace(folder / plan["wal_to"], wal)
            fsync_dir(folder)
            step("restore_wal")
    if plan.get("backup"):
        bak = folder / plan["backup"]
        with suppress(FileNotFoundError):
            bak.unlink()
    remove_db_files(folder / plan["work"])
    with suppress(FileNotFoundError):
        marker_path(p).unlink()
    fsync_dir(folder)
    return f"rolled back an interrupted adoption of {p}; the original was left as it was"


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
