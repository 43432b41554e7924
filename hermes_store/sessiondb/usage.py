"""Token and cost accounting: the session totals and the per-model usage ledger."""

from __future__ import annotations

from typing import Any, Optional

from ..repositories import MaintenanceRepository
from ..repositories.usage import ApiCallUsage, UsageRepository
from ._host import Host


class UsageMixin(Host):
    def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str | None = None,
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
    ) -> None:
        """One side-task call (vision, compression, title generation...) on the ledger.

        No-op for a falsy id or task. The session row is ensured, its counters never
        move; the call's own route is used (model 'unknown', provider/base URL '' when
        missing). Errors propagate.
        """
        if not session_id or not task:
            return
        args = dict(locals())
        for name in ("self", "session_id", "task"):
            args.pop(name)
        self._write(lambda c: UsageRepository(c).record_auxiliary(session_id, task, **args))

    def usage(self, by: str = "model", source: str | None = None) -> list[Any]:
        return self._read(lambda c: MaintenanceRepository(c).usage(by, source))
