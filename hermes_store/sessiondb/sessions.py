"""Creating, reading and updating session rows (Hermes' session lifecycle methods)."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional

from ..errors import UnknownFieldError
from ..repositories import SessionRepository
from ..repositories.sessions import CREATE_FIELDS
from ._host import Host, as_dict, transcript_budget

log = logging.getLogger(__name__)


#: Ours, beyond Hermes' list: place a session in time (imports, demos, tests). It rides
#: in ``**kwargs`` because nothing may follow ``**kwargs`` in the signature.
EXTRA_CREATE_FIELDS = ("started_at",)


def _create_fields(method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Hermes v26's keyword list for create/ensure; anything else is a TypeError.

    UnknownFieldError is a TypeError (what Python raises for an unexpected keyword in
    Hermes' own code) and an InvalidInputError; nothing is written.
    """
    unknown = sorted(set(kwargs) - set(CREATE_FIELDS) - set(EXTRA_CREATE_FIELDS))
    if unknown:
        raise UnknownFieldError(
            f"unknown session fields: {unknown} "
            f"({method}() got an unexpected keyword argument {unknown[0]!r}; accepted: {', '.join(CREATE_FIELDS)})"
        )
    return kwargs


class SessionsMixin(Host):
    def create_session(self, session_id: str, source: str, **kwargs: Any) -> str:
        """Create the session, or fill the NULL fields of an existing one (v23 upsert).

        Keywords: model, model_config (dict, JSON-encoded), system_prompt, user_id,
        session_key, chat_id, chat_type, thread_id, parent_session_id, cwd,
        profile_name, git_repo_root, display_name, origin_json (v26). An existing row
        keeps its source, user_id and start; a stored config holding only the
        ``_reset_from`` marker takes the given one, marker kept (v26). A child inherits
        its parent's cwd/git columns and profile, and its routing columns when the
        parent ended with 'compression'. ``started_at=`` (ours) places the session in
        time, e.g. for imports and demos; default now.
        """
        fields = _create_fields("create_session", kwargs)
        return self._write(lambda c: SessionRepository(c).create(session_id, source, **fields),
                           budget=transcript_budget())

    def ensure_session(
        self, session_id: str, source: str = "unknown", model: Optional[str] = None, **kwargs: Any
    ) -> str:
        fields = _create_fields("ensure_session", kwargs)
        return self._write(lambda c: SessionRepository(c).ensure(session_id, source, model, **fields),
                           budget=transcript_budget())

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        return as_dict(self._read(lambda c: SessionRepository(c).get(session_id)))

    def end_session(self, session_id: str, end_reason: str | None) -> None:
        self._write(lambda c: SessionRepository(c).end(session_id, end_reason))

    def reopen_session(self, session_id: str) -> None:
        """Clear the end; legacy reset children get their ``_reset_from`` marker first (v26)."""
        self._write(lambda c: SessionRepository(c).reopen(session_id))

    def update_system_prompt(self, session_id: str, system_prompt: Optional[str]) -> None:
        """Replace the prompt (None clears it); stored once by hash (v25)."""
        self._write(lambda c: SessionRepository(c).update_system_prompt(session_id, system_prompt))

    def promote_to_session_reset(self, session_id: str, reason: str = "session_reset") -> bool:
        """End the session as reset unless it already ended for an explicit reason.

        Open sessions and ones closed by 'agent_close' / 'ws_orphan_reap' take it.
        True iff the row changed; False for a falsy or unknown id, a kept end, or any
        failure (logged, never raised: callers run it on their way out).
        """
        if not session_id:
            return False
        try:
            return self._write(lambda c: SessionRepository(c).promote_to_reset(session_id, reason))
        except Exception:
            log.warning("promote_to_session_reset(%r) failed", session_id, exc_info=True)
            return False

    def update_session_cwd(
        self,
        session_id: str,
        cwd: str,
        git_branch: Optional[str] = None,
        git_repo_root: Optional[str] = None,
        replace_git_meta: bool = False,
    ) -> Optional[int]:
        """Record the working directory and claim a new git metadata generation (v26).

        A changed cwd (or ``replace_git_meta``) replaces both git fields with the
        stripped arguments (blank clears); the same cwd keeps each unless given
        non-blank. Returns the generation for publish_session_git_metadata; None for
        a falsy id or cwd (nothing written) or an unknown row.
        """
        if not session_id or not cwd:
            return None
        path = os.fspath(cwd) if isinstance(cwd, os.PathLike) else cwd
        return self._write(lambda c: SessionRepository(c).update_cwd(
            session_id, path, git_branch, git_repo_root, bool(replace_git_meta)))

    def backfill_repo_roots(self, cwd_to_root: Dict[str, str]) -> None:
        """Set the repo root of sessions in each exact cwd that have none (one transaction)."""
        pairs = [(cwd, root) for cwd, root in (cwd_to_root or {}).items() if cwd and root]
        if not pairs:
            return
        self._write(lambda c: SessionRepository(c).backfill_repo_roots(pairs))

    def update_session_meta(self, session_id: str, model_config_json: str, model: Optional[str] = None) -> None:
        """Replace ``model_config`` with the given JSON text as is; set ``model`` when given."""
        self._write(lambda c: SessionRepository(c).update_meta(session_id, model_config_json, model))

    def update_session_model(self, session_id: str, model: str, provider: Optional[str] = None) -> None:
        """Switch the model (v25): ``model_config`` drops its runtime lock and names the
        model (when truthy) and provider (when given), markers kept; the column is set;
        the system prompt is cleared so the agent rebuilds it. Unknown id: no-op."""
        self._write(lambda c: SessionRepository(c).update_model(session_id, model, provider))

    def update_session_billing_route(
        self, session_id: str, *, provider: str, base_url: str, billing_mode: Optional[str] = None
    ) -> None:
        """Switch provider and base URL (mode kept when None) and clear the system
        prompt and its hash, so the agent rebuilds it for the new route."""
        self._write(lambda c: SessionRepository(c).update_billing_route(session_id, provider, base_url, billing_mode))

    def distinct_session_cwds(self, include_archived: bool = False) -> List[Dict[str, Any]]:
        """``[{"cwd", "sessions", "last_active"}]`` per exact cwd (children count; blank cwds skipped)."""
        return self._read(lambda c: SessionRepository(c).distinct_cwds(include_archived))

    def update_session(self, session_id: str, **fields: Any) -> bool:
        """Set other known session columns (cwd, archived, git_branch, hidden, pinned,
        title_source, last_read_at, ...). False for an unknown id."""
        return self._write(lambda c: SessionRepository(c).update_fields(session_id, **fields))

    def record_session_activity(
        self,
        session_id: str,
        description: Optional[str] = None,
        provenance: str | None = "unknown",
        at: Optional[float] = None,
    ) -> bool:
        """Stamp a sign of life without a message (v24 ``last_activity_*``).

        What Hermes' activity watchdog records during long tool calls or compression;
        listings then order the session by it. False for an unknown id.
        """
        return self._write(lambda c: SessionRepository(c).record_activity(session_id, description, provenance, at))

    def resolve_session_id(self, session_id_or_prefix: str) -> str | None:
        return self._read(lambda c: SessionRepository(c).resolve_id(session_id_or_prefix))
