"""Gateway repair (Hermes v25-v26): orphaned sessions, never-active keyed sessions, hygiene streaks.

Where Hermes would hand one user's conversation to another or delete more than it
listed, these are stricter: adoption needs the same user on both sides (two empty
users agree, one empty user does not), and the never-active prune decides inside its
own transaction, deleting only routing entries that are the session's own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .. import errors
from ..keys import DAY
from ..codec import check_key
from ..repositories.gateway import DEFAULT_ORPHAN_GAP_S, GatewayRepairRepository
from ._host import Host, transcript_budget

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__: list[str] = []



def _days(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise errors.InvalidInputError(f"{what} must be a number, not {value!r}")
    return float(value)


def _session_key(value: Any) -> Optional[str]:
    if not value:
        return None
    if not isinstance(value, str):
        raise errors.InvalidInputError(f"session_key must be str, not {type(value).__name__}")
    return check_key(value, "session_key")


class OrphansMixin(Host):
    # ------------------------------------------------------------------ hygiene streaks (v26)

    def increment_hygiene_failure_streak(self, session_key: str) -> int:
        """One more failure of the chat's hygiene step; returns the streak (1 for a falsy key,
        nothing stored)."""
        key = _session_key(session_key)
        if key is None:
            return 1
        return self._write(lambda c: GatewayRepairRepository(c).increment_hygiene(key))

    def reset_hygiene_failure_streak(self, session_key: str) -> None:
        """The chat's hygiene step succeeded: its streak starts again from 0."""
        key = _session_key(session_key)
        if key is None:
            return
        self._write(lambda c: GatewayRepairRepository(c).reset_hygiene(key))

    # ------------------------------------------------------------------ never-active keyed sessions (v26)

    def list_never_active_keyed_sessions(self, *, older_than_days: float) -> List[Dict[str, Any]]:
        """Keyed, running sessions older than the cutoff that never did anything (untitled,
        no activity, zero counters, not pinned or archived, no message rows):
        ``{id, session_key, source, chat_id, chat_type, user_id, started_at}``, oldest first."""
        cutoff = self._now() - _days(older_than_days, "older_than_days") * DAY
        return self._read(lambda c: GatewayRepairRepository(c).never_active(cutoff))

    def prune_never_active_keyed_sessions(
        self, *, older_than_days: float, sessions_dir: Optional[Path] = None
    ) -> Tuple[int, int]:
        """Delete what :meth:`list_never_active_keyed_sessions` lists, with the routing
        entries (any scope) that are theirs: ``(sessions_deleted, routing_deleted)``.

        One transaction that decides again what is never-active; an entry goes only when
        its JSON ``session_id`` is the session and its key the session's own, and a
        session still routed to under another key is kept (Hermes deletes every entry
        whose JSON names it, in every scope).
        """
        cutoff = self._now() - _days(older_than_days, "older_than_days") * DAY
        return self._write(lambda c: GatewayRepairRepository(c).prune_never_active(cutoff, sessions_dir),
                           budget=transcript_budget())

    # ------------------------------------------------------------------ orphaned gateway sessions (v25)

    def find_orphaned_gateway_sessions(self, *, max_gap_s: Optional[float] = None) -> List[Dict[str, Any]]:
        """Unkeyed sessions with messages (not tool runs, branches or delegates), each
        with the keyed session it continued: its keyed same-source parent ("lineage"),
        else the one keyed same-source session that went quiet within ``max_gap_s``
        (default 900 s) of its start and before its last activity ("contiguity").

        Records ``{orphan_id, source, message_count, started_at, last_active, donor_id,
        session_key, evidence, adoptable, reason}``. Not adoptable: no donor, several,
        a donor claimed by two orphans, or users that differ (an empty user on one side
        only is not taken as the same user: ours, Hermes takes it).
        """
        gap = DEFAULT_ORPHAN_GAP_S if max_gap_s is None else _days(max_gap_s, "max_gap_s")
        return self._read(lambda c: GatewayRepairRepository(c).orphans(gap))

    def adopt_orphaned_gateway_session(self, orphan_id: str, donor_id: str) -> bool:
        """Move the donor's key to the orphan (routing columns filled where NULL, donor as
        parent) and end the donor ``'superseded_by_repair'``; everything re-checked in
        the transaction (same source and user, donor keyed, orphan unkeyed and without
        another parent). False when anything does not hold."""
        if not isinstance(orphan_id, str) or not isinstance(donor_id, str) or not orphan_id or not donor_id:
            return False
        stamp = self._now()
        return self._write(lambda c: GatewayRepairRepository(c).adopt(orphan_id, donor_id, stamp))
