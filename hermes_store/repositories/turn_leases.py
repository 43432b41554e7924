"""Session turn leases (Hermes v25): one live turn per conversation, keyed by the root
reached through parents that ended 'compression' (a compression continuation shares
its parent's lease). SQLAlchemy Core on ``session_turn_leases``; no commits here.

The transcript guard runs inside the append's own transaction: on PostgreSQL the lease
row is read ``FOR SHARE`` so a release or a takeover by another holder waits until the
append has committed; on SQLite the writer lock (BEGIN IMMEDIATE) already serializes
them and SQLAlchemy renders no locking clause.

The lease itself (:class:`TurnLeaseRepository`) is taken as the compression lease is:
one transaction reads the row ``FOR UPDATE``, drops it if it expired or its holder's
process is provably gone (compare-and-delete of the row as read), inserts ours unless
one is there (``ON CONFLICT DO NOTHING``: on PostgreSQL a racing insert waits for the
other transaction, then does nothing) and reads who holds it now.
"""

from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable

from sqlalchemy import Connection, String, bindparam, delete, select, update
from sqlalchemy.sql import Select

from ..dialects import Dialect
from ..errors import CompressionSessionClosedError, SessionTurnLeaseLostError
from ..models import Base
from .base import SESSIONS, Repository, per_dialect
from .lineage import COMPRESSION, parent_chain

LEASES = Base.metadata.tables["session_turn_leases"]
#: Whether a lease holder's process is provably gone (True), given the holder text.
DeadHolder = Callable[[str], bool]

_S = SESSIONS
_SID = bindparam("sid", type_=String)


@functools.cache
def _lease_key_stmt() -> Select[Any]:
    """The farthest ancestor reached through parents that ended 'compression' (the
    session itself when its parent did not, or when it is unknown)."""
    up = parent_chain(_SID, name="lease_up", through_compression=True)
    return select(up.c.id).order_by(up.c.depth.desc()).limit(1)


@functools.cache
def _lease_row_stmt() -> Select[Any, Any]:
    return (
        select(LEASES.c.holder, LEASES.c.expires_at)
        .where(LEASES.c.conversation_id == bindparam("key", type_=String))
        .with_for_update(read=True)
    )


#: The target's end reason, its row locked until the write ends (PostgreSQL): a compression
#: that ends the session waits for the append, or the append sees it ended.
_END_REASON = select(_S.c.end_reason).where(_S.c.id == _SID).with_for_update()


def turn_lease_key(conn: Connection, session_id: str) -> str:
    """The conversation id a session's turn lease is stored under."""
    return conn.execute(_lease_key_stmt(), {"sid": session_id}).scalar() or session_id


def guard_turn_lease(conn: Connection, session_id: str, *, holder: str, ttl_seconds: float, now: float) -> None:
    """Raise SessionTurnLeaseLostError unless ``holder`` owns the session's turn lease;
    an expired lease that is still the holder's is renewed (now + ttl)."""
    key = turn_lease_key(conn, session_id)
    row = conn.execute(_lease_row_stmt(), {"key": key}).first()
    if row is None or row[0] != holder:
        raise SessionTurnLeaseLostError(
            f"Turn lease for session '{session_id}' is no longer held by {holder!r}"
        )
    if row[1] is None or float(row[1]) < now:
        conn.execute(
            update(LEASES).where(LEASES.c.conversation_id == key, LEASES.c.holder == holder)
            .values(expires_at=now + float(ttl_seconds))
        )


def raise_if_closed_by_compression(session_id: str, end_reason: str | None) -> None:
    """The closed-target guard on an end reason the caller has already read."""
    if end_reason == COMPRESSION:
        raise CompressionSessionClosedError(session_id)


def guard_transcript_write(conn: Connection, session_id: str, *, holder: str | None,
                           ttl_seconds: float, now: float) -> None:
    """Both transcript guards, once per write: the turn lease (only with a ``holder``),
    then the target must not have ended 'compression'."""
    if holder is not None:
        guard_turn_lease(conn, session_id, holder=holder, ttl_seconds=ttl_seconds, now=now)
    raise_if_closed_by_compression(session_id, conn.execute(_END_REASON, {"sid": session_id}).scalar())



@per_dialect
def _take_lease(dialect: Dialect) -> Any:
    """Insert a lease unless the conversation has one (whoever holds it keeps it)."""
    return dialect.insert(LEASES).on_conflict_do_nothing(index_elements=[LEASES.c.conversation_id])


class TurnLeaseRepository(Repository):
    """The turn lease of a session's conversation; every method resolves the key itself,
    inside the caller's transaction."""

    def try_acquire(self, session_id: str, holder: str, ttl_seconds: float,
                    dead_holder: DeadHolder | None = None) -> bool:
        """Drop the conversation's lease if it expired (or, with ``dead_holder``, if another
        holder's process is provably gone), insert ours unless one is held, and report
        whether ``holder`` holds it now. Re-entrant; never extends a lease."""
        key = turn_lease_key(self.conn, session_id)
        current = self.now()
        row = self.conn.execute(
            select(LEASES.c.holder, LEASES.c.expires_at).where(LEASES.c.conversation_id == key).with_for_update()
        ).first()
        if row is not None and lease_reclaimable(row, holder, current, dead_holder):
            self.conn.execute(
                delete(LEASES).where(LEASES.c.conversation_id == key, LEASES.c.holder == row[0],
                                     LEASES.c.expires_at == row[1])
            )
        self.conn.execute(
            _take_lease(self.conn),
            {"conversation_id": key, "holder": holder, "acquired_at": current, "expires_at": current + ttl_seconds},
        )
        stored = self.conn.execute(select(LEASES.c.holder).where(LEASES.c.conversation_id == key)).scalar()
        return stored == holder

    def refresh(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        """Push the expiry to now + ttl while the row is still ``holder``'s (expired or not)."""
        key = turn_lease_key(self.conn, session_id)
        return self.conn.execute(
            update(LEASES).where(LEASES.c.conversation_id == key, LEASES.c.holder == holder)
            .values(expires_at=self.now() + ttl_seconds)
        ).rowcount > 0

    def release(self, session_id: str, holder: str) -> int:
        key = turn_lease_key(self.conn, session_id)
        return self.conn.execute(
            delete(LEASES).where(LEASES.c.conversation_id == key, LEASES.c.holder == holder)
        ).rowcount


def lease_reclaimable(row: Any, holder: str, current: float, dead_holder: DeadHolder | None) -> bool:
    """Whether a lease row ``(holder, expires_at)`` may be dropped before taking it
    (turn and compression leases): expired, or another holder whose process
    ``dead_holder`` proves gone."""
    stored, expires = row[0], row[1]
    if expires is None or float(expires) < current:
        return True
    return dead_holder is not None and stored != holder and isinstance(stored, str) and dead_holder(stored)
