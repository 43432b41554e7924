"""Search-index workflows of several transactions: optimize-storage and vacuum.

Hermes' optimize-storage moves the FTS5 indexes to the current layout without holding
the write lock for long: every chunk is its own short transaction and the workflow
pauses between chunks (a multiple of the chunk's own time), so other writers get the
lock in between. On PostgreSQL the indexes are GIN indexes the server keeps complete:
there is never a window, legacy layout or trash, and the steps find nothing to do.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from .. import errors, migrations
from ..dialects import for_connection
from ..dialects.fts5 import FtsObject, fts_objects_of
from ..dialects.sqlite import driver_errors
from ..repositories.fts_upkeep import FtsUpkeepRepository
from . import steps as steps_module
from .steps import Steps

log = logging.getLogger(__name__)

#: Hermes v23's pacing of optimize-storage (``SessionDB._FTS_REBUILD_*``).
REBUILD_CHUNK_ROWS = 500
REBUILD_DUTY_FACTOR = 4.0
REBUILD_MIN_PAUSE_S = 0.2
#: How long one backfill or teardown step waits for the write lock before it reports
#: "try again": a step must not stall behind a long writer.
STEP_BUDGET_S = 5.0

#: What a failed yes/no probe of the indexes may raise (the answer is then no).
PROBE_ERRORS = (errors.DatabaseUnavailableError, DBAPIError, sqlite3.Error)

ProgressCallback = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Pacing:
    """Chunk size, pauses and lock budget of optimize-storage's steps."""

    chunk_rows: int = REBUILD_CHUNK_ROWS
    duty_factor: float = REBUILD_DUTY_FACTOR
    min_pause: float = REBUILD_MIN_PAUSE_S
    step_budget: float = STEP_BUDGET_S


def _long_budget() -> float:
    """The long write budget (index rewrites) as :mod:`.steps` holds it now (code may lower it)."""
    return float(steps_module.LONG_BUDGET_S)


def probe(steps: Steps, fn: Callable[[FtsUpkeepRepository], Any]) -> bool:
    """A yes/no question about the search indexes, asked in one read (no when the store
    is closed or the indexes cannot be read: the caller then skips the work)."""
    try:
        return bool(steps.read(lambda c: fn(FtsUpkeepRepository(c))))
    except PROBE_ERRORS as exc:
        log.debug("search index probe failed: %s", exc)
        return False


def optimize_indexes(steps: Steps, *, bounded: bool = False) -> list[str]:
    """FTS5 ``'optimize'`` (``'merge'`` when ``bounded``) of every index, in one write;
    the names of the indexes done."""
    return steps.write(lambda c: FtsUpkeepRepository(c).optimize_each(bounded=bounded), budget=_long_budget())


def rebuild_step(steps: Steps, kind: str = "main", *, chunk_rows: int = REBUILD_CHUNK_ROWS,
                 budget: float = STEP_BUDGET_S) -> bool:
    """Backfill the next ``chunk_rows`` ids of rebuild window ``kind`` ("main", "cjk").

    True while work remains, or when the lock stayed busy (transient: try again); False
    once the window is closed or cannot be filled here.
    """
    try:
        return steps.write(lambda c: FtsUpkeepRepository(c).backfill_step(kind, chunk_rows), budget=budget)
    except errors.DatabaseLockedError as exc:
        log.debug("rebuild step deferred: %s", exc)
        return True


@functools.lru_cache(maxsize=1)
def head_fts_objects() -> tuple[FtsObject, ...]:
    """(type, name, CREATE) of every FTS object our head schema has, in creation order.

    Read from a database our migrations build (once per process), so the layout a
    demotion creates is exactly what a fresh file gets: views, then the virtual
    tables, then the triggers that feed them (the CJK index is not ours). Here, above
    the migrations: the dialects and repositories below them take it as an argument.
    """
    with tempfile.TemporaryDirectory(prefix="hermes-store-fts-") as tmp:
        path = Path(tmp) / "head.db"
        migrations.upgrade(path)
        return fts_objects_of(path)


def demote_legacy_fts(steps: Steps) -> list[str]:
    """Swap pre-v23 inline indexes for the head layout in one short write; the demoted
    tables (none on a current layout or while a window is open)."""
    demoted = steps.write(lambda c: FtsUpkeepRepository(c).demote_legacy(head_fts_objects), budget=_long_budget())
    if demoted:
        log.info("demoted pre-v23 search indexes %s; backfilling the new ones", ", ".join(demoted))
    return demoted


def vacuum_now(engine: Engine) -> None:
    """Fold the WAL into the file and give free pages back (``VACUUM``; ``VACUUM
    ANALYZE`` on a server), outside any transaction: run it with ``steps.outside``."""
    dialect = for_connection(engine)
    with driver_errors(locks=True):
        dialect.checkpoint_truncate(engine)
        dialect.vacuum(engine)


def vacuum(steps: Steps, *, optimize: Callable[[], int] | None = None) -> int:
    """Optimize the indexes, then VACUUM; returns how many indexes were optimized.

    As Hermes v23: the optimize step first (``optimize``, default one full optimize
    write; a failure is logged and counts as 0), then the vacuum, whose errors propagate.
    """
    try:
        optimized = optimize() if optimize is not None else len(optimize_indexes(steps))
    except Exception as exc:
        log.warning("optimize before vacuum failed: %s", exc)
        optimized = 0
    steps.outside(vacuum_now)
    return optimized


def _teardown_chunk(rows: int) -> Callable[[Connection], tuple[int, bool]]:
    """One teardown step of ``rows`` rows, bound now (the loop's chunk size may change)."""
    return lambda conn: FtsUpkeepRepository(conn).teardown_chunk(rows)


def _pause(steps: Steps, started: float, pacing: Pacing) -> None:
    """Sleep between chunks: ``max(min pause, duty factor × the chunk's own time)``."""
    spent = max(steps.monotonic() - started, 0.0)
    steps.sleep(max(pacing.min_pause, pacing.duty_factor * spent))


def teardown_trash(steps: Steps, report: Callable[[str, int, int, int], None],
                   pacing: Pacing = Pacing()) -> int:
    """Empty and drop the trash tables of a demotion, ``pacing.chunk_rows`` rows a
    transaction, pausing between them; a step that finds the lock busy waits and tries
    again. Returns the rows removed."""
    total = steps.read(lambda c: FtsUpkeepRepository(c).trash_rows())
    removed = 0
    while True:
        started = steps.monotonic()
        chunk = pacing.chunk_rows
        try:
            deleted, more = steps.write(_teardown_chunk(chunk), budget=pacing.step_budget)
        except errors.DatabaseLockedError:
            _pause(steps, started, pacing)
            continue
        removed += deleted
        if deleted or more or total:
            percent = 100 if not more else min(99, int(100 * removed / total)) if total else 0
            report("teardown", percent, removed, total)
        if not more:
            return removed
        _pause(steps, started, pacing)


def optimize_fts_storage(
    steps: Steps,
    *,
    progress_cb: ProgressCallback | None = None,
    vacuum: bool = True,
    pacing: Pacing = Pacing(),
    fts_enabled: bool | None = None,
    on_demoted: Callable[[list[str]], None] | None = None,
) -> dict[str, Any]:
    """Hermes' ``hermes sessions optimize-storage``, one short transaction per step.

    In order: demote a pre-v23 layout (unless a window is already open; ``on_demoted``
    then hears which tables went); backfill the window chunk by chunk; the CJK window's
    steps while its index answers here; tear the trash down chunk by chunk, pausing
    between chunks; optional VACUUM (a failure is reported, not raised); stamp the
    layout. Resumable: an interrupted run leaves a window the next run continues.
    ``progress_cb`` gets ``{"phase": "backfill" | "teardown" | "vacuum" | "done",
    "percent", "indexed", "total"}``.

    ``fts_enabled``: whether full-text search may be used here (None: ask the database).
    Returns ``{"ok": True, "vacuumed": True | False | None}`` (None: not asked) or
    ``{"ok": False, "reason": "fts5_unavailable"}``.
    """
    if fts_enabled is None:
        fts_enabled = probe(steps, lambda r: r.search_available())
    if not fts_enabled:
        return {"ok": False, "reason": "fts5_unavailable"}
    last = {"indexed": 0, "total": 0}

    def report(phase: str, percent: int, indexed: int, total: int) -> None:
        if progress_cb is not None:
            progress_cb({"phase": phase, "percent": percent, "indexed": indexed, "total": total})

    demoted = demote_legacy_fts(steps)
    if demoted and on_demoted is not None:
        on_demoted(demoted)
    status = steps.read(lambda c: FtsUpkeepRepository(c).rebuild_status("main"))
    while status is not None:
        started = steps.monotonic()
        more = rebuild_step(steps, "main", chunk_rows=pacing.chunk_rows, budget=pacing.step_budget)
        last = {"indexed": status["indexed"], "total": status["total"]}
        status = steps.read(lambda c: FtsUpkeepRepository(c).rebuild_status("main"))
        if status is None:
            last["indexed"] = last["total"]
            report("backfill", 100, last["total"], last["total"])
            break
        report("backfill", status["percent"], status["indexed"], status["total"])
        if not more:
            break  # the window cannot be filled here (its index does not answer)
        _pause(steps, started, pacing)
    while probe(steps, lambda r: r.cjk_index_available()) and rebuild_step(
        steps, "cjk", chunk_rows=pacing.chunk_rows, budget=pacing.step_budget
    ):
        _pause(steps, steps.monotonic(), pacing)
    teardown_trash(steps, report, pacing)
    vacuumed: bool | None = None
    if vacuum:
        report("vacuum", 100, last["indexed"], last["total"])
        try:
            steps.outside(vacuum_now)
            vacuumed = True
        except Exception as exc:
            log.warning("vacuum after optimize-storage failed: %s", exc)
            vacuumed = False
    steps.write(lambda c: FtsUpkeepRepository(c).finish_storage_optimize())
    report("done", 100, last["indexed"], last["total"])
    return {"ok": True, "vacuumed": vacuumed}
