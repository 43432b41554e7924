"""Models: our DeclarativeBase, the plain tables, and light constructs for FTS."""

from .base import Base, NAMING_CONVENTION
from .tables import Message, SchemaVersion, Session, StateMeta

metadata = Base.metadata

__all__ = ["Base", "NAMING_CONVENTION", "Message", "SchemaVersion", "Session", "StateMeta", "metadata"]
