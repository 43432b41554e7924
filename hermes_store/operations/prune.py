"""Auto-prune and vacuum: Hermes' startup housekeeping, at most once per interval.

Three steps, each its own transaction: read when it last ran (``state_meta``), prune
and stamp the run in one write (a failed prune leaves no stamp, so the next start
tries again), then VACUUM outside any transaction when something went.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from sqlalchemy import Connection

from ..repositories import MaintenanceRepository
from .fts import vacuum as vacuum_store
from .steps import Steps

#: The ``state_meta`` key holding when auto-prune last ran (Hermes v11).
LAST_AUTO_PRUNE_KEY = "last_auto_prune"


def auto_prune_and_vacuum(
    steps: Steps,
    retention_days: int = 90,
    min_interval_hours: float = 24,
    vacuum: bool = True,
    sessions_dir: Optional[Path] = None,
    *,
    run_vacuum: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Delete ended sessions older than ``retention_days`` (and VACUUM when any went),
    unless the last run was less than ``min_interval_hours`` ago.

    Returns ``{"skipped", "pruned", "vacuumed"}``, plus ``"error": "Type: message"`` when
    a step failed: never raises, as it runs on startup paths. ``run_vacuum`` replaces
    the default vacuum (:func:`hermes_store.operations.fts.vacuum` on ``steps``).
    """
    result: dict[str, Any] = {"skipped": False, "pruned": 0, "vacuumed": False}
    try:
        last_raw = steps.read(lambda c: MaintenanceRepository(c).get_meta(LAST_AUTO_PRUNE_KEY))
        try:
            last = float(last_raw) if last_raw is not None else None
        except ValueError:
            last = None  # unreadable stamp: treat as never run
        if last is not None and steps.now() - last < float(min_interval_hours) * 3600:
            result["skipped"] = True
            return result

        def run(c: Connection) -> int:
            repo = MaintenanceRepository(c)
            pruned = repo.prune_sessions(retention_days, None, sessions_dir)
            repo.set_meta(LAST_AUTO_PRUNE_KEY, repr(steps.now()))
            return pruned

        result["pruned"] = steps.write(run)
        if vacuum and result["pruned"]:
            if run_vacuum is not None:
                run_vacuum()
            else:
                vacuum_store(steps)
            result["vacuumed"] = True
    except Exception as exc:  # reported, never raised: this runs on startup paths
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result
