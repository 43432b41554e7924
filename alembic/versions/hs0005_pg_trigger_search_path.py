"""PostgreSQL trigger functions find their tables in their own schema, whoever writes.

Why this revision exists: the PL/pgSQL trigger functions of hs0002 (the short-CJK
index's dirty-block mark) and hs0004 (Hermes v30's ``display_order`` rules) name
``messages``, ``state_meta`` and ``messages_cjk_bigram_dirty`` without a schema, so
PostgreSQL resolved them through the *writer's* ``search_path``. hermes_store sets that
path on its own connections, but any other connection (``psql``, a host's engine, a
reporting job) that inserted into ``team_a.messages`` with the default path ran the
triggers against ``public``: the new row took its ``display_order`` from another
tenant's rows, and a dirty mark landed in another tenant's index, or the insert failed.

What it does, on PostgreSQL only: pins each of those five functions' ``search_path`` to
the schema it lives in (``ALTER FUNCTION … SET search_path``), so a trigger resolves
names the same way whatever the caller's path. ``pg_catalog`` is still searched first,
as always, and the functions use nothing from ``public``. The schema is read on the
server (``current_schema()`` inside a ``DO`` block), so ``alembic upgrade --sql`` writes
a script that pins the schema it is run in, tenant or default.

Pinning a setting costs one save/restore of ``search_path`` per trigger call, a few
microseconds per written row; correctness for every writer is worth it.

The downgrade resets exactly that setting on the five functions.
"""

from alembic import op

revision = "hs0005"
down_revision = "hs0004"
branch_labels = None
depends_on = None

#: Every trigger function of ours whose body names a table (hs0003's word functions
#: already name their schema and read no table).
TRIGGER_FUNCTIONS = (
    "hermes_store_cjk_bigram_mark_dirty",
    "hermes_store_display_order_insert",
    "hermes_store_display_visibility_update",
    "hermes_store_display_identity_update",
    "hermes_store_display_identity_delete",
)

#: No ``%`` anywhere (no format()): Alembic's offline ``--sql`` mode doubles every
#: ``%`` of a statement, which would break the script it writes.
_EACH_FUNCTION = """DO $do$
DECLARE
    target TEXT := quote_ident(current_schema());
    fn TEXT;
BEGIN
    FOREACH fn IN ARRAY ARRAY[{names}] LOOP
        EXECUTE 'ALTER FUNCTION ' || target || '.' || quote_ident(fn) || '() {action}';
    END LOOP;
END
$do$"""


def _alter_each(action: str) -> str:
    names = ", ".join(f"'{name}'" for name in TRIGGER_FUNCTIONS)
    return _EACH_FUNCTION.format(names=names, action=action)


def _on_postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if not _on_postgresql():
        return  # SQLite has no schemas: Hermes' triggers name their tables in one file
    op.execute(_alter_each("SET search_path = ' || target || '"))


def downgrade() -> None:
    if not _on_postgresql():
        return  # nothing was changed on SQLite
    op.execute(_alter_each("RESET search_path"))
