"""Turn leases (Hermes v25): one live turn per conversation, holder-checked, and the
dead-process probe the turn and compression leases share.

A lease is stored under the conversation's root, reached through parents that ended
'compression' (resolved inside the write, see repositories/turn_leases.py), so a
compression continuation and its parent can never run two turns at once.

A holder naming ``pid=<n>`` of a process on this machine that is provably gone loses
its lease at once instead of after the TTL. Only a SQLite file is known to be shared by
processes of one machine; on a server the holder may run on another host, where a
local probe proves nothing, so there the TTL alone decides.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import re
import sqlite3
from typing import Any, Callable, Optional

from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from .. import errors
from ..hermes_names import raw_turn_lease_key
from ..repositories.turn_leases import TurnLeaseRepository, turn_lease_key
from ._host import Host, HostSteps
from ..patch_points import facade_value

try:  # Hermes probes with psutil when it is installed, else os.kill(pid, 0)
    import psutil
except ImportError:
    psutil = None

log = logging.getLogger(__name__)

#: Module-level Hermes names defined here; the facade (hermes_state) re-exports them.
__all__: list[str] = []

#: ``pid=<n>`` inside a holder text (not ``ppid=``); Hermes' holders carry their process id so.
_HOLDER_PID = re.compile(r"(?<![A-Za-z0-9_])pid=(\d+)")
#: The shortest pause between two tries of a waiting acquire (a 0 poll would spin).
MIN_POLL_S = 0.01


def _psutil() -> Any:
    """``hermes_state.psutil`` now (Hermes' tests replace it), else ours."""
    return facade_value("psutil", psutil)


def holder_pid(holder: Any) -> int | None:
    """The process id a holder text names as ``pid=<n>`` (None: unstructured)."""
    found = _HOLDER_PID.search(holder) if isinstance(holder, str) else None
    return int(found.group(1)) if found else None


def holder_process_gone(holder: str) -> bool:
    """Whether the holder's local process provably no longer exists.

    False (the TTL decides) for a holder without ``pid=<n>``, for our own process id
    and whenever the probe fails or cannot tell: psutil's ``pid_exists`` when it is
    importable, else POSIX ``os.kill(pid, 0)`` (no such process → gone; no permission
    → alive).
    """
    pid = holder_pid(holder)
    if pid is None or pid <= 0 or pid == os.getpid():
        return False
    probe = _psutil()
    if probe is not None:
        try:
            return probe.pid_exists(pid) is False
        except Exception:
            return False
    if os.name != "posix":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):
        return False  # PermissionError: it exists; anything else: unknown
    return False


def check_ttl(ttl_seconds: Any) -> float:
    """A lease length must be a real number (Hermes adds it to the clock; NaN never expires)."""
    if not isinstance(ttl_seconds, numbers.Real) or math.isnan(ttl_seconds):
        raise errors.InvalidInputError(f"ttl_seconds must be a number of seconds, not {ttl_seconds!r}")
    return float(ttl_seconds)


def _locked_class(exc: BaseException) -> bool:
    """A failure Hermes' waiting acquire retries: the database was locked or busy."""
    if isinstance(exc, errors.DatabaseLockedError):
        return True
    if isinstance(exc, (sqlite3.OperationalError, OperationalError)):
        text = str(exc).lower()
        return "locked" in text or "busy" in text
    return False


class TurnLeasesMixin(Host):
    def _session_turn_lease_key(self, session_id: str) -> str:
        """The conversation id the session's turn lease is stored under: the root reached
        through parents that ended 'compression' (the session itself otherwise)."""
        return self._read(lambda c: turn_lease_key(c, session_id))

    @staticmethod
    def _session_turn_lease_key_on_conn(conn: Any, session_id: str) -> str:
        """:meth:`_session_turn_lease_key` inside the caller's transaction: a SQLAlchemy
        connection, or a raw DB-API one (``db._conn``, ``_execute_write``'s)."""
        if isinstance(conn, Connection):
            return turn_lease_key(conn, session_id)
        return raw_turn_lease_key(conn, session_id)

    def _dead_holder_probe(self) -> Callable[[str], bool] | None:
        """The dead-process probe where holders run on this machine (a SQLite file), else None."""
        return holder_process_gone if self._dialect.holders_on_this_machine else None

    def try_acquire_session_turn_lease(
        self, session_id: str, holder: str, *, ttl_seconds: float = 300.0, patience_s: Optional[float] = None
    ) -> bool:
        """Take the conversation's turn lease for ``holder``: True when it holds it now
        (re-entrant, the expiry is not moved). An expired lease, or one whose holder's
        process is provably gone, is taken over. ``patience_s`` bounds the wait for the
        write lock (None: the store's default)."""
        if not session_id or not holder:
            return False
        ttl = check_ttl(ttl_seconds)
        probe = self._dead_holder_probe()
        return self._write(lambda c: TurnLeaseRepository(c).try_acquire(session_id, holder, ttl, probe),
                           budget=patience_s)

    def acquire_session_turn_lease(
        self,
        session_id: str,
        holder: str,
        *,
        ttl_seconds: float = 300.0,
        wait_seconds: float = 1800.0,
        poll_interval_seconds: float = 1.0,
        on_wait=None,
        wait_notice_interval_seconds: float = 15.0,
        should_abort=None,
        acquire_patience_s: float = 0.5,
    ) -> bool:
        """Wait up to ``wait_seconds`` for the turn lease, trying every ``poll_interval_seconds``.

        False as soon as ``should_abort()`` is true, or once the wait is over. A try that
        found the database locked counts as a miss; any other error is raised.
        ``on_wait(elapsed)`` is called after the first miss and then every
        ``wait_notice_interval_seconds`` (its own errors are logged, not raised).
        """
        if not session_id or not holder:
            return False
        check_ttl(ttl_seconds)
        steps = HostSteps(self)
        start = steps.monotonic()
        deadline = start + max(0.0, float(wait_seconds))
        next_notice: Optional[float] = None
        while True:
            if should_abort is not None and should_abort():
                return False
            try:
                if self.try_acquire_session_turn_lease(
                    session_id, holder, ttl_seconds=ttl_seconds, patience_s=acquire_patience_s
                ):
                    return True
            except Exception as exc:
                if not _locked_class(exc):
                    raise
            current = steps.monotonic()
            if current >= deadline:
                return False
            if on_wait is not None and (next_notice is None or current >= next_notice):
                try:
                    on_wait(current - start)
                except Exception:
                    log.warning("on_wait callback of the turn lease of %r failed", session_id, exc_info=True)
                next_notice = current + max(0.0, float(wait_notice_interval_seconds))
            steps.sleep(max(MIN_POLL_S, min(float(poll_interval_seconds), deadline - current)))

    def refresh_session_turn_lease(self, session_id: str, holder: str, *, ttl_seconds: float = 300.0) -> bool:
        """Extend the lease to now + ttl; only its holder can (also after it expired, while
        nobody took it over)."""
        if not session_id or not holder:
            return False
        ttl = check_ttl(ttl_seconds)
        return self._write(lambda c: TurnLeaseRepository(c).refresh(session_id, holder, ttl))

    def release_session_turn_lease(self, session_id: str, holder: str) -> None:
        """Drop the lease if ``holder`` holds it; anything else is a no-op (idempotent)."""
        if not session_id or not holder:
            return
        self._write(lambda c: TurnLeaseRepository(c).release(session_id, holder))
