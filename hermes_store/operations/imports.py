"""Imports of several transactions: Hermes' ``import_sessions`` (validate everything,
one write, then index) and our ``import_records`` (exported records in batches, one
transaction each, then index).

Whatever happens to the short-CJK index catch-up after the import's commit, the
import stands: a failure there is logged, and rows not indexed yet are still found by
a direct scan.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterable, Mapping

from sqlalchemy import Connection

from .. import errors
from ..repositories import MaintenanceRepository
from ..repositories.housekeeping import HousekeepingRepository
from .search_index import index_search
from .steps import LONG_BUDGET_S, Steps

log = logging.getLogger(__name__)

#: Sessions ``import_records`` writes per transaction.
IMPORT_BATCH = 200

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


@dataclass(frozen=True)
class ImportLimits:
    """Hermes' import limits (``SessionDB._IMPORT_MAX_*``)."""

    max_sessions: int = 500
    max_messages_per_session: int = 10_000
    max_total_messages: int = 50_000
    max_session_bytes: int = 5 * 1024 * 1024
    max_total_bytes: int = 25 * 1024 * 1024


def import_errors(sessions: list, limits: ImportLimits = ImportLimits()) -> list[dict[str, Any]]:
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
        if len(messages) > limits.max_messages_per_session:
            fail(i, "messages exceeds the per-session import limit", sid)
            continue
        if any(not isinstance(m, dict) for m in messages):
            fail(i, "messages must contain only objects", sid)
            continue
        size = _entry_size(entry)
        if size is None:
            fail(i, "session must be JSON serializable", sid)
            continue
        if size > limits.max_session_bytes:
            fail(i, "session exceeds the import size limit", sid)
            continue
        total_bytes += size
        if total_bytes > limits.max_total_bytes and not bytes_reported:
            bytes_reported = True
            fail(i, "import exceeds the total size limit", sid)
            continue
        problem = _entry_error(entry)
        if problem:
            fail(i, problem, sid)
            continue
        total_messages += len(messages)
        if total_messages > limits.max_total_messages and not messages_reported:
            messages_reported = True
            fail(i, "messages exceeds the total import limit", sid)
    return out


def index_after_import(steps: Steps) -> int:
    """Bring the short-CJK index up to date after a committed import (one write); rows
    indexed. Never raises: the import is durable already, so a failure is logged."""
    try:
        return index_search(steps)
    except Exception:
        log.warning("short-CJK index catch-up after an import failed; retried later", exc_info=True)
        return 0


def import_sessions(steps: Steps, sessions: list, *, limits: ImportLimits = ImportLimits()) -> dict[str, Any]:
    """Hermes v23's import: validate everything, insert the new sessions in one write,
    then index them (a second write, after the import committed).

    Returns ``{"ok", "imported", "skipped", "detached", "imported_ids", "skipped_ids",
    "errors"}`` (``ok`` False with the errors and nothing written when any entry is
    invalid). A list that is not one, or longer than ``limits.max_sessions``:
    InvalidInputError.
    """
    if not isinstance(sessions, list):
        raise errors.InvalidInputError("sessions must be a list")
    if len(sessions) > limits.max_sessions:
        raise errors.InvalidInputError(f"sessions must contain at most {limits.max_sessions} entries")
    problems = import_errors(sessions, limits)
    if problems:
        return {"ok": False, "imported": 0, "skipped": 0, "detached": 0, "errors": problems}
    result = steps.write(lambda c: HousekeepingRepository(c).import_validated(sessions), budget=LONG_BUDGET_S)
    if result["imported"]:
        index_after_import(steps)  # an import is maintenance: leave the short-CJK index complete
    return result


def import_records(steps: Steps, records: Iterable[Mapping[str, Any]], batch: int = IMPORT_BATCH) -> tuple[int, int]:
    """Import exported records idempotently, ``batch`` sessions a transaction; returns
    (imported, skipped).

    Records are read lazily (a stream of any length keeps memory flat). A child met
    before its parent is relinked when the parent arrives, in a later batch too. A
    failing batch raises with the batches before it committed: running the import
    again skips what is there and carries on.
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

        return steps.write(run, budget=LONG_BUDGET_S)

    for record in records:
        chunk.append(record)
        if len(chunk) >= batch:
            a, b = flush(chunk)
            imported, skipped, chunk = imported + a, skipped + b, []
    if chunk:
        a, b = flush(chunk)
        imported, skipped = imported + a, skipped + b
    if imported:
        index_after_import(steps)
    return imported, skipped
