"""Gateway state (Hermes v23 §1.E): who a session talks to, and the gateway's routing table.

Peer columns live on ``sessions`` (``session_key``, ``chat_id``, ``chat_type``,
``thread_id``, ``display_name``, ``origin_json``, ``expiry_finalized``); routing entries
are opaque JSON strings in ``gateway_routing``, keyed by ``(scope, session_key)``.
SQLAlchemy Core on the model tables, the same statements on SQLite and PostgreSQL; the
one upsert is the dialect's own insert construct (``INSERT … ON CONFLICT``).

Session rows are read as ``s.*`` (every column the database has, like Hermes'
``SELECT *``), so a file opened read-only at an older revision still reads.
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import (
    and_,
    delete,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)

from ..dialects import Dialect
from ..models import Base
from .base import ID_CHUNK, MESSAGES, SESSIONS, Repository, now, per_dialect
from .sessions import SessionRepository

ROUTING = Base.metadata.tables["gateway_routing"]


@per_dialect
def _save_entry(dialect: Dialect) -> Any:
    """One routing entry: a clash on (scope, session_key) takes the new entry and stamp."""
    ins = dialect.insert(ROUTING)
    return ins.on_conflict_do_update(
        index_elements=[ROUTING.c.scope, ROUTING.c.session_key],
        set_={"entry_json": ins.excluded.entry_json, "updated_at": ins.excluded.updated_at},
    )

#: Ends a gateway may still resume from (Hermes v23): closed by the agent, or reaped
#: as a websocket orphan. Anything else (compression, reset, user end) is final.
RECOVERABLE_END_REASONS = ("agent_close", "ws_orphan_reap")


def _blank(value: str | None) -> str:
    """NULL-as-'' for Hermes' peer equality."""
    return "" if value is None else value


class GatewayRepository(Repository):
    """Peers and origins of sessions, and the routing table. Never commits."""

    # ------------------------------------------------------------------ peers

    def record_peer(self, session_id: str, peer: dict[str, Any], extras: dict[str, Any]) -> int:
        """Set the peer columns (``peer``: always, None overwrites) and ``extras``
        (display name / origin: only those given). Rows changed (0 for an unknown id)."""
        stmt = update(SESSIONS).where(SESSIONS.c.id == session_id).values(**peer, **extras)
        return self.conn.execute(stmt).rowcount

    def set_expiry_finalized(self, session_id: str, finalized: bool) -> int:
        stmt = update(SESSIONS).where(SESSIONS.c.id == session_id).values(expiry_finalized=1 if finalized else 0)
        return self.conn.execute(stmt).rowcount

    # ------------------------------------------------------------------ routing entries

    def save_routing_entry(self, scope: str, session_key: str, entry_json: str) -> None:
        """Upsert one entry, stamping ``updated_at``."""
        self.conn.execute(
            _save_entry(self.conn),
            {"scope": scope, "session_key": session_key, "entry_json": entry_json, "updated_at": now()},
        )

    def replace_routing_entries(self, scope: str, entries: Sequence[tuple[str, str]]) -> int:
        """Drop every entry of ``scope`` and insert ``entries`` (in the caller's transaction,
        so readers see the old set or the new one, never a mix). Returns rows inserted."""
        self.conn.execute(delete(ROUTING).where(ROUTING.c.scope == scope))
        if not entries:
            return 0
        stamp = now()
        rows = [{"scope": scope, "session_key": k, "entry_json": v, "updated_at": stamp} for k, v in entries]
        self.conn.execute(insert(ROUTING), rows)
        return len(rows)

    def load_routing_entries(self, scope: str) -> dict[str, str]:
        """``{session_key: entry_json}`` of one scope, in key order."""
        stmt = (select(ROUTING.c.session_key, ROUTING.c.entry_json)
                .where(ROUTING.c.scope == scope).order_by(ROUTING.c.session_key))
        return {k: v for k, v in self.conn.execute(stmt)}

    def delete_routing_entries(self, scope: str, session_keys: Sequence[str]) -> int:
        deleted = 0
        for start in range(0, len(session_keys), ID_CHUNK):
            chunk = list(session_keys[start:start + ID_CHUNK])
            deleted += self.conn.execute(
                delete(ROUTING).where(ROUTING.c.scope == scope, ROUTING.c.session_key.in_(chunk))
            ).rowcount
        return deleted

    # ------------------------------------------------------------------ lookups

    def _rows(self, stmt: Any) -> list[dict[str, Any]]:
        """Session rows with the full system prompt, as get_session returns them."""
        rows = [dict(r) for r in self.conn.execute(stmt).mappings()]
        SessionRepository(self.conn).resolve_prompts(rows)
        return rows

    def list_gateway_sessions(self, platform: str | None, active_only: bool) -> list[dict[str, Any]]:
        """The newest session of every session key, with ``last_active``, most recent first.

        "Newest" is over all sessions of the key (exact start ties give several rows);
        the platform (case-insensitive) and ``active_only`` filters apply afterwards,
        so a key whose newest session ended is not represented by an older live one.
        Ties on ``last_active`` go to the newer start, then the larger id.
        """
        s = SESSIONS.alias("s")
        newer = SESSIONS.alias("newer")
        newest_start = (select(func.max(newer.c.started_at))
                        .where(newer.c.session_key == s.c.session_key).scalar_subquery())
        newest_message = select(func.max(MESSAGES.c.timestamp)).where(MESSAGES.c.session_id == s.c.id).scalar_subquery()
        last_active = func.coalesce(newest_message, s.c.started_at).label("last_active")
        stmt = (
            select(literal_column("s.*"), last_active)
            .select_from(s)
            .where(s.c.session_key.is_not(None), s.c.started_at == newest_start)
            .order_by(last_active.desc(), s.c.started_at.desc(), s.c.id.desc())
        )
        if platform:
            stmt = stmt.where(func.lower(s.c.source) == func.lower(platform))
        if active_only:
            stmt = stmt.where(s.c.ended_at.is_(None))
        return self._rows(stmt)

    def origin_candidates(self, platform: str, chat_id: str, thread_id: str | None) -> list[tuple[str, str | None]]:
        """``(id, user_id)`` of live keyed sessions in this chat (and thread), newest first."""
        s = SESSIONS
        stmt = (
            select(s.c.id, s.c.user_id)
            .where(
                s.c.ended_at.is_(None),
                s.c.session_key.is_not(None),
                func.lower(s.c.source) == func.lower(platform),
                s.c.chat_id == chat_id,
            )
            .order_by(s.c.started_at.desc(), s.c.id.desc())
        )
        if thread_id is not None:
            stmt = stmt.where(func.coalesce(s.c.thread_id, "") == thread_id)
        return [(r[0], r[1]) for r in self.conn.execute(stmt)]

    def latest_for_peer(
        self,
        *,
        source: str,
        session_key: str,
        peer: dict[str, str | None] | None,
    ) -> dict[str, Any] | None:
        """Hermes' two-pass resume lookup (read-only).

        Both passes want a recoverable session (live, or ended by ``agent_close`` /
        ``ws_orphan_reap``) that has messages (a count above 0 or an actual row), the
        newest start first. Pass 1 matches ``session_key`` and ``source`` exactly;
        pass 2 (``peer`` given) matches ``source`` and the peer columns with NULL as ''.
        """
        s = SESSIONS.alias("s")
        base = [
            s.c.source == source,
            or_(s.c.ended_at.is_(None), s.c.end_reason.in_(RECOVERABLE_END_REASONS)),
            or_(s.c.message_count > 0, exists().where(MESSAGES.c.session_id == s.c.id)),
        ]
        passes: list[list[Any]] = [[s.c.session_key == session_key]]
        if peer is not None:
            passes.append([func.coalesce(s.c[col], "") == _blank(value) for col, value in peer.items()])
        for extra in passes:
            stmt = (select(literal_column("s.*")).select_from(s).where(and_(*base, *extra))
                    .order_by(s.c.started_at.desc(), s.c.id.desc()).limit(1))
            rows = self._rows(stmt)
            if rows:
                return rows[0]
        return None

