"""Lineage: compression tips, resume targets, roots, compression lineages, ancestors, descendants.

Hermes v23 rules with v26's changes (see repositories/lineage.py for the forward
compression edge, the per-step order, forks and reset children). Every walk is cycle-safe;
ours go up to MAX_DEPTH hops instead of Hermes' 100, so a very long chain is never cut mid-way.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import List, Optional

from sqlalchemy.exc import DBAPIError

from .. import errors
from ..repositories import LineageRepository
from ._host import Host

log = logging.getLogger(__name__)

#: What Hermes' ``except sqlite3.Error`` becomes here: driver errors, raw or typed.
DB_ERRORS = (
    sqlite3.Error,
    DBAPIError,
    errors.DatabaseUnavailableError,
    errors.DatabaseLockedError,
    errors.NotADatabaseError,
    errors.NotMigratedError,
)


class LineageMixin(Host):
    def get_compression_tip(self, session_id: str) -> Optional[str]:
        """The newest continuation of a compressed session; the id itself when there is
        none or the id is unknown (falsy ids come back as given)."""
        if not session_id:
            return session_id
        return self._read(lambda c: LineageRepository(c).compression_tip(session_id))

    def resolve_resume_session_id(self, session_id: str) -> str:
        """Which session a resume of ``session_id`` should open: the deepest session holding
        messages on the most-recent-child path below its compression tip (never a reset
        child, v26), else the tip."""
        if not session_id:
            return session_id
        try:
            return self._read(lambda c: LineageRepository(c).resume_target(session_id))
        except DB_ERRORS as exc:
            # Hermes returns the tip when the walk below it fails.
            log.warning("resume walk from %r failed, using its compression tip: %s", session_id, exc)
            tip = self.get_compression_tip(session_id)  # a str for a truthy id
            return tip if tip is not None else session_id

    def get_conversation_root(self, session_id: str) -> str:
        """First id of the root → session parent chain (every parent link); unknown,
        parentless or empty ids come back as given."""
        if not session_id:
            return session_id
        return self._read(lambda c: LineageRepository(c).conversation_root(session_id))

    def get_compression_lineage(self, session_id: str) -> List[str]:
        """Root-first ids of the compression chain through ``session_id`` ([] when unknown);
        forks (tool runs, branches/delegates of their own parent) are not part of it (v26)."""
        if not session_id:
            return []
        return self._read(lambda c: LineageRepository(c).compression_lineage(session_id))

    def get_session_lineage(self, session_id: str) -> list[str]:
        """Root → … → session → … → compression tip (our own; the CLI's ``lineage``)."""
        return self._read(lambda c: LineageRepository(c).chain(session_id))

    def get_session_ancestors(self, session_id: str) -> list[str]:
        """Root first, ending with the session itself."""
        return self._read(lambda c: LineageRepository(c).ancestors(session_id))

    def get_session_descendants(self, session_id: str) -> list[str]:
        """Every session below this one, nearest first."""
        return self._read(lambda c: LineageRepository(c).descendants(session_id))
