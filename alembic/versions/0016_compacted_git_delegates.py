"""Schema v16: messages.compacted, sessions git columns, and delegate tagging.

Hermes v16 keeps compacted-away messages (``compacted`` = 1) instead of deleting them,
records the git branch and repository root a session ran in, and from now on marks
delegate (sub-agent) sessions in ``model_config._delegate_from`` so session lists can
hide them. Sessions written before v16 carry no marker, so this revision infers it once,
for every session whose ``model_config`` (JSON text; NULL or '' counts as ``{}``) has
no ``_delegate_from`` key yet:

(a) a child (``parent_session_id`` set) that is neither a branch child (``_branched_from``
    in its model_config, or the parent ended with ``'branched'`` and the child started at
    or after the parent ended) nor a compression continuation (parent ended with
    ``'compression'`` and the child started at or after that) was spawned by its parent:
    ``_delegate_from`` = the parent id;
(b) a parentless session without ``_branched_from``, without a title, with at most 25
    messages, at least one ``tool`` message and no children is a delegate whose parent
    link was lost: ``_delegate_from`` = ``'__orphaned__'``.

A model_config that is not a JSON object (malformed text, an array) is left alone:
adding a key to it would destroy what it holds.

Reversibility: the downgrade must remove only the markers this step added, not ones
Hermes wrote itself. The step therefore records what it did in ``state_meta`` under the
key ``hermes_store.0016_delegate_from`` (a JSON object: session id → ``{"tag": …,
"original": <model_config text before the step, or null>}``); state_meta rows are data,
so the v16 schema stays exactly Hermes'. The downgrade, for each recorded session whose
``_delegate_from`` still holds the recorded tag, puts the original text back verbatim
when model_config is still exactly what the step wrote, and otherwise (the application
changed other keys since) only removes the ``_delegate_from`` key. Then it deletes the
record. All of it is plain SQL with SQLite's json functions, so it also works in
``--sql`` (offline) mode.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

from hermes_store.alembic_support import sqlite_history_only

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

MARKER_KEY = "hermes_store.0016_delegate_from"
TAGS_NAME = "hermes_store_0016_tags"
TAGS = f"temp.{TAGS_NAME}"

# model_config as a JSON object to work on: NULL/'' → '{}', a JSON object → itself,
# anything else → NULL (such rows are skipped). CASE guarantees json_type never sees
# malformed text.
_MC = """CASE
        WHEN s.model_config IS NULL OR s.model_config = '' THEN '{}'
        WHEN NOT json_valid(s.model_config) THEN NULL
        WHEN json_type(s.model_config) = 'object' THEN s.model_config
    END"""

CANDIDATES = f"""
SELECT id, tag, original FROM (
    SELECT s.id AS id, s.parent_session_id AS tag, s.model_config AS original, {_MC} AS mc,
           CASE WHEN
               COALESCE(p.end_reason = 'branched' AND s.started_at >= p.ended_at, 0)
               OR COALESCE(p.end_reason = 'compression' AND s.started_at >= p.ended_at, 0)
           THEN 1 ELSE 0 END AS continuation
    FROM sessions s
    LEFT JOIN sessions p ON p.id = s.parent_session_id
    WHERE s.parent_session_id IS NOT NULL
) AS child
WHERE mc IS NOT NULL
  AND json_type(mc, '$._delegate_from') IS NULL
  AND json_extract(mc, '$._branched_from') IS NULL
  AND continuation = 0
UNION ALL
SELECT id, '__orphaned__', original FROM (
    SELECT s.id AS id, s.model_config AS original, s.title AS title, {_MC} AS mc
    FROM sessions s
    WHERE s.parent_session_id IS NULL
      AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_session_id = s.id)
      AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id AND m.role = 'tool')
      AND (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id) <= 25
) AS root
WHERE mc IS NOT NULL
  AND json_type(mc, '$._delegate_from') IS NULL
  AND json_extract(mc, '$._branched_from') IS NULL
  AND COALESCE(title, '') = ''
"""

UPGRADE = [
    "ALTER TABLE messages ADD COLUMN compacted INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE sessions ADD COLUMN git_branch TEXT",
    "ALTER TABLE sessions ADD COLUMN git_repo_root TEXT",
    # 1. Decide every tag from the state before any is written.
    f"CREATE TEMP TABLE {TAGS_NAME} (session_id TEXT PRIMARY KEY, tag TEXT NOT NULL, original TEXT)",
    f"INSERT INTO {TAGS} (session_id, tag, original) {CANDIDATES}",
    # 2. Record them, so the downgrade can undo exactly this step.
    f"""INSERT OR REPLACE INTO state_meta (key, value)
    SELECT '{MARKER_KEY}', json_group_object(session_id, json_object('tag', tag, 'original', original))
    FROM {TAGS}
    HAVING COUNT(*) > 0""",
    # 3. Tag.
    f"""UPDATE sessions SET model_config = json_set(
        CASE WHEN model_config IS NULL OR model_config = '' THEN '{{}}' ELSE model_config END,
        '$._delegate_from',
        (SELECT t.tag FROM {TAGS} t WHERE t.session_id = sessions.id)
    )
    WHERE id IN (SELECT session_id FROM {TAGS})""",
    f"DROP TABLE {TAGS}",
    "UPDATE schema_version SET version = 16",
]

DOWNGRADE = [
    f"""CREATE TEMP TABLE {TAGS_NAME} (
    session_id TEXT PRIMARY KEY, tag TEXT NOT NULL, original TEXT, written TEXT NOT NULL)""",
    f"""INSERT INTO {TAGS} (session_id, tag, original, written)
    SELECT j.key,
           json_extract(j.value, '$.tag'),
           json_extract(j.value, '$.original'),
           json_set(
               CASE WHEN json_extract(j.value, '$.original') IS NULL
                         OR json_extract(j.value, '$.original') = '' THEN '{{}}'
                    ELSE json_extract(j.value, '$.original') END,
               '$._delegate_from', json_extract(j.value, '$.tag'))
    FROM state_meta m, json_each(m.value) j
    WHERE m.key = '{MARKER_KEY}'""",
    f"""UPDATE sessions SET model_config = (
        SELECT CASE WHEN sessions.model_config = t.written THEN t.original
                    ELSE json_remove(sessions.model_config, '$._delegate_from') END
        FROM {TAGS} t WHERE t.session_id = sessions.id
    )
    WHERE id IN (
        SELECT t.session_id FROM {TAGS} t
        WHERE t.session_id = sessions.id
          AND CASE WHEN json_valid(sessions.model_config)
                   THEN json_extract(sessions.model_config, '$._delegate_from') IS t.tag
                   ELSE 0 END
    )""",
    f"DELETE FROM state_meta WHERE key = '{MARKER_KEY}'",
    f"DROP TABLE {TAGS}",
]


def upgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in UPGRADE:
        op.execute(sql)


def downgrade() -> None:
    if sqlite_history_only(op.get_bind()):
        return
    for sql in DOWNGRADE:
        op.execute(sql)
    op.drop_column("sessions", "git_repo_root")
    op.drop_column("sessions", "git_branch")
    op.drop_column("messages", "compacted")
    op.execute("UPDATE schema_version SET version = 15")
