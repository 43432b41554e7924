"""Gateway state: peers and origins of sessions, routing entries, Telegram topic bindings.

Hermes v23 §1.E. Ids that Hermes binds as they come (Telegram chat and thread ids are
integers) are passed as text, ``str(value)``: the peer columns are TEXT, SQLite's
column affinity stores and compares an integer there as its decimal text, and
PostgreSQL compares text with text only. Values that are neither text nor integers
are refused with InvalidInputError (nothing written).

Telegram topic bindings are an opt-in schema step (Hermes keeps them so): nothing
creates their tables except :meth:`apply_telegram_topic_migration`. Before it, every
topic method returns 0 / None / False / [] and creates nothing. Hermes documents
``delete_telegram_topic_binding`` and (v26) ``bind_telegram_topic``; the other eight
names are ours (see the report in COMPATIBILITY.md).

Handoffs (Hermes v11): ``handoff_state`` goes NULL/completed/failed → ``pending``
(request) → ``running`` (claim, one winner) → ``completed`` / ``failed``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, overload

from .. import errors
from ..codec import check_key, clean_text
from ..repositories.gateway import (
    HANDOFF_COMPLETED,
    HANDOFF_FAILED,
    HANDOFF_PENDING,
    HANDOFF_RUNNING,
    GatewayRepository,
)
from ..repositories.telegram import TelegramTopicRepository
from ._host import Host


@overload
def _key(value: None, what: str) -> None: ...
@overload
def _key(value: str | int, what: str) -> str: ...
@overload
def _key(value: Any, what: str) -> Optional[str]: ...
def _key(value: Any, what: str) -> Optional[str]:
    """An id or key as stored text: str as given, an integer as ``str()``, None as None."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return check_key(value, what)
    raise errors.InvalidInputError(f"{what} must be str or int, not {type(value).__name__} {value!r}")


@overload
def _text(value: None, what: str) -> None: ...
@overload
def _text(value: str, what: str) -> str: ...
@overload
def _text(value: Any, what: str) -> Optional[str]: ...
def _text(value: Any, what: str) -> Optional[str]:
    """Free text (display name, origin JSON, entry JSON, topic title): lone surrogates
    become U+FFFD so the row is kept; non-text is refused."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise errors.InvalidInputError(f"{what} must be str, not {type(value).__name__}")
    return clean_text(value)


def _scope(scope: Any) -> str:
    if not isinstance(scope, str):
        raise errors.InvalidInputError(f"scope must be str, not {type(scope).__name__} {scope!r}")
    return check_key(scope, "scope")


class GatewayMixin(Host):
    # ------------------------------------------------------------------ peers

    def record_gateway_session_peer(
        self,
        session_id: str,
        *,
        source: str,
        user_id: Optional[str] = None,
        session_key: Optional[str] = None,
        chat_id: Optional[str] = None,
        chat_type: Optional[str] = None,
        thread_id: Optional[str] = None,
        display_name: Optional[str] = None,
        origin_json: Optional[str] = None,
        include_compression_ancestors: bool = False,
    ) -> None:
        """Record who the session talks to. No-op unless ``session_id`` and
        ``session_key`` are both truthy; an unknown id gets a row (Hermes v26), unless
        ``include_compression_ancestors`` is set.

        ``session_key`` and ``source`` are always set; every other column only when
        given: None keeps the stored value (Hermes clears the identity columns).
        ``include_compression_ancestors``: the same update on the parents reached
        through compression ends, never past a row of another (non-empty) user.
        """
        if not session_id or not session_key:
            return
        if not isinstance(source, str):
            raise errors.InvalidInputError(f"source must be str, not {type(source).__name__}")
        peer = {
            "session_key": _key(session_key, "session_key"),
            "source": check_key(source, "source"),
            "user_id": _key(user_id, "user_id"),
            "chat_id": _key(chat_id, "chat_id"),
            "chat_type": _key(chat_type, "chat_type"),
            "thread_id": _key(thread_id, "thread_id"),
        }
        extras = {}
        if display_name is not None:
            extras["display_name"] = _text(display_name, "display_name")
        if origin_json is not None:
            extras["origin_json"] = _text(origin_json, "origin_json")
        sid = _key(session_id, "session id")
        up = bool(include_compression_ancestors)
        self._write(lambda c: GatewayRepository(c).record_peer(sid, peer, extras, ancestors=up))

    def set_expiry_finalized(self, session_id: str, finalized: bool = True) -> None:
        """Mark (or unmark) the session's expiry as handled; falsy id: no-op."""
        if not session_id:
            return
        sid = _key(session_id, "session id")
        self._write(lambda c: GatewayRepository(c).set_expiry_finalized(sid, bool(finalized)))

    # ------------------------------------------------------------------ routing entries

    def save_gateway_routing_entry(self, session_key: str, entry_json: str, *, scope: str = "") -> None:
        """Upsert one routing entry of ``scope``; no-op when key or entry is falsy."""
        if not session_key or not entry_json:
            return
        key = _key(session_key, "session_key")
        entry = _text(entry_json, "entry_json")
        where = _scope(scope)
        self._write(lambda c: GatewayRepository(c).save_routing_entry(where, key, entry))

    def replace_gateway_routing_entries(self, entries: Dict[str, str], *, scope: str = "") -> None:
        """Make ``entries`` the whole of ``scope`` in one transaction (falsy keys or
        values skipped; an empty dict clears the scope; other scopes untouched)."""
        if not isinstance(entries, Mapping):
            raise errors.InvalidInputError(f"entries must be a dict, not {type(entries).__name__}")
        where = _scope(scope)
        pairs: dict[str, str] = {}
        for k, v in entries.items():
            if k and v:
                pairs[_key(k, "session_key")] = _text(v, "entry_json")
        items = list(pairs.items())
        self._write(lambda c: GatewayRepository(c).replace_routing_entries(where, items))

    def load_gateway_routing_entries(self, *, scope: str = "") -> Dict[str, str]:
        """``{session_key: entry_json}`` of ``scope`` (in key order)."""
        where = _scope(scope)
        return self._read(lambda c: GatewayRepository(c).load_routing_entries(where))

    def delete_gateway_routing_entries(self, session_keys: List[str], *, scope: str = "") -> None:
        """Delete these keys of ``scope``; an empty list is a no-op."""
        if isinstance(session_keys, (str, bytes)):
            raise errors.InvalidInputError("session_keys must be a list of keys, not a single string")
        keys = list(dict.fromkeys(k for k in (_key(k, "session_key") for k in session_keys or ()) if k))
        where = _scope(scope)
        if not keys:
            return
        self._write(lambda c: GatewayRepository(c).delete_routing_entries(where, keys))

    # ------------------------------------------------------------------ handoffs (Hermes v11)

    def request_handoff(self, session_id: str, platform: str) -> bool:
        """Ask for the session to move to ``platform``: ``pending``, only when it has no
        handoff or its last one completed or failed. True when requested."""
        if not session_id or not platform:
            return False
        sid, where = _key(session_id, "session id"), _text(platform, "platform")
        return self._write(lambda c: GatewayRepository(c).request_handoff(sid, where))

    def claim_handoff(self, session_id: str) -> bool:
        """Take a pending handoff (``running``); of concurrent claimers exactly one wins."""
        if not session_id:
            return False
        sid = _key(session_id, "session id")
        return self._write(lambda c: GatewayRepository(c).move_handoff(sid, (HANDOFF_PENDING,), HANDOFF_RUNNING))

    def complete_handoff(self, session_id: str) -> bool:
        """A pending or running handoff is done (``completed``)."""
        if not session_id:
            return False
        sid = _key(session_id, "session id")
        return self._write(lambda c: GatewayRepository(c).move_handoff(
            sid, (HANDOFF_PENDING, HANDOFF_RUNNING), HANDOFF_COMPLETED))

    def fail_handoff(self, session_id: str, error: str) -> bool:
        """A pending or running handoff failed (``failed``, the error's first 500 characters kept)."""
        if not session_id:
            return False
        sid = _key(session_id, "session id")
        text = None if error is None else _text(str(error), "error")[:500]
        return self._write(lambda c: GatewayRepository(c).move_handoff(
            sid, (HANDOFF_PENDING, HANDOFF_RUNNING), HANDOFF_FAILED, text))

    def get_handoff_state(self, session_id: str) -> Optional[Dict[str, Any]]:
        """``{"state", "platform", "error"}`` of the session (None values when never
        requested); None for an unknown session."""
        if not session_id:
            return None
        sid = _key(session_id, "session id")
        return self._read(lambda c: GatewayRepository(c).handoff_state(sid))

    def list_pending_handoffs(self) -> List[Dict[str, Any]]:
        """Session rows with a pending handoff, oldest start first."""
        return self._read(lambda c: GatewayRepository(c).pending_handoffs())

    # ------------------------------------------------------------------ lookups

    def list_gateway_sessions(
        self, *, platform: Optional[str] = None, active_only: bool = True
    ) -> List[Dict[str, Any]]:
        """The newest session of each session key (rows with ``last_active``), most
        recently active first; optionally one platform (any case) and only live ones."""
        if platform is not None and not isinstance(platform, str):
            raise errors.InvalidInputError(f"platform must be str, not {type(platform).__name__}")
        return self._read(lambda c: GatewayRepository(c).list_gateway_sessions(platform, bool(active_only)))

    def find_session_by_origin(
        self,
        *,
        platform: str,
        chat_id: str,
        thread_id: Optional[str] = None,
        user_id: Optional[str] = None,
    ) -> Optional[str]:
        """The live gateway session of this chat (and thread), or None.

        Candidates: live (unended), unarchived sessions with a session_key whose source
        is ``platform`` (any case) and ``chat_id`` is ``str(chat_id)``; with
        ``thread_id``, ``COALESCE(thread_id, '')`` is ``str(thread_id)``. Branch and
        delegate children are never candidates. Newest start first.

        Without ``user_id``: the newest candidate, unless the candidates belong to more
        than one (non-empty) user. With ``user_id``: the newest session of that user;
        else a lone candidate that has no user (as Hermes); else None. (Hermes also
        returns a lone candidate of *another* user here; we do not hand one user's
        session to another.)
        """
        if not platform or chat_id is None or chat_id == "":
            return None
        if not isinstance(platform, str):
            raise errors.InvalidInputError(f"platform must be str, not {type(platform).__name__}")
        chat = str(_key(chat_id, "chat_id"))
        thread = _key(thread_id, "thread_id")
        user = _key(user_id, "user_id")
        candidates = self._read(lambda c: GatewayRepository(c).origin_candidates(platform, chat, thread))
        if not candidates:
            return None
        if user:
            for sid, owner in candidates:
                if owner == user:
                    return str(sid)
            if len(candidates) == 1 and not candidates[0][1]:
                return str(candidates[0][0])
            return None
        owners = {owner for _sid, owner in candidates if owner}
        if len(owners) > 1:
            return None
        return str(candidates[0][0])

    def find_latest_gateway_session_for_peer(
        self,
        *,
        source: str,
        user_id: Optional[str] = None,
        session_key: Optional[str] = None,
        chat_id: Optional[str] = None,
        chat_type: Optional[str] = None,
        thread_id: Optional[str] = None,
    ) -> Optional[Dict[str, Any]]:
        """The session a gateway resumes for this peer (live or ended by agent_close /
        ws_orphan_reap), or None; None when ``session_key`` is falsy. Read-only.

        Pass 1, ``session_key`` + ``source``: message-bearing rows first, then the most
        recent ``COALESCE(last_activity_at, started_at)``; a row of another non-empty
        user than ``user_id`` is skipped (ours). Pass 2, when ``chat_id`` and
        ``chat_type`` are given: source and peer columns (NULL = ''), with messages.
        Either pass skips a candidate when a row of the same peer ended with a reset
        reason after the candidate's last activity.
        """
        if not session_key:
            return None
        if not isinstance(source, str):
            raise errors.InvalidInputError(f"source must be str, not {type(source).__name__}")
        key = str(_key(session_key, "session_key"))
        user = _key(user_id, "user_id")
        peer = None
        if chat_id is not None and chat_type is not None:
            peer = {
                "user_id": user,
                "chat_id": _key(chat_id, "chat_id"),
                "chat_type": _key(chat_type, "chat_type"),
                "thread_id": _key(thread_id, "thread_id"),
            }
        return self._read(lambda c: GatewayRepository(c).latest_for_peer(source=source, session_key=key, peer=peer,
                                                                         user_id=user))

    # ------------------------------------------------------------------ Telegram DM topics

    def apply_telegram_topic_migration(self) -> bool:
        """Create the Telegram DM topic tables (opt-in; never done on open) and stamp
        ``telegram_dm_topic_schema_version``. One transaction, idempotent; True when
        this call created a table."""
        return self._write(lambda c: TelegramTopicRepository(c).apply_migration())

    def has_telegram_topic_schema(self) -> bool:
        """Whether the topic tables exist (the opt-in step ran). Ours."""
        return self._read(lambda c: TelegramTopicRepository(c).present())

    def _no_topic_tables_to_write(self) -> bool:
        """A read-only store without the topic tables: a topic write is a no-op (0),
        not a ReadOnlyDatabaseError, as it would be on a writable store."""
        return self.read_only and not self.has_telegram_topic_schema()

    def get_telegram_dm_topic_mode(self, *, chat_id: str) -> bool:
        """Whether the chat uses one topic per session (False when unknown or no tables). Ours."""
        chat = _key(chat_id, "chat_id")
        if chat is None:
            return False
        return self._read(lambda c: TelegramTopicRepository(c).topic_mode(chat))

    def set_telegram_dm_topic_mode(self, *, chat_id: str, enabled: bool = True) -> int:
        """Turn the chat's topic mode on or off (bindings are kept); 1, or 0 without the
        tables. Ours."""
        chat = _required(chat_id, "chat_id")
        if self._no_topic_tables_to_write():
            return 0
        return self._write(lambda c: TelegramTopicRepository(c).set_topic_mode(chat, bool(enabled)))

    def bind_telegram_topic(
        self,
        *,
        chat_id: str,
        thread_id: str,
        user_id: str,
        session_key: str,
        session_id: str,
        managed_mode: str = "auto",
    ) -> None:
        """Point the topic ``(chat_id, thread_id)`` at ``session_id`` for this user and
        session key (rebinding moves it and keeps its title) and turn the chat's topic
        mode on. Nothing happens when the tables or the session do not exist (Hermes
        v26's signature; the title is set with :meth:`touch_telegram_topic_binding`)."""
        chat = _required(chat_id, "chat_id")
        thread = _required(thread_id, "thread_id")
        sid = _required(session_id, "session id")
        owner: dict[str, str | None] = {
            "user_id": _key(user_id, "user_id"), "session_key": _key(session_key, "session_key"),
            "managed_mode": _text(managed_mode, "managed_mode"),
        }
        if self._no_topic_tables_to_write():
            return
        self._write(lambda c: TelegramTopicRepository(c).bind(chat, thread, sid, owner=owner))

    def get_telegram_topic_binding(self, *, chat_id: str, thread_id: str) -> Optional[Dict[str, Any]]:
        """The binding row of a topic (chat_id, thread_id, session_id, title, created_at,
        updated_at), or None. Ours."""
        chat, thread = _key(chat_id, "chat_id"), _key(thread_id, "thread_id")
        if chat is None or thread is None:
            return None
        return self._read(lambda c: TelegramTopicRepository(c).binding(chat, thread))

    def get_telegram_topic_bindings_for_session(self, *, session_id: str) -> List[Dict[str, Any]]:
        """Every topic bound to the session (oldest binding first). Ours."""
        sid = _key(session_id, "session id")
        if not sid:
            return []
        return self._read(lambda c: TelegramTopicRepository(c).bindings_of_session(sid))

    def list_telegram_topic_bindings(self, *, chat_id: str) -> List[Dict[str, Any]]:
        """Every bound topic of the chat (oldest binding first). Ours."""
        chat = _key(chat_id, "chat_id")
        if chat is None:
            return []
        return self._read(lambda c: TelegramTopicRepository(c).bindings_of_chat(chat))

    def touch_telegram_topic_binding(self, *, chat_id: str, thread_id: str, title: Optional[str] = None) -> int:
        """Stamp the binding's ``updated_at`` (and rename it when ``title`` is given);
        rows changed (0 when unbound or no tables). Ours."""
        chat, thread = _key(chat_id, "chat_id"), _key(thread_id, "thread_id")
        if chat is None or thread is None:
            return 0
        name = _text(title, "title")
        if self._no_topic_tables_to_write():
            return 0
        return self._write(lambda c: TelegramTopicRepository(c).touch(chat, thread, name))

    def delete_telegram_topic_binding(self, *, chat_id: str, thread_id: str) -> int:
        """Delete the ``(str(chat_id), str(thread_id))`` binding; when it was the chat's
        last, turn the chat's topic mode off in the same transaction. Rows deleted; 0
        (never an error) when the tables do not exist. Never runs the migration."""
        chat, thread = _key(chat_id, "chat_id"), _key(thread_id, "thread_id")
        if chat is None or thread is None:
            return 0
        if self._no_topic_tables_to_write():
            return 0
        return self._write(lambda c: TelegramTopicRepository(c).delete(chat, thread))


def _required(value: Any, what: str) -> str:
    """A key a write stores: None or '' would bind a topic to nothing."""
    key = _key(value, what)
    if not key:
        raise errors.InvalidInputError(f"{what} is required")
    return key
