"""What a copy moves, what it leaves, and what it reports: the tables and
``state_meta`` keys that travel (and why the rest does not), the copy's errors and its
:class:`CopyReport`. Read by every other step of the copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from .. import errors
from ..adopt.work import FTS_BOOKKEEPING_KEYS
from ..keys import BIGRAM_HIGH_WATER_KEY, BIGRAM_SETTLE_KEY, RETENTION_TABLE, VERSION_TABLE
from ..models import Base
from ..search import cjk_pairs as bigram

#: Messages per destination transaction (and rows per page of the smaller tables).
DEFAULT_BATCH = 1000
MAX_BATCH = 100_000
#: ``state_meta`` key of the copy's marker (JSON); see the module docstring.
MARKER_KEY = "hermes_store.copy"
MARKER_FORMAT = 1
#: Suffix of the lock file next to a file destination (``state.db.copy-lock``).
LOCK_SUFFIX = ".copy-lock"
#: Prefix of the private work folders holding an adopted copy of a source file.
WORK_PREFIX = ".hermes-store-copy-"
#: Free space a work copy needs, in source sizes: the copy, and adoption's own copy of it.
WORK_SPACE_FACTOR = 3
#: Rows of the short-CJK index caught up per destination transaction.
INDEX_CHUNK = 20_000
#: How many names a report lists before it only counts.
LISTED = 50

Progress = Callable[[str, int, "int | None"], None]

#: Copied before the sessions, which point at them.
BEFORE_SESSIONS = ("system_prompts",)
#: Copied after the sessions, each on its own primary key.
AFTER_SESSIONS = ("gateway_routing", "gateway_hygiene_state", "conversation_generations", "async_delegations",
                  "state_meta", RETENTION_TABLE)
SESSION_TABLES = ("sessions", "messages", "session_model_usage")
COPIED_TABLES = (*BEFORE_SESSIONS, *SESSION_TABLES, *AFTER_SESSIONS)
#: Tables left out on purpose, with the reason a report gives.
NOT_COPIED = {
    "schema_version": "written by the destination's own migrations",
    VERSION_TABLE: "written by the destination's own migrations",
    "compression_locks": "short leases held by processes running against the source",
    "session_turn_leases": "short leases held by processes running against the source",
    "gateway_heartbeats": "liveness of the gateways serving the source",
    bigram.TABLE: "a search index, rebuilt from the copied messages",
    bigram.DIRTY_TABLE: "a search index, rebuilt from the copied messages",
}
#: Not copied and not worth a line in a report: rewritten or rebuilt on the destination.
SILENT = frozenset({"schema_version", VERSION_TABLE, bigram.TABLE, bigram.DIRTY_TABLE})
#: ``state_meta`` keys describing the source file itself (see the module docstring).
PER_FILE_META_KEYS = frozenset({*FTS_BOOKKEEPING_KEYS, BIGRAM_HIGH_WATER_KEY, BIGRAM_SETTLE_KEY,
                                "last_auto_prune"})
#: On a merge a generation counter only moves up (Hermes never lets one go back): per
#: table, what a clash on the key updates, as ``(set_, where)`` of ``on_conflict_do_update``
#: given the dialect's insert construct and the table (other tables keep their row).
UPSERT_UPDATES: dict[str, Callable[[Any, Any], tuple[dict[str, Any], Any]]] = {
    "conversation_generations": lambda ins, table: (
        {"generation": ins.excluded.generation}, ins.excluded.generation > table.c.generation,
    ),
}
#: Python's side of the same rule: whether a source row should replace the destination's.
NEWER: dict[str, Callable[[dict[str, Any], dict[str, Any]], bool]] = {
    "conversation_generations": lambda src, dst: (src.get("generation") or 0) > (dst.get("generation") or 0),
}
TABLES = Base.metadata.tables
S, M, U, P = (TABLES[n] for n in ("sessions", "messages", "session_model_usage", "system_prompts"))


def meta_key_copied(key: Any) -> bool:
    """Whether a ``state_meta`` key travels with the history (see the module docstring)."""
    if not isinstance(key, str):
        return False
    return key not in PER_FILE_META_KEYS and key != MARKER_KEY and not key.startswith(MARKER_KEY + ".")


# ---------------------------------------------------------------------------- errors and report


class CopyError(errors.HermesStoreError):
    """A copy that cannot start or finish as asked."""


class DestinationNotEmptyError(CopyError):
    """The destination already holds data and ``merge`` was not given; nothing was written."""


class CopyInProgressError(CopyError):
    """Another copy is writing to the same destination right now; this one wrote nothing."""


class CopyVerificationError(CopyError):
    """The copy finished but the destination does not match the source; ``report`` says where."""

    def __init__(self, message: str, report: CopyReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class CopyReport:
    """What a copy did and what its verification found."""

    source: str
    destination: str
    merge: bool = False
    #: This run carried on an unfinished copy of the same source.
    resumed: bool = False
    #: The destination held a finished copy of this source already.
    already_complete: bool = False
    source_revision: str | None = None
    #: The source was read through an adopted (or upgraded) work copy of it.
    source_work_copy: bool = False
    sessions_copied: int = 0
    #: Source sessions whose id the destination already had (kept as they were there).
    sessions_present: int = 0
    messages_copied: int = 0
    #: Copied sessions whose message ids were taken, so they got new ones (merge).
    renumbered_sessions: list[str] = field(default_factory=list)
    #: (session, title in the source, title given) where the title was taken (merge).
    renamed_titles: list[tuple[str, str, str]] = field(default_factory=list)
    #: (session, parent) links to a session that exists on neither side: dropped.
    dropped_links: list[tuple[str, str]] = field(default_factory=list)
    #: (session, hash) prompt references without their prompt: dropped.
    dropped_prompts: list[tuple[str, str]] = field(default_factory=list)
    #: Rows that cannot be copied, per table (a NULL key, a message of a missing session).
    not_copyable: dict[str, int] = field(default_factory=dict)
    #: Rows per table: {"source": n, "destination": m} (state_meta: keys that travel).
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped_tables: dict[str, str] = field(default_factory=dict)
    skipped_columns: dict[str, list[str]] = field(default_factory=dict)
    skipped_meta_keys: list[str] = field(default_factory=list)
    #: Rows the short-CJK index caught up on.
    indexed_rows: int = 0
    #: Full-text index → None when healthy, else the problem (after any rebuild).
    search_indexes: dict[str, str | None] = field(default_factory=dict)
    rebuilt_indexes: list[str] = field(default_factory=list)
    verified: bool = False
    sessions_checked: int = 0
    #: Order-independent sum of the per-session checksums on each side.
    source_checksum: str = ""
    destination_checksum: str = ""
    #: Sessions that differ (missing, other content or other ids) where they must not.
    mismatched_sessions: list[str] = field(default_factory=list)
    #: Merge: sessions the destination already had with other content, kept as they were.
    kept_sessions: list[str] = field(default_factory=list)
    #: Per table (other than sessions/messages/usage): source rows missing or different.
    mismatched_rows: dict[str, int] = field(default_factory=dict)
    kept_rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verified and not self.mismatched_sessions and not self.mismatched_rows

    def as_dict(self, limit: int | None = LISTED) -> dict[str, Any]:
        """Plain data for ``--json`` (long lists cut at ``limit``, their full length kept)."""

        def cut(items: list[Any]) -> list[Any]:
            return [list(i) if isinstance(i, tuple) else i for i in (items if limit is None else items[:limit])]

        doc: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            if isinstance(value, list):
                doc[name] = cut(value)
                if limit is not None and len(value) > limit:
                    doc[f"{name}_count"] = len(value)
            else:
                doc[name] = value
        doc["ok"] = self.ok
        return doc

