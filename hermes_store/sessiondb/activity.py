"""Session activity stamps, lineage-wide flags (pinned, hidden, read), model config and git
metadata (Hermes v24-v26)."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, Dict, List, Optional, Union

from ..codec import clean_text
from ..errors import InvalidInputError
from ..repositories import SessionRepository
from ..keys import RESET_END_REASONS
from ..repositories.sessions import ACTIVITY_DESCRIPTION_CHARS, config_dict
from ..titles import TITLE_SOURCE_DERIVED, TITLE_SOURCE_LLM, TITLE_SOURCE_USER
from ._host import Host
from ..patch_points import facade_value

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__: list[str] = [
    "SESSION_STATUS_COMPLETE", "SESSION_STATUS_EMPTY", "SESSION_STATUS_ERROR", "SESSION_STATUS_INTERRUPTED",
    "TITLE_SOURCE_DERIVED", "TITLE_SOURCE_LLM", "TITLE_SOURCE_USER",
    "_BARE_BILLING_PROVIDERS", "_RESET_END_REASONS", "classify_session_status",
]

#: What session_lifecycle_statuses reports (Hermes v26).
SESSION_STATUS_COMPLETE = "complete"
SESSION_STATUS_INTERRUPTED = "interrupted"
SESSION_STATUS_ERROR = "error"
SESSION_STATUS_EMPTY = "empty"
#: Finish reasons of a turn that failed rather than stopped.
_ERROR_FINISH_REASONS = frozenset({"error", "agent_error", "content_filter"})

#: Billing providers that name no real route: the gateway resolves them again.
_BARE_BILLING_PROVIDERS = frozenset({"auto", "custom"})
#: End reasons of a session reset (Hermes' name; see repositories.sessions).
_RESET_END_REASONS = RESET_END_REASONS

#: Hermes' ``agent.session_activity.ActivityProvenance``: one of these values, as text or
#: as an enum member holding it; anything else is stored as "unknown".
ActivityProvenance = Union[str, Enum]
_PROVENANCES = ("unknown", "agent.compression", "agent.compression_timeout", "agent.compression_cooldown")
#: Retry budget of an activity stamp (seconds) unless the facade names its own: a
#: heartbeat is worth less than a wait.
ACTIVITY_BUDGET_S = 0.5
#: The gateway runtime keys read from the top level of ``model_config``.
_RUNTIME_KEYS = ("provider", "base_url", "api_mode")


def _activity_budget() -> float:
    """Hermes' ``_ACTIVITY_WRITE_PATIENCE_S`` as the facade holds it now (tests patch it)."""
    return float(facade_value("_ACTIVITY_WRITE_PATIENCE_S", ACTIVITY_BUDGET_S))


def classify_session_status(role: Optional[str], has_tool_calls: bool, finish_reason: Optional[str]) -> str:
    """How a session's last message left it (Hermes v26).

    A failed finish is an error; an assistant turn that asked for tools, or a user or
    tool message nobody answered, is interrupted; anything else is complete.
    """
    if finish_reason in _ERROR_FINISH_REASONS:
        return SESSION_STATUS_ERROR
    if role == "assistant":
        return SESSION_STATUS_INTERRUPTED if has_tool_calls else SESSION_STATUS_COMPLETE
    if role in ("user", "tool"):
        return SESSION_STATUS_INTERRUPTED
    return SESSION_STATUS_COMPLETE


def _has_tool_calls(stored: Any) -> bool:
    """Whether a stored ``tool_calls`` value asks for any call (text that is not JSON counts)."""
    if stored is None:
        return False
    if not isinstance(stored, str):
        return bool(stored)
    try:
        return bool(json.loads(stored))
    except ValueError:
        return bool(stored.strip())


def _description(description: Any) -> str:
    """An activity description as Hermes bounds it: stripped, at most 120 characters."""
    text = clean_text(str(description)).strip() if description is not None else ""
    if len(text) > ACTIVITY_DESCRIPTION_CHARS:
        text = text[: ACTIVITY_DESCRIPTION_CHARS - 1] + "\u2026"
    return text


def _provenance(provenance: Any) -> str:
    value = provenance.value if isinstance(provenance, Enum) else provenance
    return value if value in _PROVENANCES else "unknown"


def _config_of(session_meta: Optional[Dict[str, Any]]) -> dict[str, Any]:
    return (config_dict(session_meta.get("model_config")) or {}) if session_meta else {}


class ActivityMixin(Host):
    # ------------------------------------------------------------------ activity (v23-late)

    def touch_session_activity(
        self,
        session_id: str,
        ts: Optional[float] = None,
        *,
        description: Optional[str] = None,
        provenance: Optional[ActivityProvenance] = None,
    ) -> None:
        """Stamp a sign of life at ``ts`` (default now) with what it was, unless the
        stored stamp is as new or newer. The description is stripped and cut to 120
        characters (119 + "…"); an unknown provenance is recorded as "unknown". A
        short retry budget: a missed heartbeat is replaced by the next."""
        if not session_id:
            return
        try:
            at = self._now() if ts is None else float(ts)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"ts must be a number of seconds, not {ts!r}") from exc
        text, origin = _description(description), _provenance(provenance)
        self._write(lambda c: SessionRepository(c).touch_activity(session_id, at, text, origin),
                    budget=_activity_budget())

    def clear_session_activity_labels(self, session_id: str) -> None:
        """Blank the description ('') and provenance ("unknown"); the time stays.

        Labels already blank (or never set) are read, not written: no write lock is
        taken for nothing.
        """
        if not session_id:
            return
        found = self._read(lambda c: SessionRepository(c).activity(session_id))
        if found is None or (not found["last_activity_description"]
                             and found["last_activity_provenance"] in (None, "unknown")):
            return
        self._write(lambda c: SessionRepository(c).clear_activity_labels(session_id),
                    budget=_activity_budget())

    def get_session_activity(self, session_id: str) -> Optional[Dict[str, Any]]:
        """The activity triple and how long ago it was; None for an unknown session.

        Keys: last_activity_at, last_activity_description, last_activity_provenance,
        seconds_since_activity (None without a stamp), and Hermes' aliases
        last_activity_ts, last_activity_desc, description, provenance.
        """
        found = self._read(lambda c: SessionRepository(c).activity(session_id))
        if found is None:
            return None
        at = found["last_activity_at"]
        found["seconds_since_activity"] = None if at is None else max(0.0, self._now() - float(at))
        found["last_activity_ts"] = at
        found["last_activity_desc"] = found["description"] = found["last_activity_description"]
        found["provenance"] = found["last_activity_provenance"]
        return found

    # ------------------------------------------------------------------ lineage-wide flags

    def _set_on_lineage(self, session_id: str, **values: Any) -> bool:
        if not isinstance(session_id, str) or not session_id:
            return False
        return self._write(lambda c: SessionRepository(c).set_on_lineage(session_id, **values))

    def set_session_pinned(self, session_id: str, pinned: bool) -> bool:
        """Pin (or unpin) the session's whole compression lineage; False if unknown."""
        return self._set_on_lineage(session_id, pinned=1 if pinned else 0)

    def set_session_hidden(self, session_id: str, hidden: bool) -> bool:
        """Hide the lineage from the sidebar (still resumable), or show it; False if unknown."""
        return self._set_on_lineage(session_id, hidden=1 if hidden else 0)

    def set_session_read(self, session_id: str, read: bool = True) -> bool:
        """Mark the lineage read now (or unread: ``last_read_at`` 0.0); False if unknown."""
        return self._set_on_lineage(session_id, last_read_at=self._now() if read else 0.0)

    @staticmethod
    def session_unread(session_row: Dict[str, Any]) -> bool:
        """Whether a listed row had activity after it was last read (never read: False)."""
        read = session_row.get("last_read_at")
        if read is None:
            return False
        active = session_row.get("last_active") or session_row.get("started_at") or 0.0
        return float(active) > float(read)

    # ------------------------------------------------------------------ model_config (v23-late..v25)

    def patch_session_model_config(self, session_id: str, patch: Dict[str, Any]) -> None:
        """Merge ``patch`` into ``model_config`` in one transaction: a None value deletes
        its key, an empty result is stored as NULL; an unknown id is a no-op."""
        if not isinstance(patch, dict):
            raise InvalidInputError(f"patch must be a dict, not {type(patch).__name__}")
        self._write(lambda c: SessionRepository(c).patch_config(session_id, patch))

    def get_session_model_config_value(self, session_id: str, key: str, default: Any = None) -> Any:
        return self._read(lambda c: SessionRepository(c).config_value(session_id, key, default))

    def update_session_runtime_lock(
        self,
        session_id: str,
        *,
        model: Optional[str] = None,
        provider: Optional[str] = None,
        model_options: Optional[Dict[str, Any]] = None,
        route_source: Optional[str] = None,
        confirmed: bool = False,
    ) -> None:
        """Record the model a runtime (the browser) locked the session to, in
        ``model_config["browser_model_lock"]``; ``model`` also goes to the column when
        given; the system prompt is cleared so the agent rebuilds it."""
        lock = {
            "provider": provider or "", "model": model or "", "model_options": dict(model_options or {}),
            "route_source": route_source or "", "confirmed": bool(confirmed), "updated_at": self._now(),
        }
        self._write(lambda c: SessionRepository(c).update_runtime_lock(session_id, lock, model))

    def set_session_yolo(self, session_id: str, enabled: bool) -> None:
        """Record whether tool calls run unconfirmed (``model_config["yolo_mode"]``)."""
        self._write(lambda c: SessionRepository(c).patch_config(session_id, {"yolo_mode": bool(enabled)}))

    @staticmethod
    def session_yolo_enabled(session_meta: Optional[Dict[str, Any]]) -> bool:
        return bool(_config_of(session_meta).get("yolo_mode"))

    @staticmethod
    def session_gateway_runtime(session_meta: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """The route a gateway session runs on (Hermes v25), most specific first.

        ``model_config["gateway_runtime"]`` when it names a provider (None values
        dropped); else the config's non-empty provider/base_url/api_mode; else the
        billing provider unless it is empty or a bare 'auto'/'custom'; else {}.
        """
        config = _config_of(session_meta)
        runtime = config.get("gateway_runtime")
        if isinstance(runtime, dict) and runtime.get("provider"):
            return {k: v for k, v in runtime.items() if v is not None}
        top = {k: config[k] for k in _RUNTIME_KEYS if config.get(k)}
        if top:
            return top
        billing = (session_meta or {}).get("billing_provider")
        if isinstance(billing, str) and billing.strip() and billing.strip().lower() not in _BARE_BILLING_PROVIDERS:
            return {"provider": billing}
        return {}

    # ------------------------------------------------------------------ git metadata (v26)

    def publish_session_git_metadata(
        self,
        session_id: str,
        cwd: str,
        generation: int,
        git_branch: Optional[str] = None,
        git_repo_root: Optional[str] = None,
    ) -> bool:
        """Write a late git lookup's non-blank fields, only while the row still has this
        exact cwd and the generation update_session_cwd returned (any later claim
        wins). False for a falsy id/cwd, a generation that is not an int ≥ 1, no
        non-blank field, or no match."""
        if not session_id or not cwd:
            return False
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
            return False
        return self._write(lambda c: SessionRepository(c).publish_git_metadata(
            session_id, cwd, generation, git_branch, git_repo_root))

    # ------------------------------------------------------------------ lifecycle (v26)

    def session_lifecycle_statuses(self, session_ids: List[str]) -> Dict[str, str]:
        """Each session's status: "empty" without active messages, else
        classify_session_status of its newest one."""
        ids = [sid for sid in dict.fromkeys(session_ids or ()) if isinstance(sid, str)]
        if not ids:
            return {}
        last = self._read(lambda c: SessionRepository(c).last_messages(ids))
        out: Dict[str, str] = {}
        for sid in ids:
            if sid not in last:
                out[sid] = SESSION_STATUS_EMPTY
                continue
            role, calls, finish = last[sid]
            out[sid] = classify_session_status(role, _has_tool_calls(calls), finish)
        return out
