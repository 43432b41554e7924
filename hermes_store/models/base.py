"""Our own declarative base, never the host application's.

The naming convention gives every constraint a predictable name, so Alembic can
address it in later revisions and autogenerate stays deterministic.
"""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of hermes_store; its metadata holds only our plain tables."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
