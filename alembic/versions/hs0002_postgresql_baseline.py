"""The PostgreSQL baseline: on PostgreSQL, create the whole head schema in one step.

Why this revision exists: revisions 0001…0030 and hs0001 replay Hermes' SQLite
history (ALTERs, table rebuilds, FTS5 tables and triggers) so that a file Hermes wrote
at any version can be brought to head. No PostgreSQL database ever went through that
history, and replaying it there would mean a second, untestable translation of thirty
SQLite migrations. So on PostgreSQL those revisions do nothing
(:func:`hermes_store.alembic_support.sqlite_history_only`) and this one creates what
head means there; on SQLite it does nothing (the schema is already at head). Every
later revision is written once, for both dialects, on top of this one.

Types are chosen to hold what SQLite holds: epoch timestamps and costs are ``double
precision`` (``real`` is 4 bytes and would lose time), message ids are ``bigint``
identity (``BY DEFAULT``, so a copied history keeps its ids), token and call counters
``bigint``, JSON columns ``text`` (kept byte for byte, invalid JSON included), raw
bytes ``bytea``. ``schema_version`` holds 30, so tools that read it work.

Search objects, in place of the FTS5 tables (not in the models; env.py hides them
from autogenerate by name, see ``hermes_store.alembic_support.PG_SEARCH_*``):

* ``messages.search_vector``: a stored generated ``tsvector`` over content, tool name
  and tool calls with the ``simple`` configuration (FTS5's unicode61 tokenizer does not
  stem either), one ``to_tsvector`` per column so a phrase never spans two columns,
  under the GIN index ``idx_messages_search_vector``. A tool row's content is cut at
  8192 characters as in Hermes' ``messages_fts_src``; other text is cut (64 KiB of
  content, 32 KiB of tool calls) so the vector stays under PostgreSQL's 1 MB tsvector
  limit and a 10 MB row can never make an INSERT fail.
* ``idx_messages_trgm``: a ``pg_trgm`` GIN index over content, tool name and tool
  calls, for CJK and substrings of 3+ characters (``CREATE EXTENSION IF NOT EXISTS
  pg_trgm``; the extension is left installed by the downgrade, since other schemas of
  the same database may use it).
* ``messages_cjk_bigram`` / ``messages_cjk_bigram_dirty``: the short-CJK index of
  hs0001, with the same dirty-block rule in one trigger function
  (``hermes_store_cjk_bigram_mark_dirty``) and its two triggers.

Downgrade drops every object this revision made (tables, their indexes and the
identity sequence, the trigger function); nothing of ours is left.

Revision ID: hs0002
Revises: 0030
"""

from __future__ import annotations

from alembic import op

revision = "hs0002"
down_revision = "0030"
branch_labels = None
depends_on = None

TABLES = [
    """CREATE TABLE async_delegations (
    delegation_id TEXT,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT DEFAULT '' NOT NULL,
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at DOUBLE PRECISION NOT NULL,
    completed_at DOUBLE PRECISION,
    updated_at DOUBLE PRECISION NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT DEFAULT 'pending' NOT NULL,
    delivery_attempts INTEGER DEFAULT 0 NOT NULL,
    delivered_at DOUBLE PRECISION,
    owner_pid INTEGER,
    owner_started_at BIGINT,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at DOUBLE PRECISION,
    origin_session_id TEXT DEFAULT '' NOT NULL,
    CONSTRAINT pk_async_delegations PRIMARY KEY (delegation_id)
)""",
    "CREATE INDEX idx_async_delegations_delivery ON async_delegations (delivery_state, completed_at)",
    """CREATE TABLE compression_locks (
    session_id TEXT,
    holder TEXT NOT NULL,
    acquired_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    CONSTRAINT pk_compression_locks PRIMARY KEY (session_id)
)""",
    "CREATE INDEX idx_compression_locks_expires ON compression_locks (expires_at)",
    """CREATE TABLE conversation_generations (
    source TEXT NOT NULL,
    session_key TEXT NOT NULL,
    generation BIGINT DEFAULT 0 NOT NULL,
    CONSTRAINT pk_conversation_generations PRIMARY KEY (source, session_key)
)""",
    """CREATE TABLE gateway_heartbeats (
    backend_id TEXT,
    pid INTEGER NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    last_heartbeat DOUBLE PRECISION NOT NULL,
    profile TEXT DEFAULT '' NOT NULL,
    host TEXT DEFAULT '' NOT NULL,
    CONSTRAINT pk_gateway_heartbeats PRIMARY KEY (backend_id)
)""",
    """CREATE TABLE gateway_hygiene_state (
    session_key TEXT,
    failure_streak INTEGER DEFAULT 0 NOT NULL,
    CONSTRAINT pk_gateway_hygiene_state PRIMARY KEY (session_key)
)""",
    """CREATE TABLE gateway_routing (
    scope TEXT DEFAULT '' NOT NULL,
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    CONSTRAINT pk_gateway_routing PRIMARY KEY (scope, session_key)
)""",
    """CREATE TABLE messages_cjk_bigram (
    gram TEXT NOT NULL,
    block BIGINT NOT NULL,
    CONSTRAINT pk_messages_cjk_bigram PRIMARY KEY (gram, block)
)""",
    """CREATE TABLE messages_cjk_bigram_dirty (
    block BIGINT,
    CONSTRAINT pk_messages_cjk_bigram_dirty PRIMARY KEY (block)
)""",
    """CREATE TABLE schema_version (
    version INTEGER NOT NULL
)""",
    """CREATE TABLE session_turn_leases (
    conversation_id TEXT,
    holder TEXT NOT NULL,
    acquired_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    CONSTRAINT pk_session_turn_leases PRIMARY KEY (conversation_id)
)""",
    "CREATE INDEX idx_session_turn_leases_expires ON session_turn_leases (expires_at)",
    """CREATE TABLE state_meta (
    key TEXT,
    value TEXT,
    CONSTRAINT pk_state_meta PRIMARY KEY (key)
)""",
    """CREATE TABLE system_prompts (
    hash TEXT,
    prompt TEXT NOT NULL,
    CONSTRAINT pk_system_prompts PRIMARY KEY (hash)
)""",
    """CREATE TABLE sessions (
    id TEXT,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    end_reason TEXT,
    message_count BIGINT DEFAULT 0,
    tool_call_count BIGINT DEFAULT 0,
    input_tokens BIGINT DEFAULT 0,
    output_tokens BIGINT DEFAULT 0,
    title TEXT,
    cache_read_tokens BIGINT DEFAULT 0,
    cache_write_tokens BIGINT DEFAULT 0,
    reasoning_tokens BIGINT DEFAULT 0,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd DOUBLE PRECISION,
    actual_cost_usd DOUBLE PRECISION,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    api_call_count BIGINT DEFAULT 0,
    handoff_state TEXT,
    handoff_platform TEXT,
    handoff_error TEXT,
    cwd TEXT,
    rewind_count INTEGER DEFAULT 0 NOT NULL,
    archived INTEGER DEFAULT 0 NOT NULL,
    git_branch TEXT,
    git_repo_root TEXT,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    compression_failure_cooldown_until DOUBLE PRECISION,
    compression_failure_error TEXT,
    display_name TEXT,
    origin_json TEXT,
    expiry_finalized INTEGER DEFAULT 0,
    compression_fallback_streak INTEGER DEFAULT 0 NOT NULL,
    profile_name TEXT,
    last_activity_at DOUBLE PRECISION,
    last_activity_description TEXT,
    last_activity_provenance TEXT,
    compression_ineffective_count INTEGER DEFAULT 0 NOT NULL,
    pinned INTEGER DEFAULT 0 NOT NULL,
    system_prompt_hash TEXT,
    title_source TEXT,
    hidden INTEGER DEFAULT 0 NOT NULL,
    last_read_at DOUBLE PRECISION,
    git_metadata_generation INTEGER DEFAULT 0 NOT NULL,
    tool_names TEXT,
    compression_recovery_deadline DOUBLE PRECISION,
    created_source TEXT,
    compression_overload_streak INTEGER DEFAULT 0 NOT NULL,
    transport_profile TEXT,
    CONSTRAINT pk_sessions PRIMARY KEY (id),
    CONSTRAINT fk_sessions_parent_session_id_sessions FOREIGN KEY(parent_session_id) REFERENCES sessions (id),
    CONSTRAINT fk_sessions_system_prompt_hash_system_prompts FOREIGN KEY(system_prompt_hash) REFERENCES system_prompts (hash)
)""",
    "CREATE INDEX idx_sessions_effective_activity ON sessions (coalesce(last_activity_at, started_at) DESC, started_at DESC)",
    "CREATE INDEX idx_sessions_gateway_peer ON sessions (source, user_id, chat_id, chat_type, thread_id, started_at DESC)",
    "CREATE INDEX idx_sessions_handoff_state ON sessions (handoff_state, started_at)",
    "CREATE INDEX idx_sessions_parent ON sessions (parent_session_id)",
    "CREATE INDEX idx_sessions_session_key ON sessions (session_key, started_at DESC)",
    "CREATE INDEX idx_sessions_source ON sessions (source)",
    "CREATE INDEX idx_sessions_source_id ON sessions (source, id)",
    "CREATE INDEX idx_sessions_started ON sessions (started_at DESC)",
    "CREATE INDEX idx_sessions_system_prompt_hash ON sessions (system_prompt_hash)",
    "CREATE UNIQUE INDEX idx_sessions_title_unique ON sessions (title) WHERE title IS NOT NULL",
    "CREATE INDEX idx_sessions_tool_names ON sessions (tool_names)",
    """CREATE TABLE messages (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY,
    session_id TEXT NOT NULL,
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp DOUBLE PRECISION NOT NULL,
    token_count BIGINT,
    finish_reason TEXT,
    reasoning TEXT,
    reasoning_details TEXT,
    codex_reasoning_items TEXT,
    reasoning_content TEXT,
    codex_message_items TEXT,
    platform_message_id TEXT,
    observed INTEGER DEFAULT 0,
    active INTEGER DEFAULT 1 NOT NULL,
    compacted INTEGER DEFAULT 0 NOT NULL,
    effect_disposition TEXT,
    api_content TEXT,
    display_kind TEXT,
    display_metadata TEXT,
    _compressed_summary INTEGER DEFAULT 0 NOT NULL,
    display_identity BYTEA,
    display_order INTEGER,
    search_vector TSVECTOR GENERATED ALWAYS AS (
        to_tsvector('simple'::regconfig, left(COALESCE(content, ''),
                                              CASE WHEN role = 'tool' THEN 8192 ELSE 65536 END))
        || to_tsvector('simple'::regconfig, left(COALESCE(tool_name, ''), 4096))
        || to_tsvector('simple'::regconfig, left(COALESCE(tool_calls, ''), 32768))
    ) STORED,
    CONSTRAINT pk_messages PRIMARY KEY (id),
    CONSTRAINT fk_messages_session_id_sessions FOREIGN KEY(session_id) REFERENCES sessions (id)
)""",
    "CREATE INDEX idx_messages_active_null ON messages (active) WHERE active IS NULL",
    "CREATE INDEX idx_messages_assistant_calls_by_session ON messages (session_id) WHERE role = 'assistant' AND tool_calls IS NOT NULL",
    "CREATE INDEX idx_messages_display_backfill ON messages (session_id) WHERE (display_order IS NULL OR display_identity IS NULL) AND (active = 1 OR compacted = 1)",
    "CREATE INDEX idx_messages_display_identity ON messages (session_id, display_identity, display_order) WHERE display_identity IS NOT NULL AND (active = 1 OR compacted = 1)",
    "CREATE INDEX idx_messages_display_page ON messages (session_id, display_order, active DESC, id DESC) WHERE active = 1 OR compacted = 1",
    "CREATE INDEX idx_messages_platform_msg_id ON messages (session_id, platform_message_id) WHERE platform_message_id IS NOT NULL",
    "CREATE INDEX idx_messages_session ON messages (session_id, timestamp)",
    "CREATE INDEX idx_messages_session_active ON messages (session_id, active, timestamp)",
    "CREATE INDEX idx_messages_session_id ON messages (session_id, id)",
    "CREATE INDEX idx_messages_timestamp ON messages (timestamp)",
    """CREATE TABLE session_model_usage (
    session_id TEXT NOT NULL,
    model TEXT NOT NULL,
    billing_provider TEXT DEFAULT '' NOT NULL,
    billing_base_url TEXT DEFAULT '' NOT NULL,
    billing_mode TEXT DEFAULT '' NOT NULL,
    task TEXT DEFAULT '' NOT NULL,
    api_call_count BIGINT DEFAULT 0 NOT NULL,
    input_tokens BIGINT DEFAULT 0 NOT NULL,
    output_tokens BIGINT DEFAULT 0 NOT NULL,
    cache_read_tokens BIGINT DEFAULT 0 NOT NULL,
    cache_write_tokens BIGINT DEFAULT 0 NOT NULL,
    reasoning_tokens BIGINT DEFAULT 0 NOT NULL,
    estimated_cost_usd DOUBLE PRECISION DEFAULT 0 NOT NULL,
    actual_cost_usd DOUBLE PRECISION DEFAULT 0 NOT NULL,
    cost_status TEXT,
    cost_source TEXT,
    first_seen DOUBLE PRECISION,
    last_seen DOUBLE PRECISION,
    CONSTRAINT pk_session_model_usage PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task),
    CONSTRAINT fk_session_model_usage_session_id_sessions FOREIGN KEY(session_id) REFERENCES sessions (id) ON DELETE CASCADE
)""",
    "CREATE INDEX idx_session_model_usage_model ON session_model_usage (model)",
    "CREATE INDEX idx_session_model_usage_session ON session_model_usage (session_id)",
]

SEARCH = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX idx_messages_search_vector ON messages USING gin (search_vector)",
    """CREATE INDEX idx_messages_trgm ON messages
    USING gin (content gin_trgm_ops, tool_name gin_trgm_ops, tool_calls gin_trgm_ops)""",
    """CREATE FUNCTION hermes_store_cjk_bigram_mark_dirty() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id <= COALESCE((SELECT CAST(value AS BIGINT) FROM state_meta
                           WHERE key = 'hermes_store.cjk_bigram_high_water'), -1) THEN
        INSERT INTO messages_cjk_bigram_dirty (block) VALUES (NEW.id / 64)
        ON CONFLICT (block) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$""",
    """CREATE TRIGGER messages_cjk_bigram_dirty_insert AFTER INSERT ON messages
FOR EACH ROW EXECUTE FUNCTION hermes_store_cjk_bigram_mark_dirty()""",
    """CREATE TRIGGER messages_cjk_bigram_dirty_update
AFTER UPDATE OF content, tool_name, tool_calls ON messages
FOR EACH ROW EXECUTE FUNCTION hermes_store_cjk_bigram_mark_dirty()""",
]

ROWS = [
    "INSERT INTO schema_version (version) VALUES (30)",
    "INSERT INTO state_meta (key, value) VALUES ('hermes_store.cjk_bigram_high_water', '-1')",
]

#: Children before parents; dropping a table drops its indexes, triggers and identity sequence.
DROP_TABLES = [
    "session_model_usage",
    "messages",
    "sessions",
    "system_prompts",
    "state_meta",
    "session_turn_leases",
    "schema_version",
    "messages_cjk_bigram_dirty",
    "messages_cjk_bigram",
    "gateway_routing",
    "gateway_hygiene_state",
    "gateway_heartbeats",
    "conversation_generations",
    "compression_locks",
    "async_delegations",
]


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite reached head through 0001…0030 and hs0001
    for sql in TABLES + SEARCH + ROWS:
        op.execute(sql)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in DROP_TABLES:
        op.execute(f"DROP TABLE {table}")
    op.execute("DROP FUNCTION hermes_store_cjk_bigram_mark_dirty()")
