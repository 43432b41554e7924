"""Retention policies (revision hs0009) and the statements that apply them.

A policy names a source (``'*'``: the store's default, for every source without a row
of its own) and two ages, each optional:

* ``delete_after_days``: ended sessions whose ``ended_at`` is that old are deleted with
  their messages and usage rows (children are kept, without a parent, as a prune does);
* ``redact_after_days``: in the other sessions, messages whose ``timestamp`` is that
  old lose their tool output (``content`` of a ``tool`` row) and their reasoning
  (``reasoning`` and ``reasoning_content`` become a short marker; ``reasoning_details``
  and ``codex_reasoning_items``, JSON a provider would replay, become NULL). The row, its
  id, role, tool calls, token count and the session's counters stay; a value no longer
  than its marker is left as it is. The search indexes follow through the ordinary
  triggers (FTS5's delete-then-insert on SQLite, the generated ``tsvector`` and the
  short-CJK dirty marks on PostgreSQL): a plain ``UPDATE``, never a replace.

Protected sessions are never touched unless the policy says so: pinned ones
(``sessions.pinned``, Hermes v24) and those titled by a person: a title whose
``title_source`` is ``'user'``, or NULL (a title from before Hermes v25 recorded
provenance: it may be a person's, so it is kept); and with each of them every session it
continues through compression (its parents that ended 'compression', up the chain): the
earlier parts of a pinned or titled conversation go with it, never before it.

Repositories never commit: :mod:`hermes_store.operations.retention` runs each batch in
a transaction of its own.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass
from functools import reduce
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Sequence

from sqlalchemy import and_, case, delete, func, not_, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from .. import errors
from ..codec import check_key
from ..keys import (
    COMPRESSION_END_REASON,
    DAY,
    RETENTION_DEFAULT_SOURCE,
    RETENTION_DELETE_MESSAGES,
    RETENTION_REASONING_MARKER,
    RETENTION_TABLE,
    RETENTION_TOOL_MARKER,
)
from ..models import Base
from ..titles import TITLE_SOURCE_USER
from .base import ID_CHUNK, MESSAGES, SESSIONS, Repository
from .housekeeping import HousekeepingRepository
from .maintenance import MaintenanceRepository

POLICIES = Base.metadata.tables[RETENTION_TABLE]
#: Message columns whose stored text a deleted session frees (the byte estimate).
TEXT_COLUMNS = ("content", "tool_calls", "reasoning", "reasoning_content", "reasoning_details",
                "codex_reasoning_items", "codex_message_items", "api_content", "display_metadata")
#: Reasoning replaced by the marker / cleared (JSON a provider replays: a marker would not parse).
REASONING_TEXT = ("reasoning", "reasoning_content")
REASONING_JSON = ("reasoning_details", "codex_reasoning_items")
#: Longest age a policy takes, in days (about 270 years: past it, "never" is meant).
MAX_DAYS = 100_000.0


@dataclass(frozen=True)
class RetentionPolicyRecord:
    """One stored policy (see the module docstring); ``source`` ``'*'`` is the default."""

    source: str
    delete_after_days: float | None = None
    redact_after_days: float | None = None
    include_pinned: bool = False
    include_user_titled: bool = False
    archive_dir: str | None = None
    updated_at: float | None = None

    @property
    def is_default(self) -> bool:
        return self.source == RETENTION_DEFAULT_SOURCE

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeleteEstimate:
    """What a policy's deletion would remove now: sessions, their messages, their bytes."""

    sessions: int
    messages: int
    bytes: int


@dataclass(frozen=True)
class RedactEstimate:
    """What a policy's redaction would replace now: rows and the bytes they hold."""

    tool_outputs: int
    tool_bytes: int
    reasoning: int
    reasoning_bytes: int


def check_days(name: str, days: float | None) -> float | None:
    """``days`` as a float in [0, MAX_DAYS], or None ("never"); InvalidInputError else."""
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, (int, float)) or not 0 <= days <= MAX_DAYS:
        raise errors.InvalidInputError(f"{name} must be a number of days from 0 to {MAX_DAYS:,.0f}, not {days!r}")
    return float(days)


def _record(row: Any) -> RetentionPolicyRecord:
    return RetentionPolicyRecord(
        source=row.source, delete_after_days=row.delete_after_days, redact_after_days=row.redact_after_days,
        include_pinned=bool(row.include_pinned), include_user_titled=bool(row.include_user_titled),
        archive_dir=row.archive_dir, updated_at=row.updated_at,
    )


def _longer_than_marker(column: Any, marker: str) -> ColumnElement[bool]:
    return and_(column.is_not(None), func.length(column) > len(marker))


m, s = MESSAGES.c, SESSIONS.c
#: A tool output that redaction replaces.
TOOL_OUTPUT = and_(m.role == "tool", _longer_than_marker(m.content, RETENTION_TOOL_MARKER))
#: Reasoning that redaction replaces or clears.
REASONING = or_(*(_longer_than_marker(m[c], RETENTION_REASONING_MARKER) for c in REASONING_TEXT),
                *(m[c].is_not(None) for c in REASONING_JSON))


class RetentionRepository(Repository):
    """The policies of this store (tenant) and the statements that apply one."""

    # ------------------------------------------------------------------ policies

    def policies(self) -> list[RetentionPolicyRecord]:
        """Every stored policy, by source (``'*'`` first); ``[]`` on a store older than
        hs0009, which has no policy to follow."""
        if not self.has_table(RETENTION_TABLE):
            return []
        rows = self.conn.execute(select(POLICIES).order_by(POLICIES.c.source))
        return [_record(r) for r in rows]

    def set_policy(self, source: str, **changes: Any) -> RetentionPolicyRecord:
        """Create or change the policy of ``source`` (``'*'``: the default): only the
        fields given change (``delete_after_days=None`` means "never"). Returns the row."""
        source = check_key(source, "source")
        known = {"delete_after_days", "redact_after_days", "include_pinned", "include_user_titled", "archive_dir"}
        unknown = set(changes) - known
        if unknown:
            raise errors.InvalidInputError(f"unknown retention field(s): {', '.join(sorted(unknown))}")
        for name in ("delete_after_days", "redact_after_days"):
            if name in changes:
                changes[name] = check_days(name, changes[name])
        for name in ("include_pinned", "include_user_titled"):
            if name in changes:
                changes[name] = 1 if changes[name] else 0
        if "archive_dir" in changes and changes["archive_dir"] is not None:
            changes["archive_dir"] = str(changes["archive_dir"])
        current = self.conn.execute(
            select(POLICIES).where(POLICIES.c.source == source).with_for_update()).first()
        values = {**changes, "updated_at": self.now()}
        if current is None:
            self.conn.execute(POLICIES.insert().values(source=source, **values))
        else:
            self.conn.execute(update(POLICIES).where(POLICIES.c.source == source).values(**values))
        row = self.conn.execute(select(POLICIES).where(POLICIES.c.source == source)).one()
        return _record(row)

    def remove_policy(self, source: str) -> bool:
        """Drop the policy of ``source``; False when there was none."""
        return bool(self.conn.execute(delete(POLICIES).where(POLICIES.c.source == source)).rowcount)

    # ------------------------------------------------------------------ whom a policy covers

    @staticmethod
    def covered(policy: RetentionPolicyRecord, others: Sequence[str]) -> list[ColumnElement[bool]]:
        """Conditions on ``sessions`` of the sessions ``policy`` governs: its source (the
        default: every source but ``others``, those with a policy of their own), and
        not protected (pinned, user-titled) unless the policy includes them."""
        conds: list[ColumnElement[bool]] = [
            s.source.not_in(list(others)) if policy.is_default else s.source == policy.source]
        if not policy.include_pinned:
            conds.append(func.coalesce(s.pinned, 0) == 0)
        if not policy.include_user_titled:
            conds.append(or_(s.title.is_(None), and_(s.title_source.is_not(None),
                                                     s.title_source != TITLE_SOURCE_USER)))
        return conds

    @staticmethod
    def protection(policy: RetentionPolicyRecord) -> ColumnElement[bool] | None:
        """The sessions ``policy`` protects by their own row (pinned, user-titled, unless
        it includes them); None when it protects none."""
        conds: list[ColumnElement[bool]] = []
        if not policy.include_pinned:
            conds.append(func.coalesce(s.pinned, 0) != 0)
        if not policy.include_user_titled:
            conds.append(and_(s.title.is_not(None), or_(s.title_source.is_(None),
                                                        s.title_source == TITLE_SOURCE_USER)))
        return or_(*conds) if conds else None

    def protected(self, policy: RetentionPolicyRecord) -> frozenset[str]:
        """Every session ``policy`` leaves alone whatever its age: the ones protected by
        their own row (:meth:`protection`) and all their earlier selves, the sessions
        they continue through compression (Hermes moves a title to the newest one, and a
        pinned conversation is all of them). Walked up one level per statement, the ids
        in chunks; a corrupt cycle ends as every id is visited once."""
        roots = self.protection(policy)
        if roots is None:
            return frozenset()
        found = {r[0] for r in self.conn.execute(select(s.id).where(roots)) if r[0] is not None}
        child, parent = SESSIONS.alias("kept_child"), SESSIONS.alias("kept_parent")
        frontier = list(found)
        while frontier:
            later: list[str] = []
            for start in range(0, len(frontier), ID_CHUNK):
                stmt = (select(parent.c.id)
                        .select_from(child.join(parent, parent.c.id == child.c.parent_session_id))
                        .where(child.c.id.in_(frontier[start:start + ID_CHUNK]),
                               parent.c.end_reason == COMPRESSION_END_REASON))
                for (pid,) in self.conn.execute(stmt):
                    if pid is not None and pid not in found:
                        found.add(pid)
                        later.append(pid)
            frontier = later
        return frozenset(found)

    def cutoff(self, days: float) -> float:
        return self.now() - days * DAY

    def _deletable(self, policy: RetentionPolicyRecord, others: Sequence[str]) -> list[ColumnElement[bool]]:
        assert policy.delete_after_days is not None
        return [*self.covered(policy, others), s.ended_at.is_not(None),
                s.ended_at < self.cutoff(policy.delete_after_days)]

    def _redactable(self, policy: RetentionPolicyRecord, others: Sequence[str]) -> ColumnElement[bool]:
        """Conditions on ``messages`` joined to ``sessions``: old enough, governed by the
        policy, in a session the same policy does not delete, holding something to redact."""
        assert policy.redact_after_days is not None
        conds = [*self.covered(policy, others), m.timestamp < self.cutoff(policy.redact_after_days),
                 or_(TOOL_OUTPUT, REASONING)]
        if policy.delete_after_days is not None:
            conds.append(not_(and_(*self._deletable(policy, others)[-2:])))
        return and_(*conds)

    # ------------------------------------------------------------------ deleting

    def sessions_to_delete(self, policy: RetentionPolicyRecord, others: Sequence[str], limit: int,
                           protected: frozenset[str] = frozenset(),
                           after: tuple[float, str] | None = None,
                           max_messages: int = RETENTION_DELETE_MESSAGES,
                           ) -> tuple[list[str], tuple[float, str] | None]:
        """The next page of sessions the policy deletes now, the longest ended first:
        up to ``limit`` rows after the key ``after`` (``(ended_at, id)``), those in
        ``protected`` left out, and no more once they hold ``max_messages`` messages
        (``sessions.message_count``; one session at least). Returns their ids and the
        page's last key (None: no more)."""
        conds = self._deletable(policy, others)
        if after is not None:
            conds.append(or_(s.ended_at > after[0], and_(s.ended_at == after[0], s.id > after[1])))
        rows = self.conn.execute(select(s.id, s.ended_at, s.message_count).where(*conds, s.id.is_not(None))
                                 .order_by(s.ended_at, s.id).limit(limit)).all()
        if not rows:
            return [], None
        picked: list[str] = []
        messages = 0
        for n, (sid, _ended, count) in enumerate(rows):
            if sid not in protected:
                picked.append(sid)
                messages += int(count or 0)
            if messages >= max_messages:  # a page of long sessions ends early: the lock stays short
                rows = rows[:n + 1]
                break
        return picked, (float(rows[-1][1]), str(rows[-1][0]))

    def export(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """The sessions ``ids`` as ``hermes-store export`` writes them (one dict each)."""
        repo = MaintenanceRepository(self.conn)
        return [r for r in (repo.export_session(i) for i in ids) if r is not None]

    def delete_sessions(self, ids: Sequence[str], policy: RetentionPolicyRecord, others: Sequence[str],
                        sessions_dir: str | Path | None = None) -> tuple[list[str], int]:
        """Delete those of ``ids`` the policy still deletes (checked again, rows locked on
        a server: a session resumed or pinned meanwhile stays). Returns the ids deleted
        and how many messages went with them."""
        still: list[str] = []
        for start in range(0, len(ids), ID_CHUNK):
            chunk = list(ids[start:start + ID_CHUNK])
            stmt = select(s.id).where(s.id.in_(chunk), *self._deletable(policy, others)).with_for_update(of=SESSIONS)
            still += [r[0] for r in self.conn.execute(stmt)]
        messages = 0
        for start in range(0, len(still), ID_CHUNK):
            chunk = still[start:start + ID_CHUNK]
            messages += int(self.conn.execute(
                select(func.count()).select_from(MESSAGES).where(m.session_id.in_(chunk))).scalar() or 0)
        house = self._peer(HousekeepingRepository)
        house.delete_rows(still)
        house.queue_files(still, sessions_dir)
        return still, messages

    def estimate_delete(self, policy: RetentionPolicyRecord, others: Sequence[str],
                        protected: frozenset[str] = frozenset()) -> DeleteEstimate:
        size = _total(func.coalesce(self.dialect.text_bytes(m[c]), 0) for c in TEXT_COLUMNS)
        stmt = (select(s.id, func.count(m.id), func.coalesce(func.sum(size), 0))
                .select_from(SESSIONS.outerjoin(MESSAGES, m.session_id == s.id))
                .where(*self._deletable(policy, others), s.id.is_not(None)).group_by(s.id))
        rows = [r for r in self.conn.execute(stmt) if r[0] not in protected]
        return DeleteEstimate(len(rows), sum(int(r[1] or 0) for r in rows), sum(int(r[2] or 0) for r in rows))

    # ------------------------------------------------------------------ redacting

    def messages_to_redact(self, policy: RetentionPolicyRecord, others: Sequence[str], after_id: int,
                           limit: int, protected: frozenset[str] = frozenset()) -> tuple[list[int], int | None]:
        """The next page of messages the policy redacts now, in id order: up to ``limit``
        rows above ``after_id``, those of ``protected`` sessions left out. Returns their
        ids and the page's last id (None: no more)."""
        stmt = (select(m.id, m.session_id).select_from(MESSAGES.join(SESSIONS, s.id == m.session_id))
                .where(m.id > after_id, self._redactable(policy, others)).order_by(m.id).limit(limit))
        rows = self.conn.execute(stmt).all()
        if not rows:
            return [], None
        return [int(r[0]) for r in rows if r[1] not in protected], int(rows[-1][0])

    def redact(self, ids: Sequence[int], policy: RetentionPolicyRecord, others: Sequence[str]) -> tuple[int, int]:
        """Replace the tool outputs and reasoning of those of ``ids`` the policy still
        redacts (age, session and protection checked again: a session pinned meanwhile
        keeps its rows). Returns (tool outputs, reasoning rows) replaced."""
        assert policy.redact_after_days is not None
        governed = select(s.id).where(*self.covered(policy, others))
        cutoff = self.cutoff(policy.redact_after_days)
        tools = reasoning = 0
        for start in range(0, len(ids), ID_CHUNK):
            chunk = list(ids[start:start + ID_CHUNK])
            due = [m.id.in_(chunk), m.timestamp < cutoff, m.session_id.in_(governed)]
            tools += int(self.conn.execute(
                update(MESSAGES).where(*due, TOOL_OUTPUT).values(content=RETENTION_TOOL_MARKER)
            ).rowcount or 0)
            values: dict[str, Any] = {}
            for c in REASONING_TEXT:
                values[c] = _marker_if_long(m[c])
            for c in REASONING_JSON:
                values[c] = None
            reasoning += int(self.conn.execute(
                update(MESSAGES).where(*due, REASONING).values(**values)).rowcount or 0)
        return tools, reasoning

    def estimate_redact(self, policy: RetentionPolicyRecord, others: Sequence[str],
                        protected: frozenset[str] = frozenset()) -> RedactEstimate:
        joined = MESSAGES.join(SESSIONS, s.id == m.session_id)
        where = self._redactable(policy, others)
        tb = self.dialect.text_bytes
        tool_bytes = func.sum(tb(m.content)).filter(TOOL_OUTPUT)
        reasoning_size = _total(func.coalesce(tb(m[c]), 0) for c in (*REASONING_TEXT, *REASONING_JSON))
        stmt = (select(m.session_id, func.count().filter(TOOL_OUTPUT), func.coalesce(tool_bytes, 0),
                       func.count().filter(REASONING),
                       func.coalesce(func.sum(reasoning_size).filter(REASONING), 0))
                .select_from(joined).where(where).group_by(m.session_id))
        rows = [r for r in self.conn.execute(stmt) if r[0] not in protected]
        return RedactEstimate(*(sum(int(r[k] or 0) for r in rows) for k in range(1, 5)))


def _total(terms: Iterable[Any]) -> Any:
    """``a + b + ...`` of SQL expressions."""
    return reduce(operator.add, terms)


def _marker_if_long(column: Any) -> Any:
    """The reasoning marker where ``column`` holds more than it, else the value as it is."""
    return case((_longer_than_marker(column, RETENTION_REASONING_MARKER), RETENTION_REASONING_MARKER),
                else_=column)


__all__ = [
    "POLICIES",
    "DeleteEstimate",
    "RedactEstimate",
    "RetentionPolicyRecord",
    "RetentionRepository",
    "check_days",
]
