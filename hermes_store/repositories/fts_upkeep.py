"""Search-index upkeep of Hermes v23: optimize/rebuild, the rebuild window, optimize-storage.

Hermes v23 moved its full-text indexes to external content and lets a big history be
re-indexed in the background: ``state_meta`` holds a *rebuild window*
(``fts_rebuild_high_water`` = the last id to backfill, ``fts_rebuild_progress`` = the
last id done). The index triggers leave rows inside the window alone, and
:meth:`FtsUpkeepRepository.backfill_step` indexes it a chunk at a time. Our own
files never open such a window (our migrations index everything in their
transaction), but a Hermes-written file can carry one, and so can a file whose pre-v23
indexes :meth:`FtsUpkeepRepository.demote_legacy` replaces.

This module is the portable half: markers are read and moved with Core statements
on the ``state_meta`` model table, so the same code runs on PostgreSQL, where the
search index cannot lag (``Dialect.search_index_can_lag`` is False: search runs on GIN
indexes the server keeps complete; its ``fts5_storage`` holds no table) and any window
left in ``state_meta`` simply closes. What an FTS5 table needs is behind the dialect
(:mod:`hermes_store.dialects.fts5`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any
from collections.abc import Callable, Sequence

from sqlalchemy import Connection, delete, func, select, update
from sqlalchemy.exc import OperationalError

from ..dialects.base import Dialect
from ..dialects.fts5 import Fts5Storage, FtsObject
from ..keys import FTS_CJK_STALE_KEY, OPTIMIZE_AVAILABLE_KEY, STORAGE_VERSION_KEY, TOOL_HIGH_WATER_KEY
from ..models import Base
from ..tenant_schema import qualified
from .base import MESSAGES, Repository
from .state_meta import STATE_META, add_meta, get_meta, set_meta

log = logging.getLogger(__name__)

SCHEMA_VERSION = Base.metadata.tables["schema_version"]

REBUILD_HIGH_WATER = "fts_rebuild_high_water"
REBUILD_PROGRESS = "fts_rebuild_progress"
CJK_REBUILD_HIGH_WATER = "fts_cjk_rebuild_high_water"
CJK_REBUILD_PROGRESS = "fts_cjk_rebuild_progress"
#: Hermes' FTS storage layout our head schema has (v30's layout 3: the word index reads
#: ``messages_fts_src``, the trigram index has no tool_calls). Stamped, never lowered.
HEAD_FTS_LAYOUT = 3
#: ``schema_version`` Hermes v23's optimize-storage raises a file to (ours are newer).
MIN_SCHEMA_VERSION = 23
#: Ids on each side of the high-water mark checked again when a window closes.
BOUNDARY_SWEEP_IDS = 1000

#: The two rebuild windows: markers and the FTS5 tables each one fills.
WINDOWS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "main": (REBUILD_HIGH_WATER, REBUILD_PROGRESS, ("messages_fts", "messages_fts_trigram")),
    "cjk": (CJK_REBUILD_HIGH_WATER, CJK_REBUILD_PROGRESS, ("messages_fts_cjk",)),
}


def parse_marker(value: Any) -> int | None:
    """A marker's integer value, or None when it is absent or not an integer."""
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def set_meta_on_cursor(cursor: Any, key: str, value: Any, *, schema: str | None = None,
                       dialect: Dialect | None = None) -> None:
    """Upsert one ``state_meta`` row through a caller's DB-API cursor (or connection).

    Hermes' ``set_meta(..., cursor=cur)`` runs inside its own schema setup: the
    statement goes out on that cursor as it is, in whatever transaction it has; we
    neither begin nor commit. A SQLAlchemy Connection is accepted too. ``schema``: the
    store's tenant schema, named in the statement (a DB-API cursor carries no tenant);
    ``dialect``: the store's, whose driver's placeholder the statement is written with.
    """
    stored = None if value is None else str(value)
    if isinstance(cursor, Connection):
        set_meta(cursor, key, stored)
        return
    mark = _driver_mark(cursor) if dialect is None else dialect.driver_param_mark
    cursor.execute(
        f"INSERT INTO {qualified(schema, 'state_meta')} (key, value) VALUES ({mark}, {mark}) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, stored),
    )


def optimize_on_cursor(cursor: Any, names: Sequence[str]) -> list[str]:
    """FTS5 ``'optimize'`` of each index in ``names`` through a caller's DB-API connection
    (Hermes' ``_conn``, where its tests count these statements), each committing on its
    own; one the driver refuses is logged and skipped, as :meth:`FtsUpkeepRepository.optimize_each`
    does. Returns those done."""
    done = []
    for name in names:
        try:
            cursor.execute(f"INSERT INTO {name}({name}) VALUES('optimize')")
        except Exception as exc:  # the caller's driver's error class: not ours to name
            log.warning("search index %s: optimize failed (%s); skipped", name, exc)
            continue
        done.append(name)
    return done


def _driver_mark(cursor: Any) -> str:
    """The placeholder of a cursor's driver, for callers that do not name the dialect:
    its DB-API module's ``paramstyle`` (``qmark`` for sqlite3, else ``format``/``pyformat``)."""
    owner = getattr(cursor, "connection", cursor)
    module = sys.modules.get(type(owner).__module__.partition(".")[0])
    return "?" if getattr(module, "paramstyle", None) == "qmark" else "%s"


class FtsUpkeepRepository(Repository):
    """The rebuild windows, index-wide FTS commands and optimize-storage, on one connection.

    Every FTS5 statement is the dialect's (``fts5_storage``); where its search index
    cannot lag (a server) the bookkeeping below has nothing to heal and says so without
    a statement."""

    @property
    def fts5(self) -> Fts5Storage | None:
        """The database's FTS5 storage; None where search needs none (a server)."""
        return self.dialect.fts5

    @property
    def _storage(self) -> Fts5Storage:
        """The FTS5 tables, as an empty storage where there are none."""
        return self.dialect.fts5_storage

    @property
    def _can_lag(self) -> bool:
        return self.dialect.search_index_can_lag

    def _fts_tables(self) -> dict[str, str]:
        """Hermes' FTS5 tables here, with their stored CREATE ({} without FTS5 storage)."""
        return self._storage.tables(self.conn)

    def _queryable(self, name: str) -> bool:
        return self._storage.queryable(self.conn, name)

    def has_trash(self) -> bool:
        """Whether tables of a demoted pre-v23 index (``fts_v22_trash_*``) remain."""
        return bool(self._storage.trash_tables(self.conn))

    # ------------------------------------------------------------------ state_meta

    def meta(self, key: str) -> str | None:
        return get_meta(self.conn, key)

    def _set(self, key: str, value: str) -> None:
        set_meta(self.conn, key, value)

    def _forget(self, *keys: str) -> None:
        self.conn.execute(delete(STATE_META).where(STATE_META.c.key.in_(keys)))

    def _claim(self, key: str, seen: str | None, new: str) -> bool:
        """Compare-and-set: move ``key`` from ``seen`` to ``new``; False if it changed meanwhile."""
        if seen is None:
            return add_meta(self.conn, key, new)  # the dialect's INSERT … ON CONFLICT DO NOTHING
        found = self.conn.execute(
            update(STATE_META).where(STATE_META.c.key == key, STATE_META.c.value == seen).values(value=new)
        )
        return found.rowcount == 1

    # ------------------------------------------------------------------ index-wide commands

    def maintained_indexes(self) -> list[str]:
        """The search indexes upkeep commands act on: Hermes' FTS5 tables that answer
        here (a missing tokenizer makes one unreadable), or the server's GIN indexes."""
        tables = self._fts_tables()
        names = [n for n in tables if self._queryable(n)]
        names += [n for n in self.dialect.fts_indexes(self.conn) if n not in tables]
        return names

    def optimize_each(self, *, bounded: bool = False) -> list[str]:
        """FTS5 ``'optimize'`` (GIN pending-list merge) per index; an index that fails with
        an OperationalError is logged and skipped, as Hermes does, unless it met a held
        lock (raised, so the write's retry loop waits it out). Returns those done.

        ``bounded``: FTS5's ``'merge'`` instead, a few hundred pages of segment merging
        at most, for upkeep inside a writer's path (a full optimize rewrites the whole
        index: seconds on a large history, every other writer waiting).
        """
        cmd = "merge" if bounded else "optimize"
        done = []
        for name in self.maintained_indexes():
            try:
                with self.conn.begin_nested():
                    self.dialect.fts_command(self.conn, name, cmd)
            except OperationalError as exc:
                if self.dialect.is_retryable(exc):
                    raise  # a held lock (a server's lock timeout): the write is retried, not skipped
                log.warning("search index %s: %s failed (%s); skipped", name, cmd, exc)
                continue
            done.append(name)
        return done

    def rebuild_each(self) -> list[str]:
        """Re-make every index from its content (FTS5 ``'rebuild'``, REINDEX on a server).

        Each index in its own savepoint: one that fails is rolled back, logged and left
        as it was (a held lock is raised instead: the write's retry loop waits it out). A
        rebuilt index holds every row, so a rebuild window over indexes
        that were all rebuilt is closed (a later backfill would index rows twice).
        """
        done = []
        for name in self.maintained_indexes():
            try:
                with self.conn.begin_nested():
                    self.dialect.fts_command(self.conn, name, "rebuild")
            except Exception as exc:
                if self.dialect.is_retryable(exc):
                    raise  # a held lock (REINDEX behind a server's lock timeout): retried, not skipped
                log.warning("search index %s: rebuild failed (%s); left as it was", name, exc)
                continue
            done.append(name)
        present = self._fts_tables()
        for hw_key, progress_key, names in WINDOWS.values():
            covered = [n for n in names if n in present]
            if covered and all(n in done for n in covered):
                self._forget(hw_key, progress_key)
        return done

    # ------------------------------------------------------------------ rebuild windows

    def rebuild_status(self, kind: str = "main") -> dict[str, Any] | None:
        """Hermes' ``fts_rebuild_status`` shape, or None when no window is open."""
        hw_key, progress_key, _names = WINDOWS[kind]
        total = parse_marker(self.meta(hw_key))
        if total is None or total <= 0:
            return None
        indexed = max(parse_marker(self.meta(progress_key)) or 0, 0)
        return {"pending": True, "total": total, "indexed": indexed, "percent": min(100, int(100 * indexed / total))}

    def backfill_step(self, kind: str, chunk: int) -> bool:
        """Index the next ``chunk`` ids of the window; True while more remains.

        The progress marker is moved compare-and-set, so two processes stepping at once
        never index the same ids twice (and the dialect skips rows already indexed). The
        last step checks ``BOUNDARY_SWEEP_IDS`` ids on each side of the high-water mark
        for rows neither the triggers nor the backfill indexed, then closes the window.
        A high-water mark that is not a number cannot say which rows are missing: every
        index is rebuilt whole instead. Where no index of the window exists (PostgreSQL)
        the window is simply closed.
        """
        hw_key, progress_key, names = WINDOWS[kind]
        raw_hw = self.meta(hw_key)
        if raw_hw is None:
            return False
        fts5 = self._storage
        present = self._fts_tables()
        targets = [n for n in names if self._queryable(n)]
        if not targets:
            if not any(n in present for n in names):
                self._forget(hw_key, progress_key)  # nothing the window could be about
            return False  # present but unreadable here (no tokenizer): left for a capable host
        hw = parse_marker(raw_hw)
        if hw is None:
            log.warning("%s=%r is not an id; rebuilding %s whole", hw_key, raw_hw, ", ".join(targets))
            for name in targets:
                fts5.rebuild_from_source(self.conn, name)
            self._forget(hw_key, progress_key)
            return False
        if hw <= 0:
            self._forget(hw_key, progress_key)
            return False
        raw_progress = self.meta(progress_key)
        progress = max(parse_marker(raw_progress) or 0, 0)
        if progress < hw:
            upper = min(progress + max(1, int(chunk)), hw)
            if not self._claim(progress_key, raw_progress, str(upper)):
                return True  # another process took this chunk: look again
            for name in targets:
                fts5.backfill(self.conn, name, progress, upper)
            if upper < hw:
                return True
        for name in targets:
            fts5.backfill(
                self.conn, name, max(hw - BOUNDARY_SWEEP_IDS, 0), hw + BOUNDARY_SWEEP_IDS, sweep=True
            )
        self._forget(hw_key, progress_key)
        return False

    # ------------------------------------------------------------------ optimize-storage

    def cjk_index_available(self) -> bool:
        """Hermes' CJK index answers here (its tokenizer is loaded on our connections)."""
        return self._queryable(WINDOWS["cjk"][2][0])

    def optimize_available(self) -> bool:
        """Whether optimize-storage has work: a pre-v23 layout, an open window, CJK work a
        loaded tokenizer could do, trash tables of a demotion still to tear down, or
        (Hermes v25) a word/trigram index left empty beside messages."""
        fts5 = self._storage
        if not self._can_lag:  # no FTS5 storage: only an open window (it closes at the first step)
            return self.meta(REBUILD_HIGH_WATER) is not None
        if fts5.layout_is_legacy(self.conn) or self.meta(REBUILD_HIGH_WATER) is not None:
            return True
        cjk_keys = (CJK_REBUILD_HIGH_WATER, CJK_REBUILD_PROGRESS, FTS_CJK_STALE_KEY)
        if self.cjk_index_available() and any(self.meta(k) is not None for k in cjk_keys):
            return True
        return bool(fts5.trash_tables(self.conn)) or self._empty_index_with_messages()

    def demote_legacy(self, head_objects: Callable[[], Sequence[FtsObject]]) -> list[str]:
        """Replace pre-v23 inline indexes by the head layout and open a window over every
        message (see :meth:`Fts5Storage.demote_legacy`). Nothing happens while a
        window is open (an interrupted optimize resumes instead), when the layout is
        current, or without FTS5 storage. ``head_objects`` gives the head schema's FTS
        objects (:func:`hermes_store.operations.fts.head_fts_objects`), asked only when
        there is something to demote. Returns the demoted tables."""
        fts5 = self._storage
        if not self._can_lag or self.meta(REBUILD_HIGH_WATER) is not None:
            return []
        if not fts5.layout_is_legacy(self.conn):
            return []
        demoted = fts5.demote_legacy(self.conn, head_objects())
        if not demoted:
            return []
        top = int(self.conn.execute(select(func.max(MESSAGES.c.id))).scalar() or 0)
        self._forget(TOOL_HIGH_WATER_KEY, REBUILD_HIGH_WATER, REBUILD_PROGRESS)
        if top > 0:
            self._set(REBUILD_PROGRESS, "0")
            self._set(REBUILD_HIGH_WATER, str(top))
        return demoted

    def trash_rows(self) -> int:
        return self._storage.trash_rows(self.conn)

    def teardown_chunk(self, rows: int) -> tuple[int, bool]:
        """Delete up to ``rows`` rows of the first trash table (dropping it once empty).

        Returns (rows deleted, whether trash remains)."""
        fts5 = self._storage
        tables = fts5.trash_tables(self.conn)
        if not tables:
            return 0, False
        deleted = fts5.trash_delete(self.conn, tables[0], rows)
        return deleted, bool(deleted) or len(tables) > 1

    def _empty_index_with_messages(self) -> bool:
        """A word or trigram index that holds no row (its ``_docsize`` table is empty)
        while messages exist: the shape an interrupted rebuild leaves without markers."""
        fts5 = self._storage
        if not self._can_lag or self.conn.execute(select(MESSAGES.c.id).limit(1)).first() is None:
            return False
        for index in WINDOWS["main"][2]:
            docsize = f"{index}_docsize"
            if index in fts5.tables(self.conn) and fts5.table_exists(self.conn, docsize):
                if self.conn.exec_driver_sql(f'SELECT 1 FROM "{docsize}" LIMIT 1').first() is None:
                    return True
        return False

    def heal_optimize_bookkeeping(self) -> list[str]:
        """Hermes v25's ``_repair_optimize_bookkeeping``, before optimize-storage works:
        a high-water mark without progress gets progress 0 and its partial indexes are
        emptied (the backfill then indexes every row once); an empty index with
        messages and no window gets a window over every message. The keys seeded."""
        fts5 = self._storage
        if not self._can_lag:
            return []
        high, progress, indexes = WINDOWS["main"]
        if self.meta(high) is not None:
            if self.meta(progress) is not None:
                return []
            for index in indexes:
                if index in fts5.tables(self.conn):
                    self.dialect.fts_command(self.conn, index, "delete-all")
            self._set(progress, "0")
            return [progress]
        if not self._empty_index_with_messages():
            return []
        top = int(self.conn.execute(select(func.max(MESSAGES.c.id))).scalar() or 0)
        self._set(progress, "0")
        self._set(high, str(top))
        return [high, progress]

    def settle_blocker(self) -> str | None:
        """Why optimize-storage may not settle yet (Hermes v25): ``"backfill_incomplete"``
        while the high-water mark stays or an index is empty beside messages,
        ``"teardown_incomplete"`` while trash tables remain; None when it may."""
        if self.meta(REBUILD_HIGH_WATER) is not None or self._empty_index_with_messages():
            return "backfill_incomplete"
        if self.has_trash():
            return "teardown_incomplete"
        return None

    def finish_storage_optimize(self, layout: int = HEAD_FTS_LAYOUT) -> str | None:
        """Hermes' last optimize-storage step: stamp the layout (never lowering a newer
        stamp), drop the "optimize available" hint, raise ``schema_version`` to 23.
        Refused (nothing written) while :meth:`settle_blocker` names a reason, returned."""
        blocker = self.settle_blocker()
        if blocker is not None:
            return blocker
        stamped = parse_marker(self.meta(STORAGE_VERSION_KEY))
        if stamped is None or stamped < layout:
            self._set(STORAGE_VERSION_KEY, str(layout))
        self._forget(OPTIMIZE_AVAILABLE_KEY)
        self.conn.execute(
            update(SCHEMA_VERSION).where(SCHEMA_VERSION.c.version < MIN_SCHEMA_VERSION)
            .values(version=MIN_SCHEMA_VERSION)
        )
        return None

    # ------------------------------------------------------------------ probes

    def search_available(self) -> bool:
        return self.dialect.fts_search_available(self.conn)

    def trigram_available(self) -> bool:
        return self.dialect.fts_trigram_available(self.conn)

    def fts_table_exists(self, name: str) -> bool:
        """Hermes' ``_fts_table_exists``: a table of that name is in the SQLite schema
        (its FTS5 tables, their shadows, trash). A server has no FTS5 table at all."""
        return self._storage.table_exists(self.conn, name)
