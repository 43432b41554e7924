"""Archive, delete, prune, empty sessions, export and import: sessions as a whole (Hermes v23).

The workflows of several transactions (the imports, auto-prune and vacuum) are
functions of :mod:`hermes_store.operations`, run over the store's own ``_write`` /
``_read`` (:class:`~hermes_store.sessiondb._host.HostSteps`); Hermes' import limits
stay class attributes here, read when a call starts, so code may lower them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Iterator, List, Mapping, Optional

from .. import errors
from ..operations import imports as import_ops
from ..operations import prune as prune_ops
from ..repositories import MaintenanceRepository
from ..repositories.housekeeping import HousekeepingRepository
from ._host import Host, HostSteps, transcript_budget


class HousekeepingMixin(Host):
    #: Hermes' import limits (class attributes, so a test or caller may lower them).
    _IMPORT_MAX_SESSIONS = import_ops.ImportLimits.max_sessions
    _IMPORT_MAX_MESSAGES_PER_SESSION = import_ops.ImportLimits.max_messages_per_session
    _IMPORT_MAX_TOTAL_MESSAGES = import_ops.ImportLimits.max_total_messages
    _IMPORT_MAX_SESSION_BYTES = import_ops.ImportLimits.max_session_bytes
    _IMPORT_MAX_TOTAL_BYTES = import_ops.ImportLimits.max_total_bytes

    # ------------------------------------------------------------------ archive

    def set_session_archived(self, session_id: str, archived: bool) -> bool:
        """Archive (or unarchive) the session's whole compression lineage; False if unknown."""
        if not isinstance(session_id, str) or not session_id:
            return False
        return self._write(lambda c: HousekeepingRepository(c).set_archived(session_id, bool(archived)))

    def list_prune_candidates(
        self, older_than_days: Optional[float] = None, source: Optional[str] = None, **filters: Any
    ) -> list[dict[str, Any]]:
        """Read-only: what prune_sessions would delete (ended, unpinned), oldest first,
        each with ``last_active`` (newest message, else start)."""
        return self._read(lambda c: HousekeepingRepository(c).candidates(older_than_days, source, filters))

    def count_open_prune_matches(self, older_than_days: Optional[float] = None, source: Optional[str] = None,
                                 **filters: Any) -> int:
        """Sessions still running that the same filters match (prune skips them)."""
        return self._read(lambda c: HousekeepingRepository(c).count_open_matches(older_than_days, source, filters))

    def archive_sessions(
        self, older_than_days: Optional[float] = None, source: Optional[str] = None, **filters: Any
    ) -> int:
        """Archive the lineage of every matching session (unarchived ones by default).

        Returns the number of sessions matched, not rows updated.
        """
        filters.setdefault("archived", False)
        return self._write(lambda c: HousekeepingRepository(c).archive(older_than_days, source, filters))

    def archive_stale_sessions(self, idle_days: float, *, exclude_pinned: bool = True) -> int:
        """Archive unarchived sessions (ended or not, not ended by compression) idle for
        ``idle_days``, with their lineages; returns how many matched (0 for None or < 0)."""
        if idle_days is None or isinstance(idle_days, bool) or not isinstance(idle_days, (int, float)):
            if idle_days is None:
                return 0
            raise errors.InvalidInputError(f"idle_days must be a number, not {idle_days!r}")
        if idle_days < 0:
            return 0
        cutoff = self._now() - float(idle_days) * 86_400.0
        return self._write(
            lambda c: HousekeepingRepository(c).archive_stale(cutoff, exclude_pinned=bool(exclude_pinned))
        )

    def maybe_auto_archive(self, idle_days: float = 3, min_interval_hours: int = 24,
                           exclude_pinned: bool = True) -> dict[str, Any]:
        """Auto-archive at most once per interval (``last_auto_archive``); running sessions
        stay visible. ``{"skipped", "archived"[, "error"]}``, never raises."""
        return prune_ops.auto_archive(HostSteps(self), idle_days, min_interval_hours, bool(exclude_pinned))

    # ------------------------------------------------------------------ delete / prune

    def prune_sessions(
        self,
        older_than_days: Optional[float] = 90,
        source: Optional[str] = None,
        sessions_dir: Optional[Path] = None,
        **filters: Any,
    ) -> int:
        """Delete matching ended sessions (children orphaned, no delegate cascade)."""
        return self._write(
            lambda c: HousekeepingRepository(c).prune(older_than_days, source, sessions_dir, filters),
            budget=transcript_budget(),
        )

    def prune_candidates(self, older_than_days: float = 90, source: Optional[str] = None) -> list[dict[str, Any]]:
        """Read-only: what ``prune_sessions(older_than_days, source)`` would delete.

        hermes_store's own (the CLI's dry run): list_prune_candidates' rows plus
        ``end_reason``.
        """
        columns = ("id", "source", "title", "model", "started_at", "ended_at", "end_reason", "message_count",
                   "archived")
        return self._read(
            lambda c: HousekeepingRepository(c).candidates(older_than_days, source, {}, columns=columns)
        )

    def delete_session(self, session_id: str, sessions_dir: Optional[Path] = None,
                       expected_delete_ids: Optional[List[str]] = None) -> bool:
        """Delete the session and, recursively, its delegate children; others are orphaned.

        ``expected_delete_ids``: the ids the delete takes (:meth:`get_session_delete_targets`
        as the caller saw them) must still be exactly these in the transaction, else
        nothing is deleted and False is returned.
        """
        if not session_id:
            return False
        if isinstance(expected_delete_ids, (str, bytes)):
            raise errors.InvalidInputError("expected_delete_ids must be a list of ids, not one string")
        expected = None if expected_delete_ids is None else list(expected_delete_ids)
        return self._write(
            lambda c: HousekeepingRepository(c).delete_sessions([session_id], sessions_dir, expected) == 1,
            budget=transcript_budget(),
        )

    def get_session_delete_targets(self, session_id: str) -> List[str]:
        """The ids delete_session would remove: the id, then its delegates sorted; [] if unknown."""
        if not isinstance(session_id, str) or not session_id:
            return []
        return self._read(lambda c: HousekeepingRepository(c).delete_targets(session_id))

    def delete_sessions(self, session_ids: list[str], sessions_dir: Optional[Path] = None) -> int:
        """Bulk delete_session in one transaction; returns how many listed ids existed."""
        if isinstance(session_ids, (str, bytes)):
            raise errors.InvalidInputError("session_ids must be a list of ids, not one string")
        ids = list(session_ids or [])
        return self._write(
            lambda c: HousekeepingRepository(c).delete_sessions(ids, sessions_dir), budget=transcript_budget()
        )

    def delete_session_if_empty(self, session_id: str, sessions_dir: Optional[Path] = None) -> bool:
        """Delete only an untitled session with no message rows and no children."""
        if not isinstance(session_id, str) or not session_id:
            return False
        return self._write(lambda c: HousekeepingRepository(c).delete_if_empty(session_id, sessions_dir))

    def count_empty_sessions(self) -> int:
        """Ended, unarchived sessions whose message counter is 0."""
        return self._read(lambda c: HousekeepingRepository(c).count_empty())

    def delete_empty_sessions(self, sessions_dir: Optional[Path] = None) -> int:
        """Delete what count_empty_sessions counts; returns how many went."""
        return self._write(lambda c: HousekeepingRepository(c).delete_empty(sessions_dir), budget=transcript_budget())

    def prune_empty_ghost_sessions(self, sessions_dir: Optional[Path] = None) -> int:
        return self._write(lambda c: MaintenanceRepository(c).prune_empty_ghost_sessions(sessions_dir))

    def finalize_orphaned_compression_sessions(self) -> int:
        return self._write(lambda c: MaintenanceRepository(c).finalize_orphaned_compression_sessions())

    # ------------------------------------------------------------------ transcript upkeep (v23L-v25)

    def retag_kanban_worker_sessions(self, workspaces_root: str) -> int:
        """Once per root: sessions of source ``cli`` working at or under ``workspaces_root``
        become ``kanban``; returns rows retagged (0 when this root was done before)."""
        if not isinstance(workspaces_root, str) or not workspaces_root.strip():
            return 0
        root = workspaces_root.strip().rstrip("/\\") or workspaces_root.strip()
        return self._write(lambda c: MaintenanceRepository(c).retag_kanban_workers(root))

    def purge_stale_tool_call_markers(self, *, dry_run: bool = False, backup: bool = True) -> dict[str, Any]:
        """Blank stored ``[tool_name]`` marker replies: ``{dry_run, rows_affected, row_ids,
        backup_path}``. A dry run or nothing found writes nothing; otherwise a backup is
        taken first unless ``backup=False`` (the blanking cannot be undone otherwise)."""
        return prune_ops.purge_stale_tool_call_markers(HostSteps(self), dry_run=bool(dry_run), backup=bool(backup))

    # ------------------------------------------------------------------ export

    def export_session(self, session_id: str, *, include_inactive: bool = False) -> Optional[dict[str, Any]]:
        """The session row plus ``messages`` (live rows, as Hermes v23) and ``model_usage``.

        ``include_inactive=True`` (ours) also exports rewound and archived rows.
        """
        return self._read(lambda c: HousekeepingRepository(c).export_session(session_id, include_inactive))

    def export_all(self, source: Optional[str] = None, *, include_inactive: bool = False) -> list[dict[str, Any]]:
        """Every session (of ``source``) exported, most recently active first (Hermes' order).

        For a full-fidelity backup of a large store use :meth:`iter_export` (streamed,
        every row kept), which ``hermes-store export`` does.
        """
        ids = [row["id"] for row in self.search_sessions(source=source, limit=100000)]
        return self._read(lambda c: HousekeepingRepository(c).export_sessions(ids, include_inactive))

    def export_session_lineage(self, session_id: str) -> Optional[dict[str, Any]]:
        """The compression lineage exported as one conversation.

        A copy of the last segment's export plus ``segments`` (each session's export),
        ``lineage_session_ids``, ``message_count`` (live messages in all) and
        ``messages`` (concatenated). None when nothing could be exported.
        """
        if not session_id:
            return None
        segments = self._read(lambda c: HousekeepingRepository(c).export_lineage(session_id))
        if not segments:
            return None
        out = dict(segments[-1])
        messages = [m for seg in segments for m in seg["messages"]]
        out.update(
            segments=segments,
            lineage_session_ids=[seg["id"] for seg in segments],
            message_count=len(messages),
            messages=messages,
        )
        return out

    def iter_export(self, source: Optional[str] = None) -> Iterator[dict[str, Any]]:
        """Streamed export of every row (rewound and archived messages too), flat memory.

        hermes_store's own, for backups (the CLI's ``export``): oldest first, parents
        before children; :meth:`import_records` takes it back unchanged.
        """
        with self._open_engine().connect() as conn:
            try:
                yield from MaintenanceRepository(conn).iter_export(source)
            finally:
                conn.rollback()

    # ------------------------------------------------------------------ import

    def import_sessions(self, sessions: list) -> dict[str, Any]:
        """Hermes v23's import: validate everything, then insert new sessions in one transaction.

        Returns ``{"ok", "imported", "skipped", "detached", "imported_ids", "skipped_ids",
        "errors"}`` (``ok`` False with the errors and nothing written when any entry is
        invalid). Messages become live rows; existing ids are skipped. Unlike Hermes, a
        title already in use does not abort the batch: that session is imported
        untitled and named in ``titles_cleared``.
        """
        return import_ops.import_sessions(HostSteps(self), sessions, limits=self._import_limits())

    def _import_limits(self) -> import_ops.ImportLimits:
        """Hermes' limits as this instance has them now (they may be patched on it)."""
        return import_ops.ImportLimits(
            max_sessions=self._IMPORT_MAX_SESSIONS,
            max_messages_per_session=self._IMPORT_MAX_MESSAGES_PER_SESSION,
            max_total_messages=self._IMPORT_MAX_TOTAL_MESSAGES,
            max_session_bytes=self._IMPORT_MAX_SESSION_BYTES,
            max_total_bytes=self._IMPORT_MAX_TOTAL_BYTES,
        )

    def _import_errors(self, sessions: list) -> list[dict[str, Any]]:
        """Every entry checked before anything is written: ``{"index", "error"[, "session_id"]}``."""
        return import_ops.import_errors(sessions, self._import_limits())

    def import_records(self, records: Iterable[Mapping[str, Any]], batch: int = 200) -> tuple[int, int]:
        """Import exported records idempotently, in batches; returns (imported, skipped).

        hermes_store's own bulk importer (formerly ``import_sessions``), the inverse of
        :meth:`iter_export`: every column and message row is kept as exported (ids when
        free, rewound and archived rows, usage rows), lineage restored across batches.
        One transaction per batch: :func:`hermes_store.operations.imports.import_records`.
        """
        return import_ops.import_records(HostSteps(self), records, batch)

    # ------------------------------------------------------------------ auto-prune

    def maybe_auto_prune_and_vacuum(
        self,
        retention_days: int = 90,
        min_interval_hours: int = 24,
        vacuum: bool = True,
        sessions_dir: Optional[Path] = None,
        min_vacuum_interval_days: int = 30,
    ) -> dict[str, Any]:
        """Prune at most once per interval (``last_auto_prune``), pinned sessions kept;
        VACUUM when anything went and ``last_vacuum`` is absent or older than
        ``min_vacuum_interval_days`` (stamped only when the VACUUM succeeded).

        :func:`hermes_store.operations.prune.auto_prune_and_vacuum` on this store; the
        vacuum step is this instance's :meth:`vacuum` (which optimizes first).
        """
        return prune_ops.auto_prune_and_vacuum(
            HostSteps(self), retention_days, min_interval_hours, vacuum, sessions_dir, min_vacuum_interval_days,
            run_vacuum=self.vacuum,
        )
