"""Compression guards: the cross-process compression lock, failure cooldowns and streaks.

Hermes' context compressor checks ``type(db) is SessionDB`` and looks these methods up
with ``inspect.getattr_static``, so they must stay plain methods of this mixin (class
attributes of the assembled SessionDB). Where Hermes swallows ``sqlite3.Error``, driver
errors of either backend (raw or already typed) are swallowed here.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Dict, Optional

from .. import errors
from ..codec import clean_text
from ..repositories.compression import CompressionRepository
from ._host import Host
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

    # ------------------------------------------------------------- compression lock

    def try_acquire_compression_lock(self, session_id: str, holder: str, ttl_seconds: float = 300.0) -> bool:
        """Take the session's compression lease for ``holder`` (True), or learn it is held (False).

        An expired lease is dropped first; the same holder asking again gets True without
        the expiry moving. Falsy id or a database error → False.
        """
        if not session_id:
            return False
        _check_ttl(ttl_seconds)
        try:
            return self._write(lambda c: CompressionRepository(c).try_acquire_lock(session_id, holder, ttl_seconds))
        except DB_ERRORS as exc:
            log.warning("compression lock of %r not taken: %s", session_id, exc)
            return False

    def refresh_compression_lock(self, session_id: str, holder: str, ttl_seconds: float = 300.0) -> bool:
        """Extend the lease to now + ttl; only its holder can, and only before it expired."""
        if not session_id or not holder:
            return False
        _check_ttl(ttl_seconds)
        try:
            return self._write(lambda c: CompressionRepository(c).refresh_lock(session_id, holder, ttl_seconds))
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


def _check_ttl(ttl_seconds: Any) -> None:
    """A lease length must be a real number (Hermes adds it to the clock; NaN never expires)."""
    if not isinstance(ttl_seconds, numbers.Real) or math.isnan(ttl_seconds):
        raise errors.InvalidInputError(f"ttl_seconds must be a number of seconds, not {ttl_seconds!r}")
