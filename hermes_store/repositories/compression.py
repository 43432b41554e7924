"""Compression guards: the per-session compression lease, failure cooldowns and the
fallback streak (Hermes v23). SQLAlchemy Core on the model tables; the one upsert is the
dialect's own insert construct (``INSERT … ON CONFLICT DO NOTHING`` on both SQLite and
PostgreSQL).

The lease is correct under concurrency on both backends because each acquire is one
transaction: on SQLite the writer lock (BEGIN IMMEDIATE) serializes acquirers; on
PostgreSQL (READ COMMITTED) the primary key does, as a racing INSERT waits for the
other transaction and then does nothing, and the final SELECT sees whoever committed.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, update

from ..dialects import Dialect
from ..models import Base
from .base import SESSIONS, Repository, now, per_dialect

LOCKS = Base.metadata.tables["compression_locks"]


@per_dialect
def _take_lease(dialect: Dialect) -> Any:
    """Insert a lease unless the session has one (whoever holds it keeps it)."""
    return dialect.insert(LOCKS).on_conflict_do_nothing(index_elements=[LOCKS.c.session_id])


class CompressionRepository(Repository):
    # ------------------------------------------------------------- failure cooldown

    def record_cooldown(self, session_id: str, cooldown_until: float, error: str | None) -> int:
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
        current = now()
        if until <= current:
            return None
        return {"cooldown_until": until, "remaining_seconds": until - current, "error": row[1]}

    def clear_cooldown(self, session_id: str) -> int:
        return self.record_cooldown(session_id, None, None)  # type: ignore[arg-type]

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

    # ------------------------------------------------------------- compression lease

    def try_acquire_lock(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        """Drop this session's expired lease, insert ours unless one is held, and report
        whether the stored holder is now ``holder``. Re-entrant; never extends a lease."""
        current = now()
        expires = current + ttl_seconds
        self.conn.execute(delete(LOCKS).where(LOCKS.c.session_id == session_id, LOCKS.c.expires_at < current))
        self.conn.execute(
            _take_lease(self.conn),
            {"session_id": session_id, "holder": holder, "acquired_at": current, "expires_at": expires},
        )
        stored = self.conn.execute(select(LOCKS.c.holder).where(LOCKS.c.session_id == session_id)).scalar()
        return stored == holder

    def refresh_lock(self, session_id: str, holder: str, ttl_seconds: float) -> bool:
        """Push the expiry to now + ttl, only for the holder of a lease that has not expired."""
        current = now()
        expires = current + ttl_seconds
        changed = self.conn.execute(
            update(LOCKS)
            .where(LOCKS.c.session_id == session_id, LOCKS.c.holder == holder, LOCKS.c.expires_at >= current)
            .values(expires_at=expires)
        ).rowcount
        return changed > 0

    def release_lock(self, session_id: str, holder: str) -> int:
        return self.conn.execute(
            delete(LOCKS).where(LOCKS.c.session_id == session_id, LOCKS.c.holder == holder)
        ).rowcount

    def lock_holder(self, session_id: str) -> str | None:
        """The holder of a lease that has not expired, else None."""
        return self.conn.execute(
            select(LOCKS.c.holder).where(LOCKS.c.session_id == session_id, LOCKS.c.expires_at >= now())
        ).scalar()
