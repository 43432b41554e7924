"""Archive, delete, prune, empty sessions, and whole-session export/import (Hermes v23).

Every statement is SQLAlchemy Core against the model tables, the same on SQLite and
PostgreSQL. Transcript files of deleted sessions are queued on the connection and
removed only after the transaction commits (see ``transcripts.remove_committed_files``).

Where Hermes' SQL would match more than the caller asked for, this module is stricter:
the ``*_like`` filters and ``cwd_prefix`` take ``_``/``%`` literally, and ``cwd_prefix``
compares the folder exactly (case-sensitively) on both backends.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import case, delete, exists, func, literal, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from .. import errors
from ..keys import COMPRESSION_END_REASON, DAY
from ..codec import clean_text
from ..models import Base
from .base import ID_CHUNK, MESSAGES, SESSIONS, Clock, Repository, insert_or_skip, missing_sessions
from .lineage import DELEGATE_MARKER, LineageRepository, compression_lineage_ids, parent_chain
from .messages import ASSISTANT_JSON, MessageRepository
from .sessions import SessionRepository
from .transcripts import queue_transcript_files

USAGE = Base.metadata.tables["session_model_usage"]

# ---------------------------------------------------------------------- the filter table

#: Exact-match filters on the column of the same name.
EXACT_FILTERS = ("source", "end_reason", "user_id", "chat_id", "chat_type")
#: Case-insensitive substring filters → column.
LIKE_FILTERS = {"title_like": "title", "model_like": "model", "branch_like": "git_branch"}
#: ``min_x``/``max_x`` bounds → what they bound.
RANGE_FILTERS = ("messages", "tokens", "cost", "tool_calls")
FILTER_NAMES = frozenset(
    {"started_before", "started_after", "last_active_before", "last_active_after", "provider", "cwd_prefix",
     "archived", *EXACT_FILTERS, *LIKE_FILTERS}
    | {f"{side}_{name}" for side in ("min", "max") for name in RANGE_FILTERS}
)
#: What list_prune_candidates returns per session (in this order; ``last_active`` since v25).
CANDIDATE_COLUMNS = ("id", "source", "title", "model", "started_at", "ended_at", "message_count", "archived",
                     "last_active")
#: Marker of a delegate (sub-agent) child in ``model_config``.


def check_filter_names(filters: Mapping[str, Any]) -> None:
    """Unknown filter names raise a TypeError (as an unexpected keyword would)."""
    unknown = sorted(set(filters) - FILTER_NAMES)
    if unknown:
        raise errors.UnknownFieldError(
            f"unknown session filter(s): {', '.join(map(repr, unknown))}; known: {', '.join(sorted(FILTER_NAMES))}"
        )


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and math.isnan(value)):
        raise errors.InvalidInputError(f"{name} must be a number, not {value!r}")
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise errors.InvalidInputError(f"{name} must be a string, not {type(value).__name__}")
    return clean_text(value)


def like_escape(value: str) -> str:
    """``value`` for a LIKE pattern with ESCAPE '\\': ``\\``, ``%`` and ``_`` match themselves."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def cwd_prefix_condition(column: Any, cwd_prefix: str) -> ColumnElement[bool]:
    """``column`` is the folder ``cwd_prefix`` or a path below it (``/`` or ``\\`` after it).

    Trailing separators of the prefix are ignored, as in Hermes. The comparison is on
    the leading characters, not a LIKE pattern: ``_`` and ``%`` in folder names are
    plain characters and the match is case-sensitive on both backends (Hermes' LIKE
    was case-insensitive on SQLite only).
    """
    base = cwd_prefix.rstrip("/\\")
    below = [base + "/", base + "\\"]
    return or_(
        column == base,
        *(func.substr(column, 1, func.length(literal(p))) == literal(p) for p in below),
    )


def message_recency() -> ColumnElement[Any]:
    """Prune's ``last_active`` (Hermes v25): the newest message's time, else ``started_at``."""
    newest = select(func.max(MESSAGES.c.timestamp)).where(MESSAGES.c.session_id == SESSIONS.c.id).scalar_subquery()
    return func.coalesce(newest, SESSIONS.c.started_at)


def activity_recency() -> ColumnElement[Any]:
    """Hermes' general ``last_active``: the later of ``last_activity_at`` and the newest
    message's time (either may be NULL), else ``started_at``."""
    stamp = SESSIONS.c.last_activity_at
    newest = select(func.max(MESSAGES.c.timestamp)).where(MESSAGES.c.session_id == SESSIONS.c.id).scalar_subquery()
    later = case((stamp.is_(None), newest), (newest.is_(None), stamp), (stamp > newest, stamp), else_=newest)
    return func.coalesce(later, SESSIONS.c.started_at)


def filter_conditions(
    older_than_days: float | None, source: str | None, filters: Mapping[str, Any], clock: float,
    *, ended: bool = True,
) -> list[ColumnElement[bool]]:
    """The WHERE conditions of Hermes' prune/archive filter table (AND-ed).

    ``ended``: only ended sessions (prune never takes a running one); False inverts the
    guard (count_open_prune_matches). ``older_than_days`` means inactivity (Hermes
    v25): unless ``last_active_before`` or ``started_before`` is given, it sets
    ``last_active_before = clock - days``. A filter given as None is not applied; any
    other value is (an empty string matches only an empty column).
    """
    check_filter_names(filters)
    s = SESSIONS.c
    f = dict(filters)
    if source is not None:
        f["source"] = source
    conds: list[ColumnElement[bool]] = [s.ended_at.is_not(None) if ended else s.ended_at.is_(None)]
    if older_than_days is not None:
        days = float(_number(older_than_days, "older_than_days"))
        if f.get("started_before") is None and f.get("last_active_before") is None:
            f["last_active_before"] = clock - days * DAY
    if f.get("started_before") is not None:
        conds.append(s.started_at < _number(f["started_before"], "started_before"))
    if f.get("started_after") is not None:
        conds.append(s.started_at >= _number(f["started_after"], "started_after"))
    if f.get("last_active_before") is not None:
        conds.append(message_recency() < _number(f["last_active_before"], "last_active_before"))
    if f.get("last_active_after") is not None:
        conds.append(message_recency() >= _number(f["last_active_after"], "last_active_after"))
    for name in EXACT_FILTERS:
        if f.get(name) is not None:
            conds.append(s[name] == _text(f[name], name))
    if f.get("provider") is not None:
        conds.append(func.lower(s.billing_provider) == func.lower(_text(f["provider"], "provider")))
    for name, col in LIKE_FILTERS.items():
        if f.get(name) is not None:
            conds.append(s[col].ilike(f"%{like_escape(_text(f[name], name))}%", escape="\\"))
    if f.get("cwd_prefix") is not None:
        conds.append(cwd_prefix_condition(s.cwd, _text(f["cwd_prefix"], "cwd_prefix")))
    measures = {
        "messages": s.message_count,
        "tokens": func.coalesce(s.input_tokens, 0) + func.coalesce(s.output_tokens, 0),
        "cost": func.coalesce(s.actual_cost_usd, s.estimated_cost_usd, 0),
        "tool_calls": s.tool_call_count,
    }
    for name, expr in measures.items():
        low, high = f.get(f"min_{name}"), f.get(f"max_{name}")
        if low is not None:
            conds.append(expr >= _number(low, f"min_{name}"))
        if high is not None:
            conds.append(expr <= _number(high, f"max_{name}"))
    archived = f.get("archived")
    if archived is not None:
        if archived not in (True, False):  # 0/1 pass: they equal False/True
            raise errors.InvalidInputError(f"archived must be True, False or None, not {archived!r}")
        conds.append(s.archived != 0 if archived else s.archived == 0)
    return conds


def _chunks(ids: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(ids), ID_CHUNK):
        yield list(ids[start:start + ID_CHUNK])


def _delegate_marker(config: Any) -> Any:
    """The ``_delegate_from`` value of a model_config text (None when absent or not JSON).

    Decided here rather than in SQL: PostgreSQL has no cast of possibly malformed text
    to JSON that does not raise, and SQLite's rule (valid JSON only) is easy to match.
    """
    if not isinstance(config, str):
        return None
    try:
        value = json.loads(config)
    except ValueError:
        return None
    return value.get(DELEGATE_MARKER) if isinstance(value, dict) else None


class HousekeepingRepository(Repository):
    """Whole sessions: archive flags, deletes with their cascades, export and import."""

    # ------------------------------------------------------------------ candidates

    def candidates(
        self,
        older_than_days: float | None,
        source: str | None,
        filters: Mapping[str, Any],
        *,
        columns: Sequence[str] = CANDIDATE_COLUMNS,
        lock: bool = False,
        keep_pinned: bool = True,
    ) -> list[dict[str, Any]]:
        """Ended sessions matching the filter table, oldest start first (then id).

        ``keep_pinned``: pinned sessions are never candidates (ours; Hermes v25 prunes
        them too). ``lock``: rows are locked for the rest of the transaction
        (PostgreSQL; SQLite's BEGIN IMMEDIATE already serializes writers), so a
        message appended meanwhile makes the row re-checked instead of deleted under it.
        """
        picked = [message_recency().label("last_active") if c == "last_active" else SESSIONS.c[c] for c in columns]
        conds = filter_conditions(older_than_days, source, filters, self.now())
        if keep_pinned:
            conds.append(SESSIONS.c.pinned == 0)
        stmt = select(*picked).where(*conds).order_by(SESSIONS.c.started_at, SESSIONS.c.id)
        if lock:
            stmt = stmt.with_for_update(of=SESSIONS)
        return [dict(r) for r in self.conn.execute(stmt).mappings()]

    def count_open_matches(self, older_than_days: float | None, source: str | None,
                           filters: Mapping[str, Any]) -> int:
        """Sessions still running that the filter table matches (the ended guard inverted)."""
        conds = filter_conditions(older_than_days, source, filters, self.now(), ended=False)
        return int(self.conn.execute(select(func.count()).select_from(SESSIONS).where(*conds)).scalar() or 0)

    # ------------------------------------------------------------------ archive

    def set_archived(self, session_id: str, archived: bool) -> bool:
        """Flag the whole compression lineage of ``session_id``; True if any row matched.

        The lineage: ancestors reached through parents that ended 'compression', then
        every child of any member that itself ended 'compression' (delegate and branch
        children of such members included), recursively. UNION keeps a corrupt cycle
        finite.
        """
        s = SESSIONS
        stmt = update(s).where(s.c.id.in_(compression_lineage_ids(session_id))).values(archived=1 if archived else 0)
        return self.conn.execute(stmt).rowcount > 0

    def archive(self, older_than_days: float | None, source: str | None, filters: Mapping[str, Any]) -> int:
        """Archive the lineage of every candidate (pinned ones too, as Hermes); returns
        how many candidates matched."""
        found = self.candidates(older_than_days, source, filters, columns=("id",), keep_pinned=False)
        for row in found:
            self.set_archived(row["id"], True)
        return len(found)

    def archive_stale(self, cutoff: float, *, exclude_pinned: bool, ended_only: bool = False) -> int:
        """Archive, with their lineages, unarchived sessions idle since before ``cutoff``
        (any end but 'compression'); ``ended_only`` leaves running ones alone. Returns
        how many sessions matched."""
        s = SESSIONS.c
        conds = [s.archived == 0, or_(s.end_reason.is_(None), s.end_reason != COMPRESSION_END_REASON),
                 activity_recency() < cutoff]
        if exclude_pinned:
            conds.append(s.pinned == 0)
        if ended_only:
            conds.append(s.ended_at.is_not(None))
        ids = [r[0] for r in self.conn.execute(select(s.id).where(*conds).order_by(s.started_at, s.id))]
        for sid in ids:
            self.set_archived(sid, True)
        return len(ids)

    # ------------------------------------------------------------------ delete

    def delete_rows(self, ids: Sequence[str]) -> None:
        """Delete these sessions with their messages and usage rows; children are orphaned.

        Children are detached chunk by chunk before the rows go, so a session and its
        parent may sit in different chunks without breaking the parent reference.
        """
        ids = list(dict.fromkeys(ids))
        if not ids:
            return
        ledger = self.has_table("session_model_usage")
        for chunk in _chunks(ids):
            self.conn.execute(
                update(SESSIONS).where(SESSIONS.c.parent_session_id.in_(chunk)).values(parent_session_id=None)
            )
            self.conn.execute(delete(MESSAGES).where(MESSAGES.c.session_id.in_(chunk)))
            if ledger:
                self.conn.execute(delete(USAGE).where(USAGE.c.session_id.in_(chunk)))
            self.conn.execute(delete(SESSIONS).where(SESSIONS.c.id.in_(chunk)))
        self._peer(SessionRepository).drop_unused_prompts()  # as Hermes does after deletes

    def queue_files(self, ids: Iterable[str], sessions_dir: str | Path | None) -> None:
        """Queue the transcript files of deleted sessions for removal after commit."""
        if sessions_dir is None:
            return
        queue_transcript_files(self.conn, list(ids), sessions_dir, self.session_exists)

    def delegate_children(self, parent_ids: Iterable[str]) -> list[str]:
        """Every delegate child of ``parent_ids``, recursively, the parents left out.

        A child is a session whose ``model_config._delegate_from`` names a doomed
        session, or whose parent is doomed and which carries the marker at all (e.g.
        ``"__orphaned__"``). Found breadth first, nearest first.
        """
        doomed = set(parent_ids)
        if not doomed:
            return []
        stmt = select(SESSIONS.c.id, SESSIONS.c.parent_session_id, SESSIONS.c.model_config).where(
            SESSIONS.c.model_config.like(f"%{like_escape(DELEGATE_MARKER)}%", escape="\\")
        )
        by_marker: dict[str, list[str]] = {}
        by_parent: dict[str, list[str]] = {}
        for sid, parent, config in self.conn.execute(stmt):
            marker = _delegate_marker(config)
            if marker is None:
                continue
            if isinstance(marker, str):
                by_marker.setdefault(marker, []).append(sid)
            if parent is not None:
                by_parent.setdefault(parent, []).append(sid)
        found: list[str] = []
        frontier = list(doomed)
        while frontier:
            nxt = []
            for pid in frontier:
                for sid in by_marker.get(pid, []) + by_parent.get(pid, []):
                    if sid not in doomed:
                        doomed.add(sid)
                        found.append(sid)
                        nxt.append(sid)
            frontier = nxt
        return found

    def delete_targets(self, session_id: str) -> list[str]:
        """What deleting ``session_id`` removes: itself, then its delegate cascade sorted;
        ``[]`` for an unknown id."""
        if not self.session_exists(session_id):
            return []
        return [session_id, *sorted(self.delegate_children([session_id]))]

    def delete_sessions(self, session_ids: Iterable[Any], sessions_dir: str | Path | None,
                        expected: Iterable[str] | None = None) -> int:
        """Delete the listed sessions and, recursively, their delegate children.

        Non-string and empty ids are dropped, duplicates counted once, unknown ids
        skipped. Other children are orphaned. ``expected``: the set of ids the delete
        would remove (listed ones and their cascade) must be exactly these, checked in
        this transaction, else nothing is deleted (0). Returns how many listed ids existed.
        """
        listed = [i for i in dict.fromkeys(x for x in session_ids if isinstance(x, str) and x)]
        if not listed:
            return 0
        missing = set(missing_sessions(self.conn, listed))
        present = [i for i in listed if i not in missing]
        if not present:
            return 0
        doomed = present + self.delegate_children(present)
        if expected is not None and set(doomed) != set(expected):
            return 0
        self.delete_rows(doomed)
        self.queue_files(doomed, sessions_dir)
        return len(present)

    def prune(self, older_than_days: float | None, source: str | None, sessions_dir: str | Path | None,
              filters: Mapping[str, Any]) -> int:
        """Delete the candidates (children orphaned, no delegate cascade, pinned sessions
        kept); returns the count."""
        ids = [r["id"] for r in self.candidates(older_than_days, source, filters, columns=("id",), lock=True)]
        self.delete_rows(ids)
        self.queue_files(ids, sessions_dir)
        return len(ids)

    # ------------------------------------------------------------------ empty sessions

    def delete_if_empty(self, session_id: str, sessions_dir: str | Path | None) -> bool:
        """Delete the session only if untitled, without any message row and without children.

        The row is locked first (PostgreSQL; a no-op on SQLite, whose writers are
        serialized), so a message or child added concurrently either lands before the
        check, and the session stays, or waits and then finds the session gone.
        """
        s = SESSIONS
        row = self.conn.execute(select(s.c.system_prompt_hash).where(s.c.id == session_id).with_for_update()).first()
        if row is None:
            return False
        kid = s.alias("k")
        stmt = delete(s).where(
            s.c.id == session_id,
            s.c.title.is_(None),
            ~exists(select(literal(1)).where(MESSAGES.c.session_id == session_id)),
            ~exists(select(literal(1)).select_from(kid).where(kid.c.parent_session_id == session_id)),
        )
        if self.conn.execute(stmt).rowcount != 1:
            return False
        if self.has_table("session_model_usage"):  # normally gone already by ON DELETE CASCADE
            self.conn.execute(delete(USAGE).where(USAGE.c.session_id == session_id))
        self._peer(SessionRepository).drop_unused_prompts([row[0]])
        self.queue_files([session_id], sessions_dir)
        return True

    @staticmethod
    def _empty() -> list[ColumnElement[bool]]:
        s = SESSIONS.c
        return [s.message_count == 0, s.ended_at.is_not(None), s.archived == 0]

    def count_empty(self) -> int:
        """Ended, unarchived sessions whose message counter is 0."""
        return int(self.conn.execute(select(func.count()).select_from(SESSIONS).where(*self._empty())).scalar() or 0)

    def delete_empty(self, sessions_dir: str | Path | None) -> int:
        """Delete what count_empty counts (children orphaned, stray messages deleted)."""
        stmt = select(SESSIONS.c.id).where(*self._empty()).order_by(SESSIONS.c.id).with_for_update()
        ids = [r[0] for r in self.conn.execute(stmt)]
        self.delete_rows(ids)
        self.queue_files(ids, sessions_dir)
        return len(ids)

    # ------------------------------------------------------------------ export

    def messages_of(self, session_id: str, include_inactive: bool = False) -> list[dict[str, Any]]:
        """Message rows exactly as get_messages returns them (live rows only unless asked)."""
        return self._peer(MessageRepository).get_messages(session_id, include_inactive)  # type: ignore[return-value]

    def export_session(self, session_id: str, include_inactive: bool = False) -> dict[str, Any] | None:
        """The session row (prompt resolved) plus ``messages`` and its ``model_usage`` rows."""
        row = self._peer(SessionRepository).get(session_id)
        if row is None:
            return None
        out = dict(row)
        out["messages"] = self.messages_of(session_id, include_inactive)
        if self.has_table("session_model_usage"):
            stmt = (select(USAGE).where(USAGE.c.session_id == session_id)
                    .order_by(USAGE.c.model, USAGE.c.task, USAGE.c.billing_provider,
                              USAGE.c.billing_base_url, USAGE.c.billing_mode))
            out["model_usage"] = [dict(r) for r in self.conn.execute(stmt).mappings()]
        return out

    def export_sessions(self, session_ids: Sequence[str], include_inactive: bool = False) -> list[dict[str, Any]]:
        """:meth:`export_session` of each id, in order; ids gone meanwhile are left out."""
        out = []
        for sid in session_ids:
            exported = self.export_session(sid, include_inactive)
            if exported is not None:
                out.append(exported)
        return out

    def export_lineage(self, session_id: str) -> list[dict[str, Any]]:
        """:meth:`export_session` of each session of the compression lineage, root first."""
        return self.export_sessions(self._peer(LineageRepository).compression_lineage(session_id))

    # ------------------------------------------------------------------ import (Hermes v23)

    def import_validated(self, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Insert entries already checked by the caller (SessionDB.import_sessions).

        Existing ids are skipped. A title another session already holds is dropped
        (the session is imported untitled and listed in ``titles_cleared``) instead of
        failing the batch. Parent links are restored last, when the parent exists and
        no cycle results; otherwise dropped and counted in ``detached``.
        """
        ids = [e["id"] for e in entries]
        existing = set(ids) - set(missing_sessions(self.conn, ids))
        imported: list[str] = []
        skipped: list[str] = []
        cleared: list[str] = []
        parents: list[tuple[str, Any]] = []
        sessions = self._peer(SessionRepository)
        messages = self._peer(MessageRepository)
        known = self.columns_of("sessions")
        for entry in entries:
            sid = entry["id"]
            if sid in existing:
                skipped.append(sid)
                continue
            row = _session_row(entry, known, self.now)
            if "system_prompt" in row and sessions.prompts_hashed():
                row["system_prompt_hash"] = sessions.store_prompt(row.pop("system_prompt"))
            inserted, title_cleared = self._insert_session(row)
            if not inserted:  # imported meanwhile by another writer (PostgreSQL): skip it
                sessions.drop_unused_prompts([row.get("system_prompt_hash")])
                skipped.append(sid)
                continue
            if title_cleared:
                cleared.append(sid)
            messages.replace(sid, [_message_item(m) for m in entry.get("messages") or []])
            imported.append(sid)
            parents.append((sid, entry.get("parent_session_id")))
        detached = 0
        for sid, parent in parents:
            if not parent:
                continue
            if parent == sid or not self.session_exists(parent) or sid in self._ancestors(parent):
                detached += 1
                continue
            self.conn.execute(update(SESSIONS).where(SESSIONS.c.id == sid).values(parent_session_id=parent))
        return {
            "ok": True,
            "imported": len(imported),
            "skipped": len(skipped),
            "detached": detached,
            "imported_ids": imported,
            "skipped_ids": skipped,
            "errors": [],
            "titles_cleared": cleared,
        }

    def _title_taken(self, title: str) -> bool:
        return self.conn.execute(select(literal(1)).where(SESSIONS.c.title == title).limit(1)).first() is not None

    def _insert_session(self, row: dict[str, Any]) -> tuple[bool, bool]:
        """Insert one imported row unless its id exists; returns (inserted, title dropped).

        A title someone else holds is dropped rather than failing the batch, also when
        a concurrent writer takes it between the check and the insert (the insert runs
        in a savepoint and is retried untitled).
        """
        cleared = False
        if row.get("title") is not None and self._title_taken(row["title"]):
            row.pop("title")
            cleared = True
        try:
            with self.conn.begin_nested():
                done = self._exec(insert_or_skip(self.conn, "sessions", row, ["id"]), row)
        except IntegrityError:
            if "title" not in row or not self._title_taken(row["title"]):
                raise
            row.pop("title")
            cleared = True
            done = self._exec(insert_or_skip(self.conn, "sessions", row, ["id"]), row)
        return done == 1, cleared

    def _ancestors(self, session_id: str) -> set[str]:
        """Ids on the parent chain above and including ``session_id`` (cycle-safe)."""
        up = parent_chain(session_id, name="import_up", depth=False)
        return {r[0] for r in self.conn.execute(select(up.c.id))}


#: Session columns an import copies (Hermes v23); everything else starts at its default
#: (gateway peer, handoff and rewind state are reset; the parent is linked afterwards).
IMPORT_SESSION_FIELDS = (
    "source", "user_id", "model", "model_config", "system_prompt", "started_at", "ended_at", "end_reason",
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
    "billing_provider", "billing_base_url", "billing_mode", "estimated_cost_usd", "actual_cost_usd",
    "cost_status", "cost_source", "pricing_version", "cwd", "git_branch", "git_repo_root", "title",
    "api_call_count", "archived",
)
#: JSON-ish message keys that an export may carry as JSON text: decoded before the
#: insert so the stored value is the same JSON, not a JSON string of it.
_DECODED_MESSAGE_KEYS = ASSISTANT_JSON


def _session_row(entry: Mapping[str, Any], known: frozenset[str], clock: Clock) -> dict[str, Any]:
    row: dict[str, Any] = {"id": entry["id"]}
    for key in IMPORT_SESSION_FIELDS:
        value = entry.get(key)
        if value is None or key not in known:
            continue
        if isinstance(value, str):
            value = clean_text(value)
        row[key] = value
    config = entry.get("model_config")
    if isinstance(config, dict):
        row["model_config"] = json.dumps(config) if config else None
    if not row.get("source"):
        row["source"] = "import"
    if row.get("started_at") is None:
        row["started_at"] = clock()
    if "archived" in row:
        row["archived"] = 1 if row["archived"] else 0
    return {k: v for k, v in row.items() if v is not None}


def _message_item(message: Mapping[str, Any]) -> dict[str, Any]:
    """One exported message as replace_messages takes it: always a live row."""
    item = {k: v for k, v in message.items() if k not in ("id", "session_id", "active", "compacted")}
    if item.get("platform_message_id") is None and item.get("message_id") is not None:
        item["platform_message_id"] = item["message_id"]
    item.pop("message_id", None)
    for key in _DECODED_MESSAGE_KEYS:
        value = item.get(key)
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if isinstance(parsed, (list, dict)):
                item[key] = parsed
    return item
