"""Export/import, deletion and pruning, state_meta, FTS upkeep, usage reports.

The front door of several rooms: ``state_meta`` lives in :mod:`.state_meta`, the
transcript files in :mod:`.transcripts`, deletes and prunes in :mod:`.housekeeping`
and the FTS upkeep in :mod:`.fts_upkeep`; this module imports them, never the reverse.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Iterator, Mapping, Sequence

from sqlalchemy import Engine, bindparam, select, update

from .. import errors
from ..keys import DAY
from ..codec import check_key, is_stale_tool_call_marker_message
from ..dialects.sqlite import _outside_transaction  # VACUUM INTO: a SQLite file's statement
from ..models import Base
from ..dialects import cjk_bigram
from ..search import cjk_pairs as bigram
from ..tenant_schema import SchemaSQL
from . import fts_upkeep
from .base import MESSAGES, SESSIONS, Repository, insert_or_skip
from .housekeeping import HousekeepingRepository, cwd_prefix_condition
from .messages import MessageRepository, decode_row, encode_message
from .records import UsageRow
from .sessions import SessionRepository
from .state_meta import get_meta, list_meta_prefix, set_meta
from .transcripts import (  # noqa: F401 - importable from here since v1 (the CLI, tests)
    DUMP_PREFIX,
    PENDING_FILES,
    queue_transcript_files,
    remove_committed_files,
    transcript_files,
    transcript_files_many,
    unsafe_file_id,
)

_TAKEN = SchemaSQL("SELECT 1 FROM {messages} WHERE id IN :ids LIMIT 1", bindparam("ids", expanding=True))
_ORPHANS = SchemaSQL(
    "SELECT id FROM {sessions} WHERE parent_session_id IN :ids AND id NOT IN :ids ORDER BY id",
    bindparam("ids", expanding=True),
)
_MESSAGES_OF = SchemaSQL("SELECT count(*) FROM {messages} WHERE session_id IN :ids", bindparam("ids", expanding=True))
_GHOSTS = SchemaSQL(
    "SELECT id FROM {sessions} s WHERE source = 'tui' AND title IS NULL AND ended_at IS NOT NULL"
    " AND started_at < :cut AND NOT EXISTS (SELECT 1 FROM {messages} m WHERE m.session_id = s.id)"
)
_ORPHANED_COMPRESSION = SchemaSQL(
    "UPDATE {sessions} SET ended_at = :t, end_reason = 'orphaned_compression' WHERE id IN ("
    " SELECT c.id FROM {sessions} c JOIN {sessions} p ON p.id = c.parent_session_id"
    " WHERE c.ended_at IS NULL AND COALESCE(c.api_call_count, 0) = 0 AND c.started_at < :cut"
    " AND p.end_reason = 'compression'"
    " AND EXISTS (SELECT 1 FROM {messages} m WHERE m.session_id = c.id))"
)


#: ``state_meta`` key prefix of the once-per-root kanban retag (ours: Hermes' is not known).
KANBAN_RETAG_PREFIX = "kanban_worker_retag:"
#: ``state_meta`` key prefix of a server's marker-purge backup (a file store backs up to a file).
MARKER_BACKUP_PREFIX = "pre-clean-markers-backup-"


def _usage_row(key: tuple[str, ...], values: Sequence[Any]) -> UsageRow:
    """A report line from its key and the 9 sums after it (sessions, 6 token counts, 2
    costs); NULL sums read as 0."""
    sessions, calls, inputs, outputs, cache_read, cache_write, reasoning = (int(x or 0) for x in values[:7])
    return UsageRow(key, sessions, calls, inputs, outputs, cache_read, cache_write, reasoning,
                    float(values[7] or 0), float(values[8] or 0))


def vacuum_into(engine: Engine, path: str) -> None:
    """``VACUUM INTO path`` (a consistent copy of a SQLite file), outside any transaction:
    our engine's DB-API connections are in autocommit and issue BEGIN themselves. Errors
    are typed, a held lock as DatabaseLockedError (``Steps.outside`` retries it)."""
    _outside_transaction(engine, "VACUUM INTO ?", (path,))


class MaintenanceRepository(Repository):
    # ------------------------------------------------------------------ state_meta

    def get_meta(self, key: str) -> str | None:
        return get_meta(self.conn, key)

    def set_meta(self, key: str, value: Any) -> None:
        set_meta(self.conn, key, value)  # a plain upsert, never a delete and re-insert

    def list_meta_prefix(self, prefix: str) -> list[tuple[str, str]]:
        return list_meta_prefix(self.conn, prefix)

    # ------------------------------------------------------------------ size, retag, markers (v23L-v25)

    def logical_size_bytes(self) -> int | None:
        """SQLite: ``page_count × page_size``. A server: the on-disk size of our tables in
        this schema (indexes and TOAST included), the nearest it has to a file's size."""
        return self.dialect.logical_size_bytes(self.conn, self.schema, sorted(Base.metadata.tables))

    def retag_kanban_workers(self, root: str) -> int:
        """Once per root (stamped in ``state_meta``): sessions of source ``cli`` whose cwd
        is the root or below it become ``kanban``. Rows changed (0 when already done)."""
        key = KANBAN_RETAG_PREFIX + root
        if get_meta(self.conn, key) is not None:
            return 0
        stmt = (update(SESSIONS).where(SESSIONS.c.source == "cli", cwd_prefix_condition(SESSIONS.c.cwd, root))
                .values(source="kanban"))
        changed = self.conn.execute(stmt).rowcount
        set_meta(self.conn, key, repr(self.now()))
        return int(changed or 0)

    def stale_tool_call_markers(self) -> list[tuple[int, Any]]:
        """``(id, stored content)`` of assistant rows whose whole reply is a stale
        ``[tool_name]`` marker beside real tool calls, in id order."""
        m = MESSAGES.c
        stmt = (select(m.id, m.role, m.content, m.tool_calls)
                .where(m.role == "assistant", m.tool_calls.is_not(None), m.content.like("%[%]%"))
                .order_by(m.id))
        found = []
        for row in self.conn.execute(stmt).mappings():
            stored = row["content"]
            if is_stale_tool_call_marker_message(decode_row(dict(row))):
                found.append((int(row["id"]), stored))
        return found

    def blank_tool_call_markers(self, ids: Iterable[int], backup_key: str | None = None) -> list[int]:
        """Blank (``''``) the rows of ``ids`` that are still stale markers; with
        ``backup_key`` their stored content is first kept in ``state_meta`` as JSON
        ``{id: content}`` (a server's backup, in this transaction). The ids blanked."""
        wanted = set(ids)
        rows = [(i, c) for i, c in self.stale_tool_call_markers() if i in wanted]
        if not rows:
            return []
        if backup_key is not None:
            set_meta(self.conn, backup_key, json.dumps({str(i): c for i, c in rows}))
        done = [i for i, _ in rows]
        for start in range(0, len(done), 500):
            chunk = done[start:start + 500]
            self.conn.execute(update(MESSAGES).where(MESSAGES.c.id.in_(chunk)).values(content=""))
        return done

    # ------------------------------------------------------------------ export / import

    def export_session(self, session_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM {sessions} WHERE id = :id", {"id": session_id})
        if row is None:
            return None
        SessionRepository(self.conn).resolve_prompts([row])
        row["messages"] = MessageRepository(self.conn).get_messages(session_id, include_inactive=True)
        if self.has_table("session_model_usage"):
            row["model_usage"] = self._usage_rows(session_id)
        return row

    def _usage_rows(self, session_id: str) -> list[dict[str, Any]]:
        return self._all(
            "SELECT * FROM {session_model_usage} WHERE session_id = :id ORDER BY model, task, billing_provider",
            {"id": session_id},
        )

    def iter_export(self, source: str | None = None, batch: int = 500) -> Iterator[dict[str, Any]]:
        """Sessions (oldest first, parents before children) each with its messages, streamed.

        Memory stays flat: sessions are read in keyset pages and each session's
        messages through a server-side cursor, one session at a time.
        """
        last_started, last_id = -1e300, ""
        ledger = self.has_table("session_model_usage")
        # Where the driver's own reads are much cheaper (SQLite), per-session rows go
        # straight to it: SQLAlchemy's result setup would cost more than the query.
        read = self.dialect.export_reader(self.conn)
        where = "" if source is None else " AND source = :src"
        while True:
            page = self._all(
                f"SELECT * FROM {{sessions}} WHERE (started_at > :t OR (started_at = :t AND id > :id)){where}"
                " ORDER BY started_at, id LIMIT :n",
                {"t": last_started, "id": last_id, "n": batch, "src": source},
            )
            if not page:
                return
            SessionRepository(self.conn).resolve_prompts(page)
            if read is None:
                for row in page:
                    row["messages"] = MessageRepository(self.conn).get_messages(row["id"], include_inactive=True)
                    if ledger:
                        row["model_usage"] = self._usage_rows(row["id"])
                    yield row
                last_started, last_id = page[-1]["started_at"], page[-1]["id"]
                continue
            for row in page:
                row["messages"] = [decode_row(m) for m in read("messages", row["id"], "id")]
                if ledger:
                    row["model_usage"] = read("session_model_usage", row["id"], "model, task, billing_provider")
                yield row
            last_started, last_id = page[-1]["started_at"], page[-1]["id"]

    def import_session(self, record: Mapping[str, Any]) -> bool:
        """Insert one exported session with its messages; an existing id is left alone.

        Returns False when the session was already there (import is idempotent).
        Messages go through the same encoder as appends (:func:`encode_message`), so an
        imported message is stored exactly as the same message appended. Message ids
        are kept when every one is free and in order, so lineage and anchors survive a
        round trip; otherwise the session's messages get new ids in their given order.
        Bad input raises InvalidInputError before anything of this record is written.
        """
        if not isinstance(record, Mapping):
            raise errors.InvalidInputError(f"session record must be a dict, not {type(record).__name__}")
        record = dict(record)
        messages = record.pop("messages", []) or []
        usage = record.pop("model_usage", []) or []
        record.pop("preview", None), record.pop("last_active", None), record.pop("_lineage_root_id", None)
        if "id" not in record:
            raise errors.InvalidInputError("session record has no 'id'")
        sid = check_key(record["id"], "session id")
        if not isinstance(messages, (list, tuple)) or not isinstance(usage, (list, tuple)):
            raise errors.InvalidInputError(f"session {sid!r}: 'messages' and 'model_usage' must be lists")
        if any(not isinstance(u, Mapping) for u in usage):
            raise errors.InvalidInputError(f"session {sid!r}: each 'model_usage' entry must be a dict")
        if self.session_exists(sid):
            return False
        msg_repo = MessageRepository(self.conn)
        msg_cols = msg_repo._known()
        rows = []
        for index, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise errors.InvalidInputError(
                    f"session {sid!r}: message #{index} must be a dict, not {type(m).__name__}")
            item = {k: v for k, v in m.items() if k in msg_cols}
            # Hermes' display identity is a digest it computes itself (NULL = "to be
            # filled in"); only the real bytes are kept, never a text rendering of them.
            if not isinstance(item.get("display_identity"), (bytes, bytearray, memoryview)):
                item.pop("display_identity", None)
            item["session_id"] = sid
            rows.append(encode_message(item, msg_cols, index=index, keep_id=True, clock=self.now))
        self._free_ids_or_renumber(rows)
        known = self.columns_of("sessions")
        cols = {k: v for k, v in record.items() if k in known}
        sessions = SessionRepository(self.conn)
        if sessions.prompts_hashed():
            # The export carries the full text: it is stored once, by its own hash
            # (v25); a hash without its text is kept only if that text is here.
            prompt, digest = cols.pop("system_prompt", None), cols.pop("system_prompt_hash", None)
            if prompt is not None:
                cols["system_prompt_hash"] = sessions.store_prompt(prompt)
            elif digest is not None and self._scalar("SELECT 1 FROM {system_prompts} WHERE hash = :h", {"h": digest}):
                cols["system_prompt_hash"] = digest
        # A parent that is not (yet) here would break the FK: keep the link only when valid.
        parent = cols.get("parent_session_id")
        if parent and not self.session_exists(parent):
            self._pending_parents.append((cols["id"], parent))
            cols["parent_session_id"] = None
        names = list(cols)
        self._exec(f"INSERT INTO {{sessions}} ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)})", cols)
        self._relink(cols["id"])
        msg_repo.insert_rows(rows)
        if rows and "id" in rows[0]:
            self.dialect.sync_identity(self.conn, "messages")  # later appends continue after kept ids
        if usage and self.has_table("session_model_usage"):
            ledger_cols = self.columns_of("session_model_usage")
            for u in usage:
                u = {k: v for k, v in u.items() if k in ledger_cols}
                u["session_id"] = cols["id"]
                names = list(u)
                self._exec(insert_or_skip(self.conn, "session_model_usage", names), u)
        return True

    def _free_ids_or_renumber(self, rows: list[dict[str, Any]]) -> None:
        """Keep the imported ids only if all rows have one, strictly rising, none taken.

        Keeping some ids and renumbering others would change the order the messages
        read back in (reads order by id), so it is all or nothing per session.
        """
        ids = [r.get("id") for r in rows]
        given = [i for i in ids if i is not None]
        keep = bool(ids) and len(given) == len(ids) and all(a < b for a, b in pairwise(given))
        for start in range(0, len(ids), 500):
            if not keep:
                break
            chunk = ids[start:start + 500]
            keep = self.conn.execute(_TAKEN.on(self.conn), {"ids": chunk}).first() is None
        if not keep:
            for r in rows:
                r.pop("id", None)
                # The on-screen order (v30) was taken from the old ids: the insert
                # trigger derives it again from the new ones.
                r.pop("display_order", None)

    _pending_parents: list[tuple[str, str]]

    def __init__(self, executor: Any, pending_parents: list[tuple[str, str]] | None = None) -> None:
        """``pending_parents``: pass the same list to the repository of each import batch
        so a child imported before its parent is relinked even when the parent arrives
        in a later batch (transaction); the list is updated in place."""
        super().__init__(executor)
        self._pending_parents = [] if pending_parents is None else pending_parents

    def _relink(self, new_id: str) -> None:
        """Children imported before their parent get their link back once it arrives."""
        still = []
        for child, parent in self._pending_parents:
            if parent == new_id or self.session_exists(parent):
                self._exec("UPDATE {sessions} SET parent_session_id = :p WHERE id = :c", {"p": parent, "c": child})
            else:
                still.append((child, parent))
        self._pending_parents[:] = still

    # ------------------------------------------------------------------ delete / prune

    def delete_session(self, session_id: str, sessions_dir: str | Path | None = None) -> bool:
        """Delete a session, its messages and (recursively) its delegate children; other
        children stay, orphaned (Hermes v23: see HousekeepingRepository.delete_sessions)."""
        return HousekeepingRepository(self.conn).delete_sessions([session_id], sessions_dir) == 1

    def _delete_ids(self, ids: list[str]) -> None:
        HousekeepingRepository(self.conn).delete_rows(ids)

    def _remove_files(self, ids: Iterable[str], folder: str | Path) -> None:
        """Queue the transcript files of these (deleted) sessions, only inside ``folder``.

        They are removed by :func:`remove_committed_files` once the caller's transaction
        has committed (SessionDB and UnitOfWork do it for you): a rolled-back delete
        must not have taken the files with it. Ids that cannot be a file name are
        skipped with a warning (their rows are deleted all the same); a request dump
        that may belong to another live session is kept. See :class:`.transcripts.TranscriptFolder`.
        """
        queue_transcript_files(self.conn, ids, folder, self.session_exists)

    def prune_candidates(self, older_than_days: float = 90, source: str | None = None) -> list[dict[str, Any]]:
        """What :meth:`prune_sessions` would delete: ended sessions started before the cutoff."""
        columns = ("id", "source", "title", "started_at", "ended_at", "end_reason", "message_count")
        return HousekeepingRepository(self.conn).candidates(older_than_days, source, {}, columns=columns)

    def prune_preview(self, ids: list[str]) -> tuple[list[str], int]:
        """For sessions about to be deleted: the children they would orphan (not
        themselves deleted), and how many messages would go with them."""
        if not ids:
            return [], 0
        orphans = self.conn.execute(_ORPHANS.on(self.conn), {"ids": ids}).scalars().all()
        messages = self.conn.execute(_MESSAGES_OF.on(self.conn), {"ids": ids}).scalar()
        return list(orphans), int(messages or 0)

    def prune_sessions(
        self, older_than_days: float | None = 90, source: str | None = None, sessions_dir: str | Path | None = None,
        **filters: Any,
    ) -> int:
        """Delete ended sessions matching Hermes' prune filters; children are orphaned."""
        return HousekeepingRepository(self.conn).prune(older_than_days, source, sessions_dir, filters)

    def prune_empty_ghost_sessions(self, sessions_dir: str | Path | None = None) -> int:
        """TUI sessions that never got a message or title, ended, older than a day."""
        ids = [
            r[0]
            for r in self.conn.execute(_GHOSTS.on(self.conn), {"cut": self.now() - DAY})
        ]
        self._delete_ids(ids)
        if sessions_dir is not None:
            self._remove_files(ids, sessions_dir)
        return len(ids)

    def finalize_orphaned_compression_sessions(self) -> int:
        """End stale compression continuations that never made an API call."""
        stamp = self.now()
        return self.conn.execute(_ORPHANED_COMPRESSION.on(self.conn), {"t": stamp, "cut": stamp - 7 * DAY}).rowcount

    # ------------------------------------------------------------------ FTS

    def defer_foreign_keys(self) -> None:
        """References are checked at commit (an import may bring children first)."""
        self.dialect.defer_foreign_keys(self.conn)

    def rebuild_search(self) -> list[str]:
        """Rebuild every full-text index and the short-CJK index; returns what was rebuilt.

        An index whose rebuild fails is logged and left out of the list (see
        :meth:`FtsUpkeepRepository.rebuild_each`).
        """
        done = self.fts_rebuild()
        if cjk_bigram.installed(self.conn):
            cjk_bigram.rebuild(self.conn)
            done.append(bigram.TABLE)
        return done

    def search_index_behind(self) -> bool:
        """Whether the short-CJK index has rows to catch up on (False when absent)."""
        return self._bigram() and cjk_bigram.behind(self.conn)

    def catch_up_search_index(self, limit: int | None = None, *, single_owner: bool = False) -> int:
        """Extend the short-CJK index over up to ``limit`` new rows; returns rows indexed.

        ``single_owner``: only when no other transaction is doing it right now (0 when
        one is: periodic upkeep of many processes must not all index the same rows)."""
        if not self._bigram():
            return 0
        if single_owner and not self.dialect.try_upkeep_lock(self.conn, "cjk-bigram"):
            return 0
        return cjk_bigram.catch_up(self.conn, limit)

    def _bigram(self) -> bool:
        """Whether this database has the short-CJK index (both dialects may); asked of
        the server until it says yes (the periodic catch-up asks every run)."""
        return cjk_bigram.seen_installed(self.conn)

    def fts_rebuild(self) -> list[str]:
        """Re-read every message into each full-text index; returns the indexes rebuilt."""
        return fts_upkeep.FtsUpkeepRepository(self.conn).rebuild_each()

    def fts_optimize(self) -> list[str]:
        """Merge each full-text index's segments into one; returns the indexes optimized."""
        return fts_upkeep.FtsUpkeepRepository(self.conn).optimize_each()

    def fts_integrity_check(self) -> dict[str, str | None]:
        """Per index: None when healthy, else the error text (a held lock is raised, never
        reported as damage)."""
        out: dict[str, str | None] = {}
        for index in self.dialect.fts_indexes(self.conn):
            try:
                self.dialect.fts_command(self.conn, index, "integrity-check")
                out[index] = None
            except Exception as exc:  # sqlite reports corruption as DatabaseError
                if self.dialect.is_retryable(exc):
                    raise  # a held lock says nothing of the index: the caller's retry waits it out
                out[index] = str(exc)
        return out

    # ------------------------------------------------------------------ usage

    def usage(self, by: str = "model", source: str | None = None) -> list[UsageRow]:
        """Tokens and cost grouped by model, task or billing route (from the ledger)."""
        keys = {
            "model": ("u.model",),
            "task": ("u.task",),
            "route": ("u.billing_provider", "u.billing_base_url", "u.billing_mode"),
            "model_task": ("u.model", "u.task"),
        }[by]
        if not self.has_table("session_model_usage"):
            return self._usage_from_sessions(source) if by == "model" else []
        if by in ("task", "model_task") and "task" not in self.columns_of("session_model_usage"):
            return []
        where = "" if source is None else " WHERE s.source = :src"
        rows = self.conn.execute(
            self._sql(
                f"SELECT {', '.join(keys)}, count(DISTINCT u.session_id), sum(u.api_call_count), sum(u.input_tokens),"
                " sum(u.output_tokens), sum(u.cache_read_tokens), sum(u.cache_write_tokens), sum(u.reasoning_tokens),"
                " sum(u.estimated_cost_usd), sum(u.actual_cost_usd)"
                f" FROM {{session_model_usage}} u JOIN {{sessions}} s ON s.id = u.session_id{where}"
                f" GROUP BY {', '.join(keys)} ORDER BY sum(u.estimated_cost_usd) DESC, sum(u.input_tokens) DESC"
            ),
            {"src": source},
        ).fetchall()
        n = len(keys)
        return [_usage_row(tuple(r[:n]), r[n:]) for r in rows]

    def _usage_from_sessions(self, source: str | None) -> list[UsageRow]:
        """Hermes' documented stats query: sessions, tokens and cost per model."""
        where = "" if source is None else " WHERE source = :src"
        rows = self.conn.execute(
            self._sql(
                "SELECT COALESCE(model, 'unknown'), count(*), sum(COALESCE(api_call_count, 0)), sum(input_tokens),"
                " sum(output_tokens), sum(cache_read_tokens), sum(cache_write_tokens), sum(reasoning_tokens),"
                f" sum(COALESCE(estimated_cost_usd, 0)), sum(COALESCE(actual_cost_usd, 0)) FROM {{sessions}}{where}"
                " GROUP BY 1 ORDER BY 9 DESC"
            ),
            {"src": source},
        ).fetchall()
        return [_usage_row((r[0],), r[1:]) for r in rows]

    def stats_by_model(self, source: str | None = None) -> list[UsageRow]:
        """Sessions, tokens and cost per model, from the session totals (Hermes' stats)."""
        return self._usage_from_sessions(source)


