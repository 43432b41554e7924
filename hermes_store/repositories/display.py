"""Display fields, reactions, resume/export sizes and small transcript readers (Hermes v24-v26).

Reactions live inside a message's ``display_metadata`` JSON object, under
:data:`REACTIONS_METADATA_KEY`: a list of ``{emoji, author, at[, seen]}``, one per
author. They are read and rewritten in the caller's write transaction, the row locked
first (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite's write transaction already holds
the file), so two authors reacting at once both land.
"""

from __future__ import annotations

import json
from typing import Any
from collections.abc import Iterable

from sqlalchemy import func, select, update

from .. import errors
from ..codec import check_key, clean_text, decode_content, message_preview
from ..skills import describe_skill_invocation, is_context_summary, is_skill_invocation, skill_preview_source
from .base import ID_CHUNK, MESSAGES, SESSIONS, Repository
from .lineage import BRANCH_MARKER, LineageRepository, _marker

#: Where reactions live in ``display_metadata`` (Hermes' ``REACTIONS_METADATA_KEY``).
REACTIONS_METADATA_KEY = "reactions"
#: Roles ``latest_message_row_id`` answers for.
TEXT_ROLES = ("user", "assistant")

M = MESSAGES.c
S = SESSIONS.c


def decode_display_metadata(value: Any) -> dict[str, Any] | None:
    """A stored ``display_metadata`` as Hermes' readers give it: a JSON object → dict
    (one extra layer of JSON string unwrapped); anything else → None."""
    if not isinstance(value, str) or not value:
        return None
    for _ in range(2):
        try:
            value = json.loads(value)
        except ValueError:
            return None
        if isinstance(value, dict):
            return value
        if not isinstance(value, str):
            return None
    return None


def encode_display_metadata(value: Any) -> str | None:
    """What a write stores: a dict as JSON, a JSON string only if it holds an object, else NULL."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str) and decode_display_metadata(value) is not None:
        return clean_text(value)
    return None


def _text_of(content: Any) -> str:
    """A message's text (multimodal: its text parts joined)."""
    value = decode_content(content)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if value is None else str(value)


def _reactions(metadata: dict[str, Any] | None) -> list[dict[str, Any]]:
    found = (metadata or {}).get(REACTIONS_METADATA_KEY)
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def _row_id(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise errors.InvalidInputError(f"{name} must be an integer, not {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise errors.InvalidInputError(f"{name} must be an integer, not {value!r}") from exc


#: Rows read per statement while looking for the newest non-blank turn.
_SCAN_BATCH = 64


class DisplayRepository(Repository):
    # ------------------------------------------------------------------ resume / export sizes

    def resume_message_count(self, session_id: str) -> int:
        """Live rows over the parent chain (every parent link; an explicit branch counts
        only its own rows, as its resume loads only those)."""
        if not session_id:
            return 0
        config = self.conn.execute(select(S.model_config).where(S.id == session_id)).first()
        if config is None:
            return 0
        ids = [session_id] if _marker(config[0], BRANCH_MARKER) else \
            (LineageRepository(self.conn).ancestors(session_id) or [session_id])
        total = 0
        for start in range(0, len(ids), ID_CHUNK):
            total += int(self.conn.execute(
                select(func.count()).select_from(MESSAGES)
                .where(M.session_id.in_(ids[start:start + ID_CHUNK]), M.active == 1)
            ).scalar() or 0)
        return total

    def export_message_count(self, session_id: str) -> int:
        """Live rows of one session."""
        if not session_id:
            return 0
        return int(self.conn.execute(
            select(func.count()).select_from(MESSAGES).where(M.session_id == session_id, M.active == 1)
        ).scalar() or 0)

    # ------------------------------------------------------------------ pickers

    def recent_user_messages(self, session_id: str, limit: int, include_inactive: bool) -> list[dict[str, Any]]:
        """Hermes v25 ``list_recent_user_messages``: user turns newest first, as
        ``{id, timestamp, preview}``, leaving out display events (a ``display_kind``)
        and compaction handoffs; a skill turn previews as ``/skill — instruction``.
        Reads ``2*limit+5`` rows, as Hermes does, so skipped rows rarely starve the page."""
        if session_id is None or limit <= 0:
            return []
        q = select(M.id, M.timestamp, M.content).where(M.session_id == session_id, M.role == "user")
        if "display_kind" in self.columns_of("messages"):
            q = q.where(func.coalesce(M.display_kind, "") == "")
        if not include_inactive:
            q = q.where(M.active == 1)
        q = q.order_by(M.id.desc()).limit(2 * limit + 5)
        out: list[dict[str, Any]] = []
        for mid, ts, content in self.conn.execute(q).fetchall():
            value = decode_content(content)
            if is_context_summary(value):
                continue
            if is_skill_invocation(value):
                value = describe_skill_invocation(skill_preview_source(value)) or value
            out.append({"id": int(mid), "timestamp": ts, "preview": message_preview(value)})
            if len(out) >= limit:
                break
        return out

    def latest_row_id(self, session_id: str, role: str, offset: int, require_text: bool) -> int | None:
        """The ``offset``-th newest live user/assistant row (blank ones skipped with ``require_text``)."""
        if not session_id or role not in TEXT_ROLES or offset < 0:
            return None
        q = select(M.id, M.content).where(M.session_id == session_id, M.role == role, M.active == 1) \
            .order_by(M.id.desc())
        if not require_text:
            found = self.conn.execute(q.limit(1).offset(offset)).first()
            return None if found is None else int(found[0])
        seen, skip = 0, 0
        while True:
            batch = self.conn.execute(q.limit(_SCAN_BATCH).offset(skip)).fetchall()
            for mid, content in batch:
                if _text_of(content).strip():
                    if seen == offset:
                        return int(mid)
                    seen += 1
            if len(batch) < _SCAN_BATCH:
                return None
            skip += _SCAN_BATCH

    def message_role(self, session_id: str, row_id: int) -> str | None:
        found = self.conn.execute(select(M.role).where(M.id == row_id, M.session_id == session_id)).first()
        return None if found is None else found[0]

    def pr_url_messages(self, session_ids: Iterable[str]) -> list[dict[str, Any]]:
        """Tool rows of these sessions whose text holds ``/pull/``: ``{session_id, content}``."""
        ids = [i for i in dict.fromkeys(session_ids) if isinstance(i, str) and i]
        out: list[dict[str, Any]] = []
        for start in range(0, len(ids), ID_CHUNK):
            rows = self.conn.execute(
                select(M.session_id, M.content)
                .where(M.session_id.in_(ids[start:start + ID_CHUNK]), M.role == "tool",
                       M.content.like("%/pull/%"))
                .order_by(M.id)
            ).fetchall()
            out += [{"session_id": sid, "content": _text_of(c)} for sid, c in rows]
        return out

    # ------------------------------------------------------------------ display kinds

    def stamp_latest_matching(self, session_id: str, role: str, content: str, kind: str,
                              metadata: Any) -> bool:
        """Set ``display_kind`` (and ``display_metadata`` when given) on the newest live
        row of that role and content."""
        check_key(session_id, "session id")
        newest = self.conn.execute(
            select(func.max(M.id)).where(M.session_id == session_id, M.role == role, M.active == 1,
                                         M.content == clean_text(content))
        ).scalar()
        if newest is None:
            return False
        values: dict[str, Any] = {"display_kind": clean_text(kind)}
        if metadata is not None:
            values["display_metadata"] = encode_display_metadata(metadata)
        self.conn.execute(update(MESSAGES).where(M.id == newest).values(**values))
        return True

    # ------------------------------------------------------------------ reactions

    def _locked_metadata(self, session_id: str, row_id: int) -> tuple[bool, dict[str, Any] | None]:
        found = self.conn.execute(
            select(M.display_metadata).where(M.id == row_id, M.session_id == session_id).with_for_update()
        ).first()
        return (False, None) if found is None else (True, decode_display_metadata(found[0]))

    def _store_reactions(self, row_id: int, metadata: dict[str, Any] | None,
                         reactions: list[dict[str, Any]]) -> None:
        updated = dict(metadata or {})
        if reactions:
            updated[REACTIONS_METADATA_KEY] = reactions
        else:
            updated.pop(REACTIONS_METADATA_KEY, None)
        self.conn.execute(update(MESSAGES).where(M.id == row_id)
                          .values(display_metadata=encode_display_metadata(updated) if updated else None))

    def set_reaction(self, session_id: str, row_id: Any, emoji: str | None, author: str
                     ) -> list[dict[str, Any]] | None:
        """One reaction per author: the old one goes; the same emoji again toggles it
        off; None clears. None when the row is not in the session."""
        row = _row_id(row_id, "message_row_id")
        present, metadata = self._locked_metadata(session_id, row)
        if not present:
            return None
        reactions = _reactions(metadata)
        previous = [r for r in reactions if r.get("author") == author]
        kept = [r for r in reactions if r.get("author") != author]
        if emoji is not None and not any(r.get("emoji") == emoji for r in previous):
            kept.append({"emoji": clean_text(emoji), "author": author, "at": self.now()})
        if kept != reactions:
            self._store_reactions(row, metadata, kept)
        return kept

    def reactions(self, session_id: str, row_id: Any) -> list[dict[str, Any]]:
        found = self.conn.execute(
            select(M.display_metadata).where(M.id == _row_id(row_id, "message_row_id"), M.session_id == session_id)
        ).first()
        return [] if found is None else _reactions(decode_display_metadata(found[0]))

    def take_unseen(self, session_id: str, author: str) -> list[dict[str, Any]]:
        """The author's reactions not yet seen, each returned once: marked ``seen``."""
        rows = self.conn.execute(
            select(M.id, M.role, M.content, M.display_metadata)
            .where(M.session_id == session_id, M.display_metadata.like(f'%"{REACTIONS_METADATA_KEY}"%'))
            .order_by(M.id).with_for_update()
        ).fetchall()
        taken: list[dict[str, Any]] = []
        for mid, role, content, stored in rows:
            metadata = decode_display_metadata(stored)
            reactions = _reactions(metadata)
            fresh = [r for r in reactions if r.get("author") == author and not r.get("seen")]
            if not fresh:
                continue
            for r in fresh:
                r["seen"] = True
                taken.append({"row_id": int(mid), "role": role, "emoji": r.get("emoji"), "text": _text_of(content)})
            self._store_reactions(int(mid), metadata, reactions)
        return taken


__all__ = ["REACTIONS_METADATA_KEY", "DisplayRepository", "decode_display_metadata", "encode_display_metadata"]
