"""Names and numbers shared across the package, each kept once, at the bottom.

Anything two rooms must agree on (a ``state_meta`` key, a table name, a marker a
write leaves for a later read, a budget) lives here, so neither imports the other
for it and a change happens in one place. This module imports nothing of ours.
"""

from __future__ import annotations

# ------------------------------------------------------------------ tables of ours
#: Our own Alembic version table (Hermes keeps ``schema_version``, a host its own).
VERSION_TABLE = "hermes_store_version"
#: PostgreSQL's search machinery, made by raw SQL in hs0002 and never in the models: the
#: stored tsvector column of messages, its GIN index and the pg_trgm GIN index. The
#: dialect reads them; Alembic's autogenerate leaves them out (alembic_support).
PG_SEARCH_COLUMNS = frozenset({("messages", "search_vector")})
PG_SEARCH_INDEXES = frozenset({"idx_messages_search_vector", "idx_messages_trgm"})
#: hs0009's retention policies, one row per source; the row of source
#: :data:`RETENTION_DEFAULT_SOURCE` is the store's default for every other source.
RETENTION_TABLE = "hermes_store_retention"
RETENTION_DEFAULT_SOURCE = "*"
#: hs0006's partial index of the sessions that may be sub-agent transcripts (their
#: ``model_config`` names ``_delegate_from``), PostgreSQL only and never in the models.
PG_DELEGATED_INDEX = "idx_sessions_maybe_delegated"

# ------------------------------------------------------------------ state_meta keys
#: Set while the word index is known to be stale (Hermes v26 fail-open).
FTS_STALE_KEY = "fts_stale"
#: Set while the CJK (trigram) index is known to be stale.
FTS_CJK_STALE_KEY = "fts_cjk_stale"
#: Whether FTS5's ``optimize`` command is known to work on this file.
OPTIMIZE_AVAILABLE_KEY = "fts_optimize_available"
#: Which layout the FTS tables are stored in.
STORAGE_VERSION_KEY = "fts_storage_version"
#: Highest message id whose tool output the index holds in full.
TOOL_HIGH_WATER_KEY = "fts_tool_full_content_high_water"
#: Highest message id the short-CJK (bigram) index has caught up to.
BIGRAM_HIGH_WATER_KEY = "hermes_store.cjk_bigram_high_water"
#: Set while the short-CJK index settles after a bulk change.
BIGRAM_SETTLE_KEY = "hermes_store.cjk_bigram_settling"
#: When housekeeping last ran each job (epoch seconds).
LAST_AUTO_PRUNE_KEY = "last_auto_prune"
LAST_VACUUM_KEY = "last_vacuum"
LAST_AUTO_ARCHIVE_KEY = "last_auto_archive"

# ------------------------------------------------------------------ session markers
#: ``end_reason`` of a session closed by compression: its continuation is its child.
COMPRESSION_END_REASON = "compression"
#: Key of ``model_config`` naming the session a reset child came from.
RESET_MARKER = "_reset_from"
#: ``end_reason`` values after which Hermes starts a fresh child session (a reset).
RESET_END_REASONS = ("session_reset", "session_switch", "idle", "daily", "suspended", "resume_pending_expired")

#: What a retention policy leaves in place of an old tool output (``content`` of a
#: ``tool`` row) and of old reasoning (``reasoning``, ``reasoning_content``); a value no
#: longer than its marker is left as it is.
RETENTION_TOOL_MARKER = "[tool output removed by retention policy]"
RETENTION_REASONING_MARKER = "[reasoning removed by retention policy]"

# ------------------------------------------------------------------ limits
#: Longest search query accepted, in characters (Hermes' own limit).
MAX_FTS5_QUERY_CHARS = 2048
#: "No limit" as a LIMIT both dialects accept (SQLite takes no ``LIMIT ALL``).
MAX_ROWS = 2**62
#: Retention's batches, each its own transaction: sessions deleted (a batch ends early
#: once its sessions hold RETENTION_DELETE_MESSAGES messages), messages redacted.
RETENTION_DELETE_BATCH = 150
RETENTION_DELETE_MESSAGES = 2400
RETENTION_REDACT_BATCH = 600
#: Seconds in a day, for ages given in days.
DAY = 86_400.0

# ------------------------------------------------------------------ write budgets
#: Retry budget of an ordinary write step (seconds).
WRITE_BUDGET_S = 20.0
#: Retry budget of a long write step: transcripts, imports, index rebuilds (seconds).
LONG_BUDGET_S = 60.0
#: Jitter windows between two tries of a locked write: short sleeps for the first
#: EARLY_PHASE_S seconds, then longer ones.
EARLY_JITTER_S = (0.020, 0.150)
LATE_JITTER_S = (0.250, 1.0)
EARLY_PHASE_S = 2.0
