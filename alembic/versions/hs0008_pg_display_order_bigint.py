"""PostgreSQL: ``messages.display_order`` is a ``bigint``, as the message ids it holds.

Why this revision exists: Hermes v30's ``display_order`` takes a message's id (or a
peer's); hs0002 made it an ``integer``, 4 bytes, while ids are ``bigint``. An id past
2^31 - 1 (a store that has handed out that many, a copy of one, or a Citus worker, whose
sequences start above 2^48: issue 33, point 6) made every append fail in the display
order trigger with ``integer out of range``.

What it does, on PostgreSQL only: the column becomes ``bigint`` (PostgreSQL rewrites the
table and its indexes once), and the table's trigger functions are recompiled in every
session (their cached plans knew the old type); SQLite's integers are 8 bytes already. The downgrade makes
it ``integer`` again, which fails, changing nothing, while a row holds an order too large
for one.
"""

from alembic import op

revision = "hs0008"
down_revision = "hs0007"
branch_labels = None
depends_on = None


#: The trigger functions of ``messages``, each altered to what it is (its own cost): the
#: catalog row changes, so every session's PL/pgSQL recompiles the function at its next
#: call. A plan cached before the column's type changed would fail every insert of a
#: connection opened before the migration ("type of parameter ... does not match that
#: when preparing the plan").
_RECOMPILE_TRIGGERS = """DO $do$
DECLARE
    f RECORD;
BEGIN
    FOR f IN SELECT DISTINCT t.tgfoid::regprocedure AS fn, p.procost AS cost
             FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
             WHERE t.tgrelid = 'messages'::regclass AND NOT t.tgisinternal
    LOOP
        EXECUTE 'ALTER FUNCTION ' || f.fn::text || ' COST ' || f.cost::text;  -- no percent sign: --sql doubles it
    END LOOP;
END
$do$"""


def _retype(to: str) -> None:
    op.execute(f"ALTER TABLE messages ALTER COLUMN display_order TYPE {to}")
    op.execute(_RECOMPILE_TRIGGERS)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite's INTEGER holds 8 bytes
    _retype("bigint")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # nothing was changed on SQLite
    _retype("integer")
