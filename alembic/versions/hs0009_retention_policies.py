"""Retention policies: how long a store keeps ended sessions, tool outputs and reasoning.

Why this revision exists: a store grows without bound (issue 34, point 2). A user wants
to say, per source (``telegram``, ``cli``...) and per tenant, how long ended sessions
are kept and after how long old tool outputs and reasoning are replaced by a short
marker, and have every ``hermes-store retention apply`` and every auto-maintenance run
follow it. The policy belongs to the store, next to its rows: a tenant schema carries
its own, and a copy of the file carries it too.

What it does, on SQLite and PostgreSQL alike (one table of our own, no Hermes object
touched, ``schema_version`` left alone): ``hermes_store_retention``, one row per source,
``'*'`` for the store's default. Days are ``REAL`` / ``double precision`` (a policy may
say half a day); the flags are integers 0/1 as Hermes' own flags are. The table starts
empty: a store without a policy keeps everything, as before.

The downgrade drops the table, and its policies with it.

Revision ID: hs0009
Revises: hs0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "hs0009"
down_revision = "hs0008"
branch_labels = None
depends_on = None

#: Frozen here (never imported from the package): epoch seconds and days, 8 bytes on both.
_DOUBLE: sa.types.TypeEngine[float] = sa.REAL().with_variant(postgresql.DOUBLE_PRECISION(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "hermes_store_retention",
        sa.Column("source", sa.TEXT(), nullable=False),
        sa.Column("delete_after_days", _DOUBLE, nullable=True),
        sa.Column("redact_after_days", _DOUBLE, nullable=True),
        sa.Column("include_pinned", sa.INTEGER(), server_default=sa.text("0"), nullable=False),
        sa.Column("include_user_titled", sa.INTEGER(), server_default=sa.text("0"), nullable=False),
        sa.Column("archive_dir", sa.TEXT(), nullable=True),
        sa.Column("updated_at", _DOUBLE, nullable=False),
        sa.PrimaryKeyConstraint("source", name="pk_hermes_store_retention"),
    )


def downgrade() -> None:
    op.drop_table("hermes_store_retention")
