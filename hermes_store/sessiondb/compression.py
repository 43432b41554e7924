"""Compression guards: the cross-process compression lock, failure cooldowns, streaks,
and (Hermes v26) the publication of a compression child in one transaction.

Hermes' context compressor checks ``type(db) is SessionDB`` and looks these methods up
with ``inspect.getattr_static``, so they must stay plain methods of this mixin (class
attributes of the assembled SessionDB). Where Hermes swallows ``sqlite3.Error``, driver
errors of either backend (raw or already typed) are swallowed here.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

from .. import errors
from ..codec import clean_text
from ..repositories.compression import CompressionRepository, PublicationError
from ._host import Host, transcript_budget
from .leases import check_ttl, holder_process_gone
from .lineage import DB_ERRORS

log = logging.getLogger(__name__)


def _cooldown_time(value: Any) -> float | None:
    """``cooldown_until`` as the REAL column holds it (None clears)."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise errors.InvalidInputError(
            f"cooldown_until must be an epoch time in seconds, not {type(value).__name__} {value!r}"
        ) from None


class CompressionMixin(Host):
    # ------------------------------------------------------------- failure cooldown

    def record_compression_failure_cooldown(
        self, session_id: str, cooldown_until: float, error: Optional[str] = None
    ) -> None:
        """Remember until when compression of this session should not be retried, and why."""
        if not session_id:
            return
        until = _cooldown_time(cooldown_until)
        # An error text with a lone surrogate keeps the cooldown (U+FFFD in its place).
        message = None if error is None else clean_text(error if isinstance(error, str) else str(error))
        try:
            self._write(lambda c: CompressionRepository(c).record_cooldown(session_id, until, message))
        except DB_ERRORS as exc:
            log.warning("could not record the compression cooldown of %r: %s", session_id, exc)

    def get_compression_failure_cooldown(self, session_id: str) -> Optional[Dict[str, Any]]:
        """``{"cooldown_until", "remaining_seconds", "error"}`` while a cooldown is running, else None."""
        if not session_id:
            return None
        return self._read(lambda c: CompressionRepository(c).cooldown(session_id))

    def clear_compression_failure_cooldown(self, session_id: str) -> None:
        if not session_id:
            return
        try:
            self._write(lambda c: CompressionRepository(c).clear_cooldown(session_id))
        except DB_ERRORS as exc:
            log.warning("could not clear the compression cooldown of %r: %s", session_id, exc)

    # ------------------------------------------------------------- fallback streak

    def get_compression_fallback_streak(self, session_id: str) -> int:
        """The stored streak, never negative; 0 for a falsy/unknown id, a closed store or junk."""
        if not session_id or getattr(self, "_engine", None) is None:
            return 0
        value = self._read(lambda c: CompressionRepository(c).fallback_streak(session_id))
        try:
            return max(0, int(value))
        except (TypeError, ValueError, OverflowError):
            return 0

    def set_compression_fallback_streak(self, session_id: str, streak: int) -> None:
        """Store ``max(0, int(streak))``; ``int()`` raises for a value that is not a number."""
        if not session_id:
            return
        value = max(0, int(streak))
        self._write(lambda c: CompressionRepository(c).set_fallback_streak(session_id, value))

    # ------------------------------------------------------------- anti-thrash count (v24)

    def get_compression_ineffective_count(self, session_id: str) -> int:
        """How many compressions in a row saved too little; as the fallback streak: never
        negative, 0 for a falsy/unknown id, a closed store or junk."""
        if not session_id or getattr(self, "_engine", None) is None:
            return 0
        value = self._read(lambda c: CompressionRepository(c).ineffective_count(session_id))
        try:
            return max(0, int(value))
        except (TypeError, ValueError, OverflowError):
            return 0

    def set_compression_ineffective_count(self, session_id: str, count: int) -> None:
        """Store ``max(0, int(count))``; ``int()`` raises for a value that is not a number."""
        if not session_id:
            return
        value = max(0, int(count))
        self._write(lambda c: CompressionRepository(c).set_ineffective_count(session_id, value))

    # ------------------------------------------------------------- cooldown snapshots (v26)

    def get_compression_failure_cooldown_row(self, session_id: str) -> Dict[str, Any]:
        """``{session_exists, cooldown_until, error}`` as stored, even when the cooldown is
        over: a snapshot :meth:`restore_compression_failure_cooldown_row` can put back."""
        if not session_id:
            return {"session_exists": False, "cooldown_until": None, "error": None}
        return self._read(lambda c: CompressionRepository(c).cooldown_row(session_id))

    def restore_compression_failure_cooldown_row(self, session_id: str, snapshot: Dict[str, Any]) -> None:
        """Write a snapshot's ``cooldown_until`` and ``error`` back and verify them in the
        same transaction; a missing row or a different read-back raises RuntimeError."""
        if not isinstance(snapshot, dict):
            raise errors.InvalidInputError(f"snapshot must be a dict, not {type(snapshot).__name__}")
        until = _cooldown_time(snapshot.get("cooldown_until"))
        error = snapshot.get("error")
        message = None if error is None else clean_text(error if isinstance(error, str) else str(error))
        if not session_id:
            raise PublicationError("cannot restore a compression cooldown without a session id")
        self._write(lambda c: CompressionRepository(c).restore_cooldown_row(session_id, until, message))

    # ------------------------------------------------------------- compression children (v26)

    def find_live_compression_child(self, parent_session_id: str) -> Optional[Dict[str, Any]]:
        """The row of the one unended continuation of a session that ended 'compression'
        (tool runs and branches/delegates of the parent are no continuation); None when
        there is none or more than one."""
        if not parent_session_id:
            return None
        return self._read(lambda c: CompressionRepository(c).live_child(parent_session_id))

    def reopen_orphaned_compression_session(self, session_id: str) -> bool:
        """Reopen a session ended 'compression' whose child was never published: True only
        when it has no continuation (ended ones count) and no live compression lease. An
        expired lease is removed only if it is still exactly as read (a racing refresh wins)."""
        if not session_id:
            return False
        return self._write(lambda c: CompressionRepository(c).reopen_orphan(session_id))

    def publish_compression_child(
        self,
        *,
        parent_session_id: str,
        child_session_id: str,
        source: str,
        messages: List[Dict[str, Any]],
        model: Optional[str] = None,
        model_config: Optional[Dict[str, Any]] = None,
        system_prompt: Optional[str] = None,
        cwd: Optional[str] = None,
        profile_name: Optional[str] = None,
        compression_lock_holder: Optional[str] = None,
        require_compression_lease: bool = True,
        watermark: Optional[int] = None,
        watermark_ceiling: Optional[int] = None,
    ) -> None:
        """Create the compacted continuation and close the parent, all or nothing.

        One transaction: with ``require_compression_lease``, ``compression_lock_holder``
        must hold an unexpired lease on the parent, else CompressionSessionBusyError
        ("Compression lease lost before publication: …", not retried); the parent must
        exist and be live and ``messages`` non-empty (else RuntimeError); the child gets
        the parent's cwd/profile unless given, its git and routing columns, the messages
        (through ``self._insert_message_rows``, which sets each ``msg["_row_id"]``) and,
        with ``watermark``, clones of the parent's live rows in
        ``(watermark, watermark_ceiling]``; the parent ends 'compression'.
        """
        if not parent_session_id or not child_session_id:
            raise PublicationError("publish_compression_child needs a parent and a child session id")
        fields = {"model": model, "model_config": model_config, "system_prompt": system_prompt,
                  "cwd": cwd, "profile_name": profile_name}
        low, high = _row_id(watermark, "watermark"), _row_id(watermark_ceiling, "watermark_ceiling")

        def publish(conn: Any) -> None:
            repo = CompressionRepository(conn)
            if require_compression_lease:
                repo.check_publication_lease(parent_session_id, compression_lock_holder)
            if not messages:
                raise PublicationError(f"cannot publish compression child {child_session_id!r}: no messages")
            repo.publish_child(
                parent_id=parent_session_id, child_id=child_session_id, source=source, fields=fields,
                insert_messages=lambda: self._insert_message_rows(conn, child_session_id, messages),
                watermark=low, watermark_ceiling=high,
            )

        self._write(publish, budget=transcript_budget())

    # ------------------------------------------------------------- compression lock

    def try_acquire_compression_lock(self, session_id: str, holder: str, ttl_seconds: float = 300.0) -> bool:
        """Take the session's compression lease for ``holder`` (True), or learn it is held (False).

        An expired lease is dropped first, and so (Hermes v26) is one whose ``pid=<n>``
        holder is provably gone from this machine (SQLite files only: see sessiondb.leases);
        the same holder asking again gets True without the expiry moving. Falsy id or a
        database error → False.
        """
        if not session_id:
            return False
        ttl = check_ttl(ttl_seconds)
        probe = holder_process_gone if self._dialect.holders_on_this_machine else None
        try:
            return self._write(lambda c: CompressionRepository(c).try_acquire_lock(session_id, holder, ttl, probe))
        except DB_ERRORS as exc:
            log.warning("compression lock of %r not taken: %s", session_id, exc)
            return False

    def refresh_compression_lock(self, session_id: str, holder: str, ttl_seconds: float = 300.0) -> bool:
        """Extend the lease to now + ttl; only its holder can. Hermes v26: also after it
        expired, as long as nobody took the session over or released it meanwhile."""
        if not session_id or not holder:
            return False
        ttl = check_ttl(ttl_seconds)
        try:
            return self._write(lambda c: CompressionRepository(c).refresh_lock(session_id, holder, ttl))
        except DB_ERRORS as exc:
            log.warning("compression lock of %r not refreshed: %s", session_id, exc)
            return False

    def release_compression_lock(self, session_id: str, holder: str) -> None:
        """Drop the lease if ``holder`` holds it; anything else is a no-op (idempotent)."""
        if not session_id or not holder:
            return
        try:
            self._write(lambda c: CompressionRepository(c).release_lock(session_id, holder))
        except DB_ERRORS as exc:
            log.warning("compression lock of %r not released: %s", session_id, exc)

    def get_compression_lock_holder(self, session_id: str) -> Optional[str]:
        """Who holds an unexpired lease on the session, or None. Takes nothing."""
        if not session_id:
            return None
        return self._read(lambda c: CompressionRepository(c).lock_holder(session_id))



def _row_id(value: Any, name: str) -> int | None:
    """A message id bound (None: no bound); bools and non-integers are refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidInputError(f"{name} must be a message id (int), not {value!r}")
    return value
