"""Token and cost accounting: the session's own totals and the per-model usage ledger.

Two writers feed ``session_model_usage`` (Hermes v20-v23): the main loop, through
``update_token_counts`` (task ``''``, keyed by the call's route with gaps filled from
the session), and side tasks (vision, compression, title generation...), through
``record_auxiliary_usage`` (their own task, their own route, never the session's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

from sqlalchemy import and_, case, func, literal, or_, select, update

from .. import errors
from ..dialects import Dialect
from ..models import Base
from .base import SESSIONS, Repository, per_dialect
from .sessions import SessionRepository

LEDGER = "session_model_usage"
LEDGER_TABLE = Base.metadata.tables[LEDGER]
COUNTERS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
ROUTE = ("billing_provider", "billing_base_url", "billing_mode")
#: The counters a token total adds up (reasoning tokens are already part of the output).
TOKEN_TOTAL = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
_KEY = ("session_id", "model", *ROUTE, "task")


def _count(value: Any, name: str) -> int:
    """A token/call counter as an int (None counts as 0); a non-number is refused."""
    try:
        return int(value or 0)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInputError(f"{name} must be a number, not {value!r}") from exc


def _cost(value: Any, name: str) -> float | None:
    """A cost in USD as a float; None stays None (no cost reported)."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInputError(f"{name} must be a number or None, not {value!r}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiCallUsage:
    """What one API call used and cost, and the route it went by: the figures of
    ``UsageRepository.update_token_counts``, gathered so that the repository takes one
    immutable value instead of sixteen parameters that are easy to pass in the wrong
    place. Keyword-only, with Hermes' defaults; values are checked when written."""

    input_tokens: int = 0
    output_tokens: int = 0
    model: str | None = None
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    estimated_cost_usd: float | None = None
    actual_cost_usd: float | None = None
    cost_status: str | None = None
    cost_source: str | None = None
    pricing_version: str | None = None
    billing_provider: str | None = None
    billing_base_url: str | None = None
    billing_mode: str | None = None
    api_call_count: int = 0
    #: Ours: a non-empty task bills a side task on the ledger only.
    task: str = ""


class UsageRepository(Repository):
    """Writes to the session counters and the ``session_model_usage`` ledger."""

    def update_token_counts(self, session_id: str, usage: ApiCallUsage, *, absolute: bool = False) -> None:
        """Hermes v23's accounting of one API call (or, with ``absolute``, a resync).

        - The session row is ensured first by the create upsert (source 'unknown'), so a
          NULL ``model`` is filled even by a call that carries no usage.
        - Counters are added (or set when ``absolute``); an estimated/actual cost of
          None leaves the stored one as it is.
        - Only a call with accounted usage (a non-zero counter or cost) fills a NULL
          model/route; the first such call (stored ``api_call_count`` 0) that names a
          model and a provider different from the stored pair replaces the whole
          route, after which it is sticky.
        - A non-absolute call with tokens, calls or an estimated cost adds a delta to
          the ledger under task '' (both costs, None as 0); an actual cost alone does
          not, and absolute resyncs never do (they would count twice).

        ``usage.task`` (ours): a non-empty task bills a side task on the ledger
        only, with the route it names (as record_auxiliary_usage does, but with the
        call count and billing mode given); the session's totals do not move.

        The call's figures come as one ApiCallUsage rather than sixteen flat parameters
        (Hermes' flat signature lives on in the facade); ``absolute`` stays apart because
        it says how to apply them, not what was used.
        """
        if not isinstance(usage, ApiCallUsage):
            raise errors.InvalidInputError(
                f"usage must be an ApiCallUsage, not {type(usage).__name__} (the flat form is SessionDB's)"
            )
        input_tokens, output_tokens = usage.input_tokens, usage.output_tokens
        cache_read_tokens, cache_write_tokens = usage.cache_read_tokens, usage.cache_write_tokens
        reasoning_tokens, api_call_count = usage.reasoning_tokens, usage.api_call_count
        model, task = usage.model, usage.task
        cost_status, cost_source, pricing_version = usage.cost_status, usage.cost_source, usage.pricing_version
        billing_provider, billing_base_url = usage.billing_provider, usage.billing_base_url
        billing_mode = usage.billing_mode
        counts = {c: _count(v, c) for c, v in zip(
            (*COUNTERS, "api_call_count"),
            (input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, api_call_count),
            strict=True,
        )}
        estimated_cost_usd = _cost(usage.estimated_cost_usd, "estimated_cost_usd")
        actual_cost_usd = _cost(usage.actual_cost_usd, "actual_cost_usd")
        t = self.now()
        if task:
            if absolute:
                raise errors.InvalidInputError(
                    "absolute=True resyncs the session's own totals; a side task (task=...) is always a delta"
                )
            self._peer(SessionRepository).create(session_id, "unknown")
            if any(counts.values()) or estimated_cost_usd:
                self._add_to_ledger(
                    session_id, model or "unknown",
                    [billing_provider or "", billing_base_url or "", billing_mode or ""],
                    task, counts, estimated_cost_usd, actual_cost_usd, cost_status, cost_source, t,
                )
            return
        self._peer(SessionRepository).create(session_id, "unknown", model=model)
        accounted = bool(any(counts.values()) or estimated_cost_usd or actual_cost_usd)
        s = SESSIONS.c
        values: dict[str, Any] = {}
        for c, n in counts.items():
            values[c] = n if absolute else func.coalesce(s[c], 0) + n
        for c, cost in (("estimated_cost_usd", estimated_cost_usd), ("actual_cost_usd", actual_cost_usd)):
            if cost is not None:
                values[c] = cost if absolute else func.coalesce(s[c], 0.0) + cost
        for c, v in (("cost_status", cost_status), ("cost_source", cost_source), ("pricing_version", pricing_version)):
            if v is not None:
                values[c] = v
        if accounted:
            route = {"model": model, "billing_provider": billing_provider,
                     "billing_base_url": billing_base_url, "billing_mode": billing_mode}
            if model and billing_provider:
                # First accounted route: before any call was counted, a named
                # model+provider pair that differs from the stored one wins outright
                # (the old SET expressions see the row as it was before this UPDATE).
                first = and_(
                    func.coalesce(s.api_call_count, 0) == 0,
                    or_(s.model.is_distinct_from(model), s.billing_provider.is_distinct_from(billing_provider)),
                )
                for c, v in route.items():
                    fill = func.coalesce(s[c], literal(v, SESSIONS.c[c].type)) if v is not None else s[c]
                    values[c] = case((first, literal(v, SESSIONS.c[c].type)), else_=fill)
            else:
                for c, v in route.items():
                    if v is not None:
                        values[c] = func.coalesce(s[c], literal(v, SESSIONS.c[c].type))
        self.conn.execute(update(SESSIONS).where(s.id == session_id).values(values))
        if absolute or not (any(counts.values()) or estimated_cost_usd):
            return
        stored: Mapping[Any, Any] = self.conn.execute(
            select(s.model, s.billing_provider, s.billing_base_url, s.billing_mode).where(s.id == session_id)
        ).mappings().first() or {}
        key_model = model if model is not None else (stored.get("model") or "unknown")
        key_route = [v if v is not None else (stored.get(c) or "") for c, v in
                     zip(ROUTE, (billing_provider, billing_base_url, billing_mode), strict=True)]
        self._add_to_ledger(session_id, key_model, key_route, "", counts, estimated_cost_usd, actual_cost_usd,
                            cost_status, cost_source, t)

    def record_auxiliary(
        self,
        session_id: str,
        task: str,
        *,
        model: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: float | None = None,
        api_call_count: int | None = 1,
    ) -> None:
        """Side-task calls on the ledger (Hermes v26 ``record_auxiliary_usage``).

        The session row is ensured (source 'unknown') but its counters never move; the
        route is the call's own (no borrowing from the session), billing mode ''.
        ``api_call_count`` None counts one call.
        """
        counts = {c: _count(v, c) for c, v in zip(
            COUNTERS, (input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens),
            strict=True,
        )}
        counts["api_call_count"] = 1 if api_call_count is None else _count(api_call_count, "api_call_count")
        estimated_cost_usd = _cost(estimated_cost_usd, "estimated_cost_usd")
        self._peer(SessionRepository).create(session_id, "unknown")
        self._add_to_ledger(session_id, model or "unknown", [billing_provider or "", billing_base_url or "", ""],
                            task, counts, estimated_cost_usd, None, None, None, self.now())

    def totals(self, min_message_count: int, include_archived: bool) -> dict[str, float]:
        """Tokens and cost of root sessions with at least ``min_message_count`` messages.

        Tokens are what the calls sent and received: input, output, cache reads and
        cache writes (reasoning tokens are part of the output). A session's cost is
        its actual cost where known, else its estimate.
        """
        s = SESSIONS.c
        tokens = sum((func.coalesce(s[c], 0) for c in TOKEN_TOTAL), literal(0))
        cost = func.coalesce(s.actual_cost_usd, s.estimated_cost_usd, 0.0)
        stmt = select(func.coalesce(func.sum(tokens), 0), func.coalesce(func.sum(cost), 0.0)).where(
            s.parent_session_id.is_(None), func.coalesce(s.message_count, 0) >= min_message_count,
        )
        if not include_archived:
            stmt = stmt.where(func.coalesce(s.archived, 0) == 0)
        total_tokens, total_cost = self.conn.execute(stmt).one()
        return {"tokens": int(total_tokens or 0), "cost_usd": float(total_cost or 0.0)}

    def dominant_route(self, session_id: str) -> dict[str, Any] | None:
        """The main loop's most used route of a session (Hermes v26): the task-'' ledger
        row naming a real model and provider with the most calls, then tokens, then the
        latest use."""
        t = LEDGER_TABLE.c
        tokens = sum((func.coalesce(t[c], 0) for c in TOKEN_TOTAL), literal(0))
        stmt = (
            select(t.model, t.billing_provider, t.billing_base_url, t.billing_mode, t.api_call_count)
            .where(t.session_id == session_id, t.task == "",
                   t.model.not_in(("", "unknown")), t.billing_provider != "")
            .order_by(t.api_call_count.desc(), tokens.desc(), t.last_seen.desc())
            .limit(1)
        )
        row = self.conn.execute(stmt).mappings().first()
        if row is None:
            return None
        found = dict(row)
        found["api_call_count"] = int(found["api_call_count"] or 0)
        return found

    def _add_to_ledger(
        self,
        session_id: str,
        model: str,
        route: list[str],
        task: str,
        counts: dict[str, int],
        estimated: float | None,
        actual: float | None,
        cost_status: str | None,
        cost_source: str | None,
        t: float,
    ) -> None:
        """Add a delta to the ledger row of (session, model, route, task), creating it."""
        q: dict[str, Any] = {
            "session_id": session_id, "model": model, **dict(zip(ROUTE, route, strict=True)), "task": task, **counts,
            "estimated_cost_usd": float(estimated or 0.0), "actual_cost_usd": float(actual or 0.0),
            "cost_status": cost_status, "cost_source": cost_source, "first_seen": t, "last_seen": t,
        }
        self._exec(_ledger_upsert(self.conn, tuple(counts)), q)


@per_dialect
def _ledger_upsert(dialect: Dialect, counts: tuple[str, ...]) -> Any:
    """The ledger upsert: a clash on the key adds the counters and costs to the row,
    takes a cost status/source when the call has one, and moves ``last_seen``."""
    ins = dialect.insert(LEDGER_TABLE)
    t = LEDGER_TABLE.c
    sets: dict[str, Any] = {c: t[c] + ins.excluded[c] for c in (*counts, "estimated_cost_usd", "actual_cost_usd")}
    sets.update({c: func.coalesce(ins.excluded[c], t[c]) for c in ("cost_status", "cost_source")})
    sets["last_seen"] = ins.excluded.last_seen
    return ins.on_conflict_do_update(index_elements=list(_KEY), set_=sets)
