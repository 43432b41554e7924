"""The copy itself: tables on their own keys, then sessions whole with their messages
and usage ledgers (one destination transaction per batch, a marker in the same
transaction), then the search indexes, then :class:`~.verify.Verifier`'s check."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any
from collections.abc import Callable

from sqlalchemy import Connection, exists, func, insert, inspect, select, update
from sqlalchemy import table as sa_table

from ..dialects import Dialect, cjk_bigram
from ..dialects.fts5 import FTS_SHADOWS
from ..repositories.base import ID_CHUNK, TableKey, per_dialect, table_key, table_of
from ..repositories.maintenance import MaintenanceRepository
from ..repositories.messages import MessageRepository
from ..repositories.sessions import SessionRepository
from ..repositories.state_meta import set_meta
from ..tenant_schema import schema_of_connection
from ..titles import split_title_number
from .plan import (AFTER_SESSIONS, BEFORE_SESSIONS, COPIED_TABLES, INDEX_CHUNK, MARKER_KEY, NEWER, NOT_COPIED,
                   SILENT, TABLES, UPSERT_UPDATES, CopyError, CopyReport, Progress, meta_key_copied)
from .rows import M, P, S, U
from .verify import Verifier


class Copier(Verifier):
    """One run: source snapshot → destination, then index upkeep and verification."""

    def __init__(self, src: Connection, dst: Connection, report: CopyReport, marker: dict[str, Any], *,
                 batch: int, progress: Progress) -> None:
        super().__init__(src, dst, report, merge=bool(marker.get("merge")))
        self.marker = marker
        self.batch, self.progress = batch, progress
        #: child → parent links waiting for their parent; parent → children, for lookup.
        self.links: dict[str, str] = dict(marker.get("pending_links") or {})
        self.waiting: dict[str, list[str]] = defaultdict(list)
        for child, parent in self.links.items():
            self.waiting[parent].append(child)
        self.pending = 0  # rows written in the open destination transaction
        self.wrote = False  # anything written since the marker was last stored
        # A killed earlier run may have committed kept ids past the destination's
        # counter: sync before the first renumbered insert of this run too.
        self.identity_behind = True
        self.src_high = 0  # the source's message-id high-water mark (copy_sessions)
        self.buffer = _Buffer()
        self.mcols: list[str] = []

    def _store_marker(self) -> None:
        self.marker["pending_links"] = dict(self.links)
        self.marker["updated_at"] = time.time()
        set_meta(self.dst, MARKER_KEY, json.dumps(self.marker, sort_keys=True))

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        report = self.report
        clock = time.monotonic()
        for name in self._source_tables():
            if name in COPIED_TABLES or name in SILENT:
                continue
            counted = select(func.count()).select_from(TABLES.get(name, sa_table(name)))
            rows = int(self.src.execute(counted).scalar() or 0)
            if rows:
                why = NOT_COPIED.get(name, "not a hermes_store table")
                report.skipped_tables[name] = f"{rows:,} row(s): {why}"
        self._count_not_copyable()
        for name in BEFORE_SESSIONS:
            self.copy_table(name)
        self.copy_sessions()
        for name in AFTER_SESSIONS:
            self.copy_table(name)
        if self.wrote or not (report.already_complete or report.resumed):
            self._store_marker()
        self.dst.commit()
        report.seconds["copy"] = round(time.monotonic() - clock, 3)
        clock = time.monotonic()
        self.index()
        report.seconds["index"] = round(time.monotonic() - clock, 3)
        clock = time.monotonic()
        self.dst.execution_options(**self.dst_dialect.begin_options(False))  # verifying only reads
        self.verify()
        self.dst.execution_options(**self.dst_dialect.begin_options(True))
        report.seconds["verify"] = round(time.monotonic() - clock, 3)
        if report.ok and (self.marker.get("state") != "done" or report.sessions_copied or report.messages_copied):
            self.marker["state"] = "done"
            self.marker["finished_at"] = time.time()
            self._store_marker()
        elif not report.ok:
            self.marker["state"] = "unverified"
            self._store_marker()
        self.dst.commit()

    def _source_tables(self) -> list[str]:
        """The source's plain tables (its full-text index tables and SQLite's own left out)."""
        names = set(inspect(self.src).get_table_names(schema=schema_of_connection(self.src)))
        indexes = set(self.src_dialect.fts_indexes(self.src))
        shadows = {f"{index}{suffix}" for index in indexes for suffix in FTS_SHADOWS}
        return sorted(n for n in names - indexes - shadows if not n.startswith("sqlite_"))

    def _count_not_copyable(self) -> None:
        """Rows no destination can hold: a NULL key, a message or ledger row of a missing session."""
        report = self.report
        for name in COPIED_TABLES:
            if self.columns(name) is None:
                continue
            n = self._count(self.src, name, self._null_keys(name))
            if name in ("messages", "session_model_usage"):
                table = TABLES[name]
                n += self._count(self.src, name, ~exists().where(S.c.id == table.c.session_id))
            if n:
                report.not_copyable[name] = n

    # ------------------------------------------------------------------ tables on their own keys

    def copy_table(self, name: str) -> None:
        """Rows the destination lacks (by key) are inserted; what it has is left alone."""
        cols = self.columns(name)
        if cols is None:
            return
        table = TABLES[name]
        key = [c.name for c in table.primary_key.columns]
        sql = _copy_rows(self.dst, table_key(self.dst, name, cols), tuple(key))
        newer = NEWER.get(name)
        total = self._count(self.src, name)
        done = 0
        for page in self._pages(name, cols, self.batch):
            rows = [dict(zip(cols, r, strict=True)) for r in page]
            done += len(rows)
            if name == "state_meta":
                self.report.skipped_meta_keys += [r["key"] for r in rows if not meta_key_copied(r["key"])]
                rows = [r for r in rows if meta_key_copied(r["key"])]
            there = self._lookup(self.dst, name, cols, [tuple(r[k] for k in key) for r in rows])
            rows = [r for r in rows if (found := there.get(tuple(r[k] for k in key))) is None
                    or (newer is not None and newer(r, found))]
            if rows:
                self.dst.execute(sql, rows)
                self.wrote = True
            self.commit(name, done, total)

    # ------------------------------------------------------------------ sessions with their messages

    def copy_sessions(self) -> None:
        scols = self.columns("sessions")
        if scols is None:
            return
        self.scols = scols
        self.mcols = self.columns("messages") or []
        self.ucols = self.columns("session_model_usage")
        self.id_at = self.mcols.index("id") if "id" in self.mcols else None
        # Ids the source handed out, its deleted newest messages' included: the
        # destination's counter goes past them, so no id ever names two messages.
        self.src_high = self.src_dialect.identity_high_water(self.src, "messages") if self.mcols else 0
        # NULLs a trigger or a column default would fill in on the way in: put back after.
        info = self.dst_dialect.table_info(self.dst, "messages")
        self.restore_nulls = [name for name, not_null, default in info
                              if name in self.mcols and not not_null and default is not None]
        if "display_order" in self.mcols:
            self.restore_nulls.append("display_order")
        total = self._count(self.src, "sessions", S.c.id.is_not(None))
        done = 0
        for page in self._pages("sessions", scols, ID_CHUNK):
            rows = [dict(zip(scols, r, strict=True)) for r in page]
            present = self._present(self.dst, S.c.id, (r["id"] for r in rows))
            todo = [r for r in rows if r["id"] not in present]
            self.report.sessions_present += len(rows) - len(todo)
            if todo:
                self._copy_page(todo, self._commit_after("sessions", done, total))
            done += len(rows)
            self.commit("sessions", done, total)
        if self.links:
            # Parents the source named but this run never brought (it changed under a
            # resumed copy): link to those the destination has, drop the rest.
            there = self._present(self.dst, S.c.id, set(self.links.values()))
            for child, parent in sorted(self.links.items()):
                if parent in there:
                    self.dst.execute(update(S).where(S.c.id == child).values(parent_session_id=parent))
                else:
                    self.report.dropped_links.append((child, parent))
            self.links.clear()
            self.waiting.clear()
            self.wrote = True
        # Later appends continue after the copied ids (every run: a killed one may have
        # committed its ids without getting here).
        self.dst_dialect.sync_identity(self.dst, "messages", at_least=self.src_high)
        self.identity_behind = False
        self.commit("sessions", done, total)

    def _commit_after(self, stage: str, before: int, total: int | None) -> Callable[[int], None]:
        """``commit`` for a page whose sessions follow the ``before`` already done: the
        callback's ``n`` counts within the page (``before`` bound now, not read later)."""
        return lambda n: self.commit(stage, before + n, total)

    def commit(self, stage: str, done: int, total: int | None) -> None:
        """Write what is buffered, then end the destination transaction (marker included)."""
        self._flush()
        if self.wrote:
            self._store_marker()
        self.dst.commit()
        self.pending = 0
        self.wrote = False
        self.progress(stage, done, total)

    def _copy_page(self, todo: list[dict[str, Any]], checkpoint: Callable[[int], None]) -> None:
        """Copy these sessions (absent from the destination), each whole in one transaction."""
        ids = [r["id"] for r in todo]
        page = _Page(todo)
        parents = {r.get("parent_session_id") for r in todo} - {None}
        page.parents_dst = self._present(self.dst, S.c.id, parents)
        rest = parents - page.parents_dst
        page.parents_src = (rest & set(ids)) | self._present(self.src, S.c.id, rest - set(ids))
        page.prompts_dst = self._present(self.dst, P.c.hash, (r.get("system_prompt_hash") for r in todo))
        page.titles_dst = self._present(self.dst, S.c.title, (r.get("title") for r in todo))
        if self.ucols:
            at = self.ucols.index("session_id")
            query = select(*(U.c[c] for c in self.ucols)).where(U.c.session_id.in_(ids))
            for row in self.src.execute(query):
                page.usage[row[at]].append(dict(zip(self.ucols, row, strict=True)))
        sid_at = self.mcols.index("session_id")
        query = (select(*(M.c[c] for c in self.mcols)).where(M.c.session_id.in_(ids))
                 .order_by(M.c.session_id, M.c.id))
        stream = self.src.execute(query, execution_options={"stream_results": True, "yield_per": max(self.batch, 100)})
        handled = 0
        current: Any = None
        rows: list[tuple[Any, ...]] = []
        big: _BigSession | None = None
        try:
            for row in stream:
                sid = row[sid_at]
                if sid != current:
                    if current is not None:
                        self._finish(page, current, rows, big)
                        handled += 1
                        self._maybe_commit(checkpoint, handled)
                    if sid in page.done or sid not in page.rows:
                        raise CopyError(f"internal error: messages of session {sid!r} arrived out of order")
                    current, rows, big = sid, [tuple(row)], None
                elif big is not None:
                    big.add(tuple(row))
                else:
                    rows.append(tuple(row))
                    if len(rows) >= self.batch:
                        big = _BigSession(self, page, sid, rows)
                        rows = []
            if current is not None:
                self._finish(page, current, rows, big)
                handled += 1
                self._maybe_commit(checkpoint, handled)
        finally:
            stream.close()
        for sid in ids:
            if sid not in page.done:
                self._finish(page, sid, [], None)
                handled += 1
                self._maybe_commit(checkpoint, handled)

    def _maybe_commit(self, checkpoint: Callable[[int], None], handled: int) -> None:
        if self.pending >= self.batch:
            checkpoint(handled)

    def _finish(self, page: _Page, sid: Any, rows: list[tuple[Any, ...]], big: _BigSession | None) -> None:
        """A session read whole: buffered for the transaction (a big one is written already)."""
        if big is not None:
            big.finish()
            return
        self._add_session(page, page.rows[sid])
        self.buffer.messages.append((sid, [dict(zip(self.mcols, r, strict=True)) for r in rows]))
        self.buffer.usage += page.usage.pop(sid, [])
        self.pending += len(rows) + 1
        page.done.add(sid)

    def _add_session(self, page: _Page, row: dict[str, Any]) -> None:
        """Buffer a session row, with the links and names the destination can hold."""
        row = dict(row)
        sid = row["id"]
        parent = row.get("parent_session_id")
        if parent is not None and parent not in page.parents_dst and parent not in page.inserted:
            row["parent_session_id"] = None
            if parent in page.parents_src:
                self.links[sid] = parent
                self.waiting[parent].append(sid)
            else:
                self.report.dropped_links.append((sid, parent))
        digest = row.get("system_prompt_hash")
        if digest is not None and digest not in page.prompts_dst:
            row["system_prompt_hash"] = None
            self.report.dropped_prompts.append((sid, digest))
        title = row.get("title")
        if title is not None and title in page.titles_dst:
            row["title"] = self._free_title(title, page)
            self.report.renamed_titles.append((sid, title, row["title"]))
        if row.get("title") is not None:
            page.titles_dst.add(row["title"])
        self.buffer.sessions.append(row)
        page.inserted.add(sid)
        self.report.sessions_copied += 1
        self.wrote = True

    def _free_title(self, title: str, page: _Page) -> str:
        """The next "title #N" nobody has (a merge met a title already in use)."""
        self._flush()  # titles of buffered sessions must be visible to the lookup
        base, _n = split_title_number(title)
        candidate = SessionRepository(self.dst).next_title_in_lineage(title)
        number = 2
        while candidate == title or candidate in page.titles_dst or self._present(self.dst, S.c.title, [candidate]):
            candidate = f"{base} #{number}"
            number += 1
        return candidate

    def _flush(self) -> None:
        """Write the buffered sessions, then their messages (ids kept when all are free), then ledgers."""
        buf = self.buffer
        if buf.empty:
            return
        self.buffer = _Buffer()
        if buf.sessions:
            self.dst.execute(insert(S), buf.sessions)
            for row in buf.sessions:
                children = self.waiting.pop(row["id"], None)
                if not children:
                    continue
                for start in range(0, len(children), ID_CHUNK):
                    chunk = children[start:start + ID_CHUNK]
                    self.dst.execute(update(S).where(S.c.id.in_(chunk)).values(parent_session_id=row["id"]))
                for child in children:
                    self.links.pop(child, None)
        if buf.messages:
            ids = [m["id"] for _sid, items in buf.messages for m in items]
            taken: set[Any] = set()
            for start in range(0, len(ids), ID_CHUNK):
                chunk = ids[start:start + ID_CHUNK]
                taken.update(r[0] for r in self.dst.execute(select(M.c.id).where(M.c.id.in_(chunk))))
            # A session keeps its ids only when every one is free (import's rule): reads
            # order by id, so keeping some and renumbering others would reorder it.
            moved = [(sid, items) for sid, items in buf.messages if taken and any(m["id"] in taken for m in items)]
            renumbered = {sid for sid, _items in moved}
            self._write_messages([m for sid, items in buf.messages if sid not in renumbered for m in items], keep=True)
            for sid, items in moved:
                self._write_messages(items, keep=False)
                self.report.renumbered_sessions.append(sid)
        if buf.usage:
            self.dst.execute(insert(U), buf.usage)
        self.wrote = True

    def _write_messages(self, items: list[dict[str, Any]], keep: bool) -> None:
        """Insert messages with their ids (``keep``) or with new ones in the same order."""
        if not items:
            return
        if keep:
            MessageRepository(self.dst).insert_rows(items)  # THE bulk insert (staged on SQLite)
            self.identity_behind = True
            self._restore_nulls([(item["id"], item) for item in items])
        else:
            if self.identity_behind:
                self.dst_dialect.sync_identity(self.dst, "messages", at_least=self.src_high)  # after the kept ones
                self.identity_behind = False
            placed = []
            for item in items:
                values = {k: v for k, v in item.items() if k not in ("id", "display_order")}
                placed.append((self.dst.execute(insert(M).values(**values).returning(M.c.id)).scalar_one(), item))
            self._restore_nulls(placed, renumbered=True)
        self.report.messages_copied += len(items)
        self.wrote = True

    def _restore_nulls(self, placed: list[tuple[Any, dict[str, Any]]], renumbered: bool = False) -> None:
        for name in self.restore_nulls:
            if renumbered and name == "display_order":
                continue  # derived from the new ids, as import does
            ids = [new_id for new_id, item in placed if item.get(name) is None]
            for start in range(0, len(ids), ID_CHUNK):
                chunk = ids[start:start + ID_CHUNK]
                self.dst.execute(update(M).where(M.c.id.in_(chunk)).values({name: None}))

    # ------------------------------------------------------------------ search indexes

    def index(self) -> None:
        """Short-CJK index caught up in bounded transactions; full-text indexes checked."""
        repo = MaintenanceRepository(self.dst)
        total = cjk_bigram.pending(self.dst) if cjk_bigram.installed(self.dst) else 0
        self.dst.commit()
        done = 0
        while total:
            n = repo.catch_up_search_index(INDEX_CHUNK)
            self.dst.commit()
            done += n
            self.progress("index", min(done, total), total)
            if not n:
                break
        self.report.indexed_rows = done
        found = repo.fts_integrity_check()
        self.dst.rollback()
        if any(problem is not None for problem in found.values()):
            self.report.rebuilt_indexes = repo.rebuild_search()
            self.dst.commit()
            found = repo.fts_integrity_check()
            self.dst.rollback()
        self.report.search_indexes = found


@per_dialect
def _copy_rows(dialect: Dialect, target: TableKey, key: tuple[str, ...]) -> Any:
    """The destination's insert of rows on their own key: a row the destination has is
    kept, or updated as :data:`~.plan.UPSERT_UPDATES` says for its table."""
    table = table_of(target)
    ins = dialect.insert(table)
    updates = UPSERT_UPDATES.get(table.name)
    if updates is None:
        return ins.on_conflict_do_nothing(index_elements=list(key))
    set_, where = updates(ins, table)
    return ins.on_conflict_do_update(index_elements=list(key), set_=set_, where=where)


class _Page:
    """A page of source sessions being copied, with what was looked up for it."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = {r["id"]: r for r in rows}
        self.parents_dst: set[Any] = set()
        self.parents_src: set[Any] = set()
        self.prompts_dst: set[Any] = set()
        self.titles_dst: set[Any] = set()
        self.usage: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        #: Sessions buffered or written so far (a parent among them can be linked to).
        self.inserted: set[Any] = set()
        self.done: set[Any] = set()


class _Buffer:
    """What the open transaction will write: session rows, then messages, then ledgers."""

    def __init__(self) -> None:
        self.sessions: list[dict[str, Any]] = []
        self.messages: list[tuple[Any, list[dict[str, Any]]]] = []
        self.usage: list[dict[str, Any]] = []

    @property
    def empty(self) -> bool:
        return not (self.sessions or self.messages or self.usage)


class _BigSession:
    """A session with more than ``batch`` messages: one transaction of its own, streamed in.

    Whether it keeps its ids is decided before any is written, from all of them.
    """

    def __init__(self, copier: Copier, page: _Page, sid: Any, first: list[tuple[Any, ...]]) -> None:
        self.copier, self.page, self.sid = copier, page, sid
        copier._flush()  # the sessions before it go first (their ids count as taken)
        self.keep = not self._any_taken()
        copier._add_session(page, page.rows[sid])
        copier._flush()
        self.count = 0
        self.rows: list[tuple[Any, ...]] = []
        for r in first:
            self.add(r)

    def _any_taken(self) -> bool:
        c = self.copier
        query = select(M.c.id).where(M.c.session_id == self.sid).order_by(M.c.id)
        result = c.src.execute(query, execution_options={"stream_results": True, "yield_per": ID_CHUNK})
        try:
            for chunk in result.partitions(ID_CHUNK):
                ids = [r[0] for r in chunk]
                if c.dst.execute(select(M.c.id).where(M.c.id.in_(ids)).limit(1)).first() is not None:
                    return True
        finally:
            result.close()
        return False

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.copier.batch:
            self._write()

    def _write(self) -> None:
        if self.rows:
            self.copier._write_messages([dict(zip(self.copier.mcols, r, strict=True)) for r in self.rows], self.keep)
            self.count += len(self.rows)
            self.copier.pending += len(self.rows)
            self.rows = []

    def finish(self) -> None:
        self._write()
        c = self.copier
        c.buffer.usage += self.page.usage.pop(self.sid, [])
        self.page.done.add(self.sid)
        if not self.keep and self.count:
            c.report.renumbered_sessions.append(self.sid)
