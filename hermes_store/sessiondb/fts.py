"""Search-index upkeep and database maintenance: FTS optimize/rebuild, VACUUM, meta."""

from __future__ import annotations

from typing import Any

from ..repositories import MaintenanceRepository
from ..repositories.base import driver_errors
from ._host import TRANSCRIPT_BUDGET_S, Host


class FtsMixin(Host):
    def vacuum(self) -> None:
        with driver_errors():
            self._dialect.vacuum(self._open_engine())

    def get_meta(self, key: str) -> str | None:
        return self._read(lambda c: MaintenanceRepository(c).get_meta(key))

    def set_meta(self, key: str, value: Any) -> None:
        self._write(lambda c: MaintenanceRepository(c).set_meta(key, value))

    def rebuild_fts(self) -> list[str]:
        """Rebuild both FTS5 indexes and the short-CJK index from the messages table."""
        return self._write(lambda c: MaintenanceRepository(c).rebuild_search(), budget=TRANSCRIPT_BUDGET_S)

    def index_search(self) -> int:
        """Bring the short-CJK index fully up to date now; returns rows indexed."""
        return self._write(lambda c: MaintenanceRepository(c).catch_up_search_index(), budget=TRANSCRIPT_BUDGET_S)

    def optimize_fts(self) -> list[str]:
        return self._write(lambda c: MaintenanceRepository(c).fts_optimize(), budget=TRANSCRIPT_BUDGET_S)

    def check_fts(self) -> dict[str, str | None]:
        return self._read(lambda c: MaintenanceRepository(c).fts_integrity_check())
