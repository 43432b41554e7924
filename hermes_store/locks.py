"""One process at a time on a file: an ``flock`` on a lock file next to it.

Used where two of our own processes must not interleave on one database file: adoption
(``state.db.adopt-lock``) and ``hermes-store copy`` into a file (``state.db.copy-lock``).
Not SQLite's locks: those last one transaction, and POSIX record locks vanish when any
other descriptor of the file in the process closes. ``flock`` belongs to the open file
description and the kernel drops it when the holder dies, so a SIGKILLed holder never
blocks the next run. The holder removes the lock file when done; a waiter that locked a
file removed meanwhile notices (the inode at the path changed) and locks the new one.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from collections.abc import Iterator

from . import errors

#: Lock files are private, as the databases they guard.
PRIVATE = 0o600


def try_flock(path: Path, *, error: type[errors.HermesStoreError]) -> int | None:
    """A descriptor holding ``flock`` on the lock file at ``path``, or None when another holds it.

    A folder we may not write is :class:`~hermes_store.errors.ReadOnlyDatabaseError`;
    any other failure to create or lock the file is ``error``.
    """
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE)
        except PermissionError as exc:
            raise errors.ReadOnlyDatabaseError(f"cannot create the lock file {path}: {exc}") from exc
        except OSError as exc:
            raise error(f"cannot create the lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as exc:
            os.close(fd)
            raise error(f"cannot lock {path} ({exc}); is the folder on a filesystem without locks?") from exc
        # The previous holder removes the file when done; we may have locked that
        # removed inode. Only the file still at the path counts.
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        if current is not None and current.st_ino == os.fstat(fd).st_ino:
            return fd
        os.close(fd)


def wait_flock(path: Path, timeout_s: float, *, error: type[errors.HermesStoreError],
               poll_s: float = 0.05) -> int | None:
    """:func:`try_flock`, tried again until ``timeout_s`` has passed; None if still held."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        fd = try_flock(path, error=error)
        if fd is not None or time.monotonic() >= deadline:
            return fd
        time.sleep(poll_s)


def release_flock(path: Path, fd: int) -> None:
    """Remove the lock file, then let go of it (in that order: see the module docstring)."""
    with suppress(OSError):
        path.unlink()
    os.close(fd)


@contextmanager
def holding(path: Path, fd: int) -> Iterator[None]:
    """Release ``fd``'s lock on ``path`` when the block ends, however it ends."""
    try:
        yield
    finally:
        release_flock(path, fd)
