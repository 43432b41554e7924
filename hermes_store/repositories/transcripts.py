"""Transcript files: what Hermes keeps per session beside the database, and their removal.

``<id>.json``, ``<id>.jsonl`` and ``request_dump_<id>_*.json`` in the sessions folder
belong to session ``id``. Deletes queue them on the connection
(:func:`queue_transcript_files`) and they go only once the transaction has committed
(:func:`remove_committed_files`, called by SessionDB and UnitOfWork): a rolled-back
delete must not have taken the files with it.

A leaf: no database access of its own (whether an id is a live session is asked of the
caller), so any room that deletes sessions may import it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable

from sqlalchemy import Connection

DUMP_PREFIX = "request_dump_"
#: Where these warnings were always logged (hosts may have configured that logger).
log = logging.getLogger("hermes_store.repositories.maintenance")


# ---------------------------------------------------------------------- transcript files
#
# A session id comes from the database, and the database from anyone who could write an
# export: it must never become a path. Files are found by listing the folder and
# comparing names, never by joining the id into a path or a glob pattern, and an id that
# could not be a plain file name in that folder is skipped with a warning.


def unsafe_file_id(session_id: Any) -> str | None:
    """Why ``session_id`` cannot name a file inside the sessions folder, or None if it can."""
    if not isinstance(session_id, str) or not session_id:
        return "is not a non-empty string"
    if "\x00" in session_id:
        return "holds a NUL character"
    if any(sep and sep in session_id for sep in ("/", os.sep, os.altsep)):
        return "holds a path separator"
    if session_id in (".", ".."):
        return "is a relative path component"
    if os.path.isabs(session_id) or os.path.splitdrive(session_id)[0]:
        return "is an absolute path"
    try:
        os.fsencode(session_id)
    except UnicodeEncodeError:
        return "cannot be encoded as a file name"
    return None


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return 255


class TranscriptFolder:
    """One listing of the sessions folder, indexed by the session id each file belongs to.

    ``<id>.json`` and ``<id>.jsonl`` belong to ``id``; ``request_dump_<id>_<rest>.json``
    is filed under every prefix of ``<id>_<rest>`` that ends before an underscore, so a
    lookup is exact string equality (no glob, ``*?[`` in ids are plain characters).
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.base = Path(folder)
        self.by_id: dict[str, list[str]] = {}
        self.dump_owners: dict[str, list[str]] = {}  # dump file → every id it could belong to
        self.name_max = 255
        try:
            with os.scandir(self.base) as it:
                entries = [e for e in it if _is_file(e)]
        except OSError:  # no folder (or unreadable): no files to find
            return
        self.name_max = _name_max(self.base)
        for entry in entries:
            name = entry.name
            if name.endswith(".jsonl"):
                self.by_id.setdefault(name[:-6], []).append(name)
            elif name.endswith(".json"):
                self.by_id.setdefault(name[:-5], []).append(name)
                if name.startswith(DUMP_PREFIX):
                    middle = name[len(DUMP_PREFIX):-5]
                    owners = []
                    pos = middle.find("_")
                    while pos > 0:
                        owners.append(middle[:pos])
                        self.by_id.setdefault(middle[:pos], []).append(name)
                        pos = middle.find("_", pos + 1)
                    self.dump_owners[name] = owners

    def files(self, session_id: Any, is_session: Callable[[str], bool] | None = None) -> list[Path]:
        """This session's transcript files, each checked to be an entry of the folder.

        A dump name cannot say where the id ends (``request_dump_a_b_1.json`` may be
        session ``a``'s or ``a_b``'s); given ``is_session``, a dump that could belong to a
        longer id that is a live session is left to that session.
        """
        reason = unsafe_file_id(session_id)
        if reason is None and len(os.fsencode(f"{session_id}.json")) > self.name_max:
            reason = "is too long to be a file name"
        if reason is not None:
            log.warning("transcript files of session %r are left alone: the id %s", session_id, reason)
            return []
        out = []
        for name in dict.fromkeys(self.by_id.get(session_id, ())):
            owners = self.dump_owners.get(name, ())
            if is_session is not None and any(
                len(other) > len(session_id) and is_session(other) for other in owners
            ):
                continue
            path = self.base / name
            # Belt and braces: the name came from listing this folder, so it is one entry.
            if path.parent == self.base and os.path.basename(name) == name:
                out.append(path)
        return out


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def transcript_files(folder: str | Path, session_id: str) -> list[Path]:
    """Files Hermes keeps per session: ``<id>.json``, ``<id>.jsonl``, ``request_dump_<id>_*.json``.

    Only entries of ``folder`` itself; an id that cannot be a file name gets [] (and a
    logged warning), whatever it holds (``..``, ``/``, NUL, glob characters...).
    """
    return TranscriptFolder(folder).files(session_id)


def transcript_files_many(folder: str | Path, session_ids: Iterable[str]) -> dict[str, list[Path]]:
    """:func:`transcript_files` for many sessions with one listing of the folder."""
    listing = TranscriptFolder(folder)
    return {sid: listing.files(sid) for sid in session_ids}


#: ``Connection.info`` key of transcript files waiting for their transaction to commit.
PENDING_FILES = "hermes_store.pending_transcript_files"


def remove_committed_files(conn: Connection, *, committed: bool = True) -> int:
    """After a commit, delete the transcript files the transaction's deletes queued.

    Call with ``committed=False`` after a rollback to forget them instead. Returns how
    many files were removed.
    """
    if conn.invalidated or conn.closed:
        # The DB-API connection (and the queue kept with it) is gone, and its transaction
        # with it; asking for ``info`` would open a new connection just to forget nothing.
        return 0
    queue = conn.info.pop(PENDING_FILES, [])
    removed = 0
    for path in queue if committed else ():
        try:
            path.unlink()  # a symlink is removed itself, never its target
            removed += 1
        except OSError:
            pass  # a file we cannot remove must not undo the committed database work
    return removed


def queue_transcript_files(conn: Connection, session_ids: Iterable[Any], folder: str | Path,
                           is_session: Callable[[str], bool] | None = None) -> None:
    """Queue the transcript files of these (deleted) sessions, only inside ``folder``.

    They are removed by :func:`remove_committed_files` once the caller's transaction
    has committed. Ids that cannot be a file name are skipped with a warning; given
    ``is_session``, a request dump that may belong to another live session is kept
    (see :class:`TranscriptFolder`).
    """
    listing = TranscriptFolder(folder)
    queue = conn.info.setdefault(PENDING_FILES, [])
    for sid in session_ids:
        queue.extend(listing.files(sid, is_session))


__all__ = [
    "DUMP_PREFIX", "PENDING_FILES", "TranscriptFolder", "queue_transcript_files", "remove_committed_files",
    "transcript_files", "transcript_files_many", "unsafe_file_id",
]
