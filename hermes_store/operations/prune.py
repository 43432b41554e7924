"""Auto-prune, vacuum and auto-archive: Hermes' startup housekeeping, at most once per interval.

Each step is its own transaction: read when it last ran (``state_meta``), do the work
and stamp the run in one write (a failed step leaves no stamp, so the next start tries
again), then VACUUM outside any transaction when something went and the last VACUUM
is old enough (``last_vacuum``, stamped only after a VACUUM succeeded).
"""

from __future__ import annotations

import logging
import sqlite3
import time as _time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from sqlalchemy import Connection, Engine

from .. import errors
from ..keys import DAY, LAST_AUTO_ARCHIVE_KEY, LAST_AUTO_PRUNE_KEY, LAST_VACUUM_KEY
from ..dialects import for_connection
from ..engine import translate_driver_error
from ..repositories import MaintenanceRepository
from ..dialects.sqlite import driver_errors
from ..repositories.housekeeping import HousekeepingRepository
from ..repositories.maintenance import MARKER_BACKUP_PREFIX, vacuum_into
from ..repositories.retention import RetentionPolicyRecord, RetentionRepository
from .retention import apply_retention
from .steps import Steps

log = logging.getLogger(__name__)

#: ``state_meta`` key: when an auto-maintenance VACUUM failed (cleared by the next one
#: that succeeds). While set, the next call retries the VACUUM even inside the prune
#: interval and with nothing new pruned.
VACUUM_OWED_KEY = "auto_vacuum_owed"


def _stamps(steps: Steps, *keys: str) -> list[float | None]:
    """The times stored under ``keys``, in one read; None when absent or unreadable
    (treated as never)."""
    raws = steps.read(lambda c: [MaintenanceRepository(c).get_meta(k) for k in keys])
    out: list[float | None] = []
    for raw in raws:
        try:
            out.append(float(raw) if raw is not None else None)
        except ValueError:
            out.append(None)
    return out


def reported(exc: BaseException) -> str:
    """``"Type: message"`` of a failure a workflow reports instead of raising: the typed
    error a driver error stands for (a held lock: DatabaseLockedError), never the
    driver's own."""
    typed = exc if isinstance(exc, errors.HermesStoreError) else translate_driver_error(exc, locks=True)
    shown = typed if typed is not None else exc
    return f"{type(shown).__name__}: {shown}"


def _due(steps: Steps, last: float | None, interval_s: float) -> bool:
    return last is None or steps.now() - last >= interval_s


def auto_prune_and_vacuum(
    steps: Steps,
    retention_days: int = 90,
    min_interval_hours: float = 24,
    vacuum: bool = True,
    sessions_dir: Path | None = None,
    min_vacuum_interval_days: float = 30,
    *,
    run_vacuum: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Delete ended sessions inactive for ``retention_days`` (pinned ones kept), unless
    the last run was less than ``min_interval_hours`` ago; VACUUM when any went and the
    last VACUUM is absent or ``min_vacuum_interval_days`` old. When the store has
    retention policies (read in the prune's transaction), they are applied right after
    it, in batches of their own (:func:`hermes_store.operations.retention.apply_retention`),
    and ``"retention"`` holds their report; what they remove counts for the VACUUM too.

    Returns ``{"skipped", "pruned", "vacuumed"}``, plus ``"error": "Type: message"`` when
    a step failed (a typed error: a lock held past the write budget is
    ``DatabaseLockedError``): never raises, as it runs on startup paths. A prune that
    committed keeps its ``last_auto_prune`` stamp when the VACUUM after it fails; that
    VACUUM is then owed (:data:`VACUUM_OWED_KEY`) and the next call runs it again, inside
    the prune interval and with nothing new pruned (still no sooner than
    ``min_vacuum_interval_days`` after the last one that succeeded). ``run_vacuum`` replaces
    the default vacuum (:func:`hermes_store.operations.fts.vacuum` on ``steps``).
    """
    result: dict[str, Any] = {"skipped": False, "pruned": 0, "vacuumed": False}
    try:
        last_prune, last_vacuum, owed = _stamps(steps, LAST_AUTO_PRUNE_KEY, LAST_VACUUM_KEY, VACUUM_OWED_KEY)
        retry_vacuum = vacuum and owed is not None
        if not retry_vacuum and not _due(steps, last_prune, float(min_interval_hours) * 3600):
            result["skipped"] = True
            return result

        def run(c: Connection) -> tuple[int, list[RetentionPolicyRecord]]:
            repo = MaintenanceRepository(c)
            pruned = repo.prune_sessions(retention_days, None, sessions_dir)
            repo.set_meta(LAST_AUTO_PRUNE_KEY, repr(steps.now()))
            return pruned, RetentionRepository(c).policies()

        if retry_vacuum and not _due(steps, last_prune, float(min_interval_hours) * 3600):
            policies: list[RetentionPolicyRecord] = []  # only the owed VACUUM: the prune ran this interval
        else:
            result["pruned"], policies = steps.write(run)
        changed = bool(result["pruned"]) or retry_vacuum
        if policies:  # the store's retention policies (hs0009), in batches of their own
            retained = apply_retention(steps, sessions_dir=sessions_dir, policies=policies)
            result["retention"] = retained.as_dict()
            changed = changed or retained.changed
        if vacuum and changed and _due(steps, last_vacuum, float(min_vacuum_interval_days) * DAY):
            try:
                if run_vacuum is not None:
                    run_vacuum()
                else:
                    steps.outside(vacuum_v26)
            except Exception:
                # Owed: the next call runs it again, whatever the intervals say.
                _owe_vacuum(steps, repr(steps.now()))
                raise
            steps.write(lambda c: _vacuumed(MaintenanceRepository(c), repr(steps.now())))
            result["vacuumed"] = True
    except Exception as exc:  # reported, never raised: this runs on startup paths
        result["error"] = reported(exc)
    return result


def _owe_vacuum(steps: Steps, stamp: str) -> None:
    """Record a VACUUM that failed (:func:`_vacuumed` clears it); best effort (the lock
    that failed the VACUUM may fail this write too: then the next due prune vacuums)."""
    try:
        steps.write(lambda c: MaintenanceRepository(c).set_meta(VACUUM_OWED_KEY, stamp))
    except Exception as exc:
        log.warning("could not record the failed VACUUM: %s", exc)


def _vacuumed(repo: MaintenanceRepository, stamp: str) -> None:
    """A VACUUM succeeded: stamp ``last_vacuum``, nothing owed any more."""
    repo.set_meta(LAST_VACUUM_KEY, stamp)
    if repo.get_meta(VACUUM_OWED_KEY) is not None:
        repo.set_meta(VACUUM_OWED_KEY, None)


def auto_archive(
    steps: Steps, idle_days: float = 3, min_interval_hours: float = 24, exclude_pinned: bool = True
) -> dict[str, Any]:
    """Archive ended sessions idle for ``idle_days`` (with their lineages) at most once
    per ``min_interval_hours``; running sessions are left visible (ours: Hermes also
    hides unended ones). ``{"skipped", "archived"[, "error"]}``; never raises."""
    result: dict[str, Any] = {"skipped": False, "archived": 0}
    try:
        if not _due(steps, _stamps(steps, LAST_AUTO_ARCHIVE_KEY)[0], float(min_interval_hours) * 3600):
            result["skipped"] = True
            return result

        def run(c: Connection) -> int:
            cutoff = steps.now() - float(idle_days) * DAY
            archived = HousekeepingRepository(c).archive_stale(cutoff, exclude_pinned=exclude_pinned,
                                                               ended_only=True)
            MaintenanceRepository(c).set_meta(LAST_AUTO_ARCHIVE_KEY, repr(steps.now()))
            return archived

        result["archived"] = steps.write(run)
    except Exception as exc:  # reported, never raised: this runs on startup paths
        result["error"] = reported(exc)
    return result


def vacuum_v26(engine: Engine) -> None:
    """Hermes v26's VACUUM, outside any transaction: a PASSIVE checkpoint, ``VACUUM``
    (``VACUUM ANALYZE`` on a server), then a TRUNCATE checkpoint that empties the WAL
    the VACUUM itself wrote. Run it with ``steps.outside``."""
    dialect = for_connection(engine)
    with driver_errors(locks=True):
        dialect.checkpoint(engine)
        dialect.vacuum(engine)
        dialect.checkpoint_truncate(engine)


def vacuum_after_optimize_storage(engine: Engine) -> None:
    """optimize-storage's VACUUM (Hermes v25): ``VACUUM``, then one PASSIVE checkpoint,
    never a TRUNCATE. Run it with ``steps.outside``."""
    dialect = for_connection(engine)
    with driver_errors(locks=True):
        dialect.vacuum(engine)
        dialect.checkpoint(engine)


#: Hermes v26's ``vacuum()`` on its ``_conn``: a PASSIVE checkpoint, VACUUM, a TRUNCATE checkpoint.
VACUUM_ON_CONN = ("PRAGMA wal_checkpoint(PASSIVE)", "VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)")
#: ``optimize_fts_storage``'s on ``_conn``: VACUUM, then one PASSIVE checkpoint (no TRUNCATE).
STORAGE_VACUUM_ON_CONN = ("VACUUM", "PRAGMA wal_checkpoint(PASSIVE)")


def vacuum_on_dbapi(conn: Any, statements: tuple[str, ...]) -> None:
    """Run a VACUUM sequence on a plain DB-API connection (SessionDB's ``_conn``, which
    Hermes' tests trace), outside any transaction. A checkpoint is best effort (a busy
    one is left for the next); the VACUUM's errors propagate typed (a held lock:
    DatabaseLockedError, which ``Steps.outside`` retries)."""
    with driver_errors(locks=True):
        for sql in statements:
            if sql != "VACUUM":
                try:
                    conn.execute(sql).fetchall()
                except sqlite3.OperationalError as exc:
                    log.debug("%s skipped: %s", sql, exc)
                continue
            conn.execute(sql)


def vacuum(steps: Steps, *, optimize: Callable[[], int]) -> int:
    """Hermes v26's ``vacuum()``: ``optimize`` first (a failure is logged and counts as
    0), then :func:`vacuum_v26`, whose errors propagate. Returns the optimize count."""
    try:
        optimized = optimize()
    except Exception as exc:
        log.warning("optimize before vacuum failed: %s", exc)
        optimized = 0
    steps.outside(vacuum_v26)
    return optimized


def purge_stale_tool_call_markers(steps: Steps, *, dry_run: bool = False, backup: bool = True) -> dict[str, Any]:
    """Blank the content of stored stale ``[tool_name]`` markers (Hermes v25).

    A dry run, or nothing to do: no write and no backup. Otherwise, with ``backup``, a
    copy first: ``VACUUM INTO "<db>.pre-clean-markers-backup-<stamp>"`` for a file (only
    rows that copy holds are blanked), or the rows' content in ``state_meta`` under
    ``pre-clean-markers-backup-<stamp>`` on a server, written in the blanking transaction
    (``backup_path`` then names that key as ``state_meta:<key>``).
    """
    found = [i for i, _ in steps.read(lambda c: MaintenanceRepository(c).stale_tool_call_markers())]
    result: dict[str, Any] = {"dry_run": bool(dry_run), "rows_affected": len(found), "row_ids": found,
                              "backup_path": None}
    if dry_run or not found:
        return result
    stamp = _time.strftime("%Y%m%d-%H%M%S", _time.gmtime(steps.now()))
    key = None
    if backup:
        engine = steps.engine
        # A database that is a file here is backed up beside it; a server's (or an
        # in-memory one's) markers are kept in state_meta.
        database = for_connection(engine).database_path(engine.url)
        if database is not None:
            path = f"{database}.{MARKER_BACKUP_PREFIX}{stamp}"
            steps.outside(lambda e: vacuum_into(e, path))
            result["backup_path"] = path
        else:
            key = MARKER_BACKUP_PREFIX + stamp
            result["backup_path"] = f"state_meta:{key}"
    done = steps.write(lambda c: MaintenanceRepository(c).blank_tool_call_markers(found, key))
    result.update(rows_affected=len(done), row_ids=done)
    return result
