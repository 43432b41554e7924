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

import json
from typing import Any
from collections.abc import Sequence

from sqlalchemy import (
    and_,
    case,
    delete,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.sql import Select

from ..dialects import Dialect
from ..keys import COMPRESSION_END_REASON, RESET_END_REASONS
from ..models import Base
from .base import ID_CHUNK, MESSAGES, SESSIONS, Repository, insert_or_skip, per_dialect
from .housekeeping import HousekeepingRepository, activity_recency
from .lineage import BRANCH_MARKER, DELEGATE_MARKER, marker_value
from .sessions import RESETTABLE_END_REASONS, SessionRepository

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
RECOVERABLE_END_REASONS = RESETTABLE_END_REASONS  # the same ends: not final


#: The handoff state machine (Hermes v11): requested, claimed by one worker, then done.
HANDOFF_PENDING = "pending"
HANDOFF_RUNNING = "running"
HANDOFF_COMPLETED = "completed"
HANDOFF_FAILED = "failed"
HANDOFF_FINISHED = (HANDOFF_COMPLETED, HANDOFF_FAILED)


def _blank(value: str | None) -> str:
    """NULL-as-'' for Hermes' peer equality."""
    return "" if value is None else value


class GatewayRepository(Repository):
    """Peers and origins of sessions, and the routing table. Never commits."""

    # ------------------------------------------------------------------ peers

    def record_peer(self, session_id: str, peer: dict[str, Any], extras: dict[str, Any], *,
                    ancestors: bool = False) -> int:
        """Record the session's peer; without ``ancestors`` a missing row is inserted first
        (Hermes v26), with it an unknown id changes nothing.

        ``session_key`` and ``source`` are set; the other columns only where a value is
        given (None keeps what is stored: ours, Hermes clears it). ``ancestors``: the
        same update on the parents reached through 'compression' ends, stopping at a
        row of another (non-empty) user, so one user's lineage is never re-keyed to
        another's. Rows changed.
        """
        s = SESSIONS.c
        if not ancestors and not self.session_exists(session_id):
            row = {"id": session_id, "source": peer["source"], "started_at": self.now()}
            self.conn.execute(insert_or_skip(self.conn, "sessions", list(row), ["id"]), row)
        values = {k: v for k, v in {**peer, **extras}.items() if v is not None}
        targets = [session_id]
        if ancestors:
            targets += self._compression_ancestors(session_id, peer.get("user_id"))
        changed = 0
        for sid in targets:
            changed += self.conn.execute(update(SESSIONS).where(s.id == sid).values(**values)).rowcount
        return changed

    def _compression_ancestors(self, session_id: str, user_id: str | None) -> list[str]:
        """Parents reached through 'compression' ends, nearest first, up to (not
        including) one whose user is set and differs from ``user_id`` (cycle-safe)."""
        s = SESSIONS.c
        found: list[str] = []
        seen = {session_id}
        current = session_id
        while True:
            parent_id = self.conn.execute(select(s.parent_session_id).where(s.id == current)).scalar()
            if parent_id is None or parent_id in seen:
                return found
            parent = self.conn.execute(select(s.end_reason, s.user_id).where(s.id == parent_id)).first()
            if parent is None or parent[0] != COMPRESSION_END_REASON:
                return found
            if user_id and parent[1] and parent[1] != user_id:
                return found
            found.append(parent_id)
            seen.add(parent_id)
            current = parent_id

    def set_expiry_finalized(self, session_id: str, finalized: bool) -> int:
        stmt = update(SESSIONS).where(SESSIONS.c.id == session_id).values(expiry_finalized=1 if finalized else 0)
        return self.conn.execute(stmt).rowcount

    # ------------------------------------------------------------------ routing entries

    def save_routing_entry(self, scope: str, session_key: str, entry_json: str) -> None:
        """Upsert one entry, stamping ``updated_at``."""
        self.conn.execute(
            _save_entry(self.conn),
            {"scope": scope, "session_key": session_key, "entry_json": entry_json, "updated_at": self.now()},
        )

    def replace_routing_entries(self, scope: str, entries: Sequence[tuple[str, str]]) -> int:
        """Drop every entry of ``scope`` and insert ``entries`` (in the caller's transaction,
        so readers see the old set or the new one, never a mix). Returns rows inserted."""
        self.conn.execute(delete(ROUTING).where(ROUTING.c.scope == scope))
        if not entries:
            return 0
        stamp = self.now()
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

    # ------------------------------------------------------------------ handoffs

    def request_handoff(self, session_id: str, platform: str) -> bool:
        """``pending`` for ``platform``, only from no handoff or a finished one."""
        s = SESSIONS.c
        stmt = (update(SESSIONS)
                .where(s.id == session_id,
                       or_(s.handoff_state.is_(None), s.handoff_state.in_(HANDOFF_FINISHED)))
                .values(handoff_state=HANDOFF_PENDING, handoff_platform=platform, handoff_error=None))
        return self.conn.execute(stmt).rowcount > 0

    def move_handoff(self, session_id: str, before: Sequence[str], after: str, error: str | None = None) -> bool:
        """Compare-and-set of the state: one caller wins a race."""
        s = SESSIONS.c
        values: dict[str, Any] = {"handoff_state": after}
        if after == HANDOFF_FAILED:
            values["handoff_error"] = error
        stmt = update(SESSIONS).where(s.id == session_id, s.handoff_state.in_(list(before))).values(**values)
        return self.conn.execute(stmt).rowcount > 0

    def handoff_state(self, session_id: str) -> dict[str, Any] | None:
        s = SESSIONS.c
        row = self.conn.execute(select(s.handoff_state, s.handoff_platform, s.handoff_error)
                                .where(s.id == session_id)).first()
        if row is None:
            return None
        return {"state": row[0], "platform": row[1], "error": row[2]}

    def pending_handoffs(self) -> list[dict[str, Any]]:
        """Session rows waiting for a handoff, oldest start first."""
        s = SESSIONS.alias("s")
        stmt: Select[Any] = (select(literal_column("s.*")).select_from(s).where(s.c.handoff_state == HANDOFF_PENDING)
                .order_by(s.c.started_at, s.c.id))
        return self._rows(stmt)

    # ------------------------------------------------------------------ lookups

    def _rows(self, stmt: Select[*tuple[Any, ...]]) -> list[dict[str, Any]]:
        """Session rows with the full system prompt, as get_session returns them."""
        rows = [dict(r) for r in self.conn.execute(stmt).mappings()]
        self._peer(SessionRepository).resolve_prompts(rows)
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
        stmt: Select[Any, Any] = (
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
        """``(id, user_id)`` of live keyed sessions in this chat (and thread), newest first.

        Left out: ended and archived sessions, and forks (branch or delegate children:
        a side conversation is never the chat's session). A compression continuation or
        a reset child is the chat's live session and stays in.
        """
        s = SESSIONS
        stmt = (
            select(s.c.id, s.c.user_id, s.c.model_config)
            .where(
                s.c.ended_at.is_(None),
                s.c.session_key.is_not(None),
                or_(s.c.archived.is_(None), s.c.archived == 0),
                func.lower(s.c.source) == func.lower(platform),
                s.c.chat_id == chat_id,
            )
            .order_by(s.c.started_at.desc(), s.c.id.desc())
        )
        if thread_id is not None:
            stmt = stmt.where(func.coalesce(s.c.thread_id, "") == thread_id)
        return [(r[0], r[1]) for r in self.conn.execute(stmt) if not _forked(r[2])]

    def latest_for_peer(
        self,
        *,
        source: str,
        session_key: str,
        peer: dict[str, str | None] | None,
        user_id: str | None = None,
    ) -> dict[str, Any] | None:
        """Hermes' two-pass resume lookup (read-only), v26 rules.

        Both passes want a recoverable session (live, or ended by ``agent_close`` /
        ``ws_orphan_reap``) and reject a candidate when a row of the same peer ended
        with a reset reason after the candidate's last activity (the user started
        over since). Pass 1 matches ``session_key`` and ``source`` exactly, message-
        bearing rows first, then ``COALESCE(last_activity_at, started_at)`` newest; a
        row of another (non-empty) user than ``user_id`` is not taken (ours: Hermes
        ignores the user there). Pass 2 (``peer`` given) matches ``source`` and the
        peer columns with NULL as '', needs messages, newest start first.
        """
        s = SESSIONS.alias("s")
        reset = SESSIONS.alias("r")
        has_messages = or_(s.c.message_count > 0, exists().where(MESSAGES.c.session_id == s.c.id))
        stamp = s.c.last_activity_at
        newest = select(func.max(MESSAGES.c.timestamp)).where(MESSAGES.c.session_id == s.c.id).scalar_subquery()
        later = case((stamp.is_(None), newest), (newest.is_(None), stamp), (stamp > newest, stamp), else_=newest)
        last_active = func.coalesce(later, s.c.started_at)
        recoverable = or_(s.c.ended_at.is_(None), s.c.end_reason.in_(RECOVERABLE_END_REASONS))

        def not_reset_since(*same_peer: Any) -> Any:
            return ~exists().where(reset.c.source == source, *same_peer,
                                   reset.c.end_reason.in_(sorted(RESET_END_REASONS)), reset.c.ended_at > last_active)

        by_key = [s.c.source == source, s.c.session_key == session_key, recoverable,
                  not_reset_since(reset.c.session_key == session_key)]
        if user_id:
            by_key.append(or_(s.c.user_id.is_(None), s.c.user_id == "", s.c.user_id == user_id))
        stmt: Select[Any] = (select(literal_column("s.*")).select_from(s).where(and_(*by_key))
                .order_by(case((has_messages, 0), else_=1), func.coalesce(stamp, s.c.started_at).desc(),
                          s.c.started_at.desc(), s.c.id.desc()).limit(1))
        rows = self._rows(stmt)
        if rows or peer is None:
            return rows[0] if rows else None
        matches = [func.coalesce(s.c[col], "") == _blank(value) for col, value in peer.items()]
        same = [func.coalesce(reset.c[col], "") == _blank(value) for col, value in peer.items()]
        stmt = (select(literal_column("s.*")).select_from(s)
                .where(s.c.source == source, recoverable, has_messages, *matches, not_reset_since(*same))
                .order_by(s.c.started_at.desc(), s.c.id.desc()).limit(1))
        rows = self._rows(stmt)
        return rows[0] if rows else None


# ---------------------------------------------------------------------- repair (Hermes v25-v26)

HYGIENE = Base.metadata.tables["gateway_hygiene_state"]
#: How long (seconds) a donor may have been quiet before an orphan started (Hermes' default).
DEFAULT_ORPHAN_GAP_S = 900.0
#: End reason of a donor whose key moved to the orphan it continued.
SUPERSEDED_BY_REPAIR = "superseded_by_repair"


@per_dialect
def _bump_hygiene(dialect: Dialect) -> Any:
    """A chat's failure streak: a new row starts at 1, an existing one goes up by one."""
    ins = dialect.insert(HYGIENE)
    return ins.on_conflict_do_update(index_elements=[HYGIENE.c.session_key],
                                     set_={"failure_streak": HYGIENE.c.failure_streak + 1})


def _keyed(column: Any) -> Any:
    return and_(column.is_not(None), column != "")


def _forked(model_config: Any) -> bool:
    """A branch or delegate child (its marker names any session)."""
    return any(marker_value(model_config, m) is not None for m in (BRANCH_MARKER, DELEGATE_MARKER))


def _entry_session(entry_json: Any) -> Any:
    """The ``session_id`` a routing entry names (None for malformed JSON or no object)."""
    try:
        value = json.loads(entry_json)
    except (TypeError, ValueError):
        return None
    return value.get("session_id") if isinstance(value, dict) else None


class GatewayRepairRepository(Repository):
    """Hygiene streaks, never-active keyed sessions, orphaned gateway sessions. Never commits."""

    # ------------------------------------------------------------------ hygiene streaks

    def increment_hygiene(self, session_key: str) -> int:
        self.conn.execute(_bump_hygiene(self.conn), {"session_key": session_key, "failure_streak": 1})
        value = self.conn.execute(select(HYGIENE.c.failure_streak)
                                  .where(HYGIENE.c.session_key == session_key)).scalar()
        return int(value or 0)

    def reset_hygiene(self, session_key: str) -> None:
        self.conn.execute(delete(HYGIENE).where(HYGIENE.c.session_key == session_key))

    # ------------------------------------------------------------------ never-active keyed sessions

    def never_active(self, cutoff: float, *, lock: bool = False) -> list[dict[str, Any]]:
        """Keyed, running, untitled sessions started before ``cutoff`` that never did
        anything: no activity stamp, zero counters, not pinned or archived, no message
        row. Oldest first."""
        s = SESSIONS.c
        zero = [func.coalesce(s[c], 0) == 0 for c in ("message_count", "tool_call_count", "api_call_count",
                                                        "input_tokens", "output_tokens")]
        stmt = (
            select(s.id, s.session_key, s.source, s.chat_id, s.chat_type, s.user_id, s.started_at)
            .where(_keyed(s.session_key), s.ended_at.is_(None), s.started_at < cutoff,
                   or_(s.title.is_(None), s.title == ""), s.last_activity_at.is_(None), *zero,
                   s.pinned == 0, s.archived == 0,
                   ~exists().where(MESSAGES.c.session_id == s.id))
            .order_by(s.started_at, s.id)
        )
        if lock:
            stmt = stmt.with_for_update(of=SESSIONS)
        return [dict(r) for r in self.conn.execute(stmt).mappings()]

    def prune_never_active(self, cutoff: float, sessions_dir: Any) -> tuple[int, int]:
        """Delete the never-active sessions and the routing entries that point at them.

        Decided in this transaction (a session that got a message since it was listed
        stays). An entry goes only when its JSON ``session_id`` is exactly the session
        and its key is the session's own (any scope); a session that a routing entry
        under another key still points at is kept, as something routes to it.
        """
        found = {r["id"]: r["session_key"] for r in self.never_active(cutoff, lock=True)}
        if not found:
            return 0, 0
        r = ROUTING.c
        own: list[tuple[str, str, str]] = []
        kept: set[str] = set()
        for scope, key, entry in self.conn.execute(select(r.scope, r.session_key, r.entry_json)):
            target = _entry_session(entry)
            if target not in found:
                continue
            if key == found[target]:
                own.append((target, scope, key))
            else:
                kept.add(target)
        routes = 0
        for target, scope, key in own:
            if target not in kept:
                routes += self.conn.execute(delete(ROUTING).where(r.scope == scope, r.session_key == key)).rowcount
        ids = [sid for sid in found if sid not in kept]
        deleted = self._peer(HousekeepingRepository).delete_sessions(ids, sessions_dir)
        return deleted, routes

    # ------------------------------------------------------------------ orphaned gateway sessions

    def _rows(self, *where: Any) -> list[dict[str, Any]]:
        s = SESSIONS.c
        stmt = select(s.id, s.source, s.user_id, s.session_key, s.parent_session_id, s.model_config,
                      s.message_count, s.started_at, s.ended_at, activity_recency().label("last_active")
                      ).where(*where).order_by(s.started_at, s.id)
        return [dict(r) for r in self.conn.execute(stmt).mappings()]

    def orphans(self, max_gap_s: float) -> list[dict[str, Any]]:
        """Unkeyed sessions with messages (no tool runs, branches or delegates), each with
        the keyed session it most likely continued (see SessionDB.find_orphaned_gateway_sessions)."""
        s = SESSIONS.c
        has_messages = or_(s.message_count > 0, exists().where(MESSAGES.c.session_id == s.id))
        orphans = [o for o in self._rows(~_keyed(s.session_key), has_messages,
                                         or_(s.source.is_(None), s.source != "tool"))
                   if not _forked(o["model_config"])]
        if not orphans:
            return []
        sources = sorted({o["source"] for o in orphans if o["source"] is not None})
        keyed = self._rows(_keyed(s.session_key), s.source.in_(sources)) if sources else []
        by_id = {k["id"]: k for k in keyed}
        out = [_orphan_record(o, by_id, keyed, max_gap_s) for o in orphans]
        claims: dict[str, int] = {}
        for rec in out:
            if rec["adoptable"]:
                claims[rec["donor_id"]] = claims.get(rec["donor_id"], 0) + 1
        for rec in out:
            if rec["adoptable"] and claims[rec["donor_id"]] > 1:
                rec.update(adoptable=False, reason="donor_claimed_twice")
        return out

    def adopt(self, orphan_id: str, donor_id: str, stamp: float) -> bool:
        """Give the orphan the donor's key (and its routing columns where the orphan's
        are NULL), make the donor its parent and end the donor 'superseded_by_repair'.

        Re-checked here: donor keyed, orphan unkeyed with messages and not a fork, same
        source, the same user (both empty counts; one empty does not), and the orphan
        has no other parent. False, and nothing written, otherwise.
        """
        if orphan_id == donor_id:
            return False
        s = SESSIONS.c
        cols = [s.id, s.source, s.user_id, s.session_key, s.parent_session_id, s.model_config, s.ended_at,
                s.chat_id, s.chat_type, s.thread_id, s.display_name, s.origin_json]
        rows = {r["id"]: dict(r) for r in self.conn.execute(
            select(*cols).where(s.id.in_([orphan_id, donor_id])).with_for_update()).mappings()}
        orphan, donor = rows.get(orphan_id), rows.get(donor_id)
        if orphan is None or donor is None or not donor["session_key"] or orphan["session_key"]:
            return False
        if orphan["source"] != donor["source"] or orphan["source"] == "tool" or _forked(orphan["model_config"]):
            return False
        if _blank(orphan["user_id"]) != _blank(donor["user_id"]):
            return False
        if orphan["parent_session_id"] not in (None, donor_id):
            return False
        fills: dict[str, Any] = {"session_key": donor["session_key"], "parent_session_id": donor_id}
        for name in ("user_id", "chat_id", "chat_type", "thread_id", "display_name", "origin_json"):
            if orphan[name] is None and donor[name] is not None:
                fills[name] = donor[name]
        self.conn.execute(update(SESSIONS).where(s.id == orphan_id).values(**fills))
        if donor["ended_at"] is None:
            self.conn.execute(update(SESSIONS).where(s.id == donor_id, s.ended_at.is_(None))
                              .values(ended_at=stamp, end_reason=SUPERSEDED_BY_REPAIR))
        return True


def _orphan_record(orphan: dict[str, Any], by_id: dict[str, dict[str, Any]], keyed: list[dict[str, Any]],
                   max_gap_s: float) -> dict[str, Any]:
    """One orphan with its donor: its keyed same-source parent ("lineage"), else the one
    keyed same-source session that went quiet within ``max_gap_s`` of the orphan's start
    and before its last activity ("contiguity"). Users must agree to adopt: equal, or
    both empty (ours: Hermes also lets an empty user match any)."""
    rec: dict[str, Any] = {
        "orphan_id": orphan["id"], "source": orphan["source"], "message_count": orphan["message_count"],
        "started_at": orphan["started_at"], "last_active": orphan["last_active"],
        "donor_id": None, "session_key": None, "evidence": None, "adoptable": False, "reason": None,
    }
    parent = by_id.get(orphan["parent_session_id"])
    if parent is not None:
        donor, rec["evidence"] = parent, "lineage"
    else:
        near = [k for k in keyed
                if k["source"] == orphan["source"] and k["id"] != orphan["id"]
                and abs(orphan["started_at"] - k["last_active"]) <= max_gap_s
                and k["last_active"] < orphan["last_active"]
                and not (k["user_id"] and orphan["user_id"] and k["user_id"] != orphan["user_id"])]
        if not near:
            rec["reason"] = "no_donor"
            return rec
        if len(near) > 1:
            rec["reason"] = "ambiguous_donor"
            return rec
        donor, rec["evidence"] = near[0], "contiguity"
    rec.update(donor_id=donor["id"], session_key=donor["session_key"])
    if _blank(donor["user_id"]) != _blank(orphan["user_id"]):
        rec["reason"] = "user_mismatch" if donor["user_id"] and orphan["user_id"] else "user_unverified"
        return rec
    rec["adoptable"] = True
    return rec
