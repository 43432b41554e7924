"""PostgreSQL: Hermes' ``schema_version`` table gets a replica identity.

Why this revision exists: ``schema_version`` (Hermes' own table, one row, no key) is
the only table of a store without a primary key. PostgreSQL's logical replication
cannot carry updates or deletes of such a table, and Citus moves a tenant between nodes
by logical replication: ``citus_schema_move`` in its default mode refused every tenant
("cannot use logical replication to transfer shards of the relation schema_version
since it doesn't have a REPLICA IDENTITY or PRIMARY KEY", issue 33, point 3).

What it does, on PostgreSQL only: ``REPLICA IDENTITY FULL`` (the whole row identifies
it), which changes neither the table's columns nor its rows, so Hermes' code reading
and writing it sees the same table. The downgrade puts back the default.
"""

from alembic import op

revision = "hs0007"
down_revision = "hs0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite has no replication
    op.execute("ALTER TABLE schema_version REPLICA IDENTITY FULL")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # nothing was changed on SQLite
    op.execute("ALTER TABLE schema_version REPLICA IDENTITY DEFAULT")
