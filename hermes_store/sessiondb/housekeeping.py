"""Export, import, delete and prune: moving sessions in and out as a whole."""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator

from sqlalchemy import Connection

from ..repositories import MaintenanceRepository
from ._host import TRANSCRIPT_BUDGET_S, Host


class HousekeepingMixin(Host):
    def export_session(self, session_id: str) -> dict[str, Any] | None:
        return self._read(lambda c: MaintenanceRepository(c).export_session(session_id))

    def export_all(self, source: str | None = None) -> list[dict[str, Any]]:
        return list(self.iter_export(source))

    def iter_export(self, source: str | None = None) -> Iterator[dict[str, Any]]:
        """Streamed export: one session (with messages) at a time, flat memory."""
        with self._engine.connect() as conn:
            try:
                yield from MaintenanceRepository(conn).iter_export(source)
            finally:
                conn.rollback()

    def import_sessions(self, records: Iterable[dict[str, Any]], batch: int = 200) -> tuple[int, int]:
        """Import exported sessions idempotently; returns (imported, skipped)."""
        imported = skipped = 0
        chunk: list[dict[str, Any]] = []
        # Children met before their parent, carried across batches until it arrives.
        pending: list[tuple[str, str]] = []

        def flush(rows: list[dict[str, Any]]) -> tuple[int, int]:
            def run(c: Connection) -> tuple[int, int]:
                repo = MaintenanceRepository(c, pending_parents=pending)
                repo.defer_foreign_keys()
                done = sum(1 for r in rows if repo.import_session(r))
                return done, len(rows) - done

            return self._write(run, budget=TRANSCRIPT_BUDGET_S)

        for record in records:
            chunk.append(record)
            if len(chunk) >= batch:
                a, b = flush(chunk)
                imported, skipped, chunk = imported + a, skipped + b, []
        if chunk:
            a, b = flush(chunk)
            imported, skipped = imported + a, skipped + b
        if imported:
            self.index_search()  # an import is maintenance: leave the short-CJK index complete
        return imported, skipped

    def delete_session(self, session_id: str, sessions_dir: str | os.PathLike[str] | None = None) -> bool:
        return self._write(lambda c: MaintenanceRepository(c).delete_session(session_id, sessions_dir))

    def prune_sessions(
        self, older_than_days: int = 90, source: str | None = None, sessions_dir: str | os.PathLike[str] | None = None
    ) -> int:
        return self._write(lambda c: MaintenanceRepository(c).prune_sessions(older_than_days, source, sessions_dir))

    def prune_candidates(self, older_than_days: int = 90, source: str | None = None) -> list[dict[str, Any]]:
        """Read-only: the sessions :meth:`prune_sessions` would delete."""
        return self._read(lambda c: MaintenanceRepository(c).prune_candidates(older_than_days, source))

    def prune_empty_ghost_sessions(self, sessions_dir: str | os.PathLike[str] | None = None) -> int:
        return self._write(lambda c: MaintenanceRepository(c).prune_empty_ghost_sessions(sessions_dir))

    def finalize_orphaned_compression_sessions(self) -> int:
        return self._write(lambda c: MaintenanceRepository(c).finalize_orphaned_compression_sessions())

    def maybe_auto_prune_and_vacuum(
        self,
        retention_days: int = 90,
        min_interval_hours: float = 24,
        vacuum: bool = True,
        sessions_dir: str | os.PathLike[str] | None = None,
    ) -> dict[str, Any]:
        """Prune (and VACUUM) at most once per interval, tracked in state_meta."""
        result: dict[str, Any] = {"skipped": False, "pruned": 0, "vacuumed": False}
        try:
            last_raw = self.get_meta("last_auto_prune")
            try:
                last = float(last_raw) if last_raw is not None else None
            except ValueError:
                last = None  # unreadable stamp: treat as never run
            if last is not None and self._now() - last < float(min_interval_hours) * 3600:
                result["skipped"] = True
                return result

            def run(c: Connection) -> int:
                repo = MaintenanceRepository(c)
                pruned = repo.prune_sessions(retention_days, None, sessions_dir)
                repo.set_meta("last_auto_prune", repr(self._now()))
                return pruned

            result["pruned"] = self._write(run)
            if vacuum and result["pruned"]:
                self.vacuum()
                result["vacuumed"] = True
        except Exception as exc:  # reported, never raised: this runs on startup paths
            result["error"] = f"{type(exc).__name__}: {exc}"
        return result
