"""Compression guards: the per-session compression lease, failure cooldowns, the
fallback streak and anti-thrash count (Hermes v23-v26), and the publication of a
compression child (v26). SQLAlchemy Core on the model tables; the one upsert is the
dialect's own insert construct (``INSERT … ON CONFLICT DO NOTHING`` on both SQLite and
PostgreSQL).

The lease is correct under concurrency on both backends because each acquire is one
transaction: on SQLite the writer lock (BEGIN IMMEDIATE) serializes acquirers; on
PostgreSQL (READ COMMITTED) the primary key does, as a racing INSERT waits for the
other transaction and then does nothing, and the final SELECT sees whoever committed.
Every removal of someone else's lease is a compare-and-delete of the row exactly as it
was read (holder and expiry), so a refresh that landed in between wins.

Publication and the orphan reopen lock the parent's lease row, then the parent's row
(``FOR UPDATE``, in that order in both; SQLite's writer lock serializes them anyway), so
on PostgreSQL the two never interleave and never deadlock.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy import delete, insert, literal, select, update

from .. import errors
from ..codec import parse_tool_calls, tool_call_increment
from ..dialects import Dialect
from ..models import Base
from .base import MESSAGES, SESSIONS, Repository, per_dialect
from .lineage import COMPRESSION, is_fork
from .sessions import INHERITED, INHERITED_BY_CONTINUATION, SessionRepository
from .turn_leases import DeadHolder, lease_reclaimable

LOCKS = Base.metadata.tables["compression_locks"]
_S = SESSIONS.c
_M = MESSAGES.c
#: Copied from the parent onto a published child: workspace, git and gateway routing.
CHILD_INHERITS = ("profile_name", *INHERITED, *INHERITED_BY_CONTINUATION)
#: Message columns a watermark clone leaves to the database or sets itself.
_NOT_CLONED = frozenset({"id", "session_id", "active", "compacted"})


class PublicationError(errors.HermesStoreError, RuntimeError):
    """A compression child cannot be published (Hermes raises RuntimeError): the parent
    is missing or already ended, the child id is taken, or there is nothing to publish."""


@per_dialect
def _take_lease(dialect: Dialect) -> Any:
    """Insert a lease unless the session has one (whoever holds it keeps it)."""
    return dialect.insert(LOCKS).on_conflict_do_nothing(index_elements=[LOCKS.c.session_id])


class CompressionRepository(Repository):
    # ------------------------------------------------------------- failure cooldown

    def record_cooldown(self, session_id: str, cooldown_until: float | None, error: str | None) -> int:
        return self.conn.execute(
            update(SESSIONS).where(SESSIONS.c.id == session_id).values(
                compression_failure_cooldown_until=cooldown_until, compression_failure_error=error,
            )
        ).rowcount

    def cooldown(self, session_id: str) -> dict[str, Any] | None:
        """``{cooldown_until, remaining_seconds, error}`` while the cooldown lies ahead, else None."""
        row = self.conn.execute(
            select(SESSIONS.c.compression_failure_cooldown_until, SESSIONS.c.compression_failure_error)
            .where(SESSIONS.c.id == session_id)
        ).first()
        if row is None or row[0] is None:
            return None
        try:
            until = float(row[0])
        except (TypeError, ValueError):  # a hand-written junk value in a SQLite file
            return None
        current = self.now()
        if until <= current:
            return None
        return {"cooldown_until": until, "remaining_seconds": until - current, "error": row[1]}

    def clear_cooldown(self, session_id: str) -> int:
        return self.record_cooldown(session_id, None, None)

    # ------------------------------------------------------------- fallback streak

    def fallback_streak(self, session_id: str) -> Any:
        """The stored value as it is (None for an unknown id)."""
        return self.conn.execute(
            select(SESSIONS.c.compression_fallback_streak).where(SESSIONS.c.id == session_id)
        ).scalar()

    def set_fallback_streak(self, session_id: str, streak: int) -> int:
        return self.conn.execute(
            update(SESSIONS).where(SESSIONS.c.id == session_id).values(compression_fallback_streak=streak)
        ).rowcount

    # ------------------------------------------------------------- anti-thrash count (v24)

    def ineffective_count(self, session_id: str) -> Any:
        """The stored value as it is (None for an unknown id)."""
        return self.conn.execute(
            select(SESSIONS.c.compression_ineffective_count).where(SESSIONS.c.id == session_id)
        ).scalar()

    def set_ineffective_count(self, session_id: str, count: int) -> int:
        return self.conn.execute(
            update(SESSIONS).where(SESSIONS.c.id == session_id).values(compression_ineffective_count=count)
        ).rowcount

    # ------------------------------------------------------------- cooldown snapshots (v26)

    def cooldown_row(self, session_id: str) -> dict[str, Any]:
        """``{session_exists, cooldown_until, error}`` as stored, expired or not."""
        row = self.conn.execute(
            select(_S.compression_failure_cooldown_until, _S.compression_failure_error).where(_S.id == session_id)
        ).first()
        if row is None:
            return {"session_exists": False, "cooldown_until": None, "error": None}
        return {"session_exists": True, "cooldown_until": row[0], "error": row[1]}

    def restore_cooldown_row(self, session_id: str, cooldown_until: float | None, error: str | None) -> None:
        """Put both cooldown columns back and read them again in the same transaction;
        a missing row or a different read-back raises (the transaction is rolled back)."""
        if not self.record_cooldown(session_id, cooldown_until, error):
            raise PublicationError(f"cannot restore the compression cooldown of {session_id!r}: no such session")
        back = self.cooldown_row(session_id)
        stored = back["cooldown_until"]
        same_time = (stored is None) == (cooldown_until is None) and (
            stored is None or float(stored) == float(cooldown_until))  # type: ignore[arg-type]
        if not same_time or back["error"] != error:
            raise PublicationError(
                f"compression cooldown of {session_id!r} did not read back as restored: "
                f"{back!r} != {{'cooldown_until': {cooldown_until!r}, 'error': {error!r}}}"
            )

    # ------------------------------------------------------------- compression lease

    def try_acquire_lock(self, session_id: str, holder: str, ttl_seconds: float,
                         dead_holder: DeadHolder | None = None) -> bool:
        """Drop this session's lease if it expired (or, with ``dead_holder``, if another
        holder's process is provably gone), insert ours unless one is held, and report
        whether the stored holder is now ``holder``. Re-entrant; never extends a lease."""
        current = self.now()
        expires = current + ttl_seconds
        row = self._lease(session_id)
        if row is not None and lease_reclaimable(row, holder, current, dead_holder):
            self._drop_as_read(session_id, row)
        self.conn.execute(
            _take_lease(self.conn),
            {"session_id": session_id, "holder": holder, "acquired_at": current, "expires_at": expires},
        )
        stored = self.conn.execute(select(LOCKS.c.holder).where(LOCKS.c.session_id == session_id)).scalar()
        return stored == holder

    def refresh_lock(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        """Push the expiry to now + ttl for the lease's holder, even after it expired
        (Hermes v26), as long as the row is still theirs: once anyone else took the
        session over, or the lease was released, there is nothing left to extend."""
        expires = self.now() + ttl_seconds
        changed = self.conn.execute(
            update(LOCKS).where(LOCKS.c.session_id == session_id, LOCKS.c.holder == holder).values(expires_at=expires)
        ).rowcount
        return changed > 0

    def _lease(self, session_id: str) -> Any:
        """``(holder, expires_at)`` of the session's lease, locked until the transaction ends."""
        return self.conn.execute(
            select(LOCKS.c.holder, LOCKS.c.expires_at).where(LOCKS.c.session_id == session_id).with_for_update()
        ).first()

    def _drop_as_read(self, session_id: str, row: Any) -> bool:
        """Delete the lease only if it is still exactly ``row`` (a racing refresh wins)."""
        return self.conn.execute(
            delete(LOCKS).where(LOCKS.c.session_id == session_id, LOCKS.c.holder == row[0],
                                LOCKS.c.expires_at == row[1])
        ).rowcount > 0

    def release_lock(self, session_id: str, holder: str) -> int:
        return self.conn.execute(
            delete(LOCKS).where(LOCKS.c.session_id == session_id, LOCKS.c.holder == holder)
        ).rowcount

    def lock_holder(self, session_id: str) -> str | None:
        """The holder of a lease that has not expired, else None."""
        return self.conn.execute(
            select(LOCKS.c.holder).where(LOCKS.c.session_id == session_id, LOCKS.c.expires_at >= self.now())
        ).scalar()

    # ------------------------------------------------------------- compression children (v26)

    def _children(self, parent_id: str, *, live_only: bool) -> list[str]:
        """Ids of the parent's children that are not forks (oldest first)."""
        q = select(_S.id, _S.source, _S.model_config).where(_S.parent_session_id == parent_id)
        if live_only:
            q = q.where(_S.ended_at.is_(None))
        rows = self.conn.execute(q.order_by(_S.started_at, _S.id)).fetchall()
        return [r[0] for r in rows if not is_fork(tool=r[1] == "tool", model_config=r[2], parent_id=parent_id)]

    def live_child(self, parent_id: str) -> dict[str, Any] | None:
        """The one unended continuation of a parent that ended 'compression' (None when
        there is none or more than one)."""
        reason = self.conn.execute(select(_S.end_reason).where(_S.id == parent_id)).scalar()
        if reason != COMPRESSION:
            return None
        live = self._children(parent_id, live_only=True)
        return self._peer(SessionRepository).get(live[0]) if len(live) == 1 else None  # type: ignore[return-value]

    def reopen_orphan(self, session_id: str) -> bool:
        """Reopen a session that ended 'compression' but was never continued (its child
        was never published) and whose compression lease is gone or expired.

        False when it did not end 'compression', has any continuation (ended or not),
        or a live lease; an expired lease is removed only if it is still the row read.
        """
        lease = self._lease(session_id)  # the lease row first, then the session's: publication's order
        parent = self.conn.execute(select(_S.end_reason).where(_S.id == session_id).with_for_update()).first()
        if parent is None or parent[0] != COMPRESSION or self._children(session_id, live_only=False):
            return False
        if lease is not None:
            if lease[1] is not None and float(lease[1]) >= self.now():
                return False
            if not self._drop_as_read(session_id, lease):
                return False
        return self.conn.execute(
            update(SESSIONS).where(_S.id == session_id, _S.end_reason == COMPRESSION)
            .values(ended_at=None, end_reason=None)
        ).rowcount > 0

    def check_publication_lease(self, parent_id: str, holder: str | None) -> None:
        """Fail fast unless ``holder`` holds an unexpired compression lease on the parent
        (the row stays locked until the publication commits)."""
        lease = self._lease(parent_id)
        if lease is None or holder is None or lease[0] != holder:
            state = "no lease" if lease is None else f"held by {lease[0]!r}"
            raise errors.CompressionSessionBusyError(
                f"Compression lease lost before publication: session {parent_id!r} ({state}, expected {holder!r})"
            )
        if lease[1] is None or float(lease[1]) < self.now():
            raise errors.CompressionSessionBusyError(
                f"Compression lease lost before publication: session {parent_id!r} (the lease of {holder!r} expired)"
            )

    def publish_child(
        self,
        *,
        parent_id: str,
        child_id: str,
        source: str,
        fields: Mapping[str, Any],
        insert_messages: Callable[[], Any],
        watermark: int | None,
        watermark_ceiling: int | None,
    ) -> None:
        """Create the compression child, fill its transcript, end the parent 'compression'.

        In the caller's one transaction: the parent's row is locked and must exist and be
        live; the child id must be new. ``fields`` are the child's own columns (None:
        taken from the parent, see :data:`CHILD_INHERITS`); ``insert_messages`` writes
        the compacted transcript (Hermes' shared row inserter); with a ``watermark`` the parent's live rows in
        ``(watermark, watermark_ceiling]`` are cloned after it. The child's counters are
        set to what it holds.
        """
        wanted = [_S[c] for c in CHILD_INHERITS]
        parent = self.conn.execute(
            select(_S.ended_at, *wanted).where(_S.id == parent_id).with_for_update()
        ).mappings().first()
        if parent is None:
            raise PublicationError(f"cannot publish compression child {child_id!r}: parent {parent_id!r} not found")
        if parent["ended_at"] is not None:
            raise PublicationError(
                f"cannot publish compression child {child_id!r}: parent {parent_id!r} has already ended"
            )
        if self.session_exists(child_id):
            raise PublicationError(f"cannot publish compression child {child_id!r}: that session already exists")
        columns = {c: parent[c] for c in CHILD_INHERITS if parent[c] is not None}
        columns.update({k: v for k, v in fields.items() if v is not None})
        self._peer(SessionRepository).create(child_id, source, parent_session_id=parent_id, **columns)
        insert_messages()
        if watermark is not None:
            self._clone_tail(parent_id, child_id, watermark, watermark_ceiling)
        self._set_counters(child_id)
        self.conn.execute(
            update(SESSIONS).where(_S.id == parent_id, _S.ended_at.is_(None))
            .values(ended_at=self.now(), end_reason=COMPRESSION)
        )

    def _clone_tail(self, parent_id: str, child_id: str, watermark: int, ceiling: int | None) -> None:
        """Copy the parent's live rows with ``watermark < id <= ceiling`` onto the child,
        in id order, as live rows with new ids (every other column as it is)."""
        present = self.columns_of("messages")
        names = [c.name for c in MESSAGES.columns if c.name in present and c.name not in _NOT_CLONED]
        q = select(*(_M[n] for n in names)).where(_M.session_id == parent_id, _M.active == 1, _M.id > watermark)
        if ceiling is not None:
            q = q.where(_M.id <= ceiling)
        from_parent = q.add_columns(*_child_values(child_id)).order_by(_M.id)
        self.conn.execute(insert(MESSAGES).from_select([*names, "session_id", "active", "compacted"], from_parent))

    def _set_counters(self, session_id: str) -> None:
        """``message_count`` / ``tool_call_count`` = what the session's live rows hold."""
        rows = self.conn.execute(
            select(_M.role, _M.tool_calls).where(_M.session_id == session_id, _M.active == 1)
        ).fetchall()
        calls = sum(tool_call_increment(parse_tool_calls(tc)) for _role, tc in rows if tc is not None)
        self.conn.execute(
            update(SESSIONS).where(_S.id == session_id).values(message_count=len(rows), tool_call_count=calls)
        )


def _child_values(child_id: str) -> Sequence[Any]:
    """The constant columns of a cloned row: the child's id, live, not compacted."""
    return [literal(child_id).label("session_id"), literal(1).label("active"), literal(0).label("compacted")]
