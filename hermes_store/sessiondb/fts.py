"""Search-index upkeep and database maintenance: Hermes v23 §1.G, and ``set_meta`` (§1.J).

Hermes' counts and shapes: ``optimize_fts()`` / ``rebuild_fts()`` return how many
indexes they did (our lists of names stay available as :meth:`optimize_search_indexes`
and :meth:`rebuild_search_indexes`, which the CLI prints), ``vacuum()`` returns the
optimize count, and the optimize-storage surface (rebuild windows, pre-v23 layout
demotion, trash teardown) works on every file our store opens. On PostgreSQL the
indexes are GIN indexes kept complete by the server: optimize merges their pending
lists, rebuild is REINDEX, and there is never a window, legacy layout or trash.

The workflows of several transactions (optimize-storage, vacuum) are functions of
:mod:`hermes_store.operations.fts`, run here over the store's own ``_write``/``_read``
(:class:`~hermes_store.sessiondb._host.HostSteps`); what stays here is Hermes' surface:
its flags, its assignable constants, the read-only answers, the write-path hooks.

The write path's two extras of Hermes v23 live here as hooks the facade's ``_write``
calls: :meth:`_after_write` (best-effort optimize every ``_OPTIMIZE_EVERY_N_WRITES``
writes) and :meth:`_on_write_error` (an FTS-corruption error: rebuild once per
instance, then the write is retried). The periodic call is still ``optimize_fts()``
(code that patches it sees every call), but made from that hook it does bounded
upkeep (FTS5 ``'merge'``): Hermes' full optimize rewrites the whole index inside a
writer's transaction, 2.6 s at 200,000 messages with every other writer waiting.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import errors
from ..engine import schema_of
from ..dialects.fts5 import FTS_TRASH_PREFIX, HERMES_FTS_TABLES
from ..operations import fts as fts_ops
from ..operations import imports as import_ops
from ..operations import prune as prune_ops
from ..operations import search_index as search_ops
from ..repositories import MaintenanceRepository
from ..dialects.sqlite import driver_errors
from ..repositories.fts_upkeep import FtsUpkeepRepository, optimize_on_cursor, set_meta_on_cursor
from ._host import Host, HostSteps, transcript_budget

log = logging.getLogger(__name__)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, the driver error SQLAlchemy wrapped, and what it was raised from."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return seen


def _sqlite_error(exc: BaseException) -> sqlite3.Error | None:
    return next((e for e in _causes(exc) if isinstance(e, sqlite3.Error)), None)


#: Set while :meth:`FtsMixin._after_write` runs its periodic ``optimize_fts()`` call.
_PERIODIC = threading.local()


class FtsMixin(Host):
    #: Message ids a backfill step indexes (Hermes v23's chunk).
    _FTS_REBUILD_CHUNK_ROWS = fts_ops.REBUILD_CHUNK_ROWS
    #: optimize-storage sleeps this many times a chunk's own duration between chunks...
    _FTS_REBUILD_DUTY_FACTOR = fts_ops.REBUILD_DUTY_FACTOR
    #: ... and never less than this (seconds), so other writers get the lock in between.
    _FTS_REBUILD_MIN_PAUSE = fts_ops.REBUILD_MIN_PAUSE_S
    #: A best-effort optimize after this many writes (see :meth:`_after_write`).
    _OPTIMIZE_EVERY_N_WRITES = 1000
    _FTS_TABLES = HERMES_FTS_TABLES
    _FTS_TRASH_PREFIX = FTS_TRASH_PREFIX
    #: How long one backfill step or teardown chunk waits for the write lock before it
    #: reports "try again" (a step must not stall behind a long writer).
    _FTS_STEP_BUDGET_S = fts_ops.STEP_BUDGET_S

    def _maintenance_steps(self) -> HostSteps:
        """This store's transactions as a workflow's steps, each one index upkeep."""
        return HostSteps(self, maintenance=True)

    def _fts_pacing(self) -> fts_ops.Pacing:
        """optimize-storage's pacing, from the constants as this instance has them now."""
        return fts_ops.Pacing(
            chunk_rows=self._FTS_REBUILD_CHUNK_ROWS, duty_factor=self._FTS_REBUILD_DUTY_FACTOR,
            min_pause=self._FTS_REBUILD_MIN_PAUSE, step_budget=self._FTS_STEP_BUDGET_S,
        )

    # ------------------------------------------------------------------ Hermes' private flags

    def _fts_probe(self, fn: Callable[[FtsUpkeepRepository], Any]) -> bool:
        """A yes/no question about the search indexes (no on a closed or unreadable store)."""
        return fts_ops.probe(self._maintenance_steps(), fn)

    @property
    def _fts_enabled(self) -> bool:
        """Hermes' flag: full-text search may be used here.

        False on a read-only instance (as Hermes: its search then returns []) or when
        the word index cannot be read (no FTS5 in this SQLite). True on PostgreSQL.
        Probed on first use; code (and Hermes' tests) may assign it.
        """
        found = self.__dict__.get("_fts_enabled_value")
        if found is None:
            found = not self.read_only and self._fts_probe(lambda r: r.search_available())
            self.__dict__["_fts_enabled_value"] = found
        return found

    @_fts_enabled.setter
    def _fts_enabled(self, value: bool) -> None:
        self.__dict__["_fts_enabled_value"] = bool(value)

    @property
    def _trigram_available(self) -> bool:
        """Hermes' flag: the trigram index (substring and CJK search) answers here.

        On PostgreSQL: the pg_trgm index exists. Probed on first use, again after a
        demotion replaced the indexes; assignable.
        """
        found = self.__dict__.get("_trigram_available_value")
        if found is None:
            found = self._fts_enabled and self._fts_probe(lambda r: r.trigram_available())
            self.__dict__["_trigram_available_value"] = found
        return found

    @_trigram_available.setter
    def _trigram_available(self, value: bool) -> None:
        self.__dict__["_trigram_available_value"] = bool(value)

    def _fts_table_exists(self, name: str) -> bool:
        """Whether the SQLite schema has a table ``name`` (an FTS5 table, shadow or trash
        table). Always False on PostgreSQL, which has no FTS5 table."""
        return self._read(lambda c: FtsUpkeepRepository(c).fts_table_exists(name))

    @staticmethod
    def _is_fts5_unavailable_error(exc: BaseException) -> bool:
        """This SQLite has no FTS5 module ("no such module: fts5")."""
        found = _sqlite_error(exc)
        text = str(found if found is not None else exc).lower()
        return isinstance(found, sqlite3.OperationalError) and "fts5" in text and (
            "no such module" in text or "not available" in text or "unavailable" in text
        )

    @staticmethod
    def _is_trigram_unavailable_error(exc: BaseException) -> bool:
        """This SQLite's FTS5 has no trigram tokenizer (before 3.34: "no such tokenizer: trigram")."""
        found = _sqlite_error(exc)
        text = str(found if found is not None else exc).lower()
        return isinstance(found, sqlite3.OperationalError) and "trigram" in text and "tokenizer" in text

    @staticmethod
    def _is_fts_corruption_error(exc: BaseException) -> bool:
        """A SQLite DatabaseError of the kind an FTS rebuild can cure: "database disk image
        is malformed" (what FTS5 reports for a damaged index) or an FTS5 "corrupt" error."""
        found = _sqlite_error(exc)
        if not isinstance(found, sqlite3.DatabaseError) or isinstance(found, sqlite3.IntegrityError):
            return False
        text = str(found).lower()
        return "malformed" in text or ("fts5" in text and "corrupt" in text)

    # ------------------------------------------------------------------ optimize / rebuild / vacuum

    def optimize_fts(self) -> int:
        """FTS5 ``'optimize'`` on each index that answers here; returns how many succeeded.

        A missing index is skipped; one that fails with an OperationalError is logged
        and skipped. 0 on a read-only instance (nothing may be written). Called by the
        periodic upkeep of :meth:`_after_write`, it does FTS5's bounded ``'merge'``
        instead (see the module docstring).
        """
        if self.read_only:
            return 0
        if getattr(_PERIODIC, "active", False):
            return len(fts_ops.optimize_indexes(self._maintenance_steps(), bounded=True))
        if self._uses_raw_conn():
            # Hermes v26 runs it on ``_conn`` (its tests count the statements there).
            names = self._read(lambda c: FtsUpkeepRepository(c).maintained_indexes())
            with self._lock:
                return len(optimize_on_cursor(self._conn, names))
        return len(self.optimize_search_indexes())

    def optimize_search_indexes(self) -> list[str]:
        """:meth:`optimize_fts`, naming the indexes done (the CLI reports them)."""
        return fts_ops.optimize_indexes(self._maintenance_steps())

    def rebuild_fts(self) -> int:
        """Re-make each index from the messages (FTS5 ``'rebuild'``; REINDEX on a server).

        Returns how many were rebuilt; one that fails is rolled back and logged. An
        open rebuild window over indexes that were all rebuilt is closed. 0 on a
        read-only instance.
        """
        if self.read_only:
            return 0
        return len(
            self._write(lambda c: FtsUpkeepRepository(c).rebuild_each(), budget=transcript_budget(), _maintenance=True)
        )

    def rebuild_search_indexes(self) -> list[str]:
        """:meth:`rebuild_fts` plus our short-CJK index, naming what was rebuilt."""
        return self._write(
            lambda c: MaintenanceRepository(c).rebuild_search(), budget=transcript_budget(), _maintenance=True
        )

    def index_search(self) -> int:
        """Bring the short-CJK index fully up to date now; returns rows indexed."""
        return search_ops.index_search(HostSteps(self))

    def _index_search_after_commit(self) -> int:
        """:meth:`index_search` after a committed import: the import stands whatever
        happens here (a failure is logged; unindexed rows are still found by a scan)."""
        return import_ops.index_after_import(HostSteps(self))

    def check_fts(self) -> dict[str, str | None]:
        """Per index: None when healthy, else what its integrity check reported.

        FTS5's check is an INSERT, so it needs the write lock: it runs as a write
        (a lock held elsewhere is retried within the write budget, then
        DatabaseLockedError), never reporting a busy file as a damaged index. A
        read-only store checks in a read, as before.
        """
        if self.read_only:
            return self._read(lambda c: MaintenanceRepository(c).fts_integrity_check())
        return self._write(lambda c: MaintenanceRepository(c).fts_integrity_check(), _maintenance=True)

    def vacuum(self) -> int:
        """Optimize the indexes, then give free pages back to the filesystem.

        As Hermes v26: :meth:`optimize_fts` first (a failure is logged and counts as 0),
        then a PASSIVE checkpoint, ``VACUUM`` (``VACUUM ANALYZE`` on a server) and a
        TRUNCATE checkpoint, whose errors propagate. Returns the optimize count. The
        optimize step is this instance's ``optimize_fts`` as it is now (Hermes' tests
        patch it on the instance).
        """
        if not self._uses_raw_conn():
            return prune_ops.vacuum(self._maintenance_steps(), optimize=self.optimize_fts)
        try:
            optimized = self.optimize_fts()
        except Exception as exc:
            log.warning("optimize before vacuum failed: %s", exc)
            optimized = 0
        self._vacuum_on_conn(prune_ops.VACUUM_ON_CONN)
        return optimized

    def _uses_raw_conn(self) -> bool:
        """Whether Hermes' ``_conn`` is in use here (opened, or assigned by code): then the
        VACUUM and its checkpoints run on it, as in Hermes (its tests trace that
        connection). Otherwise they run on our engine: no extra connection is opened
        just for them, and a server has no ``_conn``."""
        return getattr(self, "db_path", None) is not None and getattr(self, "_raw_conn", None) is not None

    def _vacuum_on_conn(self, statements: Tuple[str, ...]) -> None:
        """Hermes v26's VACUUM and checkpoints on ``_conn`` as it is now (Hermes' tests
        trace that connection, or put a wrapper there), outside any transaction; a held
        lock is retried within the write budget. A checkpoint is best effort (a busy one
        is left for the next); the VACUUM's errors propagate."""
        def run(_engine: Any) -> None:
            prune_ops.vacuum_on_dbapi(self._conn, statements)

        self._outside(run)

    def logical_size_bytes(self) -> Optional[int]:
        """``page_count × page_size`` of the file; on a server, the on-disk size of our
        tables (with their indexes) in this store's schema."""
        return self._read(lambda c: MaintenanceRepository(c).logical_size_bytes())

    # ------------------------------------------------------------------ state_meta

    def get_meta(self, key: str) -> str | None:
        return self._read(lambda c: MaintenanceRepository(c).get_meta(key))

    def list_meta_prefix(self, prefix: str) -> List[Tuple[str, str]]:
        """``(key, value)`` of the keys starting with ``prefix`` (a literal prefix), in key order."""
        if not isinstance(prefix, str):
            raise errors.InvalidInputError(f"prefix must be str, not {type(prefix).__name__}")
        return self._read(lambda c: MaintenanceRepository(c).list_meta_prefix(prefix))

    def set_meta(self, key: str, value: str, *, cursor: Optional[sqlite3.Cursor] = None) -> None:
        """Upsert ``state_meta[key]`` (stored as text; None stays NULL).

        With ``cursor`` (a DB-API cursor or connection on this database, as Hermes
        passes inside its schema setup) the statement runs right there, in whatever
        transaction the caller has: no transaction, retry or commit of ours.
        """
        if cursor is not None:
            with driver_errors():
                set_meta_on_cursor(cursor, key, value, schema=schema_of(self._open_engine()))
            return
        self._write(lambda c: MaintenanceRepository(c).set_meta(key, value))

    # ------------------------------------------------------------------ rebuild windows

    def fts_rebuild_status(self) -> Optional[Dict[str, Any]]:
        """``{"pending", "total", "indexed", "percent"}`` while a rebuild window is open, else None."""
        return self._read(lambda c: FtsUpkeepRepository(c).rebuild_status("main"))

    def fts_cjk_rebuild_status(self) -> Optional[Dict[str, Any]]:
        """:meth:`fts_rebuild_status` of the CJK index's window."""
        return self._read(lambda c: FtsUpkeepRepository(c).rebuild_status("cjk"))

    def fts_rebuild_step(self) -> bool:
        """Backfill the next ``_FTS_REBUILD_CHUNK_ROWS`` ids of the rebuild window.

        True while work remains, or when the lock was busy (try again); False when FTS
        is disabled, no window is open, or this step closed it.
        """
        if not self._fts_enabled:
            return False
        return self._fts_step("main")

    def fts_cjk_rebuild_step(self) -> bool:
        """:meth:`fts_rebuild_step` for the CJK index; False unless its tokenizer is
        loaded here (we do not ship Hermes' ``cjk_unicode61``: CJK is served by the
        trigram and short-CJK indexes)."""
        if not self._fts_enabled or not self._fts_probe(lambda r: r.cjk_index_available()):
            return False
        return self._fts_step("cjk")

    def _fts_step(self, kind: str) -> bool:
        """One backfill step of window ``kind``; a busy lock reads as "try again" (True)."""
        return fts_ops.rebuild_step(self._maintenance_steps(), kind, chunk_rows=self._FTS_REBUILD_CHUNK_ROWS,
                                    budget=self._FTS_STEP_BUDGET_S)

    # ------------------------------------------------------------------ optimize-storage

    def fts_optimize_available(self) -> bool:
        """Whether :meth:`optimize_fts_storage` has work to do here.

        False when FTS is disabled or read-only. True for a pre-v23 word index, an open
        rebuild window (an interrupted optimize), CJK work while its tokenizer is loaded,
        or trash tables of a demotion still to tear down.
        """
        if self.read_only or not self._fts_enabled:
            return False
        return self._read(lambda c: FtsUpkeepRepository(c).optimize_available())

    def _demote_legacy_fts_to_trash(self) -> bool:
        """Swap pre-v23 inline indexes for the head layout, in one short transaction.

        The old shadow tables become plain ``fts_v22_trash_*`` tables (torn down later
        in chunks), the new indexes start empty with a rebuild window over every
        message, and the backfill fills them. Does nothing (False) on a current layout,
        while a window is open, read-only or without FTS. Returns whether it demoted.
        """
        if self.read_only or not self._fts_enabled:
            return False
        demoted = fts_ops.demote_legacy_fts(self._maintenance_steps())
        if demoted:
            self._forget_trigram_flag(demoted)
        return bool(demoted)

    def _forget_trigram_flag(self, _demoted: list[str]) -> None:
        """A demotion replaced the indexes: probe the trigram flag again on next use."""
        self.__dict__.pop("_trigram_available_value", None)

    def optimize_fts_storage(
        self,
        *,
        progress_cb: Optional[Callable[[Dict[str, Any]], None]] = None,
        vacuum: bool = True,
    ) -> Dict[str, Any]:
        """Hermes' ``hermes sessions optimize-storage``: move the indexes to the current
        layout without holding the write lock for long. Resumable after interruption.

        In order: demote a pre-v23 layout (unless a window is already open); the CJK
        index steps (nothing without its tokenizer); backfill the window chunk by chunk,
        then tear the trash down chunk by chunk, pausing between chunks; optional
        VACUUM (a failure is reported, not raised); stamp ``fts_storage_version`` (our
        layout, 3, never lowered), drop ``fts_optimize_available``, raise
        ``schema_version`` to 23 if lower. ``progress_cb`` gets ``{"phase": "backfill" |
        "teardown" | "vacuum" | "done", "percent", "indexed", "total"}``.

        Hermes v25: the bookkeeping is healed first (a high-water mark without progress
        restarts its backfill from an emptied index; an empty index beside messages gets
        a window over them), and the run refuses to settle while a window, trash tables
        or an empty index with messages remain: ``{"ok": False, "reason":
        "backfill_incomplete" | "teardown_incomplete", "vacuumed": None}``, nothing
        stamped, no VACUUM. The VACUUM comes after settling, followed by one PASSIVE
        checkpoint (no TRUNCATE).

        Returns ``{"ok": True, "vacuumed": True | False | None}`` (None: not asked), or
        ``{"ok": False, "reason": "read_only" | "fts5_unavailable" | ...}``. The workflow,
        one transaction per step, is :func:`hermes_store.operations.fts.optimize_fts_storage`.
        """
        if self.read_only:
            return {"ok": False, "reason": "read_only"}
        steps = self._maintenance_steps()
        enabled = self._fts_enabled
        if enabled:
            steps.write(lambda c: FtsUpkeepRepository(c).heal_optimize_bookkeeping())
        held: list[Dict[str, Any]] = []

        def relay(event: Dict[str, Any]) -> None:
            if event.get("phase") == "done":
                held.append(event)
            elif progress_cb is not None:
                progress_cb(event)

        out = fts_ops.optimize_fts_storage(
            steps, progress_cb=relay, vacuum=False, pacing=self._fts_pacing(),
            fts_enabled=enabled, on_demoted=self._forget_trigram_flag,
        )
        if not out.get("ok"):
            return out
        blocker = steps.read(lambda c: FtsUpkeepRepository(c).settle_blocker())
        if blocker is not None:
            return {"ok": False, "reason": blocker, "vacuumed": None}
        vacuumed: Optional[bool] = None
        if vacuum:
            last = held[-1] if held else {"indexed": 0, "total": 0}
            relay({"phase": "vacuum", "percent": 100, "indexed": last["indexed"], "total": last["total"]})
            try:
                if not self._uses_raw_conn():
                    steps.outside(prune_ops.vacuum_after_optimize_storage)
                else:
                    self._vacuum_on_conn(prune_ops.STORAGE_VACUUM_ON_CONN)
                vacuumed = True
            except Exception as exc:
                log.warning("vacuum after optimize-storage failed: %s", exc)
                vacuumed = False
        for event in held:
            if progress_cb is not None:
                progress_cb(event)
        return {"ok": True, "vacuumed": vacuumed}

    # ------------------------------------------------------------------ write-path hooks

    def _after_write(self, writes: int) -> None:
        """Facade hook after each committed write (``writes`` = this instance's count):
        every ``_OPTIMIZE_EVERY_N_WRITES`` writes, a best-effort :meth:`optimize_fts`."""
        every = self._OPTIMIZE_EVERY_N_WRITES
        if not every or writes <= 0 or writes % every:
            return
        self._schedule("search index merge", self._periodic_optimize)

    def _periodic_optimize(self) -> None:
        """The periodic :meth:`optimize_fts` call (after the write, or on the upkeep thread)."""
        _PERIODIC.active = True  # per thread: an explicit optimize elsewhere stays full
        try:
            self.optimize_fts()
        except Exception as exc:
            log.warning("periodic search index upkeep failed (the write was committed): %s", exc)
        finally:
            _PERIODIC.active = False

    def _on_write_error(self, exc: BaseException) -> bool:
        """Facade hook when a write failed with an error it does not retry by itself.

        An FTS-corruption error (see :meth:`_is_fts_corruption_error`) triggers one
        :meth:`rebuild_fts` per instance; True means "rebuilt: run the write again".
        A second corruption, any other error, or a rebuild that did nothing: False
        (the caller raises the original error).
        """
        return self._rebuild_once_after(exc, "_fts_corruption_rebuilt", "retrying the write once")

    def _rebuild_once_after(self, exc: BaseException, flag: str, then: str) -> bool:
        """After an FTS-corruption error ``exc``: one :meth:`rebuild_fts` per instance and
        ``flag`` (writes and searches each get theirs). True: rebuilt, ``then`` may go on;
        any other error, a second corruption or a rebuild that did nothing: False."""
        if not self._is_fts_corruption_error(exc):
            return False
        with self._lock:
            if self.__dict__.get(flag):
                return False
            self.__dict__[flag] = True
        log.warning("%s: damaged search index (%s); rebuilding it and %s", self._label(),
                    getattr(exc, "orig", None) or exc, then)
        try:
            rebuilt = self.rebuild_fts()
        except Exception as again:
            log.warning("search index rebuild failed: %s", again)
            return False
        return rebuilt > 0
