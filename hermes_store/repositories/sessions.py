"""Sessions: creation, ending, updates and titles (listing lives in listing.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Sequence

from sqlalchemy import bindparam, case, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from .. import errors
from ..codec import check_key, clean_text, text_from_bytes
from ..dialects import Dialect
from ..models import Base
from ..tenancy import SchemaSQL
from ..titles import sanitize_title, split_title_number
from .base import (
    MESSAGES,
    SESSIONS,
    Repository,
    TableKey,
    UnknownFieldError,
    like_prefix,
    now,
    per_dialect,
    table_key,
    table_of,
)
from .records import SessionRecord

_PROMPTS = SchemaSQL("SELECT hash, prompt FROM {system_prompts} WHERE hash IN :hashes",
                     bindparam("hashes", expanding=True))
_NUMBERED = SchemaSQL("SELECT id, title, started_at FROM {sessions} WHERE title = :t OR title LIKE :p ESCAPE '\\'")
#: What ``create_session`` / ``ensure_session`` accept (Hermes v23); anything else is a TypeError.
CREATE_FIELDS = (
    "model", "model_config", "system_prompt", "user_id", "session_key", "chat_id", "chat_type", "thread_id",
    "parent_session_id", "cwd", "profile_name", "git_repo_root",
)
#: Set once, at creation: a later create/ensure of the same id never changes them (v23),
#: not even from NULL (a user id filled in afterwards could hand a session to someone else).
NEVER_REFILLED = ("source", "user_id", "started_at")
#: Copied from the parent into a new child's NULL columns (v23)...
INHERITED = ("cwd", "git_repo_root", "git_branch")
#: ...and these too when the parent ended with 'compression': the continuation is the
#: same conversation, so it keeps the gateway routing. A delegate of a live parent does not.
INHERITED_BY_CONTINUATION = ("user_id", "session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json")
#: End reasons a session reset may replace (the others are explicit and kept).
RESETTABLE_END_REASONS = ("agent_close", "ws_orphan_reap")
#: Hermes bounds an activity description to this many characters (v24).
ACTIVITY_DESCRIPTION_CHARS = 120
#: Title provenance, lowest rank first: an automatic title never replaces a user one (v25).
TITLE_SOURCES = ("derived", "llm", "user")


PROMPTS = Base.metadata.tables["system_prompts"]


@per_dialect
def _create(dialect: Dialect, target: TableKey, names: tuple[str, ...], prompt_stored: bool) -> Any:
    """Hermes v23's create upsert of these columns: on an existing id, every given column
    but :data:`NEVER_REFILLED` fills a NULL only. ``prompt_stored``: the prompt's hash
    was stored just now (v25), and fills only a row that has no inline prompt either."""
    sessions = table_of(target)
    ins = dialect.insert(sessions)
    fills: dict[str, Any] = {}
    for c in names[3:]:  # id, source and started_at come first
        if c in NEVER_REFILLED:
            continue
        if c == "system_prompt_hash" and prompt_stored:
            fills[c] = func.coalesce(
                sessions.c.system_prompt_hash,
                case((sessions.c.system_prompt.is_(None), ins.excluded.system_prompt_hash)),
            )
        else:
            fills[c] = func.coalesce(sessions.c[c], ins.excluded[c])
    if not fills:
        return ins.on_conflict_do_nothing(index_elements=["id"])
    return ins.on_conflict_do_update(index_elements=["id"], set_=fills)


@per_dialect
def _store_prompt(dialect: Dialect) -> Any:
    """A prompt is stored once per distinct text: a clash (same hash) keeps the row."""
    return dialect.insert(PROMPTS).on_conflict_do_nothing()


def _json_field(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False) if value else None
    return value


def prompt_hash(prompt: str) -> str:
    """Hermes v25's key of a stored system prompt: SHA-256 of its UTF-8 bytes, hex."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def _prompt_text(value: Any) -> str:
    """A system prompt as storable text (bytes as strict UTF-8, lone surrogates as U+FFFD)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return text_from_bytes(value, "system_prompt")
    if not isinstance(value, str):
        raise errors.InvalidInputError(f"system_prompt must be str, not {type(value).__name__}")
    return clean_text(value)


class SessionRepository(Repository):
    """Everything about rows of ``sessions`` (messages live in MessageRepository)."""

    # ------------------------------------------------------------------ lifecycle

    def create(self, session_id: str, source: str, **fields: Any) -> str:
        """Insert a session; if the id exists keep the row and fill only its NULL fields.

        Hermes v23's upsert: ``source``, ``user_id`` and ``started_at`` are never
        changed on an existing row; the other given fields fill NULLs only. With a
        ``parent_session_id`` the child then inherits the parent's cwd/git columns, and
        its routing columns too when the parent ended with 'compression' (NULLs only).
        Any known column may be given here (the facade restricts it to Hermes' list).
        """
        check_key(session_id, "session id")
        parent = fields.get("parent_session_id")
        cols = {k: _json_field(v) for k, v in fields.items() if v is not None}
        unknown = set(cols) - self.columns_of("sessions")
        if unknown:
            raise UnknownFieldError(f"unknown session fields: {sorted(map(str, unknown))}")
        stored = None
        if "system_prompt" in cols and self.prompts_hashed():
            # v25: the text goes to system_prompts; the session keeps its hash. An
            # existing session keeps the prompt it has (inline or hashed).
            stored = self.store_prompt(cols.pop("system_prompt"))
            cols["system_prompt_hash"] = stored
        started = cols.pop("started_at", None) or now()  # before the names: listed once
        names = ("id", "source", "started_at", *cols)
        values = {"id": session_id, "source": source, "started_at": started, **cols}
        target = table_key(self.conn, "sessions", (*names, "system_prompt") if stored is not None else names)
        self._exec(_create(self.conn, target, names, stored is not None), values)
        if stored is not None:
            self.drop_unused_prompts([stored])  # the session already had one
        if parent:
            self._inherit_from_parent(session_id)
        return session_id

    def _inherit_from_parent(self, session_id: str) -> None:
        """Fill the child's NULL workspace (and, after a compression, routing) columns.

        From the parent the row holds (an existing row keeps its first parent).
        """
        wanted = (*INHERITED, *INHERITED_BY_CONTINUATION)
        child, p = SESSIONS.alias("child"), SESSIONS
        row = self.conn.execute(
            select(p.c.end_reason, *(p.c[c] for c in wanted))
            .select_from(child.join(p, p.c.id == child.c.parent_session_id))
            .where(child.c.id == session_id)
        ).mappings().first()
        if row is None:
            return
        names = INHERITED + (INHERITED_BY_CONTINUATION if row["end_reason"] == "compression" else ())
        values = {c: func.coalesce(SESSIONS.c[c], row[c]) for c in names if row[c] is not None}
        if values:
            self.conn.execute(update(SESSIONS).where(SESSIONS.c.id == session_id).values(values))

    # ------------------------------------------------------------------ system prompts (v25)

    def prompts_hashed(self) -> bool:
        """Whether this file stores prompts once, by hash (Hermes v25 and later)."""
        return self.has_table("system_prompts") and "system_prompt_hash" in self.columns_of("sessions")

    def store_prompt(self, prompt: Any) -> str:
        """Keep ``prompt`` in system_prompts (once per distinct text); returns its hash."""
        text = _prompt_text(prompt)
        digest = prompt_hash(text)
        self._exec(_store_prompt(self.conn), {"hash": digest, "prompt": text})
        return digest

    def drop_unused_prompts(self, hashes: Iterable[str | None] | None = None) -> int:
        """Delete stored prompts no session points at (only ``hashes``, or all).

        Hermes collects these after deletes and prunes; a prompt replaced by
        update_system_prompt is collected at once, since nothing else can use it.
        """
        if not self.prompts_hashed():
            return 0
        unused = "NOT EXISTS (SELECT 1 FROM {sessions} WHERE sessions.system_prompt_hash = system_prompts.hash)"
        if hashes is None:
            return self._exec(f"DELETE FROM {{system_prompts}} WHERE {unused}")
        return sum(
            self._exec(f"DELETE FROM {{system_prompts}} WHERE hash = :h AND {unused}", {"h": h})
            for h in set(hashes) if h is not None
        )

    def resolve_prompts(self, rows: Sequence[dict[str, Any]]) -> None:
        """Put the full text into each row's ``system_prompt``, as Hermes' reads do.

        ``COALESCE(system_prompts.prompt, sessions.system_prompt)``: a hashed prompt is
        read from system_prompts; an inline one (a file not fully migrated, or written
        by an older Hermes) is read as it is. Rows are changed in place.
        """
        hashes = sorted({r["system_prompt_hash"] for r in rows if r.get("system_prompt_hash") is not None})
        if not hashes or not self.has_table("system_prompts"):
            return
        texts: dict[str, str] = {}
        for start in range(0, len(hashes), 500):
            chunk = hashes[start:start + 500]
            texts.update(self.conn.execute(_PROMPTS.on(self.conn), {"hashes": chunk}).fetchall())
        for row in rows:
            text = texts.get(row.get("system_prompt_hash"))  # type: ignore[arg-type]
            if text is not None:
                row["system_prompt"] = text

    def _resolved(self, row: dict[str, Any] | None) -> Any:
        if row is not None:
            self.resolve_prompts([row])
        return row

    def ensure(self, session_id: str, source: str = "unknown", model: str | None = None, **fields: Any) -> str:
        return self.create(session_id, source, model=model, **fields)

    def get(self, session_id: str) -> SessionRecord | None:
        """The session row; ``system_prompt`` holds the full text however it is stored."""
        return self._resolved(self._one("SELECT * FROM {sessions} WHERE id = :id", {"id": session_id}))

    def exists(self, session_id: str) -> bool:
        return self.session_exists(session_id)

    def get_many(self, session_ids: Iterable[str]) -> dict[str, SessionRecord]:
        """Rows of these sessions by id (unknown ids left out), prompts resolved."""
        ids = list(dict.fromkeys(session_ids))
        rows: list[dict[str, Any]] = []
        stmt = select(SESSIONS).where(SESSIONS.c.id.in_(bindparam("ids", expanding=True)))
        for start in range(0, len(ids), 500):
            result = self.conn.execute(stmt, {"ids": ids[start:start + 500]})
            rows += [dict(r) for r in result.mappings()]
        self.resolve_prompts(rows)
        return {r["id"]: r for r in rows}  # type: ignore[misc]

    def ids_with_prefix(self, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` session ids starting with ``prefix`` (``_``/``%`` literal), sorted."""
        stmt = (select(SESSIONS.c.id).where(SESSIONS.c.id.like(like_prefix(prefix), escape="\\"))
                .order_by(SESSIONS.c.id).limit(limit))
        return [r[0] for r in self.conn.execute(stmt)]

    def totals(self, source: str | None = None) -> dict[str, int]:
        """How many sessions and messages there are (of one source, or all)."""
        sessions = select(func.count()).select_from(SESSIONS)
        messages = select(func.count()).select_from(MESSAGES.join(SESSIONS, SESSIONS.c.id == MESSAGES.c.session_id))
        if source is not None:
            sessions = sessions.where(SESSIONS.c.source == source)
            messages = messages.where(SESSIONS.c.source == source)
        return {"sessions": int(self.conn.execute(sessions).scalar() or 0),
                "messages": int(self.conn.execute(messages).scalar() or 0)}

    def end(self, session_id: str, end_reason: str | None) -> bool:
        """First end wins: an already-ended session keeps its end time and reason."""
        return (
            self._exec(
                "UPDATE {sessions} SET ended_at = :t, end_reason = :r WHERE id = :id AND ended_at IS NULL",
                {"t": now(), "r": end_reason, "id": session_id},
            )
            > 0
        )

    def reopen(self, session_id: str) -> bool:
        return self._exec(
            "UPDATE {sessions} SET ended_at = NULL, end_reason = NULL WHERE id = :id", {"id": session_id}
        ) > 0

    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> bool:
        """Replace the session's prompt (None clears it); stored by hash from v25."""
        return self.update_fields(session_id, system_prompt=system_prompt)

    def promote_to_reset(self, session_id: str, reason: str) -> bool:
        """End the session with ``reason`` unless it already ended for an explicit reason.

        An open session, or one closed only by an agent shutdown or an orphaned
        websocket reap, takes the reset; True iff the row changed.
        """
        s = SESSIONS.c
        result = self.conn.execute(
            update(SESSIONS)
            .where(s.id == session_id, or_(s.ended_at.is_(None), s.end_reason.in_(RESETTABLE_END_REASONS)))
            .values(ended_at=now(), end_reason=reason)
        )
        return result.rowcount > 0

    def update_cwd(self, session_id: str, cwd: str, git_branch: str | None, git_repo_root: str | None) -> None:
        """Set the working directory, and the git branch/root when given non-blank (stripped).

        A blank branch or root never clears the stored one. Every such write also
        advances ``git_metadata_generation`` (Hermes v26's compare-and-set guard), so a
        late asynchronous git lookup by a newer Hermes cannot overwrite it.
        """
        s = SESSIONS.c
        values: dict[str, Any] = {"cwd": cwd}
        for name, value in (("git_branch", git_branch), ("git_repo_root", git_repo_root)):
            if isinstance(value, str) and value.strip():
                values[name] = value.strip()
        if "git_metadata_generation" in self.columns_of("sessions"):
            values["git_metadata_generation"] = func.coalesce(s.git_metadata_generation, 0) + 1
        self.conn.execute(update(SESSIONS).where(s.id == session_id).values(values))

    def backfill_repo_roots(self, pairs: Sequence[tuple[str, str]]) -> int:
        """Give sessions in each exact ``cwd`` its repo root where they have none; rows changed."""
        s = SESSIONS.c
        changed = 0
        for cwd, root in pairs:
            changed += self.conn.execute(
                update(SESSIONS)
                .where(s.cwd == cwd, or_(s.git_repo_root.is_(None), s.git_repo_root == ""))
                .values(git_repo_root=root)
            ).rowcount
        return changed

    def update_meta(self, session_id: str, model_config_json: str | None, model: str | None) -> bool:
        """Replace ``model_config`` as given; set ``model`` only when one is given."""
        fields: dict[str, Any] = {"model_config": model_config_json}
        if model is not None:
            fields["model"] = model
        return self.update_fields(session_id, **fields)

    def update_billing_route(self, session_id: str, provider: str | None, base_url: str | None,
                             billing_mode: str | None) -> bool:
        """Switch the billing route; the system prompt is cleared so the agent rebuilds it.

        The mode is kept when None. From v25 the prompt's hash is cleared too (reads
        resolve the text through it) and a prompt nothing uses any more is collected.
        """
        fields: dict[str, Any] = {"billing_provider": provider, "billing_base_url": base_url, "system_prompt": None}
        if billing_mode is not None:
            fields["billing_mode"] = billing_mode
        return self.update_fields(session_id, **fields)

    def distinct_cwds(self, include_archived: bool = False) -> list[dict[str, Any]]:
        """One entry per exact working directory: how many sessions, and when last active.

        ``last_active`` is the latest end (or start) of those sessions; blank cwds are
        skipped, archived sessions only counted when asked. Ordered by cwd.
        """
        s = SESSIONS.c
        last = func.max(func.coalesce(s.ended_at, s.started_at, 0.0))
        stmt = (
            select(s.cwd, func.count().label("sessions"), last.label("last_active"))
            .where(s.cwd.is_not(None), func.trim(s.cwd) != "")
            .group_by(s.cwd)
            .order_by(s.cwd)
        )
        if not include_archived:
            stmt = stmt.where(func.coalesce(s.archived, 0) == 0)
        return [
            {"cwd": cwd, "sessions": int(n), "last_active": float(la or 0.0)}
            for cwd, n, la in self.conn.execute(stmt)
        ]

    def update_fields(self, session_id: str, **fields: Any) -> bool:
        """Set arbitrary known columns (cwd, archived, hidden, pinned, title_source...).

        No fields is a no-op that reports whether the session exists; an unknown field
        raises UnknownFieldError (a TypeError too), and None for a NOT NULL column
        (hidden, pinned, archived...) InvalidInputError, before anything is written.
        ``system_prompt`` is stored the way the file stores prompts (by hash from v25).
        """
        if not fields:
            return self.exists(session_id)
        unknown = set(fields) - self.columns_of("sessions")
        if unknown:
            raise UnknownFieldError(f"unknown session fields: {sorted(map(str, unknown))}")
        required = sorted(k for k, v in fields.items() if v is None and k in self.not_null_columns("sessions"))
        if required:
            raise errors.InvalidInputError(f"session fields {required} cannot be None (NOT NULL columns)")
        values = {k: _json_field(v) for k, v in fields.items()}
        old_hash = None
        if "system_prompt" in values and self.prompts_hashed():
            old_hash = self._scalar("SELECT system_prompt_hash FROM {sessions} WHERE id = :id", {"id": session_id})
            prompt = values["system_prompt"]
            values["system_prompt_hash"] = None if prompt is None else self.store_prompt(prompt)
            values["system_prompt"] = None  # new writes never fill the legacy column (v25)
        sets = ", ".join(f"{k} = :{k}" for k in values)
        changed = self._exec(f"UPDATE {{sessions}} SET {sets} WHERE id = :_id", {**values, "_id": session_id}) > 0
        if "system_prompt_hash" in values:
            self.drop_unused_prompts([old_hash, values["system_prompt_hash"]])
        return changed

    def record_activity(
        self, session_id: str, description: str | None = None, provenance: str | None = "unknown",
        at: float | None = None,
    ) -> bool:
        """Stamp a sign of life (v24): ``last_activity_at`` and what it was.

        The description is cut to Hermes' 120 characters. Listings then count the
        session as active at ``at`` (default now) even without a new message.
        """
        if description is not None:
            description = clean_text(str(description))[:ACTIVITY_DESCRIPTION_CHARS]
        when = now() if at is None else float(at)
        return self.update_fields(
            session_id,
            last_activity_at=when,
            last_activity_description=description,
            last_activity_provenance=provenance,
        )

    # ------------------------------------------------------------------ titles

    def set_title(self, session_id: str, title: str | None, title_source: str = "user",
                  *, only_if_empty: bool = False) -> bool:
        """Set a sanitized title (Hermes v23 ``set_session_title`` / ``set_auto_title_if_empty``).

        A title held by another session raises TitleConflictError, unless that session
        is a compression ancestor of this one (up through parents that ended with
        'compression'): the title then moves here and the ancestor's is cleared.

        From v25 the title's provenance goes to ``title_source`` ('user' for a title
        set by a person, as Hermes records it; 'llm' / 'derived' for automatic ones).
        An automatic title never replaces a higher-ranked one (user > llm > derived),
        nor a title of unknown source: the call then returns False and changes
        nothing. Clearing the title clears its source.

        ``only_if_empty``: write only while the session has no title (checked in this
        transaction); False for a missing or titled row, True (nothing written) for a
        title that cleans to nothing on an untitled row.
        """
        if title_source not in TITLE_SOURCES:
            raise errors.InvalidInputError(f"title_source must be one of {TITLE_SOURCES}, not {title_source!r}")
        clean = sanitize_title(title)
        s = SESSIONS.c
        ranked = "title_source" in self.columns_of("sessions")
        # Which rows may take this title: any (a person's title), an untitled one
        # (only_if_empty), or one whose title ranks no higher (an automatic title).
        if only_if_empty:
            may_take = s.title.is_(None)
        elif ranked and title_source != "user":
            lower = TITLE_SOURCES[: TITLE_SOURCES.index(title_source) + 1]
            may_take = or_(s.title.is_(None), s.title_source.in_(lower))
        else:
            may_take = None
        if only_if_empty:
            current = self.conn.execute(select(s.title).where(s.id == session_id)).first()
            if current is None or current[0] is not None:
                return False
            if clean is None:
                return True
        holder = None
        if clean is not None:
            holder = self.conn.execute(
                select(s.id).where(s.title == clean, s.id != session_id).limit(1)
            ).scalar()
            if holder is not None and not self.is_compression_ancestor(holder, session_id):
                raise errors.TitleConflictError(f"Title '{clean}' is already in use by session {holder}")
        target = s.id == session_id
        if may_take is not None:
            target = target & may_take
        if holder is not None:
            # Check before the ancestor gives its title up: a call that changes
            # nothing here must not clear it there.
            if self.conn.execute(select(s.id).where(target)).first() is None:
                return False
            cleared: dict[str, Any] = {"title": None}
            if ranked:
                cleared["title_source"] = None
            self.conn.execute(update(SESSIONS).where(s.id == holder).values(cleared))
        values: dict[str, Any] = {"title": clean}
        if ranked:
            values["title_source"] = None if clean is None else title_source
        try:
            return self.conn.execute(update(SESSIONS).where(target).values(values)).rowcount > 0
        except IntegrityError as exc:  # a concurrent writer took it between check and update
            raise errors.TitleConflictError(f"Title '{clean}' is already in use") from exc

    def is_compression_ancestor(self, candidate: str, session_id: str) -> bool:
        """Whether ``candidate`` is reached from ``session_id`` going up through parents
        that ended with 'compression' (the session's earlier selves). Cycle-safe: the
        walk is a UNION, so a session seen twice stops it."""
        child, parent = SESSIONS.alias("child"), SESSIONS.alias("parent")
        seed = (
            select(parent.c.id)
            .select_from(child.join(parent, parent.c.id == child.c.parent_session_id))
            .where(child.c.id == session_id, parent.c.end_reason == "compression")
        )
        up = seed.cte("up", recursive=True)
        step_child, step_parent = SESSIONS.alias("step_child"), SESSIONS.alias("step_parent")
        up = up.union(
            select(step_parent.c.id)
            .select_from(
                up.join(step_child, step_child.c.id == up.c.id)
                .join(step_parent, step_parent.c.id == step_child.c.parent_session_id)
            )
            .where(step_parent.c.end_reason == "compression")
        )
        found = self.conn.execute(select(up.c.id).where(up.c.id == candidate).limit(1)).first()
        return found is not None

    def get_title(self, session_id: str) -> str | None:
        return self._scalar("SELECT title FROM {sessions} WHERE id = :id", {"id": session_id})

    def get_by_title(self, title: str) -> SessionRecord | None:
        return self._resolved(self._one("SELECT * FROM {sessions} WHERE title = :t", {"t": title}))

    def _numbered(self, base: str) -> list[tuple[str, int | None, float]]:
        """Sessions titled ``base`` (N None) or ``base #N``: (id, N, started_at)."""
        rows = self.conn.execute(
            _NUMBERED.on(self.conn),
            {"t": base, "p": like_prefix(base + " #")},
        ).fetchall()
        out: list[tuple[str, int | None, float]] = []
        for sid, title, started in rows:
            if title == base:
                out.append((sid, None, started))
                continue
            b, n = split_title_number(title)
            if b == base and n is not None:
                out.append((sid, n, started))
        return out

    def resolve_by_title(self, title: str) -> str | None:
        """The most recently started ``title #N`` session if any, else the one titled ``title``."""
        rows = self._numbered(title)
        numbered = [r for r in rows if r[1] is not None]
        if numbered:
            return max(numbered, key=lambda r: (r[2], r[1]))[0]
        return rows[0][0] if rows else None

    def next_title_in_lineage(self, base_title: str) -> str:
        base, _n = split_title_number(base_title)
        rows = self._numbered(base)
        if not any(n is None for _id, n, _t in rows):
            return base
        return f"{base} #{max(n or 1 for _id, n, _t in rows) + 1}"

    # ------------------------------------------------------------------ lookup

    def resolve_id(self, id_or_prefix: str) -> str | None:
        """Exact id, else the only id starting with the prefix (``_``/``%`` literal)."""
        if not id_or_prefix:
            return None
        if self.exists(id_or_prefix):
            return id_or_prefix
        rows = self.ids_with_prefix(id_or_prefix, 2)
        return rows[0] if len(rows) == 1 else None

    # ------------------------------------------------------------------ listing

