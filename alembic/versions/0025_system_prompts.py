"""Schema v25: system prompts stored once, by content hash; session flags and turn leases.

Why: every session repeated its full system prompt inline, and most of them are
identical, so ``sessions`` was mostly copies of the same few kilobytes. Hermes v25
stores each distinct prompt once in ``system_prompts`` keyed by its SHA-256 and points
sessions at it with ``sessions.system_prompt_hash``. Under the same version (without a
bump, so they first appear in a fresh v25 file) Hermes added ``title_source`` (who set
the title: derived / llm / user), ``hidden`` (sidebar-hidden but resumable),
``last_read_at`` (read/unread state) and ``session_turn_leases`` (a cross-process lease
serializing the turns of one conversation).

Data migration, as Hermes' ``_dedupe_legacy_system_prompts`` does it: every session
whose ``system_prompt`` IS NOT NULL (an empty prompt included) gets
``hash = sha256(prompt as UTF-8).hexdigest()``, the prompt goes into
``system_prompts`` with ``INSERT OR IGNORE`` (identical prompts share one row), the
session gets the hash and its inline copy becomes NULL. Readers resolve
``COALESCE(system_prompts.prompt, sessions.system_prompt)``, so the legacy column stays
a read fallback: a session that still holds an inline prompt reads the same. The hash
is taken over the stored bytes (SQLite keeps text as UTF-8 here), and the prompt is
copied by SQL, so the stored text moves unchanged even where Python could not decode
it. In ``--sql`` (offline) mode nothing can be hashed, so the prompts stay inline and
are read through that fallback.

The foreign key to ``system_prompts`` is declared on the column (``ADD COLUMN ...
REFERENCES``), the only way SQLite adds one without rebuilding ``sessions``; a fresh
Hermes v25 file declares it as a table constraint, and both give the same key.

Downgrade writes every resolved prompt back inline, then drops what v25 added. A
column-level key goes with ``DROP COLUMN``. A table-level one (a fresh Hermes file that
was adopted) cannot be dropped in place, so ``sessions`` is then rebuilt from Hermes'
v24 DDL, keeping every row, its rowid, any extra column the file has, and the indexes
and triggers on the table. That rebuild needs ``PRAGMA foreign_keys`` off (our own
migration connections have it off), since dropping the old table would otherwise
cascade into the usage ledger.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

import hashlib
import re

from alembic import context, op

from hermes_store.alembic_support import sqlite_history_only
from sqlalchemy import text

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

#: Sessions moved per statement batch.
CHUNK = 500

# ---- v25, verbatim from Hermes ------------------------------------------------------

UPGRADE = [
    """CREATE TABLE system_prompts (
    hash TEXT PRIMARY KEY,
    prompt TEXT NOT NULL
)""",
    "ALTER TABLE sessions ADD COLUMN system_prompt_hash TEXT REFERENCES system_prompts(hash)",
    "ALTER TABLE sessions ADD COLUMN title_source TEXT",
    "ALTER TABLE sessions ADD COLUMN hidden INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE sessions ADD COLUMN last_read_at REAL",
    """CREATE TABLE session_turn_leases (
    conversation_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
)""",
    "CREATE INDEX idx_session_turn_leases_expires ON session_turn_leases(expires_at)",
    """CREATE INDEX idx_sessions_system_prompt_hash
    ON sessions(system_prompt_hash)""",
]

#: Columns v25 adds to ``sessions``, last first (the order they are dropped in).
NEW_SESSION_COLUMNS = ["last_read_at", "hidden", "title_source", "system_prompt_hash"]

# ---- v24, verbatim from Hermes (for the rebuild of a table-level foreign key) --------

SESSIONS_V24 = """CREATE TABLE {name} (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    display_name TEXT,
    origin_json TEXT,
    expiry_finalized INTEGER DEFAULT 0,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    cwd TEXT,
    git_branch TEXT,
    git_repo_root TEXT,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    title TEXT,
    last_activity_at REAL,
    last_activity_description TEXT,
    last_activity_provenance TEXT,
    api_call_count INTEGER DEFAULT 0,
    handoff_state TEXT,
    handoff_platform TEXT,
    handoff_error TEXT,
    compression_failure_cooldown_until REAL,
    compression_failure_error TEXT,
    compression_fallback_streak INTEGER NOT NULL DEFAULT 0,
    compression_ineffective_count INTEGER NOT NULL DEFAULT 0,
    profile_name TEXT,
    rewind_count INTEGER NOT NULL DEFAULT 0,
    archived INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
)"""

REBUILT = "hermes_store_0025_sessions"

RESTORE_INLINE = """UPDATE sessions
SET system_prompt = COALESCE(
    (SELECT sp.prompt FROM system_prompts AS sp WHERE sp.hash = sessions.system_prompt_hash),
    system_prompt)
WHERE system_prompt_hash IS NOT NULL"""

_NAMES_SESSIONS = re.compile(r"\bsessions\b", re.I)
_TABLE_LEVEL_FK = re.compile(r"FOREIGN\s+KEY\s*\(\s*[\"`\[]?system_prompt_hash[\"`\]]?\s*\)", re.I)


def _move_prompts() -> None:
    """Hermes' v25 dedupe: each inline prompt into ``system_prompts`` by SHA-256."""
    bind = op.get_bind()
    utf8 = bind.execute(text("PRAGMA encoding")).scalar() == "UTF-8"
    # Stored bytes where they are UTF-8 (the same digest as hashing the decoded text,
    # and robust to bytes Python cannot decode); decoded text otherwise.
    value = "CAST(system_prompt AS BLOB)" if utf8 else "system_prompt"
    select = text(
        f"SELECT rowid, {value} FROM sessions WHERE system_prompt IS NOT NULL ORDER BY rowid LIMIT :n"
    )
    store = text(
        "INSERT OR IGNORE INTO system_prompts (hash, prompt) "
        "SELECT :hash, system_prompt FROM sessions WHERE rowid = :rowid"
    )
    point = text("UPDATE sessions SET system_prompt_hash = :hash, system_prompt = NULL WHERE rowid = :rowid")
    while True:
        batch = bind.execute(select, {"n": CHUNK}).all()
        if not batch:
            return
        params = []
        for rowid, prompt in batch:
            raw = bytes(prompt) if isinstance(prompt, (bytes, bytearray, memoryview)) else str(prompt).encode("utf-8")
            params.append({"hash": hashlib.sha256(raw).hexdigest(), "rowid": rowid})
        bind.execute(store, params)
        bind.execute(point, params)


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)
    if not context.is_offline_mode():
        _move_prompts()
    op.execute("UPDATE schema_version SET version = 25")


def _rebuild_sessions_as_v24() -> None:
    """Replace ``sessions`` by Hermes' v24 table, for a file whose v25 key is a table
    constraint. Rows (with rowids), extra columns, indexes and triggers are kept;
    views are set aside while the table is swapped (SQLite refuses the final rename
    while a view names a missing table)."""
    bind = op.get_bind()
    if bind.execute(text("PRAGMA foreign_keys")).scalar():
        from hermes_store.errors import HermesStoreError

        raise HermesStoreError(
            "downgrading below 0025 rebuilds sessions and needs PRAGMA foreign_keys=OFF "
            "(dropping the old table would cascade into the usage ledger); run it through "
            "hermes_store.migrations, whose connections have it off. Nothing was changed."
        )
    specs = {r[1]: r for r in bind.execute(text("PRAGMA table_xinfo(sessions)"))}
    live = list(specs)
    indexes = bind.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'sessions' AND sql IS NOT NULL")
    ).scalars().all()
    # Triggers on sessions go with the old table; triggers elsewhere that name it, and
    # views, would make the final RENAME fail: all are set aside and made again.
    triggers = bind.execute(
        text("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger' AND sql IS NOT NULL")
    ).all()
    triggers = [t for t in triggers if t.tbl_name == "sessions" or _NAMES_SESSIONS.search(t.sql)]
    views = bind.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'view'")).all()
    for name, _sql in views:
        op.execute(f'DROP VIEW "{name}"')
    for name, tbl_name, _sql in triggers:
        if tbl_name != "sessions":
            op.execute(f'DROP TRIGGER "{name}"')
    op.execute(SESSIONS_V24.format(name=REBUILT))
    v24 = {r[1] for r in bind.execute(text(f"PRAGMA table_xinfo({REBUILT})"))}
    for col in live:
        if col in v24 or col in NEW_SESSION_COLUMNS:
            continue
        # ADD COLUMN cannot take NOT NULL without a default; such a column keeps its
        # type and values but loses the constraint.
        _cid, _name, typ, notnull, default, _pk, _hidden = specs[col]
        spec = typ or ""
        if default is not None:
            spec += f" {'NOT NULL ' if notnull else ''}DEFAULT {default}"
        op.execute(f'ALTER TABLE {REBUILT} ADD COLUMN "{col}" {spec}')
    keep = ", ".join(f'"{c}"' for c in live if c not in NEW_SESSION_COLUMNS)
    op.execute(f"INSERT INTO {REBUILT} (rowid, {keep}) SELECT rowid, {keep} FROM sessions")
    op.execute("DROP TABLE sessions")
    op.execute(f"ALTER TABLE {REBUILT} RENAME TO sessions")
    # Replayed as the driver's text: stored SQL may hold ":word", which text() would
    # take for a bound parameter.
    for sql in [*indexes, *(sql for _name, sql in views), *(t.sql for t in triggers)]:
        bind.exec_driver_sql(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    op.execute(RESTORE_INLINE)
    op.execute("DROP INDEX idx_sessions_system_prompt_hash")
    op.execute("DROP INDEX idx_session_turn_leases_expires")
    op.execute("DROP TABLE session_turn_leases")
    table_sql = None
    if not context.is_offline_mode():
        table_sql = op.get_bind().execute(
            text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'sessions'")
        ).scalar()
    if _TABLE_LEVEL_FK.search(table_sql or ""):
        _rebuild_sessions_as_v24()
    else:
        for column in NEW_SESSION_COLUMNS:
            op.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
    op.execute("DROP TABLE system_prompts")
    op.execute("UPDATE schema_version SET version = 24")
