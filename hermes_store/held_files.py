"""Read a database file's own bytes without dropping SQLite's locks.

POSIX record locks belong to the process, not to a descriptor: when the process closes
ANY descriptor of a file, the kernel drops every lock the process holds on it, those
SQLite's connections hold included. A header check that did ``open(path).read(100)``
and closed the file silently unlocked every other connection of the process to that
database: another process then took the file for unused, checkpointed and deleted the
WAL under us, or wrote beside our write transaction. SQLite protects itself from its
own connections by keeping such descriptors open until the last connection to the
file closes; it cannot protect against ours.

So the rule (``tests/test_file_handles.py`` checks it): nothing in hermes_store opens
and closes a database file, its ``-wal``, ``-shm`` or ``-journal``. Most checks ask
SQLite itself (a connection of ours, ``PRAGMA``s, the backup API). The few that need
the raw bytes (classifying a file SQLite refuses, a zeroed file, a byte-for-byte
backup, fsyncing an adopted copy) read through this module: one read-only descriptor
per file (device and inode), opened once and kept open for the life of the process,
like SQLite's own unix VFS does. A descriptor is closed only once its file has no
name left (``st_nlink == 0``): nobody can open such a file any more, so no lock on it
can matter to anyone else.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_guard = threading.Lock()
#: (st_dev, st_ino) -> read-only descriptors of that file, never closed while it has a name.
_held: dict[tuple[int, int], list[int]] = {}

_CHUNK = 1 << 20


def _descriptor(path: str | os.PathLike[str]) -> int:
    """The process's kept descriptor of ``path`` (links followed), opened on first use."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino)
    with _guard:
        _drop_unlinked_locked()
        kept = _held.get(key)
        if kept:
            return kept[0]
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        fst = os.fstat(fd)
        # The path may name another file by now (a rename between stat and open): the
        # descriptor is kept under the file it really opened, never closed here.
        _held.setdefault((fst.st_dev, fst.st_ino), []).append(fd)
        return fd


def _drop_unlinked_locked() -> None:
    for key, fds in list(_held.items()):
        try:
            gone = os.fstat(fds[0]).st_nlink == 0
        except OSError:
            gone = True
        if gone:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            del _held[key]


def read_prefix(path: str | os.PathLike[str], size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer when the file is shorter)."""
    return os.pread(_descriptor(path), size, 0)


def copy_into(src: str | os.PathLike[str], out_fd: int) -> int:
    """Write every byte of ``src`` to the open descriptor ``out_fd``; returns the count.

    The caller owns ``out_fd`` (a new file of its own, so closing it is harmless)."""
    fd = _descriptor(src)
    offset = 0
    while chunk := os.pread(fd, _CHUNK, offset):
        view = memoryview(chunk)
        while view:
            view = view[os.write(out_fd, view):]
        offset += len(chunk)
    return offset


def same_bytes(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two files hold the same bytes (sizes first, then chunk by chunk)."""
    if os.stat(a).st_size != os.stat(b).st_size:
        return False
    fa, fb = _descriptor(a), _descriptor(b)
    offset = 0
    while True:
        x, y = os.pread(fa, _CHUNK, offset), os.pread(fb, _CHUNK, offset)
        if x != y:
            return False
        if not x:
            return True
        offset += len(x)


def fsync(path: str | os.PathLike[str]) -> None:
    """Make ``path``'s data durable (fsync works on a read-only descriptor on Linux)."""
    os.fsync(_descriptor(path))


def held_count() -> int:
    """How many descriptors are kept now (tests and ``doctor`` report it)."""
    with _guard:
        return sum(len(fds) for fds in _held.values())


def is_held(path: str | os.PathLike[str]) -> bool:
    try:
        st = os.stat(Path(path))
    except OSError:
        return False
    with _guard:
        return (st.st_dev, st.st_ino) in _held


__all__ = ["copy_into", "fsync", "held_count", "is_held", "read_prefix", "same_bytes"]
