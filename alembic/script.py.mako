"""${message}

Why this revision exists: (say it here; one short paragraph)

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from hermes_store.alembic_support import keep_triggers_across_batch
${imports if imports else ""}

revision: str = ${repr(up_revision)}
down_revision: Union[str, Sequence[str], None] = ${repr(down_revision)}
branch_labels: Union[str, Sequence[str], None] = ${repr(branch_labels)}
depends_on: Union[str, Sequence[str], None] = ${repr(depends_on)}


def upgrade() -> None:
    # Batch rebuilds on SQLite keep triggers, views and AUTOINCREMENT, whichever env.py runs us.
    keep_triggers_across_batch(op.get_bind())
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    keep_triggers_across_batch(op.get_bind())
    ${downgrades if downgrades else "pass"}
