"""Models: our DeclarativeBase, the plain tables, and light constructs for FTS."""

from .base import Base, NAMING_CONVENTION
from .tables import (
    AsyncDelegation,
    CjkBigram,
    CjkBigramDirty,
    CompressionLock,
    GatewayRouting,
    Message,
    SchemaVersion,
    Session,
    SessionModelUsage,
    StateMeta,
)

metadata = Base.metadata

__all__ = [
    "AsyncDelegation",
    "CjkBigram",
    "CjkBigramDirty",
    "Base",
    "CompressionLock",
    "GatewayRouting",
    "Message",
    "NAMING_CONVENTION",
    "SchemaVersion",
    "Session",
    "SessionModelUsage",
    "StateMeta",
    "metadata",
]
