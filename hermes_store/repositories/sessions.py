"""Sessions: creation, ending, updates and titles (listing lives in listing.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast
from collections.abc import Callable, Iterable, Mapping, Sequence

from sqlalchemy import String, and_, bindparam, case, func, literal, or_, select, update
from sqlalchemy.exc import IntegrityError

from .. import errors
from ..keys import COMPRESSION_END_REASON, RESET_END_REASONS, RESET_MARKER
from ..codec import check_key, clean_text, text_from_bytes
from ..dialects import Dialect
from ..models import Base
from ..tenant_schema import SchemaSQL
from ..titles import TITLE_SOURCE_USER, TITLE_SOURCES, automatic_title_lands, sanitize_title, split_title_number
from .base import (
    MESSAGES,
    SESSIONS,
    Repository,
    TableKey,
    UnknownFieldError,
    like_prefix,
    per_dialect,
    table_key,
    table_of,
)
from .lineage import compression_ancestors, compression_lineage_ids
from .records import SessionRecord

_PROMPTS = SchemaSQL("SELECT hash, prompt FROM {system_prompts} WHERE hash IN :hashes",
                     bindparam("hashes", expanding=True))
_NUMBERED = SchemaSQL("SELECT id, title, started_at FROM {sessions} WHERE title = :t OR title LIKE :p ESCAPE '\\'")
#: What ``create_session`` / ``ensure_session`` accept (Hermes v26: v23's list plus the
#: gateway's ``display_name`` / ``origin_json``); anything else is a TypeError.
CREATE_FIELDS = (
    "model", "model_config", "system_prompt", "user_id", "session_key", "chat_id", "chat_type", "thread_id",
    "parent_session_id", "cwd", "profile_name", "git_repo_root", "display_name", "origin_json",
)
#: Set once, at creation: a later create/ensure of the same id never changes them (v23),
#: not even from NULL (a user id filled in afterwards could hand a session to someone else).
NEVER_REFILLED = ("source", "user_id", "started_at")
#: Copied from the parent into a new child's NULL columns (v23; ``profile_name`` from v26)...
INHERITED = ("cwd", "git_repo_root", "git_branch", "profile_name")
#: ...and these too when the parent ended with 'compression': the continuation is the
#: same conversation, so it keeps the gateway routing. A delegate of a live parent does not.
INHERITED_BY_CONTINUATION = (
    "user_id", "session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json",
)
#: End reasons a session reset may replace (the others are explicit and kept).
RESETTABLE_END_REASONS = ("agent_close", "ws_orphan_reap")
#: Hermes bounds an activity description to this many characters (v24).
ACTIVITY_DESCRIPTION_CHARS = 120
#: The ``model_config`` key of a runtime (browser) model lock; a model switch drops it.
RUNTIME_LOCK_KEY = "browser_model_lock"


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


def config_dict(value: Any) -> dict[str, Any] | None:
    """A stored ``model_config`` as a dict: {} when empty, None when it is not a JSON object."""
    if isinstance(value, dict):
        return dict(value)
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _config_text(config: Mapping[str, Any]) -> str | None:
    """What is stored for a config: its JSON, NULL when empty (as create_session does)."""
    return json.dumps(config, ensure_ascii=False) if config else None


def _stripped(value: Any) -> str | None:
    """A git field as stored: stripped text, None when blank or not text."""
    return value.strip() or None if isinstance(value, str) else None


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
        started = cols.pop("started_at", None) or self.now()  # before the names: listed once
        names = ("id", "source", "started_at", *cols)
        values = {"id": session_id, "source": source, "started_at": started, **cols}
        target = table_key(self.conn, "sessions", (*names, "system_prompt") if stored is not None else names)
        self._exec(_create(self.conn, target, names, stored is not None), values)
        if stored is not None:
            self.drop_unused_prompts([stored])  # the session already had one
        if "model_config" in cols:
            self._fill_reset_only_config(session_id, cols["model_config"])
        if parent:
            self._inherit_from_parent(session_id)
        return session_id

    def _fill_reset_only_config(self, session_id: str, given: Any) -> None:
        """A stored config that holds only ``_reset_from`` (a reset child created before its
        agent knew its model) takes the incoming config, keeping the marker (v26)."""
        stored = self._scalar("SELECT model_config FROM {sessions} WHERE id = :id", {"id": session_id})
        held, incoming = config_dict(stored), config_dict(given)
        if held is None or set(held) != {RESET_MARKER} or not incoming:
            return
        merged = {**incoming, RESET_MARKER: held[RESET_MARKER]}
        if merged != held:
            self.conn.execute(update(SESSIONS).where(SESSIONS.c.id == session_id)
                              .values(model_config=_config_text(merged)))

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
        names = INHERITED + (INHERITED_BY_CONTINUATION if row["end_reason"] == COMPRESSION_END_REASON else ())
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

    def _resolved(self, row: dict[str, Any] | None) -> SessionRecord | None:
        """A ``SELECT *`` row of sessions, prompt resolved: a :class:`SessionRecord`."""
        if row is not None:
            self.resolve_prompts([row])
        return cast("SessionRecord | None", row)

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
                {"t": self.now(), "r": end_reason, "id": session_id},
            )
            > 0
        )

    def reopen(self, session_id: str) -> bool:
        """Clear the end; reset children known only by Hermes' legacy rule get their marker first.

        A child keyed like its parent (a non-empty ``session_key``) counts as that parent's reset child only while the
        parent stays ended with a reset reason; reopening would turn it into an ordinary
        resume target, so it is stamped ``_reset_from = parent`` first (Hermes v26 §5.2).
        """
        self._stamp_legacy_reset_children(session_id)
        return self._exec(
            "UPDATE {sessions} SET ended_at = NULL, end_reason = NULL WHERE id = :id", {"id": session_id}
        ) > 0

    def _stamp_legacy_reset_children(self, session_id: str) -> None:
        child, parent = SESSIONS.alias("child"), SESSIONS.alias("parent")
        rows = self.conn.execute(
            select(child.c.id, child.c.model_config)
            .select_from(child.join(parent, parent.c.id == child.c.parent_session_id))
            .where(
                parent.c.id == session_id,
                parent.c.end_reason.in_(RESET_END_REASONS),
                child.c.session_key.is_not(None), child.c.session_key != "",
                child.c.session_key == parent.c.session_key,
            )
        ).fetchall()
        for child_id, stored in rows:
            config = config_dict(stored)
            if config is None or RESET_MARKER in config:
                continue  # marked already, or a config we cannot read (left as it is)
            config[RESET_MARKER] = session_id
            self.conn.execute(update(SESSIONS).where(SESSIONS.c.id == child_id)
                              .values(model_config=_config_text(config)))

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
            .values(ended_at=self.now(), end_reason=reason)
        )
        return result.rowcount > 0

    def update_cwd(self, session_id: str, cwd: str, git_branch: str | None, git_repo_root: str | None,
                   replace_git_meta: bool = False) -> int | None:
        """Set the working directory and claim a new ``git_metadata_generation`` (Hermes v26).

        A new cwd (or ``replace_git_meta``) replaces both git fields with the stripped
        arguments, blank ones clearing them; the same cwd keeps a field unless given
        non-blank. Decided in the one UPDATE, against the row as it was. Returns the
        generation claimed (compare-and-set key of publish_git_metadata), None for an
        unknown id.
        """
        s = SESSIONS.c
        values: dict[str, Any] = {"cwd": cwd}
        moved = s.cwd.is_distinct_from(cwd)
        for name, value in (("git_branch", _stripped(git_branch)), ("git_repo_root", _stripped(git_repo_root))):
            given = literal(value, String)
            if replace_git_meta:
                values[name] = value
            else:
                values[name] = case((moved, given), else_=s[name] if value is None else given)
        counted = "git_metadata_generation" in self.columns_of("sessions")
        if counted:
            values["git_metadata_generation"] = func.coalesce(s.git_metadata_generation, 0) + 1
        if self.conn.execute(update(SESSIONS).where(s.id == session_id).values(values)).rowcount == 0:
            return None
        if not counted:
            return None
        return int(self.conn.execute(select(s.git_metadata_generation).where(s.id == session_id)).scalar_one())

    def publish_git_metadata(self, session_id: str, cwd: str, generation: int, git_branch: str | None,
                             git_repo_root: str | None) -> bool:
        """Write the non-blank git fields of a lookup begun at ``generation`` (Hermes v26).

        Lands only while the row still has that exact cwd and generation: any claim
        made since (another cwd and back, the same cwd again, another process) wins.
        """
        s = SESSIONS.c
        values = {name: v for name, v in (("git_branch", _stripped(git_branch)),
                                          ("git_repo_root", _stripped(git_repo_root))) if v is not None}
        if not values:
            return False
        stmt = (update(SESSIONS)
                .where(s.id == session_id, s.cwd == cwd, s.git_metadata_generation == generation)
                .values(values))
        return self.conn.execute(stmt).rowcount > 0

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

    # ------------------------------------------------------------------ model_config (v23-late..v26)

    def edit_config(self, session_id: str, edit: Callable[[dict[str, Any]], None], **fields: Any) -> bool:
        """Change ``model_config`` in place by ``edit`` (read with the row locked, so two
        edits never lose one another on a server), with other columns in the same
        UPDATE. An empty result is stored as NULL; False for an unknown id.

        A stored value that is not a JSON object is unreadable to Hermes as well and
        is replaced by the edit of an empty config.
        """
        s = SESSIONS.c
        found = self.conn.execute(select(s.model_config).where(s.id == session_id).with_for_update()).first()
        if found is None:
            return False
        config = config_dict(found[0]) or {}
        edit(config)
        return self.update_fields(session_id, model_config=_config_text(config), **fields)

    def config_value(self, session_id: str, key: str, default: Any = None) -> Any:
        """One key of the session's ``model_config``; ``default`` when absent or unreadable."""
        config = config_dict(self._scalar("SELECT model_config FROM {sessions} WHERE id = :id", {"id": session_id}))
        return default if not config or key not in config else config[key]

    def patch_config(self, session_id: str, patch: Mapping[str, Any]) -> bool:
        """Merge ``patch`` into ``model_config``: a None value deletes its key."""
        def merge(config: dict[str, Any]) -> None:
            for key, value in patch.items():
                if value is None:
                    config.pop(key, None)
                else:
                    config[key] = value
        return self.edit_config(session_id, merge)

    def update_model(self, session_id: str, model: str | None, provider: str | None) -> bool:
        """Switch the session's model (Hermes v25): the runtime lock goes, the config
        names the model (when given) and provider (when not None), other keys and the
        lineage markers stay; the prompt is cleared so the agent rebuilds it."""
        def switch(config: dict[str, Any]) -> None:
            config.pop(RUNTIME_LOCK_KEY, None)
            if model:
                config["model"] = model
            if provider is not None:
                config["provider"] = provider
        return self.edit_config(session_id, switch, model=model, system_prompt=None)

    def update_runtime_lock(self, session_id: str, lock: Mapping[str, Any], model: str | None) -> bool:
        """Record the runtime model lock in ``model_config``; ``model`` set when given;
        the prompt cleared (it names the model)."""
        def set_lock(config: dict[str, Any]) -> None:
            config[RUNTIME_LOCK_KEY] = dict(lock)
        fields: dict[str, Any] = {"system_prompt": None}
        if model is not None:
            fields["model"] = model
        return self.edit_config(session_id, set_lock, **fields)

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
        when = self.now() if at is None else float(at)
        return self.update_fields(
            session_id,
            last_activity_at=when,
            last_activity_description=description,
            last_activity_provenance=provenance,
        )

    # ------------------------------------------------------------------ activity (v23-late)

    def touch_activity(self, session_id: str, at: float, description: str, provenance: str) -> bool:
        """Stamp the activity triple unless the stored stamp is as new or newer."""
        s = SESSIONS.c
        stmt = (update(SESSIONS)
                .where(s.id == session_id, or_(s.last_activity_at.is_(None), s.last_activity_at < at))
                .values(last_activity_at=at, last_activity_description=description,
                        last_activity_provenance=provenance))
        return self.conn.execute(stmt).rowcount > 0

    def clear_activity_labels(self, session_id: str) -> bool:
        """Blank what the last activity was (its time stays); no write when already blank."""
        s = SESSIONS.c
        labelled = or_(func.coalesce(s.last_activity_description, "") != "",
                       func.coalesce(s.last_activity_provenance, "unknown") != "unknown")
        stmt = (update(SESSIONS).where(s.id == session_id, labelled)
                .values(last_activity_description="", last_activity_provenance="unknown"))
        return self.conn.execute(stmt).rowcount > 0

    def activity(self, session_id: str) -> dict[str, Any] | None:
        s = SESSIONS.c
        row = self.conn.execute(
            select(s.last_activity_at, s.last_activity_description, s.last_activity_provenance)
            .where(s.id == session_id)
        ).mappings().first()
        return None if row is None else dict(row)

    # ------------------------------------------------------------------ lineage-wide flags

    def set_on_lineage(self, session_id: str, **values: Any) -> bool:
        """Set columns on the session's whole compression lineage; True if any row matched.

        The lineage is set_session_archived's: ancestors reached through parents that
        ended 'compression', then every child of any member that itself ended
        'compression', recursively (UNION keeps a corrupt cycle finite).
        """
        stmt = update(SESSIONS).where(SESSIONS.c.id.in_(compression_lineage_ids(session_id))).values(values)
        return self.conn.execute(stmt).rowcount > 0

    # ------------------------------------------------------------------ lifecycle (v26)

    def last_messages(self, session_ids: Sequence[str]) -> dict[str, tuple[str | None, Any, str | None]]:
        """``(role, tool_calls, finish_reason)`` of each session's newest active message
        (highest id); sessions without one are left out."""
        m = MESSAGES.c
        newest = (select(func.max(m.id)).where(m.session_id.in_(bindparam("ids", expanding=True)), m.active == 1)
                  .group_by(m.session_id))
        stmt = select(m.session_id, m.role, m.tool_calls, m.finish_reason).where(m.id.in_(newest))
        out: dict[str, tuple[str | None, Any, str | None]] = {}
        ids = list(dict.fromkeys(session_ids))
        for start in range(0, len(ids), 500):
            for sid, role, calls, finish in self.conn.execute(stmt, {"ids": ids[start:start + 500]}):
                out[sid] = (role, calls, finish)
        return out

    # ------------------------------------------------------------------ titles

    def set_title(self, session_id: str, title: str | None, title_source: str = TITLE_SOURCE_USER) -> bool:
        """Set a sanitized title with its provenance (Hermes v25 ``title_source``).

        A person's title ('user') always lands; a title that cleans to nothing clears
        the title and its source. An automatic one ('llm', 'derived') lands only on an
        untitled row or over a strictly lower-ranked title (see
        :func:`hermes_store.titles.automatic_title_lands`); one that cleans to nothing
        writes nothing (True on an untitled row, else False).

        A title held by another session raises TitleConflictError, unless that session
        is a compression ancestor of this one (up through parents that ended with
        'compression'): the title then moves here and the ancestor's is cleared. The
        row is read locked and written as a compare-and-swap on that read, so a
        decision is never applied over a title that changed meanwhile.
        """
        if title_source not in TITLE_SOURCES:
            raise errors.InvalidInputError(f"title_source must be one of {TITLE_SOURCES}, not {title_source!r}")
        clean = sanitize_title(title)
        s = SESSIONS.c
        ranked = "title_source" in self.columns_of("sessions")
        read = select(s.title, s.title_source if ranked else literal(None, String)).where(s.id == session_id)
        current = self.conn.execute(read.with_for_update()).first()
        if title_source != TITLE_SOURCE_USER:
            if current is None or not automatic_title_lands(current[0], current[1], title_source):
                return False
            if clean is None:
                return current[0] is None
        holder = None
        if clean is not None:
            holder = self.conn.execute(
                select(s.id).where(s.title == clean, s.id != session_id).limit(1)
            ).scalar()
            if holder is not None and not self.is_compression_ancestor(holder, session_id):
                raise errors.TitleConflictError(f"Title '{clean}' is already in use by session {holder}")
        if current is None:
            return False
        values: dict[str, Any] = {"title": clean}
        same = [s.id == session_id, s.title.is_not_distinct_from(current[0])]
        if ranked:
            values["title_source"] = None if clean is None else title_source
            same.append(s.title_source.is_not_distinct_from(current[1]))
        if holder is not None:
            cleared: dict[str, Any] = {"title": None}
            if ranked:
                cleared["title_source"] = None
            self.conn.execute(update(SESSIONS).where(s.id == holder).values(cleared))
        try:
            return self.conn.execute(update(SESSIONS).where(and_(*same)).values(values)).rowcount > 0
        except IntegrityError as exc:  # a concurrent writer took it between check and update
            raise errors.TitleConflictError(f"Title '{clean}' is already in use") from exc

    def get_title_source(self, session_id: str) -> str | None:
        source: str | None = self._scalar("SELECT title_source FROM {sessions} WHERE id = :id", {"id": session_id})
        return source

    def set_title_source(self, session_id: str, source: str) -> bool:
        """Re-label who set the title of a titled row; False for an untitled or unknown one."""
        s = SESSIONS.c
        stmt = update(SESSIONS).where(s.id == session_id, s.title.is_not(None)).values(title_source=source)
        return self.conn.execute(stmt).rowcount > 0

    def is_compression_ancestor(self, candidate: str, session_id: str) -> bool:
        """Whether ``candidate`` is reached from ``session_id`` going up through parents
        that ended with 'compression' (the session's earlier selves). Cycle-safe: the
        walk is a UNION, so a session seen twice stops it."""
        up = compression_ancestors(session_id)
        found = self.conn.execute(select(up.c.id).where(up.c.id == candidate).limit(1)).first()
        return found is not None

    def get_title(self, session_id: str) -> str | None:
        title: str | None = self._scalar("SELECT title FROM {sessions} WHERE id = :id", {"id": session_id})
        return title

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

