"""Archive, delete, prune, empty sessions, export and import: sessions as a whole (Hermes v23)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional

from sqlalchemy import Connection

from .. import errors
from ..repositories import MaintenanceRepository
from ..repositories.housekeeping import HousekeepingRepository
from ._host import TRANSCRIPT_BUDGET_S, Host

#: Text fields of an imported session and of its messages (None is allowed too).
IMPORT_SESSION_TEXT = (
    "source", "user_id", "model", "system_prompt", "end_reason", "cwd", "git_branch", "git_repo_root",
    "billing_provider", "billing_base_url", "billing_mode", "cost_status", "cost_source", "pricing_version", "title",
)
IMPORT_MESSAGE_TEXT = (
    "tool_call_id", "tool_name", "effect_disposition", "finish_reason", "reasoning", "reasoning_content",
    "platform_message_id", "message_id",
)
#: Numbers an imported session may carry (checked here: Hermes would store anything).
IMPORT_SESSION_NUMBERS = ("started_at", "ended_at", "estimated_cost_usd", "actual_cost_usd")
IMPORT_SESSION_INTEGERS = (
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "api_call_count",
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry_size(entry: Any) -> int | None:
    """Bytes of the entry as compact UTF-8 JSON; None when it is not JSON serializable.

    Lone surrogates are counted, not refused: they are stored as U+FFFD like any text.
    """
    try:
        text = json.dumps(entry, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return len(text.encode("utf-8", "surrogatepass"))


def _model_config_error(config: Any) -> str | None:
    if config is None:
        return None
    if isinstance(config, str):
        try:
            value = json.loads(config)
        except ValueError:
            return "model_config must be valid JSON"
        return None if isinstance(value, dict) else "model_config must be a JSON object"
    if isinstance(config, dict):
        try:
            json.dumps(config)
        except (TypeError, ValueError, RecursionError):
            return "model_config must be JSON serializable"
        return None
    return "model_config must be a JSON object"


def _entry_error(entry: dict[str, Any]) -> str | None:
    """The first problem of one (object, id-checked, size-checked) entry, or None."""
    problem = _model_config_error(entry.get("model_config"))
    if problem:
        return problem
    for field in ("parent_session_id", *IMPORT_SESSION_TEXT):
        if entry.get(field) is not None and not isinstance(entry[field], str):
            return f"{field} must be a string"
    for field in IMPORT_SESSION_NUMBERS:
        if entry.get(field) is not None and not _is_number(entry[field]):
            return f"{field} must be a finite number"
    for field in IMPORT_SESSION_INTEGERS:
        if entry.get(field) is not None and not _is_integer(entry[field]):
            return f"{field} must be an integer"
    if entry.get("archived") not in (None, True, False):  # 0 and 1 pass
        return "archived must be a boolean"
    for i, message in enumerate(entry.get("messages") or []):
        role = message.get("role")
        if not isinstance(role, str) or not role:
            return f"messages[{i}].role must be a non-empty string"
        for field in IMPORT_MESSAGE_TEXT:
            if message.get(field) is not None and not isinstance(message[field], str):
                return f"messages[{i}].{field} must be a string"
        if message.get("token_count") is not None and not _is_integer(message["token_count"]):
            return f"messages[{i}].token_count must be an integer"
        if message.get("timestamp") is not None and not _is_number(message["timestamp"]):
            return f"messages[{i}].timestamp must be a finite number"
    return None


class HousekeepingMixin(Host):
    #: Hermes' import limits (class attributes, so a test or caller may lower them).
    _IMPORT_MAX_SESSIONS = 500
    _IMPORT_MAX_MESSAGES_PER_SESSION = 10_000
    _IMPORT_MAX_TOTAL_MESSAGES = 50_000
    _IMPORT_MAX_SESSION_BYTES = 5 * 1024 * 1024
    _IMPORT_MAX_TOTAL_BYTES = 25 * 1024 * 1024

    # ------------------------------------------------------------------ archive

    def set_session_archived(self, session_id: str, archived: bool) -> bool:
        """Archive (or unarchive) the session's whole compression lineage; False if unknown."""
        if not isinstance(session_id, str) or not session_id:
            return False
        return self._write(lambda c: HousekeepingRepository(c).set_archived(session_id, bool(archived)))

    def list_prune_candidates(
        self, older_than_days: Optional[float] = None, source: str = None, **filters: Any
    ) -> list[dict[str, Any]]:
        """Read-only: ended sessions matching the filter table, oldest first."""
        return self._read(lambda c: HousekeepingRepository(c).candidates(older_than_days, source, filters))

    def archive_sessions(self, older_than_days: Optional[float] = None, source: str = None, **filters: Any) -> int:
        """Archive the lineage of every matching session (unarchived ones by default).

        Returns the number of sessions matched, not rows updated.
        """
        filters.setdefault("archived", False)
        return self._write(lambda c: HousekeepingRepository(c).archive(older_than_days, source, filters))

    # ------------------------------------------------------------------ delete / prune

    def prune_sessions(
        self,
        older_than_days: Optional[float] = 90,
        source: str = None,
        sessions_dir: Optional[Path] = None,
        **filters: Any,
    ) -> int:
        """Delete matching ended sessions (children orphaned, no delegate cascade)."""
        return self._write(
            lambda c: HousekeepingRepository(c).prune(older_than_days, source, sessions_dir, filters),
            budget=TRANSCRIPT_BUDGET_S,
        )

    def prune_candidates(self, older_than_days: float = 90, source: str | None = None) -> list[dict[str, Any]]:
        """Read-only: what ``prune_sessions(older_than_days, source)`` would delete.

        hermes_store's own (the CLI's dry run): list_prune_candidates' rows plus
        ``end_reason``.
        """
        columns = ("id", "source", "title", "model", "started_at", "ended_at", "end_reason", "message_count",
                   "archived")
        return self._read(
            lambda c: HousekeepingRepository(c).candidates(older_than_days, source, {}, columns=columns)
        )

    def delete_session(self, session_id: str, sessions_dir: Optional[Path] = None) -> bool:
        """Delete the session and, recursively, its delegate children; others are orphaned."""
        if not session_id:
            return False
        return self._write(
            lambda c: HousekeepingRepository(c).delete_sessions([session_id], sessions_dir) == 1,
            budget=TRANSCRIPT_BUDGET_S,
        )

    def delete_sessions(self, session_ids: list[str], sessions_dir: Optional[Path] = None) -> int:
        """Bulk delete_session in one transaction; returns how many listed ids existed."""
        if isinstance(session_ids, (str, bytes)):
            raise errors.InvalidInputError("session_ids must be a list of ids, not one string")
        ids = list(session_ids or [])
        return self._write(
            lambda c: HousekeepingRepository(c).delete_sessions(ids, sessions_dir), budget=TRANSCRIPT_BUDGET_S
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
        return self._write(lambda c: HousekeepingRepository(c).delete_empty(sessions_dir), budget=TRANSCRIPT_BUDGET_S)

    def prune_empty_ghost_sessions(self, sessions_dir: Optional[Path] = None) -> int:
        return self._write(lambda c: MaintenanceRepository(c).prune_empty_ghost_sessions(sessions_dir))

    def finalize_orphaned_compression_sessions(self) -> int:
        return self._write(lambda c: MaintenanceRepository(c).finalize_orphaned_compression_sessions())

    # ------------------------------------------------------------------ export

    def export_session(self, session_id: str, *, include_inactive: bool = False) -> Optional[dict[str, Any]]:
        """The session row plus ``messages`` (live rows, as Hermes v23) and ``model_usage``.

        ``include_inactive=True`` (ours) also exports rewound and archived rows.
        """
        return self._read(lambda c: HousekeepingRepository(c).export_session(session_id, include_inactive))

    def export_all(self, source: str = None, *, include_inactive: bool = False) -> list[dict[str, Any]]:
        """Every session (of ``source``) exported, most recently active first (Hermes' order).

        For a full-fidelity backup of a large store use :meth:`iter_export` (streamed,
        every row kept), which ``hermes-store export`` does.
        """
        ids = [row["id"] for row in self.search_sessions(source=source, limit=100000)]  # type: ignore[attr-defined]
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

    def iter_export(self, source: str | None = None) -> Iterator[dict[str, Any]]:
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
        if not isinstance(sessions, list):
            raise errors.InvalidInputError("sessions must be a list")
        if len(sessions) > self._IMPORT_MAX_SESSIONS:
            raise errors.InvalidInputError(f"sessions must contain at most {self._IMPORT_MAX_SESSIONS} entries")
        problems = self._import_errors(sessions)
        if problems:
            return {"ok": False, "imported": 0, "skipped": 0, "detached": 0, "errors": problems}
        result = self._write(
            lambda c: HousekeepingRepository(c).import_validated(sessions), budget=TRANSCRIPT_BUDGET_S
        )
        if result["imported"]:
            self._index_search_after_commit()  # an import is maintenance: leave the short-CJK index complete
        return result

    def _import_errors(self, sessions: list) -> list[dict[str, Any]]:
        """Every entry checked before anything is written: ``{"index", "error"[, "session_id"]}``."""
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        total_bytes = total_messages = 0
        bytes_reported = messages_reported = False

        def fail(i: int, msg: str, sid: Any = None) -> None:
            item: dict[str, Any] = {"index": i, "error": msg}
            if isinstance(sid, str):
                item["session_id"] = sid
            out.append(item)

        for i, entry in enumerate(sessions):
            if not isinstance(entry, dict):
                fail(i, "session must be an object")
                continue
            sid = entry.get("id")
            if not isinstance(sid, str) or not sid.strip():
                fail(i, "session id is required")
                continue
            try:
                sid.encode("utf-8")
            except UnicodeEncodeError:
                fail(i, "session id must be valid text (it holds a lone surrogate)", sid)
                continue
            if sid in seen:
                fail(i, "duplicate session id", sid)
                continue
            seen.add(sid)
            messages = entry.get("messages", [])
            if messages is None:
                messages = []
            if not isinstance(messages, list):
                fail(i, "messages must be a list", sid)
                continue
            if len(messages) > self._IMPORT_MAX_MESSAGES_PER_SESSION:
                fail(i, "messages exceeds the per-session import limit", sid)
                continue
            if any(not isinstance(m, dict) for m in messages):
                fail(i, "messages must contain only objects", sid)
                continue
            size = _entry_size(entry)
            if size is None:
                fail(i, "session must be JSON serializable", sid)
                continue
            if size > self._IMPORT_MAX_SESSION_BYTES:
                fail(i, "session exceeds the import size limit", sid)
                continue
            total_bytes += size
            if total_bytes > self._IMPORT_MAX_TOTAL_BYTES and not bytes_reported:
                bytes_reported = True
                fail(i, "import exceeds the total size limit", sid)
                continue
            problem = _entry_error(entry)
            if problem:
                fail(i, problem, sid)
                continue
            total_messages += len(messages)
            if total_messages > self._IMPORT_MAX_TOTAL_MESSAGES and not messages_reported:
                messages_reported = True
                fail(i, "messages exceeds the total import limit", sid)
        return out

    def import_records(self, records: Iterable[Mapping[str, Any]], batch: int = 200) -> tuple[int, int]:
        """Import exported records idempotently, in batches; returns (imported, skipped).

        hermes_store's own bulk importer (formerly ``import_sessions``), the inverse of
        :meth:`iter_export`: every column and message row is kept as exported (ids when
        free, rewound and archived rows, usage rows), lineage restored across batches.
        """
        imported = skipped = 0
        chunk: list[Mapping[str, Any]] = []
        # Children met before their parent, carried across batches until it arrives.
        pending: list[tuple[str, str]] = []

        def flush(rows: list[Mapping[str, Any]]) -> tuple[int, int]:
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
            self._index_search_after_commit()
        return imported, skipped

    # ------------------------------------------------------------------ auto-prune

    def maybe_auto_prune_and_vacuum(
        self,
        retention_days: int = 90,
        min_interval_hours: float = 24,
        vacuum: bool = True,
        sessions_dir: Optional[Path] = None,
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
