"""Token and cost accounting: the session totals and the per-model usage ledger."""

from __future__ import annotations

from typing import Any

from ..repositories import MaintenanceRepository, SessionRepository
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
        estimated_cost_usd: float | None = None,
        actual_cost_usd: float | None = None,
        cost_status: str | None = None,
        cost_source: str | None = None,
        pricing_version: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        billing_mode: str | None = None,
        api_call_count: int = 0,
        absolute: bool = False,
        task: str = "",
    ) -> None:
        args = dict(locals())
        args.pop("self")
        self._write(lambda c: SessionRepository(c).update_token_counts(**args))

    def usage(self, by: str = "model", source: str | None = None) -> list[Any]:
        return self._read(lambda c: MaintenanceRepository(c).usage(by, source))
