"""Token and cost accounting: the session totals, the per-model usage ledger, and the
background writer Hermes' agent loop hands its per-call deltas to (v23-late)."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import deque
from typing import Any, Dict, Optional

from ..errors import UnknownFieldError
from ..operations.imports import IMPORT_SESSION_INTEGERS
from ..repositories import MaintenanceRepository
from ..repositories.usage import ApiCallUsage, UsageRepository
from ._host import Host

log = logging.getLogger(__name__)

#: The thread's name, as Hermes names it (tests and tools look it up).
TOKEN_WRITER_THREAD = "session-db-token-writer"
#: An idle writer thread ends after this long (seconds); the next delta starts another.
TOKEN_WRITER_IDLE_S = 30.0
#: How long close() and the exit hook wait for queued deltas (seconds).
TOKEN_DRAIN_S = 5.0
#: Counters a merge adds up (the session's integer counters, listed once with the import's
#: checks), and the costs it adds (None + None stays None).
_SUMMED = IMPORT_SESSION_INTEGERS
_COSTS = ("estimated_cost_usd", "actual_cost_usd")
#: Everything else update_token_counts takes: two deltas merge only when these agree.
_ROUTE = ("model", "cost_status", "cost_source", "pricing_version", "billing_provider", "billing_base_url",
          "billing_mode", "absolute", "task")
_FIELDS = frozenset(_SUMMED + _COSTS + _ROUTE)
_creating = threading.Lock()


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """One delta for two adjacent ones of the same route, or None when they must stay apart
    (a resync, another route, a figure that is not a number)."""
    if a.get("absolute") or b.get("absolute"):
        return None
    if any(a.get(k) != b.get(k) for k in _ROUTE):
        return None
    out = dict(a)
    try:
        for k in _SUMMED:
            out[k] = int(a.get(k) or 0) + int(b.get(k) or 0)
        for k in _COSTS:
            x, y = a.get(k), b.get(k)
            out[k] = None if x is None and y is None else float(x or 0.0) + float(y or 0.0)
    except (TypeError, ValueError):
        return None  # applied one by one, so the bad one fails alone (and is logged)
    return out


class TokenWriter:
    """Applies queued token deltas of one store on a daemon thread, in order.

    Started on demand; ends after :data:`TOKEN_WRITER_IDLE_S` idle, so a store nobody
    closes leaves no thread behind. It holds its store weakly, and its exit hook holds
    it weakly too, so neither keeps a store alive; the hook drains what is queued when
    the interpreter exits. After :meth:`close` nothing is queued any more.
    """

    def __init__(self, store: UsageMixin) -> None:
        self._store = weakref.ref(store)
        self._cv = threading.Condition()
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()
        self._busy = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()
        self._exit_hook: Any = None

    def put(self, session_id: str, delta: dict[str, Any]) -> bool:
        """Queue a delta, merged into the last queued one when possible; False once closed."""
        if self._pid != os.getpid():
            self._after_fork()
        with self._cv:
            if self._closed:
                return False
            last = self._queue[-1] if self._queue else None
            both = _merged(last[1], delta) if last is not None and last[0] == session_id else None
            if both is not None:
                self._queue[-1] = (session_id, both)
            else:
                self._queue.append((session_id, dict(delta)))
            if self._thread is None:
                self._start()
            self._cv.notify_all()
        return True

    def _after_fork(self) -> None:
        """A forked child has none of the parent's threads: it starts its own queue."""
        self._cv = threading.Condition()
        self._queue = deque()
        self._busy = 0
        self._thread = None
        self._pid = os.getpid()

    def _start(self) -> None:
        if self._exit_hook is None:
            me = weakref.ref(self)

            def drain_at_exit() -> None:
                writer = me()
                if writer is not None:
                    writer.close()

            self._exit_hook = drain_at_exit
            atexit.register(drain_at_exit)
        self._thread = threading.Thread(target=self._work, name=TOKEN_WRITER_THREAD, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    if self._closed or (not self._cv.wait(TOKEN_WRITER_IDLE_S) and not self._queue):
                        self._thread = None
                        self._cv.notify_all()
                        return
                item = self._queue.popleft()
                self._busy += 1
            self._apply_counted(item)

    def _apply_counted(self, item: tuple[str, dict[str, Any]]) -> None:
        """Apply one popped item; ``_busy`` (counted up by the popper) goes down after,
        so ``flush`` waits for an item in flight too."""
        try:
            self._apply(item)
        finally:
            with self._cv:
                self._busy -= 1
                self._cv.notify_all()

    def _apply(self, item: tuple[str, dict[str, Any]]) -> None:
        store = self._store()
        if store is None:
            log.warning("token counts for %r dropped: their SessionDB is gone", item[0])
            return
        apply_quietly(store, item[0], item[1])

    def _drain_here(self) -> None:
        """Apply what is queued on the calling thread."""
        while True:
            with self._cv:
                if not self._queue:
                    return
                item = self._queue.popleft()
                self._busy += 1
            self._apply_counted(item)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued delta is applied (inline when no thread runs)."""
        with self._cv:
            running = self._thread is not None and self._thread is not threading.current_thread()
        if not running:
            self._drain_here()
            return True
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = TOKEN_DRAIN_S) -> None:
        """Apply what is queued (the thread finishes its queue, then ends), stop queueing,
        drop the exit hook."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if self._thread is None:
            self._drain_here()  # anything the thread had not picked up
        hook, self._exit_hook = self._exit_hook, None
        if hook is not None:
            atexit.unregister(hook)


def apply_quietly(store: UsageMixin, session_id: str, delta: dict[str, Any]) -> None:
    """update_token_counts, a failure logged (a queued delta has no caller to raise to)."""
    try:
        store.update_token_counts(session_id, **delta)
    except Exception:
        log.warning("token counts for %r not recorded", session_id, exc_info=True)


class UsageMixin(Host):
    def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: Optional[str] = None,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: Optional[float] = None,
        actual_cost_usd: Optional[float] = None,
        cost_status: Optional[str] = None,
        cost_source: Optional[str] = None,
        pricing_version: Optional[str] = None,
        billing_provider: Optional[str] = None,
        billing_base_url: Optional[str] = None,
        billing_mode: Optional[str] = None,
        api_call_count: int = 0,
        absolute: bool = False,
        *,
        task: str = "",
    ) -> None:
        """Count one API call's usage on the session and its per-model ledger (Hermes v23).

        See UsageRepository.update_token_counts for the rules. ``task`` (ours): bill a
        side task on the ledger only; Hermes' own way is record_auxiliary_usage. Hermes'
        flat signature is kept here; the repository takes the figures as one ApiCallUsage.
        """
        usage = ApiCallUsage(
            input_tokens=input_tokens, output_tokens=output_tokens, model=model,
            cache_read_tokens=cache_read_tokens, cache_write_tokens=cache_write_tokens,
            reasoning_tokens=reasoning_tokens, estimated_cost_usd=estimated_cost_usd,
            actual_cost_usd=actual_cost_usd, cost_status=cost_status, cost_source=cost_source,
            pricing_version=pricing_version, billing_provider=billing_provider,
            billing_base_url=billing_base_url, billing_mode=billing_mode,
            api_call_count=api_call_count, task=task,
        )
        self._write(lambda c: UsageRepository(c).update_token_counts(session_id, usage, absolute=absolute))

    def record_auxiliary_usage(
        self,
        session_id: str,
        task: str,
        *,
        model: Optional[str] = None,
        billing_provider: Optional[str] = None,
        billing_base_url: Optional[str] = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: Optional[float] = None,
        api_call_count: int = 1,
    ) -> None:
        """Side-task calls (vision, compression, title generation...) on the ledger.

        No-op for a falsy id or task. The session row is ensured, its counters never
        move; the call's own route is used (model 'unknown', provider/base URL '' when
        missing). ``api_call_count`` (v26) says how many calls; None counts one.
        Errors propagate.
        """
        if not session_id or not task:
            return
        args = dict(locals())
        for name in ("self", "session_id", "task"):
            args.pop(name)
        self._write(lambda c: UsageRepository(c).record_auxiliary(session_id, task, **args))

    def usage(self, by: str = "model", source: Optional[str] = None) -> list[Any]:
        return self._read(lambda c: MaintenanceRepository(c).usage(by, source))

    def usage_totals(self, *, min_message_count: int = 1, include_archived: bool = False) -> Dict[str, float]:
        """``{"tokens": int, "cost_usd": float}`` over root sessions with at least
        ``min_message_count`` messages (archived ones when asked); a session's cost is
        its actual cost, else its estimate."""
        return self._read(lambda c: UsageRepository(c).totals(int(min_message_count), bool(include_archived)))

    def get_dominant_session_model_route(self, session_id: str) -> Optional[Dict[str, Any]]:
        """The main loop's most used route of the session: ``{model, billing_provider,
        billing_base_url, billing_mode, api_call_count}``; None without one."""
        return self._read(lambda c: UsageRepository(c).dominant_route(session_id))

    # ------------------------------------------------------------------ queued deltas (v23-late)

    #: Whether queued deltas go to a writer thread. A store whose writes must run on
    #: one event loop sets it False: its deltas are then applied at once.
    _token_counts_in_background = True

    def _token_writer(self) -> TokenWriter:
        writer = self.__dict__.get("_token_writer_state")
        if writer is None:
            with _creating:
                writer = self.__dict__.setdefault("_token_writer_state", TokenWriter(self))
        return writer

    def queue_token_counts(self, session_id: str, **kwargs: Any) -> None:
        """update_token_counts later, on the "session-db-token-writer" thread, in order.

        Adjacent deltas of one session and route (not resyncs) are merged first;
        failures are logged, never raised. A closed store applies it at once.
        Readers of the counters call flush_token_counts() first.
        """
        unknown = sorted(set(kwargs) - _FIELDS)
        if unknown:
            raise UnknownFieldError(f"queue_token_counts() got unexpected keyword arguments {unknown}")
        if self._token_counts_in_background and getattr(self, "_engine", None) is not None \
                and self._token_writer().put(session_id, kwargs):
            return
        apply_quietly(self, session_id, kwargs)

    def flush_token_counts(self, timeout: float = 5.0) -> bool:
        """Wait until queued deltas are applied (inline when no writer thread runs);
        False if ``timeout`` ran out first. Never raises."""
        try:
            return self._token_writer().flush(float(timeout))
        except Exception:
            log.warning("flushing queued token counts failed", exc_info=True)
            return False

    def _close_token_writer(self) -> None:
        """Drain and stop the writer (close() runs it first); later deltas are applied at once."""
        self._token_writer().close()
